//! The client's side of the tunnel in the kernel: the tun device, its addresses and the pushed
//! routes, configured over netlink from the accepted pushed options.
//!
//! The device is opened on the first `Connected` and **kept across reconnects** (as upstream's
//! `persist-tun`): on every later `Connected` the addresses and routes are reconciled with the
//! new push (what is no longer pushed is removed, what is new is added, what is unchanged stays
//! untouched), so a reconnect that gets the same address does not disturb sockets bound to it.
//! While the client reconnects, packets routed into the device wait in its queue (and are
//! dropped by the kernel once it is full). [`Tunnel::teardown`] removes what we added and
//! closes the device when the client stops.
//!
//! A tap device (`dev tap`) carries Ethernet frames: the pushed `ifconfig` is an address and
//! netmask whatever the topology, and a route into it needs a next hop the kernel can resolve
//! with ARP / neighbour discovery: the route's own gateway, else the pushed `route-gateway`
//! (IPv4) or the server's `ifconfig-ipv6` address (IPv6); a route with none is not applied.
//!
//! What reaches [`Plan::from_push`] has passed the pull policy and the push guard
//! (`protocol::push::guard`): no route wider than the server named, none that contains an
//! address the connection dialed (the connection applies the `PathGuard` before the plan).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netio::netlink::{Family, FwmarkRule, IpPrefix, Netlink, NetlinkError, Route};
use netio::report::chain;
use netio::tun::{Tun, TunError, TunWriter};
use protocol::push::options::{RouteGatewayAddr, RouteVia, Topology};
use protocol::push::PushedOption;

use crate::settings::TunSettings;
use crate::vpn2::HA_STANDBY_METRIC_BASE;

/// What one push asks of the device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    /// Interface addresses.
    pub addresses: Vec<IpPrefix>,
    /// Routes into the device: destination and metric.
    pub routes: Vec<(IpPrefix, Option<u32>)>,
    /// A pushed `tun-mtu`.
    pub mtu: Option<u16>,
    /// Tap: the pushed `route-gateway`, next hop of IPv4 routes without their own.
    pub gateway_v4: Option<Ipv4Addr>,
    /// Tap: the server's `ifconfig-ipv6` address, next hop of IPv6 routes without their own.
    pub gateway_v6: Option<Ipv6Addr>,
    /// Tap: routes pushed with a literal gateway, by destination.
    pub route_gateways: Vec<(IpPrefix, IpAddr)>,
}

impl Plan {
    /// The device configuration the accepted options describe. Options that would route
    /// outside the tunnel (`redirect-gateway`, `redirect-private`, a route via `net_gateway`
    /// or `remote_host`) are never applied; each is logged.
    ///
    /// With `tap`, `ifconfig` is always an address and netmask, and the next hops of the
    /// routes are kept (module docs).
    pub fn from_push(accepted: &[PushedOption], tap: bool) -> Plan {
        let mut plan = Plan::default();
        // Upstream's default topology when the server pushes none; a tap device has none.
        let topology = if tap {
            Topology::Subnet
        } else {
            Topology::of_push(accepted)
        };
        let default_metric = accepted.iter().find_map(|o| match o {
            PushedOption::RouteMetric(m) => Some(*m),
            _ => None,
        });
        for option in accepted {
            match option {
                PushedOption::Ifconfig {
                    local,
                    remote_netmask,
                } => plan.ifconfig(topology, *local, *remote_netmask),
                PushedOption::IfconfigIpv6 { local, remote } => {
                    if tap {
                        plan.gateway_v6 = *remote;
                    }
                    match IpPrefix::new(IpAddr::V6(local.addr()), local.prefix_len()) {
                        Ok(p) => plan.addresses.push(p),
                        Err(e) => tracing::warn!(%local, error = %e, "ifconfig-ipv6 not applied"),
                    }
                }
                PushedOption::Route(route) => match route.gateway {
                    Some(RouteVia::NetGateway | RouteVia::RemoteHost) => tracing::warn!(
                        network = %route.net(),
                        "pushed route outside the tunnel not applied"
                    ),
                    // A literal gateway or vpn_gateway: on a tun device the route through the
                    // device is the same route.
                    _ => {
                        let net = route.net();
                        if let Ok(dst) = IpPrefix::new(IpAddr::V4(net.addr()), net.prefix_len()) {
                            plan.routes
                                .push((dst.network(), route.metric.or(default_metric)));
                            if let (true, Some(RouteVia::Addr(gw))) = (tap, route.gateway) {
                                plan.route_gateways.push((dst.network(), IpAddr::V4(gw)));
                            }
                        }
                    }
                },
                PushedOption::RouteIpv6(route) => {
                    let net = route.network;
                    if let Ok(dst) = IpPrefix::new(IpAddr::V6(net.addr()), net.prefix_len()) {
                        plan.routes.push((dst.network(), route.metric));
                    }
                }
                PushedOption::TunMtu(mtu) => plan.mtu = Some(*mtu),
                PushedOption::RouteGateway(RouteGatewayAddr::Addr(gw)) if tap => {
                    plan.gateway_v4 = Some(*gw)
                }
                PushedOption::RedirectGateway(_) | PushedOption::RedirectPrivate(_) => {
                    tracing::warn!(
                        ?option,
                        "pushed gateway redirection not applied (never done by this client)"
                    )
                }
                _ => {}
            }
        }
        plan
    }

