//! The two directions of one OpenVPN TCP connection, for both roles (each of the server's
//! connections and the client's): [`FrameReader`] cuts the length-prefixed packets
//! (`protocol::framing`) out of the socket's byte stream, [`FrameWriter`] queues framed
//! packets and writes what is queued with one vectored write.
//!
//! ```text
//!  socket ──read (64 KiB)──► FrameReader ── next() / buffered() ──► session.handle_packet
//!  session.poll_transmit / send_tun_packet ──► FrameWriter.push ── flush(): writev ──► socket
//! ```
//!
//! Neither copies a packet: the reader splits each packet off its receive buffer (decrypted
//! in place afterwards), and the writer hands the queued buffers to the kernel as they are
//! (a data packet is encrypted in place into its own buffer, already framed).

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, BytesMut};
use protocol::framing::{stream_max_len, FrameDecoder, FrameError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Most packets already received that a driver hands its session per wakeup
/// ([`FrameReader::receive_batch`]) before its other sources get a turn: a flood on the socket
/// must not starve the timers.
pub const RECV_BATCH: usize = 64;

/// Bytes reserved in the receive buffer before each read that waits.
pub const READ_CHUNK: usize = 64 * 1024;

/// What a reader reserves before each read while it waits for a connection's first packet
/// ([`FrameReader::set_read_chunk`]): a client's first packet (its hard reset) is well under
/// 100 bytes and no packet is longer than this, while a server may hold a thousand silent
/// connections.
pub const FIRST_READ_CHUNK: usize = 2 * 1024;

/// Most bytes one read of what has already arrived takes ([`FrameReader::buffered_or_arrived`];
/// a peer's TLS flight is a few kilobytes).
pub const ARRIVED_CHUNK: usize = 16 * 1024;

/// Most buffers one vectored write hands to the kernel (Linux takes up to 1024).
pub const MAX_WRITE_BUFFERS: usize = 128;

/// Framed packets from the receiving half of the socket. Cancel-safe: bytes stay in the
/// buffer across cancelled reads.
#[derive(Debug)]
pub struct FrameReader {
    io: OwnedReadHalf,
    buf: BytesMut,
    decoder: FrameDecoder,
    quickack: bool,
    received: u64,
    chunk: usize,
}

impl FrameReader {
    /// Reads packets from `io`, starting with `leftover` (bytes already read from the socket,
    /// e.g. what an HTTP proxy sent after its response head). Packets longer than upstream
    /// accepts with this `tun-mtu` are a framing error ([`stream_max_len`]).
    pub fn new(io: OwnedReadHalf, leftover: BytesMut, tun_mtu: u16) -> FrameReader {
        FrameReader {
            io,
            buf: leftover,
            decoder: FrameDecoder::with_max_len(stream_max_len(tun_mtu)),
            quickack: false,
            received: 0,
            chunk: READ_CHUNK,
        }
    }

    /// Reserve `chunk` bytes before each read that waits ([`READ_CHUNK`] unless set; a
    /// packet longer than the buffer still arrives whole, over several reads).
    pub fn set_read_chunk(&mut self, chunk: usize) {
        self.chunk = chunk.max(1);
    }

    /// Acknowledge every read at once (`TCP_QUICKACK`, which the kernel clears again by
    /// itself, so it is set after each read; set while an ACK is pending, it sends that ACK
    /// now). A peer or proxy that runs Nagle's algorithm holds its next small write until we
    /// have acknowledged the previous one; a delayed ACK then costs it up to 40 ms.
    pub fn set_quickack(&mut self, on: bool) {
        self.quickack = on;
    }

    /// Bytes read from the socket so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The next packet (without its length prefix), reading as needed; `None` on a clean
    /// close between packets.
    pub async fn next(&mut self) -> Result<Option<BytesMut>, FrameReadError> {
        loop {
            if let Some(packet) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(packet));
            }
            self.buf.reserve(self.chunk);
            let n = self.io.read_buf(&mut self.buf).await?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameReadError::Truncated {
                        buffered: self.buf.len(),
                    })
                };
            }
            self.read_done(n);
        }
    }

    /// A batch of received packets: `first`, then each packet already buffered behind it
    /// ([`FrameReader::buffered`]; with `arrived`, also what the socket has received by now:
    /// [`FrameReader::buffered_or_arrived`]), each given to `handle` while it answers `true`
    /// (the driver stops at its share of [`RECV_BATCH`], or when its session closed).
    pub fn receive_batch(
        &mut self,
        first: BytesMut,
        arrived: bool,
        mut handle: impl FnMut(BytesMut) -> bool,
    ) -> Result<(), FrameReadError> {
        let mut next = Some(first);
        while let Some(packet) = next.take() {
            if handle(packet) {
                next = match arrived {
                    true => self.buffered_or_arrived()?,
                    false => self.buffered()?,
                };
            }
        }
        Ok(())
    }

    /// The next packet already in the buffer, without reading.
    pub fn buffered(&mut self) -> Result<Option<BytesMut>, FrameReadError> {
        Ok(self.decoder.decode(&mut self.buf)?)
    }

    /// The next packet already in the buffer; if none is, also what the socket has received
    /// by now (one read that does not wait, at most [`ARRIVED_CHUNK`] bytes).
    ///
    /// For the handshake: a peer's TLS flight often comes in two control packets, and
    /// answering the first alone means a P_ACK_V1 of its own followed by the TLS reply.
    /// Through a proxy with Nagle's algorithm on (tinyproxy), that second write waits until the
    /// server acknowledges the first at the TCP level, which an upstream server delays by
    /// about 40 ms. Taking the second packet first makes one reply that carries the ACK.
    pub fn buffered_or_arrived(&mut self) -> Result<Option<BytesMut>, FrameReadError> {
        if let Some(packet) = self.buffered()? {
            return Ok(Some(packet));
        }
        // A close (0 bytes) is for `next` to report.
        let n = crate::tcp::read_arrived(self.io.as_ref(), &mut self.buf, ARRIVED_CHUNK)?;
        if n == 0 {
            return Ok(None);
        }
        self.read_done(n);
        self.buffered()
    }

    fn read_done(&mut self, n: usize) {
        self.received += n as u64;
        if self.quickack {
            // Best effort: without it a peer behind Nagle's algorithm is only slower.
            let _ = self.io.as_ref().set_quickack(true);
        }
    }
}

