//! `vpn-server`: the seed side of the reversed VPN. See the library docs.
//!
//! `--config FILE` runs an OpenVPN server config; without it the server is configured from the
//! vpn2 environment variables and vpn2's file layout under `--secrets-dir`. SIGTERM or SIGINT
//! tells the clients, drains and exits 0; in vpn2's environment only once the pod's other
//! processes have closed their connections (at most 10 s, `vpn_server::drain`). Errors are
//! one line naming the file (and line).
//!
//! `--cloud-api-listen` also runs GEP-21's cloud API endpoint (`vpn_server::cloud_api`).
//!
//! `--sidecar` (`VPN_SERVER_SIDECAR=true`) also runs the CONNECT sidecar in this process;
//! `vpn-server sidecar` runs it alone. With `--config`, the server drops new connections from
//! its tun device to the ports of the sidecar's listeners left at their defaults
//! ([`SidecarDefaults`]; vpn2's environment mode has its seed table for that). Started as `envoy` (a link named so: Gardener's
//! `envoy-proxy` image), or as `vpn-server envoy`, it runs in Envoy mode with Envoy's flags:
//! the sidecar, or the shoot's apiserver-proxy, as the bootstrap file says
//! (`sidecar::envoy`, in the `sidecar` crate).
//!
//! Gardener's other uses of the vpn2 image: `vpn-server readiness` and `vpn-server liveness`
//! (exec probes: exit 0, or the reason on stdout and exit 1; `vpn_server::probes`) and
//! `vpn-server exporter` (the HA `openvpn-exporter` container; `vpn_server::exporter`).

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use ipnet::IpNet;
use netio::logging::Format;
use netio::report::chain;
use netio::signals::cancel_on_signals;
use protocol::config::env::Vpn2ServerEnv;
use protocol::config::netmap::Netmap;
use sidecar::cli::ShootNetworks;
use sidecar::envoy::{self, EnvoyArgs};
use sidecar::SidecarArgs;
use tokio_util::sync::CancellationToken;
use vpn_server::config::{vpn2_shoot_iroutes, VPN2_SECRETS_DIR};
use vpn_server::drain;
use vpn_server::exporter::{self, ExporterArgs, ExporterConfig};
use vpn_server::launch::{self, Launch};
use vpn_server::probes::{self, ProbeError};
use vpn_server::vpn2;
use vpn_server::{from_vpn2_env, load_file};

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
    /// Log line format: openvpn, ctime, envoy, json or full (`netio::logging`); default full on
    /// a terminal, else openvpn (the layout Gardener's `vpn-seed-server` log parser reads).
    #[arg(long, env = "VPN_SERVER_LOG_FORMAT")]
    log_format: Option<Format>,
    /// vpn2 environment mode: the directory holding `vpn-server/{ca.crt,tls.crt,tls.key}` and
    /// `tlsauth/vpn.tlsauth`.
    #[arg(long, env = "VPN_SERVER_SECRETS_DIR", default_value = VPN2_SECRETS_DIR)]
    secrets_dir: PathBuf,
    /// Admin endpoint (`/metrics`, `/healthz`, `/readyz`) listen addresses, comma-separated;
    /// none by default. Plain HTTP: never an address the tunnel reaches.
    #[arg(long, env = "VPN_SERVER_ADMIN_LISTEN", value_delimiter = ',')]
    admin_listen: Vec<SocketAddr>,
    /// How long a packet from the tun device to a reconnecting client is held before it is
    /// answered with ICMP unreachable, in milliseconds (Envoy's `connect_timeout` in
    /// Gardener, 20 s); 0: answered at once.
    #[arg(
        long = "hold-timeout-ms",
        env = "VPN_SERVER_HOLD_TIMEOUT_MS",
        default_value_t = 20_000
    )]
    tun_hold_ms: u64,
    /// Also run the CONNECT sidecar (the `--sidecar-*` flags) in this process.
    #[arg(long, env = "VPN_SERVER_SIDECAR")]
    sidecar: bool,
    #[command(flatten)]
    sidecar_args: SidecarArgs,
    /// Which of the sidecar's listen flags were left at their defaults (filled after parsing).
    #[arg(skip)]
    sidecar_defaults: SidecarDefaults,
    #[command(flatten)]
    cloud_api: vpn_server::cloud_api::CloudApiArgs,
    /// Another role of this binary; without one, the OpenVPN server. (The ingress router is
    /// the `vpn-router` binary.)
    #[command(subcommand)]
    command: Option<Command>,
}

/// The command line when started as `envoy`: Envoy's flags only.
#[derive(Debug, Parser)]
#[command(
    name = "envoy",
    version,
    about = "vpn-server in Envoy mode (Gardener's envoy-proxy image: the CONNECT sidecar, or the apiserver-proxy)"
)]
struct EnvoyCli {
    #[command(flatten)]
    args: EnvoyArgs,
}

