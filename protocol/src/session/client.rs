//! The client side of a session: hard reset, TLS, key method 2 with peer-info, `PUSH_REQUEST`
//! until `PUSH_REPLY`, the pull policy, then data keys from what was accepted. A server whose
//! key-method-2 options string names the other `dev-type` ends the session there
//! ([`CloseReason::DevTypeMismatch`]).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use rand_core::CryptoRngCore;

use crate::control_msg::ControlMessage;
use crate::data::Compression;
use crate::key::Role;
use crate::km2::occ::{check_dev_type, OccOptions};
use crate::km2::peer_info::{
    IvProto, PeerInfo, IV_PROTO_CC_EXIT_NOTIFY, IV_PROTO_DATA_V2, IV_PROTO_DYN_TLS_CRYPT,
    IV_PROTO_REQUEST_PUSH, IV_PROTO_TLS_KEY_EXPORT,
};
use crate::ncp::{check_pushed_cipher, client_cipher_without_push};
use crate::push::options::{CompLzo, Compress, KeyDerivation};
use crate::push::{PullPolicy, PushCollector, PushOutcome, PushedOption};

use super::config::{ClientConfig, PUSH_REQUEST_INTERVAL};
use super::conn::{Conn, DataSettings, Km2Template};
use super::event::{CloseReason, Connected, Event, SessionError};
use super::key_state::{KeyEvent, PeerKm2};
use super::timers::Timer;

/// An OpenVPN client session over one TCP connection. The driving contract is in the
/// [module docs](super); this type follows it exactly.
#[derive(Debug)]
pub struct ClientSession {
    conn: Conn,
    pull: PullPolicy,
    tls_ekm: bool,
    dyn_tls_crypt: bool,
    phase: ClientPhase,
    collector: PushCollector,
}

#[derive(Debug)]
enum ClientPhase {
    /// Hard reset, TLS and key method 2 of key id 0.
    Handshake,
    /// `PUSH_REQUEST` sent; waiting for the whole `PUSH_REPLY` until `deadline`.
    AwaitingPush {
        server_options: String,
        deadline: Instant,
    },
    /// Data keys installed.
    Connected,
}

impl ClientSession {
    /// A new session; its hard reset is ready in [`poll_transmit`](Self::poll_transmit).
    /// `rng` supplies session ids, key-method-2 randoms and CBC IVs.
    pub fn new(
        config: ClientConfig,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> ClientSession {
        let mut proto: IvProto = IV_PROTO_DATA_V2 | IV_PROTO_REQUEST_PUSH | IV_PROTO_CC_EXIT_NOTIFY;
        if config.tls_ekm {
            proto |= IV_PROTO_TLS_KEY_EXPORT;
        }
        if config.dyn_tls_crypt {
            proto |= IV_PROTO_DYN_TLS_CRYPT;
        }
        let peer_info = PeerInfo::pull_client(
            &config.version,
            &config.platform,
            config.tun_max_mtu,
            config.session.data_ciphers.as_slice(),
            proto,
        );
        let (username, password) = match config.credentials {
            Some((u, p)) => (Some(u), Some(p)),
            None => (None, None),
        };
        let km2 = Km2Template::Client {
            options: config.session.occ(Role::Client).options_string(),
            username,
            password,
            peer_info: peer_info.to_text(),
        };
        let mut conn = Conn::new(Role::Client, config.session, km2, rng, now);
        conn.ping = config.ping;
        conn.ping_restart = config.ping_restart;
        conn.update_keepalive();
        ClientSession {
            conn,
            pull: config.pull,
            tls_ekm: config.tls_ekm,
            dyn_tls_crypt: config.dyn_tls_crypt,
            phase: ClientPhase::Handshake,
            collector: PushCollector::new(),
        }
    }

    // Input.

    /// One received packet (a frame's bytes, without the length prefix). A data packet is
    /// decrypted in place and its tun payload returned; pings and OCC messages return
    /// `Ok(None)`. Control packets return `Ok(None)` and may queue output and events.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        packet: BytesMut,
    ) -> Result<Option<BytesMut>, SessionError> {
        let out = self.conn.handle_packet(now, packet).map(|incoming| {
            incoming.dispatch(|key_id, event| self.on_key_event(now, key_id.get(), event))
        });
        self.conn.update_keepalive();
        out
    }

