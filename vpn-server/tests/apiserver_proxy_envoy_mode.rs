//! `vpn-server` as the `proxy` container of Gardener's apiserver-proxy DaemonSet runs the
//! `envoy-proxy` image: the binary under the name `envoy` (our image's link), Gardener's
//! command `envoy --concurrency 2 --use-dynamic-base-id -c <envoy.yaml>`, uid 0 with no
//! capability but `NET_BIND_SERVICE`, an empty environment, in the node's network (here: a
//! namespace), with our rendering of Gardener's apiserver-proxy envoy.yaml. The lab has no
//! DNS, so the cluster's endpoint is the ingress's address instead of the shoot's API name;
//! the CONNECT request still names the API host, as Gardener's file says.
//!
//! ```text
//!  NODE  lo 240.168.102.23/32 (the address the apiserver-proxy sidecar keeps on its dummy
//!        interface; the lab's kernel may have no dummy devices)
//!        envoy: 240.168.102.23:443 (TCP proxy), 0.0.0.0:16910 [::]:16910 (stats)
//!        node-seed 192.0.2.1/24
//!          │ veth
//!  SEED  seed-node 192.0.2.2/24: ingress :8443 (checks the CONNECT, answers 200 and relays,
//!        or 403 once told to); kube-apiserver 127.0.0.1:6443 (TLS, `GET /version`)
//! ```
//!
//! It shows:
//! * the process runs as uid 0 with `NET_BIND_SERVICE` only and binds port 443;
//! * a TLS `GET /version` to 240.168.102.23:443 reaches the kube-apiserver, through a
//!   CONNECT whose request line and `X-Gardener-Destination` header are Gardener's;
//! * `/ready` answers 200 on 16910 (IPv4 and IPv6), as the kubelet's probes ask;
//! * `/metrics` has every series Gardener's `apiserver-proxy` job keeps, with Envoy's labels,
//!   and none of those the job drops;
//! * a CONNECT the ingress refuses closes the client's connection and is counted;
//! * the access log has one line per connection, in the file's format.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::require_lab;
use lab::sidecar_client::{connector, metric, scrape, tls, Pki, WAIT};
use pki::tls::ClientCertMode;
use rustix::process::Pid;
use rustix::thread::{capabilities, CapabilitySet};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const FIXTURE: &str = include_str!("../../sidecar/fixtures/gardener-apiserver-proxy.yaml");
const ADVERTISE: Ipv4Addr = Ipv4Addr::new(240, 168, 102, 23);
const INGRESS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const INGRESS_PORT: u16 = 8443;
const KUBE_APISERVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 6443);
const STATS_PORT: u16 = 16910;
/// The request line and header Gardener's file makes the proxy send.
const REQUEST_LINE: &str = "CONNECT api.bar.foo.internal.example.com.:443 HTTP/1.1";
const ROUTE: &str = "outbound|443||kube-apiserver.shoot--foo--bar.svc.cluster.local";
const VERSION: &str = "{\"major\":\"1\",\"minor\":\"33\"}";

/// Every series Gardener's `apiserver-proxy` scrape job keeps, and the label each carries.
const KEPT: &[(&str, &str)] = &[
    ("envoy_cluster_bind_errors", CLUSTER),
    ("envoy_cluster_lb_healthy_panic", CLUSTER),
    ("envoy_cluster_update_attempt", CLUSTER),
    ("envoy_cluster_update_failure", CLUSTER),
    ("envoy_cluster_upstream_cx_connect_ms_bucket", CLUSTER),
    ("envoy_cluster_upstream_cx_length_ms_bucket", CLUSTER),
    ("envoy_cluster_upstream_cx_none_healthy", CLUSTER),
    ("envoy_cluster_upstream_cx_rx_bytes_total", CLUSTER),
    ("envoy_cluster_upstream_cx_tx_bytes_total", CLUSTER),
    ("envoy_listener_downstream_cx_destroy", LISTENER),
    ("envoy_listener_downstream_cx_length_ms_bucket", LISTENER),
    ("envoy_listener_downstream_cx_overflow", LISTENER),
    ("envoy_listener_downstream_cx_total", LISTENER),
    ("envoy_tcp_downstream_cx_no_route", TCP),
    ("envoy_tcp_downstream_cx_rx_bytes_total", TCP),
    ("envoy_tcp_downstream_cx_total", TCP),
    ("envoy_tcp_downstream_cx_tx_bytes_total", TCP),
];
const CLUSTER: &str = "envoy_cluster_name=\"kube_apiserver\"";
const LISTENER: &str = "envoy_listener_address=\"240.168.102.23_443\"";
const TCP: &str = "envoy_tcp_prefix=\"kube_apiserver\"";