/// Why no packet could be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    /// A length prefix of 0 or above the limit: the stream cannot be resynchronised (upstream
    /// closes the connection too).
    #[error("bad packet length on the TCP stream")]
    Frame(#[from] FrameError),
    /// The peer closed the connection in the middle of a packet.
    #[error("connection closed in the middle of a packet ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the incomplete packet.
        buffered: usize,
    },
    /// The socket failed.
    #[error("socket read failed")]
    Io(#[from] io::Error),
}

/// Framed packets queued for the sending half of the socket, written together.
#[derive(Debug)]
pub struct FrameWriter {
    io: OwnedWriteHalf,
    queue: VecDeque<BytesMut>,
    sent: u64,
}

impl FrameWriter {
    /// A writer on `io` with nothing queued.
    pub fn new(io: OwnedWriteHalf) -> FrameWriter {
        FrameWriter {
            io,
            queue: VecDeque::with_capacity(MAX_WRITE_BUFFERS),
            sent: 0,
        }
    }

    /// Queues `framed` (one or more whole framed packets, as the session's `poll_transmit`
    /// and `send_tun_packet` leave them) behind what is queued; nothing is copied.
    pub fn push(&mut self, framed: BytesMut) {
        if !framed.is_empty() {
            self.queue.push_back(framed);
        }
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The one buffer queued, if exactly one is.
    pub fn only_queued(&self) -> Option<&[u8]> {
        match (self.queue.front(), self.queue.len()) {
            (Some(b), 1) => Some(b),
            _ => None,
        }
    }

    /// Bytes written to the socket so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Writes everything queued, in order, with as few vectored writes as the socket takes
    /// (each of up to [`MAX_WRITE_BUFFERS`] buffers). Waits while the socket's send buffer is
    /// full. Cancel-safe: what was not written stays queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        while !self.queue.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_WRITE_BUFFERS];
            let mut count = 0;
            for (slot, buf) in iov.iter_mut().zip(&self.queue) {
                *slot = IoSlice::new(buf);
                count += 1;
            }
            let n = self.io.write_vectored(&iov[..count]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.sent += n as u64;
            self.consume(n);
        }
        Ok(())
    }

