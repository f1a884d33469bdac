//! IPv4 ICMP echo packets for tests that push real IP traffic through a tunnel: a request we
//! build is answered by the peer's kernel, and the reply must carry our id, sequence number
//! and payload back.

use std::net::Ipv4Addr;

const IPV4_HEADER_LEN: usize = 20;
const ICMP_HEADER_LEN: usize = 8;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;
const IPPROTO_ICMP: u8 = 1;

/// An ICMP echo request from `src` to `dst` with `id`, `seq` and `payload`.
pub fn echo_request(src: Ipv4Addr, dst: Ipv4Addr, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let total = IPV4_HEADER_LEN + ICMP_HEADER_LEN + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45; // version 4, 20-byte header
    p[2..4].copy_from_slice(&u16::try_from(total).unwrap_or(u16::MAX).to_be_bytes());
    p[4..6].copy_from_slice(&seq.to_be_bytes()); // identification
    p[8] = 64; // TTL
    p[9] = IPPROTO_ICMP;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let c = checksum(&p[..IPV4_HEADER_LEN]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    let icmp = &mut p[IPV4_HEADER_LEN..];
    icmp[0] = ICMP_ECHO_REQUEST;
    icmp[4..6].copy_from_slice(&id.to_be_bytes());
    icmp[6..8].copy_from_slice(&seq.to_be_bytes());
    icmp[ICMP_HEADER_LEN..].copy_from_slice(payload);
    let c = checksum(icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// Whether `packet` is the echo reply from `from` to `to` for (`id`, `seq`, `payload`), with
/// valid checksums.
pub fn is_echo_reply(
    packet: &[u8],
    from: Ipv4Addr,
    to: Ipv4Addr,
    id: u16,
    seq: u16,
    payload: &[u8],
) -> bool {
    if packet.len() < IPV4_HEADER_LEN + ICMP_HEADER_LEN || packet[0] != 0x45 {
        return false;
    }
    let (ip, icmp) = packet.split_at(IPV4_HEADER_LEN);
    ip[9] == IPPROTO_ICMP
        && checksum(ip) == 0
        && ip[12..16] == from.octets()
        && ip[16..20] == to.octets()
        && usize::from(u16::from_be_bytes([ip[2], ip[3]])) == packet.len()
        && icmp[0] == ICMP_ECHO_REPLY
        && checksum(icmp) == 0
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
        && &icmp[ICMP_HEADER_LEN..] == payload
}

/// The Internet checksum (RFC 1071); 0 over data that includes a correct checksum.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_checksums_verify_and_a_mirrored_reply_is_recognised() {
        let a = Ipv4Addr::new(192, 168, 123, 2);
        let b = Ipv4Addr::new(192, 168, 123, 1);
        let req = echo_request(a, b, 7, 3, b"hello");
        assert_eq!(checksum(&req[..20]), 0);
        assert_eq!(checksum(&req[20..]), 0);
        // What the peer's kernel does: swap addresses, type 0, fix checksums.
        let mut reply = echo_request(b, a, 7, 3, b"hello");
        reply[20] = ICMP_ECHO_REPLY;
        reply[22..24].fill(0);
        let c = checksum(&reply[20..]);
        reply[22..24].copy_from_slice(&c.to_be_bytes());
        assert!(is_echo_reply(&reply, b, a, 7, 3, b"hello"));
        assert!(!is_echo_reply(&reply, b, a, 7, 4, b"hello"));
        assert!(!is_echo_reply(&req, a, b, 7, 3, b"hello"));
    }
}
