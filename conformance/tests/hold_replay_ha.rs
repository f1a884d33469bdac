//! Issue 29's replay of the request holding on the HA path: a kube-apiserver's load through
//! Gardener's HA landscape (`gardener::ha`, our binaries started as Gardener starts the HA
//! containers, `gardener::ha_pods`) while servers and a shoot pod are killed and restarted.
//!
//! The load goes the kube-apiserver pod's direct way, its HA clients' tunnels (`tun0` to
//! server 0 at metric 100, `tun1` to server 1 at 101): from replica 0, each every 100 ms, each
//! bounded by 25 s:
//! * **exec**: a fresh TCP connection to the kubelet (`10.250.0.5:10250`), a line there and
//!   back;
//! * **webhook**: a fresh TCP connection to a webhook pod in the shoot (`100.96.20.20:9443`),
//!   a line there and back.
//!
//! The tunnel's own downtime: `ping -i 0.02` from replica 0 to the shoot node throughout; an
//! event's downtime is from its start to the first echo reply sent after its action, or the
//! longest time without a reply until the event has settled, whichever is longer (a path that
//! moves away and back can stall on the way back).
//!
//! The events, each waited out until both replicas route through `tun0` and `tun1` again
//! (server 0 carrying, after the clients' 10 s hold-down) and both shoot pods have both
//! tunnels:
//! 1. server 0 (the one carrying the traffic) SIGKILLed and restarted;
//! 2. both servers SIGKILLed and restarted;
//! 3. shoot pod 0's clients (`vpn-shoot-s0`, `-s1`) SIGKILLed and restarted;
//! 4. both shoot pods' clients SIGKILLed and restarted, three times (no shoot connection at
//!    either server until they are back: what the servers' hold is for).
//!
//! Phases, each against the same load:
//! * **held** (the servers' `VPN_SERVER_HOLD_TIMEOUT_MS=20000`, Gardener's 20 s): asserted per
//!   event, no request fails and the longest request is within 1 s of the tunnel's downtime.
//!   The exceptions, printed: a request in flight through shoot pod 0 when its clients die
//!   loses its connection with the pod's NAT state (as in vpn2, `docs/ha.md` §4); a request
//!   in flight as a process was killed (started before the action was done, its own event's or
//!   the next one's) whose SYN went into the process as it died waits for the kernel's
//!   retransmission (1 s) on top. And in events 2 and 4 a request started while
//!   the tunnel was down ends within 300 ms of its return (what waited goes out with it), not
//!   at the kernel's retransmission: before the shoot client put its routes in ahead of the
//!   first packets through a new tunnel, the answers to the SYNs the servers released left the
//!   shoot pod by `eth0`.
//! * **short bound** (1.5 s), both shoot pods' clients gone for 4 s: the requests that start
//!   while no shoot pod is connected and cannot see one back within the bound fail with
//!   `EHOSTUNREACH` (the servers' ICMP host unreachable), and not before the bound, which runs
//!   from the last shoot connection's leaving (asserted).
//! * **old** (`VPN_SERVER_HOLD_TIMEOUT_MS=0`: the HA server holds nothing while it has no
//!   shoot connection): the same events; some requests fail (asserted, printed), each at once.
//!
//! Captures on every non-tunnel interface (`eth0`, `lo`) of both kube-apiserver pods and both
//! server pods throughout, the servers' restarts between the phases included: no packet to a
//! shoot network (service, pod, node networks, IPv4 and IPv6) leaves there in any state.

#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use conformance::gardener::capture::Capture;
use conformance::gardener::ha::{
    routes_via, HaLandscape, NODE, SHOOT_NODE_NETWORK, SHOOT_NODE_NETWORK_V6, SHOOT_POD_NETWORKS,
    SHOOT_SERVICE_NETWORKS,
};
use conformance::gardener::ha_pods::{write_secrets, HaPods};
use conformance::gardener::load::{
    self, held_problems, old_problems, report, tcp_request, to_shoot_filter, window, Event,
    InFlight, Kind, Pinger, Rec, AWAY, REQUEST_BOUND, SHORT, SLACK,
};
use conformance::gardener::pods::{Binaries, Container};
use conformance::gardener::switch::serve_echo;
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until;

