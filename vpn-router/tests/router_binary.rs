//! `vpn-router --config FILE` as a process in a lab namespace (loopback only): it
//! routes, a real SIGHUP swaps the policy, a broken file on SIGHUP keeps the old policy (and
//! says so in the log), SIGTERM ends it with status 0, and a broken file at start is one
//! error line and a failure status.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::require_lab;

const BIN: &str = env!("CARGO_BIN_EXE_vpn-router");
const ROUTER_PORT: u16 = 18443;
const VALUE: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";

fn config(upstream: SocketAddr, allow: &str) -> String {
    format!(
        "[[listener]]\naddress = \"127.0.0.1:{ROUTER_PORT}\"\nheaders = [\"Reversed-VPN\"]\n\n\
         [[route]]\nvalue = \"{VALUE}\"\nupstream = \"{upstream}\"\n{allow}"
    )
}

/// One CONNECT through the router; the status code (200 only once the upstream greeted).
fn request(ns: &Netns) -> Option<u16> {
    ns.run_in(|| {
        let mut s = TcpStream::connect(("127.0.0.1", ROUTER_PORT)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let head = format!(
            "CONNECT 127.0.0.1:1194 HTTP/1.0\r\nReversed-VPN: {VALUE}\r\nHost: 127.0.0.1\r\n\r\n"
        );
        s.write_all(head.as_bytes()).ok()?;
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            if out.starts_with(b"HTTP/1.1 200 ") && out.ends_with(b"UP\n") {
                return Some(200);
            }
            if !out.starts_with(b"HTTP/1.1 200 ") && out.ends_with(b"\r\n\r\n") {
                return std::str::from_utf8(&out[9..12]).ok()?.parse().ok();
            }
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            out.extend_from_slice(&buf[..n]);
        }
    })
    .unwrap()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn router_subcommand_routes_reloads_on_sighup_and_stops_on_sigterm() {
    require_lab(&[]);
    let ns = Netns::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let upstream = ns
        .run_in(|| TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let up_addr = upstream.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in upstream.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.write_all(b"UP\n");
        }
    });
    let path = dir.path().join("router.toml");
    std::fs::write(&path, config(up_addr, "")).unwrap();
    let log = dir.path().join("router.log");
    let pid = ns
        .spawn(
            ns.command(BIN)
                .arg("--config")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        )
        .unwrap();
    wait_for("the router to route", || request(&ns) == Some(200));

    // B: an allow-list that excludes 127.0.0.1 → 403 after SIGHUP.
    std::fs::write(&path, config(up_addr, "allow = [\"10.9.9.9/32\"]\n")).unwrap();
    signal(pid, "-HUP");
    wait_for("the new policy", || request(&ns) == Some(403));

    // A broken file: reported, the old policy stays.
    std::fs::write(&path, "[[listener]]\naddress = 7\n").unwrap();
    signal(pid, "-HUP");
    wait_for("the reload failure in the log", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("reload failed, keeping the old policy")
    });
    assert_eq!(request(&ns), Some(403));
    assert!(ns.try_wait(pid).is_none(), "the router exited");

    signal(pid, "-TERM");
    wait_for("the router to exit", || ns.try_wait(pid).is_some());
    assert!(ns.try_wait(pid).unwrap().success());
}

#[test]
fn router_with_a_broken_file_fails_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.toml");
    std::fs::write(
        &path,
        "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Host\"]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("vpn-router: error:")
            && stderr.contains("\"Host\" is not a routing header"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
