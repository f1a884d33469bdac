//! The data channel: P_DATA_V1/V2 packets, AEAD and CBC+HMAC crypto, pings, OCC and the
//! compression framing (reference sections 8 and 9.1).
//!
//! A data packet on the wire is one of
//!
//! ```text
//! AEAD (AES-128/256-GCM, CHACHA20-POLY1305):
//! +--------------+---------------+----------+----------------------------+
//! | header 1 / 4 | packet_id u32 | tag [16] | ciphertext                 |
//! +--------------+---------------+----------+----------------------------+
//!   nonce = packet_id || implicit_iv[8]; AAD = header(4) || packet_id (P_DATA_V2),
//!   packet_id only (P_DATA_V1)
//!
//! CBC (AES-128/256-CBC) + HMAC (SHA1/SHA256/SHA512), encrypt-then-MAC:
//! +--------------+-----------+---------+-----------------------------------------------+
//! | header 1 / 4 | HMAC [H]  | IV [16] | AES-CBC(PKCS#7(packet_id u32 || plaintext))   |
//! +--------------+-----------+---------+-----------------------------------------------+
//!   HMAC = HMAC(hmac_key, IV || ciphertext); the header is not covered
//! ```
//!
//! where the header ([`DataHeader`]) is `0x30|key_id` (P_DATA_V1) or `0x48|key_id` followed
//! by a 24-bit peer id (P_DATA_V2), and the plaintext is the compression framing
//! ([`Compression`]) followed by the payload: an IP packet, the keepalive ping
//! ([`PING_MAGIC`]) or an OCC message ([`OCC_MAGIC`]).
//!
//! # The send path, in place
//!
//! ```text
//!   tun read          Compression::frame       DataKey::encrypt
//! [ headroom | payload ] -> [ headroom' | framing | payload ] -> [ wire packet ]
//!   ^ offset = DATA_HEADROOM   ^ returned offset                 buf advanced to its start
//! ```
//!
//! Every function of the send path takes the buffer and the `offset` at which its contents
//! start; `buf[..offset]` is free space the function writes headers into, then it
//! [`advance`](bytes::Buf::advance)s `buf` to the first byte of the wire packet. A caller that
//! reserves [`DATA_HEADROOM`] bytes in front and [`DATA_TAILROOM`] bytes of spare capacity
//! behind the payload never makes either function allocate or copy the payload. A buffer
//! pool does it like this:
//!
//! ```
//! use bytes::{BufMut, BytesMut};
//! use protocol::data::{DATA_HEADROOM, DATA_TAILROOM};
//!
//! const MAX_PAYLOAD: usize = 1500;
//! let mut buf = BytesMut::with_capacity(DATA_HEADROOM + MAX_PAYLOAD + DATA_TAILROOM);
//! buf.resize(DATA_HEADROOM, 0); // the headroom
//! buf.put_slice(b"an IP packet read from the tun device"); // or read into spare capacity
//! // compression.frame(&mut buf, DATA_HEADROOM) -> offset; key.encrypt(&mut buf, offset, rng)
//! ```
//!
//! With less headroom the functions still work but copy the payload into a new buffer.
//!
//! # The receive path, in place
//!
//! [`DataHeader::parse`] tells the caller which key id (and peer id) a packet is for; it hands
//! the whole wire packet to that key's [`DataKey::decrypt`], which authenticates, decrypts,
//! checks the packet id for replays and leaves `buf` holding the plaintext;
//! [`Compression::unframe`] then strips the framing, and [`classify`] tells a ping or an OCC
//! message from a packet for the tun device.
//!
//! # Errors
//!
//! [`DataError::is_fatal`] says whether OpenVPN in TCP mode restarts the connection
//! ("Fatal decryption error"): on an authentication (tag/HMAC) failure, bad padding, a
//! malformed length, a replayed packet id or an internal crypto failure. A key id with no
//! key, real compressed payloads, an unknown compression byte and a refused send (packet id
//! exhausted) only drop the packet.

