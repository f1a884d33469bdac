//! The zero-copy TCP ↔ TCP relay behind [`super::relay_tcp`] (Linux only).
//!
//! ```text
//!   a ──splice──► pipe ──splice──► b      bytes never enter user space: the kernel
//!   a ◄──splice── pipe ◄──splice── b      moves page references socket → pipe → socket
//!                  ▲ lent while bytes are on their way, else back in the thread's pool
//! ```
//!
//! **Pipes are lent, not owned.** A direction holds a pipe only while bytes are on their way:
//! it takes one when its source socket turns readable and gives it back as soon as the pipe is
//! empty again and the source has nothing more (the socket would block), or at EOF. An idle
//! tunnel holds its two sockets and nothing else: no pipe descriptors, no pipe pages, no
//! buffer. At seed scale (10,000 mostly idle OpenVPN tunnels through one router) that is
//! 40,000 descriptors and their pipe quota not held.
//!
//! Pipes given back go to a pool per thread of at most [`POOL_PIPES`]; beyond that they are
//! closed. A busy direction thus takes and gives back the same pipe burst after burst without a
//! system call (a new pipe costs `pipe2`, two `fcntl`s and later two `close`s, about as many
//! calls as the splices of a small OpenVPN burst). Per thread rather than shared: no lock on
//! the hot path, and a tokio worker serves many relays, so one that gives a pipe back feeds the
//! next that becomes readable on that thread. The pool holds only empty pipes (a pipe is given
//! back only when every byte spliced into it has been spliced out), so no byte of one tunnel
//! can reach another.
//!
//! Each direction works in steps driven by tokio readiness, never by polling in a loop:
//!
//! 1. **Fill**: only when nothing is held (no pipe, or an empty one), `splice(src → pipe)`.
//!    With an empty pipe, `EAGAIN` can only mean "the socket has nothing", so clearing the
//!    socket's read readiness is correct. (A pipe that still holds bytes may be out of slots,
//!    and `EAGAIN` would then be about the pipe, not the socket: the edge-triggered read
//!    readiness would be lost and the direction would stall.) `0` means EOF.
//! 2. **Drain**: while the pipe holds bytes, `splice(pipe → dst)`. `EAGAIN` means the
//!    destination's send buffer is full; wait for write readiness (the pipe stays lent).
//! 3. **Give back**: the pipe is empty and the source's read readiness is pending: the pipe
//!    returns to the pool before the direction waits.
//!
//! EOF is only seen with an empty pipe, so every byte is delivered before `shutdown(Write)` is
//! passed on, and the other direction keeps flowing. Timeouts and error counts are those of the
//! generic relay (same types, same contract).
//!
//! **No pipe to be had.** When a pipe cannot be made (`EMFILE` at the descriptor limit,
//! `ENFILE`, `ENOMEM`), the direction copies that burst through a heap buffer of at most
//! [`COPY_BUFFER`] bytes instead (read, write, the same fill-when-empty rule) and frees it once
//! it is empty; the next burst asks for a pipe again. A relay never fails for lack of pipes.
//! If the kernel refuses to splice these sockets (`EINVAL` before any byte moved), the caller
//! falls back to the generic copying relay; see [`Outcome::Unsupported`].
//!
//! **Pipe accounting.** Pipe pages are charged to the user even when empty (pooled pipes
//! included); an unprivileged user over `fs.pipe-user-pages-soft` (16384 pages by default, i.e.
//! 64 MiB of pipe capacity) gets small pipes, and resizing fails. The relay then keeps whatever
//! capacity the kernel gave (still correct, just more system calls per byte).

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags, SpliceFlags};
use tokio::io::{AsyncWrite, Interest};
use tokio::net::tcp::WriteHalf;
use tokio::net::TcpStream;

use super::{run_until_end, RelayConfig, RelayEnd, RelayError, RelayStats, MAX_PIPE_SIZE};

/// Empty pipes kept per thread for the next burst; a pipe given back beyond this is closed
/// (two descriptors each).
pub const POOL_PIPES: usize = 32;

