//! The one bidirectional byte relay every proxy in this project uses (CONNECT sidecar,
//! apiserver-proxy, ingress router).
//!
//! ```text
//!   a ──read──► buf a→b ──write──► b        EOF from a → shutdown(Write) on b,
//!   a ◄──write── buf b→a ◄──read── b        the b→a direction keeps flowing (and vice versa)
//! ```
//!
//! * **Half-close both ways.** When one side's read returns EOF, the relay writes out what it
//!   still holds for the other side and shuts that side's write half (TCP FIN). The opposite
//!   direction keeps flowing until it ends too; the relay returns when both have ended.
//! * **Idle timeout.** If no byte moves in either direction for [`RelayConfig::idle_timeout`],
//!   both sides are shut and the relay returns [`RelayEnd::Idle`] with the counts so far.
//! * **Half-open bound.** Once one direction has ended, the other gets
//!   [`RelayConfig::half_closed_timeout`] (if shorter than the idle timeout) from that moment
//!   and after each byte it carries: a peer that half-closed and a peer that never answers or
//!   closes do not hold a tunnel for the full idle timeout, while a direction that keeps
//!   carrying bytes after the half-close is never cut.
//! * **Dead peers.** [`relay_tcp`] sets `TCP_USER_TIMEOUT` ([`RelayConfig::tcp_user_timeout`])
//!   on both sockets, so bytes a vanished peer never acknowledges fail the relay within that
//!   bound instead of after the kernel's ~15 minutes of retransmissions.
//! * **Bounded memory, no allocation per chunk.** In [`relay`], each direction owns one buffer
//!   of [`RelayConfig::buffer_size`] bytes, allocated once when the relay starts. In
//!   [`relay_tcp`] on Linux, a direction holds a splice pipe only while bytes are on their way
//!   and gives it back to a bounded per-thread pool ([`PIPE_POOL_SIZE`]) when it is empty: an
//!   idle tunnel holds its two sockets and nothing else.
//!
//! Both directions are driven by one future (no spawned tasks), so dropping the future drops
//! the relay.
//!
//! [`relay`] works on any byte stream (TLS included) and copies through its buffers;
//! [`relay_tcp`] is the same contract for two plain TCP sockets, zero-copy with `splice(2)` on
//! Linux (see `splice.rs`), falling back to [`relay`] where the kernel cannot splice.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[cfg(target_os = "linux")]
mod splice;

/// Empty splice pipes [`relay_tcp`] keeps per thread for the next burst (two descriptors
/// each); the pool lends them to directions with bytes on their way.
#[cfg(target_os = "linux")]
pub use splice::POOL_PIPES as PIPE_POOL_SIZE;

/// The default per-direction buffer: 32 KiB (what Gardener's apiserver-proxy Envoy uses per
/// connection).
pub const DEFAULT_BUFFER_SIZE: usize = 32 * 1024;

/// Envoy's default stream idle timeout (5 min), which the Gardener sidecar relied on.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the direction left open after a half-close may go without a byte: 60 s.
///
/// What crosses our relays is OpenVPN over TCP with `keepalive 10 60` (a ping each way every
/// 10 s) or HTTP, and neither leaves a live half-closed connection silent for a minute; a
/// client that gave up after its `ping-restart 60` and closed its side frees the tunnel a
/// minute later instead of five.
pub const DEFAULT_HALF_CLOSED_TIMEOUT: Duration = Duration::from_secs(60);

/// `TCP_USER_TIMEOUT` on relayed sockets: 60 s.
///
/// OpenVPN's `keepalive 10 60` keeps bytes in flight at least every 10 s, so a dead peer leaves
/// unacknowledged data within 10 s and the relay fails 60 to 70 s after the peer died. The
/// client's own `ping-restart 60` has given up on that tunnel by then (it counts from the last
/// packet received, at most 10 s before the death), so the relay never cuts a tunnel OpenVPN
/// would still keep; it frees the sockets the endpoints abandoned. A slow reader that still
/// acknowledges is not affected (zero-window probes are answered).
pub const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);

