//! The ingress router (`vpn_router`) against real sockets in lab namespaces: routing
//! by each header name, malformed and conflicting routing headers, allow-lists (exact
//! targets, IPv4-mapped peers), PROXY protocol v1/v2 and HTTP strictness. Every refusal
//! asserts that no upstream saw a connection.
//!
//! Listeners of [`CONFIG`]: 0 honours `X-Gardener-Destination` and `X-Gardener-API-Route`;
//! 1 honours `Reversed-VPN`; 2 is a dual-stack `[::]` listener (`X-Gardener-Destination`);
//! 3 requires PROXY headers from the "load balancer" 10.79.0.2 (`X-Gardener-Destination`);
//! 4 is a dual-stack `[::]` listener with PROXY per source: required from 10.79.0.2,
//! forbidden from everyone else (`X-Gardener-Destination`).

mod router_common;

use std::net::{IpAddr, SocketAddr};

use protocol::proxy_protocol::{ProxyHeader, Tlv, Version, PP2_TYPE_AUTHORITY, PP2_TYPE_NOOP};
use router_common::*;
use vpn_router::ProxyRefusal;

fn config(u1: SocketAddr, u2: SocketAddr) -> String {
    format!(
        r#"
always_allowed = ["10.250.0.0/16"]

[timeouts]
proxy_header_ms = 500
header_ms = 1000
connect_ms = 2000

[[listener]]
address = "10.79.0.1:0"
headers = ["X-Gardener-Destination", "X-Gardener-API-Route"]

[[listener]]
address = "10.79.0.1:0"
headers = ["Reversed-VPN"]

[[listener]]
address = "[::]:0"
headers = ["X-Gardener-Destination"]

[[listener]]
address = "10.79.0.1:0"
headers = ["X-Gardener-Destination"]
proxy_protocol = "required"
trusted_proxies = ["10.79.0.2/32"]

[[listener]]
address = "[::]:0"
headers = ["X-Gardener-Destination"]
proxy_protocol = "from-trusted"
trusted_proxies = ["10.79.0.2/32"]

[[route]]
value = "{a}"
upstream = "{u1}"
allow = ["10.79.0.3/32", "fd79::3/128"]

[[route]]
value = "{ab}"
upstream = "{u1}"

[[route]]
value = "{a_b}"
upstream = "{u1}"

[[route]]
value = "{kapi}"
upstream = "{u2}"
allow = ["10.79.0.3/32"]

[[route]]
value = "{dead}"
upstream = "10.79.0.1:1"
"#,
        a = vpn("shoot--p--a"),
        ab = vpn("shoot--p--ab"),
        a_b = vpn("shoot--p--a-b"),
        kapi = kapi("shoot--p--a"),
        dead = vpn("shoot--p--dead"),
    )
}

struct Setup {
    lab: Lab,
    u1: Upstream,
    u2: Upstream,
    router: RouterGuard,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let u2 = lab.upstream("U2", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &config(u1.addr, u2.addr));
    Setup {
        lab,
        u1,
        u2,
        router,
        _dir: dir,
    }
}

impl Setup {
    fn connects(&self) -> usize {
        self.u1.connects() + self.u2.connects()
    }

    /// Sends `bytes` from `src` to listener `l` and returns the status and whether the
    /// connection was closed; the whole answer must be one refusal.
    fn refused(&self, src: IpAddr, l: usize, bytes: &[u8]) -> (Option<u16>, Vec<u8>) {
        let mut c = self.lab.connect_from(src, self.router.addr(l));
        c.send(bytes);
        let (out, closed) = c.read_all();
        assert!(
            closed,
            "router did not close after {:?}",
            String::from_utf8_lossy(&out)
        );
        (status(&out), out)
    }

