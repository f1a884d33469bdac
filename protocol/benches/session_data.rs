//! The data path as the drivers run it, through the session API: a batch of tun packets
//! sealed in place in pooled buffers and coalesced into one socket write, and a socket read's
//! worth of framed packets cut out of the receive buffer and opened in place. Run with
//! `cargo bench -p protocol --bench session_data`.
//!
//! The sessions are a client and a server connected in memory (the tests' `session_util`),
//! AES-256-GCM and AES-256-CBC with HMAC-SHA256.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/session_util/mod.rs"]
mod session_util;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use protocol::data::{DataCipher, DATA_TAILROOM};
use protocol::framing::FrameDecoder;
use protocol::session::SEND_HEADROOM;
use session_util::{Pair, Setup};

/// Packets per batch (the drivers' `TUN_BATCH`).
const BATCH: usize = 32;
const PAYLOAD_LEN: usize = 1400;

fn connected(cipher: DataCipher) -> Pair {
    let mut pair = Setup::new(7).cipher(cipher).build();
    assert!(pair.run_until(Duration::from_secs(30), |p| p.connected()));
    pair
}

/// An IPv4-looking payload (the session does not parse it).
fn payload() -> Vec<u8> {
    let mut p = vec![0xa5u8; PAYLOAD_LEN];
    p[0] = 0x45;
    p
}

fn bench(c: &mut Criterion) {
    let payload = payload();
    let mut group = c.benchmark_group("session_data");
    group.throughput(Throughput::Bytes((BATCH * PAYLOAD_LEN) as u64));
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for cipher in [DataCipher::Aes256Gcm, DataCipher::Aes256Cbc] {
        let mut pair = connected(cipher);
        let now = pair.now();
        let mut pool: Vec<BytesMut> = (0..BATCH)
            .map(|_| BytesMut::with_capacity(SEND_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM))
            .collect();
        let mut out = BytesMut::with_capacity(BATCH * 2048);

        group.bench_function(format!("seal_batch/{cipher}"), |b| {
            b.iter(|| {
                for pkt in &mut pool {
                    pkt.clear();
                    pkt.reserve(SEND_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM);
                    pkt.resize(SEND_HEADROOM, 0);
                    pkt.extend_from_slice(&payload);
                    pair.client
                        .send_tun_packet(now, pkt, SEND_HEADROOM)
                        .unwrap();
                    out.extend_from_slice(pkt);
                }
                out.clear();
            })
        });

        // Opening needs fresh packet ids: seal one batch into a stream untimed, then time
        // cutting it into frames and opening them.
        let decoder = FrameDecoder::new();
        let mut stream = BytesMut::with_capacity(BATCH * 2048);
        group.bench_function(format!("open_batch/{cipher}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    stream.clear();
                    for pkt in &mut pool {
                        pkt.clear();
                        pkt.reserve(SEND_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM);
                        pkt.resize(SEND_HEADROOM, 0);
                        pkt.extend_from_slice(&payload);
                        pair.client
                            .send_tun_packet(now, pkt, SEND_HEADROOM)
                            .unwrap();
                        stream.extend_from_slice(pkt);
                    }
                    let start = Instant::now();
                    while let Some(frame) = decoder.decode(&mut stream).unwrap() {
                        let opened = pair.server.handle_packet(now, frame).unwrap();
                        assert!(opened.is_some());
                    }
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
