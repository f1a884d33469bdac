#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)
//! The control channel's TLS engine through its public API: two `TlsSession`s, a client and a
//! server, pumped against each other in memory (no sockets, no clock). Handshakes under TLS 1.3
//! and 1.2 with ECDSA P-256 certificates, key export, record boundaries, certificate refusals,
//! the `PeerVerifier` hook, byte-at-a-time delivery, corruption and close_notify.

mod common;

use std::sync::Arc;

use common::{
    client_context, context, make_ca, make_leaf, make_leaf_valid, server_context, Identity, Usage,
};
use openssl::nid::Nid;
use openssl::ssl::{SslContext, SslVerifyMode, SslVersion};
use openssl::x509::X509Ref;
use protocol::key::Role;
use protocol::tls::{
    AcceptAnyPeer, PeerCertError, PeerVerifier, TlsError, TlsSession,
    EXPORT_DYNAMIC_TLS_CRYPT_LABEL, TLS_CHANNEL_BUF_SIZE,
};

/// `EXPORT_KEY_DATA_LABEL` (reference 7.2); the constant itself belongs to `protocol::kdf`.
const DATA_KEYS_LABEL: &str = "EXPORTER-OpenVPN-datakeys";

/// Both TLS versions OpenVPN 2.6 negotiates, as `set_max_proto_version` arguments.
const VERSIONS: [SslVersion; 2] = [SslVersion::TLS1_3, SslVersion::TLS1_2];

struct Pki {
    ca: Identity,
    server: Identity,
    client: Identity,
}

fn pki() -> Pki {
    let ca = make_ca("Test CA");
    let server = make_leaf(&ca, "server", Usage::Server, 2);
    let client = make_leaf(&ca, "client", Usage::Client, 3);
    Pki { ca, server, client }
}

fn cn(cert: &X509Ref) -> String {
    let entry = cert
        .subject_name()
        .entries_by_nid(Nid::COMMONNAME)
        .next()
        .unwrap();
    String::from_utf8(entry.data().as_slice().to_vec()).unwrap()
}

/// A client and a server session wired together. Ciphertext moves in chunks of at most
/// `chunk` bytes, each followed by a `process`, until neither side has anything left to send.
/// A side that fails keeps its error and is not driven again (its queued alert still goes out).
struct Pair {
    client: TlsSession,
    server: TlsSession,
    client_err: Option<TlsError>,
    server_err: Option<TlsError>,
    chunk: usize,
}

impl Pair {
    fn new(client_ctx: &SslContext, server_ctx: &SslContext) -> Pair {
        Pair::with_verifiers(
            client_ctx,
            server_ctx,
            Arc::new(AcceptAnyPeer),
            Arc::new(AcceptAnyPeer),
        )
    }

    fn with_verifiers(
        client_ctx: &SslContext,
        server_ctx: &SslContext,
        client_verifier: Arc<dyn PeerVerifier>,
        server_verifier: Arc<dyn PeerVerifier>,
    ) -> Pair {
        let client = TlsSession::new(client_ctx, Role::Client, client_verifier).unwrap();
        let server = TlsSession::new(server_ctx, Role::Server, server_verifier).unwrap();
        Pair {
            client,
            server,
            client_err: None,
            server_err: None,
            chunk: usize::MAX,
        }
    }

    /// Runs both sides until quiet.
    fn pump(&mut self) {
        if self.client_err.is_none() {
            if let Err(e) = self.client.process() {
                self.client_err = Some(e);
            }
        }
        loop {
            let a = transfer(
                &mut self.client,
                &mut self.server,
                &mut self.server_err,
                self.chunk,
            );
            let b = transfer(
                &mut self.server,
                &mut self.client,
                &mut self.client_err,
                self.chunk,
            );
            if !a && !b {
                break;
            }
        }
    }

    fn handshake(&mut self) {
        self.pump();
        assert!(self.client_err.is_none(), "client: {:?}", self.client_err);
        assert!(self.server_err.is_none(), "server: {:?}", self.server_err);
        assert!(self.client.is_handshake_done());
        assert!(self.server.is_handshake_done());
    }
}

/// Moves `from`'s ciphertext to `to` in chunks; returns whether anything moved.
fn transfer(
    from: &mut TlsSession,
    to: &mut TlsSession,
    to_err: &mut Option<TlsError>,
    chunk: usize,
) -> bool {
    let mut moved = false;
    while let Some(bytes) = from.poll_ciphertext(chunk) {
        moved = true;
        if to_err.is_some() {
            continue;
        }
        to.feed_ciphertext(&bytes);
        if let Err(e) = to.process() {
            *to_err = Some(e);
        }
    }
    moved
}

