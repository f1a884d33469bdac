//! A layer-3 tun device (`IFF_TUN | IFF_NO_PI`): one read or write is one whole IP packet, with
//! no packet-information prefix.
//!
//! The device is opened through `tun-tap` (which does the `TUNSETIFF` ioctl in its own small C
//! shim), switched to non-blocking and registered with tokio through [`AsyncFd`]; that last
//! step is one of this crate's two `unsafe` calls, both in the `reactor` module. The device
//! exists as long as the [`Tun`] is alive (it is not made persistent) and lives in the network namespace of the thread that created it.
//!
//! Reads go into a caller-supplied [`BytesMut`] after a caller-chosen headroom, so the data
//! path can prepend the OpenVPN header and encrypt in place without copying.
//!
//! Not done yet: multi-queue (`IFF_MULTI_QUEUE`, one fd per worker). `tun-tap` cannot ask for
//! it; it needs either a crate that can (`tun-rs`) or our own ioctl.

use std::io;

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tun_tap::{Iface, Mode};

/// Longest interface name the kernel accepts (`IFNAMSIZ` - 1).
pub const IFNAMSIZ_MAX: usize = 15;

/// How often [`Tun::send_sync`] retries a write the kernel refused with `WouldBlock`.
pub const SEND_SYNC_RETRIES: u32 = 100;

/// Packets a [`Tun::recv_many`] pool grows by at once.
pub const RECV_POOL_SLOTS: usize = 32;

/// Where a packet read by [`Tun::recv_many`] sits in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketLayout {
    /// Bytes before the packet (for the headers prepended in place).
    pub headroom: usize,
    /// The longest packet read (at least the MTU; a longer one is truncated by the kernel).
    pub max_len: usize,
    /// Spare capacity after the packet (for what encryption appends).
    pub tailroom: usize,
}

/// An open tun device registered with the tokio reactor.
#[derive(Debug)]
pub struct Tun {
    fd: AsyncFd<Iface>,
}

impl Tun {
    /// Creates (or attaches to an existing, persistent) tun device named `name` in the calling
    /// thread's network namespace. A name with `%d` (e.g. `tun%d`) or an empty name lets the
    /// kernel pick; [`Tun::name`] tells which.
    ///
    /// Must be called inside a tokio runtime with I/O enabled.
    pub fn open(name: &str) -> Result<Self, TunError> {
        if name.len() > IFNAMSIZ_MAX || name.bytes().any(|b| b == 0 || b == b'/' || b == b' ') {
            return Err(TunError::BadName {
                name: name.to_owned(),
            });
        }
        let iface =
            Iface::without_packet_info(name, Mode::Tun).map_err(|source| TunError::Open {
                name: name.to_owned(),
                source,
            })?;
        iface.set_non_blocking().map_err(|source| TunError::Open {
            name: name.to_owned(),
            source,
        })?;
        let fd = crate::reactor::register_iface(iface).map_err(|source| TunError::Register {
            name: name.to_owned(),
            source,
        })?;
        tracing::debug!(name = fd.get_ref().name(), "tun device open");
        Ok(Self { fd })
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        self.fd.get_ref().name()
    }

