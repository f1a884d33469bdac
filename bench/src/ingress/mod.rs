//! The ingress part (issue 21): the seed's shared ingress at seed scale, our `vpn-router`
//! against Debian's squid for CONNECT, with equivalent routing for [`SHOOTS`] shoots.
//!
//! ```text
//!  SHOOT (load generator)                        SEED
//!   tunnels: CONNECT + one echoed byte ──────► [vpn-router | squid] :8443 ──► echo :20000+i
//! ```
//!
//! Routing is the same work for both: shoot *i* is reached through its own route to its own
//! upstream (an echo listener on port `20000 + i`). The router routes by the
//! `X-Gardener-Destination` value of shoot *i* among [`SHOOTS`] exact routes; squid by the
//! CONNECT target `s<i>.shoots.bench:<port>`, allowed by a `dstdomain` list of [`SHOOTS`]
//! names and resolved from its `hosts_file`.
//!
//! A tunnel is *ready* when the proxy answered 200 and one byte sent through it came back from
//! the upstream; its **time to the first byte** runs from the start of the TCP connect until
//! that byte is back. Per proxy, started afresh each round:
//!
//! 1. **Idle tunnels**: [`IDLE_TUNNELS`] ready tunnels held open at once (opened
//!    [`OPEN_CONCURRENCY`] at a time); the proxy's resident memory before and while they are
//!    held, per tunnel, and its descriptors.
//! 2. **New connections**: for each rate of [`RATES`] in turn, new tunnels at that rate for
//!    [`STEP`] (each closed with a reset once ready); p50 and p99 of the time to the first byte
//!    (a tunnel that failed or took longer than [`TUNNEL_TIMEOUT`] counts as that long), and
//!    the proxy's CPU time per tunnel. The sweep ends after the first rate whose p99 is over
//!    [`P99_GOAL`] or with a failure; the figure is the highest rate under it.
//! 3. **Reconnect storm**: [`STORM`] tunnels opened at the same moment; the time until all are
//!    ready.
//!
//! Bounded: at most [`IDLE_TUNNELS`] sockets held, at most `rate × STEP` tunnels per step,
//! every wait bounded by [`TUNNEL_TIMEOUT`].
//!
//! The SNI part is the same measurement for TLS SNI passthrough ([`Proxy::SNI`]): [`sni`]
//! starts our router's `kind = "sni"` listener and HAProxy, and builds the ClientHello a
//! tunnel opens with.

pub mod sni;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use netio::report::chain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;

use conformance::netns::Netns;
use conformance::LabError;

use crate::lab::{BenchLab, SEED_ADDR, SHOOT_ADDR};
use crate::measure::{cpu_seconds, rss_kib};
use crate::memory::fd_count;
use crate::{BenchError, Options};

/// Shoots routed (routes in the router, names in squid's list).
pub const SHOOTS: usize = 1000;
/// Idle tunnels held at once, at most: the issue's figure. Fewer when the open-file limit
/// would not let the proxy hold them ([`idle_tunnels`]).
pub const IDLE_TUNNELS: usize = 10_000;
/// Descriptors an idle tunnel takes, both in the proxy (two sockets; our router lends its
/// splice pipes only while bytes move, so an idle tunnel holds none) and in this process (the
/// load generator's socket and the upstream's).
pub const FDS_PER_TUNNEL: u64 = 2;
/// Descriptors left for everything else in a process (listeners, logs, the upstreams'
/// listeners in the bench).
const FD_RESERVE: u64 = 2000;
/// Rates of new tunnels tried, per second, in this order.
pub const RATES: [u32; 6] = [250, 500, 1000, 2000, 4000, 8000];
/// How long each rate runs.
pub const STEP: Duration = Duration::from_secs(2);
/// The p99 time to the first byte a rate must stay under.
pub const P99_GOAL: Duration = Duration::from_millis(10);
/// Tunnels of the reconnect storm.
pub const STORM: usize = 1000;
/// Tunnels being opened at once while the idle ones are set up.
pub const OPEN_CONCURRENCY: usize = 256;
/// Bound on one tunnel becoming ready.
pub const TUNNEL_TIMEOUT: Duration = Duration::from_secs(5);
/// The CPU figure is taken at this rate: the sweep's first, the one step every proxy runs
/// (the sweep stops at the first rate over the goal, and squid, after holding 9,000 idle
/// tunnels, is over it from the start).
pub const CPU_RATE: u32 = RATES[0];
/// The proxy's port on the seed.
pub const INGRESS_PORT: u16 = 8443;
/// Shoot *i*'s upstream echo listener is on this port plus *i*.
const UPSTREAM_BASE_PORT: u16 = 20_000;
/// Descriptors the bench process and its children may open (10,000 tunnels are 20,000
/// sockets in the bench, as many in the proxy).
const NOFILE: u64 = 200_000;
/// How long a proxy gets to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(15);
/// After the idle tunnels are open, before the memory is read.
const SETTLE: Duration = Duration::from_secs(1);

