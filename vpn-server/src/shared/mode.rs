//! The packet mode: what a client's decrypted payload is and where it goes, and where a packet
//! read from the device goes. Chosen once when the server binds ([`PacketMode::of`]) and kept
//! in [`Shared`]; the connections ([`PacketMode::forward_from_client`]) and the device reader
//! ([`PacketMode::forward_from_device`]) each call one method for every packet.
//!
//! | mode | config | device | from a client | from the device |
//! |---|---|---|---|---|
//! | [`Routed`](PacketMode::Routed) | `dev tun` | tun | IP packet: source check ([`crate::spoof`]), then the tun device or, with `client-to-client`, the client routing its destination | to the client whose address or iroute is the longest prefix of the destination ([`crate::routing`]); held while that client's tunnel is not up yet or its client left less than `hold_timeout` ago ([`crate::registry::hold`]); none (or the bound passed): ICMP unreachable |
//! | [`Switched`](PacketMode::Switched) | `dev tap` | tap | Ethernet frame: its source learned ([`crate::switch`]), then the tap device, another client, or (a group destination, `client-to-client`) every other client and the tap device | to the owner of the destination MAC address, every client (a group destination), or nowhere |
//! | [`Ha`](PacketMode::Ha) | vpn2 HA | none | IP packet: switched between kube-apiserver and shoot connections ([`crate::ha`]), never to a device; from vpn2's layer-2 (tap) connections an Ethernet frame, switched among them only ([`switch_layer2`]), group frames and unknown unicasts also to the gateway ([`crate::gateway`]: neighbour discovery and the replies to our kube-apiservers); a kube-apiserver's packet to the shoot with no layer-3 shoot connection up goes to vpn2's shoot pods through the gateway when one is known, and a shoot connection's packet to a vpn2 kube-apiserver's pod IP (known from its hellos) through the gateway too; to the shoot while no shoot connection is up: held for the first one to come up if one left (or the server started) less than `hold_timeout` ago ([`crate::registry::hold`]); none (or the bound passed): ICMP unreachable back to the kube-apiserver connection ([`expire_ha_held`]) | (there is no device) |
//!
//! The tables these decisions read (the routing table, the MAC table, the HA switch) are the
//! registry's, under its lock: the one the mode chose ([`PacketMode::registry`]). A packet
//! handed to a client marks it referenced (in routed mode only a packet to its own address,
//! as upstream's host-route lookup), which the next status turns into its rows' `Last Ref`
//! ([`crate::registry::Traffic::mark_referenced`]).

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::log_limit::LogLimiter;
use netio::tun::{Tun, TunError, TAP_FRAME_EXTRA};
use protocol::data::DATA_TAILROOM;
use protocol::session::SEND_HEADROOM;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{lock, Shared};
use crate::gateway::{Out, ToShoot};
use crate::ha::Dropped as HaDropped;
use crate::pool::{Pool, PoolError};
use crate::registry::hold::HoldLimits;
use crate::registry::{ClientId, DeviceRoute, Registry};
use crate::settings::Settings;
use crate::spoof::{self, SourceFilter, SpoofVerdict};
use crate::switch::{Dropped, FromClient, FromTap};
use crate::unreachable;

/// How the server carries packets; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PacketMode {
    /// `dev tun`: IP packets, routed by the clients' addresses and iroutes.
    Routed {
        /// `client-to-client`: a packet to another client's address goes straight to it.
        client_to_client: bool,
    },
    /// `dev tap`: Ethernet frames, switched by the MAC addresses learned from each client.
    Switched {
        /// `client-to-client`: frames to other clients go straight to them.
        client_to_client: bool,
    },
    /// vpn2 HA: no device; packets switched in the process between kube-apiserver and shoot
    /// connections.
    Ha,
}

impl PacketMode {
    /// The mode `settings` ask for: HA settings make it [`PacketMode::Ha`], else the device
    /// type decides.
    pub(crate) fn of(settings: &Settings) -> PacketMode {
        let client_to_client = settings.client_to_client;
        if settings.ha.is_some() {
            PacketMode::Ha
        } else if settings.is_tap() {
            PacketMode::Switched { client_to_client }
        } else {
            PacketMode::Routed { client_to_client }
        }
    }

