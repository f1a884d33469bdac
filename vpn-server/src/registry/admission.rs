//! Admission before authentication: what a TCP connection must show, and by when, before it
//! may take a client's place. Pure (no I/O, no clock reads), so it is tested on a virtual
//! clock.
//!
//! ```text
//!  accept ─┬─ max-clients clients authenticated: closed at once (as upstream)
//!          ▼
//!   pending, unproven ──────── bogus first frame (framing, not a client hard reset, tls-auth
//!          │                   HMAC / tls-crypt tag or packet check fails): closed at once
//!          │                   no whole first packet within `first_packet_timeout`: closed
//!          │ valid hard reset
//!          ▼
//!   pending, proven ────────── no tunnel within `handshake_timeout` (hand-window): closed
//!          │ TLS and key-method 2 done (ClientIdentified)
//!          ▼
//!   a `max-clients` slot (registry::Slots), then Registry::admit
//! ```
//!
//! Pending connections (both kinds) are bounded apart from `max-clients` by a
//! [`netio::listen::PendingSet`] of `max_pending`: a newcomer to a full set evicts the oldest
//! unproven connection, or the oldest proven one when none is unproven, instead of being
//! refused. Without the tls-auth / tls-crypt key nobody can prove a connection, so a flood of
//! idle or bogus connections only evicts itself, and a real client, which sends its hard reset
//! as soon as it is connected, is proven within one round trip.
//!
//! Upstream (OpenVPN 2.6, TCP) closes a connection whose first packet fails the framing or
//! the tls-auth check at once, as we do ("Fatal TLS error", measured against 2.6.14); it
//! counts every accepted connection against `max-clients` and gives a silent one the whole
//! `hand-window` (60 s). The separate bound and the deadline for the first packet are ours
//! (`conformance/DEVIATIONS.md`, S2 and S3).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::log_limit::{LogLimiter, LOG_EVERY};
use protocol::opcode::{
    P_CONTROL_HARD_RESET_CLIENT_V2, P_CONTROL_HARD_RESET_CLIENT_V3, P_OPCODE_SHIFT,
};
use protocol::session::{ServerSession, SessionError};

/// Why a connection's first frame closed it at once.
#[derive(Debug, thiserror::Error)]
pub enum BogusFirstPacket {
    /// The length prefix is 0 or above what the MTU allows (the stream cannot be read on).
    #[error("bad packet length on the TCP stream")]
    Framing(#[source] netio::framed::FrameReadError),
    /// The packet is not a client's hard reset (`P_CONTROL_HARD_RESET_CLIENT_V2`/`_V3`).
    #[error("first packet has opcode {opcode}, not a client hard reset")]
    NotHardReset {
        /// The opcode (the byte's upper five bits).
        opcode: u8,
    },
    /// The control channel refused it: tls-auth HMAC or tls-crypt tag, replay or packet
    /// checks.
    #[error("first packet refused")]
    Refused(#[source] SessionError),
}

/// Checks the opcode of a connection's first packet (before the session authenticates it):
/// only a client hard reset may open a connection. An empty packet cannot come out of the
/// framing; it is refused as opcode 0.
pub fn check_first_opcode(packet: &[u8]) -> Result<(), BogusFirstPacket> {
    let opcode = packet.first().map_or(0, |b| b >> P_OPCODE_SHIFT);
    match opcode {
        P_CONTROL_HARD_RESET_CLIENT_V2 | P_CONTROL_HARD_RESET_CLIENT_V3 => Ok(()),
        opcode => Err(BogusFirstPacket::NotHardReset { opcode }),
    }
}

/// A connection's first packet into its `session`: a client hard reset (by its opcode) that
/// the session accepts, its tls-auth HMAC or tls-crypt tag verified. Anything else is bogus,
/// and the connection is closed at once (upstream: "Fatal TLS error", the connection reset).
pub fn first_packet(
    session: &mut ServerSession,
    now: Instant,
    packet: BytesMut,
) -> Result<(), BogusFirstPacket> {
    check_first_opcode(&packet)?;
    session
        .handle_packet(now, packet)
        .map(|_| ())
        .map_err(BogusFirstPacket::Refused)
}

/// Which deadline of a connection passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No whole valid first packet within `first_packet_timeout` of accept.
    FirstPacket(Duration),
    /// No tunnel within `handshake_timeout` of accept.
    Handshake(Duration),
}

/// The deadlines of one connection before its tunnel is up, both counted from accept: its
/// first valid packet, and the established tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    accepted: Instant,
    first_packet: Option<Duration>,
    handshake: Option<Duration>,
}

impl Deadlines {
    /// Both deadlines running from `accepted`.
    pub fn new(
        accepted: Instant,
        first_packet_timeout: Duration,
        handshake_timeout: Duration,
    ) -> Deadlines {
        Deadlines {
            accepted,
            first_packet: Some(first_packet_timeout),
            handshake: Some(handshake_timeout),
        }
    }

    /// The first valid packet arrived: that deadline is met.
    pub fn first_packet_arrived(&mut self) {
        self.first_packet = None;
    }

    /// Whether the first valid packet has arrived.
    pub fn awaiting_first_packet(&self) -> bool {
        self.first_packet.is_some()
    }

    /// The tunnel is up: no deadline is left.
    pub fn established(&mut self) {
        self.first_packet = None;
        self.handshake = None;
    }

    /// The earliest deadline still running.
    pub fn next(&self) -> Option<Instant> {
        [self.first_packet, self.handshake]
            .into_iter()
            .flatten()
            .map(|d| self.accepted + d)
            .min()
    }

    /// The deadline that has passed at `now`, the first packet's first.
    pub fn expired(&self, now: Instant) -> Option<Expired> {
        let passed = |d: Option<Duration>| d.filter(|d| now >= self.accepted + *d);
        passed(self.first_packet)
            .map(Expired::FirstPacket)
            .or(passed(self.handshake).map(Expired::Handshake))
    }
}

/// The pre-authentication events a flood repeats, each logged at most once per
/// [`netio::log_limit::LOG_EVERY`] (every one is counted in the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreAuthEvent {
    /// A connection closed at accept (or at authentication) by `max-clients`.
    MaxClients,
    /// A connection closed at once for its first frame.
    BadFirstPacket,
    /// A connection closed by the first-packet deadline.
    NoFirstPacket,
    /// A pending connection evicted for a newer one.
    Evicted,
}

/// One [`LogLimiter`] per [`PreAuthEvent`], so a flood of one kind does not hide another.
#[derive(Debug, Clone)]
pub struct PreAuthLogs {
    limiters: [LogLimiter; 4],
}

impl Default for PreAuthLogs {
    fn default() -> Self {
        PreAuthLogs {
            limiters: [const { LogLimiter::new(LOG_EVERY) }; 4],
        }
    }
}

impl PreAuthLogs {
    /// `event` at `now`: `Some(n)` to log it with `n` events of its kind left unlogged since
    /// the last line of that kind, `None` to stay silent.
    pub fn allow(&mut self, event: PreAuthEvent, now: Instant) -> Option<u64> {
        let i = match event {
            PreAuthEvent::MaxClients => 0,
            PreAuthEvent::BadFirstPacket => 1,
            PreAuthEvent::NoFirstPacket => 2,
            PreAuthEvent::Evicted => 3,
        };
        self.limiters[i].allow(now)
    }
}
