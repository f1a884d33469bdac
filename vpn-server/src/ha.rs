//! The HA server's packet switch (`docs/ha.md` §3), without I/O: which connection a packet
//! from a kube-apiserver ("seed") connection or a shoot connection goes to, or why it is
//! dropped.
//!
//! - A seed connection owns the addresses the server learned for it when it connected (the
//!   kube-apiserver's pod IP, mapped as the config says). A newer connection claiming an
//!   address takes it over from an older one (a restarted pod), as upstream OpenVPN's address
//!   learning does; the older keeps its other addresses.
//! - A packet from a seed connection must come from one of its addresses and go to a shoot
//!   network. It goes to the shoot connection of its flow if that one is connected, else to
//!   the lowest-index shoot connection (`vpn-shoot-client-0` before `-1`), and the flow
//!   remembers that index. Both servers follow the same rule, so a flow moved from one server
//!   to the other lands on the same shoot pod, whose NAT state it needs.
//! - A restarted server knows no flow. For [`SETTLE`] after its first shoot connection
//!   came up, a TCP segment that is not a SYN, of a flow it does not know (a connection
//!   begun before the restart), waits while shoot connection 0 is not up
//!   ([`Dropped::Settling`]: the caller holds it): by the rule above the connection was on
//!   shoot pod 0 when both were up, and the other pod's NAT would reset it. A packet from a
//!   shoot connection teaches the switch its flow's shoot pod, so a connection the shoot side
//!   speaks on first keeps its pod either way.
//! - A packet from a shoot connection must come from a shoot network and go to an address a
//!   seed connection owns, and must not open anything (a TCP SYN without ACK, an echo
//!   request). Nothing else crosses: never seed to seed, shoot to shoot, or to the server
//!   itself.
//!
//! Flows are keyed by protocol, addresses and ports (the ICMP echo identifier for echo
//! requests and replies, nothing for other protocols). A flow not seen for
//! [`FLOW_IDLE`] is forgotten; at most [`MAX_FLOWS`] are kept, the least recently seen
//! evicted first. A reply refreshes its flow. Time is an argument.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use hashlink::LinkedHashMap;
use ipnet::{IpNet, Ipv6Net};

use crate::spoof::{IpHeaderError, IPV4_HEADER_LEN, IPV6_HEADER_LEN};

/// A flow not seen for this long is forgotten: its next packet picks the preferred shoot
/// connection again. Longer than the OpenVPN keepalive and kubelet/apiserver idle periods,
/// so a live `kubectl logs -f` keeps its shoot pod.
pub const FLOW_IDLE: Duration = Duration::from_secs(15 * 60);
/// Flows remembered at most; the least recently seen is evicted beyond it.
pub const MAX_FLOWS: usize = 65_536;
/// How long after a switch's first shoot connection a segment of a TCP connection it does not
/// know waits for shoot connection 0 (see the module docs). A restarted server's shoot
/// clients reconnect within about a second of each other.
pub const SETTLE: Duration = Duration::from_secs(3);

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;

/// The common name of every kube-apiserver's client (vpn2's HA seed clients share it, hence
/// `duplicate-cn`).
pub const SEED_CLIENT_CN: &str = "vpn-seed-client";

/// The addresses a kube-apiserver connected from `peer` sends from in the tunnel: its pod IP;
/// for an IPv4 one also its image in `241.0.0.0/8` (the low 24 bits kept), which is what
/// vpn2's NETMAP rules make of it when the seed's pod network overlaps the shoot's, and its
/// address in the IPv6 `transfer` network (vpn2's `VPN_NETWORK`, a /96: the pod IP as the
/// low 32 bits), its source towards IPv6 shoot networks.
pub fn seed_addresses(peer: IpAddr, transfer: Option<Ipv6Net>) -> Vec<IpAddr> {
    match peer.to_canonical() {
        IpAddr::V4(v4) => {
            let image = Ipv4Addr::from((241 << 24) | (u32::from(v4) & 0x00ff_ffff));
            let mut out = vec![IpAddr::V4(v4), IpAddr::V4(image)];
            out.extend(
                transfer.map(|t| IpAddr::V6(protocol::config::env::ha_transfer_address(t, v4))),
            );
            out
        }
        v6 => vec![v6],
    }
}

