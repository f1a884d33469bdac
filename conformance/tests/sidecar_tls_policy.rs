//! The CONNECT sidecar's front door, in a lab namespace: the mTLS handshake and the
//! destination policy, against its real listeners (`0.0.0.0:9443` and `[::]:9443`) and its
//! metrics listener.
//!
//! ```text
//!  NS  lo: 127.0.0.1, ::1, 100.96.0.10 (a "shoot pod"), 10.250.0.1 (a "seed" address),
//!          169.254.1.1 (link-local)
//!      sidecar 0.0.0.0:9443 + [::]:9443, metrics 127.0.0.1:15000
//!      allow 100.96.0.0/24, deny seed 10.250.0.0/24
//!      a recording listener on :7001 of every address
//! ```
//!
//! * no client certificate, one from another CA, an expired one → the handshake fails and the
//!   request never gets an answer;
//! * CONNECT to loopback (IPv4, IPv6, `localhost`), the seed network, a link-local address or
//!   an address outside the shoot → 403, and the recording listeners saw no connection;
//! * CONNECT to the shoot address over both listeners → 200, exactly those connections;
//! * the metrics listener reports it all under the catalogued names;
//! * with `optional` client certificates (Envoy's mode) no certificate is accepted, but a
//!   foreign one still fails.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, metric, ns_runtime, scrape, start_sidecar, tls, Pki,
    Recorder,
};

const SHOOT: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
const SEED: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const LINK_LOCAL: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
const PORT: u16 = 7001;

#[test]
fn handshake_requires_a_valid_client_cert_and_policy_refuses_without_connecting() {
    require_lab(&[]);
    let pki = Pki::generate();
    let ns = Netns::new().expect("namespace");
    for addr in [SHOOT, SEED, LINK_LOCAL] {
        ns.run(["ip", "addr", "add", &format!("{addr}/32"), "dev", "lo"])
            .expect("address on lo");
    }
    let recorders: Vec<Recorder> = ns
        .run_in(|| {
            [
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                IpAddr::V4(SHOOT),
                IpAddr::V4(SEED),
                IpAddr::V4(LINK_LOCAL),
            ]
            .into_iter()
            .map(|ip| Recorder::bind(SocketAddr::new(ip, PORT)))
            .collect()
        })
        .expect("recorders");
    let sidecar = start_sidecar(
        ns_runtime(&ns),
        config(
            &pki,
            vec![
                "0.0.0.0:9443".parse().expect("addr"),
                "[::]:9443".parse().expect("addr"),
            ],
            vec!["127.0.0.1:15000".parse().expect("addr")],
            vec!["100.96.0.0/24".parse().expect("net")],
            vec!["10.250.0.0/24".parse().expect("net")],
        ),
        None,
    );
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 9443));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 9443));
    let shoot_target = format!("{SHOOT}:{PORT}");

    // (1) The handshake fails without a certificate from the bundle's CA that is valid now. With
    // TLS 1.3 the client may finish its side first; the server's alert then ends the
    // connection before any answer to the CONNECT.
    let refused = ns
        .run_in(|| {
            [
                connector(&pki.bundle, None),
                connector(&pki.bundle, Some(&pki.foreign_client)),
                connector(&pki.bundle, Some(&pki.expired_client)),
            ]
            .iter()
            .map(|c| match tls(c, v4) {
                Err(_) => None,
                Ok(mut s) => connect_status(&mut s, &shoot_target),
            })
            .collect::<Vec<_>>()
        })
        .expect("run in namespace");
    assert_eq!(
        refused,
        vec![None, None, None],
        "no cert / other CA / expired: the request must get no answer"
    );
    assert_eq!(
        recorders[2].accepted(),
        0,
        "nothing was dialed for a refused handshake"
    );

    // (2) Forbidden destinations: 403 and no connection attempt.
    let good = connector(&pki.bundle, Some(&pki.client));
    let targets = [
        format!("127.0.0.1:{PORT}"),
        format!("[::1]:{PORT}"),
        format!("localhost:{PORT}"),
        format!("{SEED}:{PORT}"),
        format!("{LINK_LOCAL}:{PORT}"),
        format!("[::ffff:127.0.0.1]:{PORT}"),
        "192.0.2.1:443".to_owned(),
    ];
    let statuses = ns
        .run_in(|| {
            targets
                .iter()
                .map(|t| {
                    let mut s = tls(&good, v4).expect("handshake with a good certificate");
                    connect_status(&mut s, t)
                })
                .collect::<Vec<_>>()
        })
        .expect("run in namespace");
    for (t, status) in targets.iter().zip(&statuses) {
        assert_eq!(*status, Some(403), "CONNECT {t}");
    }
    for r in &recorders {
        assert_eq!(r.accepted(), 0, "{} was connected to", r.addr());
    }

    // (3) The shoot address is allowed, over the IPv4 and the IPv6 listener.
    let ok = ns
        .run_in(|| {
            [v4, v6]
                .iter()
                .map(|addr| {
                    let mut s = tls(&good, *addr).expect("handshake");
                    let status = connect_status(&mut s, &shoot_target);
                    (status, s)
                })
                .collect::<Vec<_>>()
        })
        .expect("run in namespace");
    assert!(
        ok.iter().all(|(status, _)| *status == Some(200)),
        "{:?}",
        ok.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(recorders[2].accepted(), 2, "one upstream connection each");
    drop(ok);

    // (4) The metrics listener.
    let text = ns
        .run_in(|| scrape(sidecar.metrics_addrs[0]))
        .expect("run in namespace");
    assert_eq!(metric(&text, "vpn_sidecar_tls_handshake_failures_total"), 3);
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"loopback\"}"),
        4
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"seed_network\"}"),
        1
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"link_local\"}"),
        1
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"not_shoot\"}"),
        1
    );
    let hcm = "envoy_http_conn_manager_prefix=\"ingress_http\"";
    assert_eq!(
        metric(
            &text,
            &format!("envoy_http_downstream_rq_xx{{{hcm},envoy_response_code_class=\"4\"}}")
        ),
        7
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_http_downstream_rq_xx{{{hcm},envoy_response_code_class=\"2\"}}")
        ),
        2
    );
    let cluster = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_total{{{cluster}}}")
        ),
        2
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_connect_ms_count{{{cluster}}}")
        ),
        2
    );
    drop(sidecar);

    // (5) Envoy's mode, `--sidecar-client-cert optional`: no certificate is accepted, a
    // presented one must still verify.
    let mut optional = config(
        &pki,
        vec!["127.0.0.1:9444".parse().expect("addr")],
        vec![],
        vec!["100.96.0.0/24".parse().expect("net")],
        vec![],
    );
    optional.client_cert = pki::tls::ClientCertMode::Optional;
    let sidecar = start_sidecar(ns_runtime(&ns), optional, None);
    let addr = sidecar.addrs[0];
    let (anonymous, foreign) = ns
        .run_in(|| {
            let anonymous = tls(&connector(&pki.bundle, None), addr)
                .ok()
                .and_then(|mut s| connect_status(&mut s, &shoot_target));
            let foreign = match tls(&connector(&pki.bundle, Some(&pki.foreign_client)), addr) {
                Err(_) => None,
                Ok(mut s) => connect_status(&mut s, &shoot_target),
            };
            (anonymous, foreign)
        })
        .expect("run in namespace");
    assert_eq!(
        anonymous,
        Some(200),
        "optional mode admits a client without a certificate"
    );
    assert_eq!(
        foreign, None,
        "optional mode still refuses an untrusted certificate"
    );
    drop(sidecar);
}