    /// Tap: the next hop of a route to `dst` (module docs).
    fn next_hop(&self, dst: IpPrefix) -> Option<IpAddr> {
        if let Some((_, gw)) = self.route_gateways.iter().find(|(d, _)| *d == dst) {
            return Some(*gw);
        }
        match dst.addr() {
            IpAddr::V4(_) => self.gateway_v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.gateway_v6.map(IpAddr::V6),
        }
    }

    fn ifconfig(&mut self, topology: Topology, local: Ipv4Addr, remote_netmask: Ipv4Addr) {
        match topology {
            Topology::Subnet => {
                let mask = u32::from(remote_netmask);
                let len = mask.leading_ones();
                if mask.checked_shl(len).unwrap_or(0) != 0 {
                    tracing::warn!(%remote_netmask, "ifconfig with a non-contiguous netmask not applied");
                    return;
                }
                // `len` is at most 32, so the prefix is valid.
                if let Ok(p) = IpPrefix::new(IpAddr::V4(local), len as u8) {
                    self.addresses.push(p);
                }
            }
            // net30 / p2p: our address and a host route to the peer address (what a
            // point-to-point `local L peer R` address gives).
            Topology::Net30 | Topology::P2p => {
                self.addresses.push(IpPrefix::host(IpAddr::V4(local)));
                self.routes
                    .push((IpPrefix::host(IpAddr::V4(remote_netmask)), None));
            }
        }
    }
}

/// Decrypted packets queued for the tun writer thread before the receive direction waits.
pub const TUN_QUEUE: usize = 256;

/// HA: the first wait before routes the kernel refused are tried again.
const HA_RETRY_FIRST: Duration = Duration::from_secs(1);
/// HA: the longest wait between tries at refused routes.
const HA_RETRY_MAX: Duration = Duration::from_secs(30);

/// The tun device, its writer and what we configured on it.
#[derive(Debug)]
pub(crate) struct Tunnel {
    settings: TunSettings,
    netlink: Netlink,
    tun: Option<Arc<Tun>>,
    writer: Option<TunWriter>,
    mtu: u16,
    addresses: Vec<IpPrefix>,
    routes: Vec<Route>,
    /// HA: the routes of `settings.routes` while they are installed (and their copies in the
    /// return table).
    ha_routes: Vec<Route>,
    /// HA, shoot side: the return path's routing rules while installed.
    ha_rules: Vec<FwmarkRule>,
    /// HA: when the routes go in (the tunnel is up, hold-down running), or when those the
    /// kernel refused are tried again.
    ha_due: Option<Instant>,
    /// HA: the wait before the next try at refused routes (doubles up to [`HA_RETRY_MAX`]).
    ha_retry: Duration,
    /// HA: the source address they carry (IPv4 routes, or IPv6 routes on an IPv6 pod).
    ha_source: Option<IpAddr>,
    /// HA: a tunnel of this process was up before (so the next one waits out the hold-down).
    was_up: bool,
    /// HA: the end of the running hold-down, if one runs.
    ha_hold_until: Option<Instant>,
    /// HA, kube-apiserver side: the standby routes (`HaRoutes::standby_metric`), kept while
    /// the device lives.
    ha_standby: Vec<Route>,
}

