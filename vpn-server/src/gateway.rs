//! The HA server's gateway between our layer-3 kube-apiservers and vpn2's layer-2 shoot pods
//! (direction 2) and between vpn2's layer-2 kube-apiservers and our layer-3 shoot pods
//! (direction 1) (`docs/ha.md` §7, issue 30: the mixed window of an in-place switch), without
//! I/O; time is
//! an argument. The registry keeps one ([`crate::registry::Registry::with_gateway`], fed by
//! admission and the connections' ends); the packet mode hands it a layer-3 kube-apiserver's
//! packet to the shoot while no layer-3 shoot connection is up, and every group frame and
//! unknown unicast from a layer-2 connection, and sends what it returns; the held packets'
//! task calls [`Gateway::tick`].
//!
//! Direction 1, vpn2's kube-apiservers to our layer-3 shoot pods (the registry calls
//! [`Gateway::l3_shoot_connected`]; the packet mode hands it a shoot connection's packet to
//! an address no kube-apiserver connection of ours owns, [`Gateway::from_l3_shoot`]): while
//! our shoot pod `j` is connected the gateway owns
//! `…::b:j` with the MAC address `02:76:70:0b:00:<j>` ([`shoot_identity`], the same on both
//! servers, as vpn2's pod keeps its neighbour entry across a bond failover); it answers
//! solicitations and the path controller's pings for it, swallows the hellos to it and
//! records their pod IP with the sender's bond address, MAC address and connection; a packet
//! inside IPv6 from that bond address to `…::b:j` whose inner source is that pod IP goes to
//! `j`'s connection as it is; `j`'s answers to that pod IP go back inside IPv6 from `…::b:j`
//! (never one that opens something: the shoot opens nothing into the seed).
//!
//! vpn2's kube-apiserver pod reaches shoot pod `j` by an `ip6tnl` from its bond address
//! (`…::a:X` of `VPN_NETWORK`'s /104) to `j`'s (`…::b:j`), IPv4 (next header 4) or IPv6
//! (41) inside IPv6, inside an Ethernet frame between the bonds' MAC addresses; its path
//! controller sends `j` a UDP datagram to port 5400 with the pod IP as text every 2 s, and
//! `j`'s tunnel controller answers by building the tunnel back and a host route to that pod
//! IP through it. The gateway plays that kube-apiserver pod for each of our layer-3
//! kube-apiserver connections:
//!
//! - **Identity** ([`identity`]): a bond address in the /104, bytes 13-15 from a hash of the
//!   pod IP with byte 13 at least `0x0c` (outside vpn2's `…::a:*` and `…::b:*`), and a MAC
//!   address made of it (`02:76:70:` and those bytes): the same on both servers, so `j`'s
//!   neighbour entry stays right when our kube-apiserver's traffic moves to the other server.
//!   Two pod IPs with the same identity: the second gets none ([`Collision`]).
//! - **Neighbour discovery**: the gateway asks for `j`'s MAC address with a neighbour
//!   solicitation (to `j`'s connection), learns it from `j`'s advertisements (solicited or
//!   not: `j`'s bond takes the active tap's MAC on a failover and announces it), and answers
//!   solicitations for its identities.
//! - **Hellos**: once `j`'s MAC address is known, a UDP datagram `[identity]:5400 →
//!   [j]:5400` with the pod IP as text (its 241/8 image on overlapping networks, as vpn2's:
//!   [`Gateway::hello_images`]), at once and every [`HELLO_EVERY`].
//! - **Which `j`**: the lowest index whose MAC address is known, kept while it stays known
//!   and connected (vpn2's path controller keeps a good pod too; its new pick is any good
//!   one, ours the lowest, which both servers agree on). A flow's NAT state is in its shoot
//!   pod, so the pick moves only when the pod is gone.
//! - **Encapsulation**: a packet from the kube-apiserver (from one of its addresses) goes as
//!   `Ethernet(j's MAC ← identity's MAC) / IPv6(identity → …::b:j, next header 4 or 41) /
//!   packet`, without an encapsulation-limit option (vpn2's tunnels ignore it). A TCP SYN's
//!   MSS is clamped to what fits ([`MAX_INNER`]); a packet longer than [`MAX_INNER`] is
//!   refused ([`ToShoot::TooBig`]: the caller answers it).
//! - **Decapsulation**: a frame to an identity's MAC, `IPv6(…::b:j → identity, next header 4
//!   or 41)`, whose inner destination is one of that kube-apiserver's addresses, goes to its
//!   connection as the inner packet.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipnet::Ipv6Net;

