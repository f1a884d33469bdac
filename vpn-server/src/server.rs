//! The tokio runtime of the server.
//!
//! ```text
//!  listener(s) ──accept──► connection task (one per TCP connection, owns a ServerSession)
//!                              │  ▲ framed packets in/out of the socket
//!      packets from client ────┤  │
//!        spoof check, then     │  └─ mpsc ◄── tun reader: longest-prefix match on the
//!        tun write, or another │              destination → the owning connection
//!        client (c2c)          ▼
//!                          registry (pool, routing table, clients)   status writer
//! ```
//!
//! A packet from the tun device that no client routes is answered with ICMP "destination
//! unreachable" (rate-limited; see [`crate::unreachable`]), so seed-side connects fail at once.
//!
//! A connection is admitted by a permit of `max-clients`; it must bring its tunnel up within
//! `handshake_timeout` or it is closed. On `ClientIdentified` the registry picks the address
//! (`ifconfig-push`, else the pool), installs the client's host routes and iroutes, and the
//! session pushes them. On shutdown every established client gets `RESTART`, has
//! `drain_timeout` to leave, and the run returns once every task has ended.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipnet::{IpNet, Ipv4Net};
use netio::clock::unix_now;
use netio::netlink::{IpPrefix, Netlink, NetlinkError, Route};
use netio::tun::{Coalescer, PacketLayout, RecvPool, Tun, TunError};
use protocol::control_msg::ServerSignal;
use protocol::data::DATA_TAILROOM;
use protocol::framing::FrameDecoder;
use protocol::session::{ClientIdentity, ClientSettings, Event, ServerEndpoint, SEND_HEADROOM};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::pool::{Pool, PoolError};
use crate::routing::{Forward, RoutingTable};
use crate::settings::{ClientOptions, Settings};
use crate::spoof::{self, SourceFilter, SpoofVerdict};
use crate::status::{self, ClientStatus, RouteStatus, StatusSnapshot};
use crate::unreachable;

/// Packets queued from the tun device towards one connection before new ones are dropped.
pub const TUN_QUEUE: usize = 1024;

/// Packets from clients queued for the tun writer task before the connections wait.
pub const TUN_WRITE_QUEUE: usize = 1024;

/// Most packets the tun reader takes from the device (and routes under one lock) per wakeup
/// (a super-packet's segments come together, so a batch can be longer by one super-packet).
pub const TUN_READ_BATCH: usize = 32;

/// Most packets the tun writer takes from its queue and writes (TCP segments of one flow
/// merged) at once.
pub const TUN_WRITE_BATCH: usize = 64;

