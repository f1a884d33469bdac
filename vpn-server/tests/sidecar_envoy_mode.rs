//! `vpn-server` as Gardener runs its `envoy-proxy` container: the binary under the name
//! `envoy` (a link, as our image has `/usr/local/bin/envoy`), `--concurrency 2 -c
//! <envoy.yaml>`, uid 65532 and gid 31415, an empty environment, no capabilities (a non-root
//! uid has none), the certificates as Gardener mounts them (`ca.crt`, `tls.crt`, `tls.key`,
//! mode 0644) and our rendering of Gardener's envoy.yaml pointing at them.
//!
//! ```text
//!  SEED  lo 127.0.0.1 ::1, 169.254.169.254 (metadata), 10.1.0.5 (a seed pod): recorders :7001
//!        envoy: 0.0.0.0:9443 [::]:9443, metrics 0.0.0.0:15000 [::]:15000
//!        seed-out 100.96.0.1/24 198.51.100.1/24 2001:db8::1/64
//!          │ veth
//!  OUT   out-seed 100.96.0.10/24 ("shoot pod", echo :8080)
//!               198.51.100.2/24, 2001:db8::2/64 ("external webhook", echo :8443, :8445;
//!               nothing on :8444)
//! ```
//!
//! First run (Gardener's exact command, empty environment):
//! * the process runs as 65532:31415 with no capability;
//! * CONNECT with the client certificate to the shoot pod, the external IPv4 and IPv6
//!   destinations → 200 and an echo;
//! * CONNECT to loopback (literal and `localhost`), the metadata address, the sidecar's own
//!   address → 403, and the recorders saw nothing;
//! * CONNECT to a closed external port → 503, and a tunnel held for 1.1 s → 200: exactly these
//!   two lines on stdout, each matching Gardener's fluent-bit `envoy-proxy-parser`;
//! * `GET /metrics` on 15000 (IPv4 and IPv6) has every series Gardener's
//!   `reversed-vpn-envoy-side-car` job keeps, connection-manager series labelled
//!   `ingress_http`;
//! * nothing was written into the directory tree it was started in.
//!
//! Second run, with `SEED_POD_NETWORK` and `SIDECAR_EXTERNAL=deny` as the only variables: the
//! seed pod address and the external destination are 403, the shoot pod still 200.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lab::netns::Netns;
use lab::require_lab;
use lab::sidecar_client::{connect_status, connector, metric, scrape, tls, Pki, Recorder};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const FIXTURE: &str = include_str!("../../sidecar/fixtures/gardener-envoy.yaml");
/// Gardener's `envoy-proxy` user (distroless nonroot) and group (`EnvoyVPNGroupId`).
const UID: u32 = 65532;
const GID: u32 = 31415;

const SHOOT_POD: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
const EXTERNAL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
const EXTERNAL6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
const SEED_OWN: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const SEED_POD: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
const RECORDED: u16 = 7001;

/// Gardener's fluent-bit parser `envoy-proxy-parser` (regex and time format
/// `%Y-%m-%dT%H:%M:%S.%L%z`).
const PARSER: &str = r"^\[(?<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+\S+?)]\s+(?<log>.*)$";

