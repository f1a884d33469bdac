//! Restarts with many tunnels open (issue 19's fault catalogue): the `vpn-server` process
//! stopped with SIGTERM or killed with SIGKILL under 50 clients, and the `vpn-router` process
//! restarted under 200 tunnels. Every client must come back by itself, each tunnel must carry
//! an ICMP echo to the server's tun address and back, and the time until the last one did is
//! printed (`eprintln`, run with `--nocapture` to see it).
//!
//! ```text
//!  SHOOT 10.81.0.2 ── veth ── SEED 10.81.0.1
//!  our clients (tasks of one     vpn-server process :1194 (restart tests)
//!  runtime, tun0..tunN-1)         or vpn-router process :8443 → our server (thread) :1194
//! ```
//!
//! The binaries are the ones beside this test's build (`cargo build -p vpn-server -p
//! vpn-client -p vpn-router` first; `conformance::gardener::pods::Binaries` checks they are
//! newer than their sources). The clients retry after 1 s, doubling up to 5 s
//! (`connect-retry 1 5`): the times below include that back-off.

mod faults_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::gardener::pods::Binaries;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use faults_common::*;
use netio::http::CustomHeader;
use rustix::process::Signal;
use vpn_client::{HttpProxy, Remote};

/// Where the server's admin endpoint listens (SEED's loopback).
const ADMIN: &str = "127.0.0.1:9180";
/// Where the router listens, and its metrics.
const ROUTER_PORT: u16 = 8443;
const ROUTER_METRICS: &str = "127.0.0.1:9181";
const ROUTE: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";
/// Generous bound on a whole fleet coming up or back.
const FLEET_TIMEOUT: Duration = Duration::from_secs(120);

fn client_settings(pki: &TestPki, remote: Remote) -> vpn_client::Settings {
    let mut s = pki.our_client_settings(remote).expect("client settings");
    s.connect_retry = Duration::from_secs(1);
    s.connect_retry_max = Duration::from_secs(5);
    s
}

fn start_server<'ns>(
    ns: &'ns faults_common::Pair,
    bins: &Binaries,
    dir: &Path,
    nth: usize,
) -> Process<'ns> {
    let conf = dir.join("server.conf");
    let args = vec![
        "--config".to_owned(),
        conf.display().to_string(),
        "--log".to_owned(),
        "info".to_owned(),
        "--admin-listen".to_owned(),
        ADMIN.to_owned(),
    ];
    let p = Process::start(&ns.seed, &bins.server, &args, &dir.join("server.log"), None);
    p.wait_log_count(
        "listening for incoming TCP connections",
        nth,
        Duration::from_secs(30),
    );
    p
}

fn server_clients(pair: &faults_common::Pair) -> Option<f64> {
    series(
        &scrape(&pair.seed, ADMIN.parse().expect("addr")),
        "vpn_server_clients",
    )
}

/// Waits until the admin endpoint of the server in SEED counts `n` clients.
fn wait_clients(pair: &faults_common::Pair, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = server_clients(pair);
        if now == Some(n as f64) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server counts {now:?} clients, not {n}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn server_restart(signal: Signal, label: &str) {
    const CLIENTS: usize = 50;
    require_lab(&["openssl", "openvpn", "ping", "prlimit"]);
    init_tracing();
    let bins = Binaries::locate().expect("our binaries");
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("server.conf"),
        server_process_config(&pki, &[]),
    )
    .expect("config");

    let server = start_server(&pair, &bins, dir.path(), 1);
    let started = Instant::now();
    let fleet = Fleet::start(&pair.shoot, CLIENTS, |_| {
        client_settings(&pki, Remote::new(SEED_ADDR.to_string(), PORT))
    });
    let up = ping_all(&pair.shoot, &fleet.devs, SERVER_TUN, FLEET_TIMEOUT);
    assert_eq!(up.len(), CLIENTS, "tunnels up at first: {up:?}");
    eprintln!(
        "{label}: {CLIENTS} tunnels up and answering {:?} after the clients started",
        started.elapsed()
    );
    wait_clients(&pair, CLIENTS);

    let signalled = Instant::now();
    server.signal(signal);
    let status = server.wait_exit(Duration::from_secs(15));
    let exited = signalled.elapsed();
    match signal {
        Signal::TERM => assert!(status.success(), "SIGTERM: exit {status}"),
        _ => {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc_sigkill()), "SIGKILL: {status}");
        }
    }
    let server = start_server(&pair, &bins, dir.path(), 2);
    let listening = signalled.elapsed();
    let back = ping_all(&pair.shoot, &fleet.devs, SERVER_TUN, FLEET_TIMEOUT);
    let all_back = signalled.elapsed();
    assert_eq!(
        back.len(),
        CLIENTS,
        "tunnels back after the restart: {} of {CLIENTS}",
        back.len()
    );
    wait_clients(&pair, CLIENTS);
    assert_eq!(fleet.ended(), 0, "a client gave up");
    let log = server.log_text();
    if signal == Signal::TERM {
        // The first server told its clients (RESTART) and drained before it went.
        assert!(log.contains("telling clients and draining"), "{log}");
        assert!(log.contains("shutdown complete"), "{log}");
    }
    eprintln!(
        "{label}: old server gone {exited:?} after the signal, new one listening after \
         {listening:?}; all {CLIENTS} tunnels back and answering {all_back:?} after the signal \
         (last one {:?} after the new server listened)",
        all_back.saturating_sub(listening)
    );
    for r in fleet.stop() {
        assert_eq!(r, Ok(vpn_client::Stopped::Shutdown));
    }
    drop(server);
}

fn libc_sigkill() -> i32 {
    Signal::KILL.as_raw()
}

