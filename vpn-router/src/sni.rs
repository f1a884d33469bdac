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
//!    names of one [`Policy`] snapshot, then the route's rules ([`crate::access`], the same
//!    model as CONNECT routes: always-allowed first, then the first matching rule).
//! 4. Connect upstream, send it exactly the bytes read after the PROXY header (the
//!    ClientHello and anything behind it), then relay both ways ([`crate::relay`]).
//!
//! Every refusal closes the connection unanswered, with no upstream connection: not TLS,
//! a malformed or too large ClientHello, one without a server name, an unknown name, a
//! denial by the rules, the deadline; each counted in `vpn_router_sni_refused_total{reason}`
//! ([`SniRefusal`]) and logged at most once a second (with the number left out).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netio::admin::{Exposition, Kind};
use netio::ingress::{accept_proxy, IngressError, ProxyAccepted};
use netio::listen::PendingGuard;
use netio::report::chain;
use protocol::http::route::check_namespace;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::field::display;
use tracing::{debug, info, warn, Span};

use crate::access::{admits, Client, Denial};
use crate::client_hello::{self, ClientHello, HelloError, ServerName};
use crate::config::{check_upstream, rules, ConfigError, ListenerConfig, RawRule};
use crate::policy::{Policy, Target};
use crate::serve::{refused_head, Open, Shared};
use crate::shoots::{Flow, ShootRefusal};

/// One `[[sni_route]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSniRoute {
    server_names: Vec<String>,
    upstream: String,
    allow: Option<Vec<String>>,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
    /// The shoot whose series count the route (a namespace such as `shoot--p--a`); in a
    /// shoot's file of `--config-dir`, that file's shoot whether given or not.
    shoot: Option<String>,
}

/// Checks the `[[sni_route]]` tables: every name a DNS host name, no name twice, the
/// upstream `host:port`, the rules as for CONNECT routes, the shoot a namespace.
pub(crate) fn check_routes(
    raw: Vec<RawSniRoute>,
) -> Result<std::collections::HashMap<ServerName, Target>, ConfigError> {
    let mut routes = std::collections::HashMap::new();
    for route in raw {
        let Some(first) = route.server_names.first() else {
            return Err(ConfigError::NoServerNames {
                upstream: route.upstream,
            });
        };
        check_upstream(&route.upstream)?;
        if let Some(shoot) = &route.shoot {
            check_namespace(shoot).map_err(|source| ConfigError::SniShoot {
                shoot: shoot.clone(),
                source,
            })?;
        }
        let target = Target {
            rules: rules(route.allow.as_deref(), &route.rules, first)?,
            upstream: route.upstream,
            shoot: route.shoot,
        };
        for name in &route.server_names {
            let key =
                ServerName::parse(name.as_bytes()).map_err(|source| ConfigError::ServerName {
                    name: name.clone(),
                    source,
                })?;
            if routes.contains_key(&key) {
                return Err(ConfigError::DuplicateServerName {
                    name: key.to_string(),
                });
            }
            routes.insert(key, target.clone());
        }
    }
    Ok(routes)
}

impl Policy {
    /// Decides a ClientHello's `name` from `who`: an exact `[[sni_route]]` name (stored and
    /// compared in lower case), then its rules ([`admits`]).
    pub fn decide_sni(&self, name: &ServerName, who: Client) -> Result<&Target, SniRefusal> {
        let Some(target) = self.sni_routes.get(name) else {
            return Err(SniRefusal::Unknown);
        };
        admits(&target.rules, &self.always_allowed, who).map_err(SniRefusal::Denied)?;
        Ok(target)
    }
}

/// Why an SNI connection was closed before its upstream: the `reason` of
/// `vpn_router_sni_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SniRefusal {
    /// The first bytes (after any PROXY header) are not a TLS handshake record.
    #[error("not TLS")]
    NotTls,
    /// A malformed ClientHello, or a server name that is no DNS host name.
    #[error("malformed ClientHello")]
    Malformed,
    /// A ClientHello over the size or record bound.
    #[error("ClientHello too large")]
    TooLarge,
    /// A ClientHello without a server name.
    #[error("no server name")]
    NoSni,
    /// A server name no `[[sni_route]]` lists.
    #[error("no route for the server name")]
    Unknown,
    /// The route's rules do not admit the connection.
    #[error("denied: {0}")]
    Denied(Denial),
    /// The ClientHello was not complete within the header deadline.
    #[error("no complete ClientHello in time")]
    Timeout,
    /// Connecting upstream failed or timed out.
    #[error("upstream connect failed")]
    Upstream,
    /// `max_connections` were open already (closed at accept, unread).
    #[error("connection limit reached")]
    OverLimit,
}