    /// The client address pool (`server`, `server-ipv6`); in HA mode the pool of vpn2's
    /// `server-ipv6` for its layer-2 clients only (our layer-3 clients are assigned nothing).
    pub(crate) fn pool(self, settings: &Settings) -> Result<Option<Pool>, PoolError> {
        if self == PacketMode::Ha {
            let layer2 = settings.ha.as_ref().and_then(|ha| ha.layer2_v6);
            return layer2.map(|v6| Pool::new(None, Some(v6))).transpose();
        }
        match (settings.pool_v4, settings.pool_v6) {
            (None, None) => Ok(None),
            (v4, v6) => Pool::with_range(v4, settings.pool_v4_range, v6).map(Some),
        }
    }

    /// The device `dev` opened as a tun or tap device; none in HA mode.
    pub(crate) fn open_device(self, dev: &str) -> Result<Option<Tun>, TunError> {
        match self {
            PacketMode::Routed { .. } => Tun::open(dev).map(Some),
            PacketMode::Switched { .. } => Tun::open_tap(dev).map(Some),
            PacketMode::Ha => {
                info!("HA mode: no device; packets are switched between kube-apiserver and shoot connections");
                Ok(None)
            }
        }
    }

    /// What the longest packet read from the device has beyond the MTU: a tap device's
    /// Ethernet header (and a VLAN tag).
    pub(crate) fn device_frame_extra(self) -> usize {
        match self {
            PacketMode::Switched { .. } => TAP_FRAME_EXTRA,
            PacketMode::Routed { .. } | PacketMode::Ha => 0,
        }
    }

    /// The empty registry with this mode's table: a routing table, a MAC table (at most
    /// `max-routes-per-client` addresses per client), or the HA switch over the shoot's
    /// networks.
    pub(crate) fn registry(self, settings: &Settings, pool: Option<Pool>) -> Registry {
        match self {
            PacketMode::Routed { .. } => Registry::new(pool)
                .hold_for(settings.hold_timeout, HoldLimits::default())
                .expecting(
                    settings
                        .clients
                        .values()
                        .flat_map(|c| c.iroutes.iter().copied()),
                    std::time::Instant::now(),
                ),
            PacketMode::Switched { .. } => Registry::tap(pool, settings.max_routes_per_client),
            PacketMode::Ha => {
                let shoot_networks = settings
                    .ha
                    .as_ref()
                    .map_or_else(Vec::new, |ha| ha.shoot_networks.clone());
                // After a start a shoot connection is expected: packets to the shoot wait for
                // it as they would had the server kept running.
                let vpn_network = settings.ha.as_ref().and_then(|ha| ha.transfer_v6);
                let overlap = settings.ha.as_ref().is_some_and(|ha| ha.overlap);
                Registry::ha(shoot_networks.clone(), pool, settings.max_routes_per_client)
                    .with_gateway(vpn_network, overlap)
                    .hold_for(settings.hold_timeout, HoldLimits::default())
                    .expecting(shoot_networks, Instant::now())
            }
        }
    }

    /// A decrypted payload from the admitted client `from` (allowed to send from `filter`'s
    /// sources): to the device (`to_tun`, written by the caller), to other clients' queues,
    /// or dropped and counted (and logged as `drops` allows).
    pub(crate) fn forward_from_client(
        self,
        shared: &Shared,
        from: ClientId,
        filter: &SourceFilter,
        drops: &mut LogLimiter,
        payload: BytesMut,
        to_tun: &mut Vec<BytesMut>,
    ) {
        match self {
            PacketMode::Routed { client_to_client } => {
                route_from_client(
                    shared,
                    from,
                    filter,
                    client_to_client,
                    drops,
                    payload,
                    to_tun,
                );
            }
            PacketMode::Switched { client_to_client } => {
                switch_from_client(shared, from, client_to_client, drops, payload, to_tun);
            }
            PacketMode::Ha => switch_ha(shared, from, drops, &payload),
        }
    }

    /// A batch read from the device (each packet after [`SEND_HEADROOM`]), queued to the
    /// clients under one lock of the registry; `unroutable` gets every IP packet no client
    /// routes (to answer it with ICMP unreachable).
    pub(crate) fn forward_from_device(
        self,
        shared: &Shared,
        batch: &mut Vec<BytesMut>,
        unroutable: impl FnMut(&[u8]),
    ) {
        match self {
            PacketMode::Routed { .. } => route_from_device(shared, batch, unroutable),
            PacketMode::Switched { .. } => switch_from_device(shared, batch),
            // HA mode opens no device.
            PacketMode::Ha => batch.clear(),
        }
    }
}