/// The proxies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// Our `vpn-router`, a CONNECT listener.
    Router,
    /// Debian's squid.
    Squid,
    /// Our `vpn-router`, a `kind = "sni"` listener (the SNI part, [`sni`]).
    RouterSni,
    /// Debian's HAProxy in TCP mode, routing by `req.ssl_sni` (the SNI part).
    Haproxy,
}

impl Proxy {
    /// The CONNECT proxies, ours first.
    pub const ALL: [Proxy; 2] = [Proxy::Router, Proxy::Squid];
    /// The TLS SNI passthrough proxies, ours first.
    pub const SNI: [Proxy; 2] = [Proxy::RouterSni, Proxy::Haproxy];

    /// `vpn-router`, `squid`, `vpn-router (sni)`, `haproxy`.
    pub fn name(self) -> &'static str {
        match self {
            Proxy::Router => "vpn-router",
            Proxy::Squid => "squid",
            Proxy::RouterSni => "vpn-router (sni)",
            Proxy::Haproxy => "haproxy",
        }
    }

    /// A directory name for its files.
    fn dir_name(self) -> &'static str {
        match self {
            Proxy::Router => "vpn-router",
            Proxy::Squid => "squid",
            Proxy::RouterSni => "vpn-router-sni",
            Proxy::Haproxy => "haproxy",
        }
    }

    /// Whether tunnels start with a ClientHello (no answer from the proxy itself).
    fn is_sni(self) -> bool {
        matches!(self, Proxy::RouterSni | Proxy::Haproxy)
    }

    /// The CONNECT head of tunnel `i`, for shoot `i` modulo [`SHOOTS`].
    fn head(self, i: usize) -> String {
        let i = i % SHOOTS;
        match self {
            Proxy::Router => format!(
                "CONNECT vpn-seed-server:1194 HTTP/1.1\r\nHost: vpn-seed-server:1194\r\n\
                 X-Gardener-Destination: {}\r\n\r\n",
                route_value(i)
            ),
            Proxy::Squid => {
                let target = format!("{}:{}", squid_name(i), upstream_port(i));
                format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
            }
            Proxy::RouterSni | Proxy::Haproxy => String::new(),
        }
    }
}

fn route_value(i: usize) -> String {
    format!("outbound|1194||vpn-seed-server.shoot--bench--s{i}.svc.cluster.local")
}

fn squid_name(i: usize) -> String {
    format!("s{i}.shoots.bench")
}

pub(super) fn upstream_port(i: usize) -> u16 {
    UPSTREAM_BASE_PORT + (i % SHOOTS) as u16
}

/// One rate of the sweep.
#[derive(Debug, Clone)]
pub struct RateStep {
    /// New tunnels a second.
    pub rate: u32,
    /// Tunnels started.
    pub started: usize,
    /// Tunnels that became ready.
    pub ready: usize,
    /// Median time to the first byte, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms (failures count as [`TUNNEL_TIMEOUT`]).
    pub p99_ms: f64,
    /// The proxy's CPU time per tunnel started, µs.
    pub cpu_us_per_tunnel: f64,
}

