//! Control-channel protection: tls-auth (HMAC, [`TlsAuth`]) and tls-crypt v1 (AES-256-CTR +
//! HMAC-SHA256, [`TlsCrypt`]), or nothing.
//!
//! This layer works on bytes and knows nothing of ACK lists or message ids. Its input is a
//! plaintext control packet in the logical layout (reference 2.1):
//!
//! ```text
//! +--------+-------------------+=====================================================+
//! | op|kid | own session id (8)| body: ack_count, acks, [remote sid], [msg id], payload |
//! +--------+-------------------+=====================================================+
//! ```
//!
//! and its output is the packet as it goes on the wire (inside the TCP length prefix); `unwrap`
//! is the reverse. The layouts of the wrapped forms are drawn in [`tls_auth`] and
//! [`tls_crypt`]. Both carry a long-form replay packet id ([`PacketIdNet`]: a counter that
//! starts at 1 and grows with every packet sent, including retransmissions and ACKs, plus a
//! `net_time` fixed when the first packet was sent) which the receiver checks with a
//! [`ReplayWindow`](crate::packet_id::ReplayWindow) after authenticating the packet.
//!
//! # Errors
//!
//! Every [`WrapError`] from `unwrap` means "drop this packet silently": OpenVPN never answers
//! a packet that fails tls-auth or tls-crypt (that is the point of both: an unauthenticated
//! peer gets no response at all); counting or logging it is the caller's business. `unwrap` is
//! given whole framed packets, so a short packet is malformed ([`WrapError::Truncated`]), never
//! "need more bytes". A failed `unwrap` leaves `out` as it was and records nothing in the
//! replay window.

pub mod tls_auth;
pub mod tls_crypt;

use bytes::BytesMut;

use crate::ids::SessionId;
use crate::packet_id::ReplayError;

pub use tls_auth::TlsAuth;
pub use tls_crypt::TlsCrypt;

/// Bytes of the cleartext head every control packet starts with: the opcode byte and the
/// sender's session id.
pub const CONTROL_HEAD_LEN: usize = 1 + SessionId::LEN;
/// Bytes of a long-form packet id on the wire: u32 id and u32 `net_time`.
pub const PACKET_ID_LONG_LEN: usize = 8;

/// The control-channel protection of a session (`--tls-auth`, `--tls-crypt`, or neither).
#[derive(Debug)]
pub enum ControlWrap {
    /// No protection: the wire packet is the plaintext packet.
    None,
    /// `--tls-auth`: HMAC and replay id.
    Auth(TlsAuth),
    /// `--tls-crypt` (v1): encrypted, authenticated, replay id.
    Crypt(TlsCrypt),
}

impl ControlWrap {
    /// Bytes a wrapped packet has beyond its plaintext: tls-auth `H + 8` (H = digest size),
    /// tls-crypt 40, none 0.
    pub fn overhead(&self) -> usize {
        match self {
            ControlWrap::None => 0,
            ControlWrap::Auth(a) => a.overhead(),
            ControlWrap::Crypt(_) => TlsCrypt::OVERHEAD,
        }
    }

    /// The shortest wire packet `unwrap` can accept: none 9, tls-auth `17 + H`, tls-crypt 49.
    pub fn min_wire_len(&self) -> usize {
        match self {
            ControlWrap::None => CONTROL_HEAD_LEN,
            ControlWrap::Auth(a) => a.min_wire_len(),
            ControlWrap::Crypt(_) => TlsCrypt::MIN_WIRE_LEN,
        }
    }

    /// Appends the wire form of `plain` (a 2.1 control packet) to `out`. `now_unix` is the
    /// wall-clock time in seconds; the first call fixes the packet's `net_time`.
    ///
    /// Returns the replay packet id the packet carries (`None` without protection).
    pub fn wrap(
        &mut self,
        plain: &[u8],
        now_unix: u32,
        out: &mut BytesMut,
    ) -> Result<Option<PacketIdNet>, WrapError> {
        match self {
            ControlWrap::None => {
                check_plain(plain)?;
                out.extend_from_slice(plain);
                Ok(None)
            }
            ControlWrap::Auth(a) => a.wrap(plain, now_unix, out).map(Some),
            ControlWrap::Crypt(c) => c.wrap(plain, now_unix, out).map(Some),
        }
    }

    /// Authenticates (and decrypts) one wire packet, checks its replay id and appends the
    /// plaintext 2.1 packet to `out`. `now_secs` is the caller's monotonic clock in seconds,
    /// used to expire replay-window slots. On error `out` is left as it was and the packet
    /// must be dropped silently.
    ///
    /// Returns the replay packet id the packet carried (`None` without protection).
    pub fn unwrap(
        &mut self,
        wire: &[u8],
        now_secs: u64,
        out: &mut BytesMut,
    ) -> Result<Option<PacketIdNet>, WrapError> {
        match self {
            ControlWrap::None => {
                if wire.len() < CONTROL_HEAD_LEN {
                    return Err(WrapError::Truncated {
                        len: wire.len(),
                        min: CONTROL_HEAD_LEN,
                    });
                }
                out.extend_from_slice(wire);
                Ok(None)
            }
            ControlWrap::Auth(a) => a.unwrap(wire, now_secs, out).map(Some),
            ControlWrap::Crypt(c) => c.unwrap(wire, now_secs, out).map(Some),
        }
    }
}

