//! A flood of silent and bogus connections held against a VPN server or the CONNECT proxy in
//! front of it ("lock-out before authentication", issue 19): the load of the `preauth_*` tests
//! and of the bench's flood part (the `bench` crate), which measures a legitimate client's
//! tunnel under it.
//!
//! [`Flood::start`] runs its slots on a runtime of its own inside a lab namespace. The flood
//! holds its population: a slot whose connection the other side closed connects again at
//! once, all slots together at most `rate` connects a second, so the load is bounded in rate,
//! in count (`idle` + `bogus` sockets at most) and in time (it stops when dropped).
//!
//! * Silent slot: connects and sends nothing. Through a proxy ([`FloodPath::Proxy`]) every
//!   second one sends a valid CONNECT (with the routing header) first, so the server behind
//!   holds a silent connection too.
//! * Bogus slot, direct: one frame, in turn [`BogusFrame::BadHmacReset`] (a hard reset whose
//!   tls-auth HMAC is random), [`BogusFrame::RandomFrame`], [`BogusFrame::BadLength`]; then
//!   waits for the close. Through a proxy every second one sends a head of random bytes
//!   instead of a CONNECT, the others a valid CONNECT and then the bogus frame.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand_core::{OsRng, RngCore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use vpn_client::CancellationToken;

use crate::netns::Netns;
use crate::LabError;

/// Bound on the flood's first pass (every slot connected once).
pub const POPULATE_LIMIT: Duration = Duration::from_secs(15);
/// After the first pass, before the client starts.
pub const SETTLE: Duration = Duration::from_secs(1);
/// Bound on one connect, and on a proxy's answer to a CONNECT.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// A slot whose connect failed waits this long before the next.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The rate limiter's tick.
const TICK: Duration = Duration::from_millis(10);
/// Close latencies of bogus connections kept for the median (the first ones).
const LATENCIES_KEPT: usize = 100_000;

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

/// Where the flood connects.
#[derive(Debug, Clone)]
pub enum FloodPath {
    /// Straight to the VPN server.
    Direct(SocketAddr),
    /// To a CONNECT proxy, which is asked for the VPN server.
    Proxy {
        /// The proxy.
        proxy: SocketAddr,
        /// The VPN server, asked for in the CONNECT.
        server: SocketAddr,
        /// The routing header the CONNECT carries: name, value.
        header: (&'static str, &'static str),
    },
}

impl FloodPath {
    fn addr(&self) -> SocketAddr {
        match self {
            FloodPath::Direct(a) | FloodPath::Proxy { proxy: a, .. } => *a,
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
            bogus_close_ms: (!ms.is_empty()).then(|| median(&mut ms)),
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
    ) -> Result<Flood, LabError> {
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
            let through = matches!(*self.path, FloodPath::Proxy { .. }) && self.index % 2 == 1;
            if through && !proxy_connect(&mut s, &self.path).await {
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
                FloodPath::Proxy { .. } if self.index % 2 == 0 => {
                    // A "head" of random bytes that ends like one.
                    let mut head = vec![0u8; 64];
                    OsRng.fill_bytes(&mut head);
                    head.extend_from_slice(b"\r\n\r\n");
                    head
                }
                FloodPath::Proxy { .. } => {
                    if !proxy_connect(&mut s, &self.path).await {
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

/// Sends a CONNECT for the VPN server with the routing header of `path` (a
/// [`FloodPath::Proxy`]) and reads the answer's head; whether it was 200.
async fn proxy_connect(s: &mut TcpStream, path: &FloodPath) -> bool {
    let FloodPath::Proxy {
        server,
        header: (name, value),
        ..
    } = path
    else {
        return false;
    };
    let head = format!("CONNECT {server} HTTP/1.1\r\nHost: {server}\r\n{name}: {value}\r\n\r\n");
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

/// The median of `values` (sorted in place); 0 for none. The bench's figures use it too.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
