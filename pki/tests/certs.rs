//! Issuing, loading, rotation and the certificate checks, through the public API.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::symm::Cipher;
use openssl::x509::extension::{ExtendedKeyUsage, KeyUsage};
use openssl::x509::{X509Builder, X509NameBuilder, X509};
use pki::check::{
    check_remote_cert_tls, check_verify_x509_name, client_identity, subject_string, CertCheckError,
    RemoteCertTls, VerifyX509Name, X509NameType,
};
use pki::pem::{self, CaBundle, Identity, PemError, VerifyError};
use pki::summary::CertSummary;
use pki::{Ca, CertProfile, IssueRequest, KeySpec, San, Validity};

/// A fixed "now" so the tests do not depend on the clock: 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600;
const DAY: i64 = 86_400;

fn ca(cn: &str) -> Ca {
    Ca::create(cn, KeySpec::EcdsaP256, Validity::days_from(NOW, 3650)).unwrap()
}

fn leaf(ca: &Ca, profile: CertProfile, cn: &str) -> Identity {
    ca.issue(&IssueRequest {
        profile,
        common_name: cn.to_owned(),
        sans: vec![],
        key: KeySpec::EcdsaP256,
        validity: Validity::days_from(NOW, 365),
    })
    .unwrap()
}

fn bundle(cas: &[&Ca]) -> CaBundle {
    CaBundle::new(cas.iter().map(|c| c.cert().to_owned()).collect()).unwrap()
}

#[test]
fn server_certificate_has_openvpn_profile() {
    let ca = ca("vpn");
    let id = ca
        .issue(&IssueRequest {
            profile: CertProfile::Server,
            common_name: "vpn-seed-server".into(),
            sans: [
                "vpn-seed-server",
                "vpn-seed-server.shoot--p--s",
                "IP:127.0.0.1",
            ]
            .iter()
            .map(|s| s.parse::<San>().unwrap())
            .collect(),
            key: KeySpec::EcdsaP256,
            validity: Validity::days_from(NOW, 30),
        })
        .unwrap();
    let s = CertSummary::of(id.leaf()).unwrap();
    assert_eq!(s.subject, "CN=vpn-seed-server");
    assert_eq!(s.issuer, "CN=vpn");
    assert_eq!(
        s.sans,
        [
            "DNS:vpn-seed-server",
            "DNS:vpn-seed-server.shoot--p--s",
            "IP:127.0.0.1"
        ]
    );
    assert_eq!(
        s.key_usage.as_deref(),
        Some(&["digitalSignature", "keyEncipherment"][..])
    );
    assert_eq!(s.extended_key_usage.as_deref(), Some(&["serverAuth"][..]));
    assert_eq!(s.public_key, "EC 256");
    assert_eq!(s.sha256_fingerprint.len(), 32 * 3 - 1);
    check_remote_cert_tls(id.leaf(), RemoteCertTls::Server).unwrap();
    bundle(&[&ca]).verify(id.leaf(), &[], Some(NOW)).unwrap();
    // Validity: backdated 5 minutes, 30 days long.
    let t = |s: i64| openssl::asn1::Asn1Time::from_unix(s as _).unwrap();
    assert_eq!(
        id.leaf().not_after().compare(&t(NOW + 30 * DAY)).unwrap(),
        std::cmp::Ordering::Equal
    );
    assert_eq!(
        id.leaf().not_before().compare(&t(NOW - 300)).unwrap(),
        std::cmp::Ordering::Equal
    );
}

#[test]
fn server_without_sans_gets_its_cn_as_dns_name() {
    let id = leaf(&ca("vpn"), CertProfile::Server, "vpn-seed-server");
    assert_eq!(
        CertSummary::of(id.leaf()).unwrap().sans,
        ["DNS:vpn-seed-server"]
    );
    let id = leaf(&ca("vpn"), CertProfile::Client, "vpn-shoot-client");
    assert!(CertSummary::of(id.leaf()).unwrap().sans.is_empty());
}

