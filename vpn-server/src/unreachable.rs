//! ICMP "destination unreachable" for packets the tun reader cannot deliver (no connected
//! client routes their destination).
//!
//! Upstream OpenVPN drops such packets silently, so a seed-side `connect()` into a shoot whose
//! tunnel is down hangs until its own timeout (the CONNECT sidecar's is 20 s). We answer
//! instead, as a router with no route would: the reply claims to come from the unreachable
//! destination itself (a source the seed's reverse-path check accepts on the tun device; the
//! server's own address would be dropped as a martian), goes to the packet's source, and
//! carries the start of the packet. A TCP socket in `SYN_SENT` fails at once with
//! `EHOSTUNREACH`; this is how a sidecar running outside the vpn-server process learns fast
//! that no route to the shoot exists.
//!
//! ```text
//!  IPv4 reply: IPv4 header (20, proto 1, ttl 64) | type 3 code 1 | csum | unused (4) |
//!              invoking packet, at most 548 bytes (576 in all)
//!  IPv6 reply: IPv6 header (40, next 58, hop 64) | type 1 code 3 | csum | unused (4) |
//!              invoking packet, at most 1232 bytes (1280 in all)
//! ```
//!
//! Never answered (RFC 1812 4.3.2.7, RFC 4443 2.4): ICMP / ICMPv6 errors, non-first IPv4
//! fragments, multicast and broadcast destinations, unspecified / multicast / loopback
//! sources. Replies are rate-limited by [`Limiter`].

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

/// ICMP type "destination unreachable".
pub const ICMP_DEST_UNREACH: u8 = 3;
/// ICMP code "host unreachable" (Linux: `EHOSTUNREACH`).
pub const ICMP_HOST_UNREACH: u8 = 1;
/// ICMPv6 type "destination unreachable".
pub const ICMPV6_DEST_UNREACH: u8 = 1;
/// ICMPv6 code "address unreachable" (Linux: `EHOSTUNREACH`).
pub const ICMPV6_ADDR_UNREACH: u8 = 3;
/// An IPv4 ICMP error is at most 576 bytes (RFC 1812 4.3.2.3).
pub const IPV4_ERROR_MAX: usize = 576;
/// An ICMPv6 error fits the IPv6 minimum MTU (RFC 4443 2.4 (c)).
pub const IPV6_ERROR_MAX: usize = 1280;

const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
const ICMP_ECHO: u8 = 8;

/// Writes into `out` the unreachable reply to `packet` (an IP packet read from the tun
/// device); returns its length, or `None` when the packet must not be answered.
pub fn reply(packet: &[u8], out: &mut [u8; IPV6_ERROR_MAX]) -> Option<usize> {
    match packet.first()? >> 4 {
        4 => reply_v4(packet, out),
        6 => reply_v6(packet, out),
        _ => None,
    }
}