/// A connection's internal id (upstream's "Client ID" in the status file).
pub type ClientId = u64;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The tun device could not be opened.
    #[error("cannot open the tun device")]
    Tun(#[from] TunError),
    /// Link, address or route setup failed.
    #[error("cannot {what} on the tun device")]
    Netlink {
        /// What was being done.
        what: String,
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
    /// A route or address is not a valid prefix.
    #[error("invalid prefix {net}")]
    Prefix {
        /// The network.
        net: IpNet,
    },
}

/// Counters of the data path and of refusals. All monotonic.
#[derive(Debug, Default)]
pub struct Stats {
    /// Packets from clients dropped because their source was not the client's.
    pub spoofed: AtomicU64,
    /// Packets from clients that were not readable IP packets.
    pub malformed: AtomicU64,
    /// Link-local / multicast packets from clients, dropped quietly.
    pub ignored: AtomicU64,
    /// Packets from the tun device with no client route.
    pub no_route: AtomicU64,
    /// ICMP / ICMPv6 "destination unreachable" answers to such packets (rate-limited).
    pub unreachable_sent: AtomicU64,
    /// Packets dropped because a connection's queue was full.
    pub queue_full: AtomicU64,
    /// Packets from clients written to the tun device.
    pub to_tun: AtomicU64,
    /// Packets forwarded from one client to another.
    pub client_to_client: AtomicU64,
    /// Packets from the tun device sent to clients.
    pub from_tun: AtomicU64,
    /// Connections refused at accept because of `max-clients`.
    pub refused_max_clients: AtomicU64,
    /// Clients refused because the pool was exhausted.
    pub pool_exhausted: AtomicU64,
    /// Clients refused for another reason (disabled, address in use, TLS).
    pub rejected: AtomicU64,
    /// Connections closed by the handshake deadline.
    pub handshake_timeouts: AtomicU64,
    /// Tunnels established.
    pub connected: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Byte counters of one connection.
#[derive(Debug, Default)]
struct Traffic {
    received: AtomicU64,
    sent: AtomicU64,
}

/// A connected (admitted) client as the registry knows it.
#[derive(Debug)]
struct ClientEntry {
    common_name: String,
    username: Option<String>,
    real: SocketAddr,
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
    lease: Option<u32>,
    tx: mpsc::Sender<BytesMut>,
    kicked: CancellationToken,
    traffic: Arc<Traffic>,
    since: u64,
    peer_id: u32,
    cipher: String,
}

/// Pool, routing table and clients, under one lock.
#[derive(Debug)]
struct Registry {
    pool: Option<Pool>,
    routes: RoutingTable<ClientId>,
    clients: HashMap<ClientId, ClientEntry>,
}

impl Registry {
    fn remove(&mut self, id: ClientId) -> Option<ClientEntry> {
        let entry = self.clients.remove(&id)?;
        if let (Some(pool), Some(lease)) = (self.pool.as_mut(), entry.lease) {
            pool.release(lease);
        }
        self.routes.remove_owner(id);
        Some(entry)
    }
}

/// What an admitted client gets.
struct Admission {
    settings: ClientSettings,
    filter: SourceFilter,
}

#[derive(Debug)]
struct Shared {
    settings: Settings,
    endpoint: Mutex<ServerEndpoint>,
    registry: Mutex<Registry>,
    stats: Arc<Stats>,
    tun: Tun,
    /// Decrypted packets for the tun writer task.
    tun_tx: mpsc::Sender<BytesMut>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A bound server: tun device configured, listeners open. [`Server::run`] serves.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    tun_rx: mpsc::Receiver<BytesMut>,
}

impl Server {
    /// Opens and configures the tun device (MTU, txqueuelen, the server's pool addresses,
    /// link up, the kernel `routes`) and binds the listeners, in the calling thread's network
    /// namespace. Must run inside a tokio runtime.
    pub async fn bind(settings: Settings) -> Result<Server, ServerError> {
        let pool = match (settings.pool_v4, settings.pool_v6) {
            (None, None) => None,
            (v4, v6) => Some(Pool::new(v4, v6)?),
        };
        let tun = Tun::open(&settings.dev)?;
        setup_tun(&settings, tun.name(), pool.as_ref()).await?;
        let mut listeners = Vec::new();
        for addr in &settings.listen {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: *addr,
                    source,
                })?;
            info!(addr = %l.local_addr().unwrap_or(*addr), "listening for incoming TCP connections");
            listeners.push(l);
        }
        let config = settings.server_config();
        let (tun_tx, tun_rx) = mpsc::channel(TUN_WRITE_QUEUE);
        let shared = Arc::new(Shared {
            endpoint: Mutex::new(ServerEndpoint::new(config)),
            registry: Mutex::new(Registry {
                pool,
                routes: RoutingTable::new(),
                clients: HashMap::new(),
            }),
            stats: Arc::new(Stats::default()),
            tun,
            tun_tx,
            next_id: AtomicU64::new(0),
            settings,
        });
        Ok(Server {
            shared,
            listeners,
            tun_rx,
        })
    }

    /// The bound listen addresses (with the port the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The tun device's name.
    pub fn tun_name(&self) -> &str {
        self.shared.tun.name()
    }

    /// The counters (shared; they keep counting while the server runs).
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.shared.stats)
    }

    /// A handle on the client routes, for the CONNECT sidecar running in this process.
    pub fn client_routes(&self) -> ClientRoutes {
        ClientRoutes {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until `shutdown` is cancelled, then tells clients (`RESTART`), drains and
    /// returns once every task has ended.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let tracker = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(self.shared.settings.max_clients));
        for listener in self.listeners {
            tracker.spawn(accept_loop(
                Arc::clone(&self.shared),
                listener,
                Arc::clone(&permits),
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        tracker.spawn(tun_reader(Arc::clone(&self.shared), shutdown.clone()));
        tracker.spawn(tun_writer(
            Arc::clone(&self.shared),
            self.tun_rx,
            shutdown.clone(),
        ));
        if let Some(status) = self.shared.settings.status.clone() {
            tracker.spawn(status_writer(
                Arc::clone(&self.shared),
                status,
                shutdown.clone(),
            ));
        }
        shutdown.cancelled().await;
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
    shared: Arc<Shared>,
}

impl ClientRoutes {
    /// Whether a packet to `addr` has a client to go to now.
    pub fn covers(&self, addr: IpAddr) -> bool {
        lock(&self.shared.registry)
            .routes
            .lookup(addr.to_canonical())
            .is_some()
    }
}

/// Binds with `settings` and serves until `shutdown` is cancelled; see [`Server`].
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), ServerError> {
    Server::bind(settings).await?.run(shutdown).await
}

fn prefix(net: IpNet) -> Result<IpPrefix, ServerError> {
    IpPrefix::new(net.addr(), net.prefix_len()).map_err(|_| ServerError::Prefix { net })
}

async fn setup_tun(settings: &Settings, dev: &str, pool: Option<&Pool>) -> Result<(), ServerError> {
    let nl = Netlink::open().map_err(|source| ServerError::Netlink {
        what: "open netlink".into(),
        source,
    })?;
    let err = |what: String| move |source| ServerError::Netlink { what, source };
    nl.set_mtu(dev, u32::from(settings.tun_mtu))
        .await
        .map_err(err(format!("set MTU {}", settings.tun_mtu)))?;
    if let Some(len) = settings.txqueuelen {
        nl.set_txqueuelen(dev, len)
            .await
            .map_err(err(format!("set txqueuelen {len}")))?;
    }
    let own: Vec<IpNet> = pool
        .into_iter()
        .flat_map(|p| [p.server_v4().map(IpNet::V4), p.server_v6().map(IpNet::V6)])
        .flatten()
        .collect();
    for net in own {
        nl.add_address(dev, prefix(net)?)
            .await
            .map_err(err(format!("add address {net}")))?;
    }
    nl.set_link_up(dev)
        .await
        .map_err(err("set the link up".into()))?;
    for net in &settings.routes {
        let route = Route::via_dev(prefix(net.trunc())?, dev);
        nl.add_route(&route)
            .await
            .map_err(err(format!("add route {net}")))?;
    }
    info!(dev, routes = settings.routes.len(), "tun device configured");
    Ok(())
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            bump(&shared.stats.refused_max_clients);
            warn!(%peer, max_clients = shared.settings.max_clients, "new connection would exceed max-clients; closed");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        info!(%peer, "connection accepted");
        tracker.spawn(Connection::run(
            Arc::clone(&shared),
            stream,
            peer,
            permit,
            shutdown.clone(),
        ));
    }
}

/// The tun reader: each packet goes to the connection owning the longest prefix containing
/// its destination, and a packet no client routes is answered with ICMP unreachable.
/// Reads packets from the tun device in batches (into slices of one pooled buffer, with the
/// headroom and tailroom the connections encrypt in), routes a whole batch under one lock of
/// the registry, and queues each packet to its connection.
async fn tun_reader(shared: Arc<Shared>, shutdown: CancellationToken) {
    let layout = PacketLayout {
        headroom: SEND_HEADROOM,
        max_len: usize::from(shared.settings.tun_mtu),
        tailroom: DATA_TAILROOM,
    };
    let mut pool = RecvPool::default();
    let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_READ_BATCH);
    let mut icmp = [0u8; unreachable::IPV6_ERROR_MAX];
    let mut limiter = unreachable::Limiter::new();
    let mut replies: Vec<Vec<u8>> = Vec::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = shared.tun.recv_many(&mut pool, layout, &mut batch, TUN_READ_BATCH) => {
                if let Err(e) = r {
                    warn!(error = %e, "tun read failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let lone = batch.len() == 1;
        {
            let reg = lock(&shared.registry);
            for packet in batch.drain(..) {
                let Some(payload) = packet.get(SEND_HEADROOM..) else {
                    continue;
                };
                let Ok((_, dst)) = spoof::addresses(payload) else {
                    bump(&shared.stats.malformed);
                    continue;
                };
                let client = reg.routes.lookup(dst).and_then(|id| reg.clients.get(&id));
                match client {
                    Some(c) => match c.tx.try_send(packet) {
                        Ok(()) => bump(&shared.stats.from_tun),
                        Err(_) => bump(&shared.stats.queue_full),
                    },
                    None => {
                        bump(&shared.stats.no_route);
                        // Tell the sender at once instead of letting its connect time out
                        // (rate-limited, so this path allocates only a bounded amount).
                        if limiter.allow(Instant::now()) {
                            if let Some(n) = unreachable::reply(payload, &mut icmp) {
                                replies.push(icmp[..n].to_vec());
                            }
                        }
                    }
                }
            }
        }
        for reply in replies.drain(..) {
            if shared.tun.send(&reply).await.is_ok() {
                bump(&shared.stats.unreachable_sent);
            }
        }
        if lone {
            // Let the connection send it before the next read finds the device empty (that
            // read would otherwise run first, on the packet's way: see `Tun::recv_many`).
            tokio::task::yield_now().await;
        }
    }
}

/// Writes the packets the connections decrypted into the tun device, so the kernel's work on
/// them (the whole inner receive path runs inside the write) is off the connections' tasks.
/// Takes what is queued, up to [`TUN_WRITE_BATCH`], and writes it with consecutive TCP
/// segments of one flow merged (see [`Coalescer`]).
async fn tun_writer(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<BytesMut>,
    shutdown: CancellationToken,
) {
    let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_WRITE_BATCH);
    let mut gro = Coalescer::with_capacity(TUN_WRITE_BATCH);
    loop {
        let packet = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = rx.recv() => match p {
                Some(p) => p,
                None => return,
            },
        };
        batch.push(packet);
        while batch.len() < TUN_WRITE_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        match shared.tun.send_many_sync(&mut batch, &mut gro) {
            Ok(n) => {
                shared.stats.to_tun.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => debug!(error = %e, "tun write failed"),
        }
        batch.clear();
    }
}

async fn status_writer(
    shared: Arc<Shared>,
    file: crate::settings::StatusFile,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(file.interval.max(Duration::from_secs(1)));
    let tmp = file.path.with_extension("tmp");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let text = status::render(&shared.snapshot());
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &file.path));
        if let Err(e) = written {
            warn!(path = %file.path.display(), error = %e, "cannot write the status file");
        }
    }
}

