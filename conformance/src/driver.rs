//! A small blocking driver for `protocol`'s sans-IO sessions over a real TCP connection: the
//! interop tests run our `ClientSession` / `ServerSession` against upstream OpenVPN with it.
//!
//! It follows the sessions' driving contract literally: after every input (a framed packet
//! from the socket, a timer), it writes what `poll_transmit` returns, collects the events and
//! the tun payloads, and sleeps in `read` no longer than until `poll_timeout`. Time is the
//! real clock here (`Instant::now()` and the unix time). The real binaries use `netio`
//! instead; this one is for tests only and stays simple.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use protocol::framing::FrameDecoder;
use protocol::session::{Event, SessionError, SEND_HEADROOM};

use crate::LabError;

/// The session contract the driver needs; both roles implement it (netio's, the one the
/// binaries' session pump drives).
pub use netio::pump::Session;

/// The longest the driver sleeps in one `read` (so callers' deadlines are kept).
const MAX_WAIT: Duration = Duration::from_millis(50);

/// A session and its TCP connection.
#[derive(Debug)]
pub struct Driver<S> {
    /// The session; tests may call commands on it between runs (e.g. `accept_client`).
    pub session: S,
    stream: TcpStream,
    decoder: FrameDecoder,
    inbound: BytesMut,
    /// Tun payloads received so far, in order.
    pub received: Vec<BytesMut>,
    /// Session errors of dropped packets, in order (a healthy run has none).
    pub dropped: Vec<SessionError>,
    closed_by_peer: bool,
}

impl<S: Session> Driver<S> {
    /// Drives `session` over `stream`.
    pub fn new(session: S, stream: TcpStream) -> Result<Driver<S>, LabError> {
        stream
            .set_nodelay(true)
            .map_err(|source| LabError::Socket {
                what: "set_nodelay",
                source,
            })?;
        Ok(Driver {
            session,
            stream,
            decoder: FrameDecoder::new(),
            inbound: BytesMut::with_capacity(64 * 1024),
            received: Vec::new(),
            dropped: Vec::new(),
            closed_by_peer: false,
        })
    }

    /// Whether the peer closed the TCP connection.
    pub fn closed_by_peer(&self) -> bool {
        self.closed_by_peer
    }

    /// Encrypts `payload` as a tun packet and writes it.
    pub fn send_payload(&mut self, payload: &[u8]) -> Result<(), LabError> {
        let mut buf = BytesMut::with_capacity(SEND_HEADROOM + payload.len() + 64);
        buf.resize(SEND_HEADROOM, 0);
        buf.extend_from_slice(payload);
        self.session
            .send_tun_packet(Instant::now(), &mut buf, SEND_HEADROOM)
            .map_err(|e| LabError::Protocol {
                what: "send_tun_packet".into(),
                source: Box::new(e),
            })?;
        self.write(&buf)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), LabError> {
        self.stream
            .write_all(bytes)
            .map_err(|source| LabError::Socket {
                what: "write",
                source,
            })
    }

    /// Runs the session until `until` returns true for an event (that event is returned), or
    /// `deadline` passes (`Ok(None)`), or the peer closes the connection (`Ok(None)` with
    /// [`closed_by_peer`](Self::closed_by_peer) set). Every event seen is passed to `until`.
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut until: impl FnMut(&mut S, &Event) -> bool,
    ) -> Result<Option<Event>, LabError> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let now = Instant::now();
            if self.session.poll_timeout().is_some_and(|t| t <= now) {
                self.session.handle_timeout(now);
            }
            while let Some(out) = self.session.poll_transmit(now, unix_now()) {
                self.write(&out)?;
            }
            while let Some(event) = self.session.poll_event() {
                if until(&mut self.session, &event) {
                    // Commands the callback issued may have queued output.
                    while let Some(out) = self.session.poll_transmit(Instant::now(), unix_now()) {
                        self.write(&out)?;
                    }
                    return Ok(Some(event));
                }
            }
            // Commands issued by the callback (e.g. accept_client) may have queued output.
            while let Some(out) = self.session.poll_transmit(Instant::now(), unix_now()) {
                self.write(&out)?;
            }
            if now >= deadline || self.closed_by_peer {
                return Ok(None);
            }
            let mut wait = deadline.saturating_duration_since(now).min(MAX_WAIT);
            if let Some(t) = self.session.poll_timeout() {
                wait = wait.min(t.saturating_duration_since(now));
            }
            self.stream
                .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
                .map_err(|source| LabError::Socket {
                    what: "set_read_timeout",
                    source,
                })?;
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed_by_peer = true,
                Ok(n) => {
                    self.inbound.extend_from_slice(&chunk[..n]);
                    self.handle_inbound()?;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(source) => {
                    return Err(LabError::Socket {
                        what: "read",
                        source,
                    })
                }
            }
        }
    }

    fn handle_inbound(&mut self) -> Result<(), LabError> {
        loop {
            let frame = self
                .decoder
                .decode(&mut self.inbound)
                .map_err(|e| LabError::Protocol {
                    what: "framing of a received packet".into(),
                    source: Box::new(e),
                })?;
            let Some(packet) = frame else {
                return Ok(());
            };
            match self.session.handle_packet(Instant::now(), packet) {
                Ok(Some(payload)) => self.received.push(payload),
                Ok(None) => {}
                Err(e) => self.dropped.push(e),
            }
        }
    }
}
