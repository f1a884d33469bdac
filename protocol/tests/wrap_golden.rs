//! Golden packets from a real OpenVPN 2.6.14 server, captured once and never recomputed (how:
//! `tests/data/wrap_golden_client.py`, key `tests/data/genkey-2.6.14.key`).
//!
//! For each protection a client sent its P_CONTROL_HARD_RESET_CLIENT_V2 (pid 1) and the server
//! answered with P_CONTROL_HARD_RESET_SERVER_V2, which proves the server authenticated the
//! client packet. Here: our `wrap` produces the accepted client packet byte for byte, and our
//! client-side `unwrap` authenticates the server's reply.

#![allow(clippy::unwrap_used)] // Integration tests are not `cfg(test)`, so `allow-unwrap-in-tests` misses them.

use bytes::BytesMut;
use protocol::digest::Digest;
use protocol::key::{Key2, KeyDirection, Role};
use protocol::static_key;
use protocol::wrap::{ControlWrap, TlsAuth, TlsCrypt, WrapError};

const TA_KEY: &str = include_str!("data/genkey-2.6.14.key");

/// `(name, client packet sent, server reply)`, hex, without the TCP length prefix.
const CAPTURES: [(&str, &str, &str); 3] = [
    (
        "tls-auth SHA1",
        "384c21f62a947c7a585d6833f091c9a279b28804007c9ec611c08181e3000000016b025f6a0000000000",
        "40ff095f7ddb2cf09b4fee2df46b348c608073c51f36fab1ca33cb6d1f000000016b025f6a01000000004c21f62a947c7a5800000000",
    ),
    (
        "tls-auth SHA256",
        "38653907b6b3e12cb58daa167c9e8a5fdaa0119c2cc55d1dc977fd9e807dd7daa4791c6969bdbbf42e000000016b025f6c0000000000",
        "40b29c10f2312988abb23aedad4dba961058f8776a509613e50f65e611dc59d5fc16e1a151332bf6d2000000016b025f6d0100000000653907b6b3e12cb500000000",
    ),
    (
        "tls-crypt",
        "38ce37b6a2c9f09683000000016b025f6ecb0db8f0501b67d8d51728217653fa978e112dd809d186861f927f7ae75cc3ebc87dd19d13",
        "4062a5c160bd7c94fb000000016b025f6f80848ae42892e552defa7b31703b4ed004d6e359978d2772a9c33708a4379d7632d9bc244a19659439505fea73a37cafea",
    ),
];

/// (client side, server side) contexts for a capture.
fn contexts(name: &str, key: &Key2) -> (ControlWrap, ControlWrap) {
    let auth = |dir, digest| ControlWrap::Auth(TlsAuth::new(key, dir, digest));
    match name {
        "tls-auth SHA1" => (
            auth(KeyDirection::Inverse, Digest::Sha1),
            auth(KeyDirection::Normal, Digest::Sha1),
        ),
        "tls-auth SHA256" => (
            auth(KeyDirection::Inverse, Digest::Sha256),
            auth(KeyDirection::Normal, Digest::Sha256),
        ),
        _ => (
            ControlWrap::Crypt(TlsCrypt::new(key, Role::Client)),
            ControlWrap::Crypt(TlsCrypt::new(key, Role::Server)),
        ),
    }
}

#[test]
fn real_openvpn_hard_reset_exchange() {
    let key = static_key::parse(TA_KEY).unwrap();
    for (name, sent, reply) in CAPTURES {
        let sent = hex::decode(sent).unwrap();
        let reply = hex::decode(reply).unwrap();
        let (mut client, mut server) = contexts(name, &key);

        // The server side of our code accepts what the real server accepted ...
        let mut client_plain = BytesMut::new();
        let pid = server.unwrap(&sent, 0, &mut client_plain).unwrap().unwrap();
        assert_eq!(pid.id, 1, "{name}");
        let client_sid = &client_plain[1..9];
        assert_eq!(client_plain[0], 0x38, "{name}");
        assert_eq!(
            &client_plain[9..],
            &[0, 0, 0, 0, 0],
            "{name}: no acks, msg id 0"
        );

        // ... and our client wraps exactly those bytes from the plaintext and time.
        let mut rewrapped = BytesMut::new();
        client
            .wrap(&client_plain, pid.time, &mut rewrapped)
            .unwrap();
        assert_eq!(hex::encode(&rewrapped), hex::encode(&sent), "{name}");

        // The client side unwraps the real server's reply: it acks msg 0 of our session.
        let mut server_plain = BytesMut::new();
        let got = client
            .unwrap(&reply, 0, &mut server_plain)
            .unwrap()
            .unwrap();
        assert_eq!(got.id, 1, "{name}: the server's first packet");
        assert_eq!(
            server_plain[0], 0x40,
            "{name}: HARD_RESET_SERVER_V2, key id 0"
        );
        assert_eq!(server_plain[9], 1, "{name}: one ack");
        assert_eq!(&server_plain[10..14], &[0, 0, 0, 0], "{name}: acks msg 0");
        assert_eq!(&server_plain[14..22], client_sid, "{name}: remote sid");
        assert_eq!(
            &server_plain[22..],
            &[0, 0, 0, 0],
            "{name}: msg id 0, empty"
        );
        assert_eq!(server_plain.len() + client.overhead(), reply.len());

        // The same reply is refused as a replay, and any flipped bit fails authentication.
        assert!(matches!(
            client.unwrap(&reply, 0, &mut BytesMut::new()),
            Err(WrapError::Replay(_))
        ));
        for bit in 0..reply.len() * 8 {
            let mut bad = reply.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                client.unwrap(&bad, 0, &mut BytesMut::new()),
                Err(WrapError::AuthenticationFailed),
                "{name}: bit {bit}"
            );
        }
        // A receiver with the server's key direction cannot read the server's packets.
        let (_, mut wrong) = contexts(name, &key);
        assert_eq!(
            wrong.unwrap(&reply, 0, &mut BytesMut::new()),
            Err(WrapError::AuthenticationFailed),
            "{name}"
        );
    }
}
