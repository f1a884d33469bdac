//! Our HA servers carrying vpn2's HA pods at layer 2 (issue 30, the research note's option
//! (a), step 1): the roll after the `vpn-server` image override, replayed on the model of
//! vpn2's pods (`conformance::gardener::vpn2_ha_pods`):
//!
//! ```text
//!  kapi-0 10.1.1.20: tap0 ─┐ bond0 (bridge)  …::a:1 ── path controller, routes via inet6 …::b:j
//!                    tap1 ─┘
//!  vpn-seed-server-0: vpn2's (OpenVPN, dev tap0), then ours ── tap0 of every pod
//!  vpn-seed-server-1: vpn2's, then ours                      ── tap1 of every pod
//!  vpn-shoot-0/1: tap0, tap1 ── bond0 …::b:0 / …::b:1 ── forward, masquerade ── node 10.250.0.5
//! ```
//!
//! What is real: upstream OpenVPN 2.6 as the six clients with the configs vpn2 renders in HA
//! (`dev tap<i>`, no `persist-tun`, vpn2's PKI layout and CNs), at first also as both servers
//! (vpn2's server config); the shoot pods' clients through our router as the ingress; our
//! server binary with the environment Gardener gives `vpn-seed-server-<i>` (`IS_HA=true`), and
//! its readiness probe. What stands in, as `vpn2_ha_model` describes: a bridge named `bond0`
//! with one forwarding port for each active-backup bond; an IPv4 route with an IPv6 next hop
//! on `bond0` for each `ip6tnl` tunnel (the frames carry the IPv4 packet without the tunnel's
//! 40-byte IPv6 header); a static return route in each shoot pod for the tunnel controller;
//! test code for the path controller.
//!
//! The steps: vpn2's layout carries; `vpn-seed-server-1` replaced by ours (its tap clients
//! connect and get vpn2's push, `ifconfig-ipv6` of the server's /112 included, and it turns
//! Ready on them); `vpn-seed-server-0` replaced by ours (every bond to `tap1`, through our
//! server 1, then back to `tap0`, our server 0); our server 0 killed (`kill -9`): through our
//! server 1; server 0 back; then our kube-apiserver pod beside vpn2's, with no shoot pod of
//! ours: a datagram of it reaches a vpn2 shoot pod through the servers' gateway (IPv4 inside
//! IPv6 from its vpn2 identity, read by a raw socket for protocol 4 standing in for `ip6tnl`)
//! and the pod's answer, sent back the same way, reaches it; last, vpn2's shoot pod 1
//! replaced by ours: vpn2's kube-apiserver pod's hello and datagram to `…::b:1` (a raw
//! socket again) reach our shoot pod through the gateway, and the node's echo comes back
//! inside IPv6 from `…::b:1`. A kube-apiserver → kubelet
//! request (a new TCP connection, a line echoed) runs every 100 ms through the first three
//! steps; the test prints per step the requests started, failed and the longest time without
//! an answer (`ha layer 2:` lines). Before this change
//! our HA server closed vpn2's tap clients (DEVIATIONS W4): `tap1` never came up at our
//! server 1, which never turned Ready, and the test fails there.

// One scenario read top to bottom.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance::gardener::ha::{clear_pod, max_gap, HaLandscape, KAPI, NODE, TCP_ECHO, UDP_ECHO};
use conformance::gardener::ha_pods::{secrets_dir, status_path, HaPods};
use conformance::gardener::load::{ms, tcp_request, INTERVAL};
use conformance::gardener::pods::{Binaries, Container};
use conformance::gardener::vpn2_ha_pods::bond::{tunnelled_sent, Bond};
use conformance::gardener::vpn2_ha_pods::{
    kapi_bond_address, shoot_bond_address, start_kapi_pod, start_server, start_shoot_pod,
};
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::upstream::UpstreamOpenvpn;
use conformance::wait::{wait_until, wait_until_every};

