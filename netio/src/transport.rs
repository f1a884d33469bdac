//! The OpenVPN TCP transport: packets with a 2-byte big-endian length prefix (reference 1.1),
//! framed by `protocol`'s [`FrameCodec`], over a [`TcpStream`] with `TCP_NODELAY` set before
//! the first byte is sent.
//!
//! [`Transport::into_split`] gives a [`TransportReader`] and a [`TransportWriter`] that own the
//! two halves of the socket, so the receive and send directions can run as separate tasks.
//! A transport can start with bytes already read from the socket (what an HTTP proxy sent past
//! its response head); they are decoded before anything new is read.

use std::io;
use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use protocol::framing::{CodecError, FrameCodec, FrameError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::codec::{Decoder, Encoder};

/// Bytes reserved in the receive buffer before each socket read.
pub const READ_CHUNK: usize = 16 * 1024;

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

/// A framed OpenVPN TCP connection (both directions).
#[derive(Debug)]
pub struct Transport {
    reader: TransportReader,
    writer: TransportWriter,
}

impl Transport {
    /// Connects to `addr` (`TCP_NODELAY` set before connecting) with `codec`'s limits.
    pub async fn connect(addr: SocketAddr, codec: FrameCodec) -> io::Result<Self> {
        let stream = connect_nodelay(addr).await?;
        Self::from_stream(stream, BytesMut::new(), codec)
    }

    /// Wraps an established stream (accepted, or returned by the CONNECT dialer). `leftover`
    /// holds bytes already read from it that belong to the packet stream. Sets `TCP_NODELAY`.
    pub fn from_stream(
        stream: TcpStream,
        leftover: BytesMut,
        codec: FrameCodec,
    ) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let (read, write) = stream.into_split();
        Ok(Self {
            reader: TransportReader {
                io: read,
                codec,
                buf: leftover,
                peer,
            },
            writer: TransportWriter {
                io: write,
                codec,
                buf: BytesMut::new(),
                peer,
            },
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.reader.peer
    }

    /// Receives one packet; see [`TransportReader::recv`].
    pub async fn recv(&mut self) -> Result<Option<BytesMut>, TransportError> {
        self.reader.recv().await
    }

    /// Sends one packet; see [`TransportWriter::send`].
    pub async fn send(&mut self, packet: &[u8]) -> Result<(), TransportError> {
        self.writer.send(packet).await
    }

    /// The two directions as independent halves.
    pub fn into_split(self) -> (TransportReader, TransportWriter) {
        (self.reader, self.writer)
    }
}

/// The receiving half of a [`Transport`].
#[derive(Debug)]
pub struct TransportReader {
    io: OwnedReadHalf,
    codec: FrameCodec,
    buf: BytesMut,
    peer: SocketAddr,
}

impl TransportReader {
    /// Waits for the next whole packet (without its length prefix).
    ///
    /// `Ok(None)` when the peer closed the connection cleanly between packets; a close in the
    /// middle of a packet is [`TransportError::Truncated`]. A length of 0 or above the codec's
    /// limit is [`TransportError::Frame`]: upstream closes the connection then, and so should
    /// the caller. Cancel-safe: dropping the future loses no bytes.
    pub async fn recv(&mut self) -> Result<Option<BytesMut>, TransportError> {
        loop {
            if let Some(packet) = self
                .codec
                .decode(&mut self.buf)
                .map_err(TransportError::from)?
            {
                return Ok(Some(packet));
            }
            self.buf.reserve(READ_CHUNK);
            let n = self
                .io
                .read_buf(&mut self.buf)
                .await
                .map_err(|source| TransportError::Io { source })?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(TransportError::Truncated {
                    buffered: self.buf.len(),
                });
            }
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

/// The sending half of a [`Transport`].
#[derive(Debug)]
pub struct TransportWriter {
    io: OwnedWriteHalf,
    codec: FrameCodec,
    buf: BytesMut,
    peer: SocketAddr,
}

impl TransportWriter {
    /// Frames `packet` into the send buffer without writing it; [`TransportWriter::flush`]
    /// writes everything queued in as few system calls as the socket allows.
    pub fn queue(&mut self, packet: &[u8]) -> Result<(), TransportError> {
        self.codec
            .encode(packet, &mut self.buf)
            .map_err(TransportError::from)
    }

    /// Writes all queued bytes. Cancel-safe in the sense that bytes not yet written stay
    /// queued for the next call.
    pub async fn flush(&mut self) -> Result<(), TransportError> {
        while self.buf.has_remaining() {
            let n = self
                .io
                .write_buf(&mut self.buf)
                .await
                .map_err(|source| TransportError::Io { source })?;
            if n == 0 {
                return Err(TransportError::Io {
                    source: io::ErrorKind::WriteZero.into(),
                });
            }
        }
        Ok(())
    }

    /// Queues and writes one packet.
    pub async fn send(&mut self, packet: &[u8]) -> Result<(), TransportError> {
        self.queue(packet)?;
        self.flush().await
    }

    /// Writes what is queued, then closes the sending direction (TCP FIN); the reader half
    /// keeps working.
    pub async fn shutdown(&mut self) -> Result<(), TransportError> {
        self.flush().await?;
        self.io
            .shutdown()
            .await
            .map_err(|source| TransportError::Io { source })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

/// A transport failure.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A length prefix of 0 or above the limit (fatal: close the connection).
    #[error("bad packet length on the TCP stream")]
    Frame(#[from] FrameError),
    /// The peer closed the connection in the middle of a packet.
    #[error("connection closed in the middle of a packet ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the incomplete packet.
        buffered: usize,
    },
    /// The socket failed.
    #[error("TCP transport I/O failed")]
    Io {
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl From<CodecError> for TransportError {
    fn from(err: CodecError) -> Self {
        match err {
            CodecError::Frame(e) => TransportError::Frame(e),
            CodecError::Io(source) => TransportError::Io { source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn frames_cross_both_ways_and_leftover_comes_first() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut raw, _) = listener.accept().await.unwrap();
            // The second packet arrives split across two writes.
            raw.write_all(b"\x00\x03abc\x00\x02x").await.unwrap();
            raw.write_all(b"y").await.unwrap();
            let mut got = [0u8; 6];
            raw.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"\x00\x04ping");
            raw.shutdown().await.unwrap();
        });
        let stream = connect_nodelay(addr).await.unwrap();
        assert!(stream.nodelay().unwrap());
        // Pretend a proxy already handed us the start of a first packet.
        let leftover = BytesMut::from(&b"\x00\x01Z"[..]);
        let t = Transport::from_stream(stream, leftover, FrameCodec::new()).unwrap();
        let (mut rx, mut tx) = t.into_split();
        assert_eq!(&rx.recv().await.unwrap().unwrap()[..], b"Z");
        assert_eq!(&rx.recv().await.unwrap().unwrap()[..], b"abc");
        assert_eq!(&rx.recv().await.unwrap().unwrap()[..], b"xy");
        tx.send(b"ping").await.unwrap();
        assert!(rx.recv().await.unwrap().is_none());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn bad_length_and_truncation_are_errors() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut raw, _) = listener.accept().await.unwrap();
            raw.write_all(b"\x00\x00").await.unwrap();
            let (mut raw2, _) = listener.accept().await.unwrap();
            raw2.write_all(b"\x00\x05ab").await.unwrap();
            raw2.shutdown().await.unwrap();
            // Keep the first connection open until the reader has seen the bad length.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        });
        let mut t = Transport::connect(addr, FrameCodec::new()).await.unwrap();
        assert!(matches!(t.recv().await, Err(TransportError::Frame(_))));
        let mut t = Transport::connect(addr, FrameCodec::new()).await.unwrap();
        assert!(matches!(
            t.recv().await,
            Err(TransportError::Truncated { buffered: 4 })
        ));
    }
}
