//! The `vpn-server` binary: one-line start-up errors naming file, line and directive (or the
//! path), and, in a lab namespace, the rendered vpn2 server template (file paths aside) serving
//! an upstream OpenVPN 2.6 client until SIGTERM, which makes it exit 0; its admin endpoint
//! (`--admin-listen`) answers `/healthz`, `/readyz` and `/metrics` meanwhile.
//!
//! ```text
//!   SHOOT  vc1 10.200.1.2/30 ───── vs1 10.200.1.1/30  SEED  vpn-server --config server.conf
//!   openvpn client (tun0, fd8f:6d53:b97a:1::1000)            tun0 fd8f:6d53:b97a:1::1/96
//! ```

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::pki_fixture::TestPki;
use lab::require_lab;
use lab::sidecar_client::{metric, scrape};
use lab::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/tests/data/config");
const TIMEOUT: Duration = Duration::from_secs(20);

/// vpn2's server template as rendered in the protocol fixtures, with every file path pointed
/// at `pki` and `dir`, and the firewall hooks replaced by `up`/`down` lines of the caller's.
fn render_vpn2(pki: &TestPki, dir: &Path, up: &str, down: &str) -> String {
    let text = std::fs::read_to_string(Path::new(FIXTURES).join("vpn2-server.conf")).unwrap();
    text.lines()
        .map(|l| {
            let p = |path: PathBuf| path.display().to_string();
            if l.starts_with("up ") {
                up.to_owned()
            } else if l.starts_with("down ") {
                down.to_owned()
            } else {
                l.replace("/srv/secrets/vpn-server/tls.key", &p(pki.server_key()))
                    .replace("/srv/secrets/vpn-server/tls.crt", &p(pki.server_cert()))
                    .replace("/srv/secrets/vpn-server/ca.crt", &p(pki.ca_cert()))
                    .replace("/srv/secrets/tlsauth/vpn.tlsauth", &p(pki.ta_key()))
                    .replace("/client-config-dir", &p(dir.join("ccd")))
                    .replace("/srv/status/openvpn.status", &p(dir.join("openvpn.status")))
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Runs the binary to completion with `args`; returns (success, stderr).
fn run_bin(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("VPN_SERVER_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_typo_names_file_line_and_directive() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("server.conf");
    std::fs::write(
        &conf,
        "mode server\ntls-server\nproto tcp-server\ntopology subnet\ntls-authh ta.key 0\n",
    )
    .unwrap();
    let (ok, stderr) = run_bin(&["--config", conf.to_str().unwrap()]);
    assert!(!ok);
    let want = format!("{}:5: unknown directive 'tls-authh'", conf.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn a_missing_certificate_names_the_path() {
    let pki = TestPki::generate().expect("pki (needs openssl and openvpn)");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ccd")).unwrap();
    let conf = dir.path().join("server.conf");
    let missing = dir.path().join("nowhere/tls.crt");
    let text = render_vpn2(&pki, dir.path(), "", "").replace(
        &pki.server_cert().display().to_string(),
        &missing.display().to_string(),
    );
    std::fs::write(&conf, text).unwrap();
    let (ok, stderr) = run_bin(&["--config", conf.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("{}: cannot read", missing.display())),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn vpn2_environment_mode_reads_the_secrets_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = |vars: &[(&str, &str)]| {
        let out = Command::new(BIN)
            .env_remove("VPN_SERVER_CONFIG")
            .env_remove("VPN_SERVER_LOG")
            .env_remove("OPENVPN_STATUS_PATH")
            .env("VPN_SERVER_SECRETS_DIR", dir.path())
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = run(&[]);
    assert!(
        !ok && stderr.contains("OPENVPN_STATUS_PATH is not set"),
        "{stderr}"
    );
    let (ok, stderr) = run(&[("OPENVPN_STATUS_PATH", "/tmp/vpn2.status")]);
    let want = format!(
        "{}: cannot read",
        dir.path().join("vpn-server/ca.crt").display()
    );
    assert!(!ok && stderr.contains(&want), "{stderr}");
}

/// `GET path` on the admin endpoint, from inside `ns`: the status code and the body.
fn admin_get(ns: &Netns, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    ns.run_in(move || {
        let mut s = std::net::TcpStream::connect(ADMIN).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text[9..12].parse().unwrap();
        (code, text.split_once("\r\n\r\n").unwrap().1.to_owned())
    })
    .unwrap()
}

/// Where the server's admin endpoint listens in the seed namespace.
const ADMIN: &str = "127.0.0.1:18080";

/// Waits until `path` contains `needle`.
fn wait_for(path: &Path, needle: &str, timeout: Duration) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            start.elapsed() < timeout,
            "no '{needle}' in {} after {timeout:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn vpn2_template_serves_an_upstream_client_and_sigterm_exits_0() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().unwrap();
    let ccd = dir.path().join("ccd");
    std::fs::create_dir(&ccd).unwrap();
    // The fixture's client CN is `client`: give it the shoot client's iroutes.
    std::fs::copy(
        Path::new(FIXTURES).join("vpn-shoot-client.ccd"),
        ccd.join("client"),
    )
    .unwrap();
    // up/down hooks that record their arguments and environment.
    let hook = dir.path().join("hook.sh");
    std::fs::write(
        &hook,
        "#!/bin/sh\nprintf '%s|%s|%s|%s\\n' \"$script_type\" \"$dev\" \"$ifconfig_ipv6_local\" \"$*\" >> \"$(dirname \"$0\")/hooks.log\"\n",
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&hook).status().unwrap();
    let up = format!("up \"{} seed-up\"", hook.display());
    let down = format!("down \"{} seed-down\"", hook.display());
    let conf = dir.path().join("server.conf");
    std::fs::write(&conf, render_vpn2(&pki, dir.path(), &up, &down)).unwrap();

    let seed = Netns::new().expect("seed");
    let shoot = Netns::new().expect("shoot");
    Netns::veth_pair(&seed, "vs1", &shoot, "vc1").expect("veth");
    seed.run(["ip", "addr", "add", "10.200.1.1/30", "dev", "vs1"])
        .expect("seed addr");
    shoot
        .run(["ip", "addr", "add", "10.200.1.2/30", "dev", "vc1"])
        .expect("shoot addr");

    let log = dir.path().join("server.log");
    let mut cmd = seed.command(BIN);
    cmd.arg("--config")
        .arg(&conf)
        .args(["--admin-listen", ADMIN])
        .env_remove("VPN_SERVER_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let pid = seed.spawn(&mut cmd).expect("start vpn-server");
    wait_for(&log, "Initialization Sequence Completed", TIMEOUT);
    assert_eq!(admin_get(&seed, "/healthz"), (200, "ok\n".into()));
    assert_eq!(admin_get(&seed, "/readyz"), (200, "ready\n".into()));
    let hooks = dir.path().join("hooks.log");
    let up_line = wait_for(&hooks, "up|", TIMEOUT);
    assert!(
        up_line.contains("up|tun0|fd8f:6d53:b97a:1::1|seed-up tun0 1500 0 init"),
        "{up_line}"
    );

    let client_conf = tcp_client_config(
        &pki,
        1194,
        ControlWrap::TlsAuth,
        &["auth SHA256", "data-ciphers AES-256-GCM"],
    )
    .replace("remote 127.0.0.1 1194", "remote 10.200.1.1 1194");
    let client = UpstreamOpenvpn::start(&shoot, &client_conf, 3).expect("upstream client");
    client
        .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
        .unwrap_or_else(|e| panic!("client up: {e}\n{}", client.log()));
    // The tunnel carries traffic: the client pings the server's IPv6 tun address.
    shoot
        .run(["ping", "-6", "-c", "2", "-W", "2", "fd8f:6d53:b97a:1::1"])
        .unwrap_or_else(|e| panic!("ping through the tunnel: {e}\n{}", client.log()));
    // The status file lists the client with its IPv6 pool address and the iroutes.
    let status = wait_for(
        &dir.path().join("openvpn.status"),
        "CLIENT_LIST,client,",
        TIMEOUT,
    );
    assert!(status.contains("fd8f:6d53:b97a:1::1000"), "{status}");
    assert!(
        status.contains("ROUTING_TABLE,242.0.0.0/8,client"),
        "{status}"
    );
    // The admin endpoint counts the client and the tunnel.
    let admin: std::net::SocketAddr = ADMIN.parse().unwrap();
    let text = seed.run_in(move || scrape(admin)).unwrap();
    assert_eq!(metric(&text, "vpn_server_clients"), 1, "{text}");
    assert_eq!(
        metric(&text, "vpn_server_tunnels_established_total"),
        1,
        "{text}"
    );
    assert!(
        metric(&text, "vpn_server_packets_total{direction=\"to_tun\"}") >= 2,
        "{text}"
    );

    // SIGTERM: exit 0 within a few seconds, the down hook run.
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(s) = seed.try_wait(pid) {
            break s;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(8),
            "vpn-server still running 8 s after SIGTERM:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "exit status {status}:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let hook_log = std::fs::read_to_string(&hooks).unwrap();
    assert!(
        hook_log.contains("down|tun0|fd8f:6d53:b97a:1::1|seed-down tun0 1500 0 init"),
        "{hook_log}"
    );
}

/// `[::]` means the same on every listener of the server: it takes IPv4 connections too
/// (as IPv4-mapped addresses) unless an IPv4 address with its port is listed beside it. The
/// admin endpoint and GEP-21's endpoint (`--cloud-api-listen [::]:3129`) were IPv6-only before
/// while the OpenVPN port took both families.
#[test]
fn an_ipv6_any_address_takes_ipv4_on_every_listener() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ccd")).unwrap();
    let conf = dir.path().join("server.conf");
    std::fs::write(&conf, render_vpn2(&pki, dir.path(), "", "")).unwrap();
    let seed = Netns::new().expect("seed");
    let log = dir.path().join("server.log");
    let mut cmd = seed.command(BIN);
    cmd.arg("--config")
        .arg(&conf)
        .args(["--admin-listen", "[::]:18080"])
        .args(["--cloud-api-listen", "[::]:3129"])
        .args(["--cloud-api-clients", "127.0.0.0/8"])
        .env_remove("VPN_SERVER_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    seed.spawn(&mut cmd).expect("start vpn-server");
    wait_for(&log, "Initialization Sequence Completed", TIMEOUT);
    for (what, addr) in [
        ("OpenVPN", "127.0.0.1:1194"),
        ("admin", "127.0.0.1:18080"),
        ("GEP-21 endpoint", "127.0.0.1:3129"),
        ("admin over IPv6", "[::1]:18080"),
    ] {
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        let opened = seed
            .run_in(move || std::net::TcpStream::connect_timeout(&addr, TIMEOUT).is_ok())
            .unwrap();
        assert!(
            opened,
            "{what} on [::] refused {addr}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    assert_eq!(admin_get(&seed, "/healthz"), (200, "ok\n".into()));
}
