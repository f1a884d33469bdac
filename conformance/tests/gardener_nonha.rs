//! Gardener's non-HA VPN pods replayed from our images (`images/build`), one lab namespace per
//! pod, each container started from its image's root filesystem by `lab::container` with
//! Gardener's command, environment, volumes and security context (gardener-pods.md §2.1,
//! §2.4, §2.6), probed by a kubelet at Gardener's periods:
//!
//! * seed pod `vpn-seed-server`: init `setup` (privileged), `vpn-seed-server` (the image's
//!   entrypoint, `NET_ADMIN` + `NET_RAW`), `envoy-proxy` (our envoy-proxy image,
//!   `envoy --concurrency 2 -c /etc/envoy/envoy.yaml`, Gardener's envoy.yaml, uid 65532,
//!   group 31415, every capability dropped, no environment);
//! * the ingress: our router with `X-Gardener-Destination` on 8443 (a process: Istio's place
//!   has no image of ours);
//! * shoot pod `vpn-shoot`: init `vpn-shoot-init` (privileged), `vpn-shoot` (the image's
//!   entrypoint, `NET_ADMIN`), `ENDPOINT` a DNS name with Gardener's trailing dot, answered
//!   by a resolver on the shoot's network (the pod's `dnsPolicy: Default`);
//! * a kube-apiserver, a shoot node (kubelet) and a webhook pod: `conformance::gardener::checks`.
//!
//! It shows: the seed pod Ready at its first readiness probe (15 s, as early as vpn2's can
//! be) with no client, still Ready with the shoot's client; liveness failing when the status
//! file goes stale; every traffic check of `verdict::traffic_checks` (kubelet and webhook over
//! IPv4 and IPv6 from the vpn-shoot pod's address, the gardenlet's check, the overlap, MSS,
//! silence toward the seed); the metric names Gardener's scrape jobs keep; the rules in both
//! pods after start, a second start, `kill -9` and restart, and a clean exit.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::gardener::checks::{self, Egress, Family};
use conformance::gardener::kubelet::{exec_probe, init, tcp_probe, Prober, Timing};
use conformance::gardener::landscape::{
    Landscape, INGRESS_LB, SEED_POD, SEED_POD_NETWORK, SHOOT_NODE_NETWORKS, SHOOT_POD_NETWORKS,
    SHOOT_SERVICE_NETWORKS,
};
use conformance::gardener::pods::{
    header_value, start_ingress, Binaries, Mounts, HEADER_KEY, IP_FAMILIES, OPENVPN_PORT,
};
use conformance::gardener::rules::{self, vpn2_shoot};
use conformance::gardener::verdict::{
    self, our_seed_rules, our_seed_rules_after_exit, our_seed_rules_after_kill,
    our_seed_rules_at_first_start,
};
use conformance::netns::Netns;
use conformance::require_lab;
use lab::container::{Container, ContainerSpec, Pod, SecurityContext, VolumeSource};
use lab::image::Image;
use lab::sidecar_client::try_scrape;
use rustix::process::Signal;

/// The shoot's `ENDPOINT`: Gardener's internal API domain, with the trailing dot it renders.
const ENDPOINT: &str = "api.checks.lab.internal.example.com.";
/// The resolver the vpn-shoot pod's node uses (on the shoot router, the pod's gateway).
const SHOOT_RESOLVER: Ipv4Addr = Ipv4Addr::new(100, 96, 10, 1);
/// The status file, as Gardener sets `OPENVPN_STATUS_PATH`.
const STATUS_PATH: &str = "/srv/status/openvpn.status";
/// Gardener's probes (gardener-pods.md §2.1, §2.6): exec readiness after 15 s, exec liveness
/// after 5 s, Envoy's TCP probes with no delay; Kubernetes' defaults otherwise.
const SEED_READINESS: Timing = Timing::after(Duration::from_secs(15));
const SEED_LIVENESS: Timing = Timing::after(Duration::from_secs(5));
const ENVOY_TCP: Timing = Timing::after(Duration::ZERO);
/// How often the server writes the status file (vpn2's `status <path> 15`).
const STATUS_INTERVAL: Duration = Duration::from_secs(15);
/// vpn2's liveness limit: the status file's TIME at most this old.
const STALE_AFTER: Duration = Duration::from_secs(17);
/// How long the tunnel may take to come up.
const TUNNEL: Duration = Duration::from_secs(45);
/// How long a container may take to start or stop.
const START: Duration = Duration::from_secs(30);

