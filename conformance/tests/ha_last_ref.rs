//! Gardener's HA dashboard panel "VPN Seed Servers Client Count" over our exporters: the
//! expression `count(timestamp(x) - x < 35) by (service)` on
//! `x = openvpn_server_route_last_reference_time_seconds`, evaluated on scrapes of both
//! servers' `vpn-server exporter` every 3 s for 2 minutes (1 minute idle, then 1 minute of UDP
//! from both kube-apiserver replicas to the shoot node), with `timestamp(x)` the scrape time,
//! counts every connected client of each server (2 kube-apiservers and 2 shoot pods) at every
//! sample once the first 35 s have passed; the status files read after the idle minute and
//! after the busy one list one row per connection with a `Last Ref` under 35 s old.
//!
//! The layout is `gardener_ha.rs`'s (our binaries with the environment Gardener gives each HA
//! container, the ingress router in front of the servers); the tunnel controllers and path
//! controllers are left out, they carry no traffic. `docs/metrics.md`, "Last Ref".

// One scenario read top to bottom.
#![allow(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::gardener::ha::{HaLandscape, NODE, UDP_ECHO};
use conformance::gardener::ha_pods::{env, secrets_dir, status_path, HaPods};
use conformance::gardener::pods::{Binaries, Container, Spec};
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::wait::wait_until;

const PODS: HaPods = HaPods {
    shoot_ns: SHOOT_NS,
    dual_stack_nodes: false,
};
const SHOOT_NS: &str = "shoot--lab--lastref";
const EXPORTER: &str = "127.0.0.1:15000";
const UP: Duration = Duration::from_secs(40);
/// The panel's threshold.
const FRESH: f64 = 35.0;
const SERIES: &str = "openvpn_server_route_last_reference_time_seconds";
/// Connections per server: two kube-apiserver replicas, two shoot pods.
const CLIENTS: usize = 4;
const PHASE: Duration = Duration::from_secs(60);
const SCRAPE_EVERY: Duration = Duration::from_secs(3);

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// `GET /metrics` of the exporter in `ns`, and the scrape time (`timestamp(x)`).
fn scrape(ns: &Netns) -> Option<(f64, String)> {
    ns.run_in(|| {
        let mut s =
            TcpStream::connect_timeout(&EXPORTER.parse().expect("address"), Duration::from_secs(2))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let at = unix_now();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some((at, text))
    })
    .ok()
    .flatten()
}

