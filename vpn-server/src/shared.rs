//! What every task of one server shares: the settings, the packet mode ([`mode`]), the session
//! endpoint, the registry, the counters, the device, `max-clients` and the pending connections
//! ([`Shared`]), and the one way its locks are taken ([`lock`]).
//!
//! [`crate::server`] builds it when it binds; the connections ([`crate::connection`]), the
//! device reader ([`crate::device`]) and the status writer read it. It imports none of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use netio::listen::PendingSet;
use netio::log_limit::LogLimiter;
use netio::tun::{Tun, TunWriter};
use protocol::session::ServerEndpoint;

use crate::metrics::ServerMetrics;
use crate::registry::admission::{PreAuthEvent, PreAuthLogs};
use crate::registry::{ClientId, Registry, Slots};
use crate::settings::Settings;
use crate::unreachable;

pub(crate) mod mode;

use self::mode::PacketMode;

/// The server's device and the writer thread every connection writes to it through.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) tun: Arc<Tun>,
    pub(crate) writer: TunWriter,
}

/// What every task of one server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    /// Routed, switched or HA: chosen once, when the server bound.
    pub(crate) mode: PacketMode,
    pub(crate) endpoint: Mutex<ServerEndpoint>,
    pub(crate) registry: Arc<Mutex<Registry>>,
    pub(crate) metrics: Arc<ServerMetrics>,
    /// The tun (or tap) device and its writer; none in HA mode, which switches in the
    /// process and never hands a packet to its kernel.
    pub(crate) device: Option<Device>,
    /// `max-clients`: one slot per authenticated client.
    pub(crate) slots: Slots,
    /// Connections not yet authenticated (`max_pending`, oldest evicted first).
    pub(crate) pending: PendingSet,
    /// Set while the server serves (not before `run`, not while draining): `/readyz`.
    pub(crate) serving: Arc<AtomicBool>,
    /// The rate limits of the pre-authentication log lines.
    pre_auth_logs: Mutex<PreAuthLogs>,
    /// HA mode: the rate limit of the ICMP unreachable answers to kube-apiserver connections
    /// (the device reader keeps its own).
    pub(crate) unreachable: Mutex<unreachable::Limiter>,
    /// HA mode: woken when a packet is held while none was, so that its bound is kept
    /// ([`mode::expire_ha_held`]).
    pub(crate) held: tokio::sync::Notify,
    /// The rate limits of the device-type refusal's warning, per common name (a refused
    /// vpn2 client tries again every few seconds).
    dev_type_logs: Mutex<HashMap<String, LogLimiter>>,
    next_id: AtomicU64,
}

/// How often a device-type refusal of one common name is logged.
const DEV_TYPE_LOG_EVERY: Duration = Duration::from_secs(60);
/// Common names whose device-type refusals are rate-limited apart; beyond it the record
/// starts again.
const DEV_TYPE_LOG_NAMES: usize = 64;

impl Shared {
    /// The state of a server serving with `settings` in `mode` through `registry` (made for
    /// the mode) and `device`: `max-clients` and `max_pending` from the settings, nothing
    /// pending, not serving yet.
    pub(crate) fn new(
        settings: Settings,
        mode: PacketMode,
        registry: Registry,
        metrics: ServerMetrics,
        device: Option<Device>,
    ) -> Shared {
        Shared {
            mode,
            endpoint: Mutex::new(ServerEndpoint::new(settings.server_config())),
            registry: Arc::new(Mutex::new(registry)),
            metrics: Arc::new(metrics),
            device,
            slots: Slots::new(settings.max_clients),
            pending: PendingSet::new(settings.max_pending),
            serving: Arc::new(AtomicBool::new(false)),
            pre_auth_logs: Mutex::new(PreAuthLogs::default()),
            unreachable: Mutex::new(unreachable::Limiter::new()),
            held: tokio::sync::Notify::new(),
            dev_type_logs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            settings,
        }
    }

    /// A new connection's id (upstream's "Client ID").
    pub(crate) fn next_client_id(&self) -> ClientId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether to log a pre-authentication event now: `Some(n)` with the events of its kind
    /// not logged since the last line.
    pub(crate) fn log_pre_auth(&self, event: PreAuthEvent) -> Option<u64> {
        lock(&self.pre_auth_logs).allow(event, Instant::now())
    }

    /// Whether to log the device-type refusal of a client with common name `cn` now: once a
    /// minute per name, `Some(n)` with the refusals of that name not logged since.
    pub(crate) fn log_dev_type_refusal(&self, cn: &str, now: Instant) -> Option<u64> {
        let mut logs = lock(&self.dev_type_logs);
        if logs.len() >= DEV_TYPE_LOG_NAMES && !logs.contains_key(cn) {
            logs.clear();
        }
        logs.entry(cn.to_owned())
            .or_insert_with(|| LogLimiter::new(DEV_TYPE_LOG_EVERY))
            .allow(now)
    }
}

/// Locks `m`, taking over a lock a panicking task left poisoned (the data stay consistent:
/// no code here panics while holding one).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