use crate::switch::{MacAddr, ETH_HEADER_LEN};
use crate::unreachable::checksum;

/// The tunnel controller's port.
pub const HELLO_PORT: u16 = 5400;
/// How often the path controller says hello to each shoot pod.
pub const HELLO_EVERY: Duration = Duration::from_secs(2);
/// The shoot pods' tap MTU (vpn2's default).
pub const TAP_MTU: usize = 1500;
/// The IPv6 header the encapsulation adds.
pub const ENCAP_HEADER: usize = 40;
/// The longest packet that fits the tunnel: the tap MTU less the IPv6 header.
pub const MAX_INNER: usize = TAP_MTU - ENCAP_HEADER;

const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
const NH_IPV4: u8 = 4;
const NH_IPV6: u8 = 41;
const NH_UDP: u8 = 17;
const NH_ICMPV6: u8 = 58;
const NH_TCP: u8 = 6;
const ND_SOLICIT: u8 = 135;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;
const ND_ADVERT: u8 = 136;
const ND_OPT_SOURCE_LL: u8 = 1;
const ND_OPT_TARGET_LL: u8 = 2;
/// Solicited, override.
const NA_FLAGS: u8 = 0x60;

/// vpn2's bond address with the low 24 bits `low` (bytes 13-15) in `vpn_network`'s /104.
fn bond_address(vpn_network: Ipv6Net, low: u32) -> Ipv6Addr {
    let base = u128::from(vpn_network.network()) & !0xff_ffff_ffff;
    Ipv6Addr::from(base | u128::from(low & 0xff_ffff))
}

/// Shoot pod `j`'s bond address, `…::b:j` (vpn2: from the pod name's index).
pub fn shoot_address(vpn_network: Ipv6Net, j: u8) -> Ipv6Addr {
    bond_address(vpn_network, 0x0b_0000 | u32::from(j))
}

/// The vpn2 identity the gateway gives our layer-3 shoot pod `j` (direction 1, module docs):
/// `…::b:j` and the MAC address `02:76:70:0b:00:<j>`, the same on both servers.
pub fn shoot_identity(vpn_network: Ipv6Net, j: u8) -> Identity {
    Identity {
        addr: shoot_address(vpn_network, j),
        mac: MacAddr([0x02, 0x76, 0x70, 0x0b, 0x00, j]),
    }
}

/// A kube-apiserver's emulated vpn2 identity (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Its bond address.
    pub addr: Ipv6Addr,
    /// Its bond's MAC address.
    pub mac: MacAddr,
}

/// The identity of the kube-apiserver with pod IP `pod_ip` in `vpn_network` (module docs):
/// FNV-1a of the address's bytes, folded into 24 bits, byte 13 lifted to `0x0c..=0xff`.
pub fn identity(vpn_network: Ipv6Net, pod_ip: IpAddr) -> Identity {
    let bytes: Vec<u8> = match pod_ip.to_canonical() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let folded = (h >> 24) ^ (h & 0xff_ffff);
    let hi = 0x0c + ((folded >> 16) % (0x100 - 0x0c));
    let low = (hi << 16) | (folded & 0xffff);
    let addr = bond_address(vpn_network, low);
    let o = addr.octets();
    Identity {
        addr,
        mac: MacAddr([0x02, 0x76, 0x70, o[13], o[14], o[15]]),
    }
}

/// The solicited-node multicast address of `addr` and its MAC address (`33:33:ff:…`).
pub fn solicited_node(addr: Ipv6Addr) -> (Ipv6Addr, MacAddr) {
    let o = addr.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    );
    (group, MacAddr([0x33, 0x33, 0xff, o[13], o[14], o[15]]))
}

/// An Ethernet frame `dst ← src` carrying an IPv6 packet `src_ip → dst_ip` with next header
/// `nh`, hop limit `hops` and `payload`.
fn ipv6_frame(
    dst: MacAddr,
    src: MacAddr,
    (src_ip, dst_ip): (Ipv6Addr, Ipv6Addr),
    nh: u8,
    hops: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HEADER_LEN + 40 + payload.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ETHERTYPE_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[nh, hops]);
    f.extend_from_slice(&src_ip.octets());
    f.extend_from_slice(&dst_ip.octets());
    f.extend_from_slice(payload);
    f
}