/// The series Gardener's `reversed-vpn-envoy-side-car` job keeps (gardener-pods.md §5); the
/// first element of each pair is the name, the second a label it must carry.
const ENVOY_KEPT: &[(&str, &str)] = &[
    (
        "envoy_cluster_external_upstream_rq",
        "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"",
    ),
    ("envoy_cluster_external_upstream_rq_completed", CLUSTER),
    ("envoy_cluster_external_upstream_rq_xx", CLUSTER),
    ("envoy_cluster_lb_healthy_panic", CLUSTER),
    ("envoy_cluster_original_dst_host_invalid", CLUSTER),
    ("envoy_cluster_upstream_cx_active", CLUSTER),
    (
        "envoy_cluster_upstream_cx_connect_attempts_exceeded",
        CLUSTER,
    ),
    ("envoy_cluster_upstream_cx_connect_fail", CLUSTER),
    ("envoy_cluster_upstream_cx_connect_timeout", CLUSTER),
    ("envoy_cluster_upstream_cx_max_requests", CLUSTER),
    ("envoy_cluster_upstream_cx_none_healthy", CLUSTER),
    ("envoy_cluster_upstream_cx_overflow", CLUSTER),
    ("envoy_cluster_upstream_cx_pool_overflow", CLUSTER),
    ("envoy_cluster_upstream_cx_protocol_error", CLUSTER),
    ("envoy_cluster_upstream_cx_rx_bytes_total", CLUSTER),
    ("envoy_cluster_upstream_cx_total", CLUSTER),
    ("envoy_cluster_upstream_cx_tx_bytes_total", CLUSTER),
    ("envoy_cluster_upstream_cx_connect_ms_bucket", CLUSTER),
    ("envoy_cluster_upstream_cx_connect_ms_sum", CLUSTER),
    ("envoy_cluster_upstream_cx_length_ms_bucket", CLUSTER),
    ("envoy_cluster_upstream_cx_length_ms_sum", CLUSTER),
    ("envoy_cluster_upstream_rq", CLUSTER),
    ("envoy_cluster_upstream_rq_completed", CLUSTER),
    ("envoy_cluster_upstream_rq_max_duration_reached", CLUSTER),
    ("envoy_cluster_upstream_rq_pending_overflow", CLUSTER),
    ("envoy_cluster_upstream_rq_per_try_timeout", CLUSTER),
    ("envoy_cluster_upstream_rq_retry", CLUSTER),
    ("envoy_cluster_upstream_rq_retry_limit_exceeded", CLUSTER),
    ("envoy_cluster_upstream_rq_retry_overflow", CLUSTER),
    ("envoy_cluster_upstream_rq_rx_reset", CLUSTER),
    ("envoy_cluster_upstream_rq_timeout", CLUSTER),
    ("envoy_cluster_upstream_rq_total", CLUSTER),
    ("envoy_cluster_upstream_rq_tx_reset", CLUSTER),
    ("envoy_cluster_upstream_rq_xx", CLUSTER),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_attempt",
        "",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_failure",
        "",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_success",
        "",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_host_overflow",
        "",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_num_hosts",
        "",
    ),
    ("envoy_http_downstream_cx_rx_bytes_total", HCM),
    ("envoy_http_downstream_cx_total", HCM),
    ("envoy_http_downstream_cx_tx_bytes_total", HCM),
    ("envoy_http_downstream_cx_length_ms_bucket", HCM),
    ("envoy_http_downstream_cx_length_ms_sum", HCM),
    ("envoy_http_downstream_rq_xx", HCM),
    ("envoy_http_no_route", HCM),
    ("envoy_http_rq_total", HCM),
    ("envoy_listener_http_downstream_rq_xx", HCM),
    ("envoy_server_memory_allocated", ""),
    ("envoy_server_memory_heap_size", ""),
    ("envoy_server_memory_physical_size", ""),
];
const CLUSTER: &str = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";
const HCM: &str = "envoy_http_conn_manager_prefix=\"ingress_http\"";