impl SniRefusal {
    /// Every `reason` label, in counter order.
    pub const LABELS: [&'static str; 9] = [
        "not_tls",
        "malformed",
        "too_large",
        "no_sni",
        "unknown",
        "denied",
        "timeout",
        "upstream",
        "over_limit",
    ];

    fn index(self) -> usize {
        match self {
            SniRefusal::NotTls => 0,
            SniRefusal::Malformed => 1,
            SniRefusal::TooLarge => 2,
            SniRefusal::NoSni => 3,
            SniRefusal::Unknown => 4,
            SniRefusal::Denied(_) => 5,
            SniRefusal::Timeout => 6,
            SniRefusal::Upstream => 7,
            SniRefusal::OverLimit => 8,
        }
    }

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        Self::LABELS[self.index()]
    }

    fn of(e: &HelloError) -> Self {
        match e {
            HelloError::NotTls => SniRefusal::NotTls,
            HelloError::Malformed { .. } | HelloError::Name(_) => SniRefusal::Malformed,
            HelloError::TooLarge { .. } => SniRefusal::TooLarge,
            HelloError::NoServerName => SniRefusal::NoSni,
        }
    }
}

/// The SNI listeners' counters (part of [`crate::Counters`]).
#[derive(Debug, Default)]
pub struct SniCounters {
    refused: [AtomicU64; SniRefusal::LABELS.len()],
    tunnels: AtomicU64,
}

