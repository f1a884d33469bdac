//! An HA shoot whose IPv4 networks overlap the seed's pod network, as Gardener runs it since
//! gardener#12204 (gardener-pods.md §2.3, §2.6; reference gardener-vpn2.md §8): the
//! kube-apiserver pod gets an `envoy-proxy` container (group 31415, TLS CONNECT on 9443) and
//! an egress selector pointing at it (`kube-apiserver-http-proxy:9443`, a host alias for
//! 127.0.0.1), and its `vpn-client-<i>` containers install vpn2's mappings for it: the proxy
//! group's `nat OUTPUT` NETMAP of the real shoot networks into 242–244/8 and the seed pods'
//! 241/8 pair on the tunnel devices. Replayed with our binaries in the HA landscape's
//! overlapping variant ([`HaNetworks::OVERLAP`]):
//!
//! ```text
//!  SEED (pods 10.0.0.0/8)                                         SHOOT
//!  kapi-0 10.1.1.20  envoy-proxy (gid 31415), vpn-client-0/1 ─┐   ┌─ vpn-shoot-0 10.96.10.10  s0, s1
//!  kapi-1 10.1.2.20  envoy-proxy (gid 31415), vpn-client-0/1 ─┤   ├─ vpn-shoot-1 10.96.11.10  s0, s1
//!  server-0 10.1.3.10, server-1 10.1.4.10 (IS_HA)           ─┼ R ─ SR ─ node 10.250.0.5 (kubelet :10250)
//!  ingress 10.1.5.30 + LB 203.0.113.10 (vpn-router)          ─┤   └─ webhook 10.96.20.20 (:9443)
//!  neighbour 10.250.0.5, neighbour 10.96.20.20 (seed pods)   ─┘
//! ```
//!
//! The seed's two neighbours have the addresses of the shoot's kubelet and webhook, and listen
//! on the same ports. From each kube-apiserver replica, through its own envoy-proxy (mTLS, the
//! kube-apiserver's client certificate): the gardenlet's tunnel check, kube-apiserver →
//! kubelet over IPv4 and IPv6 and → webhook, each answered by the shoot's far end with the
//! vpn-shoot pod as the source and the bytes echoed exactly; the shoot pod's tunnel shows the
//! kube-apiserver's 241/8 image going to the node's 242/8 address; a seed pod outside the
//! shoot networks is refused by the proxy; the seed neighbours never see a connection; and a
//! capture on each kube-apiserver pod's `eth0` sees its tunnels' TCP to the servers and
//! nothing to a shoot network, real or mapped.
//!
//! Stand-ins: Envoy is our `vpn-server envoy -c envoy.yaml` (Gardener's envoy.yaml, the
//! certificate paths pointed at the lab's files) run as Envoy's uid 65532 and group 31415 with
//! no capabilities and no environment, as Gardener starts the container; its certificate is
//! the lab's `vpn-seed-server` one (Gardener's is `kube-apiserver-http-proxy`; the lab's
//! kube-apiserver client checks the name `vpn-seed-server`). Without the kube-apiserver pod's
//! NETMAP the proxy's connections to the real shoot addresses never reach the shoot: they lie
//! in the seed's pod network, so the proxy group's guard refuses them with a reset (and were
//! it gone, the pod's tunnel-only guard would drop them before `eth0`); the gardenlet's tunnel
//! check is then answered 503 (seen with the NETMAP chain left out of `vpn-client`).

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::gardener::capture::{Capture, Packet, Transport};
use conformance::gardener::checks::{
    connect, cross_from, Crossing, Egress, ECHO_BYTES, GARDENLET_TUNNEL_TIMEOUT, KUBELET_PORT,
    NEIGHBOUR_PORT, SILENCE, WEBHOOK_PORT,
};
use conformance::gardener::far_end::FarEnd;
use conformance::gardener::ha::{
    gateway, routes6_via, routes_via, HaLandscape, HaNetworks, KAPI, NODE, NODE_V6, SERVER,
};
use conformance::gardener::ha_pods::{write_secrets, HaPods};
use conformance::gardener::landscape::add_pod;
use conformance::gardener::pods::{Binaries, Container, Mounts, Spec, SIDECAR_IDS, SIDECAR_READY};
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until;