/// The checksum of an upper-layer `segment` (its checksum field zero) of protocol `nh`
/// between `src` and `dst` (RFC 8200 8.1).
fn upper_checksum(src: Ipv6Addr, dst: Ipv6Addr, nh: u8, segment: &[u8]) -> u16 {
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&(segment.len() as u32).to_be_bytes());
    pseudo[39] = nh;
    checksum(&[&pseudo, segment])
}

/// An ICMPv6 message `body` (type first, checksum field zero) from `me` to `dst_ip` at
/// `dst`, hop limit 255 (neighbour discovery's).
fn icmpv6_frame(me: &Identity, dst: MacAddr, dst_ip: Ipv6Addr, mut body: Vec<u8>) -> Vec<u8> {
    let sum = upper_checksum(me.addr, dst_ip, NH_ICMPV6, &body);
    body[2..4].copy_from_slice(&sum.to_be_bytes());
    ipv6_frame(dst, me.mac, (me.addr, dst_ip), NH_ICMPV6, 255, &body)
}

/// A neighbour solicitation from `me` for `target` (to its solicited-node group), with
/// `me`'s MAC address as the source link-layer option.
pub fn neighbor_solicitation(me: &Identity, target: Ipv6Addr) -> Vec<u8> {
    let (group, group_mac) = solicited_node(target);
    let mut body = vec![ND_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    body.extend_from_slice(&[ND_OPT_SOURCE_LL, 1]);
    body.extend_from_slice(&me.mac.0);
    icmpv6_frame(me, group_mac, group, body)
}

/// A solicited advertisement of `me` (override set, `me`'s MAC address as the target
/// link-layer option) to the soliciting `to_ip` at `to`.
pub fn neighbor_advertisement(me: &Identity, to: MacAddr, to_ip: Ipv6Addr) -> Vec<u8> {
    let mut body = vec![ND_ADVERT, 0, 0, 0, NA_FLAGS, 0, 0, 0];
    body.extend_from_slice(&me.addr.octets());
    body.extend_from_slice(&[ND_OPT_TARGET_LL, 1]);
    body.extend_from_slice(&me.mac.0);
    icmpv6_frame(me, to, to_ip, body)
}

/// The echo reply of `me` to the echo request `request` (the ICMPv6 message, type first)
/// from `to_ip` at `to`: the same identifier, sequence number and data.
pub fn echo_reply(me: &Identity, to: MacAddr, to_ip: Ipv6Addr, request: &[u8]) -> Vec<u8> {
    let mut body = request.to_vec();
    body[0] = ICMPV6_ECHO_REPLY;
    body[2..4].copy_from_slice(&[0, 0]);
    let sum = upper_checksum(me.addr, to_ip, NH_ICMPV6, &body);
    body[2..4].copy_from_slice(&sum.to_be_bytes());
    ipv6_frame(to, me.mac, (me.addr, to_ip), NH_ICMPV6, 64, &body)
}

/// The path controller's hello from `me` to the shoot pod at `shoot` (`shoot_ip`): UDP to
/// port [`HELLO_PORT`] with `pod_ip` as text.
pub fn hello(me: &Identity, shoot: MacAddr, shoot_ip: Ipv6Addr, pod_ip: IpAddr) -> Vec<u8> {
    let text = pod_ip.to_canonical().to_string();
    let len = 8 + text.len();
    let mut udp = Vec::with_capacity(len);
    udp.extend_from_slice(&HELLO_PORT.to_be_bytes());
    udp.extend_from_slice(&HELLO_PORT.to_be_bytes());
    udp.extend_from_slice(&(len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(text.as_bytes());
    let sum = match upper_checksum(me.addr, shoot_ip, NH_UDP, &udp) {
        0 => 0xffff,
        s => s,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    ipv6_frame(shoot, me.mac, (me.addr, shoot_ip), NH_UDP, 64, &udp)
}

/// `packet` (IPv4 or IPv6) from `me` inside IPv6 to the shoot pod at `shoot` (`shoot_ip`),
/// its TCP SYN's MSS clamped to fit; `None` for a packet that is neither or too long
/// ([`MAX_INNER`]).
pub fn encapsulate(
    me: &Identity,
    shoot: MacAddr,
    shoot_ip: Ipv6Addr,
    packet: &[u8],
) -> Option<Vec<u8>> {
    let nh = match packet.first().map(|b| b >> 4) {
        Some(4) => NH_IPV4,
        Some(6) => NH_IPV6,
        _ => return None,
    };
    if packet.len() > MAX_INNER {
        return None;
    }
    let mut inner = packet.to_vec();
    clamp_mss(&mut inner, MAX_INNER);
    Some(ipv6_frame(
        shoot,
        me.mac,
        (me.addr, shoot_ip),
        nh,
        64,
        &inner,
    ))
}

/// Lowers the MSS option of a TCP SYN in `packet` (IPv4 or IPv6 without extension headers)
/// to what a packet of at most `mtu` bytes carries, fixing the checksum incrementally;
/// whether it changed anything.
pub fn clamp_mss(packet: &mut [u8], mtu: usize) -> bool {
    let (ip_len, proto) = match packet.first().map(|b| b >> 4) {
        Some(4) => (usize::from(packet[0] & 0x0f) * 4, packet.get(9).copied()),
        Some(6) => (40, packet.get(6).copied()),
        _ => return false,
    };
    if proto != Some(NH_TCP) {
        return false;
    }
    let Some(tcp) = packet.get_mut(ip_len..) else {
        return false;
    };
    if tcp.len() < 20 || tcp[13] & 0x02 == 0 {
        return false;
    }
    let max = u16::try_from(mtu.saturating_sub(ip_len + 20)).unwrap_or(u16::MAX);
    let header = (usize::from(tcp[12] >> 4) * 4).min(tcp.len());
    let mut i = 20;
    while i + 1 < header {
        match tcp[i] {
            0 => return false,
            1 => i += 1,
            2 if tcp[i + 1] == 4 && i + 4 <= header => {
                let old = u16::from_be_bytes([tcp[i + 2], tcp[i + 3]]);
                if old <= max {
                    return false;
                }
                tcp[i + 2..i + 4].copy_from_slice(&max.to_be_bytes());
                // RFC 1624: HC' = ~(~HC + ~m + m').
                let hc = u16::from_be_bytes([tcp[16], tcp[17]]);
                let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(max);
                while sum > 0xffff {
                    sum = (sum & 0xffff) + (sum >> 16);
                }
                tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
                return true;
            }
            _ => {
                let len = usize::from(tcp[i + 1]);
                if len < 2 {
                    return false;
                }
                i += len;
            }
        }
    }
    false
}

/// What a frame from a layer-2 connection is to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// A neighbour solicitation for `target` from `from_ip` at `from`.
    Solicitation {
        /// The address asked for.
        target: Ipv6Addr,
        /// The asker's address.
        from_ip: Ipv6Addr,
        /// The asker's MAC address (its source link-layer option, else the frame's source).
        from: MacAddr,
    },
    /// A neighbour advertisement: `target` is at `mac`.
    Advertisement {
        /// The address.
        target: Ipv6Addr,
        /// Its MAC address (the target link-layer option, else the frame's source).
        mac: MacAddr,
    },
    /// An ICMPv6 echo request from `src` at `from` to `dst`; `body` from the type on.
    EchoRequest {
        /// The sender.
        src: Ipv6Addr,
        /// Its MAC address.
        from: MacAddr,
        /// The address pinged.
        dst: Ipv6Addr,
        /// The ICMPv6 message.
        body: &'a [u8],
    },
    /// A UDP datagram from `src` at `from` to `[dst]:`[`HELLO_PORT`]: a path controller's
    /// hello, `payload` its pod IP as text.
    Hello {
        /// The sender.
        src: Ipv6Addr,
        /// Its MAC address.
        from: MacAddr,
        /// The shoot pod's address.
        dst: Ipv6Addr,
        /// The datagram's payload.
        payload: &'a [u8],
    },
    /// IPv4 or IPv6 inside IPv6 from `src` to `dst` (next header 4 or 41).
    Tunnelled {
        /// The outer source.
        src: Ipv6Addr,
        /// The outer destination.
        dst: Ipv6Addr,
        /// The inner packet.
        inner: &'a [u8],
    },
    /// Anything else.
    Other,
}

/// What `frame` is to the gateway (an IPv6 packet without extension headers; the
/// neighbour-discovery options read as RFC 4861 lays them out).
pub fn classify(frame: &[u8]) -> Inbound<'_> {
    let Some((_, eth_src)) = crate::switch::addresses(frame) else {
        return Inbound::Other;
    };
    if frame.get(12..14) != Some(&ETHERTYPE_IPV6[..]) {
        return Inbound::Other;
    }
    let ip = &frame[ETH_HEADER_LEN..];
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Inbound::Other;
    }
    let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let Some(payload) = ip.get(40..40 + len) else {
        return Inbound::Other;
    };
    let addr = |b: &[u8]| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[..16]);
        Ipv6Addr::from(o)
    };
    let (src, dst) = (addr(&ip[8..24]), addr(&ip[24..40]));
    match ip[6] {
        NH_IPV4 | NH_IPV6 => Inbound::Tunnelled {
            src,
            dst,
            inner: payload,
        },
        NH_ICMPV6 if payload.first() == Some(&ICMPV6_ECHO_REQUEST) && payload.len() >= 8 => {
            Inbound::EchoRequest {
                src,
                from: eth_src,
                dst,
                body: payload,
            }
        }
        NH_UDP
            if payload.len() >= 8 && u16::from_be_bytes([payload[2], payload[3]]) == HELLO_PORT =>
        {
            Inbound::Hello {
                src,
                from: eth_src,
                dst,
                payload: &payload[8..],
            }
        }
        NH_ICMPV6 if payload.len() >= 24 && matches!(payload[0], ND_SOLICIT | ND_ADVERT) => {
            let target = addr(&payload[8..24]);
            let wanted = if payload[0] == ND_SOLICIT {
                ND_OPT_SOURCE_LL
            } else {
                ND_OPT_TARGET_LL
            };
            let mac = nd_option_mac(&payload[24..], wanted).unwrap_or(eth_src);
            if payload[0] == ND_SOLICIT {
                Inbound::Solicitation {
                    target,
                    from_ip: src,
                    from: mac,
                }
            } else {
                Inbound::Advertisement { target, mac }
            }
        }
        _ => Inbound::Other,
    }
}