impl Tunnel {
    /// No device yet; netlink in the calling thread's namespace.
    pub fn new(settings: TunSettings) -> Result<Tunnel, TunnelError> {
        let netlink = Netlink::open().map_err(TunnelError::Netlink)?;
        let mtu = settings.mtu;
        Ok(Tunnel {
            settings,
            netlink,
            tun: None,
            writer: None,
            mtu,
            addresses: Vec::new(),
            routes: Vec::new(),
            ha_routes: Vec::new(),
            ha_rules: Vec::new(),
            ha_due: None,
            ha_retry: HA_RETRY_FIRST,
            ha_source: None,
            was_up: false,
            ha_hold_until: None,
            ha_standby: Vec::new(),
        })
    }

    /// HA: when the routes are due to go in, if they are waiting.
    pub fn ha_due(&self) -> Option<Instant> {
        self.ha_due
    }

    /// HA: the tunnel is up (over a connection from `local`): its routes go in now, or, if
    /// an earlier tunnel of this process went down and another tunnel carries the traffic
    /// meanwhile, after the hold-down ([`Tunnel::ha_install`] decides).
    pub fn ha_up(&mut self, local: Option<IpAddr>) {
        let Some(ha) = &self.settings.ha else {
            return;
        };
        self.ha_source = local.filter(|_| ha.source_from_socket);
        let now = Instant::now();
        self.ha_hold_until = (self.was_up && !ha.hold_down.is_zero()).then(|| now + ha.hold_down);
        self.was_up = true;
        self.ha_due = Some(now);
    }

    /// HA, shoot side: the return path by connection mark goes in as soon as the tunnel is up,
    /// before anything the server sent through it reaches the device and whatever the
    /// hold-down decides for the routes of the main table. A server sends what it held for its
    /// shoot connections right behind the push, and the answers to those packets must not
    /// follow the main table (another tunnel, or the pod's default route) until
    /// [`Tunnel::ha_install`] runs. What the kernel refuses is tried again there.
    pub async fn ha_return_path(&mut self) {
        let (Some(mark), Some(tun)) = (
            self.settings.ha.as_ref().and_then(|ha| ha.return_by_mark),
            &self.tun,
        ) else {
            return;
        };
        let dev = tun.name().to_owned();
        let _ = self.ha_install_return_path(&dev, mark).await;
    }

    /// HA: whether the hold-down keeps the routes out now: it runs, and another tunnel
    /// carries the traffic meanwhile (with none, nothing is gained by waiting: the traffic
    /// waits in a standby device or is dropped). Reschedules the install for its end.
    async fn ha_held_down(&mut self, dev: &str) -> bool {
        let Some(until) = self.ha_hold_until else {
            return false;
        };
        if Instant::now() >= until {
            self.ha_hold_until = None;
            return false;
        }
        if self.other_tunnel_carries(dev).await {
            tracing::info!(
                hold_down_s = until
                    .saturating_duration_since(Instant::now())
                    .as_secs_f32(),
                "tunnel back up: its routes return after the hold-down"
            );
            self.ha_due = Some(until);
            return true;
        }
        tracing::info!("tunnel back up and no other tunnel carries the traffic: routes in now");
        self.ha_hold_until = None;
        false
    }

    /// Whether a `tun` device other than `dev` has an active HA route (a metric below the
    /// standby ones) to one of our networks.
    async fn other_tunnel_carries(&self, dev: &str) -> bool {
        let mut routes = Vec::new();
        for family in [Family::V4, Family::V6] {
            match self.netlink.routes(family).await {
                Ok(found) => routes.extend(found),
                // Unknown: keep the hold-down, as without this check.
                Err(_) => return true,
            }
        }
        routes.iter().any(|r| {
            r.dev
                .as_deref()
                .is_some_and(|d| d != dev && d.starts_with("tun"))
                && r.metric.is_some_and(|m| m < HA_STANDBY_METRIC_BASE)
                && self
                    .settings
                    .routes
                    .iter()
                    .any(|n| IpPrefix::from(n.trunc()) == r.dst)
        })
    }