/// Why a control packet could not be wrapped or unwrapped. Every error of an `unwrap` means:
/// drop the packet without any answer (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WrapError {
    /// The wire packet is shorter than its protection's fixed fields.
    #[error("control packet of {len} bytes is shorter than the minimum {min}")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes needed at least.
        min: usize,
    },
    /// The HMAC (tls-auth) or tag (tls-crypt) does not match: wrong key, wrong key direction,
    /// or a forged or corrupted packet. OpenVPN logs "packet authentication failed" and drops it.
    #[error("control packet authentication failed")]
    AuthenticationFailed,
    /// The packet authenticated but its replay packet id was refused.
    #[error("control packet replay check failed")]
    Replay(#[source] ReplayError),
    /// Local misuse: the plaintext given to `wrap` lacks the opcode byte and session id.
    #[error(
        "plaintext control packet of {len} bytes is shorter than opcode and session id ({min})"
    )]
    PlaintextTooShort {
        /// Bytes given.
        len: usize,
        /// Bytes needed at least.
        min: usize,
    },
    /// The send packet id reached `0xffffffff` within one second of the current `net_time`, so
    /// it can neither grow nor roll over (OpenVPN refuses to send then, too).
    #[error("control packet id space exhausted")]
    PacketIdExhausted,
}

/// A long-form replay packet id as carried by tls-auth and tls-crypt packets
/// (`struct packet_id_net`): `id(4) || net_time(4)`, big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketIdNet {
    /// The per-direction counter, 1 for the first packet.
    pub id: u32,
    /// The sender's wall-clock seconds when it sent its first packet.
    pub time: u32,
}

impl PacketIdNet {
    /// The 8 wire bytes.
    pub fn to_bytes(self) -> [u8; PACKET_ID_LONG_LEN] {
        let mut b = [0u8; PACKET_ID_LONG_LEN];
        b[..4].copy_from_slice(&self.id.to_be_bytes());
        b[4..].copy_from_slice(&self.time.to_be_bytes());
        b
    }

    /// Reads the 8 wire bytes.
    pub fn from_bytes(b: [u8; PACKET_ID_LONG_LEN]) -> PacketIdNet {
        let [a0, a1, a2, a3, t0, t1, t2, t3] = b;
        PacketIdNet {
            id: u32::from_be_bytes([a0, a1, a2, a3]),
            time: u32::from_be_bytes([t0, t1, t2, t3]),
        }
    }
}

/// The send side of a long-form packet id (`struct packet_id_send`).
#[derive(Debug, Clone, Default)]
struct PacketIdSend {
    /// The id of the last packet sent (0 before the first).
    id: u32,
    /// `net_time`, set by the first packet.
    time: Option<u32>,
}

impl PacketIdSend {
    /// The id for the next packet (`packet_id_send_update`, long form): the counter grows by
    /// one; at `u32::MAX` it may restart at 1 only with a newer time.
    fn next(&mut self, now_unix: u32) -> Result<PacketIdNet, WrapError> {
        let mut time = *self.time.get_or_insert(now_unix);
        if self.id == u32::MAX {
            if now_unix <= time {
                return Err(WrapError::PacketIdExhausted);
            }
            time = now_unix;
            self.time = Some(time);
            self.id = 0;
        }
        self.id += 1;
        Ok(PacketIdNet { id: self.id, time })
    }
}

fn check_plain(plain: &[u8]) -> Result<(), WrapError> {
    if plain.len() < CONTROL_HEAD_LEN {
        return Err(WrapError::PlaintextTooShort {
            len: plain.len(),
            min: CONTROL_HEAD_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_id_send_sequence_and_rollover() {
        let mut p = PacketIdSend::default();
        assert_eq!(p.next(100).unwrap(), PacketIdNet { id: 1, time: 100 });
        // The time stays fixed after the first packet.
        assert_eq!(p.next(200).unwrap(), PacketIdNet { id: 2, time: 100 });
        p.id = u32::MAX;
        assert_eq!(p.next(100), Err(WrapError::PacketIdExhausted));
        assert_eq!(p.next(201).unwrap(), PacketIdNet { id: 1, time: 201 });
    }

    #[test]
    fn packet_id_bytes() {
        let p = PacketIdNet {
            id: 1,
            time: 0x5f5e_1000,
        };
        assert_eq!(p.to_bytes(), [0, 0, 0, 1, 0x5f, 0x5e, 0x10, 0]);
        assert_eq!(PacketIdNet::from_bytes(p.to_bytes()), p);
    }

    #[test]
    fn none_passes_through() {
        let mut w = ControlWrap::None;
        let mut out = BytesMut::new();
        assert_eq!(w.wrap(&[0x38; 9], 0, &mut out), Ok(None));
        assert_eq!(&out[..], &[0x38; 9]);
        assert!(matches!(
            w.wrap(&[0x38; 8], 0, &mut out),
            Err(WrapError::PlaintextTooShort { len: 8, min: 9 })
        ));
        let mut back = BytesMut::new();
        assert_eq!(w.unwrap(&out, 0, &mut back), Ok(None));
        assert_eq!(back, out);
        assert_eq!(
            w.unwrap(&out[..8], 0, &mut back),
            Err(WrapError::Truncated { len: 8, min: 9 })
        );
        assert_eq!((w.overhead(), w.min_wire_len()), (0, 9));
    }
}
