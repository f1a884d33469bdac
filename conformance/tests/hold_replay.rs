//! Issue 29's replay of the request holding on the non-HA paths: a kube-apiserver's load
//! through Gardener's non-HA landscape (`gardener::landscape`, our binaries started as
//! Gardener starts the vpn2 images, `gardener::pods`) while the VPN's processes are killed,
//! terminated and restarted, the shoot's uplink is cut and the ingress restarts.
//!
//! Two landscapes side by side, one per path of the kube-apiserver's requests:
//!
//! | path | seed pod |
//! |---|---|
//! | `in-process` | `vpn-server` with the CONNECT sidecar in its process (`VPN_SERVER_SIDECAR=true`) |
//! | `envoy` | `vpn-server`, and `envoy --concurrency 2 -c envoy.yaml` (our binary under Envoy's name, uid 65532, gid 31415) with Gardener's envoy.yaml (`sidecar/fixtures/gardener-envoy.yaml`) |
//!
//! The load, each every 100 ms, each bounded by 25 s:
//! * **exec**: the kube-apiserver pod opens TLS to the sidecar, `CONNECT` to the kubelet
//!   (`10.250.0.5:10250`), a line there and back;
//! * **webhook**: a fresh TCP connection from the seed pod through the server's tun path to
//!   the webhook pod (`244.0.20.20:9443`, its address as vpn2 maps it in the seed), a line
//!   there and back.
//!
//! The tunnel's own downtime: `ping -i 0.02` from the seed pod to the shoot node through the
//! tunnel (`242.0.0.5`) throughout; an event's downtime runs from its start to the first echo
//! reply whose request was sent after the event's action (the process gone, the link down).
//!
//! Phases, each against the same load:
//! 1. **held** (both bounds Gardener's 20 s): server SIGKILL and restart, server SIGTERM and
//!    restart, client SIGKILL and restart, the vpn-shoot pod's uplink (its veth at the shoot
//!    router) down for 5 s, the ingress router SIGTERM and restart. Asserted per event: no
//!    request fails (see below for the one exception), the longest request is within 1 s of
//!    the tunnel's downtime.
//! 2. **short bound** (1.5 s: `--hold-timeout-ms` and the sidecar's, in Envoy mode the
//!    bootstrap's `connect_timeout`), the client gone for 4 s: the requests that start while
//!    it is gone and cannot see it back within their bound fail with 503 (exec; in Envoy mode
//!    504 when its `connect_timeout` ends first) or `EHOSTUNREACH` (webhook), and not before
//!    the bound: for the in-process sidecar 1.5 s from the request's start; for the server's
//!    tun path, and so for Envoy mode's CONNECTs, 1.5 s from the client's leaving (the server
//!    holds a packet only while its client left less than the bound ago; Envoy mode, started
//!    with Gardener's empty environment, knows no shoot networks and does not dial again on
//!    "no route", so a CONNECT started later than that fails at once).
//! 3. **old** (holds off: `VPN_SERVER_HOLD_TIMEOUT_MS=0`, `SIDECAR_HOLD_TIMEOUT_MS=0`; Envoy mode
//!    has no switch of its own, its hold is the `connect_timeout`): the events of phase 1
//!    again; some requests fail, each within 2 s of its start (asserted, printed).
//!
//! Captures on every non-tunnel interface of the seed pod and the kube-apiserver pod (`eth0`,
//! `lo`) throughout: no packet to a shoot network (the mapped ranges, the shoot's service,
//! node and IPv6 networks, the shoot pods' addresses used here) leaves there in any state.
//!
//! The exception in phase 1: with the sidecar in the server's process, a server that is
//! killed takes the CONNECTs its process had accepted with it: reset in their TLS handshake,
//! a broken pipe writing the CONNECT, closed without an answer, or cut in their exchange. Those, and only those, are allowed
//! (printed as `accepted by the killed process`), for requests started between the kill and
//! the restarted server's listener. A CONNECT refused while no process listens is not
//! excused: the sidecar's restart guard (`sidecar::RESTART_TABLE`) drops its SYN, the
//! kube-apiserver's kernel sends it again after 1 s and the restarted process takes it. A
//! SIGTERM excuses nothing (the sidecar drains).

