//! Credentials that change under a running tunnel (issue 19's fault catalogue): a client
//! certificate expiring while connected, a CA bundle rotated from an old CA to a new one, and
//! a tls-auth key changed on one side only.
//!
//! ```text
//!  SHOOT 10.81.0.2 ── veth ── SEED 10.81.0.1
//!  our client(s) (tun0..)       our server (thread, [::]:1194)
//! ```
//!
//! Server and clients run in process; their logs are captured (`faults_common::capture_logs`)
//! so the tests can check that each refusal says why. Measured times are printed.

mod faults_common;

use std::path::Path;
use std::time::{Duration, Instant};

use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use faults_common::*;
use pki::tls::PeerPolicy;
use protocol::digest::Digest;
use protocol::key::KeyDirection;
use protocol::session::ControlProtection;
use protocol::static_key;
use vpn_client::{Remote, TlsMaterial};

fn remote() -> Remote {
    Remote::new(SEED_ADDR.to_string(), PORT)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Client settings with their own certificate and trusted CAs.
fn client_with(pki: &TestPki, ca: Vec<u8>, cert: Vec<u8>, key: Vec<u8>) -> vpn_client::Settings {
    let mut s = pki.our_client_settings(remote()).expect("client settings");
    s.tls = TlsMaterial::Pem {
        ca,
        cert,
        key,
        peer: PeerPolicy::server_peer(),
    };
    s.connect_retry = Duration::from_secs(1);
    s.connect_retry_max = Duration::from_secs(4);
    s
}

/// Log lines captured so far that contain every one of `words` (case-insensitive).
fn log_lines(words: &[&str]) -> Vec<String> {
    captured_logs()
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            words.iter().all(|w| l.contains(&w.to_ascii_lowercase()))
        })
        .map(str::to_owned)
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < timeout,
            "{what} not within {timeout:?}; logs:\n{}",
            captured_logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// A client certificate that expires while its tunnel is up: the tunnel keeps working past
/// the expiry (nobody re-checks a certificate between handshakes, as upstream), ends at the
/// next renegotiation (the server's `reneg-sec`, 30 s), and every later attempt is refused
/// with the reason in the server's log.
#[test]
fn an_expiring_client_certificate_ends_the_tunnel_at_the_next_renegotiation() {
    const VALID_FOR: i64 = 20;
    const RENEG: Duration = Duration::from_secs(30);
    require_lab(&["openssl", "openvpn", "ping"]);
    let _logs = capture_logs();
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let issued = unix_now();
    let issued_at = Instant::now();
    let expires_at = issued_at + Duration::from_secs(VALID_FOR as u64);
    let (cert, key) = issue_client_cert(
        &pki.ca_cert(),
        &ca_key(&pki),
        "expiring",
        issued - 60,
        issued + VALID_FOR,
    );
    let mut server = pki.our_server_settings(PORT).expect("server settings");
    server.reneg_sec = Some(RENEG);
    let mut client = client_with(&pki, read(&pki.ca_cert()), cert, key);
    // Only the server renegotiates, so the moment is the server's reneg-sec.
    client.reneg_sec = None;
    let devs = vec!["tun0".to_owned()];

    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &pair.seed, server).expect("server");
        let stats = server.stats();
        let client = ClientThread::spawn(scope, &pair.shoot, client);
        let up = ping_all(&pair.shoot, &devs, SERVER_TUN, Duration::from_secs(15));
        assert_eq!(up.len(), 1, "tunnel up while the certificate is valid");
        let connected_at = Instant::now();
        assert!(
            connected_at < expires_at,
            "set-up took longer than the validity"
        );
        assert_eq!(stats.connected(), 1);

        // Past the expiry, before the renegotiation: still carrying traffic.
        let after_expiry = expires_at + Duration::from_secs(2);
        std::thread::sleep(after_expiry.saturating_duration_since(Instant::now()));
        assert!(
            connected_at.elapsed() < RENEG - RENEG / 10,
            "too late to look before the renegotiation"
        );
        assert!(
            ping(&pair.shoot, "tun0", SERVER_TUN, 0x5a),
            "the tunnel ended at the expiry, before any renegotiation"
        );
        eprintln!(
            "certificate expired {:?} after the tunnel came up; tunnel still answering {:?} \
             after the expiry",
            expires_at - connected_at,
            Instant::now() - expires_at
        );

        // The renegotiation fails the certificate check: the tunnel ends.
        let ended = wait_for("the tunnel to end", RENEG + Duration::from_secs(30), || {
            !ping(&pair.shoot, "tun0", SERVER_TUN, 0x5b)
        });
        let ended_after_connect = connected_at.elapsed();
        eprintln!(
            "tunnel stopped answering {ended_after_connect:?} after it came up (server reneg-sec \
             {RENEG:?}, minus up to 10% jitter), {ended:?} after the first look past the expiry"
        );
        assert!(
            ended_after_connect >= RENEG - RENEG / 10 - Duration::from_secs(1),
            "the tunnel ended before the renegotiation: {ended_after_connect:?}"
        );
        // Later attempts are refused, and the server says why.
        let reason = ["CN=expiring", "refused: certificate has expired"];
        wait_for(
            "the server to log the expired certificate",
            Duration::from_secs(30),
            || !log_lines(&reason).is_empty(),
        );
        for line in log_lines(&reason).iter().take(2) {
            eprintln!("  log: {line}");
        }
        std::thread::sleep(Duration::from_secs(5));
        assert!(
            !ping(&pair.shoot, "tun0", SERVER_TUN, 0x5c),
            "an expired certificate got a tunnel again"
        );
        assert_eq!(
            stats.connected(),
            1,
            "an expired certificate was accepted again"
        );
        assert!(
            !client.is_finished(),
            "the client gave up instead of retrying"
        );
        client.stop().expect("client");
        server.stop().result.expect("server");
    });
}