    /// HA: installs the routes that are due (the tunnel stayed up through the hold-down).
    /// Whatever the kernel refuses (a device not ready for IPv6 yet, say) is tried again,
    /// after 1 s, then twice as long each time up to [`HA_RETRY_MAX`], while the tunnel
    /// stays up: a tunnel never carries traffic with part of its routes missing for good.
    pub async fn ha_install(&mut self) {
        let (Some(ha), Some(tun)) = (self.settings.ha.clone(), &self.tun) else {
            return;
        };
        self.ha_due = None;
        let dev = tun.name().to_owned();
        // The return path is the tunnel's own while it is up, hold-down or not: the answers to
        // what a server sends in through it (what it held for the shoot comes at once) go back
        // through it, also while the other tunnel still puts its routes in.
        let mut refused = match ha.return_by_mark {
            Some(mark) => self.ha_install_return_path(&dev, mark).await,
            None => 0,
        };
        if self.ha_held_down(&dev).await {
            return;
        }
        // The IPv6 routes' source on an IPv4 pod: its transfer-network address.
        let source_v6 = match (self.ha_source, ha.transfer_v6) {
            (Some(IpAddr::V4(pod)), Some(net)) => {
                Some(protocol::config::env::ha_transfer_address(net, pod))
            }
            _ => None,
        };
        if let Some(v6) = source_v6 {
            // The IPv6 routes' source must be a usable address of this host: on the device,
            // without duplicate address detection (a tentative address is no route source).
            match self
                .netlink
                .add_address_nodad(&dev, IpPrefix::host(IpAddr::V6(v6)))
                .await
            {
                Ok(()) => {}
                Err(e) if e.already_exists() => {}
                Err(e) => tracing::warn!(%v6, error = %chain(&e), "transfer address not added"),
            }
        }
        let wanted: Vec<Route> = self
            .settings
            .routes
            .iter()
            .map(|net| {
                let source = match (net, self.ha_source) {
                    (IpNet::V6(_), Some(IpAddr::V4(_))) => source_v6.map(IpAddr::V6),
                    (IpNet::V4(_), Some(IpAddr::V6(_))) => None,
                    (_, source) => source,
                };
                Route {
                    metric: Some(ha.metric),
                    source,
                    ..Route::via_dev(IpPrefix::from(net.trunc()), dev.clone())
                }
            })
            .collect();
        if let Some(standby) = ha.standby_metric {
            self.ha_add_standby(&wanted, standby).await;
        }
        refused += self.ha_add_routes(wanted).await;
        if refused == 0 {
            self.ha_retry = HA_RETRY_FIRST;
            tracing::info!(
                dev,
                metric = ha.metric,
                source = ?self.ha_source,
                routes = self.ha_routes.len(),
                "HA routes installed: this tunnel carries traffic"
            );
        } else {
            tracing::warn!(
                dev,
                metric = ha.metric,
                source = ?self.ha_source,
                installed = self.ha_routes.len(),
                refused,
                retry_s = self.ha_retry.as_secs(),
                "HA routes incomplete: trying the refused ones again"
            );
            self.ha_due = Some(Instant::now() + self.ha_retry);
            self.ha_retry = (self.ha_retry * 2).min(HA_RETRY_MAX);
        }
    }

    /// HA, kube-apiserver side: copies of `active` with metric `standby`, which stay while the
    /// device lives. One the kernel refuses is logged and tried again at the next install.
    async fn ha_add_standby(&mut self, active: &[Route], standby: u32) {
        for route in active {
            let route = Route {
                metric: Some(standby),
                ..route.clone()
            };
            if self.ha_standby.contains(&route) {
                continue;
            }
            match self.netlink.add_route(&route).await {
                Ok(()) => {}
                Err(e) if e.already_exists() => {}
                Err(e) => {
                    tracing::warn!(dst = %route.dst, error = %chain(&e), "standby route not added");
                    continue;
                }
            }
            self.ha_standby.push(route);
        }
    }

    /// HA: adds those of `routes` not in already; returns how many the kernel refused.
    async fn ha_add_routes(&mut self, routes: Vec<Route>) -> usize {
        let mut refused = 0;
        for route in routes {
            if self.ha_routes.contains(&route) {
                continue;
            }
            match self.netlink.add_route(&route).await {
                Ok(()) => {}
                Err(e) if e.already_exists() => {}
                Err(e) => {
                    let table = route.table.map_or("main".to_owned(), |t| t.to_string());
                    tracing::warn!(dst = %route.dst, table, error = %chain(&e), "HA route not added");
                    refused += 1;
                    continue;
                }
            }
            self.ha_routes.push(route);
        }
        refused
    }

