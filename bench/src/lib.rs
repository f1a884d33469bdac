//! The benchmark against upstream OpenVPN: `cargo run --release -p bench --bin bench`, as root.
//!
//! For every [`Case`] (a [`Pair`] of implementations × a [`Cipher`] × direct or through a
//! [`ProxyKind`]) the benchmark starts the server on the seed and the client in the shoot (see
//! [`lab`] for the topology) and measures, in this order: time from client start to the first
//! ping answered through the tunnel, resident memory with the tunnel idle, ping RTT, the median
//! of small TCP request/response exchanges, then iperf3 from the seed into the shoot with 1 and
//! 4 streams in both directions, with the CPU seconds per GB and the highest resident memory of
//! each VPN process. Every case runs once per round; rounds repeat the whole matrix, so ratios
//! ours/upstream are taken between cases measured in the same round.
//!
//! The library part only measures and returns [`Sample`]s; [`report`] turns them into the
//! Markdown of `docs/performance.md`. Two more parts have sections of their own: the server's
//! memory with the CONNECT sidecar ([`memory`]) and a client's tunnel under a flood of silent
//! and bogus connections ([`flood`], [`flood_report`]); and the seed ingress at seed scale, our
//! router against squid ([`ingress`], [`ingress_report`]), and the same for TLS SNI passthrough,
//! our router against HAProxy ([`ingress::sni`]); and `vpn-router --kubernetes` with 500
//! shoots' objects ([`kube`]).
//!
//! The bench builds on `conformance`: the lab it re-exports (namespaces, the throwaway PKI,
//! tinyproxy), the demo's routing header and the flood of silent and bogus connections
//! (`conformance::flood`, also the load of the `preauth_*` tests). Nothing in `conformance`
//! depends on the bench.

pub mod flood;
pub mod flood_report;
pub mod ingress;
pub mod ingress_report;
pub mod kube;
pub mod lab;
pub mod measure;
pub mod memory;
pub mod report;
pub mod stats;
pub mod tunnels;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netio::report::chain;

use conformance::LabError;
use lab::{BenchLab, Side, VpnProcess, CLIENT_TUN_ADDR, ECHO_PORT, IPERF_PORT};

/// Which implementation runs a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Impl {
    /// Upstream `openvpn` 2.6.
    Upstream,
    /// Our `vpn-server` / `vpn-client`.
    Ours,
}

/// Server implementation × client implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pair {
    /// Who runs the server.
    pub server: Impl,
    /// Who runs the client.
    pub client: Impl,
}

impl Pair {
    /// The four pairs, upstream↔upstream first (the baseline of the ratios).
    pub const ALL: [Pair; 4] = [
        Pair::new(Impl::Upstream, Impl::Upstream),
        Pair::new(Impl::Ours, Impl::Ours),
        Pair::new(Impl::Ours, Impl::Upstream),
        Pair::new(Impl::Upstream, Impl::Ours),
    ];

    /// A pair.
    pub const fn new(server: Impl, client: Impl) -> Pair {
        Pair { server, client }
    }

