//! OpenVPN clients reach a server through the ingress router, once per routing header name:
//!
//! ```text
//!  SHOOT 10.79.0.2  ── veth ──  SEED 10.79.0.1: router (3 listeners, one per header name)
//!  openvpn / vpn-client                          → upstream openvpn on 127.0.0.1:1194
//! ```
//!
//! The stock OpenVPN 2.6 client uses `http-proxy` with `http-proxy-option CUSTOM-HEADER`;
//! ours uses `Settings::http_proxy` with a custom header. Each must complete its handshake
//! and ping the server's tun address through the tunnel. A request naming a route the router
//! does not know must not reach the server (the client never initialises).
//!
//! A second test stands in for the apiserver-proxy: `curl` in SHOOT tunnels HTTPS with
//! `X-Gardener-API-Route` through the router to a test "kube-apiserver" (`openssl s_server`)
//! in SEED.

mod router_common;

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use conformance::our_client::ClientThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::upstream::{tcp_client_config, tcp_server_config, ControlWrap, UpstreamOpenvpn};
use netio::http::CustomHeader;
use router_common::*;
use vpn_client::{HttpProxy, Remote, Settings, Stopped};

const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);
const TIMEOUT: Duration = Duration::from_secs(30);
/// The test "kube-apiserver" (`openssl s_server -www`) on SEED's loopback.
const KUBE_APISERVER_PORT: u16 = 9443;
const HEADERS: [&str; 3] = [
    "X-Gardener-Destination",
    "Reversed-VPN",
    "X-Gardener-API-Route",
];

fn router_config() -> String {
    let mut text = String::new();
    for name in HEADERS {
        text.push_str(&format!(
            "[[listener]]\naddress = \"10.79.0.1:0\"\nheaders = [\"{name}\"]\n\n"
        ));
    }
    text.push_str(&format!(
        "[[route]]\nvalue = \"{}\"\nupstream = \"127.0.0.1:1194\"\n\n",
        vpn("shoot--p--a")
    ));
    text.push_str(&format!(
        "[[route]]\nvalue = \"{}\"\nupstream = \"127.0.0.1:{KUBE_APISERVER_PORT}\"\n",
        kapi("shoot--p--a")
    ));
    text
}

fn ping_server(lab: &Lab) {
    let out = Command::new("ip")
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
        .arg(SERVER_TUN.to_string())
        .output()
        .expect("ping");
    assert!(
        out.status.success(),
        "ping through the tunnel failed: {out:?}"
    );
}