const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--halayer2",
    dual_stack_nodes: false,
};
/// How long anything may take to come up (a client's `connect-retry 1 5` included).
const UP: Duration = Duration::from_secs(60);
/// One request's bound.
const REQUEST: Duration = Duration::from_secs(2);
/// What "within a few seconds" means for a failover to the other server.
const FAILOVER_BOUND: Duration = Duration::from_secs(8);
/// How long a new server pod is given to turn Ready (its status file is written every 15 s).
const READY_BOUND: Duration = Duration::from_secs(40);
/// vpn2's server `i`'s `server-ipv6`, as its clients see it: the /112 and the server's
/// address.
fn server_ipv6(i: usize) -> (String, String) {
    (
        format!("fd8f:6d53:b97a:1::10{i}:"),
        format!("fd8f:6d53:b97a:1::10{i}:1"),
    )
}

/// One kube-apiserver → kubelet request: when it started and ended, whether it worked.
#[derive(Debug, Clone, Copy)]
struct Req {
    started: Instant,
    ended: Instant,
    ok: bool,
}

/// Requests from `ns` one after the other, a new one [`INTERVAL`] after the last began (or
/// at its end if it took longer), until `stop` (at most 4000).
fn requests(ns: &Netns, stop: &AtomicBool, out: &Mutex<Vec<Req>>) {
    let target = SocketAddr::from((NODE, TCP_ECHO));
    for n in 0..4000 {
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
        std::thread::sleep((started + INTERVAL).saturating_duration_since(ended));
    }
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

/// The tunnelled frames (IPv4 in IPv6) the kube-apiserver pod's bond stand-in has sent by
/// `tap0` and `tap1`.
fn tx_packets(ns: &Netns) -> (u64, u64) {
    let sent = |i| tunnelled_sent(ns, i).expect("bond counters");
    (sent(0), sent(1))
}

/// `vpn-server readiness` of server `i` (the kubelet's exec probe), its output.
fn readiness(l: &HaLandscape, bins: &Binaries, root: &Path, i: usize) -> (bool, String) {
    let out = l.server[i]
        .command(&bins.server.display().to_string())
        .arg("readiness")
        .env_clear()
        .env("OPENVPN_STATUS_PATH", status_path(root, i))
        .env("IS_HA", "true")
        .env("POD_NAME", format!("vpn-seed-server-{i}"))
        .env("HA_VPN_CLIENTS", "2")
        .output()
        .expect("vpn-server readiness");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// The options of the last `PUSH_REPLY` an upstream client logged (verb 3), in order.
fn last_push(log: &str) -> Option<Vec<String>> {
    let line = log.lines().rev().find(|l| l.contains("'PUSH_REPLY,"))?;
    let reply = line.split("'PUSH_REPLY,").nth(1)?.split('\'').next()?;
    Some(reply.split(',').map(str::to_owned).collect())
}

/// A push without what differs per connection (`peer-id`, the leased address) and without
/// the keepalive (ours pushes its HA values, DEVIATIONS H9): what must equal vpn2's.
fn comparable(push: &[String]) -> Vec<String> {
    let mut out: Vec<String> = push
        .iter()
        .filter(|o| !o.starts_with("peer-id ") && !o.starts_with("ping"))
        .map(|o| match o.strip_prefix("ifconfig-ipv6 ") {
            Some(args) => {
                let (local, server) = args.split_once(' ').unwrap_or((args, ""));
                let len = local.rsplit('/').next().unwrap_or_default();
                format!("ifconfig-ipv6 <lease>/{len} {server}")
            }
            None => o.clone(),
        })
        .collect();
    out.sort();
    out
}

/// Kills `pid` in `ns`'s sight with SIGKILL.
fn kill9(pid: u32) {
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
}

#[test]
fn our_ha_servers_carry_vpn2s_tap_clients() {
    require_lab(&["ip", "nft", "sysctl", "bridge", "ping"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some("vpnt-7g")).expect("layout");
    let dir = secrets_dir("vpnt-halayer2-").expect("secrets");
    let root = dir.path();
    l.start_echo().expect("echo");
    let _ingress = PODS
        .start_ingress(&bins, &l.ingress, root, UP)
        .expect("router listening");
    let mut vpn2_servers: Vec<_> = (0..2)
        .map(|i| Some(start_server(&l.server[i], &PODS, &bins, root, i).expect("vpn2 server")))
        .collect();
    let begun = Instant::now();
    let kapi = start_kapi_pod(&l.kapi[0], &PODS, &bins, root, 0, 2).expect("kube-apiserver pod");
    let shoots: Vec<_> = (0..2)
        .map(|j| start_shoot_pod(&l.shoot[j], &PODS, &bins, root, j).expect("shoot pod"))
        .collect();
    let bonds = || -> [(&str, &Bond); 3] {
        [
            ("kube-apiserver", &kapi.bond),
            ("vpn-shoot-0", &shoots[0].bond),
            ("vpn-shoot-1", &shoots[1].bond),
        ]
    };
    for (what, bond) in bonds() {
        bond.wait_active(0, begun, UP)
            .unwrap_or_else(|| panic!("{what}: bond on tap0: {:?}", bond.changes()));
    }
    wait_until("the path controller's routes", UP, || {
        kapi.path.current().is_some()
    });
    wait_until_every(
        "a request through vpn2's servers",
        UP,
        Duration::from_millis(200),
        || {
            l.kapi[0]
                .run_in(|| tcp_request(SocketAddr::from((NODE, TCP_ECHO)), REQUEST, 0))
                .is_ok_and(|r| r.is_ok())
        },
    );
    // What vpn2's server 1 pushed the kube-apiserver's tap1 client: the referee.
    wait_until("vpn2's push in the client's log", UP, || {
        last_push(&kapi.clients[1].log()).is_some()
    });
    let vpn2_push = last_push(&kapi.clients[1].log()).expect("vpn2's push");
    eprintln!("ha layer 2: vpn2's server 1 pushed {}", vpn2_push.join(","));

    let stop = AtomicBool::new(false);
    let reqs = Mutex::new(Vec::new());
    let mut ours: Vec<Option<Container<'_>>> = vec![None, None];
    std::thread::scope(|s| {
        s.spawn(|| requests(&l.kapi[0], &stop, &reqs));
        let snapshot = || reqs.lock().expect("requests").clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // 1. vpn-seed-server-1 replaced by ours: the pods' tap1 clients connect to it and
            // get vpn2's push; it turns Ready on them (a layer-2 pair).
            let t1 = Instant::now();
            vpn2_servers[1] = None;
            let _ = std::fs::remove_file(status_path(root, 1));
            ours[1] = Some(
                PODS.start_server(&bins, &l.server[1], root, 1, UP)
                    .expect("our server 1"),
            );
            let pushed =
                || last_push(&kapi.clients[1].log()).filter(|p| p.iter().any(|o| o == "ping 1"));
            wait_until("our server 1's push to the tap1 client", UP, || {
                pushed().is_some()
            });
            let our_push = pushed().expect("our push");
            eprintln!("ha layer 2: our server 1 pushed {}", our_push.join(","));
            assert_eq!(comparable(&our_push), comparable(&vpn2_push));
            let (prefix, server) = server_ipv6(1);
            let lease = our_push
                .iter()
                .find_map(|o| o.strip_prefix("ifconfig-ipv6 "))
                .expect("ifconfig-ipv6 pushed");
            assert!(
                lease.starts_with(&prefix) && lease.ends_with(&format!("/112 {server}")),
                "{lease}"
            );
            // The client put it on tap1, as from vpn2's server.
            let local = lease.split(' ').next().expect("local address");
            let addrs = l.kapi[0]
                .run(["ip", "-6", "addr", "show", "dev", "tap1"])
                .expect("ip addr")
                .stdout;
            assert!(
                String::from_utf8_lossy(&addrs).contains(local),
                "{local} on tap1: {}",
                String::from_utf8_lossy(&addrs)
            );
            let mut why = String::new();
            let ready = wait_until_every_for(READY_BOUND, || {
                let (ok, out) = readiness(&l, &bins, root, 1);
                why = out;
                ok
            });
            let ready_after = ready.unwrap_or_else(|| panic!("our server 1 not Ready: {why}"));
            let t2 = Instant::now();
            let (started, failed, gap) = figure(&snapshot(), t1, t2);
            eprintln!(
                "ha layer 2: vpn-seed-server-1 -> ours | Ready after {} | {started} started, \
                 {failed} failed, longest gap {}",
                ms(ready_after),
                ms(gap)
            );
            assert_eq!(failed, 0, "server 0 (vpn2's) carries meanwhile");

            // 2. vpn-seed-server-0 replaced by ours: every bond to tap1 (our server 1), then
            // back to tap0 (our server 0).
            // Stopped as a pod is deleted (SIGTERM): its clients see their connections end.
            let killed = Instant::now();
            vpn2_servers[0] = None;
            let moved: Vec<Duration> = bonds()
                .iter()
                .map(|(what, bond)| {
                    bond.wait_active(1, killed, FAILOVER_BOUND)
                        .unwrap_or_else(|| panic!("{what}: no failover: {:?}", bond.changes()))
                        - killed
                })
                .collect();
            wait_until("a request through our server 1", FAILOVER_BOUND, || {
                snapshot().iter().any(|r| r.ok && r.started > killed)
            });
            let first = snapshot()
                .iter()
                .find(|r| r.ok && r.started > killed)
                .map(|r| r.ended)
                .expect("a request after the kill");
            std::thread::sleep(Duration::from_secs(2));
            let tx = tx_packets(&l.kapi[0]);
            std::thread::sleep(Duration::from_secs(1));
            let tx_after = tx_packets(&l.kapi[0]);
            assert!(tx_after.1 > tx.1, "tap1 carries: {tx:?} {tx_after:?}");
            assert_eq!(tx_after.0, tx.0, "tap0 sent without a server");
            let (started, failed, gap) = figure(&snapshot(), killed, Instant::now());
            eprintln!(
                "ha layer 2: vpn2's server 0 gone | bonds on tap1 (our server 1) after {} | \
                 first answer {} after | {started} started, {failed} failed, longest gap {}",
                moved.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", "),
                ms(first - killed),
                ms(gap)
            );
            assert!(gap < FAILOVER_BOUND, "gap {gap:?}");
            let back = Instant::now();
            let _ = std::fs::remove_file(status_path(root, 0));
            ours[0] = Some(
                PODS.start_server(&bins, &l.server[0], root, 0, UP)
                    .expect("our server 0"),
            );
            let all_back = back_on_tap0(&bonds(), back);
            wait_until("a request through our server 0", FAILOVER_BOUND, || {
                snapshot().iter().any(|r| r.ok && r.started > all_back.0)
            });
            std::thread::sleep(Duration::from_secs(2));
            let tx = tx_packets(&l.kapi[0]);
            std::thread::sleep(Duration::from_secs(1));
            let tx_after = tx_packets(&l.kapi[0]);
            assert!(tx_after.0 > tx.0, "tap0 carries again: {tx:?} {tx_after:?}");
            let (started, failed, gap) = figure(&snapshot(), back, Instant::now());
            eprintln!(
                "ha layer 2: vpn-seed-server-0 -> ours | bonds on tap0 after {} | {started} \
                 started, {failed} failed, longest gap {}",
                all_back.1,
                ms(gap)
            );
            let ready = wait_until_every_for(READY_BOUND, || readiness(&l, &bins, root, 0).0);
            assert!(ready.is_some(), "our server 0 not Ready");

            // 3. Our server 0 killed: through our server 1; then back.
            let steady = Instant::now();
            std::thread::sleep(Duration::from_secs(3));
            let (started, failed, gap) = figure(&snapshot(), steady, Instant::now());
            eprintln!(
                "ha layer 2: ours at rest | {started} started, {failed} failed, longest gap {}",
                ms(gap)
            );
            assert!(
                started >= 10 && failed == 0,
                "{started} started, {failed} failed"
            );
            let killed = Instant::now();
            kill9(ours[0].as_ref().expect("our server 0").pid());
            let moved: Vec<Duration> = bonds()
                .iter()
                .map(|(what, bond)| {
                    bond.wait_active(1, killed, FAILOVER_BOUND)
                        .unwrap_or_else(|| panic!("{what}: no failover: {:?}", bond.changes()))
                        - killed
                })
                .collect();
            wait_until("a request through our server 1", FAILOVER_BOUND, || {
                snapshot().iter().any(|r| r.ok && r.started > killed)
            });
            let first = snapshot()
                .iter()
                .find(|r| r.ok && r.started > killed)
                .map(|r| r.ended)
                .expect("a request after the kill");
            std::thread::sleep(Duration::from_secs(2));
            let end = Instant::now();
            let (started, failed, gap) = figure(&snapshot(), killed, end);
            eprintln!(
                "ha layer 2: our server 0 killed | bonds on tap1 after {} | first answer {} \
                 after | {started} started, {failed} failed, longest gap {}",
                moved.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", "),
                ms(first - killed),
                ms(gap)
            );
            assert!(gap < FAILOVER_BOUND, "gap {gap:?}");
            let quiet = figure(&snapshot(), first + Duration::from_millis(1), end);
            assert_eq!(
                quiet.1, 0,
                "failures after the first answer through server 1"
            );
            let back = Instant::now();
            ours[0] = None;
            ours[0] = Some(
                PODS.start_server(&bins, &l.server[0], root, 0, UP)
                    .expect("our server 0 again"),
            );
            let all_back = back_on_tap0(&bonds(), back);
            wait_until(
                "a request through our server 0 again",
                FAILOVER_BOUND,
                || snapshot().iter().any(|r| r.ok && r.started > all_back.0),
            );
            std::thread::sleep(Duration::from_secs(2));
            let (started, failed, gap) = figure(&snapshot(), back, Instant::now());
            eprintln!(
                "ha layer 2: our server 0 back | bonds on tap0 after {} | {started} started, \
                 {failed} failed, longest gap {}",
                all_back.1,
                ms(gap)
            );

            // 4. Our kube-apiserver pod beside vpn2's: through the gateway.
            eprintln!("ha layer 2: {}", through_the_gateway(&l, &bins, root));
            // 5. vpn2's shoot pod 1 replaced by ours: vpn2's kube-apiserver reaches it through
            // the gateway.
            eprintln!(
                "ha layer 2: {}",
                to_our_shoot_pod(&l, &bins, root, &shoots[1].clients)
            );
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = result {
            eprintln!("kube-apiserver client 1:\n{}", kapi.clients[1].log());
            for (i, s) in ours.iter().enumerate() {
                if let Some(s) = s {
                    eprintln!("our server {i}:\n{}", s.log());
                }
            }
            std::panic::resume_unwind(panic);
        }
    });
}

/// vpn2's shoot pod 1 replaced by ours (its clients stopped, its namespace cleared, ours
/// started: `tun0`/`tun1`): vpn2's kube-apiserver pod (replica 0, bond address `…::a:1`)
/// says hello to `[…::b:1]:5400` with its pod IP, as its path controller does, and sends a
/// UDP datagram to the node's echo inside IPv6 to `…::b:1` (a raw socket for protocol 4
/// standing in for its `ip6tnl`); the servers' gateway hands it to our shoot pod, and the
/// node's echo comes back inside IPv6 from `…::b:1`. What it saw.
fn to_our_shoot_pod(
    l: &HaLandscape,
    bins: &Binaries,
    root: &Path,
    vpn2_clients: &[UpstreamOpenvpn<'_>],
) -> String {
    use rustix::net::{
        bind, ipproto, recvfrom, sendto, socket, sockopt, AddressFamily, RecvFlags, SendFlags,
        SocketType,
    };
    let ns = &l.shoot[1];
    for c in vpn2_clients {
        ns.stop(c.pid());
    }
    clear_pod(ns).expect("a new pod's namespace");
    PODS.shoot_init_spec(bins, 1)
        .run(ns, root)
        .expect("vpn-shoot-init");
    let ours: Vec<Container<'_>> = (0..2)
        .map(|i| {
            PODS.shoot_client_spec(bins, root, 1, i)
                .start(ns, root)
                .expect("our vpn-shoot")
        })
        .collect();
    ours[0]
        .wait_log("tunnel up", UP)
        .expect("our shoot pod's tunnel to server 0");
    let started = Instant::now();
    let (pod, a1, b1) = (KAPI[0], kapi_bond_address(0), shoot_bond_address(1));
    let echoed = l.kapi[0]
        .run_in(move || -> std::io::Result<Vec<u8>> {
            let hello = std::net::UdpSocket::bind((a1, 0))?;
            let fd = socket(AddressFamily::INET6, SocketType::RAW, Some(ipproto::IPIP))?;
            bind(&fd, &SocketAddrV6::new(a1, 0, 0, 0))?;
            sockopt::set_socket_timeout(
                &fd,
                sockopt::Timeout::Recv,
                Some(Duration::from_millis(200)),
            )?;
            let datagram = ipv4_udp(pod, NODE, 40001, UDP_ECHO, b"through the gateway");
            let mut buf = [0u8; 2048];
            for _ in 0..100 {
                hello.send_to(
                    pod.to_string().as_bytes(),
                    (b1, vpn_server::gateway::HELLO_PORT),
                )?;
                sendto(
                    &fd,
                    &datagram,
                    SendFlags::empty(),
                    &SocketAddrV6::new(b1, 0, 0, 0),
                )?;
                if let Ok((n, _, Some(from))) = recvfrom(&fd, &mut buf[..], RecvFlags::empty()) {
                    if SocketAddr::try_from(from).map(|a| a.ip()) == Ok(IpAddr::V6(b1)) {
                        return Ok(buf[..n].to_vec());
                    }
                }
            }
            Err(std::io::Error::other("no echo within 20 s"))
        })
        .expect("in vpn2's kube-apiserver pod")
        .expect("the node's echo inside IPv6 from …::b:1");
    // The node's echo to the pod IP, as our shoot pod sent it back (un-NATed).
    assert_eq!(&echoed[12..16], &NODE.octets(), "{echoed:02x?}");
    assert_eq!(&echoed[16..20], &pod.octets());
    assert!(echoed.ends_with(b"through the gateway"), "{echoed:02x?}");
    format!(
        "vpn2's kube-apiserver to our shoot pod 1: its datagram inside IPv6 to {b1} echoed by \
         the node through our shoot pod and back inside IPv6 from {b1}, {} after our pod's \
         tunnel was up",
        ms(started.elapsed())
    )
}

/// vpn2's `VPN_NETWORK`.
fn vpn_network() -> ipnet::Ipv6Net {
    "fd8f:6d53:b97a:1::/96".parse().expect("net")
}

/// Our kube-apiserver pod (replica 1, `tun0`/`tun1`) beside vpn2's, both servers ours, no
/// shoot pod of ours: a UDP datagram from it to the node reaches one of vpn2's shoot pods
/// through the server's gateway as vpn2's `ip6tnl` would receive it (IPv4 inside IPv6 from
/// the kube-apiserver's vpn2 identity to the pod's bond address, read by a raw socket for
/// protocol 4 in the shoot pod: the stand-in for the tunnel device this kernel lacks), and a
/// reply the shoot pod sends the same way reaches the kube-apiserver's socket. What it saw.
fn through_the_gateway(l: &HaLandscape, bins: &Binaries, root: &Path) -> String {
    PODS.kapi_init_spec(bins, 1)
        .run(&l.kapi[1], root)
        .expect("vpn-client-init");
    let clients: Vec<Container<'_>> = (0..2)
        .map(|i| {
            PODS.seed_client_spec(bins, root, 1, i)
                .start(&l.kapi[1], root)
                .expect("our vpn-client")
        })
        .collect();
    clients[0]
        .wait_log("tunnel up", UP)
        .expect("our kube-apiserver's tunnel to server 0");
    let pod = KAPI[1];
    let me = vpn_server::gateway::identity(vpn_network(), IpAddr::V4(pod));
    let arrived = AtomicBool::new(false);
    let started = Instant::now();
    let (seen, reply) = std::thread::scope(|s| {
        let listeners: Vec<_> = (0..2)
            .map(|j| {
                let arrived = &arrived;
                s.spawn(move || {
                    l.shoot[j]
                        .run_in(move || shoot_pod_tunnel(j, me.addr, arrived))
                        .expect("in the shoot pod")
                })
            })
            .collect();
        let reply = l.kapi[1]
            .run_in(|| {
                let socket = std::net::UdpSocket::bind((pod, 40000))?;
                socket.set_read_timeout(Some(Duration::from_millis(200)))?;
                let mut buf = [0u8; 64];
                for _ in 0..100 {
                    socket.send_to(b"to the kubelet", (NODE, 9))?;
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        return Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from));
                    }
                }
                Err(std::io::Error::other("no reply within 20 s"))
            })
            .expect("in our kube-apiserver pod");
        arrived.store(true, Ordering::Relaxed);
        let seen: Vec<_> = listeners
            .into_iter()
            .filter_map(|h| h.join().expect("listener"))
            .collect();
        (seen, reply)
    });
    let (j, inner) = seen.first().cloned().expect("a packet at a shoot pod");
    // The inner packet: our kube-apiserver's datagram to the node, as it left tun0.
    assert_eq!(inner[0] >> 4, 4, "IPv4 inside: {inner:02x?}");
    assert_eq!(&inner[12..16], &pod.octets(), "from the pod IP");
    assert_eq!(&inner[16..20], &NODE.octets());
    assert!(inner.ends_with(b"to the kubelet"), "{inner:02x?}");
    let (text, from) = reply.expect("the shoot pod's reply through the gateway");
    assert_eq!(text, "from the kubelet");
    assert_eq!(from, SocketAddr::from((NODE, 9)));
    format!(
        "our kube-apiserver beside vpn2's: its datagram at vpn2's shoot pod {j} inside IPv6 \
         from {} (its vpn2 identity), the reply back through the gateway, {} after its \
         tunnel was up",
        me.addr,
        ms(started.elapsed())
    )
}

