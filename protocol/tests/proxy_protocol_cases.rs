//! PROXY protocol v1/v2: known-good headers parse to the expected values and re-encode to the
//! same bytes, every strict prefix asks for more bytes, and each malformed case is an error.
//!
//! The v2 byte strings are written out by hand from the layout in the module docs (signature,
//! version/command, family/transport, big-endian length, address block, TLVs).

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use protocol::proxy_protocol::{
    parse, parse_with_limit, Addresses, Command, ProxyError, ProxyHeader, Tlv, Transport, V1Field,
    Version, PP2_TYPE_ALPN, PP2_TYPE_AUTHORITY, PP2_TYPE_NOOP, V2_SIGNATURE,
};

fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(ver_cmd);
    out.push(fam);
    out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn v2_ipv4_with_tlvs() -> Vec<u8> {
    let mut body = vec![192, 0, 2, 1, 198, 51, 100, 7, 0xd4, 0x31, 0x01, 0xbb];
    body.extend_from_slice(&[PP2_TYPE_ALPN, 0, 2, b'h', b'2']);
    body.extend_from_slice(&[PP2_TYPE_AUTHORITY, 0, 11]);
    body.extend_from_slice(b"example.com");
    body.extend_from_slice(&[PP2_TYPE_NOOP, 0, 0]);
    v2(0x21, 0x11, &body)
}

fn v2_ipv6() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    body.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
    body.extend_from_slice(&[0x30, 0x39, 0x00, 0x50]);
    body.extend_from_slice(&[0xea, 0, 3, 1, 2, 3]);
    v2(0x21, 0x21, &body)
}

/// (bytes, expected header, expected source)
fn valid() -> Vec<(Vec<u8>, ProxyHeader, Option<SocketAddr>)> {
    let v4 = |a: [u8; 4], p| SocketAddrV4::new(Ipv4Addr::from(a), p);
    let v6 = |a: &str, p| SocketAddrV6::new(a.parse().unwrap(), p, 0, 0);
    let header = |version, command, transport, addresses, tlvs| ProxyHeader {
        version,
        command,
        transport,
        addresses,
        tlvs,
    };
    vec![
        (
            b"PROXY TCP4 192.0.2.1 198.51.100.7 54321 443\r\n".to_vec(),
            header(
                Version::V1,
                Command::Proxy,
                Transport::Stream,
                Addresses::Ipv4 {
                    source: v4([192, 0, 2, 1], 54321),
                    destination: v4([198, 51, 100, 7], 443),
                },
                vec![],
            ),
            Some("192.0.2.1:54321".parse().unwrap()),
        ),
        (
            b"PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n".to_vec(),
            header(
                Version::V1,
                Command::Proxy,
                Transport::Stream,
                Addresses::Ipv4 {
                    source: v4([0, 0, 0, 0], 0),
                    destination: v4([255, 255, 255, 255], 65535),
                },
                vec![],
            ),
            Some("0.0.0.0:0".parse().unwrap()),
        ),
        (
            b"PROXY TCP6 2001:db8::1 ::ffff:10.0.0.1 12345 80\r\n".to_vec(),
            header(
                Version::V1,
                Command::Proxy,
                Transport::Stream,
                Addresses::Ipv6 {
                    source: v6("2001:db8::1", 12345),
                    destination: v6("::ffff:10.0.0.1", 80),
                },
                vec![],
            ),
            Some("[2001:db8::1]:12345".parse().unwrap()),
        ),
        (
            b"PROXY UNKNOWN\r\n".to_vec(),
            header(
                Version::V1,
                Command::Proxy,
                Transport::Unspec,
                Addresses::Unspecified { v1_trailer: vec![] },
                vec![],
            ),
            None,
        ),
        (
            b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n".to_vec(),
            header(
                Version::V1,
                Command::Proxy,
                Transport::Unspec,
                Addresses::Unspecified {
                    v1_trailer: b" ffff:f...f:ffff ffff:f...f:ffff 65535 65535".to_vec(),
                },
                vec![],
            ),
            None,
        ),
        (
            v2_ipv4_with_tlvs(),
            header(
                Version::V2,
                Command::Proxy,
                Transport::Stream,
                Addresses::Ipv4 {
                    source: v4([192, 0, 2, 1], 54321),
                    destination: v4([198, 51, 100, 7], 443),
                },
                vec![
                    Tlv {
                        kind: PP2_TYPE_ALPN,
                        value: b"h2".to_vec(),
                    },
                    Tlv {
                        kind: PP2_TYPE_AUTHORITY,
                        value: b"example.com".to_vec(),
                    },
                    Tlv {
                        kind: PP2_TYPE_NOOP,
                        value: vec![],
                    },
                ],
            ),
            Some("192.0.2.1:54321".parse().unwrap()),
        ),
        (
            v2_ipv6(),
            header(
                Version::V2,
                Command::Proxy,
                Transport::Stream,
                Addresses::Ipv6 {
                    source: v6("2001:db8::1", 12345),
                    destination: v6("2001:db8::2", 80),
                },
                vec![Tlv {
                    kind: 0xea,
                    value: vec![1, 2, 3],
                }],
            ),
            Some("[2001:db8::1]:12345".parse().unwrap()),
        ),
        (v2(0x20, 0x00, &[]), ProxyHeader::local(), None),
        (
            // LOCAL with addresses: kept for re-encoding, but the receiver uses the real peer.
            v2(0x20, 0x12, &[10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2]),
            header(
                Version::V2,
                Command::Local,
                Transport::Dgram,
                Addresses::Ipv4 {
                    source: v4([10, 0, 0, 1], 1),
                    destination: v4([10, 0, 0, 2], 2),
                },
                vec![],
            ),
            None,
        ),
        (
            v2(0x21, 0x31, &[b'a'; 216]),
            header(
                Version::V2,
                Command::Proxy,
                Transport::Stream,
                Addresses::Unix {
                    source: [b'a'; 108],
                    destination: [b'a'; 108],
                },
                vec![],
            ),
            None,
        ),
    ]
}

