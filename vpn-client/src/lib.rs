//! `vpn-client`: the shoot side. An OpenVPN 2.6 compatible TCP client that dials out directly
//! or through an HTTP CONNECT proxy (with Gardener's routing header), applies the pushed
//! `ifconfig`, `ifconfig-ipv6`, `route` and `route-ipv6` that passed the pull policy to a tun
//! device, carries packets between the tun and the server, and reconnects by itself.
//!
//! [`run`] is the whole client: give it [`Settings`] and a [`CancellationToken`]; it returns
//! when the token is cancelled, the server sends `HALT`, or the local setup fails (tun,
//! netlink, TLS material). Everything else - a refused TCP connection, a proxy error, a TCP
//! close, `ping-restart`, `RESTART`, `AUTH_FAILED`, a failed handshake - ends only the current
//! connection, and the next attempt follows after the `connect-retry` pause.
//!
//! # The loop of one connection
//!
//! One task drives one [`ClientSession`] with a `select!` over four sources: the cancellation
//! token, the framed packets from the socket, a batch of packets from the tun device (only
//! while the tunnel is up) and the session's timer. After each input it follows the session's
//! driving contract: write what `poll_transmit` returns (all of it in one socket write), then
//! handle `poll_event`, then sleep no longer than `poll_timeout`. The session stays owned by
//! one task (no lock), and the binary runs it on a current-thread runtime (no work stealing,
//! no cross-thread wake-ups on the latency path); the expensive system call of the receive
//! direction, the write into the tun device (where the kernel runs the whole inner TCP receive
//! path), runs on a thread of its own fed by a channel, so under load both cores work.
//!
//! No buffer is allocated per packet in the steady state: tun packets are read in batches of
//! up to [`TUN_BATCH`] into slices of one pooled buffer after [`SEND_HEADROOM`] bytes,
//! encrypted there in place and coalesced into one socket write; every packet already in the
//! receive buffer is split off it and decrypted in place, and its space is reclaimed once the
//! tun writer has written it.
//!
//! # Reconnecting
//!
//! Attempts go through the remotes in order. A connection that never came up moves on to the
//! next remote and doubles the pause (from `connect-retry`, capped at its maximum); a tunnel
//! that was up and then dropped reconnects to the same remote after the initial pause (a
//! `RESTART` with the `N` flag moves on). The tun device is kept across reconnects; see
//! [`tunnel`](crate::tunnel) for how addresses and routes are reconciled.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::report::chain;
use netio::tun::{Coalescer, PacketLayout, RecvPool};
use protocol::data::DATA_TAILROOM;
use protocol::framing::{FrameDecoder, DEFAULT_STREAM_MAXLEN};
use protocol::session::{ClientConfig, ClientSession, CloseReason, Event, SessionError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
pub use tokio_util::sync::CancellationToken;

pub use protocol::session::SEND_HEADROOM;
pub use script::Scripts;
pub use settings::{
    HttpProxy, Remote, Settings, SettingsError, TlsMaterial, TunSettings, DEFAULT_CONNECT_RETRY,
    DEFAULT_CONNECT_RETRY_MAX, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TUN_MTU,
};
pub use tunnel::TunnelError;

pub mod apiserver_proxy;
pub mod config;
pub mod script;
mod settings;
pub mod tunnel;
pub mod vpn2;

use protocol::config::Family;
use script::{run_script, ScriptError, ScriptType, TunInfo};
use tunnel::{Plan, Tunnel};

/// Most tun packets read (and encrypted, and written to the socket as one write) per wakeup.
pub const TUN_BATCH: usize = 32;

/// Most packets already received that are decrypted per wakeup before the other sources get
/// a turn.
pub const RECV_BATCH: usize = 64;

/// Decrypted packets queued for the tun writer task before the receive direction waits.
pub const TUN_QUEUE: usize = 256;

/// Most packets the tun writer takes from its queue and writes (TCP segments of one flow
/// merged) at once.
pub const TUN_WRITE_BATCH: usize = 64;

/// Why [`run`] returned normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The cancellation token was cancelled.
    Shutdown,
    /// The server sent `HALT`.
    Halted {
        /// The text of the `HALT` message.
        message: String,
    },
}

