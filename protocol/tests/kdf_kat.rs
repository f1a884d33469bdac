//! Known-answer tests for the data-channel key derivation (reference sections 7.1 and 7.3),
//! plus vectors computed independently with the `openssl kdf` CLI (OpenSSL 3.0.19).

use protocol::ids::SessionId;
use protocol::kdf::{
    check_key2, key2_from_exporter, key_expansion, master_secret, tls1_prf, EXPORT_KEY_DATA_LABEL,
    EXPORT_KEY_DATA_LEN, KEY_EXPANSION_LABEL, MASTER_SECRET_LABEL,
};
use protocol::key::{Role, KEY2_LEN};

fn counting<const N: usize>(start: u8) -> [u8; N] {
    std::array::from_fn(|i| start.wrapping_add(i as u8))
}

fn unhex<const N: usize>(s: &str) -> [u8; N] {
    let v = hex::decode(s.replace([' ', '\n'], "")).expect("hex");
    v.try_into().expect("length")
}

// ---------------------------------------------------------------------------------------------
// Reference 7.1: pre_master 00..2f, client random1 40..5f, server random1 60..7f,
// client random2 80..9f, server random2 a0..bf, client sid 0102030405060708,
// server sid 1112131415161718.

const REF_MASTER: &str = "0520ed5bef47cd2c1a5bc0e84254a42563fd7fd5caf5ccac49be59e7a71461ae\
                          9c6876df8467a4fa34cbe95fdc22977f";

const REF_KEY2: &str = "\
    72344b92208ff03a1063f3bc96b0a052e478e56bfe3de63672fabdb19acbde84\
    6671acec1e358df4b30d46ec758398b110232f683dddfccfb992d4c341682662\
    8078818a396e6c222bd16d65c400cce8c13c97b2ace38716562bb30a43f275ca\
    8211118ee10a6f38188be544f05b4ee7a8049af230228dfd33aeadc80850ea82\
    2e5835792c6cb49bffad1c65ba31a8e66bc8b81a8c8213d5c452260b2930370a\
    12f0dee1abeaad6a2afce33771fb4cb55d61ce3fee4a7f04082d31a8e3b430f0\
    863e112df3c18ad32a12116f29b23d8e565d4e074ce2e9195b03047913a552df\
    81dc3cae2698fc6110b61065a0eba3caa61c59ab43f193882de4d733a30399ac";

fn reference_key2() -> protocol::key::Key2 {
    let master = master_secret(&counting(0x00), &counting(0x40), &counting(0x60));
    key_expansion(
        &master,
        &counting(0x80),
        &counting(0xa0),
        SessionId([1, 2, 3, 4, 5, 6, 7, 8]),
        SessionId([0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]),
    )
}

#[test]
fn reference_master_secret() {
    let master = master_secret(&counting(0x00), &counting(0x40), &counting(0x60));
    assert_eq!(hex::encode(master), REF_MASTER);
}

#[test]
fn reference_key_block_all_256_bytes() {
    let key2 = reference_key2();
    assert_eq!(hex::encode(key2.to_bytes()), REF_KEY2);
    assert!(check_key2(&key2, 32).is_ok());
}

#[test]
fn reference_directional_slices() {
    let key2 = reference_key2();

    // Client: sends with key[0], receives with key[1].
    let (c_send, c_recv) = key2.split(Role::Client.data_direction());
    assert_eq!(
        hex::encode(&c_send.cipher[..32]),
        "72344b92208ff03a1063f3bc96b0a052e478e56bfe3de63672fabdb19acbde84"
    );
    assert_eq!(hex::encode(&c_send.hmac[..8]), "8078818a396e6c22");
    assert_eq!(
        hex::encode(&c_recv.cipher[..32]),
        "2e5835792c6cb49bffad1c65ba31a8e66bc8b81a8c8213d5c452260b2930370a"
    );
    assert_eq!(hex::encode(&c_recv.hmac[..8]), "863e112df3c18ad3");
    // CBC: HMAC-SHA1 keys are the first 20 bytes of the HMAC slots.
    assert_eq!(
        hex::encode(&c_send.hmac[..20]),
        "8078818a396e6c222bd16d65c400cce8c13c97b2"
    );

    // Server: the mirror image.
    let (s_send, s_recv) = key2.split(Role::Server.data_direction());
    assert_eq!(s_send, c_recv);
    assert_eq!(s_recv, c_send);
}

