//! The server side: [`ServerEndpoint`] holds the shared configuration and hands out peer ids
//! and [`ServerSession`]s (one per TCP connection, so demultiplexing is the driver's accept
//! loop); a [`ServerSession`] answers the hard reset, runs the TLS server, reads the client's
//! key-method-2 message, lets the application decide ([`Event::ClientIdentified`] →
//! [`ServerSession::accept_client`] / [`ServerSession::reject_client`]), negotiates the cipher
//! and pushes the configuration.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipnet::Ipv6Net;
use openssl::nid::Nid;
use rand_core::CryptoRngCore;

use crate::control_msg::ControlMessage;
use crate::ids::PeerId;
use crate::key::Role;
use crate::km2::occ::OccOptions;
use crate::km2::peer_info::PeerInfo;
use crate::km2::ClientKeyMethod2;
use crate::ncp::{protocol_push, select_server_cipher, ProtocolPush, NO_SHARED_CIPHER_REASON};
use crate::push::{
    build_push_reply, PullPolicy, PushCollector, PushItem, PushOutcome, PushedOption,
};

use super::config::ServerConfig;
use super::conn::{Conn, DataSettings, Km2Template};
use super::event::{ClientIdentity, CloseReason, Connected, Event, SessionError};
use super::key_state::{KeyEvent, PeerKm2};
use super::timers::Timer;

/// How long a rejected session stays up so `AUTH_FAILED` reaches the client.
pub const AUTH_FAILED_LINGER: Duration = Duration::from_secs(5);

/// A `PUSH_REQUEST` within this long after a reply is ignored (reference 10.2).
pub const PUSH_REQUEST_IGNORE: Duration = Duration::from_secs(30);

/// The shared server configuration and the peer-id allocator.
#[derive(Debug)]
pub struct ServerEndpoint {
    config: Arc<ServerConfig>,
    used_peer_ids: BTreeSet<u32>,
}

