//! Control packets in their logical layout, before tls-auth / tls-crypt wrapping (and after
//! unwrapping). Without `tls-auth`/`tls-crypt` this is exactly the wire format.
//!
//! ```text
//!  0        1                 9           10
//! +--------+-----------------+-----------+--------------------+------------------+
//! | op|kid | own_sid (8)     | ack_count | ack_ids (4 * n)    | remote_sid (8)   |
//! +--------+-----------------+-----------+--------------------+------------------+
//!                                         n = ack_count <= 8   only if n > 0
//! +--------------------+=========================+
//! | msg_packet_id (4)  | payload (rest)          |
//! +--------------------+=========================+
//!  absent in P_ACK_V1
//! ```
//!
//! * `op|kid`: [`opcode`](crate::opcode) byte; only control opcodes are accepted here.
//! * `own_sid`: the sender's [`SessionId`], never all zero.
//! * `ack_ids`: message ids acknowledged ([`AckList`]), followed by the *receiver's* session
//!   id whenever there is at least one.
//! * `msg_packet_id`: this message's reliability sequence number ([`MessageId`]), 0 for the
//!   hard or soft reset of a key generation, then +1 per message; retransmissions reuse it.
//! * payload: TLS ciphertext for P_CONTROL_V1 / P_CONTROL_WKC_V1, early-negotiation TLVs
//!   ([`early_neg`]) for hard resets (normally empty), empty for soft resets and P_ACK_V1.
//!
//! The tls-crypt-v2 wrapped client key that follows P_CONTROL_WKC_V1 and
//! P_CONTROL_HARD_RESET_CLIENT_V3 on the wire is the wrapping layer's business; here it would
//! be part of the payload.
//!
//! Data packets (P_DATA_V1/V2) are handled by [`crate::data`].

mod ack;
pub mod early_neg;

use bytes::{BufMut, BytesMut};

pub use self::ack::{AckList, AckListFull, CONTROL_SEND_ACK_MAX, RELIABLE_ACK_SIZE};
use crate::ids::{KeyId, MessageId, SessionId};
use crate::opcode::{Opcode, UnknownOpcode};

/// Length of the part every control packet has: opcode byte, own session id, ack count.
pub const FIXED_HEADER_LEN: usize = 1 + SessionId::LEN + 1;

/// Length of one acknowledged message id on the wire.
pub const ACK_ID_LEN: usize = 4;

/// Length of the message packet id on the wire.
pub const MESSAGE_ID_LEN: usize = 4;

/// A control packet's meaning: the logical layout of the module docs, with a borrowed
/// payload.
///
/// Invariants checked by [`ControlPacket::emit`] (and guaranteed by
/// [`ControlPacket::parse`]): `remote_session_id` is present exactly when `acks` is not
/// empty; `message_id` is absent exactly for P_ACK_V1; a P_ACK_V1 has at least one ACK;
/// `session_id` is defined (not all zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ControlPacket<'a> {
    /// The opcode.
    pub opcode: ControlOpcode,
    /// The key generation this packet belongs to.
    pub key_id: KeyId,
    /// The sender's session id.
    pub session_id: SessionId,
    /// Message ids the sender acknowledges.
    pub acks: AckList,
    /// The receiver's session id, echoed when `acks` is not empty.
    pub remote_session_id: Option<SessionId>,
    /// This message's reliability id; `None` only for P_ACK_V1.
    pub message_id: Option<MessageId>,
    /// Everything after the header. For P_ACK_V1 normally empty: OpenVPN ignores bytes
    /// after an ACK packet's header, and the parser keeps them here rather than drop them.
    pub payload: &'a [u8],
}

impl<'a> ControlPacket<'a> {
    /// A reliable message (any opcode but P_ACK_V1) without ACKs. Add ACKs with
    /// [`with_acks`](Self::with_acks).
    pub const fn message(
        opcode: ControlOpcode,
        key_id: KeyId,
        session_id: SessionId,
        message_id: MessageId,
        payload: &'a [u8],
    ) -> Self {
        ControlPacket {
            opcode,
            key_id,
            session_id,
            acks: AckList::new(),
            remote_session_id: None,
            message_id: Some(message_id),
            payload,
        }
    }

