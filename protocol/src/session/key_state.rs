//! One key generation (key id) of a session: its reliability state, its TLS session, the
//! key-method-2 exchange and, once that is done, its data key (OpenVPN's `key_state`).
//!
//! ```text
//!            own reset ACKed            both key-method-2 messages exchanged
//!  PreStart ───────────────► Handshake ────────────────────────────────────► Established
//!  (S_PRE_START)             (S_START: TLS runs;          (S_GOT_KEY: TLS carries text control
//!                             client wrote its km2,        messages; the session installs the
//!                             server answers the client's)  data key when it knows the cipher)
//! ```
//!
//! Any TLS or key-method-2 failure makes the key state unusable; the session then ends.
//!
//! The TLS client is always the OpenVPN client, whoever started the key exchange (reference
//! 12.3). The key-method-2 message this side writes is built by the session (fresh randoms
//! per key id) and handed over at creation: a client writes it as soon as TLS starts (OpenSSL
//! sends it right after the handshake), a server after it read the client's.
//!
//! Received messages stay in the reliability layer's receive window until TLS exists, so a
//! TLS record that overtakes the ACK of our reset is not lost.
//!
//! A server's key id 0 is the one key state that does not open with its reset: it answers
//! the client's hard reset (reference 0, 4.5), so its HARD_RESET_SERVER_V2 is queued only
//! when that arrives and carries the ACK for it. Sent earlier, the client would see a server
//! reset that leaves its own unacknowledged; a 2.6 client then re-sends its reset at once
//! (`reliable_schedule_now` on the first packet of the peer) and, if our separate ACK is
//! already in its TCP buffer, can put that re-send on the wire after the ACK freed its
//! buffer, with a message id that no longer matches the HMAC.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use openssl::ssl::SslContextRef;
use openssl::x509::X509;

use crate::control_msg::{split_messages, ControlMessage, ControlMsgError};
use crate::data::DataKey;
use crate::ids::{KeyId, SessionId};
use crate::kdf::{self, EXPORT_KEY_DATA_LABEL};
use crate::key::{Key2, Role};
use crate::km2::{ClientKeyMethod2, KeySource, Km2Error, ServerKeyMethod2};
use crate::opcode::Opcode;
use crate::packet::ControlOpcode;
use crate::reliable::{PayloadLimits, Reliable};
use crate::tls::{PeerVerifier, TlsError, TlsSession};

use super::link::{ControlLink, LinkError, ReceivedControl};

/// What the key state learned from one received packet.
#[derive(Debug)]
pub(crate) enum KeyEvent {
    /// Both key-method-2 messages are exchanged; this is the peer's.
    KeyExchanged(PeerKm2),
    /// A text control message from the peer.
    Message(ControlMessage),
    /// A text control message from the peer that is dropped (see [`split_messages`]).
    Dropped(ControlMsgError),
}

/// The peer's key-method-2 message.
#[derive(Debug, Clone)]
pub(crate) enum PeerKm2 {
    /// Received by a server.
    Client(ClientKeyMethod2),
    /// Received by a client.
    Server(ServerKeyMethod2),
}

