//! What crosses the tunnel: ICMP echo answered by the far kernel, and TCP transfers whose
//! SHA-256 the receiver checks.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use openssl::sha::Sha256;

use crate::netns::Netns;

/// The port the receiver listens on (inside the client's namespace).
pub const TRANSFER_PORT: u16 = 5001;

/// The IPv4 (or with `v6`, global IPv6) address on `tun0` in `ns`, if any.
pub fn tun_address(ns: &Netns, v6: bool) -> Option<IpAddr> {
    let out = if v6 {
        ns.run([
            "ip", "-6", "-o", "addr", "show", "dev", "tun0", "scope", "global",
        ])
    } else {
        ns.run(["ip", "-4", "-o", "addr", "show", "dev", "tun0"])
    }
    .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let cidr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet" && *w != "inet6")
        .nth(1)?;
    cidr.split('/').next()?.parse().ok()
}

/// Pings `dst` from `ns` until one echo is answered, for at most `timeout`.
pub fn ping(ns: &Netns, dst: IpAddr, timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let ok = ns
            .run(["ping", "-n", "-q", "-c", "1", "-W", "1", &dst.to_string()])
            .is_ok();
        if ok {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(format!("no echo reply from {dst} within {timeout:?}"));
        }
    }
}

/// The deterministic byte at offset `i` of a transfer.
fn byte_at(i: usize) -> u8 {
    (i.wrapping_mul(7) ^ (i >> 11)) as u8
}

/// Sends `len` bytes from `from` to `to_addr:TRANSFER_PORT` in `to`, in chunks of `chunk`
/// bytes with `pause` between chunks; the receiver checks the SHA-256. Returns the number of
/// bytes received intact.
pub fn transfer(
    from: &Netns,
    to: &Netns,
    to_addr: IpAddr,
    len: usize,
    chunk: usize,
    pause: Duration,
) -> Result<usize, String> {
    let addr = SocketAddr::from((to_addr, TRANSFER_PORT));
    let listener = to
        .run_in(move || TcpListener::bind(addr))
        .map_err(|e| format!("receiver: {e}"))?
        .map_err(|e| format!("receiver bind {addr}: {e}"))?;
    let mut want = Sha256::new();
    let data: Vec<u8> = (0..len).map(byte_at).collect();
    want.update(&data);
    let want = want.finish();
    std::thread::scope(|scope| {
        let receiver = scope.spawn(move || -> Result<(usize, [u8; 32]), String> {
            let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(40)))
                .map_err(|e| e.to_string())?;
            let mut got = Sha256::new();
            let mut n = 0;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => {
                        got.update(&buf[..k]);
                        n += k;
                    }
                    Err(e) => return Err(format!("receive after {n} bytes: {e}")),
                }
            }
            Ok((n, got.finish()))
        });
        let sent = from
            .run_in(|| -> Result<(), String> {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                    .map_err(|e| format!("connect {addr} through the tunnel: {e}"))?;
                s.set_write_timeout(Some(Duration::from_secs(40)))
                    .map_err(|e| e.to_string())?;
                for (i, piece) in data.chunks(chunk.max(1)).enumerate() {
                    s.write_all(piece)
                        .map_err(|e| format!("send chunk {i}: {e}"))?;
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(e) = sent {
            // Unblock the receiver: it may still be waiting in accept.
            let _ = to.run_in(move || TcpStream::connect_timeout(&addr, Duration::from_secs(1)));
            let _ = receiver.join();
            return Err(e);
        }
        let (n, got) = receiver
            .join()
            .map_err(|_| "receiver panicked".to_owned())??;
        if n != len || got != want {
            return Err(format!(
                "transfer: received {n} of {len} bytes, checksum {}",
                if got == want { "matches" } else { "WRONG" }
            ));
        }
        Ok(n)
    })
}
