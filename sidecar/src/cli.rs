//! The sidecar's flags (each also an environment variable), shared by `vpn-server --sidecar`
//! (in-process) and `vpn-server sidecar` (alone), and their resolution into a
//! [`SidecarConfig`].
//!
//! Defaults when a flag is not given:
//!
//! * certificate, key and CA bundle: vpn2's files under the secrets directory
//!   (`vpn-server/tls.crt`, `vpn-server/tls.key`, `vpn-server/ca.crt`), which Envoy used too;
//! * allowed networks: in-process, the networks the server routes into the tunnel (its
//!   `route` directives, which vpn2's environment fills with the shoot networks) plus vpn2's
//!   mapped ranges; alone, the vpn2 variables `SHOOT_POD_NETWORKS`, `SHOOT_SERVICE_NETWORKS`,
//!   `SHOOT_NODE_NETWORKS` (vpn2's defaults when unset) plus the mapped ranges;
//! * denied seed networks: `--sidecar-deny` plus vpn2's `SEED_POD_NETWORK`;
//! * address translation ([`Netmap`]): vpn2's, when the networks come from its environment
//!   and `--sidecar-allow` is not given; none otherwise;
//! * the restart guard (`--sidecar-restart-guard-ms`): 2 s (the library's default is none,
//!   so that a sidecar built in a test or another program touches no firewall unless asked);
//! * destinations outside the shoot networks (`--sidecar-external`): `deny`. Envoy mode
//!   (`super::envoy`) allows them, as Envoy's dynamic forward proxy does; here they stay
//!   refused unless asked for, because these modes are our own deployments, configured with
//!   our variables, whose sidecar has always been limited to the shoot (DESIGN decision 6): a
//!   new release must not silently widen what it reaches. `SIDECAR_EXTERNAL=allow` is the one
//!   switch for webhooks with external URLs; name the seed's networks with it
//!   (`SEED_POD_NETWORK`, `--sidecar-deny`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use ipnet::IpNet;
use pki::pem::{CaBundle, Identity, PemError};
use pki::tls::ClientCertMode;

use super::policy::NetmapError;
use super::{DestinationPolicy, External, Netmap, SidecarConfig};

/// Whether the sidecar requires a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientCertArg {
    /// The handshake fails without a certificate signed by the bundle (default).
    Required,
    /// A presented certificate must verify; none is accepted (Envoy's behaviour).
    Optional,
}

