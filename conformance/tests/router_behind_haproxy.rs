//! Our router behind a real load balancer: Debian's HAProxy in TCP mode sends the PROXY
//! header (v2 with `send-proxy-v2`, v1 with `send-proxy`) the way a cloud load balancer in
//! front of the seed's ingress does, and the router judges each tunnel by the client address
//! in it, never by the balancer's own.
//!
//! ```text
//!  SHOOT                                              SEED
//!  client 10.79.0.3 / fd79::3                          router 10.79.0.1
//!     └─> HAProxy 10.79.0.2:18443 (v2), [fd79::2]:18443 (v2), 10.79.0.2:18132 (v1),
//!         10.79.0.2:19443 (v2, TLS passthrough to the SNI listener)
//!            └─ from 10.79.0.2 ──── veth ────────────> listeners "required", trusted 10.79.0.2
//! ```
//!
//! The routes `allowed` (and the SNI route of server name 0) admit the client only; the routes
//! `balancer-only` (and server name 1) admit only the balancer's address, so a router that
//! judged the TCP peer would let those through and refuse the others.

mod router_common;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::tls_hello::client_hello;
use conformance::wait::wait_until;
use router_common::{connect, status, vpn, Lab, SHOOT_A, SHOOT_B};

/// HAProxy's frontends in SHOOT (the balancer's address, [`SHOOT_A`]).
const V2_PORT: u16 = 18443;
const V1_PORT: u16 = 18132;
const SNI_PORT: u16 = 19443;
const BALANCER_V6: Ipv6Addr = Ipv6Addr::new(0xfd79, 0, 0, 0, 0, 0, 0, 2);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd79, 0, 0, 0, 0, 0, 0, 3);
/// The SNI routes' server names: "server name 0" admits the client, "server name 1" only the
/// balancer.
const SNI_NAMES: [&str; 2] = [
    "api.shoot--p--allowed.example.com",
    "api.shoot--p--balancer-only.example.com",
];

fn router_config(upstream: SocketAddr) -> String {
    format!(
        r#"[[listener]]
address = "10.79.0.1:0"
headers = ["X-Gardener-Destination"]
proxy_protocol = "required"
trusted_proxies = ["10.79.0.2/32"]

[[listener]]
address = "10.79.0.1:0"
headers = ["X-Gardener-Destination"]
proxy_protocol = "required"
trusted_proxies = ["10.79.0.2/32"]

[[listener]]
address = "10.79.0.1:0"
kind = "sni"
proxy_protocol = "required"
trusted_proxies = ["10.79.0.2/32"]

[[sni_route]]
server_names = ["{sni_allowed}"]
upstream = "{upstream}"
allow = ["10.79.0.3/32"]

[[sni_route]]
server_names = ["{sni_balancer_only}"]
upstream = "{upstream}"
allow = ["10.79.0.2/32"]

[[route]]
value = "{allowed}"
upstream = "{upstream}"
allow = ["10.79.0.3/32", "fd79::3/128"]

[[route]]
value = "{balancer_only}"
upstream = "{upstream}"
allow = ["10.79.0.2/32", "fd79::2/128"]
"#,
        allowed = vpn("shoot--p--allowed"),
        balancer_only = vpn("shoot--p--balancer-only"),
        sni_allowed = SNI_NAMES[0],
        sni_balancer_only = SNI_NAMES[1],
    )
}

fn haproxy_config(v2: SocketAddr, v1: SocketAddr, tls: SocketAddr) -> String {
    format!(
        "global\n    maxconn 64\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend v2\n    bind {SHOOT_A}:{V2_PORT}\n    bind [{BALANCER_V6}]:{V2_PORT} v6only\n    default_backend router_v2\n\n\
         frontend v1\n    bind {SHOOT_A}:{V1_PORT}\n    default_backend router_v1\n\n\
         frontend tls\n    bind {SHOOT_A}:{SNI_PORT}\n    default_backend router_sni\n\n\
         backend router_v2\n    server router {v2} send-proxy-v2 source {SHOOT_A}\n\n\
         backend router_v1\n    server router {v1} send-proxy source {SHOOT_A}\n\n\
         backend router_sni\n    server router {tls} send-proxy-v2 source {SHOOT_A}\n"
    )
}

/// Starts HAProxy in `ns` (tracked: stopped when `ns` is dropped) and waits until its
/// frontends accept.
fn start_haproxy(ns: &Netns, dir: &Path, config: &str) {
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).expect("haproxy config");
    ns.run(["haproxy", "-c", "-q", "-f", &path.display().to_string()])
        .expect("HAProxy accepts its config");
    let log = std::fs::File::create(dir.join("haproxy.log")).expect("haproxy log");
    ns.spawn(
        ns.command("haproxy")
            .args(["-db", "-f", &path.display().to_string()])
            .stdout(log.try_clone().expect("log"))
            .stderr(log),
    )
    .expect("start haproxy");
    let frontends = [
        SocketAddr::new(SHOOT_A.into(), V2_PORT),
        SocketAddr::new(BALANCER_V6.into(), V2_PORT),
        SocketAddr::new(SHOOT_A.into(), V1_PORT),
        SocketAddr::new(SHOOT_A.into(), SNI_PORT),
    ];
    wait_until("HAProxy listening", Duration::from_secs(10), || {
        ns.run_in(|| {
            frontends.iter().all(|a| {
                std::net::TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok()
            })
        })
        .expect("run_in")
    });
}

