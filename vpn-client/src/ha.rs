//! The HA verbs of the vpn-client image whose job our design does without (`docs/ha.md` §6):
//! Gardener still starts them, so they exist, succeed and say what they do now.
//!
//! - `vpn-client path-controller` (the kube-apiserver pod's `vpn-path-controller`): vpn2's
//!   pinged every shoot pod and rewrote the shoot routes; here each `vpn-client-<i>` owns its
//!   routes (metric `100 + i`, present only while its tunnel is up), so the kernel already
//!   takes the lowest server up. The verb checks `POD_IP` and the shoot networks as vpn2 does,
//!   then watches which device carries the shoot networks and logs every change.
//! - `vpn-client tunnel-controller` (the shoot pod's readiness): `GET :8080/readyz` is 200
//!   while at least one of the pod's tunnels is up, which is when its client has installed
//!   its HA routes (a route with metric 100 or more through a `tun` device), else 503. No
//!   UDP 5400 and no watchdog: the client that owns a tunnel ends it itself when the server
//!   goes silent (`ping-restart`).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use netio::admin::{AdminServer, AdminState, Exposition, Kind};
use netio::netlink::{Family, Netlink, NetlinkError, RouteEntry};
use tokio_util::sync::CancellationToken;

use crate::vpn2::{HA_MAX_SERVERS, HA_METRIC_BASE};

/// How often the verbs look at the routes (vpn2's path controller: every 2 s).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The port `tunnel-controller` serves `/readyz` on (vpn2: `:8080`), on every IPv4 and (where
/// the pod has IPv6) IPv6 address.
pub const TUNNEL_CONTROLLER_PORT: u16 = 8080;