/// The sidecar's command-line flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SidecarArgs {
    /// TLS listen addresses, comma-separated.
    #[arg(
        long = "sidecar-listen",
        env = "SIDECAR_LISTEN",
        value_delimiter = ',',
        default_value = "0.0.0.0:9443,[::]:9443"
    )]
    pub listen: Vec<SocketAddr>,
    /// Plain-HTTP `GET /metrics` listen addresses, comma-separated; `none` for no listener.
    #[arg(
        long = "sidecar-metrics-listen",
        env = "SIDECAR_METRICS_LISTEN",
        value_delimiter = ',',
        default_value = "0.0.0.0:15000,[::]:15000"
    )]
    pub metrics_listen: Vec<String>,
    /// Server certificate chain (PEM); default `<secrets-dir>/vpn-server/tls.crt`.
    #[arg(long = "sidecar-cert", env = "SIDECAR_CERT")]
    pub cert: Option<PathBuf>,
    /// Server private key (PEM); default `<secrets-dir>/vpn-server/tls.key`.
    #[arg(long = "sidecar-key", env = "SIDECAR_KEY")]
    pub key: Option<PathBuf>,
    /// CA bundle for client certificates (PEM); default `<secrets-dir>/vpn-server/ca.crt`.
    #[arg(long = "sidecar-ca", env = "SIDECAR_CA")]
    pub ca: Option<PathBuf>,
    /// Whether a client certificate is required.
    #[arg(
        long = "sidecar-client-cert",
        env = "SIDECAR_CLIENT_CERT",
        value_enum,
        default_value = "required"
    )]
    pub client_cert: ClientCertArg,
    /// Allowed destination networks, comma-separated (replaces the default shoot networks).
    #[arg(long = "sidecar-allow", env = "SIDECAR_ALLOW", value_delimiter = ',')]
    pub allow: Vec<IpNet>,
    /// Seed networks never dialed, comma-separated (added to `SEED_POD_NETWORK`).
    #[arg(long = "sidecar-deny", env = "SIDECAR_DENY", value_delimiter = ',')]
    pub deny: Vec<IpNet>,
    /// Destinations outside the shoot networks: dialed directly (`allow`) or refused.
    #[arg(
        long = "sidecar-external",
        env = "SIDECAR_EXTERNAL",
        value_enum,
        default_value = "deny"
    )]
    pub external: External,
    /// Upstream connect timeout in seconds; at least 1.
    #[arg(
        long = "sidecar-connect-timeout",
        env = "SIDECAR_CONNECT_TIMEOUT",
        default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub connect_timeout_secs: u64,
    /// How long a CONNECT to the shoot waits for a route (the tunnel) when none is there,
    /// in milliseconds (Envoy mode: the cluster's `connect_timeout`); 503 at the bound. 0:
    /// no wait.
    #[arg(
        long = "sidecar-hold-timeout-ms",
        env = "SIDECAR_HOLD_TIMEOUT_MS",
        default_value_t = 20_000
    )]
    pub hold_timeout_ms: u64,
    /// After SIGTERM, how long open connections may finish, in milliseconds; the listeners
    /// keep accepting until none is open. 0: end them at once, as Envoy does.
    #[arg(
        long = "sidecar-drain-timeout-ms",
        env = "SIDECAR_DRAIN_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub drain_timeout_ms: u64,
    /// How long after this process's last sign of life a SYN to the TLS listeners' ports that
    /// no socket takes is still dropped (the client's kernel sends it again) instead of
    /// refused, in milliseconds: a restart in place within it loses no connection. Refreshed
    /// every quarter of it while the process lives; needs `CAP_NET_ADMIN`. 0: no guard.
    #[arg(
        long = "sidecar-restart-guard-ms",
        env = "SIDECAR_RESTART_GUARD_MS",
        default_value_t = super::DEFAULT_RESTART_GUARD_MS
    )]
    pub restart_guard_ms: u64,
    /// CONNECTs waiting for a route at once, at least 1; the next gets 503 at once.
    #[arg(
        long = "sidecar-max-held",
        env = "SIDECAR_MAX_HELD",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u64).range(1..).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    )]
    pub max_held: usize,
    /// Idle timeout of a tunnel in seconds (no bytes either way); at least 1.
    #[arg(
        long = "sidecar-idle-timeout",
        env = "SIDECAR_IDLE_TIMEOUT",
        default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub idle_timeout_secs: u64,
    /// Concurrent tunnels, at least 1; the next CONNECT gets 503.
    #[arg(
        long = "sidecar-max-connections",
        env = "SIDECAR_MAX_CONNECTIONS",
        default_value_t = 8192,
        value_parser = clap::value_parser!(u64).range(1..).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    )]
    pub max_connections: usize,
}

