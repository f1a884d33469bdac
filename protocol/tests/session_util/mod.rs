//! A client and a server session wired together in memory on a virtual clock (a base
//! `Instant` plus an offset), with seeded randomness and an optional lossy control channel.
#![allow(dead_code)] // each test file uses a different part

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use openssl::ssl::SslVersion;
use protocol::data::{DataCipher, DATA_TAILROOM};
use protocol::digest::Digest;
use protocol::framing::FrameDecoder;
use protocol::key::{Key2, KeyDirection, KEY2_LEN};
use protocol::ncp::DataCiphers;
use protocol::opcode::{P_DATA_V1, P_DATA_V2, P_OPCODE_SHIFT};
use protocol::push::options::{RouteGatewayAddr, Topology};
use protocol::push::PushedOption;
use protocol::session::{
    ClientConfig, ClientSession, ClientSettings, ControlProtection, Event, ServerConfig,
    ServerEndpoint, ServerSession, SessionConfig, SessionError, SEND_HEADROOM,
};
use protocol::tls::PeerVerifier;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use super::common::{self, Usage};

pub const UNIX_BASE: u64 = 1_700_000_000;

/// The two sides' configurations, before the sessions are made.
pub struct Setup {
    pub client: ClientConfig,
    pub server: ServerConfig,
    /// What the server application answers to `ClientIdentified`: `Ok` accepts with these
    /// settings, `Err` rejects with the reason.
    pub decision: Result<ClientSettings, Option<String>>,
    pub seed: u64,
}

impl Setup {
    /// tls-auth SHA256, default 2.6 ciphers on both sides, TLS 1.3.
    pub fn new(seed: u64) -> Setup {
        Setup::with_tls(seed, None)
    }

    pub fn with_tls(seed: u64, max: Option<SslVersion>) -> Setup {
        let ca = common::make_ca("session test CA");
        let server_id = common::make_leaf(&ca, "server", Usage::Server, 2);
        let client_id = common::make_leaf(&ca, "alice", Usage::Client, 3);
        let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x5eed);
        let mut key = [0u8; KEY2_LEN];
        rng.fill_bytes(&mut key);
        let key = Key2::from_bytes(&key);
        let protection = |direction| ControlProtection::TlsAuth {
            key: key.clone(),
            direction,
            digest: Digest::Sha256,
        };
        let server_tls = common::server_context(&ca.cert, &server_id, max);
        let client_tls = common::client_context(&ca.cert, Some(&client_id), max);
        let mut server = ServerConfig::new(SessionConfig::new(
            server_tls,
            protection(KeyDirection::Normal),
        ));
        server.push = vec![
            PushedOption::RouteGateway(RouteGatewayAddr::Addr(Ipv4Addr::new(10, 8, 0, 1))).into(),
            PushedOption::Topology(Topology::Subnet).into(),
        ];
        let client = ClientConfig::new(SessionConfig::new(
            client_tls,
            protection(KeyDirection::Inverse),
        ));
        Setup {
            client,
            server,
            decision: Ok(ClientSettings {
                ifconfig: Some((Ipv4Addr::new(10, 8, 0, 2), Ipv4Addr::new(255, 255, 255, 0))),
                ..ClientSettings::default()
            }),
            seed,
        }
    }

    /// Both sides offer every cipher; the server prefers `cipher`.
    pub fn cipher(mut self, cipher: DataCipher) -> Setup {
        let all = DataCiphers::new(DataCipher::ALL.to_vec()).unwrap();
        self.client.session.data_ciphers = all;
        let mut pref = vec![cipher];
        pref.extend(DataCipher::ALL.iter().copied().filter(|&c| c != cipher));
        self.server.session.data_ciphers = DataCiphers::new(pref).unwrap();
        self
    }

    pub fn client_verifier(mut self, v: Arc<dyn PeerVerifier>) -> Setup {
        self.client.session.verifier = v;
        self
    }

    pub fn build(self) -> Pair {
        let base = Instant::now();
        let mut endpoint = ServerEndpoint::new(self.server);
        let client = ClientSession::new(
            self.client,
            Box::new(ChaCha20Rng::seed_from_u64(self.seed)),
            base,
        );
        let server = endpoint.new_session(
            Box::new(ChaCha20Rng::seed_from_u64(self.seed.wrapping_add(1))),
            base,
        );
        Pair {
            base,
            elapsed: Duration::ZERO,
            endpoint,
            client,
            server,
            c2s: VecDeque::new(),
            s2c: VecDeque::new(),
            decision: self.decision,
            client_events: Vec::new(),
            server_events: Vec::new(),
            client_tun: Vec::new(),
            server_tun: Vec::new(),
            client_errors: Vec::new(),
            server_errors: Vec::new(),
            lossy: None,
            blackhole_s2c: false,
            blackhole_c2s: false,
            rng: ChaCha20Rng::seed_from_u64(self.seed.wrapping_add(2)),
        }
    }
}

