//! `sidecar`: what replaces Gardener's Envoy around the VPN. The CONNECT sidecar ([`Sidecar`]:
//! the mTLS HTTP CONNECT proxy in the vpn-seed-server pod that the kube-apiserver's egress
//! selector (`cluster`) uses to reach kubelets, webhooks and pods in the shoot), its Envoy
//! mode (the same program started as Gardener starts Envoy, configured by Gardener's
//! envoy.yaml), and the GEP-30 apiserver-proxy ([`apiserver_proxy`]). A library: the
//! binaries that run it are `vpn-server` (`--sidecar`, `vpn-server sidecar`, `envoy` /
//! `vpn-server envoy`) and `vpn-client` (`vpn-client apiserver-proxy`).
//!
//! | module | what it is |
//! |---|---|
//! | this file | [`SidecarConfig`], [`Sidecar`] (bind, restart guard, serve, drain), [`run`] (the sidecar alone), [`RouteCheck`] |
//! | [`cli`] | the `--sidecar-*` flags (`SIDECAR_*` variables) → [`SidecarConfig`] |
//! | [`policy`] | which destinations may be dialed; vpn2's address mapping ([`Netmap`]) |
//! | `proxy` | one connection: TLS, CONNECT head, policy, dial, relay, access log line |
//! | [`dns`] | names in CONNECT targets: Envoy's DNS cache (`max_hosts`, refresh, TTL) |
//! | `hold` | CONNECTs waiting for a route: `max_held`, the reconnect window's log lines |
//! | [`metrics`] | the sidecar's counters under Envoy's series names (`docs/metrics.md`) |
//! | [`access_log`] | Envoy's access log: format strings, filters, one line per request |
//! | [`envoy`] | Envoy mode: Envoy's flags, Gardener's envoy.yaml read ([`envoy::bootstrap`], [`envoy::tunnel`], [`envoy::yaml`]), the apiserver-proxy's Envoy series ([`envoy::tcp_stats`]) |
//! | [`apiserver_proxy`] | GEP-30's apiserver-proxy, both programs' core: the data path ([`apiserver_proxy::tunnel`]), the CONNECT request, Gardener's defaults and header check, `vpn-client apiserver-proxy`'s flags |
//!
//! # The CONNECT sidecar
//!
//! ```text
//!  kube-apiserver ──TLS (client cert required)──► listener 0.0.0.0:9443 and [::]:9443
//!     CONNECT 10.250.0.5:10250 HTTP/1.1             │ pending: at most `max_pending`, the
//!                                                   │ oldest evicted for a newcomer; TLS
//!                                                   │ and head within `header_timeout`
//!                                                   ▼
//!     400 / 405  malformed head / not CONNECT
//!     503/504  a name did not resolve (pod resolver, `dns` cache) / cache full
//!     403  policy: loopback / link-local / seed, or outside the shoot networks when external
//!          destinations are denied, or an address of this host (no connect attempt)
//!     wait while no connected client routes the destination (in process: the server's
//!          routes; alone: the connect's "no route"), up to `hold_timeout`
//!     503  still no route at `hold_timeout`, or `max_held` already waiting (at once)
//!     503  `max_connections` tunnels already open
//!     503/504  connect failed / took longer than `connect_timeout`
//!     200  then one relay (netio::relay): half-close both ways, `idle_timeout`
//! ```
//!
//! **Running it.** `vpn-server --sidecar` (`VPN_SERVER_SIDECAR=true`) runs it beside the
//! OpenVPN server in one process; `vpn-server sidecar` runs it alone. The `--sidecar-*` flags
//! (each also a `SIDECAR_*` variable) and their defaults are in [`cli`]; the metrics and their
//! names in [`metrics`]; the destination rules in [`policy`]. In Gardener's `envoy-proxy`
//! container it runs in **Envoy mode** ([`envoy`]): invoked as `envoy` with Envoy's flags, it
//! takes everything from Gardener's envoy.yaml and writes Envoy's access log ([`access_log`]).
//!
//! **No route to the shoot: hold, don't fail.** A CONNECT to the shoot that finds no route
//! (a client reconnecting, the tunnel down) waits for it up to `hold_timeout` (Envoy mode: the
//! bootstrap's `connect_timeout`, which Gardener set to 20 s so that Envoy's SYN retransmits
//! ride out a reconnect; else `--sidecar-hold-timeout-ms`, default 20 s), then proceeds; only
//! at the bound is it answered 503 (`hold`: at most `max_held` wait, the next gets 503 at
//! once; counted and timed in `vpn_sidecar_held*`; one log line per reconnect window).
//! Inside the vpn-server process the sidecar gets a [`RouteCheck`] (the server's
//! `vpn_server::ClientRoutes`): a destination no connected client's address or iroute covers
//! (its tunnel up) waits for [`RouteCheck::changes`], woken when a tunnel comes up, never
//! polling, and nothing is dialed before. Run alone (`vpn-server sidecar`, Envoy mode) it has
//! no such view and dials: the kernel sends the SYN into the tun device, where our server
//! holds it for a reconnecting client (`vpn_server::registry::hold`) and sends it when the
//! tunnel is back; a connect that fails with "no route" (the device gone with a restarting
//! server, or the server's ICMP "host unreachable" for a destination no client routed within
//! its bound) is dialed again every [`HOLD_RETRY`] until the bound. Against a server that
//! drops such packets silently (upstream OpenVPN), the standalone sidecar answers 504 after
//! `connect_timeout`.
//!
//! **Address translation.** vpn2's shoot client expects IPv4 shoot addresses mapped into
//! `242/8`-`244/8` (vpn2 did that with NAT rules matching Envoy's group id 31415), and the
//! server's iroute for it covers only those ranges. With [`SidecarConfig::netmap`] set (the
//! default when the networks come from vpn2's environment) the sidecar dials the mapped
//! address itself; the policy is checked on the address as requested. A seed network always
//! wins over an overlapping shoot network.
//!
//! **Pending connections.** Until its CONNECT head has arrived a connection holds a place among
//! at most `max_pending` ([`netio::listen::PendingSet`]). A newcomer to a full set evicts the
//! oldest connection still in its TLS handshake, or, when every pending one has finished it,
//! the oldest of those; it is closed unanswered. Envoy has no such bound by default (a
//! connection limit, where one is configured, refuses newcomers); refusing the newcomer, as
//! this sidecar did, let a thousand silent connections keep the kube-apiserver out for the
//! header timeout, again and again. A completed handshake means a client certificate the CA signed
//! (unless `--sidecar-client-cert optional`), so a flood that cannot present one only ever
//! evicts itself. Evictions, timeouts and failed handshakes are counted
//! (`vpn_sidecar_pending_closed_total`, `vpn_sidecar_tls_handshake_failures_total`) and logged
//! at most once a second each.
//!
//! **Restarts in place.** With [`SidecarConfig::restart_guard`] (the `--sidecar-*` flags'
//! default: 2 s; the library's and Envoy mode's: none) the sidecar keeps the table
//! [`RESTART_TABLE`] (`netio::firewall::RestartGuard`) from its start to its process's end: a
//! SYN to a listener's port that no socket takes is dropped, not refused, and for up to the
//! guard's time after the process's end. The kube-apiserver's kernel sends it again after 1 s, so a
//! CONNECT started while the sidecar's process restarts (in Gardener's seed pod: the server's
//! process with the sidecar in it, which the init container's start table no longer covers)
//! reaches the next process instead of failing; without a restart the port refuses again
//! once the guard has expired. Needs `CAP_NET_ADMIN` (the server's container has it; an
//! unprivileged sidecar serves without the guard and says so).
//!
//! Access log: one `info` line per request that failed (status other than 200, or a relay
//! error) or took at least [`SLOW_REQUEST`] (for a tunnel: its whole life), like Gardener's
//! Envoy filter (status ≥ 500 or duration ≥ 1 s), plus 4xx. With Envoy's access loggers
//! configured (Envoy mode) that line is `debug`, and Envoy's line goes to stdout.
//!
//! Log targets are this crate's module paths (`sidecar::proxy`, `sidecar::apiserver_proxy`,
//! ...: `--log info,sidecar=debug` shows their debug lines), except the access log line's,
//! which keeps `vpn_server::sidecar::access`, its target from when the sidecar was part of
//! `vpn-server`.

