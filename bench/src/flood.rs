//! The flood part (issue 19, "lock-out before authentication"): how long a legitimate
//! client's tunnel takes to come up while [`FLOOD_IDLE`] silent and [`FLOOD_BOGUS`] bogus
//! connections are held open against the server (or against the CONNECT proxy in front of
//! it), against the time it takes unloaded, for our server and upstream's in the same run.
//!
//! ```text
//!  SHOOT                                                SEED
//!   flood (one runtime): FLOOD_IDLE silent slots ─┐
//!                        FLOOD_BOGUS bogus slots ─┼──► [vpn-router | tinyproxy] ──► VPN server
//!   VPN client (legitimate) ──────────────────────┘
//!   `ping` from the seed to the client's tunnel address: the tunnel is up
//! ```
//!
//! Each [`Target`] runs twice per round, each time with every process started afresh: once
//! without the flood (**unloaded**: the client starts 2 s after the server, `WARMUP`), once with
//! it (**flooded**): the flood starts, every slot has connected once and one more second
//! passed, then the client starts; the time from the
//! client's start to the first echo reply through the tunnel is measured, bounded by
//! [`FLOODED_LIMIT`] (a client that is not up by then counts as locked out).
//!
//! The flood is [`conformance::flood::Flood`] (its module docs say what the silent and the
//! bogus slots send), shared with the `preauth_*` tests. It holds its population: a slot whose
//! connection the server (or proxy) closed connects again at once, all slots together at most
//! [`FLOOD_RATE`] connects a second, so the load is bounded in rate, in count ([`FLOOD_IDLE`] +
//! [`FLOOD_BOGUS`] sockets at most) and in time (it stops when the client is up or
//! [`FLOODED_LIMIT`] passed).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use conformance::flood::{Flood, FloodCounts, FloodPath};
use conformance::netns::Netns;
use conformance::LabError;
use netio::report::chain;

use crate::lab::{
    BenchLab, Side, VpnProcess, CLIENT_TUN_ADDR, REVERSED_VPN_HEADER, SEED_ADDR, VPN_PORT,
};
use crate::{measure, tail, BenchError, Cipher, Impl, Options, ProxyKind};

/// Silent connections the flood holds.
pub const FLOOD_IDLE: usize = 1000;
/// Bogus connections the flood holds (each connected again once closed).
pub const FLOOD_BOGUS: usize = 1000;
/// Connects a second the whole flood makes at most (first connects and reconnects).
pub const FLOOD_RATE: u32 = 2000;
/// How long the legitimate client gets under the flood.
pub const FLOODED_LIMIT: Duration = Duration::from_secs(30);
/// How long it gets without the flood.
pub const UNLOADED_LIMIT: Duration = Duration::from_secs(20);
/// Without the flood, between the server's (and proxy's) start and the client's: about what
/// the flood's first pass and [`SETTLE`](conformance::flood::SETTLE) take, so both clients meet a server of the same age
/// (a process's first connections are slower: lazy set-up, cold caches).
const WARMUP: Duration = Duration::from_secs(2);
/// tinyproxy's `MaxClients` in front of upstream: upstream's default `max-clients`, and the
/// pending bound of our router.
pub const TINYPROXY_MAX_CLIENTS: usize = 1024;
/// tinyproxy's port on the seed in this part.
const TINYPROXY_PORT: u16 = 8889;
/// The `connect-retry` of both clients (vpn2's: 1 s, at most 5 s).
const CONNECT_RETRY: &str = "connect-retry 1 5";

/// The setups measured, each with its own client (ours with ours, upstream with upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Our `vpn-server`, the flood and our client straight at it.
    Ours,
    /// Upstream's `openvpn` server, the flood and upstream's client straight at it.
    Upstream,
    /// Our `vpn-router` in front of our server: the flood and our client at the router.
    OursRouter,
    /// tinyproxy in front of upstream's server: the flood and upstream's client at tinyproxy.
    UpstreamTinyproxy,
}

