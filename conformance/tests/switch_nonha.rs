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
//!    `preStop`): the surge pod gets its address, its init container runs, and it is an
//!    endpoint of the Service from then on (`publishNotReadyAddresses`; the kubelet reports
//!    the address no earlier than after the sync that started the init container); its
//!    containers start one after the other, the kubelet waiting for neither to serve; it is
//!    Ready by vpn2's rule once it serves (no client connected); then the old pod gets
//!    SIGTERM on all its processes at once, SIGKILL after 30 s if still running (the wait
//!    ends when the processes exit), and is gone (out of the Service, its link deleted).
//!    kube-proxy's random choice between the endpoints is an nft `numgen` DNAT on the seed
//!    router (`conformance::gardener::switch`);
//! 3. the vpn-shoot Deployment (maxSurge 100 %, maxUnavailable 0 %, grace 30 s, no probes):
//!    the surge pod starts and dials while the old one runs (same CN: the newer connection
//!    replaces the older), it is Ready at once, so the old pod gets SIGTERM right after the
//!    surge pod's containers started, then it is gone.
//!
//! Each step prints `switch figure: ...` (how long it lasted, requests started in it,
//! failed, the longest). No request may fail that a process of ours could have carried:
//! our surge seed pod holds the SYNs that come before its sidecar listens (its init
//! container's table, DEVIATIONS V9), our old seed pod drains at SIGTERM (the sidecar
//! finishes and still accepts, the server keeps the tunnel for it: E14, V9). What vpn2's
//! pods lose is excused and printed as `switch excused:` lines ([`excuse`]): vpn2's surge
//! pod refuses until its Envoy listens, and vpn2's old pod cuts what is in flight at SIGTERM,
//! since Envoy closes its listeners and connections on shutdown unless told to drain first
//! (which Gardener does not). Our sidecar stands in for Envoy there with
//! `SIDECAR_DRAIN_TIMEOUT_MS=0`, Envoy's behaviour. Excused too, whoever's the pod: a
//! connection refused by the old pod's address after all its processes have exited (the
//! Service keeps it until the pod is gone; no process is left to act), and one refused by
//! our old pod after its sidecar stopped listening (seen in the pod's `/proc/net/tcp`) while
//! its server was still ending (a gap left). See
//! docs/operations.md, "In-place switch and rollback". Both tests run one at a time (a
//! lock); each takes about 20 s.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use conformance::gardener::checks::{self, Egress, KUBELET_PORT, SIDECAR_PORT, WEBHOOK_PORT};
use conformance::gardener::landscape::SEED_POD;
use conformance::gardener::landscape::{Landscape, NODE, WEBHOOK};
use conformance::gardener::pods::{
    seed_server_spec, sidecar_spec, vpn_shoot_init_env, vpn_shoot_spec, Binaries, Container,
    Mounts, SidecarMode, Spec, SERVER_READY, SIDECAR_READY,
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
    /// When its sidecar was seen listening (a seed pod; the start for a vpn-shoot pod).
    listening: Instant,
}

impl Pod<'_> {
    /// SIGTERM, the grace period, SIGKILL (the kubelet without `preStop`).
    fn terminate(&self, logs: &Path) -> Termination {
        let pids: Vec<u32> = self.procs.iter().map(Proc::pid).collect();
        step("terminate", logs, switch::terminate(self.ns, &pids, GRACE))
    }

    /// [`Pod::terminate`] for a seed pod, watching its sidecar's port meanwhile: when it got
    /// SIGTERM, how it ended, and the last instant a socket was seen listening on
    /// [`SIDECAR_PORT`] in it (its `/proc/net/tcp` tables read every millisecond, the instant
    /// taken before the read: the listener closed after it; at the latest the pod's end).
    fn terminate_watching_port(&self, logs: &Path) -> (Instant, Termination, Instant) {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                self.ns
                    .run_in(|| {
                        let mut seen = Instant::now();
                        loop {
                            let now = Instant::now();
                            if done.load(Ordering::Relaxed) || !listening(SIDECAR_PORT) {
                                return seen;
                            }
                            seen = now;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    })
                    .unwrap_or_else(|e| panic!("watch the seed pod's port: {e}"))
            });
            let sigterm = Instant::now();
            let ended = self.terminate(logs);
            done.store(true, Ordering::Relaxed);
            let closed = watcher
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (sigterm, ended, closed.min(sigterm + ended.took))
        })
    }
}

