//! `relay_tcp` (splice on Linux) over real loopback TCP: bytes and counts both ways, half-close
//! each way with data still in flight, idle timeout, peer reset, many small writes, and random
//! chunk sizes through both relays.

#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::time::Duration;

use netio::relay::{relay, relay_tcp, RelayConfig, RelayEnd, RelayStats};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connected loopback pair.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

mod common;

use common::{pattern, Relay};

/// client ⇄ [relay_tcp between p1 and p2] ⇄ server.
async fn through_relay(config: RelayConfig) -> (TcpStream, TcpStream, Relay) {
    let (client, mut p1) = pair().await;
    let (mut p2, server) = pair().await;
    let task = tokio::spawn(async move { relay_tcp(&mut p1, &mut p2, config).await });
    (client, server, task)
}

/// FNV-1a 64 over a byte stream.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Sends `data` in `chunk`-sized writes, then shuts the write half.
async fn send_all(w: &mut (impl AsyncWriteExt + Unpin), data: &[u8], chunk: usize) {
    for c in data.chunks(chunk.max(1)) {
        w.write_all(c).await.unwrap();
    }
    w.shutdown().await.unwrap();
}

/// Reads to EOF; returns (length, checksum).
async fn receive_all(r: &mut (impl AsyncReadExt + Unpin)) -> (usize, u64) {
    let mut buf = vec![0u8; 64 * 1024];
    let (mut len, mut sum) = (0, Fnv::new());
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            return (len, sum.0);
        }
        sum.update(&buf[..n]);
        len += n;
    }
}

fn checksum(data: &[u8]) -> u64 {
    let mut f = Fnv::new();
    f.update(data);
    f.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_both_ways_at_once() {
    let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
    let up = pattern(1, 24 * 1024 * 1024 + 7);
    let down = pattern(2, 17 * 1024 * 1024 + 3);
    let (up_sum, down_sum) = (checksum(&up), checksum(&down));
    let (up_len, down_len) = (up.len(), down.len());
    let srv = tokio::spawn(async move {
        let (mut r, mut w) = server.split();
        let ((), got) = tokio::join!(send_all(&mut w, &down, 100_000), receive_all(&mut r));
        got
    });
    let (mut r, mut w) = client.split();
    let ((), got_down) = tokio::join!(send_all(&mut w, &up, 65_536), receive_all(&mut r));
    assert_eq!(got_down, (down_len, down_sum));
    assert_eq!(srv.await.unwrap(), (up_len, up_sum));
    let stats = task.await.unwrap().unwrap();
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: up_len as u64,
            b_to_a: down_len as u64,
            end: RelayEnd::Closed
        }
    );
}

#[tokio::test]
async fn half_close_from_client_with_data_in_flight() {
    let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
    // More than the socket buffers and the pipe hold: the FIN arrives while most of the
    // request still waits in the relay's path, because the server is not reading yet.
    let request = pattern(3, 8 * 1024 * 1024);
    let request2 = request.clone();
    let sender = tokio::spawn(async move {
        client.write_all(&request2).await.unwrap();
        client.shutdown().await.unwrap();
        client
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = receive_all(&mut server).await;
    assert_eq!(got, (request.len(), checksum(&request)));
    let mut client = sender.await.unwrap();
    // The other direction still flows after the half-close.
    server.write_all(b"response ").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.write_all(b"after half-close").await.unwrap();
    server.shutdown().await.unwrap();
    let mut back = Vec::new();
    client.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"response after half-close");
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.a_to_b, stats.b_to_a), (request.len() as u64, 25));
    assert_eq!(stats.end, RelayEnd::Closed);
}

#[tokio::test]
async fn half_close_from_server_with_data_in_flight() {
    let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
    let banner = pattern(4, 6 * 1024 * 1024 + 11);
    let banner2 = banner.clone();
    let sender = tokio::spawn(async move {
        server.write_all(&banner2).await.unwrap();
        server.shutdown().await.unwrap();
        server
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = receive_all(&mut client).await;
    assert_eq!(got, (banner.len(), checksum(&banner)));
    let mut server = sender.await.unwrap();
    client.write_all(b"still talking").await.unwrap();
    client.shutdown().await.unwrap();
    let mut up = Vec::new();
    server.read_to_end(&mut up).await.unwrap();
    assert_eq!(up, b"still talking");
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.a_to_b, stats.b_to_a), (13, banner.len() as u64));
    assert_eq!(stats.end, RelayEnd::Closed);
}

