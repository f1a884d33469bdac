//! Gardener's non-HA VPN pods replayed in the landscape's namespaces with our binaries (from
//! the build directory; `cargo build -p vpn-server -p vpn-client -p vpn-router` first), and
//! the rolling-upgrade pairs, against every check of `conformance::gardener::checks`:
//!
//! * `our_pods_pass_every_check`: `vpn-server` in vpn2 environment mode with the sidecar as
//!   Envoy's container (`vpn-server sidecar`, uid 65532, gid 31415), `vpn-router` as the
//!   ingress, `vpn-client` in environment mode; traffic, overlap, silence, MSS; the rules in
//!   both pods after start, after a second start, after `kill -9` and a restart, and gone
//!   after a clean exit;
//! * `our_server_with_upstream_client_passes_the_checks`: the seed pod as above, upstream
//!   `openvpn` in the vpn-shoot pod with vpn2's client config and vpn2's shoot rules;
//! * `upstream_server_with_our_client_passes_the_checks`: upstream `openvpn` in the seed pod
//!   with vpn2's server config and CCD, our `vpn-server firewall` as its hooks, vpn2's
//!   group-31415 NAT and our sidecar; our client; the hook's rules across `kill -9`, restart
//!   and exit;
//! * `checks_fail_when_what_they_check_is_broken`: vpn2 as it is today (upstream OpenVPN on
//!   both sides, vpn2's rules) with our hooks and sidecar, each check against a landscape
//!   where what it checks was broken on purpose;
//! * `in_process_sidecar_reaches_the_overlap`: the same with the sidecar inside the server's
//!   process, which is given `SEED_POD_NETWORK` and maps the shoot's addresses itself: a shoot
//!   address in the seed's pod network still reaches the shoot.
//!
//! The tests run one at a time (a lock): each builds the whole landscape and runs several
//! programs on a small machine.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::error::Error;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use conformance::gardener::checks::{
    self, addresses, seed_probes, CheckError, Egress, Family, Probe,
};
use conformance::gardener::landscape::SEED_POD_NETWORK;
use conformance::gardener::landscape::{Landscape, INGRESS_LB};
use conformance::gardener::pods::{
    run_init_containers, seed_server_spec, sidecar_spec, start_ingress, start_until,
    vpn_shoot_spec, Binaries, Container, Mounts, SidecarMode, SERVER_ADMIN_PORT, SERVER_READY,
    SIDECAR_IDS, SIDECAR_READY,
};
use conformance::gardener::rules::{self, forward_guard, vpn2_seed, vpn2_shoot, Expected};
use conformance::gardener::verdict::{
    self, our_seed_rules, our_seed_rules_after_exit, our_seed_rules_after_kill,
    our_seed_rules_at_first_start,
};
use conformance::gardener::vpn2_pods;
use conformance::gardener::vpn2_upstream::{client_config, install_shoot_rules, shoot_networks};
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::upstream::{UpstreamOpenvpn, INITIALIZED_MARKER};

/// How long the tunnel may take to come up (connect-retry 1 5 after a restart).
const TUNNEL: Duration = Duration::from_secs(45);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The checks and steps of [`verdict`], with the logs of this test's one log directory.
fn explain(e: &dyn Error, logs: &Path) -> String {
    verdict::explain(e, &[logs])
}

fn check<T: std::fmt::Debug>(name: &str, logs: &Path, r: Result<T, CheckError>) -> T {
    verdict::check(name, &[logs], r)
}

fn step<T, E: Error>(what: &str, logs: &Path, r: Result<T, E>) -> T {
    verdict::step(what, &[logs], r)
}

fn traffic_checks(l: &Landscape, egress: &Egress, logs: &Path, ports: &[u16]) {
    verdict::traffic_checks(l, egress, &[logs], ports)
}

fn rules_are(l: &Landscape, logs: &Path, when: &str, seed: &[Expected], shoot: &[Expected]) {
    verdict::rules_are(l, &[logs], when, seed, shoot)
}

