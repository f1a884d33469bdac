//! A minimal CONNECT proxy for lab tests and the demo (standing in for Istio's gateway or a
//! corporate proxy): the strict head of every ingress of ours (`netio::ingress`), optionally
//! one required header with an exact value (e.g. `Reversed-VPN: outbound|1194||vpn-seed-server`),
//! a connect upstream, `HTTP/1.1 200 Connection established`, then `netio::relay` until both
//! directions are closed (a half-close passed on) or nothing moved for the idle timeout.
//!
//! Answers: the ingress statuses for a bad head (400, 405, 408, 414, 431), 400 for a missing
//! or wrong required header, 502 when the upstream cannot be reached, 504 when that takes
//! longer than the timeout.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use netio::ingress::{accept_connect, refuse, Accepted, Deadlines, IngressError, ProxyMode};
use netio::relay::{relay, RelayConfig, DEFAULT_IDLE_TIMEOUT};
use netio::tcp::connect_first;
use protocol::http::connect::{Authority, Host, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Where the acceptor sends an accepted tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// Always this address, whatever the request target says (like a sidecar in front of one
    /// server).
    Fixed(SocketAddr),
    /// The request target (`host:port`), resolved when the request arrives.
    RequestTarget,
}

/// What one accepted tunnel carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// Bytes from the client to the upstream (including bytes sent right after the request).
    pub to_upstream: u64,
    /// Bytes from the upstream to the client.
    pub to_client: u64,
}

/// The proxy; see the module docs.
#[derive(Debug, Clone)]
pub struct ConnectAcceptor {
    upstream: Upstream,
    required_header: Option<(String, String)>,
    timeout: Duration,
    idle_timeout: Duration,
}

impl ConnectAcceptor {
    /// An acceptor relaying to `upstream`, requiring no header, with a 20 s bound on reading
    /// the request and on connecting upstream (Gardener's Envoy upstream connect timeout).
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            required_header: None,
            timeout: Duration::from_secs(20),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }

    /// Requires exactly one header `name` (case-insensitive), with exactly `value`.
    pub fn require_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.required_header = Some((name.into(), value.into()));
        self
    }

    /// Bounds reading the request head and connecting upstream, each.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Closes an open tunnel after `idle` with no bytes either way.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// Accepts connections forever, one task per connection. Returns only when `accept`
    /// fails. Must run inside a tokio runtime.
    pub async fn serve(self, listener: TcpListener) -> io::Error {
        let this = Arc::new(self);
        loop {
            let (client, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => return err,
            };
            let this = Arc::clone(&this);
            tokio::spawn(async move {
                match this.handle(client, peer).await {
                    Ok(relayed) => tracing::debug!(%peer, ?relayed, "CONNECT tunnel closed"),
                    Err(err) => tracing::debug!(%peer, error = %err, "CONNECT refused or failed"),
                }
            });
        }
    }

    /// Serves one client connection to the end.
    pub async fn handle(
        &self,
        mut client: TcpStream,
        peer: SocketAddr,
    ) -> Result<Relayed, AcceptError> {
        let _ = client.set_nodelay(true);
        let deadlines = Deadlines {
            proxy_header: self.timeout,
            header: self.timeout,
        };
        let Accepted { head, early, .. } =
            match accept_connect(&mut client, peer, &ProxyMode::Off, deadlines).await {
                Ok(accepted) => accepted,
                Err(e) => {
                    refuse(&mut client, e.status()).await;
                    return Err(AcceptError::Head(e));
                }
            };
        if let Some((name, value)) = &self.required_header {
            let got: Vec<&str> = head.header_values(name).collect();
            if got != [value.as_str()] {
                refuse(&mut client, Some(Status::BAD_REQUEST)).await;
                return Err(AcceptError::Header {
                    name: name.clone(),
                    got: got.join(", "),
                });
            }
        }
        let connect = tokio::time::timeout(self.timeout, self.connect_upstream(&head.authority));
        let mut upstream = match connect.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => {
                refuse(&mut client, Some(Status::BAD_GATEWAY)).await;
                return Err(AcceptError::Upstream {
                    target: head.authority.to_string(),
                    source,
                });
            }
            Err(_) => {
                refuse(&mut client, Some(Status::GATEWAY_TIMEOUT)).await;
                return Err(AcceptError::Timeout {
                    after: self.timeout,
                });
            }
        };
        let io = |source| AcceptError::Io { source };
        let mut ok = Vec::new();
        Status::ESTABLISHED.encode(&mut ok);
        client.write_all(&ok).await.map_err(io)?;
        upstream.write_all(&early).await.map_err(io)?;
        let config = RelayConfig {
            idle_timeout: self.idle_timeout,
            ..RelayConfig::default()
        };
        let stats = relay(&mut client, &mut upstream, config)
            .await
            .map_err(|e| AcceptError::Io { source: e.source })?;
        Ok(Relayed {
            to_upstream: stats.a_to_b + early.len() as u64,
            to_client: stats.b_to_a,
        })
    }

    async fn connect_upstream(&self, target: &Authority) -> io::Result<TcpStream> {
        let addrs: Vec<SocketAddr> = match (&self.upstream, &target.host) {
            (Upstream::Fixed(addr), _) => vec![*addr],
            (Upstream::RequestTarget, Host::Ipv4(a)) => vec![SocketAddr::from((*a, target.port))],
            (Upstream::RequestTarget, Host::Ipv6(a)) => vec![SocketAddr::from((*a, target.port))],
            (Upstream::RequestTarget, Host::Name(name)) => {
                tokio::net::lookup_host((name.as_str(), target.port))
                    .await?
                    .collect()
            }
        };
        connect_first(addrs).await
    }
}

/// Why the acceptor refused or ended a connection.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// No acceptable CONNECT head (answered with its status, if it has one).
    #[error("no acceptable CONNECT head")]
    Head(#[source] IngressError),
    /// The required header was missing, repeated or had another value (answered 400).
    #[error("required header {name:?} missing or wrong (got {got:?})")]
    Header {
        /// The required header's name.
        name: String,
        /// What the request carried (comma-separated).
        got: String,
    },
    /// The upstream could not be reached (answered 502).
    #[error("cannot connect upstream to {target}")]
    Upstream {
        /// The request target.
        target: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Connecting upstream took too long (answered 504).
    #[error("timed out after {after:?}")]
    Timeout {
        /// The bound.
        after: Duration,
    },
    /// A socket failed while relaying.
    #[error("CONNECT relay I/O failed")]
    Io {
        /// Why.
        #[source]
        source: io::Error,
    },
}
