//! The first byte of every packet: `opcode << 3 | key_id`.
//!
//! ```text
//!   7   6   5   4   3   2   1   0
//! +---+---+---+---+---+---+---+---+
//! |      opcode (5 bits)  | key_id|
//! +---+---+---+---+---+---+---+---+
//! ```

use crate::ids::KeyId;

/// `P_OPCODE_SHIFT`: the opcode sits above the 3 key-id bits.
pub const P_OPCODE_SHIFT: u8 = 3;

/// The packet opcodes of OpenVPN 2.6 (`P_*` in `ssl_pkt.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// `P_CONTROL_HARD_RESET_CLIENT_V1` (key-method 1; refused by 2.6).
    ControlHardResetClientV1 = 1,
    /// `P_CONTROL_HARD_RESET_SERVER_V1` (key-method 1; refused by 2.6).
    ControlHardResetServerV1 = 2,
    /// `P_CONTROL_SOFT_RESET_V1`: start renegotiating a new key id.
    ControlSoftResetV1 = 3,
    /// `P_CONTROL_V1`: carries TLS ciphertext.
    ControlV1 = 4,
    /// `P_ACK_V1`: acknowledgements only.
    AckV1 = 5,
    /// `P_DATA_V1`: data packet with a 1-byte header.
    DataV1 = 6,
    /// `P_CONTROL_HARD_RESET_CLIENT_V2`: a client's first packet (key-method 2).
    ControlHardResetClientV2 = 7,
    /// `P_CONTROL_HARD_RESET_SERVER_V2`: the server's reply to a client hard reset.
    ControlHardResetServerV2 = 8,
    /// `P_DATA_V2`: data packet with a 4-byte header carrying a 24-bit peer id.
    DataV2 = 9,
    /// `P_CONTROL_HARD_RESET_CLIENT_V3`: hard reset with a tls-crypt-v2 wrapped client key.
    ControlHardResetClientV3 = 10,
    /// `P_CONTROL_WKC_V1`: P_CONTROL_V1 with a tls-crypt-v2 wrapped client key.
    ControlWkcV1 = 11,
}

/// `P_CONTROL_HARD_RESET_CLIENT_V1`.
pub const P_CONTROL_HARD_RESET_CLIENT_V1: u8 = Opcode::ControlHardResetClientV1 as u8;
/// `P_CONTROL_HARD_RESET_SERVER_V1`.
pub const P_CONTROL_HARD_RESET_SERVER_V1: u8 = Opcode::ControlHardResetServerV1 as u8;
/// `P_CONTROL_SOFT_RESET_V1`.
pub const P_CONTROL_SOFT_RESET_V1: u8 = Opcode::ControlSoftResetV1 as u8;
/// `P_CONTROL_V1`.
pub const P_CONTROL_V1: u8 = Opcode::ControlV1 as u8;
/// `P_ACK_V1`.
pub const P_ACK_V1: u8 = Opcode::AckV1 as u8;
/// `P_DATA_V1`.
pub const P_DATA_V1: u8 = Opcode::DataV1 as u8;
/// `P_CONTROL_HARD_RESET_CLIENT_V2`.
pub const P_CONTROL_HARD_RESET_CLIENT_V2: u8 = Opcode::ControlHardResetClientV2 as u8;
/// `P_CONTROL_HARD_RESET_SERVER_V2`.
pub const P_CONTROL_HARD_RESET_SERVER_V2: u8 = Opcode::ControlHardResetServerV2 as u8;
/// `P_DATA_V2`.
pub const P_DATA_V2: u8 = Opcode::DataV2 as u8;
/// `P_CONTROL_HARD_RESET_CLIENT_V3`.
pub const P_CONTROL_HARD_RESET_CLIENT_V3: u8 = Opcode::ControlHardResetClientV3 as u8;
/// `P_CONTROL_WKC_V1`.
pub const P_CONTROL_WKC_V1: u8 = Opcode::ControlWkcV1 as u8;

/// An opcode value that OpenVPN 2.6 does not define.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown opcode {0}")]
pub struct UnknownOpcode(pub u8);

impl Opcode {
    /// Splits an opcode byte into opcode and key id.
    pub fn split_byte(byte: u8) -> Result<(Opcode, KeyId), UnknownOpcode> {
        let op = Opcode::try_from(byte >> P_OPCODE_SHIFT)?;
        Ok((op, KeyId::from_opcode_byte(byte)))
    }

    /// The wire byte for this opcode and key id.
    pub const fn byte(self, key_id: KeyId) -> u8 {
        (self as u8) << P_OPCODE_SHIFT | key_id.get()
    }

    /// Whether this is a data-channel opcode (P_DATA_V1 / P_DATA_V2).
    pub const fn is_data(self) -> bool {
        matches!(self, Opcode::DataV1 | Opcode::DataV2)
    }

    /// Whether this opcode starts a reliability sequence (carries message id 0 of a key
    /// generation): the hard and soft resets.
    pub const fn is_reset(self) -> bool {
        matches!(
            self,
            Opcode::ControlHardResetClientV1
                | Opcode::ControlHardResetServerV1
                | Opcode::ControlHardResetClientV2
                | Opcode::ControlHardResetServerV2
                | Opcode::ControlHardResetClientV3
                | Opcode::ControlSoftResetV1
        )
    }
}

impl TryFrom<u8> for Opcode {
    type Error = UnknownOpcode;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        Ok(match value {
            1 => Opcode::ControlHardResetClientV1,
            2 => Opcode::ControlHardResetServerV1,
            3 => Opcode::ControlSoftResetV1,
            4 => Opcode::ControlV1,
            5 => Opcode::AckV1,
            6 => Opcode::DataV1,
            7 => Opcode::ControlHardResetClientV2,
            8 => Opcode::ControlHardResetServerV2,
            9 => Opcode::DataV2,
            10 => Opcode::ControlHardResetClientV3,
            11 => Opcode::ControlWkcV1,
            other => return Err(UnknownOpcode(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_examples() {
        let k0 = KeyId::default();
        let k1 = k0.next();
        assert_eq!(Opcode::ControlHardResetClientV2.byte(k0), 0x38);
        assert_eq!(Opcode::ControlHardResetServerV2.byte(k0), 0x40);
        assert_eq!(Opcode::ControlV1.byte(k0), 0x20);
        assert_eq!(Opcode::AckV1.byte(k0), 0x28);
        assert_eq!(Opcode::ControlSoftResetV1.byte(k1), 0x19);
        assert_eq!(Opcode::DataV1.byte(k0), 0x30);
        assert_eq!(Opcode::DataV2.byte(k1), 0x49);
        assert_eq!(Opcode::split_byte(0x49), Ok((Opcode::DataV2, k1)));
        assert_eq!(Opcode::split_byte(0x00), Err(UnknownOpcode(0)));
        assert_eq!(Opcode::split_byte(12 << 3), Err(UnknownOpcode(12)));
    }
}
