//! The server's runtime: the tun device set up, the listeners, one task per connection, the
//! tun reader, the status writer, and shutdown.
//!
//! ```text
//!  listener(s) ──accept──► connection task (connection.rs; one per TCP connection, owns a
//!    (pending place;           │  ▲                   ServerSession)
//!     max-clients slot once authenticated, registry::admission)
//!      packets from client ────┤  │ framed packets in/out of the socket (netio::framed)
//!        spoof check, then     │  └─ mpsc ◄── tun reader (device.rs): longest-prefix match
//!        the TunWriter, or     │              on the destination → the owning connection
//!        another client (c2c)  ▼
//!              registry (registry.rs: pool, routing table, clients)   status writer
//! ```
//!
//! On shutdown every established client gets `RESTART`, has `drain_timeout` to leave, and
//! [`Server::run`] returns once every task has ended.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ipnet::IpNet;
use netio::admin::AdminState;
use netio::clock::unix_now;
use netio::listen::{Admitted, PendingSet};
use netio::netlink::NetlinkError;
use netio::tun::{Tun, TunError, TunWriter};
use protocol::session::ServerEndpoint;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::metrics::{ServerAdmin, ServerMetrics};
use crate::pool::{Pool, PoolError};
use crate::registry::admission::{PreAuthEvent, PreAuthLogs};
use crate::registry::{ClientId, Registry, Slots};
use crate::settings::{Settings, StatusFile};
use crate::{connection, device, status};

/// Decrypted packets from clients queued for the tun writer thread before the connections
/// wait.
pub const TUN_WRITE_QUEUE: usize = 1024;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The tun device could not be opened.
    #[error("cannot open the tun device")]
    Tun(#[from] TunError),
    /// The tun writer thread could not be started.
    #[error("cannot start the tun writer thread")]
    TunWriter(#[source] io::Error),
    /// Link, address or route setup failed.
    #[error("cannot {step} on the tun device")]
    Netlink {
        /// What was being done.
        step: TunStep,
        /// Why it failed.
        #[source]
        source: NetlinkError,
    },
    /// The pool networks are invalid.
    #[error("invalid address pool")]
    Pool(#[from] PoolError),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A step of the tun device's set-up ([`ServerError::Netlink`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TunStep {
    /// Opening the netlink socket.
    #[error("open netlink")]
    Open,
    /// Setting the MTU.
    #[error("set MTU {0}")]
    SetMtu(u16),
    /// Setting the transmit queue length.
    #[error("set txqueuelen {0}")]
    SetTxqueuelen(u32),
    /// Adding the server's own address.
    #[error("add address {0}")]
    AddAddress(IpNet),
    /// Bringing the link up.
    #[error("set the link up")]
    LinkUp,
    /// Adding a `route` into the tunnel.
    #[error("add route {0}")]
    AddRoute(IpNet),
    /// Reading the default route (`OPENVPN_AUTO_MTU`).
    #[error("read the default route")]
    DefaultRoute,
}

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
    /// The rate limits of the pre-authentication log lines.
    pre_auth_logs: Mutex<PreAuthLogs>,
    /// Set while the server serves (not before `run`, not while draining): `/readyz`.
    serving: Arc<AtomicBool>,
    next_id: AtomicU64,
}

impl Shared {
    /// A new connection's id (upstream's "Client ID").
    pub(crate) fn next_client_id(&self) -> ClientId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether to log a pre-authentication event now: `Some(n)` with the events of its kind
    /// not logged since the last line.
    pub(crate) fn log_pre_auth(&self, event: PreAuthEvent) -> Option<u64> {
        lock(&self.pre_auth_logs).allow(event, std::time::Instant::now())
    }
}

/// Locks `m`, taking over a lock a panicking task left poisoned (the data stay consistent:
/// no code here panics while holding one).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A bound server: tun device configured, listeners open. [`Server::run`] serves.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
}