    /// `upstream-upstream`, `ours-ours`, `ours-upstream` (server first), `upstream-ours`.
    pub fn name(self) -> &'static str {
        match (self.server, self.client) {
            (Impl::Upstream, Impl::Upstream) => "upstream-upstream",
            (Impl::Ours, Impl::Ours) => "ours-ours",
            (Impl::Ours, Impl::Upstream) => "ours-upstream",
            (Impl::Upstream, Impl::Ours) => "upstream-ours",
        }
    }

    /// The pair named `name` (as [`Pair::name`]).
    pub fn parse(name: &str) -> Option<Pair> {
        Pair::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The data-channel cipher both sides are configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cipher {
    /// `data-ciphers AES-256-GCM`.
    Gcm,
    /// `data-ciphers AES-256-CBC`, `auth SHA256`.
    CbcSha256,
}

impl Cipher {
    /// Both ciphers.
    pub const ALL: [Cipher; 2] = [Cipher::Gcm, Cipher::CbcSha256];

    /// `gcm` or `cbc`.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Gcm => "gcm",
            Cipher::CbcSha256 => "cbc",
        }
    }

    /// Display name.
    pub fn label(self) -> &'static str {
        match self {
            Cipher::Gcm => "AES-256-GCM",
            Cipher::CbcSha256 => "AES-256-CBC+SHA256",
        }
    }

    /// The config lines selecting it (identical on both sides).
    pub fn config_lines(self) -> Vec<String> {
        match self {
            Cipher::Gcm => vec!["data-ciphers AES-256-GCM".into()],
            Cipher::CbcSha256 => vec![
                "data-ciphers AES-256-CBC".into(),
                "cipher AES-256-CBC".into(),
                "auth SHA256".into(),
            ],
        }
    }

    /// The cipher named `name` (as [`Cipher::name`]).
    pub fn parse(name: &str) -> Option<Cipher> {
        Cipher::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The HTTP CONNECT proxy a client goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyKind {
    /// Debian's tinyproxy (the lab's default proxy).
    Tinyproxy,
    /// Debian's squid.
    Squid,
    /// Our ingress router (`vpn-router`), routing by the `Reversed-VPN` header.
    Router,
}

impl ProxyKind {
    /// `tinyproxy`, `squid`, `router`.
    pub fn name(self) -> &'static str {
        match self {
            ProxyKind::Tinyproxy => "tinyproxy",
            ProxyKind::Squid => "squid",
            ProxyKind::Router => "router",
        }
    }
}

/// How the client reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// TCP straight to the server.
    Direct,
    /// Through an HTTP CONNECT proxy on the seed.
    Proxy(ProxyKind),
}

impl Via {
    /// `direct` or the proxy's name.
    pub fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Proxy(p) => p.name(),
        }
    }

    /// The transport named `name` (as [`Via::name`]).
    pub fn parse(name: &str) -> Option<Via> {
        match name {
            "direct" => Some(Via::Direct),
            "tinyproxy" | "proxy" => Some(Via::Proxy(ProxyKind::Tinyproxy)),
            "squid" => Some(Via::Proxy(ProxyKind::Squid)),
            "router" => Some(Via::Proxy(ProxyKind::Router)),
            _ => None,
        }
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Case {
    /// Implementations.
    pub pair: Pair,
    /// Data cipher.
    pub cipher: Cipher,
    /// Direct or through a proxy.
    pub via: Via,
}

impl Case {
    /// The same cipher and transport with upstream on both sides (the ratio's baseline).
    pub fn baseline(self) -> Case {
        Case {
            pair: Pair::ALL[0],
            ..self
        }
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.pair.name(),
            self.cipher.name(),
            self.via.name()
        )
    }
}

/// The iperf3 loads: streams × direction.
pub const LOADS: [Load; 4] = [
    Load {
        streams: 1,
        reverse: false,
    },
    Load {
        streams: 1,
        reverse: true,
    },
    Load {
        streams: 4,
        reverse: false,
    },
    Load {
        streams: 4,
        reverse: true,
    },
];

/// One iperf3 load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Load {
    /// Parallel TCP streams.
    pub streams: u32,
    /// `false`: seed → shoot; `true`: shoot → seed (`iperf3 -R`).
    pub reverse: bool,
}

