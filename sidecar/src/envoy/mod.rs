//! Envoy mode: what Gardener's `envoy-proxy` image runs, started as Gardener starts it. One
//! image-vector entry serves two configurations, told apart by their structure
//! ([`EnvoyArgs::resolve`]):
//!
//! * the VPN pods' CONNECT sidecar (an HTTP connection manager with a CONNECT route behind a
//!   TLS listener, [`bootstrap`]): this sidecar, below;
//! * the shoot's apiserver-proxy DaemonSet (a `tcp_proxy` with a `tunneling_config`,
//!   [`tunnel`]): the GEP-30 apiserver-proxy ([`crate::apiserver_proxy`]) with Envoy's series and access log ([`tcp_stats`]).
//!   Gardener starts `envoy --concurrency 2 --use-dynamic-base-id -c
//!   /etc/apiserver-proxy/envoy.yaml` as uid 0 with `NET_BIND_SERVICE` in the host network;
//!   the proxy listens on `<advertise address>:443`, and the stats listener on 16910 answers
//!   `/metrics` and the probes' `/ready` itself (no admin interface, no pipe in
//!   `/etc/admin-uds`).
//!
//! The CONNECT sidecar: Gardener starts `envoy --concurrency 2 -c /etc/envoy/envoy.yaml` with
//! no environment, as the image's non-root user (65532) in group 31415, all capabilities
//! dropped, with the
//! certificates at `/srv/secrets/envoy-proxy` and the ConfigMap at `/etc/envoy`. Our image
//! links `envoy` to `vpn-server`, which runs this mode when its program name is `envoy`
//! (or as `vpn-server envoy -c FILE …`):
//!
//! * the flags are Envoy's that Gardener passes ([`EnvoyArgs`]); an unknown flag is an error;
//! * everything else comes from the bootstrap file ([`bootstrap`]): listeners, certificates,
//!   whether a client certificate is required (Envoy: optional), `stat_prefix`, access log,
//!   connect timeout, connection limit, DNS cache; it and the certificates it names are read
//!   up to 1 MiB each (`netio::volume::MAX_FILE_BYTES`), a larger file is refused unread with
//!   its size;
//! * destinations outside the shoot networks are dialed, as Envoy's dynamic forward proxy
//!   does, except the always-denied ranges and the seed networks we know of
//!   (`SEED_POD_NETWORK` and `--sidecar-deny` / `SIDECAR_DENY`, when given: Gardener gives
//!   neither to this container); `--sidecar-external deny` (`SIDECAR_EXTERNAL`) keeps to the
//!   shoot networks (`SHOOT_*_NETWORKS`, vpn2's defaults when unset);
//! * no address translation of our own: the pod's `nat OUTPUT` rules for group 31415 map
//!   IPv4 shoot addresses into 242–244/8, as they did for Envoy;
//! * nothing is written but stdout (Envoy's access log) and stderr (our log, at Envoy's
//!   `--log-level`); no home directory, no admin pipe, no file; ports 9443 and 15000 need no
//!   privilege.

pub mod bootstrap;
pub mod tcp_stats;
pub mod tunnel;
pub mod yaml;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;
use netio::admin::{AdminBindError, AdminServer, AdminState};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::cli::{env_networks, read_tls, vpn2_shoot_networks, SidecarConfigError};
use super::{DestinationPolicy, External, SidecarConfig, SidecarError};
use crate::apiserver_proxy::{TunnelProxy, TunnelProxyError};
use tcp_stats::{TcpLabels, TcpProxyStats};
use tunnel::TunnelBootstrap;

/// The program name that selects Envoy mode.
pub const PROGRAM_NAME: &str = "envoy";

/// Envoy's command line as Gardener uses it, plus our two policy settings.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvoyArgs {
    /// The bootstrap file (Gardener's `/etc/envoy/envoy.yaml`).
    #[arg(short = 'c', long = "config-path", value_name = "FILE")]
    pub config_path: PathBuf,
    /// Worker threads (Envoy's worker count; default: one per CPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: Option<u16>,
    /// Log level of our log on stderr.
    #[arg(
        short = 'l',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        value_parser = clap::builder::PossibleValuesParser::new(
            ["trace", "debug", "info", "warning", "warn", "error", "critical", "off"]
        )
    )]
    pub log_level: String,
    /// Accepted and ignored (Envoy's hot-restart id; there is no hot restart here).
    #[arg(long)]
    pub use_dynamic_base_id: bool,
    /// Accepted and ignored, as `--use-dynamic-base-id`.
    #[arg(long, value_name = "N")]
    pub base_id: Option<u32>,
    /// Destinations outside the shoot networks: dialed directly (`allow`, Envoy's behaviour)
    /// or refused.
    #[arg(
        long = "sidecar-external",
        env = "SIDECAR_EXTERNAL",
        value_enum,
        default_value = "allow"
    )]
    pub external: External,
    /// Seed networks never dialed, comma-separated (added to `SEED_POD_NETWORK`).
    #[arg(long = "sidecar-deny", env = "SIDECAR_DENY", value_delimiter = ',')]
    pub deny: Vec<IpNet>,
}