/// Routed: the source check, then the tun device (`to_tun`) or, with `client-to-client`,
/// another client's queue.
fn route_from_client(
    shared: &Shared,
    from: ClientId,
    filter: &SourceFilter,
    client_to_client: bool,
    drops: &mut LogLimiter,
    payload: BytesMut,
    to_tun: &mut Vec<BytesMut>,
) {
    let metrics = &shared.metrics;
    match filter.check(&payload) {
        SpoofVerdict::Accept { dst, .. } => {
            // Without client-to-client every packet goes to the tun device: no lookup.
            if !client_to_client {
                to_tun.push(payload);
                return;
            }
            let target = lock(&shared.registry).forward(from, dst, true).map(|c| {
                if c.is_own_address(dst) {
                    c.conn.traffic.mark_referenced();
                }
                c.conn.tx.clone()
            });
            let Some(tx) = target else {
                to_tun.push(payload);
                return;
            };
            match tx.try_send(laid_out_for_send(&payload)) {
                Ok(()) => metrics.packet_client_to_client(),
                Err(_) => metrics.queue_overflowed(),
            }
        }
        SpoofVerdict::Spoofed { src, dst } => {
            let total = metrics.packet_spoofed();
            if let Some(suppressed) = drops.allow(Instant::now()) {
                warn!(%src, %dst, dropped_total = total, suppressed, "packet with a source address not assigned to the client dropped");
            }
        }
        SpoofVerdict::Ignored => metrics.packet_ignored(),
        SpoofVerdict::Malformed(e) => {
            metrics.packet_malformed();
            debug!(error = %e, "malformed packet from client");
        }
    }
}

/// Switched: a decrypted frame from the client teaches the switch its source address and
/// goes to the tap device (`to_tun`), another client, or (a group destination with
/// `client-to-client`) every other client and the tap device ([`crate::switch`]). No IP
/// source check: upstream has none in tap mode.
fn switch_from_client(
    shared: &Shared,
    from: ClientId,
    client_to_client: bool,
    drops: &mut LogLimiter,
    frame: BytesMut,
    to_tun: &mut Vec<BytesMut>,
) {
    let metrics = &shared.metrics;
    let mut reg = lock(&shared.registry);
    match reg.switch_from_client(from, &frame, client_to_client, unix_now()) {
        Some(FromClient::Tap) | None => to_tun.push(frame),
        Some(FromClient::Client(other)) => {
            other.conn.traffic.mark_referenced();
            match other.conn.tx.try_send(laid_out_for_send(&frame)) {
                Ok(()) => metrics.packet_client_to_client(),
                Err(_) => metrics.queue_overflowed(),
            }
        }
        Some(FromClient::Flood) => {
            for other in reg.flood_targets(Some(from)) {
                match other.conn.tx.try_send(laid_out_for_send(&frame)) {
                    Ok(()) => metrics.packet_client_to_client(),
                    Err(_) => metrics.queue_overflowed(),
                }
            }
            to_tun.push(frame);
        }
        Some(FromClient::Drop(Dropped::Short)) => metrics.packet_malformed(),
        Some(FromClient::Drop(why)) => {
            let total = metrics.packet_spoofed();
            if let Some(suppressed) = drops.allow(Instant::now()) {
                warn!(reason = %why, dropped_total = total, suppressed, "frame from the client dropped");
            }
        }
    }
}

