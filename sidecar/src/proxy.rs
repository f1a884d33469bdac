//! One connection of the sidecar: TLS, the CONNECT head, the checks, the upstream connect and
//! the relay. See the parent module for the flow.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use netio::ingress::{accept_connect, Accepted, Deadlines, IngressError, ProxyMode};
use netio::listen::{Admitted, LogLimiter, PendingGuard, PendingSet, LOG_EVERY};
use netio::relay::{relay, RelayConfig, RelayEnd};
use netio::report::chain;
use netio::tcp::connect_first;
use openssl::nid::Nid;
use openssl::ssl::{ErrorCode, Ssl, SslAcceptor};
use protocol::http::connect::{Authority, ConnectHead, Host, RequestError, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use tokio_openssl::SslStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, Instrument as _, Span};

use super::access_log::{self, Entry};
use super::dns::{DnsCache, DnsError};
use super::hold::{Held, HeldSet};
use super::metrics::{HoldEnd, SidecarMetrics};
use super::policy::{Denied, Destination};
use super::{RouteCheck, SidecarConfig, HOLD_RETRY, SLOW_REQUEST};

/// State shared by every connection of one sidecar.
pub(super) struct Shared {
    pub(super) config: SidecarConfig,
    pub(super) acceptor: SslAcceptor,
    pub(super) routes: Option<Arc<dyn RouteCheck>>,
    pub(super) permits: Arc<Semaphore>,
    /// Connections before their CONNECT head (`max_pending`, oldest evicted first).
    pub(super) pending: PendingSet,
    pub(super) metrics: Arc<SidecarMetrics>,
    pub(super) dns: DnsCache,
    /// One line a second at most for each event a flood repeats.
    pub(super) logs: Mutex<FloodLogs>,
    /// CONNECTs waiting for a route (`max_held`), and their reconnect window.
    pub(super) held: HeldSet,
    /// Accepted connections not yet ended, and a wake-up when that falls to 0 (the drain).
    pub(super) open: AtomicUsize,
    pub(super) idle: Notify,
}

/// The events before the head that a flood repeats, each logged at most once per
/// [`LOG_EVERY`] (all are counted).
#[derive(Debug)]
pub(super) struct FloodLogs {
    evicted: LogLimiter,
    timeout: LogLimiter,
    tls_failed: LogLimiter,
}

impl Default for FloodLogs {
    fn default() -> Self {
        FloodLogs {
            evicted: LogLimiter::new(LOG_EVERY),
            timeout: LogLimiter::new(LOG_EVERY),
            tls_failed: LogLimiter::new(LOG_EVERY),
        }
    }
}

impl Shared {
    /// Accepted connections not yet ended.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until no connection is open or `deadline`; whether none is.
    pub(super) async fn idle_by(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let mut notified = std::pin::pin!(self.idle.notified());
            notified.as_mut().enable();
            if self.open() == 0 {
                return true;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return self.open() == 0,
            }
        }
    }
    /// Whether to log a flood event now: `Some(n)` with the events of its kind not logged
    /// since the last line.
    fn log(&self, kind: impl FnOnce(&mut FloodLogs) -> &mut LogLimiter) -> Option<u64> {
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        kind(&mut logs).allow(Instant::now())
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

/// One accepted connection: counted open until dropped.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> OpenGuard {
        shared.open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Accepts until `accepting` is cancelled, then takes the connections the kernel has queued
/// (their handshakes completed before the listener closes: closing it with them queued
/// would reset them) and closes the listener; each connection is served until it ends or
/// `cut` is cancelled.
pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    accepting: CancellationToken,
    cut: CancellationToken,
    tracker: TaskTracker,
) {
    while let Some((stream, peer)) = netio::listen::accept(&listener, &accepting).await {
        spawn_connection(&shared, stream, peer, &cut, &tracker);
    }
    for (stream, peer) in queued(listener) {
        spawn_connection(&shared, stream, peer, &cut, &tracker);
    }
}

