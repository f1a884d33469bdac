//! The server's tun (or tap) device: its set-up, and the reader that hands each batch to the
//! packet mode, which queues each packet to its client's connection (the writer is `netio`'s
//! [`TunWriter`](netio::tun::TunWriter), shared by every connection).
//!
//! A packet from the device to a client that is reconnecting is held until its tunnel is up
//! again, up to `hold_timeout` ([`crate::registry::hold`]); one that no client routes, or
//! held that long, is answered with ICMP "destination unreachable" (rate-limited; see
//! [`crate::unreachable`]), so seed-side connects fail then instead of at their timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipnet::IpNet;
use netio::netlink::{IpPrefix, Netlink, NetlinkError, Route};
use netio::tun::{PacketLayout, RecvPool, Tun};
use protocol::data::DATA_TAILROOM;
use protocol::push::PushedOption;
use protocol::session::SEND_HEADROOM;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::pool::Pool;
use crate::settings::Settings;
use crate::shared::{lock, mode, Shared};
use crate::unreachable;

/// Most packets the reader takes from the device (and routes under one lock of the registry)
/// per wakeup (a super-packet's segments come together, so a batch can be longer by one
/// super-packet).
pub const TUN_READ_BATCH: usize = 32;

/// Pause after a failed device read before the next.
const READ_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// The device's set-up failed: the step, and netlink's answer (the server reports it as
/// `ServerError::Netlink`).
#[derive(Debug, thiserror::Error)]
#[error("cannot {step} on the tun device")]
pub struct SetupError {
    /// What was being done.
    pub step: TunStep,
    /// Why it failed.
    #[source]
    pub source: NetlinkError,
}

/// A step of the tun device's set-up ([`SetupError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TunStep {
    /// Opening the netlink socket.
    #[error("open netlink")]
    Open,
    /// Setting the MTU.
    #[error("set MTU {0}")]
    SetMtu(u16),
    /// Setting the transmit queue length.
    #[error("set txqueuelen {0}")]
    SetTxqueuelen(u32),
    /// Adding the server's own address.
    #[error("add address {0}")]
    AddAddress(IpNet),
    /// Bringing the link up.
    #[error("set the link up")]
    LinkUp,
    /// Adding a `route` into the tunnel.
    #[error("add route {0}")]
    AddRoute(IpNet),
    /// Reading the default route (`OPENVPN_AUTO_MTU`).
    #[error("read the default route")]
    DefaultRoute,
}

/// Configures the device `dev`: MTU, txqueuelen, the server's own pool addresses, link up;
/// its routes are [`add_routes`].
pub(crate) async fn setup(
    settings: &Settings,
    dev: &str,
    pool: Option<&Pool>,
) -> Result<(), SetupError> {
    let fail = |step: TunStep| move |source| SetupError { step, source };
    let nl = Netlink::open().map_err(fail(TunStep::Open))?;
    nl.set_mtu(dev, u32::from(settings.tun_mtu))
        .await
        .map_err(fail(TunStep::SetMtu(settings.tun_mtu)))?;
    if let Some(len) = settings.txqueuelen {
        nl.set_txqueuelen(dev, len)
            .await
            .map_err(fail(TunStep::SetTxqueuelen(len)))?;
    }
    let own: Vec<IpNet> = pool
        .into_iter()
        .flat_map(|p| [p.server_v4().map(IpNet::V4), p.server_v6().map(IpNet::V6)])
        .flatten()
        .collect();
    for net in own {
        nl.add_address(dev, IpPrefix::from(net))
            .await
            .map_err(fail(TunStep::AddAddress(net)))?;
    }
    nl.set_link_up(dev).await.map_err(fail(TunStep::LinkUp))?;
    info!(dev, "tun device configured");
    Ok(())
}

/// The kernel routes of `route` directives into `dev`: the last step of its set-up, once
/// whatever must see the first packet routed into it is in force (`Server::bind_with`).
pub(crate) async fn add_routes(settings: &Settings, dev: &str) -> Result<(), SetupError> {
    let fail = |step: TunStep| move |source| SetupError { step, source };
    let nl = Netlink::open().map_err(fail(TunStep::Open))?;
    for net in &settings.routes {
        let route = Route::via_dev(IpPrefix::from(net.trunc()), dev);
        nl.add_route(&route)
            .await
            .map_err(fail(TunStep::AddRoute(*net)))?;
    }
    info!(
        dev,
        routes = settings.routes.len(),
        "routes into the tun device added"
    );
    Ok(())
}

