#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)
//! Known-answer tests for the data channel: the reference's packets (8.2, 8.3) and
//! independent vectors computed with Python's `cryptography` package.

use bytes::BytesMut;
use protocol::data::{DataCipher, DataKey, DataKeyParams, DATA_HEADROOM, PING_MAGIC};
use protocol::digest::Digest;
use protocol::ids::{KeyId, PeerId};
use protocol::key::{Key2, Role};
use rand_core::{CryptoRng, RngCore};

/// The key2 block of the reference's PRF known-answer test (7.1).
const KEY2_HEX: &str = concat!(
    "72344b92208ff03a1063f3bc96b0a052e478e56bfe3de63672fabdb19acbde84",
    "6671acec1e358df4b30d46ec758398b110232f683dddfccfb992d4c341682662",
    "8078818a396e6c222bd16d65c400cce8c13c97b2ace38716562bb30a43f275ca",
    "8211118ee10a6f38188be544f05b4ee7a8049af230228dfd33aeadc80850ea82",
    "2e5835792c6cb49bffad1c65ba31a8e66bc8b81a8c8213d5c452260b2930370a",
    "12f0dee1abeaad6a2afce33771fb4cb55d61ce3fee4a7f04082d31a8e3b430f0",
    "863e112df3c18ad32a12116f29b23d8e565d4e074ce2e9195b03047913a552df",
    "81dc3cae2698fc6110b61065a0eba3caa61c59ab43f193882de4d733a30399ac",
);

fn key2() -> Key2 {
    let bytes: [u8; 256] = hex::decode(KEY2_HEX).unwrap().try_into().unwrap();
    Key2::from_bytes(&bytes)
}

/// An "RNG" that hands out fixed bytes, so the CBC IV of a known-answer packet is chosen.
struct FixedBytes(Vec<u8>);