/// HA: a decrypted packet goes to the connection the switch picks ([`crate::ha`]), never to
/// a device; one to the shoot while no shoot connection is up is held (or answered as
/// unroutable: [`hold_for_shoot`]); anything else is dropped and counted by reason.
fn switch_ha(shared: &Shared, from: ClientId, drops: &mut LogLimiter, packet: &[u8]) {
    let metrics = &shared.metrics;
    let now = Instant::now();
    // The registry is held for the decision (and a hold) only, not for the copy and the send.
    let mut reg = lock(&shared.registry);
    if reg.is_layer2(from) {
        return switch_layer2(shared, &mut reg, from, drops, packet);
    }
    let verdict = reg.switch_ha(from, packet, now).map(|to| {
        to.map(|c| {
            c.conn.traffic.mark_referenced();
            c.conn.tx.clone()
        })
    });
    let why = match verdict {
        Some(Ok(tx)) => {
            drop(reg);
            match tx.try_send(laid_out_for_send(packet)) {
                Ok(()) => metrics.packet_client_to_client(),
                Err(_) => metrics.queue_overflowed(),
            }
            return;
        }
        Some(Err(HaDropped::NoShoot)) => {
            // No layer-3 shoot connection: vpn2's shoot pods through the gateway, if any.
            match reg.gateway_mut().map(|g| g.from_layer3(from, packet)) {
                Some(Ok(out)) => send_gateway(shared, &reg, [out]),
                Some(Err(ToShoot::TooBig)) => {
                    metrics.packet_no_route();
                    answer_client(shared, &reg, from, packet);
                }
                Some(Err(ToShoot::Unknown | ToShoot::NoShoot)) | None => {
                    hold_for_shoot(shared, &mut reg, from, packet, now);
                }
            }
            return;
        }
        Some(Err(HaDropped::Settling)) => {
            hold_for_shoot(shared, &mut reg, from, packet, now);
            return;
        }
        Some(Err(HaDropped::NotSeed)) => {
            // From our shoot pod to a vpn2 kube-apiserver's pod IP: through the gateway.
            let out = reg
                .gateway_mut()
                .and_then(|g| g.from_l3_shoot(from, packet));
            if let Some(out) = out {
                send_gateway(shared, &reg, [out]);
                return;
            }
            HaDropped::NotSeed
        }
        Some(Err(why)) => why,
        None => return,
    };
    drop(reg);
    let total = match why {
        HaDropped::Malformed(_) => {
            metrics.packet_malformed();
            return;
        }
        // Held or answered above.
        HaDropped::NoShoot | HaDropped::Settling => return,
        HaDropped::Spoofed => metrics.packet_spoofed(),
        HaDropped::NotShoot | HaDropped::NotSeed => metrics.packet_wrong_side(),
    };
    if let Some(suppressed) = drops.allow(Instant::now()) {
        let addresses = spoof::addresses(packet).ok();
        warn!(
            reason = ?why,
            src = ?addresses.map(|a| a.0),
            dst = ?addresses.map(|a| a.1),
            dropped_total = total,
            suppressed,
            "packet from the client dropped by the HA switch"
        );
    }
}

/// HA: a frame from vpn2's layer-2 connection `from` goes to the layer-2 connection owning its
/// destination MAC address, or (a group destination) to every other layer-2 connection, as
/// vpn2's server switches with `client-to-client`; never to a layer-3 connection. An unknown
/// unicast, which vpn2's server hands its `tap0` (whose kernel drops it), is dropped and
/// counted as no route.
fn switch_layer2(
    shared: &Shared,
    reg: &mut Registry,
    from: ClientId,
    drops: &mut LogLimiter,
    frame: &[u8],
) {
    let metrics = &shared.metrics;
    let send =
        |to: &crate::registry::ClientEntry| match to.conn.tx.try_send(laid_out_for_send(frame)) {
            Ok(()) => metrics.packet_client_to_client(),
            Err(_) => metrics.queue_overflowed(),
        };
    // Group frames and what no layer-2 connection owns go to the gateway too (neighbour
    // discovery, the tunnelled replies to our kube-apiservers).
    let unknown = match reg.switch_layer2(from, frame, unix_now()) {
        Some(FromClient::Client(to)) => {
            to.conn.traffic.mark_referenced();
            send(to);
            return;
        }
        Some(FromClient::Flood) => {
            reg.layer2_flood_targets(from).for_each(send);
            false
        }
        Some(FromClient::Tap) => true,
        Some(FromClient::Drop(Dropped::Short)) | None => {
            metrics.packet_malformed();
            return;
        }
        Some(FromClient::Drop(why)) => {
            let total = metrics.packet_spoofed();
            if let Some(suppressed) = drops.allow(Instant::now()) {
                warn!(reason = %why, dropped_total = total, suppressed, "frame from a layer-2 client dropped");
            }
            return;
        }
    };
    let out = reg
        .gateway_mut()
        .map(|g| g.from_layer2(from, frame))
        .unwrap_or_default();
    if unknown && out.is_empty() {
        metrics.packet_no_route();
    }
    send_gateway(shared, reg, out);
}

