#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)
//! Behaviour of the data channel through its public API: round trips for every cipher in both
//! directions, tampering, replays, key ids, packet-id exhaustion, compression framing, pings,
//! and the in-place (no allocation) contract.

use bytes::BytesMut;
use protocol::data::{
    classify, ping_payload, Compression, DataCipher, DataError, DataHeader, DataKey, DataKeyParams,
    OccOp, PacketIdLimits, PayloadKind, DATA_HEADROOM, DATA_TAILROOM, OCC_MAGIC, PACKET_ID_MAX,
    PACKET_ID_WRAP_TRIGGER, PING_MAGIC,
};
use protocol::digest::Digest;
use protocol::ids::{KeyId, PeerId};
use protocol::key::{Key2, Role, KEY2_LEN};
use protocol::packet_id::ReplayError;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

fn key2(seed: u8) -> Key2 {
    let bytes: [u8; KEY2_LEN] = std::array::from_fn(|i| (i as u8).wrapping_mul(31) ^ seed);
    Key2::from_bytes(&bytes)
}

/// Every cipher configuration: the AEADs, and CBC with each digest.
fn suites() -> Vec<(DataCipher, Digest)> {
    let mut v = Vec::new();
    for c in DataCipher::ALL {
        if c.is_aead() {
            v.push((c, Digest::Sha1));
        } else {
            for d in [Digest::Sha1, Digest::Sha256, Digest::Sha512] {
                v.push((c, d));
            }
        }
    }
    v
}

fn params(cipher: DataCipher, auth: Digest, peer_id: Option<PeerId>) -> DataKeyParams {
    DataKeyParams {
        auth,
        peer_id,
        ..DataKeyParams::new(cipher)
    }
}

fn pair(p: &DataKeyParams) -> (DataKey, DataKey) {
    let k = key2(7);
    (
        DataKey::from_key2(p, &k, Role::Client).unwrap(),
        DataKey::from_key2(p, &k, Role::Server).unwrap(),
    )
}

fn with_headroom(payload: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(DATA_HEADROOM + payload.len() + DATA_TAILROOM);
    buf.resize(DATA_HEADROOM, 0);
    buf.extend_from_slice(payload);
    buf
}

fn seal(key: &mut DataKey, payload: &[u8], rng: &mut ChaCha20Rng) -> BytesMut {
    let mut buf = with_headroom(payload);
    key.encrypt(&mut buf, DATA_HEADROOM, rng).unwrap();
    buf
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 1) as u8).collect()
}

#[test]
fn round_trip_every_cipher_both_directions() {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    for (cipher, auth) in suites() {
        for peer_id in [None, PeerId::new(0xabcdef)] {
            let p = params(cipher, auth, peer_id);
            let (mut client, mut server) = pair(&p);
            let lens = (0..=40).chain([1400, 1500]);
            for (n, len) in lens.enumerate() {
                let data = payload(len);
                let id = n as u32 + 1;
                for client_sends in [true, false] {
                    let (tx, rx) = if client_sends {
                        (&mut client, &mut server)
                    } else {
                        (&mut server, &mut client)
                    };
                    let mut buf = seal(tx, &data, &mut rng);
                    let header = DataHeader::parse(&buf).unwrap();
                    assert_eq!(header.peer_id(), peer_id);
                    assert_eq!(header.len(), if peer_id.is_some() { 4 } else { 1 });
                    assert_eq!(rx.decrypt(&mut buf, 0).unwrap(), id, "{cipher} {auth:?}");
                    assert_eq!(&buf[..], &data[..], "{cipher} {auth:?} len {len}");
                }
            }
        }
    }
}

#[test]
fn wire_sizes() {
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    let v2 = PeerId::new(0);
    let (mut c, _) = pair(&params(DataCipher::Aes256Gcm, Digest::Sha1, v2));
    // Reference 8.2: a ping is 4 + 4 + 16 + 16 = 40 bytes.
    assert_eq!(seal(&mut c, &PING_MAGIC, &mut rng).len(), 40);
    // Reference 8.3: 116 bytes for a 56-byte packet (with a 1-byte 0xFA stub) and SHA256.
    let (mut c, _) = pair(&params(DataCipher::Aes256Cbc, Digest::Sha256, v2));
    let mut buf = with_headroom(&payload(56));
    let off = Compression::LzoStub.frame(&mut buf, DATA_HEADROOM);
    c.encrypt(&mut buf, off, &mut rng).unwrap();
    assert_eq!(buf.len(), 116);
}