    /// A P_ACK_V1 acknowledging `acks` (which must not be empty) of the peer whose session
    /// id is `remote_session_id`.
    pub const fn ack(
        key_id: KeyId,
        session_id: SessionId,
        acks: AckList,
        remote_session_id: SessionId,
    ) -> Self {
        ControlPacket {
            opcode: ControlOpcode::AckV1,
            key_id,
            session_id,
            acks,
            remote_session_id: Some(remote_session_id),
            message_id: None,
            payload: &[],
        }
    }

    /// This packet carrying `acks` for the peer whose session id is `remote_session_id`
    /// (recorded only if `acks` is not empty, as the layout requires).
    pub const fn with_acks(mut self, acks: AckList, remote_session_id: SessionId) -> Self {
        self.remote_session_id = if acks.is_empty() {
            None
        } else {
            Some(remote_session_id)
        };
        self.acks = acks;
        self
    }

    /// Parses a control packet, borrowing its payload from `bytes`.
    ///
    /// [`PacketError::Truncated`] means `bytes` ends inside the header (for a packet that was
    /// cut short); [`PacketError::Malformed`] means no number of further bytes could make
    /// it valid.
    pub fn parse(bytes: &'a [u8]) -> Result<ControlPacket<'a>, PacketError> {
        let truncated = |needed: usize| PacketError::Truncated {
            needed,
            had: bytes.len(),
        };
        let Some((&first, rest)) = bytes.split_first() else {
            return Err(truncated(FIXED_HEADER_LEN));
        };
        let (opcode, key_id) = ControlOpcode::split_byte(first)?;
        let Some((sid, rest)) = rest.split_first_chunk::<{ SessionId::LEN }>() else {
            return Err(truncated(FIXED_HEADER_LEN));
        };
        let session_id = SessionId(*sid);
        if session_id.is_undefined() {
            return Err(Malformed::UndefinedSessionId.into());
        }
        let Some((&ack_count, mut rest)) = rest.split_first() else {
            return Err(truncated(FIXED_HEADER_LEN));
        };
        let n = usize::from(ack_count);
        if n > RELIABLE_ACK_SIZE {
            return Err(Malformed::TooManyAcks { count: ack_count }.into());
        }
        if n == 0 && opcode == ControlOpcode::AckV1 {
            return Err(Malformed::EmptyAck.into());
        }
        let needed = header_len(opcode, n);
        if bytes.len() < needed {
            return Err(truncated(needed));
        }

        // All reads below are within `needed`; the `else` branches cannot be taken.
        let mut acks = AckList::new();
        for _ in 0..n {
            let Some((id, r)) = rest.split_first_chunk::<ACK_ID_LEN>() else {
                return Err(truncated(needed));
            };
            rest = r;
            acks.push(MessageId(u32::from_be_bytes(*id)))
                .map_err(|AckListFull| Malformed::TooManyAcks { count: ack_count })?;
        }
        let remote_session_id = if n > 0 {
            let Some((sid, r)) = rest.split_first_chunk::<{ SessionId::LEN }>() else {
                return Err(truncated(needed));
            };
            rest = r;
            Some(SessionId(*sid))
        } else {
            None
        };
        let message_id = if opcode.has_message_id() {
            let Some((id, r)) = rest.split_first_chunk::<MESSAGE_ID_LEN>() else {
                return Err(truncated(needed));
            };
            rest = r;
            Some(MessageId(u32::from_be_bytes(*id)))
        } else {
            None
        };
        Ok(ControlPacket {
            opcode,
            key_id,
            session_id,
            acks,
            remote_session_id,
            message_id,
            payload: rest,
        })
    }

    /// Checks the invariants listed on [`ControlPacket`].
    pub fn validate(&self) -> Result<(), Malformed> {
        if self.session_id.is_undefined() {
            return Err(Malformed::UndefinedSessionId);
        }
        match (self.acks.is_empty(), self.remote_session_id.is_some()) {
            (false, false) => {
                return Err(Malformed::MissingRemoteSessionId {
                    ack_count: self.acks.len(),
                })
            }
            (true, true) => return Err(Malformed::UnexpectedRemoteSessionId),
            _ => {}
        }
        match (self.opcode.has_message_id(), self.message_id.is_some()) {
            (true, false) => {
                return Err(Malformed::MissingMessageId {
                    opcode: self.opcode,
                })
            }
            (false, true) => return Err(Malformed::UnexpectedMessageId),
            _ => {}
        }
        if self.opcode == ControlOpcode::AckV1 && self.acks.is_empty() {
            return Err(Malformed::EmptyAck);
        }
        Ok(())
    }

    /// Length of the header (everything but the payload).
    pub fn header_len(&self) -> usize {
        header_len(self.opcode, self.acks.len())
    }

    /// Length of the emitted packet.
    pub fn emitted_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Appends the packet to `dst`; writes nothing if it breaks an invariant (see
    /// [`validate`](Self::validate)).
    pub fn emit(&self, dst: &mut BytesMut) -> Result<(), Malformed> {
        self.validate()?;
        dst.reserve(self.emitted_len());
        dst.put_u8(self.opcode.opcode().byte(self.key_id));
        dst.put_slice(&self.session_id.0);
        // At most RELIABLE_ACK_SIZE (8), so the cast cannot truncate.
        dst.put_u8(self.acks.len() as u8);
        for id in &self.acks {
            dst.put_u32(id.0);
        }
        if let Some(remote) = self.remote_session_id {
            dst.put_slice(&remote.0);
        }
        if let Some(id) = self.message_id {
            dst.put_u32(id.0);
        }
        dst.put_slice(self.payload);
        Ok(())
    }
}

/// Header length of a packet with this opcode and number of ACKs.
fn header_len(opcode: ControlOpcode, ack_count: usize) -> usize {
    let acks = if ack_count > 0 {
        ack_count * ACK_ID_LEN + SessionId::LEN
    } else {
        0
    };
    let message_id = if opcode.has_message_id() {
        MESSAGE_ID_LEN
    } else {
        0
    };
    FIXED_HEADER_LEN + acks + message_id
}

/// The opcodes of the control channel: [`Opcode`] without the data opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlOpcode {
    /// `P_CONTROL_HARD_RESET_CLIENT_V1` (key-method 1, refused by OpenVPN 2.6).
    HardResetClientV1,
    /// `P_CONTROL_HARD_RESET_SERVER_V1` (key-method 1, refused by OpenVPN 2.6).
    HardResetServerV1,
    /// `P_CONTROL_SOFT_RESET_V1`.
    SoftResetV1,
    /// `P_CONTROL_V1`.
    ControlV1,
    /// `P_ACK_V1`.
    AckV1,
    /// `P_CONTROL_HARD_RESET_CLIENT_V2`.
    HardResetClientV2,
    /// `P_CONTROL_HARD_RESET_SERVER_V2`.
    HardResetServerV2,
    /// `P_CONTROL_HARD_RESET_CLIENT_V3`.
    HardResetClientV3,
    /// `P_CONTROL_WKC_V1`.
    WkcV1,
}

impl ControlOpcode {
    /// Every control opcode, in opcode order.
    pub const ALL: [ControlOpcode; 9] = [
        ControlOpcode::HardResetClientV1,
        ControlOpcode::HardResetServerV1,
        ControlOpcode::SoftResetV1,
        ControlOpcode::ControlV1,
        ControlOpcode::AckV1,
        ControlOpcode::HardResetClientV2,
        ControlOpcode::HardResetServerV2,
        ControlOpcode::HardResetClientV3,
        ControlOpcode::WkcV1,
    ];