impl Load {
    /// E.g. `1×→` (seed to shoot) or `4×←`.
    pub fn label(self) -> String {
        format!("{}×{}", self.streams, if self.reverse { "←" } else { "→" })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The cases, in the order they run within a round.
    pub cases: Vec<Case>,
    /// Rounds over all cases.
    pub rounds: u32,
    /// Length of each iperf3 run.
    pub duration: Duration,
    /// The directory of our `vpn-server` and `vpn-client` binaries.
    pub ours: PathBuf,
    /// Echo requests for the RTT.
    pub pings: u32,
    /// Request/response exchanges.
    pub exchanges: usize,
    /// Where to keep `/proc/PID/smaps` of both VPN processes at the idle sample (and of the
    /// server at each sample of the memory part), if anywhere.
    pub smaps_dir: Option<PathBuf>,
    /// The memory part's loads: concurrent streams (tunnels) of each, run in this order.
    pub tunnels: Vec<usize>,
    /// Set (e.g. on SIGINT) to stop before the next case; the lab is then torn down as
    /// after a complete run.
    pub stop: Arc<AtomicBool>,
}

/// The measurements of one case in one round.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Client start to the first ping answered.
    pub up: Duration,
    /// Median ping RTT, ms.
    pub ping_ms: f64,
    /// Median request/response time, µs.
    pub rr_us: f64,
    /// Resident memory with the tunnel idle, KiB: server, client.
    pub idle_rss_kib: (u64, u64),
    /// One per entry of [`LOADS`].
    pub transfers: Vec<measure::Transfer>,
}

/// Why a case (or the bench) failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A lab step failed.
    #[error("lab")]
    Lab(#[from] LabError),
    /// A measurement gave something unexpected.
    #[error("{what}: {detail}")]
    Unexpected {
        /// What was measured.
        what: &'static str,
        /// What was seen.
        detail: String,
    },
    /// The case needs something that does not exist yet.
    #[error("not available: {what}")]
    Unsupported {
        /// What.
        what: &'static str,
    },
    /// [`Options::stop`] was set; the lab was torn down.
    #[error("stopped before the run was complete")]
    Stopped,
}

impl BenchError {
    pub(crate) fn unexpected(what: &'static str, detail: impl Into<String>) -> BenchError {
        BenchError::Unexpected {
            what,
            detail: detail.into(),
        }
    }
}

/// All samples, by case, in round order; failures as text.
#[derive(Debug, Default)]
pub struct Results {
    /// Per case, one entry per round (`Err` for a failed round).
    pub samples: Vec<(Case, Vec<Result<Sample, String>>)>,
}

impl Results {
    /// The entries of `case`.
    pub fn of(&self, case: Case) -> Option<&[Result<Sample, String>]> {
        self.samples
            .iter()
            .find(|(c, _)| *c == case)
            .map(|(_, s)| s.as_slice())
    }
}

/// Runs the matrix; `progress` gets one line per finished case.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Results, BenchError> {
    let lab = BenchLab::new()?;
    let mut results = Results {
        samples: opts.cases.iter().map(|c| (*c, Vec::new())).collect(),
    };
    for round in 0..opts.rounds {
        for (i, case) in opts.cases.iter().enumerate() {
            if opts.stop.load(Ordering::Relaxed) {
                return Err(BenchError::Stopped);
            }
            let started = Instant::now();
            let outcome = run_case(&lab, opts, *case).map_err(|e| chain(&e));
            let line = match &outcome {
                Ok(s) => format!(
                    "round {} {case}: up {:.0} ms, rtt {:.3} ms, rr {:.0} µs, {} ({:.0} s)",
                    round + 1,
                    s.up.as_secs_f64() * 1e3,
                    s.ping_ms,
                    s.rr_us,
                    s.transfers
                        .iter()
                        .zip(LOADS)
                        .map(|(t, l)| format!("{} {:.0} Mbit/s", l.label(), t.mbit_s))
                        .collect::<Vec<_>>()
                        .join(", "),
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => format!("round {} {case}: FAILED: {e}", round + 1),
            };
            progress(&line);
            if let Some((_, v)) = results.samples.get_mut(i) {
                v.push(outcome);
            }
        }
    }
    Ok(results)
}

