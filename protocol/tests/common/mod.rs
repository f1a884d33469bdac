//! Test-only PKI and TLS contexts: a throwaway CA with ECDSA P-256 leaf certificates made with
//! the `openssl` crate, and contexts configured the way OpenVPN 2.6 configures OpenSSL
//! (reference 5.1). Validity is fixed (2020-01-01 to 2100-01-01) so nothing reads the clock.
#![allow(dead_code)] // each test file uses a different part

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{
    SslContext, SslContextBuilder, SslMethod, SslOptions, SslVerifyMode, SslVersion,
};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier,
};
use openssl::x509::{X509Name, X509};

/// 2020-01-01T00:00:00Z.
const NOT_BEFORE: i64 = 1_577_836_800;
/// 2100-01-01T00:00:00Z.
const NOT_AFTER: i64 = 4_102_444_800;

/// OpenVPN 2.6's TLS 1.2 cipher list when `--tls-cipher` is unset.
pub const OPENVPN_TLS_CIPHER: &str = "DEFAULT:!EXP:!LOW:!MEDIUM:!kDH:!kECDH:!DSS:!PSK:!SRP:!kRSA";

/// A certificate and its private key.
#[derive(Clone)]
pub struct Identity {
    pub cert: X509,
    pub key: PKey<Private>,
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug)]
pub enum Usage {
    /// KU digitalSignature + keyEncipherment, EKU serverAuth.
    Server,
    /// KU digitalSignature, EKU clientAuth.
    Client,
}

fn p256_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(cn: &str) -> X509Name {
    let mut n = X509Name::builder().unwrap();
    n.append_entry_by_text("O", "protocol tests").unwrap();
    n.append_entry_by_text("CN", cn).unwrap();
    n.build()
}

/// A self-signed CA.
pub fn make_ca(cn: &str) -> Identity {
    let key = p256_key();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap())
        .unwrap();
    let n = name(cn);
    b.set_subject_name(&n).unwrap();
    b.set_issuer_name(&n).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::from_unix(NOT_BEFORE).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(NOT_AFTER).unwrap())
        .unwrap();
    b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
        .unwrap();
    b.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()
            .unwrap(),
    )
    .unwrap();
    let ski = SubjectKeyIdentifier::new()
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(ski).unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    Identity {
        cert: b.build(),
        key,
    }
}

/// A leaf certificate signed by `ca`.
pub fn make_leaf(ca: &Identity, cn: &str, usage: Usage, serial: u32) -> Identity {
    make_leaf_valid(ca, cn, usage, serial, (NOT_BEFORE, NOT_AFTER))
}

/// A leaf certificate signed by `ca`, valid from `validity.0` to `validity.1` (unix seconds).
pub fn make_leaf_valid(
    ca: &Identity,
    cn: &str,
    usage: Usage,
    serial: u32,
    validity: (i64, i64),
) -> Identity {
    let key = p256_key();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_serial_number(&BigNum::from_u32(serial).unwrap().to_asn1_integer().unwrap())
        .unwrap();
    b.set_subject_name(&name(cn)).unwrap();
    b.set_issuer_name(ca.cert.subject_name()).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::from_unix(validity.0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(validity.1).unwrap())
        .unwrap();
    b.append_extension(BasicConstraints::new().build().unwrap())
        .unwrap();
    let (ku, eku) = match usage {
        Usage::Server => (
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_encipherment()
                .build()
                .unwrap(),
            ExtendedKeyUsage::new().server_auth().build().unwrap(),
        ),
        Usage::Client => (
            KeyUsage::new()
                .critical()
                .digital_signature()
                .build()
                .unwrap(),
            ExtendedKeyUsage::new().client_auth().build().unwrap(),
        ),
    };
    b.append_extension(ku).unwrap();
    b.append_extension(eku).unwrap();
    let ski = SubjectKeyIdentifier::new()
        .build(&b.x509v3_context(Some(&ca.cert), None))
        .unwrap();
    b.append_extension(ski).unwrap();
    let aki = AuthorityKeyIdentifier::new()
        .keyid(true)
        .build(&b.x509v3_context(Some(&ca.cert), None))
        .unwrap();
    b.append_extension(aki).unwrap();
    b.sign(&ca.key, MessageDigest::sha256()).unwrap();
    Identity {
        cert: b.build(),
        key,
    }
}

/// A context with OpenVPN 2.6's settings: TLS 1.2 minimum (maximum `max`, `None` = library
/// maximum), ECDHE-only TLS 1.2 suites, no tickets, no compression, no renegotiation, `ca` as
/// the only trust anchor, `identity` as own certificate, and `verify` as the peer check.
pub fn context(
    ca: &X509,
    identity: Option<&Identity>,
    verify: SslVerifyMode,
    max: Option<SslVersion>,
) -> SslContext {
    context_builder(ca, identity, verify, max).build()
}

/// [`context`] before `build`, for tests that add to it.
pub fn context_builder(
    ca: &X509,
    identity: Option<&Identity>,
    verify: SslVerifyMode,
    max: Option<SslVersion>,
) -> SslContextBuilder {
    let mut b = SslContextBuilder::new(SslMethod::tls()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).unwrap();
    b.set_max_proto_version(max).unwrap();
    b.set_cipher_list(OPENVPN_TLS_CIPHER).unwrap();
    b.set_options(
        SslOptions::NO_TICKET
            | SslOptions::NO_COMPRESSION
            | SslOptions::NO_RENEGOTIATION
            | SslOptions::CIPHER_SERVER_PREFERENCE,
    );
    b.cert_store_mut().add_cert(ca.clone()).unwrap();
    if let Some(id) = identity {
        b.set_certificate(&id.cert).unwrap();
        b.set_private_key(&id.key).unwrap();
        b.check_private_key().unwrap();
    }
    b.set_verify(verify);
    b
}

/// A server context: requires a client certificate (`PEER | FAIL_IF_NO_PEER_CERT`).
pub fn server_context(ca: &X509, identity: &Identity, max: Option<SslVersion>) -> SslContext {
    context(
        ca,
        Some(identity),
        SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
        max,
    )
}

/// A client context: verifies the server (`PEER`).
pub fn client_context(
    ca: &X509,
    identity: Option<&Identity>,
    max: Option<SslVersion>,
) -> SslContext {
    context(ca, identity, SslVerifyMode::PEER, max)
}