    /// HA, shoot side: the return path by connection mark ([`HaRoutes::return_by_mark`]):
    /// `routes` through the device in table `mark`, and the rule sending marked packets there.
    /// Returns how many of them the kernel refused.
    async fn ha_install_return_path(&mut self, dev: &str, mark: u32) -> usize {
        let wanted: Vec<Route> = self
            .settings
            .routes
            .iter()
            .map(|net| Route {
                table: Some(mark),
                ..Route::via_dev(IpPrefix::from(net.trunc()), dev.to_owned())
            })
            .collect();
        let mut refused = self.ha_add_routes(wanted).await;
        for family in [Family::V4, Family::V6] {
            let rule = FwmarkRule {
                family,
                fwmark: mark,
                table: mark,
                priority: mark,
            };
            if self.ha_rules.contains(&rule) {
                continue;
            }
            match self.netlink.add_rule(&rule).await {
                Ok(()) => self.ha_rules.push(rule),
                Err(e) if e.already_exists() => self.ha_rules.push(rule),
                Err(e) => {
                    refused += 1;
                    tracing::warn!(?family, mark, error = %chain(&e), "return rule not added")
                }
            }
        }
        refused
    }

    /// HA: the connection ended: the routes go at once (the other server's device, with a
    /// higher metric, takes the traffic), and a pending install is cancelled.
    pub async fn ha_withdraw(&mut self) {
        self.ha_due = None;
        self.ha_hold_until = None;
        self.ha_retry = HA_RETRY_FIRST;
        if self.ha_routes.is_empty() && self.ha_rules.is_empty() {
            return;
        }
        for rule in std::mem::take(&mut self.ha_rules) {
            if let Err(e) = self.netlink.del_rule(&rule).await {
                tracing::warn!(mark = rule.fwmark, error = %chain(&e), "return rule not removed");
            }
        }
        for route in std::mem::take(&mut self.ha_routes) {
            if let Err(e) = self.netlink.del_route(&route).await {
                tracing::warn!(dst = %route.dst, error = %chain(&e), "HA route not removed");
            }
        }
        tracing::info!("HA routes withdrawn: the tunnel is down");
    }

    /// The open device, if any.
    pub fn tun(&self) -> Option<&Tun> {
        self.tun.as_deref()
    }

    /// Where decrypted packets go into the open device, if any.
    pub fn writer(&self) -> Option<&TunWriter> {
        self.writer.as_ref()
    }

    /// The device MTU in force.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Whether the device is a tap device (Ethernet frames).
    pub fn is_tap(&self) -> bool {
        self.settings.tap
    }

