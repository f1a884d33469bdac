//! vpn2's HA data path, modelled on this machine's kernel (no bonding, no `ip6tnl`), carrying
//! kube-apiserver → kubelet requests through a server failure and back
//! (`conformance::gardener::vpn2_ha_pods`):
//!
//! ```text
//!  kapi-0 10.1.1.20: tap0 ─┐ bond0 (bridge) …::a:1 ── bond0-ip6tnl0/1 (tun + raw IPv6 sockets)
//!                    tap1 ─┘                         path controller: echo + hello, routes dev
//!  server-0 (OpenVPN, dev tap0, client-to-client) ── tap0 of every pod
//!  server-1 (OpenVPN, dev tap0, client-to-client) ── tap1 of every pod
//!  vpn-shoot-0/1: tap0, tap1 ── bond0 …::b:0 / …::b:1 ── tunnel controller: bond0ip6tnl0001,
//!                 10.1.1.20/32 dev it ── forward, masquerade ── node 10.250.0.5
//! ```
//!
//! What is real: upstream OpenVPN 2.6 as both servers and all six clients, with the configs
//! vpn2 renders in HA (tap devices, `client-to-client`, `duplicate-cn`, vpn2's PKI layout and
//! CNs), the shoot pods' clients through our router as the ingress, the server's firewall hook
//! and the pods' rules, and the frames between the pods: IPv6 between the bond addresses with
//! next header 4 around the IPv4 request and its answer, as vpn2's `ip6tnl` devices send them
//! (asserted from captures on the kube-apiserver pod's and the shoot pod's `tap0`: the frames
//! that enter and leave server 0). What stands in, because the kernel lacks the piece: a
//! bridge named `bond0` with one forwarding port for the active-backup bond (the port follows
//! the tap carriers, as the bond's MII monitor does, and announces the pod with unsolicited
//! neighbour advertisements, as the bond's peer notification does); a tun device and raw IPv6
//! sockets for each `ip6tnl` device; test code for the path controller (vpn2's interval,
//! echo retries and hellos) and the tunnel controller (a tunnel and host route per hello
//! sender). The test kills server 0 (`kill -9`): every bond moves to `tap1` and the requests
//! work again through server 1; server 0 back, every bond returns to `tap0`. It prints the gaps
//! (`vpn2 HA model:` lines).

// One scenario read top to bottom.
#![allow(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance::gardener::capture::{Capture, Packet, Transport};
use conformance::gardener::ha::{max_gap, HaLandscape, KAPI, NODE, TCP_ECHO};
use conformance::gardener::ha_pods::{secrets_dir, HaPods};
use conformance::gardener::load::{ms, tcp_request};
use conformance::gardener::pods::Binaries;
use conformance::gardener::vpn2_ha_pods::bond::tunnelled_sent;
use conformance::gardener::vpn2_ha_pods::{
    kapi_bond_address, shoot_bond_address, start_kapi_pod, start_server, start_shoot_pod,
};
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::wait::{wait_until, wait_until_every};

const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--vpn2ha",
    dual_stack_nodes: false,
};
/// How long anything may take to come up (a client's `connect-retry 1 5` included).
const UP: Duration = Duration::from_secs(60);
/// One request's bound.
const REQUEST: Duration = Duration::from_secs(2);
/// What "within a few seconds" means for the failover to server 1.
const FAILOVER_BOUND: Duration = Duration::from_secs(8);

/// One kube-apiserver → kubelet request: when it started and ended, whether it worked.
#[derive(Debug, Clone, Copy)]
struct Req {
    started: Instant,
    ended: Instant,
    ok: bool,
}

/// Requests from `ns` one after the other, a new one [`conformance::gardener::load::INTERVAL`]
/// after the last began (or at its end if it took longer), until `stop` (at most 3000).
fn requests(ns: &Netns, stop: &AtomicBool, out: &Mutex<Vec<Req>>) {
    let target = SocketAddr::from((NODE, TCP_ECHO));
    for n in 0..3000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let ok = ns
            .run_in(|| tcp_request(target, REQUEST, n))
            .is_ok_and(|r| r.is_ok());
        let ended = Instant::now();
        out.lock()
            .expect("requests")
            .push(Req { started, ended, ok });
        std::thread::sleep(
            (started + conformance::gardener::load::INTERVAL).saturating_duration_since(ended),
        );
    }
}