/// How a relay is run.
///
/// For [`relay_tcp`] on Linux, `buffer_size` is the size of the pipe a direction is lent while
/// it carries bytes (the kernel rounds it up to a power of two pages, at most
/// [`MAX_PIPE_SIZE`]); pipe pages hold references to socket pages, not copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayConfig {
    /// No bytes either way for this long closes both sides.
    pub idle_timeout: Duration,
    /// Once one direction has ended (its EOF passed on), no bytes the other way for this long
    /// closes both sides; the idle timeout still applies if it is shorter.
    pub half_closed_timeout: Duration,
    /// Bytes buffered per direction.
    pub buffer_size: usize,
    /// `TCP_USER_TIMEOUT` that [`relay_tcp`] sets on both sockets (data unacknowledged for this
    /// long fails the socket, and so the relay); `None` keeps the sockets' setting. The
    /// generic [`relay`] does not see sockets: its callers set it.
    pub tcp_user_timeout: Option<Duration>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            half_closed_timeout: DEFAULT_HALF_CLOSED_TIMEOUT,
            buffer_size: DEFAULT_BUFFER_SIZE,
            tcp_user_timeout: Some(DEFAULT_TCP_USER_TIMEOUT),
        }
    }
}

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides closed their write halves (EOF both ways) and everything was delivered.
    Closed,
    /// Nothing moved for the idle timeout (or, once one direction had ended, for the
    /// half-closed timeout).
    Idle,
}

/// What a relay carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayStats {
    /// Bytes read from `a` and written to `b`.
    pub a_to_b: u64,
    /// Bytes read from `b` and written to `a`.
    pub b_to_a: u64,
    /// How it ended.
    pub end: RelayEnd,
}

/// A socket error ended the relay; the counts say what had been delivered by then.
#[derive(Debug, thiserror::Error)]
#[error("relay failed after {a_to_b} bytes a→b and {b_to_a} bytes b→a")]
pub struct RelayError {
    /// Bytes delivered a→b before the error.
    pub a_to_b: u64,
    /// Bytes delivered b→a before the error.
    pub b_to_a: u64,
    /// The error.
    #[source]
    pub source: io::Error,
}

/// The relay's one timer: [`RelayConfig::idle_timeout`] after the last byte moved, and once
/// exactly one direction has ended, the shorter of that and
/// [`RelayConfig::half_closed_timeout`], counted from the end of that direction on.
#[derive(Debug)]
struct Deadline {
    idle: Duration,
    half_closed: Duration,
    one_ended: bool,
}

impl Deadline {
    fn new(config: &RelayConfig) -> Self {
        Deadline {
            idle: config.idle_timeout,
            half_closed: config.half_closed_timeout,
            one_ended: false,
        }
    }

    /// How long the relay may now go without moving a byte.
    fn timeout(&self) -> Duration {
        if self.one_ended {
            self.idle.min(self.half_closed)
        } else {
            self.idle
        }
    }
}

/// What one wake-up of a two-direction relay saw: each direction's poll (a to b, b to a), and
/// the bytes both had moved before and after polling them.
pub(crate) type Polled = ((Poll<io::Result<()>>, Poll<io::Result<()>>), (u64, u64));