fn stop(c: &Container<'_>, signal: &str, logs: &Path) -> std::process::ExitStatus {
    step(
        &format!("SIG{signal} to {}", c.pid()),
        logs,
        c.signal(signal),
    )
}

/// The landscape, the mounts, the binaries and the kube-apiserver's egress.
fn setup() -> (Landscape, Mounts, Binaries, Egress) {
    require_lab(&["nft", "tcpdump", "setpriv", "ping", "openssl", "openvpn"]);
    let bins = Binaries::locate().unwrap_or_else(|e| panic!("{}", explain(&e, Path::new("/"))));
    let l = Landscape::build().expect("landscape");
    let mounts = Mounts::generate().expect("mounts");
    let egress = Egress::new(&mounts.pki.bundle, &mounts.pki.client).expect("egress");
    (l, mounts, bins, egress)
}

#[test]
fn our_pods_pass_every_check() {
    let _serial = serial();
    let (l, mounts, bins, egress) = setup();
    let logs = mounts.dir();
    let started = Instant::now();
    step(
        "init containers",
        logs,
        run_init_containers(&bins, &l.seed_pod, &l.vpn_shoot, logs),
    );
    let _ingress = step("ingress", logs, start_ingress(&bins, &l.ingress, logs));
    let server_spec = seed_server_spec(&bins, &mounts, SidecarMode::Standalone);
    let mut server = step(
        "vpn-seed-server",
        logs,
        start_until(&server_spec, &l.seed_pod, logs, SERVER_READY),
    );
    let sidecar = step(
        "sidecar",
        logs,
        start_until(
            &sidecar_spec(&bins, &mounts),
            &l.seed_pod,
            logs,
            SIDECAR_READY,
        ),
    );
    assert_eq!(
        sidecar.ids(),
        Some(SIDECAR_IDS),
        "the sidecar runs as Envoy did"
    );
    let shoot_spec = vpn_shoot_spec(&bins, &mounts);
    let mut client = step("vpn-shoot", logs, shoot_spec.start(&l.vpn_shoot, logs));
    check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));
    eprintln!("pods up after {:?}", started.elapsed());

    traffic_checks(&l, &egress, logs, &[1194, 9443, 15000, SERVER_ADMIN_PORT]);
    let seed = our_seed_rules();
    let shoot = vpn2_shoot(&rules::LANDSCAPE_NETMAP);
    rules_are(
        &l,
        logs,
        "after start",
        &our_seed_rules_at_first_start(),
        &shoot,
    );

    // A second start of each container (the pod's namespace stays): the same rules, once.
    assert!(stop(&server, "TERM", logs).success(), "{}", server.log());
    assert!(stop(&client, "TERM", logs).success(), "{}", client.log());
    rules_are(
        &l,
        logs,
        "after both stopped",
        &our_seed_rules_after_exit(),
        &[],
    );
    step("server restart", logs, server.restart(logs));
    step("server ready", logs, server.wait_log(SERVER_READY, TUNNEL));
    step("client restart", logs, client.restart(logs));
    check("tunnel up again", logs, checks::wait_tunnel(&l, TUNNEL));
    rules_are(&l, logs, "after a second start", &seed, &shoot);

    // kill -9 leaves the seed pod's rules in place (V1; the vpn-shoot pod's owned table goes
    // with its client); the restart installs the rules once and carries traffic.
    assert!(!stop(&server, "KILL", logs).success());
    assert!(!stop(&client, "KILL", logs).success());
    rules_are(&l, logs, "after kill -9", &our_seed_rules_after_kill(), &[]);
    step("server restart", logs, server.restart(logs));
    step("server ready", logs, server.wait_log(SERVER_READY, TUNNEL));
    step("client restart", logs, client.restart(logs));
    check(
        "tunnel up after kill -9",
        logs,
        checks::wait_tunnel(&l, TUNNEL),
    );
    rules_are(&l, logs, "after kill -9 and restart", &seed, &shoot);
    check(
        "kubelet after restarts",
        logs,
        checks::kubelet(&l, &egress, Family::V6),
    );

    // A clean exit removes everything but the tunnel-only rules.
    assert!(stop(&client, "TERM", logs).success(), "{}", client.log());
    assert!(stop(&server, "TERM", logs).success(), "{}", server.log());
    rules_are(
        &l,
        logs,
        "after a clean exit",
        &our_seed_rules_after_exit(),
        &[],
    );
    eprintln!("done after {:?}", started.elapsed());
}

