//! TCP sockets as the drivers open and read them: connects with `TCP_NODELAY` set before the
//! first byte, the "first address that answers" connect of every proxy, and a read of what
//! has already arrived that never waits.

use std::io;
use std::net::SocketAddr;

use bytes::BytesMut;
use tokio::net::{TcpSocket, TcpStream};

/// Connects to `addr` with `TCP_NODELAY` already set on the socket.
pub async fn connect_nodelay(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_nodelay(true)?;
    socket.connect(addr).await
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
