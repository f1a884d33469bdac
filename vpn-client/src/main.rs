//! `vpn-client`: build [`vpn_client::Settings`] from an OpenVPN config file (`--config`) or,
//! without one, from the vpn2 environment variables; init logging; run until SIGINT/SIGTERM.
//! Any error ends the process with status 1 and one line on stderr naming the file and line
//! or the path at fault.
//!
//! `vpn-client apiserver-proxy` runs the GEP-30 apiserver-proxy instead (see
//! [`sidecar::apiserver_proxy`]). `vpn-client cloud-api --connections DIR` runs GEP-21's
//! cloud side: tunnels to seed endpoints with an API proxy on each
//! ([`vpn_client::cloud_api`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Parser;
use netio::logging::Format;
use netio::signals::cancel_on_signals;
use protocol::config::env::Vpn2ClientEnv;
use vpn_client::config::Loaded;
use vpn_client::{vpn2, CancellationToken, Stopped};

netio::libm_pow!();

/// The shoot side of the reversed VPN: an OpenVPN 2.6 compatible TCP client.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// OpenVPN client config file. Without it the vpn2 environment variables (`ENDPOINT`,
    /// `IS_SHOOT_CLIENT`, ...) describe the client.
    #[arg(long, env = "VPN_CLIENT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter (`LEVEL` and `target=LEVEL` directives), e.g. `info` or `info,vpn_client=debug`;
    /// default from the config's `verb` (info without one).
    #[arg(long, env = "VPN_CLIENT_LOG")]
    log: Option<String>,
    /// Log line format: openvpn, ctime, envoy, json or full (`netio::logging`); default full on
    /// a terminal, else ctime (the layout Gardener's `vpn-shoot` log parser reads).
    #[arg(long, env = "VPN_CLIENT_LOG_FORMAT")]
    log_format: Option<Format>,
    /// vpn2 environment mode: the directory holding `vpn-client/` and `tlsauth/`.
    #[arg(long, env = "VPN2_SECRETS_DIR", default_value = vpn2::DEFAULT_SECRETS_DIR)]
    vpn2_secrets_dir: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Tunnel local TCP connections to the ingress with CONNECT and a routing header (GEP-30).
    ApiserverProxy(sidecar::apiserver_proxy::ApiserverProxyArgs),
    /// GEP-21's cloud side: a tunnel to each seed endpoint of the connection files, each with
    /// a CONNECT proxy to its allow-listed cloud-provider API endpoints.
    CloudApi(vpn_client::cloud_api::CloudApiArgs),
    /// vpn2's init step: the kernel settings of the vpn-shoot pod, or (without
    /// `IS_SHOOT_CLIENT`) of a kube-apiserver pod with HA VPN clients (needs privileges).
    Setup,
    /// HA, kube-apiserver pod: reports which tunnel carries the shoot networks (each client
    /// installs its own routes; nothing is chosen here). Needs `POD_IP`.
    PathController,
    /// HA, shoot pod: `GET /readyz` on `--port`, 200 while a tunnel of the pod is up.
    TunnelController {
        /// The port `/readyz` (and `/metrics`) are served on, every address.
        #[arg(long, default_value_t = vpn_client::ha::TUNNEL_CONTROLLER_PORT)]
        port: u16,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpn-client: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(command) = &cli.command {
        init_logging(&cli, "info")?;
        return run_command(command);
    }
    // The config's `verb` gives the log level unless `--log` does, so logging starts once the
    // config is read (a config error goes to stderr without it).
    let Loaded {
        settings,
        warnings,
        verb,
    } = load(&cli)?;
    init_logging(&cli, vpn_client::config::verb_log_filter(verb))?;
    if cli.config.is_none() {
        tracing::info!(secrets = %cli.vpn2_secrets_dir.display(), "vpn2 environment mode");
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    // One thread drives the session; `vpn_client::run` starts the tun writer thread itself.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let stopped = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signals(shutdown.clone()).context("signal handlers")?);
        Ok::<_, anyhow::Error>(vpn_client::run(settings, shutdown).await?)
    })?;
    match stopped {
        Stopped::Shutdown => Ok(()),
        Stopped::Halted { message } => bail!("the server halted the client: {message}"),
    }
}

/// Logging with `--log`, else `default`.
fn init_logging(cli: &Cli, default: &str) -> anyhow::Result<()> {
    let format = cli
        .log_format
        .unwrap_or_else(|| Format::default_for(Format::Ctime));
    netio::logging::init(cli.log.as_deref().unwrap_or(default), format).context("--log")
}

/// A subcommand instead of the tunnel.
fn run_command(command: &Command) -> anyhow::Result<()> {
    match command {
        Command::Setup => {
            let shoot = std::env::var("IS_SHOOT_CLIENT").is_ok_and(|v| v == "true");
            if shoot {
                vpn2::setup()?;
            } else {
                vpn2::setup_seed()?;
            }
            Ok(())
        }
        Command::PathController => {
            // The path controller's container has the networks and POD_IP, not the clients'
            // variables (gardener-pods.md §3.9).
            let env = Vpn2ClientEnv::parse(std::env::vars().filter(|(k, _)| {
                k.starts_with("SHOOT_") || k == "SEED_POD_NETWORK" || k == "VPN_NETWORK"
            }))?;
            let networks = vpn2::ha_seed_routes(&env)?;
            let pod_ip = std::env::var("POD_IP").ok();
            block_on_signals(|shutdown| async move {
                Ok(vpn_client::ha::path_controller(pod_ip.as_deref(), &networks, shutdown).await?)
            })
        }
        Command::TunnelController { port } => {
            let port = *port;
            block_on_signals(|shutdown| async move {
                Ok(vpn_client::ha::tunnel_controller(port, shutdown).await?)
            })
        }
        Command::ApiserverProxy(args) => {
            let config = args.to_config()?;
            let runtime = tokio::runtime::Runtime::new().context("tokio runtime")?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signals(shutdown.clone())?);
                let proxy = sidecar::apiserver_proxy::ApiserverProxy::bind(config).await?;
                proxy.run(shutdown).await;
                Ok(())
            })
        }
        Command::CloudApi(args) => {
            let runtime = tokio::runtime::Runtime::new().context("tokio runtime")?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signals(shutdown.clone())?);
                Ok(vpn_client::cloud_api::run(args.clone(), shutdown).await?)
            })
        }
    }
}

/// Runs `f` on a one-thread runtime with SIGINT / SIGTERM cancelling its token.
fn block_on_signals<F, Fut>(f: F) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signals(shutdown.clone()).context("signal handlers")?);
        f(shutdown).await
    })
}

/// The config file, else the vpn2 environment.
fn load(cli: &Cli) -> anyhow::Result<Loaded> {
    if let Some(path) = &cli.config {
        return Ok(vpn_client::config::load(path)?);
    }
    if !vpn2::requested(std::env::vars()) {
        bail!("nothing to run: give --config FILE, or set the vpn2 variables (ENDPOINT, IS_SHOOT_CLIENT, ...)");
    }
    let env = Vpn2ClientEnv::parse(std::env::vars())?;
    Ok(vpn2::load_env(&env, &cli.vpn2_secrets_dir)?)
}
