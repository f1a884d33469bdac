//! The GEP-30 apiserver-proxy, all in one place: a local TCP listener in the shoot whose every
//! connection is tunnelled to the seed's ingress with HTTP CONNECT and a routing header,
//! instead of a PROXY protocol header. The ingress routes by the header alone (the
//! request-line target is informational), so the client's real address stays the one the load
//! balancer reports.
//!
//! ```text
//!  pod ──TCP──► listen (e.g. <kubernetes service address>:443)
//!                  │ CONNECT HOST:443 HTTP/1.1
//!                  │ X-Gardener-Destination: outbound|443||kube-apiserver.<ns>.svc.cluster.local
//!                  ▼
//!              ingress HOST:PORT ──200──► relay (netio::relay), half-close both ways
//! ```
//!
//! Two programs run it, on one data path ([`tunnel`]) and one request ([`connect_request`]):
//!
//! | program | configured by | reports | code |
//! |---|---|---|---|
//! | `vpn-client apiserver-proxy` | its flags ([`ApiserverProxyArgs`], each also an `APISERVER_PROXY_*` variable) → [`ApiserverProxyConfig`]: Gardener's defaults, the header value checked | log lines | this module |
//! | `envoy -c /etc/apiserver-proxy/envoy.yaml` (`vpn-server`'s Envoy mode as Gardener's apiserver-proxy DaemonSet runs it) | Gardener's file, read by [`crate::envoy::tunnel`] into a [`TunnelProxyConfig`] | Envoy's series, access log and `/ready` ([`crate::envoy::tcp_stats`]) | [`crate::envoy`] |
//!
//! Why here: this crate holds what replaces Gardener's Envoy, and the apiserver-proxy is one
//! (Envoy mode runs it from Envoy's file). The data path and the request are shared; the
//! Envoy layer maps Envoy's file and series onto them and this module never looks back at it,
//! so `vpn-client` uses this module and nothing of Envoy's. Not in `netio`: that is the I/O
//! every binary shares, and the tunnel proxy serves these two programs alone.
//!
//! The header is Gardener's: `X-Gardener-Destination` by default (`X-Gardener-API-Route`, the
//! name the GEP first proposed, or any other with `--header-name`), its value one of the two
//! shapes Gardener renders, `outbound|443||kube-apiserver.<ns>.svc.cluster.local` or
//! `<ns>--kube-apiserver-socket` under Istio's TLS termination; `vpn-client apiserver-proxy`
//! refuses any other value at start, as the ingress would refuse every connection (Envoy mode
//! sends the file's headers as they are). The request target is the ingress host with port
//! 443, as Gardener's Envoy sends it (the ingress ignores it).
//!
//! `vpn-client apiserver-proxy`'s defaults follow Gardener's Envoy apiserver-proxy: upstream
//! connect timeout 5 s, at most 10,000 connections (more are closed at accept), 32 KiB
//! buffers per direction, TCP keepalive on the connection to the ingress after 7200 s idle,
//! probing every 55 s, the ingress name looked up again when a connection needs it and the
//! last lookup is 5 s old (its addresses may change).

pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::TypedValueParser as _;

use netio::http::route::{RouteError, RouteValue, Service};
use netio::http::{ConnectRequest, CustomHeader, HttpVersion};
use netio::relay::DEFAULT_BUFFER_SIZE;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
pub use tunnel::{
    AddressFamily, Keepalive, NoEvents, Outcome, TunnelEvents, TunnelProxy, TunnelProxyConfig,
    TunnelProxyError, TunnelReport,
};

/// The routing header Gardener's apiserver-proxy sends.
pub const DEFAULT_HEADER_NAME: &str = "X-Gardener-Destination";
/// Gardener's apiserver-proxy upstream connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Gardener's apiserver-proxy connection limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Idle time before the first keepalive probe to the ingress (GEP-30's Envoy).
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(7200);
/// Interval between keepalive probes (GEP-30's Envoy).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(55);
/// Envoy's TCP proxy idle timeout (1 h).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long the ingress's addresses are reused (Envoy's default `dns_refresh_rate`).
pub const DNS_REFRESH: Duration = Duration::from_secs(5);

/// The apiserver-proxy's settings.
#[derive(Debug, Clone)]
pub struct ApiserverProxyConfig {
    /// Local listen addresses.
    pub listen: Vec<SocketAddr>,
    /// The ingress as `host:port` (resolved per connection).
    pub ingress: String,
    /// The CONNECT request target (`host:port`); the ingress ignores it.
    pub target: (String, u16),
    /// Routing header name.
    pub header_name: String,
    /// Routing header value, e.g. `outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local`.
    pub header_value: String,
    /// Bound on reaching the ingress and getting its `200`.
    pub connect_timeout: Duration,
    /// No bytes either way for this long closes a connection.
    pub idle_timeout: Duration,
    /// Concurrent connections; more are closed at accept.
    pub max_connections: usize,
}