#[test]
fn our_server_with_upstream_client_passes_the_checks() {
    let _serial = serial();
    let (l, mounts, bins, egress) = setup();
    let logs = mounts.dir();
    step(
        "init containers",
        logs,
        run_init_containers(&bins, &l.seed_pod, &l.vpn_shoot, logs),
    );
    let _ingress = step("ingress", logs, start_ingress(&bins, &l.ingress, logs));
    let server_spec = seed_server_spec(&bins, &mounts, SidecarMode::Standalone);
    let _server = step(
        "vpn-seed-server",
        logs,
        start_until(&server_spec, &l.seed_pod, logs, SERVER_READY),
    );
    let _sidecar = step(
        "sidecar",
        logs,
        start_until(
            &sidecar_spec(&bins, &mounts),
            &l.seed_pod,
            logs,
            SIDECAR_READY,
        ),
    );
    // vpn2's vpn-shoot container: its Go step's rules, then OpenVPN with its config.
    step("shoot rules", logs, install_shoot_rules(&l.vpn_shoot));
    let config = client_config(&mounts.shoot_secrets(), &INGRESS_LB.to_string());
    let upstream = step(
        "upstream client",
        logs,
        UpstreamOpenvpn::start(&l.vpn_shoot, &config, 3),
    );
    if let Err(e) = upstream.wait_for_log(INITIALIZED_MARKER, TUNNEL) {
        panic!("upstream client: {}", explain(&e, logs));
    }
    check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));

    traffic_checks(&l, &egress, logs, &[1194, 9443, 15000, SERVER_ADMIN_PORT]);
    rules_are(
        &l,
        logs,
        "after start",
        &our_seed_rules_at_first_start(),
        &vpn2_shoot(&rules::LANDSCAPE_NETMAP),
    );
}

/// vpn2's seed pod with upstream OpenVPN ([`vpn2_pods::start_seed_pod`]) and our sidecar as
/// Envoy's container.
fn upstream_seed_pod<'l>(
    l: &'l Landscape,
    mounts: &Mounts,
    bins: &Binaries,
) -> (UpstreamOpenvpn<'l>, Container<'l>, String) {
    step(
        "vpn2's seed pod",
        mounts.dir(),
        vpn2_pods::start_seed_pod(&l.seed_pod, mounts, bins, &mounts.status_path()),
    )
}

