//! `vpn-router --kubernetes` end to end: the router in SEED watches the API stand-in
//! (`conformance::kube_api`, HTTPS on SEED's loopback) holding three shoots' objects as
//! Gardener and the ACL extension create them, and clients in SHOOT open tunnels by what
//! the objects say:
//!
//! * `shoot--p--a`: `vpn-seed-server` and `kube-apiserver` Services, the passthrough Gateway
//!   and VirtualService `kube-apiserver`, an ACL Extension allowing SHOOT_A, its Cluster and
//!   Infrastructure;
//! * `shoot--p--h`: hibernated (the Cluster says so; the Services stay, with no pod behind);
//! * `shoot--p--ha`: HA, `vpn-seed-server-0` and `-1`.
//!
//! Each Service's cluster IP is an address of SEED with a recording echo server on the
//! Service's port, greeting with its name.
//!
//! The stand-in also misbehaves as an API server does: it goes away and comes back (with the
//! same objects, and with one changed meanwhile and its history lost), answers `410 Gone`,
//! cuts its watches and answers slowly. Through each, an open tunnel keeps passing bytes,
//! new tunnels keep routing, and the change made meanwhile is in force after recovery.

mod router_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use conformance::kube_api::{self, ApiServer};
use conformance::kube_objects::{
    acl, cluster, infrastructure, service, sni_objects, vpn_value as vpn, GATEWAY_LABELS, ISTIO_NS,
};
use router_common::{connect, status, Client, Lab, SEED, SHOOT_A, SHOOT_B};
use tokio_util::sync::CancellationToken;
use vpn_router::kubernetes::{Options, Settings};
use vpn_router::Router;

/// What the issue asks: a change in force for new connections within this.
const IN_FORCE: Duration = Duration::from_secs(2);

/// An echo server on `ip:port` in SEED greeting with `name`.
fn upstream(lab: &Lab, ip: Ipv4Addr, port: u16, name: &str) {
    let listener = lab
        .seed
        .run_in(|| TcpListener::bind((ip, port)))
        .expect("run_in")
        .expect("bind upstream");
    conformance::echo::serve(listener, format!("{name}\n").into_bytes(), || {});
}

/// A CONNECT from `src` with `value`: the status, the client (its tunnel open on 200) and,
/// on 200, the upstream's greeting line.
fn tunnel(
    lab: &Lab,
    router: SocketAddr,
    src: Ipv4Addr,
    value: &str,
) -> (Option<u16>, Client, String) {
    let mut c = lab.connect_from(IpAddr::V4(src), router);
    c.send(&connect(&[format!("X-Gardener-Destination: {value}")]));
    let mut got = c.read_until(b"\r\n\r\n");
    let code = status(&got);
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let mut rest = got.split_off(end);
    if code == Some(200) && !rest.contains(&b'\n') {
        rest.extend(c.read_until(b"\n"));
    }
    (code, c, String::from_utf8_lossy(&rest).into_owned())
}

/// Polls `check` until it holds, at most `limit`; the time it took.
fn within(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

struct Running {
    token: CancellationToken,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The router in SEED from `config`, its routes from the stand-in; its admin address.
fn start_router(
    lab: &Lab,
    dir: &tempfile::TempDir,
    config: &str,
    api: &ApiServer,
) -> (Running, Vec<SocketAddr>, SocketAddr) {
    let path = dir.path().join("router.toml");
    std::fs::write(&path, config).expect("write config");
    let token = CancellationToken::new();
    let options = Options {
        kubeconfig: Some(api.kubeconfig().to_owned()),
        settings: Settings {
            namespace: ISTIO_NS.into(),
            labels: GATEWAY_LABELS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            additional_allowed: vec![],
        },
    };
    let (rt, addrs, admin) = lab
        .seed
        .run_in(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let router = rt.block_on(Router::bind(&path)).expect("router bind");
            let addrs = router.local_addrs();
            let admin = router.metrics_addr().expect("metrics_listen");
            let run = token.clone();
            rt.spawn(async move {
                if let Err(e) = vpn_router::kubernetes::serve(router, options, run).await {
                    panic!("kubernetes source: {e}");
                }
            });
            (rt, addrs, admin)
        })
        .expect("run_in seed");
    (
        Running {
            token,
            rt: Some(rt),
        },
        addrs,
        admin,
    )
}

/// `GET path` on the router's admin endpoint in SEED: the status code.
fn admin_get(lab: &Lab, admin: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = lab
        .seed
        .run_in(|| std::net::TcpStream::connect(admin))
        .ok()?
        .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    status(&out)
}

const A: &str = "shoot--p--a";
const H: &str = "shoot--p--h";
const HA: &str = "shoot--p--ha";

/// The cluster IP of a Service: an address of SEED.
fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 79, 0, last)
}

