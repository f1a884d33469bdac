//! TCP sockets as the drivers open and read them: connects with `TCP_NODELAY` set before the
//! first byte, the "first address that answers" connect of every proxy, and a read of what
//! has already arrived that never waits.

use std::io;
use std::net::SocketAddr;

use bytes::BytesMut;
use tokio::net::{TcpSocket, TcpStream};

/// Connects to `addr` with `TCP_NODELAY` already set on the socket; the stream returned is
/// connected (see [`until_connected`]).
pub async fn connect_nodelay(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_nodelay(true)?;
    until_connected(socket.connect(addr).await?).await
}

/// `stream` once its connect is done: its peer known, or the connect's error.
///
/// Tokio ends a connect at the socket's first writable event when `SO_ERROR` is clear, which
/// mio's documentation says does not prove the connect done: the peer address tells. Seen
/// under load: a CONNECT answered `200` over a socket that was not connected (no peer
/// address), its SYN held by a server that answered "unreachable" a second later. A stream
/// still connecting is waited on until its next event, as mio asks, with one warning; one
/// closed without an error is a failed connect (`NotConnected`). The caller bounds the wait
/// (every caller here connects under a timeout).
async fn until_connected(stream: TcpStream) -> io::Result<TcpStream> {
    let mut warned = false;
    loop {
        match stream.peer_addr() {
            Ok(_) => return Ok(stream),
            Err(e) if e.kind() != io::ErrorKind::NotConnected => return Err(e),
            Err(_) => {}
        }
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        // The readiness tokio keeps, or the socket's next event.
        let ready = stream.ready(tokio::io::Interest::WRITABLE).await?;
        if ready.is_write_closed() {
            // Closed: connected and reset at once, failed, or (seen on a loaded host, as the
            // kernel's end of a connect our server answered "unreachable") neither a peer
            // nor an error. Nothing more will come.
            if let Some(e) = stream.take_error()? {
                return Err(e);
            }
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connect ended without a connection and without an error",
            ));
        }
        if stream.peer_addr().is_err() {
            if !warned {
                warned = true;
                tracing::warn!("a connect reported done before its peer was known; waiting for it");
            }
            // Forget that readiness: the next `ready` waits for the socket's next event.
            let _ = stream.try_io(tokio::io::Interest::WRITABLE, || {
                Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
            });
        }
    }
}

/// Reads what `stream` has received by now into `buf` (after its current contents, at most
/// `max` bytes), without waiting: one `recv(MSG_DONTWAIT)`. Returns the bytes read, 0 when
/// nothing is there (or the peer closed: the next waiting read reports that).
///
/// Unlike tokio's `try_read`, this always asks the kernel: tokio takes a read that filled less
/// than its buffer as proof the socket is drained and answers `WouldBlock` until epoll
/// reports it readable again, which misses bytes that arrived in the meantime.
pub fn read_arrived(stream: &TcpStream, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
    let start = buf.len();
    buf.resize(start + max, 0);
    let read = rustix::net::recv(stream, &mut buf[start..], rustix::net::RecvFlags::DONTWAIT);
    let n = match read {
        Ok((n, _)) => n,
        Err(rustix::io::Errno::AGAIN) => 0,
        Err(e) => {
            buf.truncate(start);
            return Err(e.into());
        }
    };
    buf.truncate(start + n);
    Ok(n)
}

/// Connects to the first of `addrs` that accepts (each with [`connect_nodelay`], in order);
/// the last error when none does (`AddrNotAvailable` for an empty list). What a proxy does
/// with the addresses a name resolved to.
pub async fn connect_first(addrs: impl IntoIterator<Item = SocketAddr>) -> io::Result<TcpStream> {
    let mut last = io::Error::from(io::ErrorKind::AddrNotAvailable);
    for addr in addrs {
        match connect_nodelay(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn connects_with_nodelay_to_the_first_address_that_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = listener.local_addr().unwrap();
        // A port nothing listens on (bound and dropped) comes first.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let stream = connect_first([dead, good]).await.unwrap();
        assert!(stream.nodelay().unwrap());
        assert_eq!(stream.peer_addr().unwrap(), good);
        assert_eq!(
            connect_first([]).await.unwrap_err().kind(),
            io::ErrorKind::AddrNotAvailable
        );
    }

    /// A stream handed over while its SYN is unanswered (a listener whose accept queue is
    /// full drops it; the kernel sends it again after 1 s) comes back only once connected,
    /// never before: what tokio's connect can hand over after an early writable event.
    #[tokio::test]
    async fn a_stream_still_connecting_is_returned_only_once_connected() {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        listener
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        // Backlog 0: one connection fills the accept queue, the next SYN is dropped.
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        let _first = connect_nodelay(addr).await.unwrap();
        let pending = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        pending.set_nonblocking(true).unwrap();
        let e = pending.connect(&addr.into()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINPROGRESS), "{e}");
        let pending = TcpStream::from_std(std::net::TcpStream::from(pending)).unwrap();
        assert_eq!(
            pending.peer_addr().unwrap_err().kind(),
            io::ErrorKind::NotConnected,
            "the SYN must still be unanswered"
        );
        let waiting = tokio::spawn(until_connected(pending));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "returned before the peer answered");
        // Free the queue: the SYN's retransmission is taken.
        let (_taken, _) = listener.accept().unwrap();
        let stream = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("connected after the retransmission")
            .unwrap()
            .unwrap();
        assert_eq!(stream.peer_addr().unwrap(), addr);
    }

    /// A connect whose socket was closed and whose error was already taken (the state a
    /// loaded host showed after an "unreachable" answer) fails at once instead of waiting for
    /// an event that never comes.
    #[tokio::test]
    async fn a_stream_closed_without_an_error_is_a_failed_connect() {
        use socket2::{Domain, Socket, Type};
        // A port nothing listens on: the kernel answers the SYN with a reset.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_nonblocking(true).unwrap();
        let _ = socket.connect(&dead.into());
        let stream = TcpStream::from_std(std::net::TcpStream::from(socket)).unwrap();
        stream.writable().await.unwrap();
        // Its error taken: closed, no peer, no error left.
        let taken = stream.take_error().unwrap().expect("the reset's error");
        assert_eq!(taken.kind(), io::ErrorKind::ConnectionRefused);
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), until_connected(stream))
            .await
            .expect("failed at once, not waiting")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
    }

    #[tokio::test]
    async fn read_arrived_takes_what_is_there_and_never_waits() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = connect_nodelay(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();
        let mut buf = BytesMut::from(&b"x"[..]);
        assert_eq!(read_arrived(&stream, &mut buf, 16).unwrap(), 0);
        assert_eq!(&buf[..], b"x");
        peer.write_all(b"hello").await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read_arrived(&stream, &mut buf, 3).unwrap() == 0 {
            assert!(std::time::Instant::now() < deadline, "nothing arrived");
            tokio::task::yield_now().await;
        }
        assert_eq!(&buf[..], b"xhel");
    }
}