/// In vpn2's shoot pod `j`: the first IPv4 packet inside IPv6 from `identity` to the pod's
/// bond address (the raw socket gets what `ip6tnl` would), answered by a UDP datagram from
/// the node inside IPv6 to `identity`; `None` once `stop` is set (at most 30 s).
fn shoot_pod_tunnel(j: usize, identity: Ipv6Addr, stop: &AtomicBool) -> Option<(usize, Vec<u8>)> {
    use rustix::net::{
        bind, ipproto, recvfrom, sendto, socket, sockopt, AddressFamily, RecvFlags, SendFlags,
        SocketType,
    };
    let bond = shoot_bond_address(j);
    let fd = socket(AddressFamily::INET6, SocketType::RAW, Some(ipproto::IPIP)).ok()?;
    bind(&fd, &SocketAddrV6::new(bond, 0, 0, 0)).ok()?;
    sockopt::set_socket_timeout(
        &fd,
        sockopt::Timeout::Recv,
        Some(Duration::from_millis(200)),
    )
    .ok()?;
    let mut buf = [0u8; 2048];
    let until = Instant::now() + Duration::from_secs(30);
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let Ok((n, _, Some(from))) = recvfrom(&fd, &mut buf[..], RecvFlags::empty()) else {
            continue;
        };
        if SocketAddr::try_from(from).map(|a| a.ip()) != Ok(IpAddr::V6(identity)) {
            continue;
        }
        let inner = buf[..n].to_vec();
        // The node's answer, from port 9 to the datagram's source port.
        let sport = [inner[20], inner[21]];
        let reply = ipv4_udp(
            NODE,
            Ipv4Addr::from(<[u8; 4]>::try_from(&inner[12..16]).ok()?),
            9,
            u16::from_be_bytes(sport),
            b"from the kubelet",
        );
        sendto(
            &fd,
            &reply,
            SendFlags::empty(),
            &SocketAddrV6::new(identity, 0, 0, 0),
        )
        .ok()?;
        return Some((j, inner));
    }
    None
}

/// An IPv4 UDP datagram (header checksum set, UDP checksum 0: none).
fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let total = 28 + payload.len();
    let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let mut sum: u32 = p
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

/// Waits until every bond of `bonds` is on `tap0` again after `since`: when the last one
/// was, and the times as text.
fn back_on_tap0(bonds: &[(&str, &Bond)], since: Instant) -> (Instant, String) {
    let returned: Vec<Instant> = bonds
        .iter()
        .map(|(what, bond)| {
            bond.wait_active(0, since, UP)
                .unwrap_or_else(|| panic!("{what}: not back: {:?}", bond.changes()))
        })
        .collect();
    let text = returned
        .iter()
        .map(|t| ms(*t - since))
        .collect::<Vec<_>>()
        .join(", ");
    (returned.into_iter().max().unwrap_or(since), text)
}

/// Polls `ready` every 500 ms for at most `bound`: how long it took, or `None`.
fn wait_until_every_for(bound: Duration, mut ready: impl FnMut() -> bool) -> Option<Duration> {
    let since = Instant::now();
    loop {
        if ready() {
            return Some(since.elapsed());
        }
        if since.elapsed() >= bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
