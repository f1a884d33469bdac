//! Per-shoot and per-flow counters: what the router did for each configured shoot, so an
//! operator can tell one shoot's refusals and traffic from another's on a shared ingress.
//!
//! A shoot is the namespace a routing value names (`shoot--p--a` in
//! `outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local` and in
//! `shoot--p--a--kube-apiserver-socket`); with `--config-dir` it is also the stem of the
//! shoot's file. An `[[sni_route]]` counts for the shoot it names (`shoot = "..."`) or, in a
//! shoot's file, for that file's shoot; one of no shoot counts router-wide only. A flow is
//! what the connection carries ([`Flow`]).
//!
//! Cardinality is bounded by the configuration: a shoot has series only while it has a route
//! in the policy in force, or while a tunnel it opened is still open (a shoot removed from
//! the configuration keeps its series until its last tunnel closes, so its active gauge can
//! go back to 0; then they are dropped, and a shoot configured again starts from 0, which
//! Prometheus reads as a counter reset). Requests naming a namespace without any route are
//! counted in the router-wide series only, so a client cannot create series.
//!
//! The series, their labels and meaning: `docs/metrics.md`, section "Ingress router", the one
//! catalogue (`conformance/tests/metrics_catalogue.rs` checks it against what this renders).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use netio::admin::{Exposition, Kind};
use protocol::http::connect::ConnectHead;
use protocol::http::route::{RouteValue, Service};

use crate::policy::Policy;

/// What a tunnel carries, by its routing value and header (the `flow` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// A shoot's VPN client to its `vpn-seed-server` (`X-Gardener-Destination` or
    /// `X-Gardener-API-Route`).
    Vpn = 0,
    /// GEP-30's apiserver-proxy (or any CONNECT client) to the shoot's `kube-apiserver`.
    ApiserverProxy = 1,
    /// The same to `<id>--kube-apiserver-socket` (Istio's TLS termination shape).
    KubeApiserverSocket = 2,
    /// Any value under the legacy `Reversed-VPN` header (the 8132 port).
    Legacy = 3,
    /// TLS passed through by an `[[sni_route]]` of the shoot (`kind = "sni"` listeners).
    Sni = 4,
}

impl Flow {
    /// Every flow, in index order.
    pub const ALL: [Flow; 5] = [
        Flow::Vpn,
        Flow::ApiserverProxy,
        Flow::KubeApiserverSocket,
        Flow::Legacy,
        Flow::Sni,
    ];

    /// The `flow` label.
    pub fn label(self) -> &'static str {
        match self {
            Flow::Vpn => "vpn",
            Flow::ApiserverProxy => "apiserver-proxy",
            Flow::KubeApiserverSocket => "kube-apiserver-socket",
            Flow::Legacy => "legacy",
            Flow::Sni => "sni",
        }
    }

    /// The flow of a request for `route` with `head` (whose one routing header decided it).
    pub fn of(route: &RouteValue, head: &ConnectHead) -> Flow {
        if head.headers.iter().any(|h| h.is("Reversed-VPN")) {
            return Flow::Legacy;
        }
        Flow::of_route(route)
    }

    /// The flow a route serves on the current headers.
    fn of_route(route: &RouteValue) -> Flow {
        match route.service() {
            Service::VpnSeedServer { .. } => Flow::Vpn,
            Service::KubeApiserver => Flow::ApiserverProxy,
            Service::KubeApiserverSocket => Flow::KubeApiserverSocket,
        }
    }
}

/// Why a request for a configured shoot was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShootRefusal {
    /// The route's rules denied the client (403).
    Denied = 0,
    /// A valid value in the shoot's namespace without a route (400).
    NoRoute = 1,
    /// The upstream refused or could not be reached (503).
    ConnectFailed = 2,
    /// The upstream did not answer within the connect timeout (504).
    ConnectTimeout = 3,
}

