//! Who is connected and what they own: the address pool, the routing table (each client's
//! addresses and iroutes → the client) and the clients, under one lock in the server; and the
//! decisions about them. Nothing here does I/O, so admission is tested without root or a tun
//! device.
//!
//! * [`admission`]: what a connection must show, and by when, before it is authenticated
//!   (a valid first packet, deadlines); pending connections have their own bound
//!   (`netio::listen::PendingSet`), apart from `max-clients`.
//! * [`Slots`]: `max-clients`, counted per authenticated client (TLS and key-method 2 done),
//!   never per pending connection.
//! * [`Registry::admit`]: the client's device type (its OCC `dev-type` must not be the other
//!   of `tun` and `tap`, conformance/DEVIATIONS.md W4; but a vpn2 HA client, `dev tap`, is
//!   carried by our HA server at layer 2, H9), an identified client's client-config-dir entry (`disable`,
//!   `ifconfig-push`, `iroute`, per-client `push`), `duplicate-cn` (without it a newer
//!   connection with the same CN replaces the older one), its addresses from the pool, its
//!   routes; the [`Admitted`] settings to push, or why it is [`Refused`] (the reason goes to the
//!   client with `AUTH_FAILED`).
//! * In tap mode ([`Registry::tap`]) no IP routes are kept (upstream learns neither addresses
//!   nor iroutes there): frames are switched by the MAC addresses learned from each client
//!   ([`crate::switch`]), [`Registry::switch_from_client`] and [`Registry::switch_from_tap`].
//! * In HA mode ([`Registry::ha`]) there is no pool and no routing table: a kube-apiserver
//!   connection (`vpn-seed-client`, any number) owns the address it connected from, a shoot
//!   connection (`vpn-shoot-client-<j>`, one per index, a newer replacing an older) its index
//!   once its tunnel is up, and [`Registry::switch_ha`] says where a packet goes
//!   ([`crate::ha`]). While no shoot connection is up, packets to the shoot are held for the
//!   hold bound after the last one left (or after the start) ([`Registry::hold_ha`]) and go,
//!   in order, to the first shoot connection whose tunnel comes up. vpn2's HA clients (OCC
//!   `dev-type tap`) are layer-2 connections beside those: an address of the pool (vpn2's
//!   `server-ipv6`) each, their frames switched among themselves by MAC address
//!   ([`Registry::switch_layer2`], as vpn2's server with `client-to-client`), never to or
//!   from a layer-3 connection.
//! * [`Registry::remove`]: a client left; its lease and routes are freed, and packets to its
//!   routes are held for the hold bound ([`hold`], [`Registry::route_from_device`]) until a
//!   client's tunnel comes up with them ([`Registry::established`]).
//! * [`Registry::status`]: what the status file shows.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use protocol::key::Role;
use protocol::km2::occ::{check_dev_type, DevType, DevTypeMismatch, OccOptions};
use protocol::push::{PushItem, PushedOption};
use protocol::session::{ClientIdentity, ClientSettings, SEND_HEADROOM};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::gateway::Gateway;
use crate::ha::{self, HaSwitch, Switched};
use crate::pool::{Pool, PoolError};
use crate::routing::{Forward, RoutingTable};
use crate::settings::{ClientOptions, Settings};
use crate::spoof::SourceFilter;
use crate::status::{
    self, ClientStatus, MacRouteStatus, RouteStatus, ShootRouteStatus, StatusSnapshot,
};
use crate::switch::{Dropped, FromClient, FromTap, MacTable};

pub mod admission;
pub mod hold;

use self::hold::{HoldCounts, HoldLimits, TunHold};

/// A connection's internal id (upstream's "Client ID" in the status file).
pub type ClientId = u64;

/// `max-clients`: one slot per authenticated client, taken when its TLS handshake and
/// key-method 2 are done (`ClientIdentified`), freed when its connection ends. A connection
/// that has not got that far holds none (it is pending, [`admission`]). While every slot is
/// taken, new connections are closed at accept, as upstream does.
#[derive(Debug, Clone)]
pub struct Slots {
    max: usize,
    free: Arc<Semaphore>,
}

/// A connection's slot; freed when dropped.
pub type Slot = OwnedSemaphorePermit;

impl Slots {
    /// `max` slots.
    pub fn new(max: usize) -> Slots {
        Slots {
            max,
            free: Arc::new(Semaphore::new(max)),
        }
    }

    /// A slot for an authenticated client, or [`Refused::MaxClients`] when all are taken.
    pub fn take(&self) -> Result<Slot, Refused> {
        Arc::clone(&self.free)
            .try_acquire_owned()
            .map_err(|_| Refused::MaxClients { max: self.max })
    }

    /// Whether every slot is taken (a new connection is then closed at accept).
    pub fn is_full(&self) -> bool {
        self.free.available_permits() == 0
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// Why a client is not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// `max-clients` clients are authenticated.
    #[error("{max} clients connected (max-clients)")]
    MaxClients {
        /// The limit.
        max: usize,
    },
    /// Its certificate's common name is not a client identity (`pki::check::is_valid_identity`:
    /// letters, digits and `-_.@`). The name keys the client-config-dir and names the client
    /// in the status file and the log, where a comma or a line feed would have to be escaped
    /// at every use. Upstream remaps such characters to `_`; we refuse, so two certificates
    /// never share an identity.
    #[error("common name {cn:?} is not a client identity (letters, digits and -_.@ only)")]
    InvalidCommonName {
        /// The name as the certificate has it (printed escaped).
        cn: String,
    },
    /// Its client-config-dir entry says `disable`.
    #[error("client disabled")]
    Disabled,
    /// Its `ifconfig-push` address (outside the pool) is another client's.
    #[error("address {addr} in use")]
    AddressInUse {
        /// The address.
        addr: Ipv4Addr,
    },
    /// Its `ifconfig-push` address inside the pool is held by another client.
    #[error(transparent)]
    FixedAddress(PoolError),
    /// HA mode: the common name is neither `vpn-seed-client` nor `vpn-shoot-client-<j>`.
    #[error(
        "common name {cn:?} has no place in the HA layout (vpn-seed-client, vpn-shoot-client-<j>)"
    )]
    NotHaClient {
        /// The name.
        cn: String,
    },
    /// The pool has no free address.
    #[error("no address available")]
    PoolExhausted {
        /// The pool's answer.
        #[source]
        source: PoolError,
    },
    /// Its OCC options string names the other device type (`dev-type tap` at a tun or HA
    /// server, `dev-type tun` at a tap server): none of its packets could cross, and in HA
    /// it would count towards readiness (vpn2's rule looks at CNs only). Upstream only warns.
    /// The connection closes without `AUTH_FAILED`, so that upstream's client tries again
    /// instead of exiting (DEVIATIONS W4).
    #[error(transparent)]
    DevType(DevTypeMismatch),
}

