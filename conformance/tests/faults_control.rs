//! Control-channel text with control bytes (issue 19's fault catalogue), from a real peer:
//!
//! * upstream OpenVPN 2.6 as the server pushes an option holding ESC and BEL (a terminal
//!   escape that would retitle an operator's terminal): our client must drop that `PUSH_REPLY`
//!   (as upstream's client does), say so once (the byte and the text escaped), apply nothing
//!   from it, keep asking at its pace and never copy the bytes into its log;
//! * our client presents a certificate whose common name holds ESC, BEL, a comma and a line
//!   feed (a forged log line, a forged status-file row): our server refuses it at admission
//!   (`AUTH_FAILED`) and says so, with the bytes escaped (DEVIATIONS S4).
//!
//! ```text
//!  SHOOT 10.81.0.2 ── veth ── SEED 10.81.0.1
//! ```
//!
//! The in-process parts' logs are captured (`faults_common::capture_logs`) and searched for
//! raw control bytes.

mod faults_common;

use std::time::{Duration, Instant};

use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};
use faults_common::*;
use pki::tls::PeerPolicy;
use vpn_client::{Remote, TlsMaterial};

/// ESC ] 0 ; ... BEL: xterm's "set window title".
const TITLE: &str = "\u{1b}]0;owned\u{7}";

/// Control bytes other than the line ends a log is made of.
fn raw_controls(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.chars().any(|c| c.is_control() && c != '\t'))
        .map(|l| format!("{l:?}"))
        .collect()
}

fn upstream_on_seed(config: String) -> String {
    config.replace("local 127.0.0.1", &format!("local {SEED_ADDR}"))
}

#[test]
fn a_push_with_control_bytes_from_upstream_is_dropped_by_our_client() {
    const WATCH: Duration = Duration::from_secs(20);
    require_lab(&["openssl", "openvpn", "ip"]);
    let _logs = capture_logs();
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let push = format!("push \"echo {TITLE}\"");
    let config = upstream_on_seed(tcp_server_config(
        &pki,
        PORT,
        ControlWrap::TlsAuth,
        &["auth SHA256", &push],
    ));
    let server = UpstreamOpenvpn::start(&pair.seed, &config, 4).expect("upstream server");
    server
        .wait_for_log("Initialization Sequence Completed", Duration::from_secs(30))
        .expect("upstream server up");
    let mut settings = pki
        .our_client_settings(Remote::new(SEED_ADDR.to_string(), PORT))
        .expect("client settings");
    settings.connect_retry = Duration::from_secs(1);
    settings.connect_retry_max = Duration::from_secs(4);
    settings.hand_window = Duration::from_secs(8);
    std::thread::scope(|scope| {
        let client = ClientThread::spawn(scope, &pair.shoot, settings);
        let start = Instant::now();
        while start.elapsed() < WATCH {
            let out = pair
                .shoot
                .run(["ip", "-4", "-o", "addr", "show"])
                .expect("ip");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                !text.contains("192.168.123."),
                "an address from the dropped push was applied: {text}"
            );
            assert!(!client.is_finished(), "our client ended");
            std::thread::sleep(Duration::from_millis(500));
        }
        let log = server.log();
        let sent = log.matches("SENT CONTROL").count();
        let requests = log.matches("'PUSH_REQUEST'").count();
        let ours = captured_logs();
        eprintln!(
            "push with ESC/BEL from upstream: in {WATCH:?} upstream got {requests} PUSH_REQUESTs \
             and sent {sent} control messages; our client applied nothing"
        );
        let dropped: Vec<&str> = ours
            .lines()
            .filter(|l| l.contains("control message from the server dropped"))
            .collect();
        for line in dropped.iter().take(2) {
            eprintln!("  ours: {line}");
        }
        // Said once per PUSH_REPLY, with the byte and the text escaped.
        assert!(
            dropped
                .iter()
                .any(|l| l.contains("invalid character 0x1b")
                    && l.contains(r"echo \u{1b}]0;owned\u{7}")),
            "our client did not say why it dropped the PUSH_REPLY:\n{ours}"
        );
        assert!(requests >= 2, "our client stopped asking:\n{log}");
        // PUSH_REQUEST_INTERVAL is 1 s: a tight loop would send thousands.
        assert!(
            requests <= 2 * WATCH.as_secs() as usize,
            "{requests} PUSH_REQUESTs in {WATCH:?}"
        );
        let raw = raw_controls(&ours);
        assert!(raw.is_empty(), "raw control bytes in our log: {raw:?}");
        client.stop().expect("client");
    });
    drop(server);
}

#[test]
fn a_common_name_with_control_bytes_is_refused_with_the_bytes_escaped() {
    require_lab(&["openssl", "openvpn"]);
    let _logs = capture_logs();
    let pki = TestPki::generate().expect("pki");
    let pair = Pair::new();
    let now = unix_now();
    let evil = format!("evil{TITLE},x\nCLIENT_LIST,forged");
    let (cert, key) = issue_client_cert(&pki.ca_cert(), &ca_key(&pki), &evil, now - 60, now + 3600);
    let mut settings = pki
        .our_client_settings(Remote::new(SEED_ADDR.to_string(), PORT))
        .expect("client settings");
    settings.tls = TlsMaterial::Pem {
        ca: std::fs::read(pki.ca_cert()).expect("ca"),
        cert,
        key,
        peer: PeerPolicy::server_peer(),
    };
    settings.connect_retry = Duration::from_secs(1);
    settings.connect_retry_max = Duration::from_secs(2);
    std::thread::scope(|scope| {
        let server = pki.our_server_settings(PORT).expect("server settings");
        let server = ServerThread::spawn(scope, &pair.seed, server).expect("our server");
        let client = ClientThread::spawn(scope, &pair.shoot, settings);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) && server.stats().rejected() < 2 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let ours = captured_logs();
        let refusals: Vec<&str> = ours
            .lines()
            .filter(|l| l.contains("client refused") && l.contains("is not a client identity"))
            .collect();
        for line in refusals.iter().take(2) {
            eprintln!("  ours: {line}");
        }
        assert!(
            server.stats().rejected() >= 2,
            "the name was not refused (the client retries after AUTH_FAILED):\n{ours}"
        );
        assert_eq!(server.stats().connected(), 0, "the name got a tunnel");
        assert!(
            refusals
                .iter()
                .any(|l| l.contains(r#"evil\u{1b}]0;owned\u{7},x\nCLIENT_LIST,forged"#)),
            "the refusal does not name the certificate, escaped:\n{ours}"
        );
        assert!(
            !ours.lines().any(|l| l.starts_with("CLIENT_LIST,forged")),
            "the name forged a log line:\n{ours}"
        );
        let raw = raw_controls(&ours);
        assert!(raw.is_empty(), "raw control bytes in our log: {raw:?}");
        assert!(!client.is_finished());
        client.stop().expect("client");
        server.stop().result.expect("our server");
    });
}