    /// Waits for one packet and reads it into `buf` after `headroom` bytes.
    ///
    /// `buf` is cleared and resized to `headroom + max_len` for the read, then truncated to
    /// `headroom + n`: the packet is `buf[headroom..]`, `n` is returned. The headroom bytes
    /// are left zeroed for the caller to overwrite. `max_len` should be at least the tun MTU;
    /// a longer packet is truncated by the kernel. Reuse one `buf` across calls to avoid
    /// reallocating.
    pub async fn recv(
        &self,
        buf: &mut BytesMut,
        headroom: usize,
        max_len: usize,
    ) -> io::Result<usize> {
        buf.clear();
        buf.resize(headroom + max_len, 0);
        loop {
            let mut guard = self.fd.readable().await?;
            let Some(slot) = buf.get_mut(headroom..) else {
                return Err(io::Error::from(io::ErrorKind::InvalidInput));
            };
            match guard.try_io(|inner| inner.get_ref().recv(slot)) {
                Ok(Ok(n)) => {
                    buf.truncate(headroom + n);
                    return Ok(n);
                }
                Ok(Err(err)) => {
                    buf.truncate(headroom);
                    return Err(err);
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// Waits until the device is readable, then reads up to `max` packets without waiting
    /// again, each into its own slice of `pool` laid out as `layout` says, and appends them to
    /// `out`. Returns how many were read (at least one, unless `max` is 0).
    ///
    /// A call that had to wait returns the first packet alone, leaving the device marked
    /// readable: the read that finds the device empty then comes at the start of the next
    /// call, after the caller has sent the packet on, instead of delaying it (one system call
    /// less on every request/response round trip). A call that finds the device still
    /// readable (packets kept coming) reads on until `max` or until the device is empty.
    ///
    /// Each packet is `layout.headroom` bytes of room, the packet, and at least
    /// `layout.tailroom` bytes of spare capacity, so the caller can encrypt it in place. The
    /// packets are split off `pool`, so once they are dropped `pool` reuses their space: in the
    /// steady state a batch costs one read system call per packet and no allocation.
    pub async fn recv_many(
        &self,
        pool: &mut BytesMut,
        layout: PacketLayout,
        out: &mut Vec<BytesMut>,
        max: usize,
    ) -> io::Result<usize> {
        let slot = layout.headroom + layout.max_len + layout.tailroom;
        let mut waited = false;
        loop {
            let mut guard = std::future::poll_fn(|cx| {
                let ready = self.fd.poll_read_ready(cx);
                waited |= ready.is_pending();
                ready
            })
            .await?;
            let mut n = 0;
            while n < max {
                pool.clear();
                pool.reserve(slot * (max - n).min(RECV_POOL_SLOTS));
                pool.resize(slot, 0);
                let Some(room) = pool.get_mut(layout.headroom..layout.headroom + layout.max_len)
                else {
                    return Err(io::Error::from(io::ErrorKind::InvalidInput));
                };
                match guard.try_io(|inner| inner.get_ref().recv(room)) {
                    Ok(Ok(len)) => {
                        let mut packet = pool.split_to(layout.headroom + len + layout.tailroom);
                        packet.truncate(layout.headroom + len);
                        out.push(packet);
                        n += 1;
                        if waited {
                            break;
                        }
                    }
                    Ok(Err(err)) if n == 0 => return Err(err),
                    // Report the packets read so far; the error comes back on the next call.
                    Ok(Err(_)) => break,
                    Err(_would_block) => break,
                }
            }
            pool.clear();
            if n > 0 || max == 0 {
                return Ok(n);
            }
        }
    }

    /// Writes one whole IP packet without the reactor, from any thread (a tun write does not
    /// wait for room: the kernel takes the packet or drops it). A `WouldBlock` is retried a
    /// bounded number of times.
    pub fn send_sync(&self, packet: &[u8]) -> io::Result<()> {
        let mut tries = 0;
        loop {
            match self.fd.get_ref().send(packet) {
                Ok(n) if n == packet.len() => return Ok(()),
                Ok(n) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("tun accepted {n} of {} bytes", packet.len()),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries < SEND_SYNC_RETRIES => {
                    tries += 1;
                    std::thread::yield_now();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes one whole IP packet. A short write (which a tun device should never do) is an
    /// error.
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|inner| inner.get_ref().send(packet)) {
                Ok(Ok(n)) if n == packet.len() => return Ok(()),
                Ok(Ok(n)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("tun accepted {n} of {} bytes", packet.len()),
                    ))
                }
                Ok(Err(err)) => return Err(err),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Why a tun device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunError {
    /// The name is too long or contains a byte the kernel refuses.
    #[error("invalid tun device name {name:?}")]
    BadName {
        /// The name asked for.
        name: String,
    },
    /// Opening `/dev/net/tun`, the `TUNSETIFF` ioctl or `O_NONBLOCK` failed.
    #[error("cannot open tun device {name:?}")]
    Open {
        /// The name asked for.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Registering the fd with the tokio reactor failed (e.g. no runtime).
    #[error("cannot register tun device {name:?} with the runtime")]
    Register {
        /// The name asked for.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}