/// The connections waiting in `listener`'s queue, taken without waiting (at most
/// [`netio::listen::BACKLOG`]); the listener is closed after.
fn queued(listener: TcpListener) -> Vec<(TcpStream, SocketAddr)> {
    let Ok(listener) = listener.into_std() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..netio::listen::BACKLOG {
        match listener.accept() {
            Ok((stream, peer)) => {
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream));
                if let Ok(stream) = stream {
                    out.push((stream, peer));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // `WouldBlock`: none left.
            Err(_) => break,
        }
    }
    out
}

/// Serves one accepted connection on its own task, counted open until it ends.
fn spawn_connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    cut: &CancellationToken,
    tracker: &TaskTracker,
) {
    let open = OpenGuard::new(shared);
    let Admitted {
        guard: pending,
        evicted,
    } = shared.pending.admit();
    if let Some(e) = evicted {
        let total = shared.metrics.pending_evicted();
        if let Some(unlogged) = shared.log(|l| &mut l.evicted) {
            info!(
                max_pending = shared.config.max_pending,
                handshake_done = e.proven,
                evicted_total = total,
                unlogged,
                "pending connections full: the oldest was closed for a new one"
            );
        }
    }
    let _ = stream.set_nodelay(true);
    let shared = Arc::clone(shared);
    let cut = cut.clone();
    let span = tracing::info_span!("sidecar_conn", %peer, target = tracing::field::Empty);
    tracker.spawn(
        async move {
            let opened = Instant::now();
            shared.metrics.downstream_opened();
            tokio::select! {
                _ = cut.cancelled() => {}
                _ = serve(&shared, stream, peer, pending) => {}
            }
            shared.metrics.downstream_closed(opened.elapsed());
            drop(open);
        }
        .instrument(span),
    );
}

/// What one request came to, for the access logs.
struct Outcome {
    status: u16,
    target: String,
    detail: String,
    /// Envoy's response flags (see `access_log`).
    flags: &'static str,
    upstream: Option<SocketAddr>,
    to_upstream: u64,
    from_upstream: u64,
}

impl Outcome {
    fn refused(r: Refusal, target: &str) -> Self {
        Outcome {
            status: r.status.code,
            target: target.to_owned(),
            detail: r.detail,
            flags: r.flags,
            upstream: r.upstream,
            to_upstream: 0,
            from_upstream: 0,
        }
    }
}

/// One request as the access logs see it: when and from whom, and its head if it parsed.
struct Request<'h> {
    start: SystemTime,
    started: Instant,
    peer: SocketAddr,
    head: Option<&'h ConnectHead>,
    /// The method of a head refused for its method.
    method: Option<&'h str>,
    request_id: Option<String>,
}

async fn serve(shared: &Shared, tcp: TcpStream, peer: SocketAddr, pending: PendingGuard) {
    let start = SystemTime::now();
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started + shared.config.header_timeout);
    let gauge = shared.metrics.pending_opened();
    let handshake = tokio::select! {
        r = tokio::time::timeout_at(deadline, handshake(shared, tcp)) => r,
        () = pending.evicted() => {
            debug!("evicted in the TLS handshake, for a newer connection; closed");
            return;
        }
    };
    let mut tls = match handshake {
        Err(_) => {
            let total = shared.metrics.pending_timed_out();
            match shared.log(|l| &mut l.timeout) {
                Some(unlogged) => info!(
                    timeouts_total = total,
                    unlogged, "no TLS handshake within the header timeout; closed"
                ),
                None => debug!("no TLS handshake within the header timeout; closed"),
            }
            return;
        }
        Ok(Err(e)) => {
            // A TCP probe (Gardener's liveness check on 9443) connects and closes: no bytes,
            // no failure worth a log line.
            if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() {
                debug!("closed before the TLS handshake");
            } else {
                shared.metrics.tls_failed();
                match shared.log(|l| &mut l.tls_failed) {
                    Some(unlogged) => info!(error = %e, unlogged, "sidecar TLS handshake failed"),
                    None => debug!(error = %e, "sidecar TLS handshake failed"),
                }
            }
            return;
        }
        Ok(Ok(tls)) => tls,
    };
    // A client certificate the CA signed (when required): evicted only after every
    // connection still in its handshake.
    pending.prove();
    // The rest of the header timeout for the head, on the strict CONNECT parser every
    // ingress of ours uses.
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let deadlines = Deadlines {
        proxy_header: left,
        header: left,
    };
    let mut request = Request {
        start,
        started,
        peer,
        head: None,
        method: None,
        request_id: None,
    };
    let accepted = tokio::select! {
        a = accept_connect(&mut tls, peer, &ProxyMode::Off, deadlines) => a,
        () = pending.evicted() => {
            debug!("evicted before its CONNECT head, for a newer connection; closed");
            return;
        }
    };
    drop(pending);
    drop(gauge);
    if let Err(IngressError::HeaderTimeout { .. }) = &accepted {
        shared.metrics.pending_timed_out();
    }
    let Accepted { head, early, .. } = match accepted {
        Ok(a) => a,
        Err(e) => {
            match e.status() {
                Some(status) => {
                    let refused = Refusal::new(status, chain(&e));
                    if let IngressError::Request(RequestError::Method { method }) = &e {
                        shared.metrics.not_routed();
                        request.method = Some(method);
                    }
                    refuse(&mut tls, shared, status).await;
                    log(shared, &request, &tls, &Outcome::refused(refused, "-"));
                }
                None => debug!(error = %chain(&e), "closed before a CONNECT head"),
            }
            return;
        }
    };
    shared.metrics.routed();
    let target = head.authority.to_string();
    Span::current().record("target", target.as_str());
    if !shared.config.access_logs.is_empty() {
        request.request_id = Some(
            head.header_values("x-request-id")
                .next()
                .map_or_else(access_log::request_id, str::to_owned),
        );
    }
    request.head = Some(&head);
    let outcome = tunnel(shared, &mut tls, &head.authority, &target, early).await;
    log(shared, &request, &tls, &outcome);
}

