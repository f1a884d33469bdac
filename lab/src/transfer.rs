//! A checksummed one-way transfer for tests that move bytes across a tunnel: deterministic
//! bytes served once by [`serve_bytes`], read to the end from inside a namespace by [`fetch`],
//! compared by SHA-256.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use openssl::sha::sha256;

use crate::netns::Netns;
use crate::LabError;

/// Serves `len` deterministic bytes to the first connection on `listener`, then closes it.
/// Returns the serving thread (it panics if the accept or the write fails) and the bytes'
/// SHA-256.
pub fn serve_bytes(listener: TcpListener, len: usize) -> (JoinHandle<()>, [u8; 32]) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    let digest = sha256(&data);
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.write_all(&data).expect("write");
    });
    (handle, digest)
}

/// Connects from `ns` to `addr` and reads to the end, each step bounded by `timeout`; returns
/// the byte count and the SHA-256 of what arrived.
pub fn fetch(
    ns: &Netns,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(usize, [u8; 32]), LabError> {
    ns.run_in(move || {
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        Ok((buf.len(), sha256(&buf)))
    })?
    .map_err(|source| LabError::io(format!("transfer from {addr}"), source))
}