/// HA: what the gateway sends ([`crate::gateway`]): frames to layer-2 connections, packets to
/// layer-3 ones (each marking its connection referenced).
fn send_gateway(shared: &Shared, reg: &Registry, out: impl IntoIterator<Item = Out<ClientId>>) {
    for o in out {
        let (to, bytes) = match &o {
            Out::Frame { to, frame } => (*to, frame.as_slice()),
            Out::Packet { to, packet } => (*to, packet.as_slice()),
        };
        let Some(c) = reg.get(to) else {
            continue;
        };
        c.conn.traffic.mark_referenced();
        match c.conn.tx.try_send(laid_out_for_send(bytes)) {
            Ok(()) => shared.metrics.packet_client_to_client(),
            Err(_) => shared.metrics.queue_overflowed(),
        }
    }
}

/// HA: `packet` from kube-apiserver connection `from` to the shoot, with no shoot connection
/// up: held for the first one to come up while one is expected (`Registry::hold_ha`; the
/// first held wakes [`expire_ha_held`]), else (or beyond the hold's limits) counted as no
/// route and answered with ICMP unreachable.
fn hold_for_shoot(
    shared: &Shared,
    reg: &mut Registry,
    from: ClientId,
    packet: &[u8],
    now: Instant,
) {
    let Ok((_, dst)) = spoof::addresses(packet) else {
        return;
    };
    let first = reg.next_hold_expiry().is_none();
    match reg.hold_ha(from, dst, laid_out_for_send(packet), now) {
        Ok(()) if first => shared.held.notify_one(),
        Ok(()) => {}
        Err(_) => {
            shared.metrics.packet_no_route();
            answer_client(shared, reg, from, packet);
        }
    }
}

/// HA: tells kube-apiserver connection `to` that `packet`'s destination is unreachable (ICMP,
/// rate-limited as the device's answers are; [`crate::unreachable`]).
fn answer_client(shared: &Shared, reg: &Registry, to: ClientId, packet: &[u8]) {
    let Some(client) = reg.get(to) else {
        return;
    };
    if !lock(&shared.unreachable).allow(Instant::now()) {
        return;
    }
    let mut icmp = [0u8; unreachable::IPV6_ERROR_MAX];
    if let Some(n) = unreachable::reply(packet, &mut icmp) {
        if client
            .conn
            .tx
            .try_send(laid_out_for_send(&icmp[..n]))
            .is_ok()
        {
            shared.metrics.unreachable_answered();
        }
    }
}

/// HA: answers the packets held for the shoot whose bound passed (ICMP unreachable to the
/// kube-apiserver connection each came from), woken by the first packet held, until
/// `shutdown`.
pub(crate) async fn expire_ha_held(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut next: Option<Instant> = None;
    let mut settled = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = sleep_until_some(next.map(tokio::time::Instant::from_std)) => {}
            () = shared.held.notified() => {}
        }
        let now = Instant::now();
        // Once the settle time (`ha::SETTLE`) is over, what waited for shoot connection 0
        // goes to the shoot connection the switch picks now.
        let settles_until = if settled {
            None
        } else {
            let mut reg = lock(&shared.registry);
            match reg.ha_settles_until() {
                Some(t) if now >= t => {
                    settled = true;
                    let send = reg.switch_held_ha(now);
                    reg.send_switched(send);
                    None
                }
                until => until,
            }
        };
        next = expire_held(&shared, now, |reg, from, payload| {
            if let Some(from) = from {
                answer_client(&shared, reg, from, payload);
            }
        });
        // The gateway's hellos and solicitations (`gateway::HELLO_EVERY`).
        let gateway_next = {
            let mut reg = lock(&shared.registry);
            let out = reg.gateway_mut().map(|g| g.tick(now)).unwrap_or_default();
            send_gateway(&shared, &reg, out);
            reg.gateway_mut().and_then(|g| g.next_tick())
        };
        next = match (next, gateway_next) {
            (Some(n), Some(t)) => Some(n.min(t)),
            (n, t) => n.or(t),
        };
        next = match (next, settles_until) {
            (Some(n), Some(t)) => Some(n.min(t)),
            (n, t) => n.or(t),
        };
    }
}