/// Whether a socket of the calling thread's network namespace listens on TCP `port` (IPv4
/// or IPv6). `/proc/net` is the process's (its first thread's) namespace, so the thread's
/// own tables are read.
fn listening(port: u16) -> bool {
    let local = format!(":{port:04X} ");
    ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"]
        .iter()
        .any(|table| {
            std::fs::read_to_string(table).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let mut fields = l.split_whitespace().skip(1);
                    let addr = fields.next().unwrap_or_default();
                    let state = fields.nth(1).unwrap_or_default();
                    format!("{addr} ").ends_with(&local) && state == "0A"
                })
            })
        })
}

/// A seed pod of `side` in `ns`: the init container, then `publish` (the kubelet reports
/// the pod's address, which puts it into the Service, no earlier than after the sync that
/// started the init container; `setup` ends within milliseconds, long before kube-proxy
/// could have learnt the address), then the containers one after the other without waiting
/// for the first to serve (the kubelet waits for no probe between containers); returns once
/// both serve (vpn2's readiness with no client connected: Ready). `surge`: the second pod's
/// status file and node address.
///
/// vpn2's init container only switches IPv6 on (`setup` in vpn2's Go code); ours also leaves
/// the table that holds SYNs to 9443 until the sidecar listens (`vpn_server::vpn2::START_TABLE`).
fn seed_pod<'ns>(
    side: Side,
    ns: &'ns Netns,
    bins: &Binaries,
    mounts: &Mounts,
    surge: bool,
    publish: &dyn Fn(),
) -> Pod<'ns> {
    let logs = mounts.dir();
    let suffix = if surge { "-surge" } else { "" };
    let status = logs.join(format!("status{suffix}"));
    match side {
        Side::Ours => {
            let init = Spec::new(
                &format!("setup{suffix}"),
                &bins.server,
                &["setup"],
                Vec::new(),
            );
            step("seed init container", logs, init.run(ns, logs));
        }
        Side::Vpn2 => {
            step(
                "vpn2's seed init container",
                logs,
                ns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"]),
            );
        }
    }
    publish();
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
            let server = step("vpn-seed-server", logs, spec.start(ns, logs));
            let mut sidecar = sidecar_spec(bins, mounts);
            sidecar.name = format!("sidecar{suffix}");
            let sidecar = step("sidecar", logs, sidecar.start(ns, logs));
            step(
                "vpn-seed-server serving",
                logs,
                server.wait_log(SERVER_READY, TUNNEL),
            );
            step(
                "sidecar listening",
                logs,
                sidecar.wait_log(SIDECAR_READY, TUNNEL),
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
    Pod {
        ns,
        procs,
        listening: Instant::now(),
    }
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
        listening: Instant::now(),
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
    let endpoints = |pods: &[std::net::Ipv4Addr]| {
        step("service", logs, switch::set_endpoints(&l.seed_router, pods));
    };
    let _ingress = step(
        "ingress",
        logs,
        switch::start_ingress_to_service(&bins, &l.ingress, logs),
    );
    let old_seed = seed_pod(from, &l.seed_pod, &bins, &mounts, false, &|| {
        endpoints(&[SEED_POD]);
    });
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
    let (steps, records, roll) = std::thread::scope(|s| {
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
        let new_seed = seed_pod(to, &surge_seed, &bins, &mounts, true, &|| {
            endpoints(&[SEED_POD, SURGE_SEED_POD]);
        });
        mark("2 vpn-seed-server old pod terminating");
        let (sigterm, ended, closed) = old_seed.terminate_watching_port(logs);
        let roll = SeedRoll {
            from,
            to,
            surge_listening: new_seed.listening,
            sigterm,
            closed,
            ended: sigterm + ended.took,
        };
        eprintln!(
            "{direction}: old seed pod's {SIDECAR_PORT} closed after {} ms, the pod ended after {ended:?}",
            ms_from(closed, sigterm)
        );
        assert!(
            !ended.killed,
            "{direction}: the old seed pod needed SIGKILL"
        );
        endpoints(&[SURGE_SEED_POD]);
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
        (steps, records, roll)
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
    judge(&direction, &steps, &records, &roll, logs);
}

/// Every failure must be one that no VPN process of ours could have avoided ([`excuse`]);
/// the excused ones are printed.
fn judge(
    direction: &str,
    steps: &[Step],
    records: &[switch::Record],
    roll: &SeedRoll,
    logs: &Path,
) {
    let mut excused: Vec<(&str, String)> = Vec::new();
    let mut unexplained: Vec<String> = Vec::new();
    for r in records {
        let Some(e) = &r.error else { continue };
        let step = steps
            .iter()
            .rev()
            .find(|s| s.start <= r.started)
            .map_or("?", |s| s.name.as_str());
        let line = format!(
            "{step}: {}: {e} (started {} ms from the old seed pod's SIGTERM, {} ms from its end; took {} ms)",
            r.target,
            ms_from(r.started, roll.sigterm),
            ms_from(r.started, roll.ended),
            r.took.as_millis()
        );
        match excuse(r, e, roll) {
            Some(why) => excused.push((why, line)),
            None => unexplained.push(line),
        }
    }
    for (why, line) in &excused {
        eprintln!("switch excused: {direction}, {why}: {line}");
    }
    assert!(
        unexplained.is_empty(),
        "{direction}: failed requests:\n{}\nlogs in {}",
        unexplained.join("\n"),
        logs.display()
    );
}

/// Milliseconds from `from` to `t`, negative if `t` is earlier.
fn ms_from(t: Instant, from: Instant) -> i128 {
    match t.checked_duration_since(from) {
        Some(d) => i128::try_from(d.as_millis()).unwrap_or(i128::MAX),
        None => -i128::try_from(from.duration_since(t).as_millis()).unwrap_or(i128::MAX),
    }
}

/// The seed pods' roll, as the failures are judged against it.
#[derive(Debug, Clone, Copy)]
struct SeedRoll {
    /// Whose the old seed pod was.
    from: Side,
    /// Whose the surge seed pod is.
    to: Side,
    /// When the surge pod's sidecar was seen listening.
    surge_listening: Instant,
    /// When the old pod got SIGTERM.
    sigterm: Instant,
    /// The last instant a socket was seen listening on the old pod's [`SIDECAR_PORT`] (it
    /// closed after).
    closed: Instant,
    /// When its last process had exited.
    ended: Instant,
}

/// Why request `r`, failed with `e`, is none of our processes' doing, if it is not:
///
/// - **vpn2's surge pod, before its Envoy listens**: refused, started before the surge pod's
///   sidecar listened, the surge pod being vpn2's (its init container holds nothing back;
///   Envoy refuses until it listens). Ours holds such SYNs (`START_TABLE`): not excused.
/// - **vpn2's old pod, ended by SIGTERM**: cut (no answer, a read or a write on a closed
///   connection) or refused while vpn2's old pod terminated:
///   Envoy closes its listeners and connections at SIGTERM (no drain: Gardener sets no
///   `preStop` and Envoy drains only when told to), and OpenVPN's tunnel ends with it. Ours
///   drains (the sidecar finishes its connections, the server keeps the tunnel for them):
///   not excused.
/// - **the Service after the old pod's processes**: refused, started after every process of
///   the old pod had exited and before the Service dropped it. With
///   `publishNotReadyAddresses` a pod stays an endpoint until it is gone, and the
///   kube-apiserver does not retry a refused connect; no process of the pod is left to do
///   anything (in a landscape this lasts until kube-proxy has synced, about a second).
/// - **our old pod after its sidecar stopped listening**: refused after no socket listened
///   on our old pod's 9443 any more (the sidecar, having finished every connection,
///   closed its listener) while its server was still ending (its own shutdown once the
///   sidecar's sockets are gone: tens of milliseconds here, longer under load). A pod that
///   has stopped serving stays an endpoint until its last process has exited; the pod's
///   processes cannot end at one instant. Printed, so the figures show it. A refusal while
///   the sidecar still listened would be ours (it cannot happen: the kernel takes the SYN),
///   and is not excused.
fn excuse(r: &switch::Record, e: &str, roll: &SeedRoll) -> Option<&'static str> {
    let refused = e.ends_with(REFUSED);
    // Cut: no answer, or the connection closed under a read or a write (`EPIPE`).
    let cut = e.ends_with(CUT)
        || e.contains("read: ")
        || e.contains("reset by peer")
        || e.contains("Broken pipe");
    if refused && roll.to == Side::Vpn2 && r.started < roll.surge_listening {
        return Some("vpn2's surge pod before its Envoy listens");
    }
    if refused && r.started >= roll.ended {
        return Some("refused by the old pod's address after its processes ended");
    }
    // Refused at once (the RST): it ended at the refusal, which came after the close.
    if refused && roll.from == Side::Ours && r.started + r.took >= roll.closed {
        return Some("our old pod after its sidecar stopped listening, its server still ending");
    }
    let during = r.started <= roll.ended && r.started + r.took >= roll.sigterm;
    if roll.from == Side::Vpn2 && during && (refused || cut) {
        return Some("vpn2's old pod, ended by SIGTERM");
    }
    None
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
