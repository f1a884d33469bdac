//! The Internet checksum (RFC 1071) of IPv4 headers and TCP/UDP segments, as the offloads need
//! it: summed over whole segments when a super-packet is cut up, checked before segments are
//! merged, and the pseudo-header part alone for a merged packet the kernel finishes.
//!
//! A [`Sum`] is the ones'-complement sum before folding; [`Sum::fold`] gives the 16-bit sum
//! and [`Sum::finish`] its complement, the value a header carries. Summing is order
//! independent, so a sum can be built from parts (pseudo header, then the segment).

/// A ones'-complement sum in progress (RFC 1071), wide enough that adding never loses a carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum(u64);

impl Sum {
    /// Adds `data`, taken as big-endian 16-bit words (an odd last byte is padded with zero).
    ///
    /// Must be called on parts of even length, except for the last part: the padding byte is
    /// where the next part's first byte would be.
    pub fn add(self, data: &[u8]) -> Sum {
        // Eight bytes at a time in the host's order: the ones'-complement sum of 16-bit words
        // does not depend on the byte order (RFC 1071, 2.(B)), so the folded result is
        // swapped back once at the end (in `fold`) instead of every word.
        let mut acc = self.to_native();
        let mut chunks = data.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let (sum, carry) = acc.overflowing_add(u64::from_ne_bytes(word));
            acc = sum + u64::from(carry);
        }
        let mut tail = [0u8; 8];
        let rest = chunks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        let (sum, carry) = acc.overflowing_add(u64::from_ne_bytes(tail));
        acc = sum + u64::from(carry);
        Sum::from_native(acc)
    }

    /// Adds one big-endian 16-bit value.
    pub fn add_u16(self, value: u16) -> Sum {
        Sum(self.0 + u64::from(value))
    }

    /// Adds one big-endian 32-bit value (two 16-bit words).
    pub fn add_u32(self, value: u32) -> Sum {
        Sum(self.0 + u64::from(value >> 16) + u64::from(value & 0xffff))
    }

    /// The sum folded to 16 bits (not complemented): what a partial checksum field holds.
    pub fn fold(self) -> u16 {
        let mut s = self.0;
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The checksum a header carries: the complement of the folded sum.
    pub fn finish(self) -> u16 {
        !self.fold()
    }

    /// This sum as a host-order accumulator for `add` (its folded value, swapped on a
    /// little-endian host).
    fn to_native(self) -> u64 {
        u64::from(u16::from_be(self.fold()))
    }

    /// A host-order accumulator back as a big-endian sum.
    fn from_native(acc: u64) -> Sum {
        let mut s = acc;
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        Sum(u64::from(u16::to_be(s as u16)))
    }
}

/// The IPv4 header checksum of `header` (its checksum field must hold 0 or be skipped by the
/// caller): the value to store in bytes 10..12.
pub fn ipv4_header(header: &[u8]) -> u16 {
    Sum::default().add(header).finish()
}

/// The pseudo-header sum of a TCP or UDP segment of `len` bytes (header and payload) between
/// `src` and `dst` (both 4 or both 16 bytes), protocol `proto` (RFC 793, RFC 8200 8.1).
pub fn pseudo_header(src: &[u8], dst: &[u8], proto: u8, len: u32) -> Sum {
    Sum::default()
        .add(src)
        .add(dst)
        .add_u16(u16::from(proto))
        .add_u32(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 written the slow, obvious way: 16-bit big-endian words, 32-bit carries folded.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for pair in data.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn known_ipv4_header() {
        // The header of RFC 1071's usual example packet (Wikipedia's "IPv4 header checksum"):
        // 4500 0073 0000 4000 4011 [b861] c0a8 0001 c0a8 00c7.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_header(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        // A header with its checksum in place sums to 0xffff.
        assert_eq!(Sum::default().add(&h).fold(), 0xffff);
    }

    #[test]
    fn pseudo_header_of_a_udp_datagram() {
        // 10.0.0.1 → 10.0.0.2, UDP, 12 bytes: 0a00 + 0001 + 0a00 + 0002 + 0011 + 000c.
        let s = pseudo_header(&[10, 0, 0, 1], &[10, 0, 0, 2], 17, 12);
        assert_eq!(
            s.fold(),
            0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 0x0011 + 0x000c
        );
    }

    #[test]
    fn carries_wrap_around() {
        assert_eq!(Sum::default().add(&[0xff; 64]).fold(), 0xffff);
        assert_eq!(Sum::default().add(&[0xff, 0xff, 0x00, 0x01]).fold(), 0x0001);
        assert_eq!(Sum::default().add(&[]).fold(), 0);
        assert_eq!(Sum::default().add(&[0xab]).fold(), 0xab00);
    }

    proptest! {
        #[test]
        fn matches_the_reference(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert_eq!(Sum::default().add(&data).fold(), reference(&data));
        }

        #[test]
        fn parts_of_even_length_sum_like_the_whole(
            data in proptest::collection::vec(any::<u8>(), 0..600),
            cut in 0usize..300,
            extra in any::<u16>(),
        ) {
            let cut = (cut * 2).min(data.len() & !1);
            let whole = Sum::default().add_u16(extra).add(&data).fold();
            let parts = Sum::default().add(&data[..cut]).add_u16(extra).add(&data[cut..]).fold();
            prop_assert_eq!(parts, whole);
        }
    }
}