#[test]
fn no_allocation_with_headroom() {
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    for (cipher, auth) in suites() {
        let (mut c, mut s) = pair(&params(cipher, auth, PeerId::new(1)));
        let mut buf = with_headroom(&payload(1400));
        let base = buf.as_ptr() as usize;
        let end = base + buf.capacity();
        let off = Compression::StubSwap.frame(&mut buf, DATA_HEADROOM);
        c.encrypt(&mut buf, off, &mut rng).unwrap();
        let start = buf.as_ptr() as usize;
        assert_eq!(start, base + DATA_HEADROOM - c.headroom(), "{cipher}");
        assert!(
            start + buf.len() <= end,
            "{cipher}: grew past the allocation"
        );
        s.decrypt(&mut buf, 0).unwrap();
        Compression::StubSwap.unframe(&mut buf).unwrap();
        assert!(buf.as_ptr() as usize >= base && buf.as_ptr() as usize + buf.len() <= end);
        assert_eq!(&buf[..], &payload(1400)[..]);
    }
}

#[test]
fn too_little_headroom_still_works() {
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    for (cipher, auth) in suites() {
        let (mut c, mut s) = pair(&params(cipher, auth, None));
        let data = payload(33);
        let mut buf = BytesMut::from(&data[..]);
        let off = Compression::StubV2.frame(&mut buf, 0);
        c.encrypt(&mut buf, off, &mut rng).unwrap();
        s.decrypt(&mut buf, 0).unwrap();
        assert_eq!(&buf[..], &data[..]);
    }
}

#[test]
fn every_bit_flip_is_rejected() {
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    for (cipher, auth) in suites() {
        for peer_id in [None, PeerId::new(0x010203)] {
            let (mut c, mut s) = pair(&params(cipher, auth, peer_id));
            let wire = seal(&mut c, &payload(37), &mut rng);
            for bit in 0..wire.len() * 8 {
                let mut bad = wire.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                // The CBC HMAC does not cover the header: a changed peer id goes unnoticed
                // (reference 8.3), exactly as with upstream.
                let unauthenticated_peer_id =
                    !cipher.is_aead() && peer_id.is_some() && (1..4).contains(&(bit / 8));
                if unauthenticated_peer_id {
                    let (_, mut fresh) = pair(&params(cipher, auth, peer_id));
                    fresh.decrypt(&mut bad, 0).unwrap();
                    continue;
                }
                let err = s
                    .decrypt(&mut bad, 0)
                    .expect_err("tampered packet accepted");
                assert!(
                    matches!(
                        err,
                        DataError::AuthFailed { .. }
                            | DataError::NotData { .. }
                            | DataError::KeyIdMismatch { .. }
                            | DataError::BadLength { .. }
                    ),
                    "{cipher} bit {bit}: {err:?}"
                );
            }
            // Rejected packets leave no trace in the replay window.
            let mut ok = wire.clone();
            s.decrypt(&mut ok, 0).unwrap();
            assert_eq!(&ok[..], &payload(37)[..]);
        }
    }
}

#[test]
fn replay_is_rejected_and_fatal() {
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    for (cipher, auth) in suites() {
        let (mut c, mut s) = pair(&params(cipher, auth, PeerId::new(3)));
        let wire = seal(&mut c, b"hello", &mut rng);
        s.decrypt(&mut wire.clone(), 0).unwrap();
        let err = s.decrypt(&mut wire.clone(), 0).unwrap_err();
        assert!(matches!(
            err,
            DataError::Replay(ReplayError::Replayed { id: 1 })
        ));
        assert!(err.is_fatal());
    }
}

#[test]
fn replay_window_is_configurable() {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let mut p = params(DataCipher::Aes128Gcm, Digest::Sha1, None);
    p.replay_window = 4;
    let (mut c, mut s) = pair(&p);
    let packets: Vec<BytesMut> = (0..10).map(|_| seal(&mut c, b"x", &mut rng)).collect();
    for i in [0, 1, 2, 3, 4, 7, 8, 9] {
        s.decrypt(&mut packets[i].clone(), 0).unwrap();
    }
    // Id 7 is 3 behind 10: inside a window of 4; id 6 is not.
    s.decrypt(&mut packets[6].clone(), 0).unwrap();
    assert!(matches!(
        s.decrypt(&mut packets[5].clone(), 0),
        Err(DataError::Replay(ReplayError::TooOld { id: 6, .. }))
    ));
}