impl ApiserverProxyConfig {
    /// Defaults for everything but the addresses and the header value; the request target is
    /// the ingress host with port 443, as Gardener's Envoy sends it.
    pub fn new(listen: Vec<SocketAddr>, ingress: String, header_value: String) -> Self {
        let target = (ingress_host(&ingress).to_owned(), 443);
        ApiserverProxyConfig {
            listen,
            ingress,
            target,
            header_name: DEFAULT_HEADER_NAME.into(),
            header_value,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// The CONNECT request every tunnel sends.
    pub fn request(&self) -> ConnectRequest {
        connect_request(
            &self.target,
            [(self.header_name.clone(), self.header_value.clone())],
        )
    }

    /// The tunnel proxy these settings describe, with Gardener's keepalive and buffers.
    fn tunnel(&self) -> Result<TunnelProxyConfig, ApiserverProxyError> {
        let proxy = ingress_host(&self.ingress);
        let port = self
            .ingress
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .filter(|_| proxy != self.ingress)
            .ok_or_else(|| ApiserverProxyError::Ingress {
                value: self.ingress.clone(),
            })?;
        Ok(TunnelProxyConfig {
            listen: self.listen.clone(),
            proxy: (proxy.to_owned(), port),
            family: AddressFamily::Any,
            refresh: DNS_REFRESH,
            request: self.request(),
            connect_timeout: self.connect_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            buffer_size: DEFAULT_BUFFER_SIZE,
            keepalive: Some(Keepalive {
                time: Some(KEEPALIVE_TIME),
                interval: Some(KEEPALIVE_INTERVAL),
                probes: None,
            }),
        })
    }
}

/// The CONNECT request of every tunnel, as Gardener's Envoy sends it: HTTP/1.1 to `target`
/// with `headers` in order (the routing header among them). Both programs build theirs here.
pub fn connect_request(
    target: &(String, u16),
    headers: impl IntoIterator<Item = (String, String)>,
) -> ConnectRequest {
    let mut req = ConnectRequest::new(target.0.clone(), target.1);
    req.options.version = HttpVersion::Http11;
    req.options.custom_headers = headers
        .into_iter()
        .map(|(name, value)| CustomHeader::NameValue { name, value })
        .collect();
    req
}

/// The host of `host:port` (`[v6]:port` without the brackets); the whole text without a port.
fn ingress_host(ingress: &str) -> &str {
    let host = match ingress.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => ingress,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Checks that `value` is one of the kube-apiserver routing values Gardener renders.
fn check_route(value: &str) -> Result<RouteValue, ApiserverProxyError> {
    let route = RouteValue::parse(value).map_err(|source| ApiserverProxyError::Route {
        value: value.to_owned(),
        source,
    })?;
    match route.service() {
        Service::KubeApiserver | Service::KubeApiserverSocket => Ok(route),
        Service::VpnSeedServer { .. } => Err(ApiserverProxyError::NotApiserver {
            value: value.to_owned(),
        }),
    }
}

/// Why the apiserver-proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiserverProxyError {
    /// The CONNECT request cannot be built from the settings (a control byte in the header
    /// value, ...).
    #[error("invalid CONNECT request settings")]
    Request(#[source] netio::http::HttpError),
    /// The header value is not a routing value.
    #[error("header value {value:?} is not a routing value")]
    Route {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: RouteError,
    },
    /// The header value routes to a VPN server, not to a kube-apiserver.
    #[error("header value {value:?} names a VPN server, not a kube-apiserver")]
    NotApiserver {
        /// The value.
        value: String,
    },
    /// The ingress is not `host:port`.
    #[error("ingress {value:?} is not host:port")]
    Ingress {
        /// The value.
        value: String,
    },
    /// A listen address could not be bound.
    #[error(transparent)]
    Listen(#[from] TunnelProxyError),
}

/// A bound apiserver-proxy ([`TunnelProxy`] with Gardener's settings);
/// [`ApiserverProxy::run`] serves.
#[derive(Debug)]
pub struct ApiserverProxy {
    inner: TunnelProxy,
}

impl ApiserverProxy {
    /// Checks the request and binds the listeners. Must run inside a tokio runtime.
    pub async fn bind(config: ApiserverProxyConfig) -> Result<Self, ApiserverProxyError> {
        // A control byte (a header smuggled into the value) is named as such before the
        // value's shape is checked.
        config
            .request()
            .to_bytes()
            .map_err(ApiserverProxyError::Request)?;
        check_route(&config.header_value)?;
        let inner = TunnelProxy::bind(config.tunnel()?, Arc::new(LogEvents))?;
        for addr in inner.local_addrs() {
            info!(%addr, ingress = %config.ingress, "apiserver-proxy listening");
        }
        Ok(ApiserverProxy { inner })
    }

    /// The bound listen addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.inner.local_addrs()
    }

    /// Serves until `shutdown`; then closes every connection and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        self.inner.run(shutdown).await;
    }
}

/// The apiserver-proxy's log: a refused connection at warn, a failed one at info.
#[derive(Debug)]
struct LogEvents;

impl TunnelEvents for LogEvents {
    fn overflowed(&self, peer: SocketAddr) {
        warn!(%peer, "apiserver-proxy connection limit reached; closed");
    }

    fn closed(&self, r: &TunnelReport) {
        let peer = r.peer;
        match r.outcome {
            Outcome::Relayed(_) => debug!(
                %peer,
                up = r.to_proxy,
                down = r.from_proxy,
                "apiserver-proxy connection closed"
            ),
            ref failed => info!(%peer, error = %failed, "apiserver-proxy connection failed"),
        }
    }
}

/// The `vpn-client apiserver-proxy` flags (each also an environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct ApiserverProxyArgs {
    /// Local listen addresses, comma-separated.
    #[arg(
        long,
        env = "APISERVER_PROXY_LISTEN",
        value_delimiter = ',',
        required = true
    )]
    pub listen: Vec<SocketAddr>,
    /// The ingress (`host:port`, e.g. the shoot's API FQDN and 8443).
    #[arg(long, env = "APISERVER_PROXY_INGRESS")]
    pub ingress: String,
    /// Routing header name.
    #[arg(long, env = "APISERVER_PROXY_HEADER_NAME", default_value = DEFAULT_HEADER_NAME)]
    pub header_name: String,
    /// Routing header value: `outbound|443||kube-apiserver.<ns>.svc.cluster.local`, or
    /// `<ns>--kube-apiserver-socket` behind Istio's TLS termination.
    #[arg(long, env = "APISERVER_PROXY_HEADER_VALUE")]
    pub header_value: String,
    /// CONNECT request target (`host:port`); default the ingress host with port 443.
    #[arg(long, env = "APISERVER_PROXY_TARGET")]
    pub target: Option<String>,
    /// Connect timeout in seconds (reaching the ingress and its answer); at least 1.
    #[arg(long, env = "APISERVER_PROXY_CONNECT_TIMEOUT", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub connect_timeout_secs: u64,
    /// Idle timeout of a connection in seconds; at least 1.
    #[arg(long, env = "APISERVER_PROXY_IDLE_TIMEOUT", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_secs: u64,
    /// Concurrent connections; at least 1.
    #[arg(long, env = "APISERVER_PROXY_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u64).range(1..).map(|n| usize::try_from(n).unwrap_or(usize::MAX)))]
    pub max_connections: usize,
}

