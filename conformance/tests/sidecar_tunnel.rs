//! The CONNECT sidecar inside the vpn-server process, through a real tunnel: our
//! `vpn_server::Server` and the sidecar share a runtime in SEED (the sidecar asks the server
//! which destinations a connected client routes), our `vpn_client::run` in SHOOT forwards into
//! the pod network.
//!
//! ```text
//!  SEED  vpn_server::Server [::]:1194, tun0 192.168.123.1/24, route 100.96.0.0/24 tun0
//!        sidecar 127.0.0.1:9443 (metrics 127.0.0.1:15000), allow 100.96.0.0/24
//!        sidecar "alone" 127.0.0.1:9444 (same, without the server's routes)
//!        sidecar "mapped" 127.0.0.1:9445 (same, with vpn2's mapping 100.96.0.0/24 → 244.0.0.0/24)
//!        route and iroute also 244.0.0.0/8 (vpn2's mapped pod range)
//!        10.250.0.1/30 ──veth── 10.250.0.2/30  SHOOT  vpn_client::run (tun0), ip_forward=1
//!                                              100.96.0.1/24 ──veth── 100.96.0.10/24  POD
//!                                              244.0.0.1/24            244.0.0.10/24
//! ```
//!
//! * CONNECT 100.96.0.10:8080 from SEED carries a 64 MiB download from the pod; its SHA-256
//!   matches what the pod sent;
//! * through the "mapped" sidecar, CONNECT 100.96.0.10 arrives at 244.0.0.10 (vpn2's
//!   address translation done in the sidecar);
//! * with the client gone for good (tunnel down) a CONNECT to the pod waits for it for the
//!   hold bound (1 s here; `hold_reconnect.rs` has a client that comes back) and is then
//!   refused with 503, not before and within 1 s after, and counted: by the in-process
//!   sidecar because the server reports no client route, and by a second sidecar that runs
//!   as if alone (no view of the server) because the server, its own hold (1 s) over, answers
//!   the SYN with ICMP "host unreachable".

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, metric, ns_runtime, scrape, tls, Pki, WAIT,
};
use conformance::tunnel_lab::{
    client_settings, server_settings, wait_route, TunnelLab, POD_ADDR, POD_NETWORK, POD_PORT,
};
use openssl::sha::sha256;
use sidecar::{Netmap, Sidecar};
use vpn_client::CancellationToken;
use vpn_server::Server;

/// `POD_ADDR` under vpn2's mapping of the pod network `100.96.0.0/24` into `244/8`.
const POD_MAPPED: Ipv4Addr = Ipv4Addr::new(244, 0, 0, 10);
const LEN: usize = 64 << 20;
/// The hold bound of the server and the sidecars.
const HOLD: Duration = Duration::from_secs(1);