/// Why [`run`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The settings cannot work (no remote, bad PEM, TLS context).
    #[error("invalid settings")]
    Settings(#[from] SettingsError),
    /// The tun device, its addresses or netlink failed.
    #[error("tun device setup failed")]
    Tunnel(#[from] TunnelError),
    /// Reading from the tun device failed.
    #[error("tun device read failed")]
    TunRead(#[source] io::Error),
    /// The tun writer thread could not be started.
    #[error("cannot start the tun writer thread")]
    Thread(#[source] io::Error),
    /// The `up` command failed.
    #[error("up script")]
    Up(#[source] ScriptError),
    /// `connect-retry-max`: every attempt failed.
    #[error("no connection after {attempts} attempts (connect-retry-max)")]
    RetriesExhausted {
        /// Failed attempts in a row.
        attempts: u64,
    },
}

/// Runs the client until `shutdown` is cancelled or the server sends `HALT`; see the crate
/// docs. Must run inside a tokio runtime with I/O and time enabled, on a thread in the network
/// namespace the tun device and routes belong to.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<Stopped, RunError> {
    let config = settings.client_config()?;
    let mut tunnel = Tunnel::new(settings.tun.clone())?;
    let mut client = Client {
        settings: &settings,
        config,
        shutdown: &shutdown,
        up_ran: None,
    };
    let result = client.reconnect_loop(&mut tunnel).await;
    tunnel.teardown().await;
    if let (Some(info), Some(down)) = (&client.up_ran, &settings.scripts.down) {
        if let Err(e) = run_script(ScriptType::Down, down, info).await {
            tracing::error!(error = %chain(&e), "down script failed");
        }
    }
    match &result {
        Ok(stopped) => tracing::info!(?stopped, "client stopped"),
        Err(e) => tracing::error!(error = %chain(e), "client failed"),
    }
    result
}

/// How one connection ended.
#[derive(Debug)]
enum Ended {
    Shutdown,
    Halt(String),
    /// Try again; `up` tells whether the tunnel had come up.
    Retry {
        up: bool,
        next_remote: bool,
    },
}

struct Client<'a> {
    settings: &'a Settings,
    config: ClientConfig,
    shutdown: &'a CancellationToken,
    /// The device parameters `up` ran with (`down` gets the same); `None` before the
    /// tunnel first came up.
    up_ran: Option<TunInfo>,
}

impl Client<'_> {
    async fn reconnect_loop(&mut self, tunnel: &mut Tunnel) -> Result<Stopped, RunError> {
        let mut backoff =
            Backoff::new(self.settings.connect_retry, self.settings.connect_retry_max);
        let mut index = 0usize;
        let mut failed: u64 = 0;
        let limit = self
            .settings
            .connect_retry_attempts
            .map(|n| u64::from(n).saturating_mul(self.settings.remotes.len() as u64));
        loop {
            let remote = &self.settings.remotes[index % self.settings.remotes.len()];
            let pause = match self.connection(remote, tunnel).await? {
                Ended::Shutdown => return Ok(Stopped::Shutdown),
                Ended::Halt(message) => return Ok(Stopped::Halted { message }),
                Ended::Retry { up, next_remote } => {
                    if up {
                        backoff.reset();
                        failed = 0;
                    } else {
                        failed += 1;
                        if limit.is_some_and(|l| failed >= l) {
                            return Err(RunError::RetriesExhausted { attempts: failed });
                        }
                    }
                    if next_remote || !up {
                        index = index.wrapping_add(1);
                    }
                    backoff.next_pause()
                }
            };
            tracing::info!(
                retry_in_s = pause.as_secs_f32(),
                next = %self.settings.remotes[index % self.settings.remotes.len()],
                "retrying after a pause"
            );
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Ok(Stopped::Shutdown),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One connection: dial, handshake, tunnel, until it ends.
    async fn connection(
        &mut self,
        remote: &Remote,
        tunnel: &mut Tunnel,
    ) -> Result<Ended, RunError> {
        let retry = Ended::Retry {
            up: false,
            next_remote: true,
        };
        let dialed = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return Ok(Ended::Shutdown),
            r = dial(self.settings, remote) => r,
        };
        let (stream, leftover) = match dialed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%remote, error = %chain(&e), "connection attempt failed");
                return Ok(retry);
            }
        };
        let (read, write) = stream.into_split();
        let mut conn = Connection {
            session: ClientSession::new(
                self.config.clone(),
                netio::rng::session_rng(),
                Instant::now(),
            ),
            reader: FrameReader {
                io: read,
                buf: leftover,
                decoder: FrameDecoder::with_max_len(frame_max_len(self.settings.tun.mtu)),
                quickack: true,
            },
            writer: write,
            out: BytesMut::with_capacity(TUN_BATCH * 2048),
            up: false,
            hold_lone_acks: self.settings.http_proxy.is_some(),
            ack_hold: None,
        };
        let ended = conn
            .drive(tunnel, self.shutdown, &mut self.up_ran, self.settings)
            .await;
        if let Ok(Ended::Retry { .. }) = &ended {
            // Close our direction (FIN) rather than leave it to the drop's RST.
            let _ = conn.writer.shutdown().await;
        }
        ended
    }
}

