//! `vpn-router --config-dir` under churn: the real binary reading a Kubernetes-style volume
//! while 100 tunnels carry checksummed traffic and the test swaps `..data` 1,000 times.
//!
//! ```text
//!  rdir…-shoot (test driver, clients)             rdir…-seed
//!  10.80.0.2/24  ─────────── veth ───────────    10.80.0.1/24: vpn-router :18443 (CONNECT),
//!                                                  :15001 (/metrics), one upstream per shoot
//!                                                  (greets with the shoot's name, then echoes)
//! ```
//!
//! Shoots: `shoot--t--0` … `shoot--t--9` carry ten tunnels each, opened at generation 0;
//! their rules flip between allowing and denying the client, and the files of `--t--5` …
//! `--t--9` come and go. `shoot--p--a` and `shoot--p--ab` (one a prefix of the other) have
//! opposite rules, flipped every generation; now and then `shoot--p--a.toml` is written
//! broken (a bad CIDR on a known line), and now and then `seed.toml` (a bad value on line 1:
//! the last good seed settings stay, the shoots' changes still apply). Each generation is a new `..<timestamp>` directory and
//! one rename of `..data`, as the kubelet does; every tenth is followed by a SIGHUP at once.
//!
//! Asserted:
//!
//! * no tunnel is reset and no byte is lost: each tunnel's bytes echoed back equal the bytes
//!   sent (SHA-256 of both), through every reload, also for shoots whose file was removed or
//!   whose rules now deny the client;
//! * right after a swap, a CONNECT for `--p--a` / `--p--ab` is answered by that shoot's
//!   current or previous policy; once the router reports the generation
//!   (`vpn_router_config_reloads_total`), every probe is answered by its shoot's current
//!   policy, and an allowed one reaches that shoot's upstream (its greeting);
//! * a background prober sends CONNECTs for every shoot all through the churn; each is
//!   answered by its own shoot's policy of a generation between the last one the router
//!   reported before the request and the last one written after it (at most the previous
//!   and the current one);
//! * a broken file is logged with its name and line, `vpn_router_config_file_ok` shows it,
//!   and the shoot keeps its last good policy;
//! * the per-shoot series match what the test did (tunnels, refusals by reason, bytes each
//!   way), and a shoot whose file is gone loses its series once its last tunnel closed.
//!
//! Needs `cargo build -p vpn-router` first (the binary beside this test's build directory).

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use openssl::sha::Sha256;

const SEED: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 1);
const ROUTER_PORT: u16 = 18443;
const METRICS_PORT: u16 = 15001;
const GENERATIONS: usize = 1000;
const TUNNEL_SHOOTS: usize = 10;
const TUNNELS_PER_SHOOT: usize = 10;
const POLL_MS: u64 = 20;
/// The whole churn must end within this.
const CHURN_BOUND: Duration = Duration::from_secs(150);
/// Bound on waiting for the router to report a generation.
const PICKUP_BOUND: Duration = Duration::from_secs(5);
/// The line of the bad CIDR in a broken `shoot--p--a.toml`.
const BROKEN_LINE: usize = 5;

fn tshoot(i: usize) -> String {
    format!("shoot--t--{i}")
}

fn vpn(ns: &str) -> String {
    format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local")
}

/// What a shoot's policy in force says about the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200 and the shoot's own greeting.
    Allowed,
    /// 403.
    Denied,
    /// 400: no route.
    Absent,
}

/// One generation of the directory: per shoot, its file (if present) and whether it is
/// broken.
struct Generation {
    /// (shoot, allow the client, broken)
    files: Vec<(String, bool, bool)>,
    /// `seed.toml` broken (on line 1): the last good seed settings stay.
    broken_seed: bool,
}