/// vpn2's `OPENVPN_AUTO_MTU`: `tun_mtu` from the default route's link (less 130 bytes, at
/// least 1280), pushed to the clients as `tun-mtu`; unchanged without a default route.
pub(crate) async fn apply_auto_mtu(settings: &mut Settings) -> Result<(), SetupError> {
    let nl = Netlink::open().map_err(|source| SetupError {
        step: TunStep::Open,
        source,
    })?;
    let link = nl.default_route_mtu().await.map_err(|source| SetupError {
        step: TunStep::DefaultRoute,
        source,
    })?;
    if let Some(link) = link {
        settings.tun_mtu = protocol::config::env::vpn2_auto_mtu(link);
        settings
            .push
            .push(PushedOption::TunMtu(settings.tun_mtu).into());
    }
    info!(link_mtu = ?link, mtu = settings.tun_mtu, "OPENVPN_AUTO_MTU: tun MTU from the default route's link");
    Ok(())
}

/// The device reader: reads packets in batches (into slices of one pooled buffer, with the
/// headroom and tailroom the connections encrypt in) and hands each batch to the packet mode,
/// which queues each packet to its connection under one lock of the registry
/// ([`PacketMode::forward_from_device`](crate::shared::mode::PacketMode::forward_from_device)); an IP packet
/// no client routes is answered with ICMP unreachable.
pub(crate) async fn read_loop(shared: Arc<Shared>, tun: Arc<Tun>, shutdown: CancellationToken) {
    let mode = shared.mode;
    let layout = PacketLayout {
        headroom: SEND_HEADROOM,
        max_len: usize::from(shared.settings.tun_mtu) + mode.device_frame_extra(),
        tailroom: DATA_TAILROOM,
    };
    let mut pool = RecvPool::default();
    let mut batch: Vec<BytesMut> = Vec::with_capacity(TUN_READ_BATCH);
    let mut icmp = [0u8; unreachable::IPV6_ERROR_MAX];
    let mut limiter = unreachable::Limiter::new();
    let mut replies: Vec<Vec<u8>> = Vec::new();
    // When the oldest packet held for a reconnecting client has waited the bound.
    let mut next_expiry: Option<Instant> = None;
    loop {
        let expiry = next_expiry.map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = mode::sleep_until_some(expiry) => {
                next_expiry = mode::expire_held(&shared, Instant::now(), |_, _, payload| {
                    answer(&mut limiter, &mut icmp, &mut replies, payload);
                });
                send_replies(&shared, &tun, &mut replies).await;
                continue;
            }
            r = tun.recv_many(&mut pool, layout, &mut batch, TUN_READ_BATCH) => {
                if let Err(e) = r {
                    warn!(error = %e, "tun read failed");
                    tokio::time::sleep(READ_ERROR_PAUSE).await;
                    continue;
                }
            }
        }
        let lone = batch.len() == 1;
        mode.forward_from_device(&shared, &mut batch, |payload| {
            answer(&mut limiter, &mut icmp, &mut replies, payload);
        });
        if next_expiry.is_none() {
            next_expiry = lock(&shared.registry).next_hold_expiry();
        }
        send_replies(&shared, &tun, &mut replies).await;
        if lone {
            // Let the connection send it before the next read finds the device empty (that
            // read would otherwise run first, on the packet's way: see `Tun::recv_many`).
            tokio::task::yield_now().await;
        }
    }
}

/// Tells the sender of `payload` at once that its destination is unreachable instead of
/// letting its connect time out (rate-limited, so this path allocates only a bounded amount).
fn answer(
    limiter: &mut unreachable::Limiter,
    icmp: &mut [u8; unreachable::IPV6_ERROR_MAX],
    replies: &mut Vec<Vec<u8>>,
    payload: &[u8],
) {
    if limiter.allow(Instant::now()) {
        if let Some(n) = unreachable::reply(payload, icmp) {
            replies.push(icmp[..n].to_vec());
        }
    }
}

/// Writes the ICMP answers into the device.
async fn send_replies(shared: &Shared, tun: &Tun, replies: &mut Vec<Vec<u8>>) {
    for reply in replies.drain(..) {
        if tun.send(&reply).await.is_ok() {
            shared.metrics.unreachable_answered();
        }
    }
}