/// Why a key state failed; the session ends.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyStateError {
    #[error("TLS failed")]
    Tls(#[source] TlsError),
    #[error("bad key-method-2 message")]
    Km2(#[source] Km2Error),
}

enum Phase {
    /// Our reset is not acknowledged yet.
    PreStart,
    /// TLS runs; we wait for the peer's key-method-2 message.
    Handshake { tls: TlsSession },
    /// Both key-method-2 messages exchanged.
    Established { tls: TlsSession, peer: Box<PeerKm2> },
    /// TLS or key method 2 failed.
    Failed,
}

/// One key generation. See the [module docs](self).
pub(crate) struct KeyState {
    key_id: KeyId,
    role: Role,
    reliable: Reliable,
    phase: Phase,
    /// TLS ciphertext not yet cut into control messages.
    stream: BytesMut,
    /// Our key-method-2 randoms.
    local: KeySource,
    /// Our key-method-2 message, until written into TLS.
    local_km2: Option<Bytes>,
    /// Our reset while it waits for the peer's (a server's key id 0 answers the client's
    /// hard reset); `None` once queued.
    reset: Option<ControlOpcode>,
    /// Plaintext received before the peer's key-method-2 message was complete.
    km2_buf: BytesMut,
    data: Option<DataKey>,
    /// Bytes and packets of data through this key (for `reneg-bytes` / `reneg-pkts`).
    bytes: u64,
    packets: u64,
}

impl std::fmt::Debug for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match &self.phase {
            Phase::PreStart => "PreStart",
            Phase::Handshake { .. } => "Handshake",
            Phase::Established { .. } => "Established",
            Phase::Failed => "Failed",
        };
        f.debug_struct("KeyState")
            .field("key_id", &self.key_id)
            .field("phase", &phase)
            .field("data", &self.data.is_some())
            .finish_non_exhaustive()
    }
}

impl KeyState {
    /// A new key state whose reset (hard reset for key id 0, soft reset otherwise) is queued
    /// as message 0, except a server's hard reset, which waits for the client's (see the
    /// [module docs](self)). `local_km2` is this side's key-method-2 message, built from
    /// `local`.
    pub(crate) fn new(
        key_id: KeyId,
        role: Role,
        reliable: Reliable,
        local: KeySource,
        local_km2: Bytes,
        now: Instant,
    ) -> KeyState {
        let mut ks = KeyState {
            key_id,
            role,
            reliable,
            phase: Phase::PreStart,
            stream: BytesMut::new(),
            local,
            local_km2: Some(local_km2),
            reset: None,
            km2_buf: BytesMut::new(),
            data: None,
            bytes: 0,
            packets: 0,
        };
        match (key_id.get(), role) {
            (0, Role::Server) => ks.reset = Some(ControlOpcode::HardResetServerV2),
            (0, Role::Client) => ks.queue_reset(ControlOpcode::HardResetClientV2, now),
            _ => ks.queue_reset(ControlOpcode::SoftResetV1, now),
        }
        ks
    }

    fn queue_reset(&mut self, reset: ControlOpcode, now: Instant) {
        // Our reset is the first message of a fresh reliable state, whose whole window is
        // free, so this cannot fail.
        let _ = self.reliable.queue(reset.opcode() as u8, Bytes::new(), now);
    }

    pub(crate) fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// Both key-method-2 messages are exchanged.
    pub(crate) fn is_established(&self) -> bool {
        matches!(self.phase, Phase::Established { .. })
    }

    pub(crate) fn data_key(&mut self) -> Option<&mut DataKey> {
        self.data.as_mut()
    }

    pub(crate) fn has_data_key(&self) -> bool {
        self.data.is_some()
    }

    /// The data key exists and every control message we sent on this key was acknowledged,
    /// so the peer holds its data key too: safe to send with (OpenVPN's S_ACTIVE).
    pub(crate) fn is_active(&self) -> bool {
        let tls_idle = match &self.phase {
            Phase::Handshake { tls } | Phase::Established { tls, .. } => {
                tls.pending_ciphertext_len() == 0
            }
            Phase::PreStart | Phase::Failed => true,
        };
        self.data.is_some() && tls_idle && self.stream.is_empty() && self.reliable.all_acked()
    }

    pub(crate) fn install(&mut self, key: DataKey) {
        self.data = Some(key);
    }

    /// Counts one data packet of `len` bytes through this key.
    pub(crate) fn count(&mut self, len: usize) {
        self.bytes = self.bytes.saturating_add(len as u64);
        self.packets = self.packets.saturating_add(1);
    }

    pub(crate) fn traffic(&self) -> (u64, u64) {
        (self.bytes, self.packets)
    }