#[test]
fn client_certificate_and_rsa() {
    let ca = Ca::create("vpn", KeySpec::Rsa2048, Validity::days_from(NOW, 10)).unwrap();
    let id = ca
        .issue(&IssueRequest {
            profile: CertProfile::Client,
            common_name: "vpn-shoot-client".into(),
            sans: vec![],
            key: KeySpec::Rsa3072,
            validity: Validity::days_from(NOW, 1),
        })
        .unwrap();
    let s = CertSummary::of(id.leaf()).unwrap();
    assert_eq!(s.key_usage.as_deref(), Some(&["digitalSignature"][..]));
    assert_eq!(s.extended_key_usage.as_deref(), Some(&["clientAuth"][..]));
    assert_eq!(s.public_key, "RSA 3072");
    assert_eq!(client_identity(id.leaf()).unwrap(), "vpn-shoot-client");
    bundle(&[&ca]).verify(id.leaf(), &[], Some(NOW)).unwrap();
}

#[test]
fn ca_round_trips_through_pem() {
    let ca = ca("vpn");
    let cert_pem = ca.cert().to_pem().unwrap();
    let key_pem = pem::private_key_to_pem(&ca.key().to_owned()).unwrap();
    let loaded = Ca::from_parts(
        pem::certificates(&cert_pem).unwrap().remove(0),
        pem::private_key(&key_pem).unwrap(),
    )
    .unwrap();
    let id = leaf(&loaded, CertProfile::Client, "c");
    bundle(&[&ca]).verify(id.leaf(), &[], Some(NOW)).unwrap();
    // A leaf is not a CA.
    let not_ca = leaf(&ca, CertProfile::Server, "s");
    assert!(Ca::from_parts(not_ca.leaf().to_owned(), not_ca.key().clone()).is_err());
    // A CA with someone else's key is refused.
    let other = self::ca("other");
    assert!(matches!(
        Ca::from_parts(ca.cert().to_owned(), other.key().to_owned()),
        Err(pki::IssueError::Pem(PemError::KeyMismatch))
    ));
}

#[test]
fn bundle_rotation_trusts_old_and_new_ca() {
    let old = ca("vpn");
    let new = ca("vpn");
    let old_leaf = leaf(&old, CertProfile::Client, "vpn-shoot-client");
    let new_leaf = leaf(&new, CertProfile::Client, "vpn-shoot-client");

    let mut b = CaBundle::new(vec![old.cert().to_owned()]).unwrap();
    b.push(new.cert().to_owned());
    b.push(new.cert().to_owned()); // no duplicate
    assert_eq!(b.certs().len(), 2);
    // Through PEM, as the mounted `ca.crt` would be read.
    let b = CaBundle::from_pem(&b.to_pem().unwrap()).unwrap();
    assert_eq!(b.certs().len(), 2);
    b.verify(old_leaf.leaf(), &[], Some(NOW)).unwrap();
    b.verify(new_leaf.leaf(), &[], Some(NOW)).unwrap();

    // After rotation completes, the old CA's leaves are no longer trusted.
    let only_new = CaBundle::new(vec![new.cert().to_owned()]).unwrap();
    let err = only_new
        .verify(old_leaf.leaf(), &[], Some(NOW))
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(VerifyError::UNABLE_TO_GET_ISSUER_CERT_LOCALLY),
        "{err}"
    );
}

#[test]
fn expired_and_foreign_certificates_are_rejected() {
    let ca = ca("vpn");
    let b = bundle(&[&ca]);
    let id = leaf(&ca, CertProfile::Server, "vpn-seed-server");
    let err = b.verify(id.leaf(), &[], Some(NOW + 400 * DAY)).unwrap_err();
    assert_eq!(err.code(), Some(VerifyError::CERT_HAS_EXPIRED), "{err}");
    let foreign = leaf(&self::ca("vpn"), CertProfile::Server, "vpn-seed-server");
    let err = b.verify(foreign.leaf(), &[], Some(NOW)).unwrap_err();
    assert_eq!(
        err.code(),
        Some(VerifyError::UNABLE_TO_GET_ISSUER_CERT_LOCALLY),
        "{err}"
    );
}

