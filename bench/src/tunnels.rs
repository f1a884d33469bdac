//! The memory part's load: K concurrent TCP streams from the seed to an echo server in the
//! shoot, straight through the VPN tunnel or each as an mTLS HTTP CONNECT tunnel through the
//! sidecar (what the kube-apiserver opens to reach a kubelet or a pod).
//!
//! ```text
//!  SEED (Loader runtime)                                   SHOOT (Echo runtime)
//!   stream k: write 16 KiB chunks until the deadline ─┐     echo on 0.0.0.0:ECHO_LOAD_PORT
//!             (at most `window` ahead of the echo),   │      copies every connection back
//!             read what comes back until EOF          │
//!   Path::Direct:  TCP 192.168.123.2:PORT ────────────┼─ tunnel ─►
//!   Path::Sidecar: TLS to 127.0.0.1:9443, CONNECT ────┘  (the sidecar dials through the tunnel)
//! ```
//!
//! Both sides run on tokio runtimes whose worker threads were started inside the namespace
//! (threads inherit the network namespace of the thread that starts them), so every socket a
//! task opens belongs there; the caller's thread only waits on join handles.
//!
//! A load has three phases: every stream writes until one shared deadline while reading the
//! echo; then reads until everything it wrote has come back (it is *drained*) and holds the
//! tunnel open and idle until [`Running::release`]; then shuts its write half and reads to
//! the echo's EOF. All of it within [`DRAIN`] after the deadline; dropping a runtime ends
//! whatever is left.

use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ssl::SslConnector;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

use conformance::netns::Netns;
use conformance::LabError;

use crate::BenchError;

/// What each stream writes at a time (one TLS record's worth).
pub const CHUNK: usize = 16 * 1024;
/// How long streams get after the deadline to deliver what is in flight, be held and see the
/// echo's EOF.
pub const DRAIN: Duration = Duration::from_secs(30);
/// Bound on opening one stream (TCP connect, TLS handshake, CONNECT answer).
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Streams being opened at once: a burst of hundreds of SYNs through the tunnel overflowed
/// the echo's SYN queue (the kernel fell back to SYN cookies and some streams were reset).
const OPEN_AT_ONCE: usize = 16;
/// What all streams together may have written and not yet read back. Without a bound the
/// kernel's socket buffers along the path took several MB per stream within seconds, and
/// draining them after the deadline took longer than the load (256 streams: over 30 s).
const IN_FLIGHT: u64 = 64 << 20;
/// Bounds of one stream's share of [`IN_FLIGHT`].
const WINDOW_MIN: u64 = 256 << 10;
const WINDOW_MAX: u64 = 16 << 20;
/// How far one of `streams` streams may write ahead of what came back, bytes.
pub fn window(streams: usize) -> u64 {
    (IN_FLIGHT / streams.max(1) as u64).clamp(WINDOW_MIN, WINDOW_MAX)
}

/// The echo's listen backlog.
const BACKLOG: u32 = 4096;
/// The largest CONNECT response head read.
const MAX_HEAD: usize = 8192;

/// How the streams reach the shoot.
#[derive(Clone)]
pub enum Path {
    /// Plain TCP to the target, routed into the tunnel by the seed's kernel.
    Direct,
    /// TLS to the sidecar at `addr` (server name `server_name`, the connector presenting the
    /// client certificate), `CONNECT target`, then the stream inside the TLS connection.
    Sidecar {
        /// The sidecar's TLS listen address.
        addr: SocketAddr,
        /// Trusts the CA, presents the client certificate.
        connector: SslConnector,
        /// The name checked in the sidecar's certificate.
        server_name: String,
    },
}

impl std::fmt::Debug for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Direct => f.write_str("Direct"),
            Path::Sidecar { addr, .. } => write!(f, "Sidecar({addr})"),
        }
    }
}

