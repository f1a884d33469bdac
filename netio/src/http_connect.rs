//! HTTP CONNECT over TCP: the client's dialer ([`connect_via_proxy`]) and a small proxy-side
//! acceptor ([`ConnectAcceptor`]) for tests and the demo. The bytes on the wire come from
//! [`crate::http`], which has no I/O.
//!
//! Unlike upstream OpenVPN, the dialer does not wait 2 s for "silence" after the `200`: it
//! reads the head up to the blank line and returns at once, handing over any bytes that came
//! after the head.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::http::{
    encode_response, find_header, parse_request_head, parse_response_head, ConnectRequest,
    HeadResult, HttpError, RequestHead, ResponseHead, MAX_HEAD_LEN,
};
use crate::relay::{relay, RelayConfig, DEFAULT_IDLE_TIMEOUT};
use crate::tcp::{connect_first, connect_nodelay};

/// Upstream's default bound on the whole proxy exchange (`--connect-timeout`, 120 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// A tunnel through the proxy, ready for the OpenVPN byte stream.
#[derive(Debug)]
pub struct ProxiedStream {
    /// The connection to the proxy, now a tunnel to the server (`TCP_NODELAY` set).
    pub stream: TcpStream,
    /// Bytes the proxy sent after its response head: the start of the server's stream.
    pub leftover: BytesMut,
    /// The proxy's `200` response head.
    pub response: ResponseHead,
}