/// Every series Gardener's `reversed-vpn-envoy-side-car` scrape job keeps.
const KEPT: &[&str] = &[
    "envoy_cluster_external_upstream_rq",
    "envoy_cluster_external_upstream_rq_completed",
    "envoy_cluster_external_upstream_rq_xx",
    "envoy_cluster_lb_healthy_panic",
    "envoy_cluster_original_dst_host_invalid",
    "envoy_cluster_upstream_cx_active",
    "envoy_cluster_upstream_cx_connect_attempts_exceeded",
    "envoy_cluster_upstream_cx_connect_fail",
    "envoy_cluster_upstream_cx_connect_timeout",
    "envoy_cluster_upstream_cx_max_requests",
    "envoy_cluster_upstream_cx_none_healthy",
    "envoy_cluster_upstream_cx_overflow",
    "envoy_cluster_upstream_cx_pool_overflow",
    "envoy_cluster_upstream_cx_protocol_error",
    "envoy_cluster_upstream_cx_rx_bytes_total",
    "envoy_cluster_upstream_cx_total",
    "envoy_cluster_upstream_cx_tx_bytes_total",
    "envoy_cluster_upstream_cx_connect_ms_bucket",
    "envoy_cluster_upstream_cx_connect_ms_sum",
    "envoy_cluster_upstream_cx_length_ms_bucket",
    "envoy_cluster_upstream_cx_length_ms_sum",
    "envoy_cluster_upstream_rq",
    "envoy_cluster_upstream_rq_completed",
    "envoy_cluster_upstream_rq_max_duration_reached",
    "envoy_cluster_upstream_rq_pending_overflow",
    "envoy_cluster_upstream_rq_per_try_timeout",
    "envoy_cluster_upstream_rq_retry",
    "envoy_cluster_upstream_rq_retry_limit_exceeded",
    "envoy_cluster_upstream_rq_retry_overflow",
    "envoy_cluster_upstream_rq_rx_reset",
    "envoy_cluster_upstream_rq_timeout",
    "envoy_cluster_upstream_rq_total",
    "envoy_cluster_upstream_rq_tx_reset",
    "envoy_cluster_upstream_rq_xx",
    "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_attempt",
    "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_failure",
    "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_success",
    "envoy_dns_cache_dynamic_forward_proxy_cache_config_host_overflow",
    "envoy_dns_cache_dynamic_forward_proxy_cache_config_num_hosts",
    "envoy_http_downstream_cx_rx_bytes_total",
    "envoy_http_downstream_cx_total",
    "envoy_http_downstream_cx_tx_bytes_total",
    "envoy_http_downstream_cx_length_ms_bucket",
    "envoy_http_downstream_cx_length_ms_sum",
    "envoy_http_downstream_rq_xx",
    "envoy_http_no_route",
    "envoy_http_rq_total",
    "envoy_listener_http_downstream_rq_xx",
    "envoy_server_memory_allocated",
    "envoy_server_memory_heap_size",
    "envoy_server_memory_physical_size",
];

/// The file tree of the container: the image's link, Gardener's mounts.
struct Container {
    root: tempfile::TempDir,
    envoy: PathBuf,
    config: PathBuf,
}

