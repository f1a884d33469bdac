//! The memory part (issue 18): the resident memory of the seed's server process with one
//! connected client, idle and under load, with the CONNECT sidecar in the process and
//! without, beside upstream OpenVPN's server. Also the sidecar's throughput and the server
//! process's CPU per GB under that load, which come with it.
//!
//! Each [`Setup`] runs once per round in one process lifetime (same lab as the matrix, see
//! [`crate::lab`]; AES-256-GCM, the client connected directly):
//!
//! 1. the server (with `--sidecar` and its flags for [`Setup::OursSidecar`]), the echo server
//!    of [`crate::tunnels`] in the shoot, the client; the first ping through the tunnel;
//! 2. one stream from the seed to the echo (through the sidecar: a CONNECT), 1 KiB echoed,
//!    closed; once the server's open file descriptors are back to their count before it,
//!    0.5 s, then **idle** `VmRSS`;
//! 3. for each number of tunnels K in [`crate::Options::tunnels`], in that order: K
//!    concurrent streams writing for [`crate::Options::duration`], `VmRSS` sampled every
//!    100 ms until every stream got all its bytes back (**peak**: the highest; **end**: the
//!    last sample before the writers stop), the server's CPU time over that; then the K
//!    streams held open and idle for 0.5 s (**held** `VmRSS`: what open tunnels cost at
//!    rest); then, once they closed and the server's descriptors are back to the idle count,
//!    1 s, then **after** `VmRSS`.
//!
//! With `smaps_dir` set, `/proc/PID/smaps` of the server is kept at idle, three quarters into
//! each load, while held, and after.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use netio::report::chain;

use conformance::LabError;

use crate::lab::{BenchLab, Side, VpnProcess, CLIENT_TUN_ADDR};
use crate::measure::{self, cpu_seconds, rss_kib};
use crate::tunnels::{Echo, Loader, Moved, Path, DRAIN, OPEN_TIMEOUT};
use crate::{tail, BenchError, Cipher, Impl, Options};

/// The echo server's port in the shoot (on every address, so on the tunnel address too).
pub const ECHO_LOAD_PORT: u16 = 5203;
/// The sidecar's TLS listener, on the seed's loopback.
pub const SIDECAR_ADDR: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(Ipv4Addr::LOCALHOST),
    sidecar::DEFAULT_PORT,
);
/// The sidecar's metrics listener, on the seed's loopback (bound as in Gardener's pod; not
/// scraped).
pub const SIDECAR_METRICS_ADDR: &str = "127.0.0.1:15000";
/// The networks the sidecar may dial: the VPN's address pool, which holds the client's
/// tunnel address (where the echo listens).
pub const SIDECAR_ALLOW: &str = "192.168.123.0/24";
/// The seed network the sidecar must never dial (the veth link).
pub const SIDECAR_DENY: &str = "10.250.0.0/24";
/// The name in the lab's server certificate (its CN; it has no SAN).
pub const SIDECAR_SERVER_NAME: &str = "server";

/// Between the first stream's end and the idle sample.
const IDLE_SETTLE: Duration = Duration::from_millis(500);
/// Between the end of a load and the after sample.
const AFTER_SETTLE: Duration = Duration::from_secs(1);
/// How long the server gets to close a load's sockets.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// RSS sampling interval under load.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The server process measured, and how the load reaches the shoot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setup {
    /// Upstream `openvpn` server and client; the streams go straight through the tunnel.
    Upstream,
    /// Our `vpn-server` alone with our `vpn-client`; the streams go straight through the
    /// tunnel.
    Ours,
    /// Our `vpn-server --sidecar` with our `vpn-client`; every stream is an mTLS CONNECT
    /// tunnel through the sidecar.
    OursSidecar,
}

impl Setup {
    /// Every setup, in the order they run within a round.
    pub const ALL: [Setup; 3] = [Setup::Upstream, Setup::Ours, Setup::OursSidecar];

