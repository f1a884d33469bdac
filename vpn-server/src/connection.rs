//! One client's connection: its session's event loop, from accept until it ends, inside a
//! `client` span (connection id, peer; the CN and peer id once known).
//!
//! The loop is netio's [`Pump`] (transmit, events, timers, batched receive and send, after
//! the session's driving contract); [`Connection`] is the server's [`Role`] in it: its own
//! inputs are shutdown, being replaced (same CN, no `duplicate-cn`), being evicted (while
//! pending) and packets for this client from the tun reader or another client (encrypted in
//! batches of [`SEND_BATCH`]); its deadlines the connection's; a decrypted packet goes where
//! the packet mode sends it.
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

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::framed::{FrameReadError, FrameReader, FrameWriter, FIRST_READ_CHUNK, READ_CHUNK};
use netio::listen::PendingGuard;
use netio::log_limit::{LogLimiter, LOG_EVERY};
use netio::pump::{log_dropped_control, Handshake, Pump, Role, Stop};
use netio::report::chain;
use netio::tun::TunWriter;
use protocol::control_msg::ServerSignal;
use protocol::session::{ClientIdentity, Event, ServerSession};
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
    /// The pump's own reasons (the session closed, the peer left, the socket failed), also
    /// before the pump exists (waiting for the first packet).
    #[error(transparent)]
    Pump(Stop<Infallible>),
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
    let pump = Pump::new(session, reader, writer, Handshake::default());
    let conn = Connection {
        shared: Arc::clone(&shared),
        id,
        handle: ConnHandle {
            peer,
            peer_id: peer_id.get(),
            tx,
            kicked: CancellationToken::new(),
            traffic: Arc::new(Traffic::default()),
        },
        rx,
        shutdown,
        filter: None,
        deadlines,
        drain: None,
        pending: Some(pending),
        slot: None,
        dropped_log: LogLimiter::new(LOG_EVERY),
        packet_log: LogLimiter::new(LOG_EVERY),
    };
    // The session's part on the heap: a task that waits for its first frame stays small
    // (a thousand of them are what a flood holds).
    Box::pin(serve_session(pump, conn)).await;
}