#[test]
fn in_process_sidecar_carries_64_mib_through_the_tunnel_and_refuses_at_the_hold_bound_when_it_is_down(
) {
    require_lab(&[]);
    let pki = Pki::generate();
    let tls_auth = protocol::static_key::generate(&mut rand_core::OsRng);
    let TunnelLab { seed, shoot, pod } = TunnelLab::new();
    // The pod also has its vpn2-mapped address (what vpn2's shoot-side NAT would translate
    // back to; here the pod simply answers on it).
    let addresses: [(&Netns, String, &str); 2] = [
        (&shoot, "244.0.0.1/24".to_owned(), "shoot-pod"),
        (&pod, format!("{POD_MAPPED}/24"), "pod0"),
    ];
    for (ns, cidr, dev) in &addresses {
        ns.run(["ip", "addr", "add", cidr, "dev", dev])
            .expect("address");
    }

    // SEED: the server and the in-process sidecar on one runtime.
    let seed_rt = ns_runtime(&seed);
    let seed_token = CancellationToken::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    // Routed and iroute'd: the pod network and vpn2's mapped pod range.
    let settings = server_settings(
        &pki,
        &tls_auth,
        &[
            POD_NETWORK.parse().expect("net"),
            "244.0.0.0/8".parse().expect("net"),
        ],
        HOLD,
    );
    let sidecar_config = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec![POD_NETWORK.parse().expect("net")],
        vec!["10.250.0.0/30".parse().expect("net")],
    );
    let mut sidecar_config = sidecar_config;
    sidecar_config.hold_timeout = HOLD;
    // A second sidecar as if it ran alone: no view of the server's routes.
    let mut alone_config = sidecar_config.clone();
    alone_config.listen = vec!["127.0.0.1:9444".parse().expect("addr")];
    alone_config.metrics_listen = Vec::new();
    // A third one with vpn2's address translation of the pod network.
    let mut mapped_config = sidecar_config.clone();
    mapped_config.listen = vec!["127.0.0.1:9445".parse().expect("addr")];
    mapped_config.metrics_listen = Vec::new();
    mapped_config.netmap =
        Netmap::vpn2(&[POD_NETWORK.parse().expect("net")], &[], &[]).expect("netmap");
    let token = seed_token.clone();
    let seed_task = seed_rt.spawn(async move {
        let server = Server::bind(settings).await.expect("server bind");
        let routes = server.client_routes();
        let sidecar = Sidecar::bind(sidecar_config, Some(Arc::new(routes.clone())))
            .await
            .expect("sidecar bind");
        let alone = Sidecar::bind(alone_config, None)
            .await
            .expect("standalone sidecar bind");
        let mapped = Sidecar::bind(mapped_config, Some(Arc::new(routes.clone())))
            .await
            .expect("mapping sidecar bind");
        ready_tx.send(routes).expect("ready");
        let mapped_task = tokio::spawn(mapped.run(token.clone()));
        let sidecar_task = tokio::spawn(sidecar.run(token.clone()));
        let alone_task = tokio::spawn(alone.run(token.clone()));
        server.run(token).await.expect("server run");
        sidecar_task.await.expect("sidecar task");
        alone_task.await.expect("standalone sidecar task");
        mapped_task.await.expect("mapping sidecar task");
    });
    let routes = ready_rx
        .recv_timeout(WAIT)
        .expect("server and sidecar bound");

    // SHOOT: our client.
    let shoot_rt = ns_runtime(&shoot);
    let client_token = CancellationToken::new();
    let client_task = shoot_rt.spawn(vpn_client::run(
        client_settings(&pki, &tls_auth),
        client_token.clone(),
    ));
    wait_route(&routes, true);

    // POD: 64 MiB for the first connection.
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4093) as u8).collect();
    let want = sha256(&data);
    let listener = pod
        .run_in(|| TcpListener::bind((POD_ADDR, POD_PORT)))
        .expect("run in pod")
        .expect("pod listener");
    let pod_server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.write_all(&data).expect("write");
    });

    let good = connector(&pki.bundle, Some(&pki.client));
    let sidecar_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9443));
    let target = format!("{POD_ADDR}:{POD_PORT}");
    let (status, got) = seed
        .run_in(|| {
            let mut s = tls(&good, sidecar_addr).expect("handshake");
            let status = connect_status(&mut s, &target);
            let mut got = Vec::with_capacity(LEN);
            s.read_to_end(&mut got).expect("read the download");
            (status, got)
        })
        .expect("run in seed");
    // The status first: a refused CONNECT never reaches the pod, whose accept would wait.
    assert_eq!(status, Some(200));
    pod_server.join().expect("pod server");
    assert_eq!(got.len(), LEN, "bytes through the sidecar and the tunnel");
    assert!(
        sha256(&got) == want,
        "SHA-256 of the 64 MiB download differs"
    );
    drop(got);

    // vpn2's translation: CONNECT to the real pod address arrives at its mapped address.
    let mapped_listener = pod
        .run_in(|| TcpListener::bind((POD_MAPPED, POD_PORT + 1)))
        .expect("run in pod")
        .expect("mapped listener");
    let mapped_server = std::thread::spawn(move || {
        let (mut s, _) = mapped_listener.accept().expect("accept");
        s.write_all(b"reached at the mapped address")
            .expect("write");
    });
    let mapped_target = format!("{POD_ADDR}:{}", POD_PORT + 1);
    let (status, got) = seed
        .run_in(|| {
            let mut s = tls(&good, SocketAddr::from((Ipv4Addr::LOCALHOST, 9445))).expect("tls");
            let status = connect_status(&mut s, &mapped_target);
            let mut got = Vec::new();
            s.read_to_end(&mut got).expect("read");
            (status, got)
        })
        .expect("run in seed");
    assert_eq!(status, Some(200));
    mapped_server.join().expect("mapped server");
    assert_eq!(got, b"reached at the mapped address");

    // The tunnel goes down: the client stops, the server forgets its iroute.
    client_token.cancel();
    shoot_rt
        .block_on(async { tokio::time::timeout(WAIT, client_task).await })
        .expect("client stops")
        .expect("client task")
        .expect("client run");
    wait_route(&routes, false);
    let alone_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9444));
    let (refusals, text) = seed
        .run_in(|| {
            let refusals: Vec<(Option<u16>, Duration)> = [sidecar_addr, alone_addr]
                .iter()
                .map(|addr| {
                    let mut s = tls(&good, *addr).expect("handshake");
                    let started = Instant::now();
                    let status = connect_status(&mut s, &target);
                    (status, started.elapsed())
                })
                .collect();
            let text = scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000)));
            (refusals, text)
        })
        .expect("run in seed");
    // In-process: the server's routes say no client; alone: the server's ICMP unreachable
    // fails the connect. Both at the hold bound, not before.
    for ((status, took), mode) in refusals.iter().zip(["in-process", "alone"]) {
        assert_eq!(*status, Some(503), "{mode}: CONNECT with the tunnel down");
        assert!(
            *took >= HOLD && *took < HOLD + Duration::from_secs(1),
            "{mode}: the refusal took {took:?} (the bound is {HOLD:?})"
        );
    }
    let cluster = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_none_healthy{{{cluster}}}")
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_rx_bytes_total{{{cluster}}}")
        ),
        LEN as u64
    );

    seed_token.cancel();
    seed_rt
        .block_on(async { tokio::time::timeout(WAIT, seed_task).await })
        .expect("seed stops")
        .expect("seed task");
    seed_rt.shutdown_timeout(Duration::from_secs(5));
    shoot_rt.shutdown_timeout(Duration::from_secs(5));
}