    /// Sends `bytes` (a head, possibly with early payload) and expects a tunnel to upstream
    /// `name`; checks the echo of `probe` through it.
    fn tunnel(&self, src: IpAddr, l: usize, bytes: &[u8], name: &str) {
        let mut c = self.lab.connect_from(src, self.router.addr(l));
        c.send(bytes);
        let head = c.read_until(b"\r\n\r\n");
        assert!(
            head.starts_with(b"HTTP/1.1 200 "),
            "expected 200, got {:?}",
            String::from_utf8_lossy(&head)
        );
        let greeting = format!("{name}\n");
        let mut seen = head[head
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("head end")
            + 4..]
            .to_vec();
        if !seen.starts_with(greeting.as_bytes()) {
            seen.extend(c.read_until(greeting.as_bytes()));
        }
        assert!(
            seen.starts_with(greeting.as_bytes()),
            "{:?}",
            String::from_utf8_lossy(&seen)
        );
        c.send(b"probe-bytes");
        let echoed = c.read_until(b"probe-bytes");
        assert!(echoed.ends_with(b"probe-bytes"));
    }
}

fn a() -> IpAddr {
    SHOOT_A.into()
}
fn b() -> IpAddr {
    SHOOT_B.into()
}
fn hdr(name: &str, value: &str) -> String {
    format!("{name}: {value}")
}

#[test]
fn routes_by_each_header_name_and_refuses_bad_routing_headers() {
    let s = setup();
    let va = vpn("shoot--p--a");
    s.tunnel(
        b(),
        0,
        &connect(&[hdr("X-Gardener-Destination", &va)]),
        "U1",
    );
    s.tunnel(
        b(),
        0,
        &connect(&[hdr("X-Gardener-API-Route", &kapi("shoot--p--a"))]),
        "U2",
    );
    s.tunnel(b(), 1, &connect(&[hdr("Reversed-VPN", &va)]), "U1");
    s.tunnel(
        b(),
        0,
        &connect(&[hdr("x-gardener-destination", &va)]),
        "U1",
    );
    // Bytes sent right behind the head are forwarded after the 200.
    let mut early = connect(&[hdr("X-Gardener-Destination", &va)]);
    early.extend_from_slice(b"EARLY");
    let mut c = s.lab.connect_from(b(), s.router.addr(0));
    c.send(&early);
    let got = c.read_until(b"U1\nEARLY");
    assert!(got.starts_with(b"HTTP/1.1 200 "));
    drop(c);

    let before = s.connects();
    assert_eq!(before, 5);
    let long = format!(
        "outbound|1194||vpn-seed-server.{}.svc.cluster.local",
        ["a"; 130].join(".")
    );
    let bad_values = [
        "outbound|443||vpn-seed-server.shoot--p--a.svc.cluster.local".to_owned(),
        "outbound|1194||kube-apiserver.shoot--p--a.svc.cluster.local".to_owned(),
        format!("{va}|extra"),
        "outbound|1194|v1|vpn-seed-server.shoot--p--a.svc.cluster.local".to_owned(),
        "outbound|1194||VPN-SEED-SERVER.shoot--p--a.svc.cluster.local".to_owned(),
        format!("{va}."),
        long,
        "outbound|1194||vpn-seed-server.shoot%2D-p--a.svc.cluster.local".to_owned(),
        "outbound|1194||vpn-seed-server..svc.cluster.local".to_owned(),
        String::new(),
    ];
    for value in &bad_values {
        let (code, _) = s.refused(b(), 0, &connect(&[hdr("X-Gardener-Destination", value)]));
        assert_eq!(code, Some(400), "value {value:?}");
    }
    let cases: Vec<(usize, Vec<String>)> = vec![
        (0, vec![]),
        (0, vec![hdr("Reversed-VPN", &va)]),
        (1, vec![hdr("X-Gardener-Destination", &va)]),
        (
            0,
            vec![
                hdr("X-Gardener-Destination", &va),
                hdr("X-Gardener-Destination", &vpn("shoot--p--ab")),
            ],
        ),
        (
            0,
            vec![
                hdr("X-Gardener-Destination", &va),
                hdr("X-Gardener-API-Route", &kapi("shoot--p--a")),
            ],
        ),
        (
            0,
            vec![
                hdr("X-Gardener-Destination", &va),
                hdr("X-Gardener-Destination", &va),
            ],
        ),
        (0, vec![hdr("X-Gardener-Destination", &vpn("shoot--p--zz"))]),
    ];
    for (l, headers) in &cases {
        let (code, _) = s.refused(b(), *l, &connect(headers));
        assert_eq!(code, Some(400), "listener {l}, headers {headers:?}");
    }
    assert_eq!(
        s.connects(),
        before,
        "a refused request reached an upstream"
    );

    let (code, _) = s.refused(
        b(),
        0,
        &connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--dead"))]),
    );
    assert_eq!(code, Some(503));
}