#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use conformance::gardener::capture::Capture;
use conformance::gardener::checks::{self, Egress, KUBELET_PORT, SIDECAR_PORT, WEBHOOK_PORT};
use conformance::gardener::landscape::{Landscape, NODE, SEED_POD, WEBHOOK};
use conformance::gardener::load::{
    self, exchange, held_problems, ms, old_problems, report, tcp_request, to_shoot_filter, Event,
    InFlight, Kind, Pinger, Rec, AWAY, REQUEST_BOUND, SHORT, SLACK,
};
use conformance::gardener::pods::{
    run_init_containers, seed_server_spec, start_ingress, start_until, vpn_shoot_spec, Binaries,
    Container, Mounts, SidecarMode, Spec, SERVER_READY, SIDECAR_IDS,
};
use conformance::gardener::switch::serve_echo;
use conformance::netns::Netns;
use conformance::require_lab;

/// Gardener's envoy.yaml.
const ENVOY_YAML: &str = include_str!("../../sidecar/fixtures/gardener-envoy.yaml");
/// Namespaces of this test.
const PREFIX: &str = "vpnt-rp";
/// At most this many requests per path and phase.
const MAX_REQUESTS: usize = 3000;
/// How long the uplink is cut.
const CUT: Duration = Duration::from_secs(5);
/// How long the tunnel may take to come back after an event.
const BACK: Duration = Duration::from_secs(30);
/// Quiet time after the tunnel is back, before the next event.
const SETTLE: Duration = Duration::from_millis(1500);
/// The webhook pod as vpn2's mapping shows it in the seed (`100.96.0.0/11` → `244.0.0.0/11`).
const WEBHOOK_MAPPED: Ipv4Addr = Ipv4Addr::new(244, 0, 20, 20);
/// The shoot node as the seed sees it (`10.250.0.0/16` → `242.0.0.0/16`): the ping's target.
const NODE_MAPPED: Ipv4Addr = Ipv4Addr::new(242, 0, 0, 5);

/// Packets to the shoot that must never leave the seed pod or the kube-apiserver pod but by
/// the tunnel; the seed's own pods (`100.96.0-2.x`, which overlap the shoot's pod network)
/// are where the sidecar's answers, the ingress's connections and the router legitimately go.
const TO_SHOOT_NETS: [&str; 7] = [
    "242.0.0.0/7",
    "244.0.0.0/8",
    "100.64.0.0/13",
    "10.250.0.0/16",
    "fd00:96::/48",
    "fd00:64::/112",
    "fd00:250::/48",
];
/// The shoot pods' addresses used here (in the seed's own pod range).
const TO_SHOOT_HOSTS: [&str; 2] = ["100.96.20.20", "100.96.10.10"];

/// What one path's run saw.
#[derive(Debug)]
struct Run {
    path: &'static str,
    phases: Vec<(&'static str, Vec<Event>, Vec<Rec>)>,
    leaked: Vec<String>,
    /// The containers' logs, kept when the test fails.
    logs: tempfile::TempDir,
}

/// The kube-apiserver's load until `stop`: both kinds every [`load::INTERVAL`].
fn run_load(l: &Landscape, egress: &Egress, stop: &AtomicBool, inflight: &InFlight) -> Vec<Rec> {
    load::load(
        stop,
        inflight,
        MAX_REQUESTS,
        Duration::from_secs(200),
        |kind, n| {
            match kind {
                Kind::Exec => l.kube_apiserver.run_in(|| exec(egress, n)),
                Kind::Webhook => l.seed_pod.run_in(|| webhook(n)),
            }
            .map_err(|e| e.to_string())
            .and_then(|r| r)
        },
    )
}

fn exec(egress: &Egress, n: usize) -> Result<(), String> {
    let target = SocketAddr::from((NODE.0, KUBELET_PORT));
    let mut s = checks::connect(egress, target, REQUEST_BOUND).map_err(|e| e.to_string())?;
    let _ = s.get_ref().set_read_timeout(Some(REQUEST_BOUND));
    exchange(&mut s, n)
}

fn webhook(n: usize) -> Result<(), String> {
    tcp_request(
        SocketAddr::from((WEBHOOK_MAPPED, WEBHOOK_PORT)),
        REQUEST_BOUND,
        n,
    )
}

/// The seed pod's sidecar (in the server's process, or Envoy mode beside it).
struct Seed<'ns> {
    server: Container<'ns>,
    envoy: Option<Container<'ns>>,
}