/// One request now, whether it worked.
fn one_request(ns: &Netns) -> bool {
    ns.run_in(|| tcp_request(SocketAddr::from((NODE, TCP_ECHO)), REQUEST, 0))
        .is_ok_and(|r| r.is_ok())
}

/// The frames with IPv4 in IPv6 the kube-apiserver pod's bond stand-in has sent by `tap0`
/// and `tap1`.
fn tx_packets(ns: &Netns) -> (u64, u64) {
    let sent = |i| tunnelled_sent(ns, i).expect("bond counters");
    (sent(0), sent(1))
}

/// What the requests in `[from, to)` (by start) did: started, failed, and the longest time
/// without a successful answer in that window.
fn figure(reqs: &[Req], from: Instant, to: Instant) -> (usize, usize, Duration) {
    let mine: Vec<&Req> = reqs
        .iter()
        .filter(|r| r.started >= from && r.started < to)
        .collect();
    let answers: Vec<Instant> = reqs.iter().filter(|r| r.ok).map(|r| r.ended).collect();
    (
        mine.len(),
        mine.iter().filter(|r| !r.ok).count(),
        max_gap(&answers, from, to),
    )
}

/// What crossed server 0 in the steady phase, as captured on the kube-apiserver pod's `tap0`
/// (`sent`, into the server) and on vpn-shoot-0's (`received`, out of it): the requests as
/// IPv4 in IPv6 (next header 4) from `…::a:1` to `…::b:0`, the answers back the same way,
/// and no IPv4 frame (what the model sent before its `ip6tnl` stand-in).
fn check_vpn2_frames(sent: &[Packet], received: &[Packet]) {
    let (a, b) = (kapi_bond_address(0), shoot_bond_address(0));
    let tunnelled = |p: &Packet, from, to| {
        p.src == std::net::IpAddr::V6(from)
            && p.dst == std::net::IpAddr::V6(to)
            && p.transport == Transport::Other(4)
    };
    let request = |p: &Packet| {
        tunnelled(p, a, b)
            && p.inner.is_some_and(|i| {
                i.src == KAPI[0]
                    && i.dst == NODE
                    && matches!(i.transport, Transport::Tcp { dst: TCP_ECHO, .. })
            })
    };
    let answer = |p: &Packet| {
        tunnelled(p, b, a)
            && p.inner.is_some_and(|i| {
                i.src == NODE
                    && i.dst == KAPI[0]
                    && matches!(i.transport, Transport::Tcp { src: TCP_ECHO, .. })
            })
    };
    let show = |ps: &[Packet]| {
        ps.iter()
            .take(8)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        sent.iter().any(request),
        "no tunnelled request: {:?}",
        show(sent)
    );
    assert!(
        received.iter().any(request),
        "none reached vpn-shoot-0: {:?}",
        show(received)
    );
    assert!(
        received.iter().any(answer),
        "no tunnelled answer: {:?}",
        show(received)
    );
    assert!(
        sent.iter().any(answer),
        "none reached the kube-apiserver: {:?}",
        show(sent)
    );
    let plain: Vec<&Packet> = sent
        .iter()
        .chain(received)
        .filter(|p| p.src.is_ipv4())
        .collect();
    assert!(plain.is_empty(), "IPv4 frames on the taps: {plain:?}");
    eprintln!(
        "vpn2 HA model: steady | on kube-apiserver tap0 {} tunnelled packets, on vpn-shoot-0 \
         tap0 {}, e.g. {}",
        sent.len(),
        received.len(),
        sent.iter()
            .find(|p| request(p))
            .map(ToString::to_string)
            .unwrap_or_default()
    );
}

