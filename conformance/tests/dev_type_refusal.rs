//! vpn2's HA generation (`dev tap`, bonding) and ours (layer 3, `tun`) at each other's
//! servers, going by the OCC `dev-type` (conformance/DEVIATIONS.md W4, H9; `docs/ha.md` §7):
//!
//! * [`vpn2_tap_clients_join_our_ha_server_at_layer_2`]: our HA
//!   server as Gardener starts `vpn-seed-server-0` (`IS_HA=true`, vpn2's environment); our
//!   kube-apiserver client (`vpn-client-0` with Gardener's environment, `tun0`) and upstream
//!   OpenVPN 2.6 as vpn2's HA clients (the config vpn2 renders for `vpn-client-0`, with its
//!   `dev tap0`), with a shoot pod's CN (`vpn-shoot-client-0`), then with the
//!   kube-apiserver's (`vpn-seed-client`). The tap clients are carried at layer 2: their
//!   tunnel comes up with the `ifconfig-ipv6` vpn2's server pushes (the server's /112), the
//!   status file lists them with it; `vpn-server readiness` is Ready on our seed client and
//!   vpn2's shoot client (a pair through the server's gateway, `vpn_server::gateway`: with
//!   the shoot pod's bond address on its `tap0`, the pod's kernel answers the server's
//!   neighbour solicitation and gets the path controller's hello, UDP 5400, from our
//!   kube-apiserver's vpn2 identity with its pod IP), and with vpn2's seed client next to
//!   them (a layer-2 pair). The refusal at a server that cannot
//!   carry the other device type is unit-tested (`vpn-server/src/registry/tests.rs`).
//! * [`our_ha_client_drops_a_vpn2_tap_server_and_keeps_retrying`]: upstream OpenVPN 2.6 as
//!   vpn2's HA `vpn-seed-server-0` (vpn2's server config: `dev tap0`, `client-to-client`,
//!   `duplicate-cn`) and our kube-apiserver client (`vpn-client-0`, `tun0`): the client logs
//!   at error that the server's `dev-type tap` is not its `tun`, never brings a tunnel up nor
//!   installs its routes (metric 100), and tries again, at least three times within 30 s.
//!
//! Not modelled: vpn2's shoot clients dial through the ingress (`http-proxy`); here the
//! shoot-CN tap client dials the server directly (the refusal is at key-method 2, after the
//! proxy hop). vpn2's server hooks (`vpn-server firewall` on `tap0`) are left out of the
//! upstream server's config: they play no part in admission. Each pod is a namespace linked to
//! the server's by a veth pair with point-to-point addresses (the server's pod IP
//! `10.1.3.10` on each).

// Two scenarios read top to bottom.
#![allow(clippy::too_many_lines)]

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::gardener::ha::{KAPI, SERVER};
use conformance::gardener::ha_pods::{secrets_dir, status_path, HaPods};
use conformance::gardener::pods::Binaries;
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::upstream::{UpstreamOpenvpn, LISTENING_MARKER};
use protocol::config::env::{Vpn2ClientEnv, Vpn2ServerEnv};
use protocol::config::{render, Line};
use vpn_client::vpn2::{client_lines, Vpn2Reader as ClientReader};
use vpn_server::config::{vpn2_lines, Vpn2Reader};

const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--devtype",
    dual_stack_nodes: false,
};
/// The namespaces' prefix.
const NS_PREFIX: &str = "vpnt-6a-";
const UP: Duration = Duration::from_secs(40);
/// A shoot pod's address (it would reach the server through the ingress).
const SHOOT_POD: &str = "10.1.6.20";

/// Polls `check` every 200 ms until it holds, at most `limit`; whether it did.
fn poll(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !check() {
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    true
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A namespace `ns` linked to `server` by a veth pair: `eth0` in `ns` with `addr` and the
/// server's pod IP as its peer, `link` in `server` the other way round.
fn link(server: &Netns, link: &str, ns: &Netns, addr: &str) {
    Netns::veth_pair(server, link, ns, "eth0").expect("veth");
    let server_ip = SERVER[0].to_string();
    server
        .run(["ip", "addr", "add", &server_ip, "peer", addr, "dev", link])
        .expect("server side");
    ns.run(["ip", "addr", "add", addr, "peer", &server_ip, "dev", "eth0"])
        .expect("pod side");
}

/// The status file's `TIME` (unix seconds), once the file exists.
fn status_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("TIME,")?.rsplit(',').next()?.parse().ok())
}

/// The status file of server 0, once one written at or after `after` exists.
fn status_after(root: &Path, after: u64) -> String {
    let path = status_path(root, 0);
    let mut text = String::new();
    let written = poll(UP, || {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        status_time(&text).is_some_and(|t| t >= after)
    });
    assert!(written, "no status file written after {after}:\n{text}");
    text
}

