//! Limits reached under running tunnels (issue 19's fault catalogue): the server's open-file
//! limit (`ulimit -n 64`) and a data key's packet id close to wrapping.
//!
//! ```text
//!  SHOOT 10.81.0.2 ── veth ── SEED 10.81.0.1
//!  our clients (tun0..)         vpn-server process under `prlimit --nofile=64:64`,
//!                               or our server as a thread (packet-id test)
//! ```
//!
//! Measured figures are printed (`--nocapture`).

mod faults_common;

use std::time::{Duration, Instant};

use conformance::gardener::pods::Binaries;
use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use faults_common::*;
use protocol::data::PacketIdLimits;
use vpn_client::Remote;

fn client(pki: &TestPki) -> vpn_client::Settings {
    let mut s = pki
        .our_client_settings(Remote::new(SEED_ADDR.to_string(), PORT))
        .expect("client settings");
    s.connect_retry = Duration::from_secs(1);
    s.connect_retry_max = Duration::from_secs(4);
    s
}

/// `ulimit -n 64` on the server process: more clients than it has descriptors for. The
/// server takes clients until it runs out, then new connections are not served (they wait in
/// the listen backlog: the accept fails with EMFILE), without a busy loop and without the
/// server ending; the tunnels it has keep carrying traffic; and when 20 clients leave, waiting
/// clients get their places.
#[test]
fn the_server_at_its_descriptor_limit_keeps_its_tunnels_and_recovers() {
    const NOFILE: u64 = 64;
    const CLIENTS: usize = 70;
    const LEAVING: usize = 20;
    require_lab(&["openssl", "openvpn", "ping", "prlimit"]);
    let _logs = capture_logs();
    let bins = Binaries::locate().expect("our binaries");
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("server.conf");
    std::fs::write(&conf, server_process_config(&pki, &[])).expect("config");
    let args = vec![
        "--config".to_owned(),
        conf.display().to_string(),
        "--log".to_owned(),
        "info".to_owned(),
    ];
    let server = Process::start(
        &pair.seed,
        &bins.server,
        &args,
        &dir.path().join("server.log"),
        Some(NOFILE),
    );
    server.wait_log_count(
        "listening for incoming TCP connections",
        1,
        Duration::from_secs(30),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid)).expect("limits");
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 64 ")),
        "{limits}"
    );
    let idle_fds = server.fds();

    let mut fleet = Fleet::start(&pair.shoot, CLIENTS, |_| client(&pki));
    let up = ping_all(
        &pair.shoot,
        &fleet.devs,
        SERVER_TUN,
        Duration::from_secs(45),
    );
    let fds = server.fds();
    eprintln!(
        "ulimit -n {NOFILE}: the server held {idle_fds} descriptors idle, {fds} with {} of \
         {CLIENTS} clients in",
        up.len()
    );
    assert!(server.running(), "the server ended:\n{}", server.log_text());
    assert!(
        up.len() < CLIENTS,
        "every client got in: the limit was not reached ({fds} descriptors)"
    );
    assert!(up.len() >= 30, "only {} clients got in", up.len());
    let log = server.log_text();
    let accept_failures = log.matches("accept failed").count();
    assert!(accept_failures > 0, "no failed accept logged:\n{log}");

    // Saturated: the tunnels it has still carry traffic, and it does not spin.
    let inside: Vec<String> = up.keys().cloned().collect();
    let lines_before = server.log_text().matches("accept failed").count();
    let cpu_before = server.cpu_time();
    let watch = Instant::now();
    let still = ping_all(&pair.shoot, &inside, SERVER_TUN, Duration::from_secs(30));
    assert_eq!(still.len(), inside.len(), "a tunnel stopped at the limit");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(watch.elapsed()));
    let cpu = server.cpu_time() - cpu_before;
    let watched = watch.elapsed();
    let lines = server.log_text().matches("accept failed").count() - lines_before;
    eprintln!(
        "  at the limit: all {} tunnels answering; server CPU {cpu:?} and {lines} \
         'accept failed' lines in {watched:?}",
        inside.len(),
    );
    // The accept loop retries every 50 ms and logs once a second.
    assert!(
        lines as u64 <= watched.as_secs() + 2,
        "{lines} 'accept failed' lines in {watched:?}"
    );
    assert!(
        cpu < watched / 5,
        "the server used {cpu:?} of CPU in {watched:?} at its descriptor limit"
    );
    assert!(server.running());

    // Recovery: clients leave, waiting ones get in.
    let leaving: Vec<usize> = fleet
        .devs
        .iter()
        .enumerate()
        .filter(|(_, d)| up.contains_key(*d))
        .map(|(i, _)| i)
        .take(LEAVING)
        .collect();
    for &i in &leaving {
        assert_eq!(fleet.stop_one(i), Ok(vpn_client::Stopped::Shutdown));
    }
    let left = Instant::now();
    let staying: Vec<String> = fleet
        .devs
        .iter()
        .enumerate()
        .filter(|(i, _)| !leaving.contains(i))
        .map(|(_, d)| d.clone())
        .collect();
    let want = staying.len().min(up.len());
    let mut back = ping_all(&pair.shoot, &staying, SERVER_TUN, Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(90);
    while back.len() < want && Instant::now() < deadline {
        back = ping_all(&pair.shoot, &staying, SERVER_TUN, Duration::from_secs(5));
    }
    let newcomers = back.keys().filter(|d| !up.contains_key(*d)).count();
    eprintln!(
        "  {LEAVING} clients left: {} of the {} staying clients answering {:?} later, \
         {newcomers} of them newly in",
        back.len(),
        staying.len(),
        left.elapsed()
    );
    assert!(
        back.len() >= want,
        "{} of {want} after the recovery",
        back.len()
    );
    assert!(newcomers > 0, "no waiting client got in after others left");
    assert_eq!(fleet.ended(), 0, "a client gave up");
    drop(fleet);
    drop(server);
}

