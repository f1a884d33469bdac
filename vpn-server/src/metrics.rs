//! The OpenVPN server's counters: one method per event, read back by tests and rendered as
//! Prometheus series on the admin endpoint (`netio::admin`).
//!
//! The series, their labels and meaning: `docs/metrics.md`, section "OpenVPN server", the one
//! catalogue (`conformance/tests/metrics_catalogue.rs` checks it against what this renders).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use netio::admin::{AdminState, Exposition, Kind};
use netio::listen::PendingSet;
use netio::tun::TunWriteStats;

use crate::registry::hold::HoldCounts;
use crate::registry::Registry;

/// The server's counters. All monotonic.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    spoofed: AtomicU64,
    malformed: AtomicU64,
    ignored: AtomicU64,
    no_route: AtomicU64,
    wrong_side: AtomicU64,
    unreachable_sent: AtomicU64,
    queue_full: AtomicU64,
    from_tun: AtomicU64,
    client_to_client: AtomicU64,
    refused_max_clients: AtomicU64,
    pool_exhausted: AtomicU64,
    rejected: AtomicU64,
    handshake_timeouts: AtomicU64,
    bad_first_packets: AtomicU64,
    first_packet_timeouts: AtomicU64,
    evicted: AtomicU64,
    connected: AtomicU64,
    control_messages_dropped: AtomicU64,
    peer_info_lines_ignored: AtomicU64,
    /// The tun writer's counts (`to_tun`, `tun_write` drops).
    tun_writes: Arc<TunWriteStats>,
}