/// The fake ingress: what it was asked, and whether it refuses.
#[derive(Debug, Default)]
struct Ingress {
    heads: Mutex<Vec<String>>,
    refuse: AtomicBool,
}

/// Reads an HTTP head (up to the blank line, at most 8 KiB) byte by byte.
fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? != 1 || head.len() > 8192 {
            return None;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).ok()
}

/// Copies `from` to `to` until EOF, then half-closes `to`.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

impl Ingress {
    /// Serves on `addr` until `deadline` (call inside the namespace): checks the CONNECT
    /// request line and routing header, then relays to the kube-apiserver; 403 when told to
    /// refuse or when the request is not Gardener's.
    fn serve(self: &Arc<Self>, addr: SocketAddr, deadline: Instant) {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let ingress = Arc::clone(self);
        std::thread::spawn(move || {
            while Instant::now() < deadline {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(WAIT)).unwrap();
                let Some(head) = read_head(&mut s) else {
                    continue;
                };
                ingress.heads.lock().unwrap().push(head.clone());
                let gardeners = head.starts_with(&format!("{REQUEST_LINE}\r\n"))
                    && head.lines().any(|l| {
                        l.split_once(':').is_some_and(|(name, value)| {
                            name.eq_ignore_ascii_case("x-gardener-destination")
                                && value.trim() == ROUTE
                        })
                    });
                if !gardeners || ingress.refuse.load(Ordering::Relaxed) {
                    let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
                    continue;
                }
                let upstream = TcpStream::connect(KUBE_APISERVER).unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
                let (s2, u2) = (s.try_clone().unwrap(), upstream.try_clone().unwrap());
                std::thread::spawn(move || pump(s2, u2));
                std::thread::spawn(move || pump(upstream, s));
            }
        });
    }
}

/// A TLS kube-apiserver answering every request with [`VERSION`], until `deadline` (call
/// inside the namespace).
fn kube_apiserver(pki: &Pki, deadline: Instant) {
    let acceptor =
        pki::tls::connect_proxy_acceptor(&pki.server, &pki.bundle, ClientCertMode::Optional)
            .unwrap();
    let listener = TcpListener::bind(KUBE_APISERVER).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while Instant::now() < deadline {
            let Ok((s, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            let Ok(mut tls) = acceptor.accept(s) else {
                continue;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{VERSION}",
                VERSION.len()
            );
            let _ = tls.write_all(answer.as_bytes());
            let _ = tls.shutdown();
        }
    });
}

