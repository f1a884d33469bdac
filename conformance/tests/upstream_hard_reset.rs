//! Interop: a real upstream OpenVPN 2.6 TCP server answers our tls-auth wrapped
//! P_CONTROL_HARD_RESET_CLIENT_V2 with a P_CONTROL_HARD_RESET_SERVER_V2 that acknowledges it.
//!
//! Setup: fresh namespace, fixture PKI, `openvpn` with `proto tcp-server`, `tls-auth ta.key 0`,
//! default `auth SHA1`, on 127.0.0.1 inside the namespace. The test's own TCP socket lives in
//! the namespace through `Netns::run_in`. Everything is torn down by the guards' drops, also
//! when an assertion fails.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};

mod common;
use common::local_tls_auth;

const PORT: u16 = 11940;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn upstream_server_answers_hard_reset_with_tls_auth_sha1() {
    require_lab(&["openvpn", "openssl"]);
    let ns = Netns::new().expect("create lab namespace");
    let pki = TestPki::generate().expect("generate fixture PKI");
    let server = UpstreamOpenvpn::start(
        &ns,
        &tcp_server_config(&pki, PORT, ControlWrap::TlsAuth, &[]),
        4,
    )
    .expect("start upstream openvpn");
    server
        .wait_listening(IO_TIMEOUT)
        .expect("upstream openvpn listening");

    let key = local_tls_auth::parse_static_key(&pki.ta_key_text().expect("read ta.key"))
        .expect("parse ta.key");
    let client_sid: [u8; 8] = *b"\x11\x22\x33\x44\x55\x66\x77\x88";
    let now = u32::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs(),
    )
    .expect("time fits u32");
    let hard_reset = local_tls_auth::hard_reset_client_v2(&key, client_sid, 1, now);

    let reply = ns
        .run_in(|| {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
            let mut stream =
                TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect to upstream");
            stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
            let len = u16::try_from(hard_reset.len()).expect("short packet");
            let mut framed = len.to_be_bytes().to_vec();
            framed.extend_from_slice(&hard_reset);
            stream.write_all(&framed).expect("send hard reset");
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).expect("read reply length");
            let mut packet = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut packet).expect("read reply");
            packet
        })
        .expect("run in namespace");

    let log = server.log();
    assert_eq!(
        reply.first(),
        Some(&0x40),
        "expected P_CONTROL_HARD_RESET_SERVER_V2/key_id 0, got {}; server log:\n{log}",
        hex::encode(&reply)
    );
    let parsed = local_tls_auth::parse_from_server(&key, &reply)
        .unwrap_or_else(|e| panic!("reply {}: {e}; server log:\n{log}", hex::encode(&reply)));
    assert_eq!(parsed.acks, vec![0], "server must ACK our message id 0");
    assert_eq!(
        parsed.remote_sid,
        Some(client_sid),
        "server must name our sid"
    );
    assert_eq!(parsed.msg_id, Some(0), "server reset is its message 0");
    assert!(
        parsed.payload.is_empty(),
        "2.6 sends an empty reset payload"
    );
    assert_eq!(parsed.replay_pid, 1, "first tls-auth packet id is 1");
    assert_ne!(parsed.own_sid, [0u8; 8], "server sid is never zero");
    assert_eq!(
        reply.len(),
        54,
        "HARD_RESET_SERVER_V2 with SHA1 tls-auth is 54 bytes"
    );
    assert!(
        log.contains("TLS: Initial packet from"),
        "server should log our hard reset; log:\n{log}"
    );
}

#[test]
fn local_tls_auth_matches_reference_kat() {
    // Reference section 2.2: key bytes 00..ff, direction 1 sending, SHA1, sid 0102..08,
    // pid 1, net_time 0x5f5e1000, HARD_RESET_CLIENT_V2, msg id 0, no acks.
    let key: [u8; 256] = std::array::from_fn(|i| u8::try_from(i).expect("< 256"));
    let packet =
        local_tls_auth::hard_reset_client_v2(&key, [1, 2, 3, 4, 5, 6, 7, 8], 1, 0x5f5e_1000);
    assert_eq!(
        hex::encode(packet),
        "380102030405060708\
         96b7589b44a2a9a9add1a68bbf912284c02ea84b\
         000000015f5e10000000000000"
    );
}
