//! A measurement, not a check: the router's heap per idle tunnel, CONNECT and SNI, by
//! allocation size, with a counting global allocator (loopback only, no privileges):
//!
//! ```text
//! cargo test --release -p vpn-router --test idle_memory -- --ignored --nocapture
//! ```
//!
//! The clients and the upstream are std sockets on their own threads, so what the count
//! sees between "before" and "after" is the router's: its tasks, their futures, the sockets'
//! registrations, spans. `docs/performance-notes.md` has the figures and what they say about
//! VmRSS per idle tunnel in the ingress benchmark.

#![allow(clippy::unwrap_used)]
// a measurement's helpers: a failed unwrap is a failed run
// A global allocator is an unsafe trait; this one only counts and forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lab::tls_hello::client_hello;
use tokio_util::sync::CancellationToken;
use vpn_router::Router;

/// Live bytes, live allocations, and live allocations by size class (`<= 2^i` bytes).
struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);
const CLASSES: usize = 18;
static BY_SIZE: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];

fn class(size: usize) -> usize {
    (usize::BITS - size.max(1).saturating_sub(1).leading_zeros()).min(CLASSES as u32 - 1) as usize
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract; the
// counters are atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        LIVE.fetch_add(1, Ordering::Relaxed);
        BY_SIZE[class(layout.size())].fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        LIVE.fetch_sub(1, Ordering::Relaxed);
        BY_SIZE[class(layout.size())].fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy)]
struct Snapshot {
    bytes: i64,
    count: i64,
    by_size: [i64; CLASSES],
}

fn snapshot() -> Snapshot {
    Snapshot {
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        count: LIVE.load(Ordering::Relaxed),
        by_size: std::array::from_fn(|i| BY_SIZE[i].load(Ordering::Relaxed)),
    }
}

fn report(what: &str, before: Snapshot, after: Snapshot, n: i64) {
    let bytes = (after.bytes - before.bytes) as f64 / n as f64;
    let count = (after.count - before.count) as f64 / n as f64;
    eprintln!("{what}: {bytes:.0} bytes in {count:.1} allocations per idle tunnel");
    for i in 0..CLASSES {
        let d = after.by_size[i] - before.by_size[i];
        if d.abs() >= n / 2 {
            let lo = if i == 0 { 0 } else { (1usize << (i - 1)) + 1 };
            eprintln!(
                "  {lo:>6}..={:<6} bytes: {:.2} per tunnel",
                1usize << i,
                d as f64 / n as f64
            );
        }
    }
}

/// An upstream that accepts and holds every connection (no reads).
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::with_capacity(4096);
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

const N: i64 = 1000;
const VALUE: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";

#[test]
#[ignore = "measurement"]
fn heap_per_idle_tunnel() {
    let up = upstream();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.toml");
    std::fs::write(
        &path,
        format!(
            "max_connections = 4096\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nheaders = [\"Reversed-VPN\"]\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nkind = \"sni\"\n\
             [[route]]\nvalue = \"{VALUE}\"\nupstream = \"{up}\"\n\
             [[sni_route]]\nserver_names = [\"api.a.example\"]\nupstream = \"{up}\"\n"
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let router = rt.block_on(Router::bind(&path)).unwrap();
    let addrs = router.local_addrs();
    let token = CancellationToken::new();
    rt.spawn(router.run(token.clone()));
    let connect = |addr: SocketAddr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(
            format!("CONNECT x:1 HTTP/1.1\r\nHost: x\r\nReversed-VPN: {VALUE}\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        s
    };
    let hello = client_hello("api.a.example");
    let sni = |addr: SocketAddr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello).unwrap();
        s
    };
    let settle = || std::thread::sleep(Duration::from_millis(500));
    // Warm-up: one of each, closed.
    drop((connect(addrs[0]), sni(addrs[1])));
    settle();
    for (what, addr, open) in [
        (
            "CONNECT",
            addrs[0],
            &connect as &dyn Fn(SocketAddr) -> TcpStream,
        ),
        ("SNI", addrs[1], &sni),
    ] {
        let before = snapshot();
        let held: Vec<TcpStream> = (0..N).map(|_| open(addr)).collect();
        settle();
        let after = snapshot();
        report(what, before, after, N);
        drop(held);
        settle();
    }
    token.cancel();
}