/// The largest copy buffer a direction allocates when it can get no pipe.
pub const COPY_BUFFER: usize = 64 * 1024;

/// What [`relay`] returns: a finished relay, or "splice is not possible here" before anything
/// moved (the caller then runs the generic relay on the same sockets).
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The relay ran (to the end or to an error).
    Done(Result<RelayStats, RelayError>),
    /// The kernel refused to splice; nothing was read or written.
    Unsupported(io::Error),
}

/// Relays `a` ⇄ `b`, lending each direction a pipe while it carries bytes; see the module
/// docs.
pub(crate) async fn relay(a: &mut TcpStream, b: &mut TcpStream, config: RelayConfig) -> Outcome {
    let pipe_size = config.buffer_size.clamp(1, MAX_PIPE_SIZE);
    let mut ab = Direction::new(pipe_size);
    let mut ba = Direction::new(pipe_size);
    let (ar, mut aw) = a.split();
    let (br, mut bw) = b.split();
    let (ar, br): (&TcpStream, &TcpStream) = (ar.as_ref(), br.as_ref());
    let result = run_until_end(&config, |cx| {
        let before = ab.moved + ba.moved;
        let r1 = ab.poll(cx, ar, &mut bw);
        let r2 = ba.poll(cx, br, &mut aw);
        ((r1, r2), (before, ab.moved + ba.moved))
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

/// A pipe for splicing: both ends and the capacity. Empty whenever no direction holds it.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// The size asked for when it was made; the pool lends it to directions asking the same.
    asked: usize,
    /// Capacity in bytes: how much one fill asks for.
    capacity: usize,
}

impl Pipe {
    /// A new pipe of (about) `asked` bytes.
    fn new(asked: usize) -> io::Result<Pipe> {
        #[cfg(test)]
        if tests::pipes_fail() {
            return Err(rustix::io::Errno::MFILE.into());
        }
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Best effort: over the user's pipe quota the kernel refuses; keep what we have.
        let _ = fcntl_setpipe_size(&write, asked);
        let capacity = fcntl_getpipe_size(&write)?;
        Ok(Pipe {
            read,
            write,
            asked,
            capacity: capacity.max(1),
        })
    }
}

thread_local! {
    /// This thread's empty pipes, at most [`POOL_PIPES`].
    static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// A pipe of `asked` bytes: an empty one from this thread's pool, or a new one.
fn take_pipe(asked: usize) -> io::Result<Pipe> {
    let pooled = POOL
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let i = pool.iter().rposition(|p| p.asked == asked)?;
            Some(pool.swap_remove(i))
        })
        .ok()
        .flatten();
    match pooled {
        Some(pipe) => Ok(pipe),
        None => Pipe::new(asked),
    }
}

/// Gives an empty pipe back to this thread's pool, or closes it when the pool is full (or the
/// thread is exiting).
fn give_back(pipe: Pipe) {
    debug_assert_eq!(
        rustix::io::ioctl_fionread(&pipe.read).ok(),
        Some(0),
        "only empty pipes go back to the pool"
    );
    let _ = POOL.try_with(move |pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < POOL_PIPES {
            pool.push(pipe);
        }
    });
}

/// Where a direction's bytes wait between source and destination.
#[derive(Debug)]
enum Held {
    /// Nothing on its way: the idle state.
    Nothing,
    /// A lent pipe holding `len` bytes.
    Pipe { pipe: Pipe, len: usize },
    /// No pipe could be had: a copy buffer holding `buf[start..end]`.
    Buffer {
        buf: Box<[u8]>,
        start: usize,
        end: usize,
    },
}

impl Held {
    fn is_empty(&self) -> bool {
        match self {
            Held::Nothing => true,
            Held::Pipe { len, .. } => *len == 0,
            Held::Buffer { start, end, .. } => start >= end,
        }
    }
}

/// One direction: what it holds, EOF / shut state and counts.
#[derive(Debug)]
struct Direction {
    /// The pipe size asked for.
    pipe_size: usize,
    held: Held,
    eof: bool,
    shut: bool,
    /// Bytes written to the destination.
    delivered: u64,
    /// Bytes in plus bytes out: changes whenever this direction made progress.
    moved: u64,
}