    /// The general opcode.
    pub const fn opcode(self) -> Opcode {
        match self {
            ControlOpcode::HardResetClientV1 => Opcode::ControlHardResetClientV1,
            ControlOpcode::HardResetServerV1 => Opcode::ControlHardResetServerV1,
            ControlOpcode::SoftResetV1 => Opcode::ControlSoftResetV1,
            ControlOpcode::ControlV1 => Opcode::ControlV1,
            ControlOpcode::AckV1 => Opcode::AckV1,
            ControlOpcode::HardResetClientV2 => Opcode::ControlHardResetClientV2,
            ControlOpcode::HardResetServerV2 => Opcode::ControlHardResetServerV2,
            ControlOpcode::HardResetClientV3 => Opcode::ControlHardResetClientV3,
            ControlOpcode::WkcV1 => Opcode::ControlWkcV1,
        }
    }

    /// The control opcode for `opcode`; `None` for a data opcode.
    pub const fn from_opcode(opcode: Opcode) -> Option<ControlOpcode> {
        Some(match opcode {
            Opcode::ControlHardResetClientV1 => ControlOpcode::HardResetClientV1,
            Opcode::ControlHardResetServerV1 => ControlOpcode::HardResetServerV1,
            Opcode::ControlSoftResetV1 => ControlOpcode::SoftResetV1,
            Opcode::ControlV1 => ControlOpcode::ControlV1,
            Opcode::AckV1 => ControlOpcode::AckV1,
            Opcode::ControlHardResetClientV2 => ControlOpcode::HardResetClientV2,
            Opcode::ControlHardResetServerV2 => ControlOpcode::HardResetServerV2,
            Opcode::ControlHardResetClientV3 => ControlOpcode::HardResetClientV3,
            Opcode::ControlWkcV1 => ControlOpcode::WkcV1,
            Opcode::DataV1 | Opcode::DataV2 => return None,
        })
    }

