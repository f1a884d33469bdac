//! A layer-3 tun device (`IFF_TUN | IFF_NO_PI`) with the kernel's offloads: TCP data comes
//! out of it in super-packets of up to 64 KiB and goes into it the same way, so the kernel
//! runs its per-packet work once for many segments and we make one system call where we would
//! make dozens.
//!
//! The device is opened with `IFF_VNET_HDR`: every read and write starts with a
//! [`VnetHdr`](vnet::VnetHdr). `TUNSETOFFLOAD` with `TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6` lets the
//! kernel hand over TCP super-packets and packets whose transport checksum is still to be
//! finished. Neither ever reaches the peer: [`Tun::recv_many`] cuts a super-packet into the
//! segments the kernel would have sent (at most the MTU each, see [`gso`]) and finishes
//! checksums, so callers see exactly the packets a plain tun device gives. Writing,
//! [`Tun::send_many_sync`] merges consecutive segments of one TCP flow into one super-packet
//! (see [`Coalescer`]); [`Tun::send`] and [`Tun::send_sync`] write one packet as it is.
//!
//! Packets read go into slices of a caller-owned [`RecvPool`] after a caller-chosen headroom,
//! so the data path can prepend the OpenVPN header and encrypt in place without copying.
//!
//! The descriptor is non-blocking and registered with tokio through [`AsyncFd`]. The device
//! exists as long as the [`Tun`] is alive (it is not made persistent) and lives in the network
//! namespace of the thread that created it.
//!
//! [`Tun::open_tap`] opens a layer-2 tap device (`IFF_TAP`) instead: Ethernet frames in and out,
//! through the same calls. It asks for no offloads (the kernel then hands over whole frames
//! with finished checksums, each read one frame) and writes frame by frame, never merged: tap
//! is kept simple, and the header parsing of [`gso`] and [`gro`] is for IP packets only.
//!
//! Not done: multi-queue (`IFF_MULTI_QUEUE`, one descriptor per worker); offloads on tap.

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;

mod checksum;
pub mod gro;
pub mod gso;
mod sys;
#[cfg(test)]
mod testpkt;
pub mod vnet;
pub mod writer;

pub use gro::{Coalescer, MAX_SEGMENTS};
pub use gso::OffloadError;
use gso::{complete_checksum, Segments};
use vnet::{VnetHdr, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_NONE, VNET_HDR_LEN};
pub use writer::{PacketSink, TunWriteStats, TunWriter, TUN_WRITE_BATCH};

/// Longest interface name the kernel accepts (`IFNAMSIZ` - 1).
pub const IFNAMSIZ_MAX: usize = 15;

/// How often a write is retried when the kernel answers `WouldBlock`.
pub const SEND_SYNC_RETRIES: u32 = 100;

/// Packets a [`RecvPool`] grows by at once.
pub const RECV_POOL_SLOTS: usize = 32;

/// The longest read: the virtio header and a 64 KiB super-packet.
const READ_MAX: usize = VNET_HDR_LEN + u16::MAX as usize;

/// The offloads asked of the kernel.
const OFFLOADS: libc::c_uint = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;

/// What a tap device's frames add to its MTU: the Ethernet header (14 bytes) and room for
/// one VLAN tag. The longest frame read from a tap device is the MTU plus this
/// ([`PacketLayout::max_len`]).
pub const TAP_FRAME_EXTRA: usize = 14 + 4;

/// Where a packet read by [`Tun::recv_many`] sits in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketLayout {
    /// Bytes before the packet (for the headers prepended in place).
    pub headroom: usize,
    /// The longest plain packet accepted (the MTU; a longer one is dropped).
    pub max_len: usize,
    /// Spare capacity after the packet (for what encryption appends).
    pub tailroom: usize,
}

impl PacketLayout {
    fn slot(&self) -> usize {
        self.headroom + self.max_len + self.tailroom
    }
}

/// The buffers of one reader: the read buffer (a super-packet arrives here first) and the
/// pool the packets handed out are split from. Keep one per reading task.
#[derive(Debug, Default)]
pub struct RecvPool {
    slots: BytesMut,
    read: Vec<u8>,
}