fn plaintext_records(s: &mut TlsSession) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| s.poll_plaintext().map(|b| b.to_vec())).collect()
}

fn pair_for(pki: &Pki, max: SslVersion) -> Pair {
    let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
    let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
    Pair::new(&client_ctx, &server_ctx)
}

#[test]
fn full_handshake_both_versions() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        assert!(!p.client.is_handshake_done());
        // The client speaks first; the server has nothing to say before the ClientHello.
        p.client.process().unwrap();
        assert!(p.client.pending_ciphertext_len() > 0);
        p.server.process().unwrap();
        assert_eq!(p.server.pending_ciphertext_len(), 0);
        p.handshake();

        for s in [&p.client, &p.server] {
            assert_eq!(s.protocol_version(), Some(max));
            let name = s.cipher_name().unwrap();
            match max {
                SslVersion::TLS1_3 => {
                    assert_eq!(s.protocol_version_str(), "TLSv1.3");
                    assert!(name.starts_with("TLS_AES_") || name.starts_with("TLS_CHACHA20"));
                }
                _ => {
                    assert_eq!(s.protocol_version_str(), "TLSv1.2");
                    assert!(name.starts_with("ECDHE-ECDSA-"), "{name}");
                }
            }
        }
        assert_eq!(p.client.cipher_name(), p.server.cipher_name());

        // Each side sees the other's leaf, and the verified chain runs leaf -> CA.
        assert_eq!(cn(&p.client.peer_certificate().unwrap()), "server");
        assert_eq!(cn(&p.server.peer_certificate().unwrap()), "client");
        let chain = p.client.peer_chain();
        assert_eq!(
            chain.iter().map(|c| cn(c)).collect::<Vec<_>>(),
            ["server", "Test CA"]
        );
        let chain = p.server.peer_chain();
        assert_eq!(
            chain.iter().map(|c| cn(c)).collect::<Vec<_>>(),
            ["client", "Test CA"]
        );
        assert_eq!(p.client.role(), Role::Client);
        assert_eq!(p.server.role(), Role::Server);
        // NewSessionTickets (TLS 1.3) and the like never surface as plaintext.
        assert!(p.client.poll_plaintext().is_none());
        assert!(p.server.poll_plaintext().is_none());
    }
}

#[test]
fn exported_keying_material_agrees() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.handshake();
        let c_data = p
            .client
            .export_keying_material(DATA_KEYS_LABEL, 256)
            .unwrap();
        let s_data = p
            .server
            .export_keying_material(DATA_KEYS_LABEL, 256)
            .unwrap();
        assert_eq!(c_data.len(), 256);
        assert_eq!(c_data, s_data);
        let c_dyn = p
            .client
            .export_keying_material(EXPORT_DYNAMIC_TLS_CRYPT_LABEL, 256)
            .unwrap();
        let s_dyn = p
            .server
            .export_keying_material(EXPORT_DYNAMIC_TLS_CRYPT_LABEL, 256)
            .unwrap();
        assert_eq!(c_dyn, s_dyn);
        assert_ne!(c_data, c_dyn);
        assert_ne!(c_data, vec![0u8; 256]);
        // The Key2 form holds the same bytes.
        let k = p.client.export_key2(DATA_KEYS_LABEL).unwrap();
        assert_eq!(k.to_bytes().to_vec(), c_data);
        assert_eq!(p.server.export_key2(DATA_KEYS_LABEL).unwrap(), k);

        // A different TLS session exports different material.
        let mut q = pair_for(&pki, max);
        q.handshake();
        assert_ne!(
            q.client
                .export_keying_material(DATA_KEYS_LABEL, 256)
                .unwrap(),
            c_data
        );
    }
}

#[test]
fn export_before_handshake_is_refused_without_harm() {
    let pki = pki();
    let mut p = pair_for(&pki, SslVersion::TLS1_3);
    let err = p
        .client
        .export_keying_material(DATA_KEYS_LABEL, 256)
        .unwrap_err();
    assert!(matches!(err, TlsError::HandshakeIncomplete));
    assert!(!err.is_fatal());
    p.handshake();
}

#[test]
fn thousand_byte_message_round_trip() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.handshake();
        let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        p.client.write_message(&msg).unwrap();
        p.pump();
        assert_eq!(plaintext_records(&mut p.server), vec![msg.clone()]);
        let reply: Vec<u8> = msg.iter().rev().copied().collect();
        p.server.write_message(&reply).unwrap();
        p.pump();
        assert_eq!(plaintext_records(&mut p.client), vec![reply]);
    }
}