#[test]
fn allow_lists_are_per_exact_target_and_match_mapped_peers() {
    let s = setup();
    let x = |ns: &str| connect(&[hdr("X-Gardener-Destination", &vpn(ns))]);
    assert_eq!(s.refused(a(), 0, &x("shoot--p--a")).0, Some(403));
    s.tunnel(b(), 0, &x("shoot--p--a"), "U1");
    s.tunnel(a(), 0, &x("shoot--p--ab"), "U1");
    s.tunnel(a(), 0, &x("shoot--p--a-b"), "U1");
    assert_eq!(
        s.refused(
            a(),
            0,
            &connect(&[hdr("X-Gardener-API-Route", &kapi("shoot--p--a"))])
        )
        .0,
        Some(403)
    );
    // The [::] listener sees IPv4 clients as ::ffff:10.79.0.x; the IPv4 CIDR must match.
    s.tunnel(b(), 2, &x("shoot--p--a"), "U1");
    assert_eq!(s.refused(a(), 2, &x("shoot--p--a")).0, Some(403));
    // Native IPv6 clients match IPv6 CIDRs.
    let v6 = |host: &str| -> IpAddr { host.parse().unwrap() };
    let v6_listener = SocketAddr::new(v6("fd79::1"), s.router.addrs[2].port());
    let mut c = s.lab.connect_from(v6("fd79::3"), v6_listener);
    c.send(&x("shoot--p--a"));
    assert!(c.read_until(b"U1\n").starts_with(b"HTTP/1.1 200 "));
    let mut c = s.lab.connect_from(v6("fd79::2"), v6_listener);
    c.send(&x("shoot--p--a"));
    let (out, closed) = c.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(403));
    // 5 tunnels opened above; the denials opened none.
    assert_eq!(s.connects(), 5);
}

fn v1(line: &str) -> Vec<u8> {
    line.as_bytes().to_vec()
}

fn v2(header: &ProxyHeader) -> Vec<u8> {
    header.to_bytes().expect("encode v2")
}

