//! The network of an HA Gardener shoot and its seed (`docs/ha.md`), one lab namespace per pod,
//! shared by `tests/gardener_ha.rs` (our binaries as processes, failover figures) and
//! `tests/gardener_ha_images.rs` (Gardener's HA pods from our images):
//!
//! ```text
//!  SEED (pods 10.1.0.0/16)                         SHOOT (dual-stack inside)
//!  kapi-0   10.1.1.20 ─┐                        ┌─ vpn-shoot-0 100.96.10.10  fd00:10::10
//!  kapi-1   10.1.2.20 ─┤                        ├─ vpn-shoot-1 100.96.11.10  fd00:11::10
//!  server-0 10.1.3.10 ─┼─ seed router ─ inet ─ shoot router (NAT)
//!  server-1 10.1.4.10 ─┤                        └─ node 10.250.0.5  fd00:250::5 (UDP and TCP echo)
//!  ingress  10.1.5.30 + LB 203.0.113.10 ─┘
//! ```
//!
//! Every pod's interface is `eth0` with a default route to its router; the internet link is
//! the non-HA landscape's ([`super::landscape::internet`]). The networks are a parameter
//! ([`HaNetworks`]): [`HaNetworks::DISJOINT`] above, or [`HaNetworks::OVERLAP`] (seed pods
//! `10.0.0.0/8`, which holds the shoot's IPv4 service, pod and node networks `10.64.0.0/13`,
//! `10.96.0.0/11`, `10.250.0.0/16`; the vpn-shoot pods at `10.96.10.10` and `10.96.11.10`;
//! the seed's own addresses unchanged), which Gardener allows for HA shoots since
//! gardener#12204 (`tests/gardener_ha_overlap.rs`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use crate::netns::Netns;
use crate::LabError;

/// The seed's pod network (`SEED_POD_NETWORK`).
pub const SEED_POD_NETWORK: &str = "10.1.0.0/16";
/// The shoot's service networks (`SHOOT_SERVICE_NETWORKS`).
pub const SHOOT_SERVICE_NETWORKS: &str = "100.64.0.0/13";
/// The shoot's pod networks (`SHOOT_POD_NETWORKS`).
pub const SHOOT_POD_NETWORKS: &str = "100.96.0.0/11";
/// The shoot's IPv4 node network (`SHOOT_NODE_NETWORKS` adds [`SHOOT_NODE_NETWORK_V6`] for a
/// dual-stack shoot).
pub const SHOOT_NODE_NETWORK: &str = "10.250.0.0/16";
/// The shoot node's IPv6 network.
pub const SHOOT_NODE_NETWORK_V6: &str = "fd00:250::/64";
/// The kube-apiserver replicas' pod IPs.
pub const KAPI: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 1, 1, 20), Ipv4Addr::new(10, 1, 2, 20)];
/// The vpn-seed-server pods' IPs (each its own Service's).
pub const SERVER: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 1, 3, 10), Ipv4Addr::new(10, 1, 4, 10)];
/// The ingress pod's address.
pub const INGRESS_POD: Ipv4Addr = Ipv4Addr::new(10, 1, 5, 30);
/// The ingress load balancer's address.
pub const INGRESS_LB: Ipv4Addr = super::landscape::INGRESS_LB;
/// The vpn-shoot pods' IPs.
pub const SHOOT_POD: [Ipv4Addr; 2] = [
    Ipv4Addr::new(100, 96, 10, 10),
    Ipv4Addr::new(100, 96, 11, 10),
];
/// The shoot node's address.
pub const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 5);
/// The shoot node's IPv6 address.
pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 5);
/// The node's UDP echo port.
pub const UDP_ECHO: u16 = 7001;
/// The node's TCP echo port (IPv4 and IPv6).
pub const TCP_ECHO: u16 = 7002;

/// The networks of a landscape: the variables every container gets and where the vpn-shoot
/// pods live (the seed's addresses, the node's and the internet are the same in every plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaNetworks {
    /// `SEED_POD_NETWORK`.
    pub seed_pod_network: &'static str,
    /// `SHOOT_SERVICE_NETWORKS`.
    pub shoot_service_networks: &'static str,
    /// `SHOOT_POD_NETWORKS`.
    pub shoot_pod_networks: &'static str,
    /// The IPv4 part of `SHOOT_NODE_NETWORKS` (it holds [`NODE`]).
    pub shoot_node_network: &'static str,
    /// The vpn-shoot pods' IPs (in `shoot_pod_networks`).
    pub shoot_pod: [Ipv4Addr; 2],
}