/// Namespaces of this test.
const PREFIX: &str = "vpnt-rh";
const PODS: HaPods = HaPods {
    shoot_ns: "shoot--lab--rh",
    dual_stack_nodes: true,
};
/// The kubelet's port on the shoot node.
const KUBELET_PORT: u16 = 10250;
/// The webhook pod in the shoot's pod network, and its port.
const WEBHOOK: Ipv4Addr = Ipv4Addr::new(100, 96, 20, 20);
const WEBHOOK_PORT: u16 = 9443;
/// At most this many requests per phase.
const MAX_REQUESTS: usize = 2000;
/// The held phase's bound (Gardener's 20 s).
const HOLD: Duration = Duration::from_secs(20);
/// How long anything may take to come up or back (the clients' back-off and 10 s hold-down
/// included).
const UP: Duration = Duration::from_secs(40);
/// The kernel's first SYN retransmission: what a request whose SYN died with a process waits
/// beyond the tunnel's downtime.
const RETRANSMIT: Duration = Duration::from_secs(1);
/// How often both shoot pods are killed in a phase.
const SHOOT_ROUNDS: usize = 3;
/// How long after the tunnel's return a request held for the shoot may end.
const RELEASED: Duration = Duration::from_millis(300);
/// Quiet time after an event settled, before the next.
const SETTLE: Duration = Duration::from_millis(1500);

/// The webhook pod: a namespace behind the shoot router at [`WEBHOOK`].
fn webhook_pod(l: &HaLandscape) -> Netns {
    let pod = Netns::with_prefix(PREFIX).expect("webhook pod");
    Netns::veth_pair(&l.shoot_router, "to-webhook", &pod, "eth0").expect("webhook veth");
    let gw = Ipv4Addr::new(100, 96, 20, 1);
    l.shoot_router
        .run([
            "ip",
            "addr",
            "add",
            &format!("{gw}/24"),
            "dev",
            "to-webhook",
        ])
        .expect("webhook router address");
    pod.run(["ip", "addr", "add", &format!("{WEBHOOK}/24"), "dev", "eth0"])
        .expect("webhook address");
    pod.run(["ip", "route", "add", "default", "via", &gw.to_string()])
        .expect("webhook route");
    pod
}

/// Both replicas route the shoot through `tun0` (metric 100) and `tun1` (101), and both
/// shoot pods have both tunnels: the layout at rest.
fn at_rest(l: &HaLandscape) -> bool {
    let routed = |ns: &Netns, dev: &str, metric: &str, net: &str| {
        let r = routes_via(ns, dev);
        r.contains(metric) && r.contains(net)
    };
    l.kapi.iter().all(|ns| {
        routed(ns, "tun0", "metric 100", SHOOT_SERVICE_NETWORKS)
            && routed(ns, "tun1", "metric 101", SHOOT_SERVICE_NETWORKS)
    }) && l.shoot.iter().all(|ns| {
        routes_via(ns, "tun0").contains("metric 100")
            && routes_via(ns, "tun1").contains("metric 101")
    })
}

/// The servers' containers with `hold` as their bound.
fn start_servers<'ns>(
    bins: &Binaries,
    l: &'ns HaLandscape,
    root: &Path,
    hold: Duration,
) -> Vec<Container<'ns>> {
    (0..2)
        .map(|i| {
            let mut spec = PODS.server_spec(bins, root, i);
            spec.env.push((
                "VPN_SERVER_HOLD_TIMEOUT_MS".into(),
                hold.as_millis().to_string(),
            ));
            let c = spec.start(&l.server[i], root).unwrap();
            c.wait_log("Initialization Sequence Completed", UP).unwrap();
            c
        })
        .collect()
}

struct Ctx<'a, 'ns> {
    l: &'ns HaLandscape,
    bins: &'a Binaries,
    root: &'a Path,
    pinger: &'a Pinger,
    inflight: &'a InFlight,
    servers: Vec<Container<'ns>>,
    shoot_clients: Vec<Vec<Container<'ns>>>,
}

