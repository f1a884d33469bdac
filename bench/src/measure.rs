//! The measurements: iperf3 throughput with per-process CPU time, ping, a TCP ping-pong,
//! time to the first ping, resident memory. Every loop is bounded in count and time.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::LabError;

use crate::{BenchError, Load};

/// CPU time (user + system) of a process, from `/proc/PID/stat`, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|source| LabError::io(&path, source))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| BenchError::unexpected("/proc/PID/stat", text.clone()))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let tick = |i: usize| -> Result<u64, BenchError> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| BenchError::unexpected("/proc/PID/stat fields", text.clone()))
    };
    let ticks = tick(11)? + tick(12)?;
    let hz = rustix::param::clock_ticks_per_second() as f64;
    Ok(ticks as f64 / hz)
}

/// Resident memory of a process (`VmRSS` in `/proc/PID/status`), in KiB.
pub fn rss_kib(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|source| LabError::io(&path, source))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| BenchError::unexpected("VmRSS", text.clone()))
}

/// Copies `/proc/PID/smaps` of each named process into `dir` as `<case>-<round>-<name>.smaps`
/// (the per-mapping breakdown behind a VmRSS figure). Best effort: a failure is printed, not
/// fatal, because the figure itself was already read.
pub fn keep_smaps(dir: &std::path::Path, case: &impl std::fmt::Display, procs: &[(&str, u32)]) {
    let stem: String = case
        .to_string()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    for (name, pid) in procs {
        let copy = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let text = std::fs::read(format!("/proc/{pid}/smaps"))?;
            let mut n = 1;
            let path = loop {
                let path = dir.join(format!("{stem}-{n}-{name}.smaps"));
                if !path.exists() {
                    break path;
                }
                n += 1;
            };
            std::fs::write(path, text)
        };
        if let Err(e) = copy() {
            eprintln!("keeping smaps of {name} (pid {pid}): {e}");
        }
    }
}

/// One iperf3 run: what arrived, and what the VPN processes spent on it.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Receiver-side throughput, Mbit/s.
    pub mbit_s: f64,
    /// Bytes received.
    pub bytes: u64,
    /// CPU seconds per GB (10^9 bytes) of the server process.
    pub server_cpu_s_per_gb: f64,
    /// CPU seconds per GB of the client process.
    pub client_cpu_s_per_gb: f64,
    /// CPU seconds per GB of the proxy process, when there is one.
    pub proxy_cpu_s_per_gb: Option<f64>,
    /// Highest resident memory sampled during the run, server, KiB.
    pub server_rss_kib: u64,
    /// Highest resident memory sampled during the run, client, KiB.
    pub client_rss_kib: u64,
}

/// The processes whose CPU time a transfer is charged to.
#[derive(Debug, Clone, Copy)]
pub struct Pids {
    /// The VPN server.
    pub server: u32,
    /// The VPN client.
    pub client: u32,
    /// The CONNECT proxy, if the client goes through one.
    pub proxy: Option<u32>,
}

/// Runs `iperf3 -c` from `from` to `target` for `duration` with `load`, measuring the CPU time
/// of `pids`.
pub fn iperf(
    from: &Netns,
    target: SocketAddr,
    load: Load,
    duration: Duration,
    pids: Pids,
) -> Result<Transfer, BenchError> {
    let (server_pid, client_pid) = (pids.server, pids.client);
    let proxy0 = pids.proxy.map(cpu_seconds).transpose()?;
    let Load { streams, reverse } = load;
    let secs = duration.as_secs().max(1);
    let mut cmd = from.command("iperf3");
    cmd.args([
        "-c",
        &target.ip().to_string(),
        "-p",
        &target.port().to_string(),
    ])
    .args(["-t", &secs.to_string(), "-P", &streams.to_string(), "-J"])
    .args(["--connect-timeout", "3000"]);
    if reverse {
        cmd.arg("-R");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let cpu0 = (cpu_seconds(server_pid)?, cpu_seconds(client_pid)?);
    let mut child = cmd.spawn().map_err(|source| LabError::Spawn {
        command: "iperf3 -c".into(),
        source,
    })?;
    // Read stdout on a thread so a full pipe cannot stall iperf3 while we sample.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(out) = stdout.as_mut() {
            let _ = out.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + duration + Duration::from_secs(15);
    let (mut srv_rss, mut cli_rss) = (0u64, 0u64);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        srv_rss = srv_rss.max(rss_kib(server_pid).unwrap_or(0));
        cli_rss = cli_rss.max(rss_kib(client_pid).unwrap_or(0));
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::unexpected(
                "iperf3",
                "did not finish in time (killed)",
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let cpu1 = (cpu_seconds(server_pid)?, cpu_seconds(client_pid)?);
    let proxy1 = pids.proxy.map(cpu_seconds).transpose()?;
    let json = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(BenchError::unexpected(
            "iperf3",
            format!("{status}: {}", json.chars().take(400).collect::<String>()),
        ));
    }
    let (bytes, bits) = parse_iperf(&json)?;
    let gb = (bytes as f64 / 1e9).max(1e-9);
    Ok(Transfer {
        mbit_s: bits / 1e6,
        bytes,
        server_cpu_s_per_gb: (cpu1.0 - cpu0.0) / gb,
        client_cpu_s_per_gb: (cpu1.1 - cpu0.1) / gb,
        proxy_cpu_s_per_gb: proxy0.zip(proxy1).map(|(a, b)| (b - a) / gb),
        server_rss_kib: srv_rss,
        client_rss_kib: cli_rss,
    })
}

/// `end.sum_received.{bytes, bits_per_second}` of iperf3's JSON.
fn parse_iperf(json: &str) -> Result<(u64, f64), BenchError> {
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| BenchError::unexpected("iperf3 JSON", e.to_string()))?;
    let sum = &v["end"]["sum_received"];
    match (sum["bytes"].as_u64(), sum["bits_per_second"].as_f64()) {
        (Some(b), Some(bits)) => Ok((b, bits)),
        _ => Err(BenchError::unexpected(
            "iperf3 JSON",
            format!("no end.sum_received: {}", v["error"]),
        )),
    }
}

