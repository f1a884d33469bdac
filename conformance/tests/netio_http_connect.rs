//! `netio::http_connect` in lab namespaces: the dialer through our acceptor (with the
//! `Reversed-VPN` header Gardener's shoot client sends) and through Debian's `tinyproxy`,
//! carrying the framed OpenVPN transport to an echo server; refusals come back as typed
//! status errors.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use conformance::connect_acceptor::{ConnectAcceptor, Upstream};
use conformance::netns::Netns;
use conformance::require_lab;
use netio::framed::{FrameReader, FrameWriter};
use netio::http::{ConnectRequest, CustomHeader};
use netio::http_connect::{connect_via_proxy, ConnectError};
use netio::netlink::{IpPrefix, Netlink};
use protocol::framing::{FrameEncoder, DEFAULT_TUN_MTU};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const HEADER_NAME: &str = "Reversed-VPN";
const HEADER_VALUE: &str = "outbound|1194||vpn-seed-server";
const TIMEOUT: Duration = Duration::from_secs(10);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A TCP echo server that closes its sending side when the client closes its own.
async fn echo_server(bind: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind(bind).await.expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

fn request_to(target: SocketAddr, with_header: bool) -> ConnectRequest {
    let mut req = ConnectRequest::new(target.ip().to_string(), target.port());
    if with_header {
        req.options.custom_headers.push(CustomHeader::NameValue {
            name: HEADER_NAME.into(),
            value: HEADER_VALUE.into(),
        });
    }
    req
}

/// Sends `count` framed packets of varying sizes from one task and reads them back in another.
/// With `half_close`, the sender closes its direction right after the last packet and the clean
/// end of stream must come back through the proxy after every echoed packet (tinyproxy does not
/// relay a half-close: it tears both directions down, so it gets `half_close = false`).
async fn framed_echo_round_trip(
    stream: netio::http_connect::ProxiedStream,
    count: usize,
    half_close: bool,
) {
    let (read, write) = stream.stream.into_split();
    let mut rx = FrameReader::new(read, stream.leftover, DEFAULT_TUN_MTU);
    let mut tx = FrameWriter::new(write);
    let packet = |i: usize| -> Vec<u8> {
        let len = 1 + (i * 37) % 1500;
        (0..len).map(|j| (i + j) as u8).collect()
    };
    let sender = tokio::spawn(async move {
        for i in 0..count {
            let mut framed = bytes::BytesMut::new();
            FrameEncoder::new()
                .encode(&packet(i), &mut framed)
                .expect("frame");
            tx.push(framed);
            if i % 16 == 15 {
                tx.flush().await.expect("flush");
            }
        }
        tx.flush().await.expect("flush");
        if half_close {
            tx.shutdown().await.expect("shutdown");
        }
        tx
    });
    for i in 0..count {
        let got = rx
            .next()
            .await
            .expect("recv")
            .unwrap_or_else(|| panic!("stream ended after {i} of {count} packets"));
        assert_eq!(got[..], packet(i)[..], "packet {i}");
    }
    let mut tx = sender.await.expect("sender");
    if !half_close {
        tx.shutdown().await.expect("shutdown");
    }
    assert!(
        rx.next().await.expect("recv after last").is_none(),
        "the close did not come back through the proxy"
    );
}

#[test]
fn dialer_through_our_acceptor_reaches_an_echo_server() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let echo = echo_server((Ipv4Addr::LOCALHOST, 0).into()).await;
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .expect("bind acceptor");
            let proxy = listener.local_addr().expect("acceptor addr");
            let acceptor = ConnectAcceptor::new(Upstream::Fixed(echo))
                .require_header(HEADER_NAME, HEADER_VALUE);
            tokio::spawn(acceptor.serve(listener));

            let started = Instant::now();
            let stream = connect_via_proxy(&[proxy], &request_to(echo, true), TIMEOUT)
                .await
                .expect("CONNECT through the acceptor");
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "no pause after the 200"
            );
            assert_eq!(stream.response.status, 200);
            assert_eq!(stream.response.reason, "Connection established");
            framed_echo_round_trip(stream, 500, true).await;
        })
    })
    .expect("run_in");
}