    /// Writes what is queued, then closes the sending direction (TCP FIN).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.io.shutdown().await
    }

    /// Drops the first `n` queued bytes (whole buffers, then the front of a partly written one).
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.queue.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn packets_split_and_coalesced_come_out_whole_and_leftover_first() {
        let (ours, mut raw) = pair().await;
        let (rd, _wr) = ours.into_split();
        let mut reader = FrameReader::new(rd, BytesMut::from(&b"\x00\x01Z\x00"[..]), 1500);
        // The second packet's prefix is split between the leftover and the first write; the
        // third arrives in two writes.
        raw.write_all(b"\x03abc\x00\x02x").await.unwrap();
        assert_eq!(&reader.next().await.unwrap().unwrap()[..], b"Z");
        assert_eq!(&reader.next().await.unwrap().unwrap()[..], b"abc");
        assert!(reader.buffered().unwrap().is_none());
        raw.write_all(b"y\x00\x01q").await.unwrap();
        assert_eq!(&reader.next().await.unwrap().unwrap()[..], b"xy");
        assert_eq!(&reader.buffered().unwrap().unwrap()[..], b"q");
        assert_eq!(reader.received(), 11);
        raw.shutdown().await.unwrap();
        assert!(reader.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_small_read_chunk_still_takes_a_long_packet_whole() {
        let (ours, mut raw) = pair().await;
        let mut reader = FrameReader::new(ours.into_split().0, BytesMut::new(), 1500);
        reader.set_read_chunk(16);
        let packet: Vec<u8> = (0..1000u16).map(|i| i as u8).collect();
        raw.write_all(&1000u16.to_be_bytes()).await.unwrap();
        raw.write_all(&packet).await.unwrap();
        assert_eq!(&reader.next().await.unwrap().unwrap()[..], &packet[..]);
    }

    #[tokio::test]
    async fn bad_lengths_and_truncation_are_errors() {
        let (ours, mut raw) = pair().await;
        let mut reader = FrameReader::new(ours.into_split().0, BytesMut::new(), 1500);
        raw.write_all(b"\x00\x00").await.unwrap();
        assert!(matches!(
            reader.next().await,
            Err(FrameReadError::Frame(FrameError::Empty { .. }))
        ));

        let (ours, mut raw) = pair().await;
        let mut reader = FrameReader::new(ours.into_split().0, BytesMut::new(), 1500);
        // 1769 is one more than upstream accepts with the default MTU.
        raw.write_all(&1769u16.to_be_bytes()).await.unwrap();
        assert!(matches!(
            reader.next().await,
            Err(FrameReadError::Frame(FrameError::TooLong { len: 1769, .. }))
        ));

        let (ours, mut raw) = pair().await;
        let mut reader = FrameReader::new(ours.into_split().0, BytesMut::new(), 9000);
        raw.write_all(&1769u16.to_be_bytes()).await.unwrap();
        raw.write_all(b"ab").await.unwrap();
        raw.shutdown().await.unwrap();
        // Long enough with a 9000-byte MTU, but the peer left in the middle.
        assert!(matches!(
            reader.next().await,
            Err(FrameReadError::Truncated { buffered: 4 })
        ));
    }

    #[tokio::test]
    async fn arrived_bytes_are_taken_without_waiting() {
        let (ours, mut raw) = pair().await;
        let mut reader = FrameReader::new(ours.into_split().0, BytesMut::new(), 1500);
        assert!(reader.buffered_or_arrived().unwrap().is_none());
        raw.write_all(b"\x00\x02hi").await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let packet = loop {
            if let Some(p) = reader.buffered_or_arrived().unwrap() {
                break p;
            }
            assert!(std::time::Instant::now() < deadline, "nothing arrived");
            tokio::task::yield_now().await;
        };
        assert_eq!(&packet[..], b"hi");
    }

    #[tokio::test]
    async fn queued_buffers_go_out_in_order_even_when_written_in_parts() {
        let (ours, mut raw) = pair().await;
        let (_rd, wr) = ours.into_split();
        let mut writer = FrameWriter::new(wr);
        // More buffers than one write takes, and more bytes than the socket buffers at once,
        // so `flush` writes in several parts and resumes inside a buffer.
        let mut expected = Vec::new();
        for i in 0..(3 * MAX_WRITE_BUFFERS) {
            let packet: Vec<u8> = (0..1400).map(|j| (i * 7 + j) as u8).collect();
            expected.extend_from_slice(&packet);
            writer.push(BytesMut::from(&packet[..]));
        }
        writer.push(BytesMut::new());
        assert!(writer.only_queued().is_none());
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            raw.read_to_end(&mut got).await.unwrap();
            got
        });
        writer.shutdown().await.unwrap();
        assert!(writer.is_empty());
        assert_eq!(writer.sent(), expected.len() as u64);
        assert_eq!(reading.await.unwrap(), expected);
    }

    #[test]
    fn only_queued_is_the_single_buffer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (ours, _raw) = pair().await;
            let mut writer = FrameWriter::new(ours.into_split().1);
            assert!(writer.only_queued().is_none());
            writer.push(BytesMut::from(&b"\x00\x01\x28"[..]));
            assert_eq!(writer.only_queued(), Some(&b"\x00\x01\x28"[..]));
        });
    }
}
