//! The session pump: one connection's driving loop for both roles, after the driving contract
//! of `protocol::session` and quinn's connection driver. [`Pump`] owns the session and the
//! socket's two halves; the role (the server's connection, the client's) implements
//! [`Role`] for what only it knows: its own inputs (the tun device or its queue, shutdown),
//! the session's events, where a decrypted packet goes, and deadlines of its own.
//!
//! One turn of [`Pump::run`]:
//!
//! 1. an expired session timer runs even if the last wakeup was for something else (a flood
//!    on one source must not starve pings and renegotiation);
//! 2. [`Pump::drive_output`]: `poll_transmit` until quiet (queued on the [`FrameWriter`]), then
//!    `poll_event`, each event to [`Role::on_event`], again until both are quiet; then one
//!    vectored write of everything queued. After [`Event::Closed`] the last words are
//!    written and the loop ends;
//! 3. one wakeup, unbiased, of three: the role's input ([`Role::next_input`] →
//!    [`Role::on_input`]), packets from the socket ([`Pump::on_frames`]: the first, then up
//!    to [`RECV_BATCH`] already buffered, decrypted in place, their payloads written to the
//!    role's [`TunWriter`] in one call), or the earliest timer ([`Pump::on_timeout`]: the
//!    role's deadlines, then the session's).
//!
//! Tun packets go the other way through [`Pump::send_tun_packets`] (encrypted in place into
//! their own buffers, queued for the next write). Nothing here allocates or copies per packet:
//! the reader splits packets off its buffer, the writer hands the buffers to the kernel, and
//! the payload batch is one vector kept for the connection's life.
//!
//! Until the session's [`Event::Connected`], [`Handshake`] can change how it reads and writes
//! (the client through a proxy running Nagle's algorithm).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use protocol::control_msg::ControlMsgError;
use protocol::opcode::{P_ACK_V1, P_OPCODE_SHIFT};
use protocol::session::{
    ClientSession, CloseReason, Event, ServerSession, SessionError, SEND_HEADROOM,
};
use tracing::{debug, warn};

use crate::clock::unix_now;
use crate::framed::{FrameReadError, FrameReader, FrameWriter, RECV_BATCH};
use crate::log_limit::LogLimiter;
use crate::report::chain;
use crate::tun::{PacketLayout, TunWriter, TAP_FRAME_EXTRA};

/// Longest a lone P_ACK_V1 waits for company during the handshake (see
/// [`Handshake::hold_lone_acks`]): well above the gaps seen between a peer's control packets
/// (0.05-0.2 ms), far below any retransmission timeout (seconds).
pub const ACK_HOLD: Duration = Duration::from_millis(1);

/// What a role does besides pumping its session; see the module docs for when each is called.
/// Every method runs on the connection's task, between two turns of the loop.
pub trait Role {
    /// `ClientSession` or `ServerSession`.
    type Session: Session;
    /// What [`Role::next_input`] waits for.
    type Input;
    /// Why the role ended the connection (besides the ends every role has: [`Stop`]).
    type Ended;

    /// The next input from the role's own sources (shutdown, the tun device or its queue).
    /// Cancel-safe: it races the socket and the timer.
    fn next_input(&mut self) -> impl Future<Output = Self::Input>;

    /// Handles what [`Role::next_input`] returned (tun packets: [`Pump::send_tun_packets`]).
    fn on_input(
        &mut self,
        pump: &mut Pump<Self::Session>,
        input: Self::Input,
    ) -> impl Future<Output = Result<(), Stop<Self::Ended>>>;

    /// One session event; never [`Event::Closed`], which ends the loop with
    /// [`Stop::Closed`]. The pump writes what is queued after the events, so a handler that
    /// waits long (a script) first writes it itself ([`Pump::flush`]).
    fn on_event(
        &mut self,
        pump: &mut Pump<Self::Session>,
        event: Event,
    ) -> impl Future<Output = Result<(), Stop<Self::Ended>>>;