/// Concatenated PEM files: a CA bundle.
fn bundle(cas: &[&Path]) -> Vec<u8> {
    cas.iter().flat_map(|p| read(p)).collect()
}

/// A server config for `load_file`: `ca` is a bundle file.
fn server_config(
    dir: &Path,
    ca: &Path,
    cert: &Path,
    key: &Path,
    ta: &Path,
) -> vpn_server::Settings {
    let text = [
        "proto tcp-server".to_owned(),
        format!("port {PORT}"),
        "dev tun".to_owned(),
        "topology subnet".to_owned(),
        "server 192.168.123.0 255.255.255.0".to_owned(),
        "keepalive 10 60".to_owned(),
        format!("ca {}", ca.display()),
        format!("cert {}", cert.display()),
        format!("key {}", key.display()),
        "dh none".to_owned(),
        format!("tls-auth {} 0", ta.display()),
        "auth SHA256".to_owned(),
        "duplicate-cn".to_owned(),
    ]
    .join("\n")
        + "\n";
    let path = dir.join("server.conf");
    std::fs::write(&path, text).expect("server config");
    vpn_server::load_file(&path)
        .expect("server config loads")
        .settings
}

/// CA rotation as an operator does it, with two CAs of the same name (`vpnt-test-ca`):
///
/// 1. the server trusts the bundle old+new and still presents its old certificate: a client
///    with an old certificate and one with a new certificate (both trusting old+new) get in;
/// 2. the server restarts trusting only the new CA, with its new certificate: the new client
///    comes back, the old one is refused, and the server's log says its certificate was not
///    trusted.
#[test]
fn a_ca_bundle_rotation_accepts_old_and_new_then_only_new() {
    require_lab(&["openssl", "openvpn", "ping"]);
    let _logs = capture_logs();
    let old = TestPki::generate().expect("old pki");
    let new = TestPki::generate().expect("new pki");
    let pair = Pair::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let both = dir.path().join("ca-old-new.crt");
    std::fs::write(&both, bundle(&[&old.ca_cert(), &new.ca_cert()])).expect("bundle");
    let phase1 = server_config(
        dir.path(),
        &both,
        &old.server_cert(),
        &old.server_key(),
        &old.ta_key(),
    );
    let client_new_cert = issue_client_cert(
        &new.ca_cert(),
        &ca_key(&new),
        "client-new",
        unix_now() - 60,
        unix_now() + 3600,
    );
    let fleet_settings = |i: usize| match i {
        0 => client_with(
            &old,
            read(&both),
            read(&old.client_cert()),
            read(&old.client_key()),
        ),
        _ => client_with(
            &old,
            read(&both),
            client_new_cert.0.clone(),
            client_new_cert.1.clone(),
        ),
    };
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &pair.seed, phase1).expect("server, phase 1");
        let fleet = Fleet::start(&pair.shoot, 2, fleet_settings);
        let up = ping_all(
            &pair.shoot,
            &fleet.devs,
            SERVER_TUN,
            Duration::from_secs(30),
        );
        assert_eq!(
            up.len(),
            2,
            "old and new client under the old+new bundle: {up:?}\n{}",
            captured_logs()
        );
        eprintln!("phase 1 (server trusts old+new, old server certificate): both clients up");
        server.stop().result.expect("server, phase 1");

        let new_only = dir.path().join("ca-new.crt");
        std::fs::write(&new_only, bundle(&[&new.ca_cert()])).expect("bundle");
        let phase2 = server_config(
            dir.path(),
            &new_only,
            &new.server_cert(),
            &new.server_key(),
            &old.ta_key(),
        );
        let restarted = Instant::now();
        let server = ServerThread::spawn(scope, &pair.seed, phase2).expect("server, phase 2");
        let back = ping_all(
            &pair.shoot,
            &fleet.devs[1..],
            SERVER_TUN,
            Duration::from_secs(30),
        );
        assert_eq!(back.len(), 1, "the new client under the new CA");
        eprintln!(
            "phase 2 (server trusts new only, new server certificate): new client back {:?} \
             after the restart",
            restarted.elapsed()
        );
        // The old client's chain is refused, named, with OpenSSL's reason (with the old CA
        // in its trust, the client sends it along: 'CN=vpnt-test-ca (chain depth 1) refused:
        // self-signed certificate in certificate chain'). Phase 1 refused nobody.
        let refused = ["peer certificate", "(chain depth", "refused:"];
        wait_for(
            "the old client's refusal in the log",
            Duration::from_secs(20),
            || !log_lines(&refused).is_empty(),
        );
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            !ping(&pair.shoot, &fleet.devs[0], SERVER_TUN, 0x11),
            "a certificate of the retired CA still gets a tunnel"
        );
        assert_eq!(server.stats().connected(), 1, "only the new client is in");
        for line in log_lines(&refused).iter().take(2) {
            eprintln!("  log: {line}");
        }
        assert_eq!(fleet.ended(), 0, "a client gave up");
        drop(fleet);
        server.stop().result.expect("server, phase 2");
    });
}