pub mod access_log;
pub mod apiserver_proxy;
pub mod cli;
pub mod dns;
pub mod envoy;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
mod hold;
pub mod metrics;
pub mod policy;
mod proxy;

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netio::admin::{AdminBindError, AdminServer, AdminState, Exposition};
use netio::firewall::{FirewallError, RestartGuard};
use netio::listen::PendingSet;
use openssl::ssl::SslAcceptor;
use pki::pem::{CaBundle, Identity};
use pki::tls::ClientCertMode;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use access_log::AccessLog;
pub use cli::SidecarArgs;
pub use dns::{DnsSettings, LookupFamily};
pub use metrics::{MetricLabels, SidecarMetrics};
pub use policy::{Denied, Destination, DestinationPolicy, External, Netmap};

/// Gardener's Envoy cluster connect timeout (gardener#4362).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Envoy's default stream idle timeout, which long `exec` / `logs -f` streams relied on.
pub const DEFAULT_IDLE_TIMEOUT: Duration = netio::relay::DEFAULT_IDLE_TIMEOUT;
/// How long a CONNECT to the shoot waits for its route (the tunnel) when none is there:
/// Envoy's cluster `connect_timeout` in Gardener (gardener#4362), which its SYN retransmits
/// spend waiting for a reconnecting tunnel.
pub const DEFAULT_HOLD_TIMEOUT: Duration = Duration::from_secs(20);
/// CONNECTs waiting for a route at once; the next one gets 503 at once (Envoy's default
/// `max_pending_requests`).
pub const DEFAULT_MAX_HELD: usize = 1024;
/// The standalone sidecar (no [`RouteCheck`]) dials again this long after a connect found no
/// route (`EHOSTUNREACH`, `ENETUNREACH`): it has no way to hear of the route's return.
pub const HOLD_RETRY: Duration = Duration::from_millis(100);
/// Gardener's Envoy circuit breaker: at most 8192 upstream connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
/// The TLS handshake and the CONNECT head must arrive within this.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections still in the TLS handshake or head phase; a newcomer beyond evicts the oldest.
pub const DEFAULT_MAX_PENDING: usize = 1024;
/// How long open connections may finish after SIGTERM (see [`Sidecar::run`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The `--sidecar-restart-guard-ms` default, in milliseconds: how long a SYN to the sidecar's
/// port that no listener takes is dropped (sent again by the client's kernel) after this
/// process's last sign of life ([`SidecarConfig::restart_guard`]).
pub const DEFAULT_RESTART_GUARD_MS: u64 = 2_000;
/// The restart guard's nf_tables table (`netio::firewall::RestartGuard`), beside the seed
/// pod's start table `vpn-seed-server-start`.
pub const RESTART_TABLE: &str = "vpn-seed-server-restart";
/// A request that takes at least this long is access-logged even when it succeeded.
pub const SLOW_REQUEST: Duration = Duration::from_secs(1);
/// The sidecar's port (Gardener's `http-proxy` service port).
pub const DEFAULT_PORT: u16 = 9443;
/// The metrics port (Gardener's `metrics` service port).
pub const DEFAULT_METRICS_PORT: u16 = 15000;
/// Gardener's DNS cache name: the default of [`DnsSettings::cache_name`], and so part of the
/// DNS series' names ([`MetricLabels::dns_cache`]).
pub const DEFAULT_DNS_CACHE_NAME: &str = "dynamic_forward_proxy_cache_config";