/// A data key's packet-id limit lowered on both ends (wrap trigger 1000, last id 1100, in
/// place of upstream's 0xff000000 and 0xffffffff; a test-only setting, no directive) and 5000
/// ICMP echoes flooded through the tunnel: each end renegotiates whenever its send counter
/// reaches the trigger; the tunnel survives every renegotiation on the same TCP connection
/// (one tunnel established in all); no end ever sends a packet id twice with one key (the
/// receiving end's replay check would have ended the connection: its first fatal error
/// restarts a TCP session); and the echoes come back.
#[test]
fn a_packet_id_close_to_wrapping_forces_a_renegotiation_without_nonce_reuse() {
    const LIMITS: PacketIdLimits = PacketIdLimits {
        wrap_trigger: 1000,
        max: 1100,
    };
    const ECHOES: u32 = 5000;
    require_lab(&["openssl", "openvpn", "ping"]);
    let _logs = capture_logs();
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let mut server = pki.our_server_settings(PORT).expect("server settings");
    server.packet_ids = LIMITS;
    let mut client = client(&pki);
    client.packet_ids = LIMITS;
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &pair.seed, server).expect("server");
        let stats = server.stats();
        let client = ClientThread::spawn(scope, &pair.shoot, client);
        let devs = vec!["tun0".to_owned()];
        let up = ping_all(&pair.shoot, &devs, SERVER_TUN, Duration::from_secs(30));
        assert_eq!(up.len(), 1, "tunnel up");
        let start = Instant::now();
        let out = pair
            .shoot
            .run([
                "timeout",
                "120",
                "ping",
                "-n",
                "-q",
                "-f",
                "-c",
                &ECHOES.to_string(),
                "-I",
                "tun0",
                &SERVER_TUN.to_string(),
            ])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("{e}"));
        let took = start.elapsed();
        let received: u32 = out
            .split(',')
            .find_map(|part| part.trim().strip_suffix(" received")?.parse().ok())
            .unwrap_or_else(|| panic!("ping's summary: {out}"));
        let logs = captured_logs();
        let server_renegs = logs
            .lines()
            .filter(|l| l.contains("vpn_server") && l.contains("key renegotiated"))
            .count();
        let client_renegs = logs
            .lines()
            .filter(|l| l.contains("vpn_client") && l.contains("data key renegotiated"))
            .count();
        eprintln!(
            "packet-id limits {LIMITS:?}: {received} of {ECHOES} echoes back in {took:?}; \
             {server_renegs} renegotiations logged by the server, {client_renegs} by the client; \
             {} tunnel(s) established",
            stats.connected()
        );
        // Each end sent at least 9/10 of the echoes (or their replies) and one key sends at
        // most `max` packets: at least 4500 / 1100, so five keys, four renegotiations.
        assert!(
            server_renegs >= 4 && client_renegs >= 4,
            "renegotiations: server {server_renegs}, client {client_renegs}"
        );
        assert_eq!(
            stats.connected(),
            1,
            "the tunnel was re-established: a fatal error (a replayed packet id?)"
        );
        let lower = logs.to_ascii_lowercase();
        assert!(!lower.contains("replay"), "replay reported:\n{logs}");
        assert!(
            received >= ECHOES * 9 / 10,
            "{received} of {ECHOES} echoes came back"
        );
        let after = ping_all(&pair.shoot, &devs, SERVER_TUN, Duration::from_secs(10));
        assert_eq!(after.len(), 1, "the tunnel after the flood");
        assert!(!client.is_finished());
        client.stop().expect("client");
        server.stop().result.expect("server");
    });
}
