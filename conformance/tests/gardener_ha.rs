//! Gardener's HA VPN layout (gardener-pods.md §2.2, 2.3, 2.5; `docs/ha.md`) replayed with our
//! binaries, one lab namespace per pod, each process started with the environment Gardener
//! gives its container, on this machine's kernel (no bonding, no ip6tnl):
//!
//! ```text
//!  SEED (pods 10.1.0.0/16)                                 SHOOT
//!  kapi-0 10.1.1.20  vpn-client-0, vpn-client-1 ─┐      ┌─ vpn-shoot-0 100.96.10.10  s0, s1, tunnel-controller
//!  kapi-1 10.1.2.20  vpn-client-0, vpn-client-1 ─┤      ├─ vpn-shoot-1 100.96.11.10  s0, s1, tunnel-controller
//!  server-0 10.1.3.10  IS_HA, POD_NAME ...-0    ─┼ R ─ SR┤
//!  server-1 10.1.4.10  IS_HA, POD_NAME ...-1    ─┤ (NAT)└─ node 10.250.0.5 (UDP and TCP echo)
//!  ingress 10.1.5.30 + LB 203.0.113.10 (vpn-router)─┘
//! ```
//!
//! Probe streams run from each kube-apiserver replica to the shoot node up to step 6:
//! sequence-numbered UDP at 100/s and a long-lived TCP echo session. The test kills a server
//! (`kill -9`), black-holes the path to a server, kills a shoot pod, restarts a kube-apiserver
//! replica 20 times (alternating its pod IP), kills both servers and then both clients of a
//! replica (a connection started meanwhile waits in a standby device; nothing to the shoot
//! leaves a kube-apiserver pod by `eth0`), takes server 0's shoot connections away while its
//! kube-apiserver tunnels stay (a connection started meanwhile is held by the server and
//! completes the moment a shoot connection is back), and checks readiness on both sides and
//! that the shoot can open nothing into the seed. The figures it prints go into `docs/ha.md`.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use conformance::gardener::capture::Capture;
use conformance::gardener::ha::{
    self as ha, gateway, routes6_via, routes_via, standby_routes_via, HaLandscape, KAPI, NODE,
    NODE_V6, SERVER, SHOOT_NODE_NETWORK, SHOOT_NODE_NETWORK_V6, SHOOT_POD, SHOOT_POD_NETWORKS,
    SHOOT_SERVICE_NETWORKS, TCP_ECHO, UDP_ECHO,
};
use conformance::gardener::ha_pods::{env, status_path, write_secrets, HaPods};
use conformance::gardener::pods::{Binaries, Container, Spec};
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until;
use lab::LabError;

const PODS: HaPods = HaPods {
    shoot_ns: SHOOT_NS,
    dual_stack_nodes: true,
};
const SHOOT_NS: &str = "shoot--lab--ha";
/// The address kube-apiserver replica 0 alternates to on its restarts (a new pod).
const KAPI0_NEW: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 21);
/// How long anything may take to come up.
const UP: Duration = Duration::from_secs(40);
/// How long after a shoot pod's route shows its tunnel up a SYN the HA server held may
/// complete (step 7): the release is immediate, the rest is the route poll and the echo.
/// A dropped SYN waits for the kernel's next retransmission, at least 0.5 s later there.
const HELD_LAG: Duration = Duration::from_millis(300);

/// Replies received by a probe, by arrival time.
#[derive(Default)]
struct Replies {
    at: Mutex<Vec<Instant>>,
    failed: Mutex<Option<String>>,
}

impl Replies {
    /// The longest time without a reply between `from` and `to` (the start of the window
    /// counts as a reply time if one came just before it).
    fn max_gap(&self, from: Instant, to: Instant) -> Duration {
        ha::max_gap(&self.at.lock().expect("probe lock"), from, to)
    }

    fn count_since(&self, from: Instant) -> usize {
        self.at
            .lock()
            .expect("probe lock")
            .iter()
            .filter(|t| **t >= from)
            .count()
    }
}

