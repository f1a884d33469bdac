//! A human summary of a certificate, for `vpn-pki show`.

use std::fmt;
use std::net::IpAddr;

use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkey::Id;
use openssl::x509::{X509ExtendedKeyUsage, X509KeyUsage, X509Ref};

use crate::check::subject_string;

/// What `vpn-pki show` prints about one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// Subject, printed as OpenVPN compares it.
    pub subject: String,
    /// Issuer, same format.
    pub issuer: String,
    /// Serial number in hex.
    pub serial: String,
    /// Start of validity, as OpenSSL prints it (`Jan  1 00:00:00 2030 GMT`).
    pub not_before: String,
    /// End of validity.
    pub not_after: String,
    /// Subject alternative names (`DNS:…`, `IP:…`).
    pub sans: Vec<String>,
    /// keyUsage bits by name; `None` when the extension is absent.
    pub key_usage: Option<Vec<&'static str>>,
    /// Extended key usages OpenSSL recognises, by name; `None` when absent.
    pub extended_key_usage: Option<Vec<&'static str>>,
    /// Public key algorithm and size, e.g. `EC 256` or `RSA 3072`.
    pub public_key: String,
    /// SHA-256 fingerprint of the DER certificate, colon-separated upper-case hex.
    pub sha256_fingerprint: String,
}

const KU_NAMES: [(X509KeyUsage, &str); 9] = [
    (X509KeyUsage::DIGITAL_SIGNATURE, "digitalSignature"),
    (X509KeyUsage::NON_REPUDIATION, "nonRepudiation"),
    (X509KeyUsage::KEY_ENCIPHERMENT, "keyEncipherment"),
    (X509KeyUsage::DATA_ENCIPHERMENT, "dataEncipherment"),
    (X509KeyUsage::KEY_AGREEMENT, "keyAgreement"),
    (X509KeyUsage::KEY_CERT_SIGN, "keyCertSign"),
    (X509KeyUsage::CRL_SIGN, "cRLSign"),
    (X509KeyUsage::ENCIPHER_ONLY, "encipherOnly"),
    (X509KeyUsage::DECIPHER_ONLY, "decipherOnly"),
];

const EKU_NAMES: [(X509ExtendedKeyUsage, &str); 9] = [
    (X509ExtendedKeyUsage::SSL_SERVER, "serverAuth"),
    (X509ExtendedKeyUsage::SSL_CLIENT, "clientAuth"),
    (X509ExtendedKeyUsage::SMIME, "emailProtection"),
    (X509ExtendedKeyUsage::CODE_SIGN, "codeSigning"),
    (X509ExtendedKeyUsage::SGC, "serverGatedCrypto"),
    (X509ExtendedKeyUsage::OCSP_SIGN, "OCSPSigning"),
    (X509ExtendedKeyUsage::TIMESTAMP, "timeStamping"),
    (X509ExtendedKeyUsage::DVCS, "DVCS"),
    (X509ExtendedKeyUsage::ANYEKU, "anyExtendedKeyUsage"),
];

/// The names in `table` (a usage name table above) whose flag `has` says is set, in table
/// order.
fn names_set<F: Copy>(table: &[(F, &'static str)], has: impl Fn(F) -> bool) -> Vec<&'static str> {
    table
        .iter()
        .filter(|(flag, _)| has(*flag))
        .map(|(_, name)| *name)
        .collect()
}

impl CertSummary {
    /// Summarises `cert`.
    pub fn of(cert: &X509Ref) -> Result<CertSummary, ErrorStack> {
        let sans = cert
            .subject_alt_names()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| {
                        if let Some(d) = n.dnsname() {
                            Some(format!("DNS:{d}"))
                        } else if let Some(ip) = n.ipaddress() {
                            ip_text(ip).map(|ip| format!("IP:{ip}"))
                        } else {
                            n.email().map(|e| format!("email:{e}"))
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let key = cert.public_key()?;
        let alg = match key.id() {
            Id::EC => "EC",
            Id::RSA => "RSA",
            Id::ED25519 => "Ed25519",
            _ => "other",
        };
        let fingerprint = cert
            .digest(MessageDigest::sha256())?
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":");
        Ok(CertSummary {
            subject: subject_string(cert.subject_name()),
            issuer: subject_string(cert.issuer_name()),
            serial: cert.serial_number().to_bn()?.to_hex_str()?.to_string(),
            not_before: cert.not_before().to_string(),
            not_after: cert.not_after().to_string(),
            sans,
            key_usage: cert
                .key_usage()
                .map(|ku| names_set(&KU_NAMES, |bit| ku.contains(bit))),
            extended_key_usage: cert
                .extended_key_usage()
                .map(|eku| names_set(&EKU_NAMES, |bit| eku.contains(bit))),
            public_key: format!("{alg} {}", key.bits()),
            sha256_fingerprint: fingerprint,
        })
    }
}

fn ip_text(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

impl fmt::Display for CertSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &Option<Vec<&str>>| match v {
            Some(v) if v.is_empty() => "(present, none recognised)".to_owned(),
            Some(v) => v.join(", "),
            None => "(absent)".to_owned(),
        };
        writeln!(f, "subject:     {}", self.subject)?;
        writeln!(f, "issuer:      {}", self.issuer)?;
        writeln!(f, "serial:      {}", self.serial)?;
        writeln!(f, "not before:  {}", self.not_before)?;
        writeln!(f, "not after:   {}", self.not_after)?;
        if self.sans.is_empty() {
            writeln!(f, "SANs:        (none)")?;
        } else {
            writeln!(f, "SANs:        {}", self.sans.join(", "))?;
        }
        writeln!(f, "key usage:   {}", list(&self.key_usage))?;
        writeln!(f, "ext. usage:  {}", list(&self.extended_key_usage))?;
        writeln!(f, "public key:  {}", self.public_key)?;
        write!(f, "SHA-256:     {}", self.sha256_fingerprint)
    }
}