/// Median ping RTT in ms over `count` echo requests 10 ms apart. The median, not ping's
/// average: one slow wake-up of an idle machine moves the average more than the difference
/// between two VPNs.
pub fn ping_rtt_ms(from: &Netns, addr: Ipv4Addr, count: u32) -> Result<f64, BenchError> {
    let out = from.run([
        "ping",
        "-n",
        "-c",
        &count.to_string(),
        "-i",
        "0.01",
        "-w",
        "10",
        &addr.to_string(),
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "64 bytes from 192.168.123.10: icmp_seq=1 ttl=64 time=0.287 ms"
    let mut times: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            l.split_once(" time=")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    if times.is_empty() {
        return Err(BenchError::unexpected("ping replies", text.into_owned()));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Sends echo requests to `addr` every 2 ms until the first reply (at most `limit`); returns
/// the time from `since` to that reply.
pub fn first_ping(
    from: &Netns,
    addr: Ipv4Addr,
    since: Instant,
    limit: Duration,
) -> Result<Duration, BenchError> {
    // Our server answers packets for a client not connected yet with ICMP host unreachable
    // (`vpn_server::unreachable`), which ends a `ping -c 1` at once with a failure; so ping
    // again (every 2 ms, each ping for at most 1 s) until an echo reply comes back.
    let deadline = since + limit;
    loop {
        let out = from
            .command("ping")
            .args(["-n", "-q", "-c", "1", "-i", "0.002", "-w", "1"])
            .arg(addr.to_string())
            .output()
            .map_err(|source| LabError::io("ping", source))?;
        if out.status.success() {
            return Ok(since.elapsed());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::unexpected(
                "first ping",
                format!(
                    "no echo reply from {addr} within {limit:?}: {}",
                    String::from_utf8_lossy(&out.stdout).trim()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A TCP echo server in the shoot for the request/response measurement; stops when dropped.
#[derive(Debug)]
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Listens on `0.0.0.0:port` inside `ns`.
    pub fn start(ns: &Netns, port: u16) -> Result<EchoServer, BenchError> {
        let listener = ns
            .run_in(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))?
            .map_err(|source| LabError::io("echo listener", source))?;
        listener
            .set_nonblocking(true)
            .map_err(|source| LabError::io("echo listener", source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => echo(s, &flag),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(EchoServer {
            stop,
            thread: Some(thread),
        })
    }
}

fn echo(mut s: TcpStream, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if s.write_all(buf.get(..n).unwrap_or(&[])).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Median time of `count` one-byte request/response exchanges over one TCP connection (with
/// `TCP_NODELAY`) from `from` to `addr:port`, in microseconds.
pub fn request_response_us(
    from: &Netns,
    addr: Ipv4Addr,
    port: u16,
    count: usize,
) -> Result<f64, BenchError> {
    let target = SocketAddr::from((addr, port));
    let mut s = from
        .run_in(|| TcpStream::connect_timeout(&target, Duration::from_secs(3)))?
        .map_err(|source| LabError::io("echo connection", source))?;
    let io = |e| LabError::io("echo connection", e);
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    let mut times = Vec::with_capacity(count);
    let mut byte = [0u8; 1];
    for i in 0..count {
        let t = Instant::now();
        s.write_all(&[i as u8]).map_err(io)?;
        s.read_exact(&mut byte).map_err(io)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(crate::stats::median(&mut times))
}

/// The IPv4 addresses configured in `ns` (for checking the client's tunnel address).
pub fn addresses(ns: &Netns) -> Result<String, BenchError> {
    let out = ns.run(["ip", "-4", "-o", "addr", "show"])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until a TCP port listens in `ns` (by `ss`, without connecting to it).
pub fn wait_port(ns: &Netns, port: u16, limit: Duration) -> Result<(), BenchError> {
    let deadline = Instant::now() + limit;
    let needle = format!(":{port} ");
    loop {
        let out = ns.run(["ss", "-ltnH"])?;
        if String::from_utf8_lossy(&out.stdout).contains(&needle) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::unexpected(
                "listening port",
                format!("nothing on {port}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