/// The values of [`SERIES`] in an exposition, with their labels.
fn last_refs(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{SERIES}{{")))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The panel's expression for one server: `count(timestamp(x) - x < 35)`.
fn panel_count(at: f64, refs: &[(String, f64)]) -> usize {
    refs.iter().filter(|(_, x)| at - x < FRESH).count()
}

/// Connected clients with their tunnel up in a status file (`CLIENT_LIST` rows with a cipher).
fn connected(status: &str) -> usize {
    status
        .lines()
        .filter(|l| l.starts_with("CLIENT_LIST,") && !l.ends_with(','))
        .count()
}

/// The status file's `TIME` and each `ROUTING_TABLE` row's virtual address and `Last Ref`.
fn status_rows(status: &str) -> (u64, Vec<(String, u64)>) {
    let time = status
        .lines()
        .find_map(|l| l.strip_prefix("TIME,")?.rsplit(',').next()?.parse().ok())
        .expect("TIME");
    let rows = status
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.strip_prefix("ROUTING_TABLE,")?.split(',').collect();
            Some((f.first()?.to_string(), f.last()?.parse().ok()?))
        })
        .collect();
    (time, rows)
}

fn check_status_files(root: &Path, phase: &str) {
    for i in 0..2 {
        let text = std::fs::read_to_string(status_path(root, i)).expect("status file");
        let (time, rows) = status_rows(&text);
        assert_eq!(rows.len(), CLIENTS, "server {i} after {phase}: {text}");
        for (addr, last_ref) in &rows {
            assert!(
                time.saturating_sub(*last_ref) < 35,
                "server {i} after {phase}: {addr} last referenced {}s before the file's TIME:\n{text}",
                time.saturating_sub(*last_ref)
            );
        }
        eprintln!("server {i} status after {phase}: {rows:?} at {time}");
    }
}

#[test]
fn the_ha_panel_counts_every_connected_client_idle_and_busy() {
    require_lab(&["ip", "nft", "sysctl"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some("vpnt-lr")).expect("layout");
    let dir = secrets_dir("vpnt-lastref-").expect("secrets");
    let root = dir.path();
    l.start_echo().expect("echo");

    PODS.run_inits(&bins, &l, root).expect("init containers");
    let ingress = PODS
        .start_ingress(&bins, &l.ingress, root, UP)
        .expect("router listening");
    let mut running: Vec<Container<'_>> = Vec::new();
    for i in 0..2 {
        running.push(
            PODS.start_server(&bins, &l.server[i], root, i, UP)
                .expect("server up"),
        );
        let exporter_env = env(&[
            ("OPENVPN_STATUS_PATH", status_path(root, i)),
            ("VPN_SERVER_LOG", "error".into()),
        ]);
        let exporter_args = ["exporter", "--listen", EXPORTER];
        let name = format!("openvpn-exporter-{i}");
        running.push(
            Spec::new(&name, &bins.server, &exporter_args, exporter_env)
                .start(&l.server[i], root)
                .expect("exporter"),
        );
    }
    running.extend(
        PODS.start_shoot_clients(&bins, &l, root)
            .expect("shoot client")
            .into_iter()
            .flatten(),
    );
    running.extend(
        PODS.start_seed_clients(&bins, &l, root)
            .expect("seed client")
            .into_iter()
            .flatten(),
    );
    wait_until("every client connected to both servers", UP, || {
        (0..2).all(|i| {
            std::fs::read_to_string(status_path(root, i)).is_ok_and(|s| connected(&s) == CLIENTS)
        })
    });
    wait_until("both exporters serve the route series", UP, || {
        l.server
            .iter()
            .all(|ns| scrape(ns).is_some_and(|(_, t)| !last_refs(&t).is_empty()))
    });
    // Traffic through the tunnels works before the idle minute (the busy one needs it).
    let probe = |ns: &Netns| -> bool {
        ns.run_in(|| {
            let s = UdpSocket::bind("0.0.0.0:0").ok()?;
            s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
            s.send_to(b"probe", SocketAddr::from((NODE, UDP_ECHO)))
                .ok()?;
            let mut b = [0u8; 16];
            s.recv_from(&mut b).ok()
        })
        .ok()
        .flatten()
        .is_some()
    };
    wait_until("UDP echo through the tunnel from both replicas", UP, || {
        l.kapi.iter().all(probe)
    });

    // Scrapes every 3 s: an idle minute, then a busy one.
    let start = Instant::now();
    let busy = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    let mut samples: Vec<(Duration, usize, usize, f64)> = Vec::new();
    let mut failures = Vec::new();
    let mut idle_checked = false;
    while start.elapsed() < 2 * PHASE {
        if !idle_checked && start.elapsed() >= PHASE {
            check_status_files(root, "the idle minute");
            idle_checked = true;
            busy.store(true, Ordering::Relaxed);
            for ns in &l.kapi {
                let sock = ns
                    .run_in(|| UdpSocket::bind("0.0.0.0:0"))
                    .expect("lab step")
                    .expect("socket");
                let busy = Arc::clone(&busy);
                // Bounded: 50 packets a second for at most the busy minute.
                load.push(std::thread::spawn(move || {
                    let until = Instant::now() + PHASE + Duration::from_secs(5);
                    while busy.load(Ordering::Relaxed) && Instant::now() < until {
                        let _ = sock.send_to(&[0u8; 200], SocketAddr::from((NODE, UDP_ECHO)));
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }));
            }
        }
        for (i, ns) in l.server.iter().enumerate() {
            let Some((at, text)) = scrape(ns) else {
                failures.push(format!(
                    "{:?}: exporter {i} did not answer",
                    start.elapsed()
                ));
                continue;
            };
            let refs = last_refs(&text);
            let count = panel_count(at, &refs);
            let oldest = refs.iter().map(|(_, x)| at - x).fold(0.0, f64::max);
            samples.push((start.elapsed(), i, count, oldest));
            if start.elapsed() >= Duration::from_secs(35) && count != CLIENTS {
                failures.push(format!(
                    "{:?} ({}): server {i} panel counts {count} of {CLIENTS}: {refs:?}",
                    start.elapsed(),
                    if busy.load(Ordering::Relaxed) {
                        "busy"
                    } else {
                        "idle"
                    },
                ));
            }
        }
        std::thread::sleep(SCRAPE_EVERY);
    }
    busy.store(false, Ordering::Relaxed);
    for t in load {
        t.join().expect("load thread");
    }
    check_status_files(root, "the busy minute");
    for (t, i, count, oldest) in &samples {
        eprintln!("{t:>8.1?} server {i}: panel {count}, oldest Last Ref {oldest:.1}s");
    }
    assert!(samples.len() >= 70, "{} samples", samples.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    drop(running);
    drop(ingress);
}