/// `vpn-server readiness` of server 0 (vpn2's exec probe), as the kubelet runs it.
fn server_ready(bins: &Binaries, root: &Path, ns: &Netns) -> (bool, String) {
    let out = ns
        .command(&bins.server.display().to_string())
        .arg("readiness")
        .env_clear()
        .env("OPENVPN_STATUS_PATH", status_path(root, 0))
        .env("IS_HA", "true")
        .env("POD_NAME", "vpn-seed-server-0")
        .env("HA_VPN_CLIENTS", "2")
        .output()
        .expect("readiness probe");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The config vpn2 renders for a kube-apiserver pod's `vpn-client-0` (upstream OpenVPN with
/// every line vpn2 writes), with vpn2's HA device `tap0`: the tun device in it is ours.
fn vpn2_tap_client_config(bins: &Binaries, root: &Path) -> String {
    let spec = PODS.seed_client_spec(bins, root, 0, 0);
    let env = Vpn2ClientEnv::parse(spec.env).expect("Gardener's environment");
    let lines = client_lines(&env, &root.join("seed"), ClientReader::Upstream)
        .expect("vpn2's client lines");
    let text = render(&lines);
    assert!(text.contains("\ndev tun0\n"), "{text}");
    text.replace("\ndev tun0\n", "\ndev tap0\n")
}

#[test]
fn vpn2_tap_clients_join_our_ha_server_at_layer_2() {
    require_lab(&["openvpn"]);
    let bins = Binaries::locate().expect("our binaries, built and current");
    let root = secrets_dir(NS_PREFIX).expect("secrets");
    let root = root.path();
    let server_ns = Netns::with_prefix(NS_PREFIX).expect("server pod");
    let kapi0 = Netns::with_prefix(NS_PREFIX).expect("kube-apiserver 0");
    let kapi1 = Netns::with_prefix(NS_PREFIX).expect("kube-apiserver 1");
    let shoot0 = Netns::with_prefix(NS_PREFIX).expect("shoot pod 0");
    link(&server_ns, "vk0", &kapi0, &KAPI[0].to_string());
    link(&server_ns, "vk1", &kapi1, &KAPI[1].to_string());
    link(&server_ns, "vs0", &shoot0, SHOOT_POD);

    let server = PODS
        .start_server(&bins, &server_ns, root, 0, UP)
        .expect("our HA server");

    // Our kube-apiserver client (tun) and vpn2's shoot client (tap, shoot pod 0's
    // certificate): both admitted.
    let ours = PODS
        .seed_client_spec(&bins, root, 0, 0)
        .start(&kapi0, root)
        .expect("our vpn-client-0");
    ours.wait_log("tunnel up", UP)
        .expect("our tun client's tunnel up");
    let seed_tap = vpn2_tap_client_config(&bins, root);
    let seed_dir = format!("{}/", root.join("seed/vpn-client").display());
    let shoot_dir = format!("{}/", root.join("shoot/vpn-client-0").display());
    assert!(seed_tap.contains(&seed_dir), "{seed_tap}");
    let shoot_tap = seed_tap.replace(&seed_dir, &shoot_dir);
    let shoot = UpstreamOpenvpn::start(&shoot0, &shoot_tap, 3).expect("vpn2 shoot client");
    assert!(
        poll(UP, || shoot
            .log()
            .contains("Initialization Sequence Completed")),
        "the tap client's tunnel up:\n{}",
        shoot.log()
    );
    // What vpn2's server-0 pushes: an address of its /112 and its own, on tap0.
    let log = shoot.log();
    assert!(
        log.contains("ifconfig-ipv6 fd8f:6d53:b97a:1::100:2/112 fd8f:6d53:b97a:1::100:1")
            && log.contains("net_addr_v6_add: fd8f:6d53:b97a:1::100:2/112 dev tap0"),
        "{log}"
    );
    assert!(!log.contains("AUTH_FAILED"), "{log}");
    let text = status_after(root, unix_now() + 1);
    assert!(
        text.contains("CLIENT_LIST,vpn-shoot-client-0,")
            && text.contains(",fd8f:6d53:b97a:1::100:2,"),
        "the tap client listed with its address:\n{text}"
    );
    // Our seed client and vpn2's shoot client: a pair through the gateway, Ready.
    let (ready, out) = server_ready(&bins, root, &server_ns);
    assert!(
        ready,
        "Ready on our seed and vpn2's shoot client: {out}\n{text}"
    );
    // The gateway plays a vpn2 kube-apiserver pod for ours: with the shoot pod's bond
    // address on its tap0, the pod's kernel answers the server's solicitation and gets the
    // path controller's hello from our kube-apiserver's identity, its pod IP as text.
    let bond = vpn_server::gateway::shoot_address("fd8f:6d53:b97a:1::/96".parse().unwrap(), 0);
    let me = vpn_server::gateway::identity(
        "fd8f:6d53:b97a:1::/96".parse().unwrap(),
        std::net::IpAddr::V4(KAPI[0]),
    );
    shoot0
        .run([
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{bond}/104"),
            "dev",
            "tap0",
            "nodad",
        ])
        .expect("the bond address");
    let hello = shoot0
        .run_in(move || {
            let socket = std::net::UdpSocket::bind((bond, vpn_server::gateway::HELLO_PORT))?;
            socket.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut buf = [0u8; 64];
            let (n, from) = socket.recv_from(&mut buf)?;
            Ok::<_, std::io::Error>((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
        })
        .expect("in the shoot pod")
        .expect("a hello within 10 s");
    assert_eq!(hello.0, KAPI[0].to_string());
    assert_eq!(
        hello.1.ip(),
        std::net::IpAddr::V6(me.addr),
        "from the identity"
    );

    // vpn2's kube-apiserver client (tap) next to them: a layer-2 pair too.
    let seed = UpstreamOpenvpn::start(&kapi1, &seed_tap, 3).expect("vpn2 seed client");
    assert!(
        poll(UP, || seed
            .log()
            .contains("Initialization Sequence Completed")),
        "{}",
        seed.log()
    );
    let text = status_after(root, unix_now() + 1);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("CLIENT_LIST,"))
            .count(),
        3,
        "{text}"
    );
    let (ready, out) = server_ready(&bins, root, &server_ns);
    assert!(ready, "Ready on the layer-2 pair: {out}\n{text}");
    assert!(
        !server.log().contains("refusing client"),
        "{}",
        server.log()
    );
}

#[test]
fn our_ha_client_drops_a_vpn2_tap_server_and_keeps_retrying() {
    require_lab(&["openvpn", "ip"]);
    let bins = Binaries::locate().expect("our binaries, built and current");
    let root = secrets_dir(NS_PREFIX).expect("secrets");
    let root = root.path();
    let server_ns = Netns::with_prefix(NS_PREFIX).expect("server pod");
    let kapi0 = Netns::with_prefix(NS_PREFIX).expect("kube-apiserver 0");
    link(&server_ns, "vk0", &kapi0, &KAPI[0].to_string());

    // vpn2's HA vpn-seed-server-0: the config vpn2 renders for Gardener's environment.
    let env =
        Vpn2ServerEnv::parse(PODS.server_spec(&bins, root, 0).env).expect("Gardener's environment");
    let ccd = root.join("ccd");
    std::fs::create_dir_all(&ccd).expect("client-config-dir");
    let lines: Vec<Line> = vpn2_lines(
        &env,
        &root.join("server"),
        Vpn2Reader::Upstream {
            client_config_dir: &ccd,
            program: &bins.server,
        },
    )
    .into_iter()
    .filter(|l| !matches!(l, Line::Up(_) | Line::Down(_) | Line::ScriptSecurity(_)))
    .collect();
    let config = render(&lines);
    assert!(config.contains("\ndev tap0\n"), "{config}");
    let server = UpstreamOpenvpn::start(&server_ns, &config, 3).expect("vpn2's HA server");
    server
        .wait_for_log(LISTENING_MARKER, UP)
        .expect("vpn2's server listening");

    let ours = PODS
        .seed_client_spec(&bins, root, 0, 0)
        .start(&kapi0, root)
        .expect("our vpn-client-0");
    let reason = "dev-type tap, this client is tun";
    let start = Instant::now();
    let mut log = String::new();
    let retried = poll(Duration::from_secs(30), || {
        log = ours.log();
        log.lines().filter(|l| l.contains(reason)).count() >= 3
    });
    assert!(
        retried,
        "three refusals within {:?}:\n{log}",
        start.elapsed()
    );
    for line in log.lines().filter(|l| l.contains(reason)) {
        assert!(line.contains("ERROR"), "{line}");
        assert!(line.contains("other device type"), "{line}");
    }
    assert!(
        log.contains("retrying after a pause"),
        "the normal backoff:\n{log}"
    );
    assert!(!log.contains("tunnel up"), "no tunnel:\n{log}");
    assert!(!log.contains("PUSH_REPLY"), "{log}");
    // No route of a working tunnel (metric 100 + index) in the kube-apiserver pod.
    let routes = kapi0
        .run(["ip", "route", "show", "table", "all"])
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(
        !routes
            .lines()
            .any(|l| l.contains("metric 100 ") || l.ends_with("metric 100")),
        "routes of a working tunnel:\n{routes}"
    );
    // vpn2's server saw our client get as far as key-method 2 each time (its certificate
    // verified, `Peer Connection Initiated`), then the connection closed.
    let server_log = server.log();
    let initiated = server_log
        .lines()
        .filter(|l| l.contains("[vpn-seed-client] Peer Connection Initiated with"))
        .count();
    let reset = server_log
        .lines()
        .filter(|l| l.contains("Connection reset, restarting"))
        .count();
    assert!(initiated >= 3 && reset >= 3, "{server_log}");
}