/// One proxy in one round.
#[derive(Debug, Clone)]
pub struct IngressSample {
    /// Resident memory with the routes loaded and no tunnel, KiB.
    pub base_rss_kib: u64,
    /// Idle tunnels that were ready and held.
    pub held: usize,
    /// Resident memory while they were held, KiB.
    pub held_rss_kib: u64,
    /// The proxy's descriptors while they were held.
    pub held_fds: usize,
    /// The sweep, in order.
    pub rates: Vec<RateStep>,
    /// Storm tunnels that became ready.
    pub storm_ready: usize,
    /// Time until the last storm tunnel was ready (or [`TUNNEL_TIMEOUT`]), ms.
    pub storm_all_ms: f64,
    /// Median storm tunnel, ms.
    pub storm_p50_ms: f64,
}

impl IngressSample {
    /// Resident memory per held tunnel, KiB.
    pub fn kib_per_tunnel(&self) -> f64 {
        if self.held == 0 {
            return f64::NAN;
        }
        self.held_rss_kib.saturating_sub(self.base_rss_kib) as f64 / self.held as f64
    }

    /// The highest rate whose p99 stayed under [`P99_GOAL`] with every tunnel ready.
    pub fn highest_rate(&self) -> Option<u32> {
        self.rates
            .iter()
            .filter(|s| s.ready == s.started && s.p99_ms < P99_GOAL.as_secs_f64() * 1e3)
            .map(|s| s.rate)
            .max()
    }

    /// CPU µs per tunnel at [`CPU_RATE`].
    pub fn cpu_us_per_tunnel(&self) -> Option<f64> {
        self.rates
            .iter()
            .find(|s| s.rate == CPU_RATE)
            .map(|s| s.cpu_us_per_tunnel)
    }
}

/// Every round's outcome per proxy.
#[derive(Debug, Default)]
pub struct IngressResults {
    /// Per proxy (in [`Proxy::ALL`] order), per round.
    pub samples: Vec<(Proxy, Vec<Result<IngressSample, String>>)>,
    /// Idle tunnels each proxy was asked to hold ([`idle_tunnels`]).
    pub idle: usize,
    /// The open-file limit the proxies ran with.
    pub nofile: u64,
}

impl IngressResults {
    /// The rounds of `proxy`.
    pub fn of(&self, proxy: Proxy) -> Option<&[Result<IngressSample, String>]> {
        self.samples
            .iter()
            .find(|(p, _)| *p == proxy)
            .map(|(_, v)| v.as_slice())
    }
}

/// Runs the CONNECT proxies ([`Proxy::ALL`]) once per round; `progress` gets a line per proxy
/// and step.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<IngressResults, BenchError> {
    run_proxies(opts, &Proxy::ALL, "ingress", progress)
}

