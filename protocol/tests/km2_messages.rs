//! Key-method-2 messages, peer-info and the OCC options string (reference 6).

use bytes::BytesMut;
use proptest::prelude::*;
use protocol::data::{Compression, DataCipher};
use protocol::digest::Digest;
use protocol::key::{KeyDirection, Role};
use protocol::km2::occ::{DevType, OccOptions, OccSettings};
use protocol::km2::peer_info::{IvProto, LineProblem, PeerInfo, IV_PROTO_DATA_V2};
use protocol::km2::{
    ClientKeyMethod2, KeySource, Km2Error, Km2Field, Malformed, ServerKeyMethod2, CLIENT_FIXED_LEN,
    PRE_MASTER_LEN, RANDOM_LEN, SERVER_FIXED_LEN, USER_PASS_LEN,
};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// The peer-info of a stock 2.6.14 Linux client with `client` (reference 6.2, observed).
const STOCK_PEER_INFO: &str = "IV_VER=2.6.14\nIV_PLAT=linux\nIV_TCPNL=1\nIV_MTU=1600\nIV_NCP=2\n\
IV_CIPHERS=AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305\nIV_PROTO=990\nIV_LZO_STUB=1\n\
IV_COMP_STUB=1\nIV_COMP_STUBv2=1\n";

/// The stock OCC strings (reference 6.3, observed).
const STOCK_CLIENT_OCC: &str = "V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client";
const STOCK_SERVER_OCC: &str = "V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_SERVER,keydir 0,auth SHA1,keysize 128,tls-auth,key-method 2,tls-server";

fn stock_peer_info() -> PeerInfo {
    PeerInfo::pull_client(
        "2.6.14",
        "linux",
        1600,
        &[
            DataCipher::Aes256Gcm,
            DataCipher::Aes128Gcm,
            DataCipher::ChaCha20Poly1305,
        ],
        IvProto::STOCK_2_6_CLIENT,
    )
}

fn rng() -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(0x6b6d32)
}

fn stock_client_message() -> ClientKeyMethod2 {
    ClientKeyMethod2 {
        key_source: KeySource::client(&mut rng()),
        options: STOCK_CLIENT_OCC.to_owned(),
        username: Some(b"alice".to_vec()),
        password: Some(b"secret123".to_vec()),
        peer_info: Some(stock_peer_info().to_text()),
    }
}

fn emit_client(m: &ClientKeyMethod2) -> Vec<u8> {
    let mut buf = BytesMut::new();
    m.emit(&mut buf).expect("valid message");
    assert_eq!(buf.len(), m.emitted_len());
    buf.to_vec()
}

fn emit_server(m: &ServerKeyMethod2) -> Vec<u8> {
    let mut buf = BytesMut::new();
    m.emit(&mut buf).expect("valid message");
    assert_eq!(buf.len(), m.emitted_len());
    buf.to_vec()
}

#[test]
fn stock_peer_info_text_is_reproduced() {
    assert_eq!(stock_peer_info().to_text(), STOCK_PEER_INFO);
    assert_eq!(STOCK_PEER_INFO.len() + 1, 173);
    let parsed = PeerInfo::parse(STOCK_PEER_INFO);
    assert!(parsed.malformed.is_empty());
    assert_eq!(parsed.info, stock_peer_info());
    assert_eq!(
        IvProto::STOCK_2_6_CLIENT.bits(),
        2 + 4 + 8 + 16 + 64 + 128 + 256 + 512
    );
}