fn sock(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

#[test]
fn proxy_protocol_headers_set_the_client_and_malformed_ones_close() {
    let s = setup();
    let va = connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--a"))]);
    let vab = connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--ab"))]);
    let with = |pp: Vec<u8>, head: &[u8]| [pp, head.to_vec()].concat();

    // The load balancer (10.79.0.2, itself not allowed) speaks for 10.79.0.3 (allowed).
    s.tunnel(
        a(),
        3,
        &with(v1("PROXY TCP4 10.79.0.3 10.79.0.1 40000 8443\r\n"), &va),
        "U1",
    );
    assert_eq!(
        s.refused(
            a(),
            3,
            &with(v1("PROXY TCP4 10.79.0.2 10.79.0.1 40000 8443\r\n"), &va)
        )
        .0,
        Some(403)
    );
    s.tunnel(
        a(),
        3,
        &with(v1("PROXY TCP6 fd79::3 fd79::1 40000 8443\r\n"), &va),
        "U1",
    );
    s.tunnel(
        a(),
        3,
        &with(
            v1("PROXY TCP6 ::ffff:10.79.0.3 fd79::1 40000 8443\r\n"),
            &va,
        ),
        "U1",
    );
    // UNKNOWN and LOCAL: the TCP peer (the balancer) is the client.
    s.tunnel(a(), 3, &with(v1("PROXY UNKNOWN\r\n"), &vab), "U1");
    assert_eq!(
        s.refused(a(), 3, &with(v1("PROXY UNKNOWN ffff\r\n"), &va))
            .0,
        Some(403)
    );
    let mut tlvs =
        ProxyHeader::tcp(Version::V2, sock("10.79.0.3:40000"), sock("10.79.0.1:8443")).unwrap();
    tlvs.tlvs = vec![
        Tlv {
            kind: PP2_TYPE_AUTHORITY,
            value: b"api.example".to_vec(),
        },
        Tlv {
            kind: PP2_TYPE_NOOP,
            value: vec![0; 7],
        },
    ];
    s.tunnel(a(), 3, &with(v2(&tlvs), &va), "U1");
    s.tunnel(a(), 3, &with(v2(&ProxyHeader::local()), &vab), "U1");
    assert_eq!(
        s.refused(a(), 3, &with(v2(&ProxyHeader::local()), &va)).0,
        Some(403)
    );
    let opened = s.connects();
    assert_eq!(opened, 6);

    // Malformed headers: closed without an answer.
    let good_v2 =
        v2(
            &ProxyHeader::tcp(Version::V2, sock("10.79.0.3:40000"), sock("10.79.0.1:8443"))
                .unwrap(),
        );
    let mut wrong_version = good_v2.clone();
    wrong_version[12] = 0x31;
    let mut truncated = good_v2[..16].to_vec();
    truncated[14..16].copy_from_slice(&8u16.to_be_bytes());
    truncated.extend_from_slice(&good_v2[16..24]);
    let mut tlv_overrun = good_v2[..28].to_vec();
    tlv_overrun[14..16].copy_from_slice(&15u16.to_be_bytes());
    tlv_overrun.extend_from_slice(&[PP2_TYPE_NOOP, 0x00, 0x05]);
    let mut no_crlf = b"PROXY TCP4 10.79.0.3 10.79.0.1 40000 8443".to_vec();
    no_crlf.resize(120, b' ');
    let malformed: Vec<(&str, Vec<u8>)> = vec![
        (
            "double space",
            v1("PROXY TCP4  10.79.0.3 10.79.0.1 40000 8443\r\n"),
        ),
        (
            "leading zeros",
            v1("PROXY TCP4 10.79.0.03 10.79.0.1 40000 8443\r\n"),
        ),
        (
            "port leading zero",
            v1("PROXY TCP4 10.79.0.3 10.79.0.1 040000 8443\r\n"),
        ),
        ("no CRLF within 107 bytes", no_crlf),
        ("wrong version nibble", wrong_version),
        ("truncated address block", truncated),
        ("TLV overrunning the header", tlv_overrun),
        ("no header at all", Vec::new()),
    ];
    for (what, pp) in malformed {
        let (code, out) = s.refused(a(), 3, &with(pp, &va));
        assert_eq!(
            (code, out.len()),
            (None, 0),
            "{what}: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    // A valid header from outside the trusted networks: closed unread.
    let (code, out) = s.refused(
        b(),
        3,
        &with(v1("PROXY TCP4 10.79.0.3 10.79.0.1 1 2\r\n"), &va),
    );
    assert_eq!((code, out.len()), (None, 0));
    // A second header behind the balancer's is HTTP, and bad HTTP.
    let twice = [
        v1("PROXY TCP4 10.79.0.2 10.79.0.1 1 2\r\n"),
        v1("PROXY TCP4 10.79.0.3 10.79.0.1 1 2\r\n"),
        va.clone(),
    ]
    .concat();
    assert_eq!(s.refused(a(), 3, &twice).0, Some(400));
    let twice_v2 = [
        v1("PROXY TCP4 10.79.0.2 10.79.0.1 1 2\r\n"),
        good_v2.clone(),
        va.clone(),
    ]
    .concat();
    assert_eq!(s.refused(a(), 3, &twice_v2).0, Some(400));
    // No header before the deadline (500 ms): closed. Nothing is sent at all.
    let mut c = s.lab.connect_from(a(), s.router.addr(3));
    let (out, closed) = c.read_all();
    assert!(closed && out.is_empty(), "{out:?}");
    // A partial header: closed too.
    let mut c = s.lab.connect_from(a(), s.router.addr(3));
    c.send(b"PROXY TCP4 10.79");
    let (out, closed) = c.read_all();
    assert!(closed && out.is_empty(), "{out:?}");

    assert_eq!(
        s.connects(),
        opened,
        "a refused connection reached an upstream"
    );
}

#[test]
fn proxy_per_source_honours_the_balancer_and_refuses_spoofed_headers() {
    let s = setup();
    let va = connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--a"))]);
    let with = |pp: Vec<u8>, head: &[u8]| [pp, head.to_vec()].concat();
    let v6 = |host: &str| -> IpAddr { host.parse().unwrap() };
    let v6_listener = SocketAddr::new(v6("fd79::1"), s.router.addrs[4].port());
    let spoof_v1 = v1("PROXY TCP4 10.79.0.3 10.79.0.1 40000 8443\r\n");
    let spoof_v2 =
        v2(
            &ProxyHeader::tcp(Version::V2, sock("10.79.0.3:40000"), sock("10.79.0.1:8443"))
                .unwrap(),
        );
    let closed_unanswered = |src: IpAddr, to: SocketAddr, bytes: &[u8]| {
        let mut c = s.lab.connect_from(src, to);
        c.send(bytes);
        let (out, closed) = c.read_all();
        assert!(closed, "not closed");
        assert!(
            out.is_empty(),
            "answered: {:?}",
            String::from_utf8_lossy(&out)
        );
    };

    // The load balancer (10.79.0.2, itself not allowed) speaks for 10.79.0.3 (allowed), on
    // the IPv6 listener as a mapped peer; v1 and v2.
    s.tunnel(a(), 4, &with(spoof_v1.clone(), &va), "U1");
    s.tunnel(a(), 4, &with(spoof_v2.clone(), &va), "U1");
    // Its header naming a client that is not allowed is judged by the header: 403.
    assert_eq!(
        s.refused(
            a(),
            4,
            &with(v1("PROXY TCP4 10.79.0.2 10.79.0.1 40000 8443\r\n"), &va)
        )
        .0,
        Some(403)
    );
    // The balancer without a header: closed unanswered (it would be judged as itself).
    closed_unanswered(a(), s.router.addr(4), &va);
    let opened = s.connects();
    assert_eq!(opened, 2);

    // Everyone else on the same port: plain requests judged by the TCP peer ...
    s.tunnel(b(), 4, &va, "U1");
    let mut c = s.lab.connect_from(v6("fd79::3"), v6_listener);
    c.send(&va);
    assert!(c.read_until(b"U1\n").starts_with(b"HTTP/1.1 200 "));
    drop(c);
    let mut c = s.lab.connect_from(v6("fd79::2"), v6_listener);
    c.send(&va);
    let (out, closed) = c.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(403), "fd79::2 is not on the allow-list");
    let opened = s.connects();
    assert_eq!(opened, 4);
    // ... and a PROXY header from them is spoofing: closed unanswered, whatever it claims,
    // from an address that is not allowed (fd79::2) or one that is (10.79.0.3).
    let before = s
        .router
        .counters
        .proxy_refused_total(ProxyRefusal::Forbidden);
    for header in [&spoof_v1, &spoof_v2] {
        closed_unanswered(v6("fd79::2"), v6_listener, &with(header.clone(), &va));
        closed_unanswered(b(), s.router.addr(4), &with(header.clone(), &va));
    }
    // Split across reads: the signature is recognised once complete.
    let mut c = s.lab.connect_from(v6("fd79::2"), v6_listener);
    c.send(b"PRO");
    std::thread::sleep(std::time::Duration::from_millis(50));
    c.send(&with(b"XY UNKNOWN\r\n".to_vec(), &va));
    let (out, closed) = c.read_all();
    assert!(closed && out.is_empty(), "{out:?}");
    assert_eq!(
        s.router
            .counters
            .proxy_refused_total(ProxyRefusal::Forbidden),
        before + 5
    );
    assert_eq!(
        s.router
            .counters
            .proxy_refused_total(ProxyRefusal::Malformed),
        1
    );
    assert_eq!(
        s.connects(),
        opened,
        "a refused connection reached an upstream"
    );
}

/// The rules model (`[[route.rule]]`): order, the address each rule and each always-allowed
/// list judges, IPv6, and routes whose namespaces are prefixes of each other.
///
/// Listener 0 takes plain requests on 10.79.0.1; listener 1 (`[::]`) takes PROXY headers
/// from the "load balancer" 10.79.0.2 and plain requests from everyone else.
fn rules_config(u1: SocketAddr, u2: SocketAddr) -> String {
    format!(
        r#"
always_allowed = ["10.79.0.99/32"]
always_allowed_peers = ["fd79::3/128"]

[[listener]]
address = "10.79.0.1:0"
headers = ["X-Gardener-Destination"]

[[listener]]
address = "[::]:0"
headers = ["X-Gardener-Destination"]
proxy_protocol = "from-trusted"
trusted_proxies = ["10.79.0.2/32"]

# shoot--p--a: everyone in the lab but 10.79.0.3.
[[route]]
value = "{a}"
upstream = "{u1}"
[[route.rule]]
action = "deny"
from = ["10.79.0.3/32"]
[[route.rule]]
action = "allow"
from = ["10.79.0.0/24", "fd79::/64"]

# shoot--p--ab: no rules, anyone.
[[route]]
value = "{ab}"
upstream = "{u1}"

# shoot--p--a's API server: only through the load balancer (judged by the TCP peer).
[[route]]
value = "{kapi}"
upstream = "{u2}"
[[route.rule]]
action = "allow"
from = ["10.79.0.2/32"]
source = "peer"

# shoot--p--a-b: nobody but the always-allowed.
[[route]]
value = "{a_b}"
upstream = "{u1}"
[[route.rule]]
action = "deny"
from = ["0.0.0.0/0", "::/0"]
"#,
        a = vpn("shoot--p--a"),
        ab = vpn("shoot--p--ab"),
        a_b = vpn("shoot--p--a-b"),
        kapi = kapi("shoot--p--a"),
    )
}

#[test]
fn rules_first_match_wins_by_their_own_source_and_always_allowed_comes_first() {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let u2 = lab.upstream("U2", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &rules_config(u1.addr, u2.addr));
    let v6 = |host: &str| -> IpAddr { host.parse().unwrap() };
    let l0 = router.addr(0);
    let l1_v4 = router.addr(1);
    let l1_v6 = SocketAddr::new(v6("fd79::1"), router.addrs[1].port());
    let head = |value: &str| connect(&[hdr("X-Gardener-Destination", value)]);
    let lb = |client: &str, value: &str| {
        let family = if client.contains(':') { "TCP6" } else { "TCP4" };
        let dst = if client.contains(':') {
            "fd79::1"
        } else {
            "10.79.0.1"
        };
        [
            format!("PROXY {family} {client} {dst} 40000 8443\r\n").into_bytes(),
            head(value),
        ]
        .concat()
    };
    // The status a request gets (200 only with the upstream's greeting).
    let answer = |src: IpAddr, to: SocketAddr, bytes: &[u8]| -> Option<u16> {
        let mut c = lab.connect_from(src, to);
        c.send(bytes);
        let (mut out, _) = c.read_all_until(b"\r\n\r\n");
        let code = status(&out);
        if code == Some(200) {
            // The greeting, unless it came with the head.
            if out.ends_with(b"\r\n\r\n") {
                out.extend(c.read_until(b"\n"));
            }
            assert!(
                out.ends_with(b"U1\n") || out.ends_with(b"U2\n"),
                "{:?}",
                String::from_utf8_lossy(&out)
            );
        }
        code
    };
    let (va, vab, va_b, ka) = (
        vpn("shoot--p--a"),
        vpn("shoot--p--ab"),
        vpn("shoot--p--a-b"),
        kapi("shoot--p--a"),
    );
    let cases: Vec<(&str, IpAddr, SocketAddr, Vec<u8>, u16)> = vec![
        // Order: the deny for 10.79.0.3 before the allow for its /24.
        ("a direct", a(), l0, head(&va), 200),
        ("b denied by rule 1", b(), l0, head(&va), 403),
        ("b mapped on [::]", b(), l1_v4, head(&va), 403),
        (
            "fd79::2 allowed by rule 2",
            v6("fd79::2"),
            l1_v6,
            head(&va),
            200,
        ),
        // Behind the balancer the header's client is judged.
        ("lb for .3", a(), l1_v4, lb("10.79.0.3", &va), 403),
        ("lb for .7", a(), l1_v4, lb("10.79.0.7", &va), 200),
        ("lb for fd79::9", a(), l1_v4, lb("fd79::9", &va), 200),
        ("lb for outsider", a(), l1_v4, lb("192.0.2.1", &va), 403),
        // A namespace that extends shoot--p--a has its own (empty) rules.
        ("b to ab", b(), l0, head(&vab), 200),
        (
            "lb for outsider to ab",
            a(),
            l1_v4,
            lb("192.0.2.1", &vab),
            200,
        ),
        ("fd79::2 to ab", v6("fd79::2"), l1_v6, head(&vab), 200),
        // A rule on the TCP peer: only through the balancer, whoever it speaks for.
        (
            "lb for outsider to kapi",
            a(),
            l1_v4,
            lb("192.0.2.1", &ka),
            200,
        ),
        ("b to kapi", b(), l0, head(&ka), 403),
        ("fd79::2 to kapi", v6("fd79::2"), l1_v6, head(&ka), 403),
        // Deny-all: only the always-allowed, each list judging its own address.
        ("a to a-b", a(), l0, head(&va_b), 403),
        ("fd79::2 to a-b", v6("fd79::2"), l1_v6, head(&va_b), 403),
        (
            "fd79::3 (peer list) to a-b",
            v6("fd79::3"),
            l1_v6,
            head(&va_b),
            200,
        ),
        (
            "lb for fd79::3 to a-b",
            a(),
            l1_v4,
            lb("fd79::3", &va_b),
            403,
        ),
        (
            "lb for 10.79.0.99 to a-b",
            a(),
            l1_v4,
            lb("10.79.0.99", &va_b),
            200,
        ),
    ];
    let mut opened = 0;
    for (what, src, to, bytes, want) in &cases {
        assert_eq!(answer(*src, *to, bytes), Some(*want), "{what}");
        opened += usize::from(*want == 200);
    }
    assert_eq!(
        u1.connects() + u2.connects(),
        opened,
        "a denied request reached an upstream"
    );
}

#[test]
fn http_strictness() {
    let s = setup();
    let route = hdr("X-Gardener-Destination", &vpn("shoot--p--a"));
    // Slow headers: part of a head, then silence past the 1 s header deadline.
    let mut c = s.lab.connect_from(b(), s.router.addr(0));
    c.send(b"CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: 10.79.0.1\r\n");
    let (out, closed) = c.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(408));

    let mut long_line = b"CONNECT ".to_vec();
    long_line.resize(3000, b'a');
    long_line.extend_from_slice(b":1194 HTTP/1.1\r\n\r\n");
    assert_eq!(s.refused(b(), 0, &long_line).0, Some(414));
    let mut big = b"CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: 10.79.0.1\r\n".to_vec();
    while big.len() < 32 * 1024 {
        big.extend_from_slice(format!("X-Pad-{}: {}\r\n", big.len(), "p".repeat(100)).as_bytes());
    }
    big.extend_from_slice(format!("{route}\r\n\r\n").as_bytes());
    assert_eq!(s.refused(b(), 0, &big).0, Some(431));

    let raw = |text: String| text.into_bytes();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "whitespace before colon",
            raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: x\r\nX-Gardener-Destination : {}\r\n\r\n", vpn("shoot--p--a"))),
            400,
        ),
        (
            "obs-fold",
            raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: x\r\n{route}\r\nX-Other: a\r\n b\r\n\r\n")),
            400,
        ),
        ("GET", raw(format!("GET / HTTP/1.1\r\nHost: x\r\n{route}\r\n\r\n")), 405),
        ("POST", raw(format!("POST / HTTP/1.1\r\nHost: x\r\n{route}\r\nContent-Length: 2\r\n\r\nhi")), 405),
        (
            "CONNECT with Content-Length",
            raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: x\r\n{route}\r\nContent-Length: 5\r\n\r\nhello")),
            400,
        ),
        (
            "CONNECT with Transfer-Encoding",
            raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: x\r\n{route}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")),
            400,
        ),
        ("origin-form target", raw(format!("CONNECT / HTTP/1.1\r\nHost: x\r\n{route}\r\n\r\n")), 400),
        ("no Host in HTTP/1.1", raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\r\n{route}\r\n\r\n")), 400),
        ("bare LF", raw(format!("CONNECT 10.79.0.1:1194 HTTP/1.1\nHost: x\n{route}\n\n")), 400),
        // Bytes no request can start with: answered at once, not left to the header deadline
        // (its answer would be 408).
        ("a TLS record header", vec![0x16, 0x03, 0x01, 0x00, 0xc8], 400),
        (
            "a PROXY v2 header where none is taken",
            protocol::proxy_protocol::V2_SIGNATURE.to_vec(),
            400,
        ),
    ];
    for (what, bytes, want) in cases {
        let (code, out) = s.refused(b(), 0, &bytes);
        assert_eq!(
            code,
            Some(want),
            "{what}: {:?}",
            String::from_utf8_lossy(&out)
        );
        if want == 405 {
            assert!(
                out.windows(15).any(|w| w == b"Allow: CONNECT\r"),
                "{what}: no Allow"
            );
        }
    }
    // A valid CONNECT pipelined behind a refused request is never parsed or forwarded: one
    // answer, then the close.
    let valid = connect(std::slice::from_ref(&route));
    for first in [
        raw(format!("GET / HTTP/1.1\r\nHost: x\r\n{route}\r\n\r\n")),
        raw(format!(
            "CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: x\r\n{route}\r\nContent-Length: 5\r\n\r\n"
        )),
        connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--zz"))]),
    ] {
        let (code, out) = s.refused(b(), 0, &[first, valid.clone()].concat());
        let answers = out.windows(9).filter(|w| w == b"HTTP/1.1 ").count();
        assert_eq!(answers, 1, "{:?}", String::from_utf8_lossy(&out));
        assert_ne!(code, Some(200));
    }
    assert_eq!(s.connects(), 0, "a refused request reached an upstream");
}

#[test]
fn connections_over_the_limit_get_503() {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "max_connections = 2\n\n[[listener]]\naddress = \"10.79.0.1:0\"\n\
         headers = [\"X-Gardener-Destination\"]\n\n[[route]]\nvalue = \"{}\"\nupstream = \"{}\"\n",
        vpn("shoot--p--ab"),
        u1.addr
    );
    let router = lab.router(&dir, &text);
    let head = connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--ab"))]);
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = lab.connect_from(b(), router.addr(0));
        c.send(&head);
        assert!(c.read_until(b"U1\n").starts_with(b"HTTP/1.1 200 "));
        open.push(c);
    }
    let mut third = lab.connect_from(b(), router.addr(0));
    let (out, closed) = third.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(503));
    // A slot frees when a tunnel ends.
    drop(open.pop());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mut c = lab.connect_from(b(), router.addr(0));
        c.send(&head);
        let (out, _) = c.read_all_until(b"U1\n");
        if status(&out) == Some(200) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the slot never freed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(u1.connects(), 3);
}