#[test]
fn encrypted_keys_are_refused_and_wrong_passwords_reported() {
    let key = KeySpec::EcdsaP256.generate().unwrap();
    let pkcs8 = key
        .private_key_to_pem_pkcs8_passphrase(Cipher::aes_256_cbc(), b"right")
        .unwrap();
    let traditional = key
        .ec_key()
        .unwrap()
        .private_key_to_pem_passphrase(Cipher::aes_128_cbc(), b"right")
        .unwrap();
    assert!(String::from_utf8_lossy(&traditional).contains("Proc-Type: 4,ENCRYPTED"));
    for pem_text in [&pkcs8, &traditional] {
        let err = pem::private_key(pem_text).unwrap_err();
        assert!(matches!(err, PemError::KeyEncrypted), "{err}");
        assert!(err.to_string().contains("encrypted"));
        let err = pem::private_key_with_password(pem_text, b"wrong").unwrap_err();
        assert!(matches!(err, PemError::WrongPassword), "{err}");
        let plain = pem::private_key_with_password(pem_text, b"right").unwrap();
        assert!(plain.public_eq(&key));
    }
}

#[test]
fn truncated_pem_is_reported() {
    let ca1 = ca("vpn");
    let ca2 = ca("vpn");
    let good = bundle(&[&ca1, &ca2]).to_pem().unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    // Cut inside the second certificate.
    let cut = text.rfind("-----END").unwrap() - 10;
    let err = CaBundle::from_pem(&good[..cut]).unwrap_err();
    assert!(
        matches!(err, PemError::Truncated { index: 1, ref label } if label == "CERTIFICATE"),
        "{err}"
    );
    // Cut inside the base64 of a key.
    let key = pem::private_key_to_pem(&KeySpec::EcdsaP256.generate().unwrap()).unwrap();
    let err = pem::private_key(&key[..key.len() / 2]).unwrap_err();
    assert!(matches!(err, PemError::Truncated { index: 0, .. }), "{err}");
    // Broken base64 inside a complete block.
    let broken = text.replacen("MI", "!!", 1);
    let err = pem::certificates(broken.as_bytes()).unwrap_err();
    assert!(
        matches!(err, PemError::Certificate { index: 0, .. }),
        "{err}"
    );
    // Nothing at all.
    assert!(matches!(
        pem::certificates(b"# just a comment\n"),
        Err(PemError::Missing { .. })
    ));
    assert!(matches!(
        pem::certificates(&[0xff, 0xfe]),
        Err(PemError::NotText)
    ));
}

#[test]
fn identity_checks_key_matches_chain() {
    let ca = ca("vpn");
    let a = leaf(&ca, CertProfile::Client, "a");
    let b = leaf(&ca, CertProfile::Client, "b");
    let chain = a.chain_pem().unwrap();
    Identity::from_pem(&chain, &a.key_pem().unwrap()).unwrap();
    let err = Identity::from_pem(&chain, &b.key_pem().unwrap()).unwrap_err();
    assert!(matches!(err, PemError::KeyMismatch), "{err}");
    // Two keys in one file are ambiguous.
    let mut two = a.key_pem().unwrap();
    two.extend(b.key_pem().unwrap());
    assert!(matches!(pem::private_key(&two), Err(PemError::SeveralKeys)));
}