#[test]
fn acceptor_answers_400_without_the_header() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let echo = echo_server((Ipv4Addr::LOCALHOST, 0).into()).await;
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .expect("bind acceptor");
            let proxy = listener.local_addr().expect("acceptor addr");
            let acceptor = ConnectAcceptor::new(Upstream::Fixed(echo))
                .require_header(HEADER_NAME, HEADER_VALUE);
            tokio::spawn(acceptor.serve(listener));

            let err = connect_via_proxy(&[proxy], &request_to(echo, false), TIMEOUT)
                .await
                .expect_err("must be refused");
            assert!(
                matches!(&err, ConnectError::Status { code: 400, reason } if reason == "Bad Request"),
                "{err:?}"
            );
        })
    })
    .expect("run_in");
}

/// Seed side (`b`: tinyproxy) and shoot side (`a`: echo server and dialer) joined by a veth
/// pair; addresses set with our netlink code inside each namespace.
#[test]
fn dialer_through_tinyproxy_reaches_an_echo_server() {
    require_lab(&["tinyproxy"]);
    let a = Netns::new().expect("netns a");
    let b = Netns::new().expect("netns b");
    Netns::veth_pair(&a, "vpnt-a", &b, "vpnt-b").expect("veth");
    let a_addr = Ipv4Addr::new(10, 77, 0, 2);
    let b_addr = Ipv4Addr::new(10, 77, 0, 1);
    for (ns, dev, addr) in [(&a, "vpnt-a", a_addr), (&b, "vpnt-b", b_addr)] {
        ns.run_in(|| {
            runtime().block_on(async {
                let nl = Netlink::open().expect("netlink");
                nl.add_address(dev, IpPrefix::new(addr.into(), 24).expect("prefix"))
                    .await
                    .expect("address");
            })
        })
        .expect("run_in");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    ns_run_tinyproxy_test(&a, &b, a_addr, b_addr, dir.path());
}

fn ns_run_tinyproxy_test(
    a: &Netns,
    b: &Netns,
    a_addr: Ipv4Addr,
    b_addr: Ipv4Addr,
    dir: &std::path::Path,
) {
    const PROXY_PORT: u16 = 8888;
    let proxy: SocketAddr = (b_addr, PROXY_PORT).into();
    let log = dir.join("tinyproxy.log");
    a.run_in(|| {
        runtime().block_on(async {
            let echo = echo_server((a_addr, 0).into()).await;
            let config = dir.join("tinyproxy.conf");
            std::fs::write(
                &config,
                format!(
                    "Port {PROXY_PORT}\n\
                     Listen {b_addr}\n\
                     Timeout 30\n\
                     MaxClients 8\n\
                     Allow 10.77.0.0/24\n\
                     ConnectPort {}\n\
                     LogFile \"{}\"\n\
                     LogLevel Info\n",
                    echo.port(),
                    log.display()
                ),
            )
            .expect("write config");
            let pid = b
                .spawn(b.command("tinyproxy").arg("-d").arg("-c").arg(&config))
                .expect("start tinyproxy");

            // Ready when it accepts a connection (bounded; no fixed sleep).
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if tokio::net::TcpStream::connect(proxy).await.is_ok() {
                    break;
                }
                if let Some(status) = b.try_wait(pid) {
                    panic!(
                        "tinyproxy exited with {status}: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                assert!(Instant::now() < deadline, "tinyproxy never listened");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }

            let stream = connect_via_proxy(&[proxy], &request_to(echo, true), TIMEOUT)
                .await
                .expect("CONNECT through tinyproxy");
            assert_eq!(stream.response.status, 200);
            framed_echo_round_trip(stream, 300, false).await;

            // A port outside ConnectPort is refused with a typed status error.
            let closed: SocketAddr = (a_addr, 1).into();
            let err = connect_via_proxy(&[proxy], &request_to(closed, true), TIMEOUT)
                .await
                .expect_err("port 1 is not allowed");
            assert!(
                matches!(err, ConnectError::Status { code: 403, .. }),
                "{err:?}"
            );

            b.stop(pid);
            assert!(
                tokio::net::TcpStream::connect(proxy).await.is_err(),
                "tinyproxy still listening after stop"
            );
        })
    })
    .expect("run_in");
}
