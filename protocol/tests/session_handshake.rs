//! Client and server sessions in memory: the full handshake (hard reset, TLS, key method 2,
//! push) and data both ways, for every data cipher and both TLS versions.

#![allow(clippy::unwrap_used)]

mod common;
mod session_util;

use openssl::ssl::SslVersion;
use protocol::data::DataCipher;
use protocol::push::PushedOption;
use protocol::session::Event;
use session_util::Setup;

fn connected_info(events: &[Event]) -> &protocol::session::Connected {
    events
        .iter()
        .find_map(|e| match e {
            Event::Connected(c) => Some(c),
            _ => None,
        })
        .expect("connected")
}

fn exchange(pair: &mut session_util::Pair, rounds: usize) {
    for i in 0..rounds {
        let up = format!("client packet {i}").into_bytes();
        let down = vec![i as u8; 1 + i * 37 % 1400];
        pair.send_data(true, &up).unwrap();
        pair.send_data(false, &down).unwrap();
        pair.pump();
        assert_eq!(
            pair.server_tun.last().map(|b| &b[..]),
            Some(&up[..]),
            "server errors {:?} {:?}",
            pair.server_errors,
            pair.server_events
        );
        assert_eq!(pair.client_tun.last().map(|b| &b[..]), Some(&down[..]));
    }
    assert_eq!(pair.server_tun.len(), rounds);
    assert_eq!(pair.client_tun.len(), rounds);
}

#[test]
fn handshake_and_data_every_cipher() {
    for (i, cipher) in DataCipher::ALL.into_iter().enumerate() {
        let mut pair = Setup::new(100 + i as u64).cipher(cipher).build();
        pair.connect();
        let c = connected_info(&pair.client_events);
        assert_eq!(c.cipher, cipher);
        assert!(c.tls_ekm, "EKM negotiated");
        assert!(c.dyn_tls_crypt);
        let s = connected_info(&pair.server_events);
        assert_eq!(s.cipher, cipher);
        assert_eq!(
            s.client.as_ref().and_then(|c| c.common_name.as_deref()),
            Some("alice")
        );
        assert!(c
            .push
            .accepted
            .iter()
            .any(|o| matches!(o, PushedOption::Ifconfig { .. })));
        exchange(&mut pair, 20);
        assert!(pair.client_errors.is_empty(), "{:?}", pair.client_errors);
        assert!(pair.server_errors.is_empty(), "{:?}", pair.server_errors);
    }
}

#[test]
fn handshake_tls12_and_prf_keys() {
    for (i, cipher) in [DataCipher::Aes256Gcm, DataCipher::Aes256Cbc]
        .into_iter()
        .enumerate()
    {
        let mut setup = Setup::with_tls(200 + i as u64, Some(SslVersion::TLS1_2)).cipher(cipher);
        // Without EKM both sides derive data keys with the TLS 1.0 PRF.
        setup.client.tls_ekm = false;
        setup.client.dyn_tls_crypt = false;
        let mut pair = setup.build();
        pair.connect();
        let c = connected_info(&pair.client_events);
        assert!(!c.tls_ekm);
        assert!(!connected_info(&pair.server_events).tls_ekm);
        exchange(&mut pair, 10);
    }
}

#[test]
fn push_reply_in_upstream_order() {
    let mut setup = Setup::new(7);
    setup.server.keepalive = Some(protocol::session::Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    let mut pair = setup.build();
    pair.connect();
    let s = connected_info(&pair.server_events);
    let kinds: Vec<String> = s
        .push
        .accepted
        .iter()
        .map(|o| {
            format!("{o:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "RouteGateway",
            "Topology",
            "Ping",
            "PingRestart",
            "Ifconfig",
            "PeerId",
            "Cipher",
            "ProtocolFlags",
            "TunMtu"
        ]
    );
}

/// The options of our `PUSH_REPLY`, byte for byte as the client received them: upstream's
/// text for this setup (the configuration's pushes, keepalive, `ifconfig`, the protocol
/// options; compare `push_golden.rs`).
#[test]
fn push_reply_text_is_upstreams() {
    let mut setup = Setup::new(7);
    setup.server.keepalive = Some(protocol::session::Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    let mut pair = setup.build();
    pair.connect();
    let c = connected_info(&pair.client_events);
    assert_eq!(
        c.push.accepted_texts.join(","),
        "route-gateway 10.8.0.1,topology subnet,ping 10,ping-restart 60,\
         ifconfig 10.8.0.2 255.255.255.0,peer-id 0,cipher AES-256-GCM,\
         protocol-flags cc-exit tls-ekm dyn-tls-crypt,tun-mtu 1500"
    );
}
