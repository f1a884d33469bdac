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
//! The flood holds its population: a slot whose connection the server (or proxy) closed
//! connects again at once, all slots together at most [`FLOOD_RATE`] connects a second, so the
//! load is bounded in rate, in count ([`FLOOD_IDLE`] + [`FLOOD_BOGUS`] sockets at most) and in
//! time (it stops when the client is up or [`FLOODED_LIMIT`] passed).
//!
//! * Silent slot: connects and sends nothing. Through a proxy every second one sends a valid
//!   CONNECT (with the routing header) first, so the server behind holds a silent connection
//!   too.
//! * Bogus slot, direct: one frame, in turn [`BogusFrame::BadHmacReset`] (a hard reset whose
//!   tls-auth HMAC is random), [`BogusFrame::RandomFrame`], [`BogusFrame::BadLength`]; then
//!   waits for the close. Through a proxy every second one sends a head of random bytes
//!   instead of a CONNECT, the others a valid CONNECT and then the bogus frame.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netio::report::chain;
use rand_core::{OsRng, RngCore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use vpn_client::CancellationToken;

use crate::netns::Netns;
use crate::LabError;

use super::lab::{
    BenchLab, Side, VpnProcess, CLIENT_TUN_ADDR, REVERSED_VPN_HEADER, SEED_ADDR, VPN_PORT,
};
use super::{measure, tail, BenchError, Cipher, Impl, Options, ProxyKind};

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
/// Bound on the flood's first pass (every slot connected once).
pub const POPULATE_LIMIT: Duration = Duration::from_secs(15);
/// After the first pass, before the client starts.
const SETTLE: Duration = Duration::from_secs(1);
/// Without the flood, between the server's (and proxy's) start and the client's: about what
/// the flood's first pass and [`SETTLE`] take, so both clients meet a server of the same age
/// (a process's first connections are slower: lazy set-up, cold caches).
const WARMUP: Duration = Duration::from_secs(2);
/// Bound on one connect, and on a proxy's answer to a CONNECT.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// A slot whose connect failed waits this long before the next.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The rate limiter's tick.
const TICK: Duration = Duration::from_millis(10);
/// Close latencies of bogus connections kept for the median (the first ones).
const LATENCIES_KEPT: usize = 100_000;
/// tinyproxy's `MaxClients` in front of upstream: upstream's default `max-clients`, and the
/// pending bound of our router.
pub const TINYPROXY_MAX_CLIENTS: usize = 1024;
/// tinyproxy's port on the seed in this part.
const TINYPROXY_PORT: u16 = 8889;
/// The `connect-retry` of both clients (vpn2's: 1 s, at most 5 s).
const CONNECT_RETRY: &str = "connect-retry 1 5";

/// What a flood's bogus connection sends (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BogusFrame {
    /// A framed `P_CONTROL_HARD_RESET_CLIENT_V2` laid out for tls-auth with a random session
    /// id and a random HMAC of `hmac_len` bytes.
    BadHmacReset {
        /// The HMAC's length (SHA1 20, SHA256 32).
        hmac_len: usize,
    },
    /// A whole frame (correct length prefix) of 14 to 200 random bytes.
    RandomFrame,
    /// A length prefix no packet has (0, or above what any MTU allows), then random bytes.
    BadLength,
}

