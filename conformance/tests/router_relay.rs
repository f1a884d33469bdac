//! The router's tunnel relay (`netio::relay` behind `vpn_router::relay`): a
//! half-close is passed on in each direction while the other keeps flowing, and a tunnel
//! with no bytes either way is closed on both sides at the idle deadline (`idle_ms`). Its
//! `GET /metrics` counts requests by status, tunnels (total and active) and relayed bytes.
//!
//! Upstreams here are scripted TCP listeners in SEED that report what they received and
//! whether they saw EOF.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod router_common;

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use conformance::sidecar_lab::{metric, scrape};
use router_common::{connect, status, vpn, Client, Lab, SEED, SHOOT_B, WAIT};

const IDLE_MS: u64 = 600;

fn config(upstream: SocketAddr) -> String {
    format!(
        "[timeouts]\nidle_ms = {IDLE_MS}\n\n[[listener]]\naddress = \"10.79.0.1:0\"\n\
         headers = [\"X-Gardener-Destination\"]\n\n[[route]]\nvalue = \"{}\"\nupstream = \"{upstream}\"\n",
        vpn("shoot--p--a")
    )
}

/// What a scripted upstream saw on its one connection.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// Bytes received before EOF (or before the read failed).
    received: Vec<u8>,
    /// Whether the read ended with EOF (not an error or a timeout).
    eof: bool,
}

/// A one-connection upstream in SEED running `script` on the accepted socket; its report
/// arrives on the returned channel.
fn scripted(
    lab: &Lab,
    script: impl FnOnce(TcpStream) -> Seen + Send + 'static,
) -> (SocketAddr, mpsc::Receiver<Seen>) {
    let listener = lab
        .seed
        .run_in(|| std::net::TcpListener::bind((SEED, 0)))
        .expect("run_in")
        .expect("bind upstream");
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(WAIT)).unwrap();
        let _ = tx.send(script(conn));
    });
    (addr, rx)
}

/// Reads `s` to EOF (or error / timeout).
fn read_to_end(s: &mut TcpStream) -> Seen {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                return Seen {
                    received,
                    eof: true,
                }
            }
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(_) => {
                return Seen {
                    received,
                    eof: false,
                }
            }
        }
    }
}

/// An upstream script: reads to EOF, then answers `got N bytes` and shuts its write half.
fn answer_after_eof(mut s: TcpStream) -> Seen {
    let got = read_to_end(&mut s);
    s.write_all(format!("got {} bytes", got.received.len()).as_bytes())
        .unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    got
}

/// Opens a tunnel from SHOOT through the router; returns the client after the 200 head
/// (and any bytes that came with it).
fn open(lab: &Lab, router: SocketAddr) -> (Client, Vec<u8>) {
    let src: IpAddr = SHOOT_B.into();
    let mut c = lab.connect_from(src, router);
    c.send(&connect(&[format!(
        "X-Gardener-Destination: {}",
        vpn("shoot--p--a")
    )]));
    let head = c.read_until(b"\r\n\r\n");
    assert_eq!(
        status(&head),
        Some(200),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (c, head[end..].to_vec())
}

#[test]
fn half_close_is_passed_on_both_ways() {
    let lab = Lab::new(&[]);
    let dir = tempfile::tempdir().unwrap();

    // Client → upstream: the client sends and shuts its write half; the upstream sees the
    // bytes and EOF, then answers, and its answer still reaches the client, then EOF.
    let (addr, seen) = scripted(&lab, answer_after_eof);
    let router = lab.router(&dir, &config(addr));
    let (mut c, mut early) = open(&lab, router.addr(0));
    c.send(b"request-then-fin");
    c.stream.shutdown(Shutdown::Write).unwrap();
    let (rest, closed) = c.read_all();
    early.extend(rest);
    assert_eq!(
        seen.recv_timeout(WAIT).unwrap(),
        Seen {
            received: b"request-then-fin".to_vec(),
            eof: true
        }
    );
    assert_eq!(early, b"got 16 bytes");
    assert!(closed, "the upstream's FIN did not reach the client");
    drop(router);

    // Upstream → client: the upstream sends and shuts its write half first; the client sees
    // the bytes and EOF, then still sends, and the upstream gets those bytes, then EOF.
    let (addr, seen) = scripted(&lab, |mut s| {
        s.write_all(b"banner-then-fin").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        read_to_end(&mut s)
    });
    let router = lab.router(&dir, &config(addr));
    let (mut c, mut got) = open(&lab, router.addr(0));
    let (rest, closed) = c.read_all();
    got.extend(rest);
    assert_eq!(got, b"banner-then-fin");
    assert!(closed, "the upstream's FIN did not reach the client");
    c.send(b"late-request");
    c.stream.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        seen.recv_timeout(WAIT).unwrap(),
        Seen {
            received: b"late-request".to_vec(),
            eof: true
        }
    );
}