/// Runs `proxies` once per round (`part` names the part in the progress lines).
pub fn run_proxies(
    opts: &Options,
    proxies: &[Proxy],
    part: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<IngressResults, BenchError> {
    let nofile = raise_nofile();
    let idle = idle_tunnels(nofile);
    if idle < IDLE_TUNNELS {
        progress(&format!(
            "open-file limit {nofile}: {idle} idle tunnels instead of {IDLE_TUNNELS} \
             ({FDS_PER_TUNNEL} descriptors each in the proxy and in the bench)"
        ));
    }
    let lab = BenchLab::new()?;
    for ns in [&lab.seed, &lab.shoot] {
        for (key, value) in [
            ("net.ipv4.ip_local_port_range", "1024 65000"),
            ("net.ipv4.tcp_tw_reuse", "1"),
            ("net.core.somaxconn", "8192"),
            ("net.ipv4.tcp_max_syn_backlog", "8192"),
        ] {
            ns.run(["sysctl", "-q", "-w", &format!("{key}={value}")])?;
        }
    }
    let seed_rt = runtime(&lab.seed)?;
    let shoot_rt = runtime(&lab.shoot)?;
    start_upstreams(&lab.seed, &seed_rt)?;
    let mut results = IngressResults {
        samples: proxies.iter().map(|p| (*p, Vec::new())).collect(),
        idle,
        nofile,
    };
    for round in 0..opts.rounds {
        for (k, proxy) in proxies.iter().copied().enumerate() {
            if opts.stop.load(Ordering::Relaxed) {
                return Err(BenchError::Stopped);
            }
            let mut step = |line: &str| {
                progress(&format!(
                    "round {} {part} {}: {line}",
                    round + 1,
                    proxy.name()
                ))
            };
            let outcome =
                measure(&lab, &shoot_rt, opts, proxy, idle, &mut step).map_err(|e| chain(&e));
            if let Err(e) = &outcome {
                step(&format!("FAILED: {e}"));
            }
            if let Some((_, v)) = results.samples.get_mut(k) {
                v.push(outcome);
            }
        }
    }
    Ok(results)
}

/// Raises this process's open-file limit (soft and hard, when allowed: a container may deny
/// even root) so the load generator, the upstreams and the proxies it starts can hold the
/// tunnels; returns the soft limit in force, which the proxies inherit.
fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|c| c >= NOFILE) {
        return NOFILE;
    }
    let wanted = Rlimit {
        current: Some(NOFILE),
        maximum: Some(NOFILE.max(limit.maximum.unwrap_or(0))),
    };
    if setrlimit(Resource::Nofile, wanted).is_ok() {
        return NOFILE;
    }
    // Not allowed: the soft limit up to the hard one.
    crate::memory::raise_nofile_limit();
    getrlimit(Resource::Nofile).current.unwrap_or(1024)
}

/// The idle tunnels a proxy can hold under an open-file limit of `limit`: [`IDLE_TUNNELS`], or
/// fewer so that [`FDS_PER_TUNNEL`] each fit beside [`FD_RESERVE`].
pub fn idle_tunnels(limit: u64) -> usize {
    let fit = limit.saturating_sub(FD_RESERVE) / FDS_PER_TUNNEL;
    IDLE_TUNNELS.min(usize::try_from(fit).unwrap_or(usize::MAX))
}

fn runtime(ns: &Netns) -> Result<Runtime, BenchError> {
    Ok(ns
        .run_in(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
        })?
        .map_err(|source| LabError::io("tokio runtime", source))?)
}

/// [`SHOOTS`] echo listeners on the seed, served by `rt`, until the runtime is dropped.
fn start_upstreams(ns: &Netns, rt: &Runtime) -> Result<(), BenchError> {
    for i in 0..SHOOTS {
        let addr = SocketAddr::from((SEED_ADDR, upstream_port(i)));
        let listener = ns
            .run_in(|| {
                let _guard = rt.enter();
                let std = std::net::TcpListener::bind(addr)?;
                std.set_nonblocking(true)?;
                TcpListener::from_std(std)
            })?
            .map_err(|source| LabError::io(format!("echo listener {addr}"), source))?;
        rt.spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = s.set_nodelay(true);
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    Ok(())
}

/// The processes of one measurement: the proxy, stopped on drop.
struct Started<'l> {
    ns: &'l Netns,
    pid: u32,
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
    }
}

