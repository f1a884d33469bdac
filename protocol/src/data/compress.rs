//! Compression framing (reference 8.8), stubs only: applied to the plaintext before encryption
//! and removed after decryption, in place.
//!
//! ```text
//! None            | payload |
//! comp-lzo no     | 0xFA | payload |                     (LzoStub)
//! compress [stub] | 0xFB | payload[1..] | payload[0] |   (StubSwap: first byte moved to the end)
//! stub-v2         | payload |  or, if payload[0] == 0x50: | 0x50 0x00 | payload |
//! ```
//!
//! An empty payload is never framed (as upstream). Really compressed payloads (LZO `0x66`, LZ4
//! `0x69`, stub-v2 `50 01`) are refused with [`DataError::Compressed`], a droppable error.

use bytes::{Buf, BufMut, BytesMut};

use super::{ensure_headroom, DataError};

/// `NO_COMPRESS_BYTE`: an uncompressed payload follows (LZO framing).
pub const NO_COMPRESS_BYTE: u8 = 0xfa;
/// `NO_COMPRESS_BYTE_SWAP`: uncompressed, first byte swapped to the end (`compress` framing).
pub const NO_COMPRESS_BYTE_SWAP: u8 = 0xfb;
/// `LZO_COMPRESS_BYTE`: an LZO-compressed payload follows.
pub const LZO_COMPRESS_BYTE: u8 = 0x66;
/// `LZ4_COMPRESS_BYTE`: an LZ4-compressed payload follows (swap framing).
pub const LZ4_COMPRESS_BYTE: u8 = 0x69;
/// `COMP_ALGV2_INDICATOR_BYTE`: the escape byte of the v2 framing.
pub const COMP_ALGV2_INDICATOR_BYTE: u8 = 0x50;
/// `COMP_ALGV2_UNCOMPRESSED`: second byte of the v2 escape for an uncompressed payload.
pub const COMP_ALGV2_UNCOMPRESSED: u8 = 0x00;
/// `COMP_ALGV2_LZ4_BYTE`: second byte of the v2 escape for an LZ4 payload.
pub const COMP_ALG_LZ4_V2_BYTE: u8 = 0x01;

/// The compression framing configured or pushed for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// No compression context: the payload as is (the 2.6 default).
    #[default]
    None,
    /// `comp-lzo no` (and the uncompressed case of `comp-lzo`): `0xFA` prefix.
    LzoStub,
    /// `compress` / `compress stub` (and the uncompressed case of `compress lz4`): `0xFB` in
    /// front, the first payload byte moved to the end.
    StubSwap,
    /// `compress stub-v2` / the uncompressed case of `lz4-v2`: unchanged unless the payload
    /// starts with `0x50`, which is escaped as `50 00`.
    StubV2,
}

impl Compression {
    /// Frames the payload `buf[offset..]` for sending. `buf[..offset]` is free headroom
    /// (at most 2 bytes are used; with less the payload is copied). Returns the offset at which
    /// the framed plaintext starts, for [`DataKey::encrypt`](super::DataKey::encrypt).
    pub fn frame(self, buf: &mut BytesMut, offset: usize) -> usize {
        let offset = ensure_headroom(buf, offset, super::MAX_COMPRESSION_HEADROOM);
        let Some(&first) = buf.get(offset) else {
            return offset;
        };
        match self {
            Compression::None => offset,
            Compression::LzoStub => {
                buf[offset - 1] = NO_COMPRESS_BYTE;
                offset - 1
            }
            Compression::StubSwap => {
                buf.put_u8(first);
                buf[offset] = NO_COMPRESS_BYTE_SWAP;
                offset
            }
            Compression::StubV2 if first == COMP_ALGV2_INDICATOR_BYTE => {
                buf[offset - 2] = COMP_ALGV2_INDICATOR_BYTE;
                buf[offset - 1] = COMP_ALGV2_UNCOMPRESSED;
                offset - 2
            }
            Compression::StubV2 => offset,
        }
    }

    /// Removes the framing from a decrypted plaintext in place, leaving the payload in `buf`.
    pub fn unframe(self, buf: &mut BytesMut) -> Result<(), DataError> {
        let Some(&first) = buf.first() else {
            return Ok(());
        };
        match self {
            Compression::None => Ok(()),
            Compression::LzoStub => match first {
                NO_COMPRESS_BYTE => {
                    buf.advance(1);
                    Ok(())
                }
                LZO_COMPRESS_BYTE => Err(DataError::Compressed { byte: first }),
                byte => Err(DataError::BadCompressionByte { byte }),
            },
            Compression::StubSwap => match first {
                NO_COMPRESS_BYTE_SWAP => {
                    // `first` exists, so `last` does.
                    let last = buf.len() - 1;
                    buf[0] = buf[last];
                    buf.truncate(last);
                    Ok(())
                }
                LZO_COMPRESS_BYTE | LZ4_COMPRESS_BYTE => Err(DataError::Compressed { byte: first }),
                byte => Err(DataError::BadCompressionByte { byte }),
            },
            Compression::StubV2 if first != COMP_ALGV2_INDICATOR_BYTE => Ok(()),
            Compression::StubV2 => match buf.get(1).copied() {
                Some(COMP_ALGV2_UNCOMPRESSED) => {
                    buf.advance(2);
                    Ok(())
                }
                Some(byte @ COMP_ALG_LZ4_V2_BYTE) => Err(DataError::Compressed { byte }),
                Some(byte) => Err(DataError::BadCompressionByte { byte }),
                None => Err(DataError::BadCompressionByte { byte: first }),
            },
        }
    }
}
