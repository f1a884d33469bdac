//! `netio::relay::relay_tcp` between real sockets in lab namespaces, on the ends a relay must
//! not keep open forever (issue 19, half-open sockets):
//!
//! * a peer half-closes and the other never answers nor closes: the relay closes both sides
//!   after the half-closed bound, far sooner than the idle timeout;
//! * a half-close with bytes still flowing the other way is not cut;
//! * a peer vanishes (its packets stop, no FIN, no RST) while bytes are on their way to it:
//!   `TCP_USER_TIMEOUT` fails the relay and the other side is closed, long before the idle
//!   timeout and the kernel's ~15 minutes of retransmissions.
//!
//! ```text
//!  CLIENT 10.83.1.2 ── veth ── 10.83.1.1 RELAY 10.83.2.1 ── veth ── 10.83.2.2 UPSTREAM
//! ```
//!
//! Every socket is made inside its namespace (`Netns::run_in`) and keeps it; the relay's
//! runtime and the test's blocking ends then run on ordinary threads. The bounds are lowered
//! to seconds; the assertions are about sockets being closed (or not), not timing exactness.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use netio::relay::{relay_tcp, RelayConfig, RelayEnd, RelayError, RelayStats};

/// Longer than any bound the tests lower, shorter than the defaults they must beat.
const WAIT: Duration = Duration::from_secs(20);

/// The half-closed bound of these tests.
const HALF_CLOSED: Duration = Duration::from_secs(1);

/// Three namespaces in a row.
struct Lab {
    client: Netns,
    relay: Netns,
    upstream: Netns,
}

impl Lab {
    fn new() -> Lab {
        require_lab(&["ip"]);
        let lab = Lab {
            client: Netns::new().unwrap(),
            relay: Netns::new().unwrap(),
            upstream: Netns::new().unwrap(),
        };
        Netns::veth_pair(&lab.client, "c0", &lab.relay, "r0").unwrap();
        Netns::veth_pair(&lab.relay, "r1", &lab.upstream, "u0").unwrap();
        for (ns, addr, dev) in [
            (&lab.client, "10.83.1.2/24", "c0"),
            (&lab.relay, "10.83.1.1/24", "r0"),
            (&lab.relay, "10.83.2.1/24", "r1"),
            (&lab.upstream, "10.83.2.2/24", "u0"),
        ] {
            ns.run(["ip", "addr", "add", addr, "dev", dev]).unwrap();
        }
        lab
    }

    /// client ⇄ [relay_tcp in RELAY] ⇄ upstream: the two blocking ends and the relay's
    /// thread, which returns what `relay_tcp` returned.
    fn tunnel(&self, config: RelayConfig) -> Tunnel {
        let listen = |ns: &Netns, ip: &str| {
            ns.run_in(|| TcpListener::bind((ip, 0)))
                .unwrap()
                .expect("bind")
        };
        let connect = |ns: &Netns, to: SocketAddr| {
            ns.run_in(move || TcpStream::connect_timeout(&to, WAIT))
                .unwrap()
                .expect("connect")
        };
        let front = listen(&self.relay, "10.83.1.1");
        let back = listen(&self.upstream, "10.83.2.2");
        let client = connect(&self.client, front.local_addr().unwrap());
        let (relay_a, _) = front.accept().unwrap();
        let relay_b = connect(&self.relay, back.local_addr().unwrap());
        let (upstream, _) = back.accept().unwrap();
        for s in [&client, &upstream] {
            s.set_read_timeout(Some(WAIT)).unwrap();
        }
        let relay = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                relay_a.set_nonblocking(true).unwrap();
                relay_b.set_nonblocking(true).unwrap();
                let mut a = tokio::net::TcpStream::from_std(relay_a).unwrap();
                let mut b = tokio::net::TcpStream::from_std(relay_b).unwrap();
                relay_tcp(&mut a, &mut b, config).await
                // Both sockets close here, as a caller's would when the relay returns.
            })
        });
        Tunnel {
            client,
            upstream,
            relay,
        }
    }
}

struct Tunnel {
    client: TcpStream,
    upstream: TcpStream,
    relay: JoinHandle<Result<RelayStats, RelayError>>,
}

