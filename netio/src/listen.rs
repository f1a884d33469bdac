//! Listening sockets and the accept step every server loop of ours shares (the OpenVPN server,
//! the CONNECT sidecar, the ingress router, the apiserver-proxy, the admin endpoint).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The listen backlog (the kernel caps it at `net.core.somaxconn`).
pub const BACKLOG: u32 = 4096;

/// How long an accept loop pauses after a failed `accept` (`EMFILE`, `ENFILE`, `ENOBUFS`):
/// the connection that caused it stays queued, so retrying at once would spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A listener on `addr` with `SO_REUSEADDR`; an IPv6 address is `IPV6_V6ONLY`, so `[::]` and
/// `0.0.0.0` can share a port. Must run inside a tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    bind_with(addr, true)
}

/// A listener on `addr` with `SO_REUSEADDR`; an IPv6 address also takes IPv4 connections (as
/// IPv4-mapped addresses) whatever `net.ipv6.bindv6only` says, like OpenVPN's `proto
/// tcp6-server` on `[::]`. Must run inside a tokio runtime.
pub fn bind_dual_stack(addr: SocketAddr) -> io::Result<TcpListener> {
    bind_with(addr, false)
}

fn bind_with(addr: SocketAddr, v6_only: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(v6_only)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG as i32)?;
    TcpListener::from_std(socket.into())
}

/// The next connection, or `None` once `shutdown` is cancelled. A failed `accept` is logged
/// and retried after [`ACCEPT_ERROR_PAUSE`].
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok(a) => return Some(a),
            Err(e) => {
                let local = listener.local_addr().ok();
                tracing::warn!(listener = ?local, error = %e, "accept failed; pausing");
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn v4_and_v6_listeners_share_a_port_and_accept_ends_on_shutdown() {
        let v4 = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = v4.local_addr().unwrap().port();
        // Binds beside the IPv4 listener only because it is IPv6-only.
        let v6 = bind(SocketAddr::from(([0u16; 8], port))).unwrap();
        let shutdown = CancellationToken::new();
        let client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_, peer) = accept(&v4, &shutdown).await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        shutdown.cancel();
        assert!(accept(&v6, &shutdown).await.is_none());
    }

    #[tokio::test]
    async fn a_dual_stack_listener_takes_ipv4() {
        let l = bind_dual_stack(SocketAddr::from(([0u16; 8], 0))).unwrap();
        let port = l.local_addr().unwrap().port();
        let _client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_, peer) = accept(&l, &CancellationToken::new()).await.unwrap();
        assert_eq!(peer.ip().to_canonical().to_string(), "127.0.0.1");
    }
}
