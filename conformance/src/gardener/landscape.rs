//! The network of a non-HA Gardener shoot and its seed, one lab namespace per pod, with
//! Gardener-like addresses: the seed's pod network and the shoot's pod network are the same
//! `100.96.0.0/11` (the overlap vpn2's address mapping exists for), the shoot is dual-stack.
//!
//! ```text
//!  SEED                                                  SHOOT
//!  seed-pod   100.96.0.10  ─┐                       ┌─ vpn-shoot 100.96.10.10  fd00:96:0:10::10
//!  (vpn-seed-server pod)    │                       │   (pod)
//!  kube-apiserver 100.96.1.20 ─ seed-node ─ inet ─ shoot-node ─ webhook 100.96.20.20  fd00:96:0:20::20
//!  (pod)                    │   router  198.51.100.0/30 router  │   (pod)
//!  ingress 100.96.2.30      ─┘                  (SNAT)  ├─ node 10.250.0.5  fd00:250::5
//!   + LB address 203.0.113.10                           │   (kubelet :10250)
//!                                                       └─ twin 100.96.1.20
//!                                                           (pod; the kube-apiserver's address)
//! ```
//!
//! Every pod's interface is `eth0`, with a default route to its router. The shoot's router
//! masquerades what leaves for the internet link, as a cloud NAT gateway would, so the seed
//! knows no shoot address; the seed's router forwards the load balancer address to the
//! ingress, and nothing else that comes from the internet link except answers (the internet
//! routes no private addresses). Routers are plain namespaces with forwarding on.
//!
//! Two pods make what the overlap and the tunnel MTU mean visible: the shoot pod `twin` has
//! the seed kube-apiserver's address (a connection the seed opens to that address must land
//! in the shoot, never at the seed's own pod), and the links differ in MTU as clouds' do: the
//! vpn-shoot pod's is smaller than the tunnel's ([`VPN_SHOOT_MTU`], an overlay network's), the
//! node's larger ([`NODE_MTU`], jumbo frames), so a TCP handshake through the tunnel carries
//! a clamped MSS only where vpn2's clamping rule works, in both directions.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::Netns;
use crate::LabError;

/// The seed's pod network (`SEED_POD_NETWORK`), equal to the shoot's IPv4 pod network.
pub const SEED_POD_NETWORK: &str = "100.96.0.0/11";
/// The shoot's pod networks (`SHOOT_POD_NETWORKS`).
pub const SHOOT_POD_NETWORKS: &str = "100.96.0.0/11,fd00:96::/48";
/// The shoot's service networks (`SHOOT_SERVICE_NETWORKS`).
pub const SHOOT_SERVICE_NETWORKS: &str = "100.64.0.0/13,fd00:64::/112";
/// The shoot's node networks (`SHOOT_NODE_NETWORKS`).
pub const SHOOT_NODE_NETWORKS: &str = "10.250.0.0/16,fd00:250::/48";

/// The vpn-seed-server pod's address.
pub const SEED_POD: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
/// The kube-apiserver pod's address.
pub const KUBE_APISERVER: Ipv4Addr = Ipv4Addr::new(100, 96, 1, 20);
/// The ingress pod's address.
pub const INGRESS_POD: Ipv4Addr = Ipv4Addr::new(100, 96, 2, 30);
/// The ingress load balancer's address (what `ENDPOINT` resolves to).
pub const INGRESS_LB: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The shoot's address on the internet link (its NAT gateway).
pub const SHOOT_EGRESS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// The vpn-shoot pod's addresses.
pub const VPN_SHOOT: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(100, 96, 10, 10),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0x10, 0, 0, 0, 0x10),
);
/// The webhook pod's addresses.
pub const WEBHOOK: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(100, 96, 20, 20),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0x20, 0, 0, 0, 0x20),
);
/// The shoot node's addresses.
pub const NODE: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 250, 0, 5),
    Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 5),
);
/// The shoot pod that has the seed kube-apiserver's address.
pub const TWIN: Ipv4Addr = KUBE_APISERVER;

/// The MTU of the vpn-shoot pod's link (an overlay network's, below the tunnel's 1500).
pub const VPN_SHOOT_MTU: u32 = 1400;
/// The MTU of the shoot node's link (jumbo frames, above the tunnel's).
pub const NODE_MTU: u32 = 9000;

/// The address under which the shoot reaches seed pod address `seed` (vpn2 maps the seed's
/// IPv4 pod network into `241.0.0.0/8`: the first octet replaced, the rest kept).
pub fn seen_from_shoot(seed: Ipv4Addr) -> Ipv4Addr {
    let [_, b, c, d] = seed.octets();
    Ipv4Addr::new(241, b, c, d)
}