impl Shared {
    fn snapshot(&self) -> StatusSnapshot {
        let reg = lock(&self.registry);
        let mut clients: Vec<(ClientId, &ClientEntry)> =
            reg.clients.iter().map(|(id, c)| (*id, c)).collect();
        clients.sort_by_key(|(id, _)| *id);
        let routes = reg
            .routes
            .entries()
            .filter_map(|(prefix, id)| {
                let c = reg.clients.get(&id)?;
                Some(RouteStatus {
                    prefix,
                    common_name: c.common_name.clone(),
                    real_address: c.real,
                    last_ref: c.since,
                })
            })
            .collect();
        StatusSnapshot {
            title: status::default_title(),
            now: unix_now(),
            clients: clients
                .into_iter()
                .map(|(id, c)| ClientStatus {
                    common_name: c.common_name.clone(),
                    real_address: c.real,
                    virtual_v4: c.v4,
                    virtual_v6: c.v6,
                    bytes_received: c.traffic.received.load(Ordering::Relaxed),
                    bytes_sent: c.traffic.sent.load(Ordering::Relaxed),
                    connected_since: c.since,
                    username: c.username.clone(),
                    client_id: id,
                    peer_id: c.peer_id,
                    cipher: c.cipher.clone(),
                })
                .collect(),
            routes,
            max_bcast_queue: 0,
        }
    }

