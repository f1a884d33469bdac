//! The demo: a seed and a shoot in network namespaces, joined only through an HTTP CONNECT
//! proxy, with real traffic from the seed into the shoot's pod network through our tunnel.
//!
//! ```text
//!  SEED                         INGRESS                      SHOOT                      POD
//!  vpn_server::Server           router :8443                 vpn_client::run            python3 -m http.server
//!  tun0 192.168.123.1/24        (the seed's ingress)         tun0 192.168.123.x/24      100.96.0.10:8080
//!  route 100.96.0.0/24 tun0                                  ip_forward=1               default via 100.96.0.1
//!  iroute for vpn-shoot-client
//!  10.250.0.1/30 ──veth── 10.250.0.2/30   10.250.0.5/30 ──veth── 10.250.0.6/30
//!                                                            100.96.0.1/24 ──veth── 100.96.0.10/24
//! ```
//!
//! SHOOT has no route to SEED: the client dials the ingress router (`vpn_router`) in
//! INGRESS with `CONNECT 10.250.0.1:1194` and the header
//! `Reversed-VPN: outbound|1194||vpn-seed-server.shoot--demo--lab.svc.cluster.local`; the
//! router routes by that header (the request target is ignored) to 10.250.0.1:1194, and only
//! for SHOOT's address (its allow-list). The PKI (a CA, the server
//! and client certificates, the tls-auth key) is issued with the `pki` crate. Once the tunnel
//! is up, SEED pings the pod address and downloads a generated file from the pod's HTTP
//! server with `curl`; the SHA-256 of what arrived must equal the served file's. Last, the
//! server's status file must list the client at its pool address (and gives the cipher).
//!
//! [`run`] performs every step, reports each one as it finishes, tears everything down (client,
//! server, proxy, HTTP server, namespaces; also after a failed step) and returns a [`Summary`].
//! Nothing touches the root namespace: every address and route lives in the four lab
//! namespaces.

use std::fmt;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netio::report::chain;
use openssl::sha::Sha256;
use pki::tls::{control_channel_server, PeerPolicy};
use pki::{Ca, CaBundle, CertProfile, Identity, IssueRequest, KeySpec, Validity};
use protocol::digest::Digest;
use protocol::key::{Key2, KeyDirection};
use protocol::session::{ControlProtection, Keepalive};
use protocol::static_key;
use vpn_client::{CancellationToken, HttpProxy, Remote, Stopped, TlsMaterial};

use crate::netns::Netns;
use crate::{check_lab, LabError};

/// The seed server's address on the SEED–INGRESS link (what the client asks the proxy for).
pub const SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// INGRESS on the SEED link.
pub const INGRESS_SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
/// INGRESS on the SHOOT link: where the router listens.
pub const PROXY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 5);
/// SHOOT on the INGRESS link.
pub const SHOOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 6);
/// The router's port (Gardener's unified CONNECT port).
pub const PROXY_PORT: u16 = 8443;
/// The OpenVPN port.
pub const VPN_PORT: u16 = 1194;
/// The server's tun address (the first of the `192.168.123.0/24` pool).
pub const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);
/// The shoot pod network (behind the client: the server's `route` and the client's `iroute`).
pub const POD_NETWORK: &str = "100.96.0.0/24";
/// SHOOT's address in the pod network: the pods' gateway.
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 1);
/// The pod: where the HTTP server listens.
pub const POD_ADDR: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
/// The pod's HTTP port.
pub const HTTP_PORT: u16 = 8080;
/// The client certificate's CN (the server's `iroute` is keyed on it).
pub const CLIENT_CN: &str = "vpn-shoot-client";
/// The server certificate's CN.
pub const SERVER_CN: &str = "vpn-seed-server";
/// The routing header the client sends to the proxy.
pub const REVERSED_VPN_HEADER: (&str, &str) = (
    "Reversed-VPN",
    "outbound|1194||vpn-seed-server.shoot--demo--lab.svc.cluster.local",
);
/// Size of the file served in the pod network.
pub const FILE_LEN: usize = 16 << 20;
/// Name of that file.
pub const FILE_NAME: &str = "shoot-pod-data.bin";
/// Echo requests sent by the ping step.
pub const PING_COUNT: u32 = 3;

/// How long one wait in the demo may take (a process listening, the tunnel coming up, ...).
const WAIT: Duration = Duration::from_secs(15);