/// What a load moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moved {
    /// Streams that ran.
    pub streams: usize,
    /// Bytes written by the streams (all delivered: the echo's EOF came after them).
    pub sent: u64,
    /// Bytes read back.
    pub received: u64,
    /// From the start of the load until the last stream was drained, seconds.
    pub secs: f64,
}

/// A multi-thread runtime with two workers started inside `ns`.
fn ns_runtime(ns: &Netns) -> Result<Runtime, BenchError> {
    ns.run_in(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    })?
    .map_err(|source| LabError::io("tokio runtime", source).into())
}

/// The echo server in the shoot; stopped (every connection closed) when dropped.
#[derive(Debug)]
pub struct Echo {
    /// Dropping it cancels every task (there are no blocking ones to wait for).
    _rt: Runtime,
}

impl Echo {
    /// Listens on `0.0.0.0:port` inside `ns`.
    pub fn start(ns: &Netns, port: u16) -> Result<Echo, BenchError> {
        let rt = ns_runtime(ns)?;
        let listener = rt
            .block_on(rt.spawn(async move {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.set_reuseaddr(true)?;
                socket.bind((Ipv4Addr::UNSPECIFIED, port).into())?;
                socket.listen(BACKLOG)
            }))
            .map_err(|e| BenchError::unexpected("echo listener task", e.to_string()))?
            .map_err(|source| LabError::io("echo listener", source))?;
        rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(echo(stream));
            }
        });
        Ok(Echo { _rt: rt })
    }
}

/// Copies everything back, then closes its write half.
async fn echo(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (r, mut w) = stream.into_split();
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, r);
    let _ = tokio::io::copy_buf(&mut r, &mut w).await;
    let _ = w.shutdown().await;
}

/// The seed's side: opens streams along a [`Path`]; dropping it cancels every stream (the
/// runtime has no blocking tasks to wait for).
#[derive(Debug)]
pub struct Loader {
    rt: Runtime,
    path: Arc<Path>,
}

impl Loader {
    /// A loader in `ns` going along `path`.
    pub fn new(ns: &Netns, path: Path) -> Result<Loader, BenchError> {
        Ok(Loader {
            rt: ns_runtime(ns)?,
            path: Arc::new(path),
        })
    }

    /// One stream to `target`: 1 KiB written and read back, then closed (the first request
    /// before the idle sample).
    pub fn exchange_once(&self, target: SocketAddr) -> Result<(), BenchError> {
        let path = Arc::clone(&self.path);
        let task = self.rt.spawn(async move {
            let work = async {
                let mut s = open(&path, target).await?;
                let data = [0x5au8; 1024];
                s.write_all(&data).await.map_err(|e| e.to_string())?;
                let mut back = [0u8; 1024];
                s.read_exact(&mut back).await.map_err(|e| e.to_string())?;
                if back != data {
                    return Err("echo returned other bytes".to_owned());
                }
                s.shutdown().await.map_err(|e| e.to_string())?;
                let mut rest = Vec::new();
                s.read_to_end(&mut rest).await.map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            };
            tokio::time::timeout(OPEN_TIMEOUT, work)
                .await
                .unwrap_or_else(|_| Err(format!("not done within {OPEN_TIMEOUT:?}")))
        });
        self.rt
            .block_on(task)
            .map_err(|e| BenchError::unexpected("first exchange", e.to_string()))?
            .map_err(|e| BenchError::unexpected("first exchange", e))
    }

