//! OpenVPN's 256-byte two-key block (`struct key2`) and key directions.
//!
//! The same layout holds a static key file (tls-auth / tls-crypt) and the data-channel key
//! material derived by the PRF or the TLS exporter:
//!
//! ```text
//! bytes   0.. 63   key[0].cipher        bytes 128..191   key[1].cipher
//! bytes  64..127   key[0].hmac          bytes 192..255   key[1].hmac
//! ```
//!
//! An algorithm uses a prefix of its 64-byte slot (AES-256 32 bytes, SHA1 20 bytes, ...).

/// Size of one slot (cipher or HMAC) of a [`Key`].
pub const KEY_SLOT_LEN: usize = 64;
/// Size of a [`Key2`] block.
pub const KEY2_LEN: usize = 4 * KEY_SLOT_LEN;

/// One direction's key: a cipher slot and an HMAC slot (`struct key`).
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    /// Cipher key slot; a cipher uses its first `key_len` bytes.
    pub cipher: [u8; KEY_SLOT_LEN],
    /// HMAC key slot; an HMAC uses its first `digest.output_len()` bytes, an AEAD cipher takes its
    /// 8-byte implicit IV from the start of it.
    pub hmac: [u8; KEY_SLOT_LEN],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// The two-key block (`struct key2`): `keys[0]` and `keys[1]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Key2 {
    /// `key[0]` and `key[1]`.
    pub keys: [Key; 2],
}

impl std::fmt::Debug for Key2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key2(..)")
    }
}

impl Key2 {
    /// Splits 256 bytes into the two keys.
    pub fn from_bytes(bytes: &[u8; KEY2_LEN]) -> Key2 {
        let slot = |i: usize| -> [u8; KEY_SLOT_LEN] {
            let mut s = [0u8; KEY_SLOT_LEN];
            s.copy_from_slice(&bytes[i * KEY_SLOT_LEN..(i + 1) * KEY_SLOT_LEN]);
            s
        };
        Key2 {
            keys: [
                Key {
                    cipher: slot(0),
                    hmac: slot(1),
                },
                Key {
                    cipher: slot(2),
                    hmac: slot(3),
                },
            ],
        }
    }

    /// The 256 bytes in file order.
    pub fn to_bytes(&self) -> [u8; KEY2_LEN] {
        let mut out = [0u8; KEY2_LEN];
        for (i, key) in self.keys.iter().enumerate() {
            let base = i * 2 * KEY_SLOT_LEN;
            out[base..base + KEY_SLOT_LEN].copy_from_slice(&key.cipher);
            out[base + KEY_SLOT_LEN..base + 2 * KEY_SLOT_LEN].copy_from_slice(&key.hmac);
        }
        out
    }

    /// The (send, receive) keys for a direction.
    pub fn split(&self, direction: KeyDirection) -> (&Key, &Key) {
        let [k0, k1] = &self.keys;
        match direction {
            KeyDirection::Normal => (k0, k1),
            KeyDirection::Inverse => (k1, k0),
            KeyDirection::Bidirectional => (k0, k0),
        }
    }
}

/// Which key of a [`Key2`] each side sends with (`key-direction`, `KEY_DIRECTION_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyDirection {
    /// Direction `0`: send with `key[0]`, receive with `key[1]`. A tls-auth server; the
    /// data-channel keys of the TLS client.
    Normal,
    /// Direction `1`: send with `key[1]`, receive with `key[0]`. A tls-auth client; the
    /// data-channel keys of the TLS server.
    Inverse,
    /// No direction given: both ways use `key[0]`.
    Bidirectional,
}

impl KeyDirection {
    /// Parses the `key-direction` / `tls-auth FILE N` argument (`0` or `1`).
    pub fn from_arg(arg: &str) -> Option<KeyDirection> {
        match arg {
            "0" => Some(KeyDirection::Normal),
            "1" => Some(KeyDirection::Inverse),
            _ => None,
        }
    }
}

/// Which end of the control channel a peer is: the TLS client (the OpenVPN client) or the TLS
/// server. Fixes the key directions that have no `key-direction` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The TLS client.
    Client,
    /// The TLS server.
    Server,
}

impl Role {
    /// Data-channel key direction: `key[0]` carries client-to-server traffic, so the client
    /// sends with it (normal) and the server receives with it (inverse).
    pub const fn data_direction(self) -> KeyDirection {
        match self {
            Role::Client => KeyDirection::Normal,
            Role::Server => KeyDirection::Inverse,
        }
    }

    /// tls-crypt (v1) key direction: the server behaves as direction 0, the client as 1.
    pub const fn tls_crypt_direction(self) -> KeyDirection {
        match self {
            Role::Client => KeyDirection::Inverse,
            Role::Server => KeyDirection::Normal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting() -> [u8; KEY2_LEN] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn layout_and_round_trip() {
        let bytes = counting();
        let k = Key2::from_bytes(&bytes);
        assert_eq!(k.keys[0].cipher[0], 0);
        assert_eq!(k.keys[0].hmac[0], 64);
        assert_eq!(k.keys[1].cipher[0], 128);
        assert_eq!(k.keys[1].hmac[0], 192);
        assert_eq!(k.to_bytes(), bytes);
    }

    #[test]
    fn directions() {
        let k = Key2::from_bytes(&counting());
        let (s, r) = k.split(KeyDirection::Inverse);
        assert_eq!((s.hmac[0], r.hmac[0]), (192, 64));
        let (s, r) = k.split(KeyDirection::Normal);
        assert_eq!((s.hmac[0], r.hmac[0]), (64, 192));
        let (s, r) = k.split(KeyDirection::Bidirectional);
        assert_eq!((s.hmac[0], r.hmac[0]), (64, 64));
        assert_eq!(KeyDirection::from_arg("2"), None);
    }
}
