//! The control packets of one session object (one TCP connection): session ids, the wrapping
//! contexts, the checks every received control packet must pass before any key state sees
//! it, and the framing of outgoing packets.
//!
//! ```text
//!   wire packet ──unwrap──► plaintext ──parse──► checks ──► ReceivedControl (owned)
//!   Transmit / AckList ──emit──► plaintext ──wrap──► length prefix + wire packet (appended)
//! ```
//!
//! Checks on receive (reference 1.3, 2.4, 4.6): the packet must authenticate with the
//! context of its key id; a hard reset must come from the other role; the sender's session id
//! must stay the same for the whole connection; a packet carrying ACKs must name our session
//! id as the remote one. Whatever fails is dropped without an answer and reported as a
//! [`LinkError`] for the caller to count.

use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};

use crate::framing::LENGTH_PREFIX_LEN;
use crate::ids::{KeyId, MessageId, SessionId};
use crate::key::Role;
use crate::packet::{AckList, ControlOpcode, ControlPacket, Malformed, PacketError};
use crate::reliable::Transmit;
use crate::wrap::{ControlWrap, WrapError};

/// A received control packet that passed every check, with an owned payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedControl {
    /// The opcode.
    pub opcode: ControlOpcode,
    /// The key generation.
    pub key_id: KeyId,
    /// The peer's session id.
    pub peer_session_id: SessionId,
    /// What the peer acknowledges.
    pub acks: AckList,
    /// The message id, absent for P_ACK_V1.
    pub message_id: Option<MessageId>,
    /// TLS ciphertext, reset TLVs, or empty.
    pub payload: Bytes,
}

