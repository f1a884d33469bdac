//! What the relay tests share: their test data and the exchange through a relay.

#![allow(dead_code)] // each test binary uses what it needs
#![allow(clippy::unwrap_used)] // helpers of tests: a failed unwrap is a failed test

use netio::relay::{RelayEnd, RelayError, RelayStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// A relay running on its own task.
pub type Relay = JoinHandle<Result<RelayStats, RelayError>>;

/// Deterministic pseudo-random bytes (xorshift64), different per seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends `up` from `client` and `down` from `server` at once, each side shutting its write
/// half after; checks what each side received and the relay's counts and end.
pub async fn exchange(
    client: TcpStream,
    server: TcpStream,
    relay: Relay,
    up: Vec<u8>,
    down: Vec<u8>,
) {
    let (ul, dl) = (up.len() as u64, down.len() as u64);
    let (srv_got, cli_got) =
        tokio::join!(transfer(server, down.clone()), transfer(client, up.clone()));
    assert!(srv_got == up, "a→b bytes differ");
    assert!(cli_got == down, "b→a bytes differ");
    let stats = relay.await.unwrap().unwrap();
    assert_eq!(
        (stats.a_to_b, stats.b_to_a, stats.end),
        (ul, dl, RelayEnd::Closed)
    );
}

/// Writes `data` and shuts the write half while reading to EOF; returns what was read.
pub async fn transfer(mut s: TcpStream, data: Vec<u8>) -> Vec<u8> {
    let (mut r, mut w) = s.split();
    let mut got = Vec::new();
    let (sent, read) = tokio::join!(
        async {
            w.write_all(&data).await?;
            w.shutdown().await
        },
        r.read_to_end(&mut got)
    );
    sent.unwrap();
    read.unwrap();
    got
}
