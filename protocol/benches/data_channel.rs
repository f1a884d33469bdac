//! Data-channel throughput: encrypt and decrypt of 1400-byte payloads in place, per cipher
//! (CBC with HMAC-SHA256). Run with `cargo bench -p protocol --bench data_channel`.
//!
//! Buffers are reused as a driver with a buffer pool does: encrypt resets its buffer to
//! headroom + payload and seals it; decrypt opens packets sealed (untimed) just before, since
//! the replay window refuses a repeated packet id.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use protocol::data::{DataCipher, DataKey, DataKeyParams, DATA_HEADROOM, DATA_TAILROOM};
use protocol::digest::Digest;
use protocol::ids::PeerId;
use protocol::key::{Key2, Role, KEY2_LEN};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

const PAYLOAD_LEN: usize = 1400;
/// Packets sealed (untimed) per round of the decrypt bench.
const DECRYPT_CHUNK: usize = 256;

fn keys(cipher: DataCipher) -> (DataKey, DataKey) {
    let bytes: [u8; KEY2_LEN] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
    let k = Key2::from_bytes(&bytes);
    let params = DataKeyParams {
        auth: Digest::Sha256,
        peer_id: PeerId::new(0),
        ..DataKeyParams::new(cipher)
    };
    let client = DataKey::from_key2(&params, &k, Role::Client).expect("client key");
    let server = DataKey::from_key2(&params, &k, Role::Server).expect("server key");
    (client, server)
}

fn bench(c: &mut Criterion) {
    let payload = vec![0xa5u8; PAYLOAD_LEN];
    let mut group = c.benchmark_group("data_channel");
    group.throughput(Throughput::Bytes(PAYLOAD_LEN as u64));
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for cipher in DataCipher::ALL {
        let (mut client, mut server) = keys(cipher);
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let mut buf = BytesMut::with_capacity(DATA_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM);

        group.bench_function(format!("encrypt/{cipher}"), |b| {
            b.iter(|| {
                // Reclaims the same allocation each time (the advanced-past headroom).
                buf.clear();
                buf.reserve(DATA_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM);
                buf.resize(DATA_HEADROOM, 0);
                buf.extend_from_slice(&payload);
                client
                    .encrypt(&mut buf, DATA_HEADROOM, &mut rng)
                    .expect("encrypt");
                // The packet id would run out after 2^32 packets; never near in a bench.
            })
        });

        // Decrypt needs fresh packet ids (the replay window refuses repeats): seal a chunk of
        // packets untimed, then time opening them, with one receiver throughout.
        let mut chunk: Vec<BytesMut> = (0..DECRYPT_CHUNK)
            .map(|_| BytesMut::with_capacity(DATA_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM))
            .collect();
        group.bench_function(format!("decrypt/{cipher}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(DECRYPT_CHUNK as u64) as usize;
                    for pkt in &mut chunk[..n] {
                        pkt.clear();
                        pkt.reserve(DATA_HEADROOM + PAYLOAD_LEN + DATA_TAILROOM);
                        pkt.resize(DATA_HEADROOM, 0);
                        pkt.extend_from_slice(&payload);
                        client
                            .encrypt(pkt, DATA_HEADROOM, &mut rng)
                            .expect("encrypt");
                    }
                    let start = Instant::now();
                    for pkt in &mut chunk[..n] {
                        server.decrypt(pkt, 0).expect("decrypt");
                    }
                    total += start.elapsed();
                    left -= n as u64;
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