const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--ha-overlap",
    dual_stack_nodes: true,
};
const NETS: HaNetworks = HaNetworks::OVERLAP;
/// Namespace prefix of this test.
const PREFIX: &str = "vpnt-ov";
/// A webhook pod in the shoot's pod network (and a seed pod with the same address).
const WEBHOOK: Ipv4Addr = Ipv4Addr::new(10, 96, 20, 20);
/// The vpn-shoot pod 0's IPv6 address (the source the node sees over IPv6).
const SHOOT_POD0_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0x10);
/// The envoy-proxy's port, reached by the kube-apiserver at 127.0.0.1.
const ENVOY_PORT: u16 = 9443;
/// How long anything may take to come up.
const UP: Duration = Duration::from_secs(40);
/// What a kube-apiserver pod's `eth0` may carry toward the shoot: nothing, real or mapped;
/// the tunnels' TCP to the servers is captured too (what the capture must see).
const EGRESS_FILTER: &str = "dst net 10.64.0.0/13 or dst net 10.96.0.0/11 or \
    dst net 10.250.0.0/16 or dst net 242.0.0.0/8 or dst net 243.0.0.0/8 or \
    dst net 244.0.0.0/8 or ip6 dst net fd00:250::/64 or tcp port 1194";

/// `addr`'s image in `241.0.0.0/8` (vpn2's NETMAP of the seed's /8 pod network).
fn image_241(addr: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::from((241 << 24) | (u32::from(addr) & 0x00ff_ffff))
}

/// Gardener's envoy.yaml with the certificates under `certs`.
fn envoy_yaml(certs: &Path) -> String {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sidecar/fixtures/gardener-envoy.yaml");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("/srv/secrets/envoy-proxy", &certs.display().to_string())
}

fn packets_text(packets: &[Packet]) -> Vec<String> {
    packets
        .iter()
        .map(|p| format!("{} > {} {:?}", p.src, p.dst, p.transport))
        .collect()
}

fn is_tunnel_tcp(p: &Packet) -> bool {
    matches!(p.transport, Transport::Tcp { src, dst, .. } if src == 1194 || dst == 1194)
}

