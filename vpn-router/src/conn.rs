//! What every connection shares, whatever its listener's kind: the router's state
//! ([`Shared`]: config, policy snapshot, counters, the pending set, the flood-limited logs),
//! the open tunnel ([`Open`]) and its relay ([`carry`]), the wait for a connection's first
//! bytes that a newer connection may cut short ([`read_unless_evicted`]), the upstream
//! connect ([`connect_upstream`]), and the counting and logging of a connection refused
//! before its head was routed ([`refused_head`]). The CONNECT handler (`crate::connect`) and the SNI handler
//! (`crate::sni`) build on these; `crate::serve` drives them.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use netio::ingress::IngressError;
use netio::listen::{LogLimiter, PendingGuard, PendingSet, LOG_EVERY};
use netio::relay::{RelayConfig, RelayError, RelayStats};
use netio::report::chain;
use netio::tcp::connect_first;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, info};

use crate::config::RouterConfig;
use crate::config_dir::DirLoader;
use crate::metrics::{ActiveTunnel, Counters, ProxyRefusal};
use crate::policy::Policy;
use crate::shoots::{ShootRefusal, ShootTunnel};

/// Relays an open tunnel until both directions have ended (a half-close passed on each way)
/// or nothing moved for the idle timeout, with zero-copy `splice(2)` (`relay_tcp`). The router's
/// only call into the byte relay; the half-closed bound and `TCP_USER_TIMEOUT` are
/// `netio::relay`'s defaults (60 s each).
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    config: &RouterConfig,
) -> Result<RelayStats, RelayError> {
    let relay = RelayConfig {
        idle_timeout: config.idle_timeout,
        buffer_size: config.relay_buffer_size,
        ..RelayConfig::default()
    };
    netio::relay::relay_tcp(client, upstream, relay).await
}

/// The router's state every connection and the reloader share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `--config FILE`: the file a reload re-reads.
    pub(crate) path: Option<PathBuf>,
    /// `--config-dir`: the directory's loader (its last good files), instead of `path`.
    pub(crate) dir: Option<Mutex<DirLoader>>,
    pub(crate) config: RouterConfig,
    policy: RwLock<Arc<Policy>>,
    pub(crate) counters: Arc<Counters>,
    /// Connections before their head is routed (`max_pending`, oldest evicted first).
    pub(crate) pending: PendingSet,
    /// One line a second at most for each event a flood repeats.
    logs: Mutex<FloodLogs>,
}

/// The events before routing that a flood repeats, each logged at most once per
/// [`LOG_EVERY`] (all are counted).
#[derive(Debug)]
pub(crate) struct FloodLogs {
    /// A pending connection evicted.
    pub(crate) evicted: LogLimiter,
    /// A PROXY header or head deadline passed.
    pub(crate) timeout: LogLimiter,
    /// A head refused (400, 405, 414, 431, a bad PROXY header, an untrusted peer).
    pub(crate) refused: LogLimiter,
    /// A connection refused on an SNI listener (`crate::sni`).
    pub(crate) sni: LogLimiter,
}

impl Default for FloodLogs {
    fn default() -> Self {
        FloodLogs {
            evicted: LogLimiter::new(LOG_EVERY),
            timeout: LogLimiter::new(LOG_EVERY),
            refused: LogLimiter::new(LOG_EVERY),
            sni: LogLimiter::new(LOG_EVERY),
        }
    }
}

impl Shared {
    /// The state of a router serving `config` (its policy in force), reloaded from `path`
    /// or `dir`.
    pub(crate) fn new(
        config: RouterConfig,
        path: Option<PathBuf>,
        dir: Option<DirLoader>,
        counters: Arc<Counters>,
    ) -> Self {
        let policy = RwLock::new(Arc::new(config.policy.clone()));
        counters.shoots.configure(&config.policy);
        Shared {
            path,
            dir: dir.map(Mutex::new),
            pending: PendingSet::new(config.max_pending),
            config,
            policy,
            counters,
            logs: Mutex::default(),
        }
    }

    /// Whether to log a flood event now: `Some(n)` with the events of its kind not logged
    /// since the last line.
    pub(crate) fn log(&self, kind: impl FnOnce(&mut FloodLogs) -> &mut LogLimiter) -> Option<u64> {
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        kind(&mut logs).allow(Instant::now())
    }

