//! The router's TLS SNI passthrough listener (`kind = "sni"`) against real TLS in lab
//! namespaces: three kube-apiserver-like HTTPS upstreams, each with its own certificate for
//! its shoot's API names; clients doing real TLS through the router (our OpenSSL client,
//! `curl`, `openssl s_client`) get their shoot's certificate and its HTTP answer. Refusals
//! (no server name, unknown name, HTTP, garbage, too large, too slow, the route's rules, a
//! spoofed PROXY header) are each closed unanswered, reach no upstream and are counted in
//! the router's `/metrics` text.
//!
//! Listeners of [`config`]: 0 on 10.79.0.1 without PROXY; 1 on `[::]` with PROXY per
//! source (required from the "load balancer" 10.79.0.2, forbidden from everyone else).

// Test helpers outside `#[test]` functions build the PKI and the TLS sessions.
#![allow(clippy::unwrap_used)]

mod router_common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::wait::wait_until;
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslConnector, SslMethod, SslVerifyMode};
use openssl::x509::extension::{BasicConstraints, ExtendedKeyUsage, SubjectAlternativeName};
use openssl::x509::{X509Name, X509};
use router_common::*;
use vpn_router::ProxyRefusal;

/// The shoots: their short name and API names (the first also the certificate's CN).
const SHOOTS: [(&str, &[&str]); 3] = [
    ("a", &["api.shoot--p--a.example.com"]),
    ("b", &["api.shoot--p--b.example.com"]),
    (
        "c",
        &[
            "api.shoot--p--c.example.com",
            "api.internal.shoot--p--c.example.com",
        ],
    ),
];

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(cn: &str) -> X509Name {
    let mut n = X509Name::builder().unwrap();
    n.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    n.build()
}

/// A self-signed CA, and per shoot a server certificate for its names signed by it.
struct Pki {
    ca: X509,
    servers: Vec<(X509, PKey<Private>)>,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = key();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap())
            .unwrap();
        b.set_subject_name(&name("sni test CA")).unwrap();
        b.set_issuer_name(&name("sni test CA")).unwrap();
        b.set_pubkey(&ca_key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::days_from_now(2).unwrap())
            .unwrap();
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.sign(&ca_key, MessageDigest::sha256()).unwrap();
        let ca = b.build();
        let mut servers = Vec::new();
        for (i, (_, names)) in SHOOTS.iter().enumerate() {
            let k = key();
            let mut b = X509::builder().unwrap();
            b.set_version(2).unwrap();
            let serial = BigNum::from_u32(10 + i as u32).unwrap();
            b.set_serial_number(&serial.to_asn1_integer().unwrap())
                .unwrap();
            b.set_subject_name(&name(names[0])).unwrap();
            b.set_issuer_name(ca.subject_name()).unwrap();
            b.set_pubkey(&k).unwrap();
            b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
                .unwrap();
            b.set_not_after(&Asn1Time::days_from_now(2).unwrap())
                .unwrap();
            let mut san = SubjectAlternativeName::new();
            for n in *names {
                san.dns(n);
            }
            let ctx = b.x509v3_context(Some(&ca), None);
            let san = san.build(&ctx).unwrap();
            b.append_extension(san).unwrap();
            b.append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
                .unwrap();
            b.sign(&ca_key, MessageDigest::sha256()).unwrap();
            servers.push((b.build(), k));
        }
        Pki { ca, servers }
    }
}

/// A kube-apiserver-like HTTPS upstream in SEED: counts the TCP connections it accepts,
/// answers every request with `shoot=<name>`.
struct TlsUpstream {
    addr: SocketAddr,
    connects: Arc<AtomicUsize>,
}

fn tls_upstream(lab: &Lab, shoot: &str, cert: &X509, key: &PKey<Private>) -> TlsUpstream {
    let listener = lab
        .seed
        .run_in(|| std::net::TcpListener::bind((SEED, 0)))
        .expect("run_in")
        .expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    b.set_certificate(cert).unwrap();
    b.set_private_key(key).unwrap();
    let acceptor = Arc::new(b.build());
    let connects = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connects);
    let body = format!("shoot={shoot}\n");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = Arc::clone(&acceptor);
            let body = body.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(WAIT));
                let Ok(mut tls) = acceptor.accept(conn) else {
                    return;
                };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes());
                let _ = tls.shutdown();
            });
        }
    });
    TlsUpstream { addr, connects }
}