#[test]
fn each_message_is_its_own_record() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.handshake();
        // Written back to back, delivered to the reader in one feed of ciphertext.
        let first = b"PUSH_REQUEST\0".to_vec();
        let second = b"PUSH_REPLY,ping 10,ping-restart 60\0".to_vec();
        p.client.write_message(&first).unwrap();
        p.client.write_message(&second).unwrap();
        let mut all = Vec::new();
        while let Some(b) = p.client.poll_ciphertext(usize::MAX) {
            all.extend_from_slice(&b);
        }
        p.server.feed_ciphertext(&all);
        p.server.process().unwrap();
        assert_eq!(p.server.poll_plaintext().unwrap(), first);
        assert_eq!(p.server.poll_plaintext().unwrap(), second);
        assert!(p.server.poll_plaintext().is_none());

        // The largest message OpenVPN accepts still travels as one record.
        let big = vec![b'x'; TLS_CHANNEL_BUF_SIZE];
        p.server.write_message(&big).unwrap();
        p.server.write_message(b"RESTART\0").unwrap();
        p.pump();
        assert_eq!(
            plaintext_records(&mut p.client),
            vec![big, b"RESTART\0".to_vec()]
        );
    }
}

#[test]
fn message_written_during_handshake_follows_it() {
    // The client writes its key-method-2 message at S_START, before TLS has finished; the
    // server writes its reply once it has read the client's (reference 4.5).
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        let km2 = [0u8, 0, 0, 0, 2, 0xaa, 0xbb];
        p.client.write_message(&km2).unwrap();
        p.client.write_message(b"second\0").unwrap();
        p.handshake();
        assert_eq!(
            plaintext_records(&mut p.server),
            vec![km2.to_vec(), b"second\0".to_vec()]
        );
    }
}

#[test]
fn oversized_and_empty_messages_are_refused_without_harm() {
    let pki = pki();
    let mut p = pair_for(&pki, SslVersion::TLS1_3);
    p.handshake();
    let err = p
        .client
        .write_message(&vec![0u8; TLS_CHANNEL_BUF_SIZE + 1])
        .unwrap_err();
    assert!(matches!(
        err,
        TlsError::MessageTooLong {
            len: 2049,
            max: 2048
        }
    ));
    assert!(!err.is_fatal());
    let err = p.client.write_message(&[]).unwrap_err();
    assert!(matches!(err, TlsError::EmptyMessage));
    assert!(!err.is_fatal());
    assert_eq!(p.client.pending_ciphertext_len(), 0);
    // The session goes on.
    p.client.write_message(b"ok\0").unwrap();
    p.pump();
    assert_eq!(plaintext_records(&mut p.server), vec![b"ok\0".to_vec()]);
}

#[test]
fn server_refuses_client_without_certificate() {
    let pki = pki();
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, None, Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let mut p = Pair::new(&client_ctx, &server_ctx);
        p.pump();
        let err = p.server_err.take().expect("server must refuse");
        assert!(matches!(err, TlsError::Handshake(_)), "{err:?}");
        assert!(err.is_fatal());
        assert!(!p.server.is_handshake_done());
        // The failed session stays failed.
        assert!(matches!(p.server.process(), Err(TlsError::Finished)));
        assert!(matches!(
            p.server.write_message(b"x\0"),
            Err(TlsError::Finished)
        ));
        // The client learns it from the server's alert: under TLS 1.2 during its handshake,
        // under TLS 1.3 (where its handshake finished first) at its next read.
        let err = p.client_err.take().expect("client must see the alert");
        assert!(err.is_fatal());
    }
}

#[test]
fn client_refuses_server_from_another_ca() {
    let pki = pki();
    let rogue_ca = make_ca("Rogue CA");
    let rogue_server = make_leaf(&rogue_ca, "server", Usage::Server, 2);
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
        // The rogue server trusts our CA for client certificates, so only the client can object.
        let server_ctx = server_context(&pki.ca.cert, &rogue_server, Some(max));
        let mut p = Pair::new(&client_ctx, &server_ctx);
        p.pump();
        let err = p.client_err.take().expect("client must refuse");
        // Which certificate, and OpenSSL's reason, not only "certificate verify failed".
        let TlsError::ChainRejected {
            reason,
            depth,
            subject,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(reason, "unable to get local issuer certificate");
        assert_eq!(
            (*depth, subject.as_str()),
            (0, "O=protocol tests,CN=server")
        );
        assert_eq!(
            err.to_string(),
            "peer certificate O=protocol tests,CN=server (chain depth 0) refused: unable to get \
             local issuer certificate"
        );
        assert!(err.is_fatal());
        assert!(!p.client.is_handshake_done());
        assert!(!p.server.is_handshake_done());
        assert!(p.server_err.take().is_some(), "server must see the alert");
    }
}