impl SniCounters {
    /// Connections refused so far with the reason labelled `label`.
    pub fn refused_total(&self, label: &str) -> u64 {
        SniRefusal::LABELS
            .iter()
            .position(|l| *l == label)
            .map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Passthrough tunnels opened so far.
    pub fn tunnels_total(&self) -> u64 {
        self.tunnels.load(Ordering::Relaxed)
    }

    fn refused(&self, why: SniRefusal) -> u64 {
        self.refused[why.index()].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Appends `vpn_router_sni_refused_total` and `vpn_router_sni_tunnels_total`.
    pub(crate) fn metrics(&self, out: &mut Exposition) {
        let name = "vpn_router_sni_refused_total";
        out.family(
            name,
            Kind::Counter,
            "SNI connections closed before an upstream, by reason.",
        );
        for (label, n) in SniRefusal::LABELS.iter().zip(&self.refused) {
            out.sample(name, &[("reason", label)], n.load(Ordering::Relaxed));
        }
        out.single(
            "vpn_router_sni_tunnels_total",
            Kind::Counter,
            "SNI passthrough tunnels opened.",
            self.tunnels_total(),
        );
    }
}

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
    let gauge = shared.counters.pending_opened();
    let read = tokio::select! {
        r = read_hello(&mut stream, peer, listener, shared) => r,
        () = pending.evicted() => {
            debug!("evicted before a ClientHello, for a newer connection; closed");
            let _ = stream.shutdown().await;
            return None;
        }
    };
    drop(pending);
    drop(gauge);
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
    let connect = tokio::time::timeout(
        shared.config.connect_timeout,
        crate::serve::connect(&upstream_name),
    )
    .await;
    let connect = match connect {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err((
            ShootRefusal::ConnectFailed,
            format!("upstream {upstream_name} connect failed: {e}"),
        )),
        Err(_) => Err((
            ShootRefusal::ConnectTimeout,
            format!("upstream {upstream_name} connect timed out"),
        )),
    };
    let mut upstream = match connect {
        Ok(s) => s,
        Err((why, detail)) => {
            if let Some(shoot) = &shoot {
                shoot.refused(Flow::Sni, why);
            }
            refused(shared, SniRefusal::Upstream, &hello.server_name, &detail);
            return None;
        }
    };
    if upstream.write_all(&bytes).await.is_err() {
        return None;
    }
    shared.counters.sni.tunnels.fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RouterConfig;

    fn config(routes: &str) -> Result<RouterConfig, ConfigError> {
        RouterConfig::parse(&format!(
            "always_allowed = [\"10.250.0.0/16\"]\n\
             [[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n{routes}"
        ))
    }

    fn name(s: &str) -> ServerName {
        ServerName::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn routes_by_exact_name_in_any_case_then_by_rules() {
        let c = config(
            "[[sni_route]]\nserver_names = [\"API.a.example\", \"api.a.internal\"]\n\
             upstream = \"10.0.0.1:443\"\n\
             [[sni_route.rule]]\naction = \"deny\"\nfrom = [\"192.0.2.9\"]\n\
             [[sni_route.rule]]\naction = \"allow\"\nfrom = [\"192.0.2.0/24\"]\n\
             [[sni_route]]\nserver_names = [\"api.ab.example\"]\nupstream = \"x:443\"\n",
        )
        .unwrap();
        assert_eq!(c.listeners[0].kind, crate::ListenerKind::Sni);
        assert!(c.listeners[0].headers.is_empty());
        let p = &c.policy;
        let at = |s: &str| Client::direct(s.parse().unwrap());
        let ok = |n: &str, who| p.decide_sni(&name(n), who).map(|t| t.upstream.clone());
        assert_eq!(
            ok("api.a.example", at("192.0.2.1")),
            Ok("10.0.0.1:443".into())
        );
        assert_eq!(
            ok("Api.A.Internal", at("192.0.2.1")),
            Ok("10.0.0.1:443".into())
        );
        assert_eq!(
            ok("api.a.example", at("192.0.2.9")),
            Err(SniRefusal::Denied(Denial::Rule(0)))
        );
        assert_eq!(
            ok("api.a.example", at("198.51.100.1")),
            Err(SniRefusal::Denied(Denial::NoMatch))
        );
        // Always-allowed first.
        assert!(ok("api.a.example", at("10.250.1.1")).is_ok());
        // No rules: anyone; no prefix or suffix matching.
        assert!(ok("api.ab.example", at("198.51.100.1")).is_ok());
        for unknown in [
            "a.example",
            "pi.a.example",
            "x.api.a.example",
            "api.a.exampl",
        ] {
            assert_eq!(
                ok(unknown, at("192.0.2.1")),
                Err(SniRefusal::Unknown),
                "{unknown}"
            );
        }
    }

    #[test]
    fn bad_sni_configs_are_refused() {
        for (routes, what) in [
            ("[[sni_route]]\nserver_names = []\nupstream = \"x:1\"\n", "no names"),
            ("[[sni_route]]\nserver_names = [\"a.example.\"]\nupstream = \"x:1\"\n", "dot"),
            ("[[sni_route]]\nserver_names = [\"*.example\"]\nupstream = \"x:1\"\n", "wildcard"),
            ("[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x\"\n", "upstream"),
            (
                "[[sni_route]]\nserver_names = [\"a.example\", \"A.example\"]\nupstream = \"x:1\"\n",
                "twice",
            ),
            (
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\n\
                 [[sni_route]]\nserver_names = [\"a.EXAMPLE\"]\nupstream = \"y:1\"\n",
                "two routes",
            ),
            (
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\nallow = []\n\
                 [[sni_route.rule]]\naction = \"allow\"\nfrom = []\n",
                "allow and rules",
            ),
            ("[[sni_route]]\nserver_name = \"a.example\"\nupstream = \"x:1\"\n", "key"),
        ] {
            assert!(config(routes).is_err(), "{what}");
        }
        // `shoot` is a namespace, exactly: no upper case, no dots, no empty value.
        for shoot in [
            "Shoot--p--a",
            "shoot--p--a.svc",
            "",
            "-shoot",
            "shoot--p--a-",
        ] {
            let routes = format!(
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\nshoot = {shoot:?}\n"
            );
            assert!(
                matches!(config(&routes), Err(ConfigError::SniShoot { .. })),
                "{shoot:?}"
            );
        }
        let routes = "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\n\
                      shoot = \"shoot--p--a\"\n";
        let parsed = config(routes).unwrap();
        let target = parsed.policy.sni_routes.values().next().unwrap();
        assert_eq!(target.shoot.as_deref(), Some("shoot--p--a"));
        // An SNI listener takes no headers; a CONNECT listener needs them.
        let with_headers = "[[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n\
                            headers = [\"Reversed-VPN\"]\n";
        assert!(matches!(
            RouterConfig::parse(with_headers),
            Err(ConfigError::SniHeaders { .. })
        ));
        assert!(RouterConfig::parse("[[listener]]\naddress = \"127.0.0.1:1\"\n").is_err());
        assert!(
            RouterConfig::parse("[[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"tls\"\n")
                .is_err()
        );
    }

    #[test]
    fn every_refusal_has_its_label() {
        let c = SniCounters::default();
        c.refused(SniRefusal::Denied(Denial::NoMatch));
        c.refused(SniRefusal::NotTls);
        c.refused(SniRefusal::NotTls);
        let mut out = Exposition::new();
        c.metrics(&mut out);
        let text = out.into_string();
        for (label, n) in [("not_tls", 2), ("denied", 1), ("no_sni", 0), ("unknown", 0)] {
            let line = format!("vpn_router_sni_refused_total{{reason=\"{label}\"}} {n}\n");
            assert!(text.contains(&line), "{line}: {text}");
        }
        assert_eq!(c.refused_total("not_tls"), 2);
        assert!(text.contains("vpn_router_sni_tunnels_total 0\n"));
    }
}
