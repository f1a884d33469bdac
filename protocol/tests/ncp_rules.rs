//! Cipher negotiation and pushed protocol options (reference 9.2 - 9.4).

use protocol::data::DataCipher::{self, *};
use protocol::ids::PeerId;
use protocol::km2::peer_info::{IvProto, PeerInfo};
use protocol::ncp::{
    check_pushed_cipher, client_cipher_without_push, parse_fallback, peer_cipher_list,
    protocol_push, select_server_cipher, ClientNcpError, DataCiphers, NcpConfigError,
    ProtocolFlags, ProtocolOption, ServerCapabilities, NO_SHARED_CIPHER_AUTH_FAILED,
};

fn list(s: &str) -> DataCiphers {
    DataCiphers::parse(s).expect("valid list")
}

fn peer(lines: &str) -> PeerInfo {
    let parsed = PeerInfo::parse(lines);
    assert!(parsed.malformed.is_empty());
    parsed.info
}

#[test]
fn data_ciphers_parse() {
    assert_eq!(
        list("aes-256-gcm:AES-128-GCM:?ChaCha20-Poly1305").as_slice(),
        &[Aes256Gcm, Aes128Gcm, ChaCha20Poly1305]
    );
    assert_eq!(
        list("AES-256-GCM:?BF-CBC:?aes-128-cbc").to_string(),
        "AES-256-GCM:AES-128-CBC"
    );
    assert_eq!(
        DataCiphers::parse("AES-256-GCM:BF-CBC"),
        Err(NcpConfigError::UnsupportedCipher {
            name: "BF-CBC".to_owned()
        })
    );
    assert_eq!(
        DataCiphers::parse("AES-256-GCM:BF-CBC")
            .expect_err("unknown")
            .to_string(),
        "Unsupported cipher in --data-ciphers: BF-CBC"
    );
    assert_eq!(DataCiphers::parse("?BF-CBC"), Err(NcpConfigError::Empty));
    assert!(DataCiphers::parse("").is_err());
    assert_eq!(
        DataCiphers::default_2_6().to_string(),
        "AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305"
    );
    assert_eq!(parse_fallback("aes-256-cbc"), Ok(Aes256Cbc));
    assert!(parse_fallback("BF-CBC").is_err());
    // Longer than MAX_NCP_CIPHERS_LENGTH (127) once canonical.
    let long = ["AES-256-GCM"; 11].join(":");
    assert_eq!(
        DataCiphers::parse(&long),
        Err(NcpConfigError::TooLong { len: 131 })
    );
}

struct Case {
    name: &'static str,
    server: &'static str,
    fallback: Option<DataCipher>,
    peer_info: Option<&'static str>,
    occ_cipher: Option<&'static str>,
    expect: Option<DataCipher>,
}