    /// The peer's leaf certificate, once TLS has it.
    pub(crate) fn peer_certificate(&self) -> Option<X509> {
        match &self.phase {
            Phase::Handshake { tls } | Phase::Established { tls, .. } => tls.peer_certificate(),
            Phase::PreStart | Phase::Failed => None,
        }
    }

    /// Keying material of this key's TLS session, once established.
    pub(crate) fn export_key2(&self, label: &str) -> Result<Key2, TlsError> {
        match &self.phase {
            Phase::Established { tls, .. } => tls.export_key2(label),
            _ => Err(TlsError::HandshakeIncomplete),
        }
    }

    /// The data-channel key block of this key generation (reference 7): from the TLS
    /// exporter with `tls_ekm`, else from the key-method-2 randoms and both session ids.
    pub(crate) fn derive_key2(
        &self,
        tls_ekm: bool,
        own_sid: SessionId,
        peer_sid: SessionId,
    ) -> Result<Key2, TlsError> {
        let Phase::Established { tls, peer } = &self.phase else {
            return Err(TlsError::HandshakeIncomplete);
        };
        if tls_ekm {
            return tls.export_key2(EXPORT_KEY_DATA_LABEL);
        }
        let (client, server, client_sid, server_sid) = match &**peer {
            PeerKm2::Server(s) => (&self.local, &s.key_source, own_sid, peer_sid),
            PeerKm2::Client(c) => (&c.key_source, &self.local, peer_sid, own_sid),
        };
        let master = kdf::master_secret(&client.pre_master, &client.random1, &server.random1);
        Ok(kdf::key_expansion(
            &master,
            &client.random2,
            &server.random2,
            client_sid,
            server_sid,
        ))
    }

    /// Writes one text control message into TLS (one record).
    pub(crate) fn write_message(&mut self, message: &ControlMessage) -> Result<(), TlsError> {
        let Phase::Established { tls, .. } = &mut self.phase else {
            return Err(TlsError::HandshakeIncomplete);
        };
        let mut text = Vec::new();
        if message.encode(&mut text).is_err() {
            return Err(TlsError::EmptyMessage);
        }
        tls.write_message(&text)
    }

    /// Feeds one received control packet of this key id. See the session for the order.
    pub(crate) fn handle_control(
        &mut self,
        now: Instant,
        packet: ReceivedControl,
        tls_ctx: &SslContextRef,
        verifier: &Arc<dyn PeerVerifier>,
    ) -> Result<Vec<KeyEvent>, KeyStateError> {
        self.reliable.handle_acks(packet.acks.as_slice(), now);
        let opcode = packet.opcode;
        if let Some(id) = packet.message_id {
            self.reliable
                .handle_message(id, opcode.opcode() as u8, packet.payload);
        }
        let peer_reset = matches!(
            opcode,
            ControlOpcode::HardResetClientV2 | ControlOpcode::HardResetClientV3
        );
        if peer_reset {
            if let Some(reset) = self.reset.take() {
                // Queued after the client's message, so it carries the ACK for it.
                self.queue_reset(reset, now);
            }
        }
        let reset_sent = self.reset.is_none();
        if matches!(self.phase, Phase::PreStart) && reset_sent && self.reliable.all_acked() {
            self.start(tls_ctx, verifier)?;
        }
        let mut events = Vec::new();
        let result = self.drive(&mut events);
        if result.is_err() {
            self.phase = Phase::Failed;
        }
        result.map(|()| events)
    }

    /// S_START: create TLS and, on a client, write our key-method-2 message.
    fn start(
        &mut self,
        tls_ctx: &SslContextRef,
        verifier: &Arc<dyn PeerVerifier>,
    ) -> Result<(), KeyStateError> {
        let mut tls = TlsSession::new(tls_ctx, self.role, Arc::clone(verifier))
            .map_err(KeyStateError::Tls)?;
        if self.role == Role::Client {
            if let Some(km2) = self.local_km2.take() {
                tls.write_message(&km2).map_err(KeyStateError::Tls)?;
            }
        }
        tls.process().map_err(KeyStateError::Tls)?;
        self.phase = Phase::Handshake { tls };
        Ok(())
    }

