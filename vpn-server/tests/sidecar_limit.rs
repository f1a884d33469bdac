//! `vpn-server sidecar` (the binary, alone) in a lab namespace, with its default concurrency
//! limit (8192, Gardener's Envoy circuit breaker): 8192 tunnels open at once, each to a
//! "shoot pod" that holds its connection; the 8193rd CONNECT gets 503 and is never dialed.
//!
//! ```text
//!  NS  lo 100.96.0.10 ("pod", holds every connection on :7002)
//!      vpn-server sidecar --sidecar-listen 127.0.0.1:9443 --sidecar-allow 100.96.0.0/24
//!      this test: 8192 + 1 mTLS CONNECTs, then GET /metrics on 127.0.0.1:15000
//! ```
//!
//! Two sockets per tunnel on each side: the binary holds 16384 (it lifts its soft
//! `RLIMIT_NOFILE` to the hard limit), this process the 8192 clients and the 8192 pod ends.

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::require_lab;
use lab::sidecar_client::{connect_status, connector, metric, scrape, tls, Pki};
use sidecar::DEFAULT_MAX_CONNECTIONS;

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const SHOOT: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
const PORT: u16 = 7002;
/// Needed by this process: 2 × 8192 sockets plus a margin.
const FDS_NEEDED: u64 = 2 * 8192 + 512;

#[test]
fn the_connection_after_the_default_limit_gets_503() {
    require_lab(&[]);
    assert_eq!(DEFAULT_MAX_CONNECTIONS, 8192);
    {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let mut limit = getrlimit(Resource::Nofile);
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).unwrap();
        let have = getrlimit(Resource::Nofile).current;
        assert!(
            have.is_none_or(|n| n >= FDS_NEEDED),
            "RLIMIT_NOFILE {have:?} is below the {FDS_NEEDED} this test needs"
        );
    }
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let ns = Netns::new().unwrap();
    ns.run(["ip", "addr", "add", &format!("{SHOOT}/32"), "dev", "lo"])
        .unwrap();

    // The "pod": accepts and holds every connection until told to stop.
    let listener = ns
        .run_in(|| TcpListener::bind((SHOOT, PORT)))
        .unwrap()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let holder = {
        let stop = Arc::clone(&stop);
        let accepted = Arc::clone(&accepted);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        held.push(s);
                        accepted.store(held.len(), Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        })
    };

    let log = std::fs::File::create(dir.path().join("sidecar.log")).unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    ns.spawn(
        ns.command(BIN)
            .args(["sidecar", "--sidecar-listen", "127.0.0.1:9443"])
            .args(["--sidecar-metrics-listen", "127.0.0.1:15000"])
            .args(["--sidecar-cert", &file("server.crt")])
            .args(["--sidecar-key", &file("server.key")])
            .args(["--sidecar-ca", &file("ca.crt")])
            .args(["--sidecar-allow", "100.96.0.0/24"])
            .env("VPN_SERVER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log),
    )
    .unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9443));
    ns.run_in(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "the sidecar never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .unwrap();

    let good = connector(&pki.bundle, Some(&pki.client));
    let target = format!("{SHOOT}:{PORT}");
    let (held, last, text) = ns
        .run_in(|| {
            let mut held = Vec::with_capacity(DEFAULT_MAX_CONNECTIONS);
            for i in 0..DEFAULT_MAX_CONNECTIONS {
                let mut s = tls(&good, addr).unwrap_or_else(|e| panic!("handshake {i}: {e}"));
                let status = connect_status(&mut s, &target);
                assert_eq!(status, Some(200), "CONNECT number {}", i + 1);
                held.push(s);
            }
            let mut s = tls(&good, addr).unwrap();
            let last = connect_status(&mut s, &target);
            let text = scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000)));
            (held, last, text)
        })
        .unwrap();
    let log_text = || std::fs::read_to_string(dir.path().join("sidecar.log")).unwrap_or_default();
    assert_eq!(
        last,
        Some(503),
        "the 8193rd concurrent CONNECT; log:\n{}",
        log_text()
    );
    let cluster = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_overflow{{{cluster}}}")
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_active{{{cluster}}}")
        ),
        8192
    );
    // The pod saw exactly the 8192 tunnels: the refused one was never dialed.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(accepted.load(Ordering::Relaxed), 8192);
    // The refusal is access-logged.
    assert!(
        log_text().contains("status=503"),
        "no access-log line for the 503:\n{}",
        log_text()
    );

    stop.store(true, Ordering::Relaxed);
    holder.join().unwrap();
    drop(held);
}