impl ShootRefusal {
    /// Every reason, in index order.
    pub const ALL: [ShootRefusal; 4] = [
        ShootRefusal::Denied,
        ShootRefusal::NoRoute,
        ShootRefusal::ConnectFailed,
        ShootRefusal::ConnectTimeout,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            ShootRefusal::Denied => "denied",
            ShootRefusal::NoRoute => "no_route",
            ShootRefusal::ConnectFailed => "connect_failed",
            ShootRefusal::ConnectTimeout => "connect_timeout",
        }
    }
}

/// One flow's counters of one shoot.
#[derive(Debug, Default)]
struct FlowCounters {
    /// Written to `/metrics` (a route of this flow, or an event seen).
    shown: AtomicBool,
    tunnels: AtomicU64,
    active: AtomicU64,
    to_upstream: AtomicU64,
    to_client: AtomicU64,
    refused: [AtomicU64; ShootRefusal::ALL.len()],
}

/// One shoot's counters, by flow. Tunnels hold it while they run, so they count into it
/// even after the shoot left the configuration.
#[derive(Debug, Default)]
pub struct ShootCounters {
    flows: [FlowCounters; Flow::ALL.len()],
}

impl ShootCounters {
    fn flow(&self, flow: Flow) -> &FlowCounters {
        let f = &self.flows[flow as usize];
        f.shown.store(true, Ordering::Relaxed);
        f
    }