fn config(up: &[TlsUpstream]) -> String {
    format!(
        r#"
[timeouts]
proxy_header_ms = 1000
header_ms = 1000

[[listener]]
address = "10.79.0.1:0"
kind = "sni"

[[listener]]
address = "[::]:0"
kind = "sni"
proxy_protocol = "from-trusted"
trusted_proxies = ["10.79.0.2/32"]

# a: anyone; its tunnels count in shoot--p--a's series.
[[sni_route]]
server_names = ["api.shoot--p--a.example.com"]
upstream = "{a}"
shoot = "shoot--p--a"

# b: anyone but 10.79.0.2; no shoot named (router-wide series only).
[[sni_route]]
server_names = ["api.shoot--p--b.example.com"]
upstream = "{b}"
[[sni_route.rule]]
action = "deny"
from = ["10.79.0.2"]
[[sni_route.rule]]
action = "allow"
from = ["0.0.0.0/0", "::/0"]

# c: only 10.79.0.3, by either of its names.
[[sni_route]]
server_names = ["api.shoot--p--c.example.com", "API.Internal.shoot--p--c.example.com"]
upstream = "{c}"
allow = ["10.79.0.3/32"]
shoot = "shoot--p--c"
"#,
        a = up[0].addr,
        b = up[1].addr,
        c = up[2].addr,
    )
}

struct Setup {
    lab: Lab,
    pki: Pki,
    up: Vec<TlsUpstream>,
    router: RouterGuard,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let lab = Lab::new(&[]);
    let pki = Pki::new();
    let up: Vec<TlsUpstream> = SHOOTS
        .iter()
        .zip(&pki.servers)
        .map(|((shoot, _), (cert, key))| tls_upstream(&lab, shoot, cert, key))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &config(&up));
    Setup {
        lab,
        pki,
        up,
        router,
        dir,
    }
}

fn a() -> IpAddr {
    SHOOT_A.into()
}
fn b() -> IpAddr {
    SHOOT_B.into()
}

impl Setup {
    fn connects(&self) -> usize {
        self.up
            .iter()
            .map(|u| u.connects.load(Ordering::SeqCst))
            .sum()
    }

    /// Trusts the lab CA and verifies the upstream's certificate.
    fn connector(&self) -> SslConnector {
        let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
        b.cert_store_mut().add_cert(self.pki.ca.clone()).unwrap();
        b.set_verify(SslVerifyMode::PEER);
        b.build()
    }