/// An open tun device registered with the tokio reactor.
#[derive(Debug)]
pub struct Tun {
    fd: AsyncFd<OwnedFd>,
    name: String,
    offload: bool,
    /// A tap device (Ethernet frames), not a tun device (IP packets).
    tap: bool,
    dropped: AtomicU64,
}

impl Tun {
    /// Creates (or attaches to an existing, persistent) tun device named `name` in the calling
    /// thread's network namespace and asks for the offloads. A name with `%d` (e.g. `tun%d`)
    /// or an empty name lets the kernel pick; [`Tun::name`] tells which. A kernel that refuses
    /// the offloads leaves a working device that reads packet by packet.
    ///
    /// Must be called inside a tokio runtime with I/O enabled.
    pub fn open(name: &str) -> Result<Self, TunError> {
        Self::open_kind(name, false)
    }

    /// Creates (or attaches to an existing, persistent) layer-2 tap device named `name`, as
    /// [`Tun::open`] does a tun device: reads and writes carry whole Ethernet frames (without
    /// the frame check sequence). No offloads are asked for (module docs); `tap%d` or an
    /// empty name lets the kernel pick.
    pub fn open_tap(name: &str) -> Result<Self, TunError> {
        Self::open_kind(name, true)
    }

    fn open_kind(name: &str, tap: bool) -> Result<Self, TunError> {
        if name.len() > IFNAMSIZ_MAX || name.bytes().any(|b| b == 0 || b == b'/' || b == b' ') {
            return Err(TunError::BadName {
                name: name.to_owned(),
            });
        }
        let (fd, given) = sys::open(name, tap).map_err(|source| TunError::Open {
            name: name.to_owned(),
            source,
        })?;
        let offload = if tap {
            // A persistent device keeps what an earlier owner asked for: ask for none.
            if let Err(e) = sys::set_offload(&fd, 0) {
                tracing::debug!(name = given, error = %e, "tap: clearing offloads failed");
            }
            false
        } else {
            match sys::set_offload(&fd, OFFLOADS) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(name = given, error = %e, "tun offloads refused: reading packet by packet");
                    false
                }
            }
        };
        let fd = crate::reactor::register_fd(fd).map_err(|source| TunError::Register {
            name: name.to_owned(),
            source,
        })?;
        tracing::debug!(name = given, offload, tap, "tun device open");
        Ok(Self {
            fd,
            name: given,
            offload,
            tap,
            dropped: AtomicU64::new(0),
        })
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the kernel took the offloads (super-packets and partial checksums).
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// Whether this is a tap device (Ethernet frames) rather than a tun device (IP packets).
    pub fn is_tap(&self) -> bool {
        self.tap
    }

    /// Reads dropped because the kernel's virtio header or packet made no sense (each logged
    /// at debug level).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until the device is readable, then reads without waiting again until at least
    /// `max` packets are in `out` or the device is empty, and appends the packets to `out`.
    /// Returns how many were appended (at least one, unless `max` is 0).
    ///
    /// A super-packet's segments always come together, so a call can return up to
    /// `max - 1 + ` the segments of one super-packet.
    ///
    /// A call that had to wait returns what its first read gave (one packet, or one
    /// super-packet's segments), leaving the device marked readable: the read that finds the
    /// device empty then comes at the start of the next call, after the caller has sent the
    /// packet on, instead of delaying it (one system call less on every request/response
    /// round trip).
    ///
    /// Each packet is `layout.headroom` bytes of room (zeroed), the packet, and at least
    /// `layout.tailroom` bytes of spare capacity, so the caller can encrypt it in place. The
    /// packets are split off `pool`, which reuses their space once they are dropped.
    pub async fn recv_many(
        &self,
        pool: &mut RecvPool,
        layout: PacketLayout,
        out: &mut Vec<BytesMut>,
        max: usize,
    ) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        if pool.read.len() < READ_MAX {
            // Zeroed by the allocator: pages only a super-packet reaches stay untouched.
            pool.read = vec![0u8; READ_MAX];
        }
        let start = out.len();
        let mut waited = false;
        loop {
            let mut guard = std::future::poll_fn(|cx| {
                let ready = self.fd.poll_read_ready(cx);
                waited |= ready.is_pending();
                ready
            })
            .await?;
            while out.len() - start < max {
                let read = &mut pool.read;
                match guard.try_io(|fd| {
                    rustix::io::read(fd.get_ref(), &mut read[..]).map_err(io::Error::from)
                }) {
                    Ok(Ok(n)) => {
                        if let Err(e) = unpack(&mut pool.read[..n], &mut pool.slots, layout, out) {
                            self.dropped.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(dev = self.name, error = %e, "tun read dropped");
                        }
                        if waited {
                            break;
                        }
                    }
                    Ok(Err(err)) if out.len() == start => return Err(err),
                    // Report the packets read so far; the error comes back on the next call.
                    Ok(Err(_)) => break,
                    Err(_would_block) => break,
                }
            }
            if out.len() > start {
                return Ok(out.len() - start);
            }
        }
    }

    /// Writes one whole IP packet without the reactor, from any thread (a tun write does not
    /// wait for room: the kernel takes the packet or drops it). A `WouldBlock` is retried a
    /// bounded number of times.
    pub fn send_sync(&self, packet: &[u8]) -> io::Result<()> {
        self.write_retrying(&VnetHdr::NONE, &[IoSlice::new(packet)])
    }

    /// Writes one whole IP packet.
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        let hdr = VnetHdr::NONE.encode();
        let iov = [IoSlice::new(&hdr), IoSlice::new(packet)];
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| write_all(fd.get_ref(), &iov)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes `packets` (whole IP packets, in order), consecutive segments of one TCP flow
    /// merged into super-packets as `gro` plans them (it patches their headers in place), each
    /// write without the reactor as [`Tun::send_sync`]. Every write is tried; returns how
    /// many packets went in, or the first error. A tap device takes its frames one by one.
    pub fn send_many_sync(
        &self,
        packets: &mut [BytesMut],
        gro: &mut Coalescer,
    ) -> io::Result<usize> {
        if self.tap {
            return self.send_each_sync(packets);
        }
        gro.plan(packets);
        let mut sent = 0;
        let mut first_error = None;
        for w in 0..gro.writes() {
            let mut parts = [IoSlice::new(&[]); gro::MAX_WRITE_PARTS];
            let (hdr, n) = gro.write(w, packets, &mut parts);
            match self.write_retrying(&hdr, &parts[..n]) {
                Ok(()) => sent += gro.segments(w),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(sent),
            Some(e) => Err(e),
        }
    }

    /// Writes `packets` one write each, in order, as [`Tun::send_sync`]; every write is tried.
    fn send_each_sync(&self, packets: &[BytesMut]) -> io::Result<usize> {
        let mut sent = 0;
        let mut first_error = None;
        for p in packets {
            match self.send_sync(p) {
                Ok(()) => sent += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(sent),
            Some(e) => Err(e),
        }
    }

    /// One write of `hdr` and `parts`, `WouldBlock` retried a bounded number of times.
    fn write_retrying(&self, hdr: &VnetHdr, parts: &[IoSlice<'_>]) -> io::Result<()> {
        let hdr = hdr.encode();
        let mut iov = [IoSlice::new(&[]); gro::MAX_WRITE_PARTS + 1];
        iov[0] = IoSlice::new(&hdr);
        let n = parts.len().min(gro::MAX_WRITE_PARTS);
        iov[1..=n].copy_from_slice(&parts[..n]);
        let mut tries = 0;
        loop {
            match write_all(self.fd.get_ref(), &iov[..=n]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries < SEND_SYNC_RETRIES => {
                    tries += 1;
                    std::thread::yield_now();
                }
                result => return result,
            }
        }
    }
}

/// One `writev` of `iov`; a short write (which a tun device never does) is an error.
fn write_all(fd: &OwnedFd, iov: &[IoSlice<'_>]) -> io::Result<()> {
    let want: usize = iov.iter().map(|p| p.len()).sum();
    let n = rustix::io::writev(fd, iov)?;
    if n != want {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("tun accepted {n} of {want} bytes"),
        ));
    }
    Ok(())
}

/// Turns one read (virtio header and packet) into packets in `slots`, appended to `out`.
fn unpack(
    read: &mut [u8],
    slots: &mut BytesMut,
    layout: PacketLayout,
    out: &mut Vec<BytesMut>,
) -> Result<(), OffloadError> {
    let hdr = VnetHdr::decode(read).ok_or(OffloadError::Short { len: read.len() })?;
    let packet = &mut read[VNET_HDR_LEN..];
    if hdr.gso_type == VIRTIO_NET_HDR_GSO_NONE {
        if hdr.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
            complete_checksum(packet, hdr.csum_start, hdr.csum_offset)?;
        }
        if packet.len() > layout.max_len {
            return Err(OffloadError::TooLong {
                len: packet.len(),
                max: layout.max_len,
            });
        }
        put(slots, layout, out, |b| b.extend_from_slice(packet));
        return Ok(());
    }
    let segments = Segments::new(&hdr, packet)?;
    for i in 0..segments.len() {
        put(slots, layout, out, |b| segments.append(i, b));
    }
    Ok(())
}