/// The namespaces of the landscape; dropping it removes them all.
#[derive(Debug)]
pub struct Landscape {
    /// The non-HA `vpn-seed-server` pod.
    pub seed_pod: Netns,
    /// A kube-apiserver pod (the sidecar's client).
    pub kube_apiserver: Netns,
    /// The seed's ingress (the Istio gateway's place).
    pub ingress: Netns,
    /// The `vpn-shoot` pod.
    pub vpn_shoot: Netns,
    /// A webhook pod in the shoot.
    pub webhook: Netns,
    /// A shoot node (its kubelet).
    pub node: Netns,
    /// A shoot pod with the seed kube-apiserver's address ([`TWIN`]).
    pub twin: Netns,
    /// The seed's routing between pods and to the internet.
    pub seed_router: Netns,
    /// The shoot's routing between pods and nodes, and its NAT gateway.
    pub shoot_router: Netns,
}

/// One pod's link to its router: the router-side interface, the /24 (and /64) it routes,
/// its MTU if not the default.
struct Link<'a> {
    pod: &'a Netns,
    router_if: &'static str,
    v4: (Ipv4Addr, Ipv4Addr),
    v6: Option<(Ipv6Addr, Ipv6Addr)>,
    mtu: Option<u32>,
}

impl Landscape {
    /// Builds every namespace, link, address and route.
    pub fn build() -> Result<Landscape, LabError> {
        Self::build_with_prefix(crate::netns::NAME_PREFIX)
    }

