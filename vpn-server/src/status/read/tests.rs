//! The reader against our fixtures (`vpn-server/fixtures/status/`), the two files captured
//! from OpenVPN 2.6.14, and what our own writer produces.

use super::*;
use crate::status::{self, ClientStatus, RouteStatus, StatusSnapshot};

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!("../../../fixtures/status/", $name)).as_slice()
    };
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn at(s: &str) -> Timestamp {
    parse_datetime(s).unwrap()
}

#[test]
fn non_ha_2_6_with_iroutes() {
    let s = parse(fixture!("nonha-2.6-shoot.status")).unwrap();
    assert_eq!(
        s.title.as_deref(),
        Some("OpenVPN 2.6.15 x86_64-pc-linux-gnu [SSL (OpenSSL)] [LZO] [LZ4] [EPOLL] [MH/PKTINFO] [AEAD]")
    );
    assert_eq!(
        s.updated_at,
        Some(Timestamp {
            unix: 1_773_480_413,
            nanos: 0
        })
    );
    assert_eq!(
        s.clients,
        [Client {
            common_name: "vpn-shoot-client".into(),
            real_address: addr("10.180.3.41:38422"),
            virtual_address: String::new(),
            virtual_ipv6: Some("fd8f:6d53:b97a:1::2".parse().unwrap()),
            bytes_received: 48_213_377,
            bytes_sent: 190_341_226,
            connected_since: at("2026-03-14 08:02:11"),
            username: "UNDEF".into(),
            client_id: "4".into(),
            peer_id: "0".into(),
            cipher: "AES-256-GCM".into(),
        }]
    );
    let routes: Vec<&str> = s
        .routes
        .iter()
        .map(|r| r.virtual_address.as_str())
        .collect();
    assert_eq!(
        routes,
        [
            "fd8f:6d53:b97a:1::2",
            "242.0.0.0/16",
            "243.0.0.0/13",
            "244.0.0.0/11"
        ]
    );
    assert_eq!(s.routes[3].last_ref, at("2026-03-14 09:26:53"));
    assert_eq!(
        s.global_stats,
        [
            ("Max bcast/mcast queue length".to_owned(), "0".to_owned()),
            ("dco_enabled".to_owned(), "0".to_owned())
        ]
    );
}

#[test]
fn bare_ipv6_peer_of_2_6_and_a_client_in_the_handshake() {
    let s = parse(fixture!("nonha-2.6-ipv6-handshake.status")).unwrap();
    assert_eq!(s.clients.len(), 2);
    assert_eq!(s.clients[0].real_address, addr("[2001:db8:77::15]:0"));
    let undef = &s.clients[1];
    assert_eq!(undef.common_name, "UNDEF");
    assert_eq!(undef.real_address, addr("[2001:db8:77::40]:0"));
    assert_eq!(undef.virtual_address, "");
    assert_eq!(undef.virtual_ipv6, None);
    assert_eq!((undef.bytes_received, undef.bytes_sent), (0, 0));
    assert_eq!(undef.cipher, "BF-CBC");
    assert_eq!(s.routes[1].real_address, addr("[2001:db8:77::15]:0"));
}

#[test]
fn prefixed_and_bracketed_addresses_of_2_7() {
    let s = parse(fixture!("nonha-2.7-shoot.status")).unwrap();
    let real: Vec<SocketAddr> = s.clients.iter().map(|c| c.real_address).collect();
    assert_eq!(
        real,
        [addr("10.180.7.9:60311"), addr("[2001:db8:77::16]:44102")]
    );
    let s = parse(fixture!("ha-2.7.status")).unwrap();
    let real: Vec<SocketAddr> = s.routes.iter().map(|r| r.real_address).collect();
    assert_eq!(
        real,
        [
            addr("10.1.22.9:49111"),
            addr("[2001:db8:77::31]:38001"),
            addr("[2001:db8:77::32]:38002")
        ]
    );
}

#[test]
fn ha_tap_routing_table_is_keyed_by_mac() {
    let s = parse(fixture!("ha-2.6.status")).unwrap();
    let cns: Vec<&str> = s.clients.iter().map(|c| c.common_name.as_str()).collect();
    assert_eq!(
        cns,
        [
            "vpn-seed-client",
            "vpn-seed-client",
            "vpn-shoot-client-0",
            "vpn-shoot-client-1"
        ]
    );
    assert_eq!(s.routes[0].virtual_address, "4a:11:9c:02:7e:d1@0");
    assert_eq!(s.routes[3].real_address, addr("[2001:db8:77::21]:0"));
    assert!(s.clients.iter().all(|c| c.virtual_address.is_empty()));
}

