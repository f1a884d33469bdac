//! `relay_tcp`'s splice pipes are lent only while bytes are on their way: idle tunnels hold
//! no pipe descriptors, tunnels that carried a burst give their pipes back, the per-thread
//! pools stay within their bound, and many tunnels at once still carry every byte.
//!
//! One test function, alone in this binary: it counts the process's pipe descriptors in
//! `/proc/self/fd`, which concurrent tests would disturb.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use netio::relay::{relay_tcp, RelayConfig, PIPE_POOL_SIZE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

mod common;

use common::{exchange, pattern, Relay};

/// Socket buffers of the tunnels that stall a burst: small, so that a burst of a few hundred
/// KiB fills them and the relay's pipe stays full.
const SMALL_BUFFER: u32 = 16 * 1024;

/// Pipe ends this process holds.
fn pipe_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("pipe:"))
        .count()
}

/// A loopback listener; with `small`, accepted sockets get [`SMALL_BUFFER`] receive buffers.
fn listener(small: bool) -> TcpListener {
    let s = TcpSocket::new_v4().unwrap();
    if small {
        s.set_recv_buffer_size(SMALL_BUFFER).unwrap();
    }
    s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    s.listen(1024).unwrap()
}

async fn connect(addr: SocketAddr, small: bool) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    if small {
        s.set_send_buffer_size(SMALL_BUFFER).unwrap();
    }
    s.connect(addr).await.unwrap()
}

/// `n` tunnels client ⇄ [relay_tcp between p1 and p2] ⇄ server, the relays spawned.
async fn tunnels(n: usize, small: bool) -> Vec<(TcpStream, TcpStream, Relay)> {
    let l = listener(small);
    let addr = l.local_addr().unwrap();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let client = connect(addr, small).await;
        let (mut p1, _) = l.accept().await.unwrap();
        let mut p2 = connect(addr, small).await;
        let (server, _) = l.accept().await.unwrap();
        let relay =
            tokio::spawn(async move { relay_tcp(&mut p1, &mut p2, RelayConfig::default()).await });
        out.push((client, server, relay));
    }
    out
}

/// Waits (at most 10 s) until the pipe count satisfies `ok`; returns the last count.
async fn settle(ok: impl Fn(usize) -> bool) -> usize {
    let start = Instant::now();
    loop {
        let n = pipe_fds();
        if ok(n) || start.elapsed() > Duration::from_secs(10) {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn relays_hold_pipes_only_while_bytes_are_on_their_way() {
    // The relays run on these workers; each keeps a pool of its own.
    const WORKERS: usize = 2;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool_bound = 2 * PIPE_POOL_SIZE * WORKERS;
        let base = pipe_fds();

        // 1. Idle tunnels hold no pipe (owned pipes would be 4 × IDLE ends). A relay's first
        // poll may take a pipe, find nothing to read and give it back: the pools keep those
        // (one per worker seen here), never more than their bound.
        const IDLE: usize = 300;
        let idle = tunnels(IDLE, false).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let held = pipe_fds();
        assert!(
            held <= base + pool_bound,
            "{IDLE} idle tunnels hold {} pipe ends",
            held - base
        );
        for (client, server, relay) in idle {
            drop((client, server));
            let _ = relay.await;
        }

        // 2. Bursts the servers do not read yet keep their pipes lent (the test sees them) ...
        const BURSTS: usize = 40;
        const BURST: usize = 512 * 1024;
        let stalled = tunnels(BURSTS, true).await;
        let mut held = Vec::new();
        for (k, (client, server, relay)) in stalled.into_iter().enumerate() {
            let (_, mut w) = client.into_split();
            let writer = tokio::spawn(async move {
                w.write_all(&pattern(k as u64, BURST)).await.unwrap();
                w
            });
            held.push((server, relay, writer));
        }
        let during = settle(|n| n >= base + 2 * BURSTS).await;
        assert!(
            during >= base + 2 * BURSTS,
            "only {} pipe ends lent while {BURSTS} bursts are stalled",
            during - base
        );
        // ... and once every byte is out, they go back: at most the pools' bound stays.
        for (k, (server, _, _)) in held.iter_mut().enumerate() {
            let mut got = vec![0u8; BURST];
            server.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(k as u64, BURST), "burst {k} differs");
        }
        let after = settle(|n| n <= base + pool_bound).await;
        assert!(
            after <= base + pool_bound,
            "{} pipe ends held by idle tunnels after their bursts",
            after - base
        );
        for (server, relay, writer) in held {
            drop((server, writer.await.unwrap()));
            let _ = relay.await;
        }

        // 3. Many tunnels at once, both ways, assorted sizes: every byte arrives in order.
        const MANY: usize = 200;
        let many = tunnels(MANY, false).await;
        let transfers = many
            .into_iter()
            .enumerate()
            .map(|(k, (client, server, relay))| {
                let up = 1 + (k * 7919) % (600 * 1024);
                let down = 1 + (k * 104_729) % (400 * 1024);
                let (up, down) = (pattern(2 * k as u64, up), pattern(2 * k as u64 + 1, down));
                tokio::spawn(exchange(client, server, relay, up, down))
            })
            .collect::<Vec<_>>();
        tokio::time::timeout(Duration::from_secs(120), async {
            for t in transfers {
                t.await.unwrap();
            }
        })
        .await
        .expect("every transfer within two minutes");
        let after = settle(|n| n <= base + pool_bound).await;
        assert!(
            after <= base + pool_bound,
            "{} pipe ends held after {MANY} tunnels ended",
            after - base
        );
    });
}