/// The TLS handshake of one connection.
async fn handshake(
    shared: &Shared,
    tcp: TcpStream,
) -> Result<SslStream<TcpStream>, openssl::ssl::Error> {
    let ssl = Ssl::new(shared.acceptor.context())?;
    let mut tls = SslStream::new(ssl, tcp)?;
    Pin::new(&mut tls).accept().await?;
    Ok(tls)
}

/// A refused request: the status line to answer, the access-log detail and Envoy's flags.
struct Refusal {
    status: Status,
    detail: String,
    flags: &'static str,
    /// The address a failed connect went to (the last one tried).
    upstream: Option<SocketAddr>,
}

impl Refusal {
    fn new(status: Status, detail: impl Into<String>) -> Self {
        Refusal {
            status,
            detail: detail.into(),
            flags: "-",
            upstream: None,
        }
    }

    fn flagged(mut self, flags: &'static str) -> Self {
        self.flags = flags;
        self
    }

    fn dialed(mut self, upstream: Option<SocketAddr>) -> Self {
        self.upstream = upstream;
        self
    }
}

/// Checks the request, connects and relays; the answer has been sent when it returns.
async fn tunnel(
    shared: &Shared,
    tls: &mut SslStream<TcpStream>,
    authority: &Authority,
    target: &str,
    early: Vec<u8>,
) -> Outcome {
    let (upstream, _permit, waited) = match open(shared, authority, target).await {
        Ok(opened) => opened,
        Err(r) => {
            refuse(tls, shared, r.status).await;
            return Outcome::refused(r, target);
        }
    };
    let mut outcome = relay_tunnel(shared, tls, upstream, target, early).await;
    if let Some(w) = waited {
        // Reported with the request: a slow one is logged anyway, and says why.
        let ms = w.as_millis();
        outcome.detail = if outcome.detail.is_empty() {
            format!("waited {ms} ms for a route")
        } else {
            format!("waited {ms} ms for a route; {}", outcome.detail)
        };
    }
    outcome
}