    /// Moves delivered payloads into TLS and reads what TLS decrypted.
    fn drive(&mut self, events: &mut Vec<KeyEvent>) -> Result<(), KeyStateError> {
        let tls = match &mut self.phase {
            Phase::Handshake { tls } | Phase::Established { tls, .. } => tls,
            Phase::PreStart => return Ok(()),
            Phase::Failed => return Err(KeyStateError::Tls(TlsError::Finished)),
        };
        while let Some(message) = self.reliable.poll_deliver() {
            // Resets carry no TLS bytes (their payload is early-negotiation TLVs at most).
            if message.tag == Opcode::ControlV1 as u8 {
                tls.feed_ciphertext(&message.payload);
            }
        }
        tls.process().map_err(KeyStateError::Tls)?;
        while let Some(record) = self.next_record() {
            self.handle_plaintext(record, events)?;
        }
        Ok(())
    }

    fn next_record(&mut self) -> Option<BytesMut> {
        match &mut self.phase {
            Phase::Handshake { tls } | Phase::Established { tls, .. } => tls.poll_plaintext(),
            Phase::PreStart | Phase::Failed => None,
        }
    }

    fn handle_plaintext(
        &mut self,
        record: BytesMut,
        events: &mut Vec<KeyEvent>,
    ) -> Result<(), KeyStateError> {
        if matches!(self.phase, Phase::Established { .. }) {
            events.extend(split_messages(&record).map(|m| match m {
                Ok(message) => KeyEvent::Message(message),
                Err(dropped) => KeyEvent::Dropped(dropped),
            }));
            return Ok(());
        }
        self.km2_buf.extend_from_slice(&record);
        let parsed = match self.role {
            Role::Server => ClientKeyMethod2::parse(&self.km2_buf).map(|(m, _)| PeerKm2::Client(m)),
            Role::Client => ServerKeyMethod2::parse(&self.km2_buf).map(|(m, _)| PeerKm2::Server(m)),
        };
        let peer = match parsed {
            Ok(peer) => peer,
            Err(e) if e.is_truncated() => return Ok(()),
            Err(e) => return Err(KeyStateError::Km2(e)),
        };
        // The rest of the record that held the message is discarded, as upstream does.
        self.km2_buf = BytesMut::new();
        let Phase::Handshake { mut tls } = std::mem::replace(&mut self.phase, Phase::Failed) else {
            return Ok(());
        };
        if let Some(km2) = self.local_km2.take() {
            tls.write_message(&km2).map_err(KeyStateError::Tls)?;
        }
        events.push(KeyEvent::KeyExchanged(peer.clone()));
        self.phase = Phase::Established {
            tls,
            peer: Box::new(peer),
        };
        Ok(())
    }

    /// Appends every control packet due at `now` (framed) to `out`: new TLS ciphertext cut
    /// into messages as far as the window allows, (re)transmissions, then a P_ACK_V1 for
    /// ACKs nothing else carried.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        limits: &PayloadLimits,
        link: &mut ControlLink,
        unix: u32,
        out: &mut BytesMut,
    ) -> Result<(), LinkError> {
        if let Phase::Handshake { tls } | Phase::Established { tls, .. } = &mut self.phase {
            while let Some(bytes) = tls.poll_ciphertext(usize::MAX) {
                self.stream.extend_from_slice(&bytes);
            }
        }
        if !self.stream.is_empty() {
            self.reliable
                .queue_stream(Opcode::ControlV1 as u8, &mut self.stream, limits, now);
        }
        while let Some(transmit) = self.reliable.poll_transmit(now) {
            link.send_message(self.key_id, &transmit, unix, out)?;
        }
        if let Some(acks) = self.reliable.poll_ack() {
            link.send_ack(self.key_id, acks, unix, out)?;
        }
        Ok(())
    }

    /// When a retransmission is due, if any message is unacknowledged.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.reliable.poll_timeout()
    }
}
