//! `relay_tcp` in a process at its descriptor limit: no pipe can be made, and the relay still
//! carries every byte both ways (it copies instead).
//!
//! One test function, alone in this binary: it lowers the process's `RLIMIT_NOFILE` to the
//! descriptors already open, which would break tests running beside it.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

mod common;

use std::fs::File;
use std::time::Duration;

use common::{exchange, pattern};
use netio::relay::{relay_tcp, RelayConfig};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::net::{TcpListener, TcpStream};

#[test]
fn a_relay_at_the_descriptor_limit_copies() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (mut p1, _) = l.accept().await.unwrap();
        let mut p2 = TcpStream::connect(addr).await.unwrap();
        let (server, _) = l.accept().await.unwrap();

        // Every descriptor number below the new limit taken: no pipe can be made.
        let limit = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64 + 8;
        setrlimit(Resource::RLIMIT_NOFILE, limit, hard).unwrap();
        let mut fillers = Vec::new();
        while let Ok(f) = File::open("/dev/null") {
            fillers.push(f);
            assert!(fillers.len() < 100, "the limit does not bind");
        }
        assert!(rustix::pipe::pipe().is_err(), "a pipe could still be made");

        let relay =
            tokio::spawn(async move { relay_tcp(&mut p1, &mut p2, RelayConfig::default()).await });
        let up = pattern(1, 3 << 20);
        let down = pattern(2, 1_234_567);
        tokio::time::timeout(
            Duration::from_secs(60),
            exchange(client, server, relay, up, down),
        )
        .await
        .unwrap();
        drop(fillers);
    });
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
}