/// `GET /version` over TLS through the proxy (call inside the namespace); the response.
fn get_version(pki: &Pki) -> String {
    let mut s = tls(
        &connector(&pki.bundle, None),
        SocketAddr::from((ADVERTISE, 443)),
    )
    .unwrap();
    s.write_all(b"GET /version HTTP/1.1\r\nHost: kubernetes\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8(out).unwrap()
}

/// A plain `GET path` (call inside the namespace); the status line.
fn status_of(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.33\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines().next().unwrap_or_default().to_owned()
}

/// Lays out the image's link and the ConfigMap; returns (`envoy`, `envoy.yaml`).
fn lay_out(root: &Path) -> (PathBuf, PathBuf) {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(BIN, bin.join("vpn-server")).unwrap();
    let envoy = root.join("envoy");
    symlink(bin.join("vpn-server"), &envoy).unwrap();
    let config_dir = root.join("etc/apiserver-proxy");
    std::fs::create_dir_all(&config_dir).unwrap();
    let config = config_dir.join("envoy.yaml");
    let endpoint = "                address: api.bar.foo.internal.example.com.\n";
    assert!(FIXTURE.contains(endpoint));
    let text = FIXTURE.replace(endpoint, &format!("                address: {INGRESS}\n"));
    std::fs::write(&config, text).unwrap();
    (envoy, config)
}

/// Waits (bounded) until `f` holds for a scrape of the stats listener; the scrape.
fn scrape_until(node: &Netns, what: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = node
            .run_in(|| scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, STATS_PORT))))
            .unwrap();
        if f(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn apiserver_proxy_container_as_gardener_runs_it() {
    require_lab(&["setpriv"]);
    let pki = Pki::generate();
    let node = Netns::new().unwrap();
    let seed = Netns::new().unwrap();
    Netns::veth_pair(&node, "node-seed", &seed, "seed-node").unwrap();
    for (ns, cidr, dev) in [
        (&node, "240.168.102.23/32", "lo"),
        (&node, "192.0.2.1/24", "node-seed"),
        (&seed, "192.0.2.2/24", "seed-node"),
    ] {
        ns.run(["ip", "addr", "add", cidr, "dev", dev]).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let ingress = Arc::new(Ingress::default());
    seed.run_in(|| {
        kube_apiserver(&pki, deadline);
        ingress.serve(SocketAddr::from((INGRESS, INGRESS_PORT)), deadline);
    })
    .unwrap();

    // Gardener's command, as uid 0 with NET_BIND_SERVICE only, nothing in the environment.
    let root = tempfile::tempdir().unwrap();
    let (envoy, config) = lay_out(root.path());
    let logs = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (logs.path().join("stdout"), logs.path().join("stderr"));
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--bounding-set",
        "-all,+net_bind_service",
        "--inh-caps",
        "-all",
        "--ambient-caps",
        "-all",
        "--",
    ])
    .arg(&envoy)
    .args(["--concurrency", "2", "--use-dynamic-base-id", "-c"])
    .arg(&config)
    .env_clear()
    .current_dir(root.path())
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&stdout).unwrap())
    .stderr(std::fs::File::create(&stderr).unwrap());
    let pid = node.run_in(|| node.spawn(&mut cmd)).unwrap().unwrap();
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    node.run_in(|| {
        let start = Instant::now();
        // The stats listener is bound after the proxy's (a connection to 443 would be
        // tunnelled, and counted).
        while TcpStream::connect((Ipv4Addr::LOCALHOST, STATS_PORT)).is_err() {
            assert!(node.try_wait(pid).is_none(), "envoy exited:\n{}", log());
            assert!(start.elapsed() < WAIT, "envoy never listened:\n{}", log());
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .unwrap();
    // `/proc/<pid>` belongs to the process's effective user.
    let proc = std::fs::metadata(format!("/proc/{pid}")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&proc), 0);
    let caps = capabilities(Some(Pid::from_raw(pid as i32).unwrap())).unwrap();
    assert_eq!(caps.effective, CapabilitySet::NET_BIND_SERVICE);
    assert_eq!(caps.permitted, CapabilitySet::NET_BIND_SERVICE);

    // A TLS request through the advertise address reaches the kube-apiserver.
    let version = node.run_in(|| get_version(&pki)).unwrap();
    assert!(
        version.starts_with("HTTP/1.1 200 OK\r\n"),
        "{version}\n{}",
        log()
    );
    assert!(version.ends_with(VERSION), "{version}");
    let heads = ingress.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].starts_with(&format!("{REQUEST_LINE}\r\n")),
        "{heads:?}"
    );
    assert!(
        heads[0].contains(&format!("\r\nX-Gardener-Destination: {ROUTE}\r\n")),
        "{heads:?}"
    );

    // The probes' path on both stats addresses; other paths are not the admin's.
    let (ready, ready6, other) = node
        .run_in(|| {
            (
                status_of(
                    SocketAddr::from((Ipv4Addr::LOCALHOST, STATS_PORT)),
                    "/ready",
                ),
                status_of(
                    SocketAddr::from((Ipv6Addr::LOCALHOST, STATS_PORT)),
                    "/ready",
                ),
                status_of(
                    SocketAddr::from((Ipv4Addr::LOCALHOST, STATS_PORT)),
                    "/stats/prometheus",
                ),
            )
        })
        .unwrap();
    assert_eq!(ready, "HTTP/1.1 200 OK");
    assert_eq!(ready6, "HTTP/1.1 200 OK");
    assert_eq!(other, "HTTP/1.1 404 Not Found");

    // Every kept series with Envoy's label; nothing the job drops.
    let destroyed = format!("envoy_listener_downstream_cx_destroy{{{LISTENER}}}");
    let text = scrape_until(&node, "counted the first connection", |t| {
        t.contains(&format!("{destroyed} 1\n"))
    });
    let mut samples: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        samples.entry(name).or_default().push(line);
    }
    for (name, label) in KEPT {
        let lines = samples.get(name).map(Vec::as_slice).unwrap_or_default();
        assert!(!lines.is_empty(), "no series {name} in\n{text}");
        assert!(
            lines.iter().all(|l| l.contains(label)),
            "{name} without {label}: {lines:?}"
        );
    }
    assert!(!text.contains("envoy_cluster_name=\"uds_admin\""), "{text}");
    assert!(
        !text.contains("envoy_listener_address=\"0.0.0.0_16910\""),
        "{text}"
    );
    let total = |name: &str, label: &str| metric(&text, &format!("{name}{{{label}}}"));
    assert_eq!(total("envoy_tcp_downstream_cx_total", TCP), 1);
    assert_eq!(total("envoy_cluster_update_attempt", CLUSTER), 1);
    assert_eq!(total("envoy_cluster_upstream_cx_total", CLUSTER), 1);
    assert!(total("envoy_tcp_downstream_cx_rx_bytes_total", TCP) > 0);
    assert_eq!(
        total("envoy_tcp_downstream_cx_tx_bytes_total", TCP),
        total("envoy_cluster_upstream_cx_rx_bytes_total", CLUSTER)
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_connect_ms_count{{{CLUSTER}}}")
        ),
        1
    );

    // The ingress refuses: the client's connection is closed without a byte, and counted.
    ingress.refuse.store(true, Ordering::Relaxed);
    let got = node
        .run_in(|| {
            let mut s = TcpStream::connect((ADVERTISE, 443)).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s.write_all(b"\x16\x03\x01hello").unwrap();
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(0),
                Err(e) => Err(e.to_string()),
            }
        })
        .unwrap();
    assert_eq!(got, Ok(0), "the refused connection was not closed");
    let text = scrape_until(&node, "counted the refused connection", |t| {
        t.contains(&format!("{destroyed} 2\n"))
    });
    assert_eq!(
        metric(&text, "vpn_apiserver_proxy_connect_refused_total"),
        1
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_connect_fail{{{CLUSTER}}}")
        ),
        1
    );
    assert_eq!(
        metric(&text, &format!("envoy_tcp_downstream_cx_total{{{TCP}}}")),
        2
    );
    assert_eq!(ingress.heads.lock().unwrap().len(), 2);

    // One access-log line per connection, in the file's format.
    let lines: Vec<String> = std::fs::read_to_string(&stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2, "access log: {lines:#?}\nlog:\n{}", log());
    let shape = regex::Regex::new(
        r#"^\[\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\] 0 (?<flags>\S+) (?<rx>\d+) rx (?<tx>\d+) tx \d+ms "240\.168\.102\.23:\d+" "192\.0\.2\.2:8443"$"#,
    )
    .unwrap();
    let fields: Vec<_> = lines
        .iter()
        .map(|l| {
            shape
                .captures(l)
                .unwrap_or_else(|| panic!("{l:?} is not the file's format"))
        })
        .collect();
    assert_eq!(&fields[0]["flags"], "-");
    assert_ne!(&fields[0]["tx"], "0");
    assert_eq!(
        (&fields[1]["flags"], &fields[1]["rx"], &fields[1]["tx"]),
        ("UF", "0", "0")
    );
    node.stop(pid);
}