#[test]
fn stock_and_our_client_reach_the_server_through_the_router_with_each_header() {
    let lab = Lab::new(&["openvpn", "openssl", "ping"]);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &router_config());
    let server_config = tcp_server_config(&pki, 1194, ControlWrap::TlsAuth, &["auth SHA256"]);
    let server = UpstreamOpenvpn::start(&lab.seed, &server_config, 3).expect("server");
    server
        .wait_for_log("Initialization Sequence Completed", TIMEOUT)
        .expect("server up");

    for (i, name) in HEADERS.iter().enumerate() {
        let proxy = router.addr(i);
        // The stock client.
        let lines = [
            "auth SHA256".to_owned(),
            format!("http-proxy {} {}", proxy.ip(), proxy.port()),
            format!(
                "http-proxy-option CUSTOM-HEADER {name} {}",
                vpn("shoot--p--a")
            ),
            "connect-retry 1 1".to_owned(),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let config = tcp_client_config(&pki, 1194, ControlWrap::TlsAuth, &lines);
        let client = UpstreamOpenvpn::start(&lab.shoot, &config, 3).expect("client");
        client
            .wait_for_log("Initialization Sequence Completed", TIMEOUT)
            .unwrap_or_else(|e| panic!("stock client via {name}: {e}"));
        ping_server(&lab);
        drop(client);
        wait_no_tun(&lab);

        // Ours.
        let settings = our_settings(&pki, proxy.ip().to_string(), proxy.port(), name);
        with_our_client(&lab, settings, ping_server);
    }

    // An unknown route: the stock client gets 400 and never initialises.
    let proxy = router.addr(0);
    let lines = [
        "auth SHA256".to_owned(),
        format!("http-proxy {} {}", proxy.ip(), proxy.port()),
        format!(
            "http-proxy-option CUSTOM-HEADER X-Gardener-Destination {}",
            vpn("shoot--p--zz")
        ),
        "connect-retry 1 1".to_owned(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let config = tcp_client_config(&pki, 1194, ControlWrap::TlsAuth, &lines);
    let client = UpstreamOpenvpn::start(&lab.shoot, &config, 3).expect("client");
    client
        .wait_for_log("HTTP proxy returned bad status", TIMEOUT)
        .expect("client sees the refusal");
    assert!(!client.log().contains("Initialization Sequence Completed"));
}

fn our_settings(pki: &TestPki, host: String, port: u16, header: &str) -> Settings {
    let mut settings = pki
        .our_client_settings(Remote::new("127.0.0.1", 1194))
        .expect("client settings");
    let mut proxy = HttpProxy::new(host, port);
    proxy.options.custom_headers.push(CustomHeader::NameValue {
        name: header.into(),
        value: vpn("shoot--p--a"),
    });
    settings.http_proxy = Some(proxy);
    settings.connect_retry = Duration::from_secs(1);
    settings.connect_retry_max = Duration::from_secs(2);
    settings
}

/// Runs our client in SHOOT until tun0 has a pool address, runs `body`, stops the client.
fn with_our_client(lab: &Lab, settings: Settings, body: impl FnOnce(&Lab) + Send) {
    std::thread::scope(|scope| {
        let client = ClientThread::spawn(scope, &lab.shoot, settings);
        client
            .wait_until("a pool address on our client's tun0", TIMEOUT, || {
                let out = Command::new("ip")
                    .args(["-n", lab.shoot.name(), "-4", "addr", "show", "dev", "tun0"])
                    .output()
                    .expect("ip");
                String::from_utf8_lossy(&out.stdout).contains("inet 192.168.123.")
            })
            .expect("tunnel up");
        body(lab);
        assert_eq!(client.stop().expect("our client"), Stopped::Shutdown);
    });
    wait_no_tun(lab);
}

fn wait_no_tun(lab: &Lab) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = Command::new("ip")
            .args(["-n", lab.shoot.name(), "link"])
            .output()
            .expect("ip");
        if !String::from_utf8_lossy(&out.stdout).contains("tun0") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("tun0 left behind in SHOOT");
}

#[test]
fn https_reaches_a_test_kube_apiserver_with_the_api_route_header() {
    let lab = Lab::new(&["openvpn", "openssl", "curl"]);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &router_config());
    let cert = pki.server_cert();
    let key = pki.server_key();
    lab.seed
        .spawn(
            lab.seed
                .command("openssl")
                .args(["s_server", "-quiet", "-www", "-accept"])
                .arg(format!("127.0.0.1:{KUBE_APISERVER_PORT}"))
                .arg("-cert")
                .arg(&cert)
                .arg("-key")
                .arg(&key),
        )
        .expect("s_server");
    let deadline = Instant::now() + TIMEOUT;
    while !lab
        .seed
        .run_in(|| std::net::TcpStream::connect(("127.0.0.1", KUBE_APISERVER_PORT)).is_ok())
        .expect("run_in")
    {
        assert!(Instant::now() < deadline, "s_server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let proxy = router.addr(2);
    let curl = |header: &str| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                lab.shoot.name(),
                "curl",
                "-sS",
                "-k",
                "--max-time",
                "10",
            ])
            .arg("--proxytunnel")
            .arg("--proxy")
            .arg(format!("http://{proxy}"))
            .arg("--proxy-header")
            .arg(header)
            .arg(format!("https://127.0.0.1:{KUBE_APISERVER_PORT}/"))
            .output()
            .expect("curl")
    };
    let ok = curl(&format!("X-Gardener-API-Route: {}", kapi("shoot--p--a")));
    assert!(
        ok.status.success(),
        "curl through the router failed: {ok:?}"
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("s_server"),
        "not the test kube-apiserver's page: {ok:?}"
    );
    // The same request naming another shoot's apiserver is refused (curl reports the 400).
    let refused = curl(&format!("X-Gardener-API-Route: {}", kapi("shoot--p--b")));
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("400"),
        "{refused:?}"
    );
}
