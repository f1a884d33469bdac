//! The CONNECT dialer (`netio::http_connect`) against the lab's `ConnectAcceptor`, and the
//! GEP-30 apiserver-proxy through it, on loopback (no namespace needed): a tunnel echoes and
//! passes a half-close, a missing or wrong routing header is 400, an unreachable upstream 502.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::net::SocketAddr;
use std::time::Duration;

use conformance::connect_acceptor::{ConnectAcceptor, Upstream};
use netio::http::{ConnectRequest, CustomHeader};
use netio::http_connect::{connect_via_proxy, ConnectError};
use sidecar::apiserver_proxy::{ApiserverProxy, ApiserverProxyConfig, DEFAULT_HEADER_NAME};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vpn_client::CancellationToken;

const HEADER: (&str, &str) = ("Reversed-VPN", "outbound|1194||vpn-seed-server");

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
        }
    });
    addr
}

async fn acceptor(acceptor: ConnectAcceptor) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(acceptor.serve(listener));
    addr
}

fn request(with_header: bool) -> ConnectRequest {
    let mut req = ConnectRequest::new("vpn-seed-server", 1194);
    if with_header {
        req.options.custom_headers.push(CustomHeader::NameValue {
            name: HEADER.0.into(),
            value: HEADER.1.into(),
        });
    }
    req
}

#[tokio::test]
async fn tunnel_through_acceptor_echoes_and_half_closes() {
    let echo = echo_server().await;
    let proxy =
        acceptor(ConnectAcceptor::new(Upstream::Fixed(echo)).require_header(HEADER.0, HEADER.1))
            .await;
    let t = connect_via_proxy(&[proxy], &request(true), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(t.leftover.is_empty());
    let mut s = t.stream;
    s.write_all(b"hello through the proxy").await.unwrap();
    s.shutdown().await.unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"hello through the proxy");
}

#[tokio::test]
async fn missing_or_wrong_header_is_400() {
    let echo = echo_server().await;
    let proxy =
        acceptor(ConnectAcceptor::new(Upstream::Fixed(echo)).require_header(HEADER.0, HEADER.1))
            .await;
    let err = connect_via_proxy(&[proxy], &request(false), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectError::Status { code: 400, reason } if reason == "Bad Request"),
        "{err:?}"
    );
    let mut wrong = request(false);
    wrong
        .options
        .custom_headers
        .push(CustomHeader::Line(format!("{}: other", HEADER.0)));
    let err = connect_via_proxy(&[proxy], &wrong, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConnectError::Status { code: 400, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn unreachable_upstream_is_502() {
    // A port that was just free: bind, take the address, drop.
    let dead = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = acceptor(ConnectAcceptor::new(Upstream::Fixed(dead))).await;
    let err = connect_via_proxy(&[proxy], &request(false), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConnectError::Status { code: 502, .. }),
        "{err:?}"
    );
}

const ROUTE: &str = "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local";

#[tokio::test]
async fn the_apiserver_proxy_tunnels_through_a_connect_proxy_with_the_header() {
    // An echo "apiserver".
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let (mut r, mut w) = s.split();
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let ingress = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ingress_addr = ingress.local_addr().unwrap();
    tokio::spawn(
        ConnectAcceptor::new(Upstream::Fixed(echo_addr))
            .require_header(DEFAULT_HEADER_NAME, ROUTE)
            .serve(ingress),
    );
    let config = ApiserverProxyConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        ingress_addr.to_string(),
        ROUTE.into(),
    );
    let proxy = ApiserverProxy::bind(config).await.unwrap();
    let local = proxy.local_addrs()[0];
    let token = CancellationToken::new();
    let task = tokio::spawn(proxy.run(token.clone()));
    let mut c = TcpStream::connect(local).await.unwrap();
    c.write_all(b"GET /version").await.unwrap();
    c.shutdown().await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"GET /version");
    token.cancel();
    task.await.unwrap();
}