    /// Starts `streams` concurrent streams to `target`, writing for `duration`; see
    /// [`Loader::finish`].
    pub fn start(&self, target: SocketAddr, streams: usize, duration: Duration) -> Running {
        let path = Arc::clone(&self.path);
        let drained = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let counter = Arc::clone(&drained);
        let handle = self.rt.spawn(async move {
            let started = Instant::now();
            let deadline = tokio::time::Instant::now() + duration;
            let window = window(streams);
            let opening = Arc::new(tokio::sync::Semaphore::new(OPEN_AT_ONCE));
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..streams {
                let path = Arc::clone(&path);
                let opening = Arc::clone(&opening);
                let hold = Hold {
                    drained: Arc::clone(&counter),
                    released: released.clone(),
                };
                set.spawn(tokio::time::timeout_at(deadline + DRAIN, async move {
                    let permit = opening.acquire().await.map_err(|e| e.to_string())?;
                    let s = open(&path, target).await?;
                    drop(permit);
                    pump(s, deadline, window, hold).await
                }));
            }
            let mut moved = Moved {
                streams,
                sent: 0,
                received: 0,
                secs: 0.0,
            };
            let mut failures = Vec::new();
            while let Some(joined) = set.join_next().await {
                match joined {
                    Ok(Ok(Ok(p))) => {
                        moved.sent += p.sent;
                        moved.received += p.received;
                        moved.secs = moved.secs.max((p.drained - started).as_secs_f64());
                    }
                    Ok(Ok(Err(e))) => failures.push(e),
                    Ok(Err(_)) => failures.push(format!("not done within {DRAIN:?} after the end")),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            match failures.first() {
                None => Ok(moved),
                Some(first) => Err(format!(
                    "{} of {streams} streams failed, first: {first}",
                    failures.len()
                )),
            }
        });
        Running {
            handle,
            drained,
            release,
        }
    }

    /// Waits for a load started with [`Loader::start`] (it is bounded by its deadline plus
    /// [`DRAIN`]).
    pub fn finish(&self, running: Running) -> Result<Moved, BenchError> {
        self.rt
            .block_on(running.handle)
            .map_err(|e| BenchError::unexpected("load", e.to_string()))?
            .map_err(|e| BenchError::unexpected("load", e))
    }
}

/// A load in progress.
#[derive(Debug)]
pub struct Running {
    handle: tokio::task::JoinHandle<Result<Moved, String>>,
    drained: Arc<AtomicUsize>,
    release: tokio::sync::watch::Sender<bool>,
}

impl Running {
    /// Whether every stream has ended (or the load failed).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Streams that stopped writing, got all their bytes back and are held open, idle.
    pub fn drained(&self) -> usize {
        self.drained.load(Ordering::Relaxed)
    }

    /// Lets the held streams close.
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

/// A stream's part in the hold phase.
struct Hold {
    /// Counts the streams drained.
    drained: Arc<AtomicUsize>,
    /// Becomes true when the streams may close.
    released: tokio::sync::watch::Receiver<bool>,
}

/// What one stream did.
struct Pumped {
    sent: u64,
    received: u64,
    /// When everything written had come back.
    drained: Instant,
}

/// A stream of either kind.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Opens one stream to `target` along `path`, within [`OPEN_TIMEOUT`].
async fn open(path: &Path, target: SocketAddr) -> Result<Box<dyn Stream>, String> {
    let work = async {
        match path {
            Path::Direct => {
                let s = TcpStream::connect(target)
                    .await
                    .map_err(|e| format!("connect {target}: {e}"))?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s) as Box<dyn Stream>)
            }
            Path::Sidecar {
                addr,
                connector,
                server_name,
            } => {
                let tcp = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect to the sidecar {addr}: {e}"))?;
                let _ = tcp.set_nodelay(true);
                let ssl = connector
                    .configure()
                    .and_then(|c| c.into_ssl(server_name))
                    .map_err(|e| format!("TLS setup: {e}"))?;
                let mut tls = tokio_openssl::SslStream::new(ssl, tcp)
                    .map_err(|e| format!("TLS setup: {e}"))?;
                Pin::new(&mut tls)
                    .connect()
                    .await
                    .map_err(|e| format!("TLS handshake with the sidecar: {e}"))?;
                let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
                tls.write_all(head.as_bytes())
                    .await
                    .map_err(|e| format!("sending CONNECT: {e}"))?;
                let status = read_status(&mut tls).await?;
                if status != 200 {
                    return Err(format!("the sidecar answered {status} to CONNECT {target}"));
                }
                Ok(Box::new(tls) as Box<dyn Stream>)
            }
        }
    };
    tokio::time::timeout(OPEN_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err(format!("opening a stream took over {OPEN_TIMEOUT:?}")))
}

/// Reads a response head byte by byte (nothing beyond it: the tunnel's bytes follow) and
/// returns its status code.
async fn read_status<S: AsyncRead + Unpin>(s: &mut S) -> Result<u16, String> {
    let mut head = Vec::with_capacity(64);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err("CONNECT response head too long".to_owned());
        }
        let b = s
            .read_u8()
            .await
            .map_err(|e| format!("reading the CONNECT answer: {e}"))?;
        head.push(b);
    }
    let text = String::from_utf8_lossy(&head);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad CONNECT answer {:?}", text.trim_end()))
}