fn reply_v4(p: &[u8], out: &mut [u8; IPV6_ERROR_MAX]) -> Option<usize> {
    let ihl = usize::from(p.first()? & 0x0f) * 4;
    let h = p.get(..ihl.max(20))?;
    let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
    let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
    let fragment_offset = u16::from_be_bytes([h[6], h[7]]) & 0x1fff;
    if fragment_offset != 0
        || dst.is_multicast()
        || dst.is_broadcast()
        || src.is_unspecified()
        || src.is_multicast()
        || src.is_broadcast()
        || src.is_loopback()
    {
        return None;
    }
    if h[9] == IPPROTO_ICMP && p.get(ihl).is_some_and(|t| *t != ICMP_ECHO) {
        return None;
    }
    let quoted = p.len().min(IPV4_ERROR_MAX - 28);
    let total = 28 + quoted;
    let o = &mut out[..total];
    o[..20].copy_from_slice(&[
        0x45,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        64,
        IPPROTO_ICMP,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    o[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    o[12..16].copy_from_slice(&dst.octets());
    o[16..20].copy_from_slice(&src.octets());
    let sum = checksum(&[&o[..20]]);
    o[10..12].copy_from_slice(&sum.to_be_bytes());
    o[20..28].copy_from_slice(&[ICMP_DEST_UNREACH, ICMP_HOST_UNREACH, 0, 0, 0, 0, 0, 0]);
    o[28..].copy_from_slice(&p[..quoted]);
    let sum = checksum(&[&o[20..]]);
    o[22..24].copy_from_slice(&sum.to_be_bytes());
    Some(total)
}

fn reply_v6(p: &[u8], out: &mut [u8; IPV6_ERROR_MAX]) -> Option<usize> {
    let h = p.get(..40)?;
    let mut a = [0u8; 16];
    a.copy_from_slice(&h[8..24]);
    let src = Ipv6Addr::from(a);
    a.copy_from_slice(&h[24..40]);
    let dst = Ipv6Addr::from(a);
    if dst.is_multicast() || src.is_unspecified() || src.is_multicast() || src.is_loopback() {
        return None;
    }
    // An ICMPv6 error (types below 128) right after the fixed header is never answered.
    if h[6] == IPPROTO_ICMPV6 && p.get(40).is_some_and(|t| *t < 128) {
        return None;
    }
    let quoted = p.len().min(IPV6_ERROR_MAX - 48);
    let icmp_len = 8 + quoted;
    let total = 40 + icmp_len;
    let o = &mut out[..total];
    o[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, IPPROTO_ICMPV6, 64]);
    o[4..6].copy_from_slice(&(icmp_len as u16).to_be_bytes());
    o[8..24].copy_from_slice(&dst.octets());
    o[24..40].copy_from_slice(&src.octets());
    o[40..48].copy_from_slice(&[ICMPV6_DEST_UNREACH, ICMPV6_ADDR_UNREACH, 0, 0, 0, 0, 0, 0]);
    o[48..].copy_from_slice(&p[..quoted]);
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&dst.octets());
    pseudo[16..32].copy_from_slice(&src.octets());
    pseudo[32..36].copy_from_slice(&(icmp_len as u32).to_be_bytes());
    pseudo[39] = IPPROTO_ICMPV6;
    let sum = checksum(&[&pseudo, &o[40..]]);
    o[42..44].copy_from_slice(&sum.to_be_bytes());
    Some(total)
}

/// The Internet checksum (RFC 1071) over the concatenation of `parts` (each but the last of
/// even length).
pub(crate) fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// At most [`Limiter::PER_WINDOW`] replies per [`Limiter::WINDOW`].
#[derive(Debug, Clone)]
pub struct Limiter {
    window_start: Option<Instant>,
    sent: u32,
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

impl Limiter {
    /// The window.
    pub const WINDOW: Duration = Duration::from_millis(100);
    /// Replies allowed per window (1000 per second).
    pub const PER_WINDOW: u32 = 100;

    /// A limiter with a full allowance.
    pub fn new() -> Self {
        Limiter {
            window_start: None,
            sent: 0,
        }
    }

    /// Whether one more reply may go out at `now`.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.window_start {
            Some(start) if now.saturating_duration_since(start) < Self::WINDOW => {}
            _ => {
                self.window_start = Some(now);
                self.sent = 0;
            }
        }
        if self.sent < Self::PER_WINDOW {
            self.sent += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP SYN 192.168.123.1:40000 → 100.96.0.10:8080 (IPv4 header checksum not needed).
    fn syn_v4() -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 192, 168, 123, 1, 100, 96, 0, 10,
        ];
        p.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90, 1, 2, 3, 4, 0, 0, 0, 0, 0x50, 0x02]);
        p.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
        p
    }

    #[test]
    fn v4_reply_comes_from_the_destination_and_quotes_the_packet() {
        let syn = syn_v4();
        let mut out = [0u8; IPV6_ERROR_MAX];
        let n = reply(&syn, &mut out).unwrap();
        let r = &out[..n];
        assert_eq!(n, 28 + syn.len());
        assert_eq!(
            &r[12..16],
            &[100, 96, 0, 10],
            "source: the unreachable host"
        );
        assert_eq!(&r[16..20], &[192, 168, 123, 1], "destination: the sender");
        assert_eq!(r[9], IPPROTO_ICMP);
        assert_eq!((r[20], r[21]), (3, 1));
        assert_eq!(&r[28..], &syn[..]);
        // Both checksums verify (a correct checksum sums to zero).
        assert_eq!(checksum(&[&r[..20]]), 0);
        assert_eq!(checksum(&[&r[20..]]), 0);
    }

    #[test]
    fn v4_known_header_checksum() {
        // Computed independently with Python 3:
        //   w=[0x4500,0x0030,0,0,0x4001,0,0x6460,0x000a,0xc0a8,0x7b01]; s=sum(w)  # 0x22544
        //   folded 0x2546, complement 0xdab9
        let h = [
            0x45, 0, 0, 0x30, 0, 0, 0, 0, 0x40, 1, 0, 0, 100, 96, 0, 10, 192, 168, 123, 1,
        ];
        assert_eq!(checksum(&[&h]), 0xdab9);
    }

    #[test]
    fn v6_reply_checksum_covers_the_pseudo_header() {
        let mut p = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        let src: Ipv6Addr = "fd8f:6d53:b97a:1::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00:10::5".parse().unwrap();
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&[0u8; 20]);
        let mut out = [0u8; IPV6_ERROR_MAX];
        let n = reply(&p, &mut out).unwrap();
        let r = &out[..n];
        assert_eq!(&r[8..24], &dst.octets());
        assert_eq!(&r[24..40], &src.octets());
        assert_eq!((r[40], r[41]), (1, 3));
        let mut pseudo = [0u8; 40];
        pseudo[..16].copy_from_slice(&dst.octets());
        pseudo[16..32].copy_from_slice(&src.octets());
        pseudo[32..36].copy_from_slice(&((n - 40) as u32).to_be_bytes());
        pseudo[39] = 58;
        assert_eq!(checksum(&[&pseudo, &r[40..]]), 0);
    }

    #[test]
    fn errors_fragments_and_multicast_are_not_answered() {
        let mut out = [0u8; IPV6_ERROR_MAX];
        let mut icmp_err = syn_v4();
        icmp_err[9] = IPPROTO_ICMP;
        icmp_err[20] = 3;
        assert_eq!(reply(&icmp_err, &mut out), None);
        icmp_err[20] = ICMP_ECHO;
        assert!(
            reply(&icmp_err, &mut out).is_some(),
            "echo requests are answered"
        );
        let mut frag = syn_v4();
        frag[7] = 1;
        assert_eq!(reply(&frag, &mut out), None);
        let mut mcast = syn_v4();
        mcast[16] = 224;
        assert_eq!(reply(&mcast, &mut out), None);
        assert_eq!(reply(&[0x45, 0, 0], &mut out), None, "truncated");
        let big = [syn_v4(), vec![0u8; 2000]].concat();
        assert_eq!(reply(&big, &mut out), Some(IPV4_ERROR_MAX));
    }

    #[test]
    fn limiter_allows_a_burst_per_window() {
        let mut l = Limiter::new();
        let t = Instant::now();
        assert_eq!((0..150).filter(|_| l.allow(t)).count(), 100);
        assert!(!l.allow(t + Duration::from_millis(50)));
        assert!(l.allow(t + Duration::from_millis(100)));
    }
}