impl ServerEndpoint {
    /// An endpoint for `config`.
    pub fn new(config: ServerConfig) -> ServerEndpoint {
        ServerEndpoint {
            config: Arc::new(config),
            used_peer_ids: BTreeSet::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// A session for a new TCP connection, with the lowest free peer id (2.6 numbers clients
    /// from 0). Release the id with [`release`](Self::release) when the session is dropped.
    pub fn new_session(
        &mut self,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> ServerSession {
        let id = (0..PeerId::UNDEFINED.get())
            .find(|id| !self.used_peer_ids.contains(id))
            .unwrap_or(0);
        self.used_peer_ids.insert(id);
        let peer_id = PeerId::new(id).unwrap_or(PeerId::UNDEFINED);
        ServerSession::new(Arc::clone(&self.config), peer_id, rng, now)
    }

    /// Frees the peer id of a finished session.
    pub fn release(&mut self, peer_id: PeerId) {
        self.used_peer_ids.remove(&peer_id.get());
    }
}

/// The application's per-client decision: what to push besides the configuration's own
/// options.
#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    /// Per-client pushes (client-config-dir `push` lines), after the configuration's.
    pub push: Vec<PushItem>,
    /// The client's IPv6 address with the prefix length, and the server's, pushed as
    /// `ifconfig-ipv6 fd00::1000/64 fd00::1` in the per-client part.
    pub ifconfig_ipv6: Option<(Ipv6Net, Option<Ipv6Addr>)>,
    /// The client's IPv4 address and the netmask (`topology subnet`) or peer address, pushed
    /// as `ifconfig 192.168.123.2 255.255.255.0` in the per-client part.
    pub ifconfig: Option<(Ipv4Addr, Ipv4Addr)>,
}

/// One client connection on the server. The driving contract is in the
/// [module docs](super); this type follows it exactly.
#[derive(Debug)]
pub struct ServerSession {
    conn: Conn,
    config: Arc<ServerConfig>,
    peer_id: PeerId,
    phase: ServerPhase,
}

#[derive(Debug)]
enum ServerPhase {
    /// Hard reset, TLS and key method 2 of key id 0.
    Handshake { push_requested: bool },
    /// The client is identified; the application decides.
    Authorizing {
        identity: Box<ClientIdentity>,
        push_requested: bool,
    },
    /// Keys installed; the reply is built and sent when due.
    Accepted {
        reply: Vec<String>,
        sent_at: Option<Instant>,
        connected: Option<Box<Connected>>,
    },
    /// `AUTH_FAILED` sent; closing after the linger.
    Rejected { reason: CloseReason },
    /// Ended.
    Done,
}

impl ServerSession {
    fn new(
        config: Arc<ServerConfig>,
        peer_id: PeerId,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> ServerSession {
        let km2 = Km2Template::Server {
            options: config.session.occ(Role::Server).options_string(),
        };
        let mut conn = Conn::new(Role::Server, config.session.clone(), km2, rng, now);
        if let Some(k) = config.keepalive {
            conn.ping = secs(k.ping);
            conn.ping_restart = secs(k.ping_restart.saturating_mul(2));
        }
        conn.update_keepalive();
        ServerSession {
            conn,
            config,
            peer_id,
            phase: ServerPhase::Handshake {
                push_requested: false,
            },
        }
    }

    /// The peer id the endpoint gave this session.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Why the client was refused (`AUTH_FAILED` sent, e.g. no shared cipher), while the
    /// session lingers before [`Event::Closed`] reports it: a client that hangs up first
    /// would otherwise leave the driver with only "connection closed".
    pub fn rejection(&self) -> Option<&CloseReason> {
        match &self.phase {
            ServerPhase::Rejected { reason } => Some(reason),
            _ => None,
        }
    }

    // Input.

    /// One received packet; see [`ClientSession::handle_packet`](super::ClientSession::handle_packet).
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
                Timer::Linger => {
                    if let ServerPhase::Rejected { .. } = self.phase {
                        if let ServerPhase::Rejected { reason } =
                            std::mem::replace(&mut self.phase, ServerPhase::Done)
                        {
                            self.conn.close(reason);
                        }
                    }
                }
                other => self.conn.on_timer(now, other),
            }
        }
        self.conn.update_keepalive();
    }

    // Commands.

    /// Accepts the client identified by [`Event::ClientIdentified`]: negotiates the cipher,
    /// derives the data keys, builds `PUSH_REPLY` in upstream's order (reference 10.4: the
    /// configuration's pushes, `settings.push`, `ping`/`ping-restart` from `keepalive`,
    /// `ifconfig-ipv6`, `ifconfig`, then `peer-id`, `cipher`, `key-derivation` /
    /// `protocol-flags`, `tun-mtu`) and sends it now if the client asked for it or announced
    /// `REQUEST_PUSH`. With no shared cipher the client gets `AUTH_FAILED` instead.
    pub fn accept_client(&mut self, now: Instant, settings: ClientSettings) {
        let ServerPhase::Authorizing {
            identity,
            push_requested,
        } = std::mem::replace(&mut self.phase, ServerPhase::Done)
        else {
            return;
        };
        let cfg = &self.config.session;
        let occ = OccOptions::parse(&identity.options);
        let cipher = match select_server_cipher(
            &cfg.data_ciphers,
            cfg.data_ciphers_fallback,
            Some(&identity.peer_info),
            occ.cipher(),
        ) {
            Ok(c) => c,
            Err(e) => {
                let reason = Some(NO_SHARED_CIPHER_REASON.to_owned());
                self.fail(now, reason, CloseReason::NoSharedCipher(e));
                return;
            }
        };
        let proto = protocol_push(
            &identity.peer_info,
            self.config.capabilities,
            self.peer_id,
            cipher,
            cfg.tun_mtu,
        );
        let reply = match build_push_reply(&self.push_items(settings, &proto)) {
            Ok(r) => r,
            Err(_) => {
                self.fail(
                    now,
                    None,
                    CloseReason::Protocol {
                        what: "push options cannot be sent",
                    },
                );
                return;
            }
        };
        let settings = DataSettings {
            cipher,
            peer_id: proto.data_v2.then_some(self.peer_id),
            tls_ekm: proto.tls_ekm,
            compression: cfg.compression,
        };
        self.conn.data = Some(settings);
        if let Err(reason) = self.conn.install_primary(now) {
            self.phase = ServerPhase::Done;
            return self.conn.close(reason);
        }
        if proto.dyn_tls_crypt {
            if let Err(reason) = self.conn.enable_dyn_tls_crypt() {
                self.phase = ServerPhase::Done;
                return self.conn.close(reason);
            }
        }
        let connected = Connected {
            cipher,
            peer_id: settings.peer_id,
            tls_ekm: proto.tls_ekm,
            dyn_tls_crypt: proto.dyn_tls_crypt,
            push: typed(&reply),
            client: Some(*identity),
        };
        self.phase = ServerPhase::Accepted {
            reply,
            sent_at: None,
            connected: Some(Box::new(connected)),
        };
        if push_requested || proto.request_push {
            self.send_push_reply(now);
        }
    }