/// Runs a two-direction relay to its end, shared by [`relay`] and the splice relay: on every
/// wake-up `poll_both` polls both directions, and [`relay_step`] decides with the idle timer
/// and the half-closed deadline of `config`.
pub(crate) async fn run_until_end(
    config: &RelayConfig,
    mut poll_both: impl FnMut(&mut Context<'_>) -> Polled,
) -> io::Result<RelayEnd> {
    let idle = tokio::time::sleep(config.idle_timeout);
    tokio::pin!(idle);
    let mut deadline = Deadline::new(config);
    poll_fn(|cx| {
        let (directions, moved) = poll_both(cx);
        relay_step(cx, directions, moved, idle.as_mut(), &mut deadline)
    })
    .await
}

/// One wake-up of a two-direction relay: the first error ends it, both directions done is
/// `Closed`; any byte moved (`moved` changed from `before`), and the end of the first
/// direction, push the deadline out; otherwise the timer decides.
fn relay_step(
    cx: &mut Context<'_>,
    directions: (Poll<io::Result<()>>, Poll<io::Result<()>>),
    moved: (u64, u64),
    idle: Pin<&mut tokio::time::Sleep>,
    deadline: &mut Deadline,
) -> Poll<io::Result<RelayEnd>> {
    let (r1, r2) = directions;
    if let Poll::Ready(Err(e)) = r1 {
        return Poll::Ready(Err(e));
    }
    if let Poll::Ready(Err(e)) = r2 {
        return Poll::Ready(Err(e));
    }
    if r1.is_ready() && r2.is_ready() {
        return Poll::Ready(Ok(RelayEnd::Closed));
    }
    let mut idle = idle;
    let half_closed_now = (r1.is_ready() || r2.is_ready()) && !deadline.one_ended;
    if half_closed_now {
        deadline.one_ended = true;
    }
    if half_closed_now || moved.0 != moved.1 {
        idle.as_mut().reset(Instant::now() + deadline.timeout());
    }
    match idle.poll(cx) {
        Poll::Ready(()) => {
            if deadline.one_ended {
                tracing::debug!(
                    timeout = ?deadline.timeout(),
                    "half-closed relay idle; closing both sides"
                );
            }
            Poll::Ready(Ok(RelayEnd::Idle))
        }
        Poll::Pending => Poll::Pending,
    }
}

/// Relays bytes between `a` and `b` until both directions have ended (EOF, then everything
/// delivered and the peer's write half shut) or nothing moved for the idle timeout; see the
/// module docs.
pub async fn relay<A, B>(
    a: &mut A,
    b: &mut B,
    config: RelayConfig,
) -> Result<RelayStats, RelayError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let size = config.buffer_size.max(1);
    let mut ab = Direction::new(size);
    let mut ba = Direction::new(size);
    let result = run_until_end(&config, |cx| {
        let before = ab.moved + ba.moved;
        let r1 = ab.poll(cx, Pin::new(&mut *a), Pin::new(&mut *b));
        let r2 = ba.poll(cx, Pin::new(&mut *b), Pin::new(&mut *a));
        ((r1, r2), (before, ab.moved + ba.moved))
    })
    .await;
    match result {
        Ok(end) => {
            if end == RelayEnd::Idle {
                // Best effort: tell both peers we are done.
                let _ = poll_fn(|cx| Pin::new(&mut *a).poll_shutdown(cx)).await;
                let _ = poll_fn(|cx| Pin::new(&mut *b).poll_shutdown(cx)).await;
            }
            Ok(RelayStats {
                a_to_b: ab.delivered,
                b_to_a: ba.delivered,
                end,
            })
        }
        Err(source) => Err(RelayError {
            a_to_b: ab.delivered,
            b_to_a: ba.delivered,
            source,
        }),
    }
}

/// The largest splice pipe [`relay_tcp`] asks for (Linux's default `fs.pipe-max-size`).
pub const MAX_PIPE_SIZE: usize = 1024 * 1024;

/// [`relay`] for two plain TCP sockets, moving bytes socket → pipe → socket with `splice(2)`
/// on Linux so they never pass through user space: same half-close, timeouts, counts and
/// errors. Sets [`RelayConfig::tcp_user_timeout`] on both sockets first.
///
/// A direction takes a pipe from a per-thread pool when its source turns readable and gives
/// it back once it is empty and the source would block, so idle tunnels hold no pipe. When no
/// pipe can be made (at the descriptor limit, for one), that burst is copied through a buffer
/// instead; the relay never fails for lack of pipes. Falls back to [`relay`] (copying,
/// `config.buffer_size` per direction) when the kernel refuses to splice these sockets before
/// any byte moved, and on other systems.
pub async fn relay_tcp(
    a: &mut TcpStream,
    b: &mut TcpStream,
    config: RelayConfig,
) -> Result<RelayStats, RelayError> {
    if let Some(timeout) = config.tcp_user_timeout {
        set_tcp_user_timeout(a, timeout);
        set_tcp_user_timeout(b, timeout);
    }
    #[cfg(target_os = "linux")]
    match splice::relay(a, b, config).await {
        splice::Outcome::Done(result) => return result,
        splice::Outcome::Unsupported(e) => {
            tracing::debug!("splice unavailable ({e}); relaying through buffers");
        }
    }
    relay(a, b, config).await
}

