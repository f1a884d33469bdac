//! Listening sockets and the accept step every server loop of ours shares (the OpenVPN server,
//! the CONNECT sidecar, the ingress router, the apiserver-proxy, the admin endpoint); the
//! bound on connections that have not yet proven anything ([`PendingSet`]). The log limiter
//! for the events a flood brings is [`crate::log_limit`]'s, re-exported here for the accept
//! paths that name it as `listen::LogLimiter`.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub use crate::log_limit::{LogLimiter, LOG_EVERY};

/// The listen backlog (the kernel caps it at `net.core.somaxconn`).
pub const BACKLOG: u32 = 4096;

/// How long an accept loop pauses after a failed `accept` (`EMFILE`, `ENFILE`, `ENOBUFS`):
/// the connection that caused it stays queued, so retrying at once would spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Listeners on every address of `addrs`, with `SO_REUSEADDR`; the first that cannot be
/// bound is returned with its error. Every listener of ours is bound through here, so `[::]`
/// means the same everywhere: the unspecified IPv6 address takes IPv4 connections too (as
/// IPv4-mapped addresses, like OpenVPN's `proto tcp6-server`, whatever
/// `net.ipv6.bindv6only` says), unless `addrs` also holds `0.0.0.0` with the same port (then
/// it is IPv6-only, so the two can share the port, as Gardener's `0.0.0.0:15000,[::]:15000`
/// asks, or any IPv4 address with that port). Must run inside a tokio runtime.
pub fn bind_each(addrs: &[SocketAddr]) -> Result<Vec<TcpListener>, (SocketAddr, io::Error)> {
    addrs
        .iter()
        .map(|&addr| {
            let beside_ipv4 = addr.is_ipv6()
                && addrs
                    .iter()
                    .any(|a| a.is_ipv4() && a.port() == addr.port() && a.port() != 0);
            bind_inner(addr, beside_ipv4, None).map_err(|e| (addr, e))
        })
        .collect()
}

/// A dual-stack listener on `port` of every address (`[::]`) that takes connections arriving
/// on network device `device` only (`SO_BINDTODEVICE`): connections through any other device,
/// loopback included, are not accepted by it. Fails with `ENODEV` while the device does not
/// exist; the socket stays bound to the device's index, so a device deleted and made again
/// needs a new listener. Must run inside a tokio runtime.
pub fn bind_on_device(port: u16, device: &str) -> io::Result<TcpListener> {
    let addr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    bind_inner(addr, false, Some(device))
}

fn bind_inner(addr: SocketAddr, v6_only: bool, device: Option<&str>) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(v6_only)?;
    }
    if let Some(device) = device {
        socket.bind_device(Some(device.as_bytes()))?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG as i32)?;
    TcpListener::from_std(socket.into())
}