#[test]
fn idle_tunnels_close_at_the_deadline_busy_ones_stay() {
    let lab = Lab::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    // An echoing upstream that reports everything it got before the router closed it.
    let (addr, seen) = scripted(&lab, |mut s| {
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => {
                    return Seen {
                        received,
                        eof: true,
                    }
                }
                Ok(n) => {
                    received.extend_from_slice(&buf[..n]);
                    if s.write_all(&buf[..n]).is_err() {
                        return Seen {
                            received,
                            eof: false,
                        };
                    }
                }
                Err(_) => {
                    return Seen {
                        received,
                        eof: false,
                    }
                }
            }
        }
    });
    let router = lab.router(&dir, &config(addr));
    let (mut c, early) = open(&lab, router.addr(0));
    assert!(early.is_empty());

    // Busy for three idle periods: a byte each third of one keeps the tunnel open.
    let busy_until = Instant::now() + Duration::from_millis(3 * IDLE_MS);
    let mut sent = Vec::new();
    let mut i = 0u8;
    let mut last_moved = Instant::now();
    while Instant::now() < busy_until {
        std::thread::sleep(Duration::from_millis(IDLE_MS / 3));
        let b = b'a' + i % 26;
        c.send(&[b]);
        sent.push(b);
        assert_eq!(c.read_until(&[b]), [b], "the busy tunnel was cut");
        last_moved = Instant::now();
        i = i.wrapping_add(1);
    }

    // Then silent: both sides are closed at the deadline, not before. The router's timer
    // restarted when it forwarded the last echo, just before the client read it: allow that
    // much slack.
    let (rest, closed) = c.read_all();
    let quiet = last_moved.elapsed();
    assert!(closed, "the idle tunnel was not closed");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        quiet >= Duration::from_millis(IDLE_MS - 50),
        "closed {quiet:?} after the last byte, before the idle deadline"
    );
    assert_eq!(
        seen.recv_timeout(WAIT).unwrap(),
        Seen {
            received: sent,
            eof: true
        },
        "the upstream side was not shut at the deadline"
    );
}

#[test]
fn metrics_count_requests_tunnels_and_bytes() {
    let lab = Lab::new(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (addr, seen) = scripted(&lab, answer_after_eof);
    let metrics_addr = SocketAddr::from((SEED, 15001));
    let text = format!("metrics_listen = \"{metrics_addr}\"\n{}", config(addr));
    let router = lab.router(&dir, &text);
    let scrape = || lab.shoot.run_in(|| scrape(metrics_addr)).unwrap();

    // A valid routing value without a route: 400.
    let mut refused = lab.connect_from(SHOOT_B.into(), router.addr(0));
    refused.send(&connect(&[format!(
        "X-Gardener-Destination: {}",
        vpn("shoot--p--zz")
    )]));
    let (out, closed) = refused.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(400));

    // One tunnel: active while open; 16 bytes up, 12 down when it ends.
    let (mut c, mut down) = open(&lab, router.addr(0));
    let during = scrape();
    assert_eq!(metric(&during, "vpn_router_tunnels_active"), 1, "{during}");
    c.send(b"request-then-fin");
    c.stream.shutdown(Shutdown::Write).unwrap();
    let (rest, closed) = c.read_all();
    down.extend(rest);
    assert!(closed);
    assert_eq!(down, b"got 16 bytes");
    assert!(seen.recv_timeout(WAIT).unwrap().eof);

    // The router counts the bytes when its relay returns, just after the client's EOF.
    let deadline = Instant::now() + WAIT;
    let after = loop {
        let text = scrape();
        if metric(&text, "vpn_router_tunnels_active") == 0 {
            break text;
        }
        assert!(Instant::now() < deadline, "tunnel never ended: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for (series, want) in [
        ("vpn_router_requests_total{code=\"200\"}", 1),
        ("vpn_router_requests_total{code=\"400\"}", 1),
        ("vpn_router_requests_total{code=\"403\"}", 0),
        ("vpn_router_tunnels_total", 1),
        (
            "vpn_router_tunnel_bytes_total{direction=\"to_upstream\"}",
            16,
        ),
        ("vpn_router_tunnel_bytes_total{direction=\"to_client\"}", 12),
    ] {
        assert_eq!(metric(&after, series), want, "{series} in\n{after}");
    }
}