    /// `upstream`, `ours`, `ours+sidecar`.
    pub fn name(self) -> &'static str {
        match self {
            Setup::Upstream => "upstream",
            Setup::Ours => "ours",
            Setup::OursSidecar => "ours+sidecar",
        }
    }

    /// Who runs the server and the client.
    fn imp(self) -> Impl {
        match self {
            Setup::Upstream => Impl::Upstream,
            Setup::Ours | Setup::OursSidecar => Impl::Ours,
        }
    }

    fn sidecar(self) -> bool {
        self == Setup::OursSidecar
    }
}

/// One load of one setup in one round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSample {
    /// Concurrent streams (tunnels).
    pub tunnels: usize,
    /// Highest `VmRSS` sampled during the load, KiB.
    pub peak_kib: u64,
    /// Last `VmRSS` sampled before the writers stopped, KiB.
    pub end_kib: u64,
    /// `VmRSS` with every stream drained and held open, idle, for 0.5 s, KiB.
    pub held_kib: u64,
    /// `VmRSS` 1 s after the server closed the load's sockets, KiB.
    pub after_kib: u64,
    /// What the streams moved.
    pub moved: Moved,
    /// CPU seconds (user + system) of the server process per GB (10^9 bytes) moved, both
    /// directions counted.
    pub cpu_s_per_gb: f64,
}

impl LoadSample {
    /// Bytes echoed back per second, MB/s (10^6): the rate each way.
    pub fn mb_s(&self) -> f64 {
        self.moved.received as f64 / self.moved.secs.max(1e-9) / 1e6
    }
}

/// One setup in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct MemorySample {
    /// `VmRSS` idle after the first stream, KiB.
    pub idle_kib: u64,
    /// One per entry of [`Options::tunnels`], in its order.
    pub loads: Vec<LoadSample>,
}

/// All samples by setup, in round order; failures as text.
#[derive(Debug, Default)]
pub struct MemoryResults {
    /// Per setup, one entry per round (`Err` for a failed round).
    pub samples: Vec<(Setup, Vec<Result<MemorySample, String>>)>,
}

impl MemoryResults {
    /// The entries of `setup`.
    pub fn of(&self, setup: Setup) -> Option<&[Result<MemorySample, String>]> {
        self.samples
            .iter()
            .find(|(s, _)| *s == setup)
            .map(|(_, v)| v.as_slice())
    }
}