fn measure(
    lab: &BenchLab,
    rt: &Runtime,
    opts: &Options,
    proxy: Proxy,
    idle: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<IngressSample, BenchError> {
    let dir = lab.dir.path().join(proxy.dir_name());
    std::fs::create_dir_all(&dir).map_err(|source| LabError::io(&dir, source))?;
    let pid = match proxy {
        Proxy::Router => start_router(&lab.seed, &dir, &opts.ours)?,
        Proxy::Squid => start_squid(&lab.seed, &dir)?,
        Proxy::RouterSni => sni::start_router(&lab.seed, &dir, &opts.ours)?,
        Proxy::Haproxy => sni::start_haproxy(&lab.seed, &dir)?,
    };
    let started = Started { ns: &lab.seed, pid };
    // Warm up: a few tunnels through each code path, then the base.
    for i in 0..10 {
        in_shoot(rt, open_tunnel(proxy, i))
            .map_err(|detail| BenchError::unexpected("a first tunnel", detail))?;
    }
    std::thread::sleep(SETTLE);
    let base_rss_kib = rss_kib(pid)?;
    let base_fds = fd_count(pid)?;

    // 1. Idle tunnels.
    let (held, failed, first_failure) = in_shoot(rt, open_many(proxy, idle));
    std::thread::sleep(SETTLE);
    let held_rss_kib = rss_kib(pid)?;
    let held_fds = fd_count(pid)?;
    let held_count = held.len();
    progress(&format!(
        "{held_count} idle tunnels held: VmRSS {:.1} → {:.1} MiB, {held_fds} descriptors; \
         {failed} failed{}",
        base_rss_kib as f64 / 1024.0,
        held_rss_kib as f64 / 1024.0,
        first_failure.map_or_else(String::new, |e| format!(" (first: {e})"))
    ));
    close_all(held);
    wait_fds_below(pid, base_fds + pooled_fds(proxy))?;

    // 2. New connections.
    let mut rates = Vec::new();
    for rate in RATES {
        if opts.stop.load(Ordering::Relaxed) {
            return Err(BenchError::Stopped);
        }
        let cpu_before = cpu_seconds(pid)?;
        let times = in_shoot(rt, rate_step(proxy, rate));
        let cpu = cpu_seconds(pid)? - cpu_before;
        let step = summarize(rate, &times, cpu);
        progress(&format!(
            "{rate}/s: {}/{} ready, p50 {:.2} ms, p99 {:.2} ms, {:.0} µs CPU per tunnel",
            step.ready, step.started, step.p50_ms, step.p99_ms, step.cpu_us_per_tunnel
        ));
        let over = step.ready < step.started || step.p99_ms >= P99_GOAL.as_secs_f64() * 1e3;
        rates.push(step);
        // Let the last step's connections go before the next.
        wait_fds_below(pid, base_fds + pooled_fds(proxy))?;
        if over {
            break;
        }
    }

    // 3. Reconnect storm.
    wait_fds_below(pid, base_fds + pooled_fds(proxy))?;
    let storm = in_shoot(rt, storm(proxy));
    let mut ms: Vec<f64> = storm.iter().map(|t| ms_or_timeout(*t)).collect();
    let storm_ready = storm.iter().filter(|t| t.is_some()).count();
    let storm_all_ms = ms.iter().copied().fold(0.0, f64::max);
    let storm_p50_ms = crate::stats::median(&mut ms);
    progress(&format!(
        "storm of {STORM}: {storm_ready} ready, all after {storm_all_ms:.0} ms (median {storm_p50_ms:.1} ms)"
    ));
    drop(started);
    Ok(IngressSample {
        base_rss_kib,
        held: held_count,
        held_rss_kib,
        held_fds,
        rates,
        storm_ready,
        storm_all_ms,
        storm_p50_ms,
    })
}

/// Runs `fut` as a task of `rt` and waits for it. The runtime's worker thread is in the
/// shoot's namespace; a future given to `block_on` itself would run on the calling thread,
/// in the root namespace.
fn in_shoot<F>(rt: &Runtime, fut: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    match rt.block_on(rt.spawn(fut)) {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("load generator task: {e}"),
    }
}

fn ms_or_timeout(t: Option<Duration>) -> f64 {
    t.unwrap_or(TUNNEL_TIMEOUT).as_secs_f64() * 1e3
}

fn summarize(rate: u32, times: &[Option<Duration>], cpu_seconds: f64) -> RateStep {
    let mut ms: Vec<f64> = times.iter().map(|t| ms_or_timeout(*t)).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if ms.is_empty() {
            return f64::NAN;
        }
        let i = ((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1;
        ms[i]
    };
    RateStep {
        rate,
        started: times.len(),
        ready: times.iter().filter(|t| t.is_some()).count(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        cpu_us_per_tunnel: cpu_seconds * 1e6 / times.len().max(1) as f64,
    }
}

/// Opens a tunnel to shoot `i`: connect, CONNECT head, the proxy's 200, one byte echoed by
/// the upstream. The stream and the time to the first byte.
async fn open_tunnel(proxy: Proxy, i: usize) -> Result<(TcpStream, Duration), String> {
    let start = Instant::now();
    let ready = async {
        // Bound to the shoot's address: outside the shoot's namespace this fails, so no
        // connection can leave the lab.
        let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
        socket
            .bind(SocketAddr::from((SHOOT_ADDR, 0)))
            .map_err(|e| format!("bind {SHOOT_ADDR}: {e}"))?;
        let mut s = socket
            .connect(SocketAddr::from((SEED_ADDR, INGRESS_PORT)))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = s.set_nodelay(true);
        if proxy.is_sni() {
            // The ClientHello goes through to the upstream, which echoes it.
            let hello = sni::client_hello(i);
            s.write_all(&hello)
                .await
                .map_err(|e| format!("ClientHello: {e}"))?;
            let mut echo = vec![0u8; hello.len()];
            s.read_exact(&mut echo)
                .await
                .map_err(|e| format!("echo: {e}"))?;
            if echo != hello {
                return Err("echo differs from the ClientHello".into());
            }
            return Ok(s);
        }
        s.write_all(proxy.head(i).as_bytes())
            .await
            .map_err(|e| format!("head: {e}"))?;
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.map_err(|e| format!("answer: {e}"))?;
            if n == 0 || got.len() > 8192 {
                return Err(format!("answer: {:?}", String::from_utf8_lossy(&got)));
            }
            got.extend_from_slice(&buf[..n]);
        }
        if !(got.starts_with(b"HTTP/1.1 200") || got.starts_with(b"HTTP/1.0 200")) {
            let line = got.split(|b| *b == b'\r').next().unwrap_or(&[]);
            return Err(format!("answer {:?}", String::from_utf8_lossy(line)));
        }
        s.write_all(b"x").await.map_err(|e| format!("byte: {e}"))?;
        let mut echo = [0u8; 1];
        s.read_exact(&mut echo)
            .await
            .map_err(|e| format!("echo: {e}"))?;
        if echo != *b"x" {
            return Err(format!("echo {echo:?}"));
        }
        Ok(s)
    };
    match tokio::time::timeout(TUNNEL_TIMEOUT, ready).await {
        Ok(Ok(s)) => Ok((s, start.elapsed())),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("not ready within {TUNNEL_TIMEOUT:?}")),
    }
}

/// Closes with a reset (no TIME_WAIT in the load generator).
fn reset(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

fn close_all(streams: Vec<TcpStream>) {
    for s in streams {
        reset(s);
    }
}

/// Opens `n` tunnels, [`OPEN_CONCURRENCY`] at a time, spread over the shoots: the ready ones,
/// and the number that failed with the first failure's reason.
async fn open_many(proxy: Proxy, n: usize) -> (Vec<TcpStream>, usize, Option<String>) {
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(OPEN_CONCURRENCY));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let Ok(permit) = std::sync::Arc::clone(&limit).acquire_owned().await else {
            break;
        };
        set.spawn(async move {
            let t = open_tunnel(proxy, i).await;
            drop(permit);
            t.map(|(s, _)| s)
        });
    }
    let mut held = Vec::with_capacity(n);
    let (mut failed, mut first) = (0, None);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(e)) => {
                failed += 1;
                first.get_or_insert(e);
            }
            Err(e) => {
                failed += 1;
                first.get_or_insert(e.to_string());
            }
        }
    }
    (held, failed, first)
}

