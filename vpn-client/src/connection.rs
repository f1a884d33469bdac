//! One connection to the server: the session's event loop, from the dialed socket until the
//! connection ends (see the crate docs for how the client reconnects).
//!
//! The loop is netio's [`Pump`] (transmit, events, timers, batched receive and send, after
//! the session's driving contract; one task owns the session, no lock). The client's [`Role`]
//! in it: its own inputs are the cancellation token, a batch of packets from the tun device
//! (only while the tunnel is up) and the HA routes' hold-down; on `Connected` it applies the
//! push to the tunnel and runs `up`; decrypted packets go to the tunnel's
//! [`TunWriter`]. Until the tunnel is up the pump batches what has arrived with each packet and,
//! through a proxy, holds a lone ACK briefly ([`Handshake`]).
//!
//! No buffer is allocated per packet in the steady state: tun packets are read in batches of
//! up to [`TUN_BATCH`] into slices of one pooled buffer after [`SEND_HEADROOM`] bytes,
//! encrypted there in place and queued as they are; every packet already in the receive
//! buffer is split off it and decrypted in place, and its space is reclaimed once the tun
//! writer has written it.

use std::time::Instant;

use bytes::BytesMut;
use netio::framed::{FrameReader, FrameWriter};
use netio::listen::{LogLimiter, LOG_EVERY};
use netio::pump::{log_dropped_control, sleep_until, tun_layout, Handshake, Pump, Role, Stop};
use netio::report::chain;
use netio::tun::{PacketLayout, RecvPool, Tun, TunWriter};
use protocol::push::{DropReason, PathGuard, PushOutcome};
use protocol::session::{ClientSession, CloseReason, Connected, Event, SEND_HEADROOM};
use tokio_util::sync::CancellationToken;

use crate::dial::Dialed;
use crate::script::{run_script, ScriptType, TunInfo};
use crate::settings::Settings;
use crate::tunnel::{Plan, Tunnel};
use crate::RunError;

/// Most tun packets read (and encrypted, and written to the socket as one write) per wakeup.
pub const TUN_BATCH: usize = 32;

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

/// One connection's session and socket, before it runs.
pub(crate) struct Connection {
    pump: Pump<ClientSession>,
    /// The addresses this connection dialed, which no pushed route may capture.
    path: PathGuard,
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
        let handshake = Handshake {
            read_arrived: true,
            hold_lone_acks: settings.http_proxy.is_some(),
        };
        Connection {
            pump: Pump::new(session, reader, FrameWriter::new(write), handshake),
            path: PathGuard::new(path),
            local,
        }
    }

    /// Runs the session until the connection ends; a `Retry` or a shutdown ends with our FIN.
    pub async fn run(mut self, cx: Context<'_>) -> Result<Ended, RunError> {
        let mut client = Client {
            settings: cx.settings,
            tunnel: cx.tunnel,
            shutdown: cx.shutdown,
            up_ran: cx.up_ran,
            up: false,
            path: self.path,
            local: self.local,
            dropped_log: LogLimiter::new(LOG_EVERY),
            pool: RecvPool::default(),
            batch: Vec::with_capacity(TUN_BATCH),
        };
        let stop = self.pump.run(&mut client).await;
        let ended = client.ended(stop);
        if let Ok(Ended::Retry { .. } | Ended::Shutdown) = &ended {
            // Close our direction (FIN) rather than leave it to the drop's RST.
            let _ = self.pump.shutdown().await;
        }
        ended
    }
}

/// The client's [`Role`] in its connection's pump.
struct Client<'a> {
    settings: &'a Settings,
    tunnel: &'a mut Tunnel,
    shutdown: &'a CancellationToken,
    up_ran: &'a mut Option<TunInfo>,
    /// Whether the tunnel came up (pushed options applied).
    up: bool,
    path: PathGuard,
    local: Option<std::net::IpAddr>,
    /// Control messages from the server that were dropped: a line a second at most.
    dropped_log: LogLimiter,
    /// The tun reader's buffers, and one batch read.
    pool: RecvPool,
    batch: Vec<BytesMut>,
}

/// The client's own inputs.
enum Input {
    Shutdown,
    /// A batch read from the tun device into `Client::batch`.
    Tun(std::io::Result<usize>),
    /// The HA routes' hold-down passed.
    HaDue,
}

