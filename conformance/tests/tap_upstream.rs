//! Tap (layer 2) mode against upstream OpenVPN 2.6, in namespaces.
//!
//! Our server, from a config file (`dev tap0`, `server NET MASK`, `client-to-client`,
//! `duplicate-cn`), with two upstream tap clients, each in its own namespace joined to SEED by
//! a veth pair:
//!
//! ```text
//!   C1  vc1 10.201.1.2/30 ──── vs1 10.201.1.1/30   SEED (vpn-server on [::]:1194,
//!   tap0 192.168.124.x/24 (pushed)                       tap0 192.168.124.1/24)
//!   C2  vc2 10.201.2.2/30 ──── vs2 10.201.2.1/30
//!   tap0 192.168.124.y/24 (pushed)
//! ```
//!
//! Asserted: upstream finds our OCC options string (`dev-type tap`, its `link-mtu`) as it
//! expects; each client gets a pool address with the pushed netmask; the clients ping each
//! other and the server's tap address, over IPv4 and IPv6 (`server-ipv6`); each client's neighbour table holds the other
//! client's and the server's real tap MAC addresses (ARP crossed the tunnel: frames are
//! switched, not routed); the replies come with TTL 64 (no router on the way); the server
//! switched frames between the clients itself (its client-to-client counter); a 4 MiB TCP
//! transfer between the clients arrives with its SHA-256; the status file lists both
//! clients and their MAC addresses as upstream writes them (`xx:xx:xx:xx:xx:xx@0`), and
//! vpn2's HA readiness check accepts it.
//!
//! The other way round, an upstream tap server (`dev tap`, `server NET MASK`,
//! `client-to-client`, `duplicate-cn`, a pushed route) in SEED with two of our clients
//! (`TunSettings::tap`), same layout on 10.202.n.0/30 and 192.168.123.0/24: the pushed address
//! and netmask are on each client's tap device and the pushed route goes via the pushed
//! `route-gateway` (IPv6: via the server's `ifconfig-ipv6` address); the clients ping each
//! other, the server's tap address and an address behind the pushed route (IPv4 and IPv6); ARP resolved each peer's real MAC address; a 4 MiB transfer
//! between our clients arrives with its SHA-256; upstream finds our OCC string as expected.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::transfer::{fetch, serve_bytes};
use conformance::upstream::{
    tcp_client_config, tcp_server_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER,
};

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(30);
const SERVER_TAP: Ipv4Addr = Ipv4Addr::new(192, 168, 124, 1);
const SERVER_TAP_V6: &str = "fd8f:6d53:b97a:2::1";
/// Bytes of the transfer between the two clients.
const TRANSFER: usize = 4 << 20;
/// The CNs of the two clients: what vpn2's HA readiness check looks for.
const CNS: [&str; 2] = ["vpn-seed-client", "vpn-shoot-client-0"];