    /// A TLS session with `server_name` through `stream` (after whatever was sent on it):
    /// the certificate's CN and the answer to `GET /`.
    fn https(&self, stream: TcpStream, server_name: &str) -> Result<(String, String), String> {
        let connector = self.connector();
        let mut tls = connector
            .connect(server_name, stream)
            .map_err(|e| format!("handshake: {e}"))?;
        let cert = tls.ssl().peer_certificate().ok_or("no certificate")?;
        let cn = cert
            .subject_name()
            .entries_by_nid(Nid::COMMONNAME)
            .next()
            .map(|e| String::from_utf8_lossy(e.data().as_slice()).into_owned())
            .unwrap_or_default();
        tls.write_all(format!("GET / HTTP/1.1\r\nHost: {server_name}\r\n\r\n").as_bytes())
            .map_err(|e| format!("request: {e}"))?;
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer);
        Ok((cn, answer))
    }

    /// Connects from `src` to listener `l`, sends `before` (e.g. a PROXY header), then does
    /// TLS with `server_name`; asserts it reached shoot `shoot`.
    fn reaches(&self, src: IpAddr, to: SocketAddr, before: &[u8], server_name: &str, shoot: &str) {
        let mut c = self.lab.connect_from(src, to);
        c.send(before);
        let (cn, answer) = self
            .https(c.stream, server_name)
            .unwrap_or_else(|e| panic!("{server_name} from {src} via {to}: {e}"));
        let (_, names) = SHOOTS.iter().find(|(s, _)| *s == shoot).unwrap();
        assert_eq!(cn, names[0], "{server_name}: certificate");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
        assert!(answer.ends_with(&format!("shoot={shoot}\n")), "{answer:?}");
    }

    /// Connects from `src`, sends `bytes`, and expects a close without a byte back.
    fn closed(&self, src: IpAddr, to: SocketAddr, bytes: &[u8], what: &str) {
        let mut c = self.lab.connect_from(src, to);
        // The router may close (and reset) while the bytes are still going out.
        let _ = c.stream.write_all(bytes);
        let (out, closed) = c.read_all();
        assert!(closed, "{what}: not closed");
        assert!(out.is_empty(), "{what}: answered {out:?}");
    }

    /// Connects from `src` and does TLS with `server_name` (or none), which must fail.
    fn tls_refused(&self, src: IpAddr, to: SocketAddr, before: &[u8], server_name: Option<&str>) {
        let mut c = self.lab.connect_from(src, to);
        c.send(before);
        let result = match server_name {
            Some(n) => self.https(c.stream, n).map(|_| ()),
            None => {
                let connector = self.connector();
                let mut config = connector.configure().unwrap();
                config.set_use_server_name_indication(false);
                config.set_verify_hostname(false);
                config
                    .connect("unused", c.stream)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        assert!(result.is_err(), "{server_name:?} from {src}: TLS succeeded");
    }

    fn refused_total(&self, reason: &str) -> u64 {
        self.router.counters.sni.refused_total(reason)
    }
}

fn proxy_v1(client: &str, family: &str, dst: &str) -> Vec<u8> {
    format!("PROXY {family} {client} {dst} 40000 443\r\n").into_bytes()
}

#[test]
fn routes_each_shoot_by_its_server_name_with_real_tls() {
    let s = setup();
    let l0 = s.router.addr(0);
    for (shoot, names) in SHOOTS {
        for n in names {
            s.reaches(b(), l0, b"", n, shoot);
        }
    }
    // Case does not matter (DNS names; OpenSSL matches the certificate the same way).
    s.reaches(b(), l0, b"", "API.SHOOT--P--A.Example.Com", "a");
    s.reaches(b(), l0, b"", "api.INTERNAL.shoot--p--c.example.com", "c");
    // The dual-stack listener, an IPv6 client with its own address (no PROXY header).
    let v6 = SocketAddr::new("fd79::1".parse().unwrap(), s.router.addrs[1].port());
    s.reaches(
        "fd79::3".parse().unwrap(),
        v6,
        b"",
        "api.shoot--p--a.example.com",
        "a",
    );
    assert_eq!(s.connects(), 7);
    assert_eq!(s.router.counters.sni.tunnels_total(), 7);
    let text = s.router.counters.render();
    assert!(text.contains("vpn_router_sni_tunnels_total 7\n"), "{text}");
    for label in ["not_tls", "malformed", "no_sni", "unknown", "denied"] {
        assert_eq!(s.refused_total(label), 0, "{label}");
    }
    // Per shoot: a's three tunnels (two names' cases and IPv6) and c's three (both names);
    // b's route names no shoot, so b has no series.
    for shoot in ["shoot--p--a", "shoot--p--c"] {
        let line = format!("vpn_router_shoot_tunnels_total{{shoot=\"{shoot}\",flow=\"sni\"}} 3\n");
        assert!(text.contains(&line), "{line}: {text}");
    }
    assert!(!text.contains("shoot=\"shoot--p--b\""), "{text}");
    assert!(text.contains("vpn_router_shoots 2\n"), "{text}");
    // Each tunnel's bytes count for its shoot once it ended (the clients have closed).
    let bytes = |text: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(
                    "vpn_router_shoot_tunnel_bytes_total{shoot=\"shoot--p--a\",flow=\"sni\",direction=\"to_client\"} ",
                )
            })
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // At least the server's certificate chain and answer crossed, three times.
    wait_until("shoot--p--a's SNI bytes", Duration::from_secs(10), || {
        bytes(&s.router.counters.render()) > 3 * 500
    });
}