/// Envoy mode's container: `envoy` (a link to our binary) with Gardener's envoy.yaml, its
/// certificates at the seed pod's mounts and `connect_timeout` as given.
fn envoy_spec(bins: &Binaries, mounts: &Mounts, connect_timeout: &str) -> Spec {
    let dir = mounts.dir().join("envoy");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("envoy");
    if !link.exists() {
        symlink(&bins.server, &link).unwrap();
    }
    let certs = mounts.seed_secrets().join("vpn-server");
    let text = ENVOY_YAML
        .replace("/srv/secrets/envoy-proxy", &certs.display().to_string())
        .replace(
            "connect_timeout: 20s",
            &format!("connect_timeout: {connect_timeout}"),
        );
    assert!(text.contains(&format!("connect_timeout: {connect_timeout}")));
    let config = dir.join(format!("envoy-{connect_timeout}.yaml"));
    std::fs::write(&config, text).unwrap();
    Spec {
        ids: Some(SIDECAR_IDS),
        ..Spec::new(
            "envoy",
            &link,
            &["--concurrency", "2", "-c", &config.display().to_string()],
            Vec::new(),
        )
    }
}

/// Waits until the seed pod's 9443 accepts; fails if `c` exits first.
fn wait_listening(ns: &Netns, c: &Container<'_>) -> Instant {
    let deadline = Instant::now() + BACK;
    loop {
        let up = ns
            .run_in(|| {
                TcpStream::connect_timeout(
                    &SocketAddr::from((SEED_POD, SIDECAR_PORT)),
                    Duration::from_millis(200),
                )
                .is_ok()
            })
            .unwrap();
        if up {
            return Instant::now();
        }
        assert!(
            ns.try_wait(c.pid()).is_none(),
            "the sidecar exited:\n{}",
            c.log()
        );
        assert!(Instant::now() < deadline, "the sidecar never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The server's spec with `hold` for both bounds (the tun path's and the in-process
/// sidecar's).
fn server_spec(bins: &Binaries, mounts: &Mounts, mode: SidecarMode, hold: Duration) -> Spec {
    let mut spec = seed_server_spec(bins, mounts, mode);
    let ms = hold.as_millis().to_string();
    spec.env
        .push(("VPN_SERVER_HOLD_TIMEOUT_MS".into(), ms.clone()));
    spec.env.push(("SIDECAR_HOLD_TIMEOUT_MS".into(), ms));
    spec
}

struct Ctx<'a, 'ns> {
    l: &'ns Landscape,
    bins: &'a Binaries,
    mounts: &'a Mounts,
    logs: &'a Path,
    mode: SidecarMode,
    pinger: &'a Pinger,
    inflight: &'a InFlight,
    seed: Seed<'ns>,
    client: Container<'ns>,
    ingress: Container<'ns>,
}

impl<'ns> Ctx<'_, 'ns> {
    /// Replaces the seed pod's containers with ones holding for `hold`.
    fn reconfigure(&mut self, hold: Duration) {
        if let Some(envoy) = &self.seed.envoy {
            envoy.signal("TERM").unwrap();
        }
        self.seed.server.signal("TERM").unwrap();
        let spec = server_spec(self.bins, self.mounts, self.mode, hold);
        self.seed.server = start_until(&spec, &self.l.seed_pod, self.logs, SERVER_READY).unwrap();
        if self.seed.envoy.is_some() {
            // Envoy mode's hold is its `connect_timeout`: no switch turns it off alone.
            let timeout = if hold.is_zero() {
                "20s".to_owned()
            } else {
                format!("{}s", hold.as_secs_f64())
            };
            let spec = envoy_spec(self.bins, self.mounts, &timeout);
            let c = spec.start(&self.l.seed_pod, self.logs).unwrap();
            wait_listening(&self.l.seed_pod, &c);
            self.seed.envoy = Some(c);
        } else {
            wait_listening(&self.l.seed_pod, &self.seed.server);
        }
        let now = Instant::now();
        self.pinger.wait_back(now, "reconfigured");
        std::thread::sleep(SETTLE);
    }

    /// One event: `action` brings the tunnel down (and may restart what it stopped); then the
    /// tunnel's return and a quiet moment.
    fn event(&mut self, name: &str, action: impl FnOnce(&mut Self) -> Instant) -> Event {
        self.inflight.quiesce(REQUEST_BOUND + SLACK);
        let begin = Instant::now();
        let down = action(self);
        let listener_back = (self.mode == SidecarMode::InProcess && name.starts_with("server"))
            .then(|| wait_listening(&self.l.seed_pod, &self.seed.server));
        let back = self.pinger.wait_back(down, name);
        std::thread::sleep(SETTLE);
        Event {
            name: name.to_owned(),
            begin,
            down,
            back,
            listener_back,
            gap: Duration::ZERO,
        }
    }

    /// The five events of phases 1 and 3.
    fn events(&mut self) -> Vec<Event> {
        let logs = self.logs;
        let mut out = Vec::new();
        for (name, signal) in [("server SIGKILL", "KILL"), ("server SIGTERM", "TERM")] {
            out.push(self.event(name, |c| {
                c.seed.server.signal(signal).unwrap();
                let down = Instant::now();
                c.seed.server.restart(logs).unwrap();
                down
            }));
        }
        out.push(self.event("client SIGKILL", |c| {
            c.client.signal("KILL").unwrap();
            let down = Instant::now();
            c.client.restart(logs).unwrap();
            down
        }));
        out.push(self.event("uplink cut 5 s", |c| {
            let router = &c.l.shoot_router;
            router
                .run(["ip", "link", "set", "to-vpn-shoot", "down"])
                .unwrap();
            let down = Instant::now();
            std::thread::sleep(CUT);
            router
                .run(["ip", "link", "set", "to-vpn-shoot", "up"])
                .unwrap();
            down
        }));
        out.push(self.event("ingress router restart", |c| {
            c.ingress.signal("TERM").unwrap();
            let down = Instant::now();
            c.ingress.restart(logs).unwrap();
            down
        }));
        out
    }
}

/// Runs the three phases on one landscape.
fn run_path(path: &'static str, mode: SidecarMode, bins: &Binaries) -> Run {
    let l = Landscape::build_with_prefix(PREFIX).expect("landscape");
    let mounts = Mounts::generate().expect("mounts");
    let egress = Egress::new(&mounts.pki.bundle, &mounts.pki.client).expect("egress");
    let logs_dir = tempfile::Builder::new()
        .prefix("vpnt-rp-logs-")
        .tempdir()
        .unwrap();
    let logs = logs_dir.path();
    serve_echo(&[
        (&l.node, SocketAddr::from((NODE.0, KUBELET_PORT))),
        (&l.webhook, SocketAddr::from((WEBHOOK.0, WEBHOOK_PORT))),
    ])
    .unwrap();
    run_init_containers(bins, &l.seed_pod, &l.vpn_shoot, logs).unwrap();
    let ingress = start_ingress(bins, &l.ingress, logs).unwrap();
    let server = start_until(
        &server_spec(bins, &mounts, mode, Duration::from_secs(20)),
        &l.seed_pod,
        logs,
        SERVER_READY,
    )
    .unwrap();
    let envoy = (mode == SidecarMode::Standalone).then(|| {
        let c = envoy_spec(bins, &mounts, "20s")
            .start(&l.seed_pod, logs)
            .unwrap();
        wait_listening(&l.seed_pod, &c);
        c
    });
    if envoy.is_none() {
        wait_listening(&l.seed_pod, &server);
    }
    let client = vpn_shoot_spec(bins, &mounts)
        .start(&l.vpn_shoot, logs)
        .unwrap();
    checks::wait_tunnel(&l, BACK).expect("tunnel up");
    let pinger = Pinger::start(&l.seed_pod, logs, NODE_MAPPED, BACK).expect("ping");
    pinger.wait_back(Instant::now(), "first");

    let to_shoot = to_shoot_filter(&TO_SHOOT_NETS, &TO_SHOOT_HOSTS);
    let captures: Vec<(String, Capture<'_>)> = [
        ("seed pod", &l.seed_pod, "eth0"),
        ("seed pod", &l.seed_pod, "lo"),
        ("kube-apiserver", &l.kube_apiserver, "eth0"),
        ("kube-apiserver", &l.kube_apiserver, "lo"),
    ]
    .into_iter()
    .map(|(pod, ns, iface)| {
        (
            format!("{pod} {iface}"),
            Capture::start(ns, iface, &to_shoot).expect("capture"),
        )
    })
    .collect();

    // With RH_TCPDUMP set, the webhook's and the kubelet's TCP, and ICMP, captured on every
    // interface of the seed pod (the tunnel's too), the vpn-shoot pod and the webhook pod,
    // kept with the logs on a failure (hunting faults seen once in about ten runs).
    let mut dumps = Vec::new();
    if std::env::var_os("RH_TCPDUMP").is_some() {
        for (name, ns) in [
            ("seed-pod", &l.seed_pod),
            ("vpn-shoot", &l.vpn_shoot),
            ("webhook", &l.webhook),
        ] {
            let mut cmd = ns.command("tcpdump");
            cmd.args(["-ni", "any", "-U", "-c", "400000", "-w"])
                .arg(logs.join(format!("{name}.pcap")))
                .arg(format!(
                    "tcp port {WEBHOOK_PORT} or tcp port {KUBELET_PORT} or icmp or icmp6"
                ))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            dumps.push(ns.spawn(&mut cmd).expect("tcpdump"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    let inflight = InFlight::default();
    let mut ctx = Ctx {
        l: &l,
        bins,
        mounts: &mounts,
        logs,
        mode,
        pinger: &pinger,
        inflight: &inflight,
        seed: Seed { server, envoy },
        client,
        ingress,
    };
    let mut phases = Vec::new();
    for phase in ["held", "short bound", "old"] {
        match phase {
            "short bound" => ctx.reconfigure(SHORT),
            "old" => ctx.reconfigure(Duration::ZERO),
            _ => {}
        }
        let stop = AtomicBool::new(false);
        let (events, recs) = std::thread::scope(|s| {
            let loader = s.spawn(|| run_load(&l, &egress, &stop, &inflight));
            std::thread::sleep(Duration::from_secs(1));
            let events = if phase == "short bound" {
                let logs = ctx.logs;
                vec![ctx.event("client away 4 s", |c| {
                    c.client.signal("KILL").unwrap();
                    let down = Instant::now();
                    std::thread::sleep(AWAY);
                    c.client.restart(logs).unwrap();
                    down
                })]
            } else {
                ctx.events()
            };
            stop.store(true, Ordering::Relaxed);
            (events, loader.join().unwrap())
        });
        phases.push((phase, events, recs));
    }
    let leaked = load::leaked(captures);
    drop(ctx);
    drop(dumps);
    Run {
        path,
        phases,
        leaked,
        logs: logs_dir,
    }
}

#[test]
fn kube_apiserver_requests_wait_for_the_tunnel_through_every_non_ha_event() {
    require_lab(&["nft", "tcpdump", "setpriv", "ping", "stdbuf"]);
    let started = Instant::now();
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let runs: Vec<Run> = std::thread::scope(|s| {
        let a = s.spawn(|| run_path("in-process", SidecarMode::InProcess, &bins));
        let b = s.spawn(|| run_path("envoy", SidecarMode::Standalone, &bins));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    eprintln!("hold replay took {:?}", started.elapsed());

    let mut problems = Vec::new();
    for run in &runs {
        for (phase, events, recs) in &run.phases {
            let failures = report(run.path, phase, events, recs);
            match *phase {
                "held" => {
                    problems.extend(held_problems(run.path, events, recs, |e, r| {
                        let err = r.error.as_deref()?;
                        // The in-process sidecar went with its killed server: a CONNECT the
                        // dying process had accepted is reset or closed. A refused one is
                        // not excused (the restart guard holds its SYN for the next
                        // process), nor anything in a SIGTERM (the sidecar drains).
                        let in_killed = e.name == "server SIGKILL"
                            && e.listener_back.is_some_and(|b| r.started < b)
                            && r.kind == Kind::Exec
                            && !err.contains("Connection refused")
                            && (err.contains("sidecar 100.96.0.10:9443: TLS handshake")
                                || err.contains("sidecar 100.96.0.10:9443: write CONNECT")
                                || err.contains("closed without an answer")
                                || err.starts_with("read: ")
                                || err.starts_with("write: "));
                        in_killed.then_some("accepted by the killed process")
                    }));
                }
                "short bound" => {
                    let e = &events[0];
                    // Started while the client was away and unable to see it back in time.
                    let doomed: Vec<&Rec> = recs
                        .iter()
                        .filter(|r| {
                            r.started >= e.down + Duration::from_millis(100)
                                && r.started + SHORT + Duration::from_millis(300) < e.back
                        })
                        .collect();
                    assert!(
                        doomed.len() >= 10,
                        "{}: too few requests in the gap",
                        run.path
                    );
                    for r in doomed {
                        let end = r.started + r.took;
                        let clear = match (&r.kind, &r.error) {
                            // Envoy mode: 504 when its `connect_timeout` ends while the
                            // server still holds the SYN (Envoy's own answer there).
                            (Kind::Exec, Some(err)) => {
                                err.contains("status 503")
                                    || (run.path == "envoy" && err.contains("status 504"))
                            }
                            // The server's unreachable answer; on a loaded host the kernel
                            // has also ended such a connect with neither a connection nor an
                            // error (std: "no error set after POLLHUP"; seen once in 9 runs,
                            // 7 ms into a connect made after the server's bound).
                            (Kind::Webhook, Some(err)) => {
                                err.contains("EHOSTUNREACH")
                                    || err.contains("refused")
                                    || err.contains("no error set after POLLHUP")
                            }
                            _ => false,
                        };
                        let early = match (r.kind, run.path) {
                            // The in-process sidecar's bound runs from the request's start.
                            (Kind::Exec, "in-process") => {
                                r.took + Duration::from_millis(50) < SHORT
                            }
                            // The server's from the client's leaving; Envoy mode (no shoot
                            // networks in its empty environment) waits only as the server
                            // holds its SYN, or until its own `connect_timeout`. The client
                            // leaves between the kill (`begin`) and the test seeing it gone
                            // (`down`), which a loaded host can tell tens of ms late.
                            _ => end + Duration::from_millis(50) < e.begin + SHORT,
                        };
                        if !clear || early {
                            problems.push(format!(
                                "{} short bound: a {:?} request started {} after the client left ended after {} with {:?}",
                                run.path,
                                r.kind,
                                ms(r.started - e.down),
                                ms(r.took),
                                r.error
                            ));
                        }
                    }
                }
                _ => problems.extend(old_problems(run.path, &failures)),
            }
        }
        for p in &run.leaked {
            problems.push(format!("{}: left by a non-tunnel interface: {p}", run.path));
        }
    }
    if !problems.is_empty() {
        for run in runs {
            eprintln!("{} logs kept in {}", run.path, run.logs.keep().display());
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
