//! The GEP-30 apiserver-proxy (`sidecar::apiserver_proxy`) in a shoot namespace, tunnelling
//! in-cluster API traffic to a test "kube-apiserver" (an HTTPS server) in the seed namespace
//! through an HTTP CONNECT ingress that routes only requests carrying the right header: our
//! ingress router (`vpn_router`, the issue's Done-when), and the minimal
//! `conformance::connect_acceptor::ConnectAcceptor`.
//!
//! ```text
//!  SHOOT  a "pod": HTTPS GET /version ──► apiserver-proxy 127.0.0.1:6443 (right header)
//!                                         apiserver-proxy 127.0.0.1:6444 (wrong value)
//!         10.250.0.2/30 ──veth── 10.250.0.1/30  SEED
//!                          ingress :8443 (router listener honouring X-Gardener-Destination
//!                            and X-Gardener-API-Route, routes
//!                            outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local and
//!                            shoot--p--a--kube-apiserver-socket → 127.0.0.1:443; or a
//!                            ConnectAcceptor requiring X-Gardener-Destination and the first)
//!                          kube-apiserver 127.0.0.1:443 (HTTPS, answers /version)
//! ```
//!
//! * through the proxy with the configured header the pod's TLS session reaches the
//!   kube-apiserver end to end (the certificate is the apiserver's, the answer its `/version`);
//! * the same proxy with another header value gets nothing through, and the kube-apiserver
//!   saw exactly the routed connections: the header arrives with the configured value and
//!   nothing else passes the ingress (the router also counts its tunnels and one refusal);
//! * through the router, a proxy sending the other header name with the socket-shaped value
//!   gets through too (both names and both of Gardener's value shapes).

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::connect_acceptor::{ConnectAcceptor, Upstream};
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{connector, ns_runtime, Pki, SERVER_NAME, WAIT};
use openssl::ssl::SslAcceptor;
use sidecar::apiserver_proxy::{ApiserverProxy, ApiserverProxyConfig, DEFAULT_HEADER_NAME};
use vpn_client::CancellationToken;
use vpn_router::{Router, RouterConfig};

const SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const SHOOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const INGRESS_PORT: u16 = 8443;
const ROUTE: &str = "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local";
const VERSION: &str = "{\"major\":\"1\",\"minor\":\"33\"}";

/// The "kube-apiserver": HTTPS on `listener`, answering every request with `VERSION`; counts
/// connections.
fn kube_apiserver(listener: TcpListener, acceptor: SslAcceptor, count: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            count.fetch_add(1, Ordering::Relaxed);
            let Ok(mut tls) = acceptor.accept(stream) else {
                continue;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{VERSION}",
                VERSION.len()
            );
            let _ = tls.write_all(answer.as_bytes());
            let _ = tls.shutdown();
        }
    });
}

/// `GET /version` over TLS through `proxy` (call inside SHOOT); the whole response, or why not.
fn get_version(pki: &Pki, proxy: SocketAddr) -> Result<String, String> {
    let tcp = TcpStream::connect_timeout(&proxy, WAIT).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(WAIT))
        .map_err(|e| e.to_string())?;
    let mut tls = connector(&pki.bundle, Some(&pki.client))
        .connect(SERVER_NAME, tcp)
        .map_err(|e| format!("TLS: {e}"))?;
    tls.write_all(b"GET /version HTTP/1.1\r\nHost: kubernetes\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    tls.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text)
}

/// The CONNECT hop in SEED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ingress {
    Router,
    ConnectAcceptor,
}

#[test]
fn apiserver_proxy_reaches_the_kube_apiserver_through_the_router() {
    apiserver_proxy_reaches_the_kube_apiserver_only_with_the_configured_header(Ingress::Router);
}

#[test]
fn apiserver_proxy_reaches_the_kube_apiserver_through_a_connect_acceptor() {
    apiserver_proxy_reaches_the_kube_apiserver_only_with_the_configured_header(
        Ingress::ConnectAcceptor,
    );
}

/// The socket-shaped routing value (Istio's TLS termination).
const SOCKET_ROUTE: &str = "shoot--p--a--kube-apiserver-socket";
/// The header name the GEP first proposed.
const OTHER_HEADER: &str = "X-Gardener-API-Route";

/// The router's config: one listener honouring both header names, both value shapes routed
/// to the kube-apiserver.
fn router_config() -> RouterConfig {
    RouterConfig::parse(&format!(
        "[[listener]]\naddress = \"{SEED_ADDR}:{INGRESS_PORT}\"\n\
         headers = [\"{DEFAULT_HEADER_NAME}\", \"{OTHER_HEADER}\"]\n\n\
         [[route]]\nvalue = \"{ROUTE}\"\nupstream = \"127.0.0.1:443\"\n\n\
         [[route]]\nvalue = \"{SOCKET_ROUTE}\"\nupstream = \"127.0.0.1:443\"\n"
    ))
    .expect("router config")
}