/// Byte counters of one connection (the status file's), and whether a packet was routed to
/// it since the status was last taken (its routing-table rows' `Last Ref`).
#[derive(Debug, Default)]
pub struct Traffic {
    /// Bytes read from the client's socket.
    pub received: AtomicU64,
    /// Bytes written to the client's socket.
    pub sent: AtomicU64,
    /// Set by the packet path when it routes a packet to the client; taken by
    /// [`Registry::status`], which turns it into that status's time.
    referenced: AtomicBool,
}

impl Traffic {
    /// A packet was routed to this client. A load first: once set, the line is only read
    /// until the next status takes the mark, so the packet path writes it at most once per
    /// status interval.
    pub fn mark_referenced(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a packet was routed to the client since the last call; clears the mark.
    fn take_referenced(&self) -> bool {
        self.referenced.load(Ordering::Relaxed) && self.referenced.swap(false, Ordering::Relaxed)
    }
}

/// What the registry keeps of a connection to reach it.
#[derive(Debug, Clone)]
pub struct ConnHandle {
    /// The client's TCP address.
    pub peer: SocketAddr,
    /// Its data-channel peer id.
    pub peer_id: u32,
    /// Packets for it (from the tun device or another client), already laid out for in-place
    /// encryption.
    pub tx: mpsc::Sender<BytesMut>,
    /// Cancelled when a newer connection with the same CN replaces it.
    pub kicked: CancellationToken,
    /// Its byte counters.
    pub traffic: Arc<Traffic>,
}

/// An admitted client.
#[derive(Debug)]
pub struct ClientEntry {
    /// Certificate CN (empty without one).
    pub common_name: String,
    /// Assigned IPv4 address.
    pub v4: Option<Ipv4Addr>,
    /// Assigned IPv6 address.
    pub v6: Option<Ipv6Addr>,
    /// Its pool entry, if the address came from the pool.
    lease: Option<u32>,
    /// How to reach the connection.
    pub conn: ConnHandle,
    /// Since when (unix seconds): admission, then tunnel up.
    pub since: u64,
    /// The data-channel cipher once the tunnel is up.
    pub cipher: String,
    /// Its rows' `Last Ref` (unix seconds): `since`, then the time of each status that found
    /// a reference ([`Registry::status`]).
    last_ref: u64,
    /// HA mode: `conn.traffic.received` when the status was last taken.
    received_seen: u64,
    /// HA mode: one of vpn2's clients (OCC `dev-type tap`), whose frames are switched by
    /// MAC address among the other layer-2 connections ([`Registry::switch_layer2`]).
    pub layer2: bool,
}

impl ClientEntry {
    /// Whether `addr` is the client's own address (not one of its iroutes): a packet routed
    /// to it moves the `Last Ref` of the client's rows, as upstream's lookup of the host
    /// route does.
    pub fn is_own_address(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => self.v4 == Some(a),
            IpAddr::V6(a) => self.v6 == Some(a),
        }
    }
}

/// What an admitted client gets.
#[derive(Debug)]
pub struct Admitted {
    /// The per-client part of the push (`ifconfig`, `ifconfig-ipv6`, client-config-dir pushes).
    pub settings: ClientSettings,
    /// The sources its packets may carry (its addresses and iroutes).
    pub filter: SourceFilter,
}

/// One client with its tunnel up, as [`Registry::tunnels`] (and the server's `ClientRoutes::tunnels`) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelAddresses {
    /// Certificate CN (empty without one).
    pub common_name: String,
    /// Assigned IPv4 address.
    pub v4: Option<std::net::Ipv4Addr>,
    /// Assigned IPv6 address.
    pub v6: Option<std::net::Ipv6Addr>,
}

/// Pool, the packet mode's table and clients.
#[derive(Debug)]
pub struct Registry {
    pool: Option<Pool>,
    table: Table,
    clients: HashMap<ClientId, ClientEntry>,
    /// Packets held for reconnecting clients ([`hold`]; holds nothing until
    /// [`Registry::hold_for`]), each with the connection it came from (none: the device;
    /// in HA mode a kube-apiserver connection).
    hold: TunHold<Option<ClientId>>,
    /// Changes whenever a client's tunnel comes up (its routes usable): what held CONNECTs
    /// of the sidecar wait on.
    route_changes: watch::Sender<u64>,
    /// HA mode: the gateway from our layer-3 kube-apiservers to vpn2's layer-2 shoot pods
    /// ([`crate::gateway`]; none without `VPN_NETWORK`).
    gateway: Option<Gateway<ClientId>>,
}

/// Where a packet read from the tun device goes ([`Registry::route_from_device`]).
#[derive(Debug)]
pub enum DeviceRoute<'a> {
    /// To this client, its tunnel up.
    Client(&'a ClientEntry),
    /// Held under this prefix: its client's tunnel is not up yet, or its client left less
    /// than the hold bound ago.
    Hold(IpNet),
    /// No client routes it (ICMP unreachable).
    Unroutable,
}

