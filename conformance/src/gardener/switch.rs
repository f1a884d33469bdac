//! What the in-place switch replay (`tests/switch_nonha.rs`) adds to the landscape: the
//! surge pods of a rolling update, the `vpn-seed-server` Service in front of the seed pods,
//! the termination of a pod, and the kube-apiserver's load with its figures.
//!
//! ```text
//!  kube-apiserver ──► 10.0.0.10:9443 ┐                 ┌─► seed pod      100.96.0.10
//!  ingress ─────────► 10.0.0.10:1194 ┴ seed router DNAT ┴─► surge seed pod 100.96.3.10
//!                                       (numgen random)
//! ```
//!
//! The Service: kube-proxy's iptables mode sends each new connection to one of the endpoints
//! at random (`statistic --mode random` with probabilities 1/N, 1/(N-1), ..); the seed router
//! does the same with `dnat to numgen random mod N map {..}`. The Services set
//! `publishNotReadyAddresses`, so a pod is an endpoint from the moment it has an address
//! until it is gone, terminating or not (the EndpointSlice's `ready` stays true for such
//! Services): [`set_endpoints`] is called once a pod's init container has run (the kubelet
//! reports a pod's address no earlier than after the sync that started its first init
//! container) and after it is gone. kube-proxy does not retry a refused connection on
//! another endpoint, nor does the kube-apiserver's egress dialer.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::checks::{self, Egress, SIDECAR_PORT};
use super::landscape::{add_pod, Landscape, VPN_SHOOT_MTU};
use super::pods::{header_value, Binaries, Container, HEADER_KEY, OPENVPN_PORT};
use crate::netns::Netns;
use crate::LabError;

/// The `vpn-seed-server` Service's cluster address.
pub const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 10);
/// The surge seed pod's address (on the seed router's `to-seed-surge`).
pub const SURGE_SEED_POD: Ipv4Addr = Ipv4Addr::new(100, 96, 3, 10);
/// The surge vpn-shoot pod's addresses (on the shoot router's `to-shoot-surge`).
pub const SURGE_VPN_SHOOT: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(100, 96, 11, 10),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0x11, 0, 0, 0, 0x10),
);
/// The seed router's link to the first seed pod (the landscape's).
pub const SEED_POD_LINK: &str = "to-seed-pod";
/// The shoot router's link to the first vpn-shoot pod (the landscape's).
pub const VPN_SHOOT_LINK: &str = "to-vpn-shoot";
/// The seed router's link to the surge seed pod.
pub const SURGE_SEED_LINK: &str = "to-seed-surge";
/// The shoot router's link to the surge vpn-shoot pod.
pub const SURGE_SHOOT_LINK: &str = "to-shoot-surge";
/// How long one request may take in all (beyond Envoy's 20 s `connect_timeout`).
pub const REQUEST_BOUND: Duration = Duration::from_secs(25);
/// How often the kube-apiserver starts a request to each target.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// At most this many requests in one load run.
pub const MAX_REQUESTS: usize = 8000;

/// Gives `pod` its link to the seed router as the surge seed pod.
pub fn attach_surge_seed_pod(l: &Landscape, pod: &Netns) -> Result<(), LabError> {
    add_pod(
        &l.seed_router,
        pod,
        SURGE_SEED_LINK,
        (Ipv4Addr::new(100, 96, 3, 1), SURGE_SEED_POD),
        None,
        None,
    )
}

/// Gives `pod` its link to the shoot router as the surge vpn-shoot pod.
pub fn attach_surge_vpn_shoot(l: &Landscape, pod: &Netns) -> Result<(), LabError> {
    add_pod(
        &l.shoot_router,
        pod,
        SURGE_SHOOT_LINK,
        (Ipv4Addr::new(100, 96, 11, 1), SURGE_VPN_SHOOT.0),
        Some((
            Ipv6Addr::new(0xfd00, 0x96, 0, 0x11, 0, 0, 0, 1),
            SURGE_VPN_SHOOT.1,
        )),
        Some(VPN_SHOOT_MTU),
    )
}

/// The pod behind `router`'s `link` is gone: the link goes with it.
pub fn remove_pod(router: &Netns, link: &str) -> Result<(), LabError> {
    router.run(["ip", "link", "del", link]).map(drop)
}

/// The `vpn-seed-server` Service's endpoints (TCP 1194 and 9443 of [`SERVICE`]) are
/// `endpoints`, each new connection to one of them at random; replaces the previous set at
/// once (one `nft` transaction).
pub fn set_endpoints(seed_router: &Netns, endpoints: &[Ipv4Addr]) -> Result<(), LabError> {
    let map = endpoints
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{i} : {a}"))
        .collect::<Vec<_>>()
        .join(", ");
    let script = format!(
        "add table ip kube-proxy\n\
         add chain ip kube-proxy services {{ type nat hook prerouting priority dstnat; }}\n\
         flush chain ip kube-proxy services\n\
         add rule ip kube-proxy services ip daddr {SERVICE} tcp dport {{ 1194, {SIDECAR_PORT} }} \
         dnat to numgen random mod {} map {{ {map} }}\n",
        endpoints.len()
    );
    seed_router.run(["nft", &script]).map(drop)
}

/// Starts the ingress (our router) in `ingress`, its one route to the Service's 1194, and
/// waits until it listens.
pub fn start_ingress_to_service<'ns>(
    bins: &Binaries,
    ingress: &'ns Netns,
    logs: &std::path::Path,
) -> Result<Container<'ns>, LabError> {
    let text = format!(
        "[[listener]]\naddress = \"0.0.0.0:{OPENVPN_PORT}\"\nheaders = [\"{HEADER_KEY}\"]\n\n\
         [[route]]\nvalue = \"{}\"\nupstream = \"{SERVICE}:1194\"\n",
        header_value()
    );
    super::pods::start_router(
        bins,
        ingress,
        logs,
        "router-service.toml",
        &text,
        Duration::from_secs(30),
    )
}

