//! The OpenSSL contexts: handshakes between our server and client contexts over a local socket
//! pair, with the peer checks OpenVPN applies.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::os::unix::net::UnixStream;
use std::time::{SystemTime, UNIX_EPOCH};

use openssl::ssl::{HandshakeError, Ssl, SslContext, SslStream, SslVersion};
use openssl::x509::X509VerifyResult;
use pki::tls::{
    connect_proxy_acceptor, connect_proxy_connector, control_channel_client,
    control_channel_server, ClientCertMode, PeerPolicy,
};
use pki::{Ca, CaBundle, CertProfile, Identity, IssueRequest, KeySpec, Validity};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn ca() -> Ca {
    Ca::create("vpn", KeySpec::EcdsaP256, Validity::days_from(now(), 30)).unwrap()
}

fn issue(ca: &Ca, profile: CertProfile, cn: &str, validity: Validity) -> Identity {
    ca.issue(&IssueRequest {
        profile,
        common_name: cn.into(),
        sans: vec![],
        key: KeySpec::EcdsaP256,
        validity,
    })
    .unwrap()
}

fn trust(ca: &Ca) -> CaBundle {
    CaBundle::new(vec![ca.cert().to_owned()]).unwrap()
}

#[derive(Debug)]
struct Outcome {
    server: Result<(String, Option<String>), String>,
    client: Result<(String, String), String>,
    /// The client's verify result (why it refused the server).
    client_verify: X509VerifyResult,
}

/// Runs one handshake; `tls12` caps the client at TLS 1.2. The server reports the version and
/// the client's CN, the client the version and cipher.
fn handshake(server: &SslContext, client: &SslContext, tls12: bool) -> Outcome {
    let (a, b) = UnixStream::pair().unwrap();
    let server_ssl = Ssl::new(server).unwrap();
    let t = std::thread::spawn(move || match server_ssl.accept(a) {
        Ok(s) => {
            let cn = s
                .ssl()
                .peer_certificate()
                .and_then(|c| pki::check::client_identity(&c).ok());
            Ok((s.ssl().version_str().to_owned(), cn))
        }
        Err(e) => Err(e.to_string()),
    });
    let mut client_ssl = Ssl::new(client).unwrap();
    if tls12 {
        client_ssl
            .set_max_proto_version(Some(SslVersion::TLS1_2))
            .unwrap();
    }
    let (client, client_verify) = match client_ssl.connect(b) {
        Ok(s) => {
            let r = describe(&s);
            (Ok(r), s.ssl().verify_result())
        }
        Err(HandshakeError::Failure(mid)) => {
            let v = mid.ssl().verify_result();
            (Err(mid.error().to_string()), v)
        }
        Err(e) => (Err(e.to_string()), X509VerifyResult::OK),
    };
    Outcome {
        server: t.join().unwrap(),
        client,
        client_verify,
    }
}

fn describe(s: &SslStream<UnixStream>) -> (String, String) {
    (
        s.ssl().version_str().to_owned(),
        s.ssl()
            .current_cipher()
            .map(|c| c.name().to_owned())
            .unwrap_or_default(),
    )
}

#[test]
fn control_channel_handshake_tls13_and_tls12() {
    let ca = ca();
    let v = Validity::days_from(now(), 1);
    let server_id = issue(&ca, CertProfile::Server, "vpn-seed-server", v);
    let client_id = issue(&ca, CertProfile::Client, "vpn-shoot-client", v);
    let s = control_channel_server(&server_id, &trust(&ca), &PeerPolicy::client_peer()).unwrap();
    let c = control_channel_client(&client_id, &trust(&ca), &PeerPolicy::server_peer()).unwrap();

    let o = handshake(&s, &c, false);
    assert_eq!(
        o.server.as_ref().unwrap(),
        &("TLSv1.3".to_owned(), Some("vpn-shoot-client".to_owned()))
    );
    assert_eq!(o.client.as_ref().unwrap().0, "TLSv1.3");

    let o = handshake(&s, &c, true);
    let (version, cipher) = o.client.unwrap();
    assert_eq!(version, "TLSv1.2");
    assert!(cipher.starts_with("ECDHE-ECDSA-"), "{cipher}");
}

