//! Our `vpn-server` in a lab namespace (SEED) against upstream OpenVPN 2.6 clients in their own
//! namespaces (SHOOT1..3), each joined to SEED by a veth pair:
//!
//! ```text
//!   SHOOTi  vc{i} 10.200.i.2/30 ───── vs{i} 10.200.i.1/30  SEED  (vpn-server on [::]:1194,
//!   tun0 192.168.123.x/24 (pushed)                              tun0 192.168.123.1/24,
//!                                                               route 10.251.0.0/16 dev tun0)
//! ```
//!
//! One test, so the three clients share one server: three distinct pool addresses; a 4 MiB TCP
//! transfer with a SHA-256 checksum from SEED to a client's tun address; an iroute network
//! reached through its client; a spoofed source from a client never reaching SEED while the
//! server's counter records the drop; the status file; graceful shutdown with RESTART.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::transfer::{fetch, serve_bytes};
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};
use protocol::session::Keepalive;
use vpn_server::{ClientOptions, Settings, StatusFile};

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(30);
const IROUTE: &str = "10.251.0.0/16";
const IROUTE_HOST: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 1);
const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);

fn settings(pki: &TestPki, status: PathBuf) -> Settings {
    let mut s = pki.our_server_settings(PORT).expect("server settings");
    s.keepalive = Some(Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    s.routes = vec![IROUTE.parse().expect("net")];
    s.clients.insert(
        "shoot1".into(),
        ClientOptions {
            iroutes: vec![IROUTE.parse().expect("net")],
            ..ClientOptions::default()
        },
    );
    s.handshake_timeout = Duration::from_secs(20);
    s.drain_timeout = Duration::from_secs(3);
    s.status = Some(StatusFile {
        path: status,
        interval: Duration::from_secs(1),
    });
    s
}

/// The IPv4 address on `tun0` in `ns`.
fn tun_address(ns: &Netns) -> Ipv4Addr {
    ns.ipv4_on("tun0")
        .expect("ip addr")
        .expect("an IPv4 address on tun0")
        .0
}

#[test]
fn three_upstream_clients_pool_traffic_iroute_antispoof_shutdown() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let shoots: Vec<Netns> = (0..3).map(|_| Netns::new().expect("shoot")).collect();
    for (i, shoot) in shoots.iter().enumerate() {
        let n = i + 1;
        Netns::veth_pair(&seed, &format!("vs{n}"), shoot, &format!("vc{n}")).expect("veth");
        seed.run([
            "ip",
            "addr",
            "add",
            &format!("10.200.{n}.1/30"),
            "dev",
            &format!("vs{n}"),
        ])
        .expect("seed addr");
        shoot
            .run([
                "ip",
                "addr",
                "add",
                &format!("10.200.{n}.2/30"),
                "dev",
                &format!("vc{n}"),
            ])
            .expect("shoot addr");
    }
    let status_dir = tempfile::tempdir().expect("tempdir");
    let status_path = status_dir.path().join("openvpn.status");
    let settings = settings(&pki, status_path.clone());

    std::thread::scope(|scope| {
        let our_server = ServerThread::spawn(scope, &seed, settings).expect("our server");
        let stats = our_server.stats();

        // (a) Three upstream clients at once get three distinct pool addresses.
        let clients: Vec<UpstreamOpenvpn<'_>> = shoots
            .iter()
            .enumerate()
            .map(|(i, shoot)| {
                let n = i + 1;
                let (cert, key) = pki
                    .issue_client(&format!("shoot{n}"))
                    .expect("client certificate");
                let config = tcp_client_config(&pki, PORT, ControlWrap::TlsAuth, &["auth SHA256"])
                    .replace(
                        &format!("remote 127.0.0.1 {PORT}"),
                        &format!("remote 10.200.{n}.1 {PORT}"),
                    )
                    .replace(
                        &format!("cert {}", pki.client_cert().display()),
                        &format!("cert {}", cert.display()),
                    )
                    .replace(
                        &format!("key {}", pki.client_key().display()),
                        &format!("key {}", key.display()),
                    );
                UpstreamOpenvpn::start(shoot, &config, 3).expect("start upstream client")
            })
            .collect();
        for c in &clients {
            c.wait_for_log(INITIALIZED_MARKER, TIMEOUT)
                .expect("client up");
        }
        let addrs: Vec<Ipv4Addr> = shoots.iter().map(tun_address).collect();
        let mut distinct = addrs.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "three distinct pool addresses: {addrs:?}"
        );
        for a in &addrs {
            let o = a.octets();
            assert!(
                o[..3] == [192, 168, 123] && (2..=254).contains(&o[3]),
                "{a} outside the pool"
            );
        }

        // (b) A 4 MiB transfer from a server in SHOOT2 (on its tun address) to SEED.
        let shoot2_addr = addrs[1];
        let listener = shoots[1]
            .run_in(move || TcpListener::bind((shoot2_addr, 5001)))
            .expect("run in shoot2")
            .expect("listen in shoot2");
        let (server, want) = serve_bytes(listener, 4 << 20);
        let (len, got) = fetch(&seed, SocketAddr::from((addrs[1], 5001)), TIMEOUT)
            .expect("transfer through the tunnel");
        server.join().expect("byte server");
        assert_eq!(len, 4 << 20);
        assert_eq!(got, want, "checksum of the transfer through the tunnel");

        // (c1) The iroute of shoot1: SEED reaches 10.251.0.1 (on SHOOT1's loopback) through it.
        shoots[0]
            .run([
                "ip",
                "addr",
                "add",
                &format!("{IROUTE_HOST}/32"),
                "dev",
                "lo",
            ])
            .expect("iroute host address");
        let listener = shoots[0]
            .run_in(|| TcpListener::bind((IROUTE_HOST, 5002)))
            .expect("run in shoot1")
            .expect("listen on the iroute address");
        let (server, want) = serve_bytes(listener, 256 << 10);
        let (len, got) = fetch(&seed, SocketAddr::from((IROUTE_HOST, 5002)), TIMEOUT)
            .expect("transfer through the tunnel");
        server.join().expect("iroute byte server");
        assert_eq!((len, got), (256 << 10, want), "iroute transfer");

        // (c2) Anti-spoofing: SHOOT3 sends UDP to SEED from its own address (arrives) and from
        // a second address on its tun (never arrives; counted).
        let sink = seed
            .run_in(|| UdpSocket::bind((SERVER_TUN, 5003)))
            .expect("run in seed")
            .expect("udp sink");
        sink.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let spoofed_src = Ipv4Addr::new(192, 168, 123, 200);
        shoots[2]
            .run([
                "ip",
                "addr",
                "add",
                &format!("{spoofed_src}/32"),
                "dev",
                "tun0",
            ])
            .expect("second address on the client's tun");
        // An address inside shoot1's iroute: another client's network is no source for shoot3.
        let other_iroute = Ipv4Addr::new(10, 251, 0, 9);
        shoots[2]
            .run([
                "ip",
                "addr",
                "add",
                &format!("{other_iroute}/32"),
                "dev",
                "tun0",
            ])
            .expect("third address on the client's tun");
        let own_src = addrs[2];
        let before = stats.spoofed();
        shoots[2]
            .run_in(move || {
                for src in [own_src, spoofed_src, other_iroute] {
                    let s = UdpSocket::bind((src, 0)).expect("bind source");
                    for _ in 0..3 {
                        s.send_to(format!("from {src}").as_bytes(), (SERVER_TUN, 5003))
                            .expect("send");
                    }
                }
            })
            .expect("run in shoot3");
        let mut seen: Vec<IpAddr> = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok((_, from)) = sink.recv_from(&mut buf) {
            seen.push(from.ip());
        }
        assert!(
            seen.contains(&IpAddr::V4(own_src)),
            "the legitimate source arrives: {seen:?}"
        );
        assert!(
            seen.iter().all(|s| *s == IpAddr::V4(own_src)),
            "spoofed sources reached SEED: {seen:?}"
        );
        let dropped = stats.spoofed() - before;
        assert!(dropped >= 6, "spoofed packets counted: {dropped}");

        // The status file lists the three clients and shoot1's iroute.
        std::thread::sleep(Duration::from_millis(1500));
        let text = std::fs::read_to_string(&status_path).expect("status file");
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("CLIENT_LIST,"))
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        for (i, a) in addrs.iter().enumerate() {
            assert!(
                rows.iter()
                    .any(|r| r.starts_with(&format!("CLIENT_LIST,shoot{},", i + 1))
                        && r.contains(&format!(",{a},"))
                        && r.ends_with(",AES-256-GCM")),
                "{text}"
            );
        }
        assert!(
            text.contains(&format!("ROUTING_TABLE,{IROUTE},shoot1,")),
            "{text}"
        );
        assert!(text.ends_with("END\n"), "{text}");

        // Graceful shutdown: clients are told (RESTART), the server drains and returns Ok.
        let stopped = our_server.stop();
        stopped.result.expect("run returned an error");
        assert!(
            stopped.took < Duration::from_secs(10),
            "shutdown took {:?}",
            stopped.took
        );
        for c in &clients {
            c.wait_for_log("server-pushed-connection-reset", Duration::from_secs(5))
                .expect("client saw RESTART");
        }
        drop(clients);
    });
}