#[test]
fn refusals_close_without_an_upstream_and_are_counted() {
    let s = setup();
    let l0 = s.router.addr(0);
    // No server name.
    s.tls_refused(b(), l0, b"", None);
    assert_eq!(s.refused_total("no_sni"), 1);
    // A name no route lists (nor a prefix or suffix of one).
    for n in [
        "api.shoot--p--zz.example.com",
        "shoot--p--a.example.com",
        "x.api.shoot--p--a.example.com",
    ] {
        s.tls_refused(b(), l0, b"", Some(n));
    }
    assert_eq!(s.refused_total("unknown"), 3);
    // HTTP instead of TLS, and garbage.
    s.closed(
        b(),
        l0,
        b"GET / HTTP/1.1\r\nHost: api.shoot--p--a.example.com\r\n\r\n",
        "HTTP",
    );
    s.closed(b(), l0, b"CONNECT a:1 HTTP/1.1\r\n\r\n", "CONNECT");
    s.closed(b(), l0, &[0u8, 1, 2, 3, 4, 5, 6, 7], "zeros");
    assert_eq!(s.refused_total("not_tls"), 3);
    s.closed(b(), l0, b"\x16\x03\x01\x00\x00", "empty record");
    s.closed(
        b(),
        l0,
        b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00",
        "short hello",
    );
    assert_eq!(s.refused_total("malformed"), 2);
    // Announced larger than the bound.
    s.closed(
        b(),
        l0,
        b"\x16\x03\x01\x40\x00\x01\x00\x40\x00",
        "too large",
    );
    assert_eq!(s.refused_total("too_large"), 1);
    // Half a ClientHello, then silence past the header deadline (1 s).
    s.closed(
        b(),
        l0,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        "slow",
    );
    assert_eq!(s.refused_total("timeout"), 1);
    // The route's rules: b denies 10.79.0.2, c admits only 10.79.0.3.
    s.tls_refused(a(), l0, b"", Some("api.shoot--p--b.example.com"));
    s.tls_refused(a(), l0, b"", Some("api.shoot--p--c.example.com"));
    s.tls_refused(a(), l0, b"", Some("api.internal.shoot--p--c.example.com"));
    assert_eq!(s.refused_total("denied"), 3);
    assert_eq!(s.connects(), 0, "a refused connection reached an upstream");
    // c's two denials count for shoot--p--c; b's route names no shoot; unknown names count
    // for nobody.
    let text = s.router.counters.render();
    let line =
        "vpn_router_shoot_refused_total{shoot=\"shoot--p--c\",flow=\"sni\",reason=\"denied\"} 2\n";
    assert!(text.contains(line), "{line}: {text}");
    let line =
        "vpn_router_shoot_refused_total{shoot=\"shoot--p--a\",flow=\"sni\",reason=\"denied\"} 0\n";
    assert!(text.contains(line), "{line}: {text}");
    // Every reason in the /metrics text.
    let text = s.router.counters.render();
    for (reason, n) in [
        ("no_sni", 1),
        ("unknown", 3),
        ("not_tls", 3),
        ("malformed", 2),
        ("too_large", 1),
        ("timeout", 1),
        ("denied", 3),
    ] {
        let line = format!("vpn_router_sni_refused_total{{reason=\"{reason}\"}} {n}\n");
        assert!(text.contains(&line), "{line}: {text}");
    }
    // The same client reaches what it may.
    s.reaches(a(), l0, b"", "api.shoot--p--a.example.com", "a");
    assert_eq!(s.connects(), 1);
}

#[test]
fn proxy_per_source_honours_the_balancer_and_refuses_spoofing() {
    let s = setup();
    let l1 = s.router.addr(1);
    let v6 = SocketAddr::new("fd79::1".parse().unwrap(), s.router.addrs[1].port());
    let c = "api.shoot--p--c.example.com";
    // The balancer (10.79.0.2, itself not allowed to c) speaks for 10.79.0.3: admitted.
    s.reaches(a(), l1, &proxy_v1("10.79.0.3", "TCP4", "10.79.0.1"), c, "c");
    // ... and for someone else: denied by the route's rules.
    s.tls_refused(
        a(),
        l1,
        &proxy_v1("10.79.0.9", "TCP4", "10.79.0.1"),
        Some(c),
    );
    assert_eq!(s.refused_total("denied"), 1);
    // The balancer without a header: closed (it would be judged as itself).
    s.tls_refused(a(), l1, b"", Some("api.shoot--p--a.example.com"));
    assert_eq!(
        s.router
            .counters
            .proxy_refused_total(ProxyRefusal::Malformed),
        1
    );
    // Anyone else: its own address (10.79.0.3 may reach c) ...
    s.reaches(b(), l1, b"", c, "c");
    // ... and a header from it is spoofing, whatever it claims: closed, counted.
    let before = s.connects();
    s.tls_refused(
        b(),
        l1,
        &proxy_v1("10.79.0.3", "TCP4", "10.79.0.1"),
        Some(c),
    );
    s.tls_refused(
        "fd79::2".parse().unwrap(),
        v6,
        &proxy_v1("fd79::3", "TCP6", "fd79::1"),
        Some(c),
    );
    assert_eq!(
        s.router
            .counters
            .proxy_refused_total(ProxyRefusal::Forbidden),
        2
    );
    assert_eq!(
        s.connects(),
        before,
        "a spoofed connection reached an upstream"
    );
    let text = s.router.counters.render();
    assert!(
        text.contains("vpn_router_proxy_refused_total{reason=\"forbidden\"} 2\n"),
        "{text}"
    );
}

