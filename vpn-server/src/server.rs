//! The server's composition root: [`Server::bind`] sets the tun device up, opens the
//! listeners and builds the state every task shares (`crate::shared`); [`Server::run`] starts
//! one task per connection, the tun reader and the status writer, and shuts them down.
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
//! [`Server::run`] returns once every task has ended and the tun device is closed.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio::admin::AdminState;
use netio::clock::unix_now;
use netio::firewall::FirewallError;
use netio::listen::Admitted;
use netio::netlink::NetlinkError;
use netio::tun::{TunError, TunWriter};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::device::SetupError;
use crate::metrics::{ServerAdmin, ServerMetrics};
use crate::pool::PoolError;
use crate::registry::admission::PreAuthEvent;
use crate::registry::Registry;
use crate::settings::{Settings, StatusFile};
use crate::shared::mode::{self, PacketMode};
use crate::shared::{lock, Device, Shared};
use crate::{connection, device, status};

pub use crate::device::TunStep;
pub use crate::registry::TunnelAddresses;

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
    /// The rules asked for before the routes ([`Server::bind_with`]) were refused.
    #[error("firewall rules")]
    Firewall(#[from] FirewallError),
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

impl From<SetupError> for ServerError {
    fn from(SetupError { step, source }: SetupError) -> ServerError {
        ServerError::Netlink { step, source }
    }
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
    pub async fn bind(settings: Settings) -> Result<Server, ServerError> {
        Ok(Self::bind_with(settings, |_| Ok(())).await?.0)
    }

    /// [`Server::bind`], running `before_routes` with the device's name (empty in HA mode)
    /// once the device is up and before any route leads into it: what the first packet
    /// routed into the device must meet (the vpn2 environment's address mappings; a
    /// connection whose first packet left unmapped keeps that in conntrack for its life).
    pub async fn bind_with<R>(
        mut settings: Settings,
        before_routes: impl FnOnce(&str) -> Result<R, FirewallError>,
    ) -> Result<(Server, R), ServerError> {
        if settings.auto_mtu {
            device::apply_auto_mtu(&mut settings).await?;
        }
        let mode = PacketMode::of(&settings);
        let pool = mode.pool(&settings)?;
        let (device, before) = match mode.open_device(&settings.dev)? {
            Some(tun) => {
                let tun = Arc::new(tun);
                device::setup(&settings, tun.name(), pool.as_ref()).await?;
                let before = before_routes(tun.name())?;
                device::add_routes(&settings, tun.name()).await?;
                let writer = TunWriter::spawn(Arc::clone(&tun), TUN_WRITE_QUEUE)
                    .map_err(ServerError::TunWriter)?;
                (Some(Device { tun, writer }), before)
            }
            None => (None, before_routes("")?),
        };
        let tun_stats = device
            .as_ref()
            .map_or_else(Default::default, |d| d.writer.stats());
        let listeners = netio::listen::bind_each(&settings.listen)
            .map_err(|(addr, source)| ServerError::Bind { addr, source })?;
        for (l, &addr) in listeners.iter().zip(&settings.listen) {
            info!(addr = %l.local_addr().unwrap_or(addr), "listening for incoming TCP connections");
        }
        let registry = mode.registry(&settings, pool);
        let metrics = ServerMetrics::new(tun_stats);
        let shared = Arc::new(Shared::new(settings, mode, registry, metrics, device));
        Ok((Server { shared, listeners }, before))
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
            changes: lock(&self.shared.registry).route_changes(),
            registry: Arc::clone(&self.shared.registry),
        }
    }

    /// Serves until `shutdown` is cancelled, then tells clients (`RESTART`), drains and
    /// returns once every task has ended and the tun device is closed.
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
        if shared.mode == PacketMode::Ha {
            tracker.spawn(mode::expire_ha_held(Arc::clone(&shared), shutdown.clone()));
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
        let tun = shared.device.as_ref().map(|d| Arc::downgrade(&d.tun));
        drop(shared);
        if let Some(tun) = tun {
            device_closed(&tun).await;
        }
        info!("shutdown complete");
        Ok(())
    }
}

/// Waits (at most a second) until the last holder of the tun device, the writer thread, has
/// let it go: closed, the kernel removes the device and its routes, so what the caller
/// removes next (the firewall's mappings) is never missing while a packet can still be
/// routed into the device.
async fn device_closed(tun: &std::sync::Weak<netio::tun::Tun>) {
    for _ in 0..1000 {
        if tun.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    warn!("the tun device is still held a second after the shutdown");
}

/// Answers whether a connected client's address or iroute covers an address (what the tun
/// reader would find for a packet to it).
#[derive(Debug, Clone)]
pub struct ClientRoutes {
    registry: Arc<Mutex<Registry>>,
    changes: tokio::sync::watch::Receiver<u64>,
}

impl ClientRoutes {
    /// Whether a packet to `addr` has a client to go to now, its tunnel up.
    pub fn covers(&self, addr: IpAddr) -> bool {
        lock(&self.registry)
            .route(addr.to_canonical())
            .is_some_and(|c| !c.cipher.is_empty())
    }

    /// A receiver whose value changes whenever a client's tunnel comes up.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The clients whose tunnel is up now, oldest tunnel first: CN and assigned addresses.
    pub fn tunnels(&self) -> Vec<TunnelAddresses> {
        lock(&self.registry).tunnels()
    }
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
