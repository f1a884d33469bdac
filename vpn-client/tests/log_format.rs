//! The log lines `vpn-client` writes when its stderr is not a terminal (a container's log):
//! by default the layout Gardener's `vpn-shoot` fluent-bit parser reads, never an ANSI escape;
//! JSON with `--log-format json`. Runs the apiserver-proxy on loopback (no root needed).

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use regex::Regex;
use rustix::process::{kill_process, Pid, Signal};

/// Gardener's `vpn-shoot-parser` (fluent-bit regex; time format `%a %b%t%d %H:%M:%S %Y`).
const VPN_SHOOT_PARSER: &str = r"^(?<time>[^0-9]*\d{1,2}\s+[^\s]+\s+\d{4})\s+(?<log>.*)";

/// Starts the apiserver-proxy with `extra` flags and returns it with its first stderr line.
fn first_line(extra: &[&str]) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vpn-client"));
    cmd.env_clear()
        .args(extra)
        .args([
            "apiserver-proxy",
            "--listen",
            "127.0.0.1:0",
            "--ingress",
            "127.0.0.1:1",
            "--header-value",
            "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

fn stop(mut child: Child) {
    let pid = Pid::from_child(&child);
    kill_process(pid, Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_container_log_is_ctime_and_plain() {
    let (child, line) = first_line(&[]);
    stop(child);
    assert!(!line.contains('\u{1b}'), "{line:?}");
    let caps = Regex::new(VPN_SHOOT_PARSER)
        .unwrap()
        .captures(&line)
        .unwrap_or_else(|| panic!("the vpn-shoot parser does not match {line:?}"));
    assert!(
        caps["log"].contains("apiserver-proxy listening"),
        "{line:?}"
    );
}

#[test]
fn json_on_request() {
    let (child, line) = first_line(&["--log-format", "json"]);
    stop(child);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["fields"]["message"], "apiserver-proxy listening");
    assert_eq!(v["level"], "INFO");
}

#[test]
fn an_unknown_format_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_vpn-client"))
        .env_clear()
        .args(["--log-format", "logfmt", "setup"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown log format \"logfmt\""), "{err}");
}
