//! Gardener's HA VPN pods (gardener-pods.md §2.2, 2.3, 2.5, 3.9, 3.10, 9) replayed from our
//! images (`images/build`): every container started by `lab::container` from its image's root
//! filesystem with Gardener's command, environment, volumes and security context, probed by a
//! kubelet ([`conformance::gardener::kubelet`]) at Gardener's periods. `gardener_ha.rs` runs
//! the same layout with the binaries as processes and measures failover; this test shows the
//! pods themselves work unchanged:
//!
//! ```text
//!  SEED (pods 10.1.0.0/16)                                       SHOOT
//!  kube-apiserver-0 10.1.1.20  vpn-client-init, vpn-client-0/1,  ┐   ┌ vpn-shoot-0 100.96.10.10  vpn-shoot-init,
//!  kube-apiserver-1 10.1.2.20    vpn-path-controller             ┤   │   vpn-shoot-s0/s1, tunnel-controller
//!  vpn-seed-server-0 10.1.3.10  setup, vpn-seed-server,          ┼ R ┼ vpn-shoot-1 100.96.11.10  (the same)
//!  vpn-seed-server-1 10.1.4.10    openvpn-exporter               ┤   └ node 10.250.0.5 (UDP and TCP echo)
//!  ingress 10.1.5.30 + LB 203.0.113.10 (our vpn-router, a process)┘
//! ```
//!
//! Names are resolved as in the cluster: the kube-apiserver pods (`dnsPolicy: ClusterFirst`)
//! ask a resolver standing in for cluster DNS, with the namespace's search path, for
//! `vpn-seed-server-<i>`; the shoot pods (`dnsPolicy: Default`) ask the node's resolver for
//! Gardener's `ENDPOINT` with its trailing dot. The ingress stays a process: Istio's place has
//! no image of ours.
//!
//! Not modelled by the lab (and not needed by these containers): the pod-level `fsGroup`
//! (every container reading the secrets runs as root), seccomp, resource requests.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use conformance::gardener::ha::{
    self as ha, gateway, routes_via, HaLandscape, INGRESS_LB, KAPI, NODE, SEED_POD_NETWORK, SERVER,
    SHOOT_POD, SHOOT_POD_NETWORKS, SHOOT_SERVICE_NETWORKS, TCP_ECHO, UDP_ECHO,
};
use conformance::gardener::kubelet::{
    assert_running, exec_probe, http_probe, init, start, tcp_probe, Prober, Timing,
};
use conformance::gardener::pods::{Binaries, Spec};
use conformance::gardener::verdict;
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::wait::wait_until;
use lab::container::{Container, ContainerSpec, Pod, SecurityContext, VolumeSource};
use lab::image::Image;
use lab::sidecar_client::try_scrape;
use lab::LabError;

/// The namespaces' name prefix (told apart from the other tests').
const PREFIX: &str = "hai-";
const SHOOT_NS: &str = "shoot--lab--hai";
const HEADER_KEY: &str = "X-Gardener-Destination";
const SHOOT_NODE_NETWORKS: &str = "10.250.0.0/16";
const IP_FAMILIES: &str = "IPv4";
const KAPI_POD: [&str; 2] = [
    "kube-apiserver-6f7d9c8b5-abcde",
    "kube-apiserver-6f7d9c8b5-fghij",
];
const OPENVPN_PORT: u16 = 8443;
/// The shoot's `ENDPOINT`: the internal API domain, with Gardener's trailing dot.
const ENDPOINT: &str = "api.hai.lab.internal.example.com.";
/// The cluster DNS stand-in (on the seed router, the kube-apiserver pods' gateway).
const SEED_RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 1);
/// The shoot node's resolver (on the shoot router, the shoot pods' gateway).
const SHOOT_RESOLVER: Ipv4Addr = Ipv4Addr::new(100, 96, 10, 1);
const STATUS_PATH: &str = "/srv/status/openvpn.status";
/// Gardener's probes: the server's exec probes (§2.1, kept in §2.2), the exporter's TCP
/// probes with Kubernetes' defaults (§2.2), the tunnel controller's HTTP readiness (§2.5).
const SERVER_READINESS: Timing = Timing::after(Duration::from_secs(15));
const SERVER_LIVENESS: Timing = Timing::after(Duration::from_secs(5));
const EXPORTER_TCP: Timing = Timing::after(Duration::ZERO);
const TUNNEL_READINESS: Timing = Timing {
    initial_delay: Duration::from_secs(5),
    period: Duration::from_secs(5),
    timeout: Duration::from_secs(2),
    success_threshold: 2,
    failure_threshold: 1,
};
/// How long anything may take to come up.
const UP: Duration = Duration::from_secs(40);
/// How long a container may take to start or end.
const START: Duration = Duration::from_secs(30);

fn header_value(i: usize) -> String {
    format!("outbound|1194||vpn-seed-server-{i}.{SHOOT_NS}.svc.cluster.local")
}

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