#[test]
fn empty_and_handshake_only_files() {
    let s = parse(fixture!("empty.status")).unwrap();
    assert!(s.clients.is_empty() && s.routes.is_empty());
    assert_eq!(s.updated_at, Some(at("2026-03-14 09:00:15")));
    let s = parse(fixture!("nonha-2.6-handshake-only.status")).unwrap();
    assert!(s.clients.iter().all(|c| c.common_name == "UNDEF"));
    assert_eq!(s.clients.len(), 2);
    assert!(s.routes.is_empty());
}

#[test]
fn malformed_fixtures_name_the_line_and_fault() {
    let cases: [(&[u8], usize, Fault); 6] = [
        (
            fixture!("malformed-unknown-line.status"),
            4,
            Fault::UnknownType {
                first: "CLIENT".into(),
            },
        ),
        (
            fixture!("malformed-short-client.status"),
            4,
            Fault::TooFewFields {
                kind: "CLIENT_LIST",
                fields: 12,
                needs: 13,
            },
        ),
        (
            fixture!("malformed-time.status"),
            2,
            Fault::Time {
                field: "TIME",
                value: "2026-02-30 09:26:53".into(),
            },
        ),
        (
            fixture!("malformed-real-address.status"),
            4,
            Fault::RealAddress {
                value: "[10.180.3.41]:38422".into(),
            },
        ),
        (
            fixture!("malformed-counter.status"),
            4,
            Fault::Counter {
                field: "Bytes Received",
                value: "-1".into(),
            },
        ),
        (
            fixture!("malformed-short-route.status"),
            5,
            Fault::TooFewFields {
                kind: "ROUTING_TABLE",
                fields: 4,
                needs: 5,
            },
        ),
    ];
    for (bytes, line, fault) in cases {
        assert_eq!(parse(bytes), Err(ParseError { line, fault }));
    }
    let e = parse(fixture!("malformed-time.status")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 2: TIME \"2026-02-30 09:26:53\" is not a YYYY-MM-DD HH:MM:SS time"
    );
}

/// The files OpenVPN 2.6.14 wrote in our lab (`vpn-server/fixtures/`).
#[test]
fn files_captured_from_openvpn_2_6() {
    let v4 = parse(include_bytes!(
        "../../../fixtures/openvpn-2.6.14-status-v2-tcp4.csv"
    ))
    .unwrap();
    assert_eq!(v4.clients[0].real_address, addr("127.0.0.1:59364"));
    assert_eq!(v4.updated_at.unwrap().unix, 1_795_320_809);
    let v6 = parse(include_bytes!(
        "../../../fixtures/openvpn-2.6.14-status-v2-tcp6.csv"
    ))
    .unwrap();
    assert_eq!(v6.clients[0].real_address, addr("[::1]:0"));
    assert_eq!(v6.routes.len(), 4);
}

fn snapshot(real: &str, clients: usize) -> StatusSnapshot {
    let real = addr(real);
    StatusSnapshot {
        title: status::default_title(),
        now: 1_800_000_000,
        clients: (0..clients)
            .map(|i| ClientStatus {
                common_name: format!("vpn-shoot-client-{i}"),
                real_address: real,
                virtual_v4: Some("192.168.123.6".parse().unwrap()),
                virtual_v6: Some("fd8f:6d53:b97a:1::1000".parse().unwrap()),
                bytes_received: u64::MAX,
                bytes_sent: 7,
                connected_since: 1_799_999_000,
                username: None,
                client_id: i as u64,
                peer_id: i as u32,
                cipher: "CHACHA20-POLY1305".into(),
            })
            .collect(),
        routes: vec![RouteStatus {
            prefix: "100.96.0.0/11".parse().unwrap(),
            common_name: "vpn-shoot-client-0".into(),
            real_address: real,
            last_ref: 1_799_999_990,
        }],
        mac_routes: Vec::new(),
        shoot_routes: Vec::new(),
        max_bcast_queue: 0,
    }
}

#[test]
fn reads_what_our_writer_writes() {
    for real in [
        "100.64.0.7:41000",
        "[fd00::7]:41000",
        "[::ffff:100.64.0.7]:41000",
    ] {
        let written = snapshot(real, 2);
        let read = parse(status::render(&written).as_bytes()).unwrap();
        assert_eq!(read.title.as_deref(), Some(written.title.as_str()));
        assert_eq!(read.updated_at.unwrap().unix, 1_800_000_000);
        assert_eq!(read.clients.len(), 2);
        for (r, w) in read.clients.iter().zip(&written.clients) {
            assert_eq!(r.common_name, w.common_name);
            // 2.6 prints IPv6 peers without their port.
            let want = match w.real_address {
                SocketAddr::V4(a) => SocketAddr::V4(a),
                SocketAddr::V6(a) => SocketAddr::new((*a.ip()).into(), 0),
            };
            assert_eq!(r.real_address, want);
            assert_eq!(r.virtual_address, "192.168.123.6");
            assert_eq!(r.bytes_received, u64::MAX);
            assert_eq!(r.connected_since.unix, 1_799_999_000);
            assert_eq!(r.username, "UNDEF");
            assert_eq!(r.cipher, "CHACHA20-POLY1305");
        }
        assert_eq!(read.routes[0].virtual_address, "100.96.0.0/11");
        assert_eq!(read.routes[0].last_ref.unix, 1_799_999_990);
    }
    let empty = parse(status::render(&snapshot("10.0.0.1:1", 0)).as_bytes()).unwrap();
    assert!(empty.clients.is_empty());
}