#[test]
fn valid_headers_parse_and_reencode() {
    for (bytes, expected, source) in valid() {
        let mut stream = bytes.clone();
        stream.extend_from_slice(b"\x16\x03\x01 payload after the header");
        let (header, consumed) = parse(&stream).unwrap().unwrap();
        assert_eq!(consumed, bytes.len(), "{bytes:?}");
        assert_eq!(header, expected, "{bytes:?}");
        assert_eq!(header.source(), source, "{bytes:?}");
        assert_eq!(header.to_bytes().unwrap(), bytes, "{bytes:?}");
    }
}

#[test]
fn strict_prefixes_need_more_bytes() {
    for (bytes, _, _) in valid() {
        for n in 0..bytes.len() {
            assert_eq!(parse(&bytes[..n]), Ok(None), "{n} of {bytes:?}");
        }
    }
}

#[test]
fn tcp_constructor_matches_families() {
    let s: SocketAddr = "192.0.2.1:1".parse().unwrap();
    let d: SocketAddr = "[2001:db8::1]:2".parse().unwrap();
    assert!(ProxyHeader::tcp(Version::V1, s, d).is_none());
    let h = ProxyHeader::tcp(Version::V2, d, d).unwrap();
    assert_eq!(h.source(), Some(d));
    assert_eq!(h.destination(), Some(d));
    let bytes = h.to_bytes().unwrap();
    assert_eq!(parse(&bytes).unwrap().unwrap().0, h);
}

fn err(bytes: &[u8]) -> ProxyError {
    match parse(bytes) {
        Err(e) => e,
        other => panic!("{bytes:?} gave {other:?}"),
    }
}