/// How a pod's termination went.
#[derive(Debug, Clone, Copy)]
pub struct Termination {
    /// From SIGTERM to the last process's exit.
    pub took: Duration,
    /// Whether the grace period ran out and SIGKILL ended it.
    pub killed: bool,
}

/// Terminates a pod as the kubelet does without a `preStop` hook: SIGTERM to every process
/// `pids` of `ns` at once, SIGKILL to those still running after `grace`.
pub fn terminate(ns: &Netns, pids: &[u32], grace: Duration) -> Result<Termination, LabError> {
    let started = Instant::now();
    signal(pids, "TERM")?;
    while pids.iter().any(|&p| ns.try_wait(p).is_none()) {
        if started.elapsed() >= grace {
            signal(pids, "KILL")?;
            while pids.iter().any(|&p| ns.try_wait(p).is_none()) {
                std::thread::sleep(Duration::from_millis(10));
            }
            return Ok(Termination {
                took: started.elapsed(),
                killed: true,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Termination {
        took: started.elapsed(),
        killed: false,
    })
}

fn signal(pids: &[u32], signal: &str) -> Result<(), LabError> {
    let mut kill = std::process::Command::new("kill");
    kill.arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(std::process::Stdio::null());
    // An exited process makes `kill` fail; the others were signalled all the same.
    kill.status().map(drop).map_err(|source| LabError::Spawn {
        command: "kill".into(),
        source,
    })
}

/// Echo servers at `addrs`, each in its namespace (the kubelet on the node, the webhook in
/// its pod): whatever a connection sends comes back.
pub fn serve_echo(ends: &[(&Netns, SocketAddr)]) -> Result<(), LabError> {
    for &(ns, addr) in ends {
        let listener = ns
            .run_in(|| TcpListener::bind(addr))?
            .map_err(|source| LabError::io(addr.to_string(), source))?;
        crate::echo::serve(listener, Vec::new(), || {});
    }
    Ok(())
}

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Record {
    /// Where it went.
    pub target: SocketAddr,
    /// When it started.
    pub started: Instant,
    /// From its start to its answer (or failure).
    pub took: Duration,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The kube-apiserver's load: from `ns`, every [`INTERVAL`] one request to each of
/// `targets` through `egress` (TLS to the sidecar, `CONNECT`, bytes there and back), each
/// bounded by [`REQUEST_BOUND`], until `stop` or `limit` or [`MAX_REQUESTS`]; returns when
/// every request has ended.
pub fn load(
    ns: &Netns,
    egress: &Egress,
    targets: &[SocketAddr],
    stop: &AtomicBool,
    limit: Duration,
) -> Vec<Record> {
    let records = Mutex::new(Vec::new());
    let begun = Instant::now();
    std::thread::scope(|s| {
        let mut next = Instant::now();
        let mut count = 0usize;
        while !stop.load(Ordering::Relaxed) && begun.elapsed() < limit && count < MAX_REQUESTS {
            for &target in targets {
                count += 1;
                let records = &records;
                s.spawn(move || {
                    let started = Instant::now();
                    let outcome = ns
                        .run_in(|| request(egress, target, count))
                        .map_err(|e| e.to_string())
                        .and_then(|r| r);
                    let took = started.elapsed();
                    let error = match outcome {
                        Err(e) => Some(e),
                        Ok(()) if took > REQUEST_BOUND => Some(format!("took {took:?}")),
                        Ok(()) => None,
                    };
                    records
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Record {
                            target,
                            started,
                            took,
                            error,
                        });
                });
            }
            next += INTERVAL;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
    records.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// One request: the connection through the sidecar, a line there, the same line back.
fn request(egress: &Egress, target: SocketAddr, n: usize) -> Result<(), String> {
    let deadline = Instant::now() + REQUEST_BOUND;
    let mut s = checks::connect(egress, target, REQUEST_BOUND).map_err(|e| e.to_string())?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = s.get_ref().set_read_timeout(Some(left));
    super::load::exchange_line(&mut s, &format!("request {n} to {target}\n"))
}

/// A step of the roll: from `start` to the next step's start.
#[derive(Debug, Clone)]
pub struct Step {
    /// What happened in it.
    pub name: String,
    /// When it began.
    pub start: Instant,
}

/// What the requests started in one step saw.
#[derive(Debug, Clone)]
pub struct Figure {
    /// The step's name.
    pub step: String,
    /// Requests started in it.
    pub started: usize,
    /// Of those, failed (with the first reasons).
    pub failed: Vec<String>,
    /// The longest of its requests.
    pub longest: Duration,
    /// How long the step lasted (the last one: until its last request started).
    pub lasted: Duration,
}

/// The figures per step: each request counts in the step it started in.
pub fn figures(steps: &[Step], records: &[Record]) -> Vec<Figure> {
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let end = steps.get(i + 1).map(|s| s.start);
            let mine: Vec<&Record> = records
                .iter()
                .filter(|r| r.started >= step.start && end.is_none_or(|e| r.started < e))
                .collect();
            Figure {
                step: step.name.clone(),
                started: mine.len(),
                failed: mine
                    .iter()
                    .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.target)))
                    .collect(),
                longest: mine.iter().map(|r| r.took).max().unwrap_or_default(),
                lasted: end
                    .or_else(|| mine.iter().map(|r| r.started).max())
                    .map(|e| e.saturating_duration_since(step.start))
                    .unwrap_or_default(),
            }
        })
        .collect()
}