impl HaNetworks {
    /// Disjoint seed and shoot networks (the constants of this module).
    pub const DISJOINT: HaNetworks = HaNetworks {
        seed_pod_network: SEED_POD_NETWORK,
        shoot_service_networks: SHOOT_SERVICE_NETWORKS,
        shoot_pod_networks: SHOOT_POD_NETWORKS,
        shoot_node_network: SHOOT_NODE_NETWORK,
        shoot_pod: SHOOT_POD,
    };
    /// The seed's pod network holds every IPv4 shoot network (see the module docs).
    pub const OVERLAP: HaNetworks = HaNetworks {
        seed_pod_network: "10.0.0.0/8",
        shoot_service_networks: "10.64.0.0/13",
        shoot_pod_networks: "10.96.0.0/11",
        shoot_node_network: SHOOT_NODE_NETWORK,
        shoot_pod: [Ipv4Addr::new(10, 96, 10, 10), Ipv4Addr::new(10, 96, 11, 10)],
    };
}

/// The namespaces; dropping it removes them.
#[derive(Debug)]
pub struct HaLandscape {
    /// The kube-apiserver pods.
    pub kapi: [Netns; 2],
    /// The vpn-seed-server pods.
    pub server: [Netns; 2],
    /// The ingress (our router's place).
    pub ingress: Netns,
    /// The vpn-shoot pods.
    pub shoot: [Netns; 2],
    /// A shoot node.
    pub node: Netns,
    /// The seed's routing.
    pub seed_router: Netns,
    /// The shoot's routing and NAT gateway.
    pub shoot_router: Netns,
    /// Its networks.
    pub networks: HaNetworks,
}

/// The `.1` of `a`'s /24: its router.
pub fn gateway(a: Ipv4Addr) -> Ipv4Addr {
    let [x, y, z, _] = a.octets();
    Ipv4Addr::new(x, y, z, 1)
}

/// A veth from `router` (`router_if`) to `pod` (`eth0`), `addr`/24 with the router at `.1`.
fn attach(router: &Netns, router_if: &str, pod: &Netns, addr: Ipv4Addr) -> Result<(), LabError> {
    let gw = gateway(addr);
    Netns::veth_pair(router, router_if, pod, "eth0")?;
    router.run(["ip", "addr", "add", &format!("{gw}/24"), "dev", router_if])?;
    pod.run(["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
    pod.run(["ip", "route", "add", "default", "via", &gw.to_string()])?;
    Ok(())
}

impl HaLandscape {
    /// Builds every namespace (named with `prefix` if given), link, address and route, with
    /// [`HaNetworks::DISJOINT`].
    pub fn build(prefix: Option<&str>) -> Result<HaLandscape, LabError> {
        HaLandscape::build_with(prefix, HaNetworks::DISJOINT)
    }

    /// [`HaLandscape::build`] with the networks `networks`.
    pub fn build_with(prefix: Option<&str>, networks: HaNetworks) -> Result<HaLandscape, LabError> {
        let ns = || match prefix {
            Some(p) => Netns::with_prefix(p),
            None => Netns::new(),
        };
        let l = HaLandscape {
            kapi: [ns()?, ns()?],
            server: [ns()?, ns()?],
            ingress: ns()?,
            shoot: [ns()?, ns()?],
            node: ns()?,
            seed_router: ns()?,
            shoot_router: ns()?,
            networks,
        };
        for r in [&l.seed_router, &l.shoot_router] {
            r.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        }
        for i in 0..2 {
            attach(&l.seed_router, &format!("to-kapi{i}"), &l.kapi[i], KAPI[i])?;
            attach(
                &l.seed_router,
                &format!("to-srv{i}"),
                &l.server[i],
                SERVER[i],
            )?;
            attach(
                &l.shoot_router,
                &format!("to-shoot{i}"),
                &l.shoot[i],
                networks.shoot_pod[i],
            )?;
        }
        attach(&l.seed_router, "to-ingress", &l.ingress, INGRESS_POD)?;
        attach(&l.shoot_router, "to-node", &l.node, NODE)?;
        // IPv6 inside the shoot: the pods and the node, no DAD, routed by the shoot router.
        l.shoot_router
            .run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        let v6_links = [
            (&l.shoot[0], "to-shoot0", "fd00:10::", 0x10),
            (&l.shoot[1], "to-shoot1", "fd00:11::", 0x10),
            (&l.node, "to-node", "fd00:250::", 5),
        ];
        for (pod, router_if, prefix, host) in v6_links {
            l.shoot_router.run([
                "ip",
                "addr",
                "add",
                &format!("{prefix}1/64"),
                "dev",
                router_if,
                "nodad",
            ])?;
            pod.run([
                "ip",
                "addr",
                "add",
                &format!("{prefix}{host:x}/64"),
                "dev",
                "eth0",
                "nodad",
            ])?;
            pod.run([
                "ip",
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("{prefix}1"),
            ])?;
        }
        super::landscape::internet(&l.seed_router, &l.shoot_router, &l.ingress, INGRESS_POD)?;
        Ok(l)
    }

    /// UDP echo ([`UDP_ECHO`]) and TCP echo ([`TCP_ECHO`], IPv4 and IPv6) on the shoot node,
    /// on threads that end with the test process.
    pub fn start_echo(&self) -> Result<(), LabError> {
        let (udp, tcp, tcp6) = self
            .node
            .run_in(|| {
                Ok::<_, std::io::Error>((
                    UdpSocket::bind(SocketAddr::from((NODE, UDP_ECHO)))?,
                    TcpListener::bind(SocketAddr::from((NODE, TCP_ECHO)))?,
                    TcpListener::bind(SocketAddr::from((NODE_V6, TCP_ECHO)))?,
                ))
            })?
            .map_err(|e| LabError::io("echo sockets on the shoot node", e))?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(&buf[..n], from);
            }
        });
        for listener in [tcp, tcp6] {
            crate::echo::serve(listener, Vec::new(), || {});
        }
        Ok(())
    }
}