    /// What one client is pushed, in the order [`Self::accept_client`] describes: the
    /// configuration's items as they are, the rest as typed options.
    fn push_items(&self, settings: ClientSettings, proto: &ProtocolPush) -> Vec<PushItem> {
        let mut items = self.config.push.clone();
        items.extend(settings.push);
        let mut typed = Vec::new();
        if let Some(k) = self.config.keepalive {
            typed.push(PushedOption::Ping(k.ping));
            typed.push(PushedOption::PingRestart(k.ping_restart));
        }
        if let Some((local, remote)) = settings.ifconfig_ipv6 {
            typed.push(PushedOption::IfconfigIpv6 { local, remote });
        }
        if let Some((local, remote_netmask)) = settings.ifconfig {
            typed.push(PushedOption::Ifconfig {
                local,
                remote_netmask,
            });
        }
        typed.extend(proto.options.iter().map(|&o| PushedOption::from(o)));
        items.extend(typed.into_iter().map(PushItem::Typed));
        items
    }

    /// Refuses the client identified by [`Event::ClientIdentified`]: it gets
    /// `AUTH_FAILED[,reason]`, and the session closes with [`CloseReason::AuthFailed`]
    /// after [`AUTH_FAILED_LINGER`].
    pub fn reject_client(&mut self, now: Instant, reason: Option<String>) {
        if !matches!(self.phase, ServerPhase::Authorizing { .. }) {
            return;
        }
        let close = CloseReason::AuthFailed {
            reason: reason.clone(),
        };
        self.fail(now, reason, close);
    }

    /// Tells an accepted client that the server is going away: sends `RESTART[,flags msg]`
    /// (reference 10.1) on the control channel. The session stays open so the message and
    /// its ACK can cross; the client then closes the connection (or call [`close`](Self::close)
    /// after a drain period). Does nothing before the client was accepted.
    pub fn send_restart(&mut self, signal: crate::control_msg::ServerSignal) {
        if matches!(self.phase, ServerPhase::Accepted { .. }) {
            self.conn.send_control(&ControlMessage::Restart(signal));
        }
    }

    /// Starts a soft reset now (if the current key is established).
    pub fn renegotiate(&mut self, now: Instant) {
        self.conn.renegotiate(now);
    }

    /// Ends the session; an [`Event::Closed`] with [`CloseReason::Local`] follows.
    pub fn close(&mut self, now: Instant) {
        let _ = now;
        self.phase = ServerPhase::Done;
        self.conn.close(CloseReason::Local);
    }

    /// Encrypts a tun packet in place; see
    /// [`ClientSession::send_tun_packet`](super::ClientSession::send_tun_packet).
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

