//! The Kubernetes part (issue 31): `vpn-router --kubernetes` against the API stand-in
//! (`conformance::kube_api`) holding [`SHOOTS`] shoots' objects as Gardener and the ACL
//! extension create them (`conformance::kube_objects`), in one lab namespace:
//!
//! ```text
//!  stand-in (HTTPS, 127.0.0.1, this process) ◄── list + watch ── vpn-router --kubernetes
//!  probe: CONNECT from 127.0.0.1 ─────────────────────────────►  127.0.0.1:8443
//! ```
//!
//! It measures the time from the router's start to `/readyz` (the first policy from a
//! complete list of every kind), the router's resident memory after that, and for
//! [`CHANGES`] changes (an ACL edited, a shoot deleted, a shoot created, in turn) the time
//! from the change in the stand-in to the policy that new connections see: a probe CONNECT
//! every 2 ms until its answer changes (403 to not 403 for the ACL, 400 "no route" for the
//! deletion, not 400 for the creation; the Services' cluster IPs lead nowhere in the
//! namespace, so a routed CONNECT is answered at once with an error of the upstream). That
//! time includes the router's debounce (`vpn_router::kubernetes::DEBOUNCE`) and the watch
//! event's way through the stand-in.
//!
//! The shoots: every tenth HA (`vpn-seed-server-0`/`-1`), every twentieth hibernated, every
//! second with an ACL (allowing 192.0.2.0/24, its Cluster and Infrastructure), each with its
//! `kube-apiserver` Service and passthrough Gateway and VirtualService.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::kube_api::{self, ApiServer};
use conformance::kube_objects::{
    acl, cluster, infrastructure, service, sni_objects, vpn_value, ISTIO_NS,
};
use conformance::netns::Netns;
use conformance::LabError;

use crate::measure::rss_kib;
use crate::BenchError;

/// Shoots served.
pub const SHOOTS: usize = 500;
/// Changes timed.
pub const CHANGES: usize = 12;
/// The router's CONNECT listener in the namespace.
const ROUTER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8443);
/// Its admin endpoint (`/readyz`).
const ADMIN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15021);
/// How long the first sync and each change may take before the part gives up.
const LIMIT: Duration = Duration::from_secs(120);

/// What a change was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A shoot's ACL now allows the probe's address.
    AclEdited,
    /// A shoot's objects deleted.
    ShootDeleted,
    /// A new shoot's objects created.
    ShootCreated,
}