#[test]
fn server_selection_table() {
    let cases = [
        Case {
            name: "stock client: server preference wins",
            server: "AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305",
            fallback: None,
            peer_info: Some("IV_NCP=2\nIV_CIPHERS=CHACHA20-POLY1305:AES-128-GCM:AES-256-GCM\n"),
            occ_cipher: None,
            expect: Some(Aes256Gcm),
        },
        Case {
            name: "first server cipher the client has",
            server: "CHACHA20-POLY1305:AES-128-GCM",
            fallback: None,
            peer_info: Some("IV_CIPHERS=AES-256-GCM:AES-128-GCM\n"),
            occ_cipher: None,
            expect: Some(Aes128Gcm),
        },
        Case {
            name: "IV_CIPHERS matched case-insensitively, unknown names ignored",
            server: "AES-256-CBC",
            fallback: None,
            peer_info: Some("IV_CIPHERS=BF-CBC:aes-256-cbc\n"),
            occ_cipher: None,
            expect: Some(Aes256Cbc),
        },
        Case {
            name: "IV_CIPHERS takes precedence over IV_NCP=2",
            server: "AES-256-GCM:AES-256-CBC",
            fallback: None,
            peer_info: Some("IV_NCP=2\nIV_CIPHERS=AES-256-CBC\n"),
            occ_cipher: None,
            expect: Some(Aes256Cbc),
        },
        Case {
            name: "IV_NCP=2 without IV_CIPHERS means both AES-GCM",
            server: "CHACHA20-POLY1305:AES-128-GCM",
            fallback: None,
            peer_info: Some("IV_NCP=2\n"),
            occ_cipher: None,
            expect: Some(Aes128Gcm),
        },
        Case {
            name: "IV_NCP=2 without IV_CIPHERS, server without GCM: no shared cipher",
            server: "CHACHA20-POLY1305:AES-256-CBC",
            fallback: Some(Aes256Cbc),
            peer_info: Some("IV_NCP=2\n"),
            occ_cipher: None,
            expect: None,
        },
        Case {
            name: "IV_NCP=1 is no list",
            server: "AES-256-GCM",
            fallback: None,
            peer_info: Some("IV_NCP=1\n"),
            occ_cipher: None,
            expect: None,
        },
        Case {
            name: "OCC cipher accepted when in data-ciphers",
            server: "AES-256-GCM:AES-256-CBC",
            fallback: None,
            peer_info: Some("IV_VER=2.3.18\n"),
            occ_cipher: Some("AES-256-CBC"),
            expect: Some(Aes256Cbc),
        },
        Case {
            name: "OCC cipher and IV_CIPHERS both count, in server order",
            server: "AES-256-CBC:AES-128-GCM",
            fallback: None,
            peer_info: Some("IV_CIPHERS=AES-128-GCM\n"),
            occ_cipher: Some("AES-256-CBC"),
            expect: Some(Aes256Cbc),
        },
        Case {
            name: "no shared cipher with a client list",
            server: "AES-256-GCM",
            fallback: Some(Aes256Gcm),
            peer_info: Some("IV_CIPHERS=CHACHA20-POLY1305\n"),
            occ_cipher: None,
            expect: None,
        },
        Case {
            name: "OCC cipher not in data-ciphers: no fallback either",
            server: "AES-256-GCM",
            fallback: Some(Aes256Cbc),
            peer_info: None,
            occ_cipher: Some("AES-256-CBC"),
            expect: None,
        },
        Case {
            name: "client said nothing: fallback",
            server: "AES-256-GCM",
            fallback: Some(Aes128Cbc),
            peer_info: Some("IV_VER=2.3.18\n"),
            occ_cipher: None,
            expect: Some(Aes128Cbc),
        },
        Case {
            name: "no peer-info at all: fallback",
            server: "AES-256-GCM",
            fallback: Some(Aes256Cbc),
            peer_info: None,
            occ_cipher: None,
            expect: Some(Aes256Cbc),
        },
        Case {
            name: "client said nothing, no fallback: fail",
            server: "AES-256-GCM",
            fallback: None,
            peer_info: None,
            occ_cipher: None,
            expect: None,
        },
    ];
    for c in cases {
        let info = c.peer_info.map(peer);
        let got = select_server_cipher(&list(c.server), c.fallback, info.as_ref(), c.occ_cipher);
        match (got, c.expect) {
            (Ok(got), Some(expect)) => assert_eq!(got, expect, "{}", c.name),
            (Err(e), None) => {
                assert_eq!(e.auth_failed_message(), NO_SHARED_CIPHER_AUTH_FAILED);
                assert_eq!(
                    e.auth_failed_message(),
                    "AUTH_FAILED,Data channel cipher negotiation failed (no shared cipher)"
                );
                assert_eq!(e.server, list(c.server), "{}", c.name);
                assert_eq!(e.client_occ_cipher.as_deref(), c.occ_cipher, "{}", c.name);
            }
            (got, _) => panic!("{}: got {got:?}, expected {:?}", c.name, c.expect),
        }
    }
}

#[test]
fn peer_cipher_list_rules() {
    assert!(peer_cipher_list(None).is_empty());
    assert_eq!(
        peer_cipher_list(Some(&peer("IV_NCP=2\n"))),
        vec!["AES-256-GCM", "AES-128-GCM"]
    );
    assert_eq!(
        peer_cipher_list(Some(&peer("IV_NCP=3\nIV_CIPHERS=AES-256-CBC\n"))),
        vec!["AES-256-CBC"]
    );
    assert!(peer_cipher_list(Some(&peer("IV_NCP=1\n"))).is_empty());
}

#[test]
fn client_checks_pushed_cipher() {
    let ours = DataCiphers::default_2_6();
    assert_eq!(
        check_pushed_cipher("AES-256-GCM", &ours, None),
        Ok(Aes256Gcm)
    );
    assert_eq!(
        check_pushed_cipher("aes-128-gcm", &ours, None),
        Ok(Aes128Gcm)
    );
    // Allowed as the fallback although not in data-ciphers.
    assert_eq!(
        check_pushed_cipher("AES-256-CBC", &ours, Some(Aes256Cbc)),
        Ok(Aes256Cbc)
    );
    let err = check_pushed_cipher("AES-256-CBC", &ours, Some(Aes128Cbc)).expect_err("refused");
    assert_eq!(
        err,
        ClientNcpError::CipherNotAllowed {
            cipher: "AES-256-CBC".to_owned(),
            data_ciphers: ours.clone(),
        }
    );
    assert!(err.to_string().contains("negotiated cipher not allowed"));
    assert!(check_pushed_cipher("BF-CBC", &ours, None).is_err());
}