#[test]
fn ha_overlap_is_served_through_the_kube_apiservers_envoy_proxy() {
    require_lab(&["ip", "nft", "sysctl", "tcpdump", "setpriv"]);
    let started = Instant::now();
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build_with(Some(PREFIX), NETS).expect("layout");
    // The shoot's webhook pod; the seed's pods with the kubelet's and the webhook's addresses.
    let webhook = Netns::with_prefix(PREFIX).expect("namespace");
    add_pod(
        &l.shoot_router,
        &webhook,
        "to-webhook",
        (gateway(WEBHOOK), WEBHOOK),
        None,
        None,
    )
    .expect("webhook pod");
    let seed_node_twin = Netns::with_prefix(PREFIX).expect("namespace");
    add_pod(
        &l.seed_router,
        &seed_node_twin,
        "to-twin-node",
        (gateway(NODE), NODE),
        None,
        None,
    )
    .expect("seed pod at the node's address");
    let seed_webhook_twin = Netns::with_prefix(PREFIX).expect("namespace");
    add_pod(
        &l.seed_router,
        &seed_webhook_twin,
        "to-twin-hook",
        (gateway(WEBHOOK), WEBHOOK),
        None,
        None,
    )
    .expect("seed pod at the webhook's address");

    let pki = TestPki::generate().expect("pki");
    let mounts = Mounts::generate().expect("envoy-proxy certificates");
    // The logs stay for a look when the test fails; a pass removes them.
    let root = tempfile::Builder::new()
        .prefix("vpnt-ov-")
        .tempdir()
        .expect("tempdir")
        .keep();
    eprintln!("logs in {}", root.display());
    let root = root.as_path();
    let secrets = root.join("secrets");
    write_secrets(&pki, &secrets).expect("secrets");
    let yaml = mounts.dir().join("envoy.yaml");
    std::fs::write(&yaml, envoy_yaml(&mounts.seed_secrets().join("vpn-server"))).expect("yaml");
    std::fs::set_permissions(&yaml, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let logs = root;
    let on = |spec: Spec| PODS.on_networks(&NETS, spec);

    // Init containers.
    PODS.run_inits_with(&bins, &l, logs, on)
        .expect("init containers");

    let router_toml = root.join("router.toml");
    std::fs::write(&router_toml, PODS.router_config()).expect("lab step");
    let ingress = Spec::new(
        "ingress",
        &bins.router,
        &["--config", &router_toml.display().to_string()],
        Vec::new(),
    )
    .start(&l.ingress, logs)
    .expect("router");
    ingress
        .wait_log("router listening", UP)
        .expect("router listening");
    let servers: Vec<Container<'_>> = (0..2)
        .map(|i| {
            let c = on(PODS.server_spec(&bins, &secrets, i))
                .start(&l.server[i], logs)
                .expect("server");
            c.wait_log("Initialization Sequence Completed", UP)
                .expect("server up");
            c
        })
        .collect();
    let shoot_clients: Vec<Container<'_>> = (0..2)
        .flat_map(|p| (0..2).map(move |i| (p, i)))
        .map(|(p, i)| {
            on(PODS.shoot_client_spec(&bins, &secrets, p, i))
                .start(&l.shoot[p], logs)
                .expect("shoot client")
        })
        .collect();
    let kapi_clients: Vec<Container<'_>> = (0..2)
        .flat_map(|r| (0..2).map(move |i| (r, i)))
        .map(|(r, i)| {
            on(PODS.seed_client_spec(&bins, &secrets, r, i))
                .start(&l.kapi[r], logs)
                .expect("seed client")
        })
        .collect();
    // envoy-proxy: Gardener's command, no environment, Envoy's uid and group 31415.
    let envoys: Vec<Container<'_>> = (0..2)
        .map(|r| {
            let spec = Spec {
                ids: Some(SIDECAR_IDS),
                ..Spec::new(
                    &format!("kapi{r}-envoy-proxy"),
                    &bins.server,
                    &[
                        "envoy",
                        "--concurrency",
                        "2",
                        "-c",
                        &yaml.display().to_string(),
                    ],
                    Vec::new(),
                )
            };
            let c = spec.start(&l.kapi[r], logs).expect("envoy-proxy");
            c.wait_log(SIDECAR_READY, UP)
                .expect("envoy-proxy listening");
            assert_eq!(c.ids(), Some(SIDECAR_IDS), "envoy-proxy's uid and gid");
            c
        })
        .collect();

    // Both tunnels of both replicas carry the mapped IPv4 ranges and the IPv6 node network.
    for r in 0..2 {
        for (dev, metric) in [("tun0", "metric 100"), ("tun1", "metric 101")] {
            wait_until("kube-apiserver routes through both tunnels", UP, || {
                let v4 = routes_via(&l.kapi[r], dev);
                ["242.0.0.0/16", "243.0.0.0/13", "244.0.0.0/11"]
                    .iter()
                    .all(|n| v4.lines().any(|l| l.starts_with(n) && l.contains(metric)))
                    && routes6_via(&l.kapi[r], dev).contains("fd00:250::/64")
            });
        }
        // vpn2's rules for the proxy, in each client's table.
        for dev in ["tun0", "tun1"] {
            let listed = l.kapi[r]
                .run(["nft", "list", "table", "inet", &format!("vpn-shoot-{dev}")])
                .expect("nft list")
                .stdout;
            let listed = String::from_utf8_lossy(&listed).into_owned();
            for part in [
                "skgid 31415",
                "dnat ip prefix to 242.0.0.0/16",
                "dnat ip prefix to 243.0.0.0/13",
                "dnat ip prefix to 244.0.0.0/11",
                "snat ip prefix to 241.0.0.0/8",
                "dnat ip prefix to 10.0.0.0/8",
                "reject with tcp reset",
            ] {
                assert!(listed.contains(part), "kapi{r} {dev}: {part} in\n{listed}");
            }
        }
    }
    eprintln!(
        "HA overlap figure: every tunnel up {:.1} s after the start",
        started.elapsed().as_secs_f64()
    );

    let egress_base = Egress::new(&mounts.pki.bundle, &mounts.pki.client).expect("egress");
    let egress = egress_base.toward(SocketAddr::from((Ipv4Addr::LOCALHOST, ENVOY_PORT)));
    let node_v4 = SocketAddr::from((NODE, KUBELET_PORT));
    let hook = SocketAddr::from((WEBHOOK, WEBHOOK_PORT));
    // The seed's pods at the shoot's addresses: never reached through a proxy.
    let twins = [
        (
            "seed pod at the node's address",
            FarEnd::start(&seed_node_twin, node_v4).expect("far end"),
        ),
        (
            "seed pod at the webhook's address",
            FarEnd::start(&seed_webhook_twin, hook).expect("far end"),
        ),
    ];
    let shoot_pod0 = IpAddr::V4(NETS.shoot_pod[0]);
    for (r, (kapi, kapi_ip)) in l.kapi.iter().zip(KAPI).enumerate() {
        let eth0 = Capture::start(kapi, "eth0", EGRESS_FILTER).expect("capture eth0");
        let tun = Capture::start(&l.shoot[0], "tun0", "tcp dst port 10250").expect("capture tun0");

        // The gardenlet's tunnel check: CONNECT <node>:10250 answered 200 and the kubelet
        // accepted, within its 5 s.
        {
            let kubelet = FarEnd::start(&l.node, node_v4).expect("kubelet");
            let t0 = Instant::now();
            let stream = kapi
                .run_in(|| connect(&egress, node_v4, GARDENLET_TUNNEL_TIMEOUT))
                .expect("namespace");
            let stream = stream.unwrap_or_else(|e| panic!("kapi{r} tunnel check: {e}"));
            while kubelet.peers().is_empty() && t0.elapsed() < GARDENLET_TUNNEL_TIMEOUT {
                std::thread::sleep(Duration::from_millis(5));
            }
            let took = t0.elapsed();
            assert!(
                !kubelet.peers().is_empty() && took <= GARDENLET_TUNNEL_TIMEOUT,
                "kapi{r} tunnel check took {took:?}"
            );
            drop(stream);
            eprintln!(
                "HA overlap figure: kapi{r} tunnel check {} ms",
                took.as_millis()
            );
        }
        // kube-apiserver → kubelet, IPv4 (the node network overlaps the seed's) and IPv6.
        let kubelet_v4 = {
            let far = FarEnd::start(&l.node, node_v4).expect("kubelet");
            cross_from(kapi, &egress, &far, shoot_pod0, ECHO_BYTES)
                .unwrap_or_else(|e| panic!("kapi{r} → kubelet {node_v4}: {e}"))
        };
        let node_v6 = SocketAddr::from((NODE_V6, KUBELET_PORT));
        let kubelet_v6 = {
            let far = FarEnd::start(&l.node, node_v6).expect("kubelet v6");
            cross_from(kapi, &egress, &far, IpAddr::V6(SHOOT_POD0_V6), ECHO_BYTES)
                .unwrap_or_else(|e| panic!("kapi{r} → kubelet {node_v6}: {e}"))
        };
        // kube-apiserver → webhook (the pod network overlaps the seed's).
        let webhook_crossing = {
            let far = FarEnd::start(&webhook, hook).expect("webhook");
            cross_from(kapi, &egress, &far, shoot_pod0, ECHO_BYTES)
                .unwrap_or_else(|e| panic!("kapi{r} → webhook {hook}: {e}"))
        };
        for c in [&kubelet_v4, &kubelet_v6, &webhook_crossing] {
            let Crossing {
                target,
                source,
                echoed,
                took,
            } = c;
            eprintln!(
                "HA overlap figure: kapi{r} CONNECT {target}: seen from {source}, {echoed} bytes echoed, {} ms",
                took.as_millis()
            );
        }
        // A seed pod outside the shoot networks (a server's pod IP): refused by the proxy
        // group's guard, and its listener sees nothing.
        {
            let target = SocketAddr::from((SERVER[0], NEIGHBOUR_PORT));
            let far = FarEnd::start(&l.server[0], target).expect("far end");
            let answer = kapi
                .run_in(|| connect(&egress, target, SILENCE))
                .expect("namespace");
            assert!(
                answer.is_err(),
                "kapi{r}: CONNECT {target} (a seed pod) answered 200"
            );
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                far.peers().is_empty(),
                "kapi{r}: the seed pod {target} was reached: {:?}",
                far.peers()
            );
            eprintln!(
                "HA overlap figure: kapi{r} CONNECT {target} (seed pod): {}",
                answer.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }

        // The shoot pod's tunnel saw the kube-apiserver's 241/8 image to the node's 242/8
        // address (vpn2's two NETMAPs), and nothing else toward the kubelet.
        {
            let seen = tun.finish().expect("capture tun0");
            let want_src = IpAddr::V4(image_241(kapi_ip));
            let want_dst = IpAddr::V4(Ipv4Addr::new(242, 0, 0, 5));
            assert!(
                seen.iter().any(|p| p.src == want_src && p.dst == want_dst),
                "kapi{r}: no {want_src} > {want_dst} on shoot0 tun0: {:?}",
                packets_text(&seen)
            );
            assert!(
                seen.iter().all(|p| p.src == want_src || p.src.is_ipv6()),
                "kapi{r}: other IPv4 sources on shoot0 tun0: {:?}",
                packets_text(&seen)
            );
        }
        // Nothing to the shoot left the kube-apiserver pod by eth0; its tunnels' TCP did.
        let seen = eth0.finish().expect("capture eth0");
        let leaked: Vec<&Packet> = seen.iter().filter(|p| !is_tunnel_tcp(p)).collect();
        assert!(
            leaked.is_empty(),
            "kapi{r}: to the shoot by eth0: {:?}",
            packets_text(&seen)
        );
        assert!(
            seen.iter().any(is_tunnel_tcp),
            "kapi{r}: the capture saw not even the tunnels' TCP"
        );
    }
    for (what, far) in &twins {
        assert!(
            far.peers().is_empty(),
            "the {what} was reached: {:?}",
            far.peers()
        );
    }

    drop((envoys, kapi_clients, shoot_clients, servers, ingress));
    let _ = std::fs::remove_dir_all(root);
    eprintln!(
        "HA overlap figure: the whole replay {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
