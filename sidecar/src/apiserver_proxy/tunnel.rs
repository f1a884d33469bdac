//! The data path of the GEP-30 apiserver-proxy: a TCP proxy that tunnels every connection it
//! accepts through an HTTP CONNECT proxy (the ingress), whoever configured it
//! ([`super::ApiserverProxy`] for `vpn-client apiserver-proxy`, Envoy mode from Gardener's
//! apiserver-proxy envoy.yaml).
//!
//! ```text
//!  client ──TCP──► listener (e.g. <kubernetes service address>:443)
//!                    │ at most `max_connections` at once; more are closed at accept
//!                    │ the proxy's addresses of `family` (looked up again after `refresh`)
//!                    │ CONNECT target HTTP/1.1 + routing header, within `connect_timeout`
//!                    ▼
//!                  proxy HOST:PORT ──200──► relay (netio::relay): half-close both ways,
//!                                           `idle_timeout`, `buffer_size` per direction
//! ```
//!
//! A refused CONNECT (any status but 200), a failed or slow connect, or a name that does not
//! resolve to an address of the family closes the client's connection without a byte. The
//! connection to the proxy gets TCP keepalive when [`TunnelProxyConfig::keepalive`] is set.
//!
//! What happened to each connection goes to the [`TunnelEvents`] the proxy was bound with:
//! one call when a connection is accepted or refused by the limit, one per name lookup, one
//! when a tunnel is established, and a [`TunnelReport`] when the connection ends. The caller
//! turns these into metrics or log lines; this module logs at debug level only.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use netio::http::{ConnectRequest, HttpError};
use netio::http_connect::{connect_via_proxy, ConnectError};
use netio::relay::{relay_tcp, RelayConfig, RelayEnd};

/// Which of the proxy's resolved addresses are dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// Every address, in the resolver's order.
    Any,
    /// IPv4 addresses only.
    V4Only,
    /// IPv6 addresses only.
    V6Only,
}

impl AddressFamily {
    fn admits(self, addr: &SocketAddr) -> bool {
        match self {
            AddressFamily::Any => true,
            AddressFamily::V4Only => addr.is_ipv4(),
            AddressFamily::V6Only => addr.is_ipv6(),
        }
    }
}