/// Runs every setup once per round in a lab of its own; `progress` gets a line per setup.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<MemoryResults, BenchError> {
    raise_nofile_limit();
    let lab = BenchLab::new()?;
    let mut results = MemoryResults {
        samples: Setup::ALL.iter().map(|s| (*s, Vec::new())).collect(),
    };
    for round in 0..opts.rounds {
        for (i, setup) in Setup::ALL.into_iter().enumerate() {
            if opts.stop.load(Ordering::Relaxed) {
                return Err(BenchError::Stopped);
            }
            let started = Instant::now();
            let outcome = measure_setup(&lab, opts, setup).map_err(|e| chain(&e));
            let line = match &outcome {
                Ok(s) => format!(
                    "round {} memory {}: idle {:.1} MiB; {} ({:.0} s)",
                    round + 1,
                    setup.name(),
                    mib(s.idle_kib),
                    s.loads
                        .iter()
                        .map(|l| format!(
                            "{} tunnels: peak {:.1}, end {:.1}, held {:.1}, after {:.1} MiB, \
                             {:.0} MB/s, {:.1} s/GB",
                            l.tunnels,
                            mib(l.peak_kib),
                            mib(l.end_kib),
                            mib(l.held_kib),
                            mib(l.after_kib),
                            l.mb_s(),
                            l.cpu_s_per_gb
                        ))
                        .collect::<Vec<_>>()
                        .join("; "),
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => format!("round {} memory {}: FAILED: {e}", round + 1, setup.name()),
            };
            progress(&line);
            if let Some((_, v)) = results.samples.get_mut(i) {
                v.push(outcome);
            }
        }
    }
    Ok(results)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Our server's flags for the in-process sidecar in the lab: the lab's server certificate,
/// client certificates required and checked against the lab's CA, the VPN pool allowed, the
/// seed's link denied.
fn sidecar_args(lab: &BenchLab) -> Vec<String> {
    let p = &lab.pki;
    let path = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
    vec![
        "--sidecar".into(),
        "--sidecar-listen".into(),
        SIDECAR_ADDR.to_string(),
        "--sidecar-metrics-listen".into(),
        SIDECAR_METRICS_ADDR.into(),
        "--sidecar-cert".into(),
        path(p.server_cert()),
        "--sidecar-key".into(),
        path(p.server_key()),
        "--sidecar-ca".into(),
        path(p.ca_cert()),
        "--sidecar-client-cert".into(),
        "required".into(),
        "--sidecar-allow".into(),
        SIDECAR_ALLOW.into(),
        "--sidecar-deny".into(),
        SIDECAR_DENY.into(),
    ]
}

/// The kube-apiserver's side: the lab's client certificate, trusting the lab's CA.
fn sidecar_path(lab: &BenchLab) -> Result<Path, BenchError> {
    let p = &lab.pki;
    let read = |path: std::path::PathBuf| {
        std::fs::read(&path).map_err(|source| BenchError::Lab(LabError::io(path, source)))
    };
    let tls = |e: String| BenchError::unexpected("sidecar client TLS", e);
    let identity = pki::Identity::from_pem(&read(p.client_cert())?, &read(p.client_key())?)
        .map_err(|e| tls(e.to_string()))?;
    let bundle = pki::CaBundle::from_pem(&read(p.ca_cert())?).map_err(|e| tls(e.to_string()))?;
    let connector = pki::tls::connect_proxy_connector(Some(&identity), &bundle)
        .map_err(|e| tls(e.to_string()))?;
    Ok(Path::Sidecar {
        addr: SIDECAR_ADDR,
        connector,
        server_name: SIDECAR_SERVER_NAME.into(),
    })
}

/// One setup: processes from scratch, idle, every load, processes stopped.
fn measure_setup(lab: &BenchLab, opts: &Options, setup: Setup) -> Result<MemorySample, BenchError> {
    let cipher = Cipher::Gcm;
    let extra = if setup.sidecar() {
        sidecar_args(lab)
    } else {
        Vec::new()
    };
    let server = VpnProcess::start_with(
        &lab.seed,
        setup.imp(),
        Side::Server,
        &lab.server_config(cipher),
        &opts.ours,
        &extra,
    )?;
    server.wait_listening()?;
    if setup.sidecar() {
        server.wait_log("connect sidecar listening", "CONNECT sidecar listening")?;
    }
    let echo = Echo::start(&lab.shoot, ECHO_LOAD_PORT)?;
    let start = Instant::now();
    let client = VpnProcess::start(
        &lab.shoot,
        setup.imp(),
        Side::Client,
        &lab.client_config(cipher, None),
        &opts.ours,
    )?;
    let failed = |what: &'static str, e: &(dyn std::error::Error + 'static)| {
        BenchError::unexpected(
            what,
            format!(
                "{}\n--- server log ---\n{}\n--- client log ---\n{}",
                chain(e),
                tail(&server.log()),
                tail(&client.log())
            ),
        )
    };
    measure::first_ping(&lab.seed, CLIENT_TUN_ADDR, start, Duration::from_secs(20))
        .map_err(|e| failed("tunnel up", &e))?;
    let path = match setup.sidecar() {
        true => sidecar_path(lab)?,
        false => Path::Direct,
    };
    let loader = Loader::new(&lab.seed, path)?;
    let target = SocketAddr::from((CLIENT_TUN_ADDR, ECHO_LOAD_PORT));
    let pid = server.pid();
    let fds = fd_count(pid)?;
    loader
        .exchange_once(target)
        .map_err(|e| failed("first stream", &e))?;
    wait_closed(pid, fds)?;
    std::thread::sleep(IDLE_SETTLE);
    let idle_kib = rss_kib(pid)?;
    keep_smaps(opts, setup, "idle", pid);
    let mut loads = Vec::new();
    for &tunnels in &opts.tunnels {
        if !server.running() || !client.running() {
            return Err(failed(
                "VPN processes",
                &BenchError::unexpected("exited", "server or client"),
            ));
        }
        let sample =
            load(&loader, opts, setup, pid, target, tunnels).map_err(|e| failed("load", &e))?;
        wait_closed(pid, fds)?;
        std::thread::sleep(AFTER_SETTLE);
        let after_kib = rss_kib(pid)?;
        keep_smaps(opts, setup, &format!("after {tunnels}"), pid);
        loads.push(LoadSample {
            after_kib,
            ..sample
        });
    }
    drop(loader);
    drop(client);
    drop(echo);
    drop(server);
    Ok(MemorySample { idle_kib, loads })
}

