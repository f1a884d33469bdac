//! The tun offloads' hot functions: a 64 KiB TCP super-packet read from the device cut into
//! its 45 segments (copy, headers, checksums), and a batch of 45 decrypted segments planned
//! into one merged write (every segment's checksum checked). Both run once per ~64 KiB that
//! crosses the tunnel. Run with `cargo bench -p netio --bench tun_offload`.

#![allow(clippy::unwrap_used)]

use std::io::IoSlice;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use netio::tun::gro::{Coalescer, MAX_WRITE_PARTS};
use netio::tun::gso::Segments;
use netio::tun::vnet::{VnetHdr, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4};

/// Payload of each segment (an MSS with timestamps on a 1500-byte MTU).
const MSS: usize = 1448;
/// Segments per super-packet (as many as fit 64 KiB).
const SEGMENTS: usize = 45;
/// IPv4 (20) and TCP with timestamps (32).
const HEADERS: usize = 52;

/// A super-packet as the kernel hands it over: one IPv4 + TCP header (checksums left to us)
/// and `SEGMENTS * MSS` bytes of payload.
fn super_packet() -> (VnetHdr, Vec<u8>) {
    let total = HEADERS + SEGMENTS * MSS;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    p[20..22].copy_from_slice(&40000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5201u16.to_be_bytes());
    p[24..28].copy_from_slice(&1000u32.to_be_bytes());
    p[28..32].copy_from_slice(&1u32.to_be_bytes());
    p[32] = 8 << 4;
    p[33] = 0x10;
    p[34..36].copy_from_slice(&502u16.to_be_bytes());
    p[40..52].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7]);
    for (i, b) in p[HEADERS..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let hdr = VnetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: HEADERS as u16,
        gso_size: MSS as u16,
        csum_start: 20,
        csum_offset: 16,
    };
    (hdr, p)
}

/// The super-packet's segments, as the peer decrypts them (valid checksums).
fn segments() -> Vec<BytesMut> {
    let (hdr, packet) = super_packet();
    let s = Segments::new(&hdr, &packet).unwrap();
    (0..s.len())
        .map(|i| {
            let mut b = BytesMut::new();
            s.append(i, &mut b);
            b
        })
        .collect()
}

fn split(c: &mut Criterion) {
    let (hdr, packet) = super_packet();
    let mut out = BytesMut::with_capacity(SEGMENTS * (HEADERS + MSS) * 2);
    let mut g = c.benchmark_group("tun_offload");
    g.throughput(Throughput::Bytes((SEGMENTS * MSS) as u64));
    g.bench_function("split 64 KiB into 45 segments", |b| {
        b.iter(|| {
            out.clear();
            let s = Segments::new(&hdr, &packet).unwrap();
            for i in 0..s.len() {
                s.append(i, &mut out);
            }
            assert_eq!(out.len(), SEGMENTS * (HEADERS + MSS));
        })
    });
    let batch = segments();
    let mut gro = Coalescer::with_capacity(64);
    g.bench_function("plan 45 segments into one write", |b| {
        b.iter_batched_ref(
            || batch.clone(),
            |packets| {
                gro.plan(packets);
                let mut parts = [IoSlice::new(&[]); MAX_WRITE_PARTS];
                let (_, n) = gro.write(0, packets, &mut parts);
                assert_eq!((gro.writes(), n), (1, SEGMENTS));
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, split);
criterion_main!(benches);