    /// Opens the device if needed and brings it to `plan`. A failed address is an error (the
    /// tunnel cannot work without it); a failed route is logged and skipped, as upstream does.
    pub async fn apply(&mut self, plan: &Plan) -> Result<(), TunnelError> {
        if self.tun.is_none() {
            let tun = if self.settings.tap {
                Tun::open_tap(&self.settings.name)
            } else {
                Tun::open(&self.settings.name)
            };
            let tun = Arc::new(tun.map_err(TunnelError::Open)?);
            tracing::info!(
                dev = tun.name(),
                tap = self.settings.tap,
                "tun device opened"
            );
            self.writer =
                Some(TunWriter::spawn(Arc::clone(&tun), TUN_QUEUE).map_err(TunnelError::Writer)?);
            self.tun = Some(tun);
        }
        let dev = self
            .tun
            .as_ref()
            .map(|t| t.name().to_owned())
            .unwrap_or_default();
        let nl = &self.netlink;
        self.mtu = plan.mtu.unwrap_or(self.settings.mtu);
        nl.set_mtu(&dev, u32::from(self.mtu))
            .await
            .map_err(TunnelError::Netlink)?;
        if let Some(len) = self.settings.txqueuelen {
            nl.set_txqueuelen(&dev, len)
                .await
                .map_err(TunnelError::Netlink)?;
        }
        nl.set_link_up(&dev).await.map_err(TunnelError::Netlink)?;

        let tap = self.settings.tap;
        let mut wanted_routes: Vec<Route> = plan
            .routes
            .iter()
            .map(|(dst, metric)| Route {
                metric: *metric,
                gateway: plan.next_hop(*dst).filter(|_| tap),
                ..Route::via_dev(*dst, dev.clone())
            })
            .collect();
        // HA: these routes come and go with the tunnel (`ha_install`, `ha_withdraw`).
        let extra = if self.settings.ha.is_some() {
            &[][..]
        } else {
            &self.settings.routes[..]
        };
        for net in extra {
            let dst = IpPrefix::from(net.trunc());
            let route = Route {
                gateway: plan.next_hop(dst).filter(|_| tap),
                ..Route::via_dev(dst, dev.clone())
            };
            if !wanted_routes.iter().any(|r| r.dst == route.dst) {
                wanted_routes.push(route);
            }
        }
        if tap {
            // On a tap device a route without a next hop would ask the whole destination
            // network for its addresses: not applied.
            wanted_routes.retain(|r| {
                if r.gateway.is_none() {
                    tracing::warn!(dst = %r.dst, "route on a tap device without a gateway (no route-gateway pushed) not applied");
                }
                r.gateway.is_some()
            });
        }
        // Remove what the new push no longer asks for.
        for route in std::mem::take(&mut self.routes) {
            if wanted_routes.contains(&route) {
                self.routes.push(route);
            } else if let Err(e) = nl.del_route(&route).await {
                tracing::warn!(dst = %route.dst, error = %chain(&e), "cannot remove old route");
            } else {
                tracing::info!(dst = %route.dst, "old route removed");
            }
        }
        for addr in std::mem::take(&mut self.addresses) {
            if plan.addresses.contains(&addr) {
                self.addresses.push(addr);
            } else if let Err(e) = nl.del_address(&dev, addr).await {
                tracing::warn!(%addr, error = %chain(&e), "cannot remove old address");
            } else {
                tracing::info!(%addr, "old address removed");
            }
        }
        // Add what is new.
        for addr in &plan.addresses {
            if self.addresses.contains(addr) {
                continue;
            }
            match nl.add_address(&dev, *addr).await {
                Ok(()) => self.addresses.push(*addr),
                Err(e) if e.already_exists() => self.addresses.push(*addr),
                Err(source) => {
                    return Err(TunnelError::Address {
                        addr: *addr,
                        source,
                    })
                }
            }
        }
        tracing::info!(
            dev,
            mtu = self.mtu,
            addresses = ?self.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "tun configured"
        );
        for route in wanted_routes {
            if self.routes.contains(&route) {
                continue;
            }
            match nl.add_route(&route).await {
                Ok(()) => {
                    tracing::info!(dst = %route.dst, dev, metric = ?route.metric, "route added");
                    self.routes.push(route);
                }
                Err(e) if e.already_exists() => {
                    tracing::info!(dst = %route.dst, "route already present (kept as is)")
                }
                Err(e) => {
                    tracing::warn!(dst = %route.dst, error = %chain(&e), "route not added")
                }
            }
        }
        Ok(())
    }

    /// Removes our routes and addresses and closes the device (once the writer thread has
    /// written what it holds).
    pub async fn teardown(&mut self) {
        self.ha_withdraw().await;
        self.writer = None;
        let Some(tun) = self.tun.take() else {
            return;
        };
        for route in std::mem::take(&mut self.routes) {
            if let Err(e) = self.netlink.del_route(&route).await {
                tracing::debug!(dst = %route.dst, error = %chain(&e), "route removal failed");
            }
        }
        for addr in std::mem::take(&mut self.addresses) {
            if let Err(e) = self.netlink.del_address(tun.name(), addr).await {
                tracing::debug!(%addr, error = %chain(&e), "address removal failed");
            }
        }
        tracing::info!(dev = tun.name(), "tun device closed");
    }
}

/// vpn2's `OPENVPN_AUTO_MTU`: the MTU of the default route's link less 130 bytes, at least
/// 1280; `configured` when there is no default route.
pub async fn auto_mtu(configured: u16) -> Result<u16, TunnelError> {
    let nl = Netlink::open().map_err(TunnelError::Netlink)?;
    let link = nl.default_route_mtu().await.map_err(TunnelError::Netlink)?;
    let mtu = link.map_or(configured, protocol::config::env::vpn2_auto_mtu);
    tracing::info!(link_mtu = ?link, mtu, "OPENVPN_AUTO_MTU: tun MTU from the default route's link");
    Ok(mtu)
}