/// Makes the namespace of a pod whose processes are gone as a new pod in its place would find
/// it (Kubernetes gives the new pod a new network namespace; the switch replays reuse the
/// namespace and its address): every link but `lo` and `eth0` deleted (with their routes),
/// every nftables table deleted, every policy routing rule but the kernel's defaults
/// (priorities 0, 32766, 32767) deleted. Kernel settings stay (the init containers set them
/// again).
pub fn clear_pod(ns: &Netns) -> Result<(), LabError> {
    let json = |argv: &[&str]| -> Result<Vec<serde_json::Value>, LabError> {
        let out = ns.run(argv)?.stdout;
        Ok(serde_json::from_slice(&out).unwrap_or_default())
    };
    for link in json(&["ip", "-j", "link", "show"])? {
        if let Some(name) = link["ifname"].as_str() {
            if name != "lo" && name != "eth0" {
                // A link may be gone with another (a veth's peer, a bridge's port).
                let _ = ns.run(["ip", "link", "del", name]);
            }
        }
    }
    let tables = ns.run(["nft", "list", "tables"])?.stdout;
    for line in String::from_utf8_lossy(&tables).lines() {
        if let ["table", family, name] = line.split_whitespace().collect::<Vec<_>>()[..] {
            ns.run(["nft", "delete", "table", family, name])?;
        }
    }
    for family in ["-4", "-6"] {
        for rule in json(&["ip", "-j", family, "rule", "show"])? {
            let Some(pref) = rule["priority"].as_u64() else {
                continue;
            };
            if ![0, 32766, 32767].contains(&pref) {
                // Several rules may share a priority: the first deletion takes one of them.
                let _ = ns.run(["ip", family, "rule", "del", "pref", &pref.to_string()]);
            }
        }
    }
    Ok(())
}

/// The `ip route` lines of `ns` through `dev` that carry traffic while a tunnel is up (empty
/// when there is no such device): a kube-apiserver client's standby routes (metric 1000 and
/// up, kept while its tunnel is down) are left out; [`standby_routes_via`] has them.
pub fn routes_via(ns: &Netns, dev: &str) -> String {
    route_lines(ns, "-4", dev, false)
}

/// The `ip -6 route` lines of [`routes_via`].
pub fn routes6_via(ns: &Netns, dev: &str) -> String {
    route_lines(ns, "-6", dev, false)
}

/// The standby routes of `ns` through `dev`, both families (`vpn_client`'s
/// `HaRoutes::standby_metric`).
pub fn standby_routes_via(ns: &Netns, dev: &str) -> String {
    route_lines(ns, "-4", dev, true) + &route_lines(ns, "-6", dev, true)
}

fn route_lines(ns: &Netns, family: &str, dev: &str, standby: bool) -> String {
    let out = ns
        .run(["ip", family, "route", "show", "dev", dev])
        .map(|o| o.stdout)
        .unwrap_or_default();
    let is_standby = |line: &str| {
        line.split_whitespace()
            .skip_while(|w| *w != "metric")
            .nth(1)
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| m >= vpn_client::vpn2::HA_STANDBY_METRIC_BASE)
    };
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|line| is_standby(line) == standby)
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The longest time without an arrival between `from` and `to`, from the arrival times of a
/// probe stream (`arrivals` in order): the last arrival at or before `from` starts the window
/// (else `from` itself), and the window's end counts as an arrival.
pub fn max_gap(arrivals: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut last = arrivals
        .iter()
        .rev()
        .find(|t| **t <= from)
        .copied()
        .unwrap_or(from);
    let mut gap = Duration::ZERO;
    for t in arrivals.iter().filter(|t| **t > from && **t <= to) {
        gap = gap.max(t.duration_since(last));
        last = *t;
    }
    gap.max(to.saturating_duration_since(last))
}