/// Answers whether a connected VPN client routes an address (its assigned address or one of
/// its iroutes), and tells when the answer may have changed.
pub trait RouteCheck: Send + Sync + fmt::Debug {
    /// Whether packets to `addr` currently have a client to go to.
    fn has_route(&self, addr: IpAddr) -> bool;

    /// A receiver whose value changes whenever a client's routes may have come (a client
    /// admitted or its tunnel up): a held CONNECT waits on it instead of polling.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// Everything the sidecar needs.
#[derive(Clone)]
pub struct SidecarConfig {
    /// TLS listen addresses (default `0.0.0.0:9443` and `[::]:9443`; a `[::]` listener is
    /// IPv6-only so both can bind).
    pub listen: Vec<SocketAddr>,
    /// Plain-HTTP `GET /metrics` listen addresses (may be empty).
    pub metrics_listen: Vec<SocketAddr>,
    /// The server certificate chain and key.
    pub identity: Identity,
    /// The CA bundle client certificates are checked against.
    pub trust: CaBundle,
    /// Whether a client certificate is required (default) or only checked when presented.
    pub client_cert: ClientCertMode,
    /// Allowed destinations.
    pub policy: DestinationPolicy,
    /// How an allowed address is rewritten before dialing (vpn2's mapped ranges).
    pub netmap: Netmap,
    /// Bound on connecting upstream (all resolved addresses together).
    pub connect_timeout: Duration,
    /// How long a CONNECT to the shoot waits for a route when no client routes its
    /// destination (or, alone, the connect finds none); 503 at the bound. Zero: no wait.
    pub hold_timeout: Duration,
    /// CONNECTs waiting for a route at once; the next gets 503 at once.
    pub max_held: usize,
    /// No bytes either way for this long closes a tunnel.
    pub idle_timeout: Duration,
    /// Bound on the TLS handshake plus the CONNECT head.
    pub header_timeout: Duration,
    /// Concurrent tunnels (including those connecting); the next CONNECT gets 503.
    pub max_connections: usize,
    /// Concurrent connections before their CONNECT head; a newcomer beyond evicts the oldest
    /// (still in its TLS handshake if any is).
    pub max_pending: usize,
    /// Name resolution: address family, DNS cache size and name.
    pub dns: DnsSettings,
    /// The connection manager's `stat_prefix` (the `envoy_http_conn_manager_prefix` label).
    pub stat_prefix: String,
    /// Envoy's stdout access loggers (Envoy mode); none otherwise.
    pub access_logs: Vec<AccessLog>,
    /// After shutdown: how long open connections may finish, the listeners still accepting
    /// until none is open ([`Sidecar::run`]). Zero: end them at once (Envoy on SIGTERM).
    pub drain_timeout: Duration,
    /// From the sidecar's start until this process ends, and for this long after (its last
    /// refresh), a SYN to a listener's port that no socket takes is dropped instead of refused
    /// ([`RESTART_TABLE`], `netio::firewall::RestartGuard`): a process restarting in place
    /// finds those connections waiting. Zero (the library's default): no guard. Needs
    /// `CAP_NET_ADMIN` in the network namespace; without it the sidecar serves unguarded.
    pub restart_guard: Duration,
}

impl fmt::Debug for SidecarConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SidecarConfig")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field("client_cert", &self.client_cert)
            .field("policy", &self.policy)
            .field("netmap", &self.netmap)
            .field("connect_timeout", &self.connect_timeout)
            .field("hold_timeout", &self.hold_timeout)
            .field("max_held", &self.max_held)
            .field("idle_timeout", &self.idle_timeout)
            .field("header_timeout", &self.header_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_pending", &self.max_pending)
            .field("dns", &self.dns)
            .field("stat_prefix", &self.stat_prefix)
            .field("access_logs", &self.access_logs.len())
            .field("drain_timeout", &self.drain_timeout)
            .field("restart_guard", &self.restart_guard)
            .finish_non_exhaustive()
    }
}