#[test]
fn wrong_key_id_is_a_silent_drop() {
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let k = key2(9);
    let p0 = params(DataCipher::Aes256Gcm, Digest::Sha1, PeerId::new(0));
    let p1 = DataKeyParams {
        key_id: KeyId::new(1).unwrap(),
        ..p0
    };
    let mut c0 = DataKey::from_key2(&p0, &k, Role::Client).unwrap();
    let mut s1 = DataKey::from_key2(&p1, &k, Role::Server).unwrap();
    let mut wire = seal(&mut c0, b"data", &mut rng);
    assert_eq!(DataHeader::parse(&wire).unwrap().key_id().get(), 0);
    let err = s1.decrypt(&mut wire, 0).unwrap_err();
    assert!(matches!(
        err,
        DataError::KeyIdMismatch {
            got: 0,
            expected: 1
        }
    ));
    assert!(!err.is_fatal());
}

#[test]
fn packet_id_roll_over() {
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    for (cipher, auth) in suites() {
        let (mut c, mut s) = pair(&params(cipher, auth, None));
        assert_eq!(c.last_sent_packet_id(), 0);
        c.skip_send_packet_ids(PACKET_ID_WRAP_TRIGGER - 2);
        assert!(!c.wants_renegotiation());
        let mut w = seal(&mut c, b"a", &mut rng);
        assert_eq!(s.decrypt(&mut w, 0).unwrap(), PACKET_ID_WRAP_TRIGGER - 1);
        assert!(!c.wants_renegotiation());
        seal(&mut c, b"b", &mut rng);
        assert!(c.wants_renegotiation());
        // Never backwards.
        c.skip_send_packet_ids(5);
        assert_eq!(c.last_sent_packet_id(), PACKET_ID_WRAP_TRIGGER);

        c.skip_send_packet_ids(PACKET_ID_MAX - 1);
        let mut w = seal(&mut c, b"last", &mut rng);
        assert_eq!(s.decrypt(&mut w, 0).unwrap(), PACKET_ID_MAX);
        let mut buf = with_headroom(b"refused");
        let err = c.encrypt(&mut buf, DATA_HEADROOM, &mut rng).unwrap_err();
        assert!(matches!(err, DataError::PacketIdExhausted));
        assert!(!err.is_fatal());
        assert_eq!(c.last_sent_packet_id(), PACKET_ID_MAX);
    }
}

#[test]
fn lowered_packet_id_limits_ask_for_renegotiation_and_stop_sending_early() {
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    for (cipher, auth) in suites() {
        let p = DataKeyParams {
            packet_ids: PacketIdLimits {
                wrap_trigger: 3,
                max: 5,
            },
            ..params(cipher, auth, None)
        };
        let (mut c, mut s) = pair(&p);
        for id in 1..=5 {
            assert_eq!(
                c.wants_renegotiation(),
                id > 3,
                "{cipher}: before packet {id}"
            );
            let mut w = seal(&mut c, b"x", &mut rng);
            assert_eq!(s.decrypt(&mut w, 0).unwrap(), id);
        }
        // Never a sixth packet id, never a wrap to 1: the packet is refused.
        let mut buf = with_headroom(b"refused");
        let err = c.encrypt(&mut buf, DATA_HEADROOM, &mut rng).unwrap_err();
        assert!(
            matches!(err, DataError::PacketIdExhausted),
            "{cipher}: {err:?}"
        );
        assert_eq!(c.last_sent_packet_id(), 5);
        assert!(c.wants_renegotiation());
    }
    assert_eq!(PacketIdLimits::default(), PacketIdLimits::UPSTREAM);
    assert_eq!(
        (
            PacketIdLimits::UPSTREAM.wrap_trigger,
            PacketIdLimits::UPSTREAM.max
        ),
        (PACKET_ID_WRAP_TRIGGER, PACKET_ID_MAX)
    );
}

#[test]
fn malformed_lengths_are_fatal() {
    let mut rng = ChaCha20Rng::seed_from_u64(10);
    for (cipher, auth) in suites() {
        let (mut c, mut s) = pair(&params(cipher, auth, PeerId::new(2)));
        let wire = seal(&mut c, &payload(20), &mut rng);
        for len in [0, 1, 3, 4, 8, 23] {
            let mut short = BytesMut::from(&wire[..len]);
            let err = s.decrypt(&mut short, 0).unwrap_err();
            assert!(err.is_fatal(), "{cipher} len {len}: {err:?}");
        }
        if !cipher.is_aead() {
            // Not a whole number of blocks.
            let mut cut = BytesMut::from(&wire[..wire.len() - 1]);
            assert!(matches!(
                s.decrypt(&mut cut, 0),
                Err(DataError::BadLength { .. })
            ));
        }
    }
}

#[test]
fn zero_key_is_refused() {
    let zero = Key2::from_bytes(&[0; KEY2_LEN]);
    let p = params(DataCipher::Aes256Gcm, Digest::Sha1, None);
    assert!(matches!(
        DataKey::from_key2(&p, &zero, Role::Client),
        Err(DataError::ZeroKey)
    ));
}