#[test]
fn upstream_server_with_our_client_passes_the_checks() {
    let _serial = serial();
    let (l, mounts, bins, egress) = setup();
    let logs = mounts.dir();
    step(
        "init containers",
        logs,
        run_init_containers(&bins, &l.seed_pod, &l.vpn_shoot, logs),
    );
    let _ingress = step("ingress", logs, start_ingress(&bins, &l.ingress, logs));
    let (server, _sidecar, config) = upstream_seed_pod(&l, &mounts, &bins);
    let _client = step(
        "vpn-shoot",
        logs,
        vpn_shoot_spec(&bins, &mounts).start(&l.vpn_shoot, logs),
    );
    check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));

    traffic_checks(&l, &egress, logs, &[1194, 9443, 15000]);
    // Our `firewall` hook installs vpn2's rules and the forward guard (DEVIATIONS V6); vpn2's
    // start NAT (`vpn2[3..]`) is not the hook's and stays after a clean exit, as does the start
    // table of our init container (only our server removes it).
    let vpn2 = vpn2_seed(SEED_POD_NETWORK, &rules::LANDSCAPE_NETMAP);
    let mut seed = vpn2_seed(SEED_POD_NETWORK, &rules::LANDSCAPE_NETMAP);
    seed.push(forward_guard());
    // The pod's init container is ours: its start table stays (only our server removes it).
    seed.push(rules::seed_start());
    let shoot = vpn2_shoot(&rules::LANDSCAPE_NETMAP);
    rules_are(&l, logs, "after start", &seed, &shoot);

    // The hook's rules are not tied to a process: kill -9 leaves them, a restart's hook
    // replaces them (no second copy, unlike vpn2's), the down hook of a clean exit removes
    // them; vpn2's start NAT stays, as vpn2's does.
    let pid = server.pid();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill")
        .success());
    let deadline = Instant::now() + TUNNEL;
    while l.seed_pod.try_wait(pid).is_none() {
        assert!(Instant::now() < deadline, "openvpn survived kill -9");
        std::thread::sleep(Duration::from_millis(20));
    }
    rules_are(&l, logs, "after kill -9", &seed, &shoot);
    drop(server);
    let server = step(
        "upstream server again",
        logs,
        UpstreamOpenvpn::start(&l.seed_pod, &config, 3),
    );
    step(
        "upstream server again",
        logs,
        server.wait_for_log(INITIALIZED_MARKER, TUNNEL),
    );
    check("tunnel up again", logs, checks::wait_tunnel(&l, TUNNEL));
    rules_are(&l, logs, "after kill -9 and restart", &seed, &shoot);
    check(
        "kubelet after restart",
        logs,
        checks::kubelet(&l, &egress, Family::V4),
    );
    drop(server);
    let mut left = vpn2[3..].to_vec();
    left.push(rules::seed_start());
    rules_are(&l, logs, "after a clean exit", &left, &shoot);
}

/// Runs an nft script in `ns`.
fn nft(ns: &Netns, logs: &Path, script: &str) {
    let path = logs.join("break.nft");
    std::fs::write(&path, script).expect("nft script");
    step(
        "nft",
        logs,
        ns.run(["nft", "-f", &path.display().to_string()]),
    );
}

/// The check's error, or a panic saying the check passed although its subject was broken.
fn fails<T: std::fmt::Debug>(what: &str, r: Result<T, CheckError>) -> CheckError {
    match r {
        Ok(v) => panic!("{what}: the check passed although it was broken: {v:?}"),
        Err(e) => {
            eprintln!("fails as it must, {what}: {e}");
            e
        }
    }
}