impl Ctx<'_, '_> {
    /// One event: `action` takes a path down (and restarts what it stopped), returning when
    /// it was down; then the tunnel's return, the layout at rest again and a quiet moment.
    fn event(&mut self, name: &str, action: impl FnOnce(&mut Self) -> Instant) -> Event {
        self.inflight.quiesce(REQUEST_BOUND + SLACK);
        let begin = Instant::now();
        let down = action(self);
        let back = self.pinger.wait_back(down, name);
        wait_until(&format!("{name}: at rest again"), UP, || at_rest(self.l));
        std::thread::sleep(SETTLE);
        let gap = self.pinger.longest_gap(begin, Instant::now());
        Event {
            name: name.to_owned(),
            begin,
            down,
            back,
            listener_back: None,
            gap,
        }
    }

    fn events(&mut self) -> Vec<Event> {
        let root = self.root;
        let mut out = Vec::new();
        out.push(self.event("server 0 SIGKILL, restart", |c| {
            c.servers[0].signal("KILL").unwrap();
            let down = Instant::now();
            c.servers[0].restart(root).unwrap();
            down
        }));
        out.push(self.event("both servers SIGKILL, restart", |c| {
            for s in &c.servers {
                s.signal("KILL").unwrap();
            }
            let down = Instant::now();
            for s in &mut c.servers {
                s.restart(root).unwrap();
            }
            down
        }));
        out.push(self.event("shoot pod 0 SIGKILL, restart", |c| {
            for s in &c.shoot_clients[0] {
                s.signal("KILL").unwrap();
            }
            let down = Instant::now();
            for s in &mut c.shoot_clients[0] {
                s.restart(root).unwrap();
            }
            down
        }));
        for n in 1..=SHOOT_ROUNDS {
            out.push(
                self.event(&format!("both shoot pods SIGKILL, restart ({n})"), |c| {
                    for s in c.shoot_clients.iter().flatten() {
                        s.signal("KILL").unwrap();
                    }
                    let down = Instant::now();
                    for s in c.shoot_clients.iter_mut().flatten() {
                        s.restart(root).unwrap();
                    }
                    down
                }),
            );
        }
        out
    }

    /// Replaces both servers with ones holding for `hold`, and waits for the layout at rest.
    fn reconfigure(&mut self, hold: Duration) {
        for s in &self.servers {
            s.signal("TERM").unwrap();
        }
        self.servers = start_servers(self.bins, self.l, self.root, hold);
        let now = Instant::now();
        self.pinger.wait_back(now, "reconfigured");
        wait_until("reconfigured: at rest", UP, || at_rest(self.l));
        std::thread::sleep(SETTLE);
    }
}

/// The load from replica 0 until `stop`.
fn run_load(l: &HaLandscape, stop: &AtomicBool, inflight: &InFlight) -> Vec<Rec> {
    load::load(
        stop,
        inflight,
        MAX_REQUESTS,
        Duration::from_secs(120),
        |kind, n| {
            let target = match kind {
                Kind::Exec => SocketAddr::from((NODE, KUBELET_PORT)),
                Kind::Webhook => SocketAddr::from((WEBHOOK, WEBHOOK_PORT)),
            };
            l.kapi[0]
                .run_in(|| tcp_request(target, REQUEST_BOUND, n))
                .map_err(|e| e.to_string())
                .and_then(|r| r)
        },
    )
}

/// Prints the requests of `events` that ended more than 300 ms after the tunnel was back: when
/// each started (from the event's action) and how long it took.
fn print_late(phase: &str, events: &[Event], recs: &[Rec]) {
    for (i, e) in events.iter().enumerate() {
        for r in window(recs, e, events.get(i + 1).map(|n| n.begin)) {
            let end = r.started + r.took;
            if end > e.back + Duration::from_millis(300) && r.took > Duration::from_millis(300) {
                let from_down = if r.started >= e.down {
                    format!("+{}", load::ms(r.started - e.down))
                } else {
                    format!("-{}", load::ms(e.down - r.started))
                };
                // Its start on the wall clock, to find it in a capture.
                let wall = std::time::SystemTime::now() - r.started.elapsed();
                let wall = wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64();
                eprintln!(
                    "hold figure: HA | {phase} | {}: late: a {:?} request started {from_down} from the action (at {wall:.3}), took {}, ended {} after the tunnel was back{}",
                    e.name,
                    r.kind,
                    load::ms(r.took),
                    load::ms(end - e.back),
                    r.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
                );
            }
        }
    }
}

