//! The benchmark's namespaces and processes.
//!
//! ```text
//!  SEED 10.250.0.1/24 (bench0) ───── veth ───── (bench1) 10.250.0.6/24 SHOOT
//!   VPN server on 10.250.0.1:1194                 VPN client (directly, or through the proxy)
//!   CONNECT proxy on 10.250.0.1:PORT              tun: 192.168.123.2/24
//!   tun: 192.168.123.1/24                         iperf3 -s, TCP echo server
//!   iperf3 -c / ping / echo client ──────────── through the tunnel ──────────► shoot
//! ```
//!
//! Every VPN side runs as its own process (`openvpn`, or our `vpn-server` / `vpn-client`
//! binaries) with the same OpenVPN config text, so CPU time and resident memory can be read per
//! process from `/proc`. Everything is stopped by the [`Netns`] guards, also on failure.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::LabError;

use crate::{BenchError, Cipher, Impl, ProxyKind};

/// The seed's address on the veth link (VPN server and proxy listen here).
pub const SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The shoot's address on the veth link.
pub const SHOOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 6);
/// The VPN port.
pub const VPN_PORT: u16 = 1194;
/// The client's tunnel address (the first address of the `server 192.168.123.0/24` pool).
pub const CLIENT_TUN_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 2);
/// iperf3's port in the shoot.
pub const IPERF_PORT: u16 = 5201;
/// The TCP echo server's port in the shoot (request/response latency).
pub const ECHO_PORT: u16 = 5202;
/// tinyproxy's port on the seed.
pub const TINYPROXY_PORT: u16 = 8888;
/// squid's port on the seed.
pub const SQUID_PORT: u16 = 3128;
/// Our ingress router's port on the seed (the legacy `Reversed-VPN` port of Gardener).
pub const ROUTER_PORT: u16 = 8132;
/// The routing header every client sends through the proxy (`http-proxy-option
/// CUSTOM-HEADER`), the same the demo uses; the router routes by it, squid and tinyproxy
/// ignore it.
pub use conformance::demo::REVERSED_VPN_HEADER;

/// How long a VPN server gets to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The two namespaces joined by a veth pair, and the PKI.
#[derive(Debug)]
pub struct BenchLab {
    /// The seed: VPN server, proxy, the load generators.
    pub seed: Netns,
    /// The shoot: VPN client, iperf3 server, echo server.
    pub shoot: Netns,
    /// Certificates and `ta.key` for every pair.
    pub pki: TestPki,
    /// Scratch space for configs and logs.
    pub dir: TempDir,
}

impl BenchLab {
    /// Creates the namespaces, the link and the PKI.
    pub fn new() -> Result<BenchLab, BenchError> {
        let seed = Netns::new()?;
        let shoot = Netns::new()?;
        Netns::veth_pair(&seed, "bench0", &shoot, "bench1")?;
        seed.run([
            "ip",
            "addr",
            "add",
            &format!("{SEED_ADDR}/24"),
            "dev",
            "bench0",
        ])?;
        shoot.run([
            "ip",
            "addr",
            "add",
            &format!("{SHOOT_ADDR}/24"),
            "dev",
            "bench1",
        ])?;
        let pki = TestPki::generate()?;
        let dir = tempfile::Builder::new()
            .prefix("vpnt-bench-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        Ok(BenchLab {
            seed,
            shoot,
            pki,
            dir,
        })
    }

    /// Starts the CONNECT proxy of `kind` on the seed; returns its port and PID. `ours` is the
    /// directory holding our release binaries (`vpn-router` for [`ProxyKind::Router`]).
    pub fn start_proxy(&self, kind: ProxyKind, ours: &Path) -> Result<(u16, u32), BenchError> {
        match kind {
            ProxyKind::Tinyproxy => {
                let pid = conformance::tinyproxy::start(
                    &self.seed,
                    self.dir.path(),
                    SEED_ADDR,
                    TINYPROXY_PORT,
                    "10.250.0.0/24",
                    VPN_PORT,
                )?;
                Ok((TINYPROXY_PORT, pid))
            }
            ProxyKind::Squid => Ok((SQUID_PORT, start_squid(&self.seed, self.dir.path())?)),
            ProxyKind::Router => Ok((
                ROUTER_PORT,
                start_router(&self.seed, self.dir.path(), ours)?,
            )),
        }
    }

    /// The server config for `cipher`.
    pub fn server_config(&self, cipher: Cipher) -> String {
        let p = &self.pki;
        let mut lines = vec![
            "proto tcp-server".to_owned(),
            format!("local {SEED_ADDR}"),
            format!("port {VPN_PORT}"),
            "dev tun".to_owned(),
            "topology subnet".to_owned(),
            "server 192.168.123.0 255.255.255.0".to_owned(),
            "keepalive 10 60".to_owned(),
            format!("ca {}", p.ca_cert().display()),
            format!("cert {}", p.server_cert().display()),
            format!("key {}", p.server_key().display()),
            "dh none".to_owned(),
            format!("tls-auth {} 0", p.ta_key().display()),
            // As vpn2's server config: `tcp-nodelay` (upstream sets TCP_NODELAY locally and
            // pushes it to the client) and the tun's queue length.
            "tcp-nodelay".to_owned(),
            "txqueuelen 1000".to_owned(),
        ];
        lines.extend(cipher.config_lines());
        lines.join("\n") + "\n"
    }

    /// The client config for `cipher`, through the proxy on `proxy_port` if given.
    pub fn client_config(&self, cipher: Cipher, proxy_port: Option<u16>) -> String {
        let p = &self.pki;
        let mut lines = vec![
            "client".to_owned(),
            "proto tcp-client".to_owned(),
            format!("remote {SEED_ADDR} {VPN_PORT}"),
            "dev tun".to_owned(),
            "nobind".to_owned(),
            format!("ca {}", p.ca_cert().display()),
            format!("cert {}", p.client_cert().display()),
            format!("key {}", p.client_key().display()),
            "remote-cert-tls server".to_owned(),
            format!("tls-auth {} 1", p.ta_key().display()),
        ];
        if let Some(port) = proxy_port {
            lines.push(format!("http-proxy {SEED_ADDR} {port}"));
            lines.push(format!(
                "http-proxy-option CUSTOM-HEADER {} {}",
                REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
            ));
        }
        lines.extend(cipher.config_lines());
        lines.join("\n") + "\n"
    }
}