#[test]
fn real_address_forms() {
    let ok = [
        ("100.64.0.7:41000", "100.64.0.7:41000"),
        ("100.64.0.7:041000", "100.64.0.7:41000"),
        ("100.64.0.7", "100.64.0.7:0"),
        ("fd00::7", "[fd00::7]:0"),
        ("FD00::7", "[fd00::7]:0"),
        ("::ffff:100.64.0.7", "[::ffff:100.64.0.7]:0"),
        ("fd00::7:4100", "[fd00::7:4100]:0"),
        ("[fd00::7]:41000", "[fd00::7]:41000"),
        ("[::ffff:100.64.0.7]:1", "[::ffff:100.64.0.7]:1"),
        ("tcp4-server:100.64.0.7:41000", "100.64.0.7:41000"),
        ("tcp6-server:[fd00::7]:41000", "[fd00::7]:41000"),
        ("tcp6-client:[fd00::7]:1", "[fd00::7]:1"),
        ("udp6:[fd00::7]:1", "[fd00::7]:1"),
        ("udp:100.64.0.7:1", "100.64.0.7:1"),
        ("tcp:fd00::7", "[fd00::7]:0"),
        ("udp4-server:100.64.0.7", "100.64.0.7:0"),
    ];
    for (text, want) in ok {
        assert_eq!(parse_real_address(text), Some(addr(want)), "{text}");
    }
    let refused = [
        "",
        "[fd00::7]",
        "[100.64.0.7]:1",
        "fd00::7]:1",
        "[fd00::7:1",
        "[fd00::7]:",
        "[fd00::7]:+1",
        "[fd00::7]:65536",
        "100.64.0.7:65536",
        "100.64.0.7:",
        "100.64.0.7:x",
        "100.064.0.7:1",
        "fe80::1%eth0",
        "::ffff:100.64.0.7:1",
        "tcp6-server:",
        "tcp6-server",
        "TCP6-SERVER:[fd00::7]:1",
        "tcp5:[fd00::7]:1",
        "sctp:[fd00::7]:1",
        "host.example:1194",
        " 100.64.0.7:1",
    ];
    for text in refused {
        assert_eq!(parse_real_address(text), None, "{text:?}");
    }
}

#[test]
fn times_as_go_reads_the_layout() {
    assert_eq!(at("1970-01-01 00:00:00").unix, 0);
    assert_eq!(at("2026-11-22 04:13:29").unix, 1_795_320_809);
    assert_eq!(at("2000-02-29 00:00:00").unix, 951_782_400);
    assert_eq!(at("2099-12-31 23:59:59").unix, 4_102_444_799);
    assert_eq!(at("1969-12-31 23:59:59").unix, -1);
    assert_eq!(at("0000-01-01 00:00:00").unix, -62_167_219_200);
    // A one-digit hour, runs of spaces and a fraction of a second are read.
    assert_eq!(at("2026-11-22 4:13:29").unix, 1_795_320_809);
    assert_eq!(at("2026-11-22   04:13:29").unix, 1_795_320_809);
    assert_eq!(
        at("2026-11-22 04:13:29.25"),
        Timestamp {
            unix: 1_795_320_809,
            nanos: 250_000_000
        }
    );
    assert_eq!(at("2026-11-22 04:13:29.1234567891").nanos, 123_456_789);
    for bad in [
        "",
        "2026-11-22",
        "2026-11-22 04:13",
        "2026-11-22T04:13:29",
        "26-11-22 04:13:29",
        "2026-1-22 04:13:29",
        "2026-11-2 04:13:29",
        "2026-11-22 04:3:29",
        "2026-11-22 04:13:9",
        "2026-11-22 004:13:29",
        "2026-13-01 00:00:00",
        "2026-00-01 00:00:00",
        "2026-04-31 00:00:00",
        "2026-02-29 00:00:00",
        "1900-02-29 00:00:00",
        "2026-11-00 00:00:00",
        "2026-11-22 24:00:00",
        "2026-11-22 23:60:00",
        "2026-11-22 23:59:60",
        "2026-11-22 04:13:29 ",
        "2026-11-22 04:13:29.",
        "2026-11-22 04:13:29Z",
        " 2026-11-22 04:13:29",
        "+026-11-22 04:13:29",
        "1795320809",
    ] {
        assert_eq!(parse_datetime(bad), None, "{bad:?}");
    }
    assert_eq!(at("2026-11-22 04:13:29").to_string(), "2026-11-22 04:13:29");
    assert_eq!(at("1969-12-31 23:59:59").to_string(), "1969-12-31 23:59:59");
}

