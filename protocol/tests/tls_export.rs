#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)
//! An independent check of `TlsSession::export_keying_material` under TLS 1.2, where "no
//! context" (RFC 5705 `use_context = 0`, what OpenVPN uses) and "empty context" give different
//! keys: the exporter is recomputed here from the master secret (taken from OpenSSL's key log)
//! and the two hello randoms (read from the cleartext TLS 1.2 hellos) with the TLS 1.2 PRF
//! written on the `hmac`/`sha2` crates.

mod common;

use std::sync::{Arc, Mutex};

use common::{context_builder, make_ca, make_leaf, server_context, Usage};
use hmac::{Hmac, Mac};
use openssl::ssl::{SslVerifyMode, SslVersion};
use protocol::key::Role;
use protocol::tls::{AcceptAnyPeer, TlsSession, EXPORT_DYNAMIC_TLS_CRYPT_LABEL};
use sha2::{Sha256, Sha384};

/// `EXPORT_KEY_DATA_LABEL` (reference 7.2).
const DATA_KEYS_LABEL: &str = "EXPORTER-OpenVPN-datakeys";

#[derive(Clone, Copy)]
enum PrfHash {
    Sha256,
    Sha384,
}

fn hmac(h: PrfHash, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match h {
        PrfHash::Sha256 => {
            let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
            parts.iter().for_each(|p| m.update(p));
            m.finalize().into_bytes().to_vec()
        }
        PrfHash::Sha384 => {
            let mut m = Hmac::<Sha384>::new_from_slice(key).unwrap();
            parts.iter().for_each(|p| m.update(p));
            m.finalize().into_bytes().to_vec()
        }
    }
}

/// The TLS 1.2 PRF (RFC 5246 section 5): `P_hash(secret, label || seed)`.
fn tls12_prf(h: PrfHash, secret: &[u8], label: &[u8], seed: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut a = hmac(h, secret, &[label, seed]);
    while out.len() < len {
        out.extend_from_slice(&hmac(h, secret, &[&a, label, seed]));
        a = hmac(h, secret, &[&a]);
    }
    out.truncate(len);
    out
}

/// The 32-byte random of a cleartext TLS 1.2 ClientHello or ServerHello that starts `flight`:
/// record header (5), handshake header (4), legacy version (2), then the random.
fn hello_random(flight: &[u8], handshake_type: u8) -> [u8; 32] {
    assert_eq!(flight[0], 0x16, "handshake record");
    assert_eq!(flight[5], handshake_type);
    flight[11..43].try_into().unwrap()
}

#[test]
fn tls12_export_uses_no_context() {
    let ca = make_ca("Test CA");
    let server_id = make_leaf(&ca, "server", Usage::Server, 2);
    let client_id = make_leaf(&ca, "client", Usage::Client, 3);
    let max = Some(SslVersion::TLS1_2);

    let keylog = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut b = context_builder(&ca.cert, Some(&client_id), SslVerifyMode::PEER, max);
    let sink = Arc::clone(&keylog);
    b.set_keylog_callback(move |_, line| sink.lock().unwrap().push(line.to_owned()));
    let client_ctx = b.build();
    let server_ctx = server_context(&ca.cert, &server_id, max);

    let mut client = TlsSession::new(&client_ctx, Role::Client, Arc::new(AcceptAnyPeer)).unwrap();
    let mut server = TlsSession::new(&server_ctx, Role::Server, Arc::new(AcceptAnyPeer)).unwrap();
    client.process().unwrap();
    let client_hello = client.poll_ciphertext(usize::MAX).unwrap();
    server.feed_ciphertext(&client_hello);
    server.process().unwrap();
    let server_flight = server.poll_ciphertext(usize::MAX).unwrap();
    client.feed_ciphertext(&server_flight);
    client.process().unwrap();
    let client_flight = client.poll_ciphertext(usize::MAX).unwrap();
    server.feed_ciphertext(&client_flight);
    server.process().unwrap();
    let server_finished = server.poll_ciphertext(usize::MAX).unwrap();
    client.feed_ciphertext(&server_finished);
    client.process().unwrap();
    assert!(client.is_handshake_done() && server.is_handshake_done());

    let client_random = hello_random(&client_hello, 1);
    let server_random = hello_random(&server_flight, 2);
    // "CLIENT_RANDOM <client random hex> <master secret hex>"
    let lines = keylog.lock().unwrap().clone();
    let line = lines
        .iter()
        .find(|l| l.starts_with("CLIENT_RANDOM "))
        .unwrap();
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(hex::decode(fields[1]).unwrap(), client_random);
    let master = hex::decode(fields[2]).unwrap();
    assert_eq!(master.len(), 48);

    let cipher = client.cipher_name().unwrap();
    let h = if cipher.ends_with("SHA384") {
        PrfHash::Sha384
    } else {
        PrfHash::Sha256
    };
    let seed = [client_random, server_random].concat();
    for label in [DATA_KEYS_LABEL, EXPORT_DYNAMIC_TLS_CRYPT_LABEL] {
        let expected = tls12_prf(h, &master, label.as_bytes(), &seed, 256);
        assert_eq!(
            client.export_keying_material(label, 256).unwrap(),
            expected,
            "{label}"
        );
        assert_eq!(
            server.export_keying_material(label, 256).unwrap(),
            expected,
            "{label}"
        );
        // With an empty context (`use_context = 1`, length 0) the seed would end in 00 00 and
        // the keys would differ: the trap reference 7.2 warns about.
        let with_empty_context = tls12_prf(
            h,
            &master,
            label.as_bytes(),
            &[&seed[..], &[0, 0]].concat(),
            256,
        );
        assert_ne!(expected, with_empty_context);
    }
}
