//! `vpn-client apiserver-proxy` refuses bad settings with one line and a non-zero exit, before
//! listening (no network needed).

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vpn-client"));
    cmd.arg("apiserver-proxy").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("APISERVER_PROXY_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().expect("run vpn-client")
}

/// Valid settings (nothing listens: each test adds the one flag that is refused).
const VALID: [&str; 6] = [
    "--listen",
    "127.0.0.1:0",
    "--ingress",
    "127.0.0.1:1",
    "--header-value",
    "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local",
];

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_target_without_port_is_named() {
    let out = run(&[&VALID[..], &["--target", "kubernetes"]].concat());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--target \"kubernetes\" is not host:port"),
        "{err}"
    );
}

#[test]
fn a_header_value_with_a_control_byte_is_refused() {
    let out = run(&[
        "--listen",
        "127.0.0.1:0",
        "--ingress",
        "127.0.0.1:1",
        "--header-value",
        "outbound|443||x\r\nX-Injected: 1",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("invalid CONNECT request settings"), "{err}");
}

#[test]
fn listen_and_header_value_are_required() {
    let out = run(&["--ingress", "127.0.0.1:1"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--listen") && err.contains("--header-value"),
        "{err}"
    );
}

#[test]
fn zero_timeouts_and_limits_are_refused() {
    for flag in [
        "--connect-timeout-secs",
        "--idle-timeout-secs",
        "--max-connections",
    ] {
        let out = run(&[&VALID[..], &[flag, "0"]].concat());
        assert!(!out.status.success(), "{flag} 0 accepted");
        let err = stderr(&out);
        assert!(err.contains(flag) && err.contains("'0'"), "{flag}: {err}");
    }
}