#[test]
fn client_certificate_presented_as_server_is_refused() {
    let ca = ca();
    let v = Validity::days_from(now(), 1);
    // The "server" holds a client certificate.
    let fake_server = issue(&ca, CertProfile::Client, "vpn-shoot-client", v);
    let client_id = issue(&ca, CertProfile::Client, "vpn-shoot-client-0", v);
    let s = control_channel_server(&fake_server, &trust(&ca), &PeerPolicy::default()).unwrap();
    let c = control_channel_client(&client_id, &trust(&ca), &PeerPolicy::server_peer()).unwrap();
    let o = handshake(&s, &c, false);
    assert!(o.client.is_err(), "{o:?}");
    // OpenSSL's own purpose check (a client verifies the "ssl_server" purpose) already refuses
    // an explicit clientAuth-only EKU, before remote-cert-tls runs.
    assert_eq!(o.client_verify.as_raw(), X509_V_ERR_INVALID_PURPOSE);

    // A certificate without any EKU passes OpenSSL's purpose check; only remote-cert-tls
    // refuses it (the case the option exists for).
    let no_eku = leaf_without_eku(&ca, "vpn-shoot-client");
    let s = control_channel_server(&no_eku, &trust(&ca), &PeerPolicy::default()).unwrap();
    let o = handshake(&s, &c, false);
    assert!(o.client.is_err(), "{o:?}");
    assert_eq!(o.client_verify, X509VerifyResult::APPLICATION_VERIFICATION);
    let lax = control_channel_client(&client_id, &trust(&ca), &PeerPolicy::default()).unwrap();
    assert!(handshake(&s, &lax, false).client.is_ok());
}

/// OpenSSL's `X509_V_ERR_INVALID_PURPOSE`.
const X509_V_ERR_INVALID_PURPOSE: i32 = 26;

/// A leaf with keyUsage but no extendedKeyUsage, signed by `ca`.
fn leaf_without_eku(ca: &Ca, cn: &str) -> Identity {
    use openssl::asn1::Asn1Time;
    use openssl::hash::MessageDigest;
    use openssl::x509::extension::KeyUsage;
    use openssl::x509::{X509Builder, X509NameBuilder};
    let key = KeySpec::EcdsaP256.generate().unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(ca.cert().subject_name()).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::from_unix(now() - 60).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now() + 86_400).unwrap())
        .unwrap();
    b.append_extension(KeyUsage::new().digital_signature().build().unwrap())
        .unwrap();
    b.sign(ca.key(), MessageDigest::sha256()).unwrap();
    Identity::new(vec![b.build()], key).unwrap()
}

#[test]
fn expired_server_and_foreign_client_are_refused() {
    let ca = ca();
    let v = Validity::days_from(now(), 1);
    let expired = issue(
        &ca,
        CertProfile::Server,
        "vpn-seed-server",
        Validity::days_from(now() - 10 * 86_400, 2),
    );
    let client_id = issue(&ca, CertProfile::Client, "vpn-shoot-client", v);
    let s = control_channel_server(&expired, &trust(&ca), &PeerPolicy::client_peer()).unwrap();
    let c = control_channel_client(&client_id, &trust(&ca), &PeerPolicy::server_peer()).unwrap();
    let o = handshake(&s, &c, false);
    assert!(o.client.is_err());
    assert_eq!(o.client_verify.as_raw(), pki::VerifyError::CERT_HAS_EXPIRED);

    let other = self::ca();
    let foreign = issue(&other, CertProfile::Client, "vpn-shoot-client", v);
    let server_id = issue(&ca, CertProfile::Server, "vpn-seed-server", v);
    let s = control_channel_server(&server_id, &trust(&ca), &PeerPolicy::client_peer()).unwrap();
    let c = control_channel_client(&foreign, &trust(&ca), &PeerPolicy::server_peer()).unwrap();
    let o = handshake(&s, &c, false);
    assert!(o.server.is_err(), "{o:?}");
}