impl ApiserverProxyArgs {
    /// The settings these flags describe.
    pub fn to_config(&self) -> Result<ApiserverProxyConfig, InvalidTarget> {
        let mut config = ApiserverProxyConfig::new(
            self.listen.clone(),
            self.ingress.clone(),
            self.header_value.clone(),
        );
        config.header_name = self.header_name.clone();
        if let Some(target) = &self.target {
            let (host, port) = target
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                .ok_or_else(|| InvalidTarget {
                    value: target.clone(),
                })?;
            config.target = (host.to_owned(), port);
        }
        config.connect_timeout = Duration::from_secs(self.connect_timeout_secs);
        config.idle_timeout = Duration::from_secs(self.idle_timeout_secs);
        config.max_connections = self.max_connections;
        Ok(config)
    }
}

/// `--target` is not `host:port`.
#[derive(Debug, thiserror::Error)]
#[error("--target {value:?} is not host:port")]
pub struct InvalidTarget {
    /// The value.
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local";

    #[test]
    fn the_request_is_gardeners() {
        let c = ApiserverProxyConfig::new(vec![], "api.example.org:8443".into(), ROUTE.into());
        assert_eq!(c.target, ("api.example.org".into(), 443));
        let text = String::from_utf8(c.request().to_bytes().unwrap()).unwrap();
        assert!(
            text.starts_with("CONNECT api.example.org:443 HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("\r\nX-Gardener-Destination: {ROUTE}\r\n")),
            "{text}"
        );
        let v6 = ApiserverProxyConfig::new(vec![], "[2001:db8::1]:8443".into(), ROUTE.into());
        assert_eq!(v6.target, ("2001:db8::1".into(), 443));
    }

    #[test]
    fn both_value_shapes_are_taken_and_nothing_else() {
        for ok in [ROUTE, "shoot--p--a--kube-apiserver-socket"] {
            assert!(check_route(ok).is_ok(), "{ok}");
        }
        for (bad, vpn) in [
            (
                "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local",
                true,
            ),
            (
                "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local.",
                false,
            ),
            ("kube-apiserver", false),
            ("Shoot--p--a--kube-apiserver-socket", false),
            ("", false),
        ] {
            let err = check_route(bad).unwrap_err();
            assert_eq!(
                matches!(err, ApiserverProxyError::NotApiserver { .. }),
                vpn,
                "{bad}: {err}"
            );
        }
    }
}