impl BogusFrame {
    /// The bytes to send, with their length prefix.
    pub fn bytes(self) -> Vec<u8> {
        let mut rng = OsRng;
        let mut body = Vec::new();
        match self {
            BogusFrame::BadHmacReset { hmac_len } => {
                // opcode 7, key id 0 | session id | HMAC | packet id 1 | time | no ACKs | msg 0
                body.push(0x38);
                let mut random = vec![0u8; 8 + hmac_len];
                rng.fill_bytes(&mut random);
                body.extend_from_slice(&random);
                body.extend_from_slice(&1u32.to_be_bytes());
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                body.extend_from_slice(&u32::try_from(now).unwrap_or(0).to_be_bytes());
                body.push(0);
                body.extend_from_slice(&0u32.to_be_bytes());
            }
            BogusFrame::RandomFrame => {
                let len = 14 + (rng.next_u32() % 187) as usize;
                body.resize(len, 0);
                rng.fill_bytes(&mut body);
            }
            BogusFrame::BadLength => {
                let prefix: u16 = if rng.next_u32() % 2 == 0 { 0 } else { 0xfff0 };
                let mut out = prefix.to_be_bytes().to_vec();
                let mut random = [0u8; 32];
                rng.fill_bytes(&mut random);
                out.extend_from_slice(&random);
                return out;
            }
        }
        let mut out = u16::try_from(body.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes()
            .to_vec();
        out.extend_from_slice(&body);
        out
    }
}

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

/// Where the flood connects.
#[derive(Debug, Clone)]
pub enum FloodPath {
    /// Straight to the VPN server.
    Direct(SocketAddr),
    /// To a CONNECT proxy, which is asked for the VPN server.
    Proxy(SocketAddr),
}

impl FloodPath {
    fn addr(&self) -> SocketAddr {
        match self {
            FloodPath::Direct(a) | FloodPath::Proxy(a) => *a,
        }
    }
}

/// The flood's counters.
#[derive(Debug, Default)]
struct FloodStats {
    connects: AtomicU64,
    connect_failed: AtomicU64,
    idle_open: AtomicU64,
    idle_closed: AtomicU64,
    bogus_sent: AtomicU64,
    bogus_closed: AtomicU64,
    /// Milliseconds from a bogus connection's last byte to the peer's close.
    bogus_close_ms: Mutex<Vec<f64>>,
}

/// The flood's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FloodCounts {
    /// Connections opened so far.
    pub connects: u64,
    /// Connects that failed or timed out.
    pub connect_failed: u64,
    /// Silent connections open now.
    pub idle_open: u64,
    /// Silent connections the other side closed.
    pub idle_closed: u64,
    /// Bogus connections that sent their bytes.
    pub bogus_sent: u64,
    /// Bogus connections the other side closed.
    pub bogus_closed: u64,
    /// The median time from a bogus connection's bytes to its close, ms.
    pub bogus_close_ms: Option<f64>,
}

impl FloodStats {
    fn counts(&self) -> FloodCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut ms = self
            .bogus_close_ms
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        FloodCounts {
            connects: get(&self.connects),
            connect_failed: get(&self.connect_failed),
            idle_open: get(&self.idle_open),
            idle_closed: get(&self.idle_closed),
            bogus_sent: get(&self.bogus_sent),
            bogus_closed: get(&self.bogus_closed),
            bogus_close_ms: (!ms.is_empty()).then(|| super::stats::median(&mut ms)),
        }
    }
}

/// A running flood in a namespace; stopped (every socket closed) when dropped.
#[derive(Debug)]
pub struct Flood {
    rt: Option<Runtime>,
    stop: CancellationToken,
    stats: Arc<FloodStats>,
    started: Instant,
}