impl Target {
    /// Every target, in the order they run within a round.
    pub const ALL: [Target; 4] = [
        Target::Ours,
        Target::Upstream,
        Target::OursRouter,
        Target::UpstreamTinyproxy,
    ];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Ours => "ours",
            Target::Upstream => "upstream",
            Target::OursRouter => "ours+router",
            Target::UpstreamTinyproxy => "upstream+tinyproxy",
        }
    }

    /// Who runs the server and the client.
    pub fn imp(self) -> Impl {
        match self {
            Target::Ours | Target::OursRouter => Impl::Ours,
            Target::Upstream | Target::UpstreamTinyproxy => Impl::Upstream,
        }
    }

    /// The CONNECT proxy in front of the server, if any.
    pub fn proxy(self) -> Option<ProxyKind> {
        match self {
            Target::Ours | Target::Upstream => None,
            Target::OursRouter => Some(ProxyKind::Router),
            Target::UpstreamTinyproxy => Some(ProxyKind::Tinyproxy),
        }
    }
}

/// One target in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct FloodSample {
    /// Client start to the first echo reply, no flood.
    pub unloaded: Duration,
    /// The same under the flood; `None`: not within [`FLOODED_LIMIT`].
    pub flooded: Option<Duration>,
    /// The flood when the client started.
    pub at_start: FloodCounts,
    /// The flood when the client was up (or the limit passed).
    pub at_end: FloodCounts,
    /// From the client's start to `at_end`.
    pub window: Duration,
    /// The server process's `VmRSS` under the flood, when the client started, KiB.
    pub server_rss_kib: u64,
}

/// All samples by target, in round order; failures as text.
#[derive(Debug, Default)]
pub struct FloodResults {
    /// Per target, one entry per round (`Err` for a failed round).
    pub samples: Vec<(Target, Vec<Result<FloodSample, String>>)>,
}

impl FloodResults {
    /// The entries of `target`.
    pub fn of(&self, target: Target) -> Option<&[Result<FloodSample, String>]> {
        self.samples
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, v)| v.as_slice())
    }
}

/// Runs every target once per round; `progress` gets a line per target.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<FloodResults, BenchError> {
    crate::memory::raise_nofile_limit();
    let lab = BenchLab::new()?;
    let mut results = FloodResults {
        samples: Target::ALL.iter().map(|t| (*t, Vec::new())).collect(),
    };
    for round in 0..opts.rounds {
        for (i, target) in Target::ALL.into_iter().enumerate() {
            if opts.stop.load(Ordering::Relaxed) {
                return Err(BenchError::Stopped);
            }
            let started = Instant::now();
            let outcome = measure_target(&lab, opts, target).map_err(|e| chain(&e));
            let line = match &outcome {
                Ok(s) => format!(
                    "round {} flood {}: unloaded {:.0} ms, flooded {}; flood at the client's \
                     start: {} silent open, {} connects, server {:.1} MiB; bogus closed after {} ms \
                     (median) ({:.0} s)",
                    round + 1,
                    target.name(),
                    s.unloaded.as_secs_f64() * 1e3,
                    s.flooded.map_or_else(
                        || format!("> {} s", FLOODED_LIMIT.as_secs()),
                        |d| format!("{:.0} ms", d.as_secs_f64() * 1e3)
                    ),
                    s.at_start.idle_open,
                    s.at_start.connects,
                    s.server_rss_kib as f64 / 1024.0,
                    s.at_end
                        .bogus_close_ms
                        .map_or_else(|| "–".to_owned(), |m| format!("{m:.1}")),
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => format!("round {} flood {}: FAILED: {e}", round + 1, target.name()),
            };
            progress(&line);
            if let Some((_, v)) = results.samples.get_mut(i) {
                v.push(outcome);
            }
        }
    }
    Ok(results)
}

/// The processes of one measurement: the proxy (if any) and the server, stopped on drop.
struct Seed<'l> {
    lab: &'l BenchLab,
    server: VpnProcess<'l>,
    proxy: Option<u32>,
    /// The client's (and the flood's) way in.
    entry: FloodPath,
    proxy_port: Option<u16>,
}

impl Drop for Seed<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.proxy {
            self.lab.seed.stop(pid);
        }
    }
}

