//! Several shoots through one router at once, each flow of Gardener's ingress (reference
//! section 2.5) for each shoot, with shoot names that are prefixes of one another:
//!
//! ```text
//!  SHOOT 10.79.0.2                      SEED 10.79.0.1: vpn-router
//!  openvpn (stock) ─ X-Gardener-Destination: vpn-seed-server.shoot--p--a    → our server A (tun-s0)
//!  openvpn (stock) ─ X-Gardener-Destination: vpn-seed-server.shoot--p--ab   → our server B (tun-s1)
//!  vpn-client (ours) ─ Reversed-VPN (legacy port): vpn-seed-server.shoot--p--a-b → our server C (tun-s2)
//!  curl ─ X-Gardener-Destination: kube-apiserver.<shoot> (GEP-30)     → that shoot's HTTPS "kube-apiserver"
//!  raw  ─ X-Gardener-Destination: <shoot>--kube-apiserver-socket     → that shoot's socket upstream
//! ```
//!
//! All three tunnels are up at the same time and each pings its own server's tunnel address;
//! each HTTPS request gets its own shoot's certificate (the TLS session is end to end, the
//! router never terminates it); each socket request is greeted by its own shoot's upstream.

mod router_common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn};
use ipnet::Ipv4Net;
use netio::http::CustomHeader;
use router_common::*;
use vpn_client::{HttpProxy, Remote};

const SHOOTS: [&str; 3] = ["shoot--p--a", "shoot--p--ab", "shoot--p--a-b"];
const TIMEOUT: Duration = Duration::from_secs(30);

fn server_port(i: usize) -> u16 {
    11940 + i as u16
}

fn kube_apiserver_port(i: usize) -> u16 {
    9440 + i as u16
}

fn socket_port(i: usize) -> u16 {
    9450 + i as u16
}

/// Server `i`'s tunnel address (its pool `192.168.(10+i).0/24`).
fn server_tun(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 10 + i as u8, 1)
}

fn socket_value(ns: &str) -> String {
    format!("{ns}--kube-apiserver-socket")
}

fn router_config() -> String {
    let mut text = format!(
        "[[listener]]\naddress = \"{SEED}:0\"\nheaders = [\"X-Gardener-Destination\"]\n\n\
         [[listener]]\naddress = \"{SEED}:0\"\nheaders = [\"Reversed-VPN\"]\n"
    );
    for (i, ns) in SHOOTS.iter().enumerate() {
        for (value, upstream) in [
            (vpn(ns), format!("127.0.0.1:{}", server_port(i))),
            (kapi(ns), format!("127.0.0.1:{}", kube_apiserver_port(i))),
            (socket_value(ns), format!("{SEED}:{}", socket_port(i))),
        ] {
            text.push_str(&format!(
                "\n[[route]]\nvalue = \"{value}\"\nupstream = \"{upstream}\"\n"
            ));
        }
    }
    text
}