/// The roles besides the OpenVPN server.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run only the CONNECT sidecar (the mTLS HTTP CONNECT proxy that replaces Envoy).
    Sidecar(SidecarArgs),
    /// Run as Gardener's envoy-proxy image: `envoy -c envoy.yaml` (the CONNECT sidecar, or the
    /// shoot's apiserver-proxy).
    Envoy(EnvoyArgs),
    /// vpn2's init step: switch IPv6 on in the pod if it is off (needs privileges).
    Setup,
    /// vpn2's OpenVPN hook: the VPN device's firewall rules and routes (`up`), or their removal
    /// (`down`).
    Firewall(vpn2::FirewallArgs),
    /// Exit 0 if the status file shows the clients vpn2's readiness rules ask for.
    Readiness,
    /// Exit 0 if the status file parses and was written at most 17 s ago.
    Liveness,
    /// Serve the status file's and netstat series on `/metrics` (vpn2's exporter).
    Exporter(ExporterArgs),
}

fn main() -> ExitCode {
    if envoy::invoked_as_envoy(std::env::args_os().next().as_deref()) {
        return exit(envoy_mode(&EnvoyCli::parse().args));
    }
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.sidecar_defaults = SidecarDefaults::of(&matches);
    let result = match &cli.command {
        Some(Command::Readiness) => return probe(probes::readiness(std::env::vars())),
        Some(Command::Liveness) => {
            return probe(probes::liveness(std::env::vars(), SystemTime::now()))
        }
        Some(Command::Sidecar(args)) => sidecar(args, &cli),
        Some(Command::Envoy(args)) => envoy_mode(args),
        Some(Command::Exporter(args)) => exporter(args, &cli),
        Some(Command::Setup) => setup(&cli),
        Some(Command::Firewall(args)) => firewall(args, &cli),
        None => server(&cli),
    };
    exit(result)
}

