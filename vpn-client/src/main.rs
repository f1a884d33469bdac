//! `vpn-client`: parse the command line, build [`Settings`], init logging, and hand over to
//! [`vpn_client::run`] until SIGINT/SIGTERM.
//!
//! Config files (`--config FILE`, OpenVPN syntax) are mapped onto [`Settings`] once the
//! config parser lands; until then the binary says so and exits with an error.

use anyhow::{bail, Context as _};
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vpn_client::{CancellationToken, Settings, Stopped};

/// The shoot side of the reversed VPN: an OpenVPN 2.6 compatible TCP client.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// OpenVPN client config file. Not wired yet: the config-file parser is pending, so every
    /// run currently ends with an error saying so.
    #[arg(long, env = "VPN_CLIENT_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `vpn_client=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("--log")?)
        .init();
    let settings = settings(&cli)?;
    let runtime = tokio::runtime::Runtime::new().context("tokio runtime")?;
    let stopped = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        vpn_client::run(settings, shutdown).await
    })?;
    match stopped {
        Stopped::Shutdown => Ok(()),
        Stopped::Halted { message } => bail!("the server halted the client: {message}"),
    }
}

/// Defaults, then the config file (not yet), then env and flags.
fn settings(cli: &Cli) -> anyhow::Result<Settings> {
    match &cli.config {
        Some(path) => bail!(
            "--config {}: OpenVPN config files are not supported yet (the parser is pending)",
            path.display()
        ),
        None => {
            bail!("nothing to run: --config FILE is required (config files: not supported yet)")
        }
    }
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    shutdown.cancel();
}
