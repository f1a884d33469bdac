//! The `vpn-client` binary refuses bad configs with one line naming what to fix, and exits
//! non-zero (no network, no privileges needed: it stops before opening anything).

use std::path::Path;
use std::process::{Command, Output};

/// A client config whose files all exist (contents do not matter for these tests' errors)
/// except where a test removes one.
fn config(dir: &Path, extra: &str) -> String {
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::write(dir.join(f), "placeholder\n").expect("write");
    }
    format!(
        "client\nproto tcp-client\nremote 127.0.0.1 1194\ndev tun0\n\
         ca {d}/ca.crt\ncert {d}/tls.crt\nkey {d}/tls.key\n{extra}",
        d = dir.display()
    )
}

fn run(config_path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vpn-client"))
        .arg("--config")
        .arg(config_path)
        .env_remove("ENDPOINT")
        .env_remove("IS_SHOOT_CLIENT")
        .output()
        .expect("run vpn-client")
}

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {text:?}");
    lines[0].to_owned()
}

#[test]
fn a_typo_exits_non_zero_naming_file_line_and_directive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("client.conf");
    std::fs::write(&path, config(dir.path(), "remote-cert-tsl server\n")).expect("write");
    let out = run(&path);
    assert!(!out.status.success());
    assert_eq!(
        stderr_line(&out),
        format!(
            "vpn-client: {}:8: unknown directive 'remote-cert-tsl'",
            path.display()
        )
    );
}

#[test]
fn a_missing_certificate_file_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("client.conf");
    std::fs::write(&path, config(dir.path(), "")).expect("write");
    let cert = dir.path().join("tls.crt");
    std::fs::remove_file(&cert).expect("rm");
    let out = run(&path);
    assert!(!out.status.success());
    let line = stderr_line(&out);
    assert!(
        line.starts_with(&format!("vpn-client: cannot read {}: ", cert.display())),
        "{line}"
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let out = run(Path::new("/nonexistent/client.conf"));
    assert!(!out.status.success());
    assert!(stderr_line(&out).contains("cannot read /nonexistent/client.conf"));
}

#[test]
fn nothing_to_run_without_config_or_vpn2_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_vpn-client"))
        .env_remove("ENDPOINT")
        .env_remove("IS_SHOOT_CLIENT")
        .env_remove("VPN_CLIENT_CONFIG")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(stderr_line(&out).contains("nothing to run"));
}
