//! `vpn-server sidecar` and `vpn-server --sidecar` start-up errors: one line naming the file
//! or value at fault, exit status 1, nothing listening.

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");

/// Runs the binary with `args` and a clean sidecar environment; returns (success, stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("SIDECAR_") || k.starts_with("SHOOT_") || k == "SEED_POD_NETWORK" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_certificate_is_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.crt");
    let (ok, err) = run(
        &[
            "--secrets-dir",
            &dir.path().display().to_string(),
            "sidecar",
            "--sidecar-cert",
            &missing.display().to_string(),
        ],
        &[],
    );
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("vpn-server: error: cannot read "), "{err}");
    assert!(err.contains("nope.crt"), "{err}");
}

#[test]
fn bad_shoot_network_variable_is_named() {
    let pki = lab::sidecar_client::Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("vpn-server")).unwrap();
    pki.write(&dir.path().join("vpn-server"));
    for (from, to) in [("server.crt", "tls.crt"), ("server.key", "tls.key")] {
        let d = dir.path().join("vpn-server");
        std::fs::rename(d.join(from), d.join(to)).unwrap();
    }
    let (ok, err) = run(
        &[
            "--secrets-dir",
            &dir.path().display().to_string(),
            "sidecar",
        ],
        &[("SHOOT_POD_NETWORKS", "100.96.0.0/11,not-a-cidr")],
    );
    assert!(!ok);
    assert!(
        err.contains("SHOOT_POD_NETWORKS") && err.contains("not-a-cidr"),
        "{err}"
    );
}

#[test]
fn unknown_client_cert_mode_is_refused() {
    let (ok, err) = run(&["sidecar", "--sidecar-client-cert", "maybe"], &[]);
    assert!(!ok);
    assert!(err.contains("maybe"), "{err}");
}

#[test]
fn zero_timeouts_and_limits_are_refused() {
    for (flag, var) in [
        ("--sidecar-connect-timeout", "SIDECAR_CONNECT_TIMEOUT"),
        ("--sidecar-idle-timeout", "SIDECAR_IDLE_TIMEOUT"),
        ("--sidecar-max-connections", "SIDECAR_MAX_CONNECTIONS"),
    ] {
        let (ok, err) = run(&["sidecar", flag, "0"], &[]);
        assert!(!ok, "{flag} 0 accepted");
        assert!(err.contains(flag) && err.contains("'0'"), "{flag}: {err}");
        // The same from the environment Gardener's pod would set.
        let (ok, err) = run(&["sidecar"], &[(var, "0")]);
        assert!(!ok, "{var}=0 accepted");
        assert!(err.contains(flag) && err.contains("'0'"), "{var}: {err}");
    }
}
