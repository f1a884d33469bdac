//! The in-process sidecar of a config-file start (`vpn-server --config F --sidecar`) with its
//! default listeners (`*:9443`, `*:15000`): the seed side reaches them, the tunnel does not.
//!
//! ```text
//!   apiserver ── api0 ═══ api0 ── SEED (vpn-server, tun0 192.168.123.1) ── eth0 ═══ eth0 ── SHOOT (vpn-client)
//!   10.2.0.2                10.2.0.1                                       10.1.0.1   10.1.0.2
//! ```
//!
//! From SHOOT, connections to the server's tunnel address, and to its seed-side address routed
//! into the tunnel, on 9443 and 15000 do not open; from the apiserver namespace both ports
//! serve. Needs the binaries current: `cargo build -p vpn-server -p vpn-client`.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use conformance::gardener::pods::Binaries;
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until_every;

const UP: Duration = Duration::from_secs(40);
const POLL: Duration = Duration::from_millis(200);

fn ip(ns: &Netns, args: &[&str]) {
    let mut argv = vec!["ip"];
    argv.extend_from_slice(args);
    ns.run(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
}

fn tcp_opens(ns: &Netns, to: &str) -> bool {
    let to: SocketAddr = to.parse().expect("address");
    ns.run_in(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok())
        .expect("run_in")
}

fn spawn(ns: &Netns, dir: &Path, name: &str, program: &Path, args: &[&str]) -> u32 {
    let out = fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let mut cmd = ns.command(&program.display().to_string());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out);
    ns.spawn(&mut cmd).expect("spawn")
}

#[test]
fn the_default_sidecar_listeners_of_a_config_start_are_not_reachable_from_the_tunnel() {
    require_lab(&["nft", "openssl", "curl"]);
    let bins = Binaries::locate().expect("binaries (cargo build -p vpn-server -p vpn-client)");
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    let (seed, shoot, api) = (
        Netns::new().expect("seed"),
        Netns::new().expect("shoot"),
        Netns::new().expect("apiserver"),
    );
    Netns::veth_pair(&seed, "eth0", &shoot, "eth0").expect("veth");
    Netns::veth_pair(&seed, "api0", &api, "api0").expect("veth");
    ip(&seed, &["addr", "add", "10.1.0.1/24", "dev", "eth0"]);
    ip(&shoot, &["addr", "add", "10.1.0.2/24", "dev", "eth0"]);
    ip(&seed, &["addr", "add", "10.2.0.1/24", "dev", "api0"]);
    ip(&api, &["addr", "add", "10.2.0.2/24", "dev", "api0"]);

    let server_conf = d.join("server.conf");
    fs::write(
        &server_conf,
        format!(
            "proto tcp-server\nport 1194\ndev tun0\ntopology subnet\n\
             server 192.168.123.0 255.255.255.0\nkeepalive 2 10\n\
             ca {}\ncert {}\nkey {}\ndh none\ntls-auth {} 0\n",
            pki.ca_cert().display(),
            pki.server_cert().display(),
            pki.server_key().display(),
            pki.ta_key().display()
        ),
    )
    .expect("server config");
    let (cert, key, ca) = (pki.server_cert(), pki.server_key(), pki.ca_cert());
    let _server = spawn(
        &seed,
        d,
        "server",
        &bins.server,
        &[
            "--config",
            &server_conf.display().to_string(),
            "--log",
            "info",
            "--sidecar",
            "--sidecar-cert",
            &cert.display().to_string(),
            "--sidecar-key",
            &key.display().to_string(),
            "--sidecar-ca",
            &ca.display().to_string(),
        ],
    );
    let client_conf = d.join("client.conf");
    fs::write(
        &client_conf,
        format!(
            "client\nproto tcp-client\nremote 10.1.0.1 1194\ndev tun0\nnobind\n\
             ca {}\ncert {}\nkey {}\ntls-auth {} 1\nremote-cert-tls server\n",
            pki.ca_cert().display(),
            pki.client_cert().display(),
            pki.client_key().display(),
            pki.ta_key().display()
        ),
    )
    .expect("client config");
    let _client = spawn(
        &shoot,
        d,
        "client",
        &bins.client,
        &["--config", &client_conf.display().to_string()],
    );
    let log = || {
        ["server", "client"]
            .map(|n| fs::read_to_string(d.join(format!("{n}.log"))).unwrap_or_default())
            .join("\n---\n")
    };
    wait_until_every("the tunnel", UP, POLL, || {
        matches!(shoot.ipv4_on("tun0"), Ok(Some(_)))
            && tcp_opens(&api, "10.2.0.1:9443")
            && tcp_opens(&shoot, "192.168.123.1:1194")
    });
    // The seed side reaches both listeners.
    assert!(tcp_opens(&api, "10.2.0.1:9443"), "{}", log());
    let metrics = api
        .command("curl")
        .args(["-sf", "--noproxy", "*", "--max-time", "5"])
        .arg("http://10.2.0.1:15000/metrics")
        .output()
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(metrics.contains("vpn_sidecar_"), "{metrics}\n{}", log());
    // The tunnel reaches neither, by the server's tunnel address nor by a seed-side address
    // routed into the tunnel.
    ip(&shoot, &["route", "add", "10.2.0.1/32", "dev", "tun0"]);
    for to in [
        "192.168.123.1:9443",
        "192.168.123.1:15000",
        "10.2.0.1:9443",
        "10.2.0.1:15000",
    ] {
        assert!(
            !tcp_opens(&shoot, to),
            "{to} opened from the tunnel\n{}",
            log()
        );
    }
    let listed = shoot_side_guard(&seed);
    assert!(
        listed.contains("iifname \"tun0\" ct state new tcp dport 9443 drop")
            && listed.contains("iifname \"tun0\" ct state new tcp dport 15000 drop"),
        "{listed}"
    );
}

/// The server's guard chain as `nft` lists it.
fn shoot_side_guard(seed: &Netns) -> String {
    let out = seed
        .run([
            "nft",
            "list",
            "chain",
            "inet",
            "vpn-seed-server",
            "listener-guard",
        ])
        .expect("the guard chain");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