/// The MAC address in the neighbour-discovery option of type `wanted` among `options`.
fn nd_option_mac(mut options: &[u8], wanted: u8) -> Option<MacAddr> {
    while let [kind, len, ..] = *options {
        let bytes = usize::from(len) * 8;
        if bytes == 0 || bytes > options.len() {
            return None;
        }
        if kind == wanted && bytes >= 8 {
            let mut m = [0u8; 6];
            m.copy_from_slice(&options[2..8]);
            return Some(MacAddr(m));
        }
        options = &options[bytes..];
    }
    None
}

/// Two kube-apiservers whose pod IPs hash to the same identity: the second gets none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("vpn2 identity {addr} of {pod_ip} is already {other}'s")]
pub struct Collision {
    /// The identity's address.
    pub addr: Ipv6Addr,
    /// The newcomer's pod IP.
    pub pod_ip: IpAddr,
    /// The holder's pod IP.
    pub other: IpAddr,
}

/// What the gateway sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out<C> {
    /// A frame to a layer-2 connection.
    Frame {
        /// The connection.
        to: C,
        /// The frame.
        frame: Vec<u8>,
    },
    /// A packet to a layer-3 connection.
    Packet {
        /// The connection.
        to: C,
        /// The packet.
        packet: Vec<u8>,
    },
}