    /// Runs every timer that expired at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(timer) = self.conn.timers.take_expired(now) {
            match timer {
                Timer::PushRequest => self.on_push_timer(now),
                other => self.conn.on_timer(now, other),
            }
        }
        self.conn.update_keepalive();
    }

    // Commands.

    /// Encrypts the tun packet `buf[offset..]` in place into one framed data packet: on
    /// success `buf` holds the 2-byte length prefix and the wire packet, ready to write.
    /// `buf[..offset]` is headroom; with [`SEND_HEADROOM`](super::SEND_HEADROOM) bytes of it
    /// and [`DATA_TAILROOM`](crate::data::DATA_TAILROOM) bytes of spare capacity nothing is
    /// copied or allocated.
    pub fn send_tun_packet(
        &mut self,
        now: Instant,
        buf: &mut BytesMut,
        offset: usize,
    ) -> Result<(), SessionError> {
        let r = self.conn.send_tun_packet(now, buf, offset);
        self.conn.update_keepalive();
        r
    }

    /// Starts a soft reset now (if the current key is established).
    pub fn renegotiate(&mut self, now: Instant) {
        self.conn.renegotiate(now);
    }

    /// Ends the session; an [`Event::Closed`] with [`CloseReason::Local`] follows.
    pub fn close(&mut self, now: Instant) {
        let _ = now;
        self.conn.close(CloseReason::Local);
    }

    // Output.

    /// The framed control packets and pings to send now, coalesced into one buffer.
    pub fn poll_transmit(&mut self, now: Instant, unix_secs: u64) -> Option<BytesMut> {
        let out = self.conn.poll_transmit(now, unix_secs);
        self.conn.update_keepalive();
        out
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.conn.poll_event()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    // Internals.

    fn on_key_event(&mut self, now: Instant, key_id: u8, event: KeyEvent) {
        match event {
            KeyEvent::KeyExchanged(PeerKm2::Server(km2)) if key_id == 0 => {
                let occ = OccOptions::parse(&km2.options);
                if let Err(e) = check_dev_type(self.conn.cfg.dev_type, Role::Client, &occ) {
                    return self.conn.close(CloseReason::DevTypeMismatch(e));
                }
                self.phase = ClientPhase::AwaitingPush {
                    server_options: km2.options,
                    deadline: now + self.conn.cfg.hand_window,
                };
                self.send_push_request(now);
            }
            KeyEvent::KeyExchanged(_) => {}
            KeyEvent::Message(message) => self.on_message(now, message),
            KeyEvent::Dropped(error) => self.conn.push_event(Event::ControlMessageDropped(error)),
        }
    }

    fn send_push_request(&mut self, now: Instant) {
        self.conn.send_control(&ControlMessage::PushRequest);
        self.conn
            .timers
            .set(Timer::PushRequest, now + PUSH_REQUEST_INTERVAL);
    }

    fn on_push_timer(&mut self, now: Instant) {
        let ClientPhase::AwaitingPush { deadline, .. } = &self.phase else {
            return;
        };
        if now >= *deadline {
            self.conn.close(CloseReason::NoPushReply);
        } else {
            self.send_push_request(now);
        }
    }

    fn on_message(&mut self, now: Instant, message: ControlMessage) {
        match message {
            ControlMessage::PushReply { options } => {
                if !matches!(self.phase, ClientPhase::AwaitingPush { .. }) {
                    return;
                }
                match self.collector.push_part(&self.pull, &options) {
                    Ok(None) => {}
                    Ok(Some(outcome)) => self.apply_push(now, outcome),
                    Err(e) => self.conn.close(CloseReason::PushRejected(e)),
                }
            }
            ControlMessage::AuthFailed { reason } => {
                self.conn.close(CloseReason::AuthFailed { reason });
            }
            ControlMessage::Restart(signal) => self.conn.close(CloseReason::Restart(signal)),
            ControlMessage::Halt(signal) => self.conn.close(CloseReason::Halt(signal)),
            ControlMessage::Exit => self.conn.close(CloseReason::PeerExit),
            ControlMessage::PushRequest
            | ControlMessage::AuthPending { .. }
            | ControlMessage::Info(_)
            | ControlMessage::InfoPre(_)
            | ControlMessage::CrResponse(_)
            | ControlMessage::Unknown(_) => {}
        }
    }

    /// Applies a complete, accepted push: cipher, peer id, key derivation, timers,
    /// compression; then the data keys.
    fn apply_push(&mut self, now: Instant, outcome: PushOutcome) {
        let ClientPhase::AwaitingPush { server_options, .. } = &self.phase else {
            return;
        };
        let cfg = &self.conn.cfg;
        let mut cipher_name = None;
        let mut peer_id = None;
        let mut tls_ekm = false;
        let mut dyn_tls_crypt = false;
        let mut compression = cfg.compression;
        let mut ping = self.conn.ping;
        let mut ping_restart = self.conn.ping_restart;
        for option in &outcome.accepted {
            match option {
                PushedOption::Cipher(name) => cipher_name = Some(name.clone()),
                PushedOption::PeerId(id) => peer_id = Some(*id),
                PushedOption::KeyDerivation(KeyDerivation::TlsEkm) => tls_ekm = true,
                PushedOption::ProtocolFlags(flags) => {
                    tls_ekm |= flags.tls_ekm;
                    dyn_tls_crypt |= flags.dyn_tls_crypt;
                }
                PushedOption::Ping(n) => ping = secs(*n),
                PushedOption::PingRestart(n) => ping_restart = secs(*n),
                PushedOption::CompLzo(CompLzo::No | CompLzo::Yes | CompLzo::Adaptive) => {
                    compression = Compression::LzoStub;
                }
                PushedOption::Compress(Compress::Stub | Compress::Lzo | Compress::Lz4) => {
                    compression = Compression::StubSwap;
                }
                PushedOption::Compress(Compress::StubV2 | Compress::Lz4V2) => {
                    compression = Compression::StubV2;
                }
                _ => {}
            }
        }
        let cipher = match &cipher_name {
            Some(name) => check_pushed_cipher(name, &cfg.data_ciphers, cfg.data_ciphers_fallback),
            None => client_cipher_without_push(
                OccOptions::parse(server_options).cipher(),
                &cfg.data_ciphers,
                cfg.data_ciphers_fallback,
            ),
        };
        let cipher = match cipher {
            Ok(c) => c,
            Err(e) => return self.conn.close(CloseReason::ClientCipher(e)),
        };
        let settings = DataSettings {
            cipher,
            peer_id,
            tls_ekm: tls_ekm && self.tls_ekm,
            compression,
        };
        let dyn_tls_crypt = dyn_tls_crypt && self.dyn_tls_crypt;
        self.conn.data = Some(settings);
        self.conn.ping = ping;
        self.conn.ping_restart = ping_restart;
        if let Err(reason) = self.conn.install_primary(now) {
            return self.conn.close(reason);
        }
        if dyn_tls_crypt {
            if let Err(reason) = self.conn.enable_dyn_tls_crypt() {
                return self.conn.close(reason);
            }
        }
        self.conn.timers.stop(Timer::PushRequest);
        self.phase = ClientPhase::Connected;
        self.conn.push_event(Event::Connected(Connected {
            cipher,
            peer_id,
            tls_ekm: settings.tls_ekm,
            dyn_tls_crypt,
            push: outcome,
            client: None,
        }));
    }
}

fn secs(n: u32) -> Option<Duration> {
    (n > 0).then(|| Duration::from_secs(u64::from(n)))
}