    /// Splits an opcode byte into control opcode and key id.
    pub fn split_byte(byte: u8) -> Result<(ControlOpcode, KeyId), Malformed> {
        let (opcode, key_id) = Opcode::split_byte(byte)
            .map_err(|UnknownOpcode(opcode)| Malformed::UnknownOpcode { opcode })?;
        let control = ControlOpcode::from_opcode(opcode).ok_or(Malformed::DataOpcode { opcode })?;
        Ok((control, key_id))
    }

    /// Whether packets with this opcode carry a message packet id (all but P_ACK_V1).
    pub const fn has_message_id(self) -> bool {
        !matches!(self, ControlOpcode::AckV1)
    }

    /// Whether this is one of the hard resets (client V1/V2/V3, server V1/V2), whose
    /// payload may hold early-negotiation TLVs.
    pub const fn is_hard_reset(self) -> bool {
        matches!(
            self,
            ControlOpcode::HardResetClientV1
                | ControlOpcode::HardResetServerV1
                | ControlOpcode::HardResetClientV2
                | ControlOpcode::HardResetServerV2
                | ControlOpcode::HardResetClientV3
        )
    }
}

impl From<ControlOpcode> for Opcode {
    fn from(op: ControlOpcode) -> Opcode {
        op.opcode()
    }
}

impl TryFrom<Opcode> for ControlOpcode {
    type Error = Malformed;

    fn try_from(opcode: Opcode) -> Result<Self, Malformed> {
        ControlOpcode::from_opcode(opcode).ok_or(Malformed::DataOpcode { opcode })
    }
}

/// Why a control packet could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// The bytes end inside the header.
    #[error("control packet truncated: header needs {needed} bytes, have {had}")]
    Truncated {
        /// Bytes needed for the header as far as it could be read (at least
        /// [`FIXED_HEADER_LEN`]).
        needed: usize,
        /// Bytes available.
        had: usize,
    },
    /// The packet can never be valid.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl PacketError {
    /// Whether the packet was cut short (as opposed to malformed).
    pub const fn is_truncated(&self) -> bool {
        matches!(self, PacketError::Truncated { .. })
    }
}

/// A control packet that breaks the format: the peer misbehaves (when parsing) or the caller
/// built an invalid packet (when emitting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// The opcode is not one OpenVPN 2.6 defines.
    #[error("control packet has unknown opcode {opcode}")]
    UnknownOpcode {
        /// The 5-bit opcode value.
        opcode: u8,
    },
    /// A data opcode where a control packet was expected.
    #[error("data opcode {opcode:?} is not a control packet")]
    DataOpcode {
        /// The data opcode.
        opcode: Opcode,
    },
    /// More ACKs than `RELIABLE_ACK_SIZE`.
    #[error("control packet carries {count} ACKs, more than {RELIABLE_ACK_SIZE}")]
    TooManyAcks {
        /// The announced ACK count.
        count: u8,
    },
    /// A P_ACK_V1 without any ACK.
    #[error("P_ACK_V1 without ACKs")]
    EmptyAck,
    /// The sender's session id is all zero ("undefined").
    #[error("control packet has an undefined (all-zero) session id")]
    UndefinedSessionId,
    /// ACKs without the remote session id that must follow them (emit only).
    #[error("{ack_count} ACKs without a remote session id")]
    MissingRemoteSessionId {
        /// Number of ACKs.
        ack_count: usize,
    },
    /// A remote session id without ACKs: the layout has no place for it (emit only).
    #[error("remote session id without ACKs")]
    UnexpectedRemoteSessionId,
    /// A reliable message without its message id (emit only).
    #[error("{opcode:?} without a message id")]
    MissingMessageId {
        /// The opcode.
        opcode: ControlOpcode,
    },
    /// A P_ACK_V1 with a message id (emit only).
    #[error("P_ACK_V1 with a message id")]
    UnexpectedMessageId,
}

#[cfg(test)]
mod tests;
