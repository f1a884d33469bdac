//! The machinery both roles share: the link, the primary and lame-duck key states, the data
//! channel, keepalive, renegotiation and the output queues. [`ClientSession`] and
//! [`ServerSession`] wrap it with what differs (push request/reply, authentication).
//!
//! [`ClientSession`]: super::ClientSession
//! [`ServerSession`]: super::ServerSession

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use rand_core::CryptoRngCore;

use crate::control_msg::ControlMessage;
use crate::data::{
    classify, Compression, DataCipher, DataError, DataHeader, DataKey, DataKeyParams, OccOp,
    PayloadKind, PING_MAGIC,
};
use crate::framing::LENGTH_PREFIX_LEN;
use crate::ids::{KeyId, PeerId, SessionId};
use crate::kdf::check_key2;
use crate::key::{Key2, Role};
use crate::km2::{ClientKeyMethod2, KeySource, ServerKeyMethod2};
use crate::opcode::{P_DATA_V1, P_DATA_V2, P_OPCODE_SHIFT};
use crate::packet::ControlOpcode;
use crate::reliable::Reliable;
use crate::tls::EXPORT_DYNAMIC_TLS_CRYPT_LABEL;
use crate::wrap::{ControlWrap, TlsCrypt};

use super::config::{reneg_interval, SessionConfig};
use super::event::{CloseReason, Event, SessionError};
use super::key_state::{KeyEvent, KeyState, KeyStateError};
use super::link::ControlLink;
use super::timers::{Timer, TimerTable};
use super::SEND_HEADROOM;

/// What the data channel runs with once negotiated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataSettings {
    pub(crate) cipher: DataCipher,
    pub(crate) peer_id: Option<PeerId>,
    pub(crate) tls_ekm: bool,
    pub(crate) compression: Compression,
}

/// This side's key-method-2 message, minus the randoms (fresh for every key id).
#[derive(Debug, Clone)]
pub(crate) enum Km2Template {
    Client {
        options: String,
        username: Option<Vec<u8>>,
        password: Option<Vec<u8>>,
        peer_info: String,
    },
    Server {
        options: String,
    },
}

/// What a received packet turned out to be.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A tun payload.
    Data(BytesMut),
    /// A ping, an OCC message, or a data packet with nothing for the caller.
    Nothing,
    /// A control packet; these are the key states' findings, by key id.
    Control(Vec<(KeyId, KeyEvent)>),
}

impl Incoming {
    /// Hands every key-state finding to `on_event` (the role's handler) and returns the tun
    /// payload, if the packet carried one. Both roles' `handle_packet` are this plus their
    /// handler.
    pub(crate) fn dispatch(self, mut on_event: impl FnMut(KeyId, KeyEvent)) -> Option<BytesMut> {
        match self {
            Incoming::Data(payload) => Some(payload),
            Incoming::Nothing => None,
            Incoming::Control(events) => {
                for (key_id, event) in events {
                    on_event(key_id, event);
                }
                None
            }
        }
    }
}