    /// Like [`Landscape::build`], its namespaces named with `prefix` ([`Netns::with_prefix`]).
    pub fn build_with_prefix(prefix: &str) -> Result<Landscape, LabError> {
        let ns = || Netns::with_prefix(prefix);
        let l = Landscape {
            seed_pod: ns()?,
            kube_apiserver: ns()?,
            ingress: ns()?,
            vpn_shoot: ns()?,
            webhook: ns()?,
            node: ns()?,
            twin: ns()?,
            seed_router: ns()?,
            shoot_router: ns()?,
        };
        // No duplicate address detection on any link, link-local addresses included: a
        // fresh link's tentative link-local address holds up neighbour discovery, and so the
        // first IPv6 packet through it, for a second.
        for (_, ns) in l.pods() {
            ns.run(["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])?;
        }
        for router in [&l.seed_router, &l.shoot_router] {
            router.run(["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])?;
            router.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            router.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        }
        // fd00:<a>:0:<b>::<h>: the /64 <b> inside the network fd00:<a>::/48.
        let v6 = |a: u16, b: u16, h: u16| Ipv6Addr::new(0xfd00, a, 0, b, 0, 0, 0, h);
        let seed_links = [
            Link {
                pod: &l.seed_pod,
                router_if: "to-seed-pod",
                v4: (Ipv4Addr::new(100, 96, 0, 1), SEED_POD),
                v6: None,
                mtu: None,
            },
            Link {
                pod: &l.kube_apiserver,
                router_if: "to-kapi",
                v4: (Ipv4Addr::new(100, 96, 1, 1), KUBE_APISERVER),
                v6: None,
                mtu: None,
            },
            Link {
                pod: &l.ingress,
                router_if: "to-ingress",
                v4: (Ipv4Addr::new(100, 96, 2, 1), INGRESS_POD),
                v6: None,
                mtu: None,
            },
        ];
        let shoot_links = [
            Link {
                pod: &l.vpn_shoot,
                router_if: "to-vpn-shoot",
                v4: (Ipv4Addr::new(100, 96, 10, 1), VPN_SHOOT.0),
                v6: Some((v6(0x96, 0x10, 1), VPN_SHOOT.1)),
                mtu: Some(VPN_SHOOT_MTU),
            },
            Link {
                pod: &l.webhook,
                router_if: "to-webhook",
                v4: (Ipv4Addr::new(100, 96, 20, 1), WEBHOOK.0),
                v6: Some((v6(0x96, 0x20, 1), WEBHOOK.1)),
                mtu: None,
            },
            Link {
                pod: &l.node,
                router_if: "to-node",
                v4: (Ipv4Addr::new(10, 250, 0, 1), NODE.0),
                v6: Some((v6(0x250, 0, 1), NODE.1)),
                mtu: Some(NODE_MTU),
            },
            Link {
                pod: &l.twin,
                router_if: "to-twin",
                v4: (Ipv4Addr::new(100, 96, 1, 1), TWIN),
                v6: None,
                mtu: None,
            },
        ];
        for (router, links) in [
            (&l.seed_router, &seed_links[..]),
            (&l.shoot_router, &shoot_links[..]),
        ] {
            for link in links {
                attach(router, link)?;
            }
        }

        internet(&l.seed_router, &l.shoot_router, &l.ingress, INGRESS_POD)?;
        Ok(l)
    }

    /// The pods' namespaces by name, for diagnostics.
    pub fn pods(&self) -> [(&'static str, &Netns); 7] {
        [
            ("seed-pod", &self.seed_pod),
            ("kube-apiserver", &self.kube_apiserver),
            ("ingress", &self.ingress),
            ("vpn-shoot", &self.vpn_shoot),
            ("webhook", &self.webhook),
            ("node", &self.node),
            ("twin", &self.twin),
        ]
    }
}

/// The internet between the seed's and the shoot's routers (`inet`, `198.51.100.0/30`): the
/// shoot leaves through its NAT gateway ([`SHOOT_EGRESS`]); from the internet the seed's
/// router forwards answers and connections to the load balancer ([`INGRESS_LB`], an address of
/// `ingress`, whose pod address is `ingress_pod`), nothing else (the internet routes no private
/// addresses).
pub fn internet(
    seed_router: &Netns,
    shoot_router: &Netns,
    ingress: &Netns,
    ingress_pod: Ipv4Addr,
) -> Result<(), LabError> {
    Netns::veth_pair(seed_router, "inet", shoot_router, "inet")?;
    seed_router.run(["ip", "addr", "add", "198.51.100.1/30", "dev", "inet"])?;
    shoot_router.run([
        "ip",
        "addr",
        "add",
        &format!("{SHOOT_EGRESS}/30"),
        "dev",
        "inet",
    ])?;
    shoot_router.run(["ip", "route", "add", "default", "via", "198.51.100.1"])?;
    for rule in [
        "add table ip lab-nat",
        "add chain ip lab-nat postrouting { type nat hook postrouting priority srcnat; }",
        "add rule ip lab-nat postrouting oifname \"inet\" masquerade",
    ] {
        shoot_router.run(["nft", rule])?;
    }
    for rule in [
        "add table inet lab-edge",
        "add chain inet lab-edge forward { type filter hook forward priority filter; }",
        "add rule inet lab-edge forward iifname \"inet\" ct state established,related accept",
        &format!("add rule inet lab-edge forward iifname \"inet\" ip daddr {INGRESS_LB} accept"),
        "add rule inet lab-edge forward iifname \"inet\" drop",
    ] {
        seed_router.run(["nft", rule])?;
    }
    ingress.run([
        "ip",
        "addr",
        "add",
        &format!("{INGRESS_LB}/32"),
        "dev",
        "eth0",
    ])?;
    seed_router.run([
        "ip",
        "route",
        "add",
        &format!("{INGRESS_LB}/32"),
        "via",
        &ingress_pod.to_string(),
    ])?;
    Ok(())
}

/// Adds a pod to a built landscape (a surge pod of a rolling update): a veth from `router`
/// (`router_if` there) to `pod` (`eth0`), the router's and the pod's IPv4 addresses `v4` in a
/// /24 (and IPv6 in a /64), the link's MTU, default routes, no duplicate address detection.
pub fn add_pod(
    router: &Netns,
    pod: &Netns,
    router_if: &'static str,
    v4: (Ipv4Addr, Ipv4Addr),
    v6: Option<(Ipv6Addr, Ipv6Addr)>,
    mtu: Option<u32>,
) -> Result<(), LabError> {
    pod.run(["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])?;
    attach(
        router,
        &Link {
            pod,
            router_if,
            v4,
            v6,
            mtu,
        },
    )
}

/// A veth from `router` to the link's pod (`eth0` there), its addresses and default routes.
fn attach(router: &Netns, link: &Link<'_>) -> Result<(), LabError> {
    Netns::veth_pair(router, link.router_if, link.pod, "eth0")?;
    if let Some(mtu) = link.mtu {
        let mtu = mtu.to_string();
        router.run(["ip", "link", "set", link.router_if, "mtu", &mtu])?;
        link.pod.run(["ip", "link", "set", "eth0", "mtu", &mtu])?;
    }
    let (gw, pod) = link.v4;
    router.run([
        "ip",
        "addr",
        "add",
        &format!("{gw}/24"),
        "dev",
        link.router_if,
    ])?;
    link.pod
        .run(["ip", "addr", "add", &format!("{pod}/24"), "dev", "eth0"])?;
    link.pod
        .run(["ip", "route", "add", "default", "via", &gw.to_string()])?;
    if let Some((gw6, pod6)) = link.v6 {
        // No duplicate address detection: the addresses are usable at once.
        router.run([
            "ip",
            "addr",
            "add",
            &format!("{gw6}/64"),
            "dev",
            link.router_if,
            "nodad",
        ])?;
        link.pod.run([
            "ip",
            "addr",
            "add",
            &format!("{pod6}/64"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        link.pod.run([
            "ip",
            "-6",
            "route",
            "add",
            "default",
            "via",
            &gw6.to_string(),
        ])?;
    }
    Ok(())
}