impl Container {
    fn lay_out(pki: &Pki) -> Container {
        let root = tempfile::tempdir().unwrap();
        let dir = |p: &str| {
            let d = root.path().join(p);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        // The binary as the image has it, and `envoy` linking to it.
        let bin = dir("bin").join("vpn-server");
        std::fs::copy(BIN, &bin).unwrap();
        let envoy = dir("usr/local/bin").join("envoy");
        symlink(&bin, &envoy).unwrap();
        // Gardener's `certs` volume (projected, mode 0644) and the ConfigMap.
        let certs = dir("srv/secrets/envoy-proxy");
        let files = [
            ("ca.crt", pki.bundle.to_pem().unwrap()),
            ("tls.crt", pki.server.chain_pem().unwrap()),
            ("tls.key", pki.server.key_pem().unwrap()),
        ];
        for (name, pem) in files {
            let path = certs.join(name);
            std::fs::write(&path, pem).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let config = dir("etc/envoy").join("envoy.yaml");
        let text = FIXTURE.replace("/srv/secrets/envoy-proxy", &certs.display().to_string());
        std::fs::write(&config, text).unwrap();
        // Readable and searchable by the container's user, writable by nobody but root.
        for entry in walk(root.path()) {
            if entry.is_dir() {
                std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Container {
            root,
            envoy,
            config,
        }
    }

    /// Starts `envoy --concurrency 2 -c <config>` in `ns` as Gardener does, with `env` as
    /// the whole environment; stdout and stderr go to files outside the tree.
    fn start(&self, ns: &Netns, env: &[(&str, &str)], out: &Path, err: &Path) -> u32 {
        let mut cmd = Command::new(&self.envoy);
        cmd.args(["--concurrency", "2", "-c"])
            .arg(&self.config)
            .env_clear()
            .envs(env.iter().copied())
            .uid(UID)
            .gid(GID)
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).unwrap())
            .stderr(std::fs::File::create(err).unwrap());
        // Spawned from a thread inside the namespace, so the process lives there.
        let pid = ns.run_in(|| ns.spawn(&mut cmd)).unwrap().unwrap();
        ns.run_in(|| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while TcpStream::connect((Ipv4Addr::LOCALHOST, 9443)).is_err()
                || TcpStream::connect((Ipv4Addr::LOCALHOST, 15000)).is_err()
            {
                let log = std::fs::read_to_string(err).unwrap_or_default();
                assert!(ns.try_wait(pid).is_none(), "envoy exited:\n{log}");
                assert!(Instant::now() < deadline, "envoy never listened:\n{log}");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .unwrap();
        pid
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_owned()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.is_symlink() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Echoes every connection to `addr` until `deadline` (call inside the namespace).
fn echo(addr: SocketAddr, deadline: Instant) {
    let listener = TcpListener::bind(addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((mut s, _)) => {
                    std::thread::spawn(move || {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                        let mut buf = [0u8; 4096];
                        while let Ok(n @ 1..) = s.read(&mut buf) {
                            if s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
}

/// CONNECTs with the kube-apiserver's client certificate; for a 200, sends a line after
/// `hold` and checks it comes back.
fn request(pki: &Pki, target: &str, hold: Duration) -> Option<u16> {
    let good = connector(&pki.bundle, Some(&pki.client));
    let mut s = tls(&good, SocketAddr::from((Ipv4Addr::LOCALHOST, 9443))).unwrap();
    let status = connect_status(&mut s, target);
    if status == Some(200) {
        std::thread::sleep(hold);
        s.write_all(b"ping\n").unwrap();
        let mut back = [0u8; 5];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping\n", "echo through {target}");
        let _ = s.shutdown();
    }
    status
}

/// The fields of `/proc/<pid>/status` named `name`.
fn proc_status(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn envoy_proxy_container_as_gardener_runs_it() {
    require_lab(&[]);
    let pki = Pki::generate();
    let seed = Netns::new().unwrap();
    let out = Netns::new().unwrap();
    Netns::veth_pair(&seed, "seed-out", &out, "out-seed").unwrap();
    let addresses: [(&Netns, &str, &str); 8] = [
        (&seed, "100.96.0.1/24", "seed-out"),
        (&seed, "198.51.100.1/24", "seed-out"),
        (&seed, "2001:db8::1/64", "seed-out"),
        (&seed, "169.254.169.254/32", "lo"),
        (&seed, "10.1.0.5/32", "lo"),
        (&out, "100.96.0.10/24", "out-seed"),
        (&out, "198.51.100.2/24", "out-seed"),
        (&out, "2001:db8::2/64", "out-seed"),
    ];
    for (ns, cidr, dev) in addresses {
        let mut argv = vec!["ip", "addr", "add", cidr, "dev", dev];
        if cidr.contains(':') {
            argv.push("nodad");
        }
        ns.run(argv).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    out.run_in(|| {
        echo(SocketAddr::from((SHOOT_POD, 8080)), deadline);
        for port in [8443, 8445] {
            echo(SocketAddr::from((EXTERNAL, port)), deadline);
        }
        echo(SocketAddr::from((EXTERNAL6, 8443)), deadline);
    })
    .unwrap();
    let recorders: Vec<Recorder> = seed
        .run_in(|| {
            [
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                IpAddr::V4(METADATA),
                IpAddr::V4(SEED_POD),
            ]
            .into_iter()
            .map(|ip| Recorder::bind(SocketAddr::new(ip, RECORDED)))
            .collect()
        })
        .unwrap();
    let container = Container::lay_out(&pki);
    let tree_before = walk(container.root.path());
    let logs = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (logs.path().join("stdout"), logs.path().join("stderr"));

    // Run 1: Gardener's command, nothing else.
    let pid = container.start(&seed, &[], &stdout, &stderr);
    assert_eq!(proc_status(pid, "Uid"), "65532 65532 65532 65532");
    assert_eq!(proc_status(pid, "Gid"), "31415 31415 31415 31415");
    assert_eq!(proc_status(pid, "Groups"), "");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(proc_status(pid, caps), "0000000000000000", "{caps}");
    }
    let cases: Vec<(String, Option<u16>)> = vec![
        (format!("{SHOOT_POD}:8080"), Some(200)),
        (format!("{EXTERNAL}:8443"), Some(200)),
        (format!("[{EXTERNAL6}]:8443"), Some(200)),
        (format!("127.0.0.1:{RECORDED}"), Some(403)),
        (format!("[::1]:{RECORDED}"), Some(403)),
        (format!("localhost:{RECORDED}"), Some(403)),
        (format!("{METADATA}:{RECORDED}"), Some(403)),
        (format!("{SEED_OWN}:15000"), Some(403)),
        (format!("{EXTERNAL}:8444"), Some(503)),
    ];
    let got = seed
        .run_in(|| {
            let mut got: Vec<Option<u16>> = cases
                .iter()
                .map(|(t, _)| request(&pki, t, Duration::ZERO))
                .collect();
            // The slow request: a tunnel held open for 1.1 s.
            got.push(request(
                &pki,
                &format!("{EXTERNAL}:8445"),
                Duration::from_millis(1100),
            ));
            got
        })
        .unwrap();
    let log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    for ((target, want), got) in cases.iter().zip(&got) {
        assert_eq!(got, want, "CONNECT {target}; log:\n{}", log());
    }
    assert_eq!(
        got.last(),
        Some(&Some(200)),
        "slow CONNECT; log:\n{}",
        log()
    );
    for r in &recorders {
        assert_eq!(r.accepted(), 0, "{} was connected to", r.addr());
    }

    // Metrics on both metrics addresses.
    let (text, text6) = seed
        .run_in(|| {
            (
                scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000))),
                scrape(SocketAddr::from((Ipv6Addr::LOCALHOST, 15000))),
            )
        })
        .unwrap();
    assert!(text6.contains("envoy_http_rq_total"), "{text6}");
    for name in KEPT {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(['{', ' ']))
            })
            .collect();
        assert!(!lines.is_empty(), "no series {name} in\n{text}");
        if name.starts_with("envoy_http_") || name.starts_with("envoy_listener_") {
            assert!(
                lines
                    .iter()
                    .all(|l| l.contains("envoy_http_conn_manager_prefix=\"ingress_http\"")),
                "{name} without the ingress_http label: {lines:?}"
            );
        }
        if name.starts_with("envoy_cluster_") {
            assert!(
                lines
                    .iter()
                    .all(|l| l.contains("envoy_cluster_name=\"dynamic_forward_proxy_cluster\"")),
                "{name} without the cluster label: {lines:?}"
            );
        }
    }
    let hcm = "envoy_http_conn_manager_prefix=\"ingress_http\"";
    let class = |c: &str| {
        metric(
            &text,
            &format!(
                "envoy_listener_http_downstream_rq_xx{{envoy_listener_address=\"0.0.0.0_9443\",\
                 {hcm},envoy_response_code_class=\"{c}\"}}"
            ),
        )
    };
    assert_eq!((class("2"), class("4"), class("5")), (4, 5, 1));
    assert_eq!(metric(&text, &format!("envoy_http_rq_total{{{hcm}}}")), 10);
    let cluster = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_total{{{cluster}}}")
        ),
        4
    );
    assert_eq!(
        metric(
            &text,
            &format!("envoy_cluster_upstream_cx_connect_fail{{{cluster}}}")
        ),
        1
    );
    let dns = "envoy_dns_cache_dynamic_forward_proxy_cache_config_";
    assert_eq!(metric(&text, &format!("{dns}dns_query_success")), 1);
    assert_eq!(metric(&text, &format!("{dns}num_hosts")), 1);
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"loopback\"}"),
        3
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"local\"}"),
        1
    );
    assert!(metric(&text, "envoy_server_memory_physical_size") > 0);

    // The access log: the failed and the slow request, nothing else, each line as
    // Gardener's fluent-bit parser takes it.
    let wait = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&stdout).unwrap();
        if text.lines().count() >= 2 || Instant::now() > wait {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let parser = regex::Regex::new(PARSER).unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 2, "access log:\n{lines:#?}");
    let failed = "\"CONNECT - HTTP/1.1\" 503 UF 0 rx 0 tx ".to_owned();
    let slow = "\"CONNECT - HTTP/1.1\" 200 - 5 rx 5 tx ".to_owned();
    for (line, want, target) in [
        (lines[0], &failed, format!("{EXTERNAL}:8444")),
        (lines[1], &slow, format!("{EXTERNAL}:8445")),
    ] {
        let fields = parser
            .captures(line)
            .unwrap_or_else(|| panic!("{line:?} does not match the parser"));
        check_time(&fields["time"]);
        let rest = &fields["log"];
        assert!(rest.starts_with(want.as_str()), "{rest}");
        assert!(
            rest.ends_with(&format!("\"{target}\" \"{target}\"")),
            "authority and upstream host in {rest}"
        );
        let ms: u64 = rest[want.len()..]
            .split_once("ms ")
            .and_then(|(ms, _)| ms.parse().ok())
            .unwrap_or_else(|| panic!("duration in {rest}"));
        if want == &slow {
            assert!(ms >= 1100, "{rest}");
        }
    }