fn generation(g: usize) -> Generation {
    let mut files = Vec::new();
    for i in 0..TUNNEL_SHOOTS {
        let present = g == 0 || i < 5 || (g / 7 + i) % 3 != 0;
        let present = present && !(g == GENERATIONS && i == TUNNEL_SHOOTS - 1);
        if present {
            files.push((tshoot(i), g == 0 || (g / 3 + i) % 2 == 0, false));
        }
    }
    files.push(("shoot--p--a".into(), g % 2 == 0, g % 97 == 50));
    files.push(("shoot--p--ab".into(), g % 2 == 1, false));
    Generation {
        files,
        broken_seed: g % 131 == 65,
    }
}

/// The model of the router: each shoot's answer in force (a broken file keeps the last).
#[derive(Default, Clone)]
struct Model {
    answers: HashMap<String, Answer>,
}

impl Model {
    fn apply(&mut self, gen: &Generation) {
        let mut next = HashMap::new();
        for (shoot, allow, broken) in &gen.files {
            let answer = if *broken {
                self.answers.get(shoot).copied().unwrap_or(Answer::Absent)
            } else if *allow {
                Answer::Allowed
            } else {
                Answer::Denied
            };
            next.insert(shoot.clone(), answer);
        }
        self.answers = next;
    }

    fn answer(&self, shoot: &str) -> Answer {
        self.answers.get(shoot).copied().unwrap_or(Answer::Absent)
    }
}

fn shoot_file(shoot: &str, port: u16, allow: bool, broken: bool) -> String {
    let from = if broken {
        "10.80.0.0/33"
    } else if allow {
        "10.80.0.2/32" // the client
    } else {
        "192.0.2.1/32"
    };
    // The CIDR is on line BROKEN_LINE.
    format!(
        "# {shoot}\n[[route]]\nvalue = \"{}\"\nupstream = \"{SEED}:{port}\"\nallow = [\"{from}\"]\n",
        vpn(shoot)
    )
}

fn seed_file() -> String {
    format!(
        "metrics_listen = \"{SEED}:{METRICS_PORT}\"\n\n[watch]\npoll_ms = {POLL_MS}\n\n\
         [[listener]]\naddress = \"{SEED}:{ROUTER_PORT}\"\n\
         headers = [\"X-Gardener-Destination\"]\n"
    )
}

/// A ConfigMap volume written as the kubelet writes it.
struct Volume {
    dir: PathBuf,
    version: usize,
    names: Vec<String>,
}

impl Volume {
    fn write(&mut self, files: &[(String, String)]) {
        let d = &self.dir;
        self.version += 1;
        let version = format!("..2026_11_26_03_00_00.{:06}", self.version);
        std::fs::create_dir(d.join(&version)).expect("version dir");
        for (name, text) in files {
            std::fs::write(d.join(&version).join(name), text).expect("write");
        }
        symlink(&version, d.join("..data_tmp")).expect("symlink");
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).expect("rename ..data");
        let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        for name in &names {
            if !self.names.contains(name) {
                symlink(Path::new("..data").join(name), d.join(name)).expect("link");
            }
        }
        for old in &self.names {
            if !names.contains(old) {
                std::fs::remove_file(d.join(old)).expect("unlink");
            }
        }
        self.names = names;
        if self.version > 1 {
            let old = format!("..2026_11_26_03_00_00.{:06}", self.version - 1);
            std::fs::remove_dir_all(d.join(old)).expect("remove old version");
        }
    }

    fn write_generation(&mut self, gen: &Generation, ports: &HashMap<String, u16>) {
        let seed = if gen.broken_seed {
            format!("max_connections = \"many\"\n{}", seed_file())
        } else {
            seed_file()
        };
        let mut files = vec![("seed.toml".to_owned(), seed)];
        for (shoot, allow, broken) in &gen.files {
            files.push((
                format!("{shoot}.toml"),
                shoot_file(shoot, ports[shoot], *allow, *broken),
            ));
        }
        self.write(&files);
    }
}