/// What the registry keeps to find a packet's client: one kind for the server's life, the one
/// its packet mode uses (chosen by the constructor: [`Registry::new`], [`Registry::tap`],
/// [`Registry::ha`]).
#[derive(Debug)]
enum Table {
    /// Routed (tun): each client's addresses and iroutes, longest prefix first.
    Routes(RoutingTable<ClientId>),
    /// Switched (tap): the MAC addresses learned from each client. No IP routes: upstream
    /// learns neither addresses nor iroutes there.
    Macs(MacTable<ClientId>),
    /// HA: the switch between our (layer 3) kube-apiserver and shoot connections, and the
    /// MAC table of vpn2's (layer 2, `dev tap`) connections, switched among themselves as
    /// vpn2's server does with `client-to-client` ([`Registry::switch_layer2`]). No routes;
    /// the pool (if any) leases the layer-2 connections' addresses.
    Ha(HaSwitch<ClientId>, MacTable<ClientId>),
}

impl Table {
    /// Forgets what client `id` owned (it left).
    fn forget(&mut self, id: ClientId) {
        match self {
            Table::Routes(routes) => routes.remove_owner(id),
            Table::Macs(macs) => macs.remove_owner(id),
            Table::Ha(switch, macs) => {
                switch.seed_disconnected(id);
                switch.shoot_disconnected(id);
                macs.remove_owner(id);
            }
        }
    }

    /// The IP prefixes and their owners, as the status file's routing table lists them in
    /// routed mode; none in tap and HA mode (`Registry::ha_rows`).
    fn ip_routes(&self) -> Vec<(IpNet, ClientId)> {
        match self {
            Table::Routes(routes) => routes.entries().collect(),
            Table::Macs(_) | Table::Ha(..) => Vec::new(),
        }
    }
}

impl Registry {
    /// An empty registry over `pool` (`None`: no pool; clients need `ifconfig-push`).
    pub fn new(pool: Option<Pool>) -> Registry {
        Registry {
            pool,
            table: Table::Routes(RoutingTable::new()),
            clients: HashMap::new(),
            hold: TunHold::new(Duration::ZERO, HoldLimits::default()),
            route_changes: watch::Sender::new(0),
            gateway: None,
        }
    }

    /// HA mode: our kube-apiservers reach vpn2's layer-2 shoot pods through a gateway in
    /// `vpn_network` (vpn2's `VPN_NETWORK`; [`crate::gateway`]) while no layer-3 shoot
    /// connection is up; with `overlap` their hellos carry the 241/8 image of the pod IP.
    #[must_use]
    pub fn with_gateway(mut self, vpn_network: Option<Ipv6Net>, overlap: bool) -> Registry {
        self.gateway = vpn_network.map(|n| Gateway::new(n).hello_images(overlap));
        self
    }

    /// HA mode: the gateway, if any.
    pub fn gateway_mut(&mut self) -> Option<&mut Gateway<ClientId>> {
        self.gateway.as_mut()
    }

    /// Holds packets from the device for reconnecting clients (in HA mode, packets to the
    /// shoot while no shoot connection is up) for `bound` within `limits` ([`hold`]); a zero
    /// bound holds nothing.
    #[must_use]
    pub fn hold_for(mut self, bound: Duration, limits: HoldLimits) -> Registry {
        self.hold = TunHold::new(bound, limits);
        self
    }

    /// The configured clients' routes (`prefixes`: their client-config-dir iroutes; in HA
    /// mode the shoot networks) count as routed until the bound after `start`: a server that
    /// has just (re)started holds the packets for them until their clients are back, as it
    /// would had it kept running, instead of refusing the connections a restart interrupted.
    #[must_use]
    pub fn expecting(
        mut self,
        prefixes: impl IntoIterator<Item = IpNet>,
        start: Instant,
    ) -> Registry {
        self.hold.routes_left(prefixes, start);
        self
    }

    /// A receiver whose value changes whenever a client's tunnel comes up.
    pub fn route_changes(&self) -> watch::Receiver<u64> {
        self.route_changes.subscribe()
    }

    /// What [`hold`] did so far.
    pub fn hold_counts(&self) -> HoldCounts {
        self.hold.counts()
    }

