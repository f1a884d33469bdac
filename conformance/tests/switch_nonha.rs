//! The in-place switch of a non-HA shoot, replayed as Gardener rolls it: from vpn2 to ours
//! (`vpn2_to_ours`) and back (`ours_to_vpn2`, the rollback), with the kube-apiserver's
//! requests to the kubelet and to a webhook every 100 ms through the whole roll, each
//! bounded by 25 s (beyond Envoy's 20 s `connect_timeout`). Our binaries come from the build
//! directory (`cargo build -p vpn-server -p vpn-client -p vpn-router` first), vpn2's pods are
//! Debian's `openvpn` configured as vpn2 renders it, with vpn2's rules
//! (`conformance::gardener::vpn2_pods`). Envoy cannot run here: our sidecar stands in for
//! Envoy's container in vpn2's seed pod too (`vpn-server sidecar`, Envoy's uid and gid).
//!
//! The order and settings (docs/research/gardener-rollout.md):
//!
//! 1. the kube-apiserver Deployment rolls (maxSurge 100 %, maxUnavailable 0,
//!    minReadySeconds 30). In non-HA its pod holds no VPN container and its egress goes to
//!    the `vpn-seed-server` Service's 9443, so nothing on the VPN path changes: the step is a
//!    window of the load, [`KAPI_STEP`] long instead of 30 s (a longer window only counts
//!    more requests of the same kind);
//! 2. the vpn-seed-server Deployment (maxSurge 100, maxUnavailable 0, grace 30 s, no
//!    `preStop`): the surge pod gets its address and is an endpoint of the Service from then
//!    on (`publishNotReadyAddresses`), its init container and containers start; it is Ready
//!    by vpn2's rule once it serves (no client connected); then the old pod gets SIGTERM,
//!    SIGKILL after 30 s if still running (the wait ends when the processes exit, so the
//!    grace costs nothing when they exit at once), and is gone (out of the Service, its link
//!    deleted). kube-proxy's random choice between the endpoints is an nft `numgen` DNAT on
//!    the seed router (`conformance::gardener::switch`);
//! 3. the vpn-shoot Deployment (maxSurge 100 %, maxUnavailable 0 %, grace 30 s, no probes):
//!    the surge pod starts and dials while the old one runs (same CN: the newer connection
//!    replaces the older), it is Ready at once, so the old pod gets SIGTERM right after the
//!    surge pod's containers started, then it is gone.
//!
//! Each step prints `switch figure: ...` (how long it lasted, requests started in it,
//! failed, the longest). No request may fail except, in step 2, those Kubernetes sends where
//! nothing listens (refused) and those in flight in the old seed pod when it ends (see the
//! end of [`switch`]; docs/operations.md, "In-place switch and rollback"). Both run one at a
//! time (a lock); each takes about 20 s.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use conformance::gardener::checks::{self, Egress, KUBELET_PORT, SIDECAR_PORT, WEBHOOK_PORT};
use conformance::gardener::landscape::SEED_POD;
use conformance::gardener::landscape::{Landscape, NODE, WEBHOOK};
use conformance::gardener::pods::{
    seed_server_spec, sidecar_spec, start_until, vpn_shoot_init_env, vpn_shoot_spec, Binaries,
    Container, Mounts, SidecarMode, Spec, SERVER_READY, SIDECAR_READY,
};
use conformance::gardener::switch::{
    self, Step, Termination, SEED_POD_LINK, SERVICE, SURGE_SEED_POD, VPN_SHOOT_LINK,
};
use conformance::gardener::verdict;
use conformance::gardener::vpn2_pods;
use conformance::netns::Netns;
use conformance::require_lab;
use conformance::upstream::UpstreamOpenvpn;

/// How long the first tunnel may take to come up.
const TUNNEL: Duration = Duration::from_secs(45);
/// The kube-apiserver step's window (Gardener's minReadySeconds is 30 s; see the docs).
const KAPI_STEP: Duration = Duration::from_secs(10);
/// The load before the roll and after it.
const STEADY: Duration = Duration::from_secs(3);
/// The pods' termination grace period (Gardener's, unchanged).
const GRACE: Duration = Duration::from_secs(30);
/// The longest the load may run.
const LOAD_LIMIT: Duration = Duration::from_secs(150);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn step<T, E: std::error::Error>(what: &str, logs: &Path, r: Result<T, E>) -> T {
    verdict::step(what, &[logs], r)
}

/// Whose pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Vpn2,
    Ours,
}

/// A process of a pod.
enum Proc<'ns> {
    Ours(Container<'ns>),
    Upstream(UpstreamOpenvpn<'ns>),
}

impl Proc<'_> {
    fn pid(&self) -> u32 {
        match self {
            Proc::Ours(c) => c.pid(),
            Proc::Upstream(u) => u.pid(),
        }
    }
}

/// A running pod: its namespace and processes.
struct Pod<'ns> {
    ns: &'ns Netns,
    procs: Vec<Proc<'ns>>,
}

