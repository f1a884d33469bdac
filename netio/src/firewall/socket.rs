//! The netfilter netlink socket: a batch sent as one datagram, then every message's
//! acknowledgement awaited (the first refusal is the transaction's error, a refusal of the
//! whole batch included).

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use super::encode::{Batch, Framed};
use super::FirewallError;
use crate::netlink::wire;

/// How long a transaction may take to be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A bound `NETLINK_NETFILTER` socket and the sequence number it used last.
#[derive(Debug)]
pub(super) struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    /// Opens and binds the socket (blocking, in the calling thread's network namespace), with
    /// [`ANSWER_TIMEOUT`] on every receive.
    pub(super) fn open() -> io::Result<Socket> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(rustix::net::netlink::NETFILTER),
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )?;
        Ok(Socket { fd, seq: 0 })
    }

    /// Sends `batch` as one transaction and waits for every acknowledgement.
    pub(super) fn send(&mut self, batch: Batch) -> Result<(), FirewallError> {
        let begin = self.seq.wrapping_add(1);
        let Framed {
            bytes,
            mut pending,
            last,
        } = batch.frame(begin);
        self.seq = last;
        rustix::net::sendto(
            &self.fd,
            &bytes,
            SendFlags::empty(),
            &SocketAddrNetlink::new(0, 0),
        )
        .map_err(|e| FirewallError::Io(e.into()))?;
        let mut buf = vec![0u8; 64 * 1024];
        while !pending.is_empty() {
            let (n, _) = rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty())
                .map_err(|e| FirewallError::Io(e.into()))?;
            for msg in wire::messages(&buf[..n])? {
                if i32::from(msg.kind) != libc::NLMSG_ERROR {
                    continue;
                }
                // A sender without CAP_NET_ADMIN gets one answer, EPERM for BATCH_BEGIN, and
                // none for the batch's messages.
                if msg.seq == begin {
                    match wire::error_code(msg.payload)? {
                        0 => continue,
                        code => {
                            return Err(FirewallError::Refused {
                                what: "the batch".into(),
                                source: io::Error::from_raw_os_error(-code),
                            })
                        }
                    }
                }
                let Some(at) = pending.iter().position(|(s, _)| *s == msg.seq) else {
                    continue;
                };
                let (_, what) = pending.remove(at);
                match wire::error_code(msg.payload)? {
                    0 => {}
                    code => {
                        return Err(FirewallError::Refused {
                            what,
                            source: io::Error::from_raw_os_error(-code),
                        })
                    }
                }
            }
        }
        Ok(())
    }
}