    /// Decides on an identified client: its client-config-dir entry, its addresses, its
    /// routes. `Err` is the reason sent with `AUTH_FAILED`.
    fn admit(
        &self,
        id: ClientId,
        identity: &ClientIdentity,
        conn: &ConnInfo,
    ) -> Result<Admission, String> {
        let s = &self.settings;
        let cn = identity.common_name.clone().unwrap_or_default();
        let opts: ClientOptions = s
            .client_options(identity.common_name.as_deref())
            .cloned()
            .unwrap_or_default();
        if opts.disable {
            return Err("client disabled".into());
        }
        let mut reg = lock(&self.registry);
        if !s.duplicate_cn {
            let same: Vec<ClientId> = reg
                .clients
                .iter()
                .filter(|(other, c)| **other != id && c.common_name == cn)
                .map(|(other, _)| *other)
                .collect();
            for other in same {
                if let Some(old) = reg.remove(other) {
                    info!(client = other, cn = %cn, "replaced by a new connection with the same CN (no duplicate-cn)");
                    old.kicked.cancel();
                }
            }
        }
        let mut lease = None;
        let (v4, v4_mask) = if let Some(push) = opts.ifconfig_push {
            if let Some(pool) = reg.pool.as_mut() {
                lease = pool
                    .acquire_fixed(push.local, Some(&cn))
                    .map_err(|e| e.to_string())?
                    .map(|l| l.index);
            }
            let host = IpNet::V4(Ipv4Net::from(push.local));
            if reg.routes.get(host).is_some() {
                release(&mut reg, lease);
                return Err(format!("address {} in use", push.local));
            }
            (Some(push.local), Some(push.remote_netmask))
        } else {
            match reg.pool.as_mut() {
                Some(pool) => match pool.acquire(Some(&cn), s.duplicate_cn) {
                    Ok(l) => {
                        lease = Some(l.index);
                        let mask = pool.v4_network().map(|n| n.netmask());
                        (l.v4, mask)
                    }
                    Err(e) => {
                        bump(&self.stats.pool_exhausted);
                        warn!(client = id, cn = %cn, error = %e, "refusing client: no address");
                        return Err("no address available".into());
                    }
                },
                None => (None, None),
            }
        };
        let server_v6 = reg.pool.as_ref().and_then(Pool::server_v6);
        let (v6, ifconfig_ipv6) = match (opts.ifconfig_ipv6_push, opts.ifconfig_push) {
            (Some(p), _) => {
                let remote = p.remote.or(server_v6.map(|n| n.addr()));
                (
                    Some(p.local.addr()),
                    remote.map(|r| format!("{} {r}", p.local)),
                )
            }
            // ifconfig-push without ifconfig-ipv6-push: no pool IPv6 (as upstream).
            (None, Some(_)) => (None, None),
            (None, None) => {
                let v6 = lease.and_then(|i| {
                    let pool = reg.pool.as_ref()?;
                    Some((pool.lease(i).v6?, pool.v6_network()?.prefix_len()))
                });
                match (v6, server_v6) {
                    (Some((a, len)), Some(srv)) => {
                        (Some(a), Some(format!("{a}/{len} {}", srv.addr())))
                    }
                    _ => (None, None),
                }
            }
        };
        let mut addresses: Vec<IpAddr> = Vec::new();
        addresses.extend(v4.map(IpAddr::V4));
        addresses.extend(v6.map(IpAddr::V6));
        for a in &addresses {
            reg.routes.insert(IpNet::from(*a), id);
        }
        for net in &opts.iroutes {
            if let Some(old) = reg.routes.insert(*net, id) {
                info!(client = id, route = %net, previous = old, "iroute moved to a new client");
            }
        }
        reg.clients.insert(
            id,
            ClientEntry {
                common_name: cn.clone(),
                username: identity
                    .username
                    .as_deref()
                    .map(|u| String::from_utf8_lossy(u).into_owned()),
                real: conn.peer,
                v4,
                v6,
                lease,
                tx: conn.tx.clone(),
                kicked: conn.kicked.clone(),
                traffic: Arc::clone(&conn.traffic),
                since: unix_now(),
                peer_id: conn.peer_id,
                cipher: String::new(),
            },
        );
        drop(reg);
        info!(
            client = id,
            cn = %cn,
            v4 = ?v4,
            v6 = ?v6,
            iroutes = ?opts.iroutes,
            "client identified; addresses assigned"
        );
        let settings = ClientSettings {
            push: s.push_for(Some(&opts)),
            ifconfig_ipv6,
            ifconfig: v4.zip(v4_mask).map(|(a, m)| format!("{a} {m}")),
        };
        Ok(Admission {
            settings,
            filter: SourceFilter::new(addresses, opts.iroutes.clone()),
        })
    }
}