/// How the control channel misbehaves: probabilities in percent.
#[derive(Debug, Clone, Copy)]
pub struct Lossy {
    pub loss: u32,
    pub duplicate: u32,
    pub reorder: u32,
}

pub struct Pair {
    pub base: Instant,
    pub elapsed: Duration,
    pub endpoint: ServerEndpoint,
    pub client: ClientSession,
    pub server: ServerSession,
    /// Frames in flight (without length prefix).
    pub c2s: VecDeque<BytesMut>,
    pub s2c: VecDeque<BytesMut>,
    pub decision: Result<ClientSettings, Option<String>>,
    pub client_events: Vec<Event>,
    pub server_events: Vec<Event>,
    pub client_tun: Vec<BytesMut>,
    pub server_tun: Vec<BytesMut>,
    pub client_errors: Vec<SessionError>,
    pub server_errors: Vec<SessionError>,
    pub lossy: Option<Lossy>,
    pub blackhole_s2c: bool,
    pub blackhole_c2s: bool,
    rng: ChaCha20Rng,
}

fn is_data(frame: &[u8]) -> bool {
    matches!(
        frame.first().map(|b| b >> P_OPCODE_SHIFT),
        Some(P_DATA_V1 | P_DATA_V2)
    )
}

impl Pair {
    pub fn now(&self) -> Instant {
        self.base + self.elapsed
    }

    pub fn unix(&self) -> u64 {
        UNIX_BASE + self.elapsed.as_secs()
    }

    fn enqueue(&mut self, to_server: bool, mut framed: BytesMut) {
        let decoder = FrameDecoder::new();
        while let Some(frame) = decoder.decode(&mut framed).unwrap() {
            if (to_server && self.blackhole_c2s) || (!to_server && self.blackhole_s2c) {
                continue;
            }
            let queue = if to_server {
                &mut self.c2s
            } else {
                &mut self.s2c
            };
            match self.lossy {
                Some(l) if !is_data(&frame) => {
                    let roll = self.rng.next_u32() % 100;
                    if roll < l.loss {
                        continue;
                    }
                    let dup = self.rng.next_u32() % 100 < l.duplicate;
                    let reorder = self.rng.next_u32() % 100 < l.reorder;
                    if reorder && !queue.is_empty() {
                        let at = self.rng.next_u32() as usize % queue.len();
                        queue.insert(at, frame.clone());
                    } else {
                        queue.push_back(frame.clone());
                    }
                    if dup {
                        queue.push_back(frame);
                    }
                }
                _ => queue.push_back(frame),
            }
        }
        assert!(framed.is_empty(), "poll_transmit returned a partial frame");
    }