/// The steps of the demo, in order (a step after a failed one is reported as skipped).
pub const STEPS: [&str; 11] = [
    "preflight",
    "lab",
    "pki",
    "proxy",
    "pod http server",
    "vpn-server",
    "tunnel",
    "ping",
    "download",
    "status file",
    "teardown",
];

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A lab operation (namespace, command, process) failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// Issuing the PKI failed.
    #[error("issuing {what} failed")]
    Issue {
        /// Which certificate.
        what: &'static str,
        /// Why.
        #[source]
        source: pki::IssueError,
    },
    /// Building the CA bundle or the server's TLS context failed.
    #[error("building the server's TLS context failed")]
    Tls(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The ingress router could not start.
    #[error("ingress router failed")]
    Router(#[source] vpn_router::RouterError),
    /// The server could not start or stopped with an error.
    #[error("vpn-server failed")]
    Server(#[source] vpn_server::ServerError),
    /// The client gave up.
    #[error("vpn-client failed")]
    Client(#[source] vpn_client::RunError),
    /// The client returned for another reason than our shutdown.
    #[error("vpn-client stopped unexpectedly: {stopped:?}")]
    ClientStopped {
        /// How it stopped.
        stopped: Stopped,
    },
    /// A tokio runtime could not be built.
    #[error("cannot build a tokio runtime")]
    Runtime(#[source] std::io::Error),
    /// A thread of the demo panicked.
    #[error("the {what} thread panicked")]
    Panicked {
        /// Which thread.
        what: &'static str,
    },
    /// A program the demo ran did not give the expected result.
    #[error("{what}: {detail}")]
    Unexpected {
        /// What was checked.
        what: &'static str,
        /// What was seen instead.
        detail: String,
    },
}

impl DemoError {
    fn unexpected(what: &'static str, detail: impl Into<String>) -> Self {
        DemoError::Unexpected {
            what,
            detail: detail.into(),
        }
    }
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done; a short description of what was done or seen.
    Ok(String),
    /// Failed; the error with its causes.
    Failed(String),
    /// Not run because an earlier step failed.
    Skipped,
}

/// One step of the demo.
#[derive(Debug, Clone)]
pub struct Step {
    /// One of [`STEPS`].
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub took: Duration,
}

/// How the ping step measured round trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingMethod {
    /// `ping` (iputils) in SEED: ICMP echo.
    Icmp,
    /// `ping` is not installed: TCP connects to the pod's HTTP port, timed.
    TcpConnect,
}

/// What the ping step saw.
#[derive(Debug, Clone)]
pub struct Ping {
    /// ICMP or TCP connect.
    pub method: PingMethod,
    /// Probes sent.
    pub sent: u32,
    /// Replies received.
    pub received: u32,
    /// The round-trip time of each reply.
    pub rtts: Vec<Duration>,
}

/// What the download step saw.
#[derive(Debug, Clone)]
pub struct Download {
    /// What was fetched.
    pub url: String,
    /// Bytes received.
    pub bytes: u64,
    /// Wall time of the transfer as `curl` measured it.
    pub took: Duration,
    /// SHA-256 of the file the pod served.
    pub served_sha256: [u8; 32],
    /// SHA-256 of what arrived in SEED.
    pub received_sha256: [u8; 32],
    /// The size of the served file.
    pub expected_bytes: u64,
}

impl Download {
    /// Whether the received bytes are the served file.
    pub fn checksum_ok(&self) -> bool {
        self.served_sha256 == self.received_sha256 && self.bytes == self.expected_bytes
    }

    /// Throughput in MiB/s.
    pub fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.took.as_secs_f64().max(1e-9)
    }
}

/// Everything the demo did and measured.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Every step of [`STEPS`], in order.
    pub steps: Vec<Step>,
    /// The lab namespaces: role and name.
    pub namespaces: Vec<(&'static str, String)>,
    /// The address the client got from the server's pool.
    pub pool_address: Option<Ipv4Addr>,
    /// The data-channel cipher, as the server's status file lists it for the client.
    pub cipher: Option<String>,
    /// From starting the client to its tun device carrying the pushed address.
    pub tunnel_up: Option<Duration>,
    /// How the ingress router routed the client's CONNECT.
    pub proxy_connect: Option<String>,
    /// The ping step's result.
    pub ping: Option<Ping>,
    /// The download step's result.
    pub download: Option<Download>,
    /// Wall time of the whole demo.
    pub total: Duration,
}

impl Summary {
    /// Whether every step succeeded.
    pub fn success(&self) -> bool {
        self.steps.len() == STEPS.len()
            && self
                .steps
                .iter()
                .all(|s| matches!(s.outcome, Outcome::Ok(_)))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let none = || "-".to_owned();
        let passed = self
            .steps
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Ok(_)))
            .count();
        let failed: Vec<&str> = self
            .steps
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Failed(_)))
            .map(|s| s.name)
            .collect();
        writeln!(f, "Summary")?;
        writeln!(
            f,
            "  path           SEED {SERVER_TUN} -> tun0 -> vpn-server => TCP via the ingress router (INGRESS) => vpn-client -> SHOOT -> pod {POD_ADDR}"
        )?;
        writeln!(
            f,
            "  pool address   {}",
            self.pool_address.map_or_else(none, |a| a.to_string())
        )?;
        writeln!(
            f,
            "  data cipher    {}",
            self.cipher.clone().unwrap_or_else(none)
        )?;
        writeln!(
            f,
            "  tunnel up in   {}",
            self.tunnel_up.map_or_else(none, ms)
        )?;
        if let Some(p) = &self.ping {
            let rtts: Vec<String> = p.rtts.iter().copied().map(ms).collect();
            writeln!(
                f,
                "  ping           {}/{} replies ({}), rtt {}",
                p.received,
                p.sent,
                match p.method {
                    PingMethod::Icmp => "ICMP",
                    PingMethod::TcpConnect => "TCP connect",
                },
                rtts.join(", ")
            )?;
        }
        if let Some(d) = &self.download {
            writeln!(
                f,
                "  download       {} bytes in {} = {:.1} MiB/s, sha256 {}",
                d.bytes,
                ms(d.took),
                d.mib_per_sec(),
                if d.checksum_ok() {
                    format!("{}... matches", hex_prefix(&d.received_sha256))
                } else {
                    format!(
                        "MISMATCH (served {}..., got {}...)",
                        hex_prefix(&d.served_sha256),
                        hex_prefix(&d.received_sha256)
                    )
                }
            )?;
        }
        writeln!(f, "  total          {}", ms(self.total))?;
        if self.success() {
            write!(
                f,
                "  result         ✔ {passed}/{} steps passed",
                STEPS.len()
            )
        } else {
            write!(
                f,
                "  result         ✘ {passed}/{} steps passed; failed: {}",
                STEPS.len(),
                failed.join(", ")
            )
        }
    }
}