fn release(reg: &mut Registry, lease: Option<u32>) {
    if let (Some(pool), Some(l)) = (reg.pool.as_mut(), lease) {
        pool.release(l);
    }
}

/// What the registry keeps of a connection.
struct ConnInfo {
    peer: SocketAddr,
    peer_id: u32,
    tx: mpsc::Sender<BytesMut>,
    kicked: CancellationToken,
    traffic: Arc<Traffic>,
}

/// One TCP connection and its session.
struct Connection {
    shared: Arc<Shared>,
    id: ClientId,
    filter: Option<SourceFilter>,
}

impl Connection {
    async fn run(
        shared: Arc<Shared>,
        stream: TcpStream,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
        shutdown: CancellationToken,
    ) {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut session = lock(&shared.endpoint).new_session(netio::rng::session_rng(), start);
        let peer_id = session.peer_id();
        let (tx, mut rx) = mpsc::channel::<BytesMut>(TUN_QUEUE);
        let info = ConnInfo {
            peer,
            peer_id: peer_id.get(),
            tx,
            kicked: CancellationToken::new(),
            traffic: Arc::new(Traffic::default()),
        };
        let mut conn = Connection {
            shared: Arc::clone(&shared),
            id,
            filter: None,
        };
        let (mut rd, mut wr) = stream.into_split();
        let decoder = FrameDecoder::new();
        let mut inbuf = BytesMut::with_capacity(64 * 1024);
        let mut frames: Vec<BytesMut> = Vec::with_capacity(64);
        let mut out = BytesMut::with_capacity(64 * 1024);
        let handshake_deadline = start + shared.settings.handshake_timeout;
        let mut established = false;
        let mut drain_deadline: Option<Instant> = None;
        let mut why = String::from("closed");
        'conn: loop {
            // Output: control packets and events until both are quiet.
            let now = Instant::now();
            let mut closed = false;
            loop {
                let mut progressed = false;
                while let Some(b) = session.poll_transmit(now, unix_now()) {
                    out.extend_from_slice(&b);
                    progressed = true;
                }
                while let Some(event) = session.poll_event() {
                    progressed = true;
                    match event {
                        Event::ClientIdentified(identity) => {
                            match shared.admit(id, &identity, &info) {
                                Ok(adm) => {
                                    conn.filter = Some(adm.filter);
                                    session.accept_client(now, adm.settings);
                                }
                                Err(reason) => {
                                    bump(&shared.stats.rejected);
                                    info!(client = id, cn = ?identity.common_name, %reason, "client refused");
                                    session.reject_client(now, Some(reason));
                                }
                            }
                        }
                        Event::Connected(c) => {
                            established = true;
                            bump(&shared.stats.connected);
                            let mut reg = lock(&shared.registry);
                            if let Some(e) = reg.clients.get_mut(&id) {
                                e.cipher = c.cipher.name().to_owned();
                                e.since = unix_now();
                            }
                            info!(client = id, cipher = c.cipher.name(), peer_id = ?c.peer_id, tls_ekm = c.tls_ekm, "tunnel established");
                        }
                        Event::KeyRenegotiated { key_id } => {
                            info!(client = id, key_id = key_id.get(), "key renegotiated");
                        }
                        Event::Closed(reason) => {
                            why = reason.to_string();
                            closed = true;
                        }
                    }
                }
                if !progressed {
                    break;
                }
            }
            if !out.is_empty() {
                if let Err(e) = wr.write_all(&out).await {
                    why = format!("write failed: {e}");
                    break 'conn;
                }
                info.traffic
                    .sent
                    .fetch_add(out.len() as u64, Ordering::Relaxed);
                out.clear();
            }
            if closed {
                break;
            }
            let mut wake = session.poll_timeout();
            if !established {
                wake = Some(wake.map_or(handshake_deadline, |w| w.min(handshake_deadline)));
            }
            if let Some(d) = drain_deadline {
                wake = Some(wake.map_or(d, |w| w.min(d)));
            }
            let sleep = async {
                match wake {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled(), if drain_deadline.is_none() => {
                    if !established {
                        why = "server shutting down".into();
                        break;
                    }
                    session.send_restart(ServerSignal::default());
                    drain_deadline = Some(Instant::now() + shared.settings.drain_timeout);
                    info!(client = id, "told client: RESTART");
                }
                _ = info.kicked.cancelled() => {
                    why = "replaced by a newer connection with the same CN".into();
                    break;
                }
                r = rd.read_buf(&mut inbuf) => match r {
                    Ok(0) => {
                        why = "connection closed by peer".into();
                        break;
                    }
                    Ok(n) => {
                        info.traffic.received.fetch_add(n as u64, Ordering::Relaxed);
                        loop {
                            match decoder.decode(&mut inbuf) {
                                Ok(Some(packet)) => frames.push(packet),
                                Ok(None) => break,
                                Err(e) => {
                                    why = format!("bad framing: {e}");
                                    break 'conn;
                                }
                            }
                        }
                        let now = Instant::now();
                        let lone = frames.len() == 1;
                        for packet in frames.drain(..) {
                            match session.handle_packet(now, packet) {
                                Ok(Some(payload)) => conn.packet_from_client(payload, lone).await,
                                Ok(None) => {}
                                Err(e) => debug!(client = id, error = %e, "packet dropped"),
                            }
                        }
                        if inbuf.capacity() - inbuf.len() < 4096 {
                            inbuf.reserve(64 * 1024);
                        }
                    }
                    Err(e) => {
                        why = format!("read failed: {e}");
                        break;
                    }
                },
                Some(mut packet) = rx.recv() => {
                    let now = Instant::now();
                    let mut batch = 0;
                    loop {
                        match session.send_tun_packet(now, &mut packet, SEND_HEADROOM) {
                            Ok(()) => out.extend_from_slice(&packet),
                            Err(e) => debug!(client = id, error = %e, "tun packet not sent"),
                        }
                        batch += 1;
                        if batch >= 64 {
                            break;
                        }
                        match rx.try_recv() {
                            Ok(p) => packet = p,
                            Err(_) => break,
                        }
                    }
                }
                _ = sleep => {
                    let now = Instant::now();
                    if !established && now >= handshake_deadline {
                        bump(&shared.stats.handshake_timeouts);
                        why = format!("no tunnel within {:?} (handshake deadline)", shared.settings.handshake_timeout);
                        break;
                    }
                    if drain_deadline.is_some_and(|d| now >= d) {
                        why = "drain timeout after RESTART".into();
                        break;
                    }
                    session.handle_timeout(now);
                }
            }
        }
        if let Some(refused) = session.rejection() {
            let mut text = format!("refused: {refused}");
            let mut cause = std::error::Error::source(refused);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            why = format!("{text} ({why})");
        }
        let _ = wr.shutdown().await;
        let removed = lock(&shared.registry).remove(id).is_some();
        lock(&shared.endpoint).release(peer_id);
        drop(permit);
        info!(client = id, %peer, reason = %why, admitted = removed, "client disconnected");
    }