fn start_seed<'l>(
    lab: &'l BenchLab,
    opts: &Options,
    target: Target,
) -> Result<Seed<'l>, BenchError> {
    let server = VpnProcess::start(
        &lab.seed,
        target.imp(),
        Side::Server,
        &lab.server_config(Cipher::Gcm),
        &opts.ours,
    )?;
    server.wait_listening()?;
    let (proxy, port) = match target.proxy() {
        None => (None, None),
        Some(ProxyKind::Tinyproxy) => {
            let pid = start_tinyproxy(&lab.seed, lab.dir.path())?;
            (Some(pid), Some(TINYPROXY_PORT))
        }
        Some(kind) => {
            let (port, pid) = lab.start_proxy(kind, &opts.ours)?;
            (Some(pid), Some(port))
        }
    };
    let entry = match port {
        None => FloodPath::Direct(SocketAddr::from((SEED_ADDR, VPN_PORT))),
        Some(p) => FloodPath::Proxy {
            proxy: SocketAddr::from((SEED_ADDR, p)),
            server: SocketAddr::from((SEED_ADDR, VPN_PORT)),
            header: REVERSED_VPN_HEADER,
        },
    };
    Ok(Seed {
        lab,
        server,
        proxy,
        entry,
        proxy_port: port,
    })
}

/// Starts the legitimate client and waits for the first echo reply through its tunnel, at
/// most `limit`; `None` if none came.
fn client_up(
    lab: &BenchLab,
    opts: &Options,
    target: Target,
    seed: &Seed<'_>,
    limit: Duration,
) -> Result<(Option<Duration>, String), BenchError> {
    let config = lab.client_config(Cipher::Gcm, seed.proxy_port) + CONNECT_RETRY + "\n";
    let start = Instant::now();
    let client = VpnProcess::start(&lab.shoot, target.imp(), Side::Client, &config, &opts.ours)?;
    let up = measure::first_ping(&lab.seed, CLIENT_TUN_ADDR, start, limit).ok();
    let log = client.log();
    drop(client);
    Ok((up, log))
}

fn measure_target(
    lab: &BenchLab,
    opts: &Options,
    target: Target,
) -> Result<FloodSample, BenchError> {
    // Unloaded.
    let unloaded = {
        let seed = start_seed(lab, opts, target)?;
        std::thread::sleep(WARMUP);
        let (up, log) = client_up(lab, opts, target, &seed, UNLOADED_LIMIT)?;
        up.ok_or_else(|| {
            BenchError::unexpected(
                "tunnel up without the flood",
                format!(
                    "--- server log ---\n{}\n--- client log ---\n{}",
                    tail(&seed.server.log()),
                    tail(&log)
                ),
            )
        })?
    };
    // Flooded.
    let seed = start_seed(lab, opts, target)?;
    let flood = Flood::start(
        &lab.shoot,
        seed.entry.clone(),
        FLOOD_IDLE,
        FLOOD_BOGUS,
        FLOOD_RATE,
    )?;
    let at_start = flood.wait_populated(FLOOD_IDLE + FLOOD_BOGUS);
    if !seed.server.running() {
        return Err(BenchError::unexpected(
            "server under the flood",
            format!("exited\n{}", tail(&seed.server.log())),
        ));
    }
    let server_rss_kib = measure::rss_kib(seed.server.pid())?;
    let started = Instant::now();
    let (flooded, _log) = client_up(lab, opts, target, &seed, FLOODED_LIMIT)?;
    let window = started.elapsed();
    let at_end = flood.counts();
    drop(flood);
    drop(seed);
    Ok(FloodSample {
        unloaded,
        flooded,
        at_start,
        at_end,
        window,
        server_rss_kib,
    })
}

/// Starts Debian's tinyproxy on the seed in front of the VPN port, `MaxClients`
/// [`TINYPROXY_MAX_CLIENTS`] (upstream's default `max-clients`), its default idle `Timeout`
/// (600 s), and waits until it listens (without a probe connection: the log says so).
fn start_tinyproxy(ns: &Netns, dir: &Path) -> Result<u32, BenchError> {
    let td = dir.join("tinyproxy-flood");
    std::fs::create_dir_all(&td).map_err(|source| LabError::io(&td, source))?;
    let _ = std::process::Command::new("chmod")
        .arg("0777")
        .arg(&td)
        .status();
    let _ = std::fs::remove_file(td.join("tinyproxy.log"));
    let pid = conformance::tinyproxy::start_sized(
        ns,
        &td,
        SEED_ADDR,
        TINYPROXY_PORT,
        "10.250.0.0/24",
        VPN_PORT,
        TINYPROXY_MAX_CLIENTS,
    )?;
    Ok(pid)
}