/// One connection's session and socket.
struct Connection {
    session: ClientSession,
    reader: FrameReader,
    writer: OwnedWriteHalf,
    /// Coalesced output: framed packets written to the socket together.
    out: BytesMut,
    up: bool,
    /// Through an HTTP proxy: until the tunnel is up, an output that is one lone P_ACK_V1
    /// waits up to [`ACK_HOLD`] to go out in the same write as what follows (see
    /// [`Connection::transmit`]).
    hold_lone_acks: bool,
    /// Until when the lone P_ACK_V1 in `out` waits.
    ack_hold: Option<Instant>,
}

impl Connection {
    async fn drive(
        &mut self,
        tunnel: &mut Tunnel,
        shutdown: &CancellationToken,
        up_ran: &mut Option<TunInfo>,
        settings: &Settings,
    ) -> Result<Ended, RunError> {
        let mut pool = RecvPool::default();
        let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_BATCH);
        // The tun writer task of this connection; it ends when this sender is dropped.
        let mut tun_tx: Option<mpsc::Sender<BytesMut>> = None;
        let mut payloads: Vec<BytesMut> = Vec::with_capacity(RECV_BATCH);
        loop {
            // A flood on one source must not starve the timers (pings, renegotiation).
            let now = Instant::now();
            if self.session.poll_timeout().is_some_and(|t| t <= now) {
                self.session.handle_timeout(now);
            }
            // The driving contract: transmit, then events, then the timer.
            if let Err(e) = self.transmit().await {
                tracing::warn!(error = %e, "write to the server failed");
                return Ok(self.retry(false));
            }
            while let Some(event) = self.session.poll_event() {
                match event {
                    Event::Connected(c) => {
                        self.reader.quickack = settings.http_proxy.is_some();
                        tracing::info!(
                            cipher = c.cipher.name(),
                            peer_id = ?c.peer_id.map(|p| p.get()),
                            tls_ekm = c.tls_ekm,
                            dyn_tls_crypt = c.dyn_tls_crypt,
                            "TLS up, keys exchanged, push received"
                        );
                        for option in &c.push.accepted {
                            tracing::info!(?option, "pushed option accepted");
                        }
                        for dropped in &c.push.dropped {
                            tracing::info!(option = dropped.text, reason = ?dropped.reason, "pushed option dropped");
                        }
                        tunnel.apply(&Plan::from_push(&c.push.accepted)).await?;
                        if tun_tx.is_none() {
                            if let Some(tun) = tunnel.shared_tun() {
                                let (tx, rx) = mpsc::channel(TUN_QUEUE);
                                std::thread::Builder::new()
                                    .name("tun-writer".into())
                                    .spawn(move || tun_writer(&tun, rx))
                                    .map_err(RunError::Thread)?;
                                tun_tx = Some(tx);
                            }
                        }
                        if up_ran.is_none() {
                            let dev = tunnel
                                .tun()
                                .map(|t| t.name().to_owned())
                                .unwrap_or_default();
                            let info = TunInfo::from_push(&dev, tunnel.mtu(), &c.push.accepted);
                            if let Some(up) = &settings.scripts.up {
                                run_script(ScriptType::Up, up, &info)
                                    .await
                                    .map_err(RunError::Up)?;
                            }
                            *up_ran = Some(info);
                        }
                        self.up = true;
                        tracing::info!("tunnel up");
                    }
                    Event::KeyRenegotiated { key_id } => {
                        tracing::info!(key_id = key_id.get(), "data key renegotiated")
                    }
                    Event::Closed(reason) => {
                        // Last words (an ACK, an EXIT) may be queued.
                        let _ = self.transmit().await;
                        let _ = self.flush().await;
                        return Ok(self.closed(reason));
                    }
                    Event::ClientIdentified(_) => {}
                }
            }
            let timeout = match (self.session.poll_timeout(), self.ack_hold) {
                (Some(t), Some(h)) => Some(t.min(h)),
                (t, h) => t.or(h),
            };
            let layout = PacketLayout {
                headroom: SEND_HEADROOM,
                max_len: usize::from(tunnel.mtu()),
                tailroom: DATA_TAILROOM,
            };
            let tun = tunnel.tun().filter(|_| self.up);
            // Unbiased: the socket and the tun take turns under load.
            tokio::select! {
                () = shutdown.cancelled() => {
                    tracing::info!("shutting down: closing the session");
                    self.session.close(Instant::now());
                    let _ = self.transmit().await;
                    let _ = self.flush().await;
                    let _ = self.writer.shutdown().await;
                    return Ok(Ended::Shutdown);
                }
                frame = self.reader.next() => match frame {
                    Ok(Some(packet)) => {
                        // This packet and every one already buffered behind it, bounded.
                        let now = Instant::now();
                        let mut next = Some(packet);
                        while let Some(packet) = next.take() {
                            match self.session.handle_packet(now, packet) {
                                Ok(Some(payload)) => payloads.push(payload),
                                Ok(None) | Err(SessionError::Fatal) => {}
                                Err(e) => tracing::debug!(error = %chain(&e), "received packet dropped"),
                            }
                            if payloads.len() < RECV_BATCH && !self.session.is_closed() {
                                // Until the tunnel is up, also what arrived while this was
                                // handled: see `FrameReader::buffered_or_arrived`.
                                match self.reader.buffered_or_arrived(!self.up) {
                                    Ok(p) => next = p,
                                    Err(e) => {
                                        tracing::warn!(error = %chain(&e), "TCP connection failed");
                                        return Ok(self.retry(false));
                                    }
                                }
                            }
                        }
                        to_tun(tunnel.tun(), tun_tx.as_ref(), &mut payloads).await;
                    }
                    Ok(None) => {
                        tracing::warn!("server closed the TCP connection");
                        return Ok(self.retry(false));
                    }
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "TCP connection failed");
                        return Ok(self.retry(false));
                    }
                },
                read = recv_tun(tun, &mut pool, layout, &mut batch) => {
                    read.map_err(RunError::TunRead)?;
                    let now = Instant::now();
                    for packet in &mut batch {
                        if link_scoped_v6(&packet[SEND_HEADROOM..]) {
                            // No server forwards it (DEVIATIONS C2): not sent.
                            continue;
                        }
                        match self.session.send_tun_packet(now, packet, SEND_HEADROOM) {
                            Ok(()) => self.out.extend_from_slice(packet),
                            Err(e) => tracing::debug!(error = %chain(&e), "tun packet dropped"),
                        }
                    }
                    // Dropping the packets lets the pool reuse their space.
                    batch.clear();
                    if let Err(e) = self.flush().await {
                        tracing::warn!(error = %e, "write to the server failed");
                        return Ok(self.retry(false));
                    }
                }
                () = sleep_until(timeout) => {
                    let now = Instant::now();
                    if self.session.poll_timeout().is_some_and(|t| t <= now) {
                        self.session.handle_timeout(now);
                    }
                }
            }
        }
    }

    /// Writes everything the session has queued, in one socket write.
    ///
    /// Through a proxy, until the tunnel is up, an output that is nothing but one P_ACK_V1
    /// waits up to [`ACK_HOLD`] for what the session sends next and goes out in the same
    /// write. A peer's control packets often come a fraction of a millisecond apart (a TLS
    /// flight, the key-method-2 message after the session tickets): answering the first with
    /// a lone ACK and the second with a reply makes two writes in quick succession, and a
    /// proxy running Nagle's algorithm (tinyproxy) holds the second until the server has
    /// acknowledged the first at the TCP level, which an upstream server delays by about
    /// 40 ms. The packets and their order are unchanged; only the write that carries them is.
    async fn transmit(&mut self) -> io::Result<()> {
        let now = Instant::now();
        let secs = unix_now();
        let before = self.out.len();
        while let Some(packet) = self.session.poll_transmit(now, secs) {
            self.out.extend_from_slice(&packet);
        }
        if self.hold_lone_acks && !self.up {
            match self.ack_hold {
                None if before == 0 && is_lone_ack(&self.out) => {
                    self.ack_hold = Some(now + ACK_HOLD);
                    return Ok(());
                }
                Some(until) if self.out.len() == before && now < until => return Ok(()),
                _ => {}
            }
        }
        self.flush().await
    }

    /// Writes the coalesced output.
    async fn flush(&mut self) -> io::Result<()> {
        self.ack_hold = None;
        if !self.out.is_empty() {
            let written = self.writer.write_all(&self.out).await;
            self.out.clear();
            written?;
        }
        Ok(())
    }

    fn retry(&self, next_remote: bool) -> Ended {
        Ended::Retry {
            up: self.up,
            next_remote,
        }
    }

    /// What the session's end means for the client, logged.
    fn closed(&self, reason: CloseReason) -> Ended {
        match reason {
            CloseReason::Local => Ended::Shutdown,
            CloseReason::Halt(signal) => {
                tracing::warn!(message = signal.message, "server sent HALT: stopping");
                Ended::Halt(signal.message)
            }
            CloseReason::Restart(signal) => {
                tracing::info!(
                    message = signal.message,
                    next_remote = signal.next_remote,
                    "server sent RESTART"
                );
                self.retry(signal.next_remote)
            }
            CloseReason::AuthFailed { reason } => {
                tracing::error!(
                    reason = reason.as_deref().unwrap_or(""),
                    "AUTH_FAILED: the server refused us; retrying (upstream would exit: conformance/DEVIATIONS.md C1)"
                );
                self.retry(false)
            }
            CloseReason::PingRestart(after) => {
                tracing::warn!(
                    silent_s = after.as_secs(),
                    "ping-restart: nothing received from the server"
                );
                self.retry(false)
            }
            other => {
                tracing::warn!(reason = %chain(&other), "session ended");
                self.retry(false)
            }
        }
    }
}