/// A CONNECT for the route of `ns` from `src` to `balancer`: the status, and for a 200 the
/// upstream's greeting and the echo of a probe through the tunnel.
fn through(lab: &Lab, src: IpAddr, balancer: SocketAddr, ns: &str) -> (Option<u16>, Vec<u8>) {
    let mut c = lab.connect_from(src, balancer);
    c.send(&connect(&[format!("X-Gardener-Destination: {}", vpn(ns))]));
    let (head, _) = c.read_all_until(b"\r\n\r\n");
    let code = status(&head);
    if code != Some(200) {
        return (code, head);
    }
    let probe = format!("probe from {src} via {balancer}\n");
    c.send(probe.as_bytes());
    let (out, _) = c.read_all_until(probe.as_bytes());
    (code, [head, out].concat())
}

#[test]
fn the_router_judges_the_client_address_haproxy_sends() {
    let lab = Lab::new(&["haproxy"]);
    let up = lab.upstream("U1", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &router_config(up.addr));
    start_haproxy(
        &lab.shoot,
        dir.path(),
        &haproxy_config(router.addr(0), router.addr(1), router.addr(2)),
    );

    let client_v4 = IpAddr::V4(SHOOT_B);
    let v2 = SocketAddr::new(SHOOT_A.into(), V2_PORT);
    let v1 = SocketAddr::new(SHOOT_A.into(), V1_PORT);
    let v2_over_v6 = SocketAddr::new(BALANCER_V6.into(), V2_PORT);
    let mut tunnels = 0;
    for (what, src, balancer) in [
        ("PROXY v2, IPv4", client_v4, v2),
        ("PROXY v1, IPv4", client_v4, v1),
        ("PROXY v2, IPv6", IpAddr::V6(CLIENT_V6), v2_over_v6),
    ] {
        let (code, out) = through(&lab, src, balancer, "shoot--p--allowed");
        let text = String::from_utf8_lossy(&out);
        assert_eq!(code, Some(200), "{what}: {text}");
        assert!(
            text.contains("U1\n") && text.contains(&format!("probe from {src} via {balancer}")),
            "{what}: the tunnel carried {text:?}"
        );
        tunnels += 1;
        // Allowed for the balancer's address only: refused, because the client is judged.
        let (code, out) = through(&lab, src, balancer, "shoot--p--balancer-only");
        assert_eq!(code, Some(403), "{what}: {}", String::from_utf8_lossy(&out));
    }
    assert_eq!(
        up.connects(),
        tunnels,
        "only the allowed tunnels reached the upstream"
    );

    // Without the balancer, the same client gets nothing: its listener requires PROXY, and
    // the client is no trusted proxy.
    let mut direct = lab.connect_from(client_v4, router.addr(0));
    direct.send(&connect(&[format!(
        "X-Gardener-Destination: {}",
        vpn("shoot--p--allowed")
    )]));
    let (out, closed) = direct.read_all();
    assert!(closed, "{}", String::from_utf8_lossy(&out));
    assert_ne!(status(&out), Some(200));
    assert_eq!(up.connects(), tunnels);

    // TLS passthrough (v2) to the SNI listener: the client's ClientHello reaches the upstream
    // for the name that admits the client (echoed back after its greeting); the name that
    // admits only the balancer is closed unanswered, with nothing sent upstream.
    let sni = SocketAddr::new(SHOOT_A.into(), SNI_PORT);
    let hello = client_hello(SNI_NAMES[0]);
    let mut c = lab.connect_from(client_v4, sni);
    c.send(&hello);
    let (out, _) = c.read_all_until(&hello);
    assert!(
        out.starts_with(b"U1\n") && out.ends_with(&hello),
        "the ClientHello for {} came back from U1 after its greeting: {out:?}",
        SNI_NAMES[0]
    );
    assert_eq!(
        up.connects(),
        tunnels + 1,
        "the allowed server name reached U1"
    );
    let mut c = lab.connect_from(client_v4, sni);
    c.send(&client_hello(SNI_NAMES[1]));
    let (out, closed) = c.read_all();
    assert!(
        closed && out.is_empty(),
        "balancer-only name answered {out:?}"
    );
    assert_eq!(
        up.connects(),
        tunnels + 1,
        "the balancer-only name reached no upstream"
    );
}