/// One load of `tunnels` streams; `after_kib` is left 0 for the caller.
fn load(
    loader: &Loader,
    opts: &Options,
    setup: Setup,
    pid: u32,
    target: SocketAddr,
    tunnels: usize,
) -> Result<LoadSample, BenchError> {
    let cpu0 = cpu_seconds(pid)?;
    let started = Instant::now();
    let running = loader.start(target, tunnels, opts.duration);
    // The streams end by the deadline plus DRAIN (each is cut there); this bound only
    // guards the sampling loop.
    let limit = opts.duration + DRAIN + OPEN_TIMEOUT;
    let (mut peak, mut end) = (0u64, 0u64);
    let mut kept = false;
    while running.drained() < tunnels && !running.is_finished() && started.elapsed() < limit {
        let rss = rss_kib(pid)?;
        peak = peak.max(rss);
        let t = started.elapsed();
        if t < opts.duration {
            end = rss;
        }
        if !kept && t >= opts.duration * 3 / 4 {
            keep_smaps(opts, setup, &format!("load {tunnels}"), pid);
            kept = true;
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    let cpu1 = cpu_seconds(pid)?;
    // Every tunnel open and idle (unless the load failed: then `finish` says why).
    let held = if running.drained() == tunnels {
        std::thread::sleep(IDLE_SETTLE);
        let held = rss_kib(pid)?;
        keep_smaps(opts, setup, &format!("held {tunnels}"), pid);
        held
    } else {
        0
    };
    running.release();
    let moved = loader.finish(running)?;
    let gb = ((moved.sent + moved.received) as f64 / 1e9).max(1e-9);
    Ok(LoadSample {
        tunnels,
        peak_kib: peak,
        end_kib: end,
        held_kib: held,
        after_kib: 0,
        moved,
        cpu_s_per_gb: (cpu1 - cpu0) / gb,
    })
}

/// Two sockets per stream in this process (the seed's end and the echo's; the flood part's
/// thousands of connections): lift the soft open-file limit to the hard one.
pub(crate) fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            eprintln!("bench: cannot raise the open-file limit: {e}");
        }
    }
}

/// Open file descriptors of a process.
pub(crate) fn fd_count(pid: u32) -> Result<usize, BenchError> {
    let path = format!("/proc/{pid}/fd");
    let dir = std::fs::read_dir(&path).map_err(|source| LabError::io(&path, source))?;
    Ok(dir.count())
}

/// Waits until the process holds at most `fds` descriptors again (the load's sockets are
/// closed), at most [`CLOSE_WAIT`].
fn wait_closed(pid: u32, fds: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + CLOSE_WAIT;
    loop {
        let now = fd_count(pid)?;
        if now <= fds {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::unexpected(
                "sockets closed after the load",
                format!("{now} descriptors open {CLOSE_WAIT:?} after it, {fds} before"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn keep_smaps(opts: &Options, setup: Setup, phase: &str, pid: u32) {
    if let Some(dir) = &opts.smaps_dir {
        measure::keep_smaps(
            dir,
            &format!("memory {} {phase}", setup.name()),
            &[("server", pid)],
        );
    }
}
