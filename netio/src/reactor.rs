//! Registering file descriptors with the tokio reactor (one of this crate's two places with
//! `unsafe` calls; the tun ioctls in `tun::sys` are the other).
//!
//! Since tokio 1.54 `AsyncFd::register*` is `unsafe` (the safe constructors are deprecated as
//! unsound for types whose `as_raw_fd` could change or close the fd). An `OwnedFd` keeps one
//! descriptor, open, for as long as it lives, so the contract holds.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Registers a descriptor (the tun device, the netlink socket) for read and write readiness.
/// Panics outside a tokio runtime.
pub(crate) fn register_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is one open descriptor that it closes only when dropped, which the
    // `AsyncFd` (its owner from here on) does after deregistering; `as_raw_fd()` always
    // returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
        .map_err(io::Error::from)
}