/// OCC strings printed by the installed OpenVPN 2.6.14 at `--verb 9` ("Local Options String"
/// and "Expected Remote Options String"), from
/// `openvpn --client --proto tcp-client --remote 127.0.0.1 9 --nobind --ca ca.crt --cert c.crt
/// --key c.key --connect-retry-max 1 --verb 9 <ARGS>` (throwaway PKI; the connection to the
/// closed loopback port fails after the strings are logged). `ARGS` per case in the comment;
/// the second string is the expected server string.
#[test]
fn occ_strings_match_openvpn_2_6_14() {
    let client = OccSettings::new(Role::Client).with_tls_auth(KeyDirection::Inverse);
    let cases: Vec<(OccSettings, &str)> = vec![
        // --dev tun --tls-auth ta.key 1
        (client.clone(), STOCK_CLIENT_OCC),
        // --dev tun --tls-auth ta.key 1 --auth SHA256
        (
            OccSettings {
                auth: Digest::Sha256,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1555,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA256,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --auth SHA512
        (
            OccSettings {
                auth: Digest::Sha512,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1587,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA512,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --auth SHA256 --comp-lzo no
        (
            OccSettings {
                auth: Digest::Sha256,
                compression: Compression::LzoStub,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1556,tun-mtu 1500,proto TCPv4_CLIENT,comp-lzo,keydir 1,auth SHA256,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --compress stub-v2
        (
            OccSettings {
                compression: Compression::StubV2,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,comp-lzo,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --compress stub
        (
            OccSettings {
                compression: Compression::StubSwap,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1544,tun-mtu 1500,proto TCPv4_CLIENT,comp-lzo,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-crypt ta.key
        (
            OccSettings::new(Role::Client),
            "V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,auth SHA1,keysize 128,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key   (no direction)
        (
            OccSettings::new(Role::Client).with_tls_auth(KeyDirection::Bidirectional),
            "V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tap --tls-auth ta.key 1
        (
            OccSettings {
                dev_type: DevType::Tap,
                ..client.clone()
            },
            "V4,dev-type tap,link-mtu 1575,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev null --tls-auth ta.key 1
        (
            OccSettings {
                dev_type: DevType::Null,
                ..client.clone()
            },
            "V4,dev-type null,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --tun-mtu 1400
        (
            OccSettings {
                tun_mtu: 1400,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1443,tun-mtu 1400,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-256-GCM
        (
            OccSettings {
                cipher: Some(DataCipher::Aes256Gcm),
                cipher_in_data_ciphers: true,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1551,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,cipher AES-256-GCM,auth [null-digest],keysize 256,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-128-GCM
        (
            OccSettings {
                cipher: Some(DataCipher::Aes128Gcm),
                cipher_in_data_ciphers: true,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1551,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,cipher AES-128-GCM,auth [null-digest],keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-256-GCM --data-ciphers AES-128-GCM
        (
            OccSettings {
                cipher: Some(DataCipher::Aes256Gcm),
                cipher_in_data_ciphers: false,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1551,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth [null-digest],keysize 256,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher CHACHA20-POLY1305
        (
            OccSettings {
                cipher: Some(DataCipher::ChaCha20Poly1305),
                cipher_in_data_ciphers: true,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1536,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,cipher CHACHA20-POLY1305,auth [null-digest],keysize 256,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-256-CBC   (not in the default data-ciphers)
        (
            OccSettings {
                cipher: Some(DataCipher::Aes256Cbc),
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1559,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 256,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-256-CBC --data-ciphers AES-256-GCM:AES-256-CBC
        (
            OccSettings {
                cipher: Some(DataCipher::Aes256Cbc),
                cipher_in_data_ciphers: true,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1559,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,cipher AES-256-CBC,auth SHA1,keysize 256,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-128-CBC --auth SHA256
        (
            OccSettings {
                cipher: Some(DataCipher::Aes128Cbc),
                auth: Digest::Sha256,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1571,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA256,keysize 128,tls-auth,key-method 2,tls-client",
        ),
        // --dev tun --tls-auth ta.key 1 --cipher AES-256-GCM --comp-lzo no
        (
            OccSettings {
                cipher: Some(DataCipher::Aes256Gcm),
                cipher_in_data_ciphers: true,
                compression: Compression::LzoStub,
                ..client.clone()
            },
            "V4,dev-type tun,link-mtu 1552,tun-mtu 1500,proto TCPv4_CLIENT,comp-lzo,keydir 1,cipher AES-256-GCM,auth [null-digest],keysize 256,tls-auth,key-method 2,tls-client",
        ),
    ];
    for (settings, expected) in cases {
        assert_eq!(settings.options_string(), expected, "{settings:?}");
        // OpenVPN's expected remote string is the same with the roles swapped.
        let server = expected
            .replace("TCPv4_CLIENT", "TCPv4_SERVER")
            .replace("keydir 1", "keydir 0")
            .replace("tls-client", "tls-server");
        assert_eq!(settings.expected_peer().options_string(), server);
    }
    let server = OccSettings::new(Role::Server).with_tls_auth(KeyDirection::Normal);
    assert_eq!(server.options_string(), STOCK_SERVER_OCC);
}

#[test]
fn occ_parse_extracts_cipher_and_comp_lzo() {
    let stock = OccOptions::parse(STOCK_CLIENT_OCC);
    assert_eq!(stock.to_string(), STOCK_CLIENT_OCC);
    assert_eq!(stock.cipher(), None);
    assert!(!stock.comp_lzo());
    assert!(stock.has("tls-auth"));
    assert_eq!(stock.value("link-mtu"), Some("1543"));
    assert_eq!(stock.value("proto"), Some("TCPv4_CLIENT"));

    let gcm = OccOptions::parse("V4,dev-type tun,link-mtu 1552,tun-mtu 1500,proto TCPv4_SERVER,comp-lzo,keydir 0,cipher AES-256-GCM,auth [null-digest],keysize 256,tls-auth,key-method 2,tls-server");
    assert_eq!(gcm.cipher(), Some("AES-256-GCM"));
    assert!(gcm.comp_lzo());
    assert_eq!(
        OccOptions::parse("V4,cipher [null-cipher]").cipher(),
        Some("none")
    );
    assert!(OccOptions::parse("").fields.is_empty());
}

/// The stock client message (reference 6.1): 440 bytes = 5 + 48 + 64 + 2+126 OCC + 2+6
/// "alice" + 2+10 "secret123" + 2+173 peer-info.
#[test]
fn stock_client_message_has_the_observed_shape() {
    let m = stock_client_message();
    let bytes = emit_client(&m);
    assert_eq!(bytes.len(), 440);
    assert_eq!(&bytes[..5], &[0, 0, 0, 0, 2]);
    assert_eq!(&bytes[5..5 + PRE_MASTER_LEN], &m.key_source.pre_master);
    assert_eq!(&bytes[53..85], &m.key_source.random1);
    assert_eq!(&bytes[85..117], &m.key_source.random2);
    let mut at = CLIENT_FIXED_LEN;
    for (len, text) in [
        (126, STOCK_CLIENT_OCC.as_bytes()),
        (6, b"alice".as_slice()),
        (10, b"secret123".as_slice()),
        (173, STOCK_PEER_INFO.as_bytes()),
    ] {
        assert_eq!(u16::from_be_bytes([bytes[at], bytes[at + 1]]), len);
        assert_eq!(&bytes[at + 2..at + 1 + len as usize], text);
        assert_eq!(bytes[at + 1 + len as usize], 0);
        at += 2 + len as usize;
    }
    assert_eq!(at, 440);

    let (parsed, used) = ClientKeyMethod2::parse(&bytes).expect("parses");
    assert_eq!(used, 440);
    assert_eq!(parsed, m);
    let info = PeerInfo::parse(parsed.peer_info.as_deref().unwrap_or_default());
    assert_eq!(info.info, stock_peer_info());
    assert!(!parsed.credentials_exceed(USER_PASS_LEN));
}

/// The 2.6 server message (reference 6.4): 203 bytes = 5 + 64 + 2+126 OCC + 3 x `00 00`.
#[test]
fn stock_server_message_has_the_observed_shape() {
    let m = ServerKeyMethod2::new(KeySource::server(&mut rng()), STOCK_SERVER_OCC.to_owned());
    assert_eq!(m.key_source.pre_master, [0; PRE_MASTER_LEN]);
    let bytes = emit_server(&m);
    assert_eq!(bytes.len(), 203);
    assert_eq!(&bytes[..5], &[0, 0, 0, 0, 2]);
    assert_eq!(&bytes[5..5 + RANDOM_LEN], &m.key_source.random1);
    assert_eq!(&bytes[SERVER_FIXED_LEN..SERVER_FIXED_LEN + 2], &[0, 126]);
    assert_eq!(&bytes[197..], &[0, 0, 0, 0, 0, 0]);
    let (parsed, used) = ServerKeyMethod2::parse(&bytes).expect("parses");
    assert_eq!((parsed, used), (m, 203));
}

#[test]
fn every_truncation_is_truncated() {
    let client = emit_client(&stock_client_message());
    for n in 0..client.len() {
        match ClientKeyMethod2::parse(&client[..n]) {
            Err(Km2Error::Truncated { needed, had }) => {
                assert_eq!(had, n);
                assert!(needed > n && needed <= client.len(), "{n}: needs {needed}");
            }
            other => panic!("prefix of {n} bytes: {other:?}"),
        }
    }
    let server = emit_server(&ServerKeyMethod2::new(
        KeySource::server(&mut rng()),
        STOCK_SERVER_OCC.to_owned(),
    ));
    for n in 0..server.len() {
        let err = ServerKeyMethod2::parse(&server[..n]).expect_err("truncated");
        assert!(err.is_truncated(), "prefix of {n} bytes: {err:?}");
    }
}

#[test]
fn bytes_after_the_message_are_left_to_the_caller() {
    let mut bytes = emit_client(&stock_client_message());
    bytes.extend_from_slice(b"PUSH_REQUEST\0junk");
    let (_, used) = ClientKeyMethod2::parse(&bytes).expect("parses");
    assert_eq!(used, 440);
}

fn malformed(bytes: &[u8]) -> Malformed {
    match ClientKeyMethod2::parse(bytes) {
        Err(Km2Error::Malformed(m)) => m,
        other => panic!("expected malformed, got {other:?}"),
    }
}

#[test]
fn malformed_messages_are_named() {
    let good = emit_client(&stock_client_message());
    let occ_len_at = CLIENT_FIXED_LEN;

    let mut b = good.clone();
    b[3] = 1;
    assert_eq!(malformed(&b), Malformed::BadLiteral { literal: 1 });

    let mut b = good.clone();
    b[4] = 1;
    assert_eq!(malformed(&b), Malformed::KeyMethod1Unsupported);
    assert!(malformed(&b).to_string().contains("key-method 1"));

    let mut b = good.clone();
    b[4] = 3;
    assert_eq!(
        malformed(&b),
        Malformed::UnknownKeyMethod { method: 3, byte: 3 }
    );

    // Flag bits are ignored, as upstream does.
    let mut b = good.clone();
    b[4] = 0x12;
    assert!(ClientKeyMethod2::parse(&b).is_ok());

    // The OCC string's NUL replaced.
    let mut b = good.clone();
    b[occ_len_at + 2 + 125] = b'x';
    assert_eq!(
        malformed(&b),
        Malformed::MissingNul {
            field: Km2Field::Options
        }
    );

    let mut b = good.clone();
    b[occ_len_at + 2 + 10] = 0;
    assert_eq!(
        malformed(&b),
        Malformed::InteriorNul {
            field: Km2Field::Options,
            offset: 10
        }
    );

    let mut b = good.clone();
    b[occ_len_at + 2 + 5] = 0xff;
    assert_eq!(
        malformed(&b),
        Malformed::NotUtf8 {
            field: Km2Field::Options
        }
    );

    // Options length 513 > TLS_OPTIONS_LEN: final without the bytes.
    let mut b = good[..occ_len_at].to_vec();
    b.extend_from_slice(&513u16.to_be_bytes());
    assert_eq!(malformed(&b), Malformed::OptionsTooLong { len: 513 });

    // Absent options string.
    let mut b = good[..occ_len_at].to_vec();
    b.extend_from_slice(&[0; 8]);
    assert_eq!(malformed(&b), Malformed::MissingOptions);

    // A password without its NUL.
    let m = stock_client_message();
    let pass_at = occ_len_at + 2 + 126 + 2 + 6;
    let mut b = good.clone();
    b[pass_at + 2 + 9] = b'!';
    assert_eq!(
        malformed(&b),
        Malformed::MissingNul {
            field: Km2Field::Password
        }
    );
    assert_eq!(m.password.as_deref(), Some(b"secret123".as_slice()));
}

#[test]
fn emit_refuses_what_cannot_be_sent() {
    let mut m = stock_client_message();
    m.options = "V".repeat(512);
    assert_eq!(
        m.emit(&mut BytesMut::new()),
        Err(Malformed::OptionsTooLong { len: 513 })
    );
    let mut m = stock_client_message();
    m.username = Some(b"al\0ice".to_vec());
    let mut buf = BytesMut::new();
    assert_eq!(
        m.emit(&mut buf),
        Err(Malformed::InteriorNul {
            field: Km2Field::Username,
            offset: 2
        })
    );
    assert!(buf.is_empty());
    let mut m = stock_client_message();
    m.peer_info = Some("x".repeat(65535));
    assert!(matches!(
        m.emit(&mut BytesMut::new()),
        Err(Malformed::StringTooLong {
            field: Km2Field::PeerInfo,
            ..
        })
    ));
    m.peer_info = Some("x".repeat(65534));
    assert!(m.emit(&mut BytesMut::new()).is_ok());
}

#[test]
fn long_credentials_are_exposed_not_rejected() {
    let mut m = stock_client_message();
    m.password = Some(vec![b'p'; 127]);
    assert!(!m.credentials_exceed(USER_PASS_LEN));
    m.password = Some(vec![b'p'; 128]);
    assert!(m.credentials_exceed(USER_PASS_LEN));
    let bytes = emit_client(&m);
    let (parsed, _) = ClientKeyMethod2::parse(&bytes).expect("parses");
    assert!(parsed.credentials_exceed(USER_PASS_LEN));
    // An empty (but present) username differs from an absent one on the wire.
    m.username = Some(Vec::new());
    let bytes = emit_client(&m);
    assert_eq!(
        &bytes[CLIENT_FIXED_LEN + 128..CLIENT_FIXED_LEN + 131],
        &[0, 1, 0]
    );
    assert_eq!(ClientKeyMethod2::parse(&bytes).expect("parses").0, m);
}

#[test]
fn peer_info_keeps_unknown_keys_and_reports_bad_lines() {
    let text = "IV_VER=2.6.14\nIV_GUI_VER=OpenVPN_GUI_11\nUV_FOO=bar baz\nno equals\n\
=x\nIV_PROTO=abc\nIV_VER=2.5\nIV_LZO=1\nIV_TCPNL=0\nIV_CTRL=a\x07b\nIV_CIPHERS=AES-256-GCM:BF-CBC";
    let parsed = PeerInfo::parse(text);
    let info = &parsed.info;
    assert_eq!(info.version.as_deref(), Some("2.6.14"));
    assert_eq!(info.proto, None);
    assert!(!info.tcp_nonlinear);
    assert_eq!(
        info.ciphers,
        Some(vec!["AES-256-GCM".to_owned(), "BF-CBC".to_owned()])
    );
    assert_eq!(
        info.extra,
        vec![
            ("IV_GUI_VER".to_owned(), "OpenVPN_GUI_11".to_owned()),
            ("UV_FOO".to_owned(), "bar baz".to_owned()),
            ("IV_LZO".to_owned(), "1".to_owned()),
            ("IV_TCPNL".to_owned(), "0".to_owned()),
        ]
    );
    let problems: Vec<(usize, LineProblem)> = parsed
        .malformed
        .iter()
        .map(|m| (m.line_no, m.reason))
        .collect();
    assert_eq!(
        problems,
        vec![
            (4, LineProblem::NoEquals),
            (5, LineProblem::BadKey),
            (6, LineProblem::BadValue),
            (7, LineProblem::Duplicate),
            (10, LineProblem::ControlCharacter),
        ]
    );
    assert!(info.supports_ncp());
    assert!(!PeerInfo::default().supports_ncp());
}

// ---------------------------------------------------------------------------------------------

fn arb_key_source(client: bool) -> impl Strategy<Value = KeySource> {
    (
        prop::array::uniform32(any::<u8>()),
        prop::array::uniform32(any::<u8>()),
        prop::array::uniform16(any::<u8>()),
        prop::array::uniform32(any::<u8>()),
    )
        .prop_map(move |(random1, random2, a, b)| {
            let mut pre_master = [0; PRE_MASTER_LEN];
            if client {
                pre_master[..16].copy_from_slice(&a);
                pre_master[16..].copy_from_slice(&b);
            }
            KeySource {
                pre_master,
                random1,
                random2,
            }
        })
}

fn arb_bytes() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::of(prop::collection::vec(1u8..=255, 0..200))
}

fn arb_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>().prop_filter("no NUL", |c| *c != '\0'), 0..max)
        .prop_map(|v| v.into_iter().collect::<String>())
}

fn arb_value() -> impl Strategy<Value = String> {
    "[ -~]{0,20}"
}

fn arb_peer_info() -> impl Strategy<Value = PeerInfo> {
    let names = prop::collection::vec("[A-Za-z0-9-]{1,20}", 0..5);
    let extra = prop::collection::vec(("(UV|IV_X)_[A-Za-z0-9_]{0,10}", arb_value()), 0..5);
    (
        (
            prop::option::of(arb_value()),
            prop::option::of(arb_value()),
            any::<bool>(),
            prop::option::of(any::<u32>()),
            prop::option::of(any::<u32>()),
            prop::option::of(names),
        ),
        (
            prop::option::of(any::<u32>()),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            extra,
        ),
    )
        .prop_map(
            |(
                (version, platform, tcp_nonlinear, mtu, ncp, ciphers),
                (proto, lzo_stub, comp_stub, comp_stub_v2, extra),
            )| PeerInfo {
                version,
                platform,
                tcp_nonlinear,
                mtu,
                ncp,
                ciphers,
                proto: proto.map(IvProto::from_bits),
                lzo_stub,
                comp_stub,
                comp_stub_v2,
                extra,
            },
        )
}

proptest! {
    #[test]
    fn client_message_round_trips(
        key_source in arb_key_source(true),
        options in arb_text(120),
        username in arb_bytes(),
        password in arb_bytes(),
        peer_info in prop::option::of(arb_peer_info()),
        trailing in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        prop_assume!(options.len() < 512);
        let m = ClientKeyMethod2 {
            key_source,
            options,
            username,
            password,
            peer_info: peer_info.map(|p| p.to_text()),
        };
        let mut bytes = emit_client(&m);
        let len = bytes.len();
        bytes.extend_from_slice(&trailing);
        let (parsed, used) = ClientKeyMethod2::parse(&bytes).expect("parses");
        prop_assert_eq!(used, len);
        prop_assert_eq!(&parsed, &m);
        prop_assert_eq!(emit_client(&parsed), bytes[..len].to_vec());
        let cut = len * 7 / 11;
        prop_assert!(ClientKeyMethod2::parse(&bytes[..cut]).expect_err("cut").is_truncated());
    }

    #[test]
    fn server_message_round_trips(
        key_source in arb_key_source(false),
        options in arb_text(120),
        username in arb_bytes(),
        peer_info in prop::option::of(arb_value()),
    ) {
        prop_assume!(options.len() < 512);
        let m = ServerKeyMethod2 { key_source, options, username, password: None, peer_info };
        let bytes = emit_server(&m);
        let (parsed, used) = ServerKeyMethod2::parse(&bytes).expect("parses");
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(parsed, m);
    }

    #[test]
    fn peer_info_round_trips(info in arb_peer_info()) {
        let text = info.to_text();
        let parsed = PeerInfo::parse(&text);
        prop_assert!(parsed.malformed.is_empty(), "{:?}", parsed.malformed);
        prop_assert_eq!(&parsed.info, &info);
        prop_assert_eq!(parsed.info.to_text(), text);
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = ClientKeyMethod2::parse(&bytes);
        let _ = ServerKeyMethod2::parse(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        let _ = PeerInfo::parse(&text);
        let _ = OccOptions::parse(&text);
    }
}

#[test]
fn iv_proto_bits() {
    let p = IV_PROTO_DATA_V2 | IvProto::from_bits(1 << 20);
    assert!(p.contains(IV_PROTO_DATA_V2));
    assert_eq!(p.bits(), 2 | (1 << 20));
}