impl Role for Client<'_> {
    type Session = ClientSession;
    type Input = Input;
    type Ended = RunError;

    async fn next_input(&mut self) -> Input {
        let layout = tun_layout(self.tunnel.mtu(), self.tunnel.is_tap());
        // Only while the tunnel is up.
        let tun = self.tunnel.tun().filter(|_| self.up);
        tokio::select! {
            () = self.shutdown.cancelled() => Input::Shutdown,
            read = recv_tun(tun, &mut self.pool, layout, &mut self.batch) => Input::Tun(read),
            () = sleep_until(self.tunnel.ha_due()), if self.tunnel.ha_due().is_some() => {
                Input::HaDue
            }
        }
    }

    async fn on_input(
        &mut self,
        pump: &mut Pump<ClientSession>,
        input: Input,
    ) -> Result<(), Stop<RunError>> {
        match input {
            // The session's `Closed` follows, and our FIN (`Connection::run`).
            Input::Shutdown => {
                tracing::info!("shutting down: closing the session");
                pump.session_mut().close(Instant::now());
            }
            Input::Tun(read) => {
                read.map_err(|e| Stop::Role(RunError::TunRead(e)))?;
                // Frames of a tap device are passed as they are (neighbour discovery needs the
                // link-local ones); no server forwards the others (DEVIATIONS C2): not sent.
                let tap = self.tunnel.is_tap();
                pump.send_tun_packets(
                    self.batch
                        .drain(..)
                        .filter(|p| tap || !link_scoped_v6(&p[SEND_HEADROOM..])),
                );
            }
            Input::HaDue => self.tunnel.ha_install().await,
        }
        Ok(())
    }

    async fn on_event(
        &mut self,
        pump: &mut Pump<ClientSession>,
        event: Event,
    ) -> Result<(), Stop<RunError>> {
        match event {
            Event::Connected(c) => return self.on_connected(pump, c).await,
            Event::KeyRenegotiated { key_id } => {
                tracing::info!(key_id = key_id.get(), "data key renegotiated")
            }
            Event::ControlMessageDropped(error) => {
                log_dropped_control(&mut self.dropped_log, &error, "server");
            }
            Event::Closed(_) | Event::ClientIdentified(_) => {}
        }
        Ok(())
    }

    fn on_payload(&mut self, payload: BytesMut, to_tun: &mut Vec<BytesMut>) {
        to_tun.push(payload);
    }

    /// Without a tunnel the packets are dropped.
    fn tun_writer(&self) -> Option<&TunWriter> {
        self.tunnel.writer()
    }
}

impl Client<'_> {
    /// The push arrived: the tunnel is configured from what the pull policy and the path
    /// guard accept, `up` runs (the first time), HA routes follow.
    async fn on_connected(
        &mut self,
        pump: &mut Pump<ClientSession>,
        c: Connected,
    ) -> Result<(), Stop<RunError>> {
        // What the session answered (the push's ACK) goes out before the set-up, which may
        // take a while (a script).
        pump.flush().await.map_err(Stop::Write)?;
        pump.reader_mut()
            .set_quickack(self.settings.http_proxy.is_some());
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
        let tunnel = &mut *self.tunnel;
        tunnel
            .apply(&Plan::from_push(&push.accepted, tunnel.is_tap()))
            .await
            .map_err(|e| Stop::Role(e.into()))?;
        if self.up_ran.is_none() {
            let dev = tunnel.tun().map(Tun::name).unwrap_or_default();
            let info = TunInfo::from_push(dev, tunnel.mtu(), &push.accepted);
            if let Some(up) = &self.settings.scripts.up {
                run_script(ScriptType::Up, up, &info)
                    .await
                    .map_err(|e| Stop::Role(RunError::Up(e)))?;
            }
            *self.up_ran = Some(info);
        }
        self.up = true;
        tunnel.ha_up(self.local);
        tunnel.ha_return_path().await;
        // HA routes due now go in before any packet the server sent with the push or right
        // behind it (what an HA server held for the shoot comes at once) is written to the
        // device: the answer to it must find the way back into this tunnel, not the pod's
        // default route (hold_replay_ha saw SYN-ACKs leave a shoot pod by eth0 and the
        // requests wait for the kernel's retransmission, 1 s).
        if tunnel.ha_due().is_some_and(|due| due <= Instant::now()) {
            tunnel.ha_install().await;
        }
        tracing::info!("tunnel up");
        Ok(())
    }

    /// How the pump's end ends the connection, logged.
    fn ended(&self, stop: Stop<RunError>) -> Result<Ended, RunError> {
        Ok(match stop {
            Stop::Closed(reason) => self.closed(reason),
            Stop::PeerClosed => {
                tracing::warn!("server closed the TCP connection");
                self.retry(false)
            }
            Stop::Read(e) => {
                tracing::warn!(error = %chain(&e), "TCP connection failed");
                self.retry(false)
            }
            Stop::Write(e) => {
                tracing::warn!(error = %e, "write to the server failed");
                self.retry(false)
            }
            Stop::Role(e) => return Err(e),
        })
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
            CloseReason::DevTypeMismatch(mismatch) => {
                tracing::error!(
                    reason = %mismatch,
                    "the server's OCC options string names the other device type: dropping \
                     this server, no tunnel; retrying (upstream would only warn: \
                     conformance/DEVIATIONS.md W4)"
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

#[cfg(test)]
mod tests {
    use super::*;

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