/// The device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The tun device could not be opened.
    #[error("cannot open the tun device")]
    Open(#[source] TunError),
    /// The tun writer thread could not be started.
    #[error("cannot start the tun writer thread")]
    Writer(#[source] std::io::Error),
    /// A netlink request failed.
    #[error("netlink request failed")]
    Netlink(#[source] NetlinkError),
    /// The pushed address could not be set.
    #[error("cannot add address {addr}")]
    Address {
        /// The address.
        addr: IpPrefix,
        /// Why.
        #[source]
        source: NetlinkError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::push::PullPolicy;

    fn plan(options: &str) -> Plan {
        let outcome = PullPolicy::default().process(options).unwrap().outcome;
        Plan::from_push(&outcome.accepted, false)
    }

    #[test]
    fn subnet_topology_gives_one_prefix_and_routes_through_the_device() {
        let p = plan(
            "route 10.99.0.0 255.255.0.0,route-ipv6 fd00:99::/64,topology subnet,\
             ifconfig 192.168.123.2 255.255.255.0,ifconfig-ipv6 fd00:123::1000/96 fd00:123::1,\
             route-gateway 192.168.123.1,redirect-gateway def1,route 10.1.2.0 255.255.255.0 net_gateway",
        );
        assert_eq!(
            p.addresses,
            vec![
                "192.168.123.2/24".parse().unwrap(),
                "fd00:123::1000/96".parse().unwrap()
            ]
        );
        assert_eq!(
            p.routes,
            vec![
                ("10.99.0.0/16".parse().unwrap(), None),
                ("fd00:99::/64".parse().unwrap(), None)
            ]
        );
        assert_eq!(p.mtu, None);
    }

    #[test]
    fn net30_topology_adds_a_host_route_to_the_peer_and_route_metric_applies() {
        let p = plan(
            "ifconfig 10.8.0.6 10.8.0.5,route-metric 7,route 10.99.0.0 255.255.0.0,tun-mtu 1400",
        );
        assert_eq!(p.addresses, vec!["10.8.0.6/32".parse().unwrap()]);
        assert_eq!(
            p.routes,
            vec![
                ("10.8.0.5/32".parse().unwrap(), None),
                ("10.99.0.0/16".parse().unwrap(), Some(7))
            ]
        );
        assert_eq!(p.mtu, Some(1400));
    }

    #[test]
    fn tap_takes_ifconfig_as_a_netmask_and_routes_via_the_gateways() {
        let options = "route 10.99.0.0 255.255.0.0,route 10.98.0.0 255.255.0.0 192.168.123.9,\
             route-ipv6 fd00:99::/64,ifconfig 192.168.123.2 255.255.255.0,\
             ifconfig-ipv6 fd00:123::1000/96 fd00:123::1,route-gateway 192.168.123.1";
        let outcome = PullPolicy::default().process(options).unwrap().outcome;
        let p = Plan::from_push(&outcome.accepted, true);
        assert_eq!(
            p.addresses,
            vec![
                "192.168.123.2/24".parse().unwrap(),
                "fd00:123::1000/96".parse().unwrap()
            ]
        );
        let hop = |dst: &str| p.next_hop(dst.parse().unwrap()).map(|a| a.to_string());
        assert_eq!(hop("10.99.0.0/16").as_deref(), Some("192.168.123.1"));
        assert_eq!(hop("10.98.0.0/16").as_deref(), Some("192.168.123.9"));
        assert_eq!(hop("fd00:99::/64").as_deref(), Some("fd00:123::1"));
        // Without a topology push a tun client reads `ifconfig A B` as net30; tap never does.
        let outcome = PullPolicy::default()
            .process("ifconfig 10.8.0.6 255.255.255.0")
            .unwrap()
            .outcome;
        let p = Plan::from_push(&outcome.accepted, true);
        assert_eq!(p.addresses, vec!["10.8.0.6/24".parse().unwrap()]);
        assert!(p.routes.is_empty());
        assert_eq!(p.next_hop("10.99.0.0/16".parse().unwrap()), None);
    }
}