/// Connects to `remote`, directly or through the proxy, with `connect-timeout`.
async fn dial(settings: &Settings, remote: &Remote) -> Result<(TcpStream, BytesMut), DialError> {
    let timeout = settings.connect_timeout;
    match &settings.http_proxy {
        None => {
            tracing::info!(%remote, "connecting");
            let attempt = async {
                let addrs: Vec<SocketAddr> =
                    tokio::net::lookup_host((remote.host.as_str(), remote.port))
                        .await
                        .map_err(|source| DialError::Resolve { source })?
                        .filter(|a| settings.family_allows(a))
                        .collect();
                let mut last = None;
                for addr in addrs {
                    match netio::transport::connect_nodelay(addr).await {
                        Ok(stream) => return Ok(stream),
                        Err(source) => last = Some(DialError::Connect { addr, source }),
                    }
                }
                Err(last.unwrap_or(DialError::NoAddress))
            };
            let stream = tokio::time::timeout(timeout, attempt)
                .await
                .map_err(|_| DialError::Timeout { after: timeout })??;
            tracing::info!(%remote, "TCP connected");
            Ok((stream, BytesMut::new()))
        }
        Some(proxy) => {
            tracing::info!(%remote, proxy = %format_args!("{}:{}", proxy.host, proxy.port), "connecting through HTTP proxy");
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((proxy.host.as_str(), proxy.port))
                .await
                .map_err(|source| DialError::Resolve { source })?
                .filter(|a| settings.family_allows(a))
                .collect();
            if addrs.is_empty() {
                return Err(DialError::NoAddress);
            }
            let tunnel =
                netio::http_connect::connect_via_proxy(&addrs, &proxy.request(remote), timeout)
                    .await
                    .map_err(DialError::Proxy)?;
            tracing::info!(
                %remote,
                status = tunnel.response.status,
                reason = tunnel.response.reason,
                "proxy answered 200: tunnel to the server open"
            );
            Ok((tunnel.stream, tunnel.leftover))
        }
    }
}