/// The rest of a connection's life once its first packet was accepted: the session's loop,
/// then the registry, the peer id and the slot freed.
async fn serve_session(mut pump: Pump<ServerSession>, mut conn: Connection) {
    let ended = pump
        .run(&mut conn)
        .await
        .into_role()
        .unwrap_or_else(Ended::Pump);
    let _ = pump.shutdown().await;
    let shared = Arc::clone(&conn.shared);
    let admitted = lock(&shared.registry).remove(conn.id).is_some();
    lock(&shared.endpoint).release(pump.session().peer_id());
    drop(conn.slot.take());
    drop(conn.pending.take());
    let mut reason = chain(&ended);
    if let Some(refused) = pump.session().rejection() {
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
                Ok(None) => Err(Ended::Pump(Stop::PeerClosed)),
                Err(e @ FrameReadError::Frame(_)) => {
                    Err(Ended::BadFirstPacket(BogusFirstPacket::Framing(e)))
                }
                Err(e) => Err(Ended::Pump(Stop::Read(e))),
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

/// One client's part of its connection (the [`Pump`] holds the session and the socket).
struct Connection {
    shared: Arc<Shared>,
    id: ClientId,
    handle: ConnHandle,
    /// Packets for this client from the tun reader or other clients.
    rx: mpsc::Receiver<BytesMut>,
    shutdown: CancellationToken,
    /// The sources this client may send from, once admitted.
    filter: Option<SourceFilter>,
    /// The first packet's and the tunnel's deadlines.
    deadlines: Deadlines,
    /// Until when the client may take to leave after `RESTART` (set at shutdown).
    drain: Option<Instant>,
    /// Its place among the pending connections, until authenticated.
    pending: Option<PendingGuard>,
    /// Its `max-clients` slot, once authenticated.
    slot: Option<Slot>,
    /// Control messages from the client that were dropped: a line a second at most.
    dropped_log: LogLimiter,
    /// Packets from the client that were dropped (spoofed, on the wrong side): a line a
    /// second at most.
    packet_log: LogLimiter,
}

/// The server's own inputs of a connection.
enum Input {
    Shutdown,
    Replaced,
    Evicted,
    /// A packet for this client from the tun reader or another client.
    Queued(BytesMut),
}

impl Role for Connection {
    type Session = ServerSession;
    type Input = Input;
    type Ended = Ended;

    async fn next_input(&mut self) -> Input {
        tokio::select! {
            () = self.shutdown.cancelled(), if self.drain.is_none() => Input::Shutdown,
            () = self.handle.kicked.cancelled() => Input::Replaced,
            () = evicted(self.pending.as_ref()) => Input::Evicted,
            Some(packet) = self.rx.recv() => Input::Queued(packet),
        }
    }

    async fn on_input(
        &mut self,
        pump: &mut Pump<ServerSession>,
        input: Input,
    ) -> Result<(), Stop<Ended>> {
        match input {
            Input::Shutdown => {
                if self.deadlines.next().is_some() {
                    return Err(Stop::Role(Ended::ShuttingDown));
                }
                pump.session_mut().send_restart(ServerSignal::default());
                self.drain = Some(Instant::now() + self.shared.settings.drain_timeout);
                info!("told client: RESTART");
            }
            Input::Replaced => return Err(Stop::Role(Ended::Replaced)),
            Input::Evicted => return Err(Stop::Role(Ended::Evicted)),
            // It and what else is queued for this client (at most `SEND_BATCH`), encrypted in
            // place for one write.
            Input::Queued(first) => {
                let rx = &mut self.rx;
                let queued = std::iter::from_fn(|| rx.try_recv().ok());
                pump.send_tun_packets(std::iter::once(first).chain(queued).take(SEND_BATCH));
            }
        }
        Ok(())
    }

    async fn on_event(
        &mut self,
        pump: &mut Pump<ServerSession>,
        event: Event,
    ) -> Result<(), Stop<Ended>> {
        match event {
            Event::ClientIdentified(identity) => {
                return self
                    .on_client_identified(pump.session_mut(), &identity)
                    .map_err(Stop::Role)
            }
            Event::Connected(c) => {
                self.deadlines.established();
                self.shared.metrics.tunnel_established();
                lock(&self.shared.registry).established(self.id, c.cipher.name(), unix_now());
                // HA: the held packets' timer looks again (a shoot connection starts the
                // settle time, `ha::SETTLE`).
                self.shared.held.notify_one();
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
                log_dropped_control(&mut self.dropped_log, &error, "client");
            }
            Event::Closed(_) => {}
        }
        Ok(())
    }

    fn on_payload(&mut self, payload: BytesMut, to_tun: &mut Vec<BytesMut>) {
        forward_from_client(
            &self.shared,
            self.id,
            self.filter.as_ref(),
            &mut self.packet_log,
            payload,
            to_tun,
        );
    }

    fn tun_writer(&self) -> Option<&TunWriter> {
        self.shared.device.as_ref().map(|device| &device.writer)
    }

    fn deadline(&self) -> Option<Instant> {
        [self.deadlines.next(), self.drain]
            .into_iter()
            .flatten()
            .min()
    }

    fn on_deadline(&mut self, now: Instant) -> Result<(), Ended> {
        match self.deadlines.expired(now) {
            Some(Expired::FirstPacket(after)) => return Err(Ended::FirstPacketTimeout(after)),
            Some(Expired::Handshake(after)) => {
                self.shared.metrics.handshake_timed_out();
                return Err(Ended::HandshakeTimeout(after));
            }
            None => {}
        }
        if self.drain.is_some_and(|d| now >= d) {
            return Err(Ended::DrainTimeout);
        }
        Ok(())
    }

    fn on_received(&mut self, total: u64) {
        self.handle.traffic.received.store(total, Ordering::Relaxed);
    }

    fn on_sent(&mut self, total: u64) {
        self.handle.traffic.sent.store(total, Ordering::Relaxed);
    }
}

impl Connection {
    /// Authenticated: from a pending place to a `max-clients` slot (none free: the connection
    /// ends), then admitted by the registry (addresses pushed) or refused (`AUTH_FAILED`).
    fn on_client_identified(
        &mut self,
        session: &mut ServerSession,
        identity: &ClientIdentity,
    ) -> Result<(), Ended> {
        let now = Instant::now();
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
        match self.shared.slots.take() {
            Ok(slot) => {
                self.slot = Some(slot);
                self.pending = None;
            }
            Err(refused) => {
                self.shared.metrics.max_clients_reached();
                warn!(reason = %refused, "authenticated client closed");
                return Err(Ended::MaxClients(refused));
            }
        }
        let admitted = lock(&self.shared.registry).admit(
            &self.shared.settings,
            self.id,
            identity,
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
                session.accept_client(now, a.settings);
            }
            Err(Refused::DevType(mismatch)) => {
                // Closed without AUTH_FAILED: upstream's client exits on it (vpn2 sets no
                // `auth-retry`), and its container would come back only after Kubernetes'
                // growing back-off; closed, it tries again within its `connect-retry` (DEVIATIONS
                // W4). Its slot is free.
                self.slot = None;
                self.shared.metrics.refused_other();
                let cn = identity.common_name.as_deref().unwrap_or_default();
                if let Some(suppressed) = self.shared.log_dev_type_refusal(cn, now) {
                    warn!(
                        reason = %mismatch,
                        options = identity.options.as_str(),
                        suppressed,
                        "refusing client: its device type is not this server's (connection closed)"
                    );
                }
                session.close(now);
            }
            Err(refused) => {
                // It lingers only to deliver AUTH_FAILED: its slot is free.
                self.slot = None;
                if let Refused::PoolExhausted { .. } = refused {
                    self.shared.metrics.refused_pool_exhausted();
                    warn!(error = %chain(&refused), "refusing client: no address");
                } else {
                    self.shared.metrics.refused_other();
                }
                info!(reason = %chain(&refused), "client refused");
                session.reject_client(now, Some(refused.to_string()));
            }
        }
        Ok(())
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
