//! The tun offloads against the real kernel: two namespaces, each with one of our tun devices,
//! and this test relaying between them as the VPN's data path does (`recv_many` on one device,
//! `send_many_sync` on the other). TCP transfers both ways, over IPv4 and IPv6, arrive intact
//! (SHA-256), and the kernel's own counters show that it handed over super-packets and took
//! merged ones: the device that was read sent more than an MTU per packet, the device that
//! was written received more than an MTU per packet.
//!
//! ```text
//!  A: vpnt-offa 10.71.0.1/24, fd00:71::1/64        B: vpnt-offb 10.72.0.1/24, fd00:72::1/64
//!     route 10.72.0.0/24, fd00:72::/64 ─► tun ══ relay (this test) ══ tun ◄─ route 10.71.0.0/24, fd00:71::/64
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use conformance::netns::Netns;
use conformance::require_lab;
use netio::netlink::{IpPrefix, Netlink, Route};
use netio::tun::{Coalescer, PacketLayout, RecvPool, Tun};

const TUN_A: &str = "vpnt-offa";
const TUN_B: &str = "vpnt-offb";
const B4: Ipv4Addr = Ipv4Addr::new(10, 72, 0, 1);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x71, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x72, 0, 0, 0, 0, 0, 1);
/// Bytes each way per transfer.
const TRANSFER: usize = 24 << 20;
/// No transfer may take longer (a broken relay shows as a timeout, not a hang).
const DEADLINE: Duration = Duration::from_secs(60);

/// What the relay saw.
#[derive(Debug, Default)]
struct Relayed {
    /// Packets read (after segmentation).
    packets: AtomicU64,
    /// Packets read longer than the MTU (none may be: the peer expects what a plain tun gives).
    oversize: AtomicU64,
    /// Writes the kernel refused.
    failed_writes: AtomicU64,
}

fn p(s: &str) -> IpPrefix {
    s.parse().expect("prefix")
}

/// Opens `name` in `ns` (registered with `rt`), with its addresses, up, and routes to the
/// other side.
fn tun_in(
    ns: &Netns,
    rt: &tokio::runtime::Runtime,
    name: &str,
    addrs: [&str; 2],
    routes: [&str; 2],
) -> Tun {
    ns.run_in(|| {
        let _entered = rt.enter();
        let tun = Tun::open(name).expect("open tun");
        assert!(tun.offload(), "the kernel refused the tun offloads");
        rt.block_on(async {
            let nl = Netlink::open().expect("netlink");
            nl.set_link_up(name).await.expect("up");
            for a in addrs {
                nl.add_address(name, p(a)).await.expect("address");
            }
            for r in routes {
                nl.add_route(&Route::via_dev(p(r), name))
                    .await
                    .expect("route");
            }
        });
        tun
    })
    .expect("run_in")
}

/// Moves every packet read from `from` into `to` until `stop`.
async fn pump(from: Arc<Tun>, to: Arc<Tun>, seen: Arc<Relayed>, stop: Arc<AtomicBool>) {
    let layout = PacketLayout {
        headroom: 0,
        max_len: 1500,
        tailroom: 0,
    };
    let mut pool = RecvPool::default();
    let mut batch: Vec<BytesMut> = Vec::new();
    let mut gro = Coalescer::default();
    while !stop.load(Ordering::Relaxed) {
        let read = tokio::time::timeout(
            Duration::from_millis(100),
            from.recv_many(&mut pool, layout, &mut batch, 64),
        )
        .await;
        let Ok(read) = read else { continue };
        read.expect("recv_many");
        seen.packets
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let oversize = batch.iter().filter(|p| p.len() > layout.max_len).count();
        seen.oversize.fetch_add(oversize as u64, Ordering::Relaxed);
        if to.send_many_sync(&mut batch, &mut gro).is_err() {
            seen.failed_writes.fetch_add(1, Ordering::Relaxed);
        }
        batch.clear();
    }
}

/// Sends `TRANSFER` bytes from A to `server` in B and the same amount back, both ways at
/// once; returns the SHA-256 of what each side sent and received.
fn transfer(a: &Netns, b: &Netns, server: SocketAddr) -> ([u8; 32], [u8; 32], [u8; 32], [u8; 32]) {
    let listener = b
        .run_in(|| TcpListener::bind(server).expect("bind"))
        .expect("run_in");
    let data_a: Vec<u8> = (0..TRANSFER).map(|i| (i % 251) as u8).collect();
    let data_b: Vec<u8> = (0..TRANSFER).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    // Each side writes on a thread of its own while it reads, so neither waits for the other.
    let exchange = |stream: TcpStream, data: &[u8]| -> Vec<u8> {
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut writer = stream.try_clone().expect("clone");
        std::thread::scope(|s| {
            s.spawn(|| {
                writer.write_all(data).expect("write");
                writer
                    .shutdown(std::net::Shutdown::Write)
                    .expect("shutdown");
            });
            let mut got = Vec::with_capacity(TRANSFER);
            (&stream).read_to_end(&mut got).expect("read");
            got
        })
    };
    let (got_b, got_a) = std::thread::scope(|s| {
        let at_b = s.spawn(|| {
            b.run_in(|| {
                let (stream, _) = listener.accept().expect("accept");
                exchange(stream, &data_b)
            })
            .expect("run_in")
        });
        let at_a = a
            .run_in(|| {
                let stream =
                    TcpStream::connect_timeout(&server, Duration::from_secs(5)).expect("connect");
                exchange(stream, &data_a)
            })
            .expect("run_in");
        (at_b.join().expect("B side"), at_a)
    });
    let sha = |d: &[u8]| openssl::sha::sha256(d);
    (sha(&data_a), sha(&got_b), sha(&data_b), sha(&got_a))
}