/// Why one connection attempt failed.
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("cannot resolve the host")]
    Resolve {
        #[source]
        source: io::Error,
    },
    #[error("the host resolved to no address")]
    NoAddress,
    #[error("TCP connect to {addr} failed")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("no connection within {after:?}")]
    Timeout { after: Duration },
    #[error("HTTP proxy")]
    Proxy(#[source] netio::http_connect::ConnectError),
}

/// Framed packets from the socket; cancel-safe (bytes stay in `buf` across cancelled reads).
struct FrameReader {
    io: OwnedReadHalf,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// ACK every read at once (`TCP_QUICKACK`, which the kernel clears again on its own, so
    /// it is set after each read; set while an ACK is pending, it sends that ACK now): during
    /// the handshake, and for as long as the session lasts when the connection goes through
    /// an HTTP proxy. A proxy that runs Nagle's algorithm (tinyproxy) holds its next small
    /// write to us until we have acknowledged the previous one. Delayed, those ACKs added
    /// about 90 ms to the handshake with an upstream server (which writes its handshake
    /// packets one at a time), and after the handshake they held the first packets through
    /// the tunnel for about 40 ms.
    quickack: bool,
}

/// Bytes reserved before each socket read.
const READ_CHUNK: usize = 64 * 1024;

/// Longest a lone P_ACK_V1 waits for company during the handshake through a proxy (see
/// [`Connection::transmit`]): well above the gaps seen between a peer's control packets
/// (0.05-0.2 ms), far below any retransmission timeout (seconds).
const ACK_HOLD: Duration = Duration::from_millis(1);

