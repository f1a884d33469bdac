//! HTTP CONNECT over TCP, the client's side: the dialer ([`connect_via_proxy`]). The bytes on
//! the wire come from [`crate::http`], which has no I/O; the accepting side of every ingress
//! of ours is [`crate::ingress`].
//!
//! Unlike upstream OpenVPN, the dialer does not wait 2 s for "silence" after the `200`: it
//! reads the head up to the blank line and returns at once, handing over any bytes that came
//! after the head.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::{
    parse_response_head, ConnectRequest, HeadResult, HttpError, ResponseHead, MAX_HEAD_LEN,
};
use crate::tcp::connect_nodelay;

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
        let Some(stream) = connected else {
            return Err(last_err.unwrap_or(ConnectError::NoProxyAddress));
        };
        exchange(stream, &bytes, request).await
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ConnectError::Timeout { after: timeout })?
}

/// [`connect_via_proxy`] over a connection to the proxy the caller opened (with its own
/// bound on the TCP connect): sends `request` and reads the response head within `timeout`.
pub async fn connect_over(
    stream: TcpStream,
    request: &ConnectRequest,
    timeout: Duration,
) -> Result<ProxiedStream, ConnectError> {
    let bytes = request.to_bytes().map_err(ConnectError::Request)?;
    tokio::time::timeout(timeout, exchange(stream, &bytes, request))
        .await
        .map_err(|_| ConnectError::Timeout { after: timeout })?
}

/// Sends the encoded request and reads the proxy's answer.
async fn exchange(
    mut stream: TcpStream,
    bytes: &[u8],
    request: &ConnectRequest,
) -> Result<ProxiedStream, ConnectError> {
    tracing::debug!(
        proxy = %stream.peer_addr().map_err(io_err)?,
        target = %format_args!("{}:{}", request.host, request.port),
        "sending HTTP CONNECT"
    );
    stream.write_all(bytes).await.map_err(io_err)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::CustomHeader;
    use tokio::net::TcpListener;

    const HEADER: (&str, &str) = ("Reversed-VPN", "outbound|1194||vpn-seed-server");

    fn request(with_header: bool) -> ConnectRequest {
        let mut req = ConnectRequest::new("vpn-seed-server", 1194);
        if with_header {
            req.options.custom_headers.push(CustomHeader::NameValue {
                name: HEADER.0.into(),
                value: HEADER.1.into(),
            });
        }
        req
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
