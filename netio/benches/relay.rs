//! The generic (copying) relay against the splice relay over loopback TCP.
//!
//! ```text
//!   source thread ──TCP──► [relay thread: relay / relay_tcp] ──TCP──► sink thread
//! ```
//!
//! Each transfer moves [`TRANSFER`] bytes one way through a relay running alone on its own
//! thread (current-thread runtime), so that thread's `getrusage(RUSAGE_THREAD)` is the relay's
//! CPU cost and nothing else. First a CPU report (user + system seconds per GB relayed, on
//! stderr), then criterion's throughput per variant.
//!
//! `cargo bench -p netio --bench relay` (add `-- --cpu-only` to skip criterion).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use netio::relay::{relay, relay_tcp, RelayConfig, RelayStats};
use nix::sys::resource::{getrusage, UsageWho};

/// Bytes per transfer.
const TRANSFER: usize = 64 * 1024 * 1024;
/// Transfers per variant in the CPU report.
const CPU_RUNS: usize = 8;
/// Write size of the source.
const SOURCE_CHUNK: usize = 256 * 1024;

#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    splice: bool,
    buffer_size: usize,
}

const VARIANTS: [Variant; 5] = [
    Variant {
        name: "generic/32KiB",
        splice: false,
        buffer_size: 32 * 1024,
    },
    Variant {
        name: "generic/256KiB",
        splice: false,
        buffer_size: 256 * 1024,
    },
    Variant {
        name: "splice/32KiB",
        splice: true,
        buffer_size: 32 * 1024,
    },
    Variant {
        name: "splice/256KiB",
        splice: true,
        buffer_size: 256 * 1024,
    },
    Variant {
        name: "splice/1MiB",
        splice: true,
        buffer_size: 1024 * 1024,
    },
];

/// What one transfer cost the relay thread.
#[derive(Debug, Clone, Copy)]
struct Measured {
    wall: Duration,
    user: Duration,
    system: Duration,
}

/// CPU time of the calling thread: (user, system).
fn thread_cpu() -> (Duration, Duration) {
    let usage = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage");
    let d = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
    };
    (d(usage.user_time()), d(usage.system_time()))
}

/// One transfer of `TRANSFER` bytes source → relay → sink.
fn transfer(v: Variant) -> Measured {
    let l1 = TcpListener::bind("127.0.0.1:0").expect("bind");
    let l2 = TcpListener::bind("127.0.0.1:0").expect("bind");
    let (a1, a2) = (
        l1.local_addr().expect("addr"),
        l2.local_addr().expect("addr"),
    );
    let relay_thread = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l1 = tokio::net::TcpListener::from_std(set_nonblocking(l1)).expect("listener");
            let l2 = tokio::net::TcpListener::from_std(set_nonblocking(l2)).expect("listener");
            let (mut a, _) = l1.accept().await.expect("accept");
            let (mut b, _) = l2.accept().await.expect("accept");
            let config = RelayConfig {
                buffer_size: v.buffer_size,
                ..RelayConfig::default()
            };
            let (u0, s0) = thread_cpu();
            let t0 = Instant::now();
            let stats: RelayStats = if v.splice {
                relay_tcp(&mut a, &mut b, config).await
            } else {
                relay(&mut a, &mut b, config).await
            }
            .expect("relay");
            let wall = t0.elapsed();
            let (u1, s1) = thread_cpu();
            assert_eq!(stats.a_to_b, TRANSFER as u64);
            Measured {
                wall,
                user: u1 - u0,
                system: s1 - s0,
            }
        })
    });
    let source = thread::spawn(move || {
        let mut s = TcpStream::connect(a1).expect("connect");
        let chunk = vec![0x5au8; SOURCE_CHUNK];
        let mut left = TRANSFER;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n]).expect("write");
            left -= n;
        }
        s.shutdown(Shutdown::Write).expect("shutdown");
        // Wait for the relay's FIN back (the sink shuts its side after EOF).
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("read");
    });
    let mut sink = TcpStream::connect(a2).expect("connect");
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    loop {
        let n = sink.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, TRANSFER);
    sink.shutdown(Shutdown::Write).expect("shutdown");
    source.join().expect("source");
    relay_thread.join().expect("relay")
}

fn set_nonblocking(l: TcpListener) -> TcpListener {
    l.set_nonblocking(true).expect("nonblocking");
    l
}

/// User + system CPU seconds per GB (10^9 bytes) of the relay thread, per variant.
fn cpu_report() {
    eprintln!(
        "relay CPU per GB relayed (one direction, {} x {} MiB over loopback, relay thread only):",
        CPU_RUNS,
        TRANSFER >> 20
    );
    eprintln!(
        "{:<16} {:>10} {:>10} {:>10} {:>12}",
        "variant", "user s/GB", "sys s/GB", "total s/GB", "MB/s (wall)"
    );
    for v in VARIANTS {
        transfer(v); // warm-up
        let (mut wall, mut user, mut system) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..CPU_RUNS {
            let m = transfer(v);
            wall += m.wall;
            user += m.user;
            system += m.system;
        }
        let gb = (CPU_RUNS * TRANSFER) as f64 / 1e9;
        eprintln!(
            "{:<16} {:>10.3} {:>10.3} {:>10.3} {:>12.0}",
            v.name,
            user.as_secs_f64() / gb,
            system.as_secs_f64() / gb,
            (user + system).as_secs_f64() / gb,
            gb * 1e3 / wall.as_secs_f64()
        );
    }
}

fn throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("relay_loopback_64MiB");
    group.throughput(Throughput::Bytes(TRANSFER as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for v in VARIANTS {
        group.bench_function(v.name, |bench| {
            bench.iter_custom(|iters| (0..iters).map(|_| transfer(v).wall).sum())
        });
    }
    group.finish();
}

fn main() {
    cpu_report();
    if std::env::args().any(|a| a == "--cpu-only") {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    throughput(&mut c);
    c.final_summary();
}