    /// Swaps `policy` in, in one step; the per-shoot series follow its shoots.
    pub(crate) fn install(&self, policy: Policy) {
        let routes = policy.routes.len();
        let sni_routes = policy.sni_routes.len();
        let fresh = Arc::new(policy);
        self.counters.shoots.configure(&fresh);
        match self.policy.write() {
            Ok(mut guard) => *guard = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        info!(
            routes,
            sni_routes,
            shoots = self.counters.shoots.configured(),
            "router policy reloaded"
        );
    }

    /// The policy in force, for deciding one connection.
    pub(crate) fn snapshot(&self) -> Arc<Policy> {
        match self.policy.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

/// A tunnel whose upstream answered: what a connection keeps once its head (or ClientHello)
/// was accepted, for the relay phase ([`carry`]).
pub(crate) struct Open<'s> {
    pub(crate) client: TcpStream,
    pub(crate) upstream: TcpStream,
    /// Bytes sent upstream before the relay (what followed the head, or the ClientHello).
    pub(crate) early: u64,
    /// Its place in `vpn_router_tunnels_active`.
    pub(crate) active: ActiveTunnel<'s>,
    /// Its place in its shoot's series, when its route belongs to a shoot.
    pub(crate) shoot: Option<ShootTunnel>,
}

/// Relays an open tunnel to its end and counts its bytes (router-wide and for its shoot).
pub(crate) async fn carry(open: Open<'_>, shared: &Shared) {
    let Open {
        mut client,
        mut upstream,
        early,
        active,
        shoot,
    } = open;
    let result = relay(&mut client, &mut upstream, &shared.config).await;
    let (to_upstream, to_client) = match &result {
        Ok(stats) => (stats.a_to_b + early, stats.b_to_a),
        Err(e) => (e.a_to_b + early, e.b_to_a),
    };
    shared.counters.relayed(to_upstream, to_client);
    if let Some(tunnel) = &shoot {
        tunnel.relayed(to_upstream, to_client);
    }
    match result {
        Ok(stats) => debug!(to_upstream, to_client, end = ?stats.end, "tunnel closed"),
        Err(e) => debug!(to_upstream, to_client, "tunnel ended: {}", chain(&e)),
    }
    drop(active);
}

/// Reads the start of a connection with `read`, counted as pending meanwhile, unless a newer
/// connection evicts this one first (a flood of silent connections must not lock out real
/// ones): then it is closed, logged at debug as evicted before `what`, and the answer is
/// `None`. Either way the connection is no longer pending afterwards.
pub(crate) async fn read_unless_evicted<T>(
    stream: &mut TcpStream,
    pending: PendingGuard,
    shared: &Shared,
    what: &str,
    read: impl AsyncFnOnce(&mut TcpStream) -> T,
) -> Option<T> {
    let gauge = shared.counters.pending_opened();
    let read = tokio::select! {
        r = read(&mut *stream) => r,
        () = pending.evicted() => {
            debug!("evicted before {what}, for a newer connection; closed");
            let _ = stream.shutdown().await;
            return None;
        }
    };
    drop(pending);
    drop(gauge);
    Some(read)
}

/// Connects to `upstream` within the configured connect timeout. On failure: the reason for
/// the shoot's series (`ConnectFailed` or `ConnectTimeout`) and what happened, as both
/// handlers log it after the upstream's name (`connect failed: …`, `connect timed out`).
pub(crate) async fn connect_upstream(
    shared: &Shared,
    upstream: &str,
) -> Result<TcpStream, (ShootRefusal, String)> {
    match tokio::time::timeout(shared.config.connect_timeout, connect(upstream)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err((ShootRefusal::ConnectFailed, format!("connect failed: {e}"))),
        Err(_) => Err((ShootRefusal::ConnectTimeout, "connect timed out".into())),
    }
}

/// Connects to the first address `upstream` (`host:port`) resolves to that answers.
async fn connect(upstream: &str) -> io::Result<TcpStream> {
    connect_first(tokio::net::lookup_host(upstream).await?).await
}

/// Counts and logs a connection that gave no usable head: a client that left is debug; a
/// timeout or a refusal is logged at most once a second (a flood repeats them).
pub(crate) fn refused_head(shared: &Shared, e: &IngressError) {
    let status = e.status().map(|s| s.code);
    match e {
        IngressError::Closed { .. } | IngressError::Io { .. } => {
            debug!("connection ended before a request: {}", chain(e));
        }
        IngressError::ProxyTimeout { .. } | IngressError::HeaderTimeout { .. } => {
            let total = shared.counters.pending_timed_out();
            match shared.log(|l| &mut l.timeout) {
                Some(unlogged) => info!(
                    status,
                    timeouts_total = total,
                    unlogged,
                    "refused: {}",
                    chain(e)
                ),
                None => debug!(status, "refused: {}", chain(e)),
            }
        }
        _ => {
            let proxy = match e {
                IngressError::Untrusted { .. } => Some(ProxyRefusal::Untrusted),
                IngressError::ProxyForbidden { .. } => Some(ProxyRefusal::Forbidden),
                IngressError::Proxy(_) => Some(ProxyRefusal::Malformed),
                _ => None,
            };
            if let Some(why) = proxy {
                shared.counters.proxy_refused(why);
            }
            match shared.log(|l| &mut l.refused) {
                Some(unlogged) => info!(status, unlogged, "refused: {}", chain(e)),
                None => debug!(status, "refused: {}", chain(e)),
            }
        }
    }
}