/// Everything before the `200` (the method and the target's form were checked with the
/// head): name lookup, policy, mapping, route check (holding the request while no route is
/// there, up to `hold_timeout`), concurrency limit, connect. Nothing is dialed unless every
/// check passed. With the connection: how long it waited for a route, if it did.
async fn open(
    shared: &Shared,
    authority: &Authority,
    target: &str,
) -> Result<(TcpStream, OwnedSemaphorePermit, Option<Duration>), Refusal> {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let allowed = destinations(shared, authority).await?;
    let hold_until = tokio::time::Instant::now() + config.hold_timeout;
    let mut held: Option<Held<'_>> = None;
    let candidates = match &shared.routes {
        Some(routes) => {
            routed_candidates(
                shared,
                routes.as_ref(),
                &allowed,
                target,
                hold_until,
                &mut held,
            )
            .await?
        }
        None => allowed
            .iter()
            .map(|(a, d)| mapped(shared, *a, *d))
            .collect(),
    };
    let mut waited = held.take().map(|h| h.end(HoldEnd::Routed));
    let Ok(permit) = Arc::clone(&shared.permits).try_acquire_owned() else {
        metrics.overflowed();
        return Err(Refusal::new(
            Status::SERVICE_UNAVAILABLE,
            format!("{} tunnels open (limit)", config.max_connections),
        )
        .flagged("UO"));
    };
    let had_shoot = allowed.iter().any(|(_, d)| *d == Destination::Shoot);
    let last = candidates.last().copied();
    loop {
        let started = Instant::now();
        let attempt =
            tokio::time::timeout(config.connect_timeout, connect_first(candidates.clone()));
        let e = match attempt.await {
            Ok(Ok(upstream)) => {
                metrics.upstream_opened(started.elapsed());
                if let Some(h) = held.take() {
                    waited = Some(h.end(HoldEnd::Routed));
                }
                return Ok((upstream, permit, waited));
            }
            Ok(Err(e)) => e,
            Err(_) => {
                metrics.connect_failed(true);
                return Err(Refusal::new(
                    Status::GATEWAY_TIMEOUT,
                    format!(
                        "upstream connect timed out after {:?}",
                        config.connect_timeout
                    ),
                )
                .flagged("UF")
                .dialed(last));
            }
        };
        // Alone, no route is the kernel's answer (the tun device gone, or our server's ICMP
        // unreachable; on a loaded host that answer can also end the connect without an
        // error, `NotConnected` from `netio::tcp`): wait as in process, dialing again since
        // nothing tells us when.
        let no_route = matches!(
            e.kind(),
            io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::NotConnected
        );
        // The last attempt is at the bound itself: never refused before it.
        let now = tokio::time::Instant::now();
        if shared.routes.is_none() && had_shoot && no_route && now < hold_until {
            if held.is_none() {
                held = shared
                    .held
                    .enter(config.max_held, config.hold_timeout, target, metrics);
            }
            if held.is_some() {
                tokio::time::sleep_until((now + HOLD_RETRY).min(hold_until)).await;
                continue;
            }
        }
        let detail = match held.take() {
            Some(h) if no_route => {
                h.end(HoldEnd::Timeout);
                format!(
                    "no route to the destination within the hold bound ({:?}): {e}",
                    config.hold_timeout
                )
            }
            _ => format!("upstream connect failed: {e}"),
        };
        metrics.connect_failed(false);
        return Err(Refusal::new(Status::SERVICE_UNAVAILABLE, detail)
            .flagged("UF")
            .dialed(last));
    }
}

/// `a` as dialed: a shoot address through vpn2's mapping, an external one as it is.
fn mapped(shared: &Shared, a: SocketAddr, d: Destination) -> SocketAddr {
    match d {
        Destination::External => a,
        Destination::Shoot => SocketAddr::new(shared.config.netmap.map(a.ip()), a.port()),
    }
}

