//! The `virtio_net_hdr` in front of every packet read from or written to a tun device opened
//! with `IFF_VNET_HDR` (Linux `include/uapi/linux/virtio_net.h`, the 10-byte legacy form the
//! tun driver uses unless `TUNSETVNETHDRSZ` says otherwise).
//!
//! ```text
//!  0        1        2        3        4        5        6        7        8        9
//! +--------+--------+--------+--------+--------+--------+--------+--------+--------+--------+
//! | flags  |gso_type|     hdr_len     |    gso_size     |   csum_start    |   csum_offset   |
//! +--------+--------+--------+--------+--------+--------+--------+--------+--------+--------+
//! ```
//!
//! The 16-bit fields are in the host's byte order (legacy virtio; we never set
//! `TUNSETVNETLE` / `TUNSETVNETBE`).
//!
//! Reading, the kernel says with it that the packet is a TCP super-packet to cut into
//! `gso_size` payloads (`gso_type` TCPV4 / TCPV6), or that its transport checksum is still to
//! be computed from `csum_start` on and stored at `csum_start + csum_offset`
//! ([`VIRTIO_NET_HDR_F_NEEDS_CSUM`]). Writing, an all-zero header is a plain packet; a merged
//! TCP packet carries its segment size and the place of its checksum.

/// Bytes of the header.
pub const VNET_HDR_LEN: usize = 10;

/// `flags`: the transport checksum is to be computed (`csum_start` / `csum_offset` are set).
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// `gso_type`: a plain packet.
pub const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
/// `gso_type`: an IPv4 TCP super-packet.
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
/// `gso_type`: an IPv6 TCP super-packet.
pub const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
/// `gso_type` bit: the super-packet has CWR set (only with `TUN_F_TSO_ECN`, which we do not
/// ask for).
pub const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;

/// One `virtio_net_hdr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// [`VIRTIO_NET_HDR_F_NEEDS_CSUM`] or 0.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`.
    pub gso_type: u8,
    /// Length of the IP and transport headers (the kernel's value is only a hint on reads).
    pub hdr_len: u16,
    /// Payload bytes of every segment but the last.
    pub gso_size: u16,
    /// Where the checksummed part (the transport header) starts.
    pub csum_start: u16,
    /// Where the checksum field is, from `csum_start` (16 for TCP, 6 for UDP).
    pub csum_offset: u16,
}

impl VnetHdr {
    /// The header of a plain packet.
    pub const NONE: VnetHdr = VnetHdr {
        flags: 0,
        gso_type: VIRTIO_NET_HDR_GSO_NONE,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };

    /// Reads a header from the first [`VNET_HDR_LEN`] bytes; `None` if `bytes` is shorter.
    pub fn decode(bytes: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = bytes.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// The header as the kernel reads it.
    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_host_order() {
        let h = VnetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        };
        let bytes = h.encode();
        assert_eq!(bytes[0], 1);
        assert_eq!(bytes[1], 1);
        assert_eq!(&bytes[4..6], &1448u16.to_ne_bytes());
        assert_eq!(VnetHdr::decode(&bytes), Some(h));
        assert_eq!(VnetHdr::decode(&bytes[..9]), None);
        assert_eq!(VnetHdr::NONE.encode(), [0u8; VNET_HDR_LEN]);
    }
}