/// `(packets, bytes)` the kernel counted on `dev` for `dir` ("tx": handed to the device, i.e.
/// read by us; "rx": written by us).
fn counters(ns: &Netns, dev: &str, dir: &str) -> (u64, u64) {
    let out = ns
        .run(["ip", "-s", "-j", "link", "show", dev])
        .expect("ip -s link");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
    let stats = &json[0]["stats64"][dir];
    (
        stats["packets"].as_u64().expect("packets"),
        stats["bytes"].as_u64().expect("bytes"),
    )
}

#[test]
fn tcp_crosses_offloading_tuns_intact_in_super_packets() {
    require_lab(&[]);
    let a = Netns::new().expect("netns A");
    let b = Netns::new().expect("netns B");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tun_a = Arc::new(tun_in(
        &a,
        &rt,
        TUN_A,
        ["10.71.0.1/24", "fd00:71::1/64"],
        ["10.72.0.0/24", "fd00:72::/64"],
    ));
    let tun_b = Arc::new(tun_in(
        &b,
        &rt,
        TUN_B,
        ["10.72.0.1/24", "fd00:72::1/64"],
        ["10.71.0.0/24", "fd00:71::/64"],
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let a_to_b = Arc::new(Relayed::default());
    let b_to_a = Arc::new(Relayed::default());
    let pumps = [
        rt.spawn(pump(
            Arc::clone(&tun_a),
            Arc::clone(&tun_b),
            Arc::clone(&a_to_b),
            Arc::clone(&stop),
        )),
        rt.spawn(pump(
            Arc::clone(&tun_b),
            Arc::clone(&tun_a),
            Arc::clone(&b_to_a),
            Arc::clone(&stop),
        )),
    ];

    // IPv6 needs duplicate address detection to finish before the addresses can be used.
    let started = Instant::now();
    for (ns, addr) in [(&a, IpAddr::V6(A6)), (&b, IpAddr::V6(B6))] {
        loop {
            let shown = ns
                .run(["ip", "-6", "addr", "show", "tentative"])
                .expect("ip");
            if !String::from_utf8_lossy(&shown.stdout).contains(&addr.to_string()) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "DAD never finished"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    for server in [
        SocketAddr::new(IpAddr::V4(B4), 5301),
        SocketAddr::new(IpAddr::V6(B6), 5302),
    ] {
        let (sent_a, got_b, sent_b, got_a) = transfer(&a, &b, server);
        assert_eq!(sent_a, got_b, "A → B over {server}: bytes changed");
        assert_eq!(sent_b, got_a, "B → A over {server}: bytes changed");
    }
    stop.store(true, Ordering::Relaxed);
    for pump in pumps {
        rt.block_on(pump).expect("pump task");
    }
    assert_eq!(a_to_b.failed_writes.load(Ordering::Relaxed), 0);
    assert_eq!(b_to_a.failed_writes.load(Ordering::Relaxed), 0);

    // The kernel handed each device's traffic over in super-packets (what we read, its "tx")
    // and took ours merged (what we wrote, its "rx"): more than an MTU per packet on average.
    for (ns, dev) in [(&a, TUN_A), (&b, TUN_B)] {
        let (tx_packets, tx_bytes) = counters(ns, dev, "tx");
        let (rx_packets, rx_bytes) = counters(ns, dev, "rx");
        assert!(
            tx_bytes > 2 * TRANSFER as u64 && rx_bytes > 2 * TRANSFER as u64,
            "{dev}: too little traffic counted: tx {tx_bytes}, rx {rx_bytes}"
        );
        assert!(
            tx_bytes / tx_packets > 3000,
            "{dev}: no super-packets read: {tx_bytes} bytes in {tx_packets} packets"
        );
        assert!(
            rx_bytes / rx_packets > 3000,
            "{dev}: no merged writes: {rx_bytes} bytes in {rx_packets} packets"
        );
    }
    // What the relay moved is what a plain tun would have given: packets of at most the MTU.
    for seen in [&a_to_b, &b_to_a] {
        assert!(seen.packets.load(Ordering::Relaxed) > 2 * TRANSFER as u64 / 1500);
        assert_eq!(seen.oversize.load(Ordering::Relaxed), 0);
    }
}