/// A certificate with hand-picked extensions, to exercise the failure paths of the checks.
fn custom(cn_parts: &[(&str, &str)], ku: bool, eku: Option<&str>) -> X509 {
    let key = KeySpec::EcdsaP256.generate().unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    for (f, v) in cn_parts {
        name.append_entry_by_text(f, v).unwrap();
    }
    let name = name.build();
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&openssl::asn1::Asn1Time::from_unix(NOW as _).unwrap())
        .unwrap();
    b.set_not_after(&openssl::asn1::Asn1Time::from_unix((NOW + DAY) as _).unwrap())
        .unwrap();
    if ku {
        b.append_extension(KeyUsage::new().digital_signature().build().unwrap())
            .unwrap();
    }
    if let Some(eku) = eku {
        b.append_extension(ExtendedKeyUsage::new().other(eku).build().unwrap())
            .unwrap();
    }
    b.sign(
        &PKey::from_ec_key(key.ec_key().unwrap()).unwrap(),
        MessageDigest::sha256(),
    )
    .unwrap();
    b.build()
}

#[test]
fn remote_cert_tls_pass_and_fail() {
    let ca = ca("vpn");
    let server = leaf(&ca, CertProfile::Server, "vpn-seed-server");
    let client = leaf(&ca, CertProfile::Client, "vpn-shoot-client");
    check_remote_cert_tls(server.leaf(), RemoteCertTls::Server).unwrap();
    check_remote_cert_tls(client.leaf(), RemoteCertTls::Client).unwrap();
    assert_eq!(
        check_remote_cert_tls(client.leaf(), RemoteCertTls::Server),
        Err(CertCheckError::ExtendedKeyUsageMismatch {
            expected: RemoteCertTls::Server
        })
    );
    assert_eq!(
        check_remote_cert_tls(server.leaf(), RemoteCertTls::Client),
        Err(CertCheckError::ExtendedKeyUsageMismatch {
            expected: RemoteCertTls::Client
        })
    );
    let cn = [("CN", "x")];
    assert_eq!(
        check_remote_cert_tls(
            &custom(&cn, false, Some("serverAuth")),
            RemoteCertTls::Server
        ),
        Err(CertCheckError::KeyUsageMissing {
            expected: RemoteCertTls::Server
        })
    );
    assert_eq!(
        check_remote_cert_tls(&custom(&cn, true, None), RemoteCertTls::Server),
        Err(CertCheckError::ExtendedKeyUsageMissing {
            expected: RemoteCertTls::Server
        })
    );
    // The EKU can be given by OID; anyExtendedKeyUsage is not serverAuth.
    check_remote_cert_tls(
        &custom(&cn, true, Some("1.3.6.1.5.5.7.3.1")),
        RemoteCertTls::Server,
    )
    .unwrap();
    assert!(check_remote_cert_tls(
        &custom(&cn, true, Some("anyExtendedKeyUsage")),
        RemoteCertTls::Server
    )
    .is_err());
}

#[test]
fn verify_x509_name_pass_and_fail() {
    let cert = custom(
        &[("C", "US"), ("O", "Test"), ("CN", "vpn-shoot-client-0")],
        true,
        None,
    );
    let rule = |name: &str, kind| VerifyX509Name {
        name: name.into(),
        kind,
    };
    // Same text as `openssl x509 -noout -subject -nameopt sep_comma_plus_space,sname,utf8,esc_ctrl`.
    assert_eq!(
        subject_string(cert.subject_name()),
        "C=US, O=Test, CN=vpn-shoot-client-0"
    );
    check_verify_x509_name(
        &cert,
        &rule("C=US, O=Test, CN=vpn-shoot-client-0", X509NameType::Subject),
    )
    .unwrap();
    check_verify_x509_name(&cert, &rule("vpn-shoot-client-0", X509NameType::Name)).unwrap();
    check_verify_x509_name(&cert, &rule("vpn-shoot-client", X509NameType::NamePrefix)).unwrap();

    let err = check_verify_x509_name(&cert, &rule("CN=vpn-shoot-client-0", X509NameType::Subject))
        .unwrap_err();
    assert!(matches!(
        err,
        CertCheckError::NameMismatch { ref actual, .. } if actual == "C=US, O=Test, CN=vpn-shoot-client-0"
    ));
    assert!(check_verify_x509_name(&cert, &rule("vpn-shoot-client", X509NameType::Name)).is_err());
    assert!(check_verify_x509_name(&cert, &rule("vpn-seed", X509NameType::NamePrefix)).is_err());
    assert_eq!("name-prefix".parse(), Ok(X509NameType::NamePrefix));
    assert!("prefix".parse::<X509NameType>().is_err());
}