/// The series Gardener's `openvpn-server-exporter` job keeps (gardener-pods.md §5), each with
/// the labels its relabelling reads.
const EXPORTER_KEPT: &[(&str, &[&str])] = &[
    (
        "openvpn_server_client_received_bytes_total",
        &[
            "common_name=\"vpn-shoot-client\"",
            "real_address=",
            "virtual_address=",
            "username=",
            "connection_time=",
            "status_path=",
        ],
    ),
    (
        "openvpn_server_client_sent_bytes_total",
        &["common_name=\"vpn-shoot-client\"", "real_address="],
    ),
    (
        "openvpn_server_route_last_reference_time_seconds",
        &["common_name=\"vpn-shoot-client\"", "virtual_address="],
    ),
    ("openvpn_status_update_time_seconds", &["status_path="]),
    ("openvpn_up", &["status_path="]),
    ("openvpn_netstat_Tcp_OutSegs", &[]),
    ("openvpn_netstat_Tcp_RetransSegs", &[]),
];

/// A program started in a namespace, stopped by PID when dropped.
struct Process<'ns> {
    ns: &'ns Netns,
    pid: u32,
}

impl Drop for Process<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
    }
}

/// The node's resolver for the shoot: dnsmasq answering `ENDPOINT` with the ingress's
/// load-balancer address, nothing else (no upstream, no hosts file).
fn shoot_resolver(ns: &Netns) -> Result<Process<'_>, lab::LabError> {
    let name = ENDPOINT.trim_end_matches('.');
    let mut cmd = ns.command("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        &format!("--listen-address={SHOOT_RESOLVER}"),
        "--pid-file=",
        "--user=root",
        &format!("--host-record={name},{INGRESS_LB}"),
    ]);
    let pid = ns.spawn(&mut cmd)?;
    let p = Process { ns, pid };
    // dnsmasq answers once it has bound; wait for the port.
    let deadline = Instant::now() + START;
    while Instant::now() < deadline {
        let bound = ns.run(["ss", "-Hlun", &format!("src {SHOOT_RESOLVER}:53")])?;
        if !bound.stdout.is_empty() {
            return Ok(p);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(lab::LabError::Timeout {
        what: "dnsmasq listening".into(),
        waited: START,
        log: String::new(),
    })
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A file of the generated secrets.
fn secret(mounts: &Mounts, rel: &str) -> Vec<u8> {
    let path = mounts.dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Gardener's envoy.yaml for the vpn-seed-server pod (our rendering of its template with the
/// values Gardener uses, shared with vpn-server's Envoy-mode tests).
fn envoy_yaml() -> Vec<u8> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sidecar/fixtures/gardener-envoy.yaml");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The images, opened (built first if the checkout changed).
struct Images {
    server: Image,
    client: Image,
    envoy: Image,
}

impl Images {
    fn open() -> Images {
        let open = |name: &str| {
            Image::built(name)
                .unwrap_or_else(|e| panic!("image {name}: {}", verdict::explain(&e, &[])))
        };
        Images {
            server: open("vpn-server"),
            client: open("vpn-client"),
            envoy: open("envoy-proxy"),
        }
    }
}

/// The seed pod's volumes (gardener-pods.md §2.1).
fn seed_pod(l: &Landscape, mounts: &Mounts) -> Pod {
    let pod = Pod::new(&l.seed_pod, "vpn-seed-server-7c9d8b6f5-q4x2z").expect("seed pod");
    let files = |names: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
        names
            .iter()
            .map(|(key, rel)| ((*key).to_owned(), secret(mounts, rel)))
            .collect()
    };
    let volumes = [
        ("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into())),
        (
            "certs",
            VolumeSource::Files {
                files: files(&[
                    ("ca.crt", "seed/vpn-server/ca.crt"),
                    ("tls.crt", "seed/vpn-server/tls.crt"),
                    ("tls.key", "seed/vpn-server/tls.key"),
                ]),
                mode: 0o644,
            },
        ),
        (
            "tlsauth",
            VolumeSource::Files {
                files: files(&[("vpn.tlsauth", "seed/tlsauth/vpn.tlsauth")]),
                mode: 0o400,
            },
        ),
        ("openvpn-status", VolumeSource::EmptyDir),
        (
            "envoy-config",
            VolumeSource::Files {
                files: vec![("envoy.yaml".to_owned(), envoy_yaml())],
                mode: 0o644,
            },
        ),
    ];
    for (name, source) in volumes {
        pod.add_volume(name, source).expect("seed pod volume");
    }
    pod
}

/// The `vpn-seed-server` container (gardener-pods.md §2.1).
fn vpn_seed_server() -> ContainerSpec {
    let mut spec = ContainerSpec::new("vpn-seed-server");
    for (k, v) in [
        ("IP_FAMILIES", IP_FAMILIES),
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS),
        ("SEED_POD_NETWORK", SEED_POD_NETWORK),
        ("LOCAL_NODE_IP", "100.96.0.1"),
        ("OPENVPN_STATUS_PATH", STATUS_PATH),
    ] {
        spec = spec.env(k, v);
    }
    spec.mount("dev-net-tun", "/dev/net/tun")
        .mount("certs", "/srv/secrets/vpn-server")
        .mount("tlsauth", "/srv/secrets/tlsauth")
        .mount("openvpn-status", "/srv/status")
        .security(SecurityContext {
            add: vec!["NET_ADMIN".into(), "NET_RAW".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

/// The `envoy-proxy` container (gardener-pods.md §2.6): no environment.
fn envoy_proxy() -> ContainerSpec {
    ContainerSpec::new("envoy-proxy")
        .command(["envoy", "--concurrency", "2", "-c", "/etc/envoy/envoy.yaml"])
        .mount("certs", "/srv/secrets/envoy-proxy")
        .mount("envoy-config", "/etc/envoy")
        .security(SecurityContext {
            drop: vec!["ALL".into()],
            run_as_group: Some(31415),
            run_as_non_root: true,
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

/// The vpn-shoot pod's volumes (gardener-pods.md §2.4), plus the resolver configuration the
/// kubelet gives a `dnsPolicy: Default` pod (the node's).
fn shoot_pod(l: &Landscape, mounts: &Mounts) -> Pod {
    let pod = Pod::new(&l.vpn_shoot, "vpn-shoot-6d9c5b7f4-x2k8q").expect("vpn-shoot pod");
    let volumes = [
        (
            "vpn-shoot",
            VolumeSource::Files {
                files: vec![
                    ("ca.crt".into(), secret(mounts, "shoot/vpn-client/ca.crt")),
                    ("tls.crt".into(), secret(mounts, "shoot/vpn-client/tls.crt")),
                    ("tls.key".into(), secret(mounts, "shoot/vpn-client/tls.key")),
                ],
                mode: 0o400,
            },
        ),
        (
            "vpn-shoot-tlsauth",
            VolumeSource::Files {
                files: vec![(
                    "vpn.tlsauth".into(),
                    secret(mounts, "shoot/tlsauth/vpn.tlsauth"),
                )],
                mode: 0o400,
            },
        ),
        ("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into())),
        (
            "etc",
            VolumeSource::Files {
                files: vec![(
                    "resolv.conf".into(),
                    format!("nameserver {SHOOT_RESOLVER}\n").into_bytes(),
                )],
                mode: 0o644,
            },
        ),
    ];
    for (name, source) in volumes {
        pod.add_volume(name, source).expect("vpn-shoot pod volume");
    }
    pod
}

/// The `vpn-shoot-init` container (gardener-pods.md §2.4): privileged, no mounts.
fn vpn_shoot_init() -> ContainerSpec {
    let mut spec = ContainerSpec::new("vpn-shoot-init").command(["/bin/vpn-client", "setup"]);
    for (k, v) in env(&[
        ("IP_FAMILIES", IP_FAMILIES),
        ("IS_SHOOT_CLIENT", "true"),
        ("POD_NAME", "vpn-shoot-6d9c5b7f4-x2k8q"),
    ]) {
        spec = spec.env(&k, &v);
    }
    spec.security(SecurityContext::privileged())
}

/// The `vpn-shoot` container (gardener-pods.md §2.4).
fn vpn_shoot() -> ContainerSpec {
    let header = header_value();
    let port = OPENVPN_PORT.to_string();
    let mut spec = ContainerSpec::new("vpn-shoot");
    for (k, v) in [
        ("IP_FAMILIES", IP_FAMILIES),
        ("ENDPOINT", ENDPOINT),
        ("OPENVPN_PORT", port.as_str()),
        ("REVERSED_VPN_HEADER", header.as_str()),
        ("REVERSED_VPN_HEADER_KEY", HEADER_KEY),
        ("IS_SHOOT_CLIENT", "true"),
        ("SEED_POD_NETWORK", SEED_POD_NETWORK),
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS),
    ] {
        spec = spec.env(k, v);
    }
    spec.mount("vpn-shoot", "/srv/secrets/vpn-client")
        .mount("vpn-shoot-tlsauth", "/srv/secrets/tlsauth")
        .mount("dev-net-tun", "/dev/net/tun")
        .mount("etc", "/etc")
        .security(SecurityContext {
            add: vec!["NET_ADMIN".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

/// Every kept series of `names` has a sample carrying each of its labels.
fn assert_series(text: &str, kept: &[(&str, &[&str])], what: &str) {
    for (name, labels) in kept {
        let ok = text.lines().any(|line| {
            let Some(rest) = line.strip_prefix(name) else {
                return false;
            };
            (rest.starts_with('{') || rest.starts_with(' '))
                && labels.iter().all(|l| rest.contains(l))
        });
        assert!(
            ok,
            "{what}: no sample of {name} with {labels:?} in:\n{text}"
        );
    }
}

/// `GET /metrics` from inside `ns` until it answers (a freshly started exporter), at most
/// [`START`].
fn wait_scrape(ns: &Netns, addr: SocketAddr) -> String {
    let deadline = Instant::now() + START;
    loop {
        match ns.run_in(|| try_scrape(addr)).expect("scrape") {
            Ok(text) => return text,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("GET /metrics from {addr}: {e}"),
        }
    }
}

/// `VmRSS` of a process in KiB (0 if unreadable).
fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// SIGTERM or SIGKILL to a container; how it ended.
fn stop(c: &Container, signal: Signal) -> std::process::ExitStatus {
    c.signal(signal);
    c.wait(START)
        .unwrap_or_else(|e| panic!("{} did not end: {e}", c.name()))
}

#[test]
fn gardeners_non_ha_pods_run_from_our_images() {
    require_lab(&["nft", "tcpdump", "dnsmasq", "ss", "buildah"]);
    let images = Images::open();
    let bins = Binaries::locate().unwrap_or_else(|e| panic!("{}", verdict::explain(&e, &[])));
    let l = Landscape::build().expect("landscape");
    let mounts = Mounts::generate().expect("secrets");
    let egress = Egress::new(&mounts.pki.bundle, &mounts.pki.client).expect("egress");
    let seed = seed_pod(&l, &mounts);
    let shoot = shoot_pod(&l, &mounts);
    let (seed_logs, shoot_logs) = (seed.logs_dir(), shoot.logs_dir());
    let logs: [&Path; 3] = [mounts.dir(), &seed_logs, &shoot_logs];
    let logs = &logs[..];
    let status_file = seed
        .logs_dir()
        .join("../volumes/openvpn-status/openvpn.status");

    // Seed pod: init, then its two main containers; the ingress; the shoot's resolver.
    let setup = init(
        &seed,
        &images.server,
        &ContainerSpec::new("setup")
            .command(["/bin/vpn-server", "setup"])
            .security(SecurityContext::privileged()),
        START,
        logs,
    );
    eprintln!("setup: {}", setup.trim());
    let _ingress = verdict::step(
        "ingress",
        logs,
        start_ingress(&bins, &l.ingress, mounts.dir()),
    );
    let _resolver = verdict::step("resolver", logs, shoot_resolver(&l.shoot_router));
    let started = Instant::now();
    let mut server = verdict::step(
        "vpn-seed-server",
        logs,
        seed.start(&images.server, &vpn_seed_server()),
    );
    let envoy = verdict::step(
        "envoy-proxy",
        logs,
        seed.start(&images.envoy, &envoy_proxy()),
    );
    let mut client = None;

    std::thread::scope(|scope| {
        let readiness = Prober::start(
            scope,
            "vpn-seed-server readiness",
            SEED_READINESS,
            started,
            exec_probe(|| &server, &["/bin/vpn-server", "readiness"]),
        );
        let liveness = Prober::start(
            scope,
            "vpn-seed-server liveness",
            SEED_LIVENESS,
            started,
            exec_probe(|| &server, &["/bin/vpn-server", "liveness"]),
        );
        let envoy_ready = Prober::start(
            scope,
            "envoy-proxy readiness",
            ENVOY_TCP,
            started,
            tcp_probe(&l.seed_router, SocketAddr::new(IpAddr::V4(SEED_POD), 9443)),
        );

        // Ready with no client, as early as vpn2's pod can be: at the first readiness run.
        readiness.wait_until(Duration::from_secs(25), |runs| !runs.is_empty());
        assert_eq!(
            readiness.ready_at(),
            Some(SEED_READINESS.initial_delay),
            "{}",
            readiness.report()
        );
        let envoy_at = envoy_ready.ready_at();
        assert!(
            envoy_at.is_some_and(|at| at <= SEED_READINESS.initial_delay),
            "{}",
            envoy_ready.report()
        );
        assert!(
            liveness.runs().iter().all(|r| r.passed),
            "{}",
            liveness.report()
        );
        eprintln!("seed pod Ready at 15 s (envoy-proxy at {envoy_at:?}), no client");

        // The shoot pod; the tunnel through the ingress; still Ready with the shoot's client.
        let init_log = init(&shoot, &images.client, &vpn_shoot_init(), START, logs);
        eprintln!("vpn-shoot-init: {}", init_log.trim());
        client = Some(verdict::step(
            "vpn-shoot",
            logs,
            shoot.start(&images.client, &vpn_shoot()),
        ));
        verdict::check("tunnel up", logs, checks::wait_tunnel(&l, TUNNEL));
        // The status file names the client at its next write (every 15 s); a readiness run
        // after that passes too.
        let deadline = Instant::now() + STATUS_INTERVAL + Duration::from_secs(5);
        let listed = loop {
            let status = std::fs::read_to_string(&status_file).unwrap_or_default();
            if status.contains("\nCLIENT_LIST,vpn-shoot-client,") {
                break started.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "the status file never lists the client: {status}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let runs = readiness.wait_until(SEED_READINESS.period + Duration::from_secs(5), |runs| {
            runs.iter().any(|r| r.at > listed)
        });
        assert!(runs.iter().any(|r| r.at > listed), "{}", readiness.report());
        assert!(runs.iter().all(|r| r.passed), "{}", readiness.report());

        verdict::traffic_checks(&l, &egress, logs, &[1194, 9443, 15000]);
        for c in [&server, &envoy] {
            // Shown, not asserted: memory is measured by the bench.
            eprintln!(
                "{} VmRSS after the checks: {} KiB",
                c.name(),
                vm_rss_kib(c.pid())
            );
        }

        // What Gardener's Prometheus scrapes: envoy-proxy on 15000, from the seed's network.
        let text = wait_scrape(&l.seed_router, SocketAddr::new(IpAddr::V4(SEED_POD), 15000));
        let kept: Vec<(&str, &[&str])> = ENVOY_KEPT
            .iter()
            .map(|(name, label)| {
                (
                    *name,
                    if label.is_empty() {
                        &[][..]
                    } else {
                        std::slice::from_ref(label)
                    },
                )
            })
            .collect();
        assert_series(&text, &kept, "envoy-proxy :15000");
        // The HA job's exporter on the same status file, run in the seed pod beside the
        // server (in HA it is a container of its own; here 15000 is envoy-proxy's).
        let mut exporter = server
            .exec_spawn(&["/bin/vpn-server", "exporter", "--listen", "127.0.0.1:15001"])
            .expect("exporter");
        let exported = wait_scrape(&l.seed_pod, SocketAddr::from(([127, 0, 0, 1], 15001)));
        exporter.wait(Duration::ZERO);
        assert_series(&exported, EXPORTER_KEPT, "exporter");
        let up = format!("openvpn_up{{status_path=\"{STATUS_PATH}\"}} 1");
        assert!(exported.lines().any(|line| line == up), "{exported}");

        // Liveness fails once the status file goes stale (the server stopped, nothing writes
        // it) and the kubelet would restart the container; it passes again once it runs.
        let before = liveness.runs().len();
        server.signal(Signal::STOP);
        let runs = liveness.wait_until(STALE_AFTER + Duration::from_secs(45), |runs| {
            runs[before..]
                .windows(3)
                .any(|w| w.iter().all(|r| !r.passed))
        });
        server.signal(Signal::CONT);
        assert!(
            runs[before..]
                .windows(3)
                .any(|w| w.iter().all(|r| !r.passed && r.output.contains("stale"))),
            "{}",
            liveness.report()
        );
        let after = liveness.runs().len();
        let runs = liveness.wait_until(Duration::from_secs(30), |runs| {
            runs[after..].iter().any(|r| r.passed)
        });
        assert!(
            runs[after..].iter().any(|r| r.passed),
            "{}",
            liveness.report()
        );
        eprintln!("liveness: {}", liveness.report());
    });
    let mut client = client.expect("vpn-shoot started");
    verdict::check(
        "tunnel after the pause",
        logs,
        checks::wait_tunnel(&l, TUNNEL),
    );

    // The rules: after start; once both stopped only the seed's tunnel-only rules (V8); once
    // after a second start; after kill -9 the seed pod's all (V1), the vpn-shoot pod's none;
    // after a clean exit again only the tunnel-only rules.
    let seed_rules = our_seed_rules();
    let shoot_rules = vpn2_shoot(&rules::LANDSCAPE_NETMAP);
    verdict::rules_are(
        &l,
        logs,
        "after start",
        &our_seed_rules_at_first_start(),
        &shoot_rules,
    );
    assert!(stop(&server, Signal::TERM).success(), "{}", server.stderr());
    assert!(stop(&client, Signal::TERM).success(), "{}", client.stderr());
    verdict::rules_are(
        &l,
        logs,
        "after both stopped",
        &our_seed_rules_after_exit(),
        &[],
    );
    server = verdict::step(
        "vpn-seed-server again",
        logs,
        seed.start(&images.server, &vpn_seed_server()),
    );
    client = verdict::step(
        "vpn-shoot again",
        logs,
        shoot.start(&images.client, &vpn_shoot()),
    );
    verdict::check("tunnel up again", logs, checks::wait_tunnel(&l, TUNNEL));
    verdict::rules_are(&l, logs, "after a second start", &seed_rules, &shoot_rules);
    assert!(!stop(&server, Signal::KILL).success());
    assert!(!stop(&client, Signal::KILL).success());
    verdict::rules_are(&l, logs, "after kill -9", &our_seed_rules_after_kill(), &[]);
    server = verdict::step(
        "vpn-seed-server after kill -9",
        logs,
        seed.start(&images.server, &vpn_seed_server()),
    );
    client = verdict::step(
        "vpn-shoot after kill -9",
        logs,
        shoot.start(&images.client, &vpn_shoot()),
    );
    verdict::check(
        "tunnel up after kill -9",
        logs,
        checks::wait_tunnel(&l, TUNNEL),
    );
    verdict::rules_are(
        &l,
        logs,
        "after kill -9 and restart",
        &seed_rules,
        &shoot_rules,
    );
    verdict::check(
        "kubelet after the restarts",
        logs,
        checks::kubelet(&l, &egress, Family::V4),
    );
    assert!(stop(&client, Signal::TERM).success(), "{}", client.stderr());
    assert!(stop(&server, Signal::TERM).success(), "{}", server.stderr());
    verdict::rules_are(
        &l,
        logs,
        "after a clean exit",
        &our_seed_rules_after_exit(),
        &[],
    );
    drop(envoy);
}