#[test]
fn our_tap_server_switches_between_two_upstream_tap_clients() {
    require_lab(&["openvpn", "openssl", "ping"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let clients: Vec<Netns> = (0..2).map(|_| Netns::new().expect("client ns")).collect();
    for (i, ns) in clients.iter().enumerate() {
        let n = i + 1;
        link(&seed, ns, n);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let status_path = dir.path().join("openvpn.status");
    let config_path = dir.path().join("server.conf");
    std::fs::write(&config_path, server_config(&pki, &status_path)).expect("server config");
    let loaded = vpn_server::load_file(&config_path).expect("our server takes the tap config");
    assert!(loaded.settings.is_tap());

    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &seed, loaded.settings).expect("our server");
        let upstream: Vec<UpstreamOpenvpn<'_>> = clients
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let n = i + 1;
                let (cert, key) = pki.issue_client(CNS[i]).expect("client certificate");
                let config = tap_client_config(&pki, &format!("10.201.{n}.1"), &cert, &key);
                UpstreamOpenvpn::start(ns, &config, 4).expect("start upstream client")
            })
            .collect();
        for c in &upstream {
            c.wait_for_log(INITIALIZED_MARKER, TIMEOUT)
                .expect("upstream tap client up");
            // Our OCC options string (dev-type tap, link-mtu) is what upstream expects.
            let log = c.log();
            assert!(!log.contains("inconsistently"), "{log}");
        }
        let addrs: Vec<(Ipv4Addr, u8)> = clients.iter().map(tap_address).collect();
        for (a, len) in &addrs {
            assert_eq!(*len, 24, "the pushed netmask is on the tap device");
            assert!(
                a.octets()[..3] == [192, 168, 124] && (2..=254).contains(&a.octets()[3]),
                "{a} outside the pool"
            );
        }
        assert_ne!(addrs[0].0, addrs[1].0, "two distinct pool addresses");
        let (a1, a2) = (addrs[0].0, addrs[1].0);

        // Pings: between the clients both ways, and from each to the server's tap address.
        let before = server.stats().client_to_client();
        for (ns, to) in [
            (&clients[0], a2),
            (&clients[1], a1),
            (&clients[0], SERVER_TAP),
            (&clients[1], SERVER_TAP),
        ] {
            let ttls = ping(ns, to);
            assert!(
                ttls.iter().all(|t| *t == 64),
                "replies from {to} come unrouted (TTL 64): {ttls:?}"
            );
        }
        assert!(
            server.stats().client_to_client() >= before + 6,
            "the server switched the clients' frames itself: {} -> {}",
            before,
            server.stats().client_to_client()
        );

        // ARP crossed the tunnel: each side knows the other's real tap MAC address.
        let macs: Vec<String> = clients.iter().map(|ns| tap_mac(ns, "tap0")).collect();
        let server_mac = tap_mac(&seed, "tap0");
        assert_eq!(neighbour(&clients[0], a2), macs[1], "C1 resolved C2");
        assert_eq!(neighbour(&clients[1], a1), macs[0], "C2 resolved C1");
        assert_eq!(
            neighbour(&clients[0], SERVER_TAP),
            server_mac,
            "C1 resolved SEED"
        );
        assert_eq!(neighbour(&seed, a2), macs[1], "SEED resolved C2");

        // IPv6 (vpn2's HA network is IPv6): neighbour discovery crosses as ARP did.
        let v6: Vec<String> = clients.iter().map(tap_address_v6).collect();
        assert_ne!(v6[0], v6[1]);
        for (ns, to) in [
            (&clients[0], v6[1].as_str()),
            (&clients[1], v6[0].as_str()),
            (&clients[0], SERVER_TAP_V6),
        ] {
            ping6(ns, to);
        }

        // A checksummed TCP transfer from C2 to C1.
        let listener = clients[1]
            .run_in(move || TcpListener::bind((a2, 5001)))
            .expect("run in C2")
            .expect("listen in C2");
        let (sender, want) = serve_bytes(listener, TRANSFER);
        let (len, got) = fetch(&clients[0], SocketAddr::from((a2, 5001)), TIMEOUT)
            .expect("transfer through the tunnel");
        sender.join().expect("byte server");
        assert_eq!(len, TRANSFER);
        assert_eq!(got, want, "SHA-256 of the transfer between the tap clients");

        // The status file: both clients, their MAC addresses as upstream prints them, and
        // vpn2's HA readiness accepts it.
        std::thread::sleep(Duration::from_millis(1500));
        let text = std::fs::read_to_string(&status_path).expect("status file");
        for (i, mac) in macs.iter().enumerate() {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("ROUTING_TABLE,{mac}@0,")))
                .unwrap_or_else(|| panic!("no routing-table row for {mac}:\n{text}"));
            assert!(row.contains(&format!(",{},", CNS[i])), "{row}");
        }
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("CLIENT_LIST,"))
                .count(),
            2,
            "{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("ROUTING_TABLE,192.168.124.")),
            "no IP routes in tap mode:\n{text}"
        );
        let status = vpn_server::probes::read_status(&status_path).expect("probes read it");
        vpn_server::probes::check_ready(&status, true).expect("HA readiness on a tap status file");

        drop(upstream);
        server.stop();
    });
}

