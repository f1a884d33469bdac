//! One client's connection: its session's event loop, from accept until it ends, inside a
//! `client` span (connection id, peer; the CN and peer id once known).
//!
//! The loop follows the session's driving contract: after every input it queues what
//! `poll_transmit` returns on the [`FrameWriter`] and handles `poll_event` until both are
//! quiet, writes (one vectored write), then waits on five sources: shutdown, being replaced
//! (same CN, no `duplicate-cn`), framed packets from the socket ([`FrameReader`]), packets
//! for this client from the tun reader or another client, and the session's timer.
//!
//! On `ClientIdentified` the registry admits the client ([`Registry::admit`]) and the
//! session pushes what it got; a refusal goes to the client with `AUTH_FAILED`. A connection
//! must bring its tunnel up within `handshake_timeout`. On shutdown an established client gets
//! `RESTART` and has `drain_timeout` to leave.
//!
//! [`Registry::admit`]: crate::registry::Registry::admit

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::framed::{FrameReadError, FrameReader, FrameWriter};
use netio::report::chain;
use protocol::control_msg::ServerSignal;
use protocol::data::DATA_TAILROOM;
use protocol::session::{CloseReason, Event, ServerSession, SEND_HEADROOM};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument as _, Span};

use crate::registry::{ClientId, ConnHandle, Refused, Slot, Traffic};
use crate::server::{lock, Shared};
use crate::spoof::{SourceFilter, SpoofVerdict};

/// Packets queued from the tun device (or other clients) towards one connection before new
/// ones are dropped.
pub const TUN_QUEUE: usize = 1024;

/// Most packets already received that are decrypted per wakeup before the other sources get a
/// turn (a flood must not starve the timers).
pub const RECV_BATCH: usize = 64;

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
    #[error("no tunnel within {0:?} (handshake deadline)")]
    HandshakeTimeout(Duration),
    #[error("drain timeout after RESTART")]
    DrainTimeout,
    #[error("replaced by a newer connection with the same CN")]
    Replaced,
    #[error("server shutting down")]
    ShuttingDown,
}

/// Serves one accepted connection to its end, inside its `client` span; `slot`
/// (`max-clients`) is freed then.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
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
    run(shared, id, stream, peer, slot, shutdown)
        .instrument(span)
        .await;
}

async fn run(
    shared: Arc<Shared>,
    id: ClientId,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    shutdown: CancellationToken,
) {
    info!("connection accepted");
    let start = Instant::now();
    let session = lock(&shared.endpoint).new_session(netio::rng::session_rng(), start);
    let peer_id = session.peer_id();
    Span::current().record("peer_id", peer_id.get());
    let (tx, rx) = mpsc::channel::<BytesMut>(TUN_QUEUE);
    let handle = ConnHandle {
        peer,
        peer_id: peer_id.get(),
        tx,
        kicked: CancellationToken::new(),
        traffic: Arc::new(Traffic::default()),
    };
    let (read, write) = stream.into_split();
    let mut conn = Connection {
        shared: Arc::clone(&shared),
        id,
        session,
        handle,
        filter: None,
        established: false,
        reader: FrameReader::new(read, BytesMut::new(), shared.settings.tun_mtu),
        writer: FrameWriter::new(write),
    };
    let ended = conn.drive(rx, start, &shutdown).await;
    let mut reason = chain(&ended);
    if let Some(refused) = conn.session.rejection() {
        reason = format!("refused: {} ({reason})", chain(refused));
    }
    let _ = conn.writer.shutdown().await;
    let admitted = lock(&shared.registry).remove(id).is_some();
    lock(&shared.endpoint).release(peer_id);
    drop(slot);
    info!(%reason, admitted, "client disconnected");
}

/// One TCP connection and its session.
struct Connection {
    shared: Arc<Shared>,
    id: ClientId,
    session: ServerSession,
    handle: ConnHandle,
    /// The sources this client may send from, once admitted.
    filter: Option<SourceFilter>,
    established: bool,
    reader: FrameReader,
    writer: FrameWriter,
}