    /// Where a packet read from the device to `dst` goes at `now`: to the client routing it
    /// with its tunnel up; held while that client's tunnel is not up yet, or when no client
    /// routes it but one did less than the hold bound ago; else nowhere.
    pub fn route_from_device(&self, dst: IpAddr, now: Instant) -> DeviceRoute<'_> {
        let Table::Routes(routes) = &self.table else {
            return DeviceRoute::Unroutable;
        };
        let holding = !self.hold.bound().is_zero();
        match routes
            .lookup(dst)
            .and_then(|id| Some((id, self.clients.get(&id)?)))
        {
            Some((_, c)) if !c.cipher.is_empty() || !holding => DeviceRoute::Client(c),
            Some((id, _)) => routes
                .entries()
                .filter(|(net, owner)| *owner == id && net.contains(&dst))
                .map(|(net, _)| net)
                .max_by_key(IpNet::prefix_len)
                .map_or(DeviceRoute::Unroutable, DeviceRoute::Hold),
            None => self
                .hold
                .recently_routed(dst, now)
                .map_or(DeviceRoute::Unroutable, DeviceRoute::Hold),
        }
    }

    /// Holds `packet` (read from the device, to `dst`) under `prefix` from `now`; gives it
    /// back when a limit does not let it (answer it as unroutable).
    pub fn hold_packet(
        &mut self,
        prefix: IpNet,
        dst: IpAddr,
        packet: BytesMut,
        now: Instant,
    ) -> Result<(), BytesMut> {
        self.hold.hold(prefix, dst, None, packet, now)
    }

    /// HA mode: holds `packet` (from kube-apiserver connection `from`, to `dst`, laid out
    /// for sending: [`SEND_HEADROOM`] before the IP packet) from `now`, for lack of a shoot
    /// connection, if one left less than the hold bound ago (or the server started less than
    /// that ago); gives it back when not, or when a limit does not let it (answer it as
    /// unroutable). It goes to the first shoot connection whose tunnel comes up
    /// ([`Registry::established`]).
    pub fn hold_ha(
        &mut self,
        from: ClientId,
        dst: IpAddr,
        packet: BytesMut,
        now: Instant,
    ) -> Result<(), BytesMut> {
        match self.hold.recently_routed(dst, now) {
            Some(prefix) => self.hold.hold(prefix, dst, Some(from), packet, now),
            None => Err(packet),
        }
    }

    /// The held packets whose bound passed at `now` (to answer as unroutable), each with the
    /// connection it came from (none: the device).
    pub fn expire_held(&mut self, now: Instant) -> Vec<(Option<ClientId>, BytesMut)> {
        self.hold.expire(now)
    }

    /// When the next held packet's bound passes.
    pub fn next_hold_expiry(&self) -> Option<Instant> {
        self.hold.next_expiry()
    }

    /// An empty registry for HA mode over the shoot's networks (as the tunnel sees them): no
    /// routes; packets are switched by [`Registry::switch_ha`], and frames of vpn2's layer-2
    /// connections by [`Registry::switch_layer2`] (at most `max_macs_per_client` addresses
    /// each). `pool` leases the layer-2 connections' addresses (vpn2's `server-ipv6`); our
    /// layer-3 connections get none.
    pub fn ha(
        shoot_networks: Vec<IpNet>,
        pool: Option<Pool>,
        max_macs_per_client: usize,
    ) -> Registry {
        Registry {
            table: Table::Ha(
                HaSwitch::new(shoot_networks),
                MacTable::new(max_macs_per_client),
            ),
            ..Registry::new(pool)
        }
    }

    /// HA mode: where `packet` from client `from` goes at `now`; `None` outside HA mode.
    pub fn switch_ha(
        &mut self,
        from: ClientId,
        packet: &[u8],
        now: Instant,
    ) -> Option<Result<&ClientEntry, ha::Dropped>> {
        let Table::Ha(switch, _) = &mut self.table else {
            return None;
        };
        Some(match switch.switch(from, packet, now) {
            Switched::To(id) => match self.clients.get(&id) {
                Some(c) => Ok(c),
                // Never: removal tells the switch.
                None => Err(ha::Dropped::NoShoot),
            },
            Switched::Dropped(why) => Err(why),
        })
    }

    /// HA mode: whether client `id` is one of vpn2's layer-2 connections.
    pub fn is_layer2(&self, id: ClientId) -> bool {
        self.clients.get(&id).is_some_and(|c| c.layer2)
    }

    /// HA mode: learns the source of `frame` from layer-2 connection `from` and says where
    /// it goes among the layer-2 connections, as vpn2's server with `client-to-client` (a
    /// group destination to every other layer-2 connection, [`Registry::layer2_flood_targets`];
    /// a learned one to its owner). What vpn2's server hands its `tap0` ([`FromClient::Tap`]:
    /// an unknown unicast) has no device here and is dropped by the caller. `None` outside
    /// HA mode.
    pub fn switch_layer2(
        &mut self,
        from: ClientId,
        frame: &[u8],
        now_unix: u64,
    ) -> Option<FromClient<&ClientEntry>> {
        let Table::Ha(_, macs) = &mut self.table else {
            return None;
        };
        Some(match macs.from_client(from, frame, true, now_unix) {
            FromClient::Client(id) => self
                .clients
                .get(&id)
                .map_or(FromClient::Tap, FromClient::Client),
            FromClient::Tap => FromClient::Tap,
            FromClient::Flood => FromClient::Flood,
            FromClient::Drop(why) => FromClient::Drop(why),
        })
    }

    /// HA mode: the layer-2 connections a flooded frame goes to: every one with its tunnel
    /// up but `except`.
    pub fn layer2_flood_targets(&self, except: ClientId) -> impl Iterator<Item = &ClientEntry> {
        self.flood_targets(Some(except)).filter(|c| c.layer2)
    }

    /// An empty registry for tap mode: frames are switched by learned MAC addresses, at most
    /// `max_macs_per_client` per client, and no IP routes are kept.
    pub fn tap(pool: Option<Pool>, max_macs_per_client: usize) -> Registry {
        Registry {
            table: Table::Macs(MacTable::new(max_macs_per_client)),
            ..Registry::new(pool)
        }
    }

    /// Tap mode: learns the source of `frame` from client `from` and says where the frame
    /// goes ([`crate::switch`]); `None` in tun mode.
    pub fn switch_from_client(
        &mut self,
        from: ClientId,
        frame: &[u8],
        client_to_client: bool,
        now_unix: u64,
    ) -> Option<FromClient<&ClientEntry>> {
        let Table::Macs(macs) = &mut self.table else {
            return None;
        };
        let verdict = macs.from_client(from, frame, client_to_client, now_unix);
        Some(match verdict {
            FromClient::Tap => FromClient::Tap,
            FromClient::Flood => FromClient::Flood,
            FromClient::Drop(why) => FromClient::Drop(why),
            // Learned from a client that is gone by now: the kernel decides.
            FromClient::Client(id) => self
                .clients
                .get(&id)
                .map_or(FromClient::Tap, FromClient::Client),
        })
    }

    /// Tap mode: where `frame`, read from the tap device, goes; `None` in tun mode.
    pub fn switch_from_tap(&self, frame: &[u8]) -> Option<FromTap<&ClientEntry>> {
        let Table::Macs(macs) = &self.table else {
            return None;
        };
        Some(match macs.from_tap(frame) {
            FromTap::Flood => FromTap::Flood,
            FromTap::Drop(why) => FromTap::Drop(why),
            FromTap::Client(id) => match self.clients.get(&id) {
                Some(c) => FromTap::Client(c),
                // Learned from a client that is gone by now (never: removal forgets them).
                None => FromTap::Drop(match crate::switch::addresses(frame) {
                    Some((dst, _)) => Dropped::UnknownDestination(dst),
                    None => Dropped::Short,
                }),
            },
        })
    }

    /// The clients a flooded frame goes to: every one with its tunnel up but `except`.
    pub fn flood_targets(&self, except: Option<ClientId>) -> impl Iterator<Item = &ClientEntry> {
        self.clients
            .iter()
            .filter(move |(id, c)| Some(**id) != except && !c.cipher.is_empty())
            .map(|(_, c)| c)
    }

    /// The admitted client `id`.
    pub fn get(&self, id: ClientId) -> Option<&ClientEntry> {
        self.clients.get(&id)
    }

    /// How many clients are admitted.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client is admitted.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// The client whose address or iroute is the longest prefix containing `dst`.
    pub fn route(&self, dst: IpAddr) -> Option<&ClientEntry> {
        let Table::Routes(routes) = &self.table else {
            return None;
        };
        routes.lookup(dst).and_then(|id| self.clients.get(&id))
    }

    /// Where a packet from client `from` to `dst` goes: the tun device, or (with
    /// `client-to-client`) the connection of the client routing `dst`.
    pub fn forward(
        &self,
        from: ClientId,
        dst: IpAddr,
        client_to_client: bool,
    ) -> Option<&ClientEntry> {
        let Table::Routes(routes) = &self.table else {
            return None;
        };
        match routes.forward(from, dst, client_to_client) {
            Forward::Tun => None,
            Forward::Client(other) => self.clients.get(&other),
        }
    }

    /// Decides on client `id` of connection `conn`, identified as `identity`: its
    /// client-config-dir entry, `duplicate-cn`, its addresses and routes. An older client
    /// with the same CN is removed (and its connection told through `kicked`) unless
    /// `duplicate-cn`.
    pub fn admit(
        &mut self,
        settings: &Settings,
        id: ClientId,
        identity: &ClientIdentity,
        conn: ConnHandle,
        now_unix: u64,
    ) -> Result<Admitted, Refused> {
        let peer = OccOptions::parse(&identity.options);
        // HA: vpn2's clients (`dev tap`) are carried at layer 2 (DEVIATIONS W4, H9).
        let layer2 = matches!(self.table, Table::Ha(..)) && peer.dev_type() == Some(DevType::Tap);
        if !layer2 {
            check_dev_type(settings.dev_type, Role::Server, &peer).map_err(Refused::DevType)?;
        }
        if let Some(cn) = identity
            .common_name
            .as_deref()
            .filter(|cn| !pki::check::is_valid_identity(cn))
        {
            return Err(Refused::InvalidCommonName { cn: cn.to_owned() });
        }
        let cn = identity.common_name.clone().unwrap_or_default();
        let opts: ClientOptions = settings
            .client_options(identity.common_name.as_deref())
            .cloned()
            .unwrap_or_default();
        if opts.disable {
            return Err(Refused::Disabled);
        }
        if layer2 {
            return self.admit_layer2(settings, id, cn, &opts, conn, now_unix);
        }
        if let Table::Ha(..) = self.table {
            return self.admit_ha(settings, id, cn, &opts, conn, now_unix);
        }
        if !settings.duplicate_cn {
            self.replace_same_cn(id, &cn);
        }
        let mut lease = None;
        let (v4, v4_mask) = if let Some(push) = opts.ifconfig_push {
            if let Some(pool) = self.pool.as_mut() {
                lease = pool
                    .acquire_fixed(push.local, Some(&cn))
                    .map_err(Refused::FixedAddress)?
                    .map(|l| l.index);
            }
            let host = IpNet::V4(Ipv4Net::from(push.local));
            if matches!(&self.table, Table::Routes(routes) if routes.get(host).is_some()) {
                self.release(lease);
                return Err(Refused::AddressInUse { addr: push.local });
            }
            (Some(push.local), Some(push.remote_netmask))
        } else {
            match self.pool.as_mut() {
                Some(pool) => {
                    let l = pool
                        .acquire(Some(&cn), settings.duplicate_cn)
                        .map_err(|source| Refused::PoolExhausted { source })?;
                    lease = Some(l.index);
                    (l.v4, pool.v4_network().map(|n| n.netmask()))
                }
                None => (None, None),
            }
        };
        let (v6, ifconfig_ipv6) = self.ipv6_for(&opts, lease);
        let addresses: Vec<IpAddr> = v4
            .map(IpAddr::V4)
            .into_iter()
            .chain(v6.map(IpAddr::V6))
            .collect();
        // Tap mode switches by MAC address: no IP routes (upstream ignores iroutes there).
        if let Table::Routes(routes) = &mut self.table {
            for a in &addresses {
                routes.insert(IpNet::from(*a), id);
            }
            for net in &opts.iroutes {
                if let Some(old) = routes.insert(*net, id) {
                    tracing::info!(route = %net, previous = old, "iroute moved to a new client");
                }
            }
        } else if self.clients.values().any(|c| v4.is_some() && c.v4 == v4) {
            // A fixed address another client holds (outside the pool: no lease tells).
            self.release(lease);
            return Err(Refused::AddressInUse {
                addr: v4.unwrap_or(Ipv4Addr::UNSPECIFIED),
            });
        }
        self.clients.insert(
            id,
            ClientEntry {
                common_name: cn,
                v4,
                v6,
                lease,
                conn,
                since: now_unix,
                cipher: String::new(),
                last_ref: now_unix,
                received_seen: 0,
                layer2: false,
            },
        );
        Ok(Admitted {
            settings: ClientSettings {
                push: settings.push_for(Some(&opts)),
                ifconfig_ipv6,
                ifconfig: v4.zip(v4_mask),
            },
            filter: SourceFilter::new(addresses, opts.iroutes.clone()),
        })
    }

    /// HA mode's admission of one of vpn2's clients (OCC `dev-type tap`): a kube-apiserver's
    /// (`vpn-seed-client`) or a shoot pod's (`vpn-shoot-client-<j>`) tap connection, switched
    /// by MAC address among the other layer-2 connections, never into the layer-3 switch. As
    /// vpn2's HA server (`duplicate-cn`), an older connection with the same CN stays. It gets
    /// what vpn2's server pushes it: an address from the pool of its `server-ipv6` (this
    /// server's /112 of `VPN_NETWORK`) with the server's address, and `tun-ipv6`.
    fn admit_layer2(
        &mut self,
        settings: &Settings,
        id: ClientId,
        cn: String,
        opts: &ClientOptions,
        conn: ConnHandle,
        now_unix: u64,
    ) -> Result<Admitted, Refused> {
        if cn != ha::SEED_CLIENT_CN && ha::shoot_index(&cn).is_none() {
            return Err(Refused::NotHaClient { cn });
        }
        let lease = match self.pool.as_mut() {
            Some(pool) => Some(
                pool.acquire(Some(&cn), settings.duplicate_cn)
                    .map_err(|source| Refused::PoolExhausted { source })?
                    .index,
            ),
            None => None,
        };
        let (v6, ifconfig_ipv6) = self.ipv6_for(opts, lease);
        let mut push = settings.push_for(Some(opts));
        if ifconfig_ipv6.is_some() {
            push.push(PushItem::Typed(PushedOption::TunIpv6));
        }
        self.clients.insert(
            id,
            ClientEntry {
                common_name: cn,
                v4: None,
                v6,
                lease,
                conn,
                since: now_unix,
                cipher: String::new(),
                last_ref: now_unix,
                received_seen: 0,
                layer2: true,
            },
        );
        Ok(Admitted {
            settings: ClientSettings {
                push,
                ifconfig_ipv6,
                ifconfig: None,
            },
            // No IP source check at layer 2 (upstream has none in tap mode).
            filter: SourceFilter::new(Vec::new(), Vec::new()),
        })
    }

    /// HA mode's admission: a kube-apiserver connection owns its TCP peer address (the pod
    /// IP; a newer connection from the same address takes it over), a shoot connection its
    /// index (a newer one with the same CN replaces the older). Nothing is assigned: the
    /// push carries no addresses.
    fn admit_ha(
        &mut self,
        settings: &Settings,
        id: ClientId,
        cn: String,
        opts: &ClientOptions,
        conn: ConnHandle,
        now_unix: u64,
    ) -> Result<Admitted, Refused> {
        let Table::Ha(switch, _) = &mut self.table else {
            return Err(Refused::NotHaClient { cn });
        };
        let (v4, v6) = if cn == ha::SEED_CLIENT_CN {
            let addr = conn.peer.ip().to_canonical();
            let transfer = settings.ha.as_ref().and_then(|h| h.transfer_v6);
            let addresses = ha::seed_addresses(addr, transfer);
            switch.seed_connected(id, &addresses);
            if let Some(g) = self.gateway.as_mut() {
                if let Err(collision) = g.kapi_connected(id, addr, addresses, Instant::now()) {
                    tracing::warn!(%collision, "no way to vpn2's shoot pods for this kube-apiserver");
                }
            }
            match addr {
                IpAddr::V4(a) => (Some(a), None),
                IpAddr::V6(a) => (None, Some(a)),
            }
        } else if ha::shoot_index(&cn).is_some() {
            // The switch takes it when its tunnel is up (`established`).
            self.replace_same_cn(id, &cn);
            (None, None)
        } else {
            return Err(Refused::NotHaClient { cn });
        };
        self.clients.insert(
            id,
            ClientEntry {
                common_name: cn,
                v4,
                v6,
                lease: None,
                conn,
                since: now_unix,
                cipher: String::new(),
                last_ref: now_unix,
                received_seen: 0,
                layer2: false,
            },
        );
        Ok(Admitted {
            settings: ClientSettings {
                push: settings.push_for(Some(opts)),
                ifconfig_ipv6: None,
                ifconfig: None,
            },
            // The switch checks sources in HA mode.
            filter: SourceFilter::new(Vec::new(), Vec::new()),
        })
    }

    /// The tunnel of client `id` came up with `cipher` at `now_unix`: the packets held for
    /// destinations it routes go to it now (in HA mode a shoot connection joins the switch,
    /// and every packet held for the shoot is switched again, oldest first), and the
    /// sidecar's held CONNECTs look again.
    pub fn established(&mut self, id: ClientId, cipher: &str, now_unix: u64) {
        let Some(e) = self.clients.get_mut(&id) else {
            return;
        };
        e.cipher = cipher.to_owned();
        e.since = now_unix;
        e.last_ref = now_unix;
        // A layer-2 connection joins no layer-3 switch (its frames teach the MAC table); a
        // layer-2 shoot connection joins the gateway.
        let shoot_index = ha::shoot_index(&e.common_name).filter(|_| !e.layer2);
        if let (Some(g), Some(j)) = (self.gateway.as_mut(), ha::shoot_index(&e.common_name)) {
            if e.layer2 {
                g.shoot_connected(id, j, Instant::now());
            } else {
                g.l3_shoot_connected(id, j);
            }
        }
        // Each released packet with the connection it goes to.
        let released: Vec<(ClientId, BytesMut)> = match &mut self.table {
            Table::Routes(routes) => self
                .hold
                .release(|dst| routes.lookup(dst) == Some(id))
                .into_iter()
                .map(|(_, packet)| (id, packet))
                .collect(),
            Table::Ha(switch, _) => match shoot_index {
                Some(index) => {
                    let now = Instant::now();
                    switch.shoot_connected(id, index, now);
                    self.switch_held_ha(now)
                }
                None => Vec::new(),
            },
            Table::Macs(_) => Vec::new(),
        };
        if !released.is_empty() {
            tracing::info!(
                client = id,
                packets = released.len(),
                "tunnel up: packets held for its routes sent"
            );
        }
        self.send_switched(released);
        self.route_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Sends each packet to its connection (one gone since sends nothing; a full queue drops
    /// it, as a packet from the device would be).
    pub fn send_switched(&self, packets: Vec<(ClientId, BytesMut)>) {
        for (to, packet) in packets {
            if let Some(c) = self.clients.get(&to) {
                let _ = c.conn.tx.try_send(packet);
            }
        }
    }

    /// HA mode: every packet held for the shoot is switched again at `now`, oldest first, as
    /// its kube-apiserver connection's packet (the flows are learned, and a connection gone
    /// since sends nothing); the ones the switch still lets wait ([`ha::Dropped::Settling`])
    /// are held again. Returns each packet to send with its connection.
    pub fn switch_held_ha(&mut self, now: Instant) -> Vec<(ClientId, BytesMut)> {
        let Table::Ha(switch, _) = &mut self.table else {
            return Vec::new();
        };
        let mut waiting = Vec::new();
        let send = self
            .hold
            .release(|_| true)
            .into_iter()
            .filter_map(|(from, packet)| {
                let from = from?;
                let ip = packet.get(SEND_HEADROOM..)?;
                match switch.switch(from, ip, now) {
                    Switched::To(to) => Some((to, packet)),
                    Switched::Dropped(ha::Dropped::Settling) => {
                        waiting.push((from, packet));
                        None
                    }
                    Switched::Dropped(_) => None,
                }
            })
            .collect();
        for (from, packet) in waiting {
            let dst = packet
                .get(SEND_HEADROOM..)
                .and_then(|ip| crate::spoof::addresses(ip).ok())
                .map(|(_, dst)| dst);
            if let Some(dst) = dst {
                // Beyond the hold's limits it is dropped; TCP sends it again.
                let _ = self.hold_ha(from, dst, packet, now);
            }
        }
        send
    }

    /// HA mode: until when packets may wait for shoot connection 0 ([`ha::SETTLE`]); the
    /// held ones are switched again then ([`Registry::switch_held_ha`]).
    pub fn ha_settles_until(&self) -> Option<Instant> {
        match &self.table {
            Table::Ha(switch, _) => switch.settles_until(),
            _ => None,
        }
    }

    /// The clients whose tunnel is up (a data cipher agreed), oldest tunnel first.
    pub fn tunnels(&self) -> Vec<TunnelAddresses> {
        let mut up: Vec<(&ClientId, &ClientEntry)> = self
            .clients
            .iter()
            .filter(|(_, e)| !e.cipher.is_empty())
            .collect();
        up.sort_by_key(|(id, e)| (e.since, **id));
        up.into_iter()
            .map(|(_, e)| TunnelAddresses {
                common_name: e.common_name.clone(),
                v4: e.v4,
                v6: e.v6,
            })
            .collect()
    }

    /// Removes client `id`, freeing its lease and routes.
    pub fn remove(&mut self, id: ClientId) -> Option<ClientEntry> {
        let entry = self.clients.remove(&id)?;
        self.release(entry.lease);
        match &self.table {
            Table::Routes(routes) => {
                let owned: Vec<IpNet> = routes
                    .entries()
                    .filter(|(_, owner)| *owner == id)
                    .map(|(net, _)| net)
                    .collect();
                self.hold.routes_left(owned, Instant::now());
            }
            // A shoot connection left: packets to the shoot are held (while none is up) for
            // the bound from now.
            Table::Ha(switch, _)
                if !entry.layer2 && ha::shoot_index(&entry.common_name).is_some() =>
            {
                self.hold
                    .routes_left(switch.shoot_networks().to_vec(), Instant::now());
            }
            Table::Ha(..) | Table::Macs(_) => {}
        }
        self.table.forget(id);
        if let Some(g) = self.gateway.as_mut() {
            g.kapi_disconnected(id);
            g.shoot_disconnected(id);
            g.l3_shoot_disconnected(id);
        }
        Some(entry)
    }

    /// What the status file shows at `now_unix`, taking the references since the last call:
    /// a client that a packet was routed to since then (in HA mode also one whose connection
    /// received anything, its keepalive pings included) gets `now_unix` as the `Last Ref` of
    /// its rows that follow traffic (`docs/metrics.md`, "Last Ref"). So `Last Ref` has the
    /// resolution of the status interval.
    pub fn status(&mut self, now_unix: u64) -> StatusSnapshot {
        self.take_references(now_unix);
        let mut clients: Vec<(&ClientId, &ClientEntry)> = self.clients.iter().collect();
        clients.sort_by_key(|(id, _)| **id);
        let (routes, shoot_routes) = match &self.table {
            Table::Ha(..) => self.ha_rows(),
            Table::Routes(_) | Table::Macs(_) => (self.ip_rows(), Vec::new()),
        };
        // Tap mode's MAC addresses, and in HA mode those of vpn2's layer-2 connections.
        let macs = match &self.table {
            Table::Macs(macs) | Table::Ha(_, macs) => Some(macs),
            Table::Routes(_) => None,
        };
        let mac_routes = macs
            .into_iter()
            .flat_map(|t| t.entries())
            .filter_map(|(mac, learned)| {
                let c = self.clients.get(&learned.owner)?;
                Some(MacRouteStatus {
                    mac,
                    common_name: c.common_name.clone(),
                    real_address: c.conn.peer,
                    last_ref: learned.since.max(c.last_ref),
                })
            })
            .collect();
        StatusSnapshot {
            title: status::default_title(),
            now: now_unix,
            clients: clients
                .into_iter()
                .map(|(id, c)| ClientStatus {
                    common_name: c.common_name.clone(),
                    real_address: c.conn.peer,
                    virtual_v4: c.v4,
                    virtual_v6: c.v6,
                    bytes_received: c.conn.traffic.received.load(Ordering::Relaxed),
                    bytes_sent: c.conn.traffic.sent.load(Ordering::Relaxed),
                    connected_since: c.since,
                    // No username is ever verified (there is no `auth-user-pass-verify`),
                    // so, as upstream prints then, the column says UNDEF: the text a client
                    // sends as its username is untrusted and never reaches the file.
                    username: None,
                    client_id: *id,
                    peer_id: c.conn.peer_id,
                    cipher: c.cipher.clone(),
                })
                .collect(),
            routes,
            mac_routes,
            shoot_routes,
            max_bcast_queue: 0,
        }
    }

    /// Turns the marks of the packet path (and, in HA mode, moved receive counters) into
    /// `now_unix`.
    fn take_references(&mut self, now_unix: u64) {
        let ha = matches!(self.table, Table::Ha(..));
        for c in self.clients.values_mut() {
            let mut referenced = c.conn.traffic.take_referenced();
            if ha {
                let received = c.conn.traffic.received.load(Ordering::Relaxed);
                referenced |= received != c.received_seen;
                c.received_seen = received;
            }
            if referenced {
                c.last_ref = now_unix;
            }
        }
    }

    /// Routed mode's rows: a client's own addresses follow traffic to them, its iroutes keep
    /// the time they were learned (as upstream's network rows; upstream's cached host rows,
    /// which move, are not listed).
    fn ip_rows(&self) -> Vec<RouteStatus> {
        self.table
            .ip_routes()
            .into_iter()
            .filter_map(|(prefix, id)| {
                let c = self.clients.get(&id)?;
                let own = prefix.prefix_len() == prefix.max_prefix_len()
                    && c.is_own_address(prefix.addr());
                Some(RouteStatus {
                    prefix,
                    common_name: c.common_name.clone(),
                    real_address: c.conn.peer,
                    last_ref: if own { c.last_ref } else { c.since },
                })
            })
            .collect()
    }

    /// HA mode's rows of the layer-3 connections: one per connection, as vpn2's tap server
    /// learns one MAC address per client: a kube-apiserver by the pod IP it connected from, a
    /// shoot connection by its index (`shoot-<j>`). The layer-2 connections' rows are their
    /// learned MAC addresses, as upstream's in tap mode.
    fn ha_rows(&self) -> (Vec<RouteStatus>, Vec<ShootRouteStatus>) {
        let mut seeds = Vec::new();
        let mut shoots = Vec::new();
        for c in self.clients.values().filter(|c| !c.layer2) {
            if let Some(addr) = c.v4.map(IpAddr::V4).or(c.v6.map(IpAddr::V6)) {
                seeds.push(RouteStatus {
                    prefix: IpNet::from(addr),
                    common_name: c.common_name.clone(),
                    real_address: c.conn.peer,
                    last_ref: c.last_ref,
                });
            } else if let Some(index) = ha::shoot_index(&c.common_name) {
                shoots.push(ShootRouteStatus {
                    index,
                    common_name: c.common_name.clone(),
                    real_address: c.conn.peer,
                    last_ref: c.last_ref,
                });
            }
        }
        (seeds, shoots)
    }

    /// Without `duplicate-cn` (in HA mode for a layer-3 shoot connection): removes every
    /// other client with this CN and tells its connection. vpn2's layer-2 connections are
    /// left alone (vpn2's server runs with `duplicate-cn`).
    fn replace_same_cn(&mut self, id: ClientId, cn: &str) {
        let same: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(other, c)| **other != id && c.common_name == cn && !c.layer2)
            .map(|(other, _)| *other)
            .collect();
        for other in same {
            if let Some(old) = self.remove(other) {
                tracing::info!(
                    client = other,
                    cn,
                    "replaced by a new connection with the same CN (no duplicate-cn)"
                );
                old.conn.kicked.cancel();
            }
        }
    }

    /// The client's IPv6 address and what its pushed `ifconfig-ipv6` says (its address with
    /// the prefix length, and the server's): its `ifconfig-ipv6-push`, else (without
    /// `ifconfig-push`, as upstream) the pool's. Nothing is pushed without a server address.
    fn ipv6_for(
        &self,
        opts: &ClientOptions,
        lease: Option<u32>,
    ) -> (Option<Ipv6Addr>, Option<(Ipv6Net, Option<Ipv6Addr>)>) {
        let server_v6 = self.pool.as_ref().and_then(Pool::server_v6);
        match (opts.ifconfig_ipv6_push, opts.ifconfig_push) {
            (Some(p), _) => {
                let remote = p.remote.or(server_v6.map(|n| n.addr()));
                (Some(p.local.addr()), remote.map(|r| (p.local, Some(r))))
            }
            // ifconfig-push without ifconfig-ipv6-push: no pool IPv6 (as upstream).
            (None, Some(_)) => (None, None),
            (None, None) => {
                let v6 = lease.and_then(|i| {
                    let pool = self.pool.as_ref()?;
                    Some((pool.lease(i).v6?, pool.v6_network()?.prefix_len()))
                });
                match (v6, server_v6) {
                    (Some((a, len)), Some(srv)) => {
                        let local = Ipv6Net::new(a, len).ok();
                        (Some(a), local.map(|l| (l, Some(srv.addr()))))
                    }
                    _ => (None, None),
                }
            }
        }
    }

    fn release(&mut self, lease: Option<u32>) {
        if let (Some(pool), Some(l)) = (self.pool.as_mut(), lease) {
            pool.release(l);
        }
    }
}

#[cfg(test)]
mod tests;
