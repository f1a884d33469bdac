//! The sidecar's stream behaviour, in a lab namespace: half-close passes through in both
//! directions (TLS `close_notify` on the client side, TCP FIN on the pod side), and a tunnel
//! with no bytes either way is closed by the idle timeout (as a `logs -f` that went quiet).
//!
//! ```text
//!  NS  lo 100.96.0.10: ":7003" reads to EOF, then answers and closes (half-close)
//!                      ":7004" accepts and stays silent (idle)
//!      sidecar 127.0.0.1:9443, idle timeout 1 s, metrics 127.0.0.1:15000
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, metric, ns_runtime, scrape, start_sidecar, tls, Pki,
};

const SHOOT: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);

#[test]
fn half_close_passes_both_ways_and_idle_tunnels_are_closed() {
    require_lab(&[]);
    let pki = Pki::generate();
    let ns = Netns::new().expect("namespace");
    ns.run(["ip", "addr", "add", &format!("{SHOOT}/32"), "dev", "lo"])
        .expect("address");
    let (half, idle) = ns
        .run_in(|| {
            (
                TcpListener::bind((SHOOT, 7003)).expect("bind"),
                TcpListener::bind((SHOOT, 7004)).expect("bind"),
            )
        })
        .expect("run in namespace");
    // Reads the request to EOF (the client's half-close, passed on as FIN), then answers.
    let half_server = std::thread::spawn(move || {
        let (mut s, _) = half.accept().expect("accept");
        let mut request = Vec::new();
        s.read_to_end(&mut request).expect("read to EOF");
        s.write_all(format!("got {} bytes after your FIN", request.len()).as_bytes())
            .expect("answer");
    });
    let idle_server = std::thread::spawn(move || {
        let (mut s, _) = idle.accept().expect("accept");
        // Silent; returns when the sidecar closes the tunnel.
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        buf.len()
    });
    let mut c = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec!["100.96.0.0/24".parse().expect("net")],
        vec![],
    );
    c.idle_timeout = Duration::from_secs(1);
    let sidecar = start_sidecar(ns_runtime(&ns), c, None);
    let addr = sidecar.addrs[0];
    let good = connector(&pki.bundle, Some(&pki.client));

    let (answer, idle_closed_after, text) = ns
        .run_in(|| {
            // Half-close: send, close our sending side (close_notify), still read the answer.
            let mut s = tls(&good, addr).expect("handshake");
            assert_eq!(connect_status(&mut s, &format!("{SHOOT}:7003")), Some(200));
            s.write_all(b"0123456789").expect("request");
            s.shutdown().expect("close_notify");
            let mut answer = String::new();
            s.read_to_string(&mut answer)
                .expect("answer after half-close");

            // Idle: nothing either way; the sidecar closes the tunnel.
            let mut s = tls(&good, addr).expect("handshake");
            assert_eq!(connect_status(&mut s, &format!("{SHOOT}:7004")), Some(200));
            let started = Instant::now();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            let after = started.elapsed();
            // The counter moves just after the close the client saw: wait (bounded) for it.
            let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, 15000));
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut text = scrape(metrics);
            while metric(&text, "vpn_sidecar_idle_timeouts_total") == 0 && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
                text = scrape(metrics);
            }
            (answer, after, text)
        })
        .expect("run in namespace");
    half_server.join().expect("half-close server");
    assert_eq!(answer, "got 10 bytes after your FIN");
    assert_eq!(idle_server.join().expect("idle server"), 0);
    // Ended by the idle timeout, not by the 20 s the client would have waited.
    assert!(
        idle_closed_after < Duration::from_secs(15),
        "the idle tunnel stayed open {idle_closed_after:?}"
    );
    assert_eq!(metric(&text, "vpn_sidecar_idle_timeouts_total"), 1);
    drop(sidecar);
}