/// A listener for the stand-in on SEED's loopback (`port` 0: any).
fn bind_api(lab: &Lab, port: u16) -> TcpListener {
    lab.seed
        .run_in(|| TcpListener::bind((Ipv4Addr::LOCALHOST, port)))
        .expect("run_in")
        .expect("bind stand-in")
}

/// The Service of HA shoot replica `i`.
fn ha_service(i: u8) -> serde_json::Value {
    service(
        ip(31 + i),
        HA,
        &format!("vpn-seed-server-{i}"),
        &[1194, 9443, 15000],
    )
}

/// The three shoots' upstreams in SEED and their objects in a stand-in on SEED's loopback;
/// shoot a's ACL allows SHOOT_A.
fn three_shoots(lab: &Lab) -> ApiServer {
    // One SEED address per Service (its cluster IP).
    for last in [11, 12, 21, 31, 32] {
        lab.seed
            .run([
                "ip",
                "addr",
                "add",
                &format!("{}/32", ip(last)),
                "dev",
                "vpnt-rseed",
            ])
            .expect("ip addr add");
    }
    upstream(lab, ip(11), 1194, "vpn-a");
    upstream(lab, ip(12), 443, "kube-apiserver-a");
    // Hibernated: ip(21) has no server on 1194.
    upstream(lab, ip(31), 1194, "vpn-ha-0");
    upstream(lab, ip(32), 1194, "vpn-ha-1");

    let api = ApiServer::start(bind_api(lab, 0), &kube_api::ROUTER_RESOURCES).expect("stand-in");

    let (a, h) = (A, H);
    api.apply(
        kube_api::SERVICE,
        service(ip(11), a, "vpn-seed-server", &[1194, 9443, 15000]),
    );
    api.apply(
        kube_api::SERVICE,
        service(ip(12), a, "kube-apiserver", &[443]),
    );
    sni_objects(
        &api,
        a,
        &["api.a.p.internal.example.com", "api.a.p.example.com"],
    );
    api.apply(kube_api::EXTENSION, acl(a, &[&format!("{SHOOT_A}/32")]));
    api.apply(kube_api::CLUSTER, cluster(a, "a", false));
    api.apply(kube_api::INFRASTRUCTURE, infrastructure(a, "a"));
    api.apply(
        kube_api::SERVICE,
        service(ip(21), h, "vpn-seed-server", &[1194, 9443, 15000]),
    );
    api.apply(kube_api::CLUSTER, cluster(h, "h", true));
    for i in 0..2u8 {
        api.apply(kube_api::SERVICE, ha_service(i));
    }

    api
}

/// The router's config file: a CONNECT and an SNI listener on SEED, the admin endpoint.
fn router_config() -> String {
    format!(
        "metrics_listen = \"127.0.0.1:0\"\n\
         [timeouts]\nconnect_ms = 1000\n\
         [[listener]]\naddress = \"{SEED}:0\"\nheaders = [\"X-Gardener-Destination\"]\n\
         [[listener]]\naddress = \"{SEED}:0\"\nkind = \"sni\"\n"
    )
}

