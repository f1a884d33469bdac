//! `vpn-pki`: certificates and static keys for the OpenVPN server, its clients and the CONNECT
//! sidecar. See [`pki::cli`] for the commands and the files they write.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = pki::cli::Cli::parse();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("system clock is before 1970")?;
    let now = i64::try_from(now.as_secs()).context("system clock out of range")?;
    pki::cli::run(&cli, now, &mut std::io::stdout().lock())
        .with_context(|| format!("vpn-pki {} failed", cli.command.name()))
}
