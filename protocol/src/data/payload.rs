//! What a decrypted data payload is: an IP packet for the tun device, a keepalive ping
//! (reference 8.6) or an OCC message (8.7).
//!
//! ```text
//! ping:  | PING_MAGIC [16] |                        exactly 16 bytes, nothing else
//! OCC:   | OCC_MAGIC [16]  | type u8 | body ...     type 0..=6
//! ```

use bytes::BytesMut;

use super::{DATA_HEADROOM, DATA_TAILROOM};

/// The keepalive ping payload (`ping_string`): a data packet whose payload is exactly these
/// 16 bytes is a ping, dropped by the receiver (it still counts as received traffic).
pub const PING_MAGIC: [u8; 16] = [
    0x2a, 0x18, 0x7b, 0xf3, 0x64, 0x1e, 0xb4, 0xcb, 0x07, 0xed, 0x2d, 0x0a, 0x98, 0x1f, 0xc7, 0x48,
];

/// The prefix of an OCC message in the data channel (`occ_magic`), followed by a type byte.
pub const OCC_MAGIC: [u8; 16] = [
    0x28, 0x7f, 0x34, 0x6b, 0xd4, 0xef, 0x7a, 0x81, 0x2d, 0x56, 0xb8, 0xd3, 0xaf, 0xc5, 0x45, 0x9c,
];

/// The type byte of an OCC message (`OCC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OccOp {
    /// `OCC_REQUEST` (0): ask for the peer's options string.
    Request,
    /// `OCC_REPLY` (1): a NUL-terminated options string follows.
    Reply,
    /// `OCC_MTU_LOAD_REQUEST` (2).
    MtuLoadRequest,
    /// `OCC_MTU_LOAD` (3).
    MtuLoad,
    /// `OCC_MTU_REQUEST` (4).
    MtuRequest,
    /// `OCC_MTU_REPLY` (5).
    MtuReply,
    /// `OCC_EXIT` (6): the peer is exiting.
    Exit,
    /// A type byte OpenVPN 2.6 does not define.
    Unknown(u8),
    /// The magic with no type byte after it.
    Missing,
}

impl OccOp {
    /// `OCC_REQUEST`.
    pub const OCC_REQUEST: u8 = 0;
    /// `OCC_REPLY`.
    pub const OCC_REPLY: u8 = 1;
    /// `OCC_MTU_LOAD_REQUEST`.
    pub const OCC_MTU_LOAD_REQUEST: u8 = 2;
    /// `OCC_MTU_LOAD`.
    pub const OCC_MTU_LOAD: u8 = 3;
    /// `OCC_MTU_REQUEST`.
    pub const OCC_MTU_REQUEST: u8 = 4;
    /// `OCC_MTU_REPLY`.
    pub const OCC_MTU_REPLY: u8 = 5;
    /// `OCC_EXIT`.
    pub const OCC_EXIT: u8 = 6;

    /// The operation of a type byte.
    pub const fn from_byte(byte: u8) -> OccOp {
        match byte {
            Self::OCC_REQUEST => OccOp::Request,
            Self::OCC_REPLY => OccOp::Reply,
            Self::OCC_MTU_LOAD_REQUEST => OccOp::MtuLoadRequest,
            Self::OCC_MTU_LOAD => OccOp::MtuLoad,
            Self::OCC_MTU_REQUEST => OccOp::MtuRequest,
            Self::OCC_MTU_REPLY => OccOp::MtuReply,
            Self::OCC_EXIT => OccOp::Exit,
            other => OccOp::Unknown(other),
        }
    }
}

/// An OCC message found in a data payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OccMessage<'a> {
    /// The type byte's meaning.
    pub op: OccOp,
    /// Everything after the type byte.
    pub body: &'a [u8],
}

/// What a decrypted, unframed payload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind<'a> {
    /// A keepalive ping: drop it (it resets `ping-restart`).
    Ping,
    /// An OCC message: handle it, never forward it to the tun device.
    Occ(OccMessage<'a>),
    /// Anything else: a packet for the tun device.
    Packet,
}

/// Classifies a decrypted payload. A ping is exactly [`PING_MAGIC`] (15 or 17 bytes are
/// packets); an OCC message is anything starting with [`OCC_MAGIC`].
pub fn classify(payload: &[u8]) -> PayloadKind<'_> {
    if payload == PING_MAGIC {
        return PayloadKind::Ping;
    }
    match payload.split_first_chunk::<16>() {
        Some((magic, rest)) if *magic == OCC_MAGIC => {
            let (op, body) = match rest.split_first() {
                Some((&op, body)) => (OccOp::from_byte(op), body),
                None => (OccOp::Missing, rest),
            };
            PayloadKind::Occ(OccMessage { op, body })
        }
        _ => PayloadKind::Packet,
    }
}

/// Whether `payload` is a keepalive ping (exactly the 16 magic bytes).
pub fn is_ping(payload: &[u8]) -> bool {
    payload == PING_MAGIC
}

/// A fresh buffer holding a ping payload at offset [`DATA_HEADROOM`], ready for
/// [`Compression::frame`](super::Compression::frame) and
/// [`DataKey::encrypt`](super::DataKey::encrypt) with that offset. Pings are rare, so this
/// allocates.
pub fn ping_payload() -> BytesMut {
    let mut buf = BytesMut::with_capacity(DATA_HEADROOM + PING_MAGIC.len() + DATA_TAILROOM);
    buf.resize(DATA_HEADROOM, 0);
    buf.extend_from_slice(&PING_MAGIC);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_payloads() {
        assert_eq!(classify(&PING_MAGIC), PayloadKind::Ping);
        assert!(is_ping(&PING_MAGIC));
        assert_eq!(classify(&PING_MAGIC[..15]), PayloadKind::Packet);
        let mut long = PING_MAGIC.to_vec();
        long.push(0);
        assert_eq!(classify(&long), PayloadKind::Packet);
        assert!(!is_ping(&long));

        let mut occ = OCC_MAGIC.to_vec();
        assert_eq!(
            classify(&occ),
            PayloadKind::Occ(OccMessage {
                op: OccOp::Missing,
                body: &[]
            })
        );
        occ.extend_from_slice(&[6, 1, 2]);
        assert_eq!(
            classify(&occ),
            PayloadKind::Occ(OccMessage {
                op: OccOp::Exit,
                body: &[1, 2]
            })
        );
        occ[16] = 9;
        assert!(matches!(
            classify(&occ),
            PayloadKind::Occ(OccMessage {
                op: OccOp::Unknown(9),
                ..
            })
        ));
        assert_eq!(classify(&[0x45, 0, 0, 20]), PayloadKind::Packet);
    }
}
