//! `vpn-client`: the shoot side. An OpenVPN 2.6 compatible TCP client that dials out directly
//! or through an HTTP CONNECT proxy (with Gardener's routing header), applies the pushed
//! `ifconfig`, `ifconfig-ipv6`, `route` and `route-ipv6` that passed the pull policy to a tun
//! device (or a tap device with `dev tap`: Ethernet frames, routes via `route-gateway`), carries packets between the tun and the server, and reconnects by itself.
//!
//! [`run`] is the whole client: give it [`Settings`] and a [`CancellationToken`]; it returns
//! when the token is cancelled, the server sends `HALT`, or the local setup fails (tun,
//! netlink, TLS material). Everything else - a refused TCP connection, a proxy error, a TCP
//! close, `ping-restart`, `RESTART`, `AUTH_FAILED`, a failed handshake, a server whose OCC
//! options string names the other device type (`dev-type tap` against our `tun`: dropped before
//! `PUSH_REQUEST`, logged at error) - ends only the current connection, and the next attempt
//! follows after the `connect-retry` pause.
//!
//! # A packet's way
//!
//! | step | where |
//! |---|---|
//! | dial: direct, or `CONNECT` through the proxy with the routing header | [`dial`](mod@dial) |
//! | the session's event loop: socket, tun, timer, shutdown | [`netio::pump`], the client's role in it [`connection`] |
//! | socket → packets (framing, length limit from the MTU) | [`netio::framed::FrameReader`] |
//! | packet → decrypted tun payload (in place) | `protocol::session::ClientSession::handle_packet` |
//! | payload → tun device (writer thread, lone-packet shortcut) | [`netio::tun::TunWriter`] |
//! | tun → packets (batches, offloads cut to the MTU) | [`netio::tun::Tun::recv_many`] |
//! | packet → framed wire packet (encrypted in place) | `ClientSession::send_tun_packet` |
//! | wire packets → socket (one vectored write) | [`netio::framed::FrameWriter`] |
//! | pushed routes over the dialed path refused (`protocol::push::PathGuard`) | [`connection`] |
//! | addresses and routes from the push | [`tunnel`] |
//!
//! The session stays owned by one task (no lock), and the binary runs it on a current-thread
//! runtime (no work stealing, no cross-thread wake-ups on the latency path); the expensive
//! system call of the receive direction, the write into the tun device (where the kernel runs
//! the whole inner TCP receive path), runs on the writer thread, so under load both cores
//! work.
//!
//! # Reconnecting
//!
//! Attempts go through the remotes in order. A connection that never came up moves on to the
//! next remote and doubles the pause (from `connect-retry`, capped at its maximum); a tunnel
//! that was up and then dropped reconnects to the same remote after the initial pause (a
//! `RESTART` with the `N` flag moves on). The tun device is kept across reconnects; see
//! [`tunnel`] for how addresses and routes are reconciled.
//!
//! # HA (vpn2's `IS_HA=true`; `docs/ha.md`)
//!
//! Each client owns `tun<VPN_SERVER_INDEX>` and its routes ([`TunSettings::ha`]): the shoot
//! networks (in a kube-apiserver pod, with the pod IP as source) or the seed side (in a shoot
//! pod), metric `100 + index`, installed when its tunnel is up (after a 10 s hold-down if an
//! earlier tunnel of the process went down) and withdrawn the moment a connection ends, so the
//! kernel moves traffic to the other server's device. [`ha`] holds the verbs whose vpn2 job
//! this makes unnecessary (`path-controller`, `tunnel-controller`).

use std::io;
use std::time::Duration;

use netio::firewall::{Firewall, FirewallError, Installed};
use netio::report::chain;
use protocol::session::{ClientConfig, ClientSession};
pub use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use protocol::session::SEND_HEADROOM;
pub use script::Scripts;
pub use settings::{
    HaRoutes, HttpProxy, Remote, Settings, SettingsError, TlsMaterial, TunSettings,
    DEFAULT_CONNECT_RETRY, DEFAULT_CONNECT_RETRY_MAX, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TUN_MTU,
};
pub use tunnel::TunnelError;

pub mod cloud_api;
pub mod config;
pub mod connection;
pub mod dial;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod ha;
pub mod script;
mod settings;
pub mod tunnel;
pub mod vpn2;

use connection::{Connection, Context, Ended};
use script::{run_script, ScriptError, ScriptType, TunInfo};
use tunnel::Tunnel;

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
    /// The tun device, its writer, its addresses or netlink failed.
    #[error("tun device setup failed")]
    Tunnel(#[from] TunnelError),
    /// Reading from the tun device failed.
    #[error("tun device read failed")]
    TunRead(#[source] io::Error),
    /// The `up` command failed.
    #[error("up script")]
    Up(#[source] ScriptError),
    /// The firewall rules were refused.
    #[error("firewall rules")]
    Firewall(#[from] FirewallError),
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
pub async fn run(mut settings: Settings, shutdown: CancellationToken) -> Result<Stopped, RunError> {
    if settings.tun.auto_mtu {
        settings.tun.mtu = tunnel::auto_mtu(settings.tun.mtu).await?;
    }
    let config = settings.client_config()?;
    if let Some(guard) = &settings.guard {
        Firewall::open()?.apply(guard, false)?;
        tracing::info!(
            table = guard.name(),
            "tunnel-only rules in place (they outlive this process)"
        );
    }
    let rules = settings
        .firewall
        .as_ref()
        .map(Installed::apply)
        .transpose()?;
    let mut tunnel = Tunnel::new(settings.tun.clone())?;
    let mut client = Client {
        settings: &settings,
        config,
        shutdown: &shutdown,
        up_ran: None,
    };
    let result = client.reconnect_loop(&mut tunnel).await;
    tunnel.teardown().await;
    if let Some(rules) = rules {
        rules.remove();
    }
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
            let span = match &self.settings.http_proxy {
                Some(p) => {
                    tracing::info_span!("connection", %remote, proxy = %format_args!("{}:{}", p.host, p.port))
                }
                None => tracing::info_span!("connection", %remote),
            };
            let ended = self.connection(remote, tunnel).instrument(span).await?;
            // HA: a tunnel that is down carries no routes (the other server's take over).
            tunnel.ha_withdraw().await;
            let pause = match ended {
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
        let dialed = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return Ok(Ended::Shutdown),
            r = dial::dial(self.settings, remote) => r,
        };
        let dialed = match dialed {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %chain(&e), "connection attempt failed");
                return Ok(Ended::Retry {
                    up: false,
                    next_remote: true,
                });
            }
        };
        let session = ClientSession::new(
            self.config.clone(),
            netio::rng::session_rng(),
            std::time::Instant::now(),
        );
        let cx = Context {
            settings: self.settings,
            tunnel,
            shutdown: self.shutdown,
            up_ran: &mut self.up_ran,
        };
        Connection::new(session, dialed, self.settings)
            .run(cx)
            .await
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
}