/// The fixture's `ta.key` of `pki` as the server's tls-auth.
fn tls_auth_server(pki: &TestPki) -> ControlProtection {
    ControlProtection::TlsAuth {
        key: static_key::parse(&pki.ta_key_text().expect("ta.key")).expect("static key"),
        direction: KeyDirection::Normal,
        digest: Digest::Sha256,
    }
}

/// The server's tls-auth key replaced, the client's not: every attempt of the client is
/// closed at once by the server (its first packet fails the HMAC), the client retries with
/// its back-off (`connect-retry 1 4`: 1, 2, 4, 4, ... s apart) and never in a tight loop, and
/// when the server gets the client's key back the client gets in by itself.
#[test]
fn a_tls_auth_key_changed_on_one_side_retries_with_backoff_then_recovers() {
    const WATCH: Duration = Duration::from_secs(20);
    require_lab(&["openssl", "openvpn", "ping"]);
    let _logs = capture_logs();
    let pki = TestPki::generate().expect("pki");
    let other = TestPki::generate().expect("other ta.key");
    let pair = Pair::new();
    let mut wrong = pki.our_server_settings(PORT).expect("server settings");
    wrong.protection = tls_auth_server(&other);
    let right = pki.our_server_settings(PORT).expect("server settings");
    let client = client_with(
        &pki,
        read(&pki.ca_cert()),
        read(&pki.client_cert()),
        read(&pki.client_key()),
    );
    let retry_max = client.connect_retry_max;
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &pair.seed, wrong).expect("server, other key");
        let stats = server.stats();
        let client = ClientThread::spawn(scope, &pair.shoot, client);
        // When each attempt was closed by the server.
        let start = Instant::now();
        let mut attempts: Vec<Duration> = Vec::new();
        let mut seen = 0;
        while start.elapsed() < WATCH {
            let now = stats.bad_first_packets();
            for _ in seen..now {
                attempts.push(start.elapsed());
            }
            seen = now;
            std::thread::sleep(Duration::from_millis(20));
        }
        let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
        eprintln!(
            "tls-auth mismatch: {} attempts in {WATCH:?}, each closed at once by the server; \
             gaps {gaps:?}",
            attempts.len()
        );
        assert_eq!(stats.connected(), 0, "a client with the wrong key got in");
        assert!(
            attempts.len() >= 3,
            "the client stopped retrying: {attempts:?}"
        );
        // 1 + 2 + 4 + 4 + ... s: at most 7 attempts in 20 s; a hot loop makes hundreds.
        assert!(
            attempts.len() <= 9,
            "retrying without back-off: {attempts:?}"
        );
        for g in gaps.iter().skip(2) {
            assert!(
                *g >= retry_max - Duration::from_millis(500),
                "a retry came {g:?} after the previous one, under the back-off's {retry_max:?}"
            );
        }
        assert!(!client.is_finished(), "the client gave up");
        server.stop().result.expect("server, other key");

        let fixed = Instant::now();
        let server = ServerThread::spawn(scope, &pair.seed, right).expect("server, right key");
        let devs = vec!["tun0".to_owned()];
        let up = ping_all(
            &pair.shoot,
            &devs,
            SERVER_TUN,
            retry_max + Duration::from_secs(20),
        );
        assert_eq!(
            up.len(),
            1,
            "the client did not get in once the key was fixed"
        );
        eprintln!(
            "tls-auth fixed: tunnel up and answering {:?} after the server restarted with the \
             client's key (back-off at most {retry_max:?})",
            fixed.elapsed()
        );
        assert_eq!(server.stats().connected(), 1);
        client.stop().expect("client");
        server.stop().result.expect("server, right key");
    });
}
