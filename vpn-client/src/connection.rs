//! One connection to the server: the session's event loop, from the dialed socket until the
//! connection ends (see the crate docs for how the client reconnects).
//!
//! One task drives one [`ClientSession`] with a `select!` over four sources: the cancellation
//! token, the framed packets from the socket ([`FrameReader`]), a batch of packets from the
//! tun device (only while the tunnel is up) and the session's timer. After each input it
//! follows the session's driving contract: queue what `poll_transmit` returns on the
//! [`FrameWriter`] and write it (one vectored write), then handle `poll_event`, then sleep no
//! longer than `poll_timeout`. The session stays owned by one task (no lock); decrypted packets
//! go to the tunnel's [`TunWriter`](netio::tun::TunWriter).
//!
//! No buffer is allocated per packet in the steady state: tun packets are read in batches of
//! up to [`TUN_BATCH`] into slices of one pooled buffer after [`SEND_HEADROOM`] bytes,
//! encrypted there in place and queued as they are; every packet already in the receive
//! buffer is split off it and decrypted in place, and its space is reclaimed once the tun
//! writer has written it.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use netio::clock::unix_now;
use netio::framed::{FrameReadError, FrameReader, FrameWriter, RECV_BATCH};
use netio::listen::{LogLimiter, LOG_EVERY};
use netio::report::chain;
use netio::tun::{PacketLayout, RecvPool, Tun, TAP_FRAME_EXTRA};
use protocol::data::DATA_TAILROOM;
use protocol::opcode::{P_ACK_V1, P_OPCODE_SHIFT};
use protocol::push::{DropReason, PathGuard, PushOutcome};
use protocol::session::{ClientSession, CloseReason, Event, SessionError, SEND_HEADROOM};
use tokio_util::sync::CancellationToken;

use crate::dial::Dialed;
use crate::script::{run_script, ScriptType, TunInfo};
use crate::settings::Settings;
use crate::tunnel::{Plan, Tunnel};
use crate::RunError;

/// Most tun packets read (and encrypted, and written to the socket as one write) per wakeup.
pub const TUN_BATCH: usize = 32;

/// Longest a lone P_ACK_V1 waits for company during the handshake through a proxy (see
/// [`Connection::transmit`]): well above the gaps seen between a peer's control packets
/// (0.05-0.2 ms), far below any retransmission timeout (seconds).
const ACK_HOLD: Duration = Duration::from_millis(1);

/// How one connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    Shutdown,
    Halt(String),
    /// Try again; `up` tells whether the tunnel had come up.
    Retry {
        up: bool,
        next_remote: bool,
    },
}

/// What a connection shares with the ones before and after it.
pub(crate) struct Context<'a> {
    pub settings: &'a Settings,
    pub tunnel: &'a mut Tunnel,
    pub shutdown: &'a CancellationToken,
    /// The device parameters `up` ran with (`down` gets the same); `None` before the tunnel
    /// first came up.
    pub up_ran: &'a mut Option<TunInfo>,
}

/// One connection's session and socket.
pub(crate) struct Connection {
    session: ClientSession,
    reader: FrameReader,
    writer: FrameWriter,
    up: bool,
    /// Through an HTTP proxy: until the tunnel is up, an output that is one lone P_ACK_V1
    /// waits up to [`ACK_HOLD`] to go out in the same write as what follows (see
    /// [`Connection::transmit`]).
    hold_lone_acks: bool,
    /// Until when the lone P_ACK_V1 queued waits.
    ack_hold: Option<Instant>,
    /// The addresses this connection dialed, which no pushed route may capture.
    path: PathGuard,
    /// Control messages from the server that were dropped: a line a second at most.
    dropped_log: LogLimiter,
    /// The local address of the connection to the server (HA: the routes' source).
    local: Option<std::net::IpAddr>,
}

impl Connection {
    /// A new session over the dialed socket.
    pub fn new(session: ClientSession, dialed: Dialed, settings: &Settings) -> Self {
        let Dialed {
            stream,
            leftover,
            path,
        } = dialed;
        let local = stream.local_addr().ok().map(|a| a.ip().to_canonical());
        let (read, write) = stream.into_split();
        let mut reader = FrameReader::new(read, leftover, settings.tun.mtu);
        // During the handshake always (a delayed ACK stalls a peer that writes its handshake
        // packets one at a time); through a proxy for the whole session (see `Connected`).
        reader.set_quickack(true);
        Connection {
            session,
            reader,
            writer: FrameWriter::new(write),
            up: false,
            hold_lone_acks: settings.http_proxy.is_some(),
            ack_hold: None,
            path: PathGuard::new(path),
            dropped_log: LogLimiter::new(LOG_EVERY),
            local,
        }
    }

