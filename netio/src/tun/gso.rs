//! What one read from an offloading tun device becomes before it can be encrypted: the
//! packets the peer expects, each at most the MTU, with complete checksums.
//!
//! With `TUN_F_TSO4 | TUN_F_TSO6` the kernel hands over a TCP flow's data as one super-packet
//! of up to 64 KiB: one IP and TCP header, then the payload of many segments, and a
//! [`VnetHdr`] saying how big each segment's payload is (`gso_size`). [`Segments`] cuts it
//! into the segments the kernel would have sent: the headers copied in front of each payload,
//! then per segment the IP length, the IPv4 id (one more per segment) and header checksum,
//! the TCP sequence number, FIN and PSH only on the last segment, CWR only on the first, and
//! the TCP checksum over the segment.
//!
//! With `TUN_F_CSUM` a plain packet may come with its transport checksum left to us (the
//! kernel stored only the pseudo-header part): [`complete_checksum`] finishes it.

use bytes::BytesMut;

use super::checksum::{self, Sum};
use super::vnet::{
    VnetHdr, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// Why a read from the device was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// The read was shorter than the virtio header.
    #[error("read of {len} bytes is shorter than the virtio header")]
    Short {
        /// Bytes read.
        len: usize,
    },
    /// A GSO type we did not ask for (UDP, ECN).
    #[error("GSO type {gso_type:#04x} not offered")]
    GsoType {
        /// The header's `gso_type`.
        gso_type: u8,
    },
    /// The IP version does not match the GSO type.
    #[error("IP version {version} in a super-packet of GSO type {gso_type}")]
    Version {
        /// The packet's version nibble.
        version: u8,
        /// The header's `gso_type`.
        gso_type: u8,
    },
    /// `gso_size` is zero.
    #[error("super-packet with gso_size 0")]
    ZeroGsoSize,
    /// The TCP header of a super-packet is not where the virtio header says, or malformed.
    #[error("super-packet without a valid TCP header at byte {csum_start}")]
    TcpHeader {
        /// The header's `csum_start`.
        csum_start: u16,
    },
    /// The checksum to complete lies outside the packet.
    #[error("checksum field at {start}+{offset} outside a packet of {len} bytes")]
    ChecksumPosition {
        /// `csum_start`.
        start: u16,
        /// `csum_offset`.
        offset: u16,
        /// Packet length.
        len: usize,
    },
    /// A plain packet longer than the device MTU the caller reads for.
    #[error("packet of {len} bytes longer than the MTU ({max})")]
    TooLong {
        /// Packet length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Byte 13 of the TCP header: its flags.
pub(crate) const TCP_FLAGS: usize = 13;
/// TCP flag FIN.
pub(crate) const TCP_FIN: u8 = 0x01;
/// TCP flag PSH.
pub(crate) const TCP_PSH: u8 = 0x08;
/// TCP flag ACK.
pub(crate) const TCP_ACK: u8 = 0x10;
/// TCP flag CWR.
pub(crate) const TCP_CWR: u8 = 0x80;
/// Offset of the checksum in the TCP header.
pub(crate) const TCP_CSUM: usize = 16;
/// IP protocol number of TCP.
pub(crate) const IPPROTO_TCP: u8 = 6;

/// A TCP super-packet and how it divides into segments. Build it with [`Segments::new`], then
/// [`Segments::append`] each segment where it should go.
#[derive(Debug)]
pub struct Segments<'a> {
    packet: &'a [u8],
    /// IP header length (the TCP header starts here).
    iph_len: usize,
    /// IP and TCP header length.
    hdr_len: usize,
    gso_size: usize,
    count: usize,
    v6: bool,
    first_seq: u32,
    first_id: u16,
    /// Addresses and protocol of the pseudo header (the length is added per segment).
    pseudo: Sum,
}

impl<'a> Segments<'a> {
    /// Checks `packet` (what followed the virtio header) against `hdr`, which must have a TCP
    /// GSO type.
    ///
    /// The kernel's `hdr_len` is not trusted (on the forwarding path it can cover the whole
    /// first segment): the headers end where the TCP header at `csum_start` says.
    pub fn new(hdr: &VnetHdr, packet: &'a [u8]) -> Result<Segments<'a>, OffloadError> {
        let gso_type = hdr.gso_type;
        let version = packet.first().map_or(0, |b| b >> 4);
        let v6 = match gso_type {
            VIRTIO_NET_HDR_GSO_TCPV4 => false,
            VIRTIO_NET_HDR_GSO_TCPV6 => true,
            _ if gso_type & VIRTIO_NET_HDR_GSO_ECN != 0 => {
                return Err(OffloadError::GsoType { gso_type })
            }
            _ => return Err(OffloadError::GsoType { gso_type }),
        };
        if version != if v6 { 6 } else { 4 } {
            return Err(OffloadError::Version { version, gso_type });
        }
        if hdr.gso_size == 0 {
            return Err(OffloadError::ZeroGsoSize);
        }
        let iph_len = usize::from(hdr.csum_start);
        let bad_tcp = OffloadError::TcpHeader {
            csum_start: hdr.csum_start,
        };
        let ip_ok = if v6 {
            iph_len >= 40
        } else {
            iph_len == usize::from(packet[0] & 0x0f) * 4 && iph_len >= 20
        };
        if !ip_ok || usize::from(hdr.csum_offset) != TCP_CSUM {
            return Err(bad_tcp);
        }
        let Some(&off) = packet.get(iph_len + 12) else {
            return Err(bad_tcp);
        };
        let tcph_len = usize::from(off >> 4) * 4;
        let hdr_len = iph_len + tcph_len;
        if tcph_len < 20 || hdr_len >= packet.len() {
            return Err(bad_tcp);
        }
        let gso_size = usize::from(hdr.gso_size);
        let payload = packet.len() - hdr_len;
        let (src, dst) = if v6 {
            (&packet[8..24], &packet[24..40])
        } else {
            (&packet[12..16], &packet[16..20])
        };
        Ok(Segments {
            packet,
            iph_len,
            hdr_len,
            gso_size,
            count: payload.div_ceil(gso_size),
            v6,
            first_seq: be32(&packet[iph_len + 4..]),
            first_id: u16::from_be_bytes([packet[4], packet[5]]),
            pseudo: checksum::pseudo_header(src, dst, IPPROTO_TCP, 0),
        })
    }

    /// How many segments.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.count
    }

    /// Bytes of segment `i` (headers and payload).
    #[cfg(test)]
    pub fn segment_len(&self, i: usize) -> usize {
        let start = self.hdr_len + i * self.gso_size;
        self.hdr_len + (self.packet.len() - start).min(self.gso_size)
    }

    /// Appends segment `i` (`i < len()`) to `dst`: a complete IP packet.
    pub fn append(&self, i: usize, dst: &mut BytesMut) {
        let start = self.hdr_len + i * self.gso_size;
        let end = (start + self.gso_size).min(self.packet.len());
        let base = dst.len();
        dst.extend_from_slice(&self.packet[..self.hdr_len]);
        dst.extend_from_slice(&self.packet[start..end]);
        let seg = &mut dst[base..];
        let len = seg.len();
        if self.v6 {
            put16(&mut seg[4..], (len - 40) as u16);
        } else {
            put16(&mut seg[2..], len as u16);
            put16(&mut seg[4..], self.first_id.wrapping_add(i as u16));
            put16(&mut seg[10..], 0);
            let c = checksum::ipv4_header(&seg[..self.iph_len]);
            put16(&mut seg[10..], c);
        }
        let tcp = &mut seg[self.iph_len..];
        let seq = self
            .first_seq
            .wrapping_add((i as u32).wrapping_mul(self.gso_size as u32));
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 < self.count {
            tcp[TCP_FLAGS] &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            tcp[TCP_FLAGS] &= !TCP_CWR;
        }
        put16(&mut tcp[TCP_CSUM..], 0);
        let sum = self.pseudo.add_u32(tcp.len() as u32).add(tcp);
        put16(&mut tcp[TCP_CSUM..], nonzero(sum.finish()));
    }
}

/// Finishes the transport checksum of a plain packet whose virtio header has
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the field at `csum_start + csum_offset` holds the
/// pseudo-header sum; the sum from `csum_start` to the end replaces it.
pub fn complete_checksum(
    packet: &mut [u8],
    csum_start: u16,
    csum_offset: u16,
) -> Result<(), OffloadError> {
    let start = usize::from(csum_start);
    let at = start + usize::from(csum_offset);
    if at + 2 > packet.len() {
        return Err(OffloadError::ChecksumPosition {
            start: csum_start,
            offset: csum_offset,
            len: packet.len(),
        });
    }
    let partial = u16::from_be_bytes([packet[at], packet[at + 1]]);
    put16(&mut packet[at..], 0);
    let sum = Sum::default().add_u16(partial).add(&packet[start..]);
    put16(&mut packet[at..], nonzero(sum.finish()));
    Ok(())
}

/// A computed checksum of 0 is sent as 0xffff (the same in ones'-complement; UDP reserves 0
/// for "none"), as the kernel does.
fn nonzero(c: u16) -> u16 {
    if c == 0 {
        0xffff
    } else {
        c
    }
}

fn put16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes());
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tun::testpkt::{tcp_packet, tcp_valid, Tcp};
    use crate::tun::vnet::VIRTIO_NET_HDR_F_NEEDS_CSUM;

    fn tso(v6: bool, payload_len: usize, gso_size: u16, flags: u8) -> (VnetHdr, Vec<u8>) {
        let payload: Vec<u8> = (0..payload_len).map(|i| (i * 7 + 3) as u8).collect();
        let t = Tcp {
            v6,
            seq: 0xffff_f000,
            flags,
            options: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
            id: 0xfffe,
            ..Tcp::default()
        };
        let mut packet = tcp_packet(&t, &payload);
        let iph = if v6 { 40 } else { 20 };
        // As the kernel leaves it: the pseudo-header sum in the checksum field.
        let partial = checksum::pseudo_header(
            if v6 { &t.src6 } else { &t.src4 },
            if v6 { &t.dst6 } else { &t.dst4 },
            6,
            (packet.len() - iph) as u32,
        )
        .fold();
        packet[iph + 16..iph + 18].copy_from_slice(&partial.to_be_bytes());
        let hdr = VnetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: if v6 {
                VIRTIO_NET_HDR_GSO_TCPV6
            } else {
                VIRTIO_NET_HDR_GSO_TCPV4
            },
            hdr_len: 0,
            gso_size,
            csum_start: iph as u16,
            csum_offset: 16,
        };
        (hdr, packet)
    }

    fn split(hdr: &VnetHdr, packet: &[u8]) -> Vec<Vec<u8>> {
        let s = Segments::new(hdr, packet).expect("valid super-packet");
        (0..s.len())
            .map(|i| {
                let mut b = BytesMut::new();
                s.append(i, &mut b);
                assert_eq!(b.len(), s.segment_len(i));
                b.to_vec()
            })
            .collect()
    }

    #[test]
    fn an_ipv4_super_packet_becomes_valid_segments() {
        let (hdr, packet) = tso(false, 1448 * 3 + 100, 1448, TCP_ACK | TCP_PSH | TCP_FIN);
        let segs = split(&hdr, &packet);
        assert_eq!(segs.len(), 4);
        let hdr_len = 20 + 32;
        let mut payload = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            assert!(tcp_valid(s), "segment {i} checksums");
            let want = if i == 3 { 100 } else { 1448 };
            assert_eq!(s.len(), hdr_len + want);
            assert_eq!(u16::from_be_bytes([s[2], s[3]]) as usize, s.len());
            // The id counts up from the super-packet's (wrapping).
            assert_eq!(
                u16::from_be_bytes([s[4], s[5]]),
                0xfffeu16.wrapping_add(i as u16)
            );
            let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
            assert_eq!(seq, 0xffff_f000u32.wrapping_add(1448 * i as u32));
            let flags = s[20 + 13];
            if i == 3 {
                assert_eq!(flags, TCP_ACK | TCP_PSH | TCP_FIN);
            } else {
                assert_eq!(flags, TCP_ACK);
            }
            // Options copied unchanged.
            assert_eq!(&s[40..52], &packet[40..52]);
            payload.extend_from_slice(&s[hdr_len..]);
        }
        assert_eq!(payload, packet[hdr_len..]);
    }

    #[test]
    fn an_ipv6_super_packet_becomes_valid_segments() {
        let (hdr, packet) = tso(true, 1428 * 2, 1428, TCP_ACK | TCP_CWR);
        let segs = split(&hdr, &packet);
        assert_eq!(segs.len(), 2);
        for (i, s) in segs.iter().enumerate() {
            assert!(tcp_valid(s));
            assert_eq!(u16::from_be_bytes([s[4], s[5]]) as usize, s.len() - 40);
            // CWR only on the first.
            let want = if i == 0 { TCP_ACK | TCP_CWR } else { TCP_ACK };
            assert_eq!(s[40 + 13], want);
        }
    }

    #[test]
    fn the_kernels_hdr_len_is_ignored() {
        let (mut hdr, packet) = tso(false, 3000, 1000, TCP_ACK);
        hdr.hdr_len = 1052;
        assert_eq!(split(&hdr, &packet).len(), 3);
    }

    #[test]
    fn malformed_super_packets_are_refused() {
        let (hdr, packet) = tso(false, 3000, 1000, TCP_ACK);
        let refused = |h: VnetHdr, p: &[u8]| Segments::new(&h, p).expect_err("refused");
        assert_eq!(
            refused(VnetHdr { gso_size: 0, ..hdr }, &packet),
            OffloadError::ZeroGsoSize
        );
        assert!(matches!(
            refused(VnetHdr { gso_type: 5, ..hdr }, &packet),
            OffloadError::GsoType { gso_type: 5 }
        ));
        assert!(matches!(
            refused(
                VnetHdr {
                    gso_type: VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_ECN,
                    ..hdr
                },
                &packet
            ),
            OffloadError::GsoType { .. }
        ));
        assert!(matches!(
            refused(
                VnetHdr {
                    gso_type: VIRTIO_NET_HDR_GSO_TCPV6,
                    ..hdr
                },
                &packet
            ),
            OffloadError::Version { version: 4, .. }
        ));
        for csum_start in [0, 19, 24, 3000] {
            assert!(matches!(
                refused(VnetHdr { csum_start, ..hdr }, &packet),
                OffloadError::TcpHeader { .. }
            ));
        }
        assert!(matches!(
            refused(
                VnetHdr {
                    csum_offset: 6,
                    ..hdr
                },
                &packet
            ),
            OffloadError::TcpHeader { .. }
        ));
        // Headers only, no payload.
        assert!(matches!(
            refused(hdr, &packet[..52]),
            OffloadError::TcpHeader { .. }
        ));
        assert!(matches!(refused(hdr, &[]), OffloadError::Version { .. }));
    }

    #[test]
    fn a_partial_checksum_is_completed() {
        let t = Tcp::default();
        let mut packet = tcp_packet(&t, b"hello");
        assert!(tcp_valid(&packet));
        let good = packet.clone();
        let partial = checksum::pseudo_header(&t.src4, &t.dst4, 6, 20 + 5).fold();
        packet[36..38].copy_from_slice(&partial.to_be_bytes());
        complete_checksum(&mut packet, 20, 16).expect("completed");
        assert_eq!(packet, good);
        assert!(matches!(
            complete_checksum(&mut packet, 20, 24),
            Err(OffloadError::ChecksumPosition { .. })
        ));
    }

    proptest::proptest! {
        /// Any payload length and segment size: the segments carry the payload in order, each
        /// with valid checksums and lengths.
        #[test]
        fn segments_carry_the_payload(
            v6 in proptest::bool::ANY,
            len in 1usize..20_000,
            gso in 1u16..2000,
        ) {
            let (hdr, packet) = tso(v6, len, gso, TCP_ACK | TCP_PSH);
            let segs = split(&hdr, &packet);
            let hdr_len = if v6 { 40 } else { 20 } + 32;
            proptest::prop_assert_eq!(segs.len(), len.div_ceil(usize::from(gso)));
            let mut payload = Vec::new();
            for s in &segs {
                proptest::prop_assert!(tcp_valid(s));
                proptest::prop_assert!(s.len() <= hdr_len + usize::from(gso));
                payload.extend_from_slice(&s[hdr_len..]);
            }
            proptest::prop_assert_eq!(&payload[..], &packet[hdr_len..]);
        }
    }
}