/// A self-signed certificate and key for `cn` in `dir`.
fn self_signed(dir: &Path, cn: &str) -> (String, String) {
    let (crt, key) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj"])
        .arg(format!("/CN={cn}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("openssl req");
    assert!(out.status.success(), "openssl req: {out:?}");
    (crt.display().to_string(), key.display().to_string())
}

/// Waits until something listens on SEED's `addr`.
fn wait_listening(lab: &Lab, addr: SocketAddr) {
    let deadline = Instant::now() + TIMEOUT;
    while !lab
        .seed
        .run_in(|| std::net::TcpStream::connect(addr).is_ok())
        .expect("run_in")
    {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ping(lab: &Lab, to: Ipv4Addr) -> bool {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.shoot.name(),
            "ping",
            "-c",
            "2",
            "-W",
            "3",
        ])
        .arg(to.to_string())
        .output()
        .expect("ping")
        .status
        .success()
}

#[test]
fn every_flow_of_several_shoots_is_routed_at_once_to_its_own_upstream() {
    let lab = Lab::new(&["openvpn", "openssl", "curl", "ping"]);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &router_config());
    let (gardener, legacy) = (router.addr(0), router.addr(1));

    // Per shoot: an HTTPS "kube-apiserver" with its own certificate and a socket upstream.
    let mut socket_upstreams = Vec::new();
    for (i, ns) in SHOOTS.iter().enumerate() {
        let (crt, key) = self_signed(dir.path(), &format!("kube-apiserver.{ns}"));
        lab.seed
            .spawn(
                lab.seed
                    .command("openssl")
                    .args(["s_server", "-quiet", "-www", "-accept"])
                    .arg(format!("127.0.0.1:{}", kube_apiserver_port(i)))
                    .args(["-cert", &crt, "-key", &key]),
            )
            .expect("s_server");
        wait_listening(
            &lab,
            SocketAddr::from(([127, 0, 0, 1], kube_apiserver_port(i))),
        );
        socket_upstreams.push(lab.upstream(&format!("socket-{ns}"), socket_port(i)));
    }

    std::thread::scope(|scope| {
        // Our server per shoot, each with its own device and pool.
        let servers: Vec<ServerThread<'_>> = (0..SHOOTS.len())
            .map(|i| {
                let mut s = pki.our_server_settings(server_port(i)).expect("settings");
                s.listen = vec![SocketAddr::from(([127, 0, 0, 1], server_port(i)))];
                s.dev = format!("tun-s{i}");
                s.pool_v4 =
                    Some(Ipv4Net::new(Ipv4Addr::new(192, 168, 10 + i as u8, 0), 24).expect("pool"));
                ServerThread::spawn(scope, &lab.seed, s).expect("our server")
            })
            .collect();

        // Stock clients for the first two shoots, through the Gardener port.
        let clients: Vec<UpstreamOpenvpn<'_>> = SHOOTS[..2]
            .iter()
            .map(|ns| {
                let lines = [
                    "auth SHA256".to_owned(),
                    format!("http-proxy {} {}", gardener.ip(), gardener.port()),
                    format!(
                        "http-proxy-option CUSTOM-HEADER X-Gardener-Destination {}",
                        vpn(ns)
                    ),
                    "connect-retry 1 1".to_owned(),
                ];
                let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                let config = tcp_client_config(&pki, 1194, ControlWrap::TlsAuth, &lines);
                UpstreamOpenvpn::start(&lab.shoot, &config, 3).expect("stock client")
            })
            .collect();
        // Ours for the third, through the legacy port.
        let mut ours = pki
            .our_client_settings(Remote::new("127.0.0.1", 1194))
            .expect("client settings");
        let mut proxy = HttpProxy::new(legacy.ip().to_string(), legacy.port());
        proxy.options.custom_headers.push(CustomHeader::NameValue {
            name: "Reversed-VPN".into(),
            value: vpn(SHOOTS[2]),
        });
        ours.http_proxy = Some(proxy);
        ours.tun.name = "tun-ours".into();
        ours.connect_retry = Duration::from_secs(1);
        let our_client = ClientThread::spawn(scope, &lab.shoot, ours);
        for (c, ns) in clients.iter().zip(SHOOTS) {
            c.wait_for_log("Initialization Sequence Completed", TIMEOUT)
                .unwrap_or_else(|e| panic!("stock client of {ns}: {e}"));
        }
        our_client
            .wait_until("our client's tunnel", TIMEOUT, || {
                let out = Command::new("ip")
                    .args([
                        "-n",
                        lab.shoot.name(),
                        "-4",
                        "addr",
                        "show",
                        "dev",
                        "tun-ours",
                    ])
                    .output()
                    .expect("ip");
                String::from_utf8_lossy(&out.stdout).contains("inet 192.168.12.")
            })
            .expect("our tunnel up");
        // All three tunnels at once, each to its own server.
        for (i, ns) in SHOOTS.iter().enumerate() {
            assert!(
                ping(&lab, server_tun(i)),
                "{ns}: no ping through its tunnel"
            );
        }
        for (i, server) in servers.iter().enumerate() {
            let mut text = netio::admin::Exposition::new();
            server.stats().render(1, 0, &mut text);
            assert!(
                text.as_str()
                    .contains("vpn_server_tunnels_established_total 1\n"),
                "server {i} ({}) should have exactly its shoot's tunnel:\n{}",
                SHOOTS[i],
                text.as_str()
            );
        }

        // GEP-30: each shoot's kube-apiserver, TLS end to end.
        for (i, ns) in SHOOTS.iter().enumerate() {
            let out = Command::new("ip")
                .args(["netns", "exec", lab.shoot.name(), "curl", "-sS", "-v", "-k"])
                .args(["--max-time", "10", "--proxytunnel", "--proxy"])
                .arg(format!("http://{gardener}"))
                .arg("--proxy-header")
                .arg(format!("X-Gardener-Destination: {}", kapi(ns)))
                .arg(format!("https://127.0.0.1:{}/", kube_apiserver_port(i)))
                .output()
                .expect("curl");
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{ns}: {log}");
            let subject = format!("CN=kube-apiserver.{ns}");
            assert!(
                log.lines()
                    .any(|l| l.contains("subject:") && l.trim_end().ends_with(&subject)),
                "{ns}: another shoot's certificate:\n{log}"
            );
        }

        // The socket shape: each greeted by its own upstream.
        for (ns, upstream) in SHOOTS.iter().zip(&socket_upstreams) {
            let mut c = lab.connect_from(SHOOT_A.into(), gardener);
            c.send(&connect(&[format!(
                "X-Gardener-Destination: {}",
                socket_value(ns)
            )]));
            let greeting = format!("socket-{ns}\n");
            let got = c.read_until(greeting.as_bytes());
            assert_eq!(
                status(&got),
                Some(200),
                "{ns}: {}",
                String::from_utf8_lossy(&got)
            );
            assert!(
                got.ends_with(greeting.as_bytes()),
                "{ns}: {}",
                String::from_utf8_lossy(&got)
            );
            assert_eq!(upstream.connects(), 1, "{ns}");
        }

        our_client.stop().expect("our client");
        drop(clients);
        for s in servers {
            s.stop();
        }
    });
}
