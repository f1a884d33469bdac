//! Newtypes for the identifiers on the wire.

use std::fmt;

/// The 8-byte session id each side of a control-channel session picks (`struct session_id`).
/// All zeros means "undefined" and is never valid on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SessionId(pub [u8; 8]);

impl SessionId {
    /// Wire size.
    pub const LEN: usize = 8;

    /// Whether this is the all-zero "undefined" id.
    pub fn is_undefined(&self) -> bool {
        self.0 == [0; 8]
    }

    /// A random, defined session id (redrawn while all zero, as upstream does).
    pub fn random<R: rand_core::RngCore + rand_core::CryptoRng>(rng: &mut R) -> SessionId {
        loop {
            let mut id = [0u8; 8];
            rng.fill_bytes(&mut id);
            if id != [0; 8] {
                return SessionId(id);
            }
        }
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The 3-bit key id in the low bits of the opcode byte: which key generation a packet belongs
/// to (0 for the first key of a session, then 1..=7 cycling, never 0 again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct KeyId(u8);

impl KeyId {
    /// `KEY_ID_MASK`.
    pub const MASK: u8 = 0x07;

    /// A key id from its low 3 bits; `None` above 7.
    pub const fn new(id: u8) -> Option<KeyId> {
        if id <= Self::MASK {
            Some(KeyId(id))
        } else {
            None
        }
    }

    /// The key id from the low 3 bits of an opcode byte.
    pub const fn from_opcode_byte(byte: u8) -> KeyId {
        KeyId(byte & Self::MASK)
    }

    /// The numeric value, 0..=7.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The key id a soft reset moves to: 1..=7 cycling, skipping 0.
    pub const fn next(self) -> KeyId {
        if self.0 >= Self::MASK {
            KeyId(1)
        } else {
            KeyId(self.0 + 1)
        }
    }
}

/// The reliability layer's message packet id (`packet_id_type` in `reliable.c`): per key
/// generation and direction, 0 for the hard or soft reset, +1 per new control message.
/// Distinct from the tls-auth replay id and the data-channel packet id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MessageId(pub u32);

/// The 24-bit peer id of P_DATA_V2 packets, pushed by the server as `peer-id N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(u32);

impl PeerId {
    /// `MAX_PEER_ID`: the largest value, also meaning "undefined".
    pub const UNDEFINED: PeerId = PeerId(0x00ff_ffff);

    /// A peer id; `None` if it does not fit in 24 bits.
    pub const fn new(id: u32) -> Option<PeerId> {
        if id <= 0x00ff_ffff {
            Some(PeerId(id))
        } else {
            None
        }
    }

    /// The numeric value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_cycles_without_zero() {
        let mut k = KeyId::default();
        let seq: Vec<u8> = (0..9)
            .map(|_| {
                k = k.next();
                k.get()
            })
            .collect();
        assert_eq!(seq, [1, 2, 3, 4, 5, 6, 7, 1, 2]);
        assert_eq!(KeyId::new(8), None);
        assert_eq!(KeyId::from_opcode_byte(0x49).get(), 1);
    }

    #[test]
    fn peer_id_range() {
        assert!(PeerId::new(0x0100_0000).is_none());
        assert_eq!(PeerId::new(5).map(PeerId::get), Some(5));
    }

    #[test]
    fn session_id_display() {
        let s = SessionId([1, 2, 3, 4, 5, 6, 7, 0xab]);
        assert_eq!(s.to_string(), "01020304050607ab");
        assert!(SessionId::default().is_undefined());
    }
}