impl Pod<'_> {
    /// SIGTERM, the grace period, SIGKILL (the kubelet without `preStop`).
    fn terminate(&self, logs: &Path) -> Termination {
        let pids: Vec<u32> = self.procs.iter().map(Proc::pid).collect();
        step("terminate", logs, switch::terminate(self.ns, &pids, GRACE))
    }
}

/// A seed pod of `side` in `ns`: the init container, then the containers until they serve
/// (vpn2's readiness with no client connected: Ready). `surge`: the second pod's status file
/// and node address.
fn seed_pod<'ns>(
    side: Side,
    ns: &'ns Netns,
    bins: &Binaries,
    mounts: &Mounts,
    surge: bool,
) -> Pod<'ns> {
    let logs = mounts.dir();
    let suffix = if surge { "-surge" } else { "" };
    let status = logs.join(format!("status{suffix}"));
    let init = Spec::new(
        &format!("setup{suffix}"),
        &bins.server,
        &["setup"],
        Vec::new(),
    );
    step("seed init container", logs, init.run(ns, logs));
    let procs = match side {
        Side::Ours => {
            let mut spec = seed_server_spec(bins, mounts, SidecarMode::Standalone);
            spec.name = format!("vpn-seed-server{suffix}");
            for (k, v) in &mut spec.env {
                match k.as_str() {
                    "OPENVPN_STATUS_PATH" => *v = status.display().to_string(),
                    "LOCAL_NODE_IP" if surge => *v = "100.96.3.1".into(),
                    _ => {}
                }
            }
            let server = step(
                "vpn-seed-server",
                logs,
                start_until(&spec, ns, logs, SERVER_READY),
            );
            let mut sidecar = sidecar_spec(bins, mounts);
            sidecar.name = format!("sidecar{suffix}");
            let sidecar = step(
                "sidecar",
                logs,
                start_until(&sidecar, ns, logs, SIDECAR_READY),
            );
            vec![Proc::Ours(server), Proc::Ours(sidecar)]
        }
        Side::Vpn2 => {
            let (server, sidecar, _) = step(
                "vpn2's seed pod",
                logs,
                vpn2_pods::start_seed_pod(ns, mounts, bins, &status),
            );
            vec![Proc::Upstream(server), Proc::Ours(sidecar)]
        }
    };
    Pod { ns, procs }
}

/// A vpn-shoot pod of `side` in `ns`: the init container, then the client (started; no
/// probes, so Ready at once).
fn shoot_pod<'ns>(
    side: Side,
    ns: &'ns Netns,
    bins: &Binaries,
    mounts: &Mounts,
    surge: bool,
) -> Pod<'ns> {
    let logs = mounts.dir();
    let suffix = if surge { "-surge" } else { "" };
    let init = Spec::new(
        &format!("vpn-shoot-init{suffix}"),
        &bins.client,
        &["setup"],
        vpn_shoot_init_env(),
    );
    step("vpn-shoot init container", logs, init.run(ns, logs));
    let proc = match side {
        Side::Ours => {
            let mut spec = vpn_shoot_spec(bins, mounts);
            spec.name = format!("vpn-shoot{suffix}");
            Proc::Ours(step("vpn-shoot", logs, spec.start(ns, logs)))
        }
        Side::Vpn2 => Proc::Upstream(step(
            "vpn2's vpn-shoot",
            logs,
            vpn2_pods::start_shoot_pod(ns, mounts),
        )),
    };
    Pod {
        ns,
        procs: vec![proc],
    }
}