#[test]
fn every_verify_x509_name_type_parses_to_itself() {
    assert_eq!("subject".parse(), Ok(X509NameType::Subject));
    assert_eq!("name".parse(), Ok(X509NameType::Name));
    assert_eq!("name-prefix".parse(), Ok(X509NameType::NamePrefix));
    // Upstream's keywords are lower case.
    assert!("Name".parse::<X509NameType>().is_err());
}

#[test]
fn an_eku_mismatch_names_the_purpose_that_is_missing() {
    let ca = ca("vpn");
    let client = leaf(&ca, CertProfile::Client, "vpn-shoot-client");
    let server = leaf(&ca, CertProfile::Server, "vpn-seed-server");
    let err = check_remote_cert_tls(client.leaf(), RemoteCertTls::Server).unwrap_err();
    assert_eq!(
        err.to_string(),
        "certificate EKU lacks TLS Web Server Authentication"
    );
    let err = check_remote_cert_tls(server.leaf(), RemoteCertTls::Client).unwrap_err();
    assert_eq!(
        err.to_string(),
        "certificate EKU lacks TLS Web Client Authentication"
    );
}

#[test]
fn client_identity_is_the_single_cn() {
    assert_eq!(
        client_identity(&custom(
            &[("O", "g"), ("CN", "vpn-seed-client")],
            true,
            None
        )),
        Ok("vpn-seed-client".into())
    );
    assert_eq!(
        client_identity(&custom(&[("O", "g")], true, None)),
        Err(CertCheckError::CommonNameMissing)
    );
    assert_eq!(
        client_identity(&custom(&[("CN", "a"), ("CN", "b")], true, None)),
        Err(CertCheckError::SeveralCommonNames { count: 2 })
    );
    assert!(matches!(
        client_identity(&custom(&[("CN", "../etc/passwd")], true, None)),
        Err(CertCheckError::InvalidIdentity { .. })
    ));
}

#[test]
fn subject_escapes_control_characters_and_backslash() {
    let cert = custom(&[("CN", "a\\b\u{1}c")], true, None);
    assert_eq!(subject_string(cert.subject_name()), "CN=a\\\\b\\01c");
}

#[test]
fn subject_keeps_spaces_and_names_unknown_attributes_by_oid() {
    // A space is printable (only bytes below 0x20 and DEL are escaped); an attribute OpenSSL
    // has no name for is written as its dotted OID, as `X509_NAME_print_ex` does.
    let cert = custom(&[("1.2.3.4", "x"), ("CN", "a b\u{1f}")], true, None);
    assert_eq!(subject_string(cert.subject_name()), "1.2.3.4=x, CN=a b\\1F");
}

#[test]
fn san_parsing() {
    assert_eq!(
        "10.0.0.1".parse::<San>().unwrap(),
        San::Ip([10, 0, 0, 1].into())
    );
    assert_eq!(
        "IP:::1".parse::<San>().unwrap(),
        San::Ip("::1".parse().unwrap())
    );
    assert_eq!(
        "DNS:vpn-seed-server".parse::<San>().unwrap(),
        San::Dns("vpn-seed-server".into())
    );
    assert_eq!(
        "*.example.org".parse::<San>().unwrap().to_string(),
        "DNS:*.example.org"
    );
    assert!("IP:nope".parse::<San>().is_err());
    assert!("bad name".parse::<San>().is_err());
    assert!("a..b".parse::<San>().is_err());
}