/// Whether `out` is exactly one framed P_ACK_V1 (the opcode byte is in clear with every
/// control-channel protection).
fn is_lone_ack(out: &[u8]) -> bool {
    out.len() > 2
        && usize::from(u16::from_be_bytes([out[0], out[1]])) == out.len() - 2
        && out[2] >> 3 == protocol::opcode::P_ACK_V1
}

/// Most bytes one read of what has arrived takes during the handshake (a peer's TLS flight
/// is a few kilobytes).
const ARRIVED_CHUNK: usize = 16 * 1024;

impl FrameReader {
    /// The next packet already in the buffer; with `arrived`, if none is, also what the
    /// socket has received by now (one read that does not wait).
    ///
    /// The handshake uses `arrived`: a peer's TLS flight often comes in two control packets,
    /// and answering the first alone means a P_ACK_V1 of its own followed by the TLS reply.
    /// Through a proxy with Nagle's algorithm on (tinyproxy), that second write waits until the
    /// server acknowledges the first at the TCP level, which an upstream server delays by
    /// about 40 ms. Taking the second packet first makes one reply that carries the ACK.
    fn buffered_or_arrived(&mut self, arrived: bool) -> Result<Option<BytesMut>, FrameReadError> {
        if let Some(packet) = self.decoder.decode(&mut self.buf)? {
            return Ok(Some(packet));
        }
        if !arrived {
            return Ok(None);
        }
        // A close (0 bytes) is for `next` to report.
        if netio::transport::read_arrived(self.io.as_ref(), &mut self.buf, ARRIVED_CHUNK)? == 0 {
            return Ok(None);
        }
        if self.quickack {
            let _ = self.io.as_ref().set_quickack(true);
        }
        Ok(self.decoder.decode(&mut self.buf)?)
    }