    // Nothing written into the container's tree.
    seed.stop(pid);
    assert_eq!(walk(container.root.path()), tree_before);

    // Run 2: the seed pod network given, external destinations refused.
    let env = [
        ("SEED_POD_NETWORK", "10.1.0.0/16"),
        ("SIDECAR_EXTERNAL", "deny"),
    ];
    let pid = container.start(&seed, &env, &stdout, &stderr);
    let (statuses, text) = seed
        .run_in(|| {
            let statuses: Vec<Option<u16>> = [
                format!("{SEED_POD}:{RECORDED}"),
                format!("{EXTERNAL}:8443"),
                format!("{SHOOT_POD}:8080"),
            ]
            .iter()
            .map(|t| request(&pki, t, Duration::ZERO))
            .collect();
            (
                statuses,
                scrape(SocketAddr::from((Ipv4Addr::LOCALHOST, 15000))),
            )
        })
        .unwrap();
    assert_eq!(
        statuses,
        [Some(403), Some(403), Some(200)],
        "log:\n{}",
        log()
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"seed_network\"}"),
        1
    );
    assert_eq!(
        metric(&text, "vpn_sidecar_denied_total{reason=\"not_shoot\"}"),
        1
    );
    for r in &recorders {
        assert_eq!(r.accepted(), 0, "{} was connected to", r.addr());
    }
    seed.stop(pid);
}