/// Encrypts `data` with `comp` framing, decrypts, and returns the plaintext as the receiver
/// sees it before unframing.
fn framed_plaintext(comp: Compression, data: &[u8]) -> Vec<u8> {
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let (mut c, mut s) = pair(&params(DataCipher::ChaCha20Poly1305, Digest::Sha1, None));
    let mut buf = with_headroom(data);
    let off = comp.frame(&mut buf, DATA_HEADROOM);
    c.encrypt(&mut buf, off, &mut rng).unwrap();
    s.decrypt(&mut buf, 0).unwrap();
    let plain = buf.to_vec();
    comp.unframe(&mut buf).unwrap();
    assert_eq!(&buf[..], data, "{comp:?}");
    plain
}

#[test]
fn compression_framing_both_ways() {
    let ip = [0x45, 0x00, 0x00, 0x14, 0xaa];
    assert_eq!(framed_plaintext(Compression::None, &ip), ip);
    assert_eq!(
        framed_plaintext(Compression::LzoStub, &ip),
        [0xfa, 0x45, 0x00, 0x00, 0x14, 0xaa]
    );
    assert_eq!(
        framed_plaintext(Compression::StubSwap, &ip),
        [0xfb, 0x00, 0x00, 0x14, 0xaa, 0x45]
    );
    assert_eq!(
        framed_plaintext(Compression::StubSwap, &[0x60]),
        [0xfb, 0x60]
    );
    assert_eq!(framed_plaintext(Compression::StubV2, &ip), ip);
    assert_eq!(
        framed_plaintext(Compression::StubV2, &[0x50, 0x01]),
        [0x50, 0x00, 0x50, 0x01]
    );
    // Pings go through the framing too (reference 8.6: `fa` + magic).
    let mut ping = framed_plaintext(Compression::LzoStub, &PING_MAGIC);
    assert_eq!(ping.remove(0), 0xfa);
    assert_eq!(ping, PING_MAGIC);
    for comp in [
        Compression::None,
        Compression::LzoStub,
        Compression::StubSwap,
        Compression::StubV2,
    ] {
        assert!(framed_plaintext(comp, &[]).is_empty());
    }
}

#[test]
fn compressed_payloads_are_droppable_errors() {
    let cases: [(Compression, &[u8], bool); 7] = [
        (Compression::LzoStub, &[0x66, 1, 2], true),
        (Compression::LzoStub, &[0x45, 1, 2], false),
        (Compression::StubSwap, &[0x69, 1, 2], true),
        (Compression::StubSwap, &[0x66, 1, 2], true),
        (Compression::StubSwap, &[0xfa, 1, 2], false),
        (Compression::StubV2, &[0x50, 0x01, 2], true),
        (Compression::StubV2, &[0x50, 0x07, 2], false),
    ];
    for (comp, plain, compressed) in cases {
        let mut buf = BytesMut::from(plain);
        let err = comp.unframe(&mut buf).unwrap_err();
        assert!(!err.is_fatal());
        assert_eq!(
            matches!(err, DataError::Compressed { .. }),
            compressed,
            "{comp:?} {plain:?}: {err:?}"
        );
    }
    let mut lone = BytesMut::from(&[0x50][..]);
    assert!(Compression::StubV2.unframe(&mut lone).is_err());
}

#[test]
fn ping_produce_and_recognise() {
    let mut rng = ChaCha20Rng::seed_from_u64(12);
    let (mut c, mut s) = pair(&params(DataCipher::Aes256Gcm, Digest::Sha1, PeerId::new(0)));
    let mut buf = ping_payload();
    let off = Compression::LzoStub.frame(&mut buf, DATA_HEADROOM);
    c.encrypt(&mut buf, off, &mut rng).unwrap();
    assert_eq!(buf.len(), 41);
    s.decrypt(&mut buf, 0).unwrap();
    Compression::LzoStub.unframe(&mut buf).unwrap();
    assert_eq!(classify(&buf), PayloadKind::Ping);

    assert_eq!(classify(&PING_MAGIC[..15]), PayloadKind::Packet);
    let mut seventeen = PING_MAGIC.to_vec();
    seventeen.push(0x00);
    assert_eq!(classify(&seventeen), PayloadKind::Packet);
    let mut occ = OCC_MAGIC.to_vec();
    occ.push(6);
    assert!(matches!(
        classify(&occ),
        PayloadKind::Occ(m) if m.op == OccOp::Exit && m.body.is_empty()
    ));
}