/// Best effort: a socket that refuses keeps the kernel's retransmission limit (logged).
fn set_tcp_user_timeout(stream: &TcpStream, timeout: Duration) {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_user_timeout(Some(timeout)) {
        tracing::debug!("TCP_USER_TIMEOUT not set on a relayed socket: {e}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "fuchsia")))]
    let _ = (stream, timeout);
}

/// One direction: a fixed buffer, what of it is still to be written, and whether the reader
/// reached EOF and the writer has been shut.
struct Direction {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
    shut: bool,
    /// Bytes written to the destination.
    delivered: u64,
    /// Bytes read plus bytes written: changes whenever this direction made progress.
    moved: u64,
}

impl Direction {
    fn new(size: usize) -> Self {
        Direction {
            buf: vec![0; size].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            shut: false,
            delivered: 0,
            moved: 0,
        }
    }

    /// Moves as much as possible; `Ready(Ok)` once EOF was read, everything written and the
    /// destination shut.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut src: Pin<&mut R>,
        mut dst: Pin<&mut W>,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            // Drain the buffer first.
            while self.start < self.end {
                let pending = &self.buf[self.start..self.end];
                match dst.as_mut().poll_write(cx, pending) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        self.start += n;
                        self.delivered += n as u64;
                        self.moved += n as u64;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            self.start = 0;
            self.end = 0;
            if self.eof {
                if !self.shut {
                    match dst.as_mut().poll_shutdown(cx) {
                        Poll::Ready(Ok(())) => self.shut = true,
                        // The peer may already be gone; its direction reports that.
                        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::NotConnected => {
                            self.shut = true
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut self.buf);
            match src.as_mut().poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        self.eof = true;
                    } else {
                        self.end = n;
                        self.moved += n as u64;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Make sure the destination's buffered bytes leave while we wait.
                    return match dst.as_mut().poll_flush(cx) {
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        _ => Poll::Pending,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected loopback pair.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// client ⇄ [relay between p1 and p2] ⇄ server; returns (client, server, relay task).
    async fn through_relay(
        config: RelayConfig,
    ) -> (
        TcpStream,
        TcpStream,
        tokio::task::JoinHandle<Result<RelayStats, RelayError>>,
    ) {
        let (client, mut p1) = pair().await;
        let (mut p2, server) = pair().await;
        let task = tokio::spawn(async move { relay(&mut p1, &mut p2, config).await });
        (client, server, task)
    }

    #[tokio::test]
    async fn carries_bytes_and_counts_both_ways() {
        let config = RelayConfig {
            buffer_size: 1000, // smaller than the transfer: many chunks through one buffer
            ..RelayConfig::default()
        };
        let (mut client, mut server, task) = through_relay(config).await;
        let up: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..123_457u32).map(|i| (i % 13) as u8).collect();
        let up2 = up.clone();
        let down2 = down.clone();
        let srv = tokio::spawn(async move {
            let (mut r, mut w) = server.split();
            let send = async {
                w.write_all(&down2).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let recv = async {
                let mut got = Vec::new();
                r.read_to_end(&mut got).await.unwrap();
                got
            };
            let ((), got) = tokio::join!(send, recv);
            assert_eq!(got, up2);
        });
        let (mut r, mut w) = client.split();
        let send = async {
            w.write_all(&up).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let recv = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(send, recv);
        assert_eq!(got, down);
        srv.await.unwrap();
        let stats = task.await.unwrap().unwrap();
        assert_eq!(
            stats,
            RelayStats {
                a_to_b: up.len() as u64,
                b_to_a: down.len() as u64,
                end: RelayEnd::Closed
            }
        );
    }

    #[tokio::test]
    async fn half_close_from_client_keeps_server_direction_open() {
        let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        // The server sees the request, then EOF (the FIN was passed on) ...
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        // ... and can still answer after that, in several writes.
        server.write_all(b"response ").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.write_all(b"after half-close").await.unwrap();
        server.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"response after half-close");
        let stats = task.await.unwrap().unwrap();
        assert_eq!((stats.a_to_b, stats.b_to_a), (7, 25));
        assert_eq!(stats.end, RelayEnd::Closed);
    }

    #[tokio::test]
    async fn half_close_from_server_keeps_client_direction_open() {
        let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
        server.write_all(b"banner").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"banner");
        client.write_all(b"still talking").await.unwrap();
        client.shutdown().await.unwrap();
        let mut up = Vec::new();
        server.read_to_end(&mut up).await.unwrap();
        assert_eq!(up, b"still talking");
        let stats = task.await.unwrap().unwrap();
        assert_eq!((stats.a_to_b, stats.b_to_a), (13, 6));
    }

    #[tokio::test]
    async fn idle_timeout_closes_both_sides() {
        let config = RelayConfig {
            idle_timeout: Duration::from_millis(300),
            ..RelayConfig::default()
        };
        let (mut client, mut server, task) = through_relay(config).await;
        // Traffic keeps it alive past the timeout ...
        for _ in 0..4 {
            client.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert!(!task.is_finished());
        // ... silence ends it, and both peers see EOF.
        let stats = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("relay ends after the idle timeout")
            .unwrap()
            .unwrap();
        assert_eq!(stats.end, RelayEnd::Idle);
        assert_eq!((stats.a_to_b, stats.b_to_a), (4, 0));
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_half_closed_tunnel_nobody_answers_closes_at_the_half_closed_timeout() {
        let config = RelayConfig {
            half_closed_timeout: Duration::from_millis(300),
            ..RelayConfig::default()
        };
        let (mut client, mut server, task) = through_relay(config).await;
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        // The server never answers nor closes: the relay gives up long before the idle timeout.
        let stats = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("relay ends after the half-closed timeout")
            .unwrap()
            .unwrap();
        assert_eq!(stats.end, RelayEnd::Idle);
        assert_eq!((stats.a_to_b, stats.b_to_a), (7, 0));
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_half_closed_tunnel_still_carrying_bytes_is_not_cut() {
        let config = RelayConfig {
            half_closed_timeout: Duration::from_millis(300),
            ..RelayConfig::default()
        };
        let (mut client, mut server, task) = through_relay(config).await;
        client.shutdown().await.unwrap();
        let mut nothing = Vec::new();
        server.read_to_end(&mut nothing).await.unwrap();
        // Four half-closed timeouts long, a byte every half of one.
        for _ in 0..8 {
            server.write_all(b"y").await.unwrap();
            let mut one = [0u8; 1];
            client.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert!(!task.is_finished());
        server.shutdown().await.unwrap();
        let stats = task.await.unwrap().unwrap();
        assert_eq!(stats.end, RelayEnd::Closed);
        assert_eq!((stats.a_to_b, stats.b_to_a), (0, 8));
    }

    #[tokio::test]
    async fn a_shorter_idle_timeout_wins_over_the_half_closed_one() {
        let config = RelayConfig {
            idle_timeout: Duration::from_millis(300),
            half_closed_timeout: Duration::from_secs(60),
            ..RelayConfig::default()
        };
        let (mut client, mut server, task) = through_relay(config).await;
        client.shutdown().await.unwrap();
        let mut nothing = Vec::new();
        server.read_to_end(&mut nothing).await.unwrap();
        let stats = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("relay ends after the idle timeout")
            .unwrap()
            .unwrap();
        assert_eq!(stats.end, RelayEnd::Idle);
    }

    #[tokio::test]
    async fn reset_peer_is_an_error_with_counts() {
        let (mut client, server, task) = through_relay(RelayConfig::default()).await;
        client.write_all(b"abc").await.unwrap();
        // SO_LINGER 0: close sends RST.
        server.set_zero_linger().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(server);
        // Keep writing until the relay notices.
        let result = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if client.write_all(&[0u8; 1024]).await.is_err() || task.is_finished() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            task.await.unwrap()
        })
        .await
        .unwrap();
        let err = result.unwrap_err();
        assert_eq!(err.b_to_a, 0);
        assert!(err.a_to_b >= 3);
    }
}