    fn fail(&mut self, now: Instant, text: Option<String>, reason: CloseReason) {
        self.conn
            .send_control(&ControlMessage::AuthFailed { reason: text });
        self.conn
            .timers
            .set(Timer::Linger, now + AUTH_FAILED_LINGER);
        self.phase = ServerPhase::Rejected { reason };
    }

    fn on_key_event(&mut self, now: Instant, key_id: u8, event: KeyEvent) {
        match event {
            KeyEvent::KeyExchanged(PeerKm2::Client(km2)) if key_id == 0 => {
                self.on_client_km2(km2);
            }
            KeyEvent::KeyExchanged(_) => {}
            KeyEvent::Message(ControlMessage::PushRequest) => self.on_push_request(now),
            KeyEvent::Message(ControlMessage::Exit) => {
                self.phase = ServerPhase::Done;
                self.conn.close(CloseReason::PeerExit);
            }
            KeyEvent::Message(_) => {}
            KeyEvent::Dropped(error) => self.conn.push_event(Event::ControlMessageDropped(error)),
        }
    }

    fn on_client_km2(&mut self, km2: ClientKeyMethod2) {
        let ServerPhase::Handshake { push_requested } = self.phase else {
            return;
        };
        let cert = self.conn.primary.peer_certificate();
        let common_name = cert.as_ref().and_then(|c| {
            c.subject_name()
                .entries_by_nid(Nid::COMMONNAME)
                .next()
                .and_then(|e| e.data().to_string().ok())
        });
        let parsed = km2
            .peer_info
            .as_deref()
            .map(PeerInfo::parse)
            .unwrap_or_default();
        let identity = ClientIdentity {
            common_name,
            certificate_der: cert.and_then(|c| c.to_der().ok()),
            username: km2.username,
            password: km2.password,
            peer_info: parsed.info,
            peer_info_ignored: parsed.malformed,
            options: km2.options,
        };
        self.conn
            .push_event(Event::ClientIdentified(identity.clone()));
        self.phase = ServerPhase::Authorizing {
            identity: Box::new(identity),
            push_requested,
        };
    }

    fn on_push_request(&mut self, now: Instant) {
        match &mut self.phase {
            ServerPhase::Handshake { push_requested }
            | ServerPhase::Authorizing { push_requested, .. } => *push_requested = true,
            ServerPhase::Accepted { sent_at, .. } => {
                let recent = sent_at.is_some_and(|t| now < t + PUSH_REQUEST_IGNORE);
                if !recent {
                    self.send_push_reply(now);
                }
            }
            ServerPhase::Rejected { .. } | ServerPhase::Done => {}
        }
    }

    fn send_push_reply(&mut self, now: Instant) {
        let ServerPhase::Accepted {
            reply,
            sent_at,
            connected,
        } = &mut self.phase
        else {
            return;
        };
        *sent_at = Some(now);
        let messages: Vec<ControlMessage> = reply
            .iter()
            .map(|text| ControlMessage::parse(text))
            .collect();
        let connected = connected.take();
        for message in &messages {
            self.conn.send_control(message);
        }
        if let Some(c) = connected {
            self.conn.push_event(Event::Connected(*c));
        }
    }
}

/// Our own push run through the client-side parser, for [`Connected::push`].
fn typed(reply: &[String]) -> PushOutcome {
    let policy = PullPolicy::default();
    let mut collector = PushCollector::new();
    let mut all = PushOutcome::default();
    for text in reply {
        let options = text.split_once(',').map_or("", |(_, o)| o);
        if let Ok(Some(outcome)) = collector.push_part(&policy, options) {
            all.accepted.extend(outcome.accepted);
            all.dropped.extend(outcome.dropped);
        }
    }
    all
}

fn secs(n: u32) -> Option<Duration> {
    (n > 0).then(|| Duration::from_secs(u64::from(n)))
}
