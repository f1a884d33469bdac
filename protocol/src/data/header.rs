//! P_DATA_V1 / P_DATA_V2 headers (reference 8.1).
//!
//! ```text
//! P_DATA_V1:  +---------------+
//!             | 0x30 | key_id |                                   1 byte
//!             +---------------+
//! P_DATA_V2:  +---------------+-----------------------------+
//!             | 0x48 | key_id | peer_id (u24, big-endian)   |      4 bytes
//!             +---------------+-----------------------------+
//! ```

use super::DataError;
use crate::ids::{KeyId, PeerId};
use crate::opcode::Opcode;

/// The header of a data packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataHeader {
    /// `P_DATA_V1`: opcode and key id only.
    V1 {
        /// Key generation the packet belongs to.
        key_id: KeyId,
    },
    /// `P_DATA_V2`: opcode, key id and the peer id the server pushed (`peer-id N`).
    V2 {
        /// Key generation the packet belongs to.
        key_id: KeyId,
        /// The client's peer id ([`PeerId::UNDEFINED`] if none).
        peer_id: PeerId,
    },
}

impl DataHeader {
    /// Length of a P_DATA_V1 header.
    pub const V1_LEN: usize = 1;
    /// Length of a P_DATA_V2 header.
    pub const V2_LEN: usize = 4;

    /// The header a sender uses: P_DATA_V2 when a peer id was pushed, P_DATA_V1 otherwise.
    pub const fn new(key_id: KeyId, peer_id: Option<PeerId>) -> DataHeader {
        match peer_id {
            Some(peer_id) => DataHeader::V2 { key_id, peer_id },
            None => DataHeader::V1 { key_id },
        }
    }

    /// Parses the header at the start of a data packet. Errors: the opcode is not a data
    /// opcode ([`DataError::NotData`]), or a P_DATA_V2 packet is shorter than its header
    /// ([`DataError::BadLength`]; a TCP frame always holds a whole packet, so this is malformed).
    pub fn parse(packet: &[u8]) -> Result<DataHeader, DataError> {
        let Some(&byte) = packet.first() else {
            return Err(DataError::BadLength {
                len: 0,
                min: Self::V1_LEN,
            });
        };
        match Opcode::split_byte(byte) {
            Ok((Opcode::DataV1, key_id)) => Ok(DataHeader::V1 { key_id }),
            Ok((Opcode::DataV2, key_id)) => {
                let Some(&[_, a, b, c]) = packet.first_chunk::<4>() else {
                    return Err(DataError::BadLength {
                        len: packet.len(),
                        min: Self::V2_LEN,
                    });
                };
                let id = u32::from_be_bytes([0, a, b, c]);
                // 24 bits always fit.
                let peer_id = PeerId::new(id).unwrap_or(PeerId::UNDEFINED);
                Ok(DataHeader::V2 { key_id, peer_id })
            }
            _ => Err(DataError::NotData { byte }),
        }
    }

    /// Wire length: 1 or 4.
    pub const fn len(&self) -> usize {
        match self {
            DataHeader::V1 { .. } => Self::V1_LEN,
            DataHeader::V2 { .. } => Self::V2_LEN,
        }
    }

    /// Whether this header is empty (never: data headers are 1 or 4 bytes).
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// The key id.
    pub const fn key_id(&self) -> KeyId {
        match *self {
            DataHeader::V1 { key_id } | DataHeader::V2 { key_id, .. } => key_id,
        }
    }

    /// The peer id of a P_DATA_V2 header.
    pub const fn peer_id(&self) -> Option<PeerId> {
        match *self {
            DataHeader::V1 { .. } => None,
            DataHeader::V2 { peer_id, .. } => Some(peer_id),
        }
    }

    /// The wire bytes: `bytes()[..len()]`.
    pub const fn bytes(&self) -> [u8; 4] {
        match *self {
            DataHeader::V1 { key_id } => [Opcode::DataV1.byte(key_id), 0, 0, 0],
            DataHeader::V2 { key_id, peer_id } => {
                let [_, a, b, c] = peer_id.get().to_be_bytes();
                [Opcode::DataV2.byte(key_id), a, b, c]
            }
        }
    }

    /// Writes the header to `out[..self.len()]`.
    ///
    /// # Panics
    /// If `out` is shorter than [`DataHeader::len`].
    pub fn emit(&self, out: &mut [u8]) {
        let n = self.len();
        out[..n].copy_from_slice(&self.bytes()[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let k1 = KeyId::new(1).unwrap();
        let v2 = DataHeader::new(k1, PeerId::new(0x123456));
        assert_eq!(v2.bytes(), [0x49, 0x12, 0x34, 0x56]);
        assert_eq!(DataHeader::parse(&[0x49, 0x12, 0x34, 0x56, 9]).unwrap(), v2);
        let v1 = DataHeader::new(KeyId::new(7).unwrap(), None);
        assert_eq!(v1.bytes()[0], 0x37);
        assert_eq!(DataHeader::parse(&[0x37]).unwrap(), v1);
        assert_eq!(v1.peer_id(), None);
        assert!(matches!(
            DataHeader::parse(&[0x48, 0]),
            Err(DataError::BadLength { len: 2, min: 4 })
        ));
        assert!(matches!(
            DataHeader::parse(&[0x20, 0, 0, 0]),
            Err(DataError::NotData { byte: 0x20 })
        ));
        assert!(matches!(
            DataHeader::parse(&[]),
            Err(DataError::BadLength { .. })
        ));
        let mut out = [0u8; 4];
        v2.emit(&mut out);
        assert_eq!(out, [0x49, 0x12, 0x34, 0x56]);
    }
}