/// dnsmasq on `addr` in `ns` answering exactly `records` (name, address), nothing else.
fn resolver<'ns>(
    ns: &'ns Netns,
    addr: Ipv4Addr,
    records: &[(String, Ipv4Addr)],
) -> Result<Process<'ns>, LabError> {
    let mut cmd = ns.command("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        &format!("--listen-address={addr}"),
        "--pid-file=",
        "--user=root",
    ]);
    for (name, a) in records {
        cmd.arg(format!("--host-record={name},{a}"));
    }
    let p = Process {
        ns,
        pid: ns.spawn(&mut cmd)?,
    };
    let deadline = Instant::now() + START;
    while Instant::now() < deadline {
        let bound = ns.run(["ss", "-Hlun", &format!("src {addr}:53")])?;
        if !bound.stdout.is_empty() {
            return Ok(p);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(LabError::Timeout {
        what: "dnsmasq listening".into(),
        waited: START,
        log: String::new(),
    })
}

/// The secrets: files as the kubelet mounts them, by volume.
struct Secrets {
    ca: Vec<u8>,
    server: (Vec<u8>, Vec<u8>),
    seed_client: (Vec<u8>, Vec<u8>),
    shoot_client: [(Vec<u8>, Vec<u8>); 2],
    tlsauth: Vec<u8>,
}

impl Secrets {
    fn generate(pki: &TestPki) -> Secrets {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let issue = |cn: &str| {
            let (crt, key) = pki.issue_client(cn).expect("client certificate");
            (read(&crt), read(&key))
        };
        Secrets {
            ca: read(&pki.ca_cert()),
            server: (read(&pki.server_cert()), read(&pki.server_key())),
            seed_client: issue("vpn-seed-client"),
            shoot_client: [issue("vpn-shoot-client-0"), issue("vpn-shoot-client-1")],
            tlsauth: read(&pki.ta_key()),
        }
    }

    fn tls(&self, (crt, key): &(Vec<u8>, Vec<u8>), mode: u32) -> VolumeSource {
        VolumeSource::Files {
            files: vec![
                ("ca.crt".into(), self.ca.clone()),
                ("tls.crt".into(), crt.clone()),
                ("tls.key".into(), key.clone()),
            ],
            mode,
        }
    }

    fn tlsauth(&self, mode: u32) -> VolumeSource {
        VolumeSource::Files {
            files: vec![("vpn.tlsauth".into(), self.tlsauth.clone())],
            mode,
        }
    }
}

fn add_volumes(pod: &Pod, volumes: Vec<(&str, VolumeSource)>) {
    for (name, source) in volumes {
        pod.add_volume(name, source)
            .unwrap_or_else(|e| panic!("pod {} volume {name}: {e}", pod.name()));
    }
}

fn resolv_conf(text: String) -> VolumeSource {
    VolumeSource::Files {
        files: vec![("resolv.conf".into(), text.into_bytes())],
        mode: 0o644,
    }
}

fn with_env(mut spec: ContainerSpec, env: &[(&str, String)]) -> ContainerSpec {
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    spec
}

fn networks() -> Vec<(&'static str, String)> {
    vec![
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS.into()),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS.into()),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS.into()),
        ("SEED_POD_NETWORK", SEED_POD_NETWORK.into()),
    ]
}

// ---- vpn-seed-server-<i> (§2.1, §2.2) ----

