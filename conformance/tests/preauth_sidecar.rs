//! The CONNECT sidecar before the CONNECT head (issue 19), in a lab namespace: connections
//! still in their TLS handshake or head have their own bound (`max_pending`); a newcomer
//! beyond it evicts the oldest one still in its handshake (closed unanswered) rather than
//! being refused; one that finished its mutual TLS handshake goes only when none is left in
//! a handshake, so the kube-apiserver is not kept out by silent connections; evictions and
//! the header timeout are counted in `vpn_sidecar_pending_closed_total`.
//!
//! ```text
//!  NS  lo 100.96.0.10:7005 (accepts, greets)     sidecar 127.0.0.1:9443, max_pending 2,
//!      this test: raw TCP and mTLS clients        header timeout 30 s (1 s in the second test)
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, metric, ns_runtime, scrape, start_sidecar, tls, Pki,
};

const SHOOT: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
const WAIT: Duration = Duration::from_secs(5);
/// The client's side of a TLS 1.3 handshake ends before the server's (which reads the
/// client's Finished): time for the sidecar to see it done.
const SERVER_SIDE: Duration = Duration::from_millis(200);

/// Whether the sidecar closed `s` within [`WAIT`] (EOF or reset), reading past any bytes.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

fn namespace() -> Netns {
    let ns = Netns::new().expect("namespace");
    ns.run(["ip", "addr", "add", &format!("{SHOOT}/32"), "dev", "lo"])
        .expect("address");
    ns
}

#[test]
fn a_full_pending_set_evicts_a_handshake_before_a_finished_one() {
    require_lab(&[]);
    let pki = Pki::generate();
    let ns = namespace();
    // The "pod": greets every connection.
    let pod = ns
        .run_in(|| TcpListener::bind((SHOOT, 7005)).expect("bind"))
        .expect("run in namespace");
    std::thread::spawn(move || {
        for s in pod.incoming() {
            let Ok(mut s) = s else { return };
            let _ = s.write_all(b"POD\n");
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let mut c = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec!["100.96.0.0/24".parse().expect("net")],
        vec![],
    );
    c.max_pending = 2;
    c.header_timeout = Duration::from_secs(30);
    let sidecar = start_sidecar(ns_runtime(&ns), c, None);
    let addr: SocketAddr = sidecar.addrs[0];
    let good = connector(&pki.bundle, Some(&pki.client));
    let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, 15000));

    ns.run_in(|| {
        // The kube-apiserver's connection: its mutual TLS handshake done, its head not sent.
        let mut apiserver = tls(&good, addr).expect("handshake");
        std::thread::sleep(SERVER_SIDE);
        // Silent TCP connections (no ClientHello): the first fills the set, each further one
        // evicts the oldest silent one, never the finished handshake.
        let mut silent = Vec::new();
        for _ in 0..5 {
            silent.push(TcpStream::connect_timeout(&addr, WAIT).expect("connect"));
            std::thread::sleep(Duration::from_millis(50));
        }
        let last = silent.pop().expect("five");
        for (i, s) in silent.iter_mut().enumerate() {
            assert!(closed(s), "silent connection {i} was not evicted");
        }
        let text = scrape(metrics);
        assert_eq!(
            metric(
                &text,
                "vpn_sidecar_pending_closed_total{reason=\"evicted\"}"
            ),
            4
        );
        assert_eq!(metric(&text, "vpn_sidecar_pending"), 2);
        // The kube-apiserver's connection is still served.
        assert_eq!(
            connect_status(&mut apiserver, &format!("{SHOOT}:7005")),
            Some(200)
        );
        let mut greeting = [0u8; 4];
        apiserver.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting, b"POD\n");
        // With every pending place taken by finished handshakes, the oldest of those goes.
        let mut second = tls(&good, addr).expect("handshake");
        drop(last);
        let _third = tls(&good, addr).expect("handshake");
        std::thread::sleep(SERVER_SIDE);
        let _fourth = tls(&good, addr).expect("handshake");
        let status = connect_status(&mut second, &format!("{SHOOT}:7005"));
        assert_eq!(status, None, "the oldest finished handshake was evicted");
        let text = scrape(metrics);
        assert!(
            metric(
                &text,
                "vpn_sidecar_pending_closed_total{reason=\"evicted\"}"
            ) >= 5
        );
    })
    .expect("run in namespace");
}

#[test]
fn a_silent_connection_is_closed_at_the_header_timeout_and_counted() {
    require_lab(&[]);
    let pki = Pki::generate();
    let ns = namespace();
    let mut c = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec!["100.96.0.0/24".parse().expect("net")],
        vec![],
    );
    c.header_timeout = Duration::from_secs(1);
    let sidecar = start_sidecar(ns_runtime(&ns), c, None);
    let addr: SocketAddr = sidecar.addrs[0];
    ns.run_in(|| {
        let mut s = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
        assert!(closed(&mut s), "still open after the header timeout");
        let text = scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000)));
        assert_eq!(
            metric(
                &text,
                "vpn_sidecar_pending_closed_total{reason=\"timeout\"}"
            ),
            1
        );
        assert_eq!(metric(&text, "vpn_sidecar_pending"), 0);
    })
    .expect("run in namespace");
}
