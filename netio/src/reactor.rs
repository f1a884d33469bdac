//! The `unsafe` calls of this crate: registering file descriptors with the tokio reactor.
//!
//! Since tokio 1.54 `AsyncFd::register*` is `unsafe` (the safe constructors are deprecated as
//! unsound for types whose `as_raw_fd` could change or close the fd). Both types registered
//! here keep one descriptor, open, for as long as they live, so the contract holds.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tun_tap::Iface;

/// Registers the tun device `iface` for read and write readiness. Panics outside a tokio
/// runtime.
pub(crate) fn register_iface(iface: Iface) -> io::Result<AsyncFd<Iface>> {
    // SAFETY: `Iface` owns the `File` behind `as_raw_fd()` for its whole lifetime: the field is
    // private to tun-tap, set once in the constructor, never reassigned, and closed only when
    // the `Iface` is dropped, which the `AsyncFd` (its owner from here on) does after
    // deregistering. Every call therefore returns the same valid, open descriptor.
    unsafe { AsyncFd::register_with_interest(iface, Interest::READABLE | Interest::WRITABLE) }
        .map_err(io::Error::from)
}

/// Registers a socket (the netlink socket) for read and write readiness. Panics outside a
/// tokio runtime.
pub(crate) fn register_socket(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is one open descriptor that it closes only when dropped, which the
    // `AsyncFd` (its owner from here on) does after deregistering; `as_raw_fd()` always
    // returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
        .map_err(io::Error::from)
}
