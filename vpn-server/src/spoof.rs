//! Anti-spoofing (design decision 5): a packet from a client reaches the seed only if its
//! source address is one the server assigned to that client or lies inside one of its
//! iroutes. Anything else is dropped and counted by the caller.
//!
//! The addresses are read from the IP header:
//!
//! ```text
//!  IPv4: 0      1      2      3         IPv6: 0      1      2      3
//!       +------+------+------+------+        +------+------+------+------+
//!   0   |v=4 IHL| tos |  total len  |     0  |v=6 tc|    flow label      |
//!   4   |   id        | flags/frag  |     4  | payload len | next | hop  |
//!   8   | ttl  |proto |  checksum   |     8  | source address (16)       |
//!  12   | source address            |    24  | destination address (16)  |
//!  16   | destination address       |    40  | payload ...
//!  20   | options / payload ...
//! ```
//!
//! Packets whose source is IPv6 link-local or unspecified, or whose destination is multicast
//! (a client kernel's router solicitations and MLD reports), are not forwarded either, but are
//! reported as [`SpoofVerdict::Ignored`] rather than as spoofed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Bytes of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Bytes of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;

/// Why the addresses of a packet could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IpHeaderError {
    /// Shorter than the header of its version.
    #[error("IP packet of {len} bytes is shorter than its header")]
    Short {
        /// The packet length.
        len: usize,
    },
    /// The version nibble is neither 4 nor 6.
    #[error("IP version {version} is not 4 or 6")]
    Version {
        /// The version nibble.
        version: u8,
    },
}

/// Source and destination of an IP packet.
pub fn addresses(packet: &[u8]) -> Result<(IpAddr, IpAddr), IpHeaderError> {
    let Some(&first) = packet.first() else {
        return Err(IpHeaderError::Short { len: 0 });
    };
    let short = IpHeaderError::Short { len: packet.len() };
    match first >> 4 {
        4 => {
            let h = packet.get(..IPV4_HEADER_LEN).ok_or(short)?;
            let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
            Ok((src.into(), dst.into()))
        }
        6 => {
            let h = packet.get(..IPV6_HEADER_LEN).ok_or(short)?;
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            src.copy_from_slice(&h[8..24]);
            dst.copy_from_slice(&h[24..40]);
            Ok((Ipv6Addr::from(src).into(), Ipv6Addr::from(dst).into()))
        }
        version => Err(IpHeaderError::Version { version }),
    }
}

/// What to do with a packet from a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpoofVerdict {
    /// The source is the client's: forward to `dst`.
    Accept {
        /// The source address.
        src: IpAddr,
        /// The destination address.
        dst: IpAddr,
    },
    /// The source is not the client's: drop and count.
    Spoofed {
        /// The source address.
        src: IpAddr,
        /// The destination address.
        dst: IpAddr,
    },
    /// Link-local / unspecified source or multicast destination: drop quietly.
    Ignored,
    /// Not a readable IP packet: drop and count.
    Malformed(IpHeaderError),
}

/// The source addresses one client may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceFilter {
    addresses: Vec<IpAddr>,
    iroutes: Vec<IpNet>,
}

impl SourceFilter {
    /// A filter for a client with `addresses` (assigned by the pool or `ifconfig-push`) and
    /// `iroutes`.
    pub fn new(addresses: Vec<IpAddr>, iroutes: Vec<IpNet>) -> SourceFilter {
        let iroutes = iroutes.into_iter().map(|n| n.trunc()).collect();
        SourceFilter { addresses, iroutes }
    }

    /// Whether `src` belongs to the client.
    pub fn allows(&self, src: IpAddr) -> bool {
        self.addresses.contains(&src) || self.iroutes.iter().any(|n| n.contains(&src))
    }

    /// The verdict on `packet` (a whole IP packet from the client's tunnel).
    pub fn check(&self, packet: &[u8]) -> SpoofVerdict {
        let (src, dst) = match addresses(packet) {
            Ok(a) => a,
            Err(e) => return SpoofVerdict::Malformed(e),
        };
        if self.allows(src) {
            return SpoofVerdict::Accept { src, dst };
        }
        if quiet(src, dst) {
            return SpoofVerdict::Ignored;
        }
        SpoofVerdict::Spoofed { src, dst }
    }
}

fn quiet(src: IpAddr, dst: IpAddr) -> bool {
    let link_local_src = match src {
        IpAddr::V6(s) => s.is_unspecified() || (s.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(s) => s.is_unspecified(),
    };
    link_local_src || dst.is_multicast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_packet(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(&[0; 8]);
        p
    }

    fn v6_packet(src: &str, dst: &str) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        p.extend_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
        p
    }

    fn filter() -> SourceFilter {
        SourceFilter::new(
            vec![
                "192.168.123.2".parse().unwrap(),
                "fd8f::1000".parse().unwrap(),
            ],
            vec![
                "10.250.0.0/16".parse().unwrap(),
                "fd00:99::/64".parse().unwrap(),
            ],
        )
    }

    #[test]
    fn reads_addresses() {
        let (s, d) = addresses(&v4_packet([1, 2, 3, 4], [5, 6, 7, 8])).unwrap();
        assert_eq!(s, IpAddr::from([1, 2, 3, 4]));
        assert_eq!(d, IpAddr::from([5, 6, 7, 8]));
        let (s, _) = addresses(&v6_packet("fd00::1", "fd00::2")).unwrap();
        assert_eq!(s, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(addresses(&[]), Err(IpHeaderError::Short { len: 0 }));
        assert_eq!(
            addresses(&[0x45; 19]),
            Err(IpHeaderError::Short { len: 19 })
        );
        assert_eq!(
            addresses(&[0x60; 39]),
            Err(IpHeaderError::Short { len: 39 })
        );
        assert_eq!(
            addresses(&[0x50; 40]),
            Err(IpHeaderError::Version { version: 5 })
        );
    }

    #[test]
    fn own_address_and_iroutes_pass() {
        let f = filter();
        for p in [
            v4_packet([192, 168, 123, 2], [192, 168, 123, 1]),
            v4_packet([10, 250, 7, 9], [100, 64, 0, 1]),
            v6_packet("fd8f::1000", "fd8f::1"),
            v6_packet("fd00:99::42", "fd8f::1"),
        ] {
            assert!(matches!(f.check(&p), SpoofVerdict::Accept { .. }), "{p:?}");
        }
    }

    #[test]
    fn other_sources_are_spoofed() {
        let f = filter();
        for p in [
            v4_packet([192, 168, 123, 3], [192, 168, 123, 1]),
            v4_packet([10, 251, 0, 1], [192, 168, 123, 1]),
            v4_packet([100, 64, 0, 1], [100, 64, 0, 2]),
            v6_packet("fd8f::1001", "fd8f::1"),
        ] {
            assert!(matches!(f.check(&p), SpoofVerdict::Spoofed { .. }), "{p:?}");
        }
        assert!(matches!(
            f.check(&[0x45, 0]),
            SpoofVerdict::Malformed(IpHeaderError::Short { len: 2 })
        ));
    }

    #[test]
    fn link_local_and_multicast_are_ignored() {
        let f = filter();
        assert_eq!(
            f.check(&v6_packet("fe80::1", "ff02::2")),
            SpoofVerdict::Ignored
        );
        assert_eq!(f.check(&v6_packet("::", "ff02::16")), SpoofVerdict::Ignored);
        assert_eq!(
            f.check(&v4_packet([192, 168, 123, 9], [224, 0, 0, 251])),
            SpoofVerdict::Ignored
        );
    }
}