/// An upstream in SEED for `shoot`: greets every connection with `<shoot>\n`, then echoes.
fn upstream(seed: &Netns, shoot: &str) -> u16 {
    let listener = seed
        .run_in(|| TcpListener::bind((SEED, 0)))
        .expect("run_in")
        .expect("bind upstream");
    let port = listener.local_addr().expect("addr").port();
    conformance::echo::serve(listener, format!("{shoot}\n").into_bytes(), || {});
    port
}

fn router_addr() -> SocketAddr {
    SocketAddr::from((SEED, ROUTER_PORT))
}

/// Opens a CONNECT for `shoot`: the status, and the stream after the head.
fn connect(shoot: &str) -> (u16, TcpStream, Vec<u8>) {
    let mut s =
        TcpStream::connect_timeout(&router_addr(), Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    let head = format!(
        "CONNECT {SEED}:1194 HTTP/1.1\r\nHost: {SEED}\r\nX-Gardener-Destination: {}\r\n\r\n",
        vpn(shoot)
    );
    s.write_all(head.as_bytes()).expect("send head");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let end = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = s.read(&mut buf).expect("read head");
        assert!(n > 0, "closed before an answer for {shoot}");
        got.extend_from_slice(&buf[..n]);
    };
    let code = std::str::from_utf8(&got[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .expect("status");
    (code, s, got[end..].to_vec())
}

/// What the test did, per shoot: tunnels opened (200), 403s, 400s, bytes each way.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    tunnels: u64,
    denied: u64,
    no_route: u64,
    to_upstream: u64,
    to_client: u64,
}

/// One probe: the answer, checked against `allowed` answers; the tally updated.
fn probe(shoot: &str, allowed: &[Answer], tally: &mut HashMap<String, Tally>) -> Answer {
    let (code, mut s, rest) = connect(shoot);
    let answer = match code {
        200 => {
            let want = format!("{shoot}\n");
            let mut got = rest;
            let mut buf = [0u8; 256];
            while got.len() < want.len() {
                let n = s.read(&mut buf).expect("read greeting");
                assert!(n > 0, "{shoot}: tunnel closed before the greeting");
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(
                String::from_utf8_lossy(&got),
                want,
                "a CONNECT for {shoot} reached another shoot's upstream"
            );
            let t = tally.entry(shoot.to_owned()).or_default();
            t.tunnels += 1;
            t.to_client += want.len() as u64;
            Answer::Allowed
        }
        403 => {
            tally.entry(shoot.to_owned()).or_default().denied += 1;
            Answer::Denied
        }
        400 => {
            tally.entry(shoot.to_owned()).or_default().no_route += 1;
            Answer::Absent
        }
        other => panic!("{shoot}: unexpected status {other}"),
    };
    assert!(
        allowed.contains(&answer),
        "{shoot}: answered {answer:?}, the policy in force allows only {allowed:?}"
    );
    answer
}

/// Fetches `/metrics`: each sample line's series → value.
fn metrics() -> HashMap<String, u64> {
    try_metrics().expect("GET /metrics")
}

fn try_metrics() -> Option<HashMap<String, u64>> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((SEED, METRICS_PORT)),
        Duration::from_secs(5),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
        return None;
    }
    let map = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect();
    Some(map)
}

fn reloads() -> u64 {
    metrics()
        .get("vpn_router_config_reloads_total")
        .copied()
        .unwrap_or(0)
}

/// One long-lived tunnel: sends deterministic chunks and checks the echo, until `stop`.
struct TunnelResult {
    shoot: String,
    sent: u64,
    sent_digest: [u8; 32],
    echoed_digest: [u8; 32],
    error: Option<String>,
}

