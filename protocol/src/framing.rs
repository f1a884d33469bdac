//! TCP stream framing: every OpenVPN packet on a TCP connection is preceded by its length.
//!
//! ```text
//! +--------+--------+=========================================+
//! | len_hi | len_lo |  OpenVPN packet (len bytes)             |
//! +--------+--------+=========================================+
//! ```
//!
//! `len` is a big-endian `u16` counting the packet bytes only (not itself). It must be at
//! least 1 and at most the receiver's stream buffer size ([`DEFAULT_STREAM_MAXLEN`] for a
//! stock OpenVPN 2.6). Packets follow each other back to back with nothing in between, so a
//! reader must cope with a packet split over several reads and with several packets in one.
//! The same framing is used in both directions.
//!
//! [`FrameDecoder`] cuts complete packets out of the bytes received so far, without copying;
//! [`FrameEncoder`] appends a length-prefixed packet to an output buffer. The limit grows with
//! the MTU as upstream's stream buffer does ([`stream_max_len`]).
//!
//! A framing error is fatal for the connection: after a bad length the stream cannot be
//! resynchronised (OpenVPN logs "Bad encapsulated packet length from peer" and drops the
//! connection). The decoder keeps reporting the same error if called again.

use bytes::{Buf, BufMut, BytesMut};

/// Size of the length prefix in front of every packet on a TCP stream.
pub const LENGTH_PREFIX_LEN: usize = 2;

/// The largest length a 2-byte prefix can express.
pub const MAX_FRAMEABLE_LEN: usize = u16::MAX as usize;

/// The default maximum packet length accepted from a stream: 1768 bytes.
///
/// This mirrors the stream buffer of a stock OpenVPN 2.6 with the default `tun-mtu 1500`
/// (its verb-9 log says `STREAM: INIT maxlen=1768`). A peer announcing a longer packet is
/// treated as broken by OpenVPN, so we refuse the same lengths it refuses, and we never
/// need to buffer more than this per packet. Configurations with a larger `tun-mtu` need a
/// larger limit ([`FrameDecoder::with_max_len`]).
pub const DEFAULT_STREAM_MAXLEN: u16 = 1768;

/// The `tun-mtu` [`DEFAULT_STREAM_MAXLEN`] belongs to (OpenVPN's default).
pub const DEFAULT_TUN_MTU: u16 = 1500;

/// The longest packet accepted from a stream with this `tun-mtu`: upstream sizes its stream
/// buffer from the MTU, so it grows by what the MTU exceeds the default by (and never shrinks
/// below [`DEFAULT_STREAM_MAXLEN`]).
pub const fn stream_max_len(tun_mtu: u16) -> u16 {
    DEFAULT_STREAM_MAXLEN.saturating_add(tun_mtu.saturating_sub(DEFAULT_TUN_MTU))
}

/// A bad frame length, on either side of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A length prefix of 0 was received, or an empty packet was to be sent. OpenVPN
    /// treats a zero length as a broken stream.
    #[error("bad encapsulated packet length 0 (must be 1..={max})")]
    Empty {
        /// The configured maximum packet length.
        max: u16,
    },
    /// A length prefix above the configured maximum was received, or a packet that long
    /// (or longer than a `u16` can express) was to be sent.
    #[error("bad encapsulated packet length {len} (maximum is {max})")]
    TooLong {
        /// The offending length.
        len: usize,
        /// The configured maximum packet length.
        max: u16,
    },
}

/// Cuts length-prefixed packets out of a TCP byte stream.
///
/// Feed it the receive buffer each time bytes arrive; it removes complete packets from the
/// front of the buffer and leaves incomplete ones in place. The decoder itself holds no
/// per-stream state besides its limit, so the buffer is the whole state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    max_len: u16,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    /// A decoder accepting packets of up to [`DEFAULT_STREAM_MAXLEN`] bytes.
    pub const fn new() -> Self {
        Self::with_max_len(DEFAULT_STREAM_MAXLEN)
    }

    /// A decoder accepting packets of up to `max_len` bytes.
    pub const fn with_max_len(max_len: u16) -> Self {
        FrameDecoder { max_len }
    }

    /// The largest packet length this decoder accepts.
    pub const fn max_len(&self) -> u16 {
        self.max_len
    }

    /// Removes the next complete packet from the front of `src`.
    ///
    /// Returns `Ok(Some(packet))` with the packet bytes (without the length prefix), split off
    /// `src` without copying; `Ok(None)` if `src` does not yet hold a complete packet (nothing
    /// is consumed, and `src` gets room reserved for the rest of the packet); `Err` if the
    /// next length prefix is 0 or above the limit (nothing is consumed; the stream is dead).
    pub fn decode(&self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        let Some(prefix) = src.get(..LENGTH_PREFIX_LEN) else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        self.check_len(len)?;
        let total = LENGTH_PREFIX_LEN + len;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(LENGTH_PREFIX_LEN);
        Ok(Some(src.split_to(len)))
    }

    fn check_len(&self, len: usize) -> Result<(), FrameError> {
        check_len(len, self.max_len)
    }
}

/// Writes packets with their length prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEncoder {
    max_len: u16,
}