/// `curl` and `openssl s_client` as independent clients, run in SHOOT.
#[test]
fn independent_clients_curl_and_openssl_s_client() {
    let s = setup();
    let port = s.router.addrs[0].port();
    let ca = s.dir.path().join("ca.pem");
    std::fs::write(&ca, s.pki.ca.to_pem().unwrap()).unwrap();
    let ca = ca.to_string_lossy().into_owned();
    for (shoot, names) in SHOOTS {
        let n = names[names.len() - 1];
        let url = format!("https://{n}:{port}/");
        let resolve = format!("{n}:{port}:{SEED}");
        let out = s
            .lab
            .shoot
            .run([
                "curl",
                "-sS",
                "--max-time",
                "5",
                "--interface",
                "10.79.0.3",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                &url,
            ])
            .unwrap_or_else(|e| panic!("curl {url}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("shoot={shoot}\n")
        );
    }
    let connect = format!("{SEED}:{port}");
    let out = s
        .lab
        .shoot
        .command("openssl")
        .args(["s_client", "-connect", &connect, "-servername"])
        .args([
            "api.shoot--p--a.example.com",
            "-CAfile",
            &ca,
            "-verify_return_error",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("CN = api.shoot--p--a.example.com")
            || text.contains("CN=api.shoot--p--a.example.com"),
        "{text}"
    );
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    // Without -servername s_client sends none for an address: refused, no certificate.
    let out = s
        .lab
        .shoot
        .command("openssl")
        .args(["s_client", "-connect", &connect, "-noservername"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("BEGIN CERTIFICATE"), "{text}");
    assert_eq!(s.refused_total("no_sni"), 1);
    assert_eq!(s.connects(), 4);
}

/// Over `max_connections` an SNI listener closes the newcomer unread (no 503: a TLS client
/// could not read it), counted as `over_limit`.
#[test]
fn over_the_connection_limit_closes_unanswered() {
    let lab = Lab::new(&[]);
    let pki = Pki::new();
    let (cert, key) = &pki.servers[0];
    let up = tls_upstream(&lab, "a", cert, key);
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "max_connections = 1\n[[listener]]\naddress = \"10.79.0.1:0\"\nkind = \"sni\"\n\
         [[sni_route]]\nserver_names = [\"api.shoot--p--a.example.com\"]\nupstream = \"{}\"\n",
        up.addr
    );
    let router = lab.router(&dir, &text);
    let mut builder = SslConnector::builder(SslMethod::tls()).unwrap();
    builder.cert_store_mut().add_cert(pki.ca.clone()).unwrap();
    let connector = builder.build();
    let first = lab.connect_from(b(), router.addr(0));
    let held = connector
        .connect("api.shoot--p--a.example.com", first.stream)
        .expect("first session");
    let mut second = lab.connect_from(b(), router.addr(0));
    let (out, closed) = second.read_all();
    assert!(closed && out.is_empty(), "{out:?}");
    assert_eq!(router.counters.sni.refused_total("over_limit"), 1);
    assert!(router
        .counters
        .render()
        .contains("vpn_router_sni_refused_total{reason=\"over_limit\"} 1\n"));
    drop(held);
    assert_eq!(up.connects.load(Ordering::SeqCst), 1);
}

/// SIGHUP swaps the SNI routes with the rest of the policy: a name taken out of the file is
/// unknown from then on, the others keep routing.
#[test]
fn sighup_swaps_the_sni_routes() {
    let s = setup();
    let l0 = s.router.addr(0);
    s.reaches(b(), l0, b"", "api.shoot--p--a.example.com", "a");
    let text = config(&s.up).replace(
        "server_names = [\"api.shoot--p--a.example.com\"]",
        "server_names = [\"api.other.example.com\"]",
    );
    std::fs::write(&s.router.path, text).expect("rewrite the config");
    // The router's handler may not be the first registered; bounded retries.
    let mut swapped = false;
    for _ in 0..50 {
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP)
            .expect("SIGHUP");
        std::thread::sleep(Duration::from_millis(100));
        let c = s.lab.connect_from(b(), l0);
        if s.https(c.stream, "api.shoot--p--a.example.com").is_err() {
            swapped = true;
            break;
        }
    }
    assert!(swapped, "the old name still routes");
    assert!(s.refused_total("unknown") >= 1);
    let a_connects = s.up[0].connects.load(Ordering::SeqCst);
    s.tls_refused(b(), l0, b"", Some("api.shoot--p--a.example.com"));
    assert_eq!(s.up[0].connects.load(Ordering::SeqCst), a_connects);
    s.reaches(b(), l0, b"", "api.shoot--p--b.example.com", "b");
}