pub(crate) struct Conn {
    pub(crate) role: Role,
    pub(crate) cfg: SessionConfig,
    pub(crate) link: ControlLink,
    rng: Box<dyn CryptoRngCore + Send>,
    km2: Km2Template,
    pub(crate) primary: KeyState,
    lame_duck: Option<KeyState>,
    pub(crate) timers: TimerTable,
    epoch: Instant,
    last_sent: Instant,
    last_received: Instant,
    pub(crate) ping: Option<Duration>,
    pub(crate) ping_restart: Option<Duration>,
    pub(crate) data: Option<DataSettings>,
    /// This session's `reneg-sec` interval, drawn at its first data key.
    reneg_interval: Option<Duration>,
    events: VecDeque<Event>,
    /// Framed packets made outside `poll_transmit` (pings).
    pending: BytesMut,
    closed: bool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("role", &self.role)
            .field("own_sid", &self.link.own_session_id())
            .field("peer_sid", &self.link.peer_session_id())
            .field("primary", &self.primary)
            .field("lame_duck", &self.lame_duck)
            .field("data", &self.data)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl Conn {
    pub(crate) fn new(
        role: Role,
        cfg: SessionConfig,
        km2: Km2Template,
        mut rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> Conn {
        let own_sid = SessionId::random(&mut &mut *rng);
        let link = ControlLink::new(role, own_sid, cfg.protection.wrap(role), now);
        let (local, bytes) = build_km2(&km2, &mut *rng);
        let primary = KeyState::new(
            KeyId::default(),
            role,
            Reliable::new(cfg.tls_timeout),
            local,
            bytes,
            now,
        );
        let mut timers = TimerTable::default();
        timers.set(Timer::HandWindow, now + cfg.hand_window);
        Conn {
            role,
            cfg,
            link,
            rng,
            km2,
            primary,
            lame_duck: None,
            timers,
            epoch: now,
            last_sent: now,
            last_received: now,
            ping: None,
            ping_restart: None,
            data: None,
            reneg_interval: None,
            events: VecDeque::new(),
            pending: BytesMut::new(),
            closed: false,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    pub(crate) fn push_event(&mut self, event: Event) {
        self.events.push_back(event);
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Ends the session with `reason` (once).
    pub(crate) fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.timers = TimerTable::default();
        self.events.push_back(Event::Closed(reason));
    }

    // Input.

    pub(crate) fn handle_packet(
        &mut self,
        now: Instant,
        packet: BytesMut,
    ) -> Result<Incoming, SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        let Some(&first) = packet.first() else {
            return Err(SessionError::Data(DataError::BadLength { len: 0, min: 1 }));
        };
        if matches!(first >> P_OPCODE_SHIFT, P_DATA_V1 | P_DATA_V2) {
            return self.handle_data(now, packet);
        }
        let received = self
            .link
            .receive(now, &packet)
            .map_err(SessionError::Link)?;
        self.last_received = now;
        let key_id = received.key_id;
        let answering_soft_reset = received.opcode == ControlOpcode::SoftResetV1
            && key_id == self.primary.key_id().next()
            && self.primary.has_data_key();
        if answering_soft_reset {
            self.start_soft_reset(now);
        }
        let ks = if key_id == self.primary.key_id() {
            &mut self.primary
        } else {
            match self.lame_duck.as_mut() {
                Some(ks) if ks.key_id() == key_id => ks,
                _ => return Err(SessionError::UnknownKeyId { key_id }),
            }
        };
        let was_established = ks.is_established();
        let result = ks.handle_control(now, received, &self.cfg.tls, &self.cfg.verifier);
        let events = match result {
            Ok(events) => events,
            Err(e) => {
                let reason = match e {
                    KeyStateError::Tls(source) => CloseReason::Tls { key_id, source },
                    KeyStateError::Km2(e) => CloseReason::KeyMethod(e),
                };
                self.close(reason);
                return Err(SessionError::Fatal);
            }
        };
        if !was_established && key_id == self.primary.key_id() && self.primary.is_established() {
            self.timers.stop(Timer::HandWindow);
            // A renegotiated key: the data settings are known, install at once.
            if key_id.get() != 0 {
                if let Err(reason) = self.install_primary(now) {
                    self.close(reason);
                    return Err(SessionError::Fatal);
                }
                self.push_event(Event::KeyRenegotiated { key_id });
            }
        }
        Ok(Incoming::Control(
            events.into_iter().map(|e| (key_id, e)).collect(),
        ))
    }

    fn handle_data(
        &mut self,
        now: Instant,
        mut packet: BytesMut,
    ) -> Result<Incoming, SessionError> {
        let header = DataHeader::parse(&packet).map_err(SessionError::Data)?;
        let key_id = header.key_id();
        let now_secs = now.saturating_duration_since(self.epoch).as_secs();
        let compression = self.data.map_or(Compression::None, |d| d.compression);
        let len = packet.len();
        let ks = self.key_state_mut(key_id).filter(|ks| ks.has_data_key());
        let Some(ks) = ks else {
            return Err(SessionError::NoKey { key_id });
        };
        let Some(key) = ks.data_key() else {
            return Err(SessionError::NoKey { key_id });
        };
        let opened = key
            .decrypt(&mut packet, now_secs)
            .and_then(|_| compression.unframe(&mut packet));
        if let Err(e) = opened {
            if e.is_fatal() {
                self.close(CloseReason::Data(e));
                return Err(SessionError::Fatal);
            }
            return Err(SessionError::Data(e));
        }
        ks.count(len);
        self.last_received = now;
        self.check_traffic_limits(now);
        match classify(&packet) {
            PayloadKind::Packet => Ok(Incoming::Data(packet)),
            PayloadKind::Ping => Ok(Incoming::Nothing),
            PayloadKind::Occ(m) => {
                if m.op == OccOp::Exit {
                    self.close(CloseReason::PeerExit);
                }
                Ok(Incoming::Nothing)
            }
        }
    }

    fn key_state_mut(&mut self, key_id: KeyId) -> Option<&mut KeyState> {
        if self.primary.key_id() == key_id {
            return Some(&mut self.primary);
        }
        self.lame_duck.as_mut().filter(|ks| ks.key_id() == key_id)
    }

    /// Runs the common timer `timer`, which has expired at `now`.
    pub(crate) fn on_timer(&mut self, now: Instant, timer: Timer) {
        match timer {
            Timer::HandWindow => {
                let key_id = self.primary.key_id();
                self.close(CloseReason::HandWindowExpired { key_id });
            }
            Timer::KeepaliveSend => self.send_ping(now),
            Timer::KeepaliveRecv => {
                let silence = now.saturating_duration_since(self.last_received);
                self.close(CloseReason::PingRestart(silence));
            }
            Timer::Renegotiate => self.renegotiate(now),
            Timer::LameDuck => self.lame_duck = None,
            Timer::PushRequest | Timer::Linger => {}
        }
    }

    // Commands.

    /// Starts a soft reset if the current key is fully established (S_GENERATED_KEYS).
    pub(crate) fn renegotiate(&mut self, now: Instant) {
        if self.closed || !self.primary.has_data_key() {
            return;
        }
        self.start_soft_reset(now);
    }

    /// The current key becomes the lame duck; a new key state with the next key id starts
    /// with its soft reset.
    fn start_soft_reset(&mut self, now: Instant) {
        let key_id = self.primary.key_id().next();
        let (local, bytes) = build_km2(&self.km2, &mut *self.rng);
        let fresh = KeyState::new(
            key_id,
            self.role,
            Reliable::new(self.cfg.tls_timeout),
            local,
            bytes,
            now,
        );
        let old = std::mem::replace(&mut self.primary, fresh);
        self.lame_duck = Some(old);
        self.timers.set(Timer::LameDuck, now + self.cfg.tran_window);
        self.timers
            .set(Timer::HandWindow, now + self.cfg.hand_window);
        self.timers.stop(Timer::Renegotiate);
    }

    /// Derives and installs the primary key's data key with the negotiated settings, and arms
    /// the renegotiation timer.
    pub(crate) fn install_primary(&mut self, now: Instant) -> Result<(), CloseReason> {
        let Some(settings) = self.data else {
            return Err(CloseReason::Protocol {
                what: "data settings missing",
            });
        };
        let own = self.link.own_session_id();
        let peer = self.link.peer_session_id().unwrap_or_default();
        let key2 = self
            .primary
            .derive_key2(settings.tls_ekm, own, peer)
            .map_err(|source| CloseReason::Tls {
                key_id: self.primary.key_id(),
                source,
            })?;
        check_key2(&key2, settings.cipher.key_len())
            .map_err(|_| CloseReason::DataKey(DataError::ZeroKey))?;
        let params = DataKeyParams {
            cipher: settings.cipher,
            auth: self.cfg.auth,
            key_id: self.primary.key_id(),
            peer_id: settings.peer_id,
            packet_ids: self.cfg.packet_ids,
            ..DataKeyParams::new(settings.cipher)
        };
        let key = DataKey::from_key2(&params, &key2, self.role).map_err(CloseReason::DataKey)?;
        self.primary.install(key);
        if let Some(max) = self.cfg.reneg_sec {
            // Drawn once, at the first data key (reference 12.2): every key of the session
            // lives as long.
            let rng = &mut self.rng;
            let interval = *self.reneg_interval.get_or_insert_with(|| {
                reneg_interval(max, self.cfg.reneg_sec_min, self.role, || rng.next_u64())
            });
            self.timers.set(Timer::Renegotiate, now + interval);
        }
        Ok(())
    }

    /// Dynamic tls-crypt (reference 12.4): wrap every control packet of key id > 0 with a key
    /// exported from the key-0 TLS session, XORed with the static key.
    pub(crate) fn enable_dyn_tls_crypt(&mut self) -> Result<(), CloseReason> {
        let key_id = self.primary.key_id();
        let exported = self
            .primary
            .export_key2(EXPORT_DYNAMIC_TLS_CRYPT_LABEL)
            .map_err(|source| CloseReason::Tls { key_id, source })?;
        let mut bytes = exported.to_bytes();
        if let Some(static_key) = self.cfg.protection.static_key() {
            let s = static_key.to_bytes();
            bytes.iter_mut().zip(s.iter()).for_each(|(b, k)| *b ^= k);
        }
        let key = Key2::from_bytes(&bytes);
        bytes.fill(0);
        self.link
            .set_renegotiation_wrap(ControlWrap::Crypt(TlsCrypt::new(&key, self.role)));
        Ok(())
    }

    /// Writes a text control message on the newest established key.
    pub(crate) fn send_control(&mut self, message: &ControlMessage) {
        let ks = if self.primary.is_established() {
            &mut self.primary
        } else {
            match self.lame_duck.as_mut() {
                Some(ks) => ks,
                None => return,
            }
        };
        let key_id = ks.key_id();
        if let Err(source) = ks.write_message(message) {
            if source.is_fatal() {
                self.close(CloseReason::Tls { key_id, source });
            }
        }
    }

    /// Encrypts `buf[offset..]` into one framed data packet in place (see
    /// [`ClientSession::send_tun_packet`](super::ClientSession::send_tun_packet)).
    pub(crate) fn send_tun_packet(
        &mut self,
        now: Instant,
        buf: &mut BytesMut,
        offset: usize,
    ) -> Result<(), SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        let compression = self.data.map_or(Compression::None, |d| d.compression);
        let mut rng: &mut dyn CryptoRngCore = &mut *self.rng;
        let Some(ks) = send_key_of(&mut self.primary, &mut self.lame_duck) else {
            return Err(SessionError::NotConnected);
        };
        let Some(key) = ks.data_key() else {
            return Err(SessionError::NotConnected);
        };
        let mut offset = compression.frame(buf, offset);
        let headroom = key.headroom();
        if offset < headroom + LENGTH_PREFIX_LEN || offset > buf.len() {
            let mut fresh = BytesMut::with_capacity(SEND_HEADROOM + buf.len() - offset + 32);
            fresh.resize(SEND_HEADROOM, 0);
            fresh.extend_from_slice(buf.get(offset..).unwrap_or(&[]));
            *buf = fresh;
            offset = SEND_HEADROOM;
        }
        bytes::Buf::advance(buf, offset - headroom - LENGTH_PREFIX_LEN);
        let mut body = buf.split_off(LENGTH_PREFIX_LEN);
        key.encrypt(&mut body, headroom, &mut rng)
            .map_err(SessionError::Data)?;
        buf.unsplit(body);
        let len = buf.len() - LENGTH_PREFIX_LEN;
        let prefix = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
        buf[..LENGTH_PREFIX_LEN].copy_from_slice(&prefix);
        ks.count(len);
        self.last_sent = now;
        self.check_traffic_limits(now);
        Ok(())
    }

    fn send_ping(&mut self, now: Instant) {
        let mut buf = BytesMut::with_capacity(SEND_HEADROOM + PING_MAGIC.len() + 32);
        buf.resize(SEND_HEADROOM, 0);
        buf.put_slice(&PING_MAGIC);
        if self.send_tun_packet(now, &mut buf, SEND_HEADROOM).is_ok() {
            self.pending.unsplit(buf);
        }
    }

    /// `reneg-bytes`, `reneg-pkts` and the packet-id trigger.
    fn check_traffic_limits(&mut self, now: Instant) {
        if !self.primary.has_data_key() || self.lame_duck.is_some() && !self.primary.is_active() {
            return;
        }
        let (bytes, packets) = self.primary.traffic();
        let wrap = self
            .primary
            .data_key()
            .is_some_and(|k| k.wants_renegotiation());
        let over = self.cfg.reneg_bytes.is_some_and(|max| bytes >= max)
            || self.cfg.reneg_pkts.is_some_and(|max| packets >= max)
            || wrap;
        if over {
            self.renegotiate(now);
        }
    }

    // Output.

    pub(crate) fn poll_transmit(&mut self, now: Instant, unix: u64) -> Option<BytesMut> {
        let mut out = std::mem::take(&mut self.pending);
        let unix = u32::try_from(unix).unwrap_or(u32::MAX);
        let limits = self.cfg.payload_limits();
        let mut failed = None;
        for ks in self
            .lame_duck
            .iter_mut()
            .chain(std::iter::once(&mut self.primary))
        {
            if let Err(e) = ks.poll_transmit(now, &limits, &mut self.link, unix, &mut out) {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            self.close(CloseReason::Link(e));
        }
        if out.is_empty() {
            return None;
        }
        self.last_sent = now;
        Some(out)
    }

    /// Re-arms the keepalive timers from the last send and receive; call after every input.
    pub(crate) fn update_keepalive(&mut self) {
        if self.closed {
            return;
        }
        match (
            self.ping,
            self.primary.has_data_key() || self.lame_duck.is_some(),
        ) {
            (Some(ping), true) => self.timers.set(Timer::KeepaliveSend, self.last_sent + ping),
            _ => self.timers.stop(Timer::KeepaliveSend),
        }
        match self.ping_restart {
            Some(limit) => self
                .timers
                .set(Timer::KeepaliveRecv, self.last_received + limit),
            None => self.timers.stop(Timer::KeepaliveRecv),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        [
            self.timers.earliest(),
            self.primary.poll_timeout(),
            self.lame_duck.as_ref().and_then(KeyState::poll_timeout),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The key to send data with: the primary once it is active (the peer holds it), else the
/// lame duck while it lives, else the primary as soon as it has a data key. Over split
/// borrows, so the caller keeps the rng.
fn send_key_of<'a>(
    primary: &'a mut KeyState,
    lame_duck: &'a mut Option<KeyState>,
) -> Option<&'a mut KeyState> {
    let primary_active = primary.is_active();
    let lame_ok = lame_duck.as_ref().is_some_and(KeyState::has_data_key);
    if !primary_active && lame_ok {
        return lame_duck.as_mut();
    }
    if primary.has_data_key() {
        return Some(primary);
    }
    None
}

/// Fresh randoms and this side's key-method-2 message for one key id.
fn build_km2(template: &Km2Template, rng: &mut dyn CryptoRngCore) -> (KeySource, Bytes) {
    let mut out = BytesMut::new();
    let local = match template {
        Km2Template::Client {
            options,
            username,
            password,
            peer_info,
        } => {
            let ks = KeySource::client(&mut &mut *rng);
            let msg = ClientKeyMethod2 {
                key_source: ks.clone(),
                options: options.clone(),
                username: username.clone(),
                password: password.clone(),
                peer_info: Some(peer_info.clone()),
            };
            // Our own strings were checked when the session was made.
            let _ = msg.emit(&mut out);
            ks
        }
        Km2Template::Server { options } => {
            let ks = KeySource::server(&mut &mut *rng);
            let _ = ServerKeyMethod2::new(ks.clone(), options.clone()).emit(&mut out);
            ks
        }
    };
    (local, out.freeze())
}