/// In process: the allowed addresses a client routes (every external one). When a shoot
/// address is allowed and none is routed, the request waits (`held`) for the server's routes
/// to change until `hold_until`; 503 at the bound, or at once when `max_held` wait already.
async fn routed_candidates<'a>(
    shared: &'a Shared,
    routes: &dyn RouteCheck,
    allowed: &[(SocketAddr, Destination)],
    target: &str,
    hold_until: tokio::time::Instant,
    held: &mut Option<Held<'a>>,
) -> Result<Vec<SocketAddr>, Refusal> {
    let config = &shared.config;
    let had_shoot = allowed.iter().any(|(_, d)| *d == Destination::Shoot);
    let mut changes = routes.changes();
    loop {
        // Seen before the check: a change after it wakes the wait below.
        changes.borrow_and_update();
        let candidates: Vec<SocketAddr> = allowed
            .iter()
            .map(|(a, d)| (mapped(shared, *a, *d), *d))
            .filter(|(a, d)| *d == Destination::External || routes.has_route(a.ip()))
            .map(|(a, _)| a)
            .collect();
        if !candidates.is_empty() || !had_shoot {
            return Ok(candidates);
        }
        let refusal = |detail: String| {
            shared.metrics.no_route();
            Err(Refusal::new(Status::SERVICE_UNAVAILABLE, detail).flagged("UH"))
        };
        if held.is_none() {
            if config.hold_timeout.is_zero() {
                return refusal("no VPN client routes the destination".into());
            }
            *held = shared.held.enter(
                config.max_held,
                config.hold_timeout,
                target,
                &shared.metrics,
            );
            if held.is_none() {
                return refusal(format!(
                    "no VPN client routes the destination, and {} requests already wait for one",
                    config.max_held
                ));
            }
        }
        let changed = tokio::time::timeout_at(hold_until, changes.changed()).await;
        if !matches!(changed, Ok(Ok(()))) {
            if let Some(h) = held.take() {
                h.end(HoldEnd::Timeout);
            }
            return refusal(format!(
                "no VPN client routed the destination within the hold bound ({:?})",
                config.hold_timeout
            ));
        }
    }
}

/// The addresses the policy allows for the target, with where each goes: the literal, or
/// every resolved address that passes (403 when none does). An external address of this
/// host is refused too.
async fn destinations(
    shared: &Shared,
    authority: &Authority,
) -> Result<Vec<(SocketAddr, Destination)>, Refusal> {
    let config = &shared.config;
    let port = authority.port;
    let resolved: Vec<IpAddr> = match &authority.host {
        Host::Ipv4(a) => vec![IpAddr::V4(*a)],
        Host::Ipv6(a) => vec![IpAddr::V6(*a)],
        Host::Name(name) => {
            let timeout = config.connect_timeout;
            let now = Instant::now();
            let lookup = shared
                .dns
                .resolve(name, port, now, timeout, &shared.metrics);
            match lookup.await {
                Ok(addrs) => addrs,
                Err(e) => {
                    let (status, flags) = match e {
                        DnsError::Overflow { .. } => (Status::SERVICE_UNAVAILABLE, "UO"),
                        DnsError::Timeout(_) => (Status::GATEWAY_TIMEOUT, "DF"),
                        DnsError::Failed(_) | DnsError::NoAddress(_) => {
                            (Status::SERVICE_UNAVAILABLE, "DF")
                        }
                    };
                    return Err(Refusal::new(status, chain(&e)).flagged(flags));
                }
            }
        }
    };
    let mut first_denial: Option<Denied> = None;
    let allowed: Vec<(SocketAddr, Destination)> = resolved
        .into_iter()
        .filter_map(|ip| {
            let checked = config
                .policy
                .check_with(ip, &config.netmap)
                .and_then(|d| match d {
                    Destination::External if is_local(ip) => Err(Denied::Local),
                    d => Ok(d),
                });
            match checked {
                Ok(d) => Some((SocketAddr::new(ip, port), d)),
                Err(why) => {
                    first_denial.get_or_insert(why);
                    None
                }
            }
        })
        .collect();
    if allowed.is_empty() {
        let why = first_denial.unwrap_or(Denied::NotShoot);
        shared.metrics.denied(why);
        let detail = match authority.host {
            Host::Name(_) => format!("resolved to a {why}"),
            _ => why.to_string(),
        };
        return Err(Refusal::new(Status::FORBIDDEN, detail));
    }
    Ok(allowed)
}

/// Whether `ip` is an address of this host (of the pod's network namespace): binding a UDP
/// socket to it succeeds only then (with `ip_nonlocal_bind` off, the default). Such an
/// address would reach the pod's own listeners.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip.to_canonical(), 0)).is_ok()
}

