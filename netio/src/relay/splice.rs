//! The zero-copy TCP ↔ TCP relay behind [`super::relay_tcp`] (Linux only).
//!
//! ```text
//!   a ──splice──► pipe a→b ──splice──► b      bytes never enter user space: the kernel
//!   a ◄──splice── pipe b→a ◄──splice── b      moves page references socket → pipe → socket
//! ```
//!
//! Each direction owns one pipe of (about) [`RelayConfig::buffer_size`] bytes and works in
//! two steps driven by tokio readiness, never by polling in a loop:
//!
//! 1. **Fill**: only when the pipe is *empty*, `splice(src → pipe)`. With an empty pipe,
//!    `EAGAIN` can only mean "the socket has nothing", so clearing the socket's read readiness
//!    is correct. (A pipe that still holds bytes may be out of slots, and `EAGAIN` would then
//!    be about the pipe, not the socket: the edge-triggered read readiness would be lost and
//!    the direction would stall.) `0` means EOF.
//! 2. **Drain**: while the pipe holds bytes, `splice(pipe → dst)`. `EAGAIN` means the
//!    destination's send buffer is full; wait for write readiness.
//!
//! EOF is only seen with an empty pipe, so every byte is delivered before `shutdown(Write)` is
//! passed on, and the other direction keeps flowing. Timeouts and error counts are those of the
//! generic relay (same types, same contract).
//!
//! If the kernel refuses to splice these sockets (`EINVAL` before any byte moved), the caller
//! falls back to the generic copying relay; see [`Outcome::Unsupported`].
//!
//! **Pipe accounting.** Pipe pages are charged to the user even when empty; an unprivileged
//! user over `fs.pipe-user-pages-soft` (16384 pages by default, i.e. 64 MiB of pipe capacity)
//! gets small pipes, and resizing fails. The relay then keeps whatever capacity the kernel gave
//! (still correct, just more system calls per byte).

use std::future::poll_fn;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags, SpliceFlags};
use tokio::io::{AsyncWrite, Interest};
use tokio::net::tcp::WriteHalf;
use tokio::net::TcpStream;

use super::{relay_step, Deadline, RelayConfig, RelayEnd, RelayError, RelayStats, MAX_PIPE_SIZE};

/// What [`relay`] returns: a finished relay, or "splice is not possible here" before anything
/// moved (the caller then runs the generic relay on the same sockets).
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The relay ran (to the end or to an error).
    Done(Result<RelayStats, RelayError>),
    /// Pipes could not be created or the kernel refused to splice; nothing was read or written.
    Unsupported(io::Error),
}

/// Relays `a` ⇄ `b` through two pipes; see the module docs.
pub(crate) async fn relay(a: &mut TcpStream, b: &mut TcpStream, config: RelayConfig) -> Outcome {
    let mut ab = match Direction::new(config.buffer_size) {
        Ok(d) => d,
        Err(e) => return Outcome::Unsupported(e),
    };
    let mut ba = match Direction::new(config.buffer_size) {
        Ok(d) => d,
        Err(e) => return Outcome::Unsupported(e),
    };
    let (ar, mut aw) = a.split();
    let (br, mut bw) = b.split();
    let (ar, br): (&TcpStream, &TcpStream) = (ar.as_ref(), br.as_ref());
    let idle = tokio::time::sleep(config.idle_timeout);
    tokio::pin!(idle);
    let mut deadline = Deadline::new(&config);
    let result = poll_fn(|cx| {
        let before = ab.moved + ba.moved;
        let r1 = ab.poll(cx, ar, &mut bw);
        let r2 = ba.poll(cx, br, &mut aw);
        relay_step(
            cx,
            (r1, r2),
            (before, ab.moved + ba.moved),
            idle.as_mut(),
            &mut deadline,
        )
    })
    .await;
    let result = match result {
        Ok(end) => {
            if end == RelayEnd::Idle {
                // Best effort, as the generic relay: tell both peers we are done.
                let _ = poll_fn(|cx| Pin::new(&mut aw).poll_shutdown(cx)).await;
                let _ = poll_fn(|cx| Pin::new(&mut bw).poll_shutdown(cx)).await;
            }
            Ok(RelayStats {
                a_to_b: ab.delivered,
                b_to_a: ba.delivered,
                end,
            })
        }
        Err(source) => {
            if ab.moved + ba.moved == 0 && source.raw_os_error() == Some(EINVAL) {
                return Outcome::Unsupported(source);
            }
            Err(RelayError {
                a_to_b: ab.delivered,
                b_to_a: ba.delivered,
                source,
            })
        }
    };
    Outcome::Done(result)
}