#[test]
fn vpn2_ha_model_carries_requests_through_a_server_failure_and_back() {
    require_lab(&["ip", "nft", "sysctl", "bridge", "ping"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some("vpnt-7m")).expect("layout");
    let dir = secrets_dir("vpnt-vpn2ha-").expect("secrets");
    let root = dir.path();
    l.start_echo().expect("echo");
    let _ingress = PODS
        .start_ingress(&bins, &l.ingress, root, UP)
        .expect("router listening");
    let mut servers: Vec<_> = (0..2)
        .map(|i| start_server(&l.server[i], &PODS, &bins, root, i).expect("vpn2 server"))
        .collect();
    for (i, s) in servers.iter().enumerate() {
        let config = std::fs::read_to_string(s.dir().join("openvpn.conf")).expect("config");
        for line in [
            "dev tap0",
            "client-to-client",
            "duplicate-cn",
            &format!("server-ipv6 fd8f:6d53:b97a:1::10{i}:0/112"),
        ] {
            assert!(config.lines().any(|l| l == line), "{line}: {config}");
        }
    }
    let begun = Instant::now();
    let kapi = start_kapi_pod(&l.kapi[0], &PODS, &bins, root, 0, 2).expect("kube-apiserver pod");
    let shoots: Vec<_> = (0..2)
        .map(|j| start_shoot_pod(&l.shoot[j], &PODS, &bins, root, j).expect("shoot pod"))
        .collect();
    let bonds = || {
        std::iter::once(("kube-apiserver", &kapi.bond)).chain([
            ("vpn-shoot-0", &shoots[0].bond),
            ("vpn-shoot-1", &shoots[1].bond),
        ])
    };
    for (what, bond) in bonds() {
        bond.wait_active(0, begun, UP)
            .unwrap_or_else(|| panic!("{what}: bond on tap0: {:?}", bond.changes()));
    }
    wait_until("the path controller's routes", UP, || {
        kapi.path.current().is_some()
    });
    let route = l.kapi[0]
        .run(["ip", "route", "show", "10.250.0.0/16"])
        .expect("ip route")
        .stdout;
    assert_eq!(
        String::from_utf8_lossy(&route).trim(),
        "10.250.0.0/16 dev bond0-ip6tnl0 scope link"
    );
    wait_until_every(
        "a request through the model",
        UP,
        Duration::from_millis(200),
        || one_request(&l.kapi[0]),
    );
    // The tunnel controllers made the way back from the path controller's hellos.
    for (j, shoot) in shoots.iter().enumerate() {
        let made = shoot.tunnel.made();
        assert!(
            made.iter().any(|m| m.remote == kapi_bond_address(0)
                && m.pod_ip == KAPI[0].to_string()
                && m.device == "bond0ip6tnl0001"),
            "vpn-shoot-{j}: {made:?}"
        );
        let back = l.shoot[j]
            .run(["ip", "route", "show", &KAPI[0].to_string()])
            .expect("ip route")
            .stdout;
        assert_eq!(
            String::from_utf8_lossy(&back).trim(),
            format!("{} dev bond0ip6tnl0001 scope link", KAPI[0])
        );
    }
    eprintln!(
        "vpn2 HA model: up {} after the pods started ({} and {} on bond0)",
        ms(begun.elapsed()),
        kapi_bond_address(0),
        shoot_bond_address(0)
    );

    let stop = AtomicBool::new(false);
    let reqs = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| requests(&l.kapi[0], &stop, &reqs));
        let snapshot = || reqs.lock().expect("requests").clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // 1. Through server 0: tap0 carries, tap1 sends nothing; the frames are vpn2's.
            let filter = "ip or ip6 proto 4";
            let to_server = Capture::start(&l.kapi[0], "tap0", filter).expect("capture");
            let from_server = Capture::start(&l.shoot[0], "tap0", filter).expect("capture");
            let t0 = Instant::now();
            let tx = tx_packets(&l.kapi[0]);
            std::thread::sleep(Duration::from_secs(3));
            let tx_after = tx_packets(&l.kapi[0]);
            check_vpn2_frames(
                &to_server.finish().expect("capture"),
                &from_server.finish().expect("capture"),
            );
            let (started, failed, gap) = figure(&snapshot(), t0, Instant::now());
            eprintln!(
                "vpn2 HA model: steady | {started} started, {failed} failed, longest gap {} | \
                 kube-apiserver tunnelled frames by tap0 {}, by tap1 {}",
                ms(gap),
                tx_after.0 - tx.0,
                tx_after.1 - tx.1
            );
            assert!(
                started >= 10 && failed == 0,
                "{started} started, {failed} failed"
            );
            assert!(tx_after.0 - tx.0 >= started as u64, "{tx:?} {tx_after:?}");
            assert_eq!(tx_after.1, tx.1, "the inactive tap sent");

            // 2. Server 0 killed: every bond to tap1, requests through server 1.
            let killed = Instant::now();
            let pid = servers[0].pid().to_string();
            std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .expect("kill");
            let moved: Vec<Duration> = bonds()
                .map(|(what, bond)| {
                    bond.wait_active(1, killed, FAILOVER_BOUND)
                        .unwrap_or_else(|| panic!("{what}: no failover: {:?}", bond.changes()))
                        - killed
                })
                .collect();
            wait_until("a request through server 1", FAILOVER_BOUND, || {
                snapshot().iter().any(|r| r.ok && r.started > killed)
            });
            let first = snapshot()
                .iter()
                .find(|r| r.ok && r.started > killed)
                .map(|r| r.ended)
                .expect("a request after the kill");
            std::thread::sleep(Duration::from_secs(2));
            let tx = tx_packets(&l.kapi[0]);
            std::thread::sleep(Duration::from_secs(2));
            let end = Instant::now();
            let tx_after = tx_packets(&l.kapi[0]);
            let (started, failed, gap) = figure(&snapshot(), killed, end);
            eprintln!(
                "vpn2 HA model: server 0 killed | bonds on tap1 after {} (kube-apiserver, \
                 vpn-shoot-0, vpn-shoot-1) | first answer {} after | {started} started, \
                 {failed} failed, longest gap {}",
                moved.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", "),
                ms(first - killed),
                ms(gap)
            );
            assert!(gap < FAILOVER_BOUND, "gap {gap:?}");
            assert!(tx_after.1 > tx.1, "tap1 carries: {tx:?} {tx_after:?}");
            assert_eq!(tx_after.0, tx.0, "tap0 sent without a server");
            let quiet = figure(&snapshot(), first + Duration::from_millis(1), end);
            assert_eq!(
                quiet.1, 0,
                "failures after the first answer through server 1"
            );

            // 3. Server 0 back: every bond to tap0 again.
            let back = Instant::now();
            servers[0] = start_server(&l.server[0], &PODS, &bins, root, 0).expect("server 0");
            let returned: Vec<Instant> = bonds()
                .map(|(what, bond)| {
                    bond.wait_active(0, back, UP)
                        .unwrap_or_else(|| panic!("{what}: not back: {:?}", bond.changes()))
                })
                .collect();
            let all_back = returned.iter().max().copied().expect("three bonds");
            wait_until("a request through server 0 again", FAILOVER_BOUND, || {
                snapshot().iter().any(|r| r.ok && r.started > all_back)
            });
            std::thread::sleep(Duration::from_secs(2));
            let tx = tx_packets(&l.kapi[0]);
            std::thread::sleep(Duration::from_secs(2));
            let end = Instant::now();
            let tx_after = tx_packets(&l.kapi[0]);
            let (started, failed, gap) = figure(&snapshot(), back, end);
            eprintln!(
                "vpn2 HA model: server 0 back | bonds on tap0 after {} (kube-apiserver, \
                 vpn-shoot-0, vpn-shoot-1) | {started} started, {failed} failed, longest gap {}",
                returned
                    .iter()
                    .map(|t| ms(*t - back))
                    .collect::<Vec<_>>()
                    .join(", "),
                ms(gap)
            );
            assert!(tx_after.0 > tx.0, "tap0 carries again: {tx:?} {tx_after:?}");
            assert_eq!(tx_after.1, tx.1, "the inactive tap sent");
            eprintln!(
                "vpn2 HA model: path controller moves {:?}",
                kapi.path
                    .moves()
                    .iter()
                    .map(|(t, j)| format!(
                        "{} -> shoot {j}",
                        ms(t.saturating_duration_since(begun))
                    ))
                    .collect::<Vec<_>>()
            );
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = result {
            eprintln!("kube-apiserver client 0:\n{}", kapi.clients[0].log());
            eprintln!("server 1:\n{}", servers[1].log());
            std::panic::resume_unwind(panic);
        }
    });
}