/// Connects to the proxy at `proxy` (addresses tried in order), sends `request` and reads the
/// response head. Everything, including the TCP connect, must finish within `timeout`.
///
/// A status other than 200 is [`ConnectError::Status`] with the code and reason phrase.
pub async fn connect_via_proxy(
    proxy: &[SocketAddr],
    request: &ConnectRequest,
    timeout: Duration,
) -> Result<ProxiedStream, ConnectError> {
    let bytes = request.to_bytes().map_err(ConnectError::Request)?;
    let exchange = async {
        let mut last_err = None;
        let mut connected = None;
        for &addr in proxy {
            match connect_nodelay(addr).await {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(source) => {
                    last_err = Some(ConnectError::Connect {
                        proxy: addr,
                        source,
                    })
                }
            }
        }
        let Some(mut stream) = connected else {
            return Err(last_err.unwrap_or(ConnectError::NoProxyAddress));
        };
        tracing::debug!(
            proxy = %stream.peer_addr().map_err(io_err)?,
            target = %format_args!("{}:{}", request.host, request.port),
            "sending HTTP CONNECT"
        );
        stream.write_all(&bytes).await.map_err(io_err)?;
        let mut buf = BytesMut::with_capacity(1024);
        let (response, len) = read_head(&mut stream, &mut buf, parse_response_head).await?;
        if response.status != 200 {
            return Err(ConnectError::Status {
                code: response.status,
                reason: response.reason,
            });
        }
        let leftover = buf.split_off(len);
        tracing::debug!(leftover = leftover.len(), "HTTP proxy tunnel established");
        Ok(ProxiedStream {
            stream,
            leftover,
            response,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ConnectError::Timeout { after: timeout })?
}

/// Reads from `stream` into `buf` until `parse` finds a whole head; the head is
/// `buf[..len]`, anything after it stays in `buf`. Never buffers more than one read past
/// [`MAX_HEAD_LEN`].
async fn read_head<T>(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    parse: fn(&[u8]) -> HeadResult<T>,
) -> Result<(T, usize), ConnectError> {
    loop {
        if let Some(found) = parse(buf).map_err(ConnectError::Malformed)? {
            return Ok(found);
        }
        buf.reserve(MAX_HEAD_LEN.saturating_sub(buf.len()).max(512));
        let n = stream.read_buf(buf).await.map_err(io_err)?;
        if n == 0 {
            return Err(ConnectError::Closed {
                received: buf.len(),
            });
        }
    }
}

fn io_err(source: io::Error) -> ConnectError {
    ConnectError::Io { source }
}

/// Why a CONNECT exchange failed (dialer side, and the acceptor's reading of a request).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The request could not be encoded from the configuration.
    #[error("cannot build the CONNECT request")]
    Request(#[source] HttpError),
    /// No proxy address was given.
    #[error("no proxy address to connect to")]
    NoProxyAddress,
    /// The TCP connection to the proxy failed.
    #[error("cannot connect to HTTP proxy {proxy}")]
    Connect {
        /// The proxy address tried last.
        proxy: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the proxy connection failed.
    #[error("HTTP proxy connection I/O failed")]
    Io {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The peer closed the connection before a whole head arrived.
    #[error(
        "HTTP proxy closed the connection after {received} bytes, before the end of its answer"
    )]
    Closed {
        /// Bytes received so far.
        received: usize,
    },
    /// The head was malformed or too large.
    #[error("malformed HTTP head from the proxy")]
    Malformed(#[source] HttpError),
    /// The proxy answered with a status other than 200.
    #[error("HTTP proxy returned bad status {code} {reason:?}")]
    Status {
        /// Status code.
        code: u16,
        /// Reason phrase.
        reason: String,
    },
    /// The exchange did not finish in time.
    #[error("HTTP proxy exchange timed out after {after:?}")]
    Timeout {
        /// The bound.
        after: Duration,
    },
}

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

/// A minimal CONNECT proxy: accepts a CONNECT, optionally requires one header with an exact
/// value (e.g. `Reversed-VPN: outbound|1194||vpn-seed-server`), connects to the upstream,
/// answers `HTTP/1.1 200 Connection established` and relays bytes both ways with
/// [`crate::relay::relay`] until both directions are closed (a half-close passed on to the
/// other side) or nothing moved for the idle timeout (default
/// [`crate::relay::DEFAULT_IDLE_TIMEOUT`]).
///
/// Answers: 400 for a malformed request or a missing or wrong required header, 405 for a method
/// other than CONNECT, 502 when the upstream cannot be reached, 504 when that takes longer than
/// the timeout. An oversized or slow request head is answered 400 / dropped.
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

    /// Requires header `name` (case-insensitive) with exactly `value`.
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
                match this.handle(client).await {
                    Ok(relayed) => tracing::debug!(%peer, ?relayed, "CONNECT tunnel closed"),
                    Err(err) => tracing::debug!(%peer, error = %err, "CONNECT refused or failed"),
                }
            });
        }
    }

    /// Serves one client connection to the end.
    pub async fn handle(&self, mut client: TcpStream) -> Result<Relayed, AcceptError> {
        client
            .set_nodelay(true)
            .map_err(|source| AcceptError::Io { source })?;
        let mut buf = BytesMut::with_capacity(1024);
        let read = tokio::time::timeout(
            self.timeout,
            read_head(&mut client, &mut buf, parse_request_head),
        )
        .await;
        let (request, len) = match read {
            Err(_) => {
                return Err(AcceptError::Timeout {
                    after: self.timeout,
                })
            }
            Ok(Err(ConnectError::Malformed(err))) => {
                reply(&mut client, 400, "Bad Request").await;
                return Err(AcceptError::Malformed(err));
            }
            Ok(Err(ConnectError::Closed { received })) => {
                return Err(AcceptError::Closed { received })
            }
            Ok(Err(ConnectError::Io { source })) => return Err(AcceptError::Io { source }),
            Ok(Err(other)) => {
                return Err(AcceptError::Io {
                    source: io::Error::other(other),
                })
            }
            Ok(Ok(found)) => found,
        };
        let early = buf.split_off(len);
        if let Err(refusal) = self.check(&request) {
            let (code, reason) = refusal.status();
            reply(&mut client, code, reason).await;
            return Err(refusal);
        }
        let connect = tokio::time::timeout(self.timeout, self.connect_upstream(&request)).await;
        let mut upstream = match connect {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                reply(&mut client, 502, "Bad Gateway").await;
                return Err(err);
            }
            Err(_) => {
                reply(&mut client, 504, "Gateway Timeout").await;
                return Err(AcceptError::Timeout {
                    after: self.timeout,
                });
            }
        };
        let mut ok = Vec::new();
        encode_response(200, "Connection established", &mut ok);
        client
            .write_all(&ok)
            .await
            .map_err(|source| AcceptError::Io { source })?;
        upstream
            .write_all(&early)
            .await
            .map_err(|source| AcceptError::Io { source })?;
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

    fn check(&self, request: &RequestHead) -> Result<(), AcceptError> {
        if request.method != "CONNECT" {
            return Err(AcceptError::Method {
                method: request.method.clone(),
            });
        }
        request.authority().map_err(AcceptError::Malformed)?;
        if let Some((name, value)) = &self.required_header {
            let got = find_header(&request.headers, name);
            if got != Some(value.as_str()) {
                return Err(AcceptError::Header {
                    name: name.clone(),
                    got: got.map(str::to_owned),
                });
            }
        }
        Ok(())
    }

    async fn connect_upstream(&self, request: &RequestHead) -> Result<TcpStream, AcceptError> {
        let addrs: Vec<SocketAddr> = match &self.upstream {
            Upstream::Fixed(addr) => vec![*addr],
            Upstream::RequestTarget => {
                let (host, port) = request.authority().map_err(AcceptError::Malformed)?;
                tokio::net::lookup_host((host, port))
                    .await
                    .map_err(|source| AcceptError::Upstream {
                        target: request.target.clone(),
                        source,
                    })?
                    .collect()
            }
        };
        connect_first(addrs)
            .await
            .map_err(|source| AcceptError::Upstream {
                target: request.target.clone(),
                source,
            })
    }
}

