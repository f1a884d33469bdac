//! The lab shared by the `faults_*` tests (issue 19's fault catalogue):
//!
//! ```text
//!  SHOOT 10.81.0.2/24 ──── veth ──── SEED 10.81.0.1/24
//!  clients: one runtime, N tasks,      vpn-server (process or thread) on :1194,
//!  tun0..tunN-1 (pushed 192.168.123.x)  tun 192.168.123.1/24
//! ```
//!
//! * [`Pair`] - SEED and SHOOT joined by a veth pair; SHOOT's reverse-path filter off, so N
//!   tun devices with addresses in one /24 can each carry their own echo replies.
//! * [`Fleet`] - N of our clients (`vpn_client::run`) as tasks of one two-worker runtime whose
//!   threads live in SHOOT, each with its own tun device; cancelled and awaited on drop.
//! * [`ping_all`] - which of the tun devices carry an ICMP echo to the server's tun address
//!   and back (`ping -I DEV`), waited for with a deadline.
//! * [`Process`] - one of our binaries as a process in a lab namespace, with its log, its
//!   signals and its exit status.
//! * [`scrape`] - `GET /metrics` of an admin endpoint inside a namespace.
//! * [`issue_client_cert`] - a client certificate from the fixture's CA with a chosen
//!   validity (the `openssl` crate; the fixture's CLI cannot set seconds).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier,
};
use openssl::x509::{X509Builder, X509NameBuilder, X509};
use rustix::process::{kill_process, Pid, Signal};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use vpn_client::{CancellationToken, RunError, Stopped};

pub const SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 81, 0, 1);
pub const SHOOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 81, 0, 2);
pub const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);
pub const PORT: u16 = 1194;

/// Logs of the in-process parts (`RUST_LOG`, default warn) in the test output.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// Everything the in-process parts log, for tests that assert on log lines.
static CAPTURED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct Captured;

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Held by a test whose assertions read [`captured_logs`]: one such test at a time per test
/// binary, so no other test's lines land in its buffer.
static LOG_OWNER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The captured logs belong to the test holding this (see [`capture_logs`]).
pub struct LogScope {
    _owner: std::sync::MutexGuard<'static, ()>,
}

/// Routes the logs of the in-process parts (`RUST_LOG`, default info) into a buffer that
/// [`captured_logs`] returns. Waits until no other test of this binary holds the buffer,
/// empties it and hands it to the caller until the returned scope drops. In a binary that
/// uses it, every test must call it first (it installs the process's one subscriber).
pub fn capture_logs() -> LogScope {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(|| Captured)
        .with_ansi(false)
        .try_init();
    let owner = LOG_OWNER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    CAPTURED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    LogScope { _owner: owner }
}