#[test]
fn line_rules() {
    let head = "TITLE,x\nTIME,2026-11-22 04:13:29,1795320809\n";
    // CRLF, empty lines, END anywhere, no final newline, HEADER of any kind, TITLE with commas.
    let text = format!("TITLE,a,b\r\n\r\n{head}END\n\nHEADER,ANYTHING\nGLOBAL_STATS,n\nEND");
    let s = parse(text.as_bytes()).unwrap();
    assert_eq!(s.title.as_deref(), Some("x"));
    assert_eq!(s.global_stats, [("n".to_owned(), String::new())]);
    assert_eq!(parse(b"TITLE,a,b\n").unwrap().title.as_deref(), Some("a,b"));
    assert_eq!(parse(b"TITLE\n").unwrap().title.as_deref(), Some(""));
    assert_eq!(parse(b"").unwrap(), Status::default());
    // TIME needs only its second field; the last one counts.
    let s = parse(b"TIME,2026-11-22 04:13:29\nTIME,2026-11-22 04:13:30,1\n").unwrap();
    assert_eq!(s.updated_at.unwrap().unix, 1_795_320_810);
    let fault = |text: &str| parse(text.as_bytes()).unwrap_err().fault;
    assert_eq!(
        fault("TIME\n"),
        Fault::TooFewFields {
            kind: "TIME",
            fields: 1,
            needs: 2
        }
    );
    assert_eq!(
        fault("GLOBAL_STATS\n"),
        Fault::TooFewFields {
            kind: "GLOBAL_STATS",
            fields: 1,
            needs: 2
        }
    );
    assert_eq!(
        fault("END,\n"),
        Fault::UnknownType {
            first: "END".into()
        }
    );
    assert_eq!(fault(" \n"), Fault::UnknownType { first: " ".into() });
    assert_eq!(
        fault("title,x\n"),
        Fault::UnknownType {
            first: "title".into()
        }
    );
    assert_eq!(
        fault("TITLE\tx\n"),
        Fault::UnknownType {
            first: "TITLE\tx".into()
        }
    );
    // A long one is quoted by its start only (the probe's output and the log stay short).
    let long = format!("{}\n", "ü".repeat(MAX_LINE_LEN / 4));
    assert_eq!(
        fault(&long),
        Fault::UnknownType {
            first: format!("{}…", "ü".repeat(UNKNOWN_SHOWN))
        }
    );
    // Counters: unsigned decimal only.
    let row =
        |rx: &str| format!("CLIENT_LIST,c,1.2.3.4:5,,,{rx},0,2026-11-22 04:13:29,0,UNDEF,0,0,x\n");
    assert_eq!(
        parse(row("18446744073709551615").as_bytes())
            .unwrap()
            .clients[0]
            .bytes_received,
        u64::MAX
    );
    for bad in ["", "+1", "1e3", "18446744073709551616", " 1"] {
        assert!(matches!(fault(&row(bad)), Fault::Counter { .. }), "{bad:?}");
    }
    // More fields than 13 are fine; the date is checked before the address.
    let long = "CLIENT_LIST,c,bad,,,x,0,bad,0,UNDEF,0,0,x,extra\n";
    assert!(matches!(
        fault(long),
        Fault::Time {
            field: "Connected Since",
            ..
        }
    ));
    let s =
        parse(b"CLIENT_LIST,c,1.2.3.4:5,v4,not-ip,1,2,2026-11-22 04:13:29,junk,u,i,p,c,extra\n")
            .unwrap();
    assert_eq!(s.clients[0].virtual_ipv6, None);
    assert_eq!(s.clients[0].virtual_address, "v4");
}

#[test]
fn line_length_limit_of_go_s_scanner() {
    let line = |len: usize| format!("GLOBAL_STATS,{}\n", "x".repeat(len - 13));
    assert!(parse(line(MAX_LINE_LEN).as_bytes()).is_ok());
    assert_eq!(
        parse(line(MAX_LINE_LEN + 1).as_bytes()).unwrap_err().fault,
        Fault::TooLong {
            len: MAX_LINE_LEN + 1
        }
    );
    // The `\r` counts.
    let crlf = format!("GLOBAL_STATS,{}\r\n", "x".repeat(MAX_LINE_LEN - 13));
    assert!(parse(crlf.as_bytes()).is_err());
}