fn run_tunnel(shoot: String, seed: u64, stop: &AtomicBool, opened: &AtomicU64) -> TunnelResult {
    let (code, mut s, mut rest) = connect(&shoot);
    assert_eq!(code, 200, "tunnel for {shoot} not opened");
    let greeting = format!("{shoot}\n");
    let mut buf = vec![0u8; 8192];
    while rest.len() < greeting.len() {
        let n = s.read(&mut buf).expect("greeting");
        assert!(n > 0);
        rest.extend_from_slice(&buf[..n]);
    }
    assert_eq!(rest, greeting.as_bytes());
    opened.fetch_add(1, Ordering::SeqCst);
    let mut state = seed | 1;
    let mut sent_hash = Sha256::new();
    let mut echo_hash = Sha256::new();
    let mut sent = 0u64;
    let mut error = None;
    let mut chunk = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        for b in chunk.iter_mut() {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        if let Err(e) = s.write_all(&chunk) {
            error = Some(format!("write: {e}"));
            break;
        }
        sent_hash.update(&chunk);
        sent += chunk.len() as u64;
        let mut got = 0;
        while got < chunk.len() {
            match s.read(&mut buf[..chunk.len() - got]) {
                Ok(0) => {
                    error = Some("closed by the router".into());
                    break;
                }
                Ok(n) => {
                    echo_hash.update(&buf[..n]);
                    got += n;
                }
                Err(e) => {
                    error = Some(format!("read: {e}"));
                    break;
                }
            }
        }
        if error.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    // End: half-close, the echo ends, nothing more may arrive.
    if error.is_none() {
        let _ = s.shutdown(Shutdown::Write);
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => error = Some(format!("{n} bytes after the end")),
            Err(e) => error = Some(format!("read at the end: {e}")),
        }
    }
    TunnelResult {
        shoot,
        sent,
        sent_digest: sent_hash.finish(),
        echoed_digest: echo_hash.finish(),
        error,
    }
}

fn router_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("vpn-router");
    assert!(
        bin.exists(),
        "{} missing: cargo build -p vpn-router first",
        bin.display()
    );
    bin
}