#[test]
fn v1_malformed() {
    let fields = |found| ProxyError::V1Fields { found, empty: true };
    assert_eq!(
        err(b"PROXY TCP4 192.0.2.1  198.51.100.7 1 2\r\n"),
        fields(7)
    );
    assert_eq!(
        err(b"PROXY  TCP4 192.0.2.1 198.51.100.7 1 2\r\n"),
        ProxyError::V1Protocol
    );
    assert_eq!(
        err(b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2 \r\n"),
        fields(7)
    );
    assert_eq!(
        err(b"PROXY TCP4 192.0.2.1 198.51.100.7 1\r\n"),
        ProxyError::V1Fields {
            found: 5,
            empty: false
        }
    );
    let src = ProxyError::V1Address {
        field: V1Field::SourceAddress,
    };
    let dst = ProxyError::V1Address {
        field: V1Field::DestinationAddress,
    };
    let sport = ProxyError::V1Port {
        field: V1Field::SourcePort,
    };
    let dport = ProxyError::V1Port {
        field: V1Field::DestinationPort,
    };
    assert_eq!(err(b"PROXY TCP4 192.0.2.01 198.51.100.7 1 2\r\n"), src);
    assert_eq!(err(b"PROXY TCP4 192.0.2.1 198.051.100.7 1 2\r\n"), dst);
    assert_eq!(err(b"PROXY TCP4 192.0.2.1 198.51.100.7 01 2\r\n"), sport);
    assert_eq!(err(b"PROXY TCP4 192.0.2.1 198.51.100.7 1 00\r\n"), dport);
    assert_eq!(err(b"PROXY TCP4 192.0.2.1 198.51.100.7 65536 2\r\n"), sport);
    assert_eq!(err(b"PROXY TCP4 192.0.2.1 198.51.100.7 +1 2\r\n"), sport);
    assert_eq!(err(b"PROXY TCP4 192.0.2.256 198.51.100.7 1 2\r\n"), src);
    assert_eq!(err(b"PROXY TCP4 192.0.2 198.51.100.7 1 2\r\n"), src);
    assert_eq!(err(b"PROXY TCP4 2001:db8::1 198.51.100.7 1 2\r\n"), src);
    assert_eq!(err(b"PROXY TCP6 2001:db8::1 198.51.100.7 1 2\r\n"), dst);
    assert_eq!(err(b"PROXY TCP6 192.0.2.1 2001:db8::1 1 2\r\n"), src);
    assert_eq!(err(b"PROXY TCP6 2001:db8::1%eth0 2001:db8::1 1 2\r\n"), src);
    assert_eq!(
        err(b"PROXY UDP4 192.0.2.1 198.51.100.7 1 2\r\n"),
        ProxyError::V1Protocol
    );
    assert_eq!(
        err(b"PROXY tcp4 192.0.2.1 198.51.100.7 1 2\r\n"),
        ProxyError::V1Protocol
    );
    assert_eq!(err(b"PROXY UNKNOWNX\r\n"), ProxyError::V1Trailer);
}

#[test]
fn v1_needs_crlf_within_107_bytes() {
    // A bare LF is not a line end: the parser keeps waiting until 107 bytes, then refuses.
    let mut line = b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\n".to_vec();
    assert_eq!(parse(&line), Ok(None));
    line.resize(107, b'x');
    assert_eq!(parse(&line[..106]), Ok(None));
    assert_eq!(parse(&line), Err(ProxyError::V1NoCrlf));
    // UNKNOWN with padding: CRLF ending exactly at byte 107 is fine, at 108 is not.
    let mut ok = b"PROXY UNKNOWN ".to_vec();
    ok.resize(105, b'a');
    ok.extend_from_slice(b"\r\n");
    assert_eq!(ok.len(), 107);
    assert_eq!(parse(&ok).unwrap().unwrap().1, 107);
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(106, b'a');
    long.extend_from_slice(b"\r\n");
    assert_eq!(parse(&long), Err(ProxyError::V1NoCrlf));
    assert_eq!(parse(&long[..107]), Err(ProxyError::V1NoCrlf));
}

#[test]
fn not_a_proxy_header() {
    assert_eq!(err(b"GET / HTTP/1.1\r\n"), ProxyError::NoSignature);
    assert_eq!(err(b"PROXX"), ProxyError::NoSignature);
    assert_eq!(err(b"\r\n\r\n\0\r\nQUIX"), ProxyError::NoSignature);
    assert_eq!(err(b"\x16\x03\x01"), ProxyError::NoSignature);
}

#[test]
fn v2_malformed() {
    let ipv4 = [192, 0, 2, 1, 198, 51, 100, 7, 0, 1, 0, 2];
    assert_eq!(
        err(&v2(0x11, 0x11, &ipv4)),
        ProxyError::V2Version { version: 1 }
    );
    assert_eq!(
        err(&v2(0x31, 0x11, &ipv4)),
        ProxyError::V2Version { version: 3 }
    );
    // The version nibble fails fast, before the rest of the header has arrived.
    assert_eq!(
        err(&v2(0x11, 0x11, &ipv4)[..13]),
        ProxyError::V2Version { version: 1 }
    );
    assert_eq!(
        err(&v2(0x22, 0x11, &ipv4)),
        ProxyError::V2Command { command: 2 }
    );
    assert_eq!(
        err(&v2(0x21, 0x41, &ipv4)),
        ProxyError::V2Family { family: 4 }
    );
    assert_eq!(
        err(&v2(0x21, 0x13, &ipv4)),
        ProxyError::V2Transport { transport: 3 }
    );
    // Truncated address blocks: detected from the length field alone.
    assert_eq!(
        err(&v2(0x21, 0x11, &ipv4[..11])),
        ProxyError::V2AddressTruncated {
            len: 11,
            needed: 12
        }
    );
    assert_eq!(
        err(&v2(0x21, 0x11, &ipv4[..11])[..16]),
        ProxyError::V2AddressTruncated {
            len: 11,
            needed: 12
        }
    );
    assert_eq!(
        err(&v2(0x21, 0x21, &[0; 35])),
        ProxyError::V2AddressTruncated {
            len: 35,
            needed: 36
        }
    );
    assert_eq!(
        err(&v2(0x21, 0x31, &[0; 215])),
        ProxyError::V2AddressTruncated {
            len: 215,
            needed: 216
        }
    );
    // A TLV whose value runs past the header's end, and one cut inside its own 3-byte header.
    let mut body = ipv4.to_vec();
    body.extend_from_slice(&[PP2_TYPE_ALPN, 0, 5, b'h', b'2']);
    assert_eq!(
        err(&v2(0x21, 0x11, &body)),
        ProxyError::V2TlvOverrun {
            offset: 28,
            needed: 8,
            available: 5
        }
    );
    let mut body = ipv4.to_vec();
    body.extend_from_slice(&[PP2_TYPE_ALPN, 0]);
    assert_eq!(
        err(&v2(0x21, 0x11, &body)),
        ProxyError::V2TlvOverrun {
            offset: 28,
            needed: 3,
            available: 2
        }
    );
    // LOCAL is parsed just as strictly.
    assert_eq!(
        err(&v2(0x20, 0x00, &[PP2_TYPE_NOOP, 0, 1])),
        ProxyError::V2TlvOverrun {
            offset: 16,
            needed: 4,
            available: 3
        }
    );
}

#[test]
fn v2_length_is_bounded() {
    let mut body = vec![0u8; 12];
    body.extend_from_slice(&[PP2_TYPE_NOOP, 0x0f, 0xe2]);
    body.resize(12 + 3 + 0x0fe2, 0);
    let header = v2(0x21, 0x11, &body);
    assert_eq!(header.len(), 4096 + 1);
    // Refused from the fixed 16 bytes already, without waiting for the rest.
    assert_eq!(
        parse(&header[..16]),
        Err(ProxyError::V2TooLong {
            len: 4097,
            limit: 4096
        })
    );
    assert!(parse_with_limit(&header, 4097).unwrap().is_some());
    assert_eq!(
        parse_with_limit(&header[..16], 64),
        Err(ProxyError::V2TooLong {
            len: 4097,
            limit: 64
        })
    );
    // The largest possible header parses under the protocol's own bound.
    let mut body = vec![0u8; 0xffff];
    body[..3].copy_from_slice(&[PP2_TYPE_NOOP, 0xff, 0xfc]);
    let max = v2(0x20, 0x00, &body);
    assert_eq!(
        parse_with_limit(&max, usize::MAX).unwrap().unwrap().1,
        16 + 0xffff
    );
}

#[test]
fn encoding_refusals() {
    let mut h = ProxyHeader::local();
    h.version = Version::V1;
    assert_eq!(h.to_bytes(), Err(ProxyError::NotEncodableAsV1));
    let mut h = ProxyHeader::local();
    h.addresses = Addresses::Unspecified {
        v1_trailer: b" x".to_vec(),
    };
    assert_eq!(h.to_bytes(), Err(ProxyError::V1Trailer));
    let mut h = ProxyHeader::local();
    h.tlvs.push(Tlv {
        kind: 1,
        value: vec![0; 0x10000],
    });
    assert!(matches!(h.to_bytes(), Err(ProxyError::V2TooLong { .. })));
    let mut out = Vec::new();
    assert!(h.encode(&mut out).is_err());
    assert!(out.is_empty(), "a refused header writes nothing");
}