/// New tunnels at `rate` a second for [`STEP`]; each one's time to the first byte.
async fn rate_step(proxy: Proxy, rate: u32) -> Vec<Option<Duration>> {
    let count = (u64::from(rate) * STEP.as_millis() as u64 / 1000) as usize;
    let period = Duration::from_secs(1) / rate;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..count {
        tick.tick().await;
        set.spawn(async move {
            match open_tunnel(proxy, i).await {
                Ok((s, t)) => {
                    reset(s);
                    Some(t)
                }
                Err(_) => None,
            }
        });
    }
    let mut times = Vec::with_capacity(count);
    while let Some(r) = set.join_next().await {
        times.push(r.ok().flatten());
    }
    times
}

/// [`STORM`] tunnels at once; each one's time to the first byte (all measured from the same
/// start, as they are started together).
async fn storm(proxy: Proxy) -> Vec<Option<Duration>> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..STORM {
        set.spawn(async move { open_tunnel(proxy, i).await.ok().map(|(s, _)| s) });
    }
    let mut times = Vec::with_capacity(STORM);
    let mut streams = Vec::with_capacity(STORM);
    while let Some(r) = set.join_next().await {
        match r.ok().flatten() {
            Some(s) => {
                times.push(Some(start.elapsed()));
                streams.push(s);
            }
            None => times.push(None),
        }
    }
    close_all(streams);
    times
}