/// Why a packet from a kube-apiserver did not go to a shoot pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToShoot {
    /// The connection has no identity, or the source is not one of its addresses.
    Unknown,
    /// No layer-2 shoot pod whose MAC address is known.
    NoShoot,
    /// Longer than [`MAX_INNER`] (or not IP).
    TooBig,
}

#[derive(Debug, Clone)]
struct Kapi<C> {
    conn: C,
    /// What its hellos carry: the pod IP or its 241/8 image.
    pod_ip: IpAddr,
    addresses: Vec<IpAddr>,
    me: Identity,
    /// The shoot pod its packets go to.
    shoot: Option<u8>,
}

/// vpn2's kube-apiserver pod as its path controller's hellos told the gateway.
#[derive(Debug, Clone, Copy)]
struct Vpn2Kapi<C> {
    addr: Ipv6Addr,
    mac: MacAddr,
    conn: C,
}

#[derive(Debug, Clone, Copy)]
struct Shoot<C> {
    conn: C,
    mac: Option<MacAddr>,
}

/// The gateway of one HA server; see the module docs. `C` names a connection.
#[derive(Debug)]
pub struct Gateway<C> {
    vpn_network: Ipv6Net,
    /// Our layer-3 kube-apiservers, by identity address.
    kapis: HashMap<Ipv6Addr, Kapi<C>>,
    /// vpn2's layer-2 shoot connections, by index.
    shoots: BTreeMap<u8, Shoot<C>>,
    /// When the next hellos (and solicitations for unknown shoot pods) are due.
    due: Option<Instant>,
    /// Hellos carry the 241/8 image of an IPv4 pod IP (vpn2 on overlapping networks).
    images: bool,
    /// Direction 1: our layer-3 shoot connections, by index.
    l3_shoots: BTreeMap<u8, C>,
    /// Direction 1: vpn2's kube-apiservers by the pod IP their hellos carry.
    vpn2_kapis: HashMap<IpAddr, Vpn2Kapi<C>>,
}