impl Server {
    /// Opens and configures the tun device (MTU, txqueuelen, the server's pool addresses,
    /// link up, the kernel `routes`), starts its writer and binds the listeners (an IPv6
    /// address takes IPv4 too, as OpenVPN's `tcp6-server`), in the calling thread's network
    /// namespace. In HA mode there is no device and no pool. Must run inside a tokio runtime.
    pub async fn bind(mut settings: Settings) -> Result<Server, ServerError> {
        if settings.auto_mtu {
            device::apply_auto_mtu(&mut settings).await?;
        }
        let pool = match (settings.pool_v4, settings.pool_v6) {
            _ if settings.ha.is_some() => None,
            (None, None) => None,
            (v4, v6) => Some(Pool::with_range(v4, settings.pool_v4_range, v6)?),
        };
        let device = if settings.ha.is_some() {
            info!("HA mode: no device; packets are switched between kube-apiserver and shoot connections");
            None
        } else {
            let tun = Arc::new(if settings.is_tap() {
                Tun::open_tap(&settings.dev)?
            } else {
                Tun::open(&settings.dev)?
            });
            device::setup(&settings, tun.name(), pool.as_ref()).await?;
            let writer = TunWriter::spawn(Arc::clone(&tun), TUN_WRITE_QUEUE)
                .map_err(ServerError::TunWriter)?;
            Some(Device { tun, writer })
        };
        let tun_stats = device
            .as_ref()
            .map_or_else(Default::default, |d| d.writer.stats());
        let mut listeners = Vec::new();
        for &addr in &settings.listen {
            let l = netio::listen::bind_dual_stack(addr)
                .map_err(|source| ServerError::Bind { addr, source })?;
            info!(addr = %l.local_addr().unwrap_or(addr), "listening for incoming TCP connections");
            listeners.push(l);
        }
        let shared = Arc::new(Shared {
            endpoint: Mutex::new(ServerEndpoint::new(settings.server_config())),
            registry: Arc::new(Mutex::new(if let Some(ha) = &settings.ha {
                Registry::ha(ha.shoot_networks.clone())
            } else if settings.is_tap() {
                Registry::tap(pool, settings.max_routes_per_client)
            } else {
                Registry::new(pool)
            })),
            metrics: Arc::new(ServerMetrics::new(tun_stats)),
            device,
            slots: Slots::new(settings.max_clients),
            pending: PendingSet::new(settings.max_pending),
            pre_auth_logs: Mutex::new(PreAuthLogs::default()),
            serving: Arc::new(AtomicBool::new(false)),
            next_id: AtomicU64::new(0),
            settings,
        });
        Ok(Server { shared, listeners })
    }

    /// The bound listen addresses (with the port the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The tun device's name (none in HA mode).
    pub fn tun_name(&self) -> Option<&str> {
        self.shared.device.as_ref().map(|d| d.tun.name())
    }

    /// The counters (shared; they keep counting while the server runs).
    pub fn metrics(&self) -> Arc<ServerMetrics> {
        Arc::clone(&self.shared.metrics)
    }

    /// The server as a part of the admin endpoint (`netio::admin`): its series, and ready
    /// while it serves.
    pub fn admin_state(&self) -> Arc<dyn AdminState> {
        Arc::new(ServerAdmin {
            metrics: Arc::clone(&self.shared.metrics),
            registry: Arc::clone(&self.shared.registry),
            pending: self.shared.pending.clone(),
            serving: Arc::clone(&self.shared.serving),
        })
    }

    /// A handle on the client routes, for the CONNECT sidecar running in this process.
    pub fn client_routes(&self) -> ClientRoutes {
        ClientRoutes {
            registry: Arc::clone(&self.shared.registry),
        }
    }