impl Flood {
    /// Starts `idle` silent and `bogus` bogus slots from `ns` along `path`, at most `rate`
    /// connects a second.
    pub fn start(
        ns: &Netns,
        path: FloodPath,
        idle: usize,
        bogus: usize,
        rate: u32,
    ) -> Result<Flood, BenchError> {
        let rt = ns
            .run_in(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
            })?
            .map_err(|source| LabError::io("tokio runtime", source))?;
        let stop = CancellationToken::new();
        let stats = Arc::new(FloodStats::default());
        let bucket = Arc::new(tokio::sync::Semaphore::new(0));
        // The rate limit: `rate` permits a second, in ticks, never more than a tick's worth
        // waiting.
        let per_tick = ((u64::from(rate) * TICK.as_millis() as u64) / 1000).max(1) as usize;
        {
            let bucket = Arc::clone(&bucket);
            let stop = stop.clone();
            rt.spawn(async move {
                let mut tick = tokio::time::interval(TICK);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let room = per_tick.saturating_sub(bucket.available_permits());
                    bucket.add_permits(room);
                }
            });
        }
        let path = Arc::new(path);
        for i in 0..idle + bogus {
            let slot = Slot {
                index: i,
                path: Arc::clone(&path),
                stats: Arc::clone(&stats),
                bucket: Arc::clone(&bucket),
                stop: stop.clone(),
            };
            if i < idle {
                rt.spawn(slot.silent());
            } else {
                rt.spawn(slot.bogus());
            }
        }
        Ok(Flood {
            rt: Some(rt),
            stop,
            stats,
            started: Instant::now(),
        })
    }

    /// The counters now.
    pub fn counts(&self) -> FloodCounts {
        self.stats.counts()
    }

    /// Waits until `slots` connects were made (every slot connected once), then [`SETTLE`];
    /// at most [`POPULATE_LIMIT`] in all.
    pub fn wait_populated(&self, slots: usize) -> FloodCounts {
        let deadline = self.started + POPULATE_LIMIT;
        while self.counts().connects < slots as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(SETTLE);
        self.counts()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// One slot of the flood.
struct Slot {
    index: usize,
    path: Arc<FloodPath>,
    stats: Arc<FloodStats>,
    bucket: Arc<tokio::sync::Semaphore>,
    stop: CancellationToken,
}

impl Slot {
    /// A connection (rate-limited), or `None` once stopped.
    async fn connect(&self) -> Option<TcpStream> {
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return None,
                permit = self.bucket.acquire() => permit.ok()?.forget(),
            }
            let addr = self.path.addr();
            match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    return Some(s);
                }
                _ => {
                    self.stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        () = self.stop.cancelled() => return None,
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// Connects and stays silent until closed, again and again.
    async fn silent(self) {
        while let Some(mut s) = self.connect().await {
            let through = matches!(*self.path, FloodPath::Proxy(_)) && self.index % 2 == 1;
            if through && !proxy_connect(&mut s).await {
                continue;
            }
            self.stats.idle_open.fetch_add(1, Ordering::Relaxed);
            let closed = wait_closed(&mut s, &self.stop).await;
            self.stats.idle_open.fetch_sub(1, Ordering::Relaxed);
            if closed {
                self.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Connects, sends something bogus and waits for the close, again and again.
    async fn bogus(self) {
        let mut turn = self.index;
        while let Some(mut s) = self.connect().await {
            turn += 1;
            let frame = match turn % 3 {
                0 => BogusFrame::BadHmacReset { hmac_len: 20 },
                1 => BogusFrame::RandomFrame,
                _ => BogusFrame::BadLength,
            };
            let bytes = match *self.path {
                FloodPath::Direct(_) => frame.bytes(),
                FloodPath::Proxy(_) if self.index % 2 == 0 => {
                    // A "head" of random bytes that ends like one.
                    let mut head = vec![0u8; 64];
                    OsRng.fill_bytes(&mut head);
                    head.extend_from_slice(b"\r\n\r\n");
                    head
                }
                FloodPath::Proxy(_) => {
                    if !proxy_connect(&mut s).await {
                        continue;
                    }
                    BogusFrame::BadHmacReset { hmac_len: 20 }.bytes()
                }
            };
            if s.write_all(&bytes).await.is_err() {
                continue;
            }
            self.stats.bogus_sent.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            if wait_closed(&mut s, &self.stop).await {
                self.stats.bogus_closed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut v) = self.stats.bogus_close_ms.lock() {
                    if v.len() < LATENCIES_KEPT {
                        v.push(sent.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
        }
    }
}

/// Sends a CONNECT for the VPN server with the routing header and reads the answer's head;
/// whether it was 200.
async fn proxy_connect(s: &mut TcpStream) -> bool {
    let head = format!(
        "CONNECT {SEED_ADDR}:{VPN_PORT} HTTP/1.1\r\nHost: {SEED_ADDR}:{VPN_PORT}\r\n{}: {}\r\n\r\n",
        REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
    );
    let answer = async {
        s.write_all(head.as_bytes()).await.ok()?;
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 8192 {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Some(got.starts_with(b"HTTP/1.1 200") || got.starts_with(b"HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(STEP_TIMEOUT, answer).await,
        Ok(Some(true))
    )
}

/// Reads (and drops) until the peer closes (`true`) or the flood stops (`false`).
async fn wait_closed(s: &mut TcpStream, stop: &CancellationToken) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            () = stop.cancelled() => return false,
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            },
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
    super::memory::raise_nofile_limit();
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
        Some(p) => FloodPath::Proxy(SocketAddr::from((SEED_ADDR, p))),
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
    let pid = crate::tinyproxy::start_sized(
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