impl Drop for Direction {
    fn drop(&mut self) {
        // An empty pipe goes back to the pool; one still holding bytes is closed with them.
        self.release();
    }
}

impl Direction {
    fn new(pipe_size: usize) -> Self {
        Direction {
            pipe_size,
            held: Held::Nothing,
            eof: false,
            shut: false,
            delivered: 0,
            moved: 0,
        }
    }

    /// Lets go of an empty pipe (to the pool) or buffer (freed); keeps one holding bytes.
    fn release(&mut self) {
        if !self.held.is_empty() {
            return;
        }
        if let Held::Pipe { pipe, .. } = std::mem::replace(&mut self.held, Held::Nothing) {
            give_back(pipe);
        }
    }

    /// Moves as much as possible; `Ready(Ok)` once EOF was read, everything delivered and the
    /// destination shut.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &mut WriteHalf<'_>,
    ) -> Poll<io::Result<()>> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        loop {
            // Drain what is held first.
            ready!(self.drain(cx, dst.as_ref()))?;
            if self.eof {
                self.release();
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
            // Nothing held: wait for the source without a pipe.
            match src.poll_read_ready(cx) {
                Poll::Pending => {
                    self.release();
                    return Poll::Pending;
                }
                Poll::Ready(ready) => ready?,
            }
            if let Held::Nothing = self.held {
                self.held = match take_pipe(self.pipe_size) {
                    Ok(pipe) => Held::Pipe { pipe, len: 0 },
                    Err(e) => {
                        tracing::debug!("no pipe for a relay direction ({e}); copying a burst");
                        Held::Buffer {
                            buf: vec![0; self.pipe_size.min(COPY_BUFFER)].into_boxed_slice(),
                            start: 0,
                            end: 0,
                        }
                    }
                };
            }
            // Fill what is held (it is empty).
            let filled = match &mut self.held {
                Held::Nothing => continue,
                Held::Pipe { pipe, .. } => src.try_io(Interest::READABLE, || {
                    rustix::pipe::splice(src, None, &pipe.write, None, pipe.capacity, flags)
                        .map_err(io::Error::from)
                }),
                Held::Buffer { buf, .. } => src.try_read(buf),
            };
            match filled {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    match &mut self.held {
                        Held::Nothing => {}
                        Held::Pipe { len, .. } => *len = n,
                        Held::Buffer { start, end, .. } => (*start, *end) = (0, n),
                    }
                    self.moved += n as u64;
                }
                // Read readiness was cleared; the next poll_read_ready registers the waker.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Writes out what is held; `Ready(Ok)` once it is empty.
    fn drain(&mut self, cx: &mut Context<'_>, out: &TcpStream) -> Poll<io::Result<()>> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        loop {
            let written = match &mut self.held {
                Held::Nothing => return Poll::Ready(Ok(())),
                Held::Pipe { len: 0, .. } => return Poll::Ready(Ok(())),
                Held::Buffer { start, end, .. } if *start >= *end => return Poll::Ready(Ok(())),
                Held::Pipe { pipe, len } => {
                    ready!(out.poll_write_ready(cx))?;
                    out.try_io(Interest::WRITABLE, || {
                        rustix::pipe::splice(&pipe.read, None, out, None, *len, flags)
                            .map_err(io::Error::from)
                    })
                }
                Held::Buffer { buf, start, end } => {
                    ready!(out.poll_write_ready(cx))?;
                    out.try_write(&buf[*start..*end])
                }
            };
            match written {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    match &mut self.held {
                        Held::Nothing => {}
                        Held::Pipe { len, .. } => *len -= n,
                        Held::Buffer { start, .. } => *start += n,
                    }
                    self.delivered += n as u64;
                    self.moved += n as u64;
                }
                // Write readiness was cleared; the next poll_write_ready registers the waker.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    thread_local! {
        /// Makes `Pipe::new` fail on this thread as at the descriptor limit.
        static PIPES_FAIL: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn pipes_fail() -> bool {
        PIPES_FAIL.with(Cell::get)
    }

    fn pooled() -> usize {
        POOL.with(|p| p.borrow().len())
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// client ⇄ [splice relay] ⇄ server, both ways at once with `up` and `down` bytes, on the
    /// current thread; returns the relay's outcome.
    async fn exchange(up: Vec<u8>, down: Vec<u8>) -> RelayStats {
        let (mut client, mut p1) = pair().await;
        let (mut p2, mut server) = pair().await;
        let relay = async move {
            match relay(&mut p1, &mut p2, RelayConfig::default()).await {
                Outcome::Done(r) => r.unwrap(),
                Outcome::Unsupported(e) => panic!("splice refused on loopback TCP: {e}"),
            }
        };
        let (down2, up2) = (down.clone(), up.clone());
        let srv = async move {
            let (mut r, mut w) = server.split();
            let send = async {
                w.write_all(&down2).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let mut got = Vec::new();
            let ((), n) = tokio::join!(send, r.read_to_end(&mut got));
            n.unwrap();
            assert!(got == up2, "a→b bytes differ");
        };
        let cli = async move {
            let (mut r, mut w) = client.split();
            let send = async {
                w.write_all(&up).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let mut got = Vec::new();
            let ((), n) = tokio::join!(send, r.read_to_end(&mut got));
            n.unwrap();
            assert!(got == down, "b→a bytes differ");
        };
        let (stats, (), ()) = tokio::join!(relay, srv, cli);
        stats
    }

    fn pattern(len: usize, k: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(k) >> 3) as u8)
            .collect()
    }

    /// Loopback TCP must take the splice path, not the fallback (the public tests cannot tell),
    /// and the pipes lent go back to this thread's pool.
    #[tokio::test]
    async fn tcp_sockets_are_spliced_and_pipes_go_back() {
        assert_eq!(pooled(), 0);
        let stats = exchange(pattern(3 << 20, 7), pattern(1 << 20, 13)).await;
        assert_eq!((stats.a_to_b, stats.b_to_a), (3 << 20, 1 << 20));
        let back = pooled();
        assert!((1..=2).contains(&back), "{back} pipes back in the pool");
        POOL.with(|pool| {
            for p in pool.borrow().iter() {
                assert_eq!(
                    rustix::io::ioctl_fionread(&p.read).unwrap(),
                    0,
                    "a pooled pipe holds bytes"
                );
            }
        });
    }

    /// With no pipe to be had, every burst is copied; bytes, counts and half-close hold.
    #[tokio::test]
    async fn without_pipes_bursts_are_copied() {
        PIPES_FAIL.with(|f| f.set(true));
        let stats = exchange(pattern(2 << 20, 5), pattern(700_001, 11)).await;
        assert_eq!((stats.a_to_b, stats.b_to_a), (2 << 20, 700_001));
        assert_eq!(stats.end, RelayEnd::Closed);
        assert_eq!(pooled(), 0, "no pipe was made");
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        let size = 64 * 1024;
        let pipes: Vec<Pipe> = (0..POOL_PIPES + 5)
            .map(|_| Pipe::new(size).unwrap())
            .collect();
        for p in pipes {
            give_back(p);
        }
        assert_eq!(pooled(), POOL_PIPES);
        // Taken pipes come from the pool; one of another size does not.
        let p = take_pipe(size).unwrap();
        assert_eq!(pooled(), POOL_PIPES - 1);
        give_back(p);
        let other = take_pipe(4096).unwrap();
        assert_eq!((pooled(), other.asked), (POOL_PIPES, 4096));
    }

    #[test]
    fn pipe_gets_the_asked_size() {
        let p = Pipe::new(256 * 1024).unwrap();
        assert_eq!(p.capacity, 256 * 1024);
        let p = Pipe::new(MAX_PIPE_SIZE).unwrap();
        assert!(p.capacity <= MAX_PIPE_SIZE);
    }
}
