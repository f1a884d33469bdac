//! PROXY protocol properties: generated headers round-trip through encode and parse in both
//! versions, and the parser never panics (nor over-consumes) on arbitrary bytes.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use proptest::prelude::*;
use protocol::proxy_protocol::{
    parse, parse_with_limit, Addresses, Command, ProxyHeader, Tlv, Transport, Version, V2_MAX_LEN,
    V2_SIGNATURE,
};

fn inet() -> impl Strategy<Value = Addresses> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<u16>(),
            any::<[u8; 4]>(),
            any::<u16>()
        )
            .prop_map(|(s, sp, d, dp)| Addresses::Ipv4 {
                source: SocketAddrV4::new(Ipv4Addr::from(s), sp),
                destination: SocketAddrV4::new(Ipv4Addr::from(d), dp),
            }),
        (
            any::<[u8; 16]>(),
            any::<u16>(),
            any::<[u8; 16]>(),
            any::<u16>()
        )
            .prop_map(|(s, sp, d, dp)| Addresses::Ipv6 {
                source: SocketAddrV6::new(Ipv6Addr::from(s), sp, 0, 0),
                destination: SocketAddrV6::new(Ipv6Addr::from(d), dp, 0, 0),
            }),
    ]
}

fn v1_header() -> impl Strategy<Value = ProxyHeader> {
    prop_oneof![
        inet().prop_map(|addresses| ProxyHeader {
            version: Version::V1,
            command: Command::Proxy,
            transport: Transport::Stream,
            addresses,
            tlvs: vec![],
        }),
        proptest::option::of("[ -~]{0,80}").prop_map(|t| ProxyHeader {
            version: Version::V1,
            command: Command::Proxy,
            transport: Transport::Unspec,
            addresses: Addresses::Unspecified {
                v1_trailer: t.map(|t| format!(" {t}").into_bytes()).unwrap_or_default(),
            },
            tlvs: vec![],
        }),
    ]
}

fn v2_header() -> impl Strategy<Value = ProxyHeader> {
    let addresses = prop_oneof![
        Just(Addresses::Unspecified { v1_trailer: vec![] }),
        inet(),
        (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(s, d)| {
            let mut source = [0u8; 108];
            let mut destination = [0u8; 108];
            source[..32].copy_from_slice(&s);
            destination[..32].copy_from_slice(&d);
            Addresses::Unix {
                source,
                destination,
            }
        }),
    ];
    let tlv = (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300))
        .prop_map(|(kind, value)| Tlv { kind, value });
    (
        prop_oneof![Just(Command::Local), Just(Command::Proxy)],
        prop_oneof![
            Just(Transport::Unspec),
            Just(Transport::Stream),
            Just(Transport::Dgram)
        ],
        addresses,
        proptest::collection::vec(tlv, 0..6),
    )
        .prop_map(|(command, transport, addresses, tlvs)| ProxyHeader {
            version: Version::V2,
            command,
            transport,
            addresses,
            tlvs,
        })
}

/// A header the parser accepts lies within the input and encodes to bytes that parse back to
/// the same header (what the `proxy_protocol` fuzz target checks).
fn reparses_to_itself(data: &[u8]) -> Result<(), TestCaseError> {
    let Ok(Some((header, consumed))) = parse_with_limit(data, V2_MAX_LEN) else {
        return Ok(());
    };
    prop_assert!(consumed <= data.len(), "consumed more than was given");
    let bytes = header.to_bytes();
    prop_assert!(bytes.is_ok(), "a parsed header must encode");
    let bytes = bytes.unwrap();
    prop_assert_eq!(
        parse_with_limit(&bytes, V2_MAX_LEN),
        Ok(Some((header, bytes.len())))
    );
    Ok(())
}

proptest! {
    #[test]
    fn v1_round_trip(header in v1_header(), tail in proptest::collection::vec(any::<u8>(), 0..20)) {
        let bytes = header.to_bytes().unwrap();
        prop_assert!(bytes.len() <= 107);
        let mut stream = bytes.clone();
        stream.extend_from_slice(&tail);
        prop_assert_eq!(parse(&stream).unwrap(), Some((header, bytes.len())));
        for n in 0..bytes.len() {
            prop_assert_eq!(parse(&bytes[..n]), Ok(None));
        }
    }

    #[test]
    fn v2_round_trip(header in v2_header(), tail in proptest::collection::vec(any::<u8>(), 0..20)) {
        let bytes = header.to_bytes().unwrap();
        let mut stream = bytes.clone();
        stream.extend_from_slice(&tail);
        prop_assert_eq!(
            parse_with_limit(&stream, V2_MAX_LEN).unwrap(),
            Some((header.clone(), bytes.len()))
        );
        for n in 0..bytes.len() {
            prop_assert_eq!(parse_with_limit(&bytes[..n], V2_MAX_LEN), Ok(None));
        }
        let (source, destination) = match &header.addresses {
            Addresses::Ipv4 { source, destination } if header.command == Command::Proxy =>
                (Some((*source).into()), Some((*destination).into())),
            Addresses::Ipv6 { source, destination } if header.command == Command::Proxy =>
                (Some((*source).into()), Some((*destination).into())),
            _ => (None, None),
        };
        prop_assert_eq!(header.source(), source);
        prop_assert_eq!(header.destination(), destination);
    }

    #[test]
    fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        reparses_to_itself(&data)?;
        if let Ok(Some((_, consumed))) = parse(&data) {
            prop_assert!(consumed <= data.len());
        }
    }

    #[test]
    fn never_panics_after_a_v2_signature(rest in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut data = V2_SIGNATURE.to_vec();
        data.extend_from_slice(&rest);
        reparses_to_itself(&data)?;
    }

    #[test]
    fn never_panics_after_a_v1_prefix(rest in "[ -~\r\n]{0,120}") {
        let mut data = b"PROXY ".to_vec();
        data.extend_from_slice(rest.as_bytes());
        reparses_to_itself(&data)?;
    }
}