#[tokio::test]
async fn a_half_closed_tunnel_nobody_answers_closes_at_the_half_closed_timeout() {
    let config = RelayConfig {
        half_closed_timeout: Duration::from_millis(300),
        ..RelayConfig::default()
    };
    let (mut client, mut server, task) = through_relay(config).await;
    server.write_all(b"banner").await.unwrap();
    server.shutdown().await.unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"banner");
    // The client neither sends nor closes.
    let stats = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("relay ends after the half-closed timeout")
        .unwrap()
        .unwrap();
    assert_eq!(stats.end, RelayEnd::Idle);
    assert_eq!((stats.a_to_b, stats.b_to_a), (0, 6));
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn both_sockets_get_the_tcp_user_timeout() {
    let (mut client, mut p1) = pair().await;
    let (mut p2, mut server) = pair().await;
    let config = RelayConfig {
        tcp_user_timeout: Some(Duration::from_millis(2500)),
        ..RelayConfig::default()
    };
    let task = tokio::spawn(async move {
        let stats = relay_tcp(&mut p1, &mut p2, config).await;
        (stats, p1, p2)
    });
    client.shutdown().await.unwrap();
    server.shutdown().await.unwrap();
    let (stats, p1, p2) = task.await.unwrap();
    assert_eq!(stats.unwrap().end, RelayEnd::Closed);
    for s in [&p1, &p2] {
        let timeout = socket2::SockRef::from(s).tcp_user_timeout().unwrap();
        assert_eq!(timeout, Some(Duration::from_millis(2500)));
    }
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
}

#[tokio::test]
async fn idle_timeout_closes_both_sides() {
    let config = RelayConfig {
        idle_timeout: Duration::from_millis(300),
        ..RelayConfig::default()
    };
    let (mut client, mut server, task) = through_relay(config).await;
    // Traffic both ways keeps it alive past the timeout ...
    for i in 0..4 {
        let mut one = [0u8; 1];
        if i % 2 == 0 {
            client.write_all(b"x").await.unwrap();
            server.read_exact(&mut one).await.unwrap();
        } else {
            server.write_all(b"y").await.unwrap();
            client.read_exact(&mut one).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(!task.is_finished());
    // ... silence ends it, and both peers see EOF.
    let stats = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("relay ends after the idle timeout")
        .unwrap()
        .unwrap();
    assert_eq!(stats.end, RelayEnd::Idle);
    assert_eq!((stats.a_to_b, stats.b_to_a), (2, 2));
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    server.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn reset_peer_is_an_error_with_counts() {
    let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
    client.write_all(b"abc").await.unwrap();
    let mut three = [0u8; 3];
    server.read_exact(&mut three).await.unwrap();
    server.write_all(b"hello").await.unwrap();
    let mut five = [0u8; 5];
    client.read_exact(&mut five).await.unwrap();
    // SO_LINGER 0: close sends RST.
    server.set_zero_linger().unwrap();
    drop(server);
    // Keep writing until the relay notices.
    let result = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if client.write_all(&[0u8; 1024]).await.is_err() || task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.await.unwrap()
    })
    .await
    .unwrap();
    let err = result.unwrap_err();
    assert_eq!(err.b_to_a, 5);
    assert!(err.a_to_b >= 3);
    assert!(
        matches!(
            err.source.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn many_small_writes() {
    let (mut client, mut server, task) = through_relay(RelayConfig::default()).await;
    client.set_nodelay(true).unwrap();
    let data = pattern(5, 200_000);
    let data2 = data.clone();
    let sender = tokio::spawn(async move {
        let mut rest = &data2[..];
        let mut i = 0usize;
        while !rest.is_empty() {
            let n = (i % 17 + 1).min(rest.len());
            client.write_all(&rest[..n]).await.unwrap();
            rest = &rest[n..];
            i += 1;
        }
        client.shutdown().await.unwrap();
        client
    });
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, data);
    server.shutdown().await.unwrap();
    let mut client = sender.await.unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    let stats = task.await.unwrap().unwrap();
    assert_eq!((stats.a_to_b, stats.b_to_a), (data.len() as u64, 0));
}

/// Sends `up` / `down` in the given chunk sizes through the chosen relay with a tiny buffer.
async fn random_chunks(splice: bool, up: Vec<u8>, down: Vec<u8>, chunks: (usize, usize)) {
    let config = RelayConfig {
        buffer_size: 4096, // one page: many fills and drains
        ..RelayConfig::default()
    };
    let (mut client, mut p1) = pair().await;
    let (mut p2, mut server) = pair().await;
    let task = tokio::spawn(async move {
        if splice {
            relay_tcp(&mut p1, &mut p2, config).await
        } else {
            relay(&mut p1, &mut p2, config).await
        }
    });
    let (up_len, down_len) = (up.len(), down.len());
    let (up_sum, down_sum) = (checksum(&up), checksum(&down));
    let srv = tokio::spawn(async move {
        let (mut r, mut w) = server.split();
        let ((), got) = tokio::join!(send_all(&mut w, &down, chunks.1), receive_all(&mut r));
        got
    });
    let (mut r, mut w) = client.split();
    let ((), got) = tokio::join!(send_all(&mut w, &up, chunks.0), receive_all(&mut r));
    assert_eq!(got, (down_len, down_sum));
    assert_eq!(srv.await.unwrap(), (up_len, up_sum));
    let stats = task.await.unwrap().unwrap();
    assert_eq!(
        (stats.a_to_b, stats.b_to_a, stats.end),
        (up_len as u64, down_len as u64, RelayEnd::Closed)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_chunk_sizes(
        splice in any::<bool>(),
        up_len in 0usize..300_000,
        down_len in 0usize..300_000,
        up_chunk in 1usize..20_000,
        down_chunk in 1usize..20_000,
        seed in any::<u64>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(random_chunks(
            splice,
            pattern(seed, up_len),
            pattern(seed.wrapping_add(1), down_len),
            (up_chunk, down_chunk),
        ));
    }
}