/// TCP keepalive on the connection to the proxy; `None` fields keep the kernel's setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Keepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`).
    pub time: Option<Duration>,
    /// Time between probes (`TCP_KEEPINTVL`).
    pub interval: Option<Duration>,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`).
    pub probes: Option<u32>,
}

/// Everything the tunnel proxy needs.
#[derive(Debug, Clone)]
pub struct TunnelProxyConfig {
    /// Local listen addresses (`[::]` takes both families unless an IPv4 address with its
    /// port is listed too, see [`netio::listen::bind_each`]).
    pub listen: Vec<SocketAddr>,
    /// The proxy's host (a name or an address) and port.
    pub proxy: (String, u16),
    /// Which of its addresses are dialed (tried in order until one answers).
    pub family: AddressFamily,
    /// How long a lookup's addresses serve new connections before the name is looked up
    /// again, when a connection needs it (Envoy's `dns_refresh_rate`); zero: for every
    /// connection. A failed lookup keeps the last addresses, as Envoy's `LOGICAL_DNS`
    /// cluster keeps its host.
    pub refresh: Duration,
    /// The CONNECT request every tunnel sends: its target and headers.
    pub request: ConnectRequest,
    /// Bound on reaching the proxy and getting its `200`.
    pub connect_timeout: Duration,
    /// No bytes either way for this long closes a connection.
    pub idle_timeout: Duration,
    /// Concurrent connections; more are closed at accept.
    pub max_connections: usize,
    /// Bytes buffered per direction of a relay.
    pub buffer_size: usize,
    /// TCP keepalive towards the proxy (none: the kernel's default, off).
    pub keepalive: Option<Keepalive>,
}

/// Why the tunnel proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum TunnelProxyError {
    /// The CONNECT request cannot be encoded (a control byte in a header value, ...).
    #[error("invalid CONNECT request settings")]
    Request(#[source] HttpError),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// How a connection ended.
#[derive(Debug)]
pub enum Outcome {
    /// The tunnel was relayed until both sides closed, or until the idle timeout.
    Relayed(RelayEnd),
    /// A socket error ended the relay.
    RelayFailed(io::Error),
    /// Writing what the proxy sent after its `200` to the client failed.
    ClientFailed(io::Error),
    /// The proxy's name did not resolve.
    ResolveFailed(io::Error),
    /// The name resolved, but to no address of the family.
    NoAddress,
    /// The proxy could not be reached, or the exchange failed or took too long.
    ConnectFailed(ConnectError),
    /// The proxy answered the CONNECT with another status than 200.
    Refused {
        /// The status.
        status: u16,
    },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Relayed(RelayEnd::Closed) => f.write_str("closed by both sides"),
            Outcome::Relayed(RelayEnd::Idle) => f.write_str("closed by the idle timeout"),
            Outcome::RelayFailed(e) => write!(f, "relay failed: {e}"),
            Outcome::ClientFailed(e) => write!(f, "writing to the client failed: {e}"),
            Outcome::ResolveFailed(e) => write!(f, "cannot resolve the proxy: {e}"),
            Outcome::NoAddress => f.write_str("the proxy has no address of the family"),
            Outcome::ConnectFailed(e) => write!(f, "{}", netio::report::chain(e)),
            Outcome::Refused { status } => write!(f, "the proxy refused the CONNECT ({status})"),
        }
    }
}

/// What one connection came to, handed to [`TunnelEvents::closed`].
#[derive(Debug)]
pub struct TunnelReport {
    /// When the connection was accepted (wall clock, for access logs).
    pub start: SystemTime,
    /// From accept to the end.
    pub duration: Duration,
    /// The client.
    pub peer: SocketAddr,
    /// The proxy address connected to (or tried last), when known.
    pub proxy: Option<SocketAddr>,
    /// How long the tunnel lived, from the proxy's `200` to the end; `None` without one.
    pub tunnel: Option<Duration>,
    /// Bytes from the client relayed to the proxy.
    pub to_proxy: u64,
    /// Bytes from the proxy (after its response head) relayed to the client.
    pub from_proxy: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// What the tunnel proxy reports; every method has a default that does nothing. Calls come
/// from the connections' tasks, concurrently.
pub trait TunnelEvents: Send + Sync + std::fmt::Debug + 'static {
    /// A connection was accepted and will be tunnelled.
    fn accepted(&self, _peer: SocketAddr) {}
    /// The connection limit refused a connection; it was closed at once.
    fn overflowed(&self, _peer: SocketAddr) {}
    /// The proxy's host was looked up: `true` when the resolver answered (with or without an
    /// address of the family), `false` when it failed.
    fn resolved(&self, _answered: bool) {}
    /// The proxy answered 200 after `latency` (from the start of the connect).
    fn connected(&self, _latency: Duration) {}
    /// The connection ended (see the report); called once per accepted connection, unless
    /// shutdown cut it short.
    fn closed(&self, _report: &TunnelReport) {}
}

/// Events that nobody counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvents;

impl TunnelEvents for NoEvents {}

/// A bound tunnel proxy; [`TunnelProxy::run`] serves.
#[derive(Debug)]
pub struct TunnelProxy {
    config: Arc<TunnelProxyConfig>,
    events: Arc<dyn TunnelEvents>,
    addresses: Arc<Addresses>,
    listeners: Vec<TcpListener>,
}

impl TunnelProxy {
    /// Checks that the request encodes and binds the listeners. Must run inside a tokio
    /// runtime.
    pub fn bind(
        config: TunnelProxyConfig,
        events: Arc<dyn TunnelEvents>,
    ) -> Result<TunnelProxy, TunnelProxyError> {
        config
            .request
            .to_bytes()
            .map_err(TunnelProxyError::Request)?;
        let listeners = netio::listen::bind_each(&config.listen)
            .map_err(|(addr, source)| TunnelProxyError::Bind { addr, source })?;
        Ok(TunnelProxy {
            addresses: Arc::new(Addresses {
                last: Mutex::new(None),
            }),
            config: Arc::new(config),
            events,
            listeners,
        })
    }

    /// The bound listen addresses (with the port the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown`; then closes every connection and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let limit = self.config.max_connections.min(Semaphore::MAX_PERMITS);
        let permits = Arc::new(Semaphore::new(limit));
        for listener in self.listeners {
            let (config, events, addresses, permits, shutdown, inner) = (
                Arc::clone(&self.config),
                Arc::clone(&self.events),
                Arc::clone(&self.addresses),
                Arc::clone(&permits),
                shutdown.clone(),
                tracker.clone(),
            );
            tracker.spawn(async move {
                while let Some((client, peer)) = netio::listen::accept(&listener, &shutdown).await {
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        events.overflowed(peer);
                        continue;
                    };
                    events.accepted(peer);
                    let (config, events, addresses, shutdown) = (
                        Arc::clone(&config),
                        Arc::clone(&events),
                        Arc::clone(&addresses),
                        shutdown.clone(),
                    );
                    inner.spawn(async move {
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            report = tunnel(&config, events.as_ref(), &addresses, client, peer) => {
                                debug!(
                                    %peer,
                                    outcome = ?report.outcome,
                                    to_proxy = report.to_proxy,
                                    from_proxy = report.from_proxy,
                                    "tunnelled connection closed"
                                );
                                events.closed(&report);
                            }
                        }
                        drop(permit);
                    });
                }
            });
        }
        shutdown.cancelled().await;
        tracker.close();
        tracker.wait().await;
    }
}

