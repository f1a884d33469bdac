//! The lab shared by the `router_*` tests:
//!
//! ```text
//!  SHOOT (clients)                               SEED (router, recording upstreams)
//!  10.79.0.2/24, 10.79.0.3/24  ──── veth ────    10.79.0.1/24
//!  fd79::2/64, fd79::3/64                         fd79::1/64
//! ```
//!
//! The router runs in-process (`vpn_router::Router`) on a runtime whose threads live
//! in SEED; each [`Upstream`] is a TCP listener in SEED that counts the connections it
//! accepts, greets each with its name and a newline, then echoes.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use tokio_util::sync::CancellationToken;
use vpn_router::Router;

pub const SEED: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
pub const SHOOT_A: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
pub const SHOOT_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 3);
/// How long a client waits for an answer or a close.
pub const WAIT: Duration = Duration::from_secs(5);

pub struct Lab {
    pub seed: Netns,
    pub shoot: Netns,
}

impl Lab {
    pub fn new(tools: &[&str]) -> Lab {
        require_lab(tools);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .with_ansi(false)
            .try_init();
        let seed = Netns::new().expect("netns seed");
        let shoot = Netns::new().expect("netns shoot");
        Netns::veth_pair(&shoot, "vpnt-rshoot", &seed, "vpnt-rseed").expect("veth");
        for (ns, dev, addrs) in [
            (&seed, "vpnt-rseed", &["10.79.0.1/24", "fd79::1/64"][..]),
            (
                &shoot,
                "vpnt-rshoot",
                &["10.79.0.2/24", "10.79.0.3/24", "fd79::2/64", "fd79::3/64"][..],
            ),
        ] {
            for addr in addrs {
                let mut argv = vec!["ip", "addr", "add", addr, "dev", dev];
                if addr.contains(':') {
                    argv.push("nodad");
                }
                ns.run(argv).expect("ip addr add");
            }
        }
        Lab { seed, shoot }
    }

    /// Starts the router in SEED from the TOML `config` (written to a file in `dir`).
    pub fn router(&self, dir: &tempfile::TempDir, config: &str) -> RouterGuard {
        let path = dir.path().join("router.toml");
        std::fs::write(&path, config).expect("write router config");
        self.start(path.clone(), || Router::bind(&path))
    }

    /// Starts the router in SEED on the configuration directory `dir` (`--config-dir`,
    /// polled every `[watch] poll_ms` of its `seed.toml`).
    pub fn router_dir(&self, dir: &Path) -> RouterGuard {
        self.start(dir.to_owned(), || Router::bind_dir(dir))
    }

    /// Starts the router `bind` makes, on a runtime whose threads live in SEED.
    fn start<F, B>(&self, path: PathBuf, bind: B) -> RouterGuard
    where
        B: FnOnce() -> F + Send,
        F: std::future::Future<Output = Result<Router, vpn_router::RouterError>>,
    {
        let token = CancellationToken::new();
        let (rt, addrs, counters) = self
            .seed
            .run_in(|| {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime");
                let router = rt.block_on(bind()).expect("router bind");
                let addrs = router.local_addrs();
                let counters = router.counters();
                let run = token.clone();
                // Also installs the process's SIGHUP handler before `bind` returns here.
                let hup = rt.block_on(async {
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                        .expect("SIGHUP handler")
                });
                rt.spawn(async move {
                    let _hup = hup;
                    router.run_with_sighup(run).await
                });
                (rt, addrs, counters)
            })
            .expect("run_in seed");
        RouterGuard {
            rt: Some(rt),
            token,
            addrs,
            path,
            counters,
        }
    }

    /// A recording upstream in SEED on `SEED:port` (port 0: any).
    pub fn upstream(&self, name: &str, port: u16) -> Upstream {
        let listener = self
            .seed
            .run_in(|| std::net::TcpListener::bind((SEED, port)))
            .expect("run_in")
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let connects = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&connects);
        conformance::echo::serve(listener, format!("{name}\n").into_bytes(), move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        Upstream { addr, connects }
    }

    /// A TCP connection from SHOOT, from source address `src`, to `dst`.
    pub fn connect_from(&self, src: IpAddr, dst: SocketAddr) -> Client {
        let stream = self
            .shoot
            .run_in(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(async {
                        let socket = if dst.is_ipv4() {
                            tokio::net::TcpSocket::new_v4()
                        } else {
                            tokio::net::TcpSocket::new_v6()
                        }?;
                        socket.bind(SocketAddr::new(src, 0))?;
                        let stream = socket.connect(dst).await?;
                        stream.into_std()
                    })
            })
            .expect("run_in shoot")
            .expect("connect");
        stream.set_nonblocking(false).expect("blocking");
        stream.set_read_timeout(Some(WAIT)).expect("timeout");
        Client { stream }
    }
}

pub struct RouterGuard {
    rt: Option<tokio::runtime::Runtime>,
    token: CancellationToken,
    pub addrs: Vec<SocketAddr>,
    pub path: PathBuf,
    /// The router's counters (they keep counting while it runs).
    pub counters: Arc<vpn_router::Counters>,
}

impl RouterGuard {
    /// The address of listener `i`, reached from SHOOT at SEED (the listener may bind a
    /// wildcard).
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::new(SEED.into(), self.addrs[i].port())
    }
}

impl Drop for RouterGuard {
    fn drop(&mut self) {
        self.token.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

pub struct Upstream {
    pub addr: SocketAddr,
    connects: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

pub struct Client {
    pub stream: TcpStream,
}

impl Client {
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Everything until the peer closes (or [`WAIT`] passes: then `closed` is false).
    pub fn read_all(&mut self) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + WAIT;
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return (out, true),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                // A reset after the answer also ends the exchange.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
                Err(_) => return (out, false),
            }
            if Instant::now() > deadline {
                return (out, false);
            }
        }
    }

    /// Reads until `out` contains `needle` or the peer closes; whether `needle` came.
    pub fn read_all_until(&mut self, needle: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.windows(needle.len()).any(|w| w == needle) {
            match self.stream.read(&mut buf) {
                Ok(0) | Err(_) => return (out, false),
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        (out, true)
    }

    /// Reads until `out` contains `needle` (panics after [`WAIT`] or on close).
    pub fn read_until(&mut self, needle: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.windows(needle.len()).any(|w| w == needle) {
            let n = self.stream.read(&mut buf).expect("read");
            assert!(
                n > 0,
                "closed before {needle:?}: {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
        }
        out
    }
}

/// The status code of an HTTP response at the start of `bytes`.
pub fn status(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes.get(..12)?).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// `outbound|1194||vpn-seed-server.<ns>.svc.cluster.local`.
pub fn vpn(ns: &str) -> String {
    format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local")
}

/// `outbound|443||kube-apiserver.<ns>.svc.cluster.local`.
pub fn kapi(ns: &str) -> String {
    format!("outbound|443||kube-apiserver.{ns}.svc.cluster.local")
}

/// A CONNECT head with `headers` (each a full `Name: value` line).
pub fn connect(headers: &[String]) -> Vec<u8> {
    let mut out = b"CONNECT 10.79.0.1:1194 HTTP/1.1\r\nHost: 10.79.0.1\r\n".to_vec();
    for h in headers {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}