#[test]
fn config_dir_churn_never_touches_tunnels_and_keeps_shoots_apart() {
    require_lab(&[]);
    let bin = router_binary();
    let seed = Netns::with_prefix("rdir-").expect("netns seed");
    let shoot = Netns::with_prefix("rdir-").expect("netns shoot");
    Netns::veth_pair(&shoot, "rdir-c", &seed, "rdir-s").expect("veth");
    seed.run(["ip", "addr", "add", "10.80.0.1/24", "dev", "rdir-s"])
        .expect("addr");
    shoot
        .run(["ip", "addr", "add", "10.80.0.2/24", "dev", "rdir-c"])
        .expect("addr");

    let mut shoots: Vec<String> = (0..TUNNEL_SHOOTS).map(tshoot).collect();
    shoots.push("shoot--p--a".into());
    shoots.push("shoot--p--ab".into());
    let ports: HashMap<String, u16> = shoots
        .iter()
        .map(|s| (s.clone(), upstream(&seed, s)))
        .collect();

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("config");
    std::fs::create_dir(&dir).expect("config dir");
    let mut volume = Volume {
        dir: dir.clone(),
        version: 0,
        names: Vec::new(),
    };
    let mut model = Model::default();
    let gen0 = generation(0);
    model.apply(&gen0);
    volume.write_generation(&gen0, &ports);
    let log = tmp.path().join("router.log");
    let pid = seed
        .spawn(
            seed.command(bin.to_str().expect("path"))
                .arg("--config-dir")
                .arg(&dir)
                .args(["--log", "info", "--log-format", "openvpn"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log")),
        )
        .expect("spawn vpn-router");

    let outcome = shoot.run_in(|| {
        // The router is up when /metrics answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&router_addr(), Duration::from_millis(200)).is_err()
            || try_metrics().is_none()
        {
            assert!(Instant::now() < deadline, "vpn-router did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let stop = AtomicBool::new(false);
        let opened = AtomicU64::new(0);
        let results = Mutex::new(Vec::new());
        let mut tally: HashMap<String, Tally> = HashMap::new();
        let mut checked_broken = 0;
        let cpu_before = Mutex::new(0.0);
        let mut checked_broken_seed = 0;
        let mut pickup_poll = Vec::new();
        // For the background prober: the model of each generation, the last written and the
        // last the router reported.
        let history = Mutex::new(vec![model.clone()]);
        let written = AtomicUsize::new(0);
        let picked = AtomicUsize::new(0);
        let background = Mutex::new((HashMap::<String, Tally>::new(), Vec::<String>::new(), 0u64));
        let mut pickup_hup = Vec::new();
        let started = Instant::now();
        std::thread::scope(|scope| {
            for i in 0..TUNNEL_SHOOTS * TUNNELS_PER_SHOOT {
                let (stop, opened, results) = (&stop, &opened, &results);
                scope.spawn(move || {
                    let r =
                        run_tunnel(tshoot(i % TUNNEL_SHOOTS), i as u64 * 7919 + 1, stop, opened);
                    results.lock().expect("results").push(r);
                });
            }
            // Stops the tunnels however the driver ends, so the scope can end.
            let guard = StopOnDrop(&stop);
            let deadline = Instant::now() + Duration::from_secs(20);
            while opened.load(Ordering::SeqCst) < (TUNNEL_SHOOTS * TUNNELS_PER_SHOOT) as u64 {
                assert!(Instant::now() < deadline, "tunnels did not open");
                std::thread::sleep(Duration::from_millis(20));
            }
            // Probes all through the churn: each answer must be the policy of a generation
            // from the last one reported before the request to the last written after it.
            scope.spawn(|| {
                let mut targets: Vec<String> = (0..TUNNEL_SHOOTS).map(tshoot).collect();
                targets.push("shoot--p--a".into());
                targets.push("shoot--p--ab".into());
                let all = [Answer::Allowed, Answer::Denied, Answer::Absent];
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let target = &targets[n % targets.len()];
                    n += 1;
                    let lo = picked.load(Ordering::SeqCst);
                    let mut bg = background.lock().expect("background");
                    let answer = probe(target, &all, &mut bg.0);
                    let hi = written.load(Ordering::SeqCst);
                    let ok: Vec<Answer> = {
                        let history = history.lock().expect("history");
                        (lo..=hi).map(|g| history[g].answer(target)).collect()
                    };
                    if !ok.contains(&answer) {
                        bg.1.push(format!(
                            "{target}: {answer:?}, generations {lo}..={hi} allow only {ok:?}"
                        ));
                    }
                    bg.2 += 1;
                    drop(bg);
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let churn = Instant::now();
            *cpu_before.lock().expect("cpu") = cpu_seconds(pid);
            for g in 1..=GENERATIONS {
                assert!(
                    churn.elapsed() < CHURN_BOUND,
                    "churn took longer than {CHURN_BOUND:?} (at generation {g})"
                );
                let gen = generation(g);
                let previous = model.clone();
                model.apply(&gen);
                history.lock().expect("history").push(model.clone());
                // Announced before the swap: the router may take it at once.
                written.store(g, Ordering::SeqCst);
                volume.write_generation(&gen, &ports);
                let swapped = Instant::now();
                if g % 10 == 0 {
                    let ok = Command::new("kill")
                        .args(["-HUP", &pid.to_string()])
                        .status()
                        .expect("kill");
                    assert!(ok.success());
                }
                // Right after the swap: this generation's policy or the previous one.
                for s in ["shoot--p--a", "shoot--p--ab"] {
                    probe(s, &[previous.answer(s), model.answer(s)], &mut tally);
                }
                let deadline = Instant::now() + PICKUP_BOUND;
                while reloads() < g as u64 {
                    assert!(
                        Instant::now() < deadline,
                        "generation {g} not picked up within {PICKUP_BOUND:?}"
                    );
                    std::thread::sleep(Duration::from_millis(POLL_MS / 2));
                }
                let pickup = swapped.elapsed();
                if g % 10 == 0 {
                    pickup_hup.push(pickup);
                } else {
                    pickup_poll.push(pickup);
                }
                assert_eq!(reloads(), g as u64, "one swap, one reload");
                picked.store(g, Ordering::SeqCst);
                // Picked up: exactly this generation's policy.
                for s in ["shoot--p--a", "shoot--p--ab"] {
                    probe(s, &[model.answer(s)], &mut tally);
                }
                for s in [
                    tshoot(g % TUNNEL_SHOOTS),
                    tshoot((g * 3 + 1) % TUNNEL_SHOOTS),
                ] {
                    probe(&s, &[model.answer(&s)], &mut tally);
                }
                if gen.files.iter().any(|(_, _, broken)| *broken) {
                    let m = metrics();
                    assert_eq!(
                        m.get("vpn_router_config_file_ok{file=\"shoot--p--a.toml\"}"),
                        Some(&0),
                        "the broken file is not reported in /metrics"
                    );
                    let text = std::fs::read_to_string(&log).expect("log");
                    let want = format!("shoot--p--a.toml, line {BROKEN_LINE}");
                    assert_eq!(
                        text.matches(&want).count(),
                        checked_broken + 1,
                        "the broken file is not logged by name and line"
                    );
                    checked_broken += 1;
                }
                if gen.broken_seed {
                    let m = metrics();
                    assert_eq!(
                        m.get("vpn_router_config_file_ok{file=\"seed.toml\"}"),
                        Some(&0),
                        "the broken seed file is not reported in /metrics"
                    );
                    let text = std::fs::read_to_string(&log).expect("log");
                    assert_eq!(
                        text.matches("seed.toml, line 1").count(),
                        checked_broken_seed + 1,
                        "the broken seed file is not logged by name and line"
                    );
                    checked_broken_seed += 1;
                }
            }
            drop(guard);
        });
        let churn_time = started.elapsed();
        let cpu = cpu_seconds(pid) - cpu_before.into_inner().expect("cpu");
        eprintln!(
            "router_dir: the router used {cpu:.1} s of CPU over the churn (1000 reloads, the \
             tunnels' traffic and every probe), resident {} KiB at its end",
            rss_kib(pid)
        );
        eprintln!(
            "router_dir: swap to reported, {POLL_MS} ms poll: {}; with SIGHUP at once: {} \
             (these include the probes sent right after each swap)",
            spread(&mut pickup_poll),
            spread(&mut pickup_hup)
        );
        let (bg_tally, violations, bg_probes) = background.into_inner().expect("background");
        assert!(
            violations.is_empty(),
            "{} background probes answered by no policy in force: {:?}",
            violations.len(),
            &violations[..violations.len().min(5)]
        );
        eprintln!("router_dir: {bg_probes} background probes during the churn, each answered by its shoot's policy in force");
        for (shoot, t) in bg_tally {
            let all = tally.entry(shoot).or_default();
            all.tunnels += t.tunnels;
            all.denied += t.denied;
            all.no_route += t.no_route;
            all.to_upstream += t.to_upstream;
            all.to_client += t.to_client;
        }
        (
            results.into_inner().expect("results"),
            tally,
            (checked_broken, checked_broken_seed),
            churn_time,
            model,
        )
    });
    let (results, mut tally, (broken, broken_seed), churn_time, model) =
        outcome.expect("run_in shoot");

    // Every tunnel survived every reload with its bytes intact.
    assert_eq!(results.len(), TUNNEL_SHOOTS * TUNNELS_PER_SHOOT);
    let mut total = 0;
    for r in &results {
        assert!(r.error.is_none(), "tunnel for {}: {:?}", r.shoot, r.error);
        assert_eq!(
            r.sent_digest, r.echoed_digest,
            "tunnel for {}: bytes changed",
            r.shoot
        );
        assert!(r.sent > 0);
        let t = tally.entry(r.shoot.clone()).or_default();
        t.tunnels += 1;
        t.to_upstream += r.sent;
        t.to_client += r.sent + format!("{}\n", r.shoot).len() as u64;
        total += r.sent;
    }

    // The router counted what the test did, per shoot.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = shoot.run_in(metrics).expect("run_in");
        if m.get("vpn_router_tunnels_active") == Some(&0) {
            break m;
        }
        assert!(Instant::now() < deadline, "tunnels still active");
        std::thread::sleep(Duration::from_millis(50));
    };
    let series = |name: &str, shoot: &str, extra: &str| {
        let key = format!("{name}{{shoot=\"{shoot}\",flow=\"vpn\"{extra}}}");
        m.get(&key).copied()
    };
    assert_eq!(model.answer(&tshoot(TUNNEL_SHOOTS - 1)), Answer::Absent);
    for s in &shoots {
        let t = tally.get(s).copied().unwrap_or_default();
        if model.answer(s) == Answer::Absent {
            // Its file is gone and its last tunnel closed: no series left.
            assert_eq!(series("vpn_router_shoot_tunnels_total", s, ""), None, "{s}");
            continue;
        }
        assert_eq!(
            series("vpn_router_shoot_tunnels_total", s, ""),
            Some(t.tunnels),
            "{s}"
        );
        assert_eq!(
            series("vpn_router_shoot_tunnels_active", s, ""),
            Some(0),
            "{s}"
        );
        assert_eq!(
            series("vpn_router_shoot_refused_total", s, ",reason=\"denied\""),
            Some(t.denied),
            "{s}"
        );
        assert_eq!(
            series("vpn_router_shoot_refused_total", s, ",reason=\"no_route\""),
            Some(t.no_route),
            "{s}"
        );
        assert_eq!(
            series(
                "vpn_router_shoot_tunnel_bytes_total",
                s,
                ",direction=\"to_upstream\""
            ),
            Some(t.to_upstream),
            "{s}"
        );
        assert_eq!(
            series(
                "vpn_router_shoot_tunnel_bytes_total",
                s,
                ",direction=\"to_client\""
            ),
            Some(t.to_client),
            "{s}"
        );
    }
    assert_eq!(
        m.get("vpn_router_config_errors_total{file=\"shoot--p--a.toml\"}"),
        Some(&(broken as u64))
    );
    assert_eq!(
        m.get("vpn_router_config_errors_total{file=\"seed.toml\"}"),
        Some(&(broken_seed as u64))
    );
    assert_eq!(
        m.get("vpn_router_config_file_ok{file=\"seed.toml\"}"),
        Some(&1)
    );
    assert_eq!(
        m.get("vpn_router_config_reloads_total"),
        Some(&(GENERATIONS as u64))
    );
    assert!(seed.try_wait(pid).is_none(), "the router exited");
    let probes: u64 = tally
        .values()
        .map(|t| t.tunnels + t.denied + t.no_route)
        .sum();
    eprintln!(
        "router_dir: {GENERATIONS} reloads in {churn_time:.1?}, {} tunnels carried {total} bytes \
         each way, {probes} CONNECTs answered (probes and tunnels), {broken} broken shoot and {broken_seed} \
         broken seed versions kept out",
        results.len(),
        churn_time = churn_time,
    );
}

/// User and system CPU seconds of process `pid` so far (`/proc/PID/stat`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which ends with the last ')'): utime and stime are the
    // 14th and 15th of the line.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / rustix::param::clock_ticks_per_second() as f64
}

/// Resident memory of process `pid` (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmRSS")
}

/// `p50 / p99 / max` of `times`.
fn spread(times: &mut [Duration]) -> String {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.1?} / p99 {:.1?} / max {:.1?} ({} swaps)",
        at(0.5),
        at(0.99),
        at(1.0),
        times.len()
    )
}

/// Stops the tunnels also when the churn fails, so the scope can end.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