/// Sleeps until `at`, or forever without one.
pub(crate) async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Routed: each packet read goes to the connection of the client routing its destination;
/// one whose client is reconnecting is held (`registry::hold`); one no client routes (or
/// beyond the hold's limits) is counted and handed to `unroutable`.
fn route_from_device(
    shared: &Shared,
    batch: &mut Vec<BytesMut>,
    mut unroutable: impl FnMut(&[u8]),
) {
    let metrics = &shared.metrics;
    let now = Instant::now();
    let mut reg = lock(&shared.registry);
    for packet in batch.drain(..) {
        let Some(payload) = packet.get(SEND_HEADROOM..) else {
            continue;
        };
        let Ok((_, dst)) = spoof::addresses(payload) else {
            metrics.packet_malformed();
            continue;
        };
        let prefix = match reg.route_from_device(dst, now) {
            DeviceRoute::Client(client) => {
                if client.is_own_address(dst) {
                    client.conn.traffic.mark_referenced();
                }
                match client.conn.tx.try_send(packet) {
                    Ok(()) => metrics.packet_from_tun(),
                    Err(_) => metrics.queue_overflowed(),
                }
                continue;
            }
            DeviceRoute::Hold(prefix) => prefix,
            DeviceRoute::Unroutable => {
                metrics.packet_no_route();
                unroutable(payload);
                continue;
            }
        };
        if let Err(packet) = reg.hold_packet(prefix, dst, packet, now) {
            metrics.packet_no_route();
            if let Some(payload) = packet.get(SEND_HEADROOM..) {
                unroutable(payload);
            }
        }
    }
}

/// The held packets whose bound passed at `now`, each handed to `unroutable` with the
/// connection it came from (none: the device) and counted as no route; when the next one's
/// bound passes.
pub(crate) fn expire_held(
    shared: &Shared,
    now: Instant,
    mut unroutable: impl FnMut(&Registry, Option<ClientId>, &[u8]),
) -> Option<Instant> {
    let mut reg = lock(&shared.registry);
    for (from, packet) in reg.expire_held(now) {
        shared.metrics.packet_no_route();
        if let Some(payload) = packet.get(SEND_HEADROOM..) {
            unroutable(&reg, from, payload);
        }
    }
    reg.next_hold_expiry()
}

/// Switched: each frame read goes to the client owning its destination MAC address, to every
/// client (a group destination), or nowhere (an unknown destination; [`crate::switch`]).
fn switch_from_device(shared: &Shared, batch: &mut Vec<BytesMut>) {
    let metrics = &shared.metrics;
    let reg = lock(&shared.registry);
    for frame in batch.drain(..) {
        let Some(payload) = frame.get(SEND_HEADROOM..) else {
            continue;
        };
        match reg.switch_from_tap(payload) {
            Some(FromTap::Client(client)) => {
                client.conn.traffic.mark_referenced();
                match client.conn.tx.try_send(frame) {
                    Ok(()) => metrics.packet_from_tun(),
                    Err(_) => metrics.queue_overflowed(),
                }
            }
            Some(FromTap::Flood) => {
                for client in reg.flood_targets(None) {
                    // A copy of the frame with its headroom, and room to encrypt in place.
                    let mut copy = BytesMut::with_capacity(frame.len() + DATA_TAILROOM);
                    copy.extend_from_slice(&frame);
                    match client.conn.tx.try_send(copy) {
                        Ok(()) => metrics.packet_from_tun(),
                        Err(_) => metrics.queue_overflowed(),
                    }
                }
            }
            Some(FromTap::Drop(_)) | None => metrics.packet_no_route(),
        }
    }
}

/// A copy of `payload` for another client's queue: headroom before it, room after it to
/// encrypt in place.
fn laid_out_for_send(payload: &[u8]) -> BytesMut {
    let mut packet = BytesMut::with_capacity(SEND_HEADROOM + payload.len() + DATA_TAILROOM);
    packet.resize(SEND_HEADROOM, 0);
    packet.extend_from_slice(payload);
    packet
}
