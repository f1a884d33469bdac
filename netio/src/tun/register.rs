//! The one `unsafe` call of this crate: registering the tun fd with the tokio reactor.
//!
//! Since tokio 1.54 `AsyncFd::register*` is `unsafe` (the safe constructors are deprecated as
//! unsound for types whose `as_raw_fd` could change or close the fd). `tun_tap::Iface` owns a
//! `std::fs::File` it never replaces or closes before drop, so the contract holds.
#![allow(unsafe_code)]

use std::io;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tun_tap::Iface;

/// Registers `iface` for read and write readiness. Panics outside a tokio runtime.
pub(super) fn register(iface: Iface) -> io::Result<AsyncFd<Iface>> {
    // SAFETY: `Iface` owns the `File` behind `as_raw_fd()` for its whole lifetime: the field is
    // private to tun-tap, set once in the constructor, never reassigned, and closed only when
    // the `Iface` is dropped, which the `AsyncFd` (its owner from here on) does after
    // deregistering. Every call therefore returns the same valid, open descriptor.
    unsafe { AsyncFd::register_with_interest(iface, Interest::READABLE | Interest::WRITABLE) }
        .map_err(io::Error::from)
}