fn exit(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpn-server: error: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// A probe's outcome as vpn2 reports it: exit 0, or the reason as one line on stdout and
/// exit 1.
#[allow(clippy::print_stdout)] // the probe's output is its stdout
fn probe(result: Result<(), ProbeError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("{}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn server(cli: &Cli) -> Result<(), Box<dyn Error>> {
    let launch = load(cli.config.as_ref(), cli)?;
    init_logging(
        cli.log_format(),
        cli.log
            .as_deref()
            .unwrap_or(netio::logging::verb_filter(launch.loaded.verb)),
    )?;
    for w in &launch.loaded.warnings {
        tracing::warn!("{w}");
    }
    if cli.config.is_some() {
        return serve(|shutdown| launch::run(launch, shutdown));
    }
    // vpn2's environment: Gardener's seed pod, whose sidecar (another process's, or the one in
    // this process) drains on SIGTERM through the tunnel (`vpn_server::drain`,
    // `launch::run_with`).
    serve(|signal| {
        let tunnel = CancellationToken::new();
        tokio::spawn(drain::after_others(signal.clone(), tunnel.clone()));
        launch::run_with(launch, signal, tunnel)
    })
}

fn sidecar(args: &SidecarArgs, cli: &Cli) -> Result<(), Box<dyn Error>> {
    let config = args.resolve(&cli.secrets_dir, ShootNetworks::Vpn2Env, std::env::vars())?;
    init_logging(cli.log_format(), cli.log.as_deref().unwrap_or("info"))?;
    serve(|shutdown| sidecar::run(config, shutdown))
}

fn envoy_mode(args: &EnvoyArgs) -> Result<(), Box<dyn Error>> {
    let mode = args.resolve(std::env::vars())?;
    // The envoy-proxy container's log is read with Gardener's `envoy-proxy` parser.
    init_logging(Format::default_for(Format::Envoy), args.log_filter())?;
    let workers = args.concurrency.map(usize::from);
    serve_on(workers, |shutdown| envoy::run(mode, shutdown))
}

fn setup(cli: &Cli) -> Result<(), Box<dyn Error>> {
    init_logging(cli.log_format(), cli.log.as_deref().unwrap_or("info"))?;
    Ok(vpn2::setup()?)
}

fn firewall(args: &vpn2::FirewallArgs, cli: &Cli) -> Result<(), Box<dyn Error>> {
    init_logging(cli.log_format(), cli.log.as_deref().unwrap_or("info"))?;
    let args = args.clone();
    serve(|_| async move { vpn2::firewall(&args).await })
}

fn exporter(args: &ExporterArgs, cli: &Cli) -> Result<(), Box<dyn Error>> {
    let config = ExporterConfig::from_vpn2_env(std::env::vars(), args)?;
    init_logging(cli.log_format(), cli.log.as_deref().unwrap_or("info"))?;
    serve(|shutdown| exporter::run(config, shutdown))
}

/// The server's configuration: the file, else the vpn2 environment; the in-process sidecar's
/// shoot networks from the same source.
fn load(config: Option<&PathBuf>, cli: &Cli) -> Result<Launch, Box<dyn Error>> {
    let (mut loaded, firewall, guard) = match config {
        Some(path) => (load_file(path)?, None, None),
        None => {
            let env = Vpn2ServerEnv::parse(std::env::vars())?;
            // vpn2's rules, in a table the server owns for as long as it runs.
            let netmap = Netmap::vpn2(
                &env.shoot_pod_networks,
                &env.shoot_service_networks,
                &env.shoot_node_networks,
            )?;
            // HA has no device, so no rules on one (docs/ha.md: the server switches in the
            // process and hands no packet to its kernel).
            let table = (!env.is_ha)
                .then(|| vpn2::seed_table(env.device(), env.seed_pod_network, Some(&netmap)));
            // And what keeps the shoot's networks in the tunnel while the server restarts.
            let guard = (!env.is_ha).then(|| {
                vpn2::seed_guard(
                    env.device(),
                    &vpn2_shoot_iroutes(&env),
                    &env.shoot_networks(),
                )
            });
            (from_vpn2_env(&env, &cli.secrets_dir)?, table, guard)
        }
    };
    loaded.settings.hold_timeout = std::time::Duration::from_millis(cli.tun_hold_ms);
    let sidecar = match cli.sidecar {
        false => None,
        true => {
            let shoot = match config {
                None => ShootNetworks::Vpn2Env,
                Some(_) => ShootNetworks::Routes(loaded.settings.routes.clone()),
            };
            Some(
                cli.sidecar_args
                    .resolve(&cli.secrets_dir, shoot, std::env::vars())?,
            )
        }
    };
    let tunnel_guarded_ports = match (&sidecar, config) {
        (Some(sidecar), Some(_)) => cli.sidecar_defaults.ports(sidecar),
        _ => Vec::new(),
    };
    let tunnel_networks = loaded
        .settings
        .pool_v4
        .map(IpNet::V4)
        .into_iter()
        .chain(loaded.settings.pool_v6.map(IpNet::V6))
        .collect();
    let cloud_api = cli.cloud_api.resolve(tunnel_networks)?;
    Ok(Launch {
        loaded,
        sidecar,
        admin_listen: cli.admin_listen.clone(),
        firewall,
        guard,
        cloud_api,
        tunnel_guarded_ports,
    })
}

/// Whether `--sidecar-listen` and `--sidecar-metrics-listen` were left at their defaults
/// (every address of the host, so also the tunnel's). In a config-file start nothing else
/// keeps the tunnel from them (vpn2's environment mode holds the seed table), so the server
/// guards their ports on its device ([`Launch::tunnel_guarded_ports`]); addresses an operator
/// names, by flag or variable, are served as named.
#[derive(Debug, Clone, Copy, Default)]
struct SidecarDefaults {
    listen: bool,
    metrics_listen: bool,
}

impl SidecarDefaults {
    fn of(matches: &clap::ArgMatches) -> SidecarDefaults {
        let defaulted = |id| matches.value_source(id) == Some(ValueSource::DefaultValue);
        SidecarDefaults {
            listen: defaulted("listen"),
            metrics_listen: defaulted("metrics_listen"),
        }
    }

    /// The ports of the defaulted listeners of `sidecar`.
    fn ports(self, sidecar: &sidecar::SidecarConfig) -> Vec<u16> {
        let mut ports: Vec<u16> = [
            (self.listen, &sidecar.listen),
            (self.metrics_listen, &sidecar.metrics_listen),
        ]
        .into_iter()
        .filter(|(defaulted, _)| *defaulted)
        .flat_map(|(_, addrs)| addrs.iter().map(SocketAddr::port))
        .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

/// Runs `job` on a multi-thread runtime until it ends; SIGTERM / SIGINT cancel its token
/// (the handlers are installed before the job starts).
fn serve<F, Fut, E>(job: F) -> Result<(), Box<dyn Error>>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: Error + 'static,
{
    serve_on(None, job)
}

/// [`serve`] with `workers` worker threads (default: one per CPU).
fn serve_on<F, Fut, E>(workers: Option<usize>, job: F) -> Result<(), Box<dyn Error>>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: Error + 'static,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build()?;
    rt.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signals(shutdown.clone())?);
        job(shutdown)
            .await
            .map_err(|e| Box::new(e) as Box<dyn Error>)
    })
}

/// Installs the log subscriber: `filter`, lines in `format`.
fn init_logging(format: Format, filter: &str) -> Result<(), Box<dyn Error>> {
    netio::logging::init(filter, format).map_err(|e| format!("--log {filter:?}: {e}").into())
}

impl Cli {
    /// `--log-format`, else OpenVPN's layout (Gardener's `vpn-seed-server` parser) off a
    /// terminal.
    fn log_format(&self) -> Format {
        self.log_format
            .unwrap_or_else(|| Format::default_for(Format::Openvpn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults(args: &[&str]) -> (bool, bool) {
        let matches = Cli::command().get_matches_from(args);
        let d = SidecarDefaults::of(&matches);
        (d.listen, d.metrics_listen)
    }

    #[test]
    fn only_listeners_left_at_their_defaults_are_guarded() {
        assert_eq!(
            defaults(&["vpn-server", "--config", "f", "--sidecar"]),
            (true, true)
        );
        assert_eq!(
            defaults(&[
                "vpn-server",
                "--sidecar",
                "--sidecar-metrics-listen",
                "0.0.0.0:15000"
            ]),
            (true, false)
        );
        assert_eq!(
            defaults(&["vpn-server", "--sidecar-listen", "[::]:9443"]),
            (false, true)
        );
    }
}