#[test]
fn connect_proxy_mtls() {
    let ca = ca();
    let v = Validity::days_from(now(), 1);
    let server_id = issue(&ca, CertProfile::Server, "vpn-seed-server", v);
    let client_id = issue(
        &ca,
        CertProfile::Client,
        "kube-apiserver-http-proxy-client",
        v,
    );
    let acceptor =
        connect_proxy_acceptor(&server_id, &trust(&ca), ClientCertMode::Required).unwrap();

    let run = |identity: Option<&Identity>, host: &str| {
        let (a, b) = UnixStream::pair().unwrap();
        let acc = acceptor.clone();
        let t = std::thread::spawn(move || acc.accept(a).map(|_| ()).map_err(|e| e.to_string()));
        let connector = connect_proxy_connector(identity, &trust(&ca)).unwrap();
        let c = connector.connect(host, b).map(|_| ());
        (t.join().unwrap(), c)
    };
    let (s, c) = run(Some(&client_id), "vpn-seed-server");
    assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
    // No client certificate: refused by the sidecar.
    let (s, _) = run(None, "vpn-seed-server");
    assert!(s.is_err());
    // Wrong host name: refused by the connector.
    let (_, c) = run(Some(&client_id), "elsewhere");
    assert!(c.is_err());
}

/// Pumps ciphertext between two in-memory `protocol` TLS engines until neither moves; returns
/// each side's first error, if any (later calls only report that the session finished).
fn pump(
    client: &mut protocol::tls::TlsSession,
    server: &mut protocol::tls::TlsSession,
) -> (
    Result<(), protocol::tls::TlsError>,
    Result<(), protocol::tls::TlsError>,
) {
    let keep_first = |kept: &mut Result<(), _>, new: Result<(), _>| {
        if kept.is_ok() {
            *kept = new;
        }
    };
    let mut results = (client.process(), server.process());
    for _ in 0..50 {
        let mut moved = false;
        while let Some(bytes) = client.poll_ciphertext(1200) {
            server.feed_ciphertext(&bytes);
            moved = true;
        }
        keep_first(&mut results.1, server.process());
        while let Some(bytes) = server.poll_ciphertext(1200) {
            client.feed_ciphertext(&bytes);
            moved = true;
        }
        keep_first(&mut results.0, client.process());
        if !moved {
            break;
        }
    }
    results
}

#[test]
fn peer_policy_travels_with_protocol_sessions() {
    use std::sync::Arc;

    use protocol::key::Role;
    use protocol::tls::{TlsError, TlsSession};

    let ca = ca();
    let v = Validity::days_from(now(), 1);
    let client_id = issue(&ca, CertProfile::Client, "vpn-shoot-client", v);
    let server_id = issue(&ca, CertProfile::Server, "vpn-seed-server", v);
    let no_eku = leaf_without_eku(&ca, "no-eku");
    let client_ctx =
        control_channel_client(&client_id, &trust(&ca), &PeerPolicy::server_peer()).unwrap();

    // A proper server certificate passes `remote-cert-tls server` inside the session.
    let good = control_channel_server(&server_id, &trust(&ca), &PeerPolicy::client_peer()).unwrap();
    let mut c = TlsSession::new(
        &client_ctx,
        Role::Client,
        Arc::new(PeerPolicy::server_peer()),
    )
    .unwrap();
    let mut s = TlsSession::new(&good, Role::Server, Arc::new(PeerPolicy::client_peer())).unwrap();
    let (rc, rs) = pump(&mut c, &mut s);
    assert!(rc.is_ok() && rs.is_ok(), "{rc:?} {rs:?}");
    assert!(c.is_handshake_done() && s.is_handshake_done());

    // A server certificate without EKU passes OpenSSL but not the policy the session carries.
    let bad = control_channel_server(&no_eku, &trust(&ca), &PeerPolicy::default()).unwrap();
    let mut c = TlsSession::new(
        &client_ctx,
        Role::Client,
        Arc::new(PeerPolicy::server_peer()),
    )
    .unwrap();
    let mut s = TlsSession::new(&bad, Role::Server, Arc::new(PeerPolicy::default())).unwrap();
    let (rc, _) = pump(&mut c, &mut s);
    assert!(matches!(rc, Err(TlsError::PeerRejected(_))), "{rc:?}");
    assert!(!c.is_handshake_done());
}