/// A running VPN process (ours or upstream's), stopped when dropped.
#[derive(Debug)]
pub struct VpnProcess<'ns> {
    ns: &'ns Netns,
    pid: u32,
    log: PathBuf,
    /// Keeps the config and log until the process is gone.
    _dir: TempDir,
}

/// Which end of the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `vpn-server` / `openvpn` in server mode, on the seed.
    Server,
    /// `vpn-client` / `openvpn` in client mode, in the shoot.
    Client,
}

impl<'ns> VpnProcess<'ns> {
    /// Starts `imp`'s `side` in `ns` with `config`. `ours` is the directory holding our
    /// `vpn-server` and `vpn-client` binaries.
    pub fn start(
        ns: &'ns Netns,
        imp: Impl,
        side: Side,
        config: &str,
        ours: &Path,
    ) -> Result<VpnProcess<'ns>, BenchError> {
        VpnProcess::start_with(ns, imp, side, config, ours, &[])
    }

    /// [`VpnProcess::start`] with `extra` arguments after `--config FILE` (e.g. our server's
    /// `--sidecar` flags).
    pub fn start_with(
        ns: &'ns Netns,
        imp: Impl,
        side: Side,
        config: &str,
        ours: &Path,
        extra: &[String],
    ) -> Result<VpnProcess<'ns>, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-bench-vpn-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        let conf = dir.path().join("vpn.conf");
        std::fs::write(&conf, config).map_err(|source| LabError::io(&conf, source))?;
        let log = dir.path().join("vpn.log");
        let out = File::create(&log).map_err(|source| LabError::io(&log, source))?;
        let err = out
            .try_clone()
            .map_err(|source| LabError::io(&log, source))?;
        let mut cmd = match imp {
            Impl::Upstream => {
                let mut c = ns.command(&conformance::upstream::referee());
                c.arg("--config").arg(&conf).args(["--verb", "3"]);
                c
            }
            Impl::Ours => {
                let bin = match side {
                    Side::Server => ours.join("vpn-server"),
                    Side::Client => ours.join("vpn-client"),
                };
                let mut c = ns.command(&bin.to_string_lossy());
                c.arg("--config").arg(&conf).args(["--log", "info"]);
                c
            }
        };
        cmd.args(extra);
        cmd.current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let pid = ns.spawn(&mut cmd)?;
        Ok(VpnProcess {
            ns,
            pid,
            log,
            _dir: dir,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the server accepts TCP connections on the VPN port (by reading the log, so
    /// no probe connection disturbs it).
    pub fn wait_listening(&self) -> Result<(), BenchError> {
        self.wait_log(
            "listening for incoming tcp connection",
            "VPN server listening",
        )
    }

    /// Waits until the log contains `needle` (compared in lower case), at most
    /// [`LISTEN_TIMEOUT`]; `what` names the wait in the error.
    pub fn wait_log(&self, needle: &str, what: &str) -> Result<(), BenchError> {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        loop {
            let log = self.log();
            let lower = log.to_ascii_lowercase();
            if lower.contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.ns.try_wait(self.pid) {
                return Err(LabError::Exited {
                    what: "VPN server".into(),
                    status,
                    log,
                }
                .into());
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: what.into(),
                    waited: LISTEN_TIMEOUT,
                    log,
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process is still running.
    pub fn running(&self) -> bool {
        self.ns.try_wait(self.pid).is_none()
    }
}

impl Drop for VpnProcess<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
        // `BENCH_KEEP_LOGS=DIR` keeps every VPN process's log as DIR/PID.log.
        if let Some(dir) = std::env::var_os("BENCH_KEEP_LOGS") {
            let _ = std::fs::copy(&self.log, Path::new(&dir).join(format!("{}.log", self.pid)));
        }
    }
}

/// Starts our ingress router (`vpn-router`, the release binary in `ours`) on the seed
/// with a config that routes [`REVERSED_VPN_HEADER`] to the VPN server, and waits until it
/// listens. Its log is `DIR/router/router.log`.
fn start_router(ns: &Netns, dir: &Path, ours: &Path) -> Result<u32, BenchError> {
    let rd = dir.join("router");
    std::fs::create_dir_all(&rd).map_err(|source| LabError::io(&rd, source))?;
    let conf = rd.join("router.toml");
    let text = format!(
        "[[listener]]\naddress = \"{SEED_ADDR}:{ROUTER_PORT}\"\nheaders = [\"{}\"]\n\n\
         [[route]]\nvalue = \"{}\"\nupstream = \"{SEED_ADDR}:{VPN_PORT}\"\n",
        REVERSED_VPN_HEADER.0, REVERSED_VPN_HEADER.1
    );
    // `BENCH_ROUTER_BUFFER=BYTES` sets the router's `[relay] buffer_size` (else its default).
    let text = match std::env::var("BENCH_ROUTER_BUFFER") {
        Ok(size) => format!("[relay]\nbuffer_size = {size}\n\n{text}"),
        Err(_) => text,
    };
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let log = rd.join("router.log");
    let out = File::create(&log).map_err(|source| LabError::io(&log, source))?;
    let err = out
        .try_clone()
        .map_err(|source| LabError::io(&log, source))?;
    let bin = ours.join("vpn-router");
    let pid = ns.spawn(
        ns.command(&bin.to_string_lossy())
            .arg("--config")
            .arg(&conf)
            .args(["--log", "info"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err),
    )?;
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("router listening") {
            return Ok(pid);
        }
        if let Some(status) = ns.try_wait(pid) {
            return Err(LabError::Exited {
                what: "vpn-router".into(),
                status,
                log: text,
            }
            .into());
        }
        if Instant::now() >= deadline {
            ns.stop(pid);
            return Err(LabError::Timeout {
                what: "vpn-router listening".into(),
                waited: LISTEN_TIMEOUT,
                log: text,
            }
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts Debian's squid on the seed as a CONNECT proxy to the VPN port (no cache, no
/// access log) and waits until it listens.
fn start_squid(ns: &Netns, dir: &Path) -> Result<u32, BenchError> {
    let sq = dir.join("squid");
    std::fs::create_dir_all(&sq).map_err(|source| LabError::io(&sq, source))?;
    // squid drops to its own user; it must be able to write its logs here.
    let _ = std::process::Command::new("chmod")
        .arg("0777")
        .arg(&sq)
        .status();
    let conf = sq.join("squid.conf");
    let text = format!(
        "http_port {SEED_ADDR}:{SQUID_PORT}\n\
         acl vpn_port port {VPN_PORT}\n\
         acl CONNECT method CONNECT\n\
         http_access allow CONNECT vpn_port\n\
         http_access deny all\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         access_log none\n\
         cache_log {}/cache.log\n\
         pid_filename {}/squid.pid\n\
         coredump_dir {}\n\
         shutdown_lifetime 1 seconds\n\
         workers 1\n",
        sq.display(),
        sq.display(),
        sq.display()
    );
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let pid = ns.spawn(
        ns.command("squid")
            .arg("-N")
            .arg("-f")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if ns.run_in(|| std::net::TcpStream::connect((SEED_ADDR, SQUID_PORT)).is_ok())? {
            return Ok(pid);
        }
        if let Some(status) = ns.try_wait(pid) {
            return Err(LabError::Exited {
                what: "squid".into(),
                status,
                log: std::fs::read_to_string(sq.join("cache.log")).unwrap_or_default(),
            }
            .into());
        }
        if Instant::now() >= deadline {
            return Err(LabError::Timeout {
                what: "squid listening".into(),
                waited: Duration::from_secs(15),
                log: std::fs::read_to_string(sq.join("cache.log")).unwrap_or_default(),
            }
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
