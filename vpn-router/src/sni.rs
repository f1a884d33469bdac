//! The TLS SNI passthrough listener (`kind = "sni"`): Gardener's port 443 → 9443 on the
//! Istio ingress gateway, which routes each connection by its ClientHello's server name to
//! the shoot's kube-apiserver without terminating TLS (reference section 2.5).
//!
//! Per connection ([`open`], then the relay), after admission as on every listener:
//!
//! 1. The PROXY stage, exactly as on CONNECT listeners (`netio::ingress::accept_proxy`: the
//!    listener's `proxy_protocol` and the TCP peer decide; refusals counted in
//!    `vpn_router_proxy_refused_total`).
//! 2. The ClientHello, read without terminating TLS ([`crate::client_hello`]): bytes are
//!    buffered until the first TLS records hold the whole ClientHello (split over TCP
//!    segments and over records alike), at most [`client_hello::MAX_BUFFERED`] bytes,
//!    complete within the header deadline (`[timeouts] header_ms`, from accept).
//! 3. The route: the server name, exactly (ASCII case ignored), among the `[[sni_route]]`
//!    names of one [`crate::Policy`] snapshot, then the route's rules ([`crate::access`], the
//!    same model as CONNECT routes: always-allowed first, then the first matching rule):
//!    [`crate::Policy::decide_sni`]. The `[[sni_route]]` tables are checked with the rest of
//!    the config (`crate::config`).
//! 4. Connect upstream, send it exactly the bytes read after the PROXY header (the
//!    ClientHello and anything behind it), then relay both ways ([`crate::relay`]).
//!
//! Every refusal closes the connection unanswered, with no upstream connection: not TLS,
//! a malformed or too large ClientHello, one without a server name, an unknown name, a
//! denial by the rules, the deadline; each counted in `vpn_router_sni_refused_total{reason}`
//! ([`SniRefusal`], decided by the policy; [`SniCounters`], part of [`crate::Counters`]; both
//! named here too) and logged at most once a second (with the number left out).

use std::net::SocketAddr;
use std::time::Duration;

use netio::ingress::{accept_proxy, IngressError, ProxyAccepted};
use netio::listen::PendingGuard;
use netio::report::chain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::field::display;
use tracing::{debug, info, warn, Span};

use crate::access::Client;
use crate::client_hello::{self, ClientHello, HelloError, ServerName};
use crate::config::ListenerConfig;
use crate::conn::{connect_upstream, read_unless_evicted, refused_head, Open, Shared};
use crate::shoots::{Flow, ShootRefusal};

pub use crate::metrics::SniCounters;
pub use crate::policy::SniRefusal;

/// Counts and logs a connection closed at accept on an SNI listener because
/// `max_connections` were open (a CONNECT listener answers 503 instead).
pub(crate) fn over_limit(shared: &Shared, span: &Span) {
    shared.counters.sni.refused(SniRefusal::OverLimit);
    span.in_scope(|| warn!("connection limit reached, closing"));
}

/// How reading the start of an SNI connection ended badly.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Proxy(IngressError),
    #[error("ClientHello refused")]
    Hello(#[source] HelloError),
    #[error("no complete ClientHello within {after:?}")]
    Timeout { after: Duration },
    #[error("client closed after {received} bytes, before the end of its ClientHello")]
    Closed { received: usize },
    #[error("reading the ClientHello failed")]
    Io(#[source] std::io::Error),
}

/// An SNI listener's ClientHello, route and upstream connect (see the module docs): the open
/// tunnel (the bytes read already sent upstream), or `None` once the connection was refused
/// (closed, counted and logged) or ended. Records `client` and `route` (the server name) in
/// the connection's span.
pub(crate) async fn open<'s>(
    mut stream: TcpStream,
    peer: SocketAddr,
    listener: &ListenerConfig,
    shared: &'s Shared,
    pending: PendingGuard,
) -> Option<Open<'s>> {
    let _ = stream.set_nodelay(true);
    let read = read_unless_evicted(&mut stream, pending, shared, "a ClientHello", async |s| {
        read_hello(s, peer, listener, shared).await
    })
    .await?;
    let (client, bytes, hello) = match read {
        Ok(read) => read,
        Err(e) => {
            refused_read(shared, &e);
            let _ = stream.shutdown().await;
            return None;
        }
    };
    Span::current().record("client", display(client));
    Span::current().record("route", display(&hello.server_name));
    let who = Client::new(client, peer.ip());
    let (upstream_name, shoot) = {
        // One snapshot decides this connection, whatever a reload does meanwhile.
        let policy = shared.snapshot();
        let shoot = policy
            .sni_routes
            .get(&hello.server_name)
            .and_then(|t| t.shoot.as_deref())
            .and_then(|name| shared.counters.shoots.get(name));
        match policy.decide_sni(&hello.server_name, who) {
            Ok(target) => (target.upstream.clone(), shoot),
            Err(why) => {
                if let (SniRefusal::Denied(_), Some(shoot)) = (&why, &shoot) {
                    shoot.refused(Flow::Sni, ShootRefusal::Denied);
                }
                refused(shared, why, &hello.server_name, &why);
                let _ = stream.shutdown().await;
                return None;
            }
        }
    };
    let mut upstream = match connect_upstream(shared, &upstream_name).await {
        Ok(s) => s,
        Err((why, what)) => {
            if let Some(shoot) = &shoot {
                shoot.refused(Flow::Sni, why);
            }
            let detail = format!("upstream {upstream_name} {what}");
            refused(shared, SniRefusal::Upstream, &hello.server_name, &detail);
            return None;
        }
    };
    if upstream.write_all(&bytes).await.is_err() {
        return None;
    }
    shared.counters.sni.tunnel_opened();
    debug!(upstream = %upstream_name, "passthrough open");
    Some(Open {
        client: stream,
        upstream,
        early: bytes.len() as u64,
        active: shared.counters.tunnel_opened(),
        shoot: shoot.map(|s| s.tunnel_opened(Flow::Sni)),
    })
}