impl<C: Copy + Eq + Hash> Gateway<C> {
    /// An empty gateway in `vpn_network` (vpn2's `VPN_NETWORK`).
    pub fn new(vpn_network: Ipv6Net) -> Self {
        Gateway {
            vpn_network,
            kapis: HashMap::new(),
            shoots: BTreeMap::new(),
            due: None,
            images: false,
            l3_shoots: BTreeMap::new(),
            vpn2_kapis: HashMap::new(),
        }
    }

    /// With `images`, hellos carry the 241/8 image of an IPv4 pod IP instead of the pod IP,
    /// as vpn2's path controller's do when the seed's pod network overlaps the shoot's.
    #[must_use]
    pub fn hello_images(mut self, images: bool) -> Self {
        self.images = images;
        self
    }

    /// Direction 1: our layer-3 shoot connection `conn` with index `j` is up; the gateway
    /// answers for `…::b:j` towards vpn2's kube-apiservers.
    pub fn l3_shoot_connected(&mut self, conn: C, j: u8) {
        self.l3_shoots.insert(j, conn);
    }

    /// Direction 1: a layer-3 shoot connection is gone.
    pub fn l3_shoot_disconnected(&mut self, conn: C) {
        self.l3_shoots.retain(|_, c| *c != conn);
    }

    /// Direction 1: the layer-3 shoot pod owning `addr` (`…::b:j`), if connected.
    fn l3_shoot_at(&self, addr: Ipv6Addr) -> Option<(u8, C)> {
        self.l3_shoots
            .iter()
            .find(|(&j, _)| shoot_address(self.vpn_network, j) == addr)
            .map(|(&j, &c)| (j, c))
    }

    /// Our kube-apiserver connection `conn` with pod IP `pod_ip` owning `addresses` is up at
    /// `now`: its identity, or the collision.
    pub fn kapi_connected(
        &mut self,
        conn: C,
        pod_ip: IpAddr,
        addresses: Vec<IpAddr>,
        now: Instant,
    ) -> Result<Identity, Collision> {
        let me = identity(self.vpn_network, pod_ip);
        let pod_ip = match pod_ip.to_canonical() {
            IpAddr::V4(v4) if self.images => IpAddr::V4(std::net::Ipv4Addr::from(
                (241 << 24) | (u32::from(v4) & 0xff_ffff),
            )),
            ip => ip,
        };
        if let Some(k) = self.kapis.get(&me.addr) {
            if k.pod_ip != pod_ip {
                return Err(Collision {
                    addr: me.addr,
                    pod_ip,
                    other: k.pod_ip,
                });
            }
        }
        self.kapis.insert(
            me.addr,
            Kapi {
                conn,
                pod_ip,
                addresses,
                me,
                shoot: None,
            },
        );
        self.due = Some(now);
        Ok(me)
    }

    /// A kube-apiserver connection is gone.
    pub fn kapi_disconnected(&mut self, conn: C) {
        self.kapis.retain(|_, k| k.conn != conn);
    }

    /// vpn2's shoot connection `conn` with index `j` is up at `now` (its MAC address not
    /// known yet).
    pub fn shoot_connected(&mut self, conn: C, j: u8, now: Instant) {
        self.shoots.insert(j, Shoot { conn, mac: None });
        self.due = Some(now);
    }