#[test]
fn server_names_an_expired_client_certificate_with_its_name_escaped() {
    let pki = pki();
    // Expired in 2021; a name that would forge a log line if printed raw.
    let expired = make_leaf_valid(
        &pki.ca,
        "evil\u{1b}]0;x\u{7}\nforged",
        Usage::Client,
        9,
        (1_577_836_800, 1_609_459_200),
    );
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&expired), Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let mut p = Pair::new(&client_ctx, &server_ctx);
        p.pump();
        let err = p.server_err.take().expect("server must refuse");
        let text = err.to_string();
        assert_eq!(
            text,
            "peer certificate O=protocol tests,CN=evil\\u{1b}]0;x\\u{7}\\nforged (chain depth \
             0) refused: certificate has expired",
            "{err:?}"
        );
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(err.is_fatal());
        assert!(!p.server.is_handshake_done());
    }
}

/// Refuses every certificate whose CN is not `expected`, like `verify-x509-name NAME name`.
#[derive(Debug)]
struct ExpectCn(&'static str);

impl PeerVerifier for ExpectCn {
    fn verify_peer(&self, leaf: &X509Ref) -> Result<(), PeerCertError> {
        let actual = cn(leaf);
        if actual == self.0 {
            Ok(())
        } else {
            Err(PeerCertError::NameMismatch {
                expected: self.0.to_string(),
                actual,
            })
        }
    }
}

#[test]
fn peer_verifier_accepting_lets_the_handshake_finish() {
    let pki = pki();
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let mut p = Pair::with_verifiers(
            &client_ctx,
            &server_ctx,
            Arc::new(ExpectCn("server")),
            Arc::new(ExpectCn("client")),
        );
        p.handshake();
    }
}

#[test]
fn client_peer_verifier_refusal_ends_the_handshake() {
    let pki = pki();
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let mut p = Pair::with_verifiers(
            &client_ctx,
            &server_ctx,
            Arc::new(ExpectCn("other-server")),
            Arc::new(AcceptAnyPeer),
        );
        p.pump();
        let err = p.client_err.take().expect("client must refuse");
        assert!(err.is_fatal());
        let TlsError::PeerRejected(PeerCertError::NameMismatch { expected, actual }) = err else {
            panic!("unexpected error {err:?}");
        };
        assert_eq!(
            (expected.as_str(), actual.as_str()),
            ("other-server", "server")
        );
        assert!(!p.client.is_handshake_done());
        // The refusal happened inside the handshake: the server got an alert, not a client
        // certificate and Finished.
        assert!(!p.server.is_handshake_done());
        assert!(
            matches!(p.server_err, Some(TlsError::Handshake(_))),
            "{:?}",
            p.server_err
        );
    }
}

#[test]
fn server_peer_verifier_refusal_ends_the_handshake() {
    let pki = pki();
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let mut p = Pair::with_verifiers(
            &client_ctx,
            &server_ctx,
            Arc::new(AcceptAnyPeer),
            Arc::new(ExpectCn("someone-else")),
        );
        p.pump();
        let err = p.server_err.take().expect("server must refuse");
        assert!(
            matches!(
                err,
                TlsError::PeerRejected(PeerCertError::NameMismatch { .. })
            ),
            "{err:?}"
        );
        assert!(!p.server.is_handshake_done());
        assert!(p.client_err.is_some(), "client must see the alert");
    }
}

#[test]
fn peer_verifier_runs_even_without_openssl_verification() {
    // A context that does not ask OpenSSL to verify the server: the hook still runs (after
    // the handshake) and its refusal is fatal.
    let pki = pki();
    let client_ctx = context(&pki.ca.cert, Some(&pki.client), SslVerifyMode::NONE, None);
    let server_ctx = server_context(&pki.ca.cert, &pki.server, None);
    let mut p = Pair::with_verifiers(
        &client_ctx,
        &server_ctx,
        Arc::new(ExpectCn("nobody")),
        Arc::new(AcceptAnyPeer),
    );
    p.pump();
    let err = p.client_err.take().expect("client must refuse");
    assert!(matches!(err, TlsError::PeerRejected(_)), "{err:?}");
    assert!(!p.client.is_handshake_done());
}