    /// Moves everything that is ready; returns whether anything happened.
    pub fn pump_once(&mut self) -> bool {
        let now = self.now();
        let unix = self.unix();
        let mut progress = false;
        while let Some(out) = self.client.poll_transmit(now, unix) {
            self.enqueue(true, out);
            progress = true;
        }
        while let Some(out) = self.server.poll_transmit(now, unix) {
            self.enqueue(false, out);
            progress = true;
        }
        while let Some(frame) = self.c2s.pop_front() {
            progress = true;
            match self.server.handle_packet(now, frame) {
                Ok(Some(p)) => self.server_tun.push(p),
                Ok(None) => {}
                Err(e) => self.server_errors.push(e),
            }
        }
        while let Some(frame) = self.s2c.pop_front() {
            progress = true;
            match self.client.handle_packet(now, frame) {
                Ok(Some(p)) => self.client_tun.push(p),
                Ok(None) => {}
                Err(e) => self.client_errors.push(e),
            }
        }
        while let Some(e) = self.client.poll_event() {
            self.client_events.push(e);
            progress = true;
        }
        while let Some(e) = self.server.poll_event() {
            progress = true;
            if let Event::ClientIdentified(_) = &e {
                match self.decision.clone() {
                    Ok(settings) => self.server.accept_client(now, settings),
                    Err(reason) => self.server.reject_client(now, reason),
                }
            }
            self.server_events.push(e);
        }
        progress
    }

    /// Pumps until nothing moves at the current instant.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            if !self.pump_once() {
                return;
            }
        }
        panic!("no quiescence");
    }

    /// Pumps, then advances the clock to the next timer and runs it; stops at `limit`.
    /// Returns false if no timer is pending.
    pub fn step(&mut self, limit: Duration) -> bool {
        self.pump();
        let next = [self.client.poll_timeout(), self.server.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next else {
            return false;
        };
        let target = (next.max(self.now()) - self.base).min(limit);
        if target <= self.elapsed && self.elapsed >= limit {
            return false;
        }
        self.elapsed = target.max(self.elapsed);
        let now = self.now();
        self.client.handle_timeout(now);
        self.server.handle_timeout(now);
        self.pump();
        true
    }

    /// Runs until `done` holds or `limit` of virtual time has passed (from the start).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Pair) -> bool) -> bool {
        self.pump();
        while !done(self) {
            if self.elapsed >= limit || !self.step(limit) {
                return done(self);
            }
        }
        true
    }

    /// Advances the clock by `d`, running every timer on the way.
    pub fn advance(&mut self, d: Duration) {
        let end = self.elapsed + d;
        self.pump();
        while self.elapsed < end {
            if !self.step(end) {
                self.elapsed = end;
                let now = self.now();
                self.client.handle_timeout(now);
                self.server.handle_timeout(now);
                self.pump();
            }
        }
    }

    pub fn connected(&self) -> bool {
        let c = self
            .client_events
            .iter()
            .any(|e| matches!(e, Event::Connected(_)));
        let s = self
            .server_events
            .iter()
            .any(|e| matches!(e, Event::Connected(_)));
        c && s
    }

    pub fn client_closed(&self) -> bool {
        self.client_events
            .iter()
            .any(|e| matches!(e, Event::Closed(_)))
    }

    pub fn server_closed(&self) -> bool {
        self.server_events
            .iter()
            .any(|e| matches!(e, Event::Closed(_)))
    }

    /// Encrypts `payload` on one side and queues the frame for the other.
    pub fn send_data(&mut self, from_client: bool, payload: &[u8]) -> Result<(), SessionError> {
        let now = self.now();
        let mut buf = BytesMut::with_capacity(SEND_HEADROOM + payload.len() + DATA_TAILROOM);
        buf.resize(SEND_HEADROOM, 0);
        buf.put_slice(payload);
        let r = if from_client {
            self.client.send_tun_packet(now, &mut buf, SEND_HEADROOM)
        } else {
            self.server.send_tun_packet(now, &mut buf, SEND_HEADROOM)
        };
        r?;
        self.enqueue(from_client, buf);
        Ok(())
    }

    /// Handshake until both sides are connected; panics otherwise.
    pub fn connect(&mut self) {
        assert!(
            self.run_until(Duration::from_secs(120), |p| p.connected()
                || p.client_closed()
                || p.server_closed()),
            "no connection: client {:?} server {:?}",
            self.client_events,
            self.server_events
        );
        assert!(
            self.connected(),
            "closed: client {:?} server {:?}",
            self.client_events,
            self.server_events
        );
    }
}