    /// The next packet (without its length prefix); `None` on a clean close between packets.
    async fn next(&mut self) -> Result<Option<BytesMut>, FrameReadError> {
        loop {
            if let Some(packet) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(packet));
            }
            self.buf.reserve(READ_CHUNK);
            let n = self.io.read_buf(&mut self.buf).await?;
            if self.quickack && n > 0 {
                // Best effort: without it the handshake is only slower.
                let _ = self.io.as_ref().set_quickack(true);
            }
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameReadError::Truncated)
                };
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum FrameReadError {
    #[error("bad packet length")]
    Frame(#[from] protocol::framing::FrameError),
    #[error("connection closed in the middle of a packet")]
    Truncated,
    #[error("socket read failed")]
    Io(#[from] io::Error),
}

/// The longest packet accepted from the server: upstream's stream buffer grows with the MTU.
fn frame_max_len(tun_mtu: u16) -> u16 {
    DEFAULT_STREAM_MAXLEN.saturating_add(tun_mtu.saturating_sub(DEFAULT_TUN_MTU))
}

/// A batch of packets from the tun into slices of `pool`, laid out as `layout`; never
/// resolves without a device.
async fn recv_tun(
    tun: Option<&netio::tun::Tun>,
    pool: &mut RecvPool,
    layout: PacketLayout,
    batch: &mut Vec<BytesMut>,
) -> io::Result<usize> {
    match tun {
        Some(tun) => tun.recv_many(pool, layout, batch, TUN_BATCH).await,
        None => std::future::pending().await,
    }
}

/// Writes the decrypted packets of one socket read into the tun device and empties
/// `payloads`. A lone packet while the writer task is idle is written here (a hand-off to
/// another thread would add its wake-up to every request/response round trip); a burst goes
/// to the writer task, waiting when its queue is full (the socket is then read no faster
/// than the device takes packets). Without a tunnel the packets are dropped.
async fn to_tun(
    tun: Option<&netio::tun::Tun>,
    tx: Option<&mpsc::Sender<BytesMut>>,
    payloads: &mut Vec<BytesMut>,
) {
    let (Some(tun), Some(tx)) = (tun, tx) else {
        payloads.clear();
        return;
    };
    if payloads.len() == 1 && tx.capacity() == tx.max_capacity() {
        if let Some(packet) = payloads.pop() {
            if let Err(e) = tun.send(&packet).await {
                tracing::debug!(error = %e, "tun write failed; packet dropped");
            }
        }
        return;
    }
    for payload in payloads.drain(..) {
        if let Err(mpsc::error::TrySendError::Full(payload)) = tx.try_send(payload) {
            let _ = tx.send(payload).await;
        }
    }
}

/// The tun writer thread: writes the packets of one connection into the tun device until the
/// connection drops its sender. Takes what is queued, up to [`TUN_WRITE_BATCH`], and writes it
/// with consecutive TCP segments of one flow merged (see [`Coalescer`]).
fn tun_writer(tun: &netio::tun::Tun, mut rx: mpsc::Receiver<BytesMut>) {
    let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_WRITE_BATCH);
    let mut gro = Coalescer::with_capacity(TUN_WRITE_BATCH);
    while let Some(packet) = rx.blocking_recv() {
        batch.push(packet);
        while batch.len() < TUN_WRITE_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        if let Err(e) = tun.send_many_sync(&mut batch, &mut gro) {
            tracing::debug!(error = %e, "tun write failed; packet dropped");
        }
        batch.clear();
    }
}

/// Whether `packet` is IPv6 from a link-local (`fe80::/10`) or the unspecified (`::`) source:
/// what the kernel sends by itself on a fresh tun device (router solicitations, MLD reports).
/// An OpenVPN server never forwards such a packet (upstream drops it without a word, ours
/// counts it as ignored), so sending it only puts a packet of no use in front of the first
/// real one (DEVIATIONS C2).
fn link_scoped_v6(packet: &[u8]) -> bool {
    let Some(src) = packet.get(8..24).filter(|_| packet[0] >> 4 == 6) else {
        return false;
    };
    (src[0] == 0xfe && src[1] & 0xc0 == 0x80) || src.iter().all(|&b| b == 0)
}

/// Sleeps until `deadline`; never resolves without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

impl Settings {
    /// Whether `proto tcp4-client|tcp6-client` allows dialing `addr`.
    fn family_allows(&self, addr: &SocketAddr) -> bool {
        match self.family {
            Family::Any => true,
            Family::V4 => addr.is_ipv4(),
            Family::V6 => addr.is_ipv6(),
        }
    }
}

/// `connect-retry` pauses: `initial`, doubling after each attempt that did not bring the tunnel
/// up, capped at `max`; back to `initial` once a tunnel came up.
#[derive(Debug, Clone)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }

    fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let pauses: Vec<u64> = (0..5).map(|_| b.next_pause().as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_pause().as_secs(), 1);
    }

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

    #[test]
    fn link_scoped_ipv6_sources_are_recognised() {
        let v6 = |src: [u8; 16]| {
            let mut p = vec![0u8; 48];
            p[0] = 0x60;
            p[8..24].copy_from_slice(&src);
            p
        };
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[15] = 1;
        let mut febf = link_local;
        febf[1] = 0xbf;
        let mut global = link_local;
        global[..2].copy_from_slice(&[0xfd, 0x00]);
        let mut fec0 = link_local;
        fec0[1] = 0xc0;
        assert!(link_scoped_v6(&v6(link_local)));
        assert!(link_scoped_v6(&v6(febf)));
        assert!(link_scoped_v6(&v6([0; 16])));
        assert!(!link_scoped_v6(&v6(global)));
        assert!(!link_scoped_v6(&v6(fec0)));
        // IPv4, short and empty packets are not.
        let mut v4 = vec![0u8; 40];
        v4[0] = 0x45;
        assert!(!link_scoped_v6(&v4));
        assert!(!link_scoped_v6(&v6(link_local)[..20]));
        assert!(!link_scoped_v6(&[]));
    }

    #[test]
    fn frame_limit_follows_the_mtu() {
        assert_eq!(frame_max_len(1500), 1768);
        assert_eq!(frame_max_len(1400), 1768);
        assert_eq!(frame_max_len(9000), 1768 + 7500);
    }
}
