//! PROXY protocol headers on a TCP listener (`ProxyHeader::check_tcp_listener`): version 2
//! `PROXY` only with `STREAM` over `AF_INET` / `AF_INET6`; `LOCAL` and version 1 always. The
//! headers are written out byte by byte: signature, version/command, family/transport,
//! big-endian length, address block.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use protocol::proxy_protocol::{parse, ProxyError, Transport};

const SIG: [u8; 12] = [
    0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
];

/// 192.0.2.7:5000 -> 198.51.100.1:8443
const INET: [u8; 12] = [192, 0, 2, 7, 198, 51, 100, 1, 0x13, 0x88, 0x20, 0xfb];

fn header(ver_cmd: u8, fam: u8, block: &[u8]) -> Vec<u8> {
    let mut out = SIG.to_vec();
    out.extend_from_slice(&[ver_cmd, fam]);
    out.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    out.extend_from_slice(block);
    out
}

fn inet6() -> Vec<u8> {
    let mut block = vec![0x20, 0x01, 0x0d, 0xb8];
    block.extend_from_slice(&[0; 11]);
    block.push(1);
    block.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    block.extend_from_slice(&[0; 11]);
    block.push(2);
    block.extend_from_slice(&[0x13, 0x88, 0x20, 0xfb]);
    block
}

fn on_tcp(bytes: &[u8]) -> Result<(), ProxyError> {
    let (h, used) = parse(bytes).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    h.check_tcp_listener()
}

#[test]
fn stream_over_inet_and_inet6_pass() {
    // \r\n\r\n\0\r\nQUIT\n 0x21 0x11 0x000c + block: PROXY, TCP over IPv4.
    let v4 = header(0x21, 0x11, &INET);
    assert_eq!(v4.len(), 28);
    assert_eq!(&v4[12..16], &[0x21, 0x11, 0x00, 0x0c]);
    assert_eq!(on_tcp(&v4), Ok(()));
    // PROXY, TCP over IPv6: length 0x0024.
    let v6 = header(0x21, 0x21, &inet6());
    assert_eq!(&v6[12..16], &[0x21, 0x21, 0x00, 0x24]);
    assert_eq!(on_tcp(&v6), Ok(()));
}

#[test]
fn local_passes_whatever_its_block_says() {
    for (fam, block) in [
        (0x00, Vec::new()),
        (0x11, INET.to_vec()),
        (0x12, INET.to_vec()),
        (0x32, vec![0; 216]),
    ] {
        assert_eq!(on_tcp(&header(0x20, fam, &block)), Ok(()), "{fam:#04x}");
    }
}

#[test]
fn version_1_passes() {
    assert_eq!(
        on_tcp(b"PROXY TCP4 192.0.2.7 198.51.100.1 5000 8443\r\n"),
        Ok(())
    );
    assert_eq!(on_tcp(b"PROXY UNKNOWN\r\n"), Ok(()));
}

#[test]
fn datagram_unix_and_unspecified_proxy_headers_are_refused() {
    let cases: [(u8, Vec<u8>, u8, Transport); 7] = [
        // UDP over IPv4: the case of the issue.
        (0x12, INET.to_vec(), 1, Transport::Dgram),
        // UDP over IPv6.
        (0x22, inet6(), 2, Transport::Dgram),
        // AF_UNIX stream and datagram (two 108-byte paths).
        (0x31, vec![b'/'; 216], 3, Transport::Stream),
        (0x32, vec![b'/'; 216], 3, Transport::Dgram),
        // PROXY with nothing to proxy.
        (0x00, Vec::new(), 0, Transport::Unspec),
        // Inet addresses with an unspecified transport.
        (0x10, INET.to_vec(), 1, Transport::Unspec),
        (0x20, inet6(), 2, Transport::Unspec),
    ];
    for (fam, block, family, transport) in cases {
        let bytes = header(0x21, fam, &block);
        assert_eq!(
            on_tcp(&bytes),
            Err(ProxyError::V2NotTcp { family, transport }),
            "{fam:#04x}"
        );
    }
    // The exact bytes of the first case, for the record.
    assert_eq!(
        header(0x21, 0x12, &INET),
        [
            0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, 0x21, 0x12,
            0x00, 0x0c, 192, 0, 2, 7, 198, 51, 100, 1, 0x13, 0x88, 0x20, 0xfb
        ]
    );
    let msg = on_tcp(&header(0x21, 0x12, &INET)).unwrap_err().to_string();
    assert!(msg.contains("family 1") && msg.contains("Dgram"), "{msg}");
}