#[test]
fn one_byte_at_a_time() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.chunk = 1;
        p.client.write_message(b"km2 from client").unwrap();
        p.handshake();
        assert_eq!(
            plaintext_records(&mut p.server),
            vec![b"km2 from client".to_vec()]
        );
        let msg = vec![0x5a; 1000];
        p.server.write_message(&msg).unwrap();
        p.pump();
        assert_eq!(plaintext_records(&mut p.client), vec![msg]);
        assert_eq!(
            p.client
                .export_keying_material(DATA_KEYS_LABEL, 256)
                .unwrap(),
            p.server
                .export_keying_material(DATA_KEYS_LABEL, 256)
                .unwrap()
        );
    }
}

#[test]
fn corrupted_application_record_is_fatal() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.handshake();
        p.client.write_message(&[0x42; 100]).unwrap();
        let mut record = p.client.poll_ciphertext(usize::MAX).unwrap().to_vec();
        let mid = record.len() / 2;
        record[mid] ^= 0x01;
        p.server.feed_ciphertext(&record);
        let err = p.server.process().unwrap_err();
        assert!(matches!(err, TlsError::Record(_)), "{err:?}");
        assert!(err.is_fatal());
        assert!(p.server.poll_plaintext().is_none());
        assert!(matches!(p.server.process(), Err(TlsError::Finished)));
    }
}

#[test]
fn corrupted_handshake_ciphertext_never_completes_and_never_panics() {
    // Flip one bit at many positions of the server's first flight, then let both sides carry
    // on. Every outcome must be a fatal error on some side, or a stall waiting for bytes that
    // never come (a corrupted record length); never a handshake both sides consider done,
    // never a panic.
    let pki = pki();
    for max in VERSIONS {
        let client_ctx = client_context(&pki.ca.cert, Some(&pki.client), Some(max));
        let server_ctx = server_context(&pki.ca.cert, &pki.server, Some(max));
        let flight_len = {
            let mut p = Pair::new(&client_ctx, &server_ctx);
            p.client.process().unwrap();
            let hello = p.client.poll_ciphertext(usize::MAX).unwrap();
            p.server.feed_ciphertext(&hello);
            p.server.process().unwrap();
            p.server.pending_ciphertext_len()
        };
        let (mut errors, mut stalls) = (0, 0);
        for pos in (0..flight_len).step_by(17) {
            let mut p = Pair::new(&client_ctx, &server_ctx);
            p.client.process().unwrap();
            let hello = p.client.poll_ciphertext(usize::MAX).unwrap();
            p.server.feed_ciphertext(&hello);
            p.server.process().unwrap();
            let mut flight = p.server.poll_ciphertext(usize::MAX).unwrap().to_vec();
            // ECDSA signatures vary in length by a byte or two.
            let Some(byte) = flight.get_mut(pos) else {
                continue;
            };
            *byte ^= 0x10;
            p.client.feed_ciphertext(&flight);
            if let Err(e) = p.client.process() {
                p.client_err = Some(e);
            }
            p.pump();
            assert!(
                !(p.client.is_handshake_done() && p.server.is_handshake_done()),
                "bit flip at {pos} went unnoticed"
            );
            match (&p.client_err, &p.server_err) {
                (None, None) => stalls += 1,
                (c, s) => {
                    assert!(c.iter().chain(s.iter()).all(TlsError::is_fatal));
                    errors += 1;
                }
            }
        }
        // Only flips in the few record-header length bytes stall.
        assert!(errors > 10 * stalls, "{errors} errors, {stalls} stalls");
    }
}

#[test]
fn close_notify() {
    let pki = pki();
    for max in VERSIONS {
        let mut p = pair_for(&pki, max);
        p.handshake();
        p.server.write_message(b"EXIT\0").unwrap();
        p.server.close().unwrap();
        assert!(matches!(
            p.server.write_message(b"more\0"),
            Err(TlsError::Finished)
        ));
        p.pump();
        assert_eq!(plaintext_records(&mut p.client), vec![b"EXIT\0".to_vec()]);
        assert!(p.client.is_peer_closed());
        assert!(!p.server.is_peer_closed());
        // The other direction still works until the client closes too.
        p.client.write_message(b"bye\0").unwrap();
        p.client.close().unwrap();
        p.pump();
        assert_eq!(plaintext_records(&mut p.server), vec![b"bye\0".to_vec()]);
        assert!(p.server.is_peer_closed());
    }
}

#[test]
fn session_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<TlsSession>();
    assert_send::<TlsError>();
}
