//! `vpn-server readiness`, `vpn-server liveness` and `vpn-server exporter` as Gardener runs
//! them: exit codes, the one line on stdout, the time a probe takes, and the exporter's
//! `/metrics` on loopback. Status files are temporary files; no root needed.

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::{kill_process, Pid, Signal};
use vpn_server::status::{self, ClientStatus, StatusSnapshot};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");

/// Gardener's probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

const HA: &[(&str, &str)] = &[
    ("IS_HA", "true"),
    ("POD_NAME", "vpn-seed-server-0"),
    ("HA_VPN_CLIENTS", "2"),
];

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/status")
        .join(name);
    std::fs::read(path).unwrap()
}

/// Runs `vpn-server <verb>` with only `env` set and the status file at `status` (if any);
/// returns the output and how long it took.
fn verb(verb: &str, status: Option<&Path>, env: &[(&str, &str)]) -> (Output, Duration) {
    let mut cmd = Command::new(BIN);
    cmd.arg(verb).env_clear().stdin(Stdio::null());
    if let Some(path) = status {
        cmd.env("OPENVPN_STATUS_PATH", path);
    }
    cmd.envs(env.iter().copied());
    let start = Instant::now();
    let out = cmd.output().unwrap();
    (out, start.elapsed())
}

/// Exit status 1 and one line on stdout, nothing on stderr; returns the line.
fn failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert!(stdout.ends_with('\n'));
    stdout.trim_end().to_owned()
}

fn succeeded(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A status file as our server writes it, written at `time`, with clients `cns`.
fn written_by_us(path: &Path, time: u64, cns: &[&str]) {
    let clients = cns
        .iter()
        .enumerate()
        .map(|(i, cn)| ClientStatus {
            common_name: (*cn).to_owned(),
            real_address: "10.180.3.41:38422".parse().unwrap(),
            virtual_v4: None,
            virtual_v6: Some("fd8f:6d53:b97a:1::2".parse().unwrap()),
            bytes_received: 10,
            bytes_sent: 20,
            connected_since: time - 100,
            username: None,
            client_id: i as u64,
            peer_id: i as u32,
            cipher: "AES-256-GCM".into(),
        })
        .collect();
    let snapshot = StatusSnapshot {
        title: status::default_title(),
        now: time,
        clients,
        routes: Vec::new(),
        mac_routes: Vec::new(),
        shoot_routes: Vec::new(),
        max_bcast_queue: 0,
    };
    std::fs::write(path, status::render(&snapshot)).unwrap();
}

#[test]
fn readiness_exit_codes_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    for (file, env, ready) in [
        ("empty.status", &[][..], true),
        ("nonha-2.6-shoot.status", &[], true),
        ("nonha-2.7-shoot.status", &[], true),
        ("nonha-2.6-ipv6-handshake.status", &[], true),
        ("nonha-2.6-handshake-only.status", &[], false),
        ("ha-2.6.status", HA, true),
        ("ha-2.7.status", HA, true),
        ("ha-2.6-no-seed-client.status", HA, false),
        ("empty.status", HA, false),
    ] {
        std::fs::write(&path, fixture(file)).unwrap();
        let (out, took) = verb("readiness", Some(&path), env);
        assert!(took < PROBE_TIMEOUT, "{file}: {took:?}");
        if ready {
            succeeded(&out);
        } else {
            assert!(failed(&out).starts_with("not ready"), "{file}: {out:?}");
        }
    }
    std::fs::write(&path, fixture("nonha-2.6-handshake-only.status")).unwrap();
    let (out, _) = verb("readiness", Some(&path), &[]);
    assert_eq!(
        failed(&out),
        "not ready: 2 client(s) connected, none with a CN starting with vpn-shoot-client"
    );
}