/// The proxy's addresses from the last lookup, and when it was made.
#[derive(Debug)]
struct Addresses {
    last: Mutex<Option<(Instant, Vec<SocketAddr>)>>,
}

impl Addresses {
    /// The addresses of `family` to dial: the last lookup's while it is younger than
    /// `refresh`, else a new lookup's; the last ones when the new lookup fails.
    async fn get(
        &self,
        config: &TunnelProxyConfig,
        events: &dyn TunnelEvents,
    ) -> io::Result<Vec<SocketAddr>> {
        let last = || self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, addrs)) = &*last() {
            if at.elapsed() < config.refresh {
                return Ok(addrs.clone());
            }
        }
        let (host, port) = &config.proxy;
        match tokio::net::lookup_host((host.as_str(), *port)).await {
            Ok(found) => {
                events.resolved(true);
                let addrs: Vec<SocketAddr> = found.filter(|a| config.family.admits(a)).collect();
                *last() = Some((Instant::now(), addrs.clone()));
                Ok(addrs)
            }
            Err(e) => {
                events.resolved(false);
                match &*last() {
                    Some((_, addrs)) if !addrs.is_empty() => Ok(addrs.clone()),
                    _ => Err(e),
                }
            }
        }
    }
}

/// Tunnels one connection to its end.
async fn tunnel(
    config: &TunnelProxyConfig,
    events: &dyn TunnelEvents,
    addresses: &Addresses,
    mut client: TcpStream,
    peer: SocketAddr,
) -> TunnelReport {
    let start = SystemTime::now();
    let accepted = Instant::now();
    let report = |proxy, tunnel, (to_proxy, from_proxy), outcome| TunnelReport {
        start,
        duration: accepted.elapsed(),
        peer,
        proxy,
        tunnel,
        to_proxy,
        from_proxy,
        outcome,
    };
    let _ = client.set_nodelay(true);
    let addrs = match addresses.get(config, events).await {
        Ok(addrs) => addrs,
        Err(e) => return report(None, None, (0, 0), Outcome::ResolveFailed(e)),
    };
    if addrs.is_empty() {
        return report(None, None, (0, 0), Outcome::NoAddress);
    }
    let connecting = Instant::now();
    let proxied = match connect_via_proxy(&addrs, &config.request, config.connect_timeout).await {
        Ok(p) => p,
        Err(e) => {
            let tried = match &e {
                ConnectError::Connect { proxy, .. } => Some(*proxy),
                _ => addrs.first().copied().filter(|_| addrs.len() == 1),
            };
            let outcome = match e {
                ConnectError::Status { code, .. } => Outcome::Refused { status: code },
                e => Outcome::ConnectFailed(e),
            };
            return report(tried, None, (0, 0), outcome);
        }
    };
    events.connected(connecting.elapsed());
    let established = Instant::now();
    let mut upstream = proxied.stream;
    let proxy = upstream.peer_addr().ok();
    if let Some(k) = config.keepalive {
        set_keepalive(&upstream, k);
    }
    let leftover = proxied.leftover.len() as u64;
    if leftover > 0 {
        if let Err(e) = client.write_all(&proxied.leftover).await {
            let tunnel = Some(established.elapsed());
            return report(proxy, tunnel, (0, 0), Outcome::ClientFailed(e));
        }
    }
    let relay = RelayConfig {
        idle_timeout: config.idle_timeout,
        buffer_size: config.buffer_size,
        ..RelayConfig::default()
    };
    let (bytes, outcome) = match relay_tcp(&mut client, &mut upstream, relay).await {
        Ok(s) => ((s.a_to_b, s.b_to_a + leftover), Outcome::Relayed(s.end)),
        Err(e) => (
            (e.a_to_b, e.b_to_a + leftover),
            Outcome::RelayFailed(e.source),
        ),
    };
    report(proxy, Some(established.elapsed()), bytes, outcome)
}