/// A duration in milliseconds with two decimals (seconds from 1 s on).
fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    }
}

/// A step as one line: mark, name, time, detail.
#[derive(Debug)]
pub struct StepLine<'a>(pub &'a Step);

impl fmt::Display for StepLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let (mark, detail) = match &s.outcome {
            Outcome::Ok(d) => ("✔", d.as_str()),
            Outcome::Failed(e) => ("✘", e.as_str()),
            Outcome::Skipped => ("·", "skipped"),
        };
        write!(f, "{mark} {:<16} {:>11}  {detail}", s.name, ms(s.took))
    }
}

fn hex_prefix(b: &[u8]) -> String {
    b.iter().take(8).map(|x| format!("{x:02x}")).collect()
}

/// Records steps, reports each as it finishes, and stops running steps after a failure.
struct Recorder<'a> {
    summary: Summary,
    failed: bool,
    report: &'a mut dyn FnMut(&Step),
}

impl Recorder<'_> {
    /// Runs `f` as step `name` unless an earlier step failed; `f` returns its value and the
    /// line to show.
    fn step<T>(
        &mut self,
        name: &'static str,
        f: impl FnOnce(&mut Summary) -> Result<(T, String), DemoError>,
    ) -> Option<T> {
        if self.failed {
            return None;
        }
        let start = Instant::now();
        let (value, outcome) = match f(&mut self.summary) {
            Ok((v, line)) => (Some(v), Outcome::Ok(line)),
            Err(e) => {
                self.failed = true;
                (None, Outcome::Failed(chain(&e)))
            }
        };
        let step = Step {
            name,
            outcome,
            took: start.elapsed(),
        };
        (self.report)(&step);
        self.summary.steps.push(step);
        value
    }

    /// Adds the steps that never ran as skipped.
    fn finish(mut self, total: Duration) -> Summary {
        for name in STEPS {
            if !self.summary.steps.iter().any(|s| s.name == name) {
                let step = Step {
                    name,
                    outcome: Outcome::Skipped,
                    took: Duration::ZERO,
                };
                (self.report)(&step);
                self.summary.steps.push(step);
            }
        }
        let mut s = self.summary;
        s.steps
            .sort_by_key(|st| STEPS.iter().position(|n| *n == st.name));
        s.total = total;
        s
    }
}

/// Runs the demo (see the module docs). `report` is called with each step as it finishes.
/// Needs root, `ip`, `python3` and `curl`; `ping` is used when present.
pub fn run(report: &mut dyn FnMut(&Step)) -> Summary {
    run_with_file(FILE_LEN, report)
}

/// [`run`] with a pod file of `file_len` bytes (the end-to-end test moves 64 MiB).
pub fn run_with_file(file_len: usize, report: &mut dyn FnMut(&Step)) -> Summary {
    let start = Instant::now();
    let mut rec = Recorder {
        summary: Summary::default(),
        failed: false,
        report,
    };
    let tools = rec.step("preflight", |_| preflight());
    let lab = tools
        .and_then(|tools| rec.step("lab", |s| Lab::build(tools, s)))
        .map(|lab| Lab { file_len, ..lab });
    if let Some(lab) = lab {
        let stopped = with_lab(&mut rec, &lab);
        // Teardown runs also after a failed step.
        let failed = rec.failed;
        rec.failed = false;
        rec.step("teardown", |_| {
            let line = lab.teardown()?;
            stopped.map(|()| ((), line))
        });
        rec.failed |= failed;
    }
    rec.finish(start.elapsed())
}

