//! The far end of a check: a TCP server inside a pod's namespace that tells each client the
//! source address it saw and then echoes every byte, and keeps a record of who connected.
//!
//! ```text
//!  client ──connect──► far end
//!         ◄── "from 100.96.10.10 40312\n"
//!         ──── bytes ──►
//!         ◄─── the same bytes
//! ```
//!
//! It stands in for a kubelet (TCP 10250), a webhook (TCP 9443) or any listener a check needs
//! to prove reached or not reached. The listening socket is made inside the namespace; the
//! serving threads run anywhere (a socket stays in the namespace it was made in). Dropping it
//! stops accepting and waits for the connection threads, each bounded by [`IDLE`].

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::Netns;
use crate::LabError;

/// How long a connection may stay silent before the far end closes it.
pub const IDLE: Duration = Duration::from_secs(20);
/// At most this many connections are served; later ones are recorded and closed.
pub const MAX_CONNECTIONS: usize = 64;
/// How often the accept loop looks for a new connection.
const POLL: Duration = Duration::from_millis(10);

/// A far end listening in a namespace; stops when dropped.
#[derive(Debug)]
pub struct FarEnd {
    addr: SocketAddr,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FarEnd {
    /// Listens on `addr` inside `ns`.
    pub fn start(ns: &Netns, addr: SocketAddr) -> Result<FarEnd, LabError> {
        let listener =
            ns.run_in(|| TcpListener::bind(addr))?
                .map_err(|source| LabError::Socket {
                    what: "far end bind",
                    source,
                })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| LabError::Socket {
                what: "far end non-blocking",
                source,
            })?;
        let peers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let peers = Arc::clone(&peers);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || serve(&listener, &peers, &stop))
        };
        Ok(FarEnd {
            addr,
            peers,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every client address accepted so far, in order.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FarEnd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts until `stop`; each connection on a thread of its own, joined before returning.
fn serve(listener: &TcpListener, peers: &Mutex<Vec<SocketAddr>>, stop: &AtomicBool) {
    let mut workers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let served = {
                    let mut p = peers.lock().unwrap_or_else(PoisonError::into_inner);
                    p.push(peer);
                    p.len()
                };
                if served <= MAX_CONNECTIONS {
                    workers.push(std::thread::spawn(move || echo(stream, peer)));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
    }
    for w in workers {
        let _ = w.join();
    }
}

/// The greeting line for a client seen from `peer`.
pub fn greeting(peer: SocketAddr) -> String {
    format!("from {} {}\n", peer.ip(), peer.port())
}

/// Parses a greeting line (without its newline): the source address the far end saw.
pub fn parse_greeting(line: &str) -> Option<SocketAddr> {
    let mut words = line.strip_prefix("from ")?.split(' ');
    let ip: IpAddr = words.next()?.parse().ok()?;
    let port: u16 = words.next()?.parse().ok()?;
    words.next().is_none().then_some(SocketAddr::new(ip, port))
}

/// Greets, then echoes until the client closes or is silent for [`IDLE`].
fn echo(mut stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IDLE));
    let _ = stream.set_write_timeout(Some(IDLE));
    if stream.write_all(greeting(peer).as_bytes()).is_ok() {
        crate::echo::echo_until_closed(&mut stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_greeting_round_trips_both_families() {
        for peer in ["100.96.10.10:40312", "[fd00:96:10::10]:1024"] {
            let peer: SocketAddr = peer.parse().unwrap();
            let line = greeting(peer);
            assert_eq!(parse_greeting(line.trim_end()), Some(peer), "{line}");
        }
        assert_eq!(parse_greeting("from 1.2.3.4"), None);
        assert_eq!(parse_greeting("hello 1.2.3.4 5"), None);
        assert_eq!(parse_greeting("from 1.2.3.4 5 6"), None);
    }
}