/// Each check fails when what it checks is broken. The landscape runs vpn2 as it is today
/// (upstream OpenVPN on both sides, vpn2's rules, none owned by a process, so `nft` can
/// edit them) with our hooks and sidecar: the source address, the echoed bytes, the MSS
/// clamp, the seed's INPUT drop (silence and rules), a doubled rule, the sidecar's mapping
/// of the overlap, the tunnel itself.
#[test]
fn checks_fail_when_what_they_check_is_broken() {
    let _serial = serial();
    let (l, mounts, bins, egress) = setup();
    let logs = mounts.dir();
    step(
        "init containers",
        logs,
        run_init_containers(&bins, &l.seed_pod, &l.vpn_shoot, logs),
    );
    let _ingress = step("ingress", logs, start_ingress(&bins, &l.ingress, logs));
    let (_server, mut sidecar, _) = upstream_seed_pod(&l, &mounts, &bins);
    step("shoot rules", logs, install_shoot_rules(&l.vpn_shoot));
    let config = client_config(&mounts.shoot_secrets(), &INGRESS_LB.to_string());
    let client = step(
        "upstream client",
        logs,
        UpstreamOpenvpn::start(&l.vpn_shoot, &config, 3),
    );
    check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));
    let delete_break = |ns: &Netns| nft(ns, logs, "delete table inet break\n");

    // The vpn-shoot pod leaves through another of its addresses: the kubelet sees it.
    step(
        "second address",
        logs,
        l.vpn_shoot
            .run(["ip", "addr", "add", "100.96.10.99/24", "dev", "eth0"]),
    );
    nft(
        &l.vpn_shoot,
        logs,
        "table inet break {\n chain post {\n type nat hook postrouting priority 50;\n \
         oifname \"eth0\" ip daddr 10.250.0.5 snat ip to 100.96.10.99\n }\n}\n",
    );
    let e = fails("another source", checks::kubelet(&l, &egress, Family::V4));
    assert!(matches!(e, CheckError::WrongSource { .. }), "{e}");
    delete_break(&l.vpn_shoot);

    // The node resets the connection at the first echoed segment.
    nft(
        &l.node,
        logs,
        "table inet break {\n chain input {\n type filter hook input priority 0;\n \
         tcp dport 10250 meta length > 400 reject with tcp reset\n }\n}\n",
    );
    let e = fails("a reset mid-echo", checks::kubelet(&l, &egress, Family::V6));
    assert!(matches!(e, CheckError::Echo { got: 0, .. }), "{e}");
    delete_break(&l.node);

    // No MSS clamp in the vpn-shoot pod.
    nft(
        &l.vpn_shoot,
        logs,
        "delete chain inet vpn-shoot clamp-mss\n",
    );
    let e = fails("no clamp", checks::mss_clamped(&l, &egress, Family::V4));
    assert!(matches!(e, CheckError::MssTooLarge { .. }), "{e}");
    step("shoot rules again", logs, install_shoot_rules(&l.vpn_shoot));
    check(
        "clamp repaired",
        logs,
        checks::mss_clamped(&l, &egress, Family::V4),
    );

    // The seed's INPUT drop is gone: the rules say so, and the shoot reaches the seed.
    let listing = step(
        "nft -a",
        logs,
        l.seed_pod.run([
            "nft",
            "-a",
            "list",
            "chain",
            "inet",
            "vpn-seed-server",
            "input",
        ]),
    );
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let handle = listing
        .lines()
        .find(|l| l.contains("iifname \"tun0\" drop"))
        .and_then(|l| l.rsplit("# handle ").next())
        .expect("the drop rule's handle")
        .trim()
        .to_owned();
    step(
        "delete the drop",
        logs,
        l.seed_pod.run([
            "nft",
            "delete",
            "rule",
            "inet",
            "vpn-seed-server",
            "input",
            "handle",
            &handle,
        ]),
    );
    // What our `firewall` hook installs: vpn2's rules and the forward guard (DEVIATIONS V6).
    let mut seed = vpn2_seed(SEED_POD_NETWORK, &rules::LANDSCAPE_NETMAP);
    seed.push(forward_guard());
    // The pod's init container is ours: its start table stays (only our server removes it).
    seed.push(rules::seed_start());
    let e = fails("no INPUT drop", checks::rules(&l.seed_pod, "seed", &seed));
    assert!(
        matches!(&e, CheckError::Rules { diff, .. } if diff.missing.len() == 1),
        "{e}"
    );
    let tun = step("tun0 addresses", logs, addresses(&l.seed_pod, "tun0"));
    let probes: Vec<Probe> = seed_probes(&tun, &[1194])
        .into_iter()
        .filter(|p| matches!(p, Probe::Tcp(a) if a.port() == 1194))
        .collect();
    let e = fails(
        "no INPUT drop",
        checks::shoot_cannot_reach_seed(&l, &probes),
    );
    assert!(matches!(e, CheckError::ShootAnswered { .. }), "{e}");
    // A rule twice.
    for _ in 0..2 {
        step(
            "add a drop",
            logs,
            l.seed_pod.run([
                "nft",
                "add",
                "rule",
                "inet",
                "vpn-seed-server",
                "input",
                "iifname",
                "tun0",
                "drop",
            ]),
        );
    }
    let e = fails("a doubled rule", checks::rules(&l.seed_pod, "seed", &seed));
    assert!(
        matches!(&e, CheckError::Rules { diff, .. } if diff.duplicated.len() == 1),
        "{e}"
    );
    // The hook run again puts the table right (it replaces, never appends).
    let nets = format!("--shoot-network={}", shoot_networks().join(","));
    let seed_pod = format!("--seed-pod-network={SEED_POD_NETWORK}");
    let hook = [
        bins.server.display().to_string(),
        "firewall".into(),
        "--mode".into(),
        "up".into(),
        "--device".into(),
        "tun0".into(),
        nets,
        seed_pod,
    ];
    step("the hook again", logs, l.seed_pod.run(&hook));
    check(
        "seed rules repaired",
        logs,
        checks::rules(&l.seed_pod, "seed", &seed).map(|_| ()),
    );

    // The sidecar without the mapping (root, its own allow-list): the overlap lands in the
    // seed.
    stop(&sidecar, "TERM", logs);
    let allow = format!(
        "{},{},{}",
        conformance::gardener::landscape::SHOOT_POD_NETWORKS,
        conformance::gardener::landscape::SHOOT_SERVICE_NETWORKS,
        conformance::gardener::landscape::SHOOT_NODE_NETWORKS
    );
    let mut unmapped = sidecar_spec(&bins, &mounts);
    unmapped.ids = None;
    unmapped.args.extend(["--sidecar-allow".to_owned(), allow]);
    let root_sidecar = step(
        "unmapped sidecar",
        logs,
        start_until(&unmapped, &l.seed_pod, logs, SIDECAR_READY),
    );
    let e = fails("no mapping", checks::overlap(&l, &egress));
    assert!(
        matches!(
            e,
            CheckError::Reached {
                pod: "kube-apiserver",
                ..
            }
        ),
        "{e}"
    );
    stop(&root_sidecar, "TERM", logs);
    step("sidecar again", logs, sidecar.restart(logs));
    step(
        "sidecar again",
        logs,
        sidecar.wait_log(SIDECAR_READY, TUNNEL),
    );
    check("overlap repaired", logs, checks::overlap(&l, &egress));

    // The tunnel is down.
    drop(client);
    let e = fails("no tunnel", checks::tunnel_check(&l, &egress));
    assert!(matches!(e, CheckError::NotConnected { .. }), "{e}");
    let e = fails("no tunnel", checks::wait_tunnel(&l, Duration::from_secs(2)));
    assert!(matches!(e, CheckError::NoTunnel { .. }), "{e}");
    let e = fails("no tunnel", checks::shoot_cannot_reach_seed(&l, &probes));
    assert!(matches!(e, CheckError::ProbeLost { .. }), "{e}");
}

#[test]
fn in_process_sidecar_reaches_the_overlap() {
    let _serial = serial();
    let (l, mounts, bins, egress) = setup();
    let logs = mounts.dir();
    step(
        "init containers",
        logs,
        run_init_containers(&bins, &l.seed_pod, &l.vpn_shoot, logs),
    );
    let _ingress = step("ingress", logs, start_ingress(&bins, &l.ingress, logs));
    let server_spec = seed_server_spec(&bins, &mounts, SidecarMode::InProcess);
    let _server = step(
        "vpn-seed-server",
        logs,
        start_until(&server_spec, &l.seed_pod, logs, SIDECAR_READY),
    );
    let _client = step(
        "vpn-shoot",
        logs,
        vpn_shoot_spec(&bins, &mounts).start(&l.vpn_shoot, logs),
    );
    check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));
    check("kubelet", logs, checks::kubelet(&l, &egress, Family::V4));
    check("webhook", logs, checks::webhook(&l, &egress, Family::V4));
    check("overlap", logs, checks::overlap(&l, &egress));
}