/// The shoot connection index in a shoot client's common name: `vpn-shoot-client-<j>`.
pub fn shoot_index(common_name: &str) -> Option<u8> {
    let digits = common_name.strip_prefix("vpn-shoot-client-")?;
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Why a packet was not switched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Not a readable IP packet.
    Malformed(IpHeaderError),
    /// From a seed connection, with a source that is not one of its addresses; or from a
    /// shoot connection, with a source outside the shoot networks.
    Spoofed,
    /// From a seed connection, to an address outside the shoot networks.
    NotShoot,
    /// From a shoot connection, to an address no seed connection owns.
    NotSeed,
    /// To the shoot, with no shoot connection up.
    NoShoot,
    /// To the shoot, a segment of a TCP connection the switch does not know, in the
    /// [`SETTLE`] time while shoot connection 0 is not up: held as for [`Dropped::NoShoot`].
    Settling,
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switched<C> {
    /// To this connection.
    To(C),
    /// Nowhere: drop and count by reason.
    Dropped(Dropped),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
}

impl FlowKey {
    fn reversed(self) -> FlowKey {
        FlowKey {
            proto: self.proto,
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    shoot: u8,
    seen: Instant,
}

/// The switch of one HA server; see the module docs. `C` names a connection.
#[derive(Debug)]
pub struct HaSwitch<C> {
    shoot_networks: Vec<IpNet>,
    /// Address → the seed connection owning it.
    seed: HashMap<IpAddr, C>,
    /// Shoot index → its connection.
    shoot: BTreeMap<u8, C>,
    /// Least recently seen first.
    flows: LinkedHashMap<FlowKey, Flow>,
    max_flows: usize,
    /// When the first shoot connection came up.
    first_shoot: Option<Instant>,
}

impl<C: Copy + Eq + Hash> HaSwitch<C> {
    /// A switch for the shoot's networks (as the tunnel sees them: mapped where vpn2 maps).
    pub fn new(shoot_networks: Vec<IpNet>) -> Self {
        Self::with_max_flows(shoot_networks, MAX_FLOWS)
    }

    /// As [`HaSwitch::new`], remembering at most `max_flows` flows (at least one).
    pub fn with_max_flows(shoot_networks: Vec<IpNet>, max_flows: usize) -> Self {
        HaSwitch {
            shoot_networks: shoot_networks.into_iter().map(|n| n.trunc()).collect(),
            seed: HashMap::new(),
            shoot: BTreeMap::new(),
            flows: LinkedHashMap::new(),
            max_flows: max_flows.max(1),
            first_shoot: None,
        }
    }

    /// A seed connection is up and owns `addresses` (taken over from any older owner).
    pub fn seed_connected(&mut self, conn: C, addresses: &[IpAddr]) {
        for addr in addresses {
            self.seed.insert(*addr, conn);
        }
    }

    /// A seed connection is gone: the addresses it still owns are freed.
    pub fn seed_disconnected(&mut self, conn: C) {
        self.seed.retain(|_, owner| *owner != conn);
    }

    /// A shoot connection with index `index` is up at `now` (a reconnect replaces the old
    /// one).
    pub fn shoot_connected(&mut self, conn: C, index: u8, now: Instant) {
        self.first_shoot.get_or_insert(now);
        self.shoot.insert(index, conn);
    }

    /// Until when segments of unknown TCP connections wait for shoot connection 0 (while it
    /// is not up): [`SETTLE`] after the first shoot connection; `None` before one came.
    pub fn settles_until(&self) -> Option<Instant> {
        self.first_shoot.map(|t| t + SETTLE)
    }

    /// A shoot connection is gone.
    pub fn shoot_disconnected(&mut self, conn: C) {
        self.shoot.retain(|_, c| *c != conn);
    }

    /// The shoot networks (as the tunnel sees them).
    pub fn shoot_networks(&self) -> &[IpNet] {
        &self.shoot_networks
    }

    /// The connection owning seed address `addr`, if any.
    pub fn seed_owner(&self, addr: IpAddr) -> Option<C> {
        self.seed.get(&addr).copied()
    }

    /// Every address a seed connection owns, with its owner (in no particular order).
    pub fn seed_addresses(&self) -> impl Iterator<Item = (IpAddr, C)> + '_ {
        self.seed.iter().map(|(a, c)| (*a, *c))
    }

    /// The shoot index new flows go to: the lowest connected.
    pub fn preferred_shoot(&self) -> Option<u8> {
        self.shoot.keys().next().copied()
    }

    /// Flows remembered now.
    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Where `packet`, read from connection `from`, goes at `now`.
    pub fn switch(&mut self, from: C, packet: &[u8], now: Instant) -> Switched<C> {
        let key = match flow_key(packet) {
            Ok(key) => key,
            Err(e) => return Switched::Dropped(Dropped::Malformed(e)),
        };
        self.expire(now);
        // A handful of shoot connections; any other connection is a seed connection, which
        // may send only from addresses it owns (one that owns none sends nothing).
        let from_shoot = self
            .shoot
            .iter()
            .find(|(_, c)| **c == from)
            .map(|(i, _)| *i);
        if let Some(index) = from_shoot {
            // The shoot answers; it never opens anything into the seed (a TCP SYN or an echo
            // request is dropped here, before the kube-apiserver pod's own rules would).
            if opens_connection(packet) {
                return Switched::Dropped(Dropped::NotSeed);
            }
            self.switch_from_shoot(index, key, now)
        } else {
            self.switch_from_seed(from, key, packet, now)
        }
    }

    fn switch_from_seed(
        &mut self,
        from: C,
        key: FlowKey,
        packet: &[u8],
        now: Instant,
    ) -> Switched<C> {
        if self.seed.get(&key.src) != Some(&from) {
            return Switched::Dropped(Dropped::Spoofed);
        }
        if !self.in_shoot(key.dst) {
            return Switched::Dropped(Dropped::NotShoot);
        }
        let remembered = self
            .flows
            .get(&key)
            .map(|f| f.shoot)
            .filter(|i| self.shoot.contains_key(i));
        let Some(index) = remembered.or_else(|| self.preferred_shoot()) else {
            return Switched::Dropped(Dropped::NoShoot);
        };
        // A segment of a connection begun before (read only in the settle time).
        let waits = remembered.is_none()
            && index != 0
            && key.proto == PROTO_TCP
            && self.settles_until().is_some_and(|t| now < t)
            && !opens_connection(packet);
        if waits {
            return Switched::Dropped(Dropped::Settling);
        }
        self.flows.remove(&key);
        self.remember(key, index, now);
        Switched::To(self.shoot[&index])
    }

    fn switch_from_shoot(&mut self, index: u8, key: FlowKey, now: Instant) -> Switched<C> {
        if !self.in_shoot(key.src) {
            return Switched::Dropped(Dropped::Spoofed);
        }
        let Some(owner) = self.seed.get(&key.dst).copied() else {
            return Switched::Dropped(Dropped::NotSeed);
        };
        // A known flow keeps its pod (the reply refreshes it); an unknown one learns it.
        let forward = key.reversed();
        let shoot = self.flows.remove(&forward).map_or(index, |f| f.shoot);
        self.remember(forward, shoot, now);
        Switched::To(owner)
    }

    /// Flow `key` (taken out of the table by the caller) goes to shoot connection `index`,
    /// seen `now`: the most recent.
    fn remember(&mut self, key: FlowKey, index: u8, now: Instant) {
        self.flows.insert(
            key,
            Flow {
                shoot: index,
                seen: now,
            },
        );
        while self.flows.len() > self.max_flows {
            self.flows.pop_front();
        }
    }

    fn in_shoot(&self, addr: IpAddr) -> bool {
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
            v4 => v4,
        };
        self.shoot_networks.iter().any(|n| n.contains(&addr))
    }

    fn expire(&mut self, now: Instant) {
        while let Some((_, flow)) = self.flows.front() {
            if now.saturating_duration_since(flow.seen) < FLOW_IDLE {
                break;
            }
            self.flows.pop_front();
        }
    }
}

/// Whether `packet` (a readable IP packet) starts something: a TCP SYN without ACK, or an
/// ICMP / ICMPv6 echo request. Only the first fragment of an IPv4 packet and IPv6 packets
/// whose next header is the transport are read.
pub(crate) fn opens_connection(packet: &[u8]) -> bool {
    let (proto, transport) = match packet.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let first = packet
                .get(6..8)
                .is_some_and(|f| u16::from_be_bytes([f[0], f[1]]) & 0x1fff == 0);
            match (packet.get(9), first) {
                (Some(p), true) => (*p, packet.get(ihl..)),
                _ => return false,
            }
        }
        Some(6) => match packet.get(6) {
            Some(p) => (*p, packet.get(IPV6_HEADER_LEN..)),
            None => return false,
        },
        _ => return false,
    };
    let transport = transport.unwrap_or(&[]);
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    match proto {
        PROTO_TCP => transport.get(13).is_some_and(|f| f & (SYN | ACK) == SYN),
        PROTO_ICMP => transport.first() == Some(&ICMP_ECHO_REQUEST),
        PROTO_ICMPV6 => transport.first() == Some(&ICMPV6_ECHO_REQUEST),
        _ => false,
    }
}