/// `splice(2)`'s answer when one of the descriptors does not support it.
const EINVAL: i32 = rustix::io::Errno::INVAL.raw_os_error();

/// One direction: its pipe, how many bytes sit in it, EOF / shut state and counts.
#[derive(Debug)]
struct Direction {
    pipe_r: OwnedFd,
    pipe_w: OwnedFd,
    /// Pipe capacity in bytes: how much one fill asks for.
    capacity: usize,
    /// Bytes spliced into the pipe and not yet out of it.
    in_pipe: usize,
    eof: bool,
    shut: bool,
    /// Bytes spliced to the destination.
    delivered: u64,
    /// Bytes in plus bytes out: changes whenever this direction made progress.
    moved: u64,
}

impl Direction {
    fn new(buffer_size: usize) -> io::Result<Self> {
        let (pipe_r, pipe_w) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Best effort: over the user's pipe quota the kernel refuses; keep what we have.
        let _ = fcntl_setpipe_size(&pipe_w, buffer_size.clamp(1, MAX_PIPE_SIZE));
        let capacity = fcntl_getpipe_size(&pipe_w)?;
        Ok(Direction {
            pipe_r,
            pipe_w,
            capacity: capacity.max(1),
            in_pipe: 0,
            eof: false,
            shut: false,
            delivered: 0,
            moved: 0,
        })
    }

    /// Moves as much as possible; `Ready(Ok)` once EOF was read, the pipe drained and the
    /// destination shut.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &mut WriteHalf<'_>,
    ) -> Poll<io::Result<()>> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        loop {
            // Drain the pipe first.
            while self.in_pipe > 0 {
                let out: &TcpStream = dst.as_ref();
                ready!(out.poll_write_ready(cx))?;
                let spliced = out.try_io(Interest::WRITABLE, || {
                    rustix::pipe::splice(&self.pipe_r, None, out, None, self.in_pipe, flags)
                        .map_err(io::Error::from)
                });
                match spliced {
                    Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        self.in_pipe -= n;
                        self.delivered += n as u64;
                        self.moved += n as u64;
                    }
                    // Readiness was cleared; the next poll_write_ready registers the waker.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if self.eof {
                if !self.shut {
                    match ready!(Pin::new(&mut *dst).poll_shutdown(cx)) {
                        Ok(()) => self.shut = true,
                        // The peer may already be gone; its direction reports that.
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => self.shut = true,
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                return Poll::Ready(Ok(()));
            }
            // The pipe is empty: fill it.
            ready!(src.poll_read_ready(cx))?;
            let spliced = src.try_io(Interest::READABLE, || {
                rustix::pipe::splice(src, None, &self.pipe_w, None, self.capacity, flags)
                    .map_err(io::Error::from)
            });
            match spliced {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.in_pipe = n;
                    self.moved += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// Loopback TCP must take the splice path, not the fallback (the public tests cannot tell).
    #[tokio::test]
    async fn tcp_sockets_are_spliced() {
        let (mut client, mut p1) = pair().await;
        let (mut p2, mut server) = pair().await;
        let task = tokio::spawn(async move {
            let config = RelayConfig::default();
            match relay(&mut p1, &mut p2, config).await {
                Outcome::Done(r) => r.unwrap(),
                Outcome::Unsupported(e) => panic!("splice refused on loopback TCP: {e}"),
            }
        });
        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        server.shutdown().await.unwrap();
        let stats = task.await.unwrap();
        assert_eq!((stats.a_to_b, stats.b_to_a), (4, 0));
    }

    #[test]
    fn pipe_gets_the_asked_size() {
        let d = Direction::new(256 * 1024).unwrap();
        assert_eq!(d.capacity, 256 * 1024);
        let d = Direction::new(10 * MAX_PIPE_SIZE).unwrap();
        assert!(d.capacity <= MAX_PIPE_SIZE);
    }
}
