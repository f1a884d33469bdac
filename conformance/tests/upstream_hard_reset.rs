//! Interop: a real upstream OpenVPN 2.6 TCP server answers the P_CONTROL_HARD_RESET_CLIENT_V2
//! that our `protocol` crate builds and wraps, with a P_CONTROL_HARD_RESET_SERVER_V2 that our
//! code authenticates and parses: it acknowledges our message 0 and names our session id.
//! Once with tls-auth SHA1 (OpenVPN's default), once with `auth SHA256`, once with tls-crypt.
//!
//! Setup per case: a fresh namespace, fixture PKI, `openvpn` with `proto tcp-server` on
//! 127.0.0.1 inside the namespace; our TCP socket lives there through `Netns::run_in`. The
//! guards tear everything down, also when an assertion fails.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::probe::{hard_reset_exchange, hex, Protection};
use conformance::require_lab;
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};
use protocol::digest::Digest;
use protocol::ids::{MessageId, SessionId};
use protocol::packet::ControlOpcode;
use protocol::static_key;

const PORT: u16 = 11940;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn exchange_with_upstream(protection: Protection) {
    require_lab(&["openvpn", "openssl"]);
    let ns = Netns::new().expect("create lab namespace");
    let pki = TestPki::generate().expect("generate fixture PKI");
    let (wrap, extra): (ControlWrap, &[&str]) = match protection {
        Protection::TlsAuth(Digest::Sha1) => (ControlWrap::TlsAuth, &[]),
        Protection::TlsAuth(Digest::Sha256) => (ControlWrap::TlsAuth, &["auth SHA256"]),
        Protection::TlsAuth(Digest::Sha512) => (ControlWrap::TlsAuth, &["auth SHA512"]),
        Protection::TlsCrypt => (ControlWrap::TlsCrypt, &[]),
    };
    let server = UpstreamOpenvpn::start(&ns, &tcp_server_config(&pki, PORT, wrap, extra), 4)
        .expect("start upstream openvpn");
    server
        .wait_listening(IO_TIMEOUT)
        .expect("upstream openvpn listening");

    let key = static_key::parse(&pki.ta_key_text().expect("read ta.key")).expect("parse ta.key");
    let client_sid = SessionId([0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let now = u32::try_from(now).expect("time fits u32");

    let exchange = ns
        .run_in(|| {
            hard_reset_exchange(
                SocketAddr::from((Ipv4Addr::LOCALHOST, PORT)),
                &key,
                protection,
                client_sid,
                now,
                IO_TIMEOUT,
            )
        })
        .expect("run in namespace")
        .unwrap_or_else(|e| panic!("{protection:?}: {e:?}; server log:\n{}", server.log()));

    let log = server.log();
    let reply = exchange.reply().expect("reply parses");
    let ctx = format!(
        "{protection:?}: sent {}, got {}; server log:\n{log}",
        hex(&exchange.sent),
        hex(&exchange.reply_wire)
    );
    assert_eq!(reply.opcode, ControlOpcode::HardResetServerV2, "{ctx}");
    assert_eq!(reply.key_id.get(), 0, "{ctx}");
    assert_eq!(
        reply.acks.as_slice(),
        &[MessageId(0)],
        "server must ACK our reset: {ctx}"
    );
    assert_eq!(reply.remote_session_id, Some(client_sid), "{ctx}");
    assert_eq!(reply.message_id, Some(MessageId(0)), "{ctx}");
    assert!(
        reply.payload.is_empty(),
        "2.6 sends an empty reset payload: {ctx}"
    );
    assert!(!reply.session_id.is_undefined(), "{ctx}");
    assert!(
        log.contains("TLS: Initial packet from"),
        "the server accepted our hard reset: {ctx}"
    );
}

#[test]
fn upstream_answers_our_hard_reset_tls_auth_sha1() {
    exchange_with_upstream(Protection::TlsAuth(Digest::Sha1));
}

#[test]
fn upstream_answers_our_hard_reset_tls_auth_sha256() {
    exchange_with_upstream(Protection::TlsAuth(Digest::Sha256));
}

#[test]
fn upstream_answers_our_hard_reset_tls_crypt() {
    exchange_with_upstream(Protection::TlsCrypt);
}