#[test]
fn server_sigterm_with_50_clients_all_come_back() {
    server_restart(Signal::TERM, "server SIGTERM");
}

#[test]
fn server_sigkill_with_50_clients_all_come_back() {
    server_restart(Signal::KILL, "server SIGKILL");
}

fn router_config() -> String {
    format!(
        "metrics_listen = \"{ROUTER_METRICS}\"\n\n\
         [[listener]]\naddress = \"{SEED_ADDR}:{ROUTER_PORT}\"\n\
         headers = [\"Reversed-VPN\"]\n\n\
         [[route]]\nvalue = \"{ROUTE}\"\nupstream = \"127.0.0.1:{PORT}\"\n"
    )
}

fn start_router<'ns>(pair: &'ns Pair, bins: &Binaries, dir: &Path, nth: usize) -> Process<'ns> {
    let conf = dir.join("router.toml");
    let args = vec![
        "--config".to_owned(),
        conf.display().to_string(),
        "--log".to_owned(),
        "info".to_owned(),
    ];
    let p = Process::start(
        &pair.seed,
        &bins.router,
        &args,
        &dir.join("router.log"),
        None,
    );
    p.wait_log_count("router listening", nth, Duration::from_secs(30));
    p
}

fn router_tunnels(pair: &Pair) -> Option<f64> {
    let addr: SocketAddr = ROUTER_METRICS.parse().expect("addr");
    series(&scrape(&pair.seed, addr), "vpn_router_tunnels_active")
}

/// 200 of our clients through the ingress router; the router process stopped (SIGTERM) or
/// killed (SIGKILL), then a new one started. Every tunnel comes back through the new router; the server's counter
/// of established tunnels shows each client reconnected, the router's gauge shows 200 open
/// tunnels again, and a sample of 20 tunnels carries an echo (all 200 are counted, not each
/// pinged: two cores).
fn router_restart(signal: Signal, label: &str) {
    const TUNNELS: usize = 200;
    const SAMPLE: usize = 20;
    require_lab(&["openssl", "openvpn", "ping"]);
    init_tracing();
    let bins = Binaries::locate().expect("our binaries");
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("router.toml"), router_config()).expect("config");
    let mut settings = pki.our_server_settings(PORT).expect("server settings");
    settings.duplicate_cn = true;
    settings.listen = vec![SocketAddr::from(([127, 0, 0, 1], PORT))];

    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &pair.seed, settings).expect("our server");
        let stats = server.stats();
        let router = start_router(&pair, &bins, dir.path(), 1);
        let started = Instant::now();
        let fleet = Fleet::start(&pair.shoot, TUNNELS, |_| {
            let mut s = client_settings(&pki, Remote::new(SEED_ADDR.to_string(), PORT));
            let mut proxy = HttpProxy::new(SEED_ADDR.to_string(), ROUTER_PORT);
            proxy.options.custom_headers.push(CustomHeader::NameValue {
                name: "Reversed-VPN".into(),
                value: ROUTE.into(),
            });
            s.http_proxy = Some(proxy);
            s
        });
        let wait_established = |n: u64, what: &str| {
            let deadline = Instant::now() + FLEET_TIMEOUT;
            while stats.connected() < n {
                assert!(
                    Instant::now() < deadline,
                    "{what}: {} of {n} tunnels established",
                    stats.connected()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        let wait_router = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let now = router_tunnels(&pair);
                if now == Some(n as f64) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "the router counts {now:?} open tunnels, not {n}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        wait_established(TUNNELS as u64, "first start");
        let first_up = started.elapsed();
        wait_router(TUNNELS);
        let sample: Vec<String> = fleet
            .devs
            .iter()
            .step_by(TUNNELS / SAMPLE)
            .cloned()
            .collect();
        let up = ping_all(&pair.shoot, &sample, SERVER_TUN, Duration::from_secs(60));
        assert_eq!(
            up.len(),
            SAMPLE,
            "sample answering before the restart: {up:?}"
        );
        eprintln!("{label}: {TUNNELS} tunnels established {first_up:?} after the start");
        assert_eq!(
            stats.connected(),
            TUNNELS as u64,
            "a client reconnected early"
        );

        let signalled = Instant::now();
        router.signal(signal);
        let status = router.wait_exit(Duration::from_secs(15));
        match signal {
            Signal::TERM => assert!(status.success(), "SIGTERM: exit {status}"),
            _ => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(libc_sigkill()), "SIGKILL: {status}");
            }
        }
        let exited = signalled.elapsed();
        let router = start_router(&pair, &bins, dir.path(), 2);
        let listening = signalled.elapsed();
        wait_established(2 * TUNNELS as u64, "after the router restart");
        let all_back = signalled.elapsed();
        wait_router(TUNNELS);
        let back = ping_all(&pair.shoot, &sample, SERVER_TUN, Duration::from_secs(60));
        assert_eq!(
            back.len(),
            SAMPLE,
            "sample answering after the restart: {back:?}"
        );
        assert_eq!(fleet.ended(), 0, "a client gave up");
        eprintln!(
            "{label}: old router gone {exited:?} after the signal, new one listening after \
             {listening:?}; all {TUNNELS} tunnels re-established {all_back:?} after the signal; \
             {SAMPLE} sampled tunnels answering {:?} after it",
            signalled.elapsed()
        );
        for r in fleet.stop() {
            assert_eq!(r, Ok(vpn_client::Stopped::Shutdown));
        }
        drop(router);
        server.stop().result.expect("server run");
    });
}

#[test]
fn router_sigterm_with_200_tunnels_all_come_back() {
    router_restart(Signal::TERM, "router SIGTERM");
}

#[test]
fn router_sigkill_with_200_tunnels_all_come_back() {
    router_restart(Signal::KILL, "router SIGKILL");
}
