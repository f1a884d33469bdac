//! `vpn-router`: the seed's ingress router (see the `vpn_router` library).
//!
//! `vpn-router --config FILE` routes HTTP CONNECT requests by header to the seed's VPN servers
//! and kube-apiservers; SIGHUP reloads the routes and allow-lists, SIGTERM or SIGINT ends it.
//! `vpn-router --config-dir DIR` reads a seed file and one file per shoot instead, and reads
//! them again whenever they change (`vpn_router::config_dir`).
//! `vpn-router --config FILE --kubernetes` takes the routes and allow-lists from the objects
//! Gardener and the ACL extension create in the seed instead (`vpn_router::kubernetes`).
//! A binary of its own, not a subcommand of `vpn-server`: it runs in the ingress deployment,
//! not beside each VPN server, and leaving it (and its TOML parser) out of `vpn-server` keeps
//! that binary's text, and so every VPN server's resident memory, smaller. Errors are one line
//! on stderr and a failure status.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{ArgGroup, Parser};
use netio::logging::Format;
use netio::report::chain;
use netio::signals::cancel_on_signals;
use tokio_util::sync::CancellationToken;
use vpn_router::Router;

netio::libm_pow!();

/// The seed's ingress router: CONNECT routing by header, allow-lists, PROXY protocol.
#[derive(Debug, Parser)]
#[command(name = "vpn-router", version, about)]
#[command(group(ArgGroup::new("source").required(true).args(["config", "config_dir"])))]
struct RouterArgs {
    /// The router's TOML config file (format: the `vpn_router` crate docs).
    #[arg(
        long,
        env = "VPN_ROUTER_CONFIG",
        required_unless_present = "config_dir",
        conflicts_with = "config_dir"
    )]
    config: Option<PathBuf>,
    /// A config directory: `seed.toml` and one `<shoot>.toml` per shoot, polled for changes
    /// (`vpn_router::config_dir`; a mounted ConfigMap or Secret).
    #[arg(long, env = "VPN_ROUTER_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Take the routes and allow-lists from the Kubernetes objects Gardener and the ACL
    /// extension create (`vpn_router::kubernetes`); the `--config` file holds the rest.
    #[arg(
        long,
        env = "VPN_ROUTER_KUBERNETES",
        requires = "config",
        conflicts_with = "config_dir"
    )]
    kubernetes: bool,
    /// With `--kubernetes`: a kubeconfig file; without, the pod's service account (in the
    /// cluster), else `KUBECONFIG` or `~/.kube/config`.
    #[arg(long, env = "VPN_ROUTER_KUBECONFIG", requires = "kubernetes")]
    kubeconfig: Option<PathBuf>,
    /// With `--kubernetes`: the router's namespace; Services must be exported to it
    /// (`networking.istio.io/exportTo`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-ingress")]
    namespace: String,
    /// With `--kubernetes`: the router pods' labels, `k=v,...`; the Gateways whose
    /// `spec.selector` they satisfy are served (default: Gardener's default gateway's).
    #[arg(long, env = "VPN_ROUTER_GATEWAY_LABELS", default_value = vpn_router::kubernetes::DEFAULT_GATEWAY_LABELS)]
    gateway_labels: String,
    /// With `--kubernetes`: the ACL extension's `--additional-allowed-cidrs` (comma list),
    /// allowed on every shoot with an ACL.
    #[arg(
        long,
        env = "VPN_ROUTER_ADDITIONAL_ALLOWED_CIDRS",
        value_delimiter = ','
    )]
    additional_allowed_cidrs: Vec<ipnet::IpNet>,
    /// Log filter (`LEVEL` and `target=LEVEL` directives, e.g. `info,vpn_router=debug`).
    #[arg(long, env = "VPN_ROUTER_LOG", default_value = "info")]
    log: String,
    /// Log line format: openvpn, ctime, envoy, json or full (`netio::logging`); default full on
    /// a terminal, else openvpn.
    #[arg(long, env = "VPN_ROUTER_LOG_FORMAT")]
    log_format: Option<Format>,
}

fn main() -> ExitCode {
    match run(RouterArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpn-router: error: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Loads the config, binds, serves until SIGTERM or SIGINT; SIGHUP reloads the policy.
fn run(args: RouterArgs) -> anyhow::Result<()> {
    let format = args
        .log_format
        .unwrap_or_else(|| Format::default_for(Format::Openvpn));
    netio::logging::init(&args.log, format).with_context(|| format!("--log {:?}", args.log))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async {
        // Signal handlers first, so a SIGTERM during start-up also ends in a clean exit.
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signals(shutdown.clone()).context("signal handlers")?);
        if args.kubernetes {
            let file = args
                .config
                .as_deref()
                .context("--kubernetes needs --config FILE")?;
            let router = Router::bind(file).await?;
            let options = vpn_router::kubernetes::Options {
                kubeconfig: args.kubeconfig.clone(),
                settings: vpn_router::kubernetes::Settings {
                    namespace: args.namespace.clone(),
                    labels: labels(&args.gateway_labels)?,
                    additional_allowed: args.additional_allowed_cidrs.clone(),
                },
            };
            vpn_router::kubernetes::serve(router, options, shutdown).await?;
            return Ok(());
        }
        let router = match (&args.config, &args.config_dir) {
            (_, Some(dir)) => Router::bind_dir(dir).await?,
            (Some(file), None) => Router::bind(file).await?,
            (None, None) => anyhow::bail!("--config FILE or --config-dir DIR is needed"),
        };
        router.run_with_sighup(shutdown).await?;
        Ok(())
    })
}

/// `k=v,...` as a map.
fn labels(text: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .with_context(|| format!("--gateway-labels: {pair:?} is not key=value"))?;
            Ok((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}