    /// A decrypted packet from the client: spoof check, then the tun device or another
    /// client. `lone`: the only packet of its socket read; written to the device here when
    /// the tun writer is idle (a hand-off would add a wake-up to every round trip), otherwise
    /// queued to the writer.
    async fn packet_from_client(&mut self, payload: BytesMut, lone: bool) {
        let stats = &self.shared.stats;
        let Some(filter) = &self.filter else {
            bump(&stats.malformed);
            return;
        };
        match filter.check(&payload) {
            SpoofVerdict::Accept { dst, .. } => {
                // Without client-to-client every packet goes to the tun device: no lookup.
                let target = if !self.shared.settings.client_to_client {
                    None
                } else {
                    let reg = lock(&self.shared.registry);
                    match reg
                        .routes
                        .forward(self.id, dst, self.shared.settings.client_to_client)
                    {
                        Forward::Tun => None,
                        Forward::Client(other) => reg.clients.get(&other).map(|c| c.tx.clone()),
                    }
                };
                match target {
                    None => {
                        let tx = &self.shared.tun_tx;
                        if lone && tx.capacity() == tx.max_capacity() {
                            match self.shared.tun.send(&payload).await {
                                Ok(()) => bump(&stats.to_tun),
                                Err(e) => debug!(client = self.id, error = %e, "tun write failed"),
                            }
                        } else {
                            // Waits when the writer is behind: the socket is then read no
                            // faster than the device takes packets.
                            let _ = tx.send(payload).await;
                        }
                    }
                    Some(tx) => {
                        let mut packet =
                            BytesMut::with_capacity(SEND_HEADROOM + payload.len() + DATA_TAILROOM);
                        packet.resize(SEND_HEADROOM, 0);
                        packet.extend_from_slice(&payload);
                        match tx.try_send(packet) {
                            Ok(()) => bump(&stats.client_to_client),
                            Err(_) => bump(&stats.queue_full),
                        }
                    }
                }
            }
            SpoofVerdict::Spoofed { src, dst } => {
                let n = stats.spoofed.fetch_add(1, Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    warn!(client = self.id, %src, %dst, dropped_total = n + 1, "packet with a source address not assigned to the client dropped");
                }
            }
            SpoofVerdict::Ignored => bump(&stats.ignored),
            SpoofVerdict::Malformed(e) => {
                bump(&stats.malformed);
                debug!(client = self.id, error = %e, "malformed packet from client");
            }
        }
    }
}