/// Why Envoy mode could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyModeError {
    /// The bootstrap file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bootstrap file asks for something this sidecar cannot honour.
    #[error("{}", path.display())]
    Bootstrap {
        /// The file.
        path: PathBuf,
        /// Where and what.
        #[source]
        source: yaml::YamlError,
    },
    /// A certificate file or a network variable.
    #[error(transparent)]
    Config(#[from] SidecarConfigError),
}

/// What the bootstrap file asks this process to be.
#[derive(Debug)]
pub enum EnvoyMode {
    /// The VPN pods' CONNECT sidecar.
    Sidecar(Box<SidecarConfig>),
    /// The shoot's apiserver-proxy.
    ApiserverProxy(Box<TunnelBootstrap>),
}

/// Why Envoy mode stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyRunError {
    /// The CONNECT sidecar could not start.
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    /// The apiserver-proxy's listener could not be bound.
    #[error(transparent)]
    Tunnel(#[from] TunnelProxyError),
    /// Its stats listener could not be bound.
    #[error(transparent)]
    Stats(#[from] AdminBindError),
}

/// Runs `mode` until `shutdown`.
pub async fn run(mode: EnvoyMode, shutdown: CancellationToken) -> Result<(), EnvoyRunError> {
    match mode {
        EnvoyMode::Sidecar(config) => Ok(super::run(*config, shutdown).await?),
        EnvoyMode::ApiserverProxy(b) => run_apiserver_proxy(&b, shutdown).await,
    }
}

/// The apiserver-proxy: the tunnel proxy, counted by [`TcpProxyStats`], and its stats
/// listener.
async fn run_apiserver_proxy(
    b: &TunnelBootstrap,
    shutdown: CancellationToken,
) -> Result<(), EnvoyRunError> {
    super::raise_nofile_limit();
    let labels = TcpLabels::new(b.listen.first().copied(), &b.stat_prefix, &b.cluster);
    let stats = Arc::new(TcpProxyStats::new(labels, b.access_logs.clone()));
    let proxy = TunnelProxy::bind(b.tunnel_config(), stats.clone())?;
    let mut admin = AdminServer::bind(&b.stats_listen)?;
    if b.ready {
        admin = admin.with_ready_path(tunnel::READY_PATH);
    }
    let ingress = format!("{}:{}", b.proxy.0, b.proxy.1);
    for addr in proxy.local_addrs() {
        info!(%addr, %ingress, "apiserver-proxy listening");
    }
    let parts: Vec<Arc<dyn AdminState>> = vec![stats.clone()];
    stats.set_serving(true);
    let serving = async {
        shutdown.cancelled().await;
        stats.set_serving(false);
    };
    tokio::join!(
        proxy.run(shutdown.clone()),
        admin.serve(parts, shutdown.clone()),
        serving
    );
    info!("apiserver-proxy stopped");
    Ok(())
}

impl EnvoyArgs {
    /// What to run: the bootstrap file read by the reader its structure asks for (a
    /// `tcp_proxy` listener: the apiserver-proxy; else the CONNECT sidecar, with the
    /// certificates the file names and the optional variables of the module docs from `env`).
    pub fn resolve<I>(&self, env: I) -> Result<EnvoyMode, EnvoyModeError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let path = &self.config_path;
        let text = netio::volume::read_text_bounded(path, netio::volume::MAX_FILE_BYTES).map_err(
            |source| EnvoyModeError::Read {
                path: path.clone(),
                source,
            },
        )?;
        let in_file = |source| EnvoyModeError::Bootstrap {
            path: path.clone(),
            source,
        };
        let doc = yaml::load(&text).map_err(in_file)?;
        let root = yaml::Node::root(&doc, &text);
        if tunnel::recognised(&root) {
            let b = tunnel::from_root(&root).map_err(in_file)?;
            return Ok(EnvoyMode::ApiserverProxy(Box::new(b)));
        }
        let b = bootstrap::from_root(&root).map_err(in_file)?;
        let (identity, trust) = read_tls(&b.cert_chain, &b.private_key, &b.trusted_ca)?;
        let env: HashMap<String, String> = env.into_iter().collect();
        let mut seed = self.deny.clone();
        seed.extend(env_networks(&env, "SEED_POD_NETWORK", "")?);
        let [pods, services, nodes] = vpn2_shoot_networks(&env)?;
        let policy = DestinationPolicy::from_shoot_networks(&pods, &services, &nodes, seed)
            .with_external(self.external);
        let mut config = SidecarConfig::new(identity, trust, policy);
        config.listen = b.listen;
        config.metrics_listen = b.metrics_listen;
        config.client_cert = b.client_cert;
        config.connect_timeout = b.connect_timeout;
        // Envoy's SYN retransmits wait for a reconnecting tunnel until `connect_timeout`
        // (why Gardener set it to 20 s): ours wait for the route as long.
        config.hold_timeout = b.connect_timeout;
        config.max_connections = b.max_connections;
        config.dns = b.dns;
        config.stat_prefix = b.stat_prefix;
        config.access_logs = b.access_logs;
        Ok(EnvoyMode::Sidecar(Box::new(config)))
    }

    /// Our log filter for Envoy's `--log-level`.
    pub fn log_filter(&self) -> &'static str {
        match self.log_level.as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "warning" | "warn" => "warn",
            "error" | "critical" => "error",
            "off" => "off",
            _ => "info",
        }
    }
}