/// Why the sidecar's configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SidecarConfigError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A certificate, key or bundle did not parse.
    #[error("invalid PEM in {path}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: PemError,
    },
    /// A vpn2 network variable did not parse.
    #[error("invalid network {value:?} in {var}")]
    Network {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The shoot networks do not fit vpn2's mapped ranges.
    #[error("cannot map the shoot networks")]
    Netmap(#[from] NetmapError),
    /// A metrics listen address did not parse.
    #[error("invalid metrics listen address {value:?}")]
    MetricsListen {
        /// The value.
        value: String,
    },
}

/// Where the default allowed networks come from.
#[derive(Debug, Clone)]
pub enum ShootNetworks {
    /// In-process: the networks the server routes into the tunnel.
    Routes(Vec<IpNet>),
    /// vpn2's `SHOOT_*_NETWORKS` environment variables (alone, or in-process in vpn2
    /// environment mode), with vpn2's address translation.
    Vpn2Env,
}

/// vpn2's defaults for the shoot networks when the variables are unset.
const VPN2_DEFAULT_SERVICE_NETWORKS: &str = "100.64.0.0/13";
const VPN2_DEFAULT_POD_NETWORKS: &str = "100.96.0.0/11";

impl SidecarArgs {
    /// Resolves the flags: files read from `secrets_dir` unless given, networks from
    /// `shoot` unless `--sidecar-allow` is given, `SEED_POD_NETWORK` from `env`.
    pub fn resolve<I>(
        &self,
        secrets_dir: &Path,
        shoot: ShootNetworks,
        env: I,
    ) -> Result<SidecarConfig, SidecarConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let env: std::collections::HashMap<String, String> = env.into_iter().collect();
        let file = |given: &Option<PathBuf>, default: &str| {
            given
                .clone()
                .unwrap_or_else(|| secrets_dir.join("vpn-server").join(default))
        };
        let (identity, trust) = read_tls(
            &file(&self.cert, "tls.crt"),
            &file(&self.key, "tls.key"),
            &file(&self.ca, "ca.crt"),
        )?;
        let mut seed = self.deny.clone();
        seed.extend(env_networks(&env, "SEED_POD_NETWORK", "")?);
        let mut netmap = Netmap::none();
        let policy = if !self.allow.is_empty() {
            DestinationPolicy::new(self.allow.clone(), seed)
        } else {
            match shoot {
                ShootNetworks::Routes(routes) => {
                    // Routes carry no kind; any IPv4 one adds every mapped range.
                    DestinationPolicy::from_shoot_networks(&routes, &routes, &routes, seed)
                }
                ShootNetworks::Vpn2Env => {
                    let [pods, services, nodes] = vpn2_shoot_networks(&env)?;
                    netmap = Netmap::vpn2(&pods, &services, &nodes)?;
                    DestinationPolicy::from_shoot_networks(&pods, &services, &nodes, seed)
                }
            }
        };
        let metrics_listen = self
            .metrics_listen
            .iter()
            .filter(|s| !s.is_empty() && s.as_str() != "none")
            .map(|s| {
                s.parse()
                    .map_err(|_| SidecarConfigError::MetricsListen { value: s.clone() })
            })
            .collect::<Result<Vec<SocketAddr>, _>>()?;
        let mut config = SidecarConfig::new(identity, trust, policy.with_external(self.external));
        config.listen = self.listen.clone();
        config.metrics_listen = metrics_listen;
        config.netmap = netmap;
        config.client_cert = match self.client_cert {
            ClientCertArg::Required => ClientCertMode::Required,
            ClientCertArg::Optional => ClientCertMode::Optional,
        };
        config.connect_timeout = Duration::from_secs(self.connect_timeout_secs);
        config.hold_timeout = Duration::from_millis(self.hold_timeout_ms);
        config.max_held = self.max_held;
        config.drain_timeout = Duration::from_millis(self.drain_timeout_ms);
        config.restart_guard = Duration::from_millis(self.restart_guard_ms);
        config.idle_timeout = Duration::from_secs(self.idle_timeout_secs);
        config.max_connections = self.max_connections;
        Ok(config)
    }
}

/// The server identity (chain and key) and the client CA bundle from PEM files.
pub(super) fn read_tls(
    cert: &Path,
    key: &Path,
    ca: &Path,
) -> Result<(Identity, CaBundle), SidecarConfigError> {
    let identity = Identity::from_pem(&read(cert)?, &read(key)?).map_err(|source| {
        SidecarConfigError::Pem {
            path: cert.to_owned(),
            source,
        }
    })?;
    let trust = CaBundle::from_pem(&read(ca)?).map_err(|source| SidecarConfigError::Pem {
        path: ca.to_owned(),
        source,
    })?;
    Ok((identity, trust))
}

/// The comma-separated networks of the vpn2 variable `var` (`default` when unset).
pub(super) fn env_networks(
    env: &std::collections::HashMap<String, String>,
    var: &'static str,
    default: &str,
) -> Result<Vec<IpNet>, SidecarConfigError> {
    let value = env.get(var).map(String::as_str).unwrap_or(default);
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| SidecarConfigError::Network {
                var,
                value: value.to_owned(),
            })
        })
        .collect()
}

/// vpn2's shoot networks from its variables (its defaults when unset): pods, services, nodes.
pub(super) fn vpn2_shoot_networks(
    env: &std::collections::HashMap<String, String>,
) -> Result<[Vec<IpNet>; 3], SidecarConfigError> {
    Ok([
        env_networks(env, "SHOOT_POD_NETWORKS", VPN2_DEFAULT_POD_NETWORKS)?,
        env_networks(env, "SHOOT_SERVICE_NETWORKS", VPN2_DEFAULT_SERVICE_NETWORKS)?,
        env_networks(env, "SHOOT_NODE_NETWORKS", "")?,
    ])
}

/// Reads a certificate or key file: at most 1 MiB (`netio::volume::MAX_FILE_BYTES`, what a
/// Secret holds), else refused unread with its size.
fn read(path: &Path) -> Result<Vec<u8>, SidecarConfigError> {
    netio::volume::read_file_bounded(path, netio::volume::MAX_FILE_BYTES).map_err(|source| {
        SidecarConfigError::Read {
            path: path.to_owned(),
            source,
        }
    })
}