/// Rolls a landscape running `from`'s pods to `to`'s in Gardener's order under load; prints
/// and checks the figures.
fn switch(from: Side, to: Side) {
    let _serial = serial();
    require_lab(&["nft", "setpriv", "ping", "openssl", "openvpn"]);
    let bins = Binaries::locate().unwrap_or_else(|e| panic!("{e}"));
    let l = Landscape::build().expect("landscape");
    let surge_seed = Netns::new().expect("namespace");
    let surge_shoot = Netns::new().expect("namespace");
    let mounts = Mounts::generate().expect("mounts");
    let logs = mounts.dir();
    let egress = Egress::new(&mounts.pki.bundle, &mounts.pki.client)
        .expect("egress")
        .toward(SocketAddr::from((SERVICE, SIDECAR_PORT)));
    let direction = format!("{from:?} -> {to:?}");

    // The landscape as it runs before the switch: `from`'s pods behind the Service.
    step(
        "service",
        logs,
        switch::set_endpoints(&l.seed_router, &[SEED_POD]),
    );
    let _ingress = step(
        "ingress",
        logs,
        switch::start_ingress_to_service(&bins, &l.ingress, logs),
    );
    let old_seed = seed_pod(from, &l.seed_pod, &bins, &mounts, false);
    let old_shoot = shoot_pod(from, &l.vpn_shoot, &bins, &mounts, false);
    verdict::check("tunnel up", &[logs], checks::wait_tunnel(&l, TUNNEL));
    let targets = [
        SocketAddr::new(NODE.0.into(), KUBELET_PORT),
        SocketAddr::new(WEBHOOK.0.into(), WEBHOOK_PORT),
    ];
    step(
        "kubelet and webhook",
        logs,
        switch::serve_echo(&[(&l.node, targets[0]), (&l.webhook, targets[1])]),
    );

    let stop = AtomicBool::new(false);
    let (steps, records) = std::thread::scope(|s| {
        let load =
            s.spawn(|| switch::load(&l.kube_apiserver, &egress, &targets, &stop, LOAD_LIMIT));
        let mut steps = Vec::new();
        let mut mark = |name: &str| {
            eprintln!("{direction}: {name}");
            steps.push(Step {
                name: name.to_owned(),
                start: Instant::now(),
            });
        };
        mark("before the roll");
        std::thread::sleep(STEADY);

        mark("1 kube-apiserver roll");
        std::thread::sleep(KAPI_STEP);

        mark("2 vpn-seed-server surge pod");
        step(
            "surge seed pod",
            logs,
            switch::attach_surge_seed_pod(&l, &surge_seed),
        );
        step(
            "service",
            logs,
            switch::set_endpoints(&l.seed_router, &[SEED_POD, SURGE_SEED_POD]),
        );
        let new_seed = seed_pod(to, &surge_seed, &bins, &mounts, true);
        mark("2 vpn-seed-server old pod terminating");
        let ended = old_seed.terminate(logs);
        eprintln!("{direction}: old seed pod ended after {ended:?}");
        step(
            "service",
            logs,
            switch::set_endpoints(&l.seed_router, &[SURGE_SEED_POD]),
        );
        step(
            "old seed pod gone",
            logs,
            switch::remove_pod(&l.seed_router, SEED_POD_LINK),
        );
        drop(old_seed);

        mark("3 vpn-shoot surge pod");
        step(
            "surge vpn-shoot pod",
            logs,
            switch::attach_surge_vpn_shoot(&l, &surge_shoot),
        );
        let new_shoot = shoot_pod(to, &surge_shoot, &bins, &mounts, true);
        mark("3 vpn-shoot old pod terminating");
        let ended = old_shoot.terminate(logs);
        eprintln!("{direction}: old vpn-shoot pod ended after {ended:?}");
        step(
            "old vpn-shoot pod gone",
            logs,
            switch::remove_pod(&l.shoot_router, VPN_SHOOT_LINK),
        );
        drop(old_shoot);

        mark("after the roll");
        std::thread::sleep(STEADY);
        stop.store(true, Ordering::Relaxed);
        let records = load.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        drop((new_seed, new_shoot));
        (steps, records)
    });

    let figures = switch::figures(&steps, &records);
    for f in &figures {
        eprintln!(
            "switch figure: {direction}, {} ({} ms): {} requests started, {} failed, longest {} ms",
            f.step,
            f.lasted.as_millis(),
            f.started,
            f.failed.len(),
            f.longest.as_millis()
        );
        for e in f.failed.iter().take(3) {
            eprintln!("  failed: {e}");
        }
    }
    // The roll's own steps last 0.1 to 0.3 s here (our processes start in milliseconds, no
    // image is pulled), so one may start no request of its own; the steady windows must, and
    // the roll as a whole.
    let steady = |f: &&switch::Figure| !f.step.starts_with(['2', '3']);
    assert!(
        figures.iter().filter(steady).all(|f| f.started > 0)
            && figures
                .iter()
                .filter(|f| !steady(f))
                .map(|f| f.started)
                .sum::<usize>()
                > 0,
        "the load ran through the roll: {figures:?}"
    );
    // The failures the replay shows, and why they are the roll's and not the VPN's: with
    // `publishNotReadyAddresses` the Service sends new connections to a seed pod from the
    // moment it has an address until it is gone, also while nothing listens on 9443 there
    // (the surge pod before its sidecar listens, the old pod after SIGTERM): refused at
    // once. And a CONNECT the old pod's sidecar is still dialing when the pod gets SIGTERM
    // ends with the pod (no `preStop`; Envoy exits on SIGTERM too): closed without an
    // answer. Both only in step 2; everything else must succeed.
    let unexplained: Vec<String> = figures
        .iter()
        .flat_map(|f| {
            let seed_roll = f.step.starts_with("2 ");
            f.failed
                .iter()
                .filter(move |e| !(seed_roll && (e.ends_with(REFUSED) || e.ends_with(CUT))))
                .map(move |e| format!("{}: {e}", f.step))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "{direction}: failed requests:\n{}\nlogs in {}",
        unexplained.join("\n"),
        logs.display()
    );
}

/// How a connection to a Service address with nothing listening behind it fails.
const REFUSED: &str = "connect: Connection refused (os error 111)";
/// How a CONNECT ends when the sidecar's pod ends before its answer.
const CUT: &str = "closed without an answer (want 200)";

#[test]
fn vpn2_to_ours() {
    switch(Side::Vpn2, Side::Ours);
}

#[test]
fn ours_to_vpn2() {
    switch(Side::Ours, Side::Vpn2);
}