fn apiserver_proxy_reaches_the_kube_apiserver_only_with_the_configured_header(ingress: Ingress) {
    require_lab(&[]);
    let pki = Pki::generate();
    let seed = Netns::new().expect("seed");
    let shoot = Netns::new().expect("shoot");
    Netns::veth_pair(&seed, "seed-shoot", &shoot, "shoot-seed").expect("veth");
    seed.run([
        "ip",
        "addr",
        "add",
        &format!("{SEED_ADDR}/30"),
        "dev",
        "seed-shoot",
    ])
    .expect("addr");
    shoot
        .run([
            "ip",
            "addr",
            "add",
            &format!("{SHOOT_ADDR}/30"),
            "dev",
            "shoot-seed",
        ])
        .expect("addr");

    // SEED: the kube-apiserver and the ingress.
    let connections = Arc::new(AtomicUsize::new(0));
    let apiserver = seed
        .run_in(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 443)))
        .expect("run in seed")
        .expect("apiserver listener");
    let acceptor = pki::tls::connect_proxy_acceptor(
        &pki.server,
        &pki.bundle,
        pki::tls::ClientCertMode::Optional,
    )
    .expect("apiserver TLS");
    kube_apiserver(apiserver, acceptor, Arc::clone(&connections));
    let seed_rt = ns_runtime(&seed);
    let mut router_counters = None;
    match ingress {
        Ingress::Router => {
            let router = seed_rt
                .block_on(async {
                    seed_rt
                        .spawn(Router::bind_config(router_config(), None))
                        .await
                })
                .expect("task")
                .expect("router bind");
            router_counters = Some(router.counters());
            seed_rt.spawn(router.run(CancellationToken::new()));
        }
        Ingress::ConnectAcceptor => {
            let listener = seed_rt
                .block_on(async {
                    seed_rt
                        .spawn(async {
                            tokio::net::TcpListener::bind((SEED_ADDR, INGRESS_PORT)).await
                        })
                        .await
                })
                .expect("task")
                .expect("ingress listener");
            seed_rt.spawn(
                ConnectAcceptor::new(Upstream::Fixed(SocketAddr::from((
                    Ipv4Addr::LOCALHOST,
                    443,
                ))))
                .require_header(DEFAULT_HEADER_NAME, ROUTE)
                .with_timeout(Duration::from_secs(5))
                .serve(listener),
            );
        }
    }

    // SHOOT: two apiserver-proxies, the second with a wrong header value.
    let shoot_rt = ns_runtime(&shoot);
    let token = CancellationToken::new();
    let ingress_addr = format!("{SEED_ADDR}:{INGRESS_PORT}");
    let mut proxies = Vec::new();
    for (port, header, value) in [
        (6443, None, ROUTE),
        (
            6444,
            None,
            "outbound|443||kube-apiserver.shoot--p--b.svc.cluster.local",
        ),
        (6445, Some(OTHER_HEADER), SOCKET_ROUTE),
    ] {
        let mut config = ApiserverProxyConfig::new(
            vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))],
            ingress_addr.clone(),
            value.into(),
        );
        assert_eq!(config.header_name, "X-Gardener-Destination");
        assert_eq!(config.target, (SEED_ADDR.to_string(), 443));
        if let Some(name) = header {
            config.header_name = name.into();
        }
        let proxy = shoot_rt
            .block_on(async { shoot_rt.spawn(ApiserverProxy::bind(config)).await })
            .expect("task")
            .expect("apiserver-proxy bind");
        proxies.push(shoot_rt.spawn(proxy.run(token.clone())));
    }

    let (good, bad, other) = shoot
        .run_in(|| {
            (
                get_version(&pki, SocketAddr::from((Ipv4Addr::LOCALHOST, 6443))),
                get_version(&pki, SocketAddr::from((Ipv4Addr::LOCALHOST, 6444))),
                get_version(&pki, SocketAddr::from((Ipv4Addr::LOCALHOST, 6445))),
            )
        })
        .expect("run in shoot");
    let good = good.expect("GET /version through the apiserver-proxy");
    assert!(good.starts_with("HTTP/1.1 200 OK\r\n"), "{good}");
    assert!(good.ends_with(VERSION), "{good}");
    assert!(
        bad.is_err(),
        "a wrong routing header value got through: {bad:?}"
    );
    // Only the router knows the other header name and the socket shape.
    let routed = match ingress {
        Ingress::Router => {
            let other = other.expect("GET /version with the other header and the socket shape");
            assert!(other.ends_with(VERSION), "{other}");
            2
        }
        Ingress::ConnectAcceptor => {
            assert!(other.is_err(), "the acceptor let another header through");
            1
        }
    };
    assert_eq!(
        connections.load(Ordering::Relaxed),
        routed,
        "the kube-apiserver saw only the correctly routed connections"
    );
    if let Some(counters) = router_counters {
        assert_eq!(
            counters.tunnels.load(Ordering::Relaxed),
            2,
            "router tunnels"
        );
        assert_eq!(
            counters.refused.load(Ordering::Relaxed),
            1,
            "router refusals"
        );
    }

    token.cancel();
    for p in proxies {
        shoot_rt
            .block_on(async { tokio::time::timeout(WAIT, p).await })
            .expect("proxy stops")
            .expect("proxy task");
    }
    shoot_rt.shutdown_timeout(Duration::from_secs(5));
    seed_rt.shutdown_timeout(Duration::from_secs(5));
}