impl Default for FrameEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameEncoder {
    /// An encoder refusing packets longer than [`DEFAULT_STREAM_MAXLEN`] bytes (what a stock
    /// OpenVPN 2.6 peer would refuse to receive).
    pub const fn new() -> Self {
        Self::with_max_len(DEFAULT_STREAM_MAXLEN)
    }

    /// An encoder refusing packets longer than `max_len` bytes.
    pub const fn with_max_len(max_len: u16) -> Self {
        FrameEncoder { max_len }
    }

    /// The largest packet length this encoder writes.
    pub const fn max_len(&self) -> u16 {
        self.max_len
    }

    /// Appends the length prefix and `packet` to `dst`.
    ///
    /// Fails, writing nothing, if `packet` is empty or longer than the limit.
    pub fn encode(&self, packet: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
        check_len(packet.len(), self.max_len)?;
        let Ok(len) = u16::try_from(packet.len()) else {
            // Unreachable after `check_len` (the limit is a u16), kept total for clarity.
            return Err(FrameError::TooLong {
                len: packet.len(),
                max: self.max_len,
            });
        };
        dst.reserve(LENGTH_PREFIX_LEN + packet.len());
        dst.put_u16(len);
        dst.put_slice(packet);
        Ok(())
    }
}

fn check_len(len: usize, max: u16) -> Result<(), FrameError> {
    if len == 0 {
        Err(FrameError::Empty { max })
    } else if len > usize::from(max) {
        Err(FrameError::TooLong { len, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_mtu() {
        assert_eq!(stream_max_len(1500), 1768);
        assert_eq!(stream_max_len(1400), 1768);
        assert_eq!(stream_max_len(9000), 1768 + 7500);
        assert_eq!(stream_max_len(u16::MAX), u16::MAX);
    }

    #[test]
    fn decodes_split_and_coalesced() {
        let dec = FrameDecoder::new();
        let mut buf = BytesMut::new();
        assert_eq!(dec.decode(&mut buf), Ok(None));
        buf.extend_from_slice(&[0x00]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        buf.extend_from_slice(&[0x03, 0xaa, 0xbb]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(buf.len(), 4, "nothing consumed while incomplete");
        buf.extend_from_slice(&[0xcc, 0x00, 0x01, 0x38, 0x00]);
        assert_eq!(
            dec.decode(&mut buf).unwrap().unwrap()[..],
            [0xaa, 0xbb, 0xcc]
        );
        assert_eq!(dec.decode(&mut buf).unwrap().unwrap()[..], [0x38]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(buf[..], [0x00]);
    }

    #[test]
    fn zero_and_over_limit_lengths_are_errors() {
        let dec = FrameDecoder::new();
        let mut buf = BytesMut::from(&[0x00, 0x00, 0x38][..]);
        let err = dec.decode(&mut buf).unwrap_err();
        assert_eq!(err, FrameError::Empty { max: 1768 });
        assert_eq!(
            err.to_string(),
            "bad encapsulated packet length 0 (must be 1..=1768)"
        );
        assert_eq!(buf.len(), 3, "an error consumes nothing");

        // 1769 = 0x06e9: one above the limit, reported before the body arrives.
        let mut buf = BytesMut::from(&[0x06, 0xe9][..]);
        let err = dec.decode(&mut buf).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLong {
                len: 1769,
                max: 1768
            }
        );
        assert_eq!(
            err.to_string(),
            "bad encapsulated packet length 1769 (maximum is 1768)"
        );

        // Exactly the limit is fine.
        let mut buf = BytesMut::from(&[0x06, 0xe8][..]);
        buf.resize(2 + 1768, 0x20);
        assert_eq!(dec.decode(&mut buf).unwrap().unwrap().len(), 1768);
        assert!(buf.is_empty());
    }

    #[test]
    fn custom_limit() {
        let dec = FrameDecoder::with_max_len(u16::MAX);
        assert_eq!(dec.max_len(), u16::MAX);
        let mut buf = BytesMut::from(&[0xff, 0xff][..]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert!(buf.capacity() >= 2 + 65535, "room reserved for the packet");
    }

    #[test]
    fn encodes_with_prefix() {
        let enc = FrameEncoder::new();
        let mut out = BytesMut::new();
        enc.encode(&[0x38, 1, 2], &mut out).unwrap();
        enc.encode(&[0x28], &mut out).unwrap();
        assert_eq!(out[..], [0x00, 0x03, 0x38, 1, 2, 0x00, 0x01, 0x28]);

        assert_eq!(
            enc.encode(&[], &mut out),
            Err(FrameError::Empty { max: 1768 })
        );
        assert_eq!(
            enc.encode(&[0; 1769], &mut out),
            Err(FrameError::TooLong {
                len: 1769,
                max: 1768
            })
        );
        let wide = FrameEncoder::with_max_len(u16::MAX);
        assert_eq!(
            wide.encode(&vec![0; 65536], &mut out),
            Err(FrameError::TooLong {
                len: 65536,
                max: u16::MAX
            })
        );
        assert_eq!(out.len(), 8, "failed encodes write nothing");
        wide.encode(&vec![7; 65535], &mut out).unwrap();
        assert_eq!(out[8..10], [0xff, 0xff]);
    }
}
