//! `vpn-server`: the seed side of the reversed VPN. See the library docs.
//!
//! `--config FILE` runs an OpenVPN server config; without it the server is configured from the
//! vpn2 environment variables and vpn2's file layout under `--secrets-dir`. SIGTERM or SIGINT
//! tells the clients, drains and exits 0. Errors are one line naming the file (and line).
//!
//! `--sidecar` (`VPN_SERVER_SIDECAR=true`) also runs the CONNECT sidecar in this process;
//! `vpn-server sidecar` runs it alone.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use netio::report::chain;
use netio::signals::cancel_on_signals;
use protocol::config::env::Vpn2ServerEnv;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use vpn_server::config::VPN2_SECRETS_DIR;
use vpn_server::sidecar::cli::ShootNetworks;
use vpn_server::sidecar::{Sidecar, SidecarArgs, SidecarConfig};
use vpn_server::{from_vpn2_env, load_file, Loaded, Server};

netio::libm_pow!();

/// OpenVPN-compatible server of the reversed cluster VPN.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// OpenVPN-style server configuration file; without it, the vpn2 environment variables.
    #[arg(long, env = "VPN_SERVER_CONFIG")]
    config: Option<PathBuf>,
    /// Log filter (`LEVEL` and `target=LEVEL` directives, e.g. `info,vpn_server=debug`); default from the
    /// config's `verb`.
    #[arg(long, env = "VPN_SERVER_LOG")]
    log: Option<String>,
    /// vpn2 environment mode: the directory holding `vpn-server/{ca.crt,tls.crt,tls.key}` and
    /// `tlsauth/vpn.tlsauth`.
    #[arg(long, env = "VPN_SERVER_SECRETS_DIR", default_value = VPN2_SECRETS_DIR)]
    secrets_dir: PathBuf,
    /// Also run the CONNECT sidecar (the `--sidecar-*` flags) in this process.
    #[arg(long, env = "VPN_SERVER_SIDECAR")]
    sidecar: bool,
    #[command(flatten)]
    sidecar_args: SidecarArgs,
    /// Another role of this binary; without one, the OpenVPN server. (The ingress router is
    /// the `vpn-router` binary.)
    #[command(subcommand)]
    command: Option<Command>,
}

/// The roles besides the OpenVPN server.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run only the CONNECT sidecar (the mTLS HTTP CONNECT proxy that replaces Envoy).
    Sidecar(SidecarArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpn-server: error: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(Command::Sidecar(args)) = &cli.command {
        let config = args.resolve(&cli.secrets_dir, ShootNetworks::Vpn2Env, std::env::vars())?;
        init_tracing(cli.log.as_deref().unwrap_or("info"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return rt.block_on(async {
            let token = CancellationToken::new();
            tokio::spawn(cancel_on_signals(token.clone())?);
            Sidecar::bind(config, None).await?.run(token).await;
            Ok(())
        });
    }
    let loaded = match &cli.config {
        Some(path) => load_file(path)?,
        None => from_vpn2_env(&Vpn2ServerEnv::parse(std::env::vars())?, &cli.secrets_dir)?,
    };
    let sidecar = match cli.sidecar {
        true => {
            // vpn2 environment mode: the shoot networks (and vpn2's mapping) from the same
            // variables; a config file: the networks it routes into the tunnel.
            let shoot = match cli.config {
                None => ShootNetworks::Vpn2Env,
                Some(_) => ShootNetworks::Routes(loaded.settings.routes.clone()),
            };
            Some(
                cli.sidecar_args
                    .resolve(&cli.secrets_dir, shoot, std::env::vars())?,
            )
        }
        false => None,
    };
    init_tracing(cli.log.as_deref().unwrap_or(verb_filter(loaded.verb)))?;
    for w in &loaded.warnings {
        warn!("{w}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(serve(loaded, sidecar))
}

fn init_tracing(filter: &str) -> Result<(), Box<dyn std::error::Error>> {
    netio::logging::init(filter).map_err(|e| format!("--log {filter:?}: {e}").into())
}

async fn serve(
    loaded: Loaded,
    sidecar: Option<SidecarConfig>,
) -> Result<(), Box<dyn std::error::Error>> {
    let Loaded {
        settings,
        up,
        down,
        verb,
        ..
    } = loaded;
    // Signal handlers first, so a SIGTERM during start-up also ends in a clean exit.
    let token = CancellationToken::new();
    tokio::spawn(cancel_on_signals(token.clone())?);
    let script_settings = settings.clone();
    let server = Server::bind(settings).await?;
    let dev = server.tun_name().to_owned();
    let sidecar = match sidecar {
        Some(config) => {
            let bound = Sidecar::bind(config, Some(Arc::new(server.client_routes()))).await?;
            Some(tokio::spawn(bound.run(token.clone())))
        }
        None => None,
    };
    if let Some(up) = up {
        up.run(&script_settings, &dev, verb).await?;
    }
    info!("Initialization Sequence Completed");
    server.run(token).await?;
    if let Some(task) = sidecar {
        let _ = task.await;
    }
    if let Some(down) = down {
        if let Err(e) = down.run(&script_settings, &dev, verb).await {
            warn!("{}", chain(&e));
        }
    }
    Ok(())
}

/// The default log filter for upstream's `verb`.
fn verb_filter(verb: u8) -> &'static str {
    match verb {
        0 => "error",
        1..=4 => "info",
        5..=6 => "debug",
        _ => "trace",
    }
}
