//! A small HTTP CONNECT proxy for the matrix that records each request head, so a case can
//! assert that the client's custom header (`Reversed-VPN: ...`) reached the proxy. tinyproxy
//! (used by the other lab tests) does not log request headers.
//!
//! It accepts on a listener inside a lab namespace, reads one request head (at most
//! [`MAX_HEAD`] bytes), dials the `CONNECT` target from the same namespace, answers
//! `HTTP/1.0 200 Connection established` and copies bytes both ways until either side closes.
//! [`Proxy::stop`] (or drop) closes the listener; running tunnels end with their sockets.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::netns::Netns;
use crate::LabError;

/// The largest request head accepted.
pub const MAX_HEAD: usize = 8192;

/// A running recording proxy.
#[derive(Debug)]
pub struct Proxy {
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts the proxy in `ns` on `addr`.
    pub fn start(ns: &Netns, addr: SocketAddr) -> Result<Self, LabError> {
        let listener = ns
            .run_in(move || TcpListener::bind(addr))?
            .map_err(|source| LabError::io(format!("proxy listen {addr}"), source))?;
        listener
            .set_nonblocking(true)
            .map_err(|source| LabError::io("proxy listener", source))?;
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let ns_path = format!("/run/netns/{}", ns.name());
        let (h, s) = (heads.clone(), stop.clone());
        let thread = std::thread::spawn(move || accept_loop(listener, &ns_path, &h, &s));
        Ok(Self {
            heads,
            stop,
            thread: Some(thread),
        })
    }

    /// Every request head received so far, as text.
    pub fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops accepting.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: TcpListener,
    ns_path: &str,
    heads: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) {
    // Sockets dialled from this thread must live in the namespace too.
    if let Ok(file) = std::fs::File::open(ns_path) {
        use std::os::fd::AsFd;
        let _ = rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        );
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if let Some((head, upstream)) = handshake(&stream) {
                    heads
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(head);
                    splice(stream, upstream);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads the head, dials the target, answers 200. `None` (and the connection dropped) on any
/// failure: the client sees a closed connection.
fn handshake(mut stream: &TcpStream) -> Option<(String, TcpStream)> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte so nothing after the head (the tunnel's first bytes) is consumed here.
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD || stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split_whitespace().nth(1)?.to_owned();
    if !head.starts_with("CONNECT ") {
        let _ = stream.write_all(b"HTTP/1.0 405 Method Not Allowed\r\n\r\n");
        return None;
    }
    let addr: SocketAddr = target.parse().ok()?;
    let Ok(upstream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        let _ = stream.write_all(b"HTTP/1.0 502 Bad Gateway\r\n\r\n");
        return None;
    };
    stream.set_read_timeout(None).ok()?;
    stream
        .write_all(b"HTTP/1.0 200 Connection established\r\n\r\n")
        .ok()?;
    Some((head, upstream))
}

/// Copies both ways on two threads, closing the write side of each when its reader ends.
fn splice(client: TcpStream, server: TcpStream) {
    let pairs = [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ];
    for (from, to) in pairs {
        let (Ok(mut from), Ok(mut to)) = (from, to) else {
            continue;
        };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
            let _ = from.shutdown(Shutdown::Read);
        });
    }
}