    /// A request of `flow` was refused for `why`.
    pub fn refused(&self, flow: Flow, why: ShootRefusal) {
        self.flow(flow).refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A tunnel of `flow` opened; it counts as active until the guard drops, which also
    /// counts its bytes ([`ShootTunnel::relayed`]).
    pub fn tunnel_opened(self: &Arc<Self>, flow: Flow) -> ShootTunnel {
        let f = self.flow(flow);
        f.tunnels.fetch_add(1, Ordering::Relaxed);
        f.active.fetch_add(1, Ordering::Relaxed);
        ShootTunnel {
            shoot: Arc::clone(self),
            flow,
        }
    }

    fn active(&self) -> u64 {
        self.flows
            .iter()
            .map(|f| f.active.load(Ordering::Relaxed))
            .sum()
    }
}

/// An open tunnel in its shoot's `vpn_router_shoot_tunnels_active`.
#[derive(Debug)]
pub struct ShootTunnel {
    shoot: Arc<ShootCounters>,
    flow: Flow,
}

impl ShootTunnel {
    /// The tunnel relayed these bytes (counted when it ends).
    pub fn relayed(&self, to_upstream: u64, to_client: u64) {
        let f = self.shoot.flow(self.flow);
        f.to_upstream.fetch_add(to_upstream, Ordering::Relaxed);
        f.to_client.fetch_add(to_client, Ordering::Relaxed);
    }
}

impl Drop for ShootTunnel {
    fn drop(&mut self) {
        self.shoot.flows[self.flow as usize]
            .active
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shoots with series: configured ones and those with tunnels still open.
#[derive(Debug, Default)]
pub struct Shoots {
    inner: Mutex<BTreeMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    counters: Arc<ShootCounters>,
    /// The shoot has a route in the policy in force.
    configured: bool,
}

impl Shoots {
    /// The policy in force is now `policy`: its routes' shoots get series (the flows of their
    /// routes shown from the start, `legacy` beside `vpn`); shoots no longer in it lose theirs
    /// once their last tunnel has closed.
    pub fn configure(&self, policy: &Policy) {
        let mut flows: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
        for route in policy.routes.keys() {
            let set = flows.entry(route.namespace()).or_default();
            let flow = Flow::of_route(route);
            set.insert(flow as usize);
            if flow == Flow::Vpn {
                set.insert(Flow::Legacy as usize);
            }
        }
        for shoot in policy
            .sni_routes
            .values()
            .filter_map(|t| t.shoot.as_deref())
        {
            flows.entry(shoot).or_default().insert(Flow::Sni as usize);
        }
        let mut map = self.lock();
        for entry in map.values_mut() {
            entry.configured = false;
        }
        for (shoot, flows) in flows {
            let entry = map.entry(shoot.to_owned()).or_insert_with(|| Entry {
                counters: Arc::default(),
                configured: true,
            });
            entry.configured = true;
            for i in flows {
                entry.counters.flows[i].shown.store(true, Ordering::Relaxed);
            }
        }
        map.retain(|_, e| e.configured || e.counters.active() > 0);
    }

    /// The counters of `shoot`, if it has series (configured, or tunnels still open).
    pub fn get(&self, shoot: &str) -> Option<Arc<ShootCounters>> {
        self.lock().get(shoot).map(|e| Arc::clone(&e.counters))
    }

    /// Shoots with a route in the policy in force.
    pub fn configured(&self) -> usize {
        self.lock().values().filter(|e| e.configured).count()
    }

    /// Writes the `vpn_router_shoot*` series (and drops shoots that left the configuration
    /// and have no tunnel open any more).
    pub fn metrics(&self, out: &mut Exposition) {
        let mut map = self.lock();
        map.retain(|_, e| e.configured || e.counters.active() > 0);
        out.single(
            "vpn_router_shoots",
            Kind::Gauge,
            "Shoots with a route in the policy in force.",
            map.values().filter(|e| e.configured).count(),
        );
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let shown = || {
            map.iter().flat_map(|(shoot, e)| {
                Flow::ALL
                    .iter()
                    .map(move |&flow| (shoot.as_str(), flow, &e.counters.flows[flow as usize]))
                    .filter(|(_, _, f)| f.shown.load(Ordering::Relaxed))
            })
        };
        let name = "vpn_router_shoot_tunnels_total";
        out.family(name, Kind::Counter, "Tunnels opened, by shoot and flow.");
        for (shoot, flow, f) in shown() {
            let labels = [("shoot", shoot), ("flow", flow.label())];
            out.sample(name, &labels, get(&f.tunnels));
        }
        let name = "vpn_router_shoot_tunnels_active";
        out.family(name, Kind::Gauge, "Tunnels open now, by shoot and flow.");
        for (shoot, flow, f) in shown() {
            let labels = [("shoot", shoot), ("flow", flow.label())];
            out.sample(name, &labels, get(&f.active));
        }
        let name = "vpn_router_shoot_tunnel_bytes_total";
        out.family(
            name,
            Kind::Counter,
            "Bytes relayed by ended tunnels, by shoot, flow and direction.",
        );
        for (shoot, flow, f) in shown() {
            for (direction, n) in [("to_upstream", &f.to_upstream), ("to_client", &f.to_client)] {
                let labels = [
                    ("shoot", shoot),
                    ("flow", flow.label()),
                    ("direction", direction),
                ];
                out.sample(name, &labels, get(n));
            }
        }
        let name = "vpn_router_shoot_refused_total";
        out.family(
            name,
            Kind::Counter,
            "Requests refused, by shoot, flow and reason.",
        );
        for (shoot, flow, f) in shown() {
            for why in ShootRefusal::ALL {
                let labels = [
                    ("shoot", shoot),
                    ("flow", flow.label()),
                    ("reason", why.label()),
                ];
                out.sample(name, &labels, get(&f.refused[why as usize]));
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Target;
    use protocol::http::connect::parse_connect_request;

    fn policy(values: &[&str]) -> Policy {
        let mut p = Policy::default();
        for v in values {
            p.routes.insert(
                RouteValue::parse(v).unwrap(),
                Target {
                    upstream: "x:1".into(),
                    rules: vec![],
                    shoot: None,
                },
            );
        }
        p
    }

    const A: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";
    const AB: &str = "outbound|443||kube-apiserver.shoot--p--ab.svc.cluster.local";

    #[test]
    fn flows_by_header_and_service() {
        let head = |h: &str| {
            let raw = format!("CONNECT a:1 HTTP/1.1\r\nHost: a\r\n{h}\r\n\r\n");
            parse_connect_request(raw.as_bytes()).unwrap().unwrap().0
        };
        let a = RouteValue::parse(A).unwrap();
        let ab = RouteValue::parse(AB).unwrap();
        let socket = RouteValue::parse("shoot--p--a--kube-apiserver-socket").unwrap();
        let dest = head(&format!("X-Gardener-Destination: {A}"));
        assert_eq!(Flow::of(&a, &dest), Flow::Vpn);
        assert_eq!(Flow::of(&ab, &dest), Flow::ApiserverProxy);
        assert_eq!(Flow::of(&socket, &dest), Flow::KubeApiserverSocket);
        assert_eq!(
            Flow::of(&a, &head(&format!("reversed-vpn: {A}"))),
            Flow::Legacy
        );
    }

    #[test]
    fn series_follow_the_configuration_and_open_tunnels() {
        let shoots = Shoots::default();
        shoots.configure(&policy(&[A, AB]));
        let text = |s: &Shoots| {
            let mut out = Exposition::new();
            s.metrics(&mut out);
            out.into_string()
        };
        let t = text(&shoots);
        assert!(t.contains("vpn_router_shoots 2\n"), "{t}");
        for line in [
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--a\",flow=\"vpn\"} 0\n",
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--a\",flow=\"legacy\"} 0\n",
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--ab\",flow=\"apiserver-proxy\"} 0\n",
        ] {
            assert!(t.contains(line), "{line}: {t}");
        }
        assert!(!t.contains("shoot=\"shoot--p--ab\",flow=\"vpn\""), "{t}");

        let a = shoots.get("shoot--p--a").unwrap();
        a.refused(Flow::Vpn, ShootRefusal::Denied);
        let tunnel = a.tunnel_opened(Flow::Vpn);
        tunnel.relayed(10, 20);
        // Removed from the configuration: kept while the tunnel is open.
        shoots.configure(&policy(&[AB]));
        let t = text(&shoots);
        assert!(t.contains("vpn_router_shoots 1\n"), "{t}");
        for line in [
            "vpn_router_shoot_tunnels_active{shoot=\"shoot--p--a\",flow=\"vpn\"} 1\n",
            "vpn_router_shoot_tunnel_bytes_total{shoot=\"shoot--p--a\",flow=\"vpn\",direction=\"to_client\"} 20\n",
            "vpn_router_shoot_refused_total{shoot=\"shoot--p--a\",flow=\"vpn\",reason=\"denied\"} 1\n",
        ] {
            assert!(t.contains(line), "{line}: {t}");
        }
        drop(tunnel);
        let t = text(&shoots);
        assert!(!t.contains("shoot--p--a\""), "{t}");
        assert!(shoots.get("shoot--p--a").is_none());
        assert!(shoots.get("shoot--p--ab").is_some());
    }

    #[test]
    fn sni_routes_count_for_their_shoot_only() {
        let mut p = policy(&[A]);
        let sni = |name: &str, shoot: Option<&str>| {
            (
                crate::client_hello::ServerName::parse(name.as_bytes()).unwrap(),
                Target {
                    upstream: "x:1".into(),
                    rules: vec![],
                    shoot: shoot.map(str::to_owned),
                },
            )
        };
        p.sni_routes.extend([
            sni("api.a.example", Some("shoot--p--a")),
            sni("api.b.example", Some("shoot--p--b")),
            sni("api.none.example", None),
        ]);
        let shoots = Shoots::default();
        shoots.configure(&p);
        let mut out = Exposition::new();
        shoots.metrics(&mut out);
        let t = out.into_string();
        assert!(t.contains("vpn_router_shoots 2\n"), "{t}");
        for line in [
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--a\",flow=\"sni\"} 0\n",
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--a\",flow=\"vpn\"} 0\n",
            "vpn_router_shoot_tunnels_total{shoot=\"shoot--p--b\",flow=\"sni\"} 0\n",
        ] {
            assert!(t.contains(line), "{line}: {t}");
        }
        assert!(!t.contains("shoot=\"shoot--p--b\",flow=\"vpn\""), "{t}");
    }
}