// ---------------------------------------------------------------------------------------------
// Independent vector (different inputs), computed with OpenSSL 3.0.19:
//
//   PM=d0d1d2...ff                      # 48 bytes 0xd0..=0xff
//   CR1=00070e15...                     # 32 bytes, byte i = 7*i mod 256
//   SR1=05121f2c...                     # 32 bytes, byte i = 13*i + 5 mod 256
//   LBL=$(printf 'OpenVPN master secret' | xxd -p -c 100)
//   openssl kdf -keylen 48 -kdfopt digest:MD5-SHA1 -kdfopt hexsecret:$PM \
//       -kdfopt hexseed:$LBL$CR1$SR1 TLS1-PRF
//
//   M=<the 48 bytes above>
//   CR2=fffefd...e0                     # 32 bytes, byte i = 0xff - i
//   SR2=202326...7d                     # 32 bytes, byte i = 0x20 + 3*i
//   LBL=$(printf 'OpenVPN key expansion' | xxd -p -c 100)
//   openssl kdf -keylen 256 -kdfopt digest:MD5-SHA1 -kdfopt hexsecret:$M \
//       -kdfopt hexseed:${LBL}${CR2}${SR2}a1a2a3a4a5a6a7a8b1b2b3b4b5b6b7b8 TLS1-PRF

const OSSL_MASTER: &str = "58a8d903e2e18ac78d7b636381dc81c59a8f1988f34d75d74ff2258cc698b151\
                           2cf9230a6ffa39f1781318caaf848c6b";

const OSSL_KEY2: &str = "\
    54ab9bf82b8b7ed2e3abb9a117a6d6208456ee696a904b6a11bc05c22e9618ba\
    8f28b53e47485a989486f6063f1c58f772198d8d5cde12937ecb3bb6bb2abdb0\
    1aae20910c8664e7dbd1de7518151eeb710e3af733eb95a0cfe603e249e3ec9a\
    a9a213b36f07785a0763e81b889077d6054b692f727e61e21043ffe1b42e92ed\
    8434f999b3788f205890dadcd1462914b96a24275ca4d1bda375450282e6bd82\
    20570d9af9381fb72a96b820f098fc69bd7b6482ca02fe019fb7125f719269e9\
    be4886d6b69a473f98b810c6cf85ccf23d54e1cc46bf25594a0516da9d0a6e2b\
    faa880eb6538ef8db6819911d5b58f5f30373dc1163af05ab7391f210bb31e87";

#[test]
fn openssl_vector_master_and_key_block() {
    let pre_master: [u8; 48] = counting(0xd0);
    let cr1: [u8; 32] = std::array::from_fn(|i| (7 * i) as u8);
    let sr1: [u8; 32] = std::array::from_fn(|i| (13 * i + 5) as u8);
    let master = master_secret(&pre_master, &cr1, &sr1);
    assert_eq!(hex::encode(master), OSSL_MASTER);

    let cr2: [u8; 32] = std::array::from_fn(|i| 0xff - i as u8);
    let sr2: [u8; 32] = std::array::from_fn(|i| 0x20 + 3 * i as u8);
    let key2 = key_expansion(
        &master,
        &cr2,
        &sr2,
        SessionId(unhex("a1a2a3a4a5a6a7a8")),
        SessionId(unhex("b1b2b3b4b5b6b7b8")),
    );
    assert_eq!(hex::encode(key2.to_bytes()), OSSL_KEY2);
}

// Odd-length secret (the two halves share the middle byte), computed with OpenSSL 3.0.19:
//
//   openssl kdf -keylen 40 -kdfopt digest:MD5-SHA1 \
//       -kdfopt secret:0123456789abcdef0123456789abcdefX -kdfopt seed:odd-length-secret TLS1-PRF
#[test]
fn openssl_vector_odd_length_secret() {
    let mut out = [0u8; 40];
    tls1_prf(
        b"0123456789abcdef0123456789abcdefX",
        &[b"odd-length-", b"secret"],
        &mut out,
    );
    assert_eq!(
        hex::encode(out),
        "8e04c6b6381c34d11bedb20ec7264b0812a201233321157e0e074f82f5d3c34739acf6c57e775976"
    );
}

#[test]
fn labels_and_exporter_mapping() {
    assert_eq!(MASTER_SECRET_LABEL, b"OpenVPN master secret");
    assert_eq!(KEY_EXPANSION_LABEL, b"OpenVPN key expansion");
    assert_eq!(EXPORT_KEY_DATA_LABEL, "EXPORTER-OpenVPN-datakeys");
    assert_eq!(EXPORT_KEY_DATA_LEN, KEY2_LEN);

    // The exporter's 256 bytes are the key block verbatim, in the same layout as the PRF's.
    let ekm: [u8; 256] = unhex(REF_KEY2);
    assert_eq!(key2_from_exporter(&ekm), reference_key2());
    let key2 = key2_from_exporter(&ekm);
    let (send, _) = key2.split(Role::Server.data_direction());
    assert_eq!(send.cipher[..4], [0x2e, 0x58, 0x35, 0x79]);
}