    /// Runs the session until the connection ends; a `Retry` ends with our FIN.
    pub async fn run(mut self, cx: Context<'_>) -> Result<Ended, RunError> {
        let ended = self.drive(cx).await;
        if let Ok(Ended::Retry { .. }) = &ended {
            // Close our direction (FIN) rather than leave it to the drop's RST.
            let _ = self.writer.shutdown().await;
        }
        ended
    }

    async fn drive(&mut self, cx: Context<'_>) -> Result<Ended, RunError> {
        let Context {
            settings,
            tunnel,
            shutdown,
            up_ran,
        } = cx;
        let mut pool = RecvPool::default();
        let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_BATCH);
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
                        self.reader.set_quickack(settings.http_proxy.is_some());
                        let mut push = c.push;
                        self.path.apply(&mut push);
                        tracing::info!(
                            cipher = c.cipher.name(),
                            peer_id = ?c.peer_id.map(|p| p.get()),
                            tls_ekm = c.tls_ekm,
                            dyn_tls_crypt = c.dyn_tls_crypt,
                            accepted = push.accepted.len(),
                            dropped = push.dropped.len(),
                            refused = push.refused_by_guard().count(),
                            adjusted = push.adjusted.len(),
                            "TLS up, keys exchanged, push received"
                        );
                        log_push(&push);
                        tunnel
                            .apply(&Plan::from_push(&push.accepted, tunnel.is_tap()))
                            .await?;
                        if up_ran.is_none() {
                            let dev = tunnel.tun().map(Tun::name).unwrap_or_default();
                            let info = TunInfo::from_push(dev, tunnel.mtu(), &push.accepted);
                            if let Some(up) = &settings.scripts.up {
                                run_script(ScriptType::Up, up, &info)
                                    .await
                                    .map_err(RunError::Up)?;
                            }
                            *up_ran = Some(info);
                        }
                        self.up = true;
                        tunnel.ha_up(self.local);
                        tracing::info!("tunnel up");
                    }
                    Event::KeyRenegotiated { key_id } => {
                        tracing::info!(key_id = key_id.get(), "data key renegotiated")
                    }
                    Event::ControlMessageDropped(error) => {
                        if let Some(suppressed) = self.dropped_log.allow(Instant::now()) {
                            tracing::warn!(
                                error = %error,
                                text = %error.escaped_message().unwrap_or_default(),
                                suppressed,
                                "control message from the server dropped"
                            );
                        }
                    }
                    Event::Closed(reason) => {
                        // Last words (an ACK, an EXIT) may be queued.
                        let _ = self.transmit().await;
                        let _ = self.writer.flush().await;
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
                // A tap device's frames: the MTU, the Ethernet header and a VLAN tag.
                max_len: usize::from(tunnel.mtu())
                    + if tunnel.is_tap() { TAP_FRAME_EXTRA } else { 0 },
                tailroom: DATA_TAILROOM,
            };
            let tun = tunnel.tun().filter(|_| self.up);
            // Unbiased: the socket and the tun take turns under load.
            tokio::select! {
                () = shutdown.cancelled() => {
                    tracing::info!("shutting down: closing the session");
                    self.session.close(Instant::now());
                    let _ = self.transmit().await;
                    let _ = self.writer.shutdown().await;
                    return Ok(Ended::Shutdown);
                }
                frame = self.reader.next() => match frame {
                    Ok(Some(packet)) => {
                        if let Err(e) = self.receive(packet, &mut payloads) {
                            tracing::warn!(error = %chain(&e), "TCP connection failed");
                            return Ok(self.retry(false));
                        }
                        match tunnel.writer() {
                            Some(writer) => writer.write(&mut payloads).await,
                            // Without a tunnel the packets are dropped.
                            None => payloads.clear(),
                        }
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
                    for mut packet in batch.drain(..) {
                        // Frames of a tap device are passed as they are (neighbour discovery
                        // needs the link-local ones).
                        if !tunnel.is_tap() && link_scoped_v6(&packet[SEND_HEADROOM..]) {
                            // No server forwards it (DEVIATIONS C2): not sent.
                            continue;
                        }
                        match self.session.send_tun_packet(now, &mut packet, SEND_HEADROOM) {
                            Ok(()) => self.writer.push(packet),
                            Err(e) => tracing::debug!(error = %chain(&e), "tun packet dropped"),
                        }
                    }
                    if let Err(e) = self.flush().await {
                        tracing::warn!(error = %e, "write to the server failed");
                        return Ok(self.retry(false));
                    }
                }
                () = sleep_until(tunnel.ha_due()), if tunnel.ha_due().is_some() => {
                    tunnel.ha_install().await;
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

    /// Handles `first` and every packet already buffered behind it (at most [`RECV_BATCH`]),
    /// collecting the decrypted tun payloads. Until the tunnel is up, also what has arrived
    /// while they were handled: see [`FrameReader::buffered_or_arrived`].
    fn receive(
        &mut self,
        first: BytesMut,
        payloads: &mut Vec<BytesMut>,
    ) -> Result<(), FrameReadError> {
        let now = Instant::now();
        let Connection {
            session,
            reader,
            up,
            ..
        } = self;
        reader.receive_batch(first, !*up, |packet| {
            match session.handle_packet(now, packet) {
                Ok(Some(payload)) => payloads.push(payload),
                Ok(None) | Err(SessionError::Fatal) => {}
                Err(e) => tracing::debug!(error = %chain(&e), "received packet dropped"),
            }
            payloads.len() < RECV_BATCH && !session.is_closed()
        })
    }

    /// Queues everything the session has to send and writes it, in one vectored write.
    ///
    /// Through a proxy, until the tunnel is up, an output that is nothing but one P_ACK_V1
    /// waits up to [`ACK_HOLD`] for what the session sends next and goes out in the same
    /// write. A peer's control packets often come a fraction of a millisecond apart (a TLS
    /// flight, the key-method-2 message after the session tickets): answering the first with
    /// a lone ACK and the second with a reply makes two writes in quick succession, and a
    /// proxy running Nagle's algorithm (tinyproxy) holds the second until the server has
    /// acknowledged the first at the TCP level, which an upstream server delays by about
    /// 40 ms. The packets and their order are unchanged; only the write that carries them is.
    async fn transmit(&mut self) -> std::io::Result<()> {
        let now = Instant::now();
        let was_empty = self.writer.is_empty();
        let mut queued = false;
        while let Some(packet) = self.session.poll_transmit(now, unix_now()) {
            self.writer.push(packet);
            queued = true;
        }
        if self.hold_lone_acks && !self.up {
            match self.ack_hold {
                None if was_empty && self.writer.only_queued().is_some_and(is_lone_ack) => {
                    self.ack_hold = Some(now + ACK_HOLD);
                    return Ok(());
                }
                Some(until) if !queued && now < until => return Ok(()),
                _ => {}
            }
        }
        self.flush().await
    }

    /// Writes what is queued.
    async fn flush(&mut self) -> std::io::Result<()> {
        self.ack_hold = None;
        self.writer.flush().await
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

/// One line per pushed option: accepted, adjusted or refused by the push guard (a warning, with
/// the option's text and why), dropped otherwise.
fn log_push(push: &PushOutcome) {
    for option in &push.accepted {
        tracing::info!(?option, "pushed option accepted");
    }
    for a in &push.adjusted {
        tracing::warn!(
            option = a.text,
            pushed = a.pushed,
            applied = a.applied,
            "pushed {} raised by the push guard",
            a.option
        );
    }
    for dropped in &push.dropped {
        match &dropped.reason {
            DropReason::Guard(refusal) => tracing::warn!(
                option = dropped.text,
                "pushed option refused by the push guard: {refusal}"
            ),
            reason => tracing::info!(option = dropped.text, ?reason, "pushed option dropped"),
        }
    }
}

/// Whether `out` is exactly one framed P_ACK_V1 (the opcode byte is in clear with every
/// control-channel protection).
fn is_lone_ack(out: &[u8]) -> bool {
    out.len() > 2
        && usize::from(u16::from_be_bytes([out[0], out[1]])) == out.len() - 2
        && out[2] >> P_OPCODE_SHIFT == P_ACK_V1
}

/// A batch of packets from the tun into slices of `pool`, laid out as `layout`; never
/// resolves without a device.
async fn recv_tun(
    tun: Option<&Tun>,
    pool: &mut RecvPool,
    layout: PacketLayout,
    batch: &mut Vec<BytesMut>,
) -> std::io::Result<usize> {
    match tun {
        Some(tun) => tun.recv_many(pool, layout, batch, TUN_BATCH).await,
        None => std::future::pending().await,
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
}