/// With both servers or both shoot pods gone, what the kube-apiserver sends to the shoot waits
/// (in its standby device, at the servers): a request started while the tunnel was down must
/// end when it is back (its held SYN goes out with the tunnel's return and the answer comes
/// back at once), not at the kernel's next retransmission a second later.
fn release_problems(events: &[Event], recs: &[Rec]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !e.name.starts_with("both") {
            continue;
        }
        for r in window(recs, e, events.get(i + 1).map(|n| n.begin)) {
            let end = r.started + r.took;
            if r.started >= e.down && r.started < e.back && end > e.back + RELEASED {
                problems.push(format!(
                    "HA {}: a {:?} request started {} after the action, while the tunnel was down, ended {} after it was back ({:?})",
                    e.name,
                    r.kind,
                    load::ms(r.started - e.down),
                    load::ms(end - e.back),
                    r.error
                ));
            }
        }
    }
    problems
}

/// The short bound's event: the requests that started while no shoot pod was connected and
/// could not see one back within the bound fail with `EHOSTUNREACH` (the servers' ICMP host
/// unreachable), none before the bound ran out: it runs from the last shoot connection's
/// leaving (at each server: one of the kills), so a request started later fails at once.
fn short_bound_problems(e: &Event, recs: &[Rec]) -> Vec<String> {
    let doomed: Vec<&Rec> = recs
        .iter()
        .filter(|r| {
            r.started >= e.down + Duration::from_millis(100)
                && r.started + SHORT + Duration::from_millis(300) < e.back
        })
        .collect();
    let mut problems = Vec::new();
    if doomed.len() < 10 {
        problems.push(format!(
            "HA short bound: only {} requests in the gap",
            doomed.len()
        ));
    }
    for r in doomed {
        let end = r.started + r.took;
        let clear = r
            .error
            .as_deref()
            .is_some_and(|err| err.contains("EHOSTUNREACH"));
        // No server's bound can have started before the first kill.
        let early = end + Duration::from_millis(50) < e.begin + SHORT;
        if !clear || early {
            problems.push(format!(
                "HA short bound: a {:?} request started {} after the shoot pods left ended after {} with {:?}",
                r.kind,
                load::ms(r.started - e.down),
                load::ms(r.took),
                r.error
            ));
        }
    }
    problems
}