fn bump(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl ServerMetrics {
    /// Counters at zero, with the counts of the tun writer the server writes through.
    pub(crate) fn new(tun_writes: Arc<TunWriteStats>) -> ServerMetrics {
        ServerMetrics {
            tun_writes,
            ..ServerMetrics::default()
        }
    }

    // Events.

    /// A packet from a client with a source not its own was dropped; returns the total so far
    /// (for rate-limited logging).
    pub(crate) fn packet_spoofed(&self) -> u64 {
        bump(&self.spoofed)
    }
    /// A packet that was not a readable IP packet was dropped.
    pub(crate) fn packet_malformed(&self) {
        bump(&self.malformed);
    }
    /// A link-local or multicast packet from a client was dropped quietly.
    pub(crate) fn packet_ignored(&self) {
        bump(&self.ignored);
    }
    /// A packet from the tun device had no client route.
    pub(crate) fn packet_no_route(&self) {
        bump(&self.no_route);
    }
    /// HA mode: a packet from a kube-apiserver connection not to the shoot, or from a shoot
    /// connection not to a kube-apiserver, was dropped; returns the total so far.
    pub(crate) fn packet_wrong_side(&self) -> u64 {
        bump(&self.wrong_side)
    }
    /// An ICMP unreachable answer went into the tun device.
    pub(crate) fn unreachable_answered(&self) {
        bump(&self.unreachable_sent);
    }
    /// A connection's queue was full; the packet was dropped.
    pub(crate) fn queue_overflowed(&self) {
        bump(&self.queue_full);
    }
    /// A packet from the tun device was queued to its client.
    pub(crate) fn packet_from_tun(&self) {
        bump(&self.from_tun);
    }
    /// A packet from one client was queued to another.
    pub(crate) fn packet_client_to_client(&self) {
        bump(&self.client_to_client);
    }
    /// A connection was closed at accept (or at authentication) because of `max-clients`;
    /// returns the total so far.
    pub(crate) fn max_clients_reached(&self) -> u64 {
        bump(&self.refused_max_clients)
    }
    /// A client was refused because the pool was exhausted.
    pub(crate) fn refused_pool_exhausted(&self) {
        bump(&self.pool_exhausted);
    }
    /// A client was refused for another reason.
    pub(crate) fn refused_other(&self) {
        bump(&self.rejected);
    }
    /// A connection was closed by the handshake deadline.
    pub(crate) fn handshake_timed_out(&self) {
        bump(&self.handshake_timeouts);
    }
    /// A connection was closed at once for its first frame.
    pub(crate) fn bad_first_packet(&self) {
        bump(&self.bad_first_packets);
    }
    /// A text control message from a client was dropped.
    pub(crate) fn control_message_dropped(&self) {
        bump(&self.control_messages_dropped);
    }
    /// `n` peer-info lines of a client were ignored.
    pub(crate) fn peer_info_ignored(&self, n: usize) {
        self.peer_info_lines_ignored
            .fetch_add(n as u64, Ordering::Relaxed);
    }
    /// A connection was closed by the first-packet deadline.
    pub(crate) fn first_packet_timed_out(&self) {
        bump(&self.first_packet_timeouts);
    }
    /// A pending connection was evicted for a newer one.
    pub(crate) fn pending_evicted(&self) {
        bump(&self.evicted);
    }
    /// A tunnel came up.
    pub(crate) fn tunnel_established(&self) {
        bump(&self.connected);
    }

    // Reads.

    /// Packets from clients dropped because their source was not the client's.
    pub fn spoofed(&self) -> u64 {
        get(&self.spoofed)
    }
    /// Packets from clients that were not readable IP packets.
    pub fn malformed(&self) -> u64 {
        get(&self.malformed)
    }
    /// Link-local / multicast packets from clients, dropped quietly.
    pub fn ignored(&self) -> u64 {
        get(&self.ignored)
    }
    /// Packets from the tun device with no client route.
    pub fn no_route(&self) -> u64 {
        get(&self.no_route)
    }
    /// ICMP / ICMPv6 "destination unreachable" answers sent (rate-limited).
    pub fn unreachable_sent(&self) -> u64 {
        get(&self.unreachable_sent)
    }
    /// Packets dropped because a connection's queue was full.
    pub fn queue_full(&self) -> u64 {
        get(&self.queue_full)
    }
    /// Packets from clients written to the tun device.
    pub fn to_tun(&self) -> u64 {
        self.tun_stats().0
    }
    /// Packets forwarded from one client to another.
    pub fn client_to_client(&self) -> u64 {
        get(&self.client_to_client)
    }
    /// Packets from the tun device sent to clients.
    pub fn from_tun(&self) -> u64 {
        get(&self.from_tun)
    }
    /// Connections refused at accept because of `max-clients`.
    pub fn refused_max_clients(&self) -> u64 {
        get(&self.refused_max_clients)
    }
    /// Clients refused because the pool was exhausted.
    pub fn pool_exhausted(&self) -> u64 {
        get(&self.pool_exhausted)
    }
    /// Clients refused for another reason (disabled, address in use, TLS).
    pub fn rejected(&self) -> u64 {
        get(&self.rejected)
    }
    /// Connections closed by the handshake deadline.
    pub fn handshake_timeouts(&self) -> u64 {
        get(&self.handshake_timeouts)
    }
    /// Connections closed at once for their first frame.
    pub fn bad_first_packets(&self) -> u64 {
        get(&self.bad_first_packets)
    }
    /// Connections closed by the first-packet deadline.
    pub fn first_packet_timeouts(&self) -> u64 {
        get(&self.first_packet_timeouts)
    }
    /// Pending connections evicted for newer ones.
    pub fn evicted(&self) -> u64 {
        get(&self.evicted)
    }
    /// Tunnels established.
    pub fn connected(&self) -> u64 {
        get(&self.connected)
    }

    /// (written, failed) of the tun writer.
    fn tun_stats(&self) -> (u64, u64) {
        (get(&self.tun_writes.written), get(&self.tun_writes.failed))
    }

    /// Writes the series above; `clients` and `pending` are the gauges' values.
    pub fn render(&self, clients: usize, pending: usize, out: &mut Exposition) {
        let (to_tun, tun_failed) = self.tun_stats();
        out.single(
            "vpn_server_clients",
            Kind::Gauge,
            "Clients admitted now.",
            clients,
        )
        .single(
            "vpn_server_connections_pending",
            Kind::Gauge,
            "Connections not yet authenticated.",
            pending,
        )
        .single(
            "vpn_server_tunnels_established_total",
            Kind::Counter,
            "Tunnels that came up.",
            self.connected(),
        );
        let name = "vpn_server_connections_refused_total";
        out.family(
            name,
            Kind::Counter,
            "Connections closed before or at admission, by reason.",
        );
        for (reason, n) in [
            ("max_clients", self.refused_max_clients()),
            ("pool_exhausted", self.pool_exhausted()),
            ("rejected", self.rejected()),
            ("handshake_timeout", self.handshake_timeouts()),
            ("bad_first_packet", self.bad_first_packets()),
            ("first_packet_timeout", self.first_packet_timeouts()),
            ("evicted", self.evicted()),
        ] {
            out.sample(name, &[("reason", reason)], n);
        }
        let name = "vpn_server_packets_dropped_total";
        out.family(name, Kind::Counter, "Packets dropped, by reason.");
        for (reason, n) in [
            ("spoofed", self.spoofed()),
            ("malformed", self.malformed()),
            ("ignored", self.ignored()),
            ("no_route", self.no_route()),
            ("wrong_side", get(&self.wrong_side)),
            ("queue_full", self.queue_full()),
            ("tun_write", tun_failed),
        ] {
            out.sample(name, &[("reason", reason)], n);
        }
        let name = "vpn_server_packets_total";
        out.family(name, Kind::Counter, "Packets carried, by direction.");
        for (direction, n) in [
            ("to_tun", to_tun),
            ("from_tun", self.from_tun()),
            ("client_to_client", self.client_to_client()),
        ] {
            out.sample(name, &[("direction", direction)], n);
        }
        let name = "vpn_server_control_dropped_total";
        out.family(
            name,
            Kind::Counter,
            "Text a client sent on the control channel that was dropped: whole messages \
             (control characters, not UTF-8, no NUL) and peer-info lines.",
        );
        for (kind, c) in [
            ("message", &self.control_messages_dropped),
            ("peer_info_line", &self.peer_info_lines_ignored),
        ] {
            out.sample(name, &[("kind", kind)], get(c));
        }
        out.single(
            "vpn_server_unreachable_sent_total",
            Kind::Counter,
            "ICMP destination-unreachable answers to packets no client routes.",
            self.unreachable_sent(),
        );
    }
}

/// Writes the series of the packets held for reconnecting clients (`registry::hold`; in HA
/// mode packets to the shoot held while no shoot connection is up).
pub fn render_hold(hold: &HoldCounts, out: &mut Exposition) {
    out.single(
        "vpn_server_held_packets",
        Kind::Gauge,
        "Packets held now for a reconnecting client (HA: for a shoot connection).",
        hold.packets,
    )
    .single(
        "vpn_server_held_bytes",
        Kind::Gauge,
        "Bytes of the packets held now.",
        hold.bytes,
    );
    let name = "vpn_server_held_total";
    out.family(
        name,
        Kind::Counter,
        "Packets held for a reconnecting client (HA: for a shoot connection), by what became of them.",
    );
    for (end, n) in [
        ("held", hold.held),
        ("released", hold.released),
        ("expired", hold.expired),
        ("over_limit", hold.over_limit),
    ] {
        out.sample(name, &[("end", end)], n);
    }
}

/// The server as one part of the admin endpoint: its series, and ready while it serves.
#[derive(Debug)]
pub(crate) struct ServerAdmin {
    pub(crate) metrics: Arc<ServerMetrics>,
    pub(crate) registry: Arc<Mutex<Registry>>,
    pub(crate) pending: PendingSet,
    pub(crate) serving: Arc<std::sync::atomic::AtomicBool>,
}

impl AdminState for ServerAdmin {
    fn metrics(&self, out: &mut Exposition) {
        let (clients, hold) = {
            let reg = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            (reg.len(), reg.hold_counts())
        };
        self.metrics.render(clients, self.pending.len(), out);
        render_hold(&hold, out);
    }

    fn ready(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_count_and_render_with_their_labels() {
        let tun = Arc::new(TunWriteStats::default());
        let m = ServerMetrics::new(Arc::clone(&tun));
        assert_eq!(m.packet_spoofed(), 1);
        assert_eq!(m.packet_spoofed(), 2);
        m.max_clients_reached();
        m.bad_first_packet();
        m.bad_first_packet();
        m.pending_evicted();
        m.tunnel_established();
        m.control_message_dropped();
        m.peer_info_ignored(3);
        tun.written.fetch_add(5, Ordering::Relaxed);
        assert_eq!(m.to_tun(), 5);
        let mut out = Exposition::new();
        m.render(3, 7, &mut out);
        let text = out.into_string();
        for line in [
            "vpn_server_clients 3\n",
            "vpn_server_tunnels_established_total 1\n",
            "vpn_server_connections_pending 7\n",
            "vpn_server_connections_refused_total{reason=\"max_clients\"} 1\n",
            "vpn_server_connections_refused_total{reason=\"bad_first_packet\"} 2\n",
            "vpn_server_connections_refused_total{reason=\"first_packet_timeout\"} 0\n",
            "vpn_server_connections_refused_total{reason=\"evicted\"} 1\n",
            "vpn_server_packets_dropped_total{reason=\"spoofed\"} 2\n",
            "vpn_server_packets_total{direction=\"to_tun\"} 5\n",
            "vpn_server_control_dropped_total{kind=\"message\"} 1\n",
            "vpn_server_control_dropped_total{kind=\"peer_info_line\"} 3\n",
            "# TYPE vpn_server_unreachable_sent_total counter\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }
}