/// Splits one packet off `slots`: headroom, what `fill` appends, tailroom.
fn put(
    slots: &mut BytesMut,
    layout: PacketLayout,
    out: &mut Vec<BytesMut>,
    fill: impl FnOnce(&mut BytesMut),
) {
    if slots.capacity() < layout.slot() {
        slots.reserve(layout.slot() * RECV_POOL_SLOTS);
    }
    slots.clear();
    slots.resize(layout.headroom, 0);
    fill(slots);
    let len = slots.len();
    slots.resize(len + layout.tailroom, 0);
    let mut packet = slots.split_to(len + layout.tailroom);
    packet.truncate(len);
    out.push(packet);
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
    /// Opening `/dev/net/tun` or the `TUNSETIFF` ioctl failed.
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

#[cfg(test)]
mod tests {
    use super::*;
    use testpkt::{tcp_packet, tcp_valid, Tcp};

    const LAYOUT: PacketLayout = PacketLayout {
        headroom: 24,
        max_len: 1500,
        tailroom: 16,
    };

    fn read_of(hdr: VnetHdr, packet: &[u8]) -> Vec<u8> {
        let mut r = hdr.encode().to_vec();
        r.extend_from_slice(packet);
        r
    }

    #[test]
    fn a_plain_read_becomes_one_packet_with_room_around_it() {
        let packet = tcp_packet(&Tcp::default(), b"abc");
        let mut read = read_of(VnetHdr::NONE, &packet);
        let (mut slots, mut out) = (BytesMut::new(), Vec::new());
        unpack(&mut read, &mut slots, LAYOUT, &mut out).expect("unpacked");
        assert_eq!(out.len(), 1);
        assert_eq!(&out[0][24..], &packet[..]);
        assert!(out[0][..24].iter().all(|&b| b == 0));
        assert!(out[0].capacity() >= out[0].len() + 16);
    }

    #[test]
    fn a_super_packet_read_becomes_its_segments() {
        let t = Tcp::default();
        let payload = vec![7u8; 3000];
        let mut packet = tcp_packet(&t, &payload);
        packet[36..38].copy_from_slice(&[0, 0]);
        let hdr = VnetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: vnet::VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 40,
            gso_size: 1460,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut read = read_of(hdr, &packet);
        let (mut slots, mut out) = (BytesMut::new(), Vec::new());
        unpack(&mut read, &mut slots, LAYOUT, &mut out).expect("unpacked");
        let lens: Vec<usize> = out.iter().map(|p| p.len() - 24).collect();
        assert_eq!(lens, vec![1500, 1500, 120]);
        assert!(out.iter().all(|p| tcp_valid(&p[24..])));
        assert!(out.iter().all(|p| p.capacity() >= p.len() + 16));
    }

    #[test]
    fn bad_reads_are_refused() {
        let (mut slots, mut out) = (BytesMut::new(), Vec::new());
        let mut short = vec![0u8; 4];
        assert_eq!(
            unpack(&mut short, &mut slots, LAYOUT, &mut out),
            Err(OffloadError::Short { len: 4 })
        );
        let mut long = read_of(VnetHdr::NONE, &[0x45; 1501]);
        assert_eq!(
            unpack(&mut long, &mut slots, LAYOUT, &mut out),
            Err(OffloadError::TooLong {
                len: 1501,
                max: 1500
            })
        );
        assert!(out.is_empty());
    }
}
