//! The vpn2 shoot client config template, rendered with example values, starts our client
//! unchanged (file paths aside) against upstream OpenVPN 2.6 through Debian's `tinyproxy`,
//! in namespaces:
//!
//! ```text
//!  SHOOT (vpn_client, tun0)                  SEED (openvpn server :1194, tinyproxy :8888)
//!   vpnt-shoot 10.79.0.2/24  ── veth ──  vpnt-seed 10.79.0.1/24
//! ```
//!
//! The template (`protocol/tests/data/config/vpn2-client-shoot.conf`) is rendered with
//! `ENDPOINT=10.79.0.1` and `OPENVPN_PORT=8888` and the secrets paths pointing at a temp PKI;
//! everything else is vpn2's text, including `management` (a warning), `verb 3` and the `up`
//! hook `/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' --`. The config goes through
//! the same loader as `vpn-client --config` ([`vpn_client::config::load`]). The test asserts
//! that the tun gets the pushed address and that the `up` hook ran with the device name (its
//! route is in SHOOT's table). The binary's own error paths are tested in
//! `vpn-client/tests/cli.rs`.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::our_client::ClientThread;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};
use netio::netlink::{IpPrefix, Netlink};
use vpn_client::Stopped;

const SERVER_PORT: u16 = 1194;
const PROXY_PORT: u16 = 8888;
const SEED_VETH: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const SHOOT_VETH: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const CLIENT_TUN: &str = "192.168.123.2/24";
const TIMEOUT: Duration = Duration::from_secs(25);
const TEMPLATE: &str = include_str!("../../protocol/tests/data/config/vpn2-client-shoot.conf");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn ip(ns: &Netns, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", ns.name()])
        .args(args)
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn start_tinyproxy(seed: &Netns, dir: &Path) {
    conformance::tinyproxy::start(
        seed,
        dir,
        SEED_VETH,
        PROXY_PORT,
        "10.79.0.0/24",
        SERVER_PORT,
    )
    .expect("start tinyproxy");
}

/// The template with vpn2's example values replaced by the lab's, and `/srv/secrets` files
/// by the PKI's.
fn render(pki: &TestPki) -> String {
    let p = |path: std::path::PathBuf| path.display().to_string();
    TEMPLATE
        .replace("/srv/secrets/tlsauth/vpn.tlsauth", &p(pki.ta_key()))
        .replace("/srv/secrets/vpn-client/tls.key", &p(pki.client_key()))
        .replace("/srv/secrets/vpn-client/tls.crt", &p(pki.client_cert()))
        .replace("/srv/secrets/vpn-client/ca.crt", &p(pki.ca_cert()))
        .replace(
            "api.demo.proj.example.com 8443",
            &format!("{SEED_VETH} {PROXY_PORT}"),
        )
        .replace("api.demo.proj.example.com", &SEED_VETH.to_string())
}

#[test]
fn the_vpn2_client_template_starts_unchanged_and_runs_its_up_hook() {
    require_lab(&["openvpn", "openssl", "tinyproxy"]);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_test_writer()
        .with_ansi(false)
        .try_init();
    let seed = Netns::new().expect("netns seed");
    let shoot = Netns::new().expect("netns shoot");
    Netns::veth_pair(&shoot, "vpnt-shoot", &seed, "vpnt-seed").expect("veth");
    for (ns, dev, addr) in [
        (&seed, "vpnt-seed", SEED_VETH),
        (&shoot, "vpnt-shoot", SHOOT_VETH),
    ] {
        ns.run_in(|| {
            runtime().block_on(async {
                let nl = Netlink::open().expect("netlink");
                nl.add_address(dev, IpPrefix::new(addr.into(), 24).expect("prefix"))
                    .await
                    .expect("address");
            })
        })
        .expect("run_in");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    start_tinyproxy(&seed, dir.path());
    let pki = TestPki::generate().expect("pki");
    // The server listens on every address so that `remote ENDPOINT` (port 1194) reaches it.
    let config = tcp_server_config(
        &pki,
        SERVER_PORT,
        ControlWrap::TlsAuth,
        &["auth SHA256", "local 0.0.0.0"],
    );
    let server = UpstreamOpenvpn::start(&seed, &config, 3).expect("start openvpn");
    server
        .wait_for_log("Initialization Sequence Completed", TIMEOUT)
        .expect("server up");

    let client_conf = dir.path().join("openvpn-client.config");
    std::fs::write(&client_conf, render(&pki)).expect("write client config");
    let loaded = vpn_client::config::load(&client_conf).expect("the template loads unchanged");
    assert!(
        loaded.warnings.iter().any(|w| w.contains("'management'")),
        "management is reported: {:?}",
        loaded.warnings
    );

    std::thread::scope(|scope| {
        let client = ClientThread::spawn(scope, &shoot, loaded.settings);
        let (mut addr, mut routes) = (String::new(), String::new());
        client
            .wait_until("the tunnel address and the up-hook route", TIMEOUT, || {
                addr = ip(&shoot, &["-4", "addr", "show", "dev", "tun0"]);
                routes = ip(&shoot, &["route"]);
                addr.contains(&format!("inet {CLIENT_TUN}"))
                    && routes.contains("241.0.0.0/8 dev tun0")
            })
            .unwrap_or_else(|e| panic!("{e}: {addr} / {routes}"));
        assert_eq!(client.stop().expect("our client"), Stopped::Shutdown);
    });
    drop(server);
}
