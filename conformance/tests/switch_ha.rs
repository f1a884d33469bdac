//! The in-place switch of an HA shoot from vpn2 to ours, replayed in the order an operator
//! can drive with image overrides alone (issue 30; research option (c)): vpn2's HA pods as
//! `conformance::gardener::vpn2_ha_pods` models them (upstream OpenVPN, bridges standing in
//! for the bonds, IPv6 next hops for the `ip6tnl` tunnels), then, in Gardener's order:
//!
//! 1. `vpn-server` overridden: the StatefulSet replaces `vpn-seed-server-1`, then, once that
//!    pod is Ready (`vpn-server readiness`, vpn2's rule), `vpn-seed-server-0`; a pod not Ready
//!    within [`READY_BOUND`] stalls the StatefulSet (it would wait for ever), and the replay
//!    goes on with the next override;
//! 2. `vpn-client` overridden: the kube-apiserver Deployment starts our pod beside vpn2's
//!    (maxSurge 100%; a kube-apiserver is Ready whatever its tunnels do, so it serves at once)
//!    and deletes vpn2's after `minReadySeconds` ([`MIN_READY`], 30 s scaled down); then the
//!    `vpn-shoot` StatefulSet replaces `vpn-shoot-1`, then, once it has a tunnel (the
//!    tunnel controller's readiness), `vpn-shoot-0`; a stalled `vpn-seed-server-0` rolls
//!    once `-1` turns Ready.
//!
//! The kube-apiserver sends a request to the kubelet (a new TCP connection, a line echoed)
//! every 100 ms from each pod that serves, each bounded by [`REQUEST`]. The outage is
//! expected and measured, not hidden: the test prints per step the requests started, failed
//! and the longest time without an answer (`switch HA figure:` lines), and asserts only that
//! vpn2's layout works before the switch and ours after it. A new pod reuses its
//! predecessor's namespace and address, vpn2's stand-ins removed
//! (`vpn2_ha_pods::remove_stand_ins`); our shoot pods run their two clients without the
//! tunnel controller (its readiness is read from the routes it reads).

// One scenario read top to bottom.
#![allow(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance::gardener::ha::{max_gap, routes_via, HaLandscape, KAPI, NODE, TCP_ECHO};
use conformance::gardener::ha_pods::{status_path, write_secrets, HaPods};
use conformance::gardener::load::{ms, tcp_request, INTERVAL};
use conformance::gardener::pods::{Binaries, Container};
use conformance::gardener::vpn2_ha_pods::{
    remove_stand_ins, start_kapi_pod, start_server, start_shoot_pod,
};
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::UpstreamOpenvpn;
use conformance::wait::wait_until_every;

const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--switchha",
    dual_stack_nodes: false,
};
/// How long anything may take to come up.
const UP: Duration = Duration::from_secs(60);
/// One request's bound.
const REQUEST: Duration = Duration::from_secs(5);
/// The kube-apiserver Deployment's `minReadySeconds` (30 s), scaled down.
const MIN_READY: Duration = Duration::from_secs(3);
/// How long a StatefulSet's new pod is given to turn Ready before the replay counts the
/// rollout as stalled (the status file is written every 15 s).
const READY_BOUND: Duration = Duration::from_secs(40);
/// At most this many requests in all.
const MAX_REQUESTS: usize = 6000;

/// One request: from which kube-apiserver pod, when it started and ended, whether it worked.
#[derive(Debug, Clone, Copy)]
struct Req {
    pod: usize,
    started: Instant,
    ended: Instant,
    ok: bool,
}