/// Whether the program was started as `envoy` (the last component of `argv[0]`).
pub fn invoked_as_envoy(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .is_some_and(|name| name == PROGRAM_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use pki::tls::ClientCertMode;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: EnvoyArgs,
    }

    fn parse(argv: &[&str]) -> Result<EnvoyArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("envoy").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn gardeners_command_line_and_envoys_harmless_flags() {
        let a = parse(&["--concurrency", "2", "-c", "/etc/envoy/envoy.yaml"]).unwrap();
        assert_eq!(a.concurrency, Some(2));
        assert_eq!(a.config_path, PathBuf::from("/etc/envoy/envoy.yaml"));
        assert_eq!(a.log_filter(), "info");
        assert_eq!(a.external, External::Allow);
        let a = parse(&[
            "--config-path=/x.yaml",
            "--use-dynamic-base-id",
            "-l",
            "warning",
            "--base-id",
            "3",
        ])
        .unwrap();
        assert_eq!(a.log_filter(), "warn");
        assert!(a.use_dynamic_base_id);
        for bad in [
            &["-c", "/x", "--mode", "validate"][..],
            &["-c", "/x", "--config-yaml", "{}"],
            &["-c", "/x", "-l", "loud"],
            &["-c", "/x", "--concurrency", "0"],
            &["--concurrency", "2"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_ne!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{bad:?}");
        }
    }

    #[test]
    fn program_name() {
        let yes = |s: &str| invoked_as_envoy(Some(std::ffi::OsStr::new(s)));
        assert!(yes("envoy"));
        assert!(yes("/usr/local/bin/envoy"));
        assert!(!yes("/bin/vpn-server"));
        assert!(!yes("envoy-proxy"));
        assert!(!invoked_as_envoy(None));
    }

    /// The fixture with its certificate directory moved to `dir`.
    fn bootstrap_in(dir: &std::path::Path) -> PathBuf {
        let text = include_str!("../../fixtures/gardener-envoy.yaml")
            .replace("/srv/secrets/envoy-proxy", &dir.display().to_string());
        let path = dir.join("envoy.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn sidecar(mode: EnvoyMode) -> SidecarConfig {
        match mode {
            EnvoyMode::Sidecar(c) => *c,
            other => panic!("not the sidecar: {other:?}"),
        }
    }

    #[test]
    fn the_kube_apiserver_pods_certificates_chain_including_the_ca() {
        // HA with overlapping networks: the `kube-apiserver-http-proxy` secret's chain
        // carries the CA after the leaf; the same file names it.
        let pki = lab::sidecar_client::Pki::generate();
        let dir = tempfile::tempdir().unwrap();
        let mut chain = pki.server.chain_pem().unwrap();
        chain.extend(pki.bundle.to_pem().unwrap());
        std::fs::write(dir.path().join("tls.crt"), chain).unwrap();
        std::fs::write(dir.path().join("tls.key"), pki.server.key_pem().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.crt"), pki.bundle.to_pem().unwrap()).unwrap();
        let args = parse(&["-c", &bootstrap_in(dir.path()).display().to_string()]).unwrap();
        let c = sidecar(args.resolve(Vec::new()).unwrap());
        assert_eq!(c.identity.chain().len(), 2);
        assert_eq!(c.client_cert, ClientCertMode::Optional);
        assert_eq!(c.stat_prefix, "ingress_http");
        assert_eq!(c.access_logs.len(), 1);
        assert_eq!(c.max_connections, 8192);
        // A CONNECT waits for a reconnecting tunnel as long as Envoy's connect would.
        assert_eq!(c.hold_timeout, c.connect_timeout);
        assert_eq!(c.metric_labels().listener_address, "0.0.0.0_9443");
        assert_eq!(c.policy.external(), External::Allow);
        // No environment: no seed network known; vpn2's default shoot networks.
        assert!(c.policy.seed().is_empty());
        let seeded = sidecar(
            args.resolve([("SEED_POD_NETWORK".to_owned(), "10.1.0.0/16".to_owned())])
                .unwrap(),
        );
        assert_eq!(
            seeded.policy.seed(),
            &["10.1.0.0/16".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn the_apiserver_proxy_file_is_told_apart_by_its_structure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("envoy.yaml");
        let text = include_str!("../../fixtures/gardener-apiserver-proxy.yaml");
        std::fs::write(&path, text).unwrap();
        let args = parse(&[
            "--concurrency",
            "2",
            "--use-dynamic-base-id",
            "-c",
            &path.display().to_string(),
        ])
        .unwrap();
        let EnvoyMode::ApiserverProxy(b) = args.resolve(Vec::new()).unwrap() else {
            panic!("not the apiserver-proxy");
        };
        assert_eq!(b.listen, ["240.168.102.23:443".parse().unwrap()]);
        // No certificate is read, and the sidecar's variables play no part.
        let odd = [("SEED_POD_NETWORK".to_owned(), "not a network".to_owned())];
        assert!(args.resolve(odd).is_ok());
        std::fs::write(
            &path,
            text.replace("connect_timeout: 5s", "connect_timeout: 5"),
        )
        .unwrap();
        let e = netio::report::chain(&args.resolve(Vec::new()).unwrap_err());
        assert!(
            e.starts_with(&format!(
                "{}: line 122: static_resources.clusters[0].connect_timeout: expected a string",
                path.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_file_line_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = bootstrap_in(dir.path());
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("lb_policy: CLUSTER_PROVIDED", "lb_policy: RANDOM");
        std::fs::write(&path, text).unwrap();
        let args = parse(&["-c", &path.display().to_string()]).unwrap();
        let e = args.resolve(Vec::new()).unwrap_err();
        let text = netio::report::chain(&e);
        assert!(
            text.starts_with(&format!("{}: line 131: static_resources.clusters[0].lb_policy: unsupported value \"RANDOM\"", path.display())),
            "{text}"
        );
        let missing = parse(&["-c", "/nonexistent/envoy.yaml"]).unwrap();
        let e = netio::report::chain(&missing.resolve(Vec::new()).unwrap_err());
        assert!(e.starts_with("cannot read /nonexistent/envoy.yaml"), "{e}");
    }

    #[test]
    fn files_over_a_mebibyte_are_refused_unread_with_their_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = bootstrap_in(dir.path());
        let mut text = std::fs::read_to_string(&path).unwrap();
        let size = usize::try_from(netio::volume::MAX_FILE_BYTES).unwrap() + 1 - text.len();
        text.push_str(&"#".repeat(size));
        std::fs::write(&path, text).unwrap();
        let args = parse(&["-c", &path.display().to_string()]).unwrap();
        let e = netio::report::chain(&args.resolve(Vec::new()).unwrap_err());
        assert_eq!(
            e,
            format!(
                "cannot read {}: 1048577 bytes, more than the 1048576 bytes a file may have",
                path.display()
            )
        );
        // A certificate the file names.
        let path = bootstrap_in(dir.path());
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "x".repeat(2 << 20)).unwrap();
        std::fs::write(dir.path().join("tls.key"), "x").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "x").unwrap();
        let args = parse(&["-c", &path.display().to_string()]).unwrap();
        let e = netio::report::chain(&args.resolve(Vec::new()).unwrap_err());
        assert!(
            e.contains(&cert.display().to_string())
                && e.contains("2097152 bytes, more than the 1048576 bytes a file may have"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let missing = parse(&["-c", "/nonexistent/envoy.yaml"]).unwrap();
        let e = netio::report::chain(&missing.resolve(Vec::new()).unwrap_err());
        assert!(e.starts_with("cannot read /nonexistent/envoy.yaml"), "{e}");
    }
}