/// One case: both VPN processes from scratch, every measurement, both processes stopped.
fn run_case(lab: &BenchLab, opts: &Options, case: Case) -> Result<Sample, BenchError> {
    let proxy = match case.via {
        Via::Direct => None,
        Via::Proxy(kind) => Some(lab.start_proxy(kind, &opts.ours)?),
    };
    let result = measure_case(lab, opts, case, proxy);
    if let Some((_, pid)) = proxy {
        lab.seed.stop(pid);
    }
    result
}

fn measure_case(
    lab: &BenchLab,
    opts: &Options,
    case: Case,
    proxy: Option<(u16, u32)>,
) -> Result<Sample, BenchError> {
    let proxy_port = proxy.map(|(port, _)| port);
    let server = VpnProcess::start(
        &lab.seed,
        case.pair.server,
        Side::Server,
        &lab.server_config(case.cipher),
        &opts.ours,
    )?;
    server.wait_listening()?;
    let iperf_pid = lab.shoot.spawn(
        lab.shoot
            .command("iperf3")
            .args(["-s", "-p", &IPERF_PORT.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )?;
    let echo = measure::EchoServer::start(&lab.shoot, ECHO_PORT)?;
    let result = (|| {
        measure::wait_port(&lab.shoot, IPERF_PORT, Duration::from_secs(5))?;
        let start = Instant::now();
        let client = VpnProcess::start(
            &lab.shoot,
            case.pair.client,
            Side::Client,
            &lab.client_config(case.cipher, proxy_port),
            &opts.ours,
        )?;
        let up = measure::first_ping(&lab.seed, CLIENT_TUN_ADDR, start, Duration::from_secs(20))
            .map_err(|e| {
                BenchError::unexpected(
                    "tunnel up",
                    format!(
                        "{}\n--- server log ---\n{}\n--- client log ---\n{}",
                        chain(&e),
                        tail(&server.log()),
                        tail(&client.log())
                    ),
                )
            })?;
        let addrs = measure::addresses(&lab.shoot)?;
        if !addrs.contains(&format!("{CLIENT_TUN_ADDR}/")) {
            return Err(BenchError::unexpected("client tunnel address", addrs));
        }
        // Let the handshake's allocations settle before reading the idle footprint.
        std::thread::sleep(Duration::from_millis(500));
        let idle_rss_kib = (
            measure::rss_kib(server.pid())?,
            measure::rss_kib(client.pid())?,
        );
        if let Some(dir) = &opts.smaps_dir {
            measure::keep_smaps(
                dir,
                &case,
                &[("server", server.pid()), ("client", client.pid())],
            );
        }
        let ping_ms = measure::ping_rtt_ms(&lab.seed, CLIENT_TUN_ADDR, opts.pings)?;
        let rr_us =
            measure::request_response_us(&lab.seed, CLIENT_TUN_ADDR, ECHO_PORT, opts.exchanges)?;
        let mut transfers = Vec::new();
        for load in LOADS {
            if !server.running() || !client.running() {
                return Err(BenchError::unexpected(
                    "VPN processes",
                    format!(
                        "one exited\n--- server ---\n{}\n--- client ---\n{}",
                        tail(&server.log()),
                        tail(&client.log())
                    ),
                ));
            }
            let once = || {
                measure::iperf(
                    &lab.seed,
                    (CLIENT_TUN_ADDR, IPERF_PORT).into(),
                    load,
                    opts.duration,
                    measure::Pids {
                        server: server.pid(),
                        client: client.pid(),
                        proxy: proxy.map(|(_, pid)| pid),
                    },
                )
            };
            // iperf3 sometimes loses its control connection at the start of a run (seen once
            // with upstream through tinyproxy); one retry, then the case fails.
            transfers.push(match once() {
                Ok(t) => t,
                Err(_) => once()?,
            });
        }
        drop(client);
        Ok(Sample {
            up,
            ping_ms,
            rr_us,
            idle_rss_kib,
            transfers,
        })
    })();
    drop(echo);
    lab.shoot.stop(iperf_pid);
    drop(server);
    result
}

/// The last lines of a log, for error messages.
pub(crate) fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