mod cipher;
mod compress;
mod crypto;
mod header;
mod payload;

pub use cipher::DataCipher;
pub use compress::{
    Compression, COMP_ALGV2_INDICATOR_BYTE, COMP_ALGV2_UNCOMPRESSED, COMP_ALG_LZ4_V2_BYTE,
    LZ4_COMPRESS_BYTE, LZO_COMPRESS_BYTE, NO_COMPRESS_BYTE, NO_COMPRESS_BYTE_SWAP,
};
pub use crypto::{DataKey, DataKeyParams, PacketIdLimits, PACKET_ID_MAX, PACKET_ID_WRAP_TRIGGER};
pub use header::DataHeader;
pub use payload::{
    classify, is_ping, ping_payload, OccMessage, OccOp, PayloadKind, OCC_MAGIC, PING_MAGIC,
};

use crate::ids::KeyId;
use crate::packet_id::ReplayError;

/// Largest header a data packet has: P_DATA_V2's opcode byte and 24-bit peer id.
pub const MAX_DATA_HEADER_LEN: usize = 4;
/// AEAD tag length (`OPENVPN_AEAD_TAG_LENGTH`).
pub const AEAD_TAG_LEN: usize = 16;
/// AEAD implicit IV length taken from the HMAC slot (nonce 12 bytes minus the 4-byte packet id).
pub const AEAD_IMPLICIT_IV_LEN: usize = 8;
/// AES block and CBC IV length.
pub const CBC_BLOCK_LEN: usize = 16;
/// Short-form data packet id length.
pub const PACKET_ID_LEN: usize = 4;
/// Most bytes the compression framing puts in front of a payload (`compress stub-v2`: `50 00`).
pub const MAX_COMPRESSION_HEADROOM: usize = 2;

/// Headroom a caller reserves in front of a plaintext payload so that framing and encryption
/// never copy it: the compression framing (2) plus the largest crypto overhead in front,
/// CBC with SHA512: header (4) + HMAC (64) + IV (16) + packet id (4). AEAD needs
/// header + packet id + tag = 24 of it.
pub const DATA_HEADROOM: usize = MAX_COMPRESSION_HEADROOM
    + MAX_DATA_HEADER_LEN
    + crate::digest::MAX_DIGEST_LEN
    + CBC_BLOCK_LEN
    + PACKET_ID_LEN;

/// Spare capacity a caller reserves behind a payload so that framing and encryption never
/// reallocate: the stub-swap framing moves one byte to the end, CBC padding adds 1..=16.
pub const DATA_TAILROOM: usize = 1 + CBC_BLOCK_LEN;