/// Writes [`CHUNK`]s until `deadline`, at most `window` bytes ahead of what came back, while
/// reading the echo; once every byte has come back, holds the stream (see [`Hold`]); then
/// shuts the write half and reads until EOF.
async fn pump(
    s: Box<dyn Stream>,
    deadline: tokio::time::Instant,
    window: u64,
    hold: Hold,
) -> Result<Pumped, String> {
    let Hold {
        drained,
        mut released,
    } = hold;
    let (mut r, mut w) = tokio::io::split(s);
    // The writer tells the reader how much it wrote once it stopped; the reader tells the
    // writer how much came back (the writer stays at most `window` ahead).
    let (total_tx, mut total_rx) = tokio::sync::watch::channel(None::<u64>);
    let (back_tx, mut back_rx) = tokio::sync::watch::channel(0u64);
    let writer = async {
        let chunk = vec![0x5au8; CHUNK];
        let mut sent = 0u64;
        // A chunk is never cut (a TLS write must be retried with the same bytes); the
        // caller's bound of deadline + DRAIN covers a chunk that waits on backpressure.
        while tokio::time::Instant::now() < deadline {
            let room = back_rx.wait_for(|back| sent + CHUNK as u64 <= back + window);
            match tokio::time::timeout_at(deadline, room).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return Err("the reader ended early".to_owned()),
                Err(_) => break,
            }
            w.write_all(&chunk)
                .await
                .map_err(|e| format!("write: {e}"))?;
            sent += CHUNK as u64;
        }
        w.flush().await.map_err(|e| format!("flush: {e}"))?;
        total_tx.send_replace(Some(sent));
        // Held open, idle, until released (or the caller's bound ends the stream).
        let _ = released.wait_for(|r| *r).await;
        w.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
        Ok::<u64, String>(sent)
    };
    let reader = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut received = 0u64;
        let mut drained_at = None;
        loop {
            if drained_at.is_none() && (*total_rx.borrow()).is_some_and(|t| received >= t) {
                drained_at = Some(Instant::now());
                drained.fetch_add(1, Ordering::Relaxed);
            }
            // Woken by the echo, or by the writer's total (a read that waits is cancelled
            // without losing bytes: nothing was read).
            let n = tokio::select! {
                read = r.read(&mut buf) => read.map_err(|e| format!("read: {e}"))?,
                changed = total_rx.changed(), if drained_at.is_none() => match changed {
                    Ok(()) => continue,
                    Err(_) => return Err("the writer ended early".to_owned()),
                },
            };
            if n == 0 {
                return Ok::<_, String>((received, drained_at));
            }
            received += n as u64;
            back_tx.send_replace(received);
        }
    };
    let (sent, received) = tokio::join!(writer, reader);
    let (sent, (received, drained_at)) = (sent?, received?);
    if received != sent {
        return Err(format!("wrote {sent} bytes, {received} came back"));
    }
    Ok(Pumped {
        sent,
        received,
        drained: drained_at.unwrap_or_else(Instant::now),
    })
}
