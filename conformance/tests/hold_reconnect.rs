//! Requests toward the shoot that start while its tunnel reconnects wait for it (DESIGN
//! decision 10; DEVIATIONS S1): through the in-process CONNECT sidecar, the sidecar run as if
//! alone, and a plain TCP connect from the seed namespace (the server's tun path). Our
//! `vpn_server::Server` and the sidecars share a runtime in SEED, our `vpn_client::run` in
//! SHOOT forwards into the pod network; the same topology as `sidecar_tunnel.rs`.
//!
//! ```text
//!  SEED  vpn_server::Server [::]:1194, tun0, route 100.96.0.0/24 tun0, hold 4 s
//!        sidecar "held"  127.0.0.1:9443 (metrics :15000), in process, hold 8 s
//!        sidecar "alone" 127.0.0.1:9444, no view of the server, hold 8 s
//!        sidecar "short" 127.0.0.1:9446 (metrics :15001), in process, hold 1.5 s, 1 waiter
//!        10.250.0.1/30 ──veth── 10.250.0.2/30  SHOOT  vpn_client::run, ip_forward=1
//!                                              100.96.0.1/24 ──veth── 100.96.0.10/24  POD
//! ```
//!
//! The client stops; requests start; 2 s later the client starts again:
//! * the CONNECTs through "held" and "alone" and the direct TCP connect succeed, each within
//!   1 s of the tunnel being back, and "held" counts one wait that ended routed;
//! * through "short" the CONNECT gets 503 at its bound (1.5 s) and not before, and a second
//!   one while it waits gets 503 at once (over the one-waiter limit); both counted.
//!
//! Then the client stops for good: a direct TCP connect is held for the server's bound (4 s)
//! and then refused by ICMP host unreachable (`EHOSTUNREACH`), not before. A CONNECT through
//! "alone" now meets that refusal at once and dials again until its own bound: the client
//! started 1 s later carries it, within 1 s of its return.

#![allow(clippy::too_many_lines)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, metric, ns_runtime, scrape, tls, Pki, WAIT,
};
use conformance::tunnel_lab::{
    client_settings, server_settings, wait_route, TunnelLab, POD_ADDR, POD_NETWORK, POD_PORT,
};
use sidecar::{RouteCheck, Sidecar};
use vpn_client::CancellationToken;
use vpn_server::Server;

/// The server's hold of packets from its tun device.
const SERVER_HOLD: Duration = Duration::from_secs(4);
/// The hold of the "held" and "alone" sidecars.
const SIDECAR_HOLD: Duration = Duration::from_secs(8);
/// The hold of the "short" sidecar.
const SHORT_HOLD: Duration = Duration::from_millis(1500);
/// How long the tunnel stays down.
const DOWN: Duration = Duration::from_secs(2);
/// What a held request may take beyond the tunnel's return.
const AFTER_RETURN: Duration = Duration::from_secs(1);
/// What the pod answers on each connection.
const HELLO: &[u8] = b"pod says hello\n";

/// A CONNECT to the pod through the sidecar at `port`: its status, what the pod sent, and
/// when the answer came.
fn connect_through(
    good: &openssl::ssl::SslConnector,
    port: u16,
) -> (Option<u16>, Vec<u8>, Instant) {
    let mut s = tls(good, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).expect("handshake");
    let status = connect_status(&mut s, &format!("{POD_ADDR}:{POD_PORT}"));
    let answered = Instant::now();
    let mut got = Vec::new();
    if status == Some(200) {
        let _ = s.read_to_end(&mut got);
    }
    (status, got, answered)
}

type ClientResult = Result<vpn_client::Stopped, vpn_client::RunError>;

/// A client run in SHOOT.
fn start_client(
    rt: &tokio::runtime::Runtime,
    pki: &Pki,
    tls_auth: &protocol::key::Key2,
) -> (CancellationToken, tokio::task::JoinHandle<ClientResult>) {
    let token = CancellationToken::new();
    let task = rt.spawn(vpn_client::run(
        client_settings(pki, tls_auth),
        token.clone(),
    ));
    (token, task)
}

fn stop_client(
    rt: &tokio::runtime::Runtime,
    (token, task): (CancellationToken, tokio::task::JoinHandle<ClientResult>),
) {
    token.cancel();
    rt.block_on(async { tokio::time::timeout(WAIT, task).await })
        .expect("client stops")
        .expect("client task")
        .expect("client run");
}