/// A server pod: vpn2's or ours.
enum Server<'ns> {
    Vpn2(#[allow(dead_code)] UpstreamOpenvpn<'ns>),
    Ours(#[allow(dead_code)] Container<'ns>),
}

/// `vpn-server readiness` of server `i` (the kubelet's exec probe).
fn server_ready(bins: &Binaries, root: &Path, ns: &Netns, i: usize) -> bool {
    ns.command(&bins.server.display().to_string())
        .arg("readiness")
        .env_clear()
        .env("OPENVPN_STATUS_PATH", status_path(root, i))
        .env("IS_HA", "true")
        .env("POD_NAME", format!("vpn-seed-server-{i}"))
        .env("HA_VPN_CLIENTS", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether our shoot pod in `ns` has a tunnel up (what its tunnel controller's `/readyz`
/// reads).
fn shoot_ready(ns: &Netns) -> bool {
    ["tun0", "tun1"]
        .iter()
        .any(|d| !routes_via(ns, d).is_empty())
}

/// Waits at most `bound` for `ready`, polled every 500 ms; when it was, from `since`.
fn gate(bound: Duration, since: Instant, mut ready: impl FnMut() -> bool) -> Option<Duration> {
    let deadline = Instant::now() + bound;
    loop {
        if ready() {
            return Some(since.elapsed());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The kube-apiserver's load: every [`INTERVAL`] a request from each pod in `kapis` whose
/// flag in `serving` is set, each on a thread of its own, until `stop`.
fn load(kapis: &[&Netns; 2], serving: &[AtomicBool; 2], stop: &AtomicBool, out: &Mutex<Vec<Req>>) {
    let target = SocketAddr::from((NODE, TCP_ECHO));
    std::thread::scope(|s| {
        let mut next = Instant::now();
        let mut count = 0usize;
        while !stop.load(Ordering::Relaxed) && count < MAX_REQUESTS {
            for (pod, ns) in kapis.iter().enumerate() {
                if !serving[pod].load(Ordering::Relaxed) {
                    continue;
                }
                count += 1;
                let n = count;
                s.spawn(move || {
                    let started = Instant::now();
                    let ok = ns
                        .run_in(|| tcp_request(target, REQUEST, n))
                        .is_ok_and(|r| r.is_ok());
                    let ended = Instant::now();
                    out.lock().expect("requests").push(Req {
                        pod,
                        started,
                        ended,
                        ok,
                    });
                });
            }
            next += INTERVAL;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
}

#[test]
fn ha_switch_vpn2_to_ours_with_image_overrides_alone() {
    require_lab(&["ip", "nft", "sysctl", "bridge", "ping"]);
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some("vpnt-6b")).expect("layout");
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::Builder::new()
        .prefix("vpnt-switchha-")
        .tempdir()
        .expect("tempdir");
    let root = dir.path();
    write_secrets(&pki, root).expect("secrets");
    l.start_echo().expect("echo");
    let _ingress = PODS
        .start_ingress(&bins, &l.ingress, root, UP)
        .expect("router listening");
    let mut servers: Vec<Option<Server<'_>>> = (0..2)
        .map(|i| {
            Some(Server::Vpn2(
                start_server(&l.server[i], &PODS, &bins, root, i).expect("vpn2 server"),
            ))
        })
        .collect();
    let mut vpn2_kapi =
        Some(start_kapi_pod(&l.kapi[0], &PODS, &bins, root, 0, 2).expect("vpn2 kube-apiserver"));
    let mut vpn2_shoots: Vec<Option<_>> = (0..2)
        .map(|j| {
            Some(
                start_shoot_pod(&l.shoot[j], &PODS, &bins, root, j, &[(KAPI[0], 0)])
                    .expect("vpn2 shoot pod"),
            )
        })
        .collect();
    wait_until_every(
        "vpn2's layout carries",
        UP,
        Duration::from_millis(200),
        || {
            l.kapi[0]
                .run_in(|| tcp_request(SocketAddr::from((NODE, TCP_ECHO)), REQUEST, 0))
                .is_ok_and(|r| r.is_ok())
        },
    );

    let serving = [AtomicBool::new(true), AtomicBool::new(false)];
    let stop = AtomicBool::new(false);
    let reqs = Mutex::new(Vec::<Req>::new());
    let mut steps: Vec<(String, Instant)> = Vec::new();
    let mut our_kapi: Vec<Container<'_>> = Vec::new();
    let mut our_shoots: Vec<Vec<Container<'_>>> = vec![Vec::new(), Vec::new()];
    let kapis = [&l.kapi[0], &l.kapi[1]];
    std::thread::scope(|s| {
        s.spawn(|| load(&kapis, &serving, &stop, &reqs));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut step = |name: &str| {
                eprintln!("switch HA: {name}");
                steps.push((name.to_owned(), Instant::now()));
            };
            step("vpn2 steady");
            std::thread::sleep(Duration::from_secs(3));

            // The servers: -1, then -0 once -1 is Ready.
            let mut replace_server = |i: usize, step: &mut dyn FnMut(&str)| -> bool {
                step(&format!("vpn-seed-server-{i} -> ours"));
                servers[i] = None;
                let _ = std::fs::remove_file(status_path(root, i));
                let t = Instant::now();
                servers[i] = Some(Server::Ours(
                    PODS.start_server(&bins, &l.server[i], root, i, UP)
                        .expect("our server"),
                ));
                let ready = gate(READY_BOUND, t, || {
                    server_ready(&bins, root, &l.server[i], i)
                });
                match ready {
                    Some(d) => eprintln!("switch HA: vpn-seed-server-{i} Ready after {}", ms(d)),
                    None => eprintln!(
                        "switch HA: vpn-seed-server-{i} not Ready within {}: the StatefulSet \
                         stalls",
                        ms(READY_BOUND)
                    ),
                }
                ready.is_some()
            };
            let mut server0_done = false;
            if replace_server(1, &mut step) {
                replace_server(0, &mut step);
                server0_done = true;
            }

            // vpn-client: the kube-apiserver Deployment (surge), then vpn-shoot -1, -0.
            step("kube-apiserver: our pod beside vpn2's");
            PODS.kapi_init_spec(&bins, 1)
                .run(&l.kapi[1], root)
                .expect("vpn-client-init");
            for i in 0..2 {
                our_kapi.push(
                    PODS.seed_client_spec(&bins, root, 1, i)
                        .start(&l.kapi[1], root)
                        .expect("vpn-client"),
                );
            }
            serving[1].store(true, Ordering::Relaxed);
            std::thread::sleep(MIN_READY);
            step("kube-apiserver: vpn2's pod deleted");
            serving[0].store(false, Ordering::Relaxed);
            vpn2_kapi = None;
            for j in [1, 0] {
                if j == 0 && !server0_done {
                    let t = Instant::now();
                    match gate(READY_BOUND, t, || {
                        server_ready(&bins, root, &l.server[1], 1)
                    }) {
                        Some(d) => eprintln!("switch HA: vpn-seed-server-1 Ready after {}", ms(d)),
                        None => eprintln!("switch HA: vpn-seed-server-1 still not Ready"),
                    }
                    replace_server(0, &mut step);
                    server0_done = true;
                }
                step(&format!("vpn-shoot-{j} -> ours"));
                vpn2_shoots[j] = None;
                remove_stand_ins(&l.shoot[j]).expect("a new pod's namespace");
                PODS.shoot_init_spec(&bins, j)
                    .run(&l.shoot[j], root)
                    .expect("vpn-shoot-init");
                let t = Instant::now();
                for i in 0..2 {
                    our_shoots[j].push(
                        PODS.shoot_client_spec(&bins, root, j, i)
                            .start(&l.shoot[j], root)
                            .expect("vpn-shoot"),
                    );
                }
                match gate(READY_BOUND, t, || shoot_ready(&l.shoot[j])) {
                    Some(d) => eprintln!("switch HA: vpn-shoot-{j} Ready after {}", ms(d)),
                    None => eprintln!("switch HA: vpn-shoot-{j} not Ready: the StatefulSet stalls"),
                }
            }
            step("ours steady");
            std::thread::sleep(Duration::from_secs(5));
            steps.push(("end".to_owned(), Instant::now()));
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    });
    drop(vpn2_kapi);

    let reqs = reqs.into_inner().expect("requests");
    let answers: Vec<Instant> = reqs.iter().filter(|r| r.ok).map(|r| r.ended).collect();
    let mut failed_at_end = 0;
    for w in steps.windows(2) {
        let ((name, from), (_, to)) = (&w[0], &w[1]);
        let mine: Vec<&Req> = reqs
            .iter()
            .filter(|r| r.started >= *from && r.started < *to)
            .collect();
        let failed = mine.iter().filter(|r| !r.ok).count();
        let per_pod: Vec<String> = [(0, "vpn2's"), (1, "ours")]
            .into_iter()
            .filter_map(|(p, whose)| {
                let of: Vec<&&Req> = mine.iter().filter(|r| r.pod == p).collect();
                (!of.is_empty()).then(|| {
                    let f = of.iter().filter(|r| !r.ok).count();
                    let longest = of
                        .iter()
                        .map(|r| r.ended - r.started)
                        .max()
                        .unwrap_or_default();
                    format!(
                        "{whose} kube-apiserver: {} started, {f} failed, longest {}",
                        of.len(),
                        ms(longest)
                    )
                })
            })
            .collect();
        eprintln!(
            "switch HA figure: {name} | {} | {} started, {failed} failed, longest without an \
             answer {} | {}",
            ms(*to - *from),
            mine.len(),
            ms(max_gap(&answers, *from, *to)),
            per_pod.join(" | "),
        );
        if name == "vpn2 steady" || name == "ours steady" {
            failed_at_end += failed;
            assert!(!mine.is_empty(), "{name}: no request");
        }
    }
    assert_eq!(
        failed_at_end, 0,
        "requests failed with vpn2's or our layout at rest"
    );
}