/// The programs the demo runs.
#[derive(Debug, Clone)]
struct Tools {
    python: String,
    ping: bool,
}

fn preflight() -> Result<(Tools, String), DemoError> {
    // Debian's python3 when present (a pyenv shim also works, only slower to start).
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3".to_owned()
    } else {
        "python3".to_owned()
    };
    check_lab(&["curl", &python])?;
    let ping = Command::new("ping")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let line = format!(
        "root, /dev/net/tun, ip, curl, python3{}",
        if ping {
            ", ping"
        } else {
            " (no ping: TCP connect timing instead)"
        }
    );
    Ok((Tools { python, ping }, line))
}

/// The four namespaces and a scratch directory (PKI files are not written; the served file
/// and the proxy's config and log are).
struct Lab {
    seed: Netns,
    ingress: Netns,
    shoot: Netns,
    pod: Netns,
    dir: tempfile::TempDir,
    tools: Tools,
    /// Size of the file the pod serves.
    file_len: usize,
}

impl Lab {
    fn build(tools: Tools, summary: &mut Summary) -> Result<(Lab, String), DemoError> {
        let dir = tempfile::tempdir().map_err(|e| LabError::Io {
            path: std::env::temp_dir(),
            source: e,
        })?;
        let lab = Lab {
            seed: Netns::new()?,
            ingress: Netns::new()?,
            shoot: Netns::new()?,
            pod: Netns::new()?,
            dir,
            tools,
            file_len: FILE_LEN,
        };
        summary.namespaces = vec![
            ("SEED", lab.seed.name().to_owned()),
            ("INGRESS", lab.ingress.name().to_owned()),
            ("SHOOT", lab.shoot.name().to_owned()),
            ("POD", lab.pod.name().to_owned()),
        ];
        let links: [(&Netns, &str, String, &Netns, &str, String); 3] = [
            (
                &lab.seed,
                "seed-ingress",
                format!("{SEED_ADDR}/30"),
                &lab.ingress,
                "ingress-seed",
                format!("{INGRESS_SEED_ADDR}/30"),
            ),
            (
                &lab.ingress,
                "ingress-shoot",
                format!("{PROXY_ADDR}/30"),
                &lab.shoot,
                "shoot-ingress",
                format!("{SHOOT_ADDR}/30"),
            ),
            (
                &lab.shoot,
                "shoot-pod",
                format!("{POD_GATEWAY}/24"),
                &lab.pod,
                "pod0",
                format!("{POD_ADDR}/24"),
            ),
        ];
        for (a, a_if, a_addr, b, b_if, b_addr) in &links {
            Netns::veth_pair(a, a_if, b, b_if)?;
            a.run(["ip", "addr", "add", a_addr, "dev", a_if])?;
            b.run(["ip", "addr", "add", b_addr, "dev", b_if])?;
        }
        lab.pod.run([
            "ip",
            "route",
            "add",
            "default",
            "via",
            &POD_GATEWAY.to_string(),
        ])?;
        lab.shoot
            .run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
        let names: Vec<String> = summary
            .namespaces
            .iter()
            .map(|(role, name)| format!("{role}={name}"))
            .collect();
        let line = format!("{}; SHOOT forwards into {POD_NETWORK}", names.join(" "));
        Ok((lab, line))
    }