/// The PROXY stage, then the ClientHello within the header deadline (both from accept): the
/// client address, every byte read after the PROXY header, and the hello.
async fn read_hello(
    stream: &mut TcpStream,
    peer: SocketAddr,
    listener: &ListenerConfig,
    shared: &Shared,
) -> Result<(std::net::IpAddr, Vec<u8>, ClientHello), ReadError> {
    let start = Instant::now();
    let deadlines = shared.config.deadlines;
    let ProxyAccepted {
        client, mut buf, ..
    } = accept_proxy(stream, peer, &listener.proxy, deadlines)
        .await
        .map_err(ReadError::Proxy)?;
    let read = async {
        loop {
            if let Some(hello) = client_hello::parse(&buf).map_err(ReadError::Hello)? {
                return Ok(hello);
            }
            let room = client_hello::MAX_BUFFERED.saturating_sub(buf.len());
            if room == 0 {
                return Err(ReadError::Hello(HelloError::TooLarge {
                    len: buf.len(),
                    records: 0,
                }));
            }
            let mut scratch = [0u8; 4096];
            let n = stream
                .read(&mut scratch[..room.min(4096)])
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(ReadError::Closed {
                    received: buf.len(),
                });
            }
            buf.extend_from_slice(&scratch[..n]);
        }
    };
    let hello = tokio::time::timeout_at(start + deadlines.header, read)
        .await
        .map_err(|_| ReadError::Timeout {
            after: deadlines.header,
        })??;
    Ok((client, buf, hello))
}

/// Counts and logs a connection whose start was refused: PROXY-stage failures as on CONNECT
/// listeners; a client that left at debug; the rest by [`SniRefusal`].
fn refused_read(shared: &Shared, e: &ReadError) {
    let why = match e {
        ReadError::Proxy(e) => return refused_head(shared, e),
        ReadError::Closed { .. } | ReadError::Io(_) => {
            debug!("connection ended before a ClientHello: {}", chain(e));
            return;
        }
        ReadError::Timeout { .. } => {
            shared.counters.pending_timed_out();
            SniRefusal::Timeout
        }
        ReadError::Hello(h) => SniRefusal::of(h),
    };
    let total = shared.counters.sni.refused(why);
    match shared.log(|l| &mut l.sni) {
        Some(unlogged) => info!(
            reason = why.label(),
            refused_total = total,
            unlogged,
            "SNI refused: {}",
            chain(e)
        ),
        None => debug!(reason = why.label(), "SNI refused: {}", chain(e)),
    }
}

/// Counts and logs (at most once a second) a ClientHello refused after parsing.
fn refused(shared: &Shared, why: SniRefusal, name: &ServerName, detail: &dyn std::fmt::Display) {
    let total = shared.counters.sni.refused(why);
    match shared.log(|l| &mut l.sni) {
        Some(unlogged) => info!(
            reason = why.label(),
            server_name = %name,
            refused_total = total,
            unlogged,
            "SNI refused: {detail}"
        ),
        None => debug!(reason = why.label(), server_name = %name, "SNI refused: {detail}"),
    }
}