/// Why a received control packet was dropped, or an outgoing one could not be built. Every
/// receive-side variant means "drop silently and count"; none is answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Authentication, decryption or replay check failed.
    #[error("control packet refused by its protection")]
    Unwrap(#[source] WrapError),
    /// Not a well-formed control packet.
    #[error("malformed control packet")]
    Parse(#[source] PacketError),
    /// A hard reset of our own role (a client receiving a client reset), or of key-method 1.
    #[error("{opcode:?} is not acceptable for a {role:?}")]
    UnexpectedOpcode {
        /// The opcode received.
        opcode: ControlOpcode,
        /// Our role.
        role: Role,
    },
    /// The sender's session id differs from the one this connection started with.
    #[error("packet from session {got}, expected {expected}")]
    WrongPeerSession {
        /// What the packet carried.
        got: SessionId,
        /// The peer's session id of this connection.
        expected: SessionId,
    },
    /// The packet acknowledges something but names another remote session id than ours.
    #[error("packet acknowledges for session {got:?}, ours is {ours}")]
    WrongRemoteSession {
        /// What the packet carried.
        got: Option<SessionId>,
        /// Our session id.
        ours: SessionId,
    },
    /// A queued message's tag is not a control opcode (a bug of ours).
    #[error("queued message tag {tag} is not a control opcode")]
    BadTag {
        /// The tag.
        tag: u8,
    },
    /// An outgoing packet could not be written (an invariant of ours broke).
    #[error("could not build an outgoing control packet")]
    Build(#[source] Malformed),
    /// An outgoing packet could not be wrapped (packet id exhausted).
    #[error("could not wrap an outgoing control packet")]
    Wrap(#[source] WrapError),
}

/// Control packets in and out of one session object. See the [module docs](self).
#[derive(Debug)]
pub struct ControlLink {
    role: Role,
    own_sid: SessionId,
    peer_sid: Option<SessionId>,
    /// Key id 0, and every key id unless `renegotiation` is set.
    wrap: ControlWrap,
    /// Dynamic tls-crypt for key ids above 0, once negotiated.
    renegotiation: Option<ControlWrap>,
    epoch: Instant,
    scratch: BytesMut,
}

impl ControlLink {
    /// A link for our `role` with our session id and the configured protection. `epoch` is
    /// the instant the monotonic seconds of replay checks count from.
    pub fn new(role: Role, own_sid: SessionId, wrap: ControlWrap, epoch: Instant) -> ControlLink {
        ControlLink {
            role,
            own_sid,
            peer_sid: None,
            wrap,
            renegotiation: None,
            epoch,
            scratch: BytesMut::with_capacity(2048),
        }
    }

    /// Our session id.
    pub fn own_session_id(&self) -> SessionId {
        self.own_sid
    }

    /// The peer's session id, once its first packet arrived.
    pub fn peer_session_id(&self) -> Option<SessionId> {
        self.peer_sid
    }

    /// Bytes the protection adds to every packet.
    pub fn wrap_overhead(&self) -> usize {
        self.wrap.overhead()
    }

    /// From now on, key ids above 0 use `wrap` (dynamic tls-crypt, reference 12.4).
    pub fn set_renegotiation_wrap(&mut self, wrap: ControlWrap) {
        self.renegotiation = Some(wrap);
    }

    fn context(&mut self, key_id: KeyId) -> &mut ControlWrap {
        match (&mut self.renegotiation, key_id.get()) {
            (Some(dynamic), 1..) => dynamic,
            _ => &mut self.wrap,
        }
    }

    /// Unwraps, parses and checks one wire packet (without its length prefix).
    pub fn receive(&mut self, now: Instant, wire: &[u8]) -> Result<ReceivedControl, LinkError> {
        let key_id = KeyId::from_opcode_byte(wire.first().copied().unwrap_or_default());
        let now_secs = now.saturating_duration_since(self.epoch).as_secs();
        let mut plain = std::mem::take(&mut self.scratch);
        plain.clear();
        let result = self
            .context(key_id)
            .unwrap(wire, now_secs, &mut plain)
            .map_err(LinkError::Unwrap)
            .and_then(|_| self.check(&plain));
        self.scratch = plain;
        result
    }

    fn check(&mut self, plain: &[u8]) -> Result<ReceivedControl, LinkError> {
        let packet = ControlPacket::parse(plain).map_err(LinkError::Parse)?;
        let acceptable = match packet.opcode {
            ControlOpcode::HardResetClientV2 | ControlOpcode::HardResetClientV3 => {
                self.role == Role::Server
            }
            ControlOpcode::HardResetServerV2 => self.role == Role::Client,
            ControlOpcode::HardResetClientV1 | ControlOpcode::HardResetServerV1 => false,
            _ => true,
        };
        if !acceptable {
            return Err(LinkError::UnexpectedOpcode {
                opcode: packet.opcode,
                role: self.role,
            });
        }
        if let Some(expected) = self.peer_sid {
            if packet.session_id != expected {
                return Err(LinkError::WrongPeerSession {
                    got: packet.session_id,
                    expected,
                });
            }
        }
        if !packet.acks.is_empty() && packet.remote_session_id != Some(self.own_sid) {
            return Err(LinkError::WrongRemoteSession {
                got: packet.remote_session_id,
                ours: self.own_sid,
            });
        }
        self.peer_sid = Some(packet.session_id);
        Ok(ReceivedControl {
            opcode: packet.opcode,
            key_id: packet.key_id,
            peer_session_id: packet.session_id,
            acks: packet.acks,
            message_id: packet.message_id,
            payload: Bytes::copy_from_slice(packet.payload),
        })
    }

    /// Appends the framed, wrapped packet for a reliable transmission (a message with the
    /// ACKs riding along) to `out`. `tag` of the message is its opcode.
    pub fn send_message(
        &mut self,
        key_id: KeyId,
        transmit: &Transmit,
        unix_time: u32,
        out: &mut BytesMut,
    ) -> Result<(), LinkError> {
        let tag = transmit.message.tag;
        let opcode = crate::opcode::Opcode::try_from(tag)
            .ok()
            .and_then(ControlOpcode::from_opcode)
            .ok_or(LinkError::BadTag { tag })?;
        let packet = ControlPacket::message(
            opcode,
            key_id,
            self.own_sid,
            transmit.message.id,
            &transmit.message.payload,
        )
        .with_acks(transmit.acks, self.peer_sid.unwrap_or_default());
        self.send(&packet, unix_time, out)
    }

    /// Appends a framed, wrapped P_ACK_V1 for `acks` to `out`.
    pub fn send_ack(
        &mut self,
        key_id: KeyId,
        acks: AckList,
        unix_time: u32,
        out: &mut BytesMut,
    ) -> Result<(), LinkError> {
        let packet = ControlPacket::ack(
            key_id,
            self.own_sid,
            acks,
            self.peer_sid.unwrap_or_default(),
        );
        self.send(&packet, unix_time, out)
    }

    fn send(
        &mut self,
        packet: &ControlPacket<'_>,
        unix_time: u32,
        out: &mut BytesMut,
    ) -> Result<(), LinkError> {
        let mut plain = std::mem::take(&mut self.scratch);
        plain.clear();
        let result = packet
            .emit(&mut plain)
            .map_err(LinkError::Build)
            .and_then(|()| {
                let start = out.len();
                out.put_u16(0);
                let wrapped = self.context(packet.key_id).wrap(&plain, unix_time, out);
                match wrapped {
                    Ok(_) => {
                        // Control packets are far below 64 KiB (tls-mtu is at most 2048).
                        let len = u16::try_from(out.len() - start - LENGTH_PREFIX_LEN)
                            .unwrap_or(u16::MAX);
                        out[start..start + LENGTH_PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
                        Ok(())
                    }
                    Err(e) => {
                        out.truncate(start);
                        Err(LinkError::Wrap(e))
                    }
                }
            });
        self.scratch = plain;
        result
    }
}