/// `%Y-%m-%dT%H:%M:%S.%L%z` with Envoy's milliseconds and `Z`, within a minute of now.
fn check_time(time: &str) {
    let shape = regex::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$").unwrap();
    assert!(shape.is_match(time), "{time}");
    let n = |r: std::ops::Range<usize>| time[r].parse::<i64>().unwrap();
    let (y, mo, d, h, mi, s) = (n(0..4), n(5..7), n(8..10), n(11..13), n(14..16), n(17..19));
    // Days since the epoch of a Gregorian date (the inverse of the civil-date walk).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now - secs).abs() < 60, "{time} is not now");
}

/// Runs `program args…` with an empty environment; (exit code, stderr).
fn run(program: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn envoy_flags_and_files_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let envoy = dir.path().join("envoy");
    symlink(BIN, &envoy).unwrap();
    // A flag Envoy has but this sidecar does not honour.
    let (code, err) = run(
        &envoy,
        &["--concurrency", "2", "-c", "/x.yaml", "--mode", "validate"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--mode"), "{err}");
    // No bootstrap file.
    let (code, err) = run(&envoy, &["--concurrency", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--config-path"), "{err}");
    // The file, as `envoy` and as `vpn-server envoy`: one line naming it.
    let (code, err) = run(&envoy, &["-c", "/nonexistent/envoy.yaml"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("vpn-server: error: cannot read /nonexistent/envoy.yaml"),
        "{err}"
    );
    let bad = dir.path().join("envoy.yaml");
    std::fs::write(&bad, FIXTURE.replace("max_hosts: 8192", "max_hosts: many")).unwrap();
    let bad = bad.display().to_string();
    let (code, err) = run(Path::new(BIN), &["envoy", "--concurrency", "2", "-c", &bad]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with(&format!(
            "vpn-server: error: {bad}: line 82: static_resources.listeners[0].filter_chains[0]\
             .filters[0].typed_config.http_filters[0].typed_config.dns_cache_config.max_hosts: \
             expected a non-negative integer"
        )),
        "{err}"
    );
}