/// Why a verb cannot run.
#[derive(Debug, thiserror::Error)]
pub enum HaVerbError {
    /// `POD_IP` is unset or not an address.
    #[error("POD_IP is not set to an IP address")]
    PodIp,
    /// Neither node nor service networks are given (vpn2: "network to check is undefined").
    #[error("network to check is undefined: set SHOOT_NODE_NETWORKS or SHOOT_SERVICE_NETWORKS")]
    NoNetwork,
    /// Netlink could not be opened or asked.
    #[error("netlink")]
    Netlink(#[from] NetlinkError),
    /// The readiness listener could not be bound.
    #[error(transparent)]
    Bind(#[from] netio::admin::AdminBindError),
}

/// The HA routes of this namespace: those through a `tun` device with an HA metric
/// (`100 + i` for server `i`). Only those: the kernel's own routes on a `tun` device (IPv6
/// `fe80::/64`, metric 256) stay while a client reconnects and say nothing about its tunnel.
fn ha_routes(routes: &[RouteEntry]) -> impl Iterator<Item = &RouteEntry> {
    routes.iter().filter(|r| {
        r.metric
            .is_some_and(|m| (HA_METRIC_BASE..HA_METRIC_BASE + HA_MAX_SERVERS).contains(&m))
            && r.dev.as_deref().is_some_and(|d| d.starts_with("tun"))
    })
}

async fn all_routes(nl: &Netlink) -> Result<Vec<RouteEntry>, NetlinkError> {
    let mut routes = nl.routes(Family::V4).await?;
    routes.extend(nl.routes(Family::V6).await?);
    Ok(routes)
}

/// The device carrying traffic to `net` now: the HA route to it with the lowest metric.
fn carrier(routes: &[RouteEntry], net: IpNet) -> Option<(String, u32)> {
    ha_routes(routes)
        .filter(|r| r.dst.addr() == net.network() && r.dst.prefix_len() == net.prefix_len())
        .filter_map(|r| Some((r.dev.clone()?, r.metric?)))
        .min_by_key(|(_, m)| *m)
}

/// `vpn-client path-controller`: checks `pod_ip` and the networks, then logs which device
/// carries `networks[0]` whenever that changes, until `shutdown`.
pub async fn path_controller(
    pod_ip: Option<&str>,
    networks: &[IpNet],
    shutdown: CancellationToken,
) -> Result<(), HaVerbError> {
    let pod_ip: IpAddr = pod_ip
        .and_then(|p| p.parse().ok())
        .ok_or(HaVerbError::PodIp)?;
    let Some(&watched) = networks.first() else {
        return Err(HaVerbError::NoNetwork);
    };
    let nl = Netlink::open()?;
    tracing::info!(
        %pod_ip,
        network = %watched,
        "path controller: each vpn-client-<i> installs its own routes (metric 100+i) while its \
         tunnel is up, so the kernel picks the lowest server up; this only reports the path"
    );
    let mut last: Option<Option<(String, u32)>> = None;
    loop {
        let now = match all_routes(&nl).await {
            Ok(routes) => carrier(&routes, watched),
            Err(e) => {
                tracing::warn!(error = %netio::report::chain(&e), "cannot read the routes");
                None
            }
        };
        if last.as_ref() != Some(&now) {
            match &now {
                Some((dev, metric)) => tracing::info!(
                    dev,
                    server = metric - HA_METRIC_BASE,
                    network = %watched,
                    "shoot networks carried by this tunnel"
                ),
                None => tracing::warn!(network = %watched, "no tunnel carries the shoot networks"),
            }
            last = Some(now);
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// The shoot pod's tunnels as `/readyz` and `/metrics` see them.
#[derive(Debug, Default)]
pub struct Tunnels {
    /// Devices with HA routes now.
    up: AtomicU32,
    /// Whether the routes were read at least once.
    known: AtomicBool,
}

impl AdminState for Tunnels {
    fn metrics(&self, out: &mut Exposition) {
        out.single(
            "vpn_shoot_tunnels_up",
            Kind::Gauge,
            "Tunnels of this pod that carry traffic now (their client installed its routes).",
            self.up.load(Ordering::Relaxed),
        );
    }

    fn ready(&self) -> bool {
        self.known.load(Ordering::Relaxed) && self.up.load(Ordering::Relaxed) > 0
    }
}

/// `vpn-client tunnel-controller`: `/readyz` on `port` (all addresses) while at least one
/// tunnel of the pod is up; runs until `shutdown`.
pub async fn tunnel_controller(port: u16, shutdown: CancellationToken) -> Result<(), HaVerbError> {
    let nl = Netlink::open()?;
    let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port));
    let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    // IPv6 too where the pod has it (as Go's `:8080`); an IPv4-only pod serves IPv4 alone.
    let (admin, listen) = match AdminServer::bind(&[v4, v6]) {
        Ok(admin) => (admin, vec![v4, v6]),
        Err(_) => (AdminServer::bind(&[v4])?, vec![v4]),
    };
    let state = Arc::new(Tunnels::default());
    tracing::info!(
        ?listen,
        "tunnel controller: /readyz is 200 while a tunnel of this pod is up; no UDP 5400 and no \
         watchdog (each client ends a silent tunnel itself)"
    );
    let part: Arc<dyn AdminState> = Arc::clone(&state) as _;
    let serve = tokio::spawn(admin.serve(vec![part], shutdown.clone()));
    let mut last = None;
    loop {
        match all_routes(&nl).await {
            Ok(routes) => {
                let mut devs: Vec<&str> = ha_routes(&routes)
                    .filter_map(|r| r.dev.as_deref())
                    .collect();
                devs.sort_unstable();
                devs.dedup();
                let up = u32::try_from(devs.len()).unwrap_or(u32::MAX);
                state.up.store(up, Ordering::Relaxed);
                state.known.store(true, Ordering::Relaxed);
                if last != Some(up) {
                    tracing::info!(tunnels_up = up, devices = ?devs, "tunnels of this pod");
                    last = Some(up);
                }
            }
            Err(e) => tracing::warn!(error = %netio::report::chain(&e), "cannot read the routes"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
    let _ = serve.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use netio::netlink::IpPrefix;

    fn route(dst: &str, dev: &str, metric: u32) -> RouteEntry {
        let (addr, len) = dst.split_once('/').expect("prefix");
        RouteEntry {
            dst: IpPrefix::new(addr.parse().expect("address"), len.parse().expect("length"))
                .expect("prefix"),
            oif: Some(7),
            dev: Some(dev.to_owned()),
            gateway: None,
            metric: Some(metric),
            source: None,
            table: 254,
        }
    }

    #[test]
    fn only_the_clients_routes_count_as_a_tunnel_up() {
        // A client reconnecting keeps its device: the kernel's link-local route stays.
        let reconnecting = [
            route("fe80::/64", "tun0", 256),
            route("fe80::/64", "tun1", 256),
            route("100.96.10.0/24", "eth0", 0),
        ];
        assert_eq!(ha_routes(&reconnecting).count(), 0);
        let up = [
            route("fe80::/64", "tun0", 256),
            route("241.0.0.0/8", "tun1", 101),
            route("10.1.0.0/16", "tun1", 101),
            route("10.2.0.0/16", "eth0", 100),
        ];
        let devs: Vec<_> = ha_routes(&up).filter_map(|r| r.dev.as_deref()).collect();
        assert_eq!(devs, ["tun1", "tun1"]);
        assert_eq!(
            carrier(&up, "10.1.0.0/16".parse().expect("net")),
            Some(("tun1".to_owned(), 101))
        );
        assert_eq!(
            carrier(&reconnecting, "fe80::/64".parse().expect("net")),
            None
        );
    }
}