    /// A layer-2 connection is gone: a shoot connection (kube-apiservers on it pick again),
    /// or vpn2's kube-apiserver's (its hellos forgotten).
    pub fn shoot_disconnected(&mut self, conn: C) {
        self.vpn2_kapis.retain(|_, k| k.conn != conn);
        let gone: Vec<u8> = self
            .shoots
            .iter()
            .filter(|(_, s)| s.conn == conn)
            .map(|(j, _)| *j)
            .collect();
        for j in gone {
            self.shoots.remove(&j);
            for k in self.kapis.values_mut() {
                if k.shoot == Some(j) {
                    k.shoot = None;
                }
            }
        }
    }

    /// When [`Gateway::tick`] has something to send.
    pub fn next_tick(&self) -> Option<Instant> {
        self.due
            .filter(|_| !self.kapis.is_empty() && !self.shoots.is_empty())
    }

    /// What is due at `now`: a solicitation to each shoot pod whose MAC address is unknown,
    /// a hello from each kube-apiserver to each one whose address is known; the next due
    /// [`HELLO_EVERY`] later.
    pub fn tick(&mut self, now: Instant) -> Vec<Out<C>> {
        if self.due.is_none_or(|d| now < d) {
            return Vec::new();
        }
        self.due = Some(now + HELLO_EVERY);
        let mut out = Vec::new();
        let asker = self.kapis.values().map(|k| k.me).min_by_key(|m| m.addr);
        for (&j, s) in &self.shoots {
            let shoot_ip = shoot_address(self.vpn_network, j);
            match s.mac {
                Some(mac) => out.extend(self.kapis.values().map(|k| Out::Frame {
                    to: s.conn,
                    frame: hello(&k.me, mac, shoot_ip, k.pod_ip),
                })),
                None => out.extend(asker.map(|me| Out::Frame {
                    to: s.conn,
                    frame: neighbor_solicitation(&me, shoot_ip),
                })),
            }
        }
        out
    }

    /// A frame from layer-2 connection `from` (a group frame's copy included): an answer to a
    /// solicitation for an identity, a shoot pod's MAC address learned (and hellos to it at
    /// once), a tunnelled reply to a kube-apiserver; direction 1: an answer to vpn2's
    /// kube-apiserver's solicitation or ping of one of our shoot pods, its hello recorded,
    /// its tunnelled packet to that shoot pod.
    pub fn from_layer2(&mut self, from: C, frame: &[u8]) -> Vec<Out<C>> {
        match classify(frame) {
            Inbound::Solicitation {
                target,
                from_ip,
                from: mac,
            } => {
                let me = self.kapis.get(&target).map(|k| k.me).or_else(|| {
                    self.l3_shoot_at(target)
                        .map(|(j, _)| shoot_identity(self.vpn_network, j))
                });
                me.map(|me| Out::Frame {
                    to: from,
                    frame: neighbor_advertisement(&me, mac, from_ip),
                })
                .into_iter()
                .collect()
            }
            Inbound::Advertisement { target, mac } => self.learn(from, target, mac),
            Inbound::EchoRequest {
                src,
                from: mac,
                dst,
                body,
            } => self
                .l3_shoot_at(dst)
                .map(|(j, _)| Out::Frame {
                    to: from,
                    frame: echo_reply(&shoot_identity(self.vpn_network, j), mac, src, body),
                })
                .into_iter()
                .collect(),
            Inbound::Hello {
                src,
                from: mac,
                dst,
                payload,
            } => {
                let pod = std::str::from_utf8(payload)
                    .ok()
                    .and_then(|t| t.trim().parse::<IpAddr>().ok());
                if let (Some(pod), Some(_)) = (pod, self.l3_shoot_at(dst)) {
                    self.vpn2_kapis.insert(
                        pod,
                        Vpn2Kapi {
                            addr: src,
                            mac,
                            conn: from,
                        },
                    );
                }
                Vec::new()
            }
            Inbound::Tunnelled { src, dst, inner } => self.tunnelled(from, src, dst, inner),
            Inbound::Other => Vec::new(),
        }
    }