fn set_keepalive(stream: &TcpStream, k: Keepalive) {
    let mut keepalive = socket2::TcpKeepalive::new();
    if let Some(t) = k.time {
        keepalive = keepalive.with_time(t);
    }
    if let Some(i) = k.interval {
        keepalive = keepalive.with_interval(i);
    }
    if let Some(n) = k.probes {
        keepalive = keepalive.with_retries(n);
    }
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        debug!(error = %e, "cannot set TCP keepalive towards the proxy");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netio::http::{parse_request_head, CustomHeader, HttpVersion};
    use std::sync::Mutex;
    use tokio::io::AsyncReadExt;

    const ROUTE: (&str, &str) = (
        "X-Gardener-Destination",
        "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local",
    );

    fn request() -> ConnectRequest {
        let mut req = ConnectRequest::new("api.example.org.", 443);
        req.options.version = HttpVersion::Http11;
        req.options.custom_headers.push(CustomHeader::NameValue {
            name: ROUTE.0.into(),
            value: ROUTE.1.into(),
        });
        req
    }

    /// The proxy by name (`/etc/hosts`), its IPv4 address dialed.
    fn config(proxy: SocketAddr) -> TunnelProxyConfig {
        TunnelProxyConfig {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            proxy: ("localhost".into(), proxy.port()),
            family: AddressFamily::V4Only,
            refresh: Duration::from_secs(5),
            request: request(),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_connections: 2,
            buffer_size: 32 * 1024,
            keepalive: Some(Keepalive {
                time: Some(Duration::from_secs(7200)),
                interval: Some(Duration::from_secs(55)),
                probes: None,
            }),
        }
    }

    /// What the events saw, in order.
    #[derive(Debug, Default)]
    struct Seen(Mutex<Vec<String>>);

    impl Seen {
        fn push(&self, s: String) {
            self.0.lock().unwrap().push(s);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    impl TunnelEvents for Seen {
        fn accepted(&self, _: SocketAddr) {
            self.push("accepted".into());
        }
        fn overflowed(&self, _: SocketAddr) {
            self.push("overflowed".into());
        }
        fn resolved(&self, answered: bool) {
            self.push(format!("resolved {answered}"));
        }
        fn connected(&self, _: Duration) {
            self.push("connected".into());
        }
        fn closed(&self, r: &TunnelReport) {
            let outcome = match &r.outcome {
                Outcome::Relayed(end) => format!("relayed {end:?}"),
                Outcome::Refused { status } => format!("refused {status}"),
                Outcome::NoAddress => "no address".into(),
                o => format!("{o:?}"),
            };
            self.push(format!(
                "closed {outcome} {}/{} tunnel={}",
                r.to_proxy,
                r.from_proxy,
                r.tunnel.is_some()
            ));
        }
    }

    /// A proxy that checks the head, answers `status` (200: with `early` bytes after the
    /// head) and then echoes. Returns its address and the heads it read.
    async fn fake_proxy(
        status: u16,
        early: &'static [u8],
    ) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let head = loop {
                        let mut chunk = [0u8; 512];
                        let n = s.read(&mut chunk).await.unwrap();
                        assert!(n > 0, "closed before the head");
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some((head, _)) = parse_request_head(&buf).unwrap() {
                            break head;
                        }
                    };
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    let route = head
                        .headers
                        .iter()
                        .find(|h| h.is(ROUTE.0))
                        .map(|h| h.value.clone());
                    seen.lock().unwrap().push(text);
                    assert_eq!(route.as_deref(), Some(ROUTE.1));
                    let answer = format!("HTTP/1.1 {status} X\r\n\r\n");
                    s.write_all(answer.as_bytes()).await.unwrap();
                    if status != 200 {
                        return;
                    }
                    s.write_all(early).await.unwrap();
                    let (mut r, mut w) = s.split();
                    tokio::io::copy(&mut r, &mut w).await.unwrap();
                    w.shutdown().await.unwrap();
                });
            }
        });
        (addr, heads)
    }

    /// Sends `send`, half-closes, and reads until the proxy closes; a reset (the proxy
    /// closed with `send` unread) ends the reading as a close does.
    async fn exchange(local: SocketAddr, send: &[u8]) -> Vec<u8> {
        let mut c = TcpStream::connect(local).await.unwrap();
        c.write_all(send).await.unwrap();
        c.shutdown().await.unwrap();
        let mut back = Vec::new();
        if let Err(e) = c.read_to_end(&mut back).await {
            assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        }
        back
    }

    /// A tunnel proxy serving on a task.
    struct Running {
        local: SocketAddr,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        fn start(config: TunnelProxyConfig, events: Arc<Seen>) -> Running {
            let tp = TunnelProxy::bind(config, events).unwrap();
            let local = tp.local_addrs()[0];
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(tp.run(shutdown.clone()));
            Running {
                local,
                shutdown,
                task,
            }
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }
    }

    /// Waits (bounded) until the events show `n` closed connections.
    async fn closed(seen: &Seen, n: usize) -> Vec<String> {
        for _ in 0..500 {
            let got = seen.0.lock().unwrap().clone();
            if got.iter().filter(|s| s.starts_with("closed")).count() >= n {
                return seen.take();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never closed: {:?}", seen.take());
    }

    #[tokio::test]
    async fn tunnels_with_the_request_and_relays_the_bytes_after_the_200() {
        let (proxy, heads) = fake_proxy(200, b"early:").await;
        let seen = Arc::new(Seen::default());
        let running = Running::start(config(proxy), seen.clone());
        let local = running.local;
        assert_eq!(
            exchange(local, b"GET /version").await,
            b"early:GET /version"
        );
        assert_eq!(
            closed(&seen, 1).await,
            [
                "accepted",
                "resolved true",
                "connected",
                "closed relayed Closed 12/18 tunnel=true"
            ]
        );
        let head = heads.lock().unwrap()[0].clone();
        assert!(
            head.starts_with("CONNECT api.example.org.:443 HTTP/1.1\r\n"),
            "{head}"
        );
        // Within `refresh`, the next connection dials the addresses looked up before.
        assert_eq!(exchange(local, b"again").await, b"early:again");
        assert_eq!(
            closed(&seen, 1).await,
            [
                "accepted",
                "connected",
                "closed relayed Closed 5/11 tunnel=true"
            ]
        );
        running.stop().await;
    }

    #[tokio::test]
    async fn a_refused_connect_closes_the_client_without_a_byte() {
        let (proxy, _) = fake_proxy(403, b"").await;
        let seen = Arc::new(Seen::default());
        let running = Running::start(config(proxy), seen.clone());
        let local = running.local;
        assert!(exchange(local, b"GET /version").await.is_empty());
        assert_eq!(
            closed(&seen, 1).await,
            [
                "accepted",
                "resolved true",
                "closed refused 403 0/0 tunnel=false"
            ]
        );
        running.stop().await;
    }

    #[tokio::test]
    async fn no_address_of_the_family_and_a_dead_proxy_close_the_client() {
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let seen = Arc::new(Seen::default());
        let mut v6 = config(dead);
        v6.proxy.0 = "127.0.0.1".into();
        v6.family = AddressFamily::V6Only;
        let running = Running::start(v6, seen.clone());
        let local = running.local;
        assert!(exchange(local, b"x").await.is_empty());
        assert_eq!(
            closed(&seen, 1).await,
            [
                "accepted",
                "resolved true",
                "closed no address 0/0 tunnel=false"
            ]
        );
        running.stop().await;

        let running = Running::start(config(dead), seen.clone());
        let local = running.local;
        assert!(exchange(local, b"x").await.is_empty());
        let events = closed(&seen, 1).await;
        assert!(
            events[2].starts_with("closed ConnectFailed(Connect {"),
            "{events:?}"
        );
        running.stop().await;
    }

    #[tokio::test]
    async fn the_limit_closes_connections_beyond_it_at_accept() {
        let (proxy, _) = fake_proxy(200, b"").await;
        let seen = Arc::new(Seen::default());
        let running = Running::start(config(proxy), seen.clone());
        let local = running.local;
        // Two tunnels held open (the limit), a third closed at once.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(local).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut back = [0u8; 4];
            c.read_exact(&mut back).await.unwrap();
            held.push(c);
        }
        let mut third = TcpStream::connect(local).await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(third.read(&mut buf).await.unwrap(), 0);
        assert!(seen.take().contains(&"overflowed".to_owned()));
        drop(held);
        // The permits come back: a new connection is tunnelled again.
        closed(&seen, 2).await;
        assert_eq!(exchange(local, b"again").await, b"again");
        running.stop().await;
    }

    #[test]
    fn a_header_value_with_a_control_byte_is_refused_at_bind() {
        let mut c = config("127.0.0.1:1".parse().unwrap());
        c.request.options.custom_headers = vec![CustomHeader::NameValue {
            name: ROUTE.0.into(),
            value: "x\r\nX-Injected: 1".into(),
        }];
        let e = TunnelProxy::bind(c, Arc::new(NoEvents)).unwrap_err();
        assert!(matches!(e, TunnelProxyError::Request(_)), "{e}");
    }
}
