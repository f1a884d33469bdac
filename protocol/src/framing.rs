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
//! [`FrameEncoder`] appends a length-prefixed packet to an output buffer. With the `codec`
//! feature, `FrameCodec` is the same pair as a `tokio_util::codec` `Decoder`/`Encoder` for
//! use with `Framed`.
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

#[cfg(feature = "codec")]
pub use self::codec::{CodecError, FrameCodec};

#[cfg(feature = "codec")]
mod codec {
    use bytes::BytesMut;

    use super::{FrameDecoder, FrameEncoder, FrameError, DEFAULT_STREAM_MAXLEN};

    /// [`FrameDecoder`] and [`FrameEncoder`] as a `tokio_util::codec` pair, for
    /// `tokio_util::codec::Framed` over a TCP stream (feature `codec`).
    ///
    /// Decodes to `BytesMut` packets; encodes anything that is `AsRef<[u8]>`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct FrameCodec {
        decoder: FrameDecoder,
        encoder: FrameEncoder,
    }

    impl FrameCodec {
        /// A codec with the [`DEFAULT_STREAM_MAXLEN`] limit in both directions.
        pub const fn new() -> Self {
            Self::with_max_len(DEFAULT_STREAM_MAXLEN)
        }

        /// A codec with the limit `max_len` in both directions.
        pub const fn with_max_len(max_len: u16) -> Self {
            FrameCodec {
                decoder: FrameDecoder::with_max_len(max_len),
                encoder: FrameEncoder::with_max_len(max_len),
            }
        }

        /// The decoding half.
        pub const fn decoder(&self) -> &FrameDecoder {
            &self.decoder
        }

        /// The encoding half.
        pub const fn encoder(&self) -> &FrameEncoder {
            &self.encoder
        }
    }

    /// An error of a [`FrameCodec`] stream: a bad frame, or the transport failed.
    ///
    /// `tokio_util` needs the decoder error to be constructible from `std::io::Error`;
    /// this type exists so that [`FrameError`] stays free of I/O.
    #[derive(Debug, thiserror::Error)]
    pub enum CodecError {
        /// A bad frame length.
        #[error(transparent)]
        Frame(#[from] FrameError),
        /// Reading from or writing to the underlying transport failed.
        #[error("stream I/O failed")]
        Io(#[from] std::io::Error),
    }

    impl tokio_util::codec::Decoder for FrameCodec {
        type Item = BytesMut;
        type Error = CodecError;

        fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, CodecError> {
            Ok(self.decoder.decode(src)?)
        }
    }

    impl<T: AsRef<[u8]>> tokio_util::codec::Encoder<T> for FrameCodec {
        type Error = CodecError;

        fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), CodecError> {
            Ok(self.encoder.encode(item.as_ref(), dst)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[cfg(feature = "codec")]
    #[test]
    fn codec_round_trip() {
        use tokio_util::codec::{Decoder, Encoder};

        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::new();
        codec.encode(&b"\x38abc"[..], &mut buf).unwrap();
        codec
            .encode(bytes::Bytes::from_static(b"\x28"), &mut buf)
            .unwrap();
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap()[..], b"\x38abc"[..]);
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap()[..], b"\x28"[..]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(codec.decode_eof(&mut buf).unwrap().is_none());

        buf.extend_from_slice(&[0, 0]);
        let err = codec.decode(&mut buf).unwrap_err();
        assert!(matches!(err, CodecError::Frame(FrameError::Empty { .. })));
        let io: CodecError = std::io::Error::other("reset").into();
        assert!(std::error::Error::source(&io).is_some());
    }
}