#[test]
fn our_tap_clients_with_an_upstream_tap_server() {
    require_lab(&["openvpn", "ping"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let clients: Vec<Netns> = (0..2).map(|_| Netns::new().expect("client ns")).collect();
    for (i, ns) in clients.iter().enumerate() {
        link_on(&seed, ns, i + 1, 202);
    }
    // An address behind the pushed route, on SEED's loopback.
    let behind = Ipv4Addr::new(10, 203, 0, 1);
    seed.run(["ip", "addr", "add", "10.203.0.1/32", "dev", "lo"])
        .expect("address behind the route");
    seed.run(["ip", "addr", "add", "fd00:203::1/128", "dev", "lo"])
        .expect("IPv6 address behind the route");
    let config = tcp_server_config(
        &pki,
        PORT,
        ControlWrap::TlsAuth,
        &[
            "auth SHA256",
            "client-to-client",
            "duplicate-cn",
            "push \"route 10.203.0.0 255.255.0.0\"",
            "server-ipv6 fd8f:6d53:b97a:3::/64",
            "push \"route-ipv6 fd00:203::/64\"",
        ],
    )
    .replace("local 127.0.0.1\n", "")
    .replace("dev tun\n", "dev tap\n")
    .replace("topology subnet\n", "");
    let server = UpstreamOpenvpn::start(&seed, &config, 4).expect("upstream tap server");
    server.wait_listening(TIMEOUT).expect("server listening");
    let server_tap = Ipv4Addr::new(192, 168, 123, 1);

    std::thread::scope(|scope| {
        let ours: Vec<ClientThread<'_>> = clients
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let remote = vpn_client::Remote::new(format!("10.202.{}.1", i + 1), PORT);
                let mut s = pki.our_client_settings(remote).expect("client settings");
                s.tun.tap = true;
                s.tun.name = "tap0".into();
                ClientThread::spawn(scope, ns, s)
            })
            .collect();
        for (c, ns) in ours.iter().zip(&clients) {
            c.wait_until("the pushed address on tap0", TIMEOUT, || {
                ns.run(["ip", "-4", "-o", "addr", "show", "dev", "tap0"])
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("inet "))
            })
            .expect("our tap client up");
            let routes = ns.run(["ip", "route"]).expect("ip route");
            let routes = String::from_utf8_lossy(&routes.stdout);
            assert!(
                routes.contains("10.203.0.0/16 via 192.168.123.1 dev tap0"),
                "the pushed route goes via the route-gateway:\n{routes}"
            );
            let routes = ns.run(["ip", "-6", "route"]).expect("ip -6 route");
            let routes = String::from_utf8_lossy(&routes.stdout);
            assert!(
                routes.contains("fd00:203::/64 via fd8f:6d53:b97a:3::1 dev tap0"),
                "the pushed IPv6 route goes via the server's address:\n{routes}"
            );
        }
        let addrs: Vec<(Ipv4Addr, u8)> = clients.iter().map(tap_address).collect();
        assert!(addrs.iter().all(|(_, len)| *len == 24), "{addrs:?}");
        assert_ne!(addrs[0].0, addrs[1].0, "two distinct pool addresses");
        let (a1, a2) = (addrs[0].0, addrs[1].0);

        for (ns, to) in [
            (&clients[0], a2),
            (&clients[1], a1),
            (&clients[0], server_tap),
            (&clients[1], server_tap),
            (&clients[0], behind),
        ] {
            ping(ns, to);
        }
        let v6: Vec<String> = clients.iter().map(tap_address_v6).collect();
        for (ns, to) in [
            (&clients[0], v6[1].as_str()),
            (&clients[1], v6[0].as_str()),
            (&clients[1], "fd00:203::1"),
        ] {
            ping6(ns, to);
        }
        let macs: Vec<String> = clients.iter().map(|ns| tap_mac(ns, "tap0")).collect();
        assert_eq!(neighbour(&clients[0], a2), macs[1], "C1 resolved C2");
        assert_eq!(neighbour(&clients[1], a1), macs[0], "C2 resolved C1");
        assert_eq!(
            neighbour(&clients[0], server_tap),
            tap_mac(&seed, "tap0"),
            "C1 resolved the server"
        );

        let listener = clients[0]
            .run_in(move || TcpListener::bind((a1, 5002)))
            .expect("run in C1")
            .expect("listen in C1");
        let (sender, want) = serve_bytes(listener, TRANSFER);
        let (len, got) = fetch(&clients[1], SocketAddr::from((a1, 5002)), TIMEOUT)
            .expect("transfer through the tunnel");
        sender.join().expect("byte server");
        assert_eq!(
            (len, got),
            (TRANSFER, want),
            "transfer between our tap clients"
        );

        let log = server.log();
        assert!(!log.contains("inconsistently"), "{log}");
        for c in ours {
            assert_eq!(c.stop().expect("our client"), vpn_client::Stopped::Shutdown);
        }
    });
}

/// The server config: vpn2's HA server (`dev tap0`, `client-to-client`, `duplicate-cn`) with
/// an IPv4 pool.
fn server_config(pki: &TestPki, status: &Path) -> String {
    [
        format!("port {PORT}"),
        "proto tcp-server".into(),
        "dev tap0".into(),
        "server 192.168.124.0 255.255.255.0".into(),
        "server-ipv6 fd8f:6d53:b97a:2::/96".into(),
        "client-to-client".into(),
        "duplicate-cn".into(),
        "keepalive 10 60".into(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.server_cert().display()),
        format!("key {}", pki.server_key().display()),
        "dh none".into(),
        format!("tls-auth {} 0", pki.ta_key().display()),
        "auth SHA256".into(),
        format!("status {} 1", status.display()),
        "status-version 2".into(),
    ]
    .join("\n")
        + "\n"
}