impl Connection {
    async fn drive(
        &mut self,
        mut rx: mpsc::Receiver<BytesMut>,
        start: Instant,
        shutdown: &CancellationToken,
    ) -> Ended {
        let shared = Arc::clone(&self.shared);
        let settings = &shared.settings;
        let handshake_deadline = start + settings.handshake_timeout;
        let mut drain_deadline: Option<Instant> = None;
        let mut to_tun: Vec<BytesMut> = Vec::with_capacity(RECV_BATCH);
        loop {
            if let Some(reason) = self.output() {
                let _ = self.flush().await;
                return Ended::Session(reason);
            }
            if let Err(e) = self.flush().await {
                return Ended::Write(e);
            }
            let mut wake = self.session.poll_timeout();
            if !self.established {
                wake = Some(wake.map_or(handshake_deadline, |w| w.min(handshake_deadline)));
            }
            if let Some(d) = drain_deadline {
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
                    if !self.established {
                        return Ended::ShuttingDown;
                    }
                    self.session.send_restart(ServerSignal::default());
                    drain_deadline = Some(Instant::now() + settings.drain_timeout);
                    info!("told client: RESTART");
                }
                _ = self.handle.kicked.cancelled() => return Ended::Replaced,
                r = self.reader.next() => match r {
                    Ok(Some(packet)) => {
                        if let Err(e) = self.receive(packet, &mut to_tun) {
                            return Ended::Read(e);
                        }
                        shared.tun_writer.write(&mut to_tun).await;
                    }
                    Ok(None) => return Ended::PeerClosed,
                    Err(e) => return Ended::Read(e),
                },
                Some(packet) = rx.recv() => self.send_queued(packet, &mut rx),
                _ = sleep => {
                    let now = Instant::now();
                    if !self.established && now >= handshake_deadline {
                        shared.metrics.handshake_timed_out();
                        return Ended::HandshakeTimeout(settings.handshake_timeout);
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
    /// the reason when the session closed.
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
                        self.established = true;
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
        let mut next = Some(first);
        let mut handled = 0;
        while let Some(packet) = next.take() {
            match self.session.handle_packet(now, packet) {
                Ok(Some(payload)) => self.forward_from_client(payload, to_tun),
                Ok(None) => {}
                Err(e) => debug!(error = %e, "packet dropped"),
            }
            handled += 1;
            if handled < RECV_BATCH {
                next = self.reader.buffered()?;
            }
        }
        self.handle
            .traffic
            .received
            .store(self.reader.received(), Ordering::Relaxed);
        Ok(())
    }

    /// A decrypted packet from the client: the source check, then the tun device (`to_tun`)
    /// or, with `client-to-client`, another client's queue.
    fn forward_from_client(&self, payload: BytesMut, to_tun: &mut Vec<BytesMut>) {
        let metrics = &self.shared.metrics;
        let Some(filter) = &self.filter else {
            metrics.packet_malformed();
            return;
        };
        match filter.check(&payload) {
            SpoofVerdict::Accept { dst, .. } => {
                // Without client-to-client every packet goes to the tun device: no lookup.
                if !self.shared.settings.client_to_client {
                    to_tun.push(payload);
                    return;
                }
                let target = lock(&self.shared.registry)
                    .forward(self.id, dst, true)
                    .map(|c| c.conn.tx.clone());
                let Some(tx) = target else {
                    to_tun.push(payload);
                    return;
                };
                let mut packet =
                    BytesMut::with_capacity(SEND_HEADROOM + payload.len() + DATA_TAILROOM);
                packet.resize(SEND_HEADROOM, 0);
                packet.extend_from_slice(&payload);
                match tx.try_send(packet) {
                    Ok(()) => metrics.packet_client_to_client(),
                    Err(_) => metrics.queue_overflowed(),
                }
            }
            SpoofVerdict::Spoofed { src, dst } => {
                let total = metrics.packet_spoofed();
                if total <= 10 || (total - 1).is_power_of_two() {
                    warn!(%src, %dst, dropped_total = total, "packet with a source address not assigned to the client dropped");
                }
            }
            SpoofVerdict::Ignored => metrics.packet_ignored(),
            SpoofVerdict::Malformed(e) => {
                metrics.packet_malformed();
                debug!(error = %e, "malformed packet from client");
            }
        }
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
