//! One client's connection: its session's event loop, from accept until it ends, inside a
//! `client` span (connection id, peer; the CN and peer id once known).
//!
//! The loop follows the session's driving contract: after every input it queues what
//! `poll_transmit` returns on the [`FrameWriter`] and handles `poll_event` until both are
//! quiet, writes (one vectored write), then waits on six sources: shutdown, being replaced
//! (same CN, no `duplicate-cn`), being evicted (while pending), framed packets from the socket
//! ([`FrameReader`]), packets for this client from the tun reader or another client, and the
//! session's timer with the connection's deadlines.
//!
//! Before authentication ([`admission`]): the first frame must arrive within
//! `first_packet_timeout` and be a client hard reset the session accepts (tls-auth /
//! tls-crypt verified), else the connection is closed at once; the session (its TLS state and
//! peer id) is made only for that frame, and the reader's buffer is small until then, so a
//! silent connection costs little more than a task and a socket.
//! Until `ClientIdentified` the connection holds a pending place, which a newer connection may
//! take. On `ClientIdentified` it takes a
//! `max-clients` slot (none free: closed without an answer, as upstream closes at accept), the
//! registry admits the client ([`Registry::admit`]) and the session pushes what it got; a
//! refusal goes to the client with `AUTH_FAILED`. A connection must bring its tunnel up
//! within `handshake_timeout`. On shutdown an established client gets `RESTART` and has
//! `drain_timeout` to leave.
//!
//! Connections closed before their first valid packet (bogus, silent, evicted) log at debug
//! and, per kind, one line a second at most: a flood must not flood the log.
//!
//! [`Registry::admit`]: crate::registry::Registry::admit
//! [`admission`]: crate::registry::admission

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::framed::{
    FrameReadError, FrameReader, FrameWriter, FIRST_READ_CHUNK, READ_CHUNK, RECV_BATCH,
};
use netio::listen::PendingGuard;
use netio::log_limit::{LogLimiter, LOG_EVERY};
use netio::report::chain;
use protocol::control_msg::ServerSignal;
use protocol::session::{CloseReason, Event, ServerSession, SEND_HEADROOM};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument as _, Span};

use crate::registry::admission::{self, BogusFirstPacket, Deadlines, Expired, PreAuthEvent};
use crate::registry::{ClientId, ConnHandle, Refused, Slot, Traffic};
use crate::shared::{lock, Shared};
use crate::spoof::SourceFilter;

/// Packets queued from the tun device (or other clients) towards one connection before new
/// ones are dropped.
pub const TUN_QUEUE: usize = 1024;

/// Most queued tun packets encrypted (and written together) per wakeup.
pub const SEND_BATCH: usize = 64;