#[test]
fn requests_started_while_the_tunnel_reconnects_wait_for_it_and_fail_only_at_the_bound() {
    require_lab(&[]);
    let pki = Pki::generate();
    let tls_auth = protocol::static_key::generate(&mut rand_core::OsRng);
    let TunnelLab { seed, shoot, pod } = TunnelLab::new();

    // SEED: the server and three sidecars on one runtime.
    let seed_rt = ns_runtime(&seed);
    let seed_token = CancellationToken::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    let settings = server_settings(
        &pki,
        &tls_auth,
        &[POD_NETWORK.parse().expect("net")],
        SERVER_HOLD,
    );
    let mut held_config = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec![POD_NETWORK.parse().expect("net")],
        vec!["10.250.0.0/30".parse().expect("net")],
    );
    held_config.hold_timeout = SIDECAR_HOLD;
    let mut alone_config = held_config.clone();
    alone_config.listen = vec!["127.0.0.1:9444".parse().expect("addr")];
    alone_config.metrics_listen = Vec::new();
    let mut short_config = held_config.clone();
    short_config.listen = vec!["127.0.0.1:9446".parse().expect("addr")];
    short_config.metrics_listen = vec!["127.0.0.1:15001".parse().expect("addr")];
    short_config.hold_timeout = SHORT_HOLD;
    short_config.max_held = 1;
    let token = seed_token.clone();
    let seed_task = seed_rt.spawn(async move {
        let server = Server::bind(settings).await.expect("server bind");
        let routes = server.client_routes();
        let mut tasks = Vec::new();
        for (config, routes) in [
            (
                held_config,
                Some(Arc::new(routes.clone()) as Arc<dyn RouteCheck>),
            ),
            (alone_config, None),
            (
                short_config,
                Some(Arc::new(routes.clone()) as Arc<dyn RouteCheck>),
            ),
        ] {
            let sidecar = Sidecar::bind(config, routes).await.expect("sidecar bind");
            tasks.push(tokio::spawn(sidecar.run(token.clone())));
        }
        ready_tx.send(routes).expect("ready");
        server.run(token).await.expect("server run");
        for t in tasks {
            t.await.expect("sidecar task");
        }
    });
    let routes = ready_rx
        .recv_timeout(WAIT)
        .expect("server and sidecars bound");

    // POD: answers every connection with HELLO (four are expected; bounded in time).
    let listener = pod
        .run_in(|| TcpListener::bind((POD_ADDR, POD_PORT)))
        .expect("run in pod")
        .expect("pod listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let pod_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pod_server = {
        let stop = Arc::clone(&pod_stop);
        std::thread::spawn(move || {
            let deadline = Instant::now() + WAIT * 2;
            let mut served = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.write_all(HELLO);
                        served += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("pod accept: {e}"),
                }
            }
            served
        })
    };

    // SHOOT: our client, up; then gone.
    let shoot_rt = ns_runtime(&shoot);
    let client = start_client(&shoot_rt, &pki, &tls_auth);
    wait_route(&routes, true);
    stop_client(&shoot_rt, client);
    let gone = wait_route(&routes, false);

    let good = connector(&pki.bundle, Some(&pki.client));
    let pod_addr = SocketAddr::from((POD_ADDR, POD_PORT));
    let (results, back) = std::thread::scope(|sc| {
        let held = sc.spawn(|| seed.run_in(|| connect_through(&good, 9443)).expect("seed"));
        let alone = sc.spawn(|| seed.run_in(|| connect_through(&good, 9444)).expect("seed"));
        let direct = sc.spawn(|| {
            seed.run_in(|| {
                let started = Instant::now();
                let mut s = TcpStream::connect_timeout(&pod_addr, WAIT).expect("direct connect");
                let connected = Instant::now();
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                (started, connected, got)
            })
            .expect("seed")
        });
        let short_started = Instant::now();
        let short = sc.spawn(|| seed.run_in(|| connect_through(&good, 9446)).expect("seed"));
        std::thread::sleep(Duration::from_millis(300));
        let over_started = Instant::now();
        let (over_status, _, over_answered) =
            seed.run_in(|| connect_through(&good, 9446)).expect("seed");
        std::thread::sleep((gone + DOWN).saturating_duration_since(Instant::now()));
        let client = start_client(&shoot_rt, &pki, &tls_auth);
        let back = wait_route(&routes, true);
        let results = (
            held.join().expect("held"),
            alone.join().expect("alone"),
            direct.join().expect("direct"),
            (short_started, short.join().expect("short")),
            (over_started, over_status, over_answered),
            client,
        );
        (results, back)
    });
    let (held, alone, direct, short, over, client) = results;
    let down = back - gone;
    for (name, (status, got, answered)) in [("held", held), ("alone", alone)] {
        assert_eq!(status, Some(200), "{name}: CONNECT during the reconnect");
        assert_eq!(got, HELLO, "{name}: the pod's answer");
        let after = answered.saturating_duration_since(back);
        assert!(
            after < AFTER_RETURN,
            "{name}: answered {after:?} after the tunnel was back (down {down:?})"
        );
    }
    let (started, connected, got) = direct;
    assert_eq!(got, HELLO, "direct: the pod's answer");
    assert!(
        connected.saturating_duration_since(back) < AFTER_RETURN,
        "direct: connected {:?} after the tunnel was back (down {down:?}; started {:?} after it went)",
        connected.saturating_duration_since(back),
        started.saturating_duration_since(gone)
    );
    let (short_started, (status, _, answered)) = short;
    let took = answered - short_started;
    assert_eq!(status, Some(503), "short: no route within its bound");
    assert!(
        took >= SHORT_HOLD && took < SHORT_HOLD + Duration::from_secs(1),
        "short: 503 after {took:?}, its bound is {SHORT_HOLD:?}"
    );
    let (over_started, over_status, over_answered) = over;
    assert_eq!(over_status, Some(503), "over the waiter limit");
    assert!(
        over_answered - over_started < Duration::from_millis(500),
        "over the waiter limit: 503 after {:?}, must be at once",
        over_answered - over_started
    );
    let (held_text, short_text) = seed
        .run_in(|| {
            (
                scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000))),
                scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15001))),
            )
        })
        .expect("seed");
    assert_eq!(
        metric(&held_text, "vpn_sidecar_held_total{end=\"routed\"}"),
        1
    );
    assert_eq!(metric(&held_text, "vpn_sidecar_held"), 0);
    assert_eq!(
        metric(&short_text, "vpn_sidecar_held_total{end=\"timeout\"}"),
        1
    );
    assert_eq!(metric(&short_text, "vpn_sidecar_held_overflow_total"), 1);

    // The client gone for good: the server holds the SYN for its bound, then answers it with
    // ICMP host unreachable.
    stop_client(&shoot_rt, client);
    wait_route(&routes, false);
    let (refused, took) = seed
        .run_in(|| {
            let started = Instant::now();
            let r = TcpStream::connect_timeout(&pod_addr, WAIT);
            (r.map(|_| ()), started.elapsed())
        })
        .expect("seed");
    let e = refused.expect_err("no client: the connect fails");
    assert_eq!(e.kind(), ErrorKind::HostUnreachable, "{e}");
    assert!(
        took >= SERVER_HOLD - Duration::from_millis(50)
            && took < SERVER_HOLD + Duration::from_secs(2),
        "refused after {took:?}; the server's bound is {SERVER_HOLD:?}"
    );

    // Past the server's bound it answers at once; the sidecar alone dials again until its
    // own bound, so a client back meanwhile still carries the CONNECT.
    let (alone, back) = std::thread::scope(|sc| {
        let alone = sc.spawn(|| seed.run_in(|| connect_through(&good, 9444)).expect("seed"));
        std::thread::sleep(Duration::from_secs(1));
        let client = start_client(&shoot_rt, &pki, &tls_auth);
        let back = wait_route(&routes, true);
        ((alone.join().expect("alone"), client), back)
    });
    let ((status, got, answered), client) = alone;
    assert_eq!(status, Some(200), "alone, past the server's bound");
    assert_eq!(got, HELLO);
    let after = answered.saturating_duration_since(back);
    assert!(
        after < AFTER_RETURN,
        "alone, past the server's bound: answered {after:?} after the tunnel was back"
    );
    stop_client(&shoot_rt, client);

    pod_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        pod_server.join().expect("pod server"),
        4,
        "connections the pod served"
    );
    seed_token.cancel();
    seed_rt
        .block_on(async { tokio::time::timeout(WAIT, seed_task).await })
        .expect("seed stops")
        .expect("seed task");
    seed_rt.shutdown_timeout(Duration::from_secs(5));
    shoot_rt.shutdown_timeout(Duration::from_secs(5));
}