impl RngCore for FixedBytes {
    fn next_u32(&mut self) -> u32 {
        unimplemented!("only fill_bytes is used")
    }
    fn next_u64(&mut self) -> u64 {
        unimplemented!("only fill_bytes is used")
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        assert_eq!(dest.len(), self.0.len(), "IV length");
        dest.copy_from_slice(&self.0);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

// Only for known-answer tests: the "randomness" is deliberately fixed.
impl CryptoRng for FixedBytes {}

fn params(cipher: DataCipher, digest: Option<Digest>, header: &[u8]) -> DataKeyParams {
    let mut p = DataKeyParams::new(cipher);
    if let Some(d) = digest {
        p.auth = d;
    }
    p.key_id = KeyId::from_opcode_byte(header[0]);
    if header[0] >> 3 == 9 {
        p.peer_id = PeerId::new(u32::from_be_bytes([0, header[1], header[2], header[3]]));
    }
    p
}

/// Encrypts `payload` as `sender` (after `packet_id - 1` packets) and checks the wire bytes,
/// then decrypts them as the other side and checks the payload comes back.
fn check(
    cipher: DataCipher,
    digest: Option<Digest>,
    sender: Role,
    packet_id: u32,
    iv: &str,
    payload: &[u8],
    wire_hex: &str,
) {
    let wire = hex::decode(wire_hex).unwrap();
    let p = params(cipher, digest, &wire);
    let k2 = key2();
    let mut tx = DataKey::from_key2(&p, &k2, sender).unwrap();
    let receiver = match sender {
        Role::Client => Role::Server,
        Role::Server => Role::Client,
    };
    let mut rx = DataKey::from_key2(&p, &k2, receiver).unwrap();
    tx.skip_send_packet_ids(packet_id - 1);

    let mut buf = BytesMut::new();
    buf.resize(DATA_HEADROOM, 0);
    buf.extend_from_slice(payload);
    let mut rng = FixedBytes(hex::decode(iv).unwrap());
    let used = tx.encrypt(&mut buf, DATA_HEADROOM, &mut rng).unwrap();
    assert_eq!(used, packet_id);
    assert_eq!(hex::encode(&buf), wire_hex, "{cipher} encrypt");

    let mut rbuf = BytesMut::from(&wire[..]);
    assert_eq!(rx.decrypt(&mut rbuf, 0).unwrap(), packet_id);
    assert_eq!(&rbuf[..], payload, "{cipher} decrypt");
}

// Reference 8.2: AES-256-GCM, client -> server, key id 0, packet id 1, payload = ping magic.
const REF_GCM_V2: &str = "4800000000000001\
                          4ddcf213f26cc179ffc3df0884071e53fd78e65dcb492030d67aa08a3d3d14e8";
const REF_GCM_V1: &str = "3000000001\
                          6f4aedb8696698dd683c0f9e2b8e04ccfd78e65dcb492030d67aa08a3d3d14e8";
// Reference 8.3: AES-256-CBC + SHA1, client -> server, IV f0..ff, packet id 1, ping magic.
const REF_CBC_SHA1_V2: &str = "48000000\
                               59fe4f19ab45b164bb006a50816b46c2e7f18b03\
                               f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff\
                               7bdb80653fd02df2110810bd2864f6f63475011019c6a1dde2551bcab1c1c5f2";

#[test]
fn reference_aes_256_gcm_p_data_v2() {
    let wire = REF_GCM_V2;
    assert_eq!(wire.len() / 2, 40, "a ping is 40 bytes on the wire");
    check(
        DataCipher::Aes256Gcm,
        None,
        Role::Client,
        1,
        "",
        &PING_MAGIC,
        wire,
    );
}

#[test]
fn reference_aes_256_gcm_p_data_v1() {
    check(
        DataCipher::Aes256Gcm,
        None,
        Role::Client,
        1,
        "",
        &PING_MAGIC,
        REF_GCM_V1,
    );
}

#[test]
fn reference_aes_256_cbc_sha1() {
    check(
        DataCipher::Aes256Cbc,
        Some(Digest::Sha1),
        Role::Client,
        1,
        "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
        &PING_MAGIC,
        REF_CBC_SHA1_V2,
    );
}

/// An independently computed packet.
struct Vector {
    cipher: DataCipher,
    digest: Option<Digest>,
    sender: Role,
    packet_id: u32,
    iv: &'static str,
    payload: &'static str,
    wire: &'static str,
}

fn check_vector(v: &Vector) {
    check(
        v.cipher,
        v.digest,
        v.sender,
        v.packet_id,
        v.iv,
        &hex::decode(v.payload).unwrap(),
        v.wire,
    );
}

// The vectors below were printed by `python3 protocol/tests/data/gen_data_vectors.py`
// (Python 3, `cryptography` 48: AESGCM, ChaCha20Poly1305, AES-CBC; stdlib `hmac`), from the
// key2 block above. That script first reproduces the reference packets as a self-check.

/// AES-128-GCM, client->server, P_DATA_V2 key_id 2 peer_id 0x123456, pid 0x01020304, 100-byte payload
const AES_128_GCM_V2: Vector = Vector {
    cipher: DataCipher::Aes128Gcm,
    digest: None,
    sender: Role::Client,
    packet_id: 0x1020304,
    iv: "",
    payload: "030a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dce3eaf1f8ff060d141b222930373e454c535a61686f767d848b9299a0a7aeb5bcc3cad1d8dfe6edf4fb020910171e252c333a41484f565d646b727980878e959ca3aab1b8",
    wire: "4a123456010203041acd88eb50d321bd07b0253871182751e3ef7b3f496cbd4673020e359c9d13bc443a317c1c8ea8dc839b9e354d86b6e8cb2353e482e0fd705e737952ed9858d35b318d9c52062f918914f83f3d066a8118e2e72c55675f61c8d6afd38fa423fcb2937d5e18134c058165c864251d26071821196d",
};

/// CHACHA20-POLY1305, server->client, P_DATA_V1 key_id 1, pid 7, 47-byte payload
const CHACHA20_POLY1305_V1: Vector = Vector {
    cipher: DataCipher::ChaCha20Poly1305,
    digest: None,
    sender: Role::Server,
    packet_id: 0x7,
    iv: "",
    payload: "010e1b2835424f5c697683909daab7c4d1deebf805121f2c394653606d7a8794a1aebbc8d5e2effc091623303d4a57",
    wire: "31000000071188e7bba87b8404bb692d8ffa783fc8241e1792ad575cee668339abaf6b138bbff9f8e7b50ca84e3f3d07acd1bd8d9a33875a7f454a4506de86f4915ee1be",
};

/// AES-256-CBC + SHA256, server->client, P_DATA_V2 key_id 0 peer_id 5, pid 2, 100-byte payload, IV 00..0f
const AES_256_CBC_SHA256_V2: Vector = Vector {
    cipher: DataCipher::Aes256Cbc,
    digest: Some(Digest::Sha256),
    sender: Role::Server,
    packet_id: 0x2,
    iv: "000102030405060708090a0b0c0d0e0f",
    payload: "030a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dce3eaf1f8ff060d141b222930373e454c535a61686f767d848b9299a0a7aeb5bcc3cad1d8dfe6edf4fb020910171e252c333a41484f565d646b727980878e959ca3aab1b8",
    wire: "480000056222e39e6b4c0c3326e6890d79681c3d712f8777bbbf6583c9f2f72db66b2c56000102030405060708090a0b0c0d0e0fbe8e61780d8959e0cde9c12ed8d28d4db116361bbb3e4fafbd2ec32f551af735a6d1d8af29bd9998043911e453d8f861f78da552612317b3f106c4a2cd08bf613282bbba17c96b8010bdb6cd434590e6a321cc0c90aa0b09ef803c63c933d355aec070f9b604c1aa2e07c62f552b06b7",
};

/// AES-128-CBC + SHA512, client->server, P_DATA_V1 key_id 7, pid 0xfeffffff, 47-byte payload, IV 00..0f
const AES_128_CBC_SHA512_V1: Vector = Vector {
    cipher: DataCipher::Aes128Cbc,
    digest: Some(Digest::Sha512),
    sender: Role::Client,
    packet_id: 0xfeffffff,
    iv: "000102030405060708090a0b0c0d0e0f",
    payload: "010e1b2835424f5c697683909daab7c4d1deebf805121f2c394653606d7a8794a1aebbc8d5e2effc091623303d4a57",
    wire: "37eeb21c8a6b65174bc5b29428c11f4f583ec471183a5634ec54ef096a1faed55e3ad49bef499a57e6a7894ec62b3d7bed69030d84080201a1571ac9a7e4497eb1000102030405060708090a0b0c0d0e0fd72f0a90da2b146d6776eb7226164631a6789fec369336f4d0492ef740a609763d44f9f040752440dd1a0d6eabbef2ad99420e9d48324a475919e7f49b705127",
};

#[test]
fn independent_aes_128_gcm() {
    check_vector(&AES_128_GCM_V2);
}

#[test]
fn independent_chacha20_poly1305() {
    check_vector(&CHACHA20_POLY1305_V1);
}

#[test]
fn independent_aes_256_cbc_sha256() {
    check_vector(&AES_256_CBC_SHA256_V2);
}

#[test]
fn independent_aes_128_cbc_sha512() {
    check_vector(&AES_128_CBC_SHA512_V1);
}