/// Best effort: the client may already be gone.
async fn reply(client: &mut TcpStream, code: u16, reason: &str) {
    let mut out = Vec::new();
    encode_response(code, reason, &mut out);
    let _ = client.write_all(&out).await;
    let _ = client.shutdown().await;
}

/// Why the acceptor refused or ended a connection.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The request head was malformed or too large (answered 400).
    #[error("malformed CONNECT request")]
    Malformed(#[source] HttpError),
    /// Not a CONNECT (answered 405).
    #[error("method {method:?} is not CONNECT")]
    Method {
        /// The method.
        method: String,
    },
    /// The required header was missing or had another value (answered 400).
    #[error("required header {name:?} missing or wrong (got {got:?})")]
    Header {
        /// The required header's name.
        name: String,
        /// What the request carried.
        got: Option<String>,
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
    /// The client closed before sending a whole request.
    #[error("client closed after {received} bytes, before the end of its request")]
    Closed {
        /// Bytes received.
        received: usize,
    },
    /// Reading the request or connecting upstream took too long.
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

impl AcceptError {
    /// The status the acceptor answers for a refusal.
    fn status(&self) -> (u16, &'static str) {
        match self {
            AcceptError::Method { .. } => (405, "Method Not Allowed"),
            AcceptError::Upstream { .. } => (502, "Bad Gateway"),
            AcceptError::Timeout { .. } => (504, "Gateway Timeout"),
            _ => (400, "Bad Request"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::CustomHeader;

    const HEADER: (&str, &str) = ("Reversed-VPN", "outbound|1194||vpn-seed-server");

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    tokio::io::copy(&mut r, &mut w).await.unwrap();
                    w.shutdown().await.unwrap();
                });
            }
        });
        addr
    }

    async fn acceptor(acceptor: ConnectAcceptor) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(acceptor.serve(listener));
        addr
    }

    fn request(with_header: bool) -> ConnectRequest {
        let mut req = ConnectRequest::new("vpn-seed-server", 1194);
        if with_header {
            req.custom_headers.push(CustomHeader::NameValue {
                name: HEADER.0.into(),
                value: HEADER.1.into(),
            });
        }
        req
    }

    #[tokio::test]
    async fn tunnel_through_acceptor_echoes_and_half_closes() {
        let echo = echo_server().await;
        let proxy = acceptor(
            ConnectAcceptor::new(Upstream::Fixed(echo)).require_header(HEADER.0, HEADER.1),
        )
        .await;
        let t = connect_via_proxy(&[proxy], &request(true), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(t.leftover.is_empty());
        let mut s = t.stream;
        s.write_all(b"hello through the proxy").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"hello through the proxy");
    }

    #[tokio::test]
    async fn missing_or_wrong_header_is_400() {
        let echo = echo_server().await;
        let proxy = acceptor(
            ConnectAcceptor::new(Upstream::Fixed(echo)).require_header(HEADER.0, HEADER.1),
        )
        .await;
        let err = connect_via_proxy(&[proxy], &request(false), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ConnectError::Status { code: 400, reason } if reason == "Bad Request"),
            "{err:?}"
        );
        let mut wrong = request(false);
        wrong
            .custom_headers
            .push(CustomHeader::Line(format!("{}: other", HEADER.0)));
        let err = connect_via_proxy(&[proxy], &wrong, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConnectError::Status { code: 400, .. }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn unreachable_upstream_is_502() {
        // A port that was just free: bind, take the address, drop.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = acceptor(ConnectAcceptor::new(Upstream::Fixed(dead))).await;
        let err = connect_via_proxy(&[proxy], &request(false), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConnectError::Status { code: 502, .. }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn bytes_after_the_200_are_kept_and_no_pause() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let mut got = 0;
            while !buf[..got].ends_with(b"\r\n\r\n") {
                got += s.read(&mut buf[got..]).await.unwrap();
            }
            s.write_all(b"HTTP/1.0 200 OK\r\nX: y\r\n\r\n\x00\x01\x38")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        let started = std::time::Instant::now();
        let t = connect_via_proxy(&[proxy], &request(false), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(&t.leftover[..], b"\x00\x01\x38");
        assert_eq!(t.response.headers.len(), 1);
    }

    #[tokio::test]
    async fn silent_proxy_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (_s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        let err = connect_via_proxy(&[proxy], &request(false), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectError::Timeout { .. }), "{err:?}");
    }
}