/// A probe stream from one kube-apiserver replica: UDP at 100/s and a TCP echo session.
struct Probes {
    udp: Arc<Replies>,
    tcp: Arc<Replies>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Probes {
    fn start(ns: &Netns) -> Result<Probes, LabError> {
        let udp_sock = ns
            .run_in(|| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect(SocketAddr::from((NODE, UDP_ECHO)))?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok::<_, std::io::Error>(s)
            })?
            .map_err(|e| LabError::io("udp probe", e))?;
        let udp = Arc::new(Replies::default());
        let tcp = Arc::new(Replies::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let send = udp_sock
            .try_clone()
            .map_err(|e| LabError::io("udp probe", e))?;
        let stop_send = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            let mut seq: u64 = 0;
            // Bounded: at most 20 minutes of 100 packets a second.
            while !stop_send.load(Ordering::Relaxed) && seq < 120_000 {
                let _ = send.send(&seq.to_be_bytes());
                seq += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }));
        let (recv_udp, stop_recv) = (Arc::clone(&udp), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stop_recv.load(Ordering::Relaxed) {
                if let Ok(8) = udp_sock.recv(&mut buf) {
                    recv_udp.at.lock().expect("probe lock").push(Instant::now());
                }
            }
        }));
        // The TCP session: 8 bytes every 20 ms, each echoed before the next goes.
        let stream = ns
            .run_in(|| {
                TcpStream::connect_timeout(
                    &SocketAddr::from((NODE, TCP_ECHO)),
                    Duration::from_secs(10),
                )
            })?
            .map_err(|e| LabError::io("tcp probe", e))?;
        stream.set_read_timeout(Some(Duration::from_secs(120))).ok();
        let (tcp_r, stop_tcp) = (Arc::clone(&tcp), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut s = stream;
            let mut n: u64 = 0;
            while !stop_tcp.load(Ordering::Relaxed) && n < 60_000 {
                let mut back = [0u8; 8];
                let r = s
                    .write_all(&n.to_be_bytes())
                    .and_then(|()| s.read_exact(&mut back));
                match r {
                    Ok(()) if back == n.to_be_bytes() => {
                        tcp_r.at.lock().expect("probe lock").push(Instant::now())
                    }
                    Ok(()) => {
                        *tcp_r.failed.lock().expect("probe lock") =
                            Some(format!("echo {back:?} for {n}"));
                        return;
                    }
                    Err(e) => {
                        eprintln!(
                            "TCP probe failed at {:?}: {e}",
                            std::time::SystemTime::now()
                        );
                        *tcp_r.failed.lock().expect("probe lock") = Some(e.to_string());
                        return;
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
        Ok(Probes {
            udp,
            tcp,
            stop,
            threads,
        })
    }

    fn tcp_alive(&self) -> Result<(), String> {
        match self.tcp.failed.lock().expect("probe lock").clone() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Prints a figure for `docs/ha.md` and keeps it.
fn record(figures: &mut Vec<String>, figure: String) -> String {
    eprintln!("HA figure: {figure}");
    figures.push(figure.clone());
    figure
}

/// Whether a new TCP connection from `ns` to the node's echo port works within `limit`.
fn connects(ns: &Netns, limit: Duration) -> bool {
    connects_to(ns, IpAddr::V4(NODE), limit)
}

/// Whether a new TCP connection from `ns` to `addr`'s echo port works (an echoed byte) within
/// `limit`.
fn connects_to(ns: &Netns, addr: IpAddr, limit: Duration) -> bool {
    ns.run_in(|| {
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(addr, TCP_ECHO), limit).ok()?;
        s.set_read_timeout(Some(limit)).ok()?;
        s.write_all(b"x").ok()?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).ok()
    })
    .ok()
    .flatten()
    .is_some()
}

/// `vpn-server readiness` of server `i` (vpn2's exec probe), as the kubelet runs it.
fn server_ready(bins: &Binaries, root: &Path, ns: &Netns, i: usize) -> (bool, String) {
    let out = ns
        .command(&bins.server.display().to_string())
        .arg("readiness")
        .env_clear()
        .env("OPENVPN_STATUS_PATH", status_path(root, i))
        .env("IS_HA", "true")
        .env("POD_NAME", format!("vpn-seed-server-{i}"))
        .env("HA_VPN_CLIENTS", "2")
        .output()
        .expect("readiness probe");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `GET /readyz` of a shoot pod's tunnel controller, as the kubelet sends it (to the pod IP).
fn shoot_readyz(ns: &Netns, pod: usize) -> Option<u16> {
    ns.run_in(|| {
        let mut s = TcpStream::connect_timeout(
            &SocketAddr::from((SHOOT_POD[pod], 8080)),
            Duration::from_secs(1),
        )
        .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    })
    .ok()
    .flatten()
}

#[test]
fn ha_layout_fails_over_on_a_kernel_without_bonding() {
    require_lab(&["ip", "nft", "sysctl"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(None).expect("layout");
    let pki = TestPki::generate().expect("pki");
    let root = tempfile::Builder::new()
        .prefix("vpnt-ha-")
        .tempdir()
        .expect("tempdir");
    // The logs (and with HA_TCPDUMP set, captures of the TCP probes in every pod) stay for a
    // look when the test fails; a pass removes them.
    let root = root.keep();
    eprintln!("logs in {}", root.display());
    let root = root.as_path();
    write_secrets(&pki, root).expect("secrets");
    let logs = root;
    l.start_echo().expect("echo");
    let mut dumps = Vec::new();
    if std::env::var_os("HA_TCPDUMP").is_some() {
        for (name, ns) in [
            ("node", &l.node),
            ("shoot0", &l.shoot[0]),
            ("shoot1", &l.shoot[1]),
            ("kapi0", &l.kapi[0]),
            ("kapi1", &l.kapi[1]),
        ] {
            let file = root.join(format!("{name}.pcap"));
            let pid = ns
                .spawn(ns.command("tcpdump").args([
                    "-ni",
                    "any",
                    "-c",
                    "200000",
                    "-w",
                    &file.display().to_string(),
                    "tcp port 7002",
                ]))
                .expect("lab step");
            dumps.push((ns, pid));
        }
    }

    // Init containers: the kernel settings of each pod.
    PODS.run_inits(&bins, &l, logs).expect("init containers");

    let ingress = PODS
        .start_ingress(&bins, &l.ingress, root, UP)
        .expect("router listening");
    let mut servers: Vec<Container<'_>> = (0..2)
        .map(|i| {
            PODS.start_server(&bins, &l.server[i], root, i, UP)
                .expect("server up")
        })
        .collect();
    for (i, s) in servers.iter().enumerate() {
        assert!(
            s.log().contains("HA mode: no device"),
            "server {i}: {}",
            s.log()
        );
        let links = l.server[i]
            .run(["ip", "-o", "link"])
            .expect("lab step")
            .stdout;
        let links = String::from_utf8_lossy(&links).into_owned();
        assert!(
            !links.contains("tun") && !links.contains("tap") && !links.contains("bond"),
            "{links}"
        );
    }
    let mut shoot_clients = PODS
        .start_shoot_clients(&bins, &l, root)
        .expect("shoot client");
    let controllers: Vec<Container<'_>> = (0..2)
        .map(|p| {
            Spec::new(
                &format!("shoot{p}-tunnel-controller"),
                &bins.client,
                &["tunnel-controller"],
                env(&[("HA_VPN_CLIENTS", "2".into())]),
            )
            .start(&l.shoot[p], logs)
            .expect("tunnel controller")
        })
        .collect();
    // Before any kube-apiserver: the shoot pods' tunnels come up, the servers are not Ready.
    for p in 0..2 {
        wait_until("shoot tunnels up", UP, || {
            routes_via(&l.shoot[p], "tun0").contains("metric 100")
                && routes_via(&l.shoot[p], "tun1").contains("metric 101")
        });
        wait_until("shoot /readyz 200", UP, || {
            shoot_readyz(&l.shoot[p], p) == Some(200)
        });
    }
    // vpn2's HA rule: shoot clients alone do not make a server Ready.
    for i in 0..2 {
        wait_until(
            "the status file lists both shoot clients",
            Duration::from_secs(20),
            || {
                std::fs::read_to_string(status_path(root, i)).is_ok_and(|t| {
                    t.contains("vpn-shoot-client-0") && t.contains("vpn-shoot-client-1")
                })
            },
        );
        let (ready, why) = server_ready(&bins, root, &l.server[i], i);
        assert!(!ready, "server {i} Ready without a kube-apiserver: {why}");
        eprintln!(
            "HA figure: server {i} with the shoot clients only: not Ready ({})",
            why.trim()
        );
    }
    // A route the kernel refuses at first is tried again: the second replica's devices come
    // up with IPv6 off, so its IPv6 routes (and their transfer-network source) are refused
    // until IPv6 is turned on below.
    l.kapi[1]
        .run(["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"])
        .expect("lab step");
    let mut kapi_clients = PODS
        .start_seed_clients(&bins, &l, root)
        .expect("seed client");
    let path_controller = {
        let mut e = PODS.networks();
        e.extend([
            ("POD_IP", KAPI[0].to_string()),
            ("HA_VPN_CLIENTS", "2".into()),
        ]);
        Spec::new(
            "kapi0-path-controller",
            &bins.client,
            &["path-controller"],
            env(&e),
        )
        .start(&l.kapi[0], logs)
        .expect("path controller")
    };
    for (ns, addr) in l.kapi.iter().zip(KAPI) {
        for i in 0..2 {
            let metric = format!("metric {}", 100 + i);
            let src = format!("src {addr}");
            let dev = format!("tun{i}");
            wait_until("kube-apiserver routes", UP, || {
                let routes = routes_via(ns, &dev);
                routes.contains(&metric)
                    && routes.contains(&src)
                    && routes.contains("100.64.0.0/13")
            });
        }
    }
    // The refused IPv6 routes of the second replica: missing, reported, tried again, and in
    // once the devices take IPv6 (the wait below).
    for (i, client) in kapi_clients[1].iter().enumerate() {
        client
            .wait_log("HA routes incomplete: trying the refused ones again", UP)
            .expect("refused routes reported");
        assert!(
            client
                .log()
                .contains("HA route not added dst=fd00:250::/64"),
            "{}",
            client.log()
        );
        let routes = routes6_via(&l.kapi[1], &format!("tun{i}"));
        assert!(!routes.contains("fd00:250::/64"), "tun{i}: {routes}");
    }
    l.kapi[1]
        .run([
            "sysctl",
            "-qw",
            "net.ipv6.conf.default.disable_ipv6=0",
            "net.ipv6.conf.tun0.disable_ipv6=0",
            "net.ipv6.conf.tun1.disable_ipv6=0",
        ])
        .expect("lab step");
    // IPv6 shoot networks from the IPv4 seed: through the transfer network.
    for (ns, addr) in l.kapi.iter().zip(KAPI) {
        let transfer = u32::from(addr);
        let src = format!(
            "src fd8f:6d53:b97a:1::{:x}:{:x}",
            transfer >> 16,
            transfer & 0xffff
        );
        // The second replica's go in at the client's next try.
        wait_until(&format!("IPv6 routes with {src}"), UP, || {
            let routes = routes6_via(ns, "tun0");
            routes.contains("fd00:250::/64") && routes.contains(&src)
        });
        assert!(
            connects_to(ns, IpAddr::V6(NODE_V6), Duration::from_secs(5)),
            "no IPv6 connection from {addr} to the shoot node"
        );
    }
    eprintln!("HA figure: IPv6 shoot node reached from both IPv4 kube-apiserver replicas (transfer-network source)");
    // Its last report names tun0 (server 0 up: the lowest metric).
    path_controller
        .wait_log("carried by this tunnel dev=\"tun0\"", UP)
        .expect("path controller reports tun0");

    // Readiness: vpn2's HA rule, from the status file (written every 15 s).
    for i in 0..2 {
        let waited = wait_until("server Ready", Duration::from_secs(40), || {
            server_ready(&bins, root, &l.server[i], i).0
        });
        eprintln!(
            "server {i} Ready {:.1} s after the clients started (status file every 15 s)",
            waited.as_secs_f64()
        );
    }

    let probes: Vec<Probes> = l
        .kapi
        .iter()
        .map(|ns| Probes::start(ns).expect("probes"))
        .collect();
    wait_until("probe replies", UP, || {
        probes
            .iter()
            .all(|p| p.udp.count_since(Instant::now() - Duration::from_secs(1)) > 50)
    });

    let mut figures: Vec<String> = Vec::new();
    let gaps = |probes: &[Probes], from: Instant, to: Instant| -> (Duration, Duration) {
        let udp = probes
            .iter()
            .map(|p| p.udp.max_gap(from, to))
            .max()
            .unwrap_or_default();
        let tcp = probes
            .iter()
            .map(|p| p.tcp.max_gap(from, to))
            .max()
            .unwrap_or_default();
        (udp, tcp)
    };

    // 1. kill -9 server 0 (which carries all traffic: metric 100).
    let t0 = Instant::now();
    servers[0].signal("KILL").expect("kill server 0");
    for r in 0..2 {
        wait_until(
            "routes of the dead server withdrawn",
            Duration::from_secs(5),
            || !routes_via(&l.kapi[r], "tun0").contains("100.64.0.0/13"),
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let (udp, tcp) = gaps(&probes, t0, Instant::now());
    for p in &probes {
        p.tcp_alive()
            .expect("TCP session survives the server's death");
    }
    let msg = record(
        &mut figures,
        format!(
            "kill -9 server 0: UDP gap {:.0} ms, TCP echo gap {:.0} ms, TCP sessions alive",
            udp.as_secs_f64() * 1e3,
            tcp.as_secs_f64() * 1e3
        ),
    );
    assert!(udp < Duration::from_secs(1), "{}", msg);
    servers[0].restart(logs).expect("server 0 again");
    servers[0]
        .wait_log("Initialization Sequence Completed", UP)
        .expect("server 0 up");
    // Back after the 10 s hold-down.
    let back = Instant::now();
    for r in 0..2 {
        wait_until(
            "server 0 takes its routes back",
            Duration::from_secs(30),
            || routes_via(&l.kapi[r], "tun0").contains("100.64.0.0/13"),
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let (udp, _) = gaps(&probes, back, Instant::now());
    record(&mut figures, format!("server 0 back: routes returned {:.1} s after its restart (10 s hold-down), UDP gap on the move back {:.0} ms", back.elapsed().as_secs_f64(), udp.as_secs_f64() * 1e3));

    // 2. Blackhole server 0 (no RST): every packet to or from it dropped in the seed's router.
    for rule in [
        "add table ip lab-blackhole",
        "add chain ip lab-blackhole forward { type filter hook forward priority -10; }",
        &format!(
            "add rule ip lab-blackhole forward ip daddr {} drop",
            SERVER[0]
        ),
        &format!(
            "add rule ip lab-blackhole forward ip saddr {} drop",
            SERVER[0]
        ),
    ] {
        l.seed_router.run(["nft", rule]).expect("blackhole");
    }
    let t1 = Instant::now();
    for r in 0..2 {
        wait_until(
            "routes of the black-holed server withdrawn",
            Duration::from_secs(15),
            || !routes_via(&l.kapi[r], "tun0").contains("100.64.0.0/13"),
        );
    }
    let seed_moved = t1.elapsed();
    std::thread::sleep(Duration::from_secs(12));
    let (udp, tcp) = gaps(&probes, t1, Instant::now());
    for p in &probes {
        p.tcp_alive().expect("TCP session survives the blackhole");
    }
    let msg = record(&mut figures, format!("blackhole server 0: kube-apiserver routes moved after {:.1} s (ping-restart 5 s), UDP gap {:.1} s, TCP echo gap {:.1} s, TCP sessions alive", seed_moved.as_secs_f64(), udp.as_secs_f64(), tcp.as_secs_f64()));
    assert!(udp < Duration::from_secs(7), "{}", msg);
    l.seed_router
        .run(["nft", "delete table ip lab-blackhole"])
        .expect("lift blackhole");
    for r in 0..2 {
        wait_until(
            "server 0 back after the blackhole",
            Duration::from_secs(60),
            || routes_via(&l.kapi[r], "tun0").contains("100.64.0.0/13"),
        );
    }

    // 3. Kill shoot pod 0 (both its clients): new connections work within 2 s. Connections
    // that went through it die with its NAT state (as in vpn2); the probes' sessions did.
    for p in &probes {
        p.tcp_alive()
            .expect("TCP sessions alive until the shoot pod dies");
    }
    let t2 = Instant::now();
    for c in &shoot_clients[0] {
        c.signal("KILL").expect("kill shoot client");
    }
    let new_conn = wait_until(
        "a new connection after the shoot pod died",
        Duration::from_secs(10),
        || {
            connects(&l.kapi[0], Duration::from_millis(500))
                && connects(&l.kapi[1], Duration::from_millis(500))
        },
    );
    let msg = record(
        &mut figures,
        format!(
            "kill shoot pod 0: new TCP connections from both replicas work {:.0} ms after the kill",
            new_conn.as_secs_f64() * 1e3
        ),
    );
    assert!(new_conn < Duration::from_secs(2), "{}", msg);
    let _ = t2;
    wait_until("shoot pod 0 /readyz fails", Duration::from_secs(5), || {
        shoot_readyz(&l.shoot[0], 0) == Some(503)
    });
    for c in &mut shoot_clients[0] {
        c.restart(logs).expect("shoot client again");
    }
    wait_until("shoot pod 0 back", UP, || {
        shoot_readyz(&l.shoot[0], 0) == Some(200)
    });

    // 4. The shoot opens nothing into the seed, through either server.
    let listener = l.kapi[0]
        .run_in(|| TcpListener::bind(SocketAddr::from((KAPI[0], 9999))))
        .expect("lab step")
        .expect("seed listener");
    listener.set_nonblocking(true).expect("lab step");
    for dev in ["tun0", "tun1"] {
        let reached = l.shoot[1]
            .run_in(|| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .ok()?;
                s.bind_device(Some(dev.as_bytes())).ok()?;
                s.connect_timeout(
                    &SocketAddr::from((KAPI[0], 9999)).into(),
                    Duration::from_secs(2),
                )
                .ok()
            })
            .expect("lab step");
        assert!(
            reached.is_none(),
            "the shoot opened a connection into the seed through {dev}"
        );
    }
    assert!(
        listener.accept().is_err(),
        "a shoot connection reached the kube-apiserver"
    );
    record(
        &mut figures,
        "the shoot's connections into the seed through tun0 and tun1: none got through".into(),
    );

    // 5. Restart kube-apiserver replica 0 twenty times, alternating its pod IP.
    let mut worst = Duration::ZERO;
    for n in 0..20 {
        for c in &kapi_clients[0] {
            c.signal("KILL").expect("kill seed client");
        }
        let addr = if n % 2 == 0 { KAPI0_NEW } else { KAPI[0] };
        l.kapi[0]
            .run(["ip", "addr", "flush", "dev", "eth0"])
            .expect("lab step");
        l.kapi[0]
            .run(["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"])
            .expect("lab step");
        l.kapi[0]
            .run([
                "ip",
                "route",
                "add",
                "default",
                "via",
                &gateway(addr).to_string(),
            ])
            .expect("lab step");
        let start = Instant::now();
        for c in &mut kapi_clients[0] {
            c.restart(logs).expect("seed client again");
        }
        let src = format!("src {addr}");
        wait_until(
            "restarted replica's routes",
            Duration::from_secs(10),
            || {
                routes_via(&l.kapi[0], "tun0").contains(&src)
                    && routes_via(&l.kapi[0], "tun1").contains(&src)
            },
        );
        let up = start.elapsed();
        worst = worst.max(up);
        assert!(
            connects(&l.kapi[0], Duration::from_secs(2)),
            "restart {n}: no connection through the tunnel"
        );
    }
    let msg = record(&mut figures, format!("20 kube-apiserver restarts (pod IP alternating): tunnels up and routed within {:.0} ms at worst, a connection through each time", worst.as_secs_f64() * 1e3));
    assert!(worst < Duration::from_secs(1), "{}", msg);

    // 6. Both servers down, then back: a connection a kube-apiserver starts meanwhile waits in
    // a standby device and completes once a tunnel is back; then both clients of a replica
    // gone as well. In none of these states does a packet addressed to the shoot leave a
    // kube-apiserver pod by its eth0 (the tunnel-only rules; without them, and without the
    // standby routes, such packets followed the pod's default route into the seed).
    // The probe streams end first (nothing below measures them): with both servers down their
    // datagrams (100 a second from each replica, and the TCP sessions' retransmissions) wait
    // in the standby devices, and a restarted server whose kube-apiserver tunnels are back
    // before its shoot connections holds them all for the node's network. They fill that
    // network's limit (256 packets) before the connection below gets its SYN in, and a SYN
    // beyond the limit is answered with ICMP unreachable, which fails the connect at once
    // (seen in one of five runs with the probes still on: server 0 "packets held for its
    // routes sent packets=256"). The same holds for step 7.
    for p in probes {
        p.finish();
    }
    let to_shoot = format!(
        "dst net {SHOOT_SERVICE_NETWORKS} or dst net {SHOOT_POD_NETWORKS} or dst net \
         {SHOOT_NODE_NETWORK} or dst net {SHOOT_NODE_NETWORK_V6}"
    );
    let captures: Vec<Capture<'_>> = l
        .kapi
        .iter()
        .map(|ns| Capture::start(ns, "eth0", &to_shoot).expect("capture on eth0"))
        .collect();
    for s in &servers {
        s.signal("KILL").expect("kill server");
    }
    for ns in &l.kapi {
        wait_until(
            "both tunnels' routes withdrawn",
            Duration::from_secs(5),
            || {
                !routes_via(ns, "tun0").contains(SHOOT_SERVICE_NETWORKS)
                    && !routes_via(ns, "tun1").contains(SHOOT_SERVICE_NETWORKS)
            },
        );
        let standby = standby_routes_via(ns, "tun0");
        assert!(
            standby.contains(SHOOT_SERVICE_NETWORKS) && standby.contains("metric 1000"),
            "the standby routes stay while the tunnel is down: {standby}"
        );
    }
    let (waited, tunnels_back) = std::thread::scope(|scope| {
        let start = Instant::now();
        let replica = &l.kapi[1];
        let waiting = scope.spawn(move || {
            let ok = connects(replica, Duration::from_secs(30));
            (ok, start.elapsed())
        });
        std::thread::sleep(Duration::from_secs(2));
        for s in &mut servers {
            s.restart(logs).expect("server again");
        }
        // When each of replica 1's tunnels carries traffic again, from the connection's start.
        let mut carries: [Option<Duration>; 2] = [None, None];
        wait_until("both tunnels of replica 1 back", UP, || {
            for (i, at) in carries.iter_mut().enumerate() {
                if at.is_none()
                    && routes_via(&l.kapi[1], &format!("tun{i}")).contains(SHOOT_SERVICE_NETWORKS)
                {
                    *at = Some(start.elapsed());
                }
            }
            carries.iter().all(Option::is_some)
        });
        let (ok, waited) = waiting.join().expect("connecting thread");
        assert!(
            ok,
            "a connection started with both servers down completes once one is back"
        );
        let [tun0, tun1] = carries.map(|at| at.unwrap_or_default());
        (waited, (tun0, tun1))
    });
    let back = tunnels_back.0.min(tunnels_back.1);
    // Only its completion after the return is asserted: a tunnel carrying again on the
    // kube-apiserver's side is not yet the whole path (the shoot pods reconnect to the servers
    // on their own back-off), so the SYN that leaves the standby device can wait for a shoot
    // connection (the HA server holds it meanwhile, step 7: seen 0.15 s and 1.0 s after `back`
    // before it held; then within 0.04 s in four of nine runs and one retransmission, about
    // 1 s, after in four, the shoot pod's reply leaving by its eth0 before its return path was
    // in; since that goes in with the push, within 0.04 s, `docs/ha.md` §9). `back` is when
    // the polling above saw the route
    // (an `ip route` run every `POLL`), so the connection may complete up to one poll and one
    // run before it; a connection that leaked by another path would complete at once, seconds
    // before any tunnel was back.
    let seen_late = conformance::wait::POLL + Duration::from_millis(100);
    let msg = record(
        &mut figures,
        format!(
            "both servers killed, restarted 2 s later: a connection started then completed after {:.2} s; tun0 carried again after {:.2} s, tun1 after {:.2} s",
            waited.as_secs_f64(),
            tunnels_back.0.as_secs_f64(),
            tunnels_back.1.as_secs_f64()
        ),
    );
    assert!(
        waited + seen_late >= back,
        "completed before a tunnel was back: {msg}"
    );
    for c in &kapi_clients[1] {
        c.signal("KILL").expect("kill seed client");
    }
    wait_until("replica 1's devices gone", Duration::from_secs(5), || {
        standby_routes_via(&l.kapi[1], "tun0").is_empty()
            && standby_routes_via(&l.kapi[1], "tun1").is_empty()
    });
    assert!(
        !connects(&l.kapi[1], Duration::from_secs(2)),
        "no tunnel, no connection"
    );
    let guard = String::from_utf8_lossy(
        &l.kapi[1]
            .run(["nft", "list", "table", "inet", "vpn-seed-client-guard"])
            .expect("nft")
            .stdout,
    )
    .into_owned();
    assert!(
        guard.contains("oifname \"tun*\" accept"),
        "the tunnel-only rules outlive the clients: {guard}"
    );
    for c in &mut kapi_clients[1] {
        c.restart(logs).expect("seed client again");
    }
    wait_until("replica 1 routed again", UP, || {
        routes_via(&l.kapi[1], "tun0").contains(SHOOT_SERVICE_NETWORKS)
    });
    assert!(connects(&l.kapi[1], Duration::from_secs(2)));
    for (r, capture) in captures.into_iter().enumerate() {
        let leaked = capture.finish().expect("capture");
        assert!(
            leaked.is_empty(),
            "kube-apiserver replica {r} sent packets to the shoot by eth0: {leaked:?}"
        );
    }
    record(
        &mut figures,
        "both servers down, a replica's clients gone: no packet to the shoot left either kube-apiserver pod by eth0".to_owned(),
    );

    // 7. Server 0 without a shoot connection (both shoot pods' s0 gone) while the
    // kube-apiserver's tunnel to it stays up: a connection started meanwhile is held by the
    // server and completes as soon as the first shoot connection is up again, not at the
    // kernel's next SYN retransmission. On this machine's kernel (6.18,
    // `net.ipv4.tcp_syn_linear_timeouts = 4`) SYNs are sent again 1, 2, 3, 4, 5 s after the
    // start (older kernels: 1, 3, 7 s); the shoot returns about 3.45 s after the start, between
    // two of them, so a SYN the server dropped is only answered at 4 s, about 0.6 s after the
    // return (measured with the server before its hold: 4.10 s, 772 ms after the shoot's tunnel
    // was up, and no "packets held" line in its log). Held, it leaves the moment the shoot
    // connection's tunnel is up: within [`HELD_LAG`] of the shoot pod's route showing.
    wait_until("replica 0 routed by tun0", UP, || {
        routes_via(&l.kapi[0], "tun0").contains("metric 100")
    });
    for pod in &shoot_clients {
        pod[0].signal("KILL").expect("kill shoot client s0");
    }
    for ns in &l.shoot {
        wait_until("shoot pods' tun0 gone", Duration::from_secs(5), || {
            routes_via(ns, "tun0").is_empty()
        });
    }
    // The router passes the closes on: server 0 sees them within moments.
    std::thread::sleep(Duration::from_millis(500));
    let (waited, shoot_back) = std::thread::scope(|scope| {
        let start = Instant::now();
        let replica = &l.kapi[0];
        let waiting = scope.spawn(move || {
            let ok = connects(replica, Duration::from_secs(15));
            (ok, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(3400));
        shoot_clients[0][0]
            .restart(logs)
            .expect("shoot client s0 again");
        wait_until("shoot pod 0's s0 tunnel up", UP, || {
            routes_via(&l.shoot[0], "tun0").contains("metric 100")
        });
        let back = start.elapsed();
        let (ok, waited) = waiting.join().expect("connecting thread");
        assert!(
            ok,
            "a connection started while server 0 had no shoot connection"
        );
        (waited, back)
    });
    let msg = record(
        &mut figures,
        format!(
            "server 0 without a shoot connection for {:.2} s: a connection started then completed after {:.2} s, {:+.0} ms from the shoot's tunnel being seen up",
            shoot_back.as_secs_f64(),
            waited.as_secs_f64(),
            (waited.as_secs_f64() - shoot_back.as_secs_f64()) * 1e3
        ),
    );
    assert!(
        waited < shoot_back + HELD_LAG,
        "held by the server, not left to the SYN retransmissions: {msg}"
    );
    assert!(
        servers[0]
            .log()
            .contains("packets held for its routes sent"),
        "server 0 sent what it held: {}",
        servers[0].log()
    );
    shoot_clients[1][0]
        .restart(logs)
        .expect("shoot client s0 again");

    let _ = controllers;
    let _ = &ingress;
    drop(dumps);
    let _ = std::fs::remove_dir_all(root);
}