/// An upstream `dev tap` client of `remote` with its own certificate.
fn tap_client_config(pki: &TestPki, remote: &str, cert: &Path, key: &Path) -> String {
    tcp_client_config(pki, PORT, ControlWrap::TlsAuth, &["auth SHA256"])
        .replace(
            &format!("remote 127.0.0.1 {PORT}"),
            &format!("remote {remote} {PORT}"),
        )
        .replace("dev tun", "dev tap")
        .replace(
            &format!("cert {}", pki.client_cert().display()),
            &format!("cert {}", cert.display()),
        )
        .replace(
            &format!("key {}", pki.client_key().display()),
            &format!("key {}", key.display()),
        )
}

/// A veth pair `vs{n}` (SEED, 10.201.n.1/30) – `vc{n}` (`ns`, 10.201.n.2/30).
fn link(seed: &Netns, ns: &Netns, n: usize) {
    link_on(seed, ns, n, 201);
}

/// A veth pair `vs{n}` (SEED, 10.`net`.n.1/30) – `vc{n}` (`ns`, 10.`net`.n.2/30).
fn link_on(seed: &Netns, ns: &Netns, n: usize, net: u8) {
    Netns::veth_pair(seed, &format!("vs{n}"), ns, &format!("vc{n}")).expect("veth");
    seed.run([
        "ip",
        "addr",
        "add",
        &format!("10.{net}.{n}.1/30"),
        "dev",
        &format!("vs{n}"),
    ])
    .expect("seed address");
    ns.run([
        "ip",
        "addr",
        "add",
        &format!("10.{net}.{n}.2/30"),
        "dev",
        &format!("vc{n}"),
    ])
    .expect("client address");
}

/// The IPv4 address and prefix length on `tap0` in `ns`.
fn tap_address(ns: &Netns) -> (Ipv4Addr, u8) {
    ns.ipv4_on("tap0")
        .expect("ip addr")
        .expect("an IPv4 address on tap0")
}

/// The global IPv6 address on `tap0` in `ns` (waiting up to 10 s for duplicate address
/// detection to finish).
fn tap_address_v6(ns: &Netns) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns
            .run([
                "ip", "-6", "-o", "addr", "show", "dev", "tap0", "scope", "global",
            ])
            .expect("ip addr");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let addr = text
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .map(|cidr| cidr.split('/').next().unwrap_or(cidr).to_owned());
        match addr {
            Some(a) if !text.contains("tentative") => return a,
            _ if std::time::Instant::now() >= deadline => {
                panic!("no usable IPv6 address on tap0: {text:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Pings `to` over IPv6 from `ns` until three replies came (at most 15 s: the peer's
/// address may still be in duplicate address detection).
fn ping6(ns: &Netns, to: &str) {
    let out = ns
        .run(["ping", "-6", "-c", "3", "-i", "0.2", "-w", "15", to])
        .expect("ping -6");
    assert!(
        out.status.success(),
        "ping -6 {to}:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The MAC address of `dev` in `ns`.
fn tap_mac(ns: &Netns, dev: &str) -> String {
    let out = ns
        .run(["ip", "-o", "link", "show", "dev", dev])
        .expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("{dev} has no MAC address: {text}"))
        .to_owned()
}

/// The MAC address `ns` resolved for `addr` on tap0 (its neighbour table).
fn neighbour(ns: &Netns, addr: Ipv4Addr) -> String {
    let out = ns
        .run(["ip", "neigh", "show", &addr.to_string(), "dev", "tap0"])
        .expect("ip neigh");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .unwrap_or_else(|| panic!("{addr} not resolved: {text:?}"))
        .to_owned()
}

/// Three pings from `ns` to `to`, all answered; their TTLs.
fn ping(ns: &Netns, to: Ipv4Addr) -> Vec<u8> {
    let out = ns
        .run(["ping", "-c", "3", "-i", "0.2", "-W", "5", &to.to_string()])
        .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ping {to}:\n{text}");
    let ttls: Vec<u8> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("ttl="))
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(ttls.len(), 3, "three replies from {to}:\n{text}");
    ttls
}