#[test]
fn kube_apiserver_requests_wait_for_the_tunnel_through_every_ha_event() {
    require_lab(&["ip", "nft", "sysctl", "tcpdump", "ping", "stdbuf"]);
    let started = Instant::now();
    let bins = &Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some(PREFIX)).expect("layout");
    let webhook = webhook_pod(&l);
    let pki = TestPki::generate().expect("pki");
    let root = tempfile::Builder::new()
        .prefix("vpnt-rh-")
        .tempdir()
        .expect("tempdir");
    let root_path = root.path();
    write_secrets(&pki, root_path).expect("secrets");
    serve_echo(&[
        (&l.node, SocketAddr::from((NODE, KUBELET_PORT))),
        (&webhook, SocketAddr::from((WEBHOOK, WEBHOOK_PORT))),
    ])
    .unwrap();
    PODS.run_inits(bins, &l, root_path)
        .expect("init containers");
    let ingress = PODS
        .start_ingress(bins, &l.ingress, root_path, UP)
        .expect("ingress");
    let servers = start_servers(bins, &l, root_path, HOLD);
    let shoot_clients = PODS
        .start_shoot_clients(bins, &l, root_path)
        .expect("shoot clients");
    let seed_clients = PODS
        .start_seed_clients(bins, &l, root_path)
        .expect("seed clients");
    wait_until("the layout at rest", UP, || at_rest(&l));
    let pinger = Pinger::start(&l.kapi[0], root_path, NODE, UP).expect("ping");
    pinger.wait_back(Instant::now(), "first");

    let to_shoot = to_shoot_filter(
        &[
            SHOOT_SERVICE_NETWORKS,
            SHOOT_POD_NETWORKS,
            SHOOT_NODE_NETWORK,
            SHOOT_NODE_NETWORK_V6,
        ],
        &[],
    );
    let mut captures: Vec<(String, Capture<'_>)> = Vec::new();
    for (pod, ns) in [
        ("kube-apiserver 0", &l.kapi[0]),
        ("kube-apiserver 1", &l.kapi[1]),
        ("server 0", &l.server[0]),
        ("server 1", &l.server[1]),
    ] {
        for iface in ["eth0", "lo"] {
            captures.push((
                format!("{pod} {iface}"),
                Capture::start(ns, iface, &to_shoot).expect("capture"),
            ));
        }
    }

    // With RH_TCPDUMP set, every pod's requests captured (kept with the logs on a failure).
    let mut dumps = Vec::new();
    if std::env::var_os("RH_TCPDUMP").is_some() {
        for (name, ns) in [
            ("kapi0", &l.kapi[0]),
            ("shoot0", &l.shoot[0]),
            ("shoot1", &l.shoot[1]),
            ("node", &l.node),
            ("webhook", &webhook),
        ] {
            let file = root_path.join(format!("{name}.pcap"));
            let mut cmd = ns.command("tcpdump");
            cmd.args(["-ni", "any", "-U", "-c", "400000", "-w"])
                .arg(&file)
                .arg("tcp port 10250 or tcp port 9443")
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
        root: root_path,
        pinger: &pinger,
        inflight: &inflight,
        servers,
        shoot_clients,
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
            let loader = s.spawn(|| run_load(&l, &stop, &inflight));
            std::thread::sleep(Duration::from_secs(1));
            let events = if phase == "short bound" {
                vec![ctx.event("both shoot pods away 4 s", |c| {
                    for s in c.shoot_clients.iter().flatten() {
                        s.signal("KILL").unwrap();
                    }
                    let down = Instant::now();
                    std::thread::sleep(AWAY);
                    for s in c.shoot_clients.iter_mut().flatten() {
                        s.restart(c.root).unwrap();
                    }
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
    eprintln!("HA hold replay took {:?}", started.elapsed());

    let mut problems = Vec::new();
    for (phase, events, recs) in &phases {
        let failures = report("HA", phase, events, recs);
        print_late(phase, events, recs);
        match *phase {
            "held" => {
                problems.extend(release_problems(events, recs));
                problems.extend(held_problems("HA", events, recs, |_, r| {
                    // In flight as an action took place (its own event's, or the next one's
                    // when it started just before that began): its packets could go into the
                    // process as it died.
                    let end = r.started + r.took;
                    let x = events
                        .iter()
                        .find(|x| r.started < x.down && end > x.begin)?;
                    match &r.error {
                        // Through a shoot pod as its clients died: the connection's NAT state
                        // went with the pod (as in vpn2); the request had its connection.
                        Some(err) if x.name.contains("shoot pod") && !err.starts_with("connect") => {
                            Some("in flight through the killed shoot pod")
                        }
                        Some(_) => None,
                        // Its SYN died with the process; the kernel's retransmission carried it.
                        None => (end <= x.begin + x.downtime() + SLACK + RETRANSMIT).then_some(
                            "in flight as a process was killed, carried by the kernel's retransmission",
                        ),
                    }
                }));
            }
            "short bound" => problems.extend(short_bound_problems(&events[0], recs)),
            _ => problems.extend(old_problems("HA", &failures)),
        }
    }
    for p in &leaked {
        problems.push(format!("HA: left by a non-tunnel interface: {p}"));
    }
    drop(ctx);
    drop(dumps);
    drop(seed_clients);
    drop(ingress);
    if !problems.is_empty() || std::env::var_os("RH_TCPDUMP").is_some() {
        eprintln!("logs kept in {}", root.keep().display());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