fn server_pod(ns: &Netns, s: &Secrets, i: usize) -> Pod {
    let pod = Pod::new(ns, &format!("vpn-seed-server-{i}")).expect("server pod");
    add_volumes(
        &pod,
        vec![
            ("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into())),
            ("certs", s.tls(&s.server, 0o644)),
            ("tlsauth", s.tlsauth(0o400)),
            ("openvpn-status", VolumeSource::EmptyDir),
        ],
    );
    pod
}

fn vpn_seed_server(i: usize) -> ContainerSpec {
    let mut env = vec![("IP_FAMILIES", IP_FAMILIES.to_owned())];
    env.extend(networks());
    env.extend([
        ("LOCAL_NODE_IP", gateway(SERVER[i]).to_string()),
        ("OPENVPN_STATUS_PATH", STATUS_PATH.into()),
        ("POD_NAME", format!("vpn-seed-server-{i}")),
        ("IS_HA", "true".into()),
        ("HA_VPN_CLIENTS", "2".into()),
    ]);
    with_env(ContainerSpec::new("vpn-seed-server"), &env)
        .mount("dev-net-tun", "/dev/net/tun")
        .mount("certs", "/srv/secrets/vpn-server")
        .mount("tlsauth", "/srv/secrets/tlsauth")
        .mount("openvpn-status", "/srv/status")
        .security(SecurityContext {
            add: vec!["NET_ADMIN".into(), "NET_RAW".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

fn openvpn_exporter() -> ContainerSpec {
    ContainerSpec::new("openvpn-exporter")
        .command(["/bin/vpn-server", "exporter"])
        .env("OPENVPN_STATUS_PATH", STATUS_PATH)
        .mount("openvpn-status", "/srv/status")
        .security(SecurityContext {
            drop: vec!["all".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

// ---- kube-apiserver-<r> (§2.3) ----

fn kapi_pod(ns: &Netns, s: &Secrets, r: usize) -> Pod {
    let pod = Pod::new(ns, KAPI_POD[r]).expect("kube-apiserver pod");
    // `net.ipv4.ping_group_range="0 0"`: the pod's sysctl, set by the kubelet in its netns.
    ns.run(["sysctl", "-qw", "net.ipv4.ping_group_range=0 0"])
        .expect("pod sysctl");
    add_volumes(
        &pod,
        vec![
            (
                "kube-api-access-gardener",
                VolumeSource::Files {
                    files: vec![
                        ("token".into(), b"unread.service.account.token".to_vec()),
                        ("ca.crt".into(), s.ca.clone()),
                        ("namespace".into(), SHOOT_NS.as_bytes().to_vec()),
                    ],
                    mode: 0o640,
                },
            ),
            ("vpn-seed-client", s.tls(&s.seed_client, 0o640)),
            ("vpn-seed-tlsauth", s.tlsauth(0o640)),
            ("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into())),
            // ClusterFirst: cluster DNS with the namespace's search path.
            (
                "etc",
                resolv_conf(format!(
                    "search {SHOOT_NS}.svc.cluster.local svc.cluster.local cluster.local\n\
                     nameserver {SEED_RESOLVER}\noptions ndots:5\n"
                )),
            ),
        ],
    );
    pod
}

/// The pod's securityContext (runAsNonRoot, 65532) as the container inherits it, with the
/// container's own fields over it.
fn kapi_security(own: SecurityContext) -> SecurityContext {
    SecurityContext {
        run_as_user: own.run_as_user.or(Some(65532)),
        run_as_group: own.run_as_group.or(Some(65532)),
        ..own
    }
}

fn vpn_client_env(i: usize) -> Vec<(&'static str, String)> {
    let mut env = vec![("ENDPOINT", format!("vpn-seed-server-{i}"))];
    env.extend(networks());
    env.extend([
        ("VPN_SERVER_INDEX", i.to_string()),
        ("IS_HA", "true".into()),
        ("HA_VPN_SERVERS", "2".into()),
        ("HA_VPN_CLIENTS", "2".into()),
        ("OPENVPN_PORT", "1194".into()),
        ("IP_FAMILIES", IP_FAMILIES.into()),
    ]);
    env
}

fn vpn_client(i: usize) -> ContainerSpec {
    with_env(
        ContainerSpec::new(&format!("vpn-client-{i}")),
        &vpn_client_env(i),
    )
    .mount("vpn-seed-client", "/srv/secrets/vpn-client")
    .mount("vpn-seed-tlsauth", "/srv/secrets/tlsauth")
    .mount("dev-net-tun", "/dev/net/tun")
    .mount("etc", "/etc")
    .security(kapi_security(SecurityContext {
        run_as_user: Some(0),
        run_as_non_root: false,
        add: vec!["NET_ADMIN".into()],
        ..SecurityContext::default()
    }))
}

fn vpn_client_init(r: usize) -> ContainerSpec {
    let mut env = vpn_client_env(0);
    env.extend([
        ("POD_NAME", KAPI_POD[r].to_owned()),
        ("NAMESPACE", SHOOT_NS.to_owned()),
    ]);
    with_env(ContainerSpec::new("vpn-client-init"), &env)
        .command(["/bin/vpn-client", "setup"])
        .mount("vpn-seed-client", "/srv/secrets/vpn-client")
        .mount("vpn-seed-tlsauth", "/srv/secrets/tlsauth")
        .mount("dev-net-tun", "/dev/net/tun")
        .mount("etc", "/etc")
        .mount_read_only(
            "kube-api-access-gardener",
            "/var/run/secrets/kubernetes.io/serviceaccount",
        )
        .security(kapi_security(SecurityContext {
            privileged: true,
            run_as_user: Some(0),
            run_as_non_root: false,
            add: vec!["NET_ADMIN".into()],
            ..SecurityContext::default()
        }))
}

fn vpn_path_controller(r: usize) -> ContainerSpec {
    let mut env = networks();
    env.extend([
        ("IS_HA", "true".into()),
        ("HA_VPN_CLIENTS", "2".into()),
        ("POD_IP", KAPI[r].to_string()),
    ]);
    with_env(ContainerSpec::new("vpn-path-controller"), &env)
        .command(["/bin/vpn-client", "path-controller"])
        .security(kapi_security(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: false,
            add: vec!["NET_ADMIN".into()],
            ..SecurityContext::default()
        }))
}

// ---- vpn-shoot-<p> (§2.4, §2.5) ----

fn shoot_pod(ns: &Netns, s: &Secrets, p: usize) -> Pod {
    let pod = Pod::new(ns, &format!("vpn-shoot-{p}")).expect("shoot pod");
    add_volumes(
        &pod,
        vec![
            ("vpn-shoot-0", s.tls(&s.shoot_client[0], 0o400)),
            ("vpn-shoot-1", s.tls(&s.shoot_client[1], 0o400)),
            ("vpn-shoot-tlsauth", s.tlsauth(0o400)),
            ("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into())),
            // dnsPolicy Default: the node's resolver.
            ("etc", resolv_conf(format!("nameserver {SHOOT_RESOLVER}\n"))),
        ],
    );
    pod
}

fn vpn_shoot_init(p: usize) -> ContainerSpec {
    let env = [
        ("IP_FAMILIES", IP_FAMILIES.to_owned()),
        ("IS_SHOOT_CLIENT", "true".into()),
        ("POD_NAME", format!("vpn-shoot-{p}")),
        ("IS_HA", "true".into()),
        ("HA_VPN_SERVERS", "2".into()),
        ("HA_VPN_CLIENTS", "2".into()),
    ];
    with_env(ContainerSpec::new("vpn-shoot-init"), &env)
        .command(["/bin/vpn-client", "setup"])
        .security(SecurityContext::privileged())
}

fn vpn_shoot_s(p: usize, i: usize) -> ContainerSpec {
    let mut env = vec![
        ("IP_FAMILIES", IP_FAMILIES.to_owned()),
        ("ENDPOINT", ENDPOINT.into()),
        ("OPENVPN_PORT", OPENVPN_PORT.to_string()),
        ("REVERSED_VPN_HEADER", header_value(i)),
        ("REVERSED_VPN_HEADER_KEY", HEADER_KEY.into()),
        ("IS_SHOOT_CLIENT", "true".into()),
    ];
    env.extend(networks());
    env.extend([
        ("IS_HA", "true".into()),
        ("VPN_SERVER_INDEX", i.to_string()),
        ("POD_NAME", format!("vpn-shoot-{p}")),
    ]);
    with_env(ContainerSpec::new(&format!("vpn-shoot-s{i}")), &env)
        .mount("vpn-shoot-0", "/srv/secrets/vpn-client-0")
        .mount("vpn-shoot-1", "/srv/secrets/vpn-client-1")
        .mount("vpn-shoot-tlsauth", "/srv/secrets/tlsauth")
        .mount("dev-net-tun", "/dev/net/tun")
        .mount("etc", "/etc")
        .security(SecurityContext {
            add: vec!["NET_ADMIN".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

fn tunnel_controller() -> ContainerSpec {
    let env = [
        ("HA_VPN_CLIENTS", "2".to_owned()),
        ("WATCHDOG_WINDOW_SIZE", "20".into()),
        ("WATCHDOG_THRESHOLD", "8".into()),
        ("WATCHDOG_COOLDOWN", "20".into()),
    ];
    with_env(ContainerSpec::new("tunnel-controller"), &env)
        .command(["/bin/vpn-client", "tunnel-controller"])
        .security(SecurityContext {
            add: vec!["NET_ADMIN".into()],
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        })
}

// ---- running them ----

/// A container the kubelet may replace (a restart); probes go to whichever runs.
type Slot = RwLock<Container>;

fn read(slot: &Slot) -> std::sync::RwLockReadGuard<'_, Container> {
    slot.read().unwrap_or_else(PoisonError::into_inner)
}

/// One UDP echo and one new TCP connection with an echo, from `ns` to the shoot node.
fn echo_once(ns: &Netns, timeout: Duration) -> Result<(), String> {
    ns.run_in(|| {
        let u = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        u.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        u.send_to(b"hai-udp!", (NODE, UDP_ECHO))
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 16];
        let n = u.recv(&mut buf).map_err(|e| format!("UDP: {e}"))?;
        if &buf[..n] != b"hai-udp!" {
            return Err(format!("UDP echo {:?}", &buf[..n]));
        }
        let mut t = TcpStream::connect_timeout(&SocketAddr::from((NODE, TCP_ECHO)), timeout)
            .map_err(|e| format!("TCP: {e}"))?;
        t.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        t.write_all(b"hai-tcp!").map_err(|e| e.to_string())?;
        let mut back = [0u8; 8];
        t.read_exact(&mut back).map_err(|e| format!("TCP: {e}"))?;
        if &back != b"hai-tcp!" {
            return Err(format!("TCP echo {back:?}"));
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?
}

/// Sequence-numbered UDP at 100/s from one kube-apiserver replica, each echo's arrival kept.
struct Stream {
    at: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Stream {
    fn start(ns: &Netns) -> Stream {
        let sock = ns
            .run_in(|| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect(SocketAddr::from((NODE, UDP_ECHO)))?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok::<_, std::io::Error>(s)
            })
            .expect("lab step")
            .expect("UDP stream");
        let send = sock.try_clone().expect("UDP stream");
        let at = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (stop_send, stop_recv, at_recv) =
            (Arc::clone(&stop), Arc::clone(&stop), Arc::clone(&at));
        let threads = vec![
            std::thread::spawn(move || {
                // Bounded: at most 10 minutes.
                for seq in 0u64..60_000 {
                    if stop_send.load(Ordering::Relaxed) {
                        return;
                    }
                    let _ = send.send(&seq.to_be_bytes());
                    std::thread::sleep(Duration::from_millis(10));
                }
            }),
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop_recv.load(Ordering::Relaxed) {
                    if let Ok(8) = sock.recv(&mut buf) {
                        at_recv
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(Instant::now());
                    }
                }
            }),
        ];
        Stream { at, stop, threads }
    }

    /// The longest time without an echo between `from` and `to`.
    fn max_gap(&self, from: Instant, to: Instant) -> Duration {
        ha::max_gap(
            &self.at.lock().unwrap_or_else(PoisonError::into_inner),
            from,
            to,
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Every line of `text` naming `series` that carries all of `labels`.
fn samples<'t>(text: &'t str, series: &str, labels: &[&str]) -> Vec<&'t str> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && labels.iter().all(|lb| l.contains(lb))
        })
        .collect()
}

#[test]
fn gardeners_ha_pods_run_from_our_images() {
    require_lab(&["ip", "nft", "sysctl", "dnsmasq", "ss", "buildah"]);
    let t_test = Instant::now();
    let open = |name: &str| {
        Image::built(name).unwrap_or_else(|e| panic!("image {name}: {}", verdict::explain(&e, &[])))
    };
    let (server_image, client_image) = (open("vpn-server"), open("vpn-client"));
    eprintln!("images ready after {:.1} s", t_test.elapsed().as_secs_f64());
    let bins = Binaries::locate()
        .expect("binaries (cargo build -p vpn-server -p vpn-client -p vpn-router)");
    let l = HaLandscape::build(Some(PREFIX)).expect("layout");
    let pki = TestPki::generate().expect("pki");
    let secrets = Secrets::generate(&pki);
    l.start_echo().expect("echo");

    // Cluster DNS for the seed, the node's resolver for the shoot.
    let _seed_dns = resolver(
        &l.seed_router,
        SEED_RESOLVER,
        &[0, 1].map(|i| {
            (
                format!("vpn-seed-server-{i}.{SHOOT_NS}.svc.cluster.local"),
                SERVER[i],
            )
        }),
    )
    .expect("seed resolver");
    let _shoot_dns = resolver(
        &l.shoot_router,
        SHOOT_RESOLVER,
        &[(ENDPOINT.trim_end_matches('.').to_owned(), INGRESS_LB)],
    )
    .expect("shoot resolver");

    // The ingress: our router routing by Gardener's header to each server pod's Service.
    let router_toml = tempfile::NamedTempFile::new().expect("router config");
    let mut cfg = format!(
        "[[listener]]\naddress = \"0.0.0.0:{OPENVPN_PORT}\"\nheaders = [\"{HEADER_KEY}\"]\n"
    );
    for (i, addr) in SERVER.iter().enumerate() {
        cfg.push_str(&format!(
            "\n[[route]]\nvalue = \"{}\"\nupstream = \"{addr}:1194\"\n",
            header_value(i)
        ));
    }
    std::fs::write(router_toml.path(), cfg).expect("router config");
    let router_logs = tempfile::tempdir().expect("router logs");
    let ingress = Spec::new(
        "ingress",
        &bins.router,
        &["--config", &router_toml.path().display().to_string()],
        Vec::new(),
    )
    .start(&l.ingress, router_logs.path())
    .expect("router");
    ingress
        .wait_log("router listening", UP)
        .expect("router listening");

    // The pods and their init containers.
    let server_pods: Vec<Pod> = (0..2)
        .map(|i| server_pod(&l.server[i], &secrets, i))
        .collect();
    let kapi_pods: Vec<Pod> = (0..2).map(|r| kapi_pod(&l.kapi[r], &secrets, r)).collect();
    let shoot_pods: Vec<Pod> = (0..2)
        .map(|p| shoot_pod(&l.shoot[p], &secrets, p))
        .collect();
    let logs: Vec<std::path::PathBuf> = server_pods
        .iter()
        .chain(&kapi_pods)
        .chain(&shoot_pods)
        .map(Pod::logs_dir)
        .collect();
    eprintln!("container logs in {logs:?}");
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let logs = &logs[..];
    for (i, pod) in server_pods.iter().enumerate() {
        let log = init(
            pod,
            &server_image,
            &ContainerSpec::new("setup")
                .command(["/bin/vpn-server", "setup"])
                .security(SecurityContext::privileged()),
            START,
            logs,
        );
        eprintln!("vpn-seed-server-{i} setup: {}", log.trim());
    }

    // The server pods: vpn-seed-server and openvpn-exporter, probed from the start.
    let t0 = Instant::now();
    let servers: Vec<Slot> = server_pods
        .iter()
        .enumerate()
        .map(|(i, pod)| RwLock::new(start(pod, &server_image, &vpn_seed_server(i), logs)))
        .collect();
    let exporters: Vec<Container> = server_pods
        .iter()
        .map(|pod| start(pod, &server_image, &openvpn_exporter(), logs))
        .collect();
    let mut kapi_containers: Vec<Vec<Container>> = Vec::new();
    let mut shoot_containers: Vec<Vec<Container>> = Vec::new();
    let mut controllers: Vec<Container> = Vec::new();

    std::thread::scope(|scope| {
        let readiness: Vec<Prober<'_>> = servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                Prober::start(
                    scope,
                    &format!("vpn-seed-server-{i} readiness"),
                    SERVER_READINESS,
                    t0,
                    exec_probe(move || read(server), &["/bin/vpn-server", "readiness"]),
                )
            })
            .collect();
        let liveness: Vec<Prober<'_>> = servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                Prober::start(
                    scope,
                    &format!("vpn-seed-server-{i} liveness"),
                    SERVER_LIVENESS,
                    t0,
                    exec_probe(move || read(server), &["/bin/vpn-server", "liveness"]),
                )
            })
            .collect();
        let exporter_probes: Vec<Prober<'_>> = (0..2)
            .map(|i| {
                Prober::start(
                    scope,
                    &format!("openvpn-exporter-{i} readiness/liveness"),
                    EXPORTER_TCP,
                    t0,
                    tcp_probe(&l.seed_router, SocketAddr::from((SERVER[i], 15000))),
                )
            })
            .collect();

        // The shoot pods: init, both clients through the ingress, the tunnel controller.
        for (p, pod) in shoot_pods.iter().enumerate() {
            let log = init(pod, &client_image, &vpn_shoot_init(p), START, logs);
            eprintln!("vpn-shoot-{p} vpn-shoot-init: {}", log.trim());
            shoot_containers.push(
                (0..2)
                    .map(|i| start(pod, &client_image, &vpn_shoot_s(p, i), logs))
                    .collect(),
            );
        }
        let t_ctl = Instant::now();
        for pod in &shoot_pods {
            controllers.push(start(pod, &client_image, &tunnel_controller(), logs));
        }
        let tunnel_probes: Vec<Prober<'_>> = (0..2)
            .map(|p| {
                Prober::start(
                    scope,
                    &format!("vpn-shoot-{p} tunnel-controller readiness"),
                    TUNNEL_READINESS,
                    t_ctl,
                    http_probe(
                        &l.shoot_router,
                        SocketAddr::from((SHOOT_POD[p], 8080)),
                        "/readyz",
                    ),
                )
            })
            .collect();
        for (p, ns) in l.shoot.iter().enumerate() {
            wait_until(&format!("vpn-shoot-{p} tunnels up"), UP, || {
                routes_via(ns, "tun0").contains("metric 100")
                    && routes_via(ns, "tun1").contains("metric 101")
            });
        }
        for (p, t) in tunnel_probes.iter().enumerate() {
            t.wait_until(UP, |_| t.ready_at().is_some());
            let at = t.ready_at();
            assert!(at.is_some(), "vpn-shoot-{p}: {}", t.report());
            eprintln!(
                "vpn-shoot-{p} tunnel-controller Ready at {:.0} s after its start (2 successes, period 5 s)",
                at.unwrap_or_default().as_secs_f64()
            );
        }

        // vpn2's HA rule: with only the shoot's clients the servers stay not Ready, at the
        // first readiness run after the status file lists them.
        let status_file = |i: usize| {
            server_pods[i]
                .logs_dir()
                .join("../volumes/openvpn-status/openvpn.status")
        };
        let listed = |i: usize, names: &[String]| {
            std::fs::read_to_string(status_file(i))
                .is_ok_and(|t| names.iter().all(|n| t.contains(n.as_str())))
        };
        for (i, r) in readiness.iter().enumerate() {
            let shoot_cns = [
                "vpn-shoot-client-0".to_owned(),
                "vpn-shoot-client-1".to_owned(),
            ];
            wait_until(
                "the status file lists the shoot's clients",
                Duration::from_secs(20),
                || listed(i, &shoot_cns),
            );
            let since = t0.elapsed();
            let runs = r.wait_until(Duration::from_secs(15), |runs| {
                runs.iter().any(|run| run.at > since)
            });
            let run = runs.iter().find(|run| run.at > since);
            assert!(
                run.is_some_and(|run| !run.passed
                    && run.output.contains("2 client(s) connected")
                    && run.output.contains("vpn-seed-client")),
                "vpn-seed-server-{i} with the shoot's clients only: {}",
                r.report()
            );
            assert!(runs.iter().all(|run| !run.passed), "{}", r.report());
        }
        let seed_clients_at = t0.elapsed();
        eprintln!(
            "servers not Ready with the shoot's clients only (until {:.0} s)",
            seed_clients_at.as_secs_f64()
        );

        // The kube-apiserver pods: init, vpn-client-0/1 (by Service name), path controller.
        for (r, pod) in kapi_pods.iter().enumerate() {
            let log = init(pod, &client_image, &vpn_client_init(r), START, logs);
            eprintln!("{} vpn-client-init: {}", KAPI_POD[r], log.trim());
            let mut cs: Vec<Container> = (0..2)
                .map(|i| start(pod, &client_image, &vpn_client(i), logs))
                .collect();
            cs.push(start(pod, &client_image, &vpn_path_controller(r), logs));
            kapi_containers.push(cs);
        }
        for (r, ns) in l.kapi.iter().enumerate() {
            for i in 0..2 {
                let (metric, src) = (format!("metric {}", 100 + i), format!("src {}", KAPI[r]));
                wait_until(&format!("kube-apiserver-{r} routes via tun{i}"), UP, || {
                    let routes = routes_via(ns, &format!("tun{i}"));
                    routes.contains(&metric)
                        && routes.contains(&src)
                        && routes.contains("100.64.0.0/13")
                });
            }
            kapi_containers[r][2]
                .wait_for_output("dev=\"tun0\"", UP)
                .expect("path controller names tun0");
        }
        // Ready once a seed and a shoot client are listed (the status file is written every
        // 15 s, the probe runs every 10 s).
        for (i, r) in readiness.iter().enumerate() {
            r.wait_until(Duration::from_secs(45), |_| r.ready_at().is_some());
            let at = r.ready_at();
            assert!(
                at.is_some_and(|at| at > seed_clients_at),
                "vpn-seed-server-{i}: {}",
                r.report()
            );
            eprintln!(
                "vpn-seed-server-{i} Ready at {:.0} s ({:.0} s after the kube-apiservers started)",
                at.unwrap_or_default().as_secs_f64(),
                (at.unwrap_or_default().saturating_sub(seed_clients_at)).as_secs_f64()
            );
        }
        for (i, p) in exporter_probes.iter().enumerate() {
            assert!(p.ready_at().is_some(), "exporter {i}: {}", p.report());
        }

        // Both replicas' connections in each status file (written every 15 s).
        for i in 0..2 {
            let kapis = KAPI.map(|a| a.to_string());
            wait_until(
                "the status file lists both kube-apiservers",
                Duration::from_secs(20),
                || listed(i, &kapis),
            );
        }

        // Traffic from each kube-apiserver replica to the shoot node, UDP and TCP.
        for (r, ns) in l.kapi.iter().enumerate() {
            echo_once(ns, Duration::from_secs(3))
                .unwrap_or_else(|e| panic!("kube-apiserver-{r} to the node: {e}"));
        }
        eprintln!("UDP and TCP echo from both kube-apiserver replicas through the tunnel");

        // Each server pod's exporter: kumina's series for its own server's clients.
        for (i, server) in SERVER.iter().enumerate() {
            let text = l
                .seed_router
                .run_in(|| try_scrape(SocketAddr::from((*server, 15000))))
                .expect("lab step")
                .unwrap_or_else(|e| panic!("exporter {i}: {e}"));
            let sp = format!("status_path=\"{STATUS_PATH}\"");
            assert_eq!(
                samples(&text, "openvpn_up", &[&sp]),
                [format!("openvpn_up{{{sp}}} 1").as_str()],
                "{text}"
            );
            for series in [
                "openvpn_status_update_time_seconds",
                "openvpn_netstat_Tcp_OutSegs",
                "openvpn_netstat_Tcp_RetransSegs",
                "openvpn_server_connected_clients",
            ] {
                assert!(!samples(&text, series, &[]).is_empty(), "{series}: {text}");
            }
            for cn in ["vpn-shoot-client-0", "vpn-shoot-client-1"] {
                for series in [
                    "openvpn_server_client_received_bytes_total",
                    "openvpn_server_client_sent_bytes_total",
                ] {
                    let cn = format!("common_name=\"{cn}\"");
                    assert_eq!(
                        samples(&text, series, &[&cn, &sp]).len(),
                        1,
                        "{series} {cn}: {text}"
                    );
                }
            }
            for addr in KAPI {
                let addr = addr.to_string();
                let labels = ["common_name=\"vpn-seed-client\"", addr.as_str()];
                assert_eq!(
                    samples(&text, "openvpn_server_client_received_bytes_total", &labels).len(),
                    1,
                    "seed client {addr}: {text}"
                );
            }
            let clients = samples(&text, "openvpn_server_connected_clients", &[]);
            assert!(clients.iter().any(|l| l.ends_with(" 4")), "{clients:?}");
        }
        eprintln!("each exporter serves its server: 2 seed + 2 shoot clients, openvpn_up 1");

        // Kill vpn-seed-server-0's container: traffic flows through server 1.
        let streams: Vec<Stream> = l.kapi.iter().map(Stream::start).collect();
        wait_until("UDP stream echoes", UP, || {
            streams.iter().all(|s| {
                s.max_gap(Instant::now() - Duration::from_secs(1), Instant::now())
                    < Duration::from_millis(200)
            })
        });
        let t_kill = Instant::now();
        read(&servers[0]).kill();
        for (r, ns) in l.kapi.iter().enumerate() {
            wait_until(
                &format!("kube-apiserver-{r} drops tun0's routes"),
                Duration::from_secs(5),
                || !routes_via(ns, "tun0").contains("100.64.0.0/13"),
            );
        }
        std::thread::sleep(Duration::from_secs(3));
        let gap = streams
            .iter()
            .map(|s| s.max_gap(t_kill, Instant::now()))
            .max()
            .unwrap_or_default();
        for (r, ns) in l.kapi.iter().enumerate() {
            echo_once(ns, Duration::from_secs(3))
                .unwrap_or_else(|e| panic!("kube-apiserver-{r} after the kill: {e}"));
        }
        eprintln!(
            "kill -9 vpn-seed-server-0's container: longest UDP gap {:.0} ms, new UDP and TCP echo work through server 1",
            gap.as_secs_f64() * 1e3
        );
        assert!(gap < Duration::from_secs(1), "UDP gap {gap:?}");
        drop(streams);
        // The kubelet restarts it.
        *servers[0].write().unwrap_or_else(PoisonError::into_inner) =
            start(&server_pods[0], &server_image, &vpn_seed_server(0), logs);

        // Every container up, except the one killed (restarted).
        for c in exporters
            .iter()
            .chain(kapi_containers.iter().flatten())
            .chain(shoot_containers.iter().flatten())
            .chain(&controllers)
        {
            assert_running(c);
        }
        assert_running(&read(&servers[1]));

        // Both servers down: each shoot pod's /readyz fails (503) at its next probe.
        let t_down = Instant::now();
        for s in &servers {
            read(s).kill();
        }
        for (p, t) in tunnel_probes.iter().enumerate() {
            let after = t_down.duration_since(t_ctl);
            // The shoot's clients see the end through the ingress, or after their
            // `ping-restart` (10 s) at the latest; the probe runs every 5 s.
            let runs = t.wait_until(Duration::from_secs(30), |runs| {
                runs.iter().any(|r| r.at > after && !r.passed)
            });
            let failed = runs.iter().find(|r| r.at > after && !r.passed);
            assert!(
                failed.is_some_and(|r| r.output.starts_with("503")),
                "vpn-shoot-{p}: {}\nroutes:\n{}\n{}",
                t.report(),
                String::from_utf8_lossy(
                    &l.shoot[p]
                        .run(["ip", "route", "show", "table", "all"])
                        .map(|o| o.stdout)
                        .unwrap_or_default()
                ),
                shoot_containers[p]
                    .iter()
                    .map(|c| {
                        let log = c.stderr();
                        let tail: Vec<&str> = log.lines().rev().take(12).collect();
                        format!("{}: {:?}\n{}", c.name(), c.try_wait(), tail.join("\n"))
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            eprintln!(
                "vpn-shoot-{p} /readyz with both servers down: {} ({:.1} s after)",
                failed.map(|r| r.output.clone()).unwrap_or_default(),
                (failed
                    .map(|r| r.at)
                    .unwrap_or_default()
                    .saturating_sub(after))
                .as_secs_f64()
            );
        }
        // Both back: Ready again after two successes in a row.
        let t_back = Instant::now();
        for (i, s) in servers.iter().enumerate() {
            *s.write().unwrap_or_else(PoisonError::into_inner) =
                start(&server_pods[i], &server_image, &vpn_seed_server(i), logs);
        }
        for (p, t) in tunnel_probes.iter().enumerate() {
            let after = t_back.duration_since(t_ctl);
            let runs = t.wait_until(Duration::from_secs(60), |runs| {
                runs.windows(2)
                    .any(|w| w[0].at > after && w[0].passed && w[1].passed)
            });
            let back = runs
                .windows(2)
                .find(|w| w[0].at > after && w[0].passed && w[1].passed)
                .map(|w| w[1].at);
            assert!(
                back.is_some(),
                "vpn-shoot-{p} not Ready again: {}",
                t.report()
            );
            eprintln!(
                "vpn-shoot-{p} Ready again {:.0} s after both servers restarted",
                back.unwrap_or_default().saturating_sub(after).as_secs_f64()
            );
        }
        for (r, ns) in l.kapi.iter().enumerate() {
            wait_until(&format!("kube-apiserver-{r} routes back"), UP, || {
                routes_via(ns, "tun0").contains("100.64.0.0/13")
                    || routes_via(ns, "tun1").contains("100.64.0.0/13")
            });
            echo_once(ns, Duration::from_secs(3))
                .unwrap_or_else(|e| panic!("kube-apiserver-{r} after the restart: {e}"));
        }
        for (i, lv) in liveness.iter().enumerate() {
            // Shown: the liveness runs while the server was up passed.
            eprintln!("{}", lv.report());
            assert!(
                lv.runs().iter().take(2).all(|r| r.passed),
                "vpn-seed-server-{i}: {}",
                lv.report()
            );
        }
        for c in exporters
            .iter()
            .chain(kapi_containers.iter().flatten())
            .chain(shoot_containers.iter().flatten())
            .chain(&controllers)
        {
            assert_running(c);
        }
        // The exporter's TCP probes (no initial delay: the first may come before it
        // listens): Ready, and never 3 failures in a row (a liveness restart).
        for (i, p) in exporter_probes.iter().enumerate() {
            assert!(
                p.ready_at().is_some() && p.restart_at().is_none(),
                "exporter {i}: {}",
                p.report()
            );
        }
        eprintln!("{}", tunnel_probes[0].report());
        eprintln!("{}", readiness[0].report());
    });
    // Containers before pods before namespaces.
    drop(controllers);
    drop(shoot_containers);
    drop(kapi_containers);
    drop(exporters);
    drop(servers);
    drop(ingress);
    eprintln!("test took {:.0} s", t_test.elapsed().as_secs_f64());
}