    /// Starts the ingress router in INGRESS (a runtime whose threads live there): one
    /// listener honouring `Reversed-VPN`, one route to the server, allowed for SHOOT only.
    fn start_router(&self) -> Result<(IngressRouter, String), DemoError> {
        let text = format!(
            "[[listener]]\naddress = \"{PROXY_ADDR}:{PROXY_PORT}\"\nheaders = [\"{}\"]\n\n\
             [[route]]\nvalue = \"{}\"\nupstream = \"{SEED_ADDR}:{VPN_PORT}\"\n\
             allow = [\"{SHOOT_ADDR}/32\"]\n",
            REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
        );
        let config =
            vpn_router::RouterConfig::parse(&text).map_err(|e| DemoError::Router(e.into()))?;
        let token = CancellationToken::new();
        let (rt, counters) = self.ingress.run_in(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(DemoError::Runtime)?;
            let router = rt
                .block_on(vpn_router::Router::bind_config(config, None))
                .map_err(DemoError::Router)?;
            let counters = router.counters();
            rt.spawn(router.run(token.clone()));
            Ok::<_, DemoError>((rt, counters))
        })??;
        Ok((
            IngressRouter {
                rt: Some(rt),
                token,
                counters,
            },
            format!(
                "vpn_router in INGRESS on {PROXY_ADDR}:{PROXY_PORT}: {} {} -> {SEED_ADDR}:{VPN_PORT}, allowed for {SHOOT_ADDR}",
                REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
            ),
        ))
    }

    /// Writes the file and starts `python3 -m http.server` on the pod address.
    fn start_http(&self) -> Result<([u8; 32], String), DemoError> {
        let www = self.dir.path().join("www");
        std::fs::create_dir(&www).map_err(|e| LabError::Io {
            path: www.clone(),
            source: e,
        })?;
        let (data, digest) = generate_file(self.file_len);
        let path = www.join(FILE_NAME);
        std::fs::write(&path, &data).map_err(|e| LabError::Io {
            path: path.clone(),
            source: e,
        })?;
        let pid = self.pod.spawn(
            self.pod
                .command(&self.tools.python)
                .args(["-m", "http.server", &HTTP_PORT.to_string()])
                .args(["--bind", &POD_ADDR.to_string()])
                .arg("--directory")
                .arg(&www)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        self.wait_listening(&self.pod, pid, "python3 http.server", (POD_ADDR, HTTP_PORT))?;
        Ok((
            digest,
            format!(
                "python3 http.server in POD on {POD_ADDR}:{HTTP_PORT} serving {FILE_NAME} ({} MiB, sha256 {}...)",
                self.file_len >> 20,
                hex_prefix(&digest)
            ),
        ))
    }

    fn wait_listening(
        &self,
        ns: &Netns,
        pid: u32,
        what: &'static str,
        addr: (Ipv4Addr, u16),
    ) -> Result<(), DemoError> {
        let deadline = Instant::now() + WAIT;
        loop {
            let up = ns.run_in(move || {
                TcpStream::connect_timeout(&SocketAddr::from(addr), Duration::from_millis(200))
                    .is_ok()
            })?;
            if up {
                return Ok(());
            }
            if let Some(status) = ns.try_wait(pid) {
                return Err(LabError::Exited {
                    what: what.to_owned(),
                    status,
                    log: String::new(),
                }
                .into());
            }
            if Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!("{what} to listen on {}:{}", addr.0, addr.1),
                    waited: WAIT,
                    log: String::new(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The IPv4 address on SHOOT's `tun0`, if any.
    fn shoot_tun_address(&self) -> Option<Ipv4Addr> {
        let out = Command::new("ip")
            .args([
                "-n",
                self.shoot.name(),
                "-4",
                "-o",
                "addr",
                "show",
                "dev",
                "tun0",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|cidr| cidr.split('/').next())
            .and_then(|a| a.parse().ok())
    }

    /// Stops the proxy and HTTP server (by PID) and deletes the namespaces; then checks that
    /// none of them is left.
    fn teardown(self) -> Result<String, DemoError> {
        let names = [
            self.seed.name().to_owned(),
            self.ingress.name().to_owned(),
            self.shoot.name().to_owned(),
            self.pod.name().to_owned(),
        ];
        drop(self);
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map_err(|source| LabError::Spawn {
                command: "ip netns list".into(),
                source,
            })?;
        let list = String::from_utf8_lossy(&out.stdout);
        let left: Vec<&String> = names
            .iter()
            .filter(|n| list.split_whitespace().any(|w| w == n.as_str()))
            .collect();
        if !left.is_empty() {
            return Err(DemoError::unexpected(
                "namespaces left behind",
                format!("{left:?}"),
            ));
        }
        Ok("every process stopped, 4 namespaces deleted, none left".into())
    }
}

/// Deterministic pseudo-random bytes (xorshift64) and their SHA-256.
fn generate_file(len: usize) -> (Vec<u8>, [u8; 32]) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    let mut h = Sha256::new();
    h.update(&data);
    (data, h.finish())
}

/// The issued PKI.
struct Material {
    ca: CaBundle,
    server: Identity,
    client: Identity,
    tls_auth: Key2,
}

fn issue_pki() -> Result<(Material, String), DemoError> {
    let now = i64::try_from(netio::clock::unix_now()).unwrap_or(i64::MAX);
    let validity = Validity::days_from(now, 1);
    let ca =
        Ca::create("vpn", KeySpec::EcdsaP256, validity).map_err(|source| DemoError::Issue {
            what: "the CA",
            source,
        })?;
    let leaf = |profile, cn: &str| IssueRequest {
        profile,
        common_name: cn.to_owned(),
        sans: Vec::new(),
        key: KeySpec::EcdsaP256,
        validity,
    };
    let server = ca
        .issue(&leaf(CertProfile::Server, SERVER_CN))
        .map_err(|source| DemoError::Issue {
            what: "the server certificate",
            source,
        })?;
    let client = ca
        .issue(&leaf(CertProfile::Client, CLIENT_CN))
        .map_err(|source| DemoError::Issue {
            what: "the client certificate",
            source,
        })?;
    let bundle =
        CaBundle::new(vec![ca.cert().to_owned()]).map_err(|e| DemoError::Tls(Box::new(e)))?;
    let tls_auth = static_key::generate(&mut rand_core::OsRng);
    Ok((
        Material {
            ca: bundle,
            server,
            client,
            tls_auth,
        },
        format!(
            "CA `vpn`, server `{SERVER_CN}`, client `{CLIENT_CN}` (ECDSA P-256), tls-auth key (SHA256)"
        ),
    ))
}

fn server_settings(m: &Material, status: PathBuf) -> Result<vpn_server::Settings, DemoError> {
    let policy = PeerPolicy::client_peer();
    let tls = control_channel_server(&m.server, &m.ca, &policy)
        .map_err(|e| DemoError::Tls(Box::new(e)))?;
    let mut s = vpn_server::Settings::new(
        tls,
        Arc::new(policy),
        ControlProtection::TlsAuth {
            key: m.tls_auth.clone(),
            direction: KeyDirection::Normal,
            digest: Digest::Sha256,
        },
    );
    let pod_net: IpNet = POD_NETWORK
        .parse()
        .map_err(|_| DemoError::unexpected("pod network", POD_NETWORK))?;
    s.listen = vec![SocketAddr::from(([0u16; 8], VPN_PORT))];
    s.auth = Digest::Sha256;
    s.keepalive = Some(Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    s.routes = vec![pod_net];
    s.clients.insert(
        CLIENT_CN.into(),
        vpn_server::ClientOptions {
            iroutes: vec![pod_net],
            ..vpn_server::ClientOptions::default()
        },
    );
    s.drain_timeout = Duration::from_secs(2);
    s.status = Some(vpn_server::StatusFile {
        path: status,
        interval: Duration::from_secs(1),
    });
    Ok(s)
}

fn client_settings(m: &Material) -> Result<vpn_client::Settings, DemoError> {
    let pem = |r: Result<Vec<u8>, pki::PemError>| r.map_err(|e| DemoError::Tls(Box::new(e)));
    let mut s = vpn_client::Settings::new(
        vec![Remote::new(SEED_ADDR.to_string(), VPN_PORT)],
        TlsMaterial::Pem {
            ca: pem(m.ca.to_pem())?,
            cert: pem(m.client.chain_pem())?,
            key: pem(m.client.key_pem())?,
            peer: PeerPolicy::server_peer(),
        },
        ControlProtection::TlsAuth {
            key: m.tls_auth.clone(),
            direction: KeyDirection::Inverse,
            digest: Digest::Sha256,
        },
    );
    s.auth = Digest::Sha256;
    let mut proxy = HttpProxy::new(PROXY_ADDR.to_string(), PROXY_PORT);
    proxy
        .options
        .custom_headers
        .push(netio::http::CustomHeader::NameValue {
            name: REVERSED_VPN_HEADER.0.into(),
            value: REVERSED_VPN_HEADER.1.into(),
        });
    s.http_proxy = Some(proxy);
    s.connect_retry = Duration::from_secs(1);
    s.connect_retry_max = Duration::from_secs(2);
    Ok(s)
}

/// The ingress router's runtime in INGRESS; stopped when dropped.
struct IngressRouter {
    rt: Option<tokio::runtime::Runtime>,
    token: CancellationToken,
    counters: Arc<vpn_router::Counters>,
}

impl Drop for IngressRouter {
    fn drop(&mut self) {
        self.token.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// Cancels a token when dropped (so an early return stops the server and client threads).
struct CancelOnDrop(CancellationToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The steps that need the lab: PKI, proxy, HTTP server, vpn-server, tunnel, ping, download.
/// The server and client threads are stopped and joined before this returns; the result says
/// whether both stopped cleanly (checked only when every step passed).
fn with_lab(rec: &mut Recorder<'_>, lab: &Lab) -> Result<(), DemoError> {
    let Some(material) = rec.step("pki", |_| issue_pki()) else {
        return Ok(());
    };
    let Some(router) = rec.step("proxy", |_| lab.start_router()) else {
        return Ok(());
    };
    let counters = Arc::clone(&router.counters);
    let Some(served) = rec.step("pod http server", |_| lab.start_http()) else {
        return Ok(());
    };
    let status_path = lab.dir.path().join("openvpn.status");
    let server_token = CancellationToken::new();
    let client_token = CancellationToken::new();
    std::thread::scope(|scope| {
        // Dropped (cancelled) before the scope joins the threads, also on an early return.
        let _stop_server = CancelOnDrop(server_token.clone());
        let _stop_client = CancelOnDrop(client_token.clone());

        let (ready_tx, ready_rx) = mpsc::channel::<String>();
        let token = server_token.clone();
        let settings = server_settings(&material, status_path.clone());
        let server_thread = scope.spawn(move || -> Result<(), DemoError> {
            let settings = settings?;
            lab.seed.run_in(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(DemoError::Runtime)?;
                rt.block_on(async move {
                    let server = vpn_server::Server::bind(settings)
                        .await
                        .map_err(DemoError::Server)?;
                    let _ = ready_tx.send(server.tun_name().unwrap_or_default().to_owned());
                    server.run(token).await.map_err(DemoError::Server)
                })
            })?
        });
        let mut server_thread = Some(server_thread);
        let started = rec.step("vpn-server", |_| match ready_rx.recv_timeout(WAIT) {
            Ok(tun) => Ok((
                (),
                format!(
                    "vpn_server::Server in SEED on [::]:{VPN_PORT}, {tun} {SERVER_TUN}/24, \
                     route {POD_NETWORK} via {tun}, iroute {POD_NETWORK} for {CLIENT_CN}"
                ),
            )),
            // The thread ended (bind failed): its error says why.
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(
                match server_thread
                    .take()
                    .map(std::thread::ScopedJoinHandle::join)
                {
                    Some(Ok(Err(e))) => e,
                    _ => DemoError::Panicked { what: "server" },
                },
            ),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(DemoError::unexpected(
                "vpn-server",
                "not listening within 15 s",
            )),
        });
        let (Some(()), Some(server_thread)) = (started, server_thread) else {
            return Ok(());
        };

        let client_started = Instant::now();
        let token = client_token.clone();
        let settings = client_settings(&material);
        let client_thread = scope.spawn(move || -> Result<Stopped, DemoError> {
            let settings = settings?;
            lab.shoot.run_in(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(DemoError::Runtime)?;
                rt.block_on(vpn_client::run(settings, token))
                    .map_err(DemoError::Client)
            })?
        });
        let up = rec.step("tunnel", |summary| {
            wait_tunnel(lab, &client_thread, client_started, &counters, summary)
        });
        let ok = up.is_some()
            && rec
                .step("ping", |summary| {
                    let p = ping(lab)?;
                    let line = format!(
                        "{} from SEED to {POD_ADDR}: {}/{} replies",
                        match p.method {
                            PingMethod::Icmp => format!("ping -c {PING_COUNT}"),
                            PingMethod::TcpConnect => format!("{PING_COUNT} TCP connects"),
                        },
                        p.received,
                        p.sent
                    );
                    let complete = p.received == p.sent;
                    summary.ping = Some(p);
                    if complete {
                        Ok(((), line))
                    } else {
                        Err(DemoError::unexpected("ping", line))
                    }
                })
                .is_some()
            && rec
                .step("download", |summary| {
                    let d = download(lab, served)?;
                    let ok = d.checksum_ok();
                    let line = format!(
                        "curl in SEED fetched {} through the tunnel: {} bytes, {:.1} MiB/s, sha256 {}",
                        d.url,
                        d.bytes,
                        d.mib_per_sec(),
                        if ok { "matches" } else { "DIFFERS" }
                    );
                    summary.download = Some(d);
                    if ok {
                        Ok(((), line))
                    } else {
                        Err(DemoError::unexpected("download", line))
                    }
                })
                .is_some()
            && rec
                .step("status file", |summary| read_status(&status_path, summary))
                .is_some();

        // Stop the client first (it removes its tun device), then the server (it drains).
        client_token.cancel();
        let client_result = client_thread.join();
        server_token.cancel();
        let server_result = server_thread.join();
        if !ok {
            // The failed step already says why; how the threads ended adds nothing.
            return Ok(());
        }
        match client_result {
            Ok(Ok(Stopped::Shutdown)) => Ok(()),
            Ok(Ok(stopped)) => Err(DemoError::ClientStopped { stopped }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(DemoError::Panicked { what: "client" }),
        }?;
        match server_result {
            Ok(r) => r,
            Err(_) => Err(DemoError::Panicked { what: "server" }),
        }
    })
}

/// Waits until SHOOT's tun device carries the pushed pool address, then checks that the
/// router opened the tunnel.
fn wait_tunnel(
    lab: &Lab,
    client: &std::thread::ScopedJoinHandle<'_, Result<Stopped, DemoError>>,
    started: Instant,
    counters: &vpn_router::Counters,
    summary: &mut Summary,
) -> Result<((), String), DemoError> {
    let deadline = started + WAIT;
    let address = loop {
        if let Some(a) = lab.shoot_tun_address() {
            break a;
        }
        if client.is_finished() {
            return Err(DemoError::unexpected(
                "tunnel",
                "the client stopped before the tunnel came up",
            ));
        }
        if Instant::now() > deadline {
            return Err(DemoError::unexpected(
                "tunnel",
                "SHOOT's tun0 got no address within 15 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let up = started.elapsed();
    summary.tunnel_up = Some(up);
    summary.pool_address = Some(address);
    let tunnels = counters.tunnels.load(std::sync::atomic::Ordering::Relaxed);
    if tunnels == 0 {
        return Err(DemoError::unexpected(
            "tunnel",
            "the tunnel is up but the router opened none",
        ));
    }
    let routed = format!(
        "CONNECT {SEED_ADDR}:{VPN_PORT} routed by {}: {} to {SEED_ADDR}:{VPN_PORT}",
        REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
    );
    let via = format!(" via the router ({tunnels} tunnel opened)");
    summary.proxy_connect = Some(routed);
    Ok((
        (),
        format!("{CLIENT_CN} up in {}{via}; pool address {address}", ms(up)),
    ))
}

/// Reads the server's status file (written once a second): the client's row must list the
/// pool address the client got; it gives the data cipher and the server's byte counters.
fn read_status(status_path: &Path, summary: &mut Summary) -> Result<((), String), DemoError> {
    let address = summary
        .pool_address
        .ok_or_else(|| DemoError::unexpected("status file", "no pool address to look for"))?;
    let deadline = Instant::now() + Duration::from_secs(3);
    let row = loop {
        let text = std::fs::read_to_string(status_path).unwrap_or_default();
        if let Some(row) = text
            .lines()
            .find(|l| l.starts_with(&format!("CLIENT_LIST,{CLIENT_CN},")))
        {
            break row.to_owned();
        }
        if Instant::now() > deadline {
            return Err(DemoError::unexpected(
                "status file",
                format!("no CLIENT_LIST row for {CLIENT_CN}:\n{text}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // CLIENT_LIST,cn,real,virtual,virtual6,rx,tx,since,since_t,user,client id,peer id,cipher
    let fields: Vec<&str> = row.split(',').collect();
    summary.cipher = fields.last().map(|c| (*c).to_owned());
    if fields.get(3) != Some(&address.to_string().as_str()) {
        return Err(DemoError::unexpected(
            "status file",
            format!("the server lists another address for {CLIENT_CN}: {row}"),
        ));
    }
    Ok((
        (),
        format!(
            "vpn-server lists {CLIENT_CN} at {address}, cipher {}, {} bytes from it, {} to it so far",
            summary.cipher.as_deref().unwrap_or("?"),
            fields.get(5).unwrap_or(&"?"),
            fields.get(6).unwrap_or(&"?"),
        ),
    ))
}

/// `ping -c 3` from SEED to the pod, or timed TCP connects when `ping` is missing.
fn ping(lab: &Lab) -> Result<Ping, DemoError> {
    if !lab.tools.ping {
        let mut rtts = Vec::new();
        for _ in 0..PING_COUNT {
            let rtt = lab.seed.run_in(|| {
                let t = Instant::now();
                TcpStream::connect_timeout(
                    &SocketAddr::from((POD_ADDR, HTTP_PORT)),
                    Duration::from_secs(2),
                )
                .ok()
                .map(|_| t.elapsed())
            })?;
            rtts.extend(rtt);
        }
        return Ok(Ping {
            method: PingMethod::TcpConnect,
            sent: PING_COUNT,
            received: u32::try_from(rtts.len()).unwrap_or(0),
            rtts,
        });
    }
    let out = lab
        .seed
        .command("ping")
        .args(["-n", "-c", &PING_COUNT.to_string(), "-i", "0.2", "-W", "2"])
        .arg(POD_ADDR.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            command: "ping".into(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts: Vec<Duration> = text
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| {
            let ms = l.split("time=").nth(1)?.split_whitespace().next()?;
            ms.parse::<f64>()
                .ok()
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        })
        .collect();
    Ok(Ping {
        method: PingMethod::Icmp,
        sent: PING_COUNT,
        received: u32::try_from(rtts.len()).unwrap_or(0),
        rtts,
    })
}

/// `curl` in SEED fetches the pod's file into the scratch directory; its SHA-256 is compared
/// with the served one.
fn download(lab: &Lab, served: [u8; 32]) -> Result<Download, DemoError> {
    let url = format!("http://{POD_ADDR}:{HTTP_PORT}/{FILE_NAME}");
    let dest = lab.dir.path().join("downloaded.bin");
    let out = lab
        .seed
        .command("curl")
        .args(["-sS", "--fail", "--max-time", "30", "-o"])
        .arg(&dest)
        .args(["-w", "%{size_download} %{time_total}", &url])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            command: "curl".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::CommandFailed {
            command: format!("curl {url}"),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let bytes = words.next().and_then(|w| w.parse::<u64>().ok());
    let secs = words.next().and_then(|w| w.parse::<f64>().ok());
    let (Some(bytes), Some(secs)) = (bytes, secs) else {
        return Err(DemoError::unexpected("curl's -w output", text.into_owned()));
    };
    let mut file = std::fs::File::open(&dest).map_err(|e| LabError::Io {
        path: dest.clone(),
        source: e,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| LabError::Io {
            path: dest.clone(),
            source: e,
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(Download {
        url,
        bytes,
        took: Duration::from_secs_f64(secs),
        served_sha256: served,
        received_sha256: h.finish(),
        expected_bytes: lab.file_len as u64,
    })
}