#[test]
fn routes_follow_the_objects_acl_changes_apply_within_2s_and_a_410_costs_no_route() {
    let lab = Lab::new(&["ip"]);
    let api = three_shoots(&lab);
    let (a, h, ha) = (A, H, HA);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = router_config();
    let (_running, addrs, admin) = start_router(&lab, &dir, &config, &api);
    let (router, sni) = (addrs[0], addrs[1]);
    within(
        Duration::from_secs(10),
        "/readyz 200 after the first sync",
        || admin_get(&lab, admin, "/readyz") == Some(200),
    );

    // CONNECT by what the Services say; the ACL admits SHOOT_A only.
    let (code, mut open_a, greeting) = tunnel(&lab, router, SHOOT_A, &vpn(a, None));
    assert_eq!((code, greeting.as_str()), (Some(200), "vpn-a\n"));
    let (code, _, _) = tunnel(&lab, router, SHOOT_B, &vpn(a, None));
    assert_eq!(code, Some(403), "SHOOT_B is not in shoot a's ACL");
    for i in 0..2u8 {
        let (code, _, greeting) = tunnel(&lab, router, SHOOT_B, &vpn(ha, Some(i)));
        assert_eq!(code, Some(200), "HA replica {i}");
        assert_eq!(greeting, format!("vpn-ha-{i}\n"));
    }
    let (code, _, _) = tunnel(&lab, router, SHOOT_B, &vpn(ha, None));
    assert_eq!(
        code,
        Some(400),
        "an HA shoot has no vpn-seed-server Service"
    );
    let (code, _, _) = tunnel(&lab, router, SHOOT_B, &vpn(h, None));
    assert_eq!(
        code,
        Some(503),
        "hibernated: routed, nobody behind the Service"
    );
    // SNI by what the Gateway and VirtualService say (and the same ACL).
    let mut c = lab.connect_from(IpAddr::V4(SHOOT_A), sni);
    c.send(&conformance::tls_hello::client_hello("api.a.p.example.com"));
    assert!(c.read_until(b"\n").starts_with(b"kube-apiserver-a\n"));

    // The ACL now allows SHOOT_B instead of SHOOT_A: new connections from A are denied
    // within 2 s; A's open tunnel keeps working.
    api.apply(kube_api::EXTENSION, acl(a, &[&format!("{SHOOT_B}/32")]));
    let took = within(IN_FORCE, "SHOOT_A denied after the ACL change", || {
        tunnel(&lab, router, SHOOT_A, &vpn(a, None)).0 == Some(403)
    });
    eprintln!("ACL change in force after {took:?}");
    assert_eq!(tunnel(&lab, router, SHOOT_B, &vpn(a, None)).0, Some(200));
    open_a.send(b"still here\n");
    assert_eq!(open_a.read_until(b"still here\n"), b"still here\n");

    // The history expires: every watch gets 410 on resuming and lists again. No route is
    // lost meanwhile, and changes after the relist still apply.
    let before = api.requests().len();
    api.expire();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert_eq!(
            tunnel(&lab, router, SHOOT_B, &vpn(ha, Some(0))).0,
            Some(200),
            "route kept through the relist"
        );
        assert_eq!(
            tunnel(&lab, router, SHOOT_B, &vpn(a, None)).0,
            Some(200),
            "rules kept through the relist"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after: Vec<String> = api.requests()[before..].to_vec();
    assert!(
        after.iter().any(
            |r| r.starts_with("/apis/extensions.gardener.cloud/v1alpha1/extensions")
                && !r.contains("watch=")
        ),
        "the Extension watch listed again after the 410: {after:?}"
    );
    api.delete(kube_api::SERVICE, ha, "vpn-seed-server-1");
    within(IN_FORCE, "a deleted Service's route gone", || {
        tunnel(&lab, router, SHOOT_B, &vpn(ha, Some(1))).0 == Some(400)
    });
    open_a.send(b"after the relist\n");
    assert_eq!(
        open_a.read_until(b"after the relist\n"),
        b"after the relist\n"
    );
}

/// How long the router may take to apply a change made while the stand-in misbehaved, once
/// it behaves again: kube-runtime's watcher backs off exponentially from 0.8 s (doubling,
/// up to twice that with jitter) and resets only after a success, so after a 3 s outage
/// the retry that connects may come some 8 s after the stand-in is back, and the `410` it
/// gets (history lost) backs off up to 12.8 s more before the list (9.2 s measured).
const RECOVERY: Duration = Duration::from_secs(30);

/// For `time`: a new tunnel from SHOOT_A to shoot a and one from SHOOT_B to HA replica 0
/// route (with their upstream's greeting), and `open` passes bytes both ways; every 100 ms.
fn hold(lab: &Lab, router: SocketAddr, open: &mut Client, time: Duration, phase: &str) {
    let end = Instant::now() + time;
    for n in 0.. {
        let (code, _, greeting) = tunnel(lab, router, SHOOT_A, &vpn(A, None));
        assert_eq!(
            (code, greeting.as_str()),
            (Some(200), "vpn-a\n"),
            "{phase}: a new tunnel to shoot a"
        );
        let (code, _, greeting) = tunnel(lab, router, SHOOT_B, &vpn(HA, Some(0)));
        assert_eq!(
            (code, greeting.as_str()),
            (Some(200), "vpn-ha-0\n"),
            "{phase}: a new tunnel to HA replica 0"
        );
        let line = format!("{phase} {n}\n");
        open.send(line.as_bytes());
        assert_eq!(
            open.read_until(line.as_bytes()),
            line.as_bytes(),
            "{phase}: the open tunnel"
        );
        if Instant::now() >= end {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Shoot a's ACL allowing SHOOT_A, and SHOOT_B too when `b`.
fn acl_a(b: bool) -> serde_json::Value {
    let mut cidrs = vec![format!("{SHOOT_A}/32")];
    if b {
        cidrs.push(format!("{SHOOT_B}/32"));
    }
    acl(A, &cidrs.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Waits until a new tunnel from SHOOT_B to shoot a gets `code` (200: the ACL admits B,
/// 403: it does not), at most [`RECOVERY`]; the time it took.
fn until_b_on_a(lab: &Lab, router: SocketAddr, code: u16, what: &str) -> Duration {
    within(RECOVERY, what, || {
        tunnel(lab, router, SHOOT_B, &vpn(A, None)).0 == Some(code)
    })
}

/// The requests since `before` (`path?query`); panics when there are none.
fn since(api: &ApiServer, before: usize) -> Vec<String> {
    let after = api.requests()[before..].to_vec();
    assert!(!after.is_empty(), "the router asked nothing");
    after
}

fn is_list(request: &str) -> bool {
    !request.contains("watch=true")
}

#[test]
fn a_restarted_expiring_cutting_or_slow_stand_in_costs_no_route_and_no_tunnel() {
    let lab = Lab::new(&["ip"]);
    let api = three_shoots(&lab);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_running, addrs, admin) = start_router(&lab, &dir, &router_config(), &api);
    let router = addrs[0];
    within(Duration::from_secs(10), "/readyz 200", || {
        admin_get(&lab, admin, "/readyz") == Some(200)
    });
    let (code, mut open, greeting) = tunnel(&lab, router, SHOOT_A, &vpn(A, None));
    assert_eq!((code, greeting.as_str()), (Some(200), "vpn-a\n"));
    assert_eq!(tunnel(&lab, router, SHOOT_B, &vpn(A, None)).0, Some(403));
    let port = api.addr().port();

    // 1. The API server goes away for 3 s and comes back with the same objects and its
    // history: the watches resume from the version they had (no list), and a change made
    // after it is back applies.
    api.down();
    hold(&lab, router, &mut open, Duration::from_secs(3), "down");
    let before = api.requests().len();
    api.up(bind_api(&lab, port)).expect("up");
    hold(&lab, router, &mut open, Duration::from_secs(1), "back");
    api.apply(kube_api::EXTENSION, acl_a(true));
    let took = until_b_on_a(&lab, router, 200, "a change after the restart");
    eprintln!("restart, same objects: a change after it in force after {took:?}");
    let after = since(&api, before);
    assert!(
        !after.iter().any(|r| is_list(r)),
        "resumed, not listed again: {after:?}"
    );

    // 2. It goes away, an object changes meanwhile, and it comes back without the history
    // (a restarted API server's watch cache): 410, a list, and the change is in force.
    api.down();
    api.apply(kube_api::EXTENSION, acl_a(false));
    api.expire();
    hold(
        &lab,
        router,
        &mut open,
        Duration::from_secs(3),
        "down, changed",
    );
    assert_eq!(
        tunnel(&lab, router, SHOOT_B, &vpn(A, None)).0,
        Some(200),
        "the last policy stays while the API server is away"
    );
    let before = api.requests().len();
    api.up(bind_api(&lab, port)).expect("up");
    let took = until_b_on_a(&lab, router, 403, "the change made while away");
    eprintln!("restart, changed object, history lost: in force after {took:?}");
    hold(&lab, router, &mut open, Duration::from_secs(1), "relisted");
    let after = since(&api, before);
    assert!(
        after
            .iter()
            .any(|r| r.starts_with(kube_api::EXTENSION.path) && is_list(r)),
        "listed again after the 410: {after:?}"
    );

    // 3. 410 Gone to every watch, with a change right behind it.
    api.expire();
    api.apply(kube_api::EXTENSION, acl_a(true));
    hold(&lab, router, &mut open, Duration::from_secs(1), "410");
    let took = until_b_on_a(&lab, router, 200, "the change behind the 410");
    eprintln!("410: the change behind it in force after {took:?}");

    // 4. Every watch cut mid-stream, with a change right behind: resumed from the version
    // seen (the Extensions are not listed again; other kinds may still be finishing the
    // relists of step 3), the change applies.
    let before = api.requests().len();
    api.drop_connections();
    api.apply(kube_api::EXTENSION, acl_a(false));
    hold(&lab, router, &mut open, Duration::from_secs(1), "cut");
    let took = until_b_on_a(&lab, router, 403, "the change behind the cut");
    eprintln!("watches cut: the change behind it in force after {took:?}");
    let after = since(&api, before);
    assert!(
        !after
            .iter()
            .any(|r| r.starts_with(kube_api::EXTENSION.path) && is_list(r)),
        "resumed, not listed again: {after:?}"
    );

    // 5. Slow answers: every request 3 s late, and the history gone, so the lists that
    // follow take seconds. The routes stay through the slow relist; a Service deleted and
    // the ACL changed meanwhile apply once it is done.
    api.set_delay(Duration::from_secs(3));
    api.expire();
    api.apply(kube_api::EXTENSION, acl_a(true));
    api.delete(kube_api::SERVICE, HA, "vpn-seed-server-1");
    hold(&lab, router, &mut open, Duration::from_secs(4), "slow");
    let took = until_b_on_a(&lab, router, 200, "the change made during the slow relist");
    within(
        RECOVERY,
        "the Service deleted during the slow relist",
        || tunnel(&lab, router, SHOOT_B, &vpn(HA, Some(1))).0 == Some(400),
    );
    eprintln!("slow answers (3 s): the changes in force after {took:?} more");
    api.set_delay(Duration::ZERO);
    api.apply(kube_api::SERVICE, ha_service(1));
    // The watch asked for while answers were slow answers 3 s late.
    within(RECOVERY, "the Service back", || {
        tunnel(&lab, router, SHOOT_B, &vpn(HA, Some(1))).0 == Some(200)
    });
    hold(&lab, router, &mut open, Duration::ZERO, "end");
}

#[test]
fn readiness_waits_for_the_first_complete_sync_when_the_first_list_is_slow() {
    const SLOW: Duration = Duration::from_secs(2);
    let lab = Lab::new(&["ip"]);
    let api = three_shoots(&lab);
    api.set_delay(SLOW);
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let (_running, addrs, admin) = start_router(&lab, &dir, &router_config(), &api);
    let router = addrs[0];
    // No list has been answered yet: not ready.
    while started.elapsed() < SLOW - Duration::from_millis(300) {
        assert_eq!(
            admin_get(&lab, admin, "/readyz"),
            Some(503),
            "ready before any list was answered ({:?})",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    within(Duration::from_secs(15), "/readyz 200", || {
        admin_get(&lab, admin, "/readyz") == Some(200)
    });
    eprintln!("ready after {:?}", started.elapsed());
    assert!(started.elapsed() >= SLOW);
    // Ready is the whole policy: every shoot's routes and rules at once.
    let (code, _, greeting) = tunnel(&lab, router, SHOOT_A, &vpn(A, None));
    assert_eq!((code, greeting.as_str()), (Some(200), "vpn-a\n"));
    assert_eq!(tunnel(&lab, router, SHOOT_B, &vpn(A, None)).0, Some(403));
    for i in 0..2u8 {
        let (code, _, greeting) = tunnel(&lab, router, SHOOT_B, &vpn(HA, Some(i)));
        assert_eq!((code, greeting), (Some(200), format!("vpn-ha-{i}\n")));
    }
    assert_eq!(tunnel(&lab, router, SHOOT_B, &vpn(H, None)).0, Some(503));
}