impl Change {
    /// How the section names it.
    pub fn name(self) -> &'static str {
        match self {
            Change::AclEdited => "ACL edited",
            Change::ShootDeleted => "shoot deleted",
            Change::ShootCreated => "shoot created",
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct KubeSample {
    /// Shoots served at the start.
    pub shoots: usize,
    /// Objects the stand-in held at the start.
    pub objects: usize,
    /// From the router's start to `/readyz` 200.
    pub first_sync: Duration,
    /// The router's VmRSS once ready.
    pub rss_after_sync_kib: u64,
    /// Its VmRSS after the changes.
    pub rss_after_changes_kib: u64,
    /// Each change and the time to its policy.
    pub changes: Vec<(Change, Duration)>,
}

/// Runs the part with our `vpn-router` from `ours`; `progress` gets a line per step.
pub fn run(ours: &Path, progress: &mut dyn FnMut(&str)) -> Result<KubeSample, BenchError> {
    let ns = Netns::with_prefix("vpnt-kb")?;
    let listener = ns
        .run_in(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?
        .map_err(|e| LabError::io("the stand-in's listener", e))?;
    let api = ApiServer::start(listener, &kube_api::ROUTER_RESOURCES)
        .map_err(|e| LabError::io("the API stand-in", e))?;
    let objects: usize = (0..SHOOTS).map(|i| create_shoot(&api, i)).sum();
    progress(&format!("kube: {SHOOTS} shoots, {objects} objects served"));

    let dir = tempfile::tempdir().map_err(|e| LabError::io("tempdir", e))?;
    let config = dir.path().join("router.toml");
    std::fs::write(
        &config,
        format!(
            "metrics_listen = \"{ADMIN}\"\n[[listener]]\naddress = \"{ROUTER}\"\n\
             headers = [\"X-Gardener-Destination\"]\n"
        ),
    )
    .map_err(|e| LabError::io("router.toml", e))?;
    let log = dir.path().join("router.log");
    let out = std::fs::File::create(&log).map_err(|e| LabError::io("router.log", e))?;
    let err = out.try_clone().map_err(|e| LabError::io("router.log", e))?;
    let mut cmd = ns.command(&ours.join("vpn-router").to_string_lossy());
    cmd.arg("--config")
        .arg(&config)
        .args(["--kubernetes", "--namespace", ISTIO_NS, "--log", "warn"])
        .arg("--kubeconfig")
        .arg(api.kubeconfig())
        .stdout(out)
        .stderr(err);
    let started = Instant::now();
    let pid = ns.spawn(&mut cmd)?;
    let gone = |what: &'static str| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        BenchError::unexpected(what, text)
    };
    while readyz(&ns) != Some(200) {
        if ns.try_wait(pid).is_some() {
            return Err(gone("vpn-router ended before it was ready"));
        }
        if started.elapsed() > LIMIT {
            return Err(gone("vpn-router not ready"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let first_sync = started.elapsed();
    progress(&format!("kube: ready after {first_sync:?}"));
    // Let the allocator settle, as the memory part does.
    std::thread::sleep(Duration::from_secs(1));
    let rss_after_sync_kib = rss_kib(pid)?;

    let mut changes = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let (change, took) = change(&ns, &api, k)?;
        progress(&format!("kube: {} in force after {took:?}", change.name()));
        changes.push((change, took));
        std::thread::sleep(Duration::from_millis(300));
    }
    let rss_after_changes_kib = rss_kib(pid)?;
    ns.stop(pid);
    Ok(KubeSample {
        shoots: SHOOTS,
        objects,
        first_sync,
        rss_after_sync_kib,
        rss_after_changes_kib,
        changes,
    })
}

/// Shoot `i`'s namespace.
fn namespace(i: usize) -> String {
    format!("shoot--p--s{i:04}")
}

/// A cluster IP of shoot `i` (nothing listens there).
fn cluster_ip(i: usize, last: u8) -> Ipv4Addr {
    let [_, _, hi, lo] = u32::try_from(i).unwrap_or_default().to_be_bytes();
    Ipv4Addr::new(10, 64 + hi, lo, last)
}

/// Creates shoot `i`'s objects; how many. The VPN Services come last: a creation is in
/// force when they are.
fn create_shoot(api: &ApiServer, i: usize) -> usize {
    let ns = namespace(i);
    let name = format!("s{i:04}");
    let mut n = 0;
    api.apply(kube_api::CLUSTER, cluster(&ns, &name, i % 20 == 19));
    api.apply(
        kube_api::SERVICE,
        service(cluster_ip(i, 1), &ns, "kube-apiserver", &[443]),
    );
    let hosts = [
        format!("api.{name}.p.internal.example.com"),
        format!("api.{name}.p.example.com"),
    ];
    sni_objects(api, &ns, &[&hosts[0], &hosts[1]]);
    n += 4;
    if i % 2 == 0 {
        api.apply(kube_api::INFRASTRUCTURE, infrastructure(&ns, &name));
        api.apply(kube_api::EXTENSION, acl(&ns, &["192.0.2.0/24"]));
        n += 2;
    }
    for (vpn, last) in vpn_services(i) {
        api.apply(
            kube_api::SERVICE,
            service(cluster_ip(i, last), &ns, &vpn, &[1194, 9443, 15000]),
        );
        n += 1;
    }
    n
}

/// Shoot `i`'s VPN Services and the last byte of their cluster IPs.
fn vpn_services(i: usize) -> Vec<(String, u8)> {
    if i % 10 == 9 {
        vec![
            ("vpn-seed-server-0".to_owned(), 2),
            ("vpn-seed-server-1".to_owned(), 3),
        ]
    } else {
        vec![("vpn-seed-server".to_owned(), 2)]
    }
}

/// Deletes shoot `i`'s objects, the VPN Services first; the deletion is in force when they
/// are gone.
fn delete_shoot(api: &ApiServer, i: usize) {
    let ns = namespace(i);
    for (vpn, _) in vpn_services(i) {
        api.delete(kube_api::SERVICE, &ns, &vpn);
    }
    api.delete(kube_api::SERVICE, &ns, "kube-apiserver");
    api.delete(kube_api::GATEWAY, &ns, "kube-apiserver");
    api.delete(kube_api::VIRTUAL_SERVICE, &ns, "kube-apiserver");
    api.delete(kube_api::EXTENSION, &ns, "acl");
    api.delete(kube_api::INFRASTRUCTURE, &ns, &format!("s{i:04}"));
    api.delete(kube_api::CLUSTER, "", &ns);
}

/// Change `k`: its kind and the time from making it to the probe seeing it.
fn change(ns: &Netns, api: &ApiServer, k: usize) -> Result<(Change, Duration), BenchError> {
    // Shoots with an ACL and one VPN Service: even and not 9 mod 10.
    let with_acl = 2 * (k / 3) * 10 % SHOOTS;
    let deleted = (2 * (k / 3) * 10 + 4) % SHOOTS;
    let created = SHOOTS + k / 3;
    let (change, value, done): (Change, String, fn(Option<u16>) -> bool) = match k % 3 {
        0 => (
            Change::AclEdited,
            vpn_value(&namespace(with_acl), None),
            |c| c.is_some_and(|c| c != 403),
        ),
        1 => (
            Change::ShootDeleted,
            vpn_value(&namespace(deleted), None),
            |c| c == Some(400),
        ),
        _ => (
            Change::ShootCreated,
            vpn_value(&namespace(created), None),
            |c| c.is_some_and(|c| c != 400),
        ),
    };
    if done(probe(ns, &value)) {
        return Err(BenchError::unexpected(
            "kube change",
            format!("{} shows before it was made", change.name()),
        ));
    }
    let start = Instant::now();
    match change {
        Change::AclEdited => api.apply(
            kube_api::EXTENSION,
            acl(&namespace(with_acl), &["192.0.2.0/24", "127.0.0.1/32"]),
        ),
        Change::ShootDeleted => delete_shoot(api, deleted),
        Change::ShootCreated => {
            create_shoot(api, created);
        }
    }
    while !done(probe(ns, &value)) {
        if start.elapsed() > LIMIT {
            return Err(BenchError::unexpected(
                "kube change",
                format!("{} not in force", change.name()),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok((change, start.elapsed()))
}

/// A CONNECT with `value` from 127.0.0.1 in `ns`: the status code.
fn probe(ns: &Netns, value: &str) -> Option<u16> {
    let request = format!(
        "CONNECT 127.0.0.1:1194 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Gardener-Destination: {value}\r\n\r\n"
    );
    request_status(ns, ROUTER, &request)
}

/// `GET /readyz` on the admin endpoint in `ns`: the status code.
fn readyz(ns: &Netns) -> Option<u16> {
    request_status(ns, ADMIN, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
}

fn request_status(ns: &Netns, to: SocketAddr, request: &str) -> Option<u16> {
    ns.run_in(|| {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(request.as_bytes()).ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    })
    .ok()
    .flatten()
}

/// The heading of the part's section in `docs/performance.md`.
pub const KUBE_HEADING: &str =
    "## vpn-router --kubernetes at seed scale: 500 shoots' objects (issue 31)";

/// The part's section of `docs/performance.md`.
pub fn section(sample: &KubeSample, machine: &crate::report::Machine, command: &str) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    crate::report::write_section_head(&mut md, KUBE_HEADING, "kube", machine, command);
    let build = if cfg!(debug_assertions) {
        "a **debug** build: a check that the part works, figures to be replaced by a release run"
    } else {
        "a release build"
    };
    let _ = writeln!(
        md,
        "Our `vpn-router --kubernetes` ({build}) against the Kubernetes API stand-in \
         (`conformance::kube_api`, HTTPS on the namespace's loopback, in the bench's process) \
         serving {} shoots' objects as Gardener and the ACL extension create them (every tenth \
         shoot HA, every twentieth hibernated, every second with an ACL; `bench::kube` says \
         which objects). First sync: from the router's start to `/readyz` 200 (the first \
         policy from a complete list of every kind). A change: from the change in the \
         stand-in to the first new CONNECT that sees it (probed every 2 ms), so the router's \
         200 ms debounce is in it.\n",
        sample.shoots
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let _ = writeln!(
        md,
        "| shoots | objects | first sync | VmRSS after sync | VmRSS after the changes |\n\
         |---|---|---|---|---|\n\
         | {} | {} | {:.2} s | {:.1} MiB | {:.1} MiB |\n",
        sample.shoots,
        sample.objects,
        sample.first_sync.as_secs_f64(),
        mib(sample.rss_after_sync_kib),
        mib(sample.rss_after_changes_kib),
    );
    let _ = writeln!(
        md,
        "| change → in force for new connections | changes | median | max |\n|---|---|---|---|"
    );
    let kinds = [
        Some(Change::AclEdited),
        Some(Change::ShootDeleted),
        Some(Change::ShootCreated),
        None,
    ];
    for kind in kinds {
        let ms: Vec<f64> = sample
            .changes
            .iter()
            .filter(|(c, _)| kind.is_none_or(|k| k == *c))
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .collect();
        if let Some(s) = crate::stats::Spread::of(&ms) {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} ms | {:.0} ms |",
                kind.map_or("all", Change::name),
                s.n,
                s.median,
                s.max
            );
        }
    }
    md.push('\n');
    md
}