    /// Serves until `shutdown` is cancelled, then tells clients (`RESTART`), drains and
    /// returns once every task has ended.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let shared = self.shared;
        let tracker = TaskTracker::new();
        for listener in self.listeners {
            tracker.spawn(accept_loop(
                Arc::clone(&shared),
                listener,
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        if let Some(d) = &shared.device {
            tracker.spawn(device::read_loop(
                Arc::clone(&shared),
                Arc::clone(&d.tun),
                shutdown.clone(),
            ));
        }
        if let Some(status) = shared.settings.status.clone() {
            tracker.spawn(status_writer(Arc::clone(&shared), status, shutdown.clone()));
        }
        shared.serving.store(true, Ordering::Relaxed);
        shutdown.cancelled().await;
        shared.serving.store(false, Ordering::Relaxed);
        info!("shutting down: telling clients and draining");
        tracker.close();
        tracker.wait().await;
        info!("shutdown complete");
        Ok(())
    }
}

/// Answers whether a connected client's address or iroute covers an address (what the tun
/// reader would find for a packet to it).
#[derive(Debug, Clone)]
pub struct ClientRoutes {
    registry: Arc<Mutex<Registry>>,
}

impl ClientRoutes {
    /// Whether a packet to `addr` has a client to go to now.
    pub fn covers(&self, addr: IpAddr) -> bool {
        lock(&self.registry).route(addr.to_canonical()).is_some()
    }

    /// The clients whose tunnel is up now, oldest tunnel first: CN and assigned addresses.
    pub fn tunnels(&self) -> Vec<TunnelAddresses> {
        lock(&self.registry).tunnels()
    }
}

/// One client with its tunnel up, as [`ClientRoutes::tunnels`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelAddresses {
    /// Certificate CN (empty without one).
    pub common_name: String,
    /// Assigned IPv4 address.
    pub v4: Option<std::net::Ipv4Addr>,
    /// Assigned IPv6 address.
    pub v6: Option<std::net::Ipv6Addr>,
}

/// Binds with `settings` and serves until `shutdown` is cancelled; see [`Server`].
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), ServerError> {
    Server::bind(settings).await?.run(shutdown).await
}

/// Accepts connections: closed at once while `max-clients` clients are authenticated (as
/// upstream), else pending (`registry::admission`), evicting the oldest pending one when
/// `max_pending` are.
async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    while let Some((stream, peer)) = netio::listen::accept(&listener, &shutdown).await {
        if shared.slots.is_full() {
            let total = shared.metrics.max_clients_reached();
            match shared.log_pre_auth(PreAuthEvent::MaxClients) {
                Some(unlogged) => warn!(
                    %peer,
                    max_clients = shared.slots.max(),
                    refused_total = total,
                    unlogged,
                    "new connection closed: max-clients clients connected"
                ),
                None => debug!(%peer, "new connection closed: max-clients clients connected"),
            }
            continue;
        }
        let Admitted { guard, evicted } = shared.pending.admit();
        if let Some(e) = evicted {
            shared.metrics.pending_evicted();
            if let Some(unlogged) = shared.log_pre_auth(PreAuthEvent::Evicted) {
                info!(
                    max_pending = shared.pending.max(),
                    evicted_seq = e.seq,
                    proven = e.proven,
                    evicted_total = shared.metrics.evicted(),
                    unlogged,
                    "pending connections full: the oldest made room for a new one"
                );
            }
        }
        let _ = stream.set_nodelay(true);
        tracker.spawn(connection::serve(
            Arc::clone(&shared),
            stream,
            peer,
            guard,
            shutdown.clone(),
        ));
    }
}

/// Writes the status file every `file.interval` (at least every second), atomically
/// (a temporary file renamed over it).
async fn status_writer(shared: Arc<Shared>, file: StatusFile, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(file.interval.max(Duration::from_secs(1)));
    let tmp = file.path.with_extension("tmp");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let text = status::render(&lock(&shared.registry).status(unix_now()));
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &file.path));
        if let Err(e) = written {
            warn!(path = %file.path.display(), error = %e, "cannot write the status file");
        }
    }
}