/// Answers `200`, forwards the bytes that came with the head, relays to the end.
async fn relay_tunnel(
    shared: &Shared,
    tls: &mut SslStream<TcpStream>,
    mut upstream: TcpStream,
    target: &str,
    early: Vec<u8>,
) -> Outcome {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let opened = Instant::now();
    let mut ok = Vec::with_capacity(48);
    Status::ESTABLISHED.encode(&mut ok);
    metrics.responded(Status::ESTABLISHED.code);
    let mut outcome = Outcome {
        status: 200,
        target: target.to_owned(),
        detail: String::new(),
        flags: "-",
        upstream: upstream.peer_addr().ok(),
        to_upstream: 0,
        from_upstream: 0,
    };
    if let Err(e) = tls.write_all(&ok).await {
        outcome.detail = format!("writing the 200 failed: {e}");
        metrics.upstream_closed(opened.elapsed(), 0, 0);
        return outcome;
    }
    if !early.is_empty() {
        if let Err(e) = upstream.write_all(&early).await {
            outcome.detail = format!("forwarding early bytes failed: {e}");
            metrics.upstream_closed(opened.elapsed(), 0, 0);
            return outcome;
        }
    }
    let relay_config = RelayConfig {
        idle_timeout: config.idle_timeout,
        ..RelayConfig::default()
    };
    match relay(tls, &mut upstream, relay_config).await {
        Ok(stats) => {
            outcome.to_upstream = stats.a_to_b + early.len() as u64;
            outcome.from_upstream = stats.b_to_a;
            if stats.end == RelayEnd::Idle {
                metrics.idle_timeout();
                outcome.detail = format!("idle for {:?}", config.idle_timeout);
                outcome.flags = "SI";
            }
        }
        Err(e) => {
            outcome.to_upstream = e.a_to_b + early.len() as u64;
            outcome.from_upstream = e.b_to_a;
            outcome.detail = format!("relay ended: {}", e.source);
        }
    }
    metrics.upstream_closed(opened.elapsed(), outcome.to_upstream, outcome.from_upstream);
    outcome
}

/// Answers a refusal and closes (`netio::ingress::refuse`: what the client sends meanwhile is
/// read and discarded, never looked at); best effort.
async fn refuse(tls: &mut SslStream<TcpStream>, shared: &Shared, status: Status) {
    shared.metrics.responded(status.code);
    netio::ingress::refuse(tls, Some(status)).await;
}

/// The access logs of one request: our `info` line for a failure (status other than 200, or
/// a relay error) or a request of at least [`SLOW_REQUEST`] (`debug` when Envoy's log is
/// written); Envoy's line on stdout when its filter selects the request.
fn log(shared: &Shared, request: &Request<'_>, tls: &SslStream<TcpStream>, o: &Outcome) {
    let duration = request.started.elapsed();
    let envoy_logs = &shared.config.access_logs;
    if !envoy_logs.is_empty() {
        let head = request.head;
        let header = |name: &str| {
            let found = head.and_then(|h| h.headers.iter().find(|x| x.is(name)));
            found.map(|x| x.value.as_str())
        };
        let entry = Entry {
            start: request.start,
            method: head
                .map(|_| protocol::http::connect::CONNECT)
                .or(request.method),
            protocol: head.map(|h| h.version.as_str()),
            status: o.status,
            flags: o.flags,
            bytes_received: o.to_upstream,
            bytes_sent: o.from_upstream,
            duration,
            downstream: request.peer,
            request_id: request.request_id.as_deref(),
            authority: head.map(|_| o.target.as_str()),
            upstream: o.upstream,
            header: &header,
        };
        access_log::write(envoy_logs, &entry);
    }
    if o.status == 200 && o.detail.is_empty() && duration < SLOW_REQUEST {
        return;
    }
    let cn = tls
        .ssl()
        .peer_certificate()
        .and_then(|c| {
            c.subject_name()
                .entries_by_nid(Nid::COMMONNAME)
                .next()
                .and_then(|e| e.data().to_string().ok())
        })
        .unwrap_or_else(|| "-".into());
    let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    macro_rules! line {
        ($level:ident) => {
            $level!(
                // The target it had inside vpn-server: log filters and readers name it.
                target: "vpn_server::sidecar::access",
                peer = %request.peer,
                client_cn = %cn,
                target_addr = %o.target,
                status = o.status,
                duration_ms,
                bytes_up = o.to_upstream,
                bytes_down = o.from_upstream,
                detail = %o.detail,
                "CONNECT"
            )
        };
    }
    if envoy_logs.is_empty() {
        line!(info);
    } else {
        line!(debug);
    }
}