/// Why a data packet could not be built or opened. See [`DataError::is_fatal`].
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The first byte is not a P_DATA_V1 / P_DATA_V2 opcode (a caller routing error).
    #[error("opcode byte {byte:#04x} is not a data packet")]
    NotData {
        /// The first byte of the packet.
        byte: u8,
    },
    /// The packet is shorter than its header and crypto overhead (or, for CBC, the
    /// ciphertext is not a whole number of blocks).
    #[error("data packet of {len} bytes is malformed for this cipher (needs at least {min})")]
    BadLength {
        /// Length of the packet.
        len: usize,
        /// Least length this cipher accepts.
        min: usize,
    },
    /// The packet is for a key id this key does not hold (upstream "key ID mismatch" /
    /// "keys out of sync"): the caller has no key for it.
    #[error("packet for key id {got}, this key is {expected}")]
    KeyIdMismatch {
        /// Key id in the packet.
        got: u8,
        /// Key id of this key.
        expected: u8,
    },
    /// The AEAD tag or the CBC HMAC did not verify.
    #[error("authentication failed (key id {key_id})")]
    AuthFailed {
        /// Key id of the packet.
        key_id: u8,
    },
    /// The CBC plaintext does not end in valid PKCS#7 padding.
    #[error("bad CBC padding")]
    BadPadding,
    /// The packet id was refused by the replay window.
    #[error("replayed or too old packet id")]
    Replay(#[from] ReplayError),
    /// The send packet id reached [`PACKET_ID_MAX`]: OpenVPN drops outgoing packets ("packet
    /// ID roll over") until a new key is negotiated.
    #[error("send packet id exhausted, renegotiate the key")]
    PacketIdExhausted,
    /// A negotiated cipher key is all zeros (upstream "Bad dynamic key generated").
    #[error("all-zero data channel cipher key")]
    ZeroKey,
    /// The payload is really compressed (LZO `0x66`, LZ4 `0x69`, stub-v2 `50 01`); we only
    /// speak the stubs.
    #[error("compressed payload (byte {byte:#04x}) but only compression stubs are supported")]
    Compressed {
        /// The compression byte.
        byte: u8,
    },
    /// The compression framing byte is not one the configured framing accepts.
    #[error("unexpected compression framing byte {byte:#04x}")]
    BadCompressionByte {
        /// The byte found.
        byte: u8,
    },
    /// OpenSSL failed (context setup or an internal error).
    #[error("OpenSSL error")]
    Crypto(#[from] openssl::error::ErrorStack),
}

impl DataError {
    /// Whether OpenVPN in TCP mode restarts the connection on this error.
    ///
    /// Fatal: [`BadLength`](Self::BadLength), [`AuthFailed`](Self::AuthFailed),
    /// [`BadPadding`](Self::BadPadding), [`Replay`](Self::Replay) (all are "decryption
    /// errors" upstream, which restart a TCP connection), [`ZeroKey`](Self::ZeroKey) and
    /// [`Crypto`](Self::Crypto).
    ///
    /// Not fatal (drop the packet): [`NotData`](Self::NotData),
    /// [`KeyIdMismatch`](Self::KeyIdMismatch) (no key for that key id, a silent drop),
    /// [`PacketIdExhausted`](Self::PacketIdExhausted) (outgoing packet dropped until the
    /// renegotiation [`DataKey::wants_renegotiation`] asked for completes),
    /// [`Compressed`](Self::Compressed) and [`BadCompressionByte`](Self::BadCompressionByte)
    /// (upstream drops the packet after a decompression error).
    pub fn is_fatal(&self) -> bool {
        match self {
            DataError::BadLength { .. }
            | DataError::AuthFailed { .. }
            | DataError::BadPadding
            | DataError::Replay(_)
            | DataError::ZeroKey
            | DataError::Crypto(_) => true,
            DataError::NotData { .. }
            | DataError::KeyIdMismatch { .. }
            | DataError::PacketIdExhausted
            | DataError::Compressed { .. }
            | DataError::BadCompressionByte { .. } => false,
        }
    }
}

/// Makes sure `buf[..offset]` holds at least `need` bytes of headroom, copying the contents
/// `buf[offset..]` into a new buffer (with [`DATA_HEADROOM`] and [`DATA_TAILROOM`]) only if
/// it does not. Returns the (possibly new) offset of the contents.
fn ensure_headroom(buf: &mut bytes::BytesMut, offset: usize, need: usize) -> usize {
    if offset >= need && offset <= buf.len() {
        return offset;
    }
    let contents = buf.get(offset..).unwrap_or(&[]);
    let mut fresh = bytes::BytesMut::with_capacity(DATA_HEADROOM + contents.len() + DATA_TAILROOM);
    fresh.resize(DATA_HEADROOM, 0);
    fresh.extend_from_slice(contents);
    *buf = fresh;
    DATA_HEADROOM
}

fn key_id_mismatch(got: KeyId, expected: KeyId) -> DataError {
    DataError::KeyIdMismatch {
        got: got.get(),
        expected: expected.get(),
    }
}