impl Tunnel {
    /// What the relay returned, waiting at most [`WAIT`].
    fn relay_result(self) -> Result<RelayStats, RelayError> {
        let start = Instant::now();
        while !self.relay.is_finished() {
            assert!(start.elapsed() < WAIT, "the relay is still running");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.relay.join().unwrap()
    }
}

/// How a blocking read of `s` ended: the bytes before the end, and whether the end was the
/// peer closing (EOF or reset) rather than the read timeout.
fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

#[test]
fn a_half_close_nobody_answers_is_closed_on_both_sides_after_the_bound() {
    let lab = Lab::new();
    let config = RelayConfig {
        half_closed_timeout: HALF_CLOSED,
        ..RelayConfig::default()
    };
    let mut t = lab.tunnel(config);
    t.client.write_all(b"request").unwrap();
    t.client.shutdown(Shutdown::Write).unwrap();
    // The upstream gets the request and the FIN, and then never answers nor closes.
    let (got, closed) = read_until_closed(&mut t.upstream);
    assert_eq!(got, b"request");
    assert!(closed, "the client's FIN did not reach the upstream");
    let start = Instant::now();
    let (late, closed) = read_until_closed(&mut t.client);
    assert!(late.is_empty());
    assert!(
        closed,
        "the half-open tunnel was still open after {:?}",
        start.elapsed()
    );
    // Both sides are closed: the upstream's writes now end in a reset.
    let refused = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        t.upstream.write_all(b"too late").is_err()
    });
    assert!(
        refused,
        "the relay's socket towards the upstream is still open"
    );
    let stats = t.relay_result().unwrap();
    assert_eq!(stats.end, RelayEnd::Idle);
    assert_eq!((stats.a_to_b, stats.b_to_a), (7, 0));
    eprintln!(
        "half-closed tunnel without an answer closed {:?} after the half-close (bound {HALF_CLOSED:?}, idle timeout {:?})",
        start.elapsed(),
        config.idle_timeout
    );
}

#[test]
fn a_half_close_with_bytes_still_flowing_the_other_way_is_not_cut() {
    let lab = Lab::new();
    let config = RelayConfig {
        half_closed_timeout: HALF_CLOSED,
        ..RelayConfig::default()
    };
    let mut t = lab.tunnel(config);
    t.client.shutdown(Shutdown::Write).unwrap();
    let (nothing, closed) = read_until_closed(&mut t.upstream);
    assert!(nothing.is_empty() && closed);
    // Four bounds long, a chunk every 400 ms: each one crosses.
    let chunk = [0x5au8; 1000];
    let mut received = 0;
    for _ in 0..10 {
        t.upstream.write_all(&chunk).unwrap();
        let mut buf = [0u8; 1000];
        t.client.read_exact(&mut buf).unwrap();
        assert_eq!(buf, chunk);
        received += buf.len();
        std::thread::sleep(Duration::from_millis(400));
    }
    assert!(!t.relay.is_finished(), "the relay cut a flowing direction");
    t.upstream.shutdown(Shutdown::Write).unwrap();
    let (rest, closed) = read_until_closed(&mut t.client);
    assert!(rest.is_empty() && closed);
    let stats = t.relay_result().unwrap();
    assert_eq!(stats.end, RelayEnd::Closed);
    assert_eq!((stats.a_to_b, stats.b_to_a), (0, received as u64));
}

#[test]
fn bytes_towards_a_vanished_peer_fail_the_relay_within_the_user_timeout() {
    let lab = Lab::new();
    let config = RelayConfig {
        tcp_user_timeout: Some(Duration::from_secs(2)),
        ..RelayConfig::default()
    };
    let mut t = lab.tunnel(config);
    t.client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    t.upstream.read_exact(&mut buf).unwrap();
    // The upstream vanishes: nothing it sends reaches the relay any more (no ACK, no FIN,
    // no RST), as when its node dies.
    lab.upstream
        .run(["ip", "route", "add", "blackhole", "10.83.2.1/32"])
        .unwrap();
    let start = Instant::now();
    t.client.write_all(&[0u8; 4096]).unwrap();
    let (_, closed) = read_until_closed(&mut t.client);
    assert!(
        closed,
        "the client's side stayed open {:?} after its bytes went to a vanished peer",
        start.elapsed()
    );
    let err = t.relay_result().unwrap_err();
    assert_eq!(
        err.source.kind(),
        ErrorKind::TimedOut,
        "{err}: {}",
        err.source
    );
    eprintln!(
        "vanished upstream: relay failed ({}) and closed the client {:?} after the write",
        err.source,
        start.elapsed()
    );
}