/// Descriptors a proxy may keep after its tunnels closed beyond its count before them: our
/// router's per-thread pools of empty splice pipes (two ends each, one pool per worker thread,
/// tokio's default of one worker per CPU).
fn pooled_fds(proxy: Proxy) -> usize {
    match proxy {
        Proxy::Router | Proxy::RouterSni => {
            let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
            2 * netio::relay::PIPE_POOL_SIZE * workers
        }
        Proxy::Squid | Proxy::Haproxy => 0,
    }
}

/// Waits (at most 30 s) until the proxy holds no more than 20 descriptors over `base` (its
/// count with no tunnel): the last load's connections are gone; then one more second.
fn wait_fds_below(pid: u32, base: usize) -> Result<(), BenchError> {
    let fds = base + 20;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fd_count(pid)? > fds {
        if Instant::now() >= deadline {
            return Err(BenchError::unexpected(
                "the proxy's descriptors after the tunnels closed",
                format!("{} still open", fd_count(pid)?),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(SETTLE);
    Ok(())
}

fn start_router(ns: &Netns, dir: &Path, ours: &Path) -> Result<u32, BenchError> {
    let mut text = format!(
        "max_connections = 30000\nmax_pending = 4096\n\n[[listener]]\n\
         address = \"{SEED_ADDR}:{INGRESS_PORT}\"\nheaders = [\"X-Gardener-Destination\"]\n"
    );
    for i in 0..SHOOTS {
        text.push_str(&format!(
            "\n[[route]]\nvalue = \"{}\"\nupstream = \"{SEED_ADDR}:{}\"\n",
            route_value(i),
            upstream_port(i)
        ));
    }
    let conf = dir.join("router.toml");
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let log = dir.join("router.log");
    let bin = ours.join("vpn-router");
    let mut cmd = ns.command(&bin.to_string_lossy());
    cmd.arg("--config").arg(&conf).args(["--log", "warn"]);
    spawn_logged(ns, cmd, &log, "vpn-router")
}

fn start_squid(ns: &Netns, dir: &Path) -> Result<u32, BenchError> {
    // squid drops to its own user; it must be able to write its logs here.
    let _ = std::process::Command::new("chmod")
        .arg("0777")
        .arg(dir)
        .status();
    let hosts = dir.join("hosts");
    let names = dir.join("shoots.txt");
    let mut hosts_text = String::new();
    let mut names_text = String::new();
    for i in 0..SHOOTS {
        hosts_text.push_str(&format!("{SEED_ADDR} {}\n", squid_name(i)));
        names_text.push_str(&format!("{}\n", squid_name(i)));
    }
    std::fs::write(&hosts, hosts_text).map_err(|source| LabError::io(&hosts, source))?;
    std::fs::write(&names, names_text).map_err(|source| LabError::io(&names, source))?;
    let last = UPSTREAM_BASE_PORT + SHOOTS as u16 - 1;
    let d = dir.display();
    let text = format!(
        "http_port {SEED_ADDR}:{INGRESS_PORT}\n\
         hosts_file {hosts}\n\
         acl shoots dstdomain \"{names}\"\n\
         acl shoot_ports port {UPSTREAM_BASE_PORT}-{last}\n\
         acl CONNECT method CONNECT\n\
         http_access allow CONNECT shoots shoot_ports\n\
         http_access deny all\n\
         max_filedescriptors 65536\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         access_log none\n\
         cache_log {d}/cache.log\n\
         pid_filename {d}/squid.pid\n\
         coredump_dir {d}\n\
         shutdown_lifetime 1 seconds\n\
         workers 1\n",
        hosts = hosts.display(),
        names = names.display(),
    );
    let conf = dir.join("squid.conf");
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let mut cmd = ns.command("squid");
    cmd.arg("-N").arg("-f").arg(&conf);
    spawn_logged(ns, cmd, &dir.join("squid.out"), "squid")
}

/// Spawns `cmd` in `ns` with its output in `log` and waits until the ingress port answers.
pub(super) fn spawn_logged(
    ns: &Netns,
    mut cmd: std::process::Command,
    log: &Path,
    what: &str,
) -> Result<u32, BenchError> {
    let out = std::fs::File::create(log).map_err(|source| LabError::io(log, source))?;
    let err = out
        .try_clone()
        .map_err(|source| LabError::io(log, source))?;
    let pid = ns.spawn(cmd.stdin(Stdio::null()).stdout(out).stderr(err))?;
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    let addr = SocketAddr::from((SEED_ADDR, INGRESS_PORT));
    loop {
        if ns.run_in(|| std::net::TcpStream::connect(addr).is_ok())? {
            return Ok(pid);
        }
        let text = || std::fs::read_to_string(log).unwrap_or_default();
        if let Some(status) = ns.try_wait(pid) {
            return Err(LabError::Exited {
                what: what.into(),
                status,
                log: text(),
            }
            .into());
        }
        if Instant::now() >= deadline {
            ns.stop(pid);
            return Err(LabError::Timeout {
                what: format!("{what} listening"),
                waited: LISTEN_TIMEOUT,
                log: text(),
            }
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_count_failures_as_the_timeout() {
        let mut times: Vec<Option<Duration>> =
            (1..=99).map(|ms| Some(Duration::from_millis(ms))).collect();
        times.push(None);
        let s = summarize(100, &times, 0.01);
        assert_eq!((s.started, s.ready), (100, 99));
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert!((s.cpu_us_per_tunnel - 100.0).abs() < 1e-9);
        times.push(None);
        assert_eq!(summarize(100, &times, 0.0).p99_ms, 5000.0);
    }

    #[test]
    fn the_highest_rate_needs_every_tunnel_and_the_goal() {
        let step = |rate, ready, p99_ms| RateStep {
            rate,
            started: 10,
            ready,
            p50_ms: 1.0,
            p99_ms,
            cpu_us_per_tunnel: 1.0,
        };
        let sample = IngressSample {
            base_rss_kib: 1000,
            held: 10,
            held_rss_kib: 1100,
            held_fds: 30,
            rates: vec![step(250, 10, 2.0), step(500, 10, 9.9), step(1000, 9, 3.0)],
            storm_ready: 0,
            storm_all_ms: 0.0,
            storm_p50_ms: 0.0,
        };
        assert_eq!(sample.highest_rate(), Some(500));
        assert_eq!(idle_tunnels(200_000), IDLE_TUNNELS);
        assert_eq!(idle_tunnels(20_000), 9000);
        assert_eq!(idle_tunnels(100), 0);
        assert_eq!(sample.kib_per_tunnel(), 10.0);
        assert_eq!(
            Proxy::Squid.head(7),
            "CONNECT s7.shoots.bench:20007 HTTP/1.1\r\nHost: s7.shoots.bench:20007\r\n\r\n"
        );
        assert!(Proxy::Router.head(7).contains(
            "X-Gardener-Destination: outbound|1194||vpn-seed-server.shoot--bench--s7.svc"
        ));
    }
}