impl SidecarConfig {
    /// The defaults above, listening on `0.0.0.0` and `[::]` ports 9443 / 15000.
    pub fn new(identity: Identity, trust: CaBundle, policy: DestinationPolicy) -> Self {
        let any4 = IpAddr::from([0u8; 4]);
        let any6 = IpAddr::from([0u16; 8]);
        SidecarConfig {
            listen: vec![
                SocketAddr::new(any4, DEFAULT_PORT),
                SocketAddr::new(any6, DEFAULT_PORT),
            ],
            metrics_listen: vec![
                SocketAddr::new(any4, DEFAULT_METRICS_PORT),
                SocketAddr::new(any6, DEFAULT_METRICS_PORT),
            ],
            identity,
            trust,
            client_cert: ClientCertMode::Required,
            policy,
            netmap: Netmap::none(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            hold_timeout: DEFAULT_HOLD_TIMEOUT,
            max_held: DEFAULT_MAX_HELD,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_pending: DEFAULT_MAX_PENDING,
            dns: DnsSettings::default(),
            stat_prefix: metrics::DEFAULT_STAT_PREFIX.into(),
            access_logs: Vec::new(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            restart_guard: Duration::ZERO,
        }
    }

    /// The label values of the metrics: the stat prefix, the first TLS listen address as
    /// Envoy names it, the DNS cache's name.
    pub fn metric_labels(&self) -> MetricLabels {
        let default = MetricLabels::default();
        MetricLabels {
            stat_prefix: self.stat_prefix.clone(),
            listener_address: self
                .listen
                .first()
                .map_or(default.listener_address, |a| MetricLabels::listener(*a)),
            dns_cache: self.dns.cache_name.clone(),
        }
    }
}

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// The TLS context could not be built from the identity and bundle.
    #[error("cannot build the sidecar's TLS context")]
    Tls(#[from] pki::tls::TlsError),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A metrics listen address could not be bound.
    #[error(transparent)]
    Metrics(#[from] AdminBindError),
}

/// The sidecar as a part of its admin endpoint: its series, ready while it serves.
#[derive(Debug)]
struct SidecarAdmin {
    metrics: Arc<SidecarMetrics>,
    serving: Arc<AtomicBool>,
}

impl AdminState for SidecarAdmin {
    fn metrics(&self, out: &mut Exposition) {
        self.metrics.write(out);
    }

    fn ready(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

/// A bound sidecar; [`Sidecar::run`] serves.
#[derive(Debug)]
pub struct Sidecar {
    shared: Arc<proxy::Shared>,
    listeners: Vec<TcpListener>,
    admin: AdminServer,
    /// What the metrics listeners report: the sidecar, and what [`Sidecar::also_report`] adds.
    parts: Vec<Arc<dyn AdminState>>,
    serving: Arc<AtomicBool>,
    /// Refreshed until the process ends ([`SidecarConfig::restart_guard`]).
    restart_guard: Option<RestartGuard>,
}

impl Sidecar {
    /// Builds the TLS context and binds every listener. `routes` is the server's view of
    /// client routes when running in-process (`None` alone). Must run inside a tokio runtime.
    pub async fn bind(
        config: SidecarConfig,
        routes: Option<Arc<dyn RouteCheck>>,
    ) -> Result<Sidecar, SidecarError> {
        let acceptor: SslAcceptor =
            pki::tls::connect_proxy_acceptor(&config.identity, &config.trust, config.client_cert)?;
        raise_nofile_limit();
        let listeners = netio::listen::bind_each(&config.listen)
            .map_err(|(addr, source)| SidecarError::Bind { addr, source })?;
        let admin = AdminServer::bind(&config.metrics_listen)?;
        let restart_guard = restart_guard(&listeners, config.restart_guard);
        for l in &listeners {
            if let Ok(addr) = l.local_addr() {
                info!(
                    %addr,
                    client_cert = ?config.client_cert,
                    external = ?config.policy.external(),
                    "CONNECT sidecar listening"
                );
            }
        }
        let metrics = Arc::new(SidecarMetrics::new(config.metric_labels()));
        let dns = dns::DnsCache::new(config.dns.clone(), Arc::new(dns::SystemResolver));
        let serving = Arc::new(AtomicBool::new(false));
        let parts: Vec<Arc<dyn AdminState>> = vec![Arc::new(SidecarAdmin {
            metrics: Arc::clone(&metrics),
            serving: Arc::clone(&serving),
        })];
        let shared = Arc::new(proxy::Shared {
            permits: Arc::new(Semaphore::new(config.max_connections)),
            pending: PendingSet::new(config.max_pending),
            logs: std::sync::Mutex::default(),
            held: hold::HeldSet::default(),
            open: std::sync::atomic::AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
            metrics,
            dns,
            acceptor,
            routes,
            config,
        });
        Ok(Sidecar {
            shared,
            listeners,
            admin,
            parts,
            serving,
            restart_guard,
        })
    }

    /// The bound TLS listen addresses (with the port the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The bound metrics listen addresses (the admin endpoint: `/metrics`, `/healthz`,
    /// `/readyz`).
    pub fn metrics_addrs(&self) -> Vec<SocketAddr> {
        self.admin.local_addrs()
    }

    /// Reports `part` on the metrics listeners too (the VPN server running in this process).
    pub fn also_report(mut self, part: Arc<dyn AdminState>) -> Sidecar {
        self.parts.push(part);
        self
    }

    /// The counters (they keep counting while the sidecar runs).
    pub fn metrics(&self) -> Arc<SidecarMetrics> {
        Arc::clone(&self.shared.metrics)
    }

    /// Serves until `shutdown` is cancelled; then drains: the listeners keep accepting and
    /// every connection keeps being served until none is open (a pod's address stays an
    /// endpoint of its Service until its processes have exited, so a closed listener would
    /// refuse the kube-apiserver), at most `drain_timeout`; then stops accepting (the
    /// connections the kernel has queued by then are taken and served, not reset), ends what
    /// is still open at `drain_timeout` and returns when every task has ended.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let accepting = CancellationToken::new();
        let cut = CancellationToken::new();
        let mut accept_loops = Vec::new();
        for listener in self.listeners {
            accept_loops.push(tracker.spawn(proxy::accept_loop(
                Arc::clone(&self.shared),
                listener,
                accepting.clone(),
                cut.clone(),
                tracker.clone(),
            )));
        }
        tracker.spawn(self.admin.serve(self.parts, accepting.clone()));
        self.serving.store(true, Ordering::Relaxed);
        shutdown.cancelled().await;
        self.serving.store(false, Ordering::Relaxed);
        let drain = self.shared.config.drain_timeout;
        let open = self.shared.open();
        if !drain.is_zero() && open > 0 {
            info!(
                open,
                drain_ms = drain.as_millis(),
                "draining open connections"
            );
        }
        let deadline = tokio::time::Instant::now() + drain;
        self.shared.idle_by(deadline).await;
        accepting.cancel();
        // The accept loops take what the kernel queued and close their listeners; every
        // connection they took is counted open before the wait below.
        for accept_loop in accept_loops {
            let _ = accept_loop.await;
        }
        let drained = self.shared.idle_by(deadline).await;
        if !drained {
            info!(
                open = self.shared.open(),
                "drain time over: open connections ended"
            );
        }
        cut.cancel();
        tracker.close();
        tracker.wait().await;
        // The listeners are closed; the guard stays in force while this process finishes
        // (an in-process sidecar's server still ends its tunnel) and expires `restart_guard`
        // after its end, so a restart within that finds the SYNs of the gap waiting.
        if let Some(guard) = self.restart_guard {
            guard.keep_for_life();
        }
        info!("CONNECT sidecar stopped");
    }
}

/// The restart guard of `listeners` for `lifetime` (none for zero); failures are logged and
/// the sidecar serves without it (an unprivileged container cannot install one).
fn restart_guard(listeners: &[TcpListener], lifetime: Duration) -> Option<RestartGuard> {
    if lifetime.is_zero() {
        return None;
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    match RestartGuard::install(RESTART_TABLE, &addrs, lifetime) {
        Ok(guard) => Some(guard),
        Err(e) => {
            let denied = matches!(&e, FirewallError::Refused { source, .. }
                if source.kind() == io::ErrorKind::PermissionDenied);
            if denied {
                info!("no restart guard: this process may not change the firewall (CAP_NET_ADMIN)");
            } else {
                warn!(error = %netio::report::chain(&e), "no restart guard");
            }
            None
        }
    }
}

/// Runs the CONNECT sidecar alone (no [`RouteCheck`]: it dials) until `shutdown`.
pub async fn run(config: SidecarConfig, shutdown: CancellationToken) -> Result<(), SidecarError> {
    Sidecar::bind(config, None).await?.run(shutdown).await;
    Ok(())
}

/// Two sockets per tunnel: lift the soft `RLIMIT_NOFILE` to the hard limit, as servers do.
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            warn!(error = %e, "cannot raise the open-file limit");
        }
    }
}
