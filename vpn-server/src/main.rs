//! `vpn-server`: the seed side of the reversed VPN. See the library docs.
//!
//! The command line takes `--config FILE` (OpenVPN syntax). The config-file parser is not
//! wired in yet, so the binary stops with a clear message until it is; the server itself is
//! [`vpn_server::run`].

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;

/// OpenVPN-compatible server of the reversed cluster VPN.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// OpenVPN-style configuration file.
    #[arg(long, env = "VPN_SERVER_CONFIG")]
    config: PathBuf,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,vpn_server=debug`).
    #[arg(long, env = "VPN_SERVER_LOG", default_value = "info")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    bail!(
        "{}: reading OpenVPN config files is not wired into vpn-server yet",
        cli.config.display()
    )
}