#[test]
fn client_without_push() {
    let ours = list("AES-256-GCM:AES-256-CBC");
    // Poor man's NCP: the server's OCC cipher, if we allow it.
    assert_eq!(
        client_cipher_without_push(Some("AES-256-CBC"), &ours, None),
        Ok(Aes256Cbc)
    );
    // The fallback is used only when the server's OCC string has no cipher.
    assert!(matches!(
        client_cipher_without_push(Some("AES-128-CBC"), &ours, Some(Aes128Cbc)),
        Err(ClientNcpError::ServerCipherNotAllowed { .. })
    ));
    assert_eq!(
        client_cipher_without_push(None, &ours, Some(Aes128Cbc)),
        Ok(Aes128Cbc)
    );
    assert_eq!(
        client_cipher_without_push(None, &ours, None),
        Err(ClientNcpError::NoCipher)
    );
}

fn rendered(options: &[ProtocolOption]) -> Vec<String> {
    options.iter().map(ToString::to_string).collect()
}

const ALL_CAPS: ServerCapabilities = ServerCapabilities {
    tls_ekm: true,
    dyn_tls_crypt: true,
    cc_exit: true,
};

#[test]
fn stock_client_gets_the_observed_push() {
    let stock = peer(
        "IV_VER=2.6.14\nIV_PLAT=linux\nIV_TCPNL=1\nIV_MTU=1600\nIV_NCP=2\n\
         IV_CIPHERS=AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305\nIV_PROTO=990\n",
    );
    let peer_id = PeerId::new(0).expect("valid");
    let push = protocol_push(&stock, ALL_CAPS, peer_id, Aes256Gcm, 1500);
    // The tail of the PUSH_REPLY in protocol/tests/golden/*/keys.txt.
    assert_eq!(
        rendered(&push.options).join(","),
        "peer-id 0,cipher AES-256-GCM,protocol-flags cc-exit tls-ekm dyn-tls-crypt,tun-mtu 1500"
    );
    assert!(push.data_v2 && push.request_push && push.tls_ekm && push.dyn_tls_crypt);
    assert!(push.cc_exit);
}

#[test]
fn protocol_push_table() {
    let pid = PeerId::new(7).expect("valid");
    let none = ServerCapabilities::default();
    let cases: [(&str, ServerCapabilities, &[&str]); 9] = [
        // No IV_PROTO, no NCP, no IV_MTU: nothing.
        ("IV_VER=2.3\n", ALL_CAPS, &[]),
        ("IV_PROTO=2\n", ALL_CAPS, &["peer-id 7"]),
        (
            "IV_PROTO=6\nIV_NCP=2\n",
            ALL_CAPS,
            &["peer-id 7", "cipher AES-128-GCM"],
        ),
        // EKM without CC_EXIT_NOTIFY: key-derivation.
        (
            "IV_PROTO=10\n",
            ALL_CAPS,
            &["peer-id 7", "key-derivation tls-ekm"],
        ),
        // EKM with CC_EXIT_NOTIFY: inside protocol-flags.
        (
            "IV_PROTO=138\n",
            ALL_CAPS,
            &["peer-id 7", "protocol-flags cc-exit tls-ekm"],
        ),
        // Only dynamic tls-crypt.
        (
            "IV_PROTO=514\nIV_MTU=1600\n",
            ALL_CAPS,
            &["peer-id 7", "protocol-flags dyn-tls-crypt", "tun-mtu 1400"],
        ),
        // A server without EKM or dynamic tls-crypt pushes neither.
        (
            "IV_PROTO=990\nIV_CIPHERS=AES-128-GCM\n",
            ServerCapabilities {
                cc_exit: true,
                ..none
            },
            &["peer-id 7", "cipher AES-128-GCM", "protocol-flags cc-exit"],
        ),
        (
            "IV_PROTO=990\n",
            ServerCapabilities {
                tls_ekm: true,
                ..none
            },
            &["peer-id 7", "protocol-flags tls-ekm"],
        ),
        ("IV_PROTO=990\nIV_MTU=abc\n", none, &["peer-id 7"]),
    ];
    for (info, caps, expect) in cases {
        let parsed = PeerInfo::parse(info).info;
        let push = protocol_push(&parsed, caps, pid, Aes128Gcm, 1400);
        assert_eq!(rendered(&push.options), expect, "{info:?} {caps:?}");
    }
    let p = protocol_push(&peer("IV_PROTO=10\n"), ALL_CAPS, pid, Aes128Gcm, 1500);
    assert!(p.tls_ekm && !p.cc_exit && !p.request_push);
    assert_eq!(
        ProtocolOption::ProtocolFlags(ProtocolFlags::default()).to_string(),
        "protocol-flags"
    );
    assert_eq!(
        IvProto::from_bits(990),
        PeerInfo::parse("IV_PROTO=990").info.proto_bits()
    );
}