/// What the in-process parts logged so far (see [`capture_logs`]).
pub fn captured_logs() -> String {
    String::from_utf8_lossy(
        &CAPTURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

/// The `vpn-server --config` text for the fixture on SEED's veth address, plus `extra`
/// directives. Every client of a fleet presents the fixture's one client certificate, hence
/// `duplicate-cn`.
pub fn server_process_config(pki: &TestPki, extra: &[&str]) -> String {
    let mut lines = vec![
        "proto tcp-server".to_owned(),
        format!("local {SEED_ADDR}"),
        format!("port {PORT}"),
        "dev tun".to_owned(),
        "topology subnet".to_owned(),
        "server 192.168.123.0 255.255.255.0".to_owned(),
        "keepalive 10 60".to_owned(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.server_cert().display()),
        format!("key {}", pki.server_key().display()),
        "dh none".to_owned(),
        format!("tls-auth {} 0", pki.ta_key().display()),
        "auth SHA256".to_owned(),
        "duplicate-cn".to_owned(),
    ];
    lines.extend(extra.iter().map(|l| (*l).to_owned()));
    lines.join("\n") + "\n"
}

/// SEED and SHOOT joined by a veth pair.
pub struct Pair {
    pub seed: Netns,
    pub shoot: Netns,
}

impl Pair {
    pub fn new() -> Pair {
        let seed = Netns::new().expect("netns seed");
        let shoot = Netns::new().expect("netns shoot");
        Netns::veth_pair(&shoot, "vpnt-fshoot", &seed, "vpnt-fseed").expect("veth");
        seed.run(["ip", "addr", "add", "10.81.0.1/24", "dev", "vpnt-fseed"])
            .expect("seed addr");
        shoot
            .run(["ip", "addr", "add", "10.81.0.2/24", "dev", "vpnt-fshoot"])
            .expect("shoot addr");
        allow_asymmetric_replies(&shoot);
        Pair { seed, shoot }
    }
}

/// With several tun devices in one /24, the route back to the server's tun address leads
/// through the first of them; a strict reverse-path filter would drop the replies arriving on
/// the others.
pub fn allow_asymmetric_replies(ns: &Netns) {
    for key in [
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ] {
        ns.run(["sysctl", "-qw", &format!("{key}=0")])
            .expect("sysctl rp_filter");
    }
}

/// A multi-thread runtime (two workers) whose threads live in `ns`: tasks spawned on it open
/// their sockets, tun devices and netlink sockets there.
pub fn ns_runtime(ns: &Netns) -> Runtime {
    ns.run_in(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
    .expect("run_in")
}

/// N of our clients in one namespace; see the module docs.
pub struct Fleet {
    rt: Option<Runtime>,
    token: CancellationToken,
    /// `None` once stopped alone ([`Fleet::stop_one`]).
    handles: Vec<Option<JoinHandle<Result<Stopped, RunError>>>>,
    tokens: Vec<CancellationToken>,
    /// The tun device of client `i`.
    pub devs: Vec<String>,
}

impl Fleet {
    /// Starts `n` clients in `ns`; client `i` runs with `settings(i)`, its tun device named
    /// `tun{i}`.
    pub fn start(ns: &Netns, n: usize, settings: impl Fn(usize) -> vpn_client::Settings) -> Fleet {
        let rt = ns_runtime(ns);
        let token = CancellationToken::new();
        let mut handles = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut devs = Vec::with_capacity(n);
        for i in 0..n {
            let mut s = settings(i);
            s.tun.name = format!("tun{i}");
            devs.push(s.tun.name.clone());
            let child = token.child_token();
            tokens.push(child.clone());
            handles.push(Some(rt.spawn(vpn_client::run(s, child))));
        }
        Fleet {
            rt: Some(rt),
            token,
            handles,
            tokens,
            devs,
        }
    }

    /// Stops client `i` (its tun device goes with it); what it returned.
    pub fn stop_one(&mut self, i: usize) -> Result<Stopped, String> {
        self.tokens[i].cancel();
        let rt = self.rt.as_ref().expect("running");
        let handle = self.handles[i].take().expect("stopped once");
        rt.block_on(async {
            match tokio::time::timeout(Duration::from_secs(15), handle).await {
                Ok(Ok(Ok(stopped))) => Ok(stopped),
                Ok(Ok(Err(e))) => Err(format!("{e:?}")),
                Ok(Err(e)) => Err(format!("task: {e}")),
                Err(_) => Err("did not stop within 15 s".into()),
            }
        })
    }

    /// How many clients have ended by themselves (a healthy fleet: none).
    pub fn ended(&self) -> usize {
        self.handles
            .iter()
            .flatten()
            .filter(|h| h.is_finished())
            .count()
    }

    /// Cancels every client and waits for them; what each returned.
    pub fn stop(mut self) -> Vec<Result<Stopped, String>> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Vec<Result<Stopped, String>> {
        self.token.cancel();
        let Some(rt) = self.rt.take() else {
            return Vec::new();
        };
        let handles = std::mem::take(&mut self.handles);
        let results = rt.block_on(async {
            let mut out = Vec::new();
            for h in handles.into_iter().flatten() {
                out.push(
                    match tokio::time::timeout(Duration::from_secs(15), h).await {
                        Ok(Ok(Ok(stopped))) => Ok(stopped),
                        Ok(Ok(Err(e))) => Err(format!("{e:?}")),
                        Ok(Err(e)) => Err(format!("task: {e}")),
                        Err(_) => Err("did not stop within 15 s".into()),
                    },
                );
            }
            out
        });
        rt.shutdown_timeout(Duration::from_secs(5));
        results
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// One ICMP echo from `dev` in `ns` to `dst` (payload pattern `pattern`), answered within 2 s.
pub fn ping(ns: &Netns, dev: &str, dst: Ipv4Addr, pattern: u8) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns.name(), "ping", "-n", "-q", "-c", "1"])
        .args(["-W", "2", "-I", dev, "-p", &format!("{pattern:02x}")])
        .arg(dst.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Pings `dst` from every device in `devs` until each has had one echo answered, or
/// `timeout` passes. Returns, per device, when its first answered echo was sent (from the
/// start of the call); devices never answered are missing.
pub fn ping_all(
    ns: &Netns,
    devs: &[String],
    dst: Ipv4Addr,
    timeout: Duration,
) -> BTreeMap<String, Duration> {
    /// Pings in flight at once.
    const AT_ONCE: usize = 25;
    let start = Instant::now();
    let mut up = BTreeMap::new();
    let mut round: u8 = 0;
    while up.len() < devs.len() && start.elapsed() < timeout {
        round = round.wrapping_add(1);
        let pending: Vec<&String> = devs.iter().filter(|d| !up.contains_key(*d)).collect();
        for chunk in pending.chunks(AT_ONCE) {
            let sent = start.elapsed();
            let answered: Vec<&String> = std::thread::scope(|scope| {
                let probes: Vec<_> = chunk
                    .iter()
                    .map(|dev| scope.spawn(move || ping(ns, dev, dst, round).then_some(*dev)))
                    .collect();
                probes
                    .into_iter()
                    .filter_map(|p| p.join().expect("ping thread"))
                    .collect()
            });
            for dev in answered {
                up.insert(dev.clone(), sent);
            }
        }
        if up.len() < devs.len() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    up
}

/// The latest of the times [`ping_all`] returned.
pub fn last(up: &BTreeMap<String, Duration>) -> Duration {
    up.values().copied().max().unwrap_or_default()
}

/// One of our binaries as a process in a lab namespace; stopped when dropped.
pub struct Process<'ns> {
    ns: &'ns Netns,
    pub pid: u32,
    pub log: PathBuf,
    what: String,
}

impl<'ns> Process<'ns> {
    /// Starts `program args...` in `ns` with stdout and stderr into `log` (appended: a
    /// restarted process adds to the same file). `nofile`: run it under `prlimit
    /// --nofile=N:N` (the process is `prlimit`'s exec, so the PID is the binary's).
    pub fn start(
        ns: &'ns Netns,
        program: &Path,
        args: &[String],
        log: &Path,
        nofile: Option<u64>,
    ) -> Process<'ns> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = ns.command("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(program);
                c
            }
            None => ns.command(&program.to_string_lossy()),
        };
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        let pid = ns.spawn(&mut cmd).expect("spawn");
        Process {
            ns,
            pid,
            log: log.to_path_buf(),
            what: program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle` `count` times; panics with the log after `timeout`
    /// or if the process ends.
    pub fn wait_log_count(&self, needle: &str, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.log_text();
            if text.matches(needle).count() >= count {
                return;
            }
            if let Some(status) = self.ns.try_wait(self.pid) {
                panic!("{} ended ({status}) before {needle:?}:\n{text}", self.what);
            }
            assert!(
                Instant::now() < deadline,
                "{} did not log {needle:?} within {timeout:?}:\n{text}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.pid)
            .ok()
            .and_then(Pid::from_raw)
            .expect("pid");
        kill_process(pid, signal).expect("kill");
    }

    /// Waits for the process to exit (at most `timeout`) and returns its status.
    pub fn wait_exit(self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.ns.try_wait(self.pid) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}:\n{}",
                self.what,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process is still running.
    pub fn running(&self) -> bool {
        self.ns.try_wait(self.pid).is_none()
    }

    /// User plus system CPU time the process has used so far.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).expect("stat");
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        let rest = stat.rsplit_once(')').expect("stat format").1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        let hz = rustix::param::clock_ticks_per_second();
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// Open file descriptors of the process.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Process<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
    }
}

/// `GET /metrics` from `addr` inside `ns`.
pub fn scrape(ns: &Netns, addr: SocketAddr) -> String {
    ns.run_in(move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .expect("run_in")
    .unwrap_or_default()
}

/// The value of the series `name` (with its labels, as written) in a scrape.
pub fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Seconds since the epoch.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// Issues a client certificate for `cn` from `pki`'s CA, valid from `not_before` to
/// `not_after` (unix seconds), with the extensions of the fixture's own client certificate
/// and the subject and authority key identifiers.
/// Returns (certificate PEM, key PEM).
pub fn issue_client_cert(
    ca_cert: &Path,
    ca_key: &Path,
    cn: &str,
    not_before: i64,
    not_after: i64,
) -> (Vec<u8>, Vec<u8>) {
    let ca = X509::from_pem(&std::fs::read(ca_cert).expect("ca cert")).expect("ca pem");
    let ca_key =
        PKey::private_key_from_pem(&std::fs::read(ca_key).expect("ca key")).expect("ca key pem");
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("curve");
    let key = PKey::from_ec_key(EcKey::generate(&group).expect("ec key")).expect("pkey");
    let mut name = X509NameBuilder::new().expect("name");
    name.append_entry_by_nid(Nid::COMMONNAME, cn).expect("cn");
    let name = name.build();
    let mut b = X509Builder::new().expect("builder");
    b.set_version(2).expect("version");
    let mut serial = BigNum::new().expect("bn");
    serial
        .rand(64, MsbOption::MAYBE_ZERO, false)
        .expect("serial");
    b.set_serial_number(&serial.to_asn1_integer().expect("serial"))
        .expect("serial");
    b.set_subject_name(&name).expect("subject");
    b.set_issuer_name(ca.subject_name()).expect("issuer");
    b.set_pubkey(&key).expect("pubkey");
    b.set_not_before(&Asn1Time::from_unix(not_before).expect("time"))
        .expect("not before");
    b.set_not_after(&Asn1Time::from_unix(not_after).expect("time"))
        .expect("not after");
    b.append_extension(BasicConstraints::new().build().expect("bc"))
        .expect("bc");
    b.append_extension(
        KeyUsage::new()
            .critical()
            .digital_signature()
            .build()
            .expect("ku"),
    )
    .expect("ku");
    b.append_extension(ExtendedKeyUsage::new().client_auth().build().expect("eku"))
        .expect("eku");
    // As real issuers do: with two CAs of one name in a bundle, the key identifier is how a
    // verifier finds the right one.
    let ski = SubjectKeyIdentifier::new()
        .build(&b.x509v3_context(Some(&ca), None))
        .expect("ski");
    b.append_extension(ski).expect("ski");
    let aki = AuthorityKeyIdentifier::new()
        .keyid(true)
        .build(&b.x509v3_context(Some(&ca), None))
        .expect("aki");
    b.append_extension(aki).expect("aki");
    b.sign(&ca_key, MessageDigest::sha256()).expect("sign");
    (
        b.build().to_pem().expect("cert pem"),
        key.private_key_to_pem_pkcs8().expect("key pem"),
    )
}

/// The fixture's CA key.
pub fn ca_key(pki: &TestPki) -> PathBuf {
    pki.dir().join("ca.key")
}
