//! The log lines `vpn-server` writes when its stderr is not a terminal (a container's log): by
//! default OpenVPN's time layout, which Gardener's `vpn-seed-server` fluent-bit parser reads,
//! and never an ANSI escape. Runs the exporter on loopback (no root needed).

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use regex::Regex;
use rustix::process::{kill_process, Pid, Signal};

/// Gardener's `vpn-seed-server-parser` (fluent-bit regex; time format `%Y-%m-%d %H:%M:%S`).
const VPN_SEED_SERVER_PARSER: &str = r"^(?<time>\d{4}-\d{2}-\d{2}\s+[^\s]+)\s+(?<log>.*)$";

#[test]
fn a_container_log_is_openvpns_layout_and_plain() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vpn-server"))
        .env_clear()
        .env("OPENVPN_STATUS_PATH", dir.path().join("openvpn.status"))
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    kill_process(Pid::from_child(&child), Signal::TERM).unwrap();
    assert!(child.wait().unwrap().success());

    let line = line.trim_end();
    assert!(!line.contains('\u{1b}'), "{line:?}");
    let caps = Regex::new(VPN_SEED_SERVER_PARSER)
        .unwrap()
        .captures(line)
        .unwrap_or_else(|| panic!("the vpn-seed-server parser does not match {line:?}"));
    // strptime's `%Y-%m-%d %H:%M:%S` takes the whole time field: no fraction, no zone.
    assert_eq!(caps["time"].len(), "2026-11-25 16:22:19".len(), "{line:?}");
    assert!(
        caps["log"].contains("exporter serving /metrics"),
        "{line:?}"
    );
}
