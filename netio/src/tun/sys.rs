//! The tun device's ioctls: `TUNSETIFF` (create or attach, with the virtio header) and
//! `TUNSETOFFLOAD` (which super-packets and partial checksums the kernel may hand us). These
//! are this crate's `unsafe` calls besides the reactor registrations.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

/// The clone device every tun is created through.
const CLONE_DEVICE: &str = "/dev/net/tun";

/// Opens `/dev/net/tun` non-blocking and attaches it to a device named `name`: a layer-3 tun
/// device (`IFF_TUN`) or, with `tap`, a layer-2 tap device (`IFF_TAP`), both with
/// `IFF_NO_PI | IFF_VNET_HDR`; returns the descriptor and the name the kernel gave (for
/// `tun%d` or an empty name). `name` must fit `IFNAMSIZ` with its NUL.
pub(crate) fn open(name: &str, tap: bool) -> io::Result<(OwnedFd, String)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(CLONE_DEVICE)?;
    // SAFETY: `ifreq` is a C struct of integers, byte arrays and a union of such (and one
    // pointer, `ifru_data`, unused here); all zeroes is a valid value of each.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    let kind = if tap { libc::IFF_TAP } else { libc::IFF_TUN };
    req.ifr_ifru.ifru_flags = (kind | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq` through its pointer argument;
    // `req` is one, exclusively borrowed for the call, on a descriptor we own.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let given: Vec<u8> = req
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok((
        OwnedFd::from(file),
        String::from_utf8_lossy(&given).into_owned(),
    ))
}

/// Sets the offloads the device advertises (`TUN_F_*` bits).
pub(crate) fn set_offload(fd: &OwnedFd, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned long), not through a
    // pointer; the descriptor is ours and open.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(flags),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
