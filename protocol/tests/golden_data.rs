//! Data packets from the real OpenVPN 2.6.14 captures (`tests/golden/`): every P_DATA_V2
//! packet, in both directions and on both key ids, decrypts with the keys the peers logged
//! (`keys.txt`: the AES-256-GCM cipher keys and, from the nonces, the implicit IVs) to a
//! keepalive ping or an IP packet, in order, and is refused with any single bit flipped.

#![allow(clippy::unwrap_used)] // Integration tests are not `cfg(test)`.

use bytes::BytesMut;
use protocol::data::{is_ping, DataCipher, DataHeader, DataKey, DataKeyParams};
use protocol::ids::{KeyId, PeerId};
use protocol::key::{Key, KEY_SLOT_LEN};

const CASES: [(&str, &str, &str, &str); 3] = [
    (
        "tls-auth-sha1",
        include_str!("golden/tls-auth-sha1/c2s.hex"),
        include_str!("golden/tls-auth-sha1/s2c.hex"),
        include_str!("golden/tls-auth-sha1/keys.txt"),
    ),
    (
        "tls-auth-sha256",
        include_str!("golden/tls-auth-sha256/c2s.hex"),
        include_str!("golden/tls-auth-sha256/s2c.hex"),
        include_str!("golden/tls-auth-sha256/keys.txt"),
    ),
    (
        "tls-crypt",
        include_str!("golden/tls-crypt/c2s.hex"),
        include_str!("golden/tls-crypt/s2c.hex"),
        include_str!("golden/tls-crypt/keys.txt"),
    ),
];

/// The hex after the last `": "` of a log line, whitespace removed.
fn hex_tail(line: &str) -> Vec<u8> {
    let tail: String = line
        .rsplit(": ")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    hex::decode(tail).unwrap()
}

/// The server's receive (`Incoming`, `DECRYPT`) or send (`Outgoing`, `ENCRYPT`) keys, one per
/// key generation that carried packets, in the order they were made: cipher key plus implicit
/// IV (the last 8 bytes of each logged nonce, which changes only with the key).
fn server_keys(keys: &str, incoming: bool) -> Vec<Key> {
    let (key_label, iv_label) = if incoming {
        ("Incoming Data Channel: CIPHER KEY", "DECRYPT IV")
    } else {
        ("Outgoing Data Channel: CIPHER KEY", "ENCRYPT IV")
    };
    let server = || keys.lines().filter(|l| l.starts_with("server:"));
    let ciphers: Vec<Vec<u8>> = server()
        .filter(|l| l.contains(key_label))
        .map(hex_tail)
        .collect();
    let mut ivs: Vec<Vec<u8>> = Vec::new();
    for nonce in server().filter(|l| l.contains(iv_label)).map(hex_tail) {
        let iv = nonce[4..].to_vec();
        if ivs.last() != Some(&iv) {
            ivs.push(iv);
        }
    }
    // A 2.6 peer keeps sending with the old key for a while after a soft reset, so the newest
    // send key may never have been used (no nonce logged for it).
    assert!(ivs.len() <= ciphers.len() && !ivs.is_empty());
    ciphers
        .iter()
        .zip(&ivs)
        .map(|(c, iv)| {
            let mut key = Key {
                cipher: [0; KEY_SLOT_LEN],
                hmac: [0; KEY_SLOT_LEN],
            };
            key.cipher[..32].copy_from_slice(c);
            key.hmac[..8].copy_from_slice(iv);
            key
        })
        .collect()
}

/// Decrypts every data packet of one direction; returns how many.
fn check_direction(name: &str, stream: &str, keys: &[Key]) -> usize {
    let mut contexts: Vec<DataKey> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let mut params = DataKeyParams::new(DataCipher::Aes256Gcm);
            params.key_id = KeyId::new(u8::try_from(i).unwrap()).unwrap();
            params.peer_id = PeerId::new(0);
            DataKey::new(&params, key, key).unwrap()
        })
        .collect();
    let (mut count, mut pings) = (0, 0);
    for line in stream.lines().filter(|l| !l.trim().is_empty()) {
        let wire = hex::decode(line.trim()).unwrap();
        let Ok(header) = DataHeader::parse(&wire) else {
            continue; // a control packet
        };
        assert_eq!(
            header.peer_id(),
            PeerId::new(0),
            "{name}: peer-id pushed as 0"
        );
        let ctx = &mut contexts[usize::from(header.key_id().get())];

        let mut bad = wire.clone();
        for bit in 0..wire.len() * 8 {
            bad[bit / 8] ^= 1 << (bit % 8);
            let mut buf = BytesMut::from(&bad[..]);
            assert!(
                ctx.decrypt(&mut buf, 0).is_err(),
                "{name}: bit {bit} flipped was accepted"
            );
            bad[bit / 8] ^= 1 << (bit % 8);
        }

        let mut buf = BytesMut::from(&wire[..]);
        ctx.decrypt(&mut buf, 0)
            .unwrap_or_else(|e| panic!("{name}: {line}: {e}"));
        assert!(
            is_ping(&buf) || is_ip_packet(&buf),
            "{name}: expected a keepalive ping or an IP packet, got {buf:x?}"
        );
        pings += usize::from(is_ping(&buf));
        count += 1;
    }
    assert!(pings >= 3, "{name}: only {pings} pings");
    count
}

/// An IPv4 or IPv6 packet whose length field matches its size (the tun devices of the capture
/// sent IPv6 router solicitations through the tunnel).
fn is_ip_packet(p: &[u8]) -> bool {
    match p.first().map(|b| b >> 4) {
        Some(4) => p.len() >= 20 && usize::from(u16::from_be_bytes([p[2], p[3]])) == p.len(),
        Some(6) => p.len() >= 40 && 40 + usize::from(u16::from_be_bytes([p[4], p[5]])) == p.len(),
        _ => false,
    }
}

#[test]
fn real_data_packets_decrypt_to_pings_and_refuse_bit_flips() {
    for (name, c2s, s2c, keys) in CASES {
        let incoming = server_keys(keys, true);
        let outgoing = server_keys(keys, false);
        assert_eq!(incoming.len(), 2, "{name}: keys for key id 0 and 1");
        let c = check_direction(name, c2s, &incoming);
        let s = check_direction(name, s2c, &outgoing);
        assert!(c >= 5 && s >= 5, "{name}: only {c} + {s} data packets");
        eprintln!("{name}: {c} + {s} data packets decrypted");
    }
}