/// Why a connection ended (besides a refusal, which the session records).
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("session closed")]
    Session(#[source] CloseReason),
    #[error("connection closed by peer")]
    PeerClosed,
    #[error("read failed")]
    Read(#[source] FrameReadError),
    #[error("write failed")]
    Write(#[source] io::Error),
    #[error("bogus first packet")]
    BadFirstPacket(#[source] BogusFirstPacket),
    #[error("no valid first packet within {0:?}")]
    FirstPacketTimeout(Duration),
    #[error("evicted while pending, for a newer connection (max_pending)")]
    Evicted,
    #[error("authenticated, but max-clients clients are connected")]
    MaxClients(#[source] Refused),
    #[error("no tunnel within {0:?} (handshake deadline)")]
    HandshakeTimeout(Duration),
    #[error("drain timeout after RESTART")]
    DrainTimeout,
    #[error("replaced by a newer connection with the same CN")]
    Replaced,
    #[error("server shutting down")]
    ShuttingDown,
}

/// Serves one accepted connection to its end, inside its `client` span; `pending` (its place
/// among the connections not yet authenticated) is given up at authentication, or at the end.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    pending: PendingGuard,
    shutdown: CancellationToken,
) {
    let id = shared.next_client_id();
    let span = tracing::info_span!(
        "client",
        id,
        %peer,
        cn = tracing::field::Empty,
        peer_id = tracing::field::Empty
    );
    run(shared, id, stream, peer, pending, shutdown)
        .instrument(span)
        .await;
}

async fn run(
    shared: Arc<Shared>,
    id: ClientId,
    stream: TcpStream,
    peer: SocketAddr,
    pending: PendingGuard,
    shutdown: CancellationToken,
) {
    debug!("connection accepted");
    let start = Instant::now();
    let settings = &shared.settings;
    let (read, write) = stream.into_split();
    let mut reader = FrameReader::new(read, BytesMut::new(), settings.tun_mtu);
    reader.set_read_chunk(FIRST_READ_CHUNK);
    let mut writer = FrameWriter::new(write);
    let mut deadlines = Deadlines::new(
        start,
        settings.first_packet_timeout,
        settings.handshake_timeout,
    );
    // No session (TLS state, peer id) until a first frame arrived: a silent connection costs
    // a task and its socket only.
    let first = match first_frame(&mut reader, &deadlines, &pending, &shutdown).await {
        Ok(frame) => frame,
        Err(ended) => {
            let _ = writer.shutdown().await;
            return ended_before_first_packet(&shared, &ended);
        }
    };
    let now = Instant::now();
    let mut session = lock(&shared.endpoint).new_session(netio::rng::session_rng(), now);
    let peer_id = session.peer_id();
    if let Err(bogus) = admission::first_packet(&mut session, now, first) {
        drop(session);
        lock(&shared.endpoint).release(peer_id);
        let _ = writer.shutdown().await;
        return ended_before_first_packet(&shared, &Ended::BadFirstPacket(bogus));
    }
    deadlines.first_packet_arrived();
    pending.prove();
    reader.set_read_chunk(READ_CHUNK);
    debug!("client hard reset received");
    Span::current().record("peer_id", peer_id.get());
    let (tx, rx) = mpsc::channel::<BytesMut>(TUN_QUEUE);
    let conn = Connection {
        shared: Arc::clone(&shared),
        id,
        session,
        handle: ConnHandle {
            peer,
            peer_id: peer_id.get(),
            tx,
            kicked: CancellationToken::new(),
            traffic: Arc::new(Traffic::default()),
        },
        filter: None,
        deadlines,
        pending: Some(pending),
        slot: None,
        closing: None,
        reader,
        writer,
        dropped_log: LogLimiter::new(LOG_EVERY),
        packet_log: LogLimiter::new(LOG_EVERY),
    };
    // The session's part on the heap: a task that waits for its first frame stays small
    // (a thousand of them are what a flood holds).
    Box::pin(serve_session(conn, rx, shutdown)).await;
}

/// The rest of a connection's life once its first packet was accepted: the session's loop,
/// then the registry, the peer id and the slot freed.
async fn serve_session(
    mut conn: Connection,
    rx: mpsc::Receiver<BytesMut>,
    shutdown: CancellationToken,
) {
    let ended = conn.drive(rx, &shutdown).await;
    let _ = conn.writer.shutdown().await;
    let shared = Arc::clone(&conn.shared);
    let admitted = lock(&shared.registry).remove(conn.id).is_some();
    lock(&shared.endpoint).release(conn.session.peer_id());
    drop(conn.slot.take());
    drop(conn.pending.take());
    let mut reason = chain(&ended);
    if let Some(refused) = conn.session.rejection() {
        reason = format!("refused: {} ({reason})", chain(refused));
    }
    info!(%reason, admitted, "client disconnected");
}

/// Waits for a new connection's first frame: at most until the first-packet deadline, while
/// not evicted and not shutting down. A length prefix no packet has is a bogus first packet.
async fn first_frame(
    reader: &mut FrameReader,
    deadlines: &Deadlines,
    pending: &PendingGuard,
    shutdown: &CancellationToken,
) -> Result<BytesMut, Ended> {
    loop {
        let deadline = deadlines.next().unwrap_or_else(Instant::now);
        tokio::select! {
            () = shutdown.cancelled() => return Err(Ended::ShuttingDown),
            () = pending.evicted() => return Err(Ended::Evicted),
            () = tokio::time::sleep_until(deadline.into()) => match deadlines.expired(Instant::now()) {
                Some(Expired::FirstPacket(after)) => return Err(Ended::FirstPacketTimeout(after)),
                Some(Expired::Handshake(after)) => return Err(Ended::HandshakeTimeout(after)),
                None => {}
            },
            r = reader.next() => return match r {
                Ok(Some(frame)) => Ok(frame),
                Ok(None) => Err(Ended::PeerClosed),
                Err(e @ FrameReadError::Frame(_)) => {
                    Err(Ended::BadFirstPacket(BogusFirstPacket::Framing(e)))
                }
                Err(e) => Err(Ended::Read(e)),
            },
        }
    }
}

/// The end of a connection that never sent a valid packet: counted, and logged at most once
/// a second per kind (else at debug).
fn ended_before_first_packet(shared: &Shared, ended: &Ended) {
    let metrics = &shared.metrics;
    let (event, total) = match ended {
        Ended::BadFirstPacket(_) => {
            metrics.bad_first_packet();
            (PreAuthEvent::BadFirstPacket, metrics.bad_first_packets())
        }
        Ended::FirstPacketTimeout(_) => {
            metrics.first_packet_timed_out();
            (PreAuthEvent::NoFirstPacket, metrics.first_packet_timeouts())
        }
        // A hand-window shorter than the first-packet deadline.
        Ended::HandshakeTimeout(_) => {
            metrics.handshake_timed_out();
            (PreAuthEvent::NoFirstPacket, metrics.handshake_timeouts())
        }
        // Counted where it was evicted (the accept loop); a peer that left is no event.
        _ => {
            debug!(reason = %chain(ended), "connection closed before its first packet");
            return;
        }
    };
    match shared.log_pre_auth(event) {
        Some(unlogged) => warn!(
            reason = %chain(ended),
            closed_total = total,
            unlogged,
            "connection closed before authentication"
        ),
        None => debug!(reason = %chain(ended), "connection closed before authentication"),
    }
}

/// Completes when the pending connection is evicted; never once it is authenticated.
async fn evicted(pending: Option<&PendingGuard>) {
    match pending {
        Some(p) => p.evicted().await,
        None => std::future::pending().await,
    }
}

/// One TCP connection and its session.
struct Connection {
    shared: Arc<Shared>,
    id: ClientId,
    session: ServerSession,
    handle: ConnHandle,
    /// The sources this client may send from, once admitted.
    filter: Option<SourceFilter>,
    /// The first packet's and the tunnel's deadlines.
    deadlines: Deadlines,
    /// Its place among the pending connections, until authenticated.
    pending: Option<PendingGuard>,
    /// Its `max-clients` slot, once authenticated.
    slot: Option<Slot>,
    /// Set when an event decided to close the connection.
    closing: Option<Ended>,
    reader: FrameReader,
    writer: FrameWriter,
    /// Control messages from the client that were dropped: a line a second at most.
    dropped_log: LogLimiter,
    /// Packets from the client that were dropped (spoofed, on the wrong side): a line a
    /// second at most.
    packet_log: LogLimiter,
}

impl Connection {
    async fn drive(
        &mut self,
        mut rx: mpsc::Receiver<BytesMut>,
        shutdown: &CancellationToken,
    ) -> Ended {
        let shared = Arc::clone(&self.shared);
        let settings = &shared.settings;
        let mut drain_deadline: Option<Instant> = None;
        let mut to_tun: Vec<BytesMut> = Vec::with_capacity(RECV_BATCH);
        loop {
            if let Some(reason) = self.output() {
                let _ = self.flush().await;
                return Ended::Session(reason);
            }
            if let Some(ended) = self.closing.take() {
                return ended;
            }
            if let Err(e) = self.flush().await {
                return Ended::Write(e);
            }
            let mut wake = self.session.poll_timeout();
            for d in [self.deadlines.next(), drain_deadline]
                .into_iter()
                .flatten()
            {
                wake = Some(wake.map_or(d, |w| w.min(d)));
            }
            let sleep = async {
                match wake {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled(), if drain_deadline.is_none() => {
                    if self.deadlines.next().is_some() {
                        return Ended::ShuttingDown;
                    }
                    self.session.send_restart(ServerSignal::default());
                    drain_deadline = Some(Instant::now() + settings.drain_timeout);
                    info!("told client: RESTART");
                }
                _ = self.handle.kicked.cancelled() => return Ended::Replaced,
                () = evicted(self.pending.as_ref()) => return Ended::Evicted,
                r = self.reader.next() => match r {
                    Ok(Some(packet)) => {
                        if let Err(e) = self.receive(packet, &mut to_tun) {
                            return Ended::Read(e);
                        }
                        if let Some(device) = &shared.device {
                            device.writer.write(&mut to_tun).await;
                        }
                    }
                    Ok(None) => return Ended::PeerClosed,
                    Err(e) => return Ended::Read(e),
                },
                Some(packet) = rx.recv() => self.send_queued(packet, &mut rx),
                _ = sleep => {
                    let now = Instant::now();
                    match self.deadlines.expired(now) {
                        Some(Expired::FirstPacket(after)) => return Ended::FirstPacketTimeout(after),
                        Some(Expired::Handshake(after)) => {
                            shared.metrics.handshake_timed_out();
                            return Ended::HandshakeTimeout(after);
                        }
                        None => {}
                    }
                    if drain_deadline.is_some_and(|d| now >= d) {
                        return Ended::DrainTimeout;
                    }
                    self.session.handle_timeout(now);
                }
            }
        }
    }

    /// Queues the session's control packets and handles its events until both are quiet;
    /// the reason when the session closed. An event that closes the connection otherwise
    /// leaves its reason in `closing`.
    fn output(&mut self) -> Option<CloseReason> {
        let now = Instant::now();
        let mut closed = None;
        loop {
            let mut progressed = false;
            while let Some(b) = self.session.poll_transmit(now, unix_now()) {
                self.writer.push(b);
                progressed = true;
            }
            while let Some(event) = self.session.poll_event() {
                progressed = true;
                match event {
                    Event::ClientIdentified(identity) => {
                        if let Some(cn) = &identity.common_name {
                            Span::current().record("cn", cn.as_str());
                        }
                        if let Some(first) = identity.peer_info_ignored.first() {
                            let n = identity.peer_info_ignored.len();
                            self.shared.metrics.peer_info_ignored(n);
                            if let Some(suppressed) = self.dropped_log.allow(now) {
                                warn!(
                                    lines = n,
                                    first = %first,
                                    suppressed,
                                    "peer-info lines from the client ignored"
                                );
                            }
                        }
                        // Authenticated: from a pending place to a `max-clients` slot.
                        match self.shared.slots.take() {
                            Ok(slot) => {
                                self.slot = Some(slot);
                                self.pending = None;
                            }
                            Err(refused) => {
                                self.shared.metrics.max_clients_reached();
                                warn!(reason = %refused, "authenticated client closed");
                                self.closing = Some(Ended::MaxClients(refused));
                                return closed;
                            }
                        }
                        let admitted = lock(&self.shared.registry).admit(
                            &self.shared.settings,
                            self.id,
                            &identity,
                            self.handle.clone(),
                            unix_now(),
                        );
                        match admitted {
                            Ok(a) => {
                                info!(
                                    v4 = ?a.settings.ifconfig,
                                    v6 = ?a.settings.ifconfig_ipv6,
                                    "client identified; addresses assigned"
                                );
                                self.filter = Some(a.filter);
                                self.session.accept_client(now, a.settings);
                            }
                            Err(refused) => {
                                // It lingers only to deliver AUTH_FAILED: its slot is free.
                                self.slot = None;
                                match refused {
                                    Refused::PoolExhausted { .. } => {
                                        self.shared.metrics.refused_pool_exhausted();
                                        warn!(error = %chain(&refused), "refusing client: no address");
                                    }
                                    _ => self.shared.metrics.refused_other(),
                                }
                                info!(reason = %chain(&refused), "client refused");
                                self.session.reject_client(now, Some(refused.to_string()));
                            }
                        }
                    }
                    Event::Connected(c) => {
                        self.deadlines.established();
                        self.shared.metrics.tunnel_established();
                        lock(&self.shared.registry).established(
                            self.id,
                            c.cipher.name(),
                            unix_now(),
                        );
                        info!(
                            cipher = c.cipher.name(),
                            tls_ekm = c.tls_ekm,
                            "tunnel established"
                        );
                    }
                    Event::KeyRenegotiated { key_id } => {
                        info!(key_id = key_id.get(), "key renegotiated");
                    }
                    Event::ControlMessageDropped(error) => {
                        self.shared.metrics.control_message_dropped();
                        if let Some(suppressed) = self.dropped_log.allow(now) {
                            warn!(
                                error = %error,
                                text = %error.escaped_message().unwrap_or_default(),
                                suppressed,
                                "control message from the client dropped"
                            );
                        }
                    }
                    Event::Closed(reason) => closed = Some(reason),
                }
            }
            if !progressed {
                return closed;
            }
        }
    }

    /// Writes what is queued and updates the status file's byte count.
    async fn flush(&mut self) -> io::Result<()> {
        if self.writer.is_empty() {
            return Ok(());
        }
        let written = self.writer.flush().await;
        self.handle
            .traffic
            .sent
            .store(self.writer.sent(), Ordering::Relaxed);
        written
    }

    /// Handles `first` and every packet already buffered behind it (at most
    /// [`RECV_BATCH`]); the decrypted packets bound for the tun device go to `to_tun`.
    fn receive(
        &mut self,
        first: BytesMut,
        to_tun: &mut Vec<BytesMut>,
    ) -> Result<(), FrameReadError> {
        let now = Instant::now();
        let mut handled = 0;
        let Connection {
            shared,
            id,
            session,
            filter,
            reader,
            packet_log,
            ..
        } = self;
        reader.receive_batch(first, false, |packet| {
            match session.handle_packet(now, packet) {
                Ok(Some(payload)) => {
                    forward_from_client(shared, *id, filter.as_ref(), packet_log, payload, to_tun);
                }
                Ok(None) => {}
                Err(e) => debug!(error = %e, "packet dropped"),
            }
            handled += 1;
            handled < RECV_BATCH
        })?;
        self.handle
            .traffic
            .received
            .store(self.reader.received(), Ordering::Relaxed);
        Ok(())
    }

    /// Encrypts `first` and what else is queued for this client (at most [`SEND_BATCH`]) in
    /// place, queued for one write.
    fn send_queued(&mut self, first: BytesMut, rx: &mut mpsc::Receiver<BytesMut>) {
        let now = Instant::now();
        let mut next = Some(first);
        let mut sent = 0;
        while let Some(mut packet) = next.take() {
            match self
                .session
                .send_tun_packet(now, &mut packet, SEND_HEADROOM)
            {
                Ok(()) => self.writer.push(packet),
                Err(e) => debug!(error = %e, "tun packet not sent"),
            }
            sent += 1;
            if sent < SEND_BATCH {
                next = rx.try_recv().ok();
            }
        }
    }
}

/// A decrypted packet from client `id`, once admitted (`filter` set): where the packet mode
/// sends it (the tun device through `to_tun`, or other clients' queues).
fn forward_from_client(
    shared: &Shared,
    id: ClientId,
    filter: Option<&SourceFilter>,
    drops: &mut LogLimiter,
    payload: BytesMut,
    to_tun: &mut Vec<BytesMut>,
) {
    let Some(filter) = filter else {
        shared.metrics.packet_malformed();
        return;
    };
    shared
        .mode
        .forward_from_client(shared, id, filter, drops, payload, to_tun);
}