    /// IP inside IPv6 from `src` to `dst` on layer-2 connection `from`: a shoot pod's reply
    /// to one of our kube-apiservers, or (direction 1) vpn2's kube-apiserver's packet to one
    /// of our shoot pods, from the pod IP its hellos carry.
    fn tunnelled(&self, from: C, src: Ipv6Addr, dst: Ipv6Addr, inner: &[u8]) -> Vec<Out<C>> {
        let Ok((inner_src, inner_dst)) = crate::spoof::addresses(inner) else {
            return Vec::new();
        };
        if let Some(k) = self.kapis.get(&dst) {
            let from_shoot = self
                .shoots
                .iter()
                .any(|(&j, s)| s.conn == from && shoot_address(self.vpn_network, j) == src);
            if !from_shoot || !k.addresses.contains(&inner_dst) {
                return Vec::new();
            }
            return vec![Out::Packet {
                to: k.conn,
                packet: inner.to_vec(),
            }];
        }
        let Some((_, shoot)) = self.l3_shoot_at(dst) else {
            return Vec::new();
        };
        let sender = self.vpn2_kapis.get(&inner_src);
        if !sender.is_some_and(|k| k.conn == from && k.addr == src) {
            return Vec::new();
        }
        vec![Out::Packet {
            to: shoot,
            packet: inner.to_vec(),
        }]
    }

    /// Direction 1: a packet from our layer-3 shoot connection `from` to a vpn2
    /// kube-apiserver's pod IP (known from its hellos): inside IPv6 from `…::b:j` to its bond
    /// address, to its connection. `None` when it is no vpn2 kube-apiserver's, when the
    /// packet opens something (the shoot opens nothing into the seed), or does not fit.
    pub fn from_l3_shoot(&self, from: C, packet: &[u8]) -> Option<Out<C>> {
        let (&j, _) = self.l3_shoots.iter().find(|(_, c)| **c == from)?;
        let (_, dst) = crate::spoof::addresses(packet).ok()?;
        let k = self.vpn2_kapis.get(&dst)?;
        if crate::ha::opens_connection(packet) {
            return None;
        }
        let frame = encapsulate(&shoot_identity(self.vpn_network, j), k.mac, k.addr, packet)?;
        Some(Out::Frame { to: k.conn, frame })
    }

    /// Shoot pod `j` (at connection `from`) announced `mac` for `target`: learned if
    /// `target` is `j`'s bond address; hellos to it at once when it was unknown or moved.
    fn learn(&mut self, from: C, target: Ipv6Addr, mac: MacAddr) -> Vec<Out<C>> {
        let vpn_network = self.vpn_network;
        let Some((_, s)) = self
            .shoots
            .iter_mut()
            .find(|(&j, s)| s.conn == from && shoot_address(vpn_network, j) == target)
        else {
            return Vec::new();
        };
        if s.mac == Some(mac) || !mac.is_learnable() {
            return Vec::new();
        }
        s.mac = Some(mac);
        let conn = s.conn;
        self.kapis
            .values()
            .map(|k| Out::Frame {
                to: conn,
                frame: hello(&k.me, mac, target, k.pod_ip),
            })
            .collect()
    }

    /// A packet from our kube-apiserver connection `from` to the shoot: encapsulated to its
    /// shoot pod (the one it has while that one's MAC address stays known, else the lowest
    /// index known), or why not.
    pub fn from_layer3(&mut self, from: C, packet: &[u8]) -> Result<Out<C>, ToShoot> {
        let src = crate::spoof::addresses(packet)
            .map_err(|_| ToShoot::TooBig)?
            .0;
        let Some(k) = self
            .kapis
            .values_mut()
            .find(|k| k.conn == from && k.addresses.contains(&src))
        else {
            return Err(ToShoot::Unknown);
        };
        let known = |j: &u8| self.shoots.get(j).and_then(|s| s.mac).is_some();
        let j = match k.shoot.filter(known) {
            Some(j) => j,
            None => *self
                .shoots
                .keys()
                .find(|j| known(j))
                .ok_or(ToShoot::NoShoot)?,
        };
        k.shoot = Some(j);
        let s = self.shoots[&j];
        let mac = s.mac.ok_or(ToShoot::NoShoot)?;
        let frame = encapsulate(&k.me, mac, shoot_address(self.vpn_network, j), packet)
            .ok_or(ToShoot::TooBig)?;
        Ok(Out::Frame { to: s.conn, frame })
    }
}

#[cfg(test)]
mod tests;