/// The next connection, or `None` once `shutdown` is cancelled. A failed `accept` is retried
/// after [`ACCEPT_ERROR_PAUSE`] and logged at most once per [`LOG_EVERY`] (out of
/// descriptors, it fails every pause until a connection closes: 20 lines a second).
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    let mut log = LogLimiter::new(LOG_EVERY);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok(a) => return Some(a),
            Err(e) => {
                if let Some(suppressed) = log.allow(Instant::now()) {
                    let local = listener.local_addr().ok();
                    tracing::warn!(
                        listener = ?local,
                        error = %e,
                        suppressed,
                        "accept failed; pausing"
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// Connections accepted but not yet past their first step (an OpenVPN connection before its
/// client is authenticated, a CONNECT head before it is routed, a TLS handshake), bounded apart
/// from the established ones so that silent or bogus connections never take an established
/// connection's place.
///
/// When the bound is reached, a newcomer is not refused: the oldest pending connection is
/// evicted to make room (its [`PendingGuard::evicted`] fires; its task closes it). Pending
/// connections come in two classes: *unproven* ones, and those that have shown something an
/// attacker without credentials cannot (a first packet whose tls-auth HMAC verifies, a completed
/// mutual TLS handshake; [`PendingGuard::prove`]). Unproven ones go first, oldest first; a proven
/// one is evicted, oldest first, only when none is unproven. So a flood of connections that
/// cannot prove anything only ever evicts itself, and a real client, which proves itself
/// within a round trip of its accept, keeps its place whatever the flood's rate.
///
/// Accept order decides "oldest"; no clock is read. The drivers keep their own deadlines.
#[derive(Debug, Clone)]
pub struct PendingSet {
    inner: Arc<Mutex<PendingInner>>,
}

#[derive(Debug)]
struct PendingInner {
    max: usize,
    next: u64,
    unproven: BTreeMap<u64, CancellationToken>,
    proven: BTreeMap<u64, CancellationToken>,
}

/// What [`PendingSet::admit`] did.
#[derive(Debug)]
pub struct Admitted {
    /// The newcomer's place; leaving it (drop) frees it.
    pub guard: PendingGuard,
    /// The connection evicted to make room, if the set was full.
    pub evicted: Option<Evicted>,
}

/// A pending connection evicted for a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// Its place in accept order (the first admitted is 0).
    pub seq: u64,
    /// Whether it had proven itself (evicted only when no unproven one was left).
    pub proven: bool,
}

/// A connection's place in a [`PendingSet`]; dropped when the connection is established or
/// closed.
#[derive(Debug)]
pub struct PendingGuard {
    set: Arc<Mutex<PendingInner>>,
    seq: u64,
    evicted: CancellationToken,
}

impl PendingSet {
    /// At most `max` pending connections (at least 1).
    pub fn new(max: usize) -> PendingSet {
        PendingSet {
            inner: Arc::new(Mutex::new(PendingInner {
                max: max.max(1),
                next: 0,
                unproven: BTreeMap::new(),
                proven: BTreeMap::new(),
            })),
        }
    }

    /// A place for a newly accepted connection, unproven; when the set is full, the oldest
    /// unproven connection (else the oldest proven one) is evicted first.
    pub fn admit(&self) -> Admitted {
        let mut inner = lock(&self.inner);
        let mut evicted = None;
        if inner.unproven.len() + inner.proven.len() >= inner.max {
            let victim = match inner.unproven.pop_first() {
                Some((seq, token)) => Some((seq, token, false)),
                None => inner
                    .proven
                    .pop_first()
                    .map(|(seq, token)| (seq, token, true)),
            };
            if let Some((seq, token, proven)) = victim {
                token.cancel();
                evicted = Some(Evicted { seq, proven });
            }
        }
        let seq = inner.next;
        inner.next += 1;
        let token = CancellationToken::new();
        inner.unproven.insert(seq, token.clone());
        Admitted {
            guard: PendingGuard {
                set: Arc::clone(&self.inner),
                seq,
                evicted: token,
            },
            evicted,
        }
    }

    /// Pending connections now (both classes).
    pub fn len(&self) -> usize {
        let inner = lock(&self.inner);
        inner.unproven.len() + inner.proven.len()
    }

    /// Whether no connection is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pending connections that have proven themselves.
    pub fn proven(&self) -> usize {
        lock(&self.inner).proven.len()
    }

    /// The bound.
    pub fn max(&self) -> usize {
        lock(&self.inner).max
    }
}

impl PendingGuard {
    /// Its place in accept order.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Moves the connection into the class that is evicted last (no-op once evicted).
    pub fn prove(&self) {
        let mut inner = lock(&self.set);
        if let Some(token) = inner.unproven.remove(&self.seq) {
            inner.proven.insert(self.seq, token);
        }
    }

    /// Whether it was evicted for a newer connection.
    pub fn is_evicted(&self) -> bool {
        self.evicted.is_cancelled()
    }

    /// Completes when it is evicted for a newer connection (cancel-safe).
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.evicted.cancelled()
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut inner = lock(&self.set);
        if inner.unproven.remove(&self.seq).is_none() {
            inner.proven.remove(&self.seq);
        }
    }
}

fn lock(m: &Mutex<PendingInner>) -> MutexGuard<'_, PendingInner> {
    // No code here panics while holding the lock; the maps stay consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines a test's subscriber wrote.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_failing_accept_pauses_and_logs_once_per_interval() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let listener = bind_each(&["127.0.0.1:0".parse().unwrap()])
            .unwrap()
            .remove(0);
        // A listening socket shut for reading leaves the listening state: every accept fails
        // (EINVAL) at once, as EMFILE does while the descriptors are used up.
        socket2::SockRef::from(&listener)
            .shutdown(std::net::Shutdown::Read)
            .unwrap();
        let shutdown = CancellationToken::new();
        let run = Duration::from_millis(1500);
        let result = tokio::time::timeout(run, accept(&listener, &shutdown)).await;
        assert!(result.is_err(), "accept returned: {result:?}");
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let logged = text.matches("accept failed").count();
        // 1.5 s of failures 50 ms apart: 30 attempts, two lines (at 0 s and 1 s).
        assert_eq!(logged, 2, "{text}");
        assert!(text.contains("suppressed="), "{text}");
    }

    #[test]
    fn a_full_set_evicts_the_oldest_unproven_first_then_the_oldest_proven() {
        let set = PendingSet::new(3);
        let a = set.admit();
        let b = set.admit();
        let c = set.admit();
        assert!(a.evicted.is_none() && b.evicted.is_none() && c.evicted.is_none());
        assert_eq!((set.len(), set.proven()), (3, 0));
        // `a` proves itself: the oldest unproven is now `b`.
        a.guard.prove();
        let d = set.admit();
        assert_eq!(
            d.evicted,
            Some(Evicted {
                seq: 1,
                proven: false
            })
        );
        assert!(b.guard.is_evicted() && !a.guard.is_evicted());
        assert_eq!(set.len(), 3);
        // Unproven newcomers keep evicting each other, never `a`.
        let mut newest = d;
        let mut older = c;
        for seq in 4..100 {
            let next = set.admit();
            assert_eq!(next.evicted.map(|e| e.proven), Some(false));
            assert!(older.guard.is_evicted());
            assert!(!a.guard.is_evicted());
            older = std::mem::replace(&mut newest, next);
            assert_eq!(newest.guard.seq(), seq);
        }
        // With every place proven, the oldest proven one goes.
        older.guard.prove();
        newest.guard.prove();
        let last = set.admit();
        assert_eq!(
            last.evicted,
            Some(Evicted {
                seq: 0,
                proven: true
            })
        );
        assert!(a.guard.is_evicted());
        // An evicted guard proving or dropping changes nothing.
        a.guard.prove();
        drop(a);
        drop(b);
        assert_eq!((set.len(), set.proven()), (3, 2));
        drop(last);
        drop(newest);
        drop(older);
        assert!(set.is_empty());
    }

    #[test]
    fn a_place_is_freed_when_the_guard_drops() {
        let set = PendingSet::new(1);
        let a = set.admit();
        drop(a);
        let b = set.admit();
        assert!(b.evicted.is_none(), "a freed place needs no eviction");
        assert_eq!(set.max(), 1);
        assert_eq!(PendingSet::new(0).max(), 1);
    }

    #[tokio::test]
    async fn eviction_wakes_the_evicted_task() {
        let set = PendingSet::new(1);
        let first = set.admit().guard;
        let waiter = tokio::spawn(async move {
            first.evicted().await;
            first.is_evicted()
        });
        let _second = set.admit();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn beside_ipv4_on_its_port_the_ipv6_listener_is_ipv6_only_and_accept_ends_on_shutdown() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Both bind only because `[::]` is IPv6-only beside `0.0.0.0` on the same port.
        let listeners = bind_each(&[
            SocketAddr::from(([0u8; 4], port)),
            SocketAddr::from(([0u16; 8], port)),
        ])
        .unwrap();
        let shutdown = CancellationToken::new();
        let client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_, peer) = accept(&listeners[0], &shutdown).await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        shutdown.cancel();
        assert!(accept(&listeners[1], &shutdown).await.is_none());
    }

    #[tokio::test]
    async fn a_lone_ipv6_any_listener_takes_ipv4_too() {
        let listeners = bind_each(&[SocketAddr::from(([0u16; 8], 0))]).unwrap();
        let port = listeners[0].local_addr().unwrap().port();
        let _client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_, peer) = accept(&listeners[0], &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(peer.ip().to_canonical().to_string(), "127.0.0.1");
    }

    #[test]
    fn a_refused_address_is_named() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let (named, _) = bind_each(&[addr]).unwrap_err();
        assert_eq!(named, addr);
    }
}