#[test]
fn liveness_exit_codes_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    // Fresh, with only a client in the handshake: alive (readiness is another matter).
    written_by_us(&path, now(), &["UNDEF"]);
    let (out, took) = verb("liveness", Some(&path), &[]);
    succeeded(&out);
    assert!(took < PROBE_TIMEOUT, "{took:?}");
    let (out, _) = verb("readiness", Some(&path), &[]);
    assert!(failed(&out).starts_with("not ready"));
    // 10 s old: alive; 60 s old: stale.
    written_by_us(&path, now() - 10, &["vpn-shoot-client"]);
    succeeded(&verb("liveness", Some(&path), HA).0);
    written_by_us(&path, now() - 60, &["vpn-shoot-client"]);
    let (out, took) = verb("liveness", Some(&path), &[]);
    let line = failed(&out);
    assert!(took < PROBE_TIMEOUT, "{took:?}");
    assert!(
        line.starts_with("OpenVPN status is stale: TIME ")
            && line.ends_with("at most 17 s allowed"),
        "{line}"
    );
    // The fixtures were written long ago.
    std::fs::write(&path, fixture("ha-2.7.status")).unwrap();
    assert!(failed(&verb("liveness", Some(&path), HA).0).starts_with("OpenVPN status is stale"));
}

#[test]
fn probe_errors_are_one_line_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    for probe in ["readiness", "liveness"] {
        let (out, _) = verb(probe, None, &[]);
        assert_eq!(
            failed(&out),
            "invalid vpn2 environment: OPENVPN_STATUS_PATH is not set"
        );
        let (out, _) = verb(probe, Some(&path), &[("IS_HA", "true")]);
        assert_eq!(
            failed(&out),
            "invalid vpn2 environment: IS_HA is set to true but POD_NAME is not set or invalid"
        );
        let (out, _) = verb(probe, Some(&path), &[]);
        let line = failed(&out);
        assert!(
            line.starts_with(&format!(
                "cannot read the OpenVPN status file {}: ",
                path.display()
            )),
            "{line}"
        );
        std::fs::write(&path, fixture("malformed-unknown-line.status")).unwrap();
        let (out, _) = verb(probe, Some(&path), &[]);
        assert_eq!(
            failed(&out),
            format!(
                "cannot parse the OpenVPN status file {}: line 4: unknown line type \"CLIENT\"",
                path.display()
            )
        );
        std::fs::remove_file(&path).unwrap();
    }
}

/// A running `vpn-server exporter`, stopped with SIGTERM when dropped.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    fn start(status: &Path) -> Exporter {
        // A port the kernel just handed out and took back.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(BIN)
            .args(["exporter", "--listen", &format!("127.0.0.1:{port}")])
            .env_clear()
            .env("OPENVPN_STATUS_PATH", status)
            .env("VPN_SERVER_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let exporter = Exporter { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "exporter did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        exporter
    }

    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: vpn-seed-server-0:15000\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap()).unwrap();
        kill_process(pid, Signal::TERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "exporter ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn exporter_serves_what_gardener_keeps_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    let mut exporter = Exporter::start(&path);
    // No file yet: up 0.
    let up = format!("openvpn_up{{status_path=\"{}\"}}", path.display());
    let metrics = exporter.get("/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
    assert!(metrics.contains(&format!("\n{up} 0\n")), "{metrics}");

    std::fs::write(&path, fixture("ha-2.6.status")).unwrap();
    let metrics = exporter.get("/metrics");
    assert!(
        metrics.contains("Content-Type: text/plain; version=0.0.4"),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("\n{up} 1\n")), "{metrics}");
    // The series Gardener's `openvpn-server-exporter` job keeps.
    for name in [
        "openvpn_server_client_received_bytes_total{",
        "openvpn_server_client_sent_bytes_total{",
        "openvpn_server_route_last_reference_time_seconds{",
        "openvpn_status_update_time_seconds{",
        "openvpn_up{",
        "openvpn_netstat_Tcp_OutSegs ",
        "openvpn_netstat_Tcp_RetransSegs ",
    ] {
        assert!(
            metrics.contains(&format!("\n{name}")),
            "{name} missing:\n{metrics}"
        );
    }
    assert!(metrics.contains(
        "openvpn_server_client_sent_bytes_total{common_name=\"vpn-shoot-client-0\",\
         connection_time=\"1776664679\",real_address=\"10.180.5.3:33870\""
    ));

    let index = exporter.get("/");
    assert!(index.starts_with("HTTP/1.1 200 OK\r\n"), "{index}");
    assert!(index.contains("Content-Type: text/html"), "{index}");
    assert!(index.contains("href=\"/metrics\""), "{index}");

    let status = exporter.terminate();
    assert!(status.success(), "{status:?}");
}

#[test]
fn exporter_without_status_path_exits_1() {
    let out = Command::new(BIN)
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        "vpn-server: error: OPENVPN_STATUS_PATH is not set"
    );
}
