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

mod router_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use conformance::kube_api::{self, ApiServer};
use router_common::{connect, status, Client, Lab, SEED, SHOOT_A, SHOOT_B};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use vpn_router::kubernetes::{Options, Settings};
use vpn_router::Router;

const ISTIO_NS: &str = "istio-ingress";
/// What the issue asks: a change in force for new connections within this.
const IN_FORCE: Duration = Duration::from_secs(2);

fn service(ip: Ipv4Addr, ns: &str, name: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"port": p})).collect();
    json!({
        "metadata": {"namespace": ns, "name": name,
                     "annotations": {"networking.istio.io/exportTo": ISTIO_NS}},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "ports": ports},
    })
}

fn cluster(ns: &str, shoot: &str, hibernated: bool) -> Value {
    json!({
        "metadata": {"name": ns},
        "spec": {
            "shoot": {
                "metadata": {"name": shoot, "namespace": "garden-p"},
                "spec": {"networking": {"nodes": "10.180.0.0/16"},
                         "provider": {"workers": [{"name": "w"}]},
                         "hibernation": {"enabled": hibernated}},
                "status": {"isHibernated": hibernated, "technicalID": ns,
                           "advertisedAddresses": [{"name": "external",
                                                    "url": format!("https://api.{shoot}.p.example.com")}]},
            },
            "seed": {"spec": {"networks": {"nodes": "10.250.0.0/16", "pods": "10.96.0.0/11"}}},
        },
    })
}

fn acl(ns: &str, cidrs: &[&str]) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": "acl"},
        "spec": {"type": "acl",
                 "providerConfig": {"rule": {"action": "ALLOW", "type": "remote_ip", "cidrs": cidrs}}},
    })
}

fn infrastructure(ns: &str, shoot: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": shoot},
           "status": {"egressCIDRs": ["203.0.113.10/32"]}})
}

fn sni_objects(api: &ApiServer, ns: &str, hosts: &[&str]) {
    api.apply(
        kube_api::GATEWAY,
        json!({"metadata": {"namespace": ns, "name": "kube-apiserver"},
               "spec": {"selector": {"app": "istio-ingressgateway", "istio": "ingressgateway",
                                     "istio-role": "seed"},
                        "servers": [{"port": {"number": 443, "name": "tls", "protocol": "TLS"},
                                     "tls": {"mode": "PASSTHROUGH"}, "hosts": hosts}]}}),
    );
    api.apply(
        kube_api::VIRTUAL_SERVICE,
        json!({"metadata": {"namespace": ns, "name": "kube-apiserver"},
               "spec": {"hosts": hosts, "gateways": ["kube-apiserver"], "exportTo": [ISTIO_NS],
                        "tls": [{"match": [{"port": 443, "sniHosts": hosts}],
                                 "route": [{"destination": {
                                     "host": format!("kube-apiserver.{ns}.svc.cluster.local"),
                                     "port": {"number": 443}}}]}]}}),
    );
}

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

fn vpn(ns: &str, replica: Option<u8>) -> String {
    match replica {
        None => format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local"),
        Some(i) => format!("outbound|1194||vpn-seed-server-{i}.{ns}.svc.cluster.local"),
    }
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
            labels: [
                ("app", "istio-ingressgateway"),
                ("istio", "ingressgateway"),
                ("istio-role", "seed"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
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

#[test]
fn routes_follow_the_objects_acl_changes_apply_within_2s_and_a_410_costs_no_route() {
    let lab = Lab::new(&["ip"]);
    // One SEED address per Service (its cluster IP).
    let ip = |last: u8| Ipv4Addr::new(10, 79, 0, last);
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
    upstream(&lab, ip(11), 1194, "vpn-a");
    upstream(&lab, ip(12), 443, "kube-apiserver-a");
    // Hibernated: ip(21) has no server on 1194.
    upstream(&lab, ip(31), 1194, "vpn-ha-0");
    upstream(&lab, ip(32), 1194, "vpn-ha-1");

    let listener = lab
        .seed
        .run_in(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .expect("run_in")
        .expect("bind stand-in");
    let api = ApiServer::start(listener, &kube_api::ROUTER_RESOURCES).expect("stand-in");

    let (a, h, ha) = ("shoot--p--a", "shoot--p--h", "shoot--p--ha");
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
        api.apply(
            kube_api::SERVICE,
            service(
                ip(31 + i),
                ha,
                &format!("vpn-seed-server-{i}"),
                &[1194, 9443, 15000],
            ),
        );
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "metrics_listen = \"127.0.0.1:0\"\n\
         [timeouts]\nconnect_ms = 1000\n\
         [[listener]]\naddress = \"{SEED}:0\"\nheaders = [\"X-Gardener-Destination\"]\n\
         [[listener]]\naddress = \"{SEED}:0\"\nkind = \"sni\"\n"
    );
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