    /// A decrypted payload from the peer: into `to_tun` (written to [`Role::tun_writer`] after
    /// the batch), or elsewhere.
    fn on_payload(&mut self, payload: BytesMut, to_tun: &mut Vec<BytesMut>);

    /// The device the payloads of a batch are written to; none: they are dropped.
    fn tun_writer(&self) -> Option<&TunWriter>;

    /// The earliest deadline of the role's own (besides the session's timer).
    fn deadline(&self) -> Option<Instant> {
        None
    }

    /// A timer fired at `now` (the role's deadline or the session's): whether a deadline of
    /// the role's ends the connection. Runs before the session's timers.
    fn on_deadline(&mut self, now: Instant) -> Result<(), Self::Ended> {
        let _ = now;
        Ok(())
    }

    /// Bytes read from the socket so far, after each batch.
    fn on_received(&mut self, total: u64) {
        let _ = total;
    }

    /// Bytes written to the socket so far, after each write.
    fn on_sent(&mut self, total: u64) {
        let _ = total;
    }
}

/// Why [`Pump::run`] returned.
#[derive(Debug, thiserror::Error)]
pub enum Stop<E> {
    /// The session closed (its last packets were written, as far as the socket took them).
    #[error("session closed")]
    Closed(#[source] CloseReason),
    /// The peer closed the TCP connection between two packets.
    #[error("connection closed by peer")]
    PeerClosed,
    /// Reading the socket failed, or its framing is broken.
    #[error("read failed")]
    Read(#[source] FrameReadError),
    /// Writing to the socket failed.
    #[error("write failed")]
    Write(#[source] io::Error),
    /// The role ended the connection.
    #[error("ended by the role")]
    Role(E),
}

impl<E> Stop<E> {
    /// The role's own end (`Ok`), or the pump's (`Err`, without a role variant): lets a role
    /// keep one `Stop<Infallible>` among its reasons instead of copies of the pump's.
    ///
    /// # Errors
    ///
    /// The pump's reason, when it was not [`Stop::Role`].
    pub fn into_role(self) -> Result<E, Stop<Infallible>> {
        match self {
            Stop::Role(e) => Ok(e),
            Stop::Closed(reason) => Err(Stop::Closed(reason)),
            Stop::PeerClosed => Err(Stop::PeerClosed),
            Stop::Read(e) => Err(Stop::Read(e)),
            Stop::Write(e) => Err(Stop::Write(e)),
        }
    }
}

/// How the pump reads and writes until the session's [`Event::Connected`]; by default as
/// after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Handshake {
    /// Batch with each received packet also what the socket has received by now
    /// ([`FrameReader::buffered_or_arrived`]), so a TLS flight in two packets gets one reply.
    pub read_arrived: bool,
    /// An output that is nothing but one P_ACK_V1 waits up to [`ACK_HOLD`] for what the session
    /// sends next and goes out in the same write. A peer's control packets often come a
    /// fraction of a millisecond apart (a TLS flight, the key-method-2 message after the
    /// session tickets): answering the first with a lone ACK and the second with a reply makes
    /// two writes in quick succession, and a proxy running Nagle's algorithm (tinyproxy) holds
    /// the second until the server has acknowledged the first at the TCP level, which an
    /// upstream server delays by about 40 ms. The packets and their order are unchanged; only
    /// the write that carries them is.
    pub hold_lone_acks: bool,
}

/// One connection's session and socket, and the loop that drives them; see the module docs.
#[derive(Debug)]
pub struct Pump<S> {
    session: S,
    reader: FrameReader,
    writer: FrameWriter,
    handshake: Handshake,
    /// Whether the session reported [`Event::Connected`].
    connected: bool,
    /// Until when the lone P_ACK_V1 queued waits ([`Handshake::hold_lone_acks`]).
    ack_hold: Option<Instant>,
    /// The decrypted payloads of one receive batch, bound for the device.
    to_tun: Vec<BytesMut>,
}

impl<S: Session> Pump<S> {
    /// A pump for `session` over the socket's two halves.
    pub fn new(session: S, reader: FrameReader, writer: FrameWriter, handshake: Handshake) -> Self {
        Pump {
            session,
            reader,
            writer,
            handshake,
            connected: false,
            ack_hold: None,
            to_tun: Vec::with_capacity(RECV_BATCH),
        }
    }

    /// The session.
    pub fn session(&self) -> &S {
        &self.session
    }

    /// The session, for commands (`accept_client`, `close`, ...).
    pub fn session_mut(&mut self) -> &mut S {
        &mut self.session
    }

    /// The socket's receiving half (e.g. to change `TCP_QUICKACK`).
    pub fn reader_mut(&mut self) -> &mut FrameReader {
        &mut self.reader
    }

    /// Drives the session until it closes, the socket fails, or the role ends it.
    pub async fn run<R: Role<Session = S>>(&mut self, role: &mut R) -> Stop<R::Ended> {
        loop {
            let now = Instant::now();
            if self.session.poll_timeout().is_some_and(|t| t <= now) {
                self.session.handle_timeout(now);
            }
            if let Err(stop) = self.drive_output(role).await {
                return stop;
            }
            let wake = [self.session.poll_timeout(), role.deadline(), self.ack_hold]
                .into_iter()
                .flatten()
                .min();
            // Unbiased: the socket and the role's sources take turns under load.
            let turn = tokio::select! {
                input = role.next_input() => role.on_input(self, input).await,
                frame = self.reader.next() => self.on_frames(role, frame).await,
                () = sleep_until(wake) => self.on_timeout(role),
            };
            if let Err(stop) = turn {
                return stop;
            }
        }
    }

    /// Queues the session's transmits and hands its events to the role until both are quiet,
    /// then writes what is queued (unless a lone ACK waits: [`Handshake::hold_lone_acks`]).
    /// After [`Event::Closed`]: what is left queued is written, errors ignored, and the
    /// reason returned.
    pub async fn drive_output<R: Role<Session = S>>(
        &mut self,
        role: &mut R,
    ) -> Result<(), Stop<R::Ended>> {
        let now = Instant::now();
        let was_empty = self.writer.is_empty();
        let mut queued = false;
        let mut closed = None;
        loop {
            let mut progressed = false;
            while let Some(out) = self.session.poll_transmit(now, unix_now()) {
                self.writer.push(out);
                progressed = true;
            }
            queued |= progressed;
            while let Some(event) = self.session.poll_event() {
                progressed = true;
                match event {
                    Event::Closed(reason) => closed = Some(reason),
                    event => {
                        let connected = matches!(event, Event::Connected(_));
                        self.connected |= connected;
                        role.on_event(self, event).await?;
                        if connected {
                            self.deliver_early_payloads(role).await;
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
        if let Some(reason) = closed {
            let _ = self.flush_to(role).await;
            return Err(Stop::Closed(reason));
        }
        if self.holds_output(now, was_empty, queued) {
            return Ok(());
        }
        self.flush_to(role).await.map_err(Stop::Write)
    }

    /// Handles a frame from the socket, and every packet already buffered behind it (at most
    /// [`RECV_BATCH`], fewer once the session closed); the payloads go to the role, then to its
    /// device in one write.
    pub async fn on_frames<R: Role<Session = S>>(
        &mut self,
        role: &mut R,
        frame: Result<Option<BytesMut>, FrameReadError>,
    ) -> Result<(), Stop<R::Ended>> {
        let first = match frame {
            Ok(Some(packet)) => packet,
            Ok(None) => return Err(Stop::PeerClosed),
            Err(e) => return Err(Stop::Read(e)),
        };
        let now = Instant::now();
        let arrived = self.handshake.read_arrived && !self.connected;
        let Pump {
            session,
            reader,
            to_tun,
            ..
        } = self;
        let mut handled = 0;
        reader
            .receive_batch(first, arrived, |packet| {
                match session.handle_packet(now, packet) {
                    Ok(Some(payload)) => role.on_payload(payload, to_tun),
                    // A fatal error closed the session: its `Closed` event says why.
                    Ok(None) | Err(SessionError::Fatal) => {}
                    Err(e) => debug!(error = %chain(&e), "received packet dropped"),
                }
                handled += 1;
                handled < RECV_BATCH && !session.is_closed()
            })
            .map_err(Stop::Read)?;
        role.on_received(self.reader.received());
        // What came in with the handshake's last packets (a peer sends its first data right
        // behind its push, e.g. packets it held for a reconnecting client) waits for
        // `Connected`, which the session reports after this batch, one batch at most: the
        // device may open only then (the client's first), and a device kept from an earlier
        // connection may not route the answers yet (an HA shoot client's return path goes in
        // at `Connected`).
        if !self.connected {
            self.to_tun.truncate(RECV_BATCH);
            return Ok(());
        }
        match role.tun_writer() {
            Some(writer) => writer.write(&mut self.to_tun).await,
            None => self.to_tun.clear(),
        }
        Ok(())
    }

    /// After `Connected`: the payloads kept until then go to the device now.
    async fn deliver_early_payloads<R: Role<Session = S>>(&mut self, role: &mut R) {
        if self.to_tun.is_empty() {
            return;
        }
        match role.tun_writer() {
            Some(writer) => writer.write(&mut self.to_tun).await,
            None => self.to_tun.clear(),
        }
    }

    /// A timer fired: the role's deadlines first, then the session's timers if due.
    pub fn on_timeout<R: Role<Session = S>>(&mut self, role: &mut R) -> Result<(), Stop<R::Ended>> {
        let now = Instant::now();
        role.on_deadline(now).map_err(Stop::Role)?;
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
        }
        Ok(())
    }

    /// Encrypts each tun packet in place (laid out as [`tun_layout`]) and queues it for the
    /// next write; a packet the session cannot send is dropped.
    pub fn send_tun_packets(&mut self, packets: impl IntoIterator<Item = BytesMut>) {
        let now = Instant::now();
        for mut packet in packets {
            match self
                .session
                .send_tun_packet(now, &mut packet, SEND_HEADROOM)
            {
                Ok(()) => self.writer.push(packet),
                Err(e) => debug!(error = %chain(&e), "tun packet not sent"),
            }
        }
    }

    /// Writes what is queued now (a lone ACK's wait ends).
    pub async fn flush(&mut self) -> io::Result<()> {
        self.ack_hold = None;
        self.writer.flush().await
    }

    /// Writes what is queued, then closes the sending direction (TCP FIN).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.ack_hold = None;
        self.writer.shutdown().await
    }

    /// Writes what is queued and tells the role the byte count.
    async fn flush_to<R: Role<Session = S>>(&mut self, role: &mut R) -> io::Result<()> {
        if self.writer.is_empty() {
            self.ack_hold = None;
            return Ok(());
        }
        let written = self.flush().await;
        role.on_sent(self.writer.sent());
        written
    }

    /// Whether the output queued stays queued for now: a lone ACK during the handshake
    /// ([`Handshake::hold_lone_acks`]) until something follows it or [`ACK_HOLD`] passed.
    fn holds_output(&mut self, now: Instant, was_empty: bool, queued: bool) -> bool {
        if !self.handshake.hold_lone_acks || self.connected {
            return false;
        }
        match self.ack_hold {
            None if was_empty && self.writer.only_queued().is_some_and(is_lone_ack) => {
                self.ack_hold = Some(now + ACK_HOLD);
                true
            }
            Some(until) => !queued && now < until,
            None => false,
        }
    }
}

/// Where a tun packet read for a session sits in its buffer: [`SEND_HEADROOM`] in front, the
/// session's tailroom behind, so it is encrypted in place. `tap`: a tap device's frames, the MTU
/// plus [`TAP_FRAME_EXTRA`].
pub fn tun_layout(mtu: u16, tap: bool) -> PacketLayout {
    PacketLayout {
        headroom: SEND_HEADROOM,
        max_len: usize::from(mtu) + if tap { TAP_FRAME_EXTRA } else { 0 },
        tailroom: protocol::data::DATA_TAILROOM,
    }
}

/// Logs a text control message the session dropped ([`Event::ControlMessageDropped`]) as
/// `log` allows (the peer decides how often), `from` naming the peer ("client", "server").
pub fn log_dropped_control(log: &mut LogLimiter, error: &ControlMsgError, from: &str) {
    if let Some(suppressed) = log.allow(Instant::now()) {
        warn!(
            error = %error,
            text = %error.escaped_message().unwrap_or_default(),
            suppressed,
            "control message from the {from} dropped"
        );
    }
}

/// Sleeps until `deadline`; never resolves without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Whether `out` is exactly one framed P_ACK_V1 (the opcode byte is in clear with every
/// control-channel protection).
fn is_lone_ack(out: &[u8]) -> bool {
    out.len() > 2
        && usize::from(u16::from_be_bytes([out[0], out[1]])) == out.len() - 2
        && out[2] >> P_OPCODE_SHIFT == P_ACK_V1
}

/// The driving contract of `protocol::session`, as the pump calls it: what
/// [`ClientSession`] and [`ServerSession`] both offer (see their docs).
pub trait Session {
    /// `handle_packet`: one received frame; a data packet's payload decrypted in place.
    fn handle_packet(
        &mut self,
        now: Instant,
        packet: BytesMut,
    ) -> Result<Option<BytesMut>, SessionError>;
    /// `handle_timeout`: runs the timers expired at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// `send_tun_packet`: encrypts `buf[offset..]` in place into one framed packet.
    fn send_tun_packet(
        &mut self,
        now: Instant,
        buf: &mut BytesMut,
        offset: usize,
    ) -> Result<(), SessionError>;
    /// `poll_transmit`: framed control packets to write.
    fn poll_transmit(&mut self, now: Instant, unix_secs: u64) -> Option<BytesMut>;
    /// `poll_event`: the next event.
    fn poll_event(&mut self) -> Option<Event>;
    /// `poll_timeout`: when to call `handle_timeout` next.
    fn poll_timeout(&self) -> Option<Instant>;
    /// `is_closed`: whether the session ended.
    fn is_closed(&self) -> bool;
}

macro_rules! session_contract {
    ($t:ty) => {
        impl Session for $t {
            fn handle_packet(
                &mut self,
                now: Instant,
                packet: BytesMut,
            ) -> Result<Option<BytesMut>, SessionError> {
                <$t>::handle_packet(self, now, packet)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$t>::handle_timeout(self, now)
            }
            fn send_tun_packet(
                &mut self,
                now: Instant,
                buf: &mut BytesMut,
                offset: usize,
            ) -> Result<(), SessionError> {
                <$t>::send_tun_packet(self, now, buf, offset)
            }
            fn poll_transmit(&mut self, now: Instant, unix_secs: u64) -> Option<BytesMut> {
                <$t>::poll_transmit(self, now, unix_secs)
            }
            fn poll_event(&mut self) -> Option<Event> {
                <$t>::poll_event(self)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$t>::poll_timeout(self)
            }
            fn is_closed(&self) -> bool {
                <$t>::is_closed(self)
            }
        }
    };
}

session_contract!(ClientSession);
session_contract!(ServerSession);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_ack_is_one_framed_p_ack_v1() {
        // P_ACK_V1 (5 << 3) with key id 0, framed: length 4, then the packet.
        let ack = [0, 4, 5 << 3, 1, 2, 3];
        assert!(is_lone_ack(&ack));
        // A control packet (P_CONTROL_V1 = 4) is not.
        assert!(!is_lone_ack(&[0, 4, 4 << 3, 1, 2, 3]));
        // An ACK followed by another packet is not alone.
        let mut two = ack.to_vec();
        two.extend_from_slice(&[0, 2, 4 << 3, 0]);
        assert!(!is_lone_ack(&two));
        // Key id bits do not matter; short or empty output is not an ACK.
        assert!(is_lone_ack(&[0, 1, (5 << 3) | 2]));
        assert!(!is_lone_ack(&[0, 0]));
        assert!(!is_lone_ack(&[]));
    }
}