/// The flow of an IP packet. Ports are read only from the first fragment of an IPv4 packet
/// and from an IPv6 packet whose next header is the transport itself; otherwise the flow is
/// the addresses and protocol alone.
fn flow_key(packet: &[u8]) -> Result<FlowKey, IpHeaderError> {
    let (src, dst) = crate::spoof::addresses(packet)?;
    let (proto, transport) = match packet[0] >> 4 {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            if ihl < IPV4_HEADER_LEN {
                return Err(IpHeaderError::Short { len: packet.len() });
            }
            let fragment_offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
            let transport = if fragment_offset == 0 {
                packet.get(ihl..)
            } else {
                None
            };
            (packet[9], transport)
        }
        _ => (packet[6], packet.get(IPV6_HEADER_LEN..)),
    };
    let transport = transport.unwrap_or(&[]);
    let (sport, dport) = match (proto, transport) {
        (PROTO_TCP | PROTO_UDP, [a, b, c, d, ..]) => {
            (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d]))
        }
        // Echo request and reply share the identifier, so a reply is the request's flow
        // reversed.
        (PROTO_ICMP, [ICMP_ECHO_REQUEST | ICMP_ECHO_REPLY, _, _, _, i0, i1, ..])
        | (PROTO_ICMPV6, [ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY, _, _, _, i0, i1, ..]) => {
            let id = u16::from_be_bytes([*i0, *i1]);
            (id, id)
        }
        _ => (0, 0),
    };
    Ok(FlowKey {
        proto,
        src,
        dst,
        sport,
        dport,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_A: u32 = 1;
    const SEED_B: u32 = 2;
    const SHOOT_0: u32 = 10;
    const SHOOT_1: u32 = 11;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An IPv4 TCP or UDP packet header (no checksum: the switch does not read it).
    fn v4(proto: u8, src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (ip(src), ip(dst)) else {
            panic!("v4 addresses")
        };
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, proto, 0, 0];
        p.extend_from_slice(&s.octets());
        p.extend_from_slice(&d.octets());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        p
    }

    fn v6(proto: u8, src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
        let (IpAddr::V6(s), IpAddr::V6(d)) = (ip(src), ip(dst)) else {
            panic!("v6 addresses")
        };
        let mut p = vec![0x60, 0, 0, 0, 0, 8, proto, 64];
        p.extend_from_slice(&s.octets());
        p.extend_from_slice(&d.octets());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        p
    }

    fn switch() -> HaSwitch<u32> {
        let mut s = HaSwitch::new(vec![
            "100.64.0.0/13".parse().unwrap(),
            "fd00:100::/64".parse().unwrap(),
        ]);
        s.seed_connected(SEED_A, &[ip("10.1.0.5"), ip("fd8f:6d53:b97a:1::a01:5")]);
        s.seed_connected(SEED_B, &[ip("10.1.0.6")]);
        s
    }

    #[test]
    fn shoot_index_reads_only_the_exact_name() {
        assert_eq!(shoot_index("vpn-shoot-client-0"), Some(0));
        assert_eq!(shoot_index("vpn-shoot-client-1"), Some(1));
        assert_eq!(shoot_index("vpn-shoot-client-12"), Some(12));
        for cn in [
            "vpn-shoot-client",
            "vpn-shoot-client-",
            "vpn-shoot-client-+1",
            "vpn-shoot-client-1a",
            "vpn-shoot-client-1000",
            "vpn-shoot-client-300",
            "xvpn-shoot-client-1",
            "vpn-seed-client",
        ] {
            assert_eq!(shoot_index(cn), None, "{cn}");
        }
    }

    #[test]
    fn new_flows_go_to_the_lowest_index_shoot_connection() {
        let now = Instant::now();
        let mut s = switch();
        assert_eq!(
            s.switch(
                SEED_A,
                &v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443),
                now
            ),
            Switched::Dropped(Dropped::NoShoot)
        );
        s.shoot_connected(SHOOT_1, 1, now);
        s.shoot_connected(SHOOT_0, 0, now);
        assert_eq!(s.preferred_shoot(), Some(0));
        assert_eq!(
            s.switch(
                SEED_A,
                &v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40001, 443),
                now
            ),
            Switched::To(SHOOT_0)
        );
        assert_eq!(
            s.switch(
                SEED_A,
                &v6(PROTO_UDP, "fd8f:6d53:b97a:1::a01:5", "fd00:100::9", 5, 53),
                now
            ),
            Switched::To(SHOOT_0)
        );
    }

    #[test]
    fn a_flow_sticks_to_its_shoot_connection_while_it_is_connected() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_1, 1, now);
        let syn = tcp_v4("10.1.0.5", "100.64.1.1", 40000, 443, SYN);
        let request = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443);
        assert_eq!(s.switch(SEED_A, &syn, now), Switched::To(SHOOT_1));
        // Shoot pod 0 comes (back): new flows go there, the old flow stays.
        s.shoot_connected(SHOOT_0, 0, now);
        assert_eq!(s.switch(SEED_A, &request, now), Switched::To(SHOOT_1));
        let other = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40002, 443);
        assert_eq!(s.switch(SEED_A, &other, now), Switched::To(SHOOT_0));
        // Pod 1 gone: its flows move to the preferred one.
        s.shoot_disconnected(SHOOT_1);
        assert_eq!(s.switch(SEED_A, &request, now), Switched::To(SHOOT_0));
        // Pod 1 reconnects (a new connection, same index): the flow now stays on 0.
        s.shoot_connected(SHOOT_1 + 100, 1, now);
        assert_eq!(s.switch(SEED_A, &request, now), Switched::To(SHOOT_0));
    }

    #[test]
    fn a_reconnected_shoot_index_keeps_its_flows() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_1, 1, now);
        let request = v4(PROTO_UDP, "10.1.0.5", "100.64.1.1", 1000, 53);
        assert_eq!(s.switch(SEED_A, &request, now), Switched::To(SHOOT_1));
        s.shoot_connected(SHOOT_0, 0, now);
        // The same pod's client reconnects: its NAT state is still in the pod.
        s.shoot_connected(77, 1, now);
        assert_eq!(s.switch(SEED_A, &request, now), Switched::To(77));
    }

    #[test]
    fn replies_go_to_the_seed_connection_owning_the_destination() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_0, 0, now);
        s.shoot_connected(SHOOT_1, 1, now);
        let reply = v4(PROTO_TCP, "100.64.1.1", "10.1.0.6", 443, 40000);
        assert_eq!(s.switch(SHOOT_1, &reply, now), Switched::To(SEED_B));
        let reply6 = v6(PROTO_TCP, "fd00:100::9", "fd8f:6d53:b97a:1::a01:5", 443, 1);
        assert_eq!(s.switch(SHOOT_0, &reply6, now), Switched::To(SEED_A));
    }

    /// A TCP segment with `flags` (the full 20-byte header).
    fn tcp_v4(src: &str, dst: &str, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let mut p = v4(PROTO_TCP, src, dst, sport, dport);
        p.truncate(IPV4_HEADER_LEN + 4);
        p.extend_from_slice(&[0; 16]);
        p[IPV4_HEADER_LEN + 12] = 0x50;
        p[IPV4_HEADER_LEN + 13] = flags;
        p
    }

    const SYN: u8 = 0x02;

    #[test]
    fn a_restarted_server_keeps_connections_begun_before_on_shoot_pod_0() {
        let start = Instant::now();
        let mut s = switch();
        // Shoot pod 1's client is back first.
        s.shoot_connected(SHOOT_1, 1, start);
        let t = start + Duration::from_secs(1);
        let old = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443);
        assert_eq!(
            s.switch(SEED_A, &old, t),
            Switched::Dropped(Dropped::Settling)
        );
        // What starts now, and what is not TCP, goes on.
        let syn = tcp_v4("10.1.0.5", "100.64.1.1", 40001, 443, SYN);
        assert_eq!(s.switch(SEED_A, &syn, t), Switched::To(SHOOT_1));
        let udp = v4(PROTO_UDP, "10.1.0.5", "100.64.1.1", 40002, 53);
        assert_eq!(s.switch(SEED_A, &udp, t), Switched::To(SHOOT_1));
        // Pod 0 is back: the old connection goes there, the new one stays on 1.
        s.shoot_connected(SHOOT_0, 0, t);
        assert_eq!(s.switch(SEED_A, &old, t), Switched::To(SHOOT_0));
        let next = tcp_v4("10.1.0.5", "100.64.1.1", 40001, 443, 0x10);
        assert_eq!(s.switch(SEED_A, &next, t), Switched::To(SHOOT_1));

        // Without pod 0, the wait ends with the settle time.
        let mut s = switch();
        s.shoot_connected(SHOOT_1, 1, start);
        let just_before = start + SETTLE - Duration::from_millis(1);
        assert_eq!(
            s.switch(SEED_A, &old, just_before),
            Switched::Dropped(Dropped::Settling)
        );
        assert_eq!(
            s.switch(SEED_A, &old, start + SETTLE),
            Switched::To(SHOOT_1)
        );
        // And it never starts again: a later unknown connection goes to the lowest up.
        s.shoot_disconnected(SHOOT_1);
        s.shoot_connected(SHOOT_1 + 100, 1, start + SETTLE * 10);
        let other = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40009, 443);
        assert_eq!(
            s.switch(SEED_A, &other, start + SETTLE * 10),
            Switched::To(SHOOT_1 + 100)
        );
    }

    #[test]
    fn a_shoot_packet_teaches_an_unknown_connection_its_pod() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_0, 0, now);
        s.shoot_connected(SHOOT_1, 1, now);
        // A restarted server hears first from pod 1 about a connection begun before.
        let from_shoot = v4(PROTO_TCP, "100.64.1.1", "10.1.0.5", 443, 40000);
        assert_eq!(s.switch(SHOOT_1, &from_shoot, now), Switched::To(SEED_A));
        let to_shoot = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443);
        assert_eq!(s.switch(SEED_A, &to_shoot, now), Switched::To(SHOOT_1));
        // A known connection keeps its pod whoever sends.
        let syn = tcp_v4("10.1.0.5", "100.64.1.1", 40001, 443, SYN);
        assert_eq!(s.switch(SEED_A, &syn, now), Switched::To(SHOOT_0));
        let stray = tcp_v4("100.64.1.1", "10.1.0.5", 443, 40001, 0x12);
        assert_eq!(s.switch(SHOOT_1, &stray, now), Switched::To(SEED_A));
        let next = tcp_v4("10.1.0.5", "100.64.1.1", 40001, 443, 0x10);
        assert_eq!(s.switch(SEED_A, &next, now), Switched::To(SHOOT_0));
    }

    #[test]
    fn the_shoot_opens_nothing_into_the_seed() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_0, 0, now);
        // A SYN from a shoot address to a kube-apiserver's address: dropped; the SYN-ACK and
        // the rest of a connection the seed opened pass.
        let syn = tcp_v4("100.64.1.1", "10.1.0.5", 40000, 10250, 0x02);
        assert_eq!(
            s.switch(SHOOT_0, &syn, now),
            Switched::Dropped(Dropped::NotSeed)
        );
        let syn_ack = tcp_v4("100.64.1.1", "10.1.0.5", 443, 40000, 0x12);
        assert_eq!(s.switch(SHOOT_0, &syn_ack, now), Switched::To(SEED_A));
        let ack = tcp_v4("100.64.1.1", "10.1.0.5", 443, 40000, 0x10);
        assert_eq!(s.switch(SHOOT_0, &ack, now), Switched::To(SEED_A));
        // The seed's own SYN goes to the shoot.
        let out = tcp_v4("10.1.0.5", "100.64.1.1", 40001, 443, 0x02);
        assert_eq!(s.switch(SEED_A, &out, now), Switched::To(SHOOT_0));
        // Pings: requests from the shoot dropped, replies pass.
        let mut echo = v4(PROTO_ICMP, "100.64.1.1", "10.1.0.5", 0, 0);
        echo[IPV4_HEADER_LEN] = ICMP_ECHO_REQUEST;
        assert_eq!(
            s.switch(SHOOT_0, &echo, now),
            Switched::Dropped(Dropped::NotSeed)
        );
        echo[IPV4_HEADER_LEN] = ICMP_ECHO_REPLY;
        assert_eq!(s.switch(SHOOT_0, &echo, now), Switched::To(SEED_A));
        let mut echo6 = v6(PROTO_ICMPV6, "fd00:100::9", "fd8f:6d53:b97a:1::a01:5", 0, 0);
        echo6[IPV6_HEADER_LEN] = ICMPV6_ECHO_REQUEST;
        assert_eq!(
            s.switch(SHOOT_0, &echo6, now),
            Switched::Dropped(Dropped::NotSeed)
        );
    }

    #[test]
    fn seed_addresses_are_the_pod_ip_and_its_241_image() {
        let transfer = "fd8f:6d53:b97a:1::/96".parse().ok();
        assert_eq!(
            seed_addresses(ip("::ffff:10.1.2.3"), transfer),
            [
                ip("10.1.2.3"),
                ip("241.1.2.3"),
                ip("fd8f:6d53:b97a:1::a01:203")
            ]
        );
        assert_eq!(
            seed_addresses(ip("10.1.2.3"), None),
            [ip("10.1.2.3"), ip("241.1.2.3")]
        );
        assert_eq!(seed_addresses(ip("fd00::5"), transfer), [ip("fd00::5")]);
    }

    #[test]
    fn nothing_crosses_but_seed_to_shoot_and_back() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_0, 0, now);
        // Seed to seed, seed to the server's or seed's other networks.
        for dst in ["10.1.0.6", "10.1.0.1", "192.168.123.1", "100.72.0.1"] {
            assert_eq!(
                s.switch(SEED_A, &v4(PROTO_TCP, "10.1.0.5", dst, 1, 2), now),
                Switched::Dropped(Dropped::NotShoot),
                "{dst}"
            );
        }
        // A seed connection using another's address, or an address of none.
        for src in ["10.1.0.6", "10.1.0.7", "100.64.0.1"] {
            assert_eq!(
                s.switch(SEED_A, &v4(PROTO_TCP, src, "100.64.1.1", 1, 2), now),
                Switched::Dropped(Dropped::Spoofed),
                "{src}"
            );
        }
        // Shoot into the seed anywhere but a seed connection's address, or shoot to shoot.
        for dst in ["10.1.0.1", "10.1.0.7", "100.64.1.2", "192.168.123.1"] {
            assert_eq!(
                s.switch(SHOOT_0, &v4(PROTO_TCP, "100.64.1.1", dst, 1, 2), now),
                Switched::Dropped(Dropped::NotSeed),
                "{dst}"
            );
        }
        // A shoot connection with a source outside the shoot networks.
        assert_eq!(
            s.switch(SHOOT_0, &v4(PROTO_TCP, "10.9.9.9", "10.1.0.5", 1, 2), now),
            Switched::Dropped(Dropped::Spoofed)
        );
        // From a connection that owns no address.
        assert_eq!(
            s.switch(99, &v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 1, 2), now),
            Switched::Dropped(Dropped::Spoofed)
        );
        assert!(matches!(
            s.switch(SEED_A, &[0x45, 0, 0], now),
            Switched::Dropped(Dropped::Malformed(_))
        ));
        assert!(matches!(
            s.switch(SEED_A, &[0x20; 40], now),
            Switched::Dropped(Dropped::Malformed(_))
        ));
    }

    #[test]
    fn a_newer_seed_connection_takes_an_address_over() {
        let now = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_0, 0, now);
        // The pod restarts with the same IP; its old connection is not gone yet.
        s.seed_connected(SEED_A + 100, &[ip("10.1.0.5")]);
        assert_eq!(s.seed_owner(ip("10.1.0.5")), Some(SEED_A + 100));
        let reply = v4(PROTO_TCP, "100.64.1.1", "10.1.0.5", 443, 1);
        assert_eq!(s.switch(SHOOT_0, &reply, now), Switched::To(SEED_A + 100));
        // The old one ending frees only what it still owns.
        s.seed_disconnected(SEED_A);
        assert_eq!(s.seed_owner(ip("10.1.0.5")), Some(SEED_A + 100));
        assert_eq!(s.seed_owner(ip("fd8f:6d53:b97a:1::a01:5")), None);
        // The old connection may no longer send as that address.
        assert_eq!(
            s.switch(SEED_A, &v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 1, 2), now),
            Switched::Dropped(Dropped::Spoofed)
        );
    }

    #[test]
    fn idle_flows_are_forgotten_and_replies_keep_them() {
        let start = Instant::now();
        let mut s = switch();
        s.shoot_connected(SHOOT_1, 1, start);
        let syn = tcp_v4("10.1.0.5", "100.64.1.1", 40000, 443, SYN);
        let request = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443);
        let reply = v4(PROTO_TCP, "100.64.1.1", "10.1.0.5", 443, 40000);
        assert_eq!(s.switch(SEED_A, &syn, start), Switched::To(SHOOT_1));
        s.shoot_connected(SHOOT_0, 0, start);
        // Only replies for most of an idle period: the flow stays.
        let later = start + FLOW_IDLE - Duration::from_secs(1);
        assert_eq!(s.switch(SHOOT_1, &reply, later), Switched::To(SEED_A));
        let later = later + FLOW_IDLE - Duration::from_secs(1);
        assert_eq!(s.switch(SEED_A, &request, later), Switched::To(SHOOT_1));
        // Silent for a whole idle period: forgotten, so it goes to the preferred one.
        let much_later = later + FLOW_IDLE;
        assert_eq!(
            s.switch(SEED_A, &request, much_later),
            Switched::To(SHOOT_0)
        );
        assert_eq!(s.flow_count(), 1);
    }

    #[test]
    fn flows_beyond_the_bound_evict_the_least_recently_seen() {
        let now = Instant::now();
        let mut s = HaSwitch::with_max_flows(vec!["100.64.0.0/13".parse().unwrap()], 2);
        s.seed_connected(SEED_A, &[ip("10.1.0.5")]);
        s.shoot_connected(SHOOT_1, 1, now);
        let a = v4(PROTO_UDP, "10.1.0.5", "100.64.1.1", 1, 443);
        let b = v4(PROTO_UDP, "10.1.0.5", "100.64.1.1", 2, 443);
        let c = v4(PROTO_UDP, "10.1.0.5", "100.64.1.1", 3, 443);
        s.switch(SEED_A, &a, now);
        s.switch(SEED_A, &b, now);
        s.switch(SEED_A, &a, now); // a is now the most recent
        s.shoot_connected(SHOOT_0, 0, now);
        s.switch(SEED_A, &c, now); // evicts b
        assert_eq!(s.flow_count(), 2);
        assert_eq!(s.switch(SEED_A, &a, now), Switched::To(SHOOT_1));
        assert_eq!(s.switch(SEED_A, &b, now), Switched::To(SHOOT_0));
    }

    #[test]
    fn flow_keys_read_ports_echo_ids_and_nothing_from_later_fragments() {
        let tcp = v4(PROTO_TCP, "10.1.0.5", "100.64.1.1", 40000, 443);
        let key = flow_key(&tcp).unwrap();
        assert_eq!((key.proto, key.sport, key.dport), (PROTO_TCP, 40000, 443));
        // A later fragment carries no ports.
        let mut frag = tcp.clone();
        frag[7] = 1;
        assert_eq!(flow_key(&frag).unwrap().sport, 0);
        // IPv4 options move the transport header.
        let mut opts = tcp[..20].to_vec();
        opts[0] = 0x46;
        opts.extend_from_slice(&[1, 1, 1, 1]);
        opts.extend_from_slice(&tcp[20..]);
        assert_eq!(flow_key(&opts).unwrap().dport, 443);
        // An IHL below 5 is malformed.
        let mut bad = tcp.clone();
        bad[0] = 0x44;
        assert!(flow_key(&bad).is_err());
        // ICMP echo: the identifier on both sides, request and reply the same flow.
        let mut echo = v4(PROTO_ICMP, "10.1.0.5", "100.64.1.1", 0, 0);
        echo[20..28].copy_from_slice(&[ICMP_ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 1]);
        let mut reply = v4(PROTO_ICMP, "100.64.1.1", "10.1.0.5", 0, 0);
        reply[20..28].copy_from_slice(&[ICMP_ECHO_REPLY, 0, 0, 0, 0x12, 0x34, 0, 1]);
        assert_eq!(
            flow_key(&echo).unwrap().reversed(),
            flow_key(&reply).unwrap()
        );
        assert_eq!(flow_key(&echo).unwrap().sport, 0x1234);
        // A truncated transport header: addresses and protocol only.
        assert_eq!(flow_key(&tcp[..22]).unwrap().sport, 0);
    }
}
