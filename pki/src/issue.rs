//! A certificate authority and the certificates it issues.
//!
//! Profiles match what OpenVPN's `remote-cert-tls` and the Gardener secrets expect:
//!
//! | profile | basicConstraints | keyUsage (critical) | extendedKeyUsage |
//! |---|---|---|---|
//! | CA | critical, `CA:TRUE` | keyCertSign, cRLSign | none |
//! | server | critical, `CA:FALSE` | digitalSignature, keyEncipherment | serverAuth |
//! | client | critical, `CA:FALSE` | digitalSignature | clientAuth |
//!
//! Subjects hold only a CN. Serials are 127 random bits. Signatures use SHA-256. Time is an
//! argument ([`Validity`]); nothing here reads the clock.

use std::net::IpAddr;
use std::str::FromStr;

use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::{BigNum, MsbOption};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, PKeyRef, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509Builder, X509KeyUsage, X509NameBuilder, X509Ref, X509};

use crate::keys::{KeyError, KeySpec};
use crate::pem::{Identity, PemError};

/// How far `not_before` is set back from "now", so a peer whose clock lags a little still
/// accepts a freshly issued certificate.
pub const BACKDATE_SECS: i64 = 5 * 60;

/// Seconds in a day.
const DAY_SECS: i64 = 24 * 60 * 60;

/// Number of random bits in a serial number (positive, fits the 20-octet limit of RFC 5280).
const SERIAL_BITS: i32 = 127;

/// The validity period of a certificate, in seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Start of validity.
    pub not_before: i64,
    /// End of validity.
    pub not_after: i64,
}

impl Validity {
    /// `days` days from `now_unix`, with `not_before` set back by [`BACKDATE_SECS`].
    pub fn days_from(now_unix: i64, days: u32) -> Validity {
        Validity {
            not_before: now_unix - BACKDATE_SECS,
            not_after: now_unix + i64::from(days) * DAY_SECS,
        }
    }
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertProfile {
    /// A TLS server (OpenVPN server, CONNECT sidecar): EKU serverAuth.
    Server,
    /// A TLS client (OpenVPN client, kube-apiserver towards the sidecar): EKU clientAuth.
    Client,
}

/// A subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum San {
    /// `DNS:name`.
    Dns(String),
    /// `IP:address`.
    Ip(IpAddr),
}

/// Errors from issuing certificates.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The common name is empty or longer than X.509's 64-character limit.
    #[error("invalid common name {cn:?} (1 to 64 characters)")]
    InvalidCommonName {
        /// The name given.
        cn: String,
    },
    /// A SAN is neither an IP address nor a DNS name.
    #[error("invalid subject alternative name {value:?} (want a DNS name or an IP address)")]
    InvalidSan {
        /// The text given.
        value: String,
    },
    /// `not_after` is not after `not_before`.
    #[error("empty validity period")]
    EmptyValidity,
    /// The certificate given as a CA is not one (no `CA:TRUE`, or no keyCertSign).
    #[error("the certificate is not a CA certificate")]
    NotACa,
    /// Key generation failed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The CA certificate and key do not belong together.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// OpenSSL failed while building or signing.
    #[error("building the certificate failed")]
    Build(#[source] ErrorStack),
}

impl From<ErrorStack> for IssueError {
    fn from(e: ErrorStack) -> Self {
        IssueError::Build(e)
    }
}

impl FromStr for San {
    type Err = IssueError;

    /// `IP:addr`, `DNS:name`, or a bare IP address or DNS name.
    fn from_str(s: &str) -> Result<San, IssueError> {
        let invalid = || IssueError::InvalidSan {
            value: s.to_owned(),
        };
        if let Some(ip) = s.strip_prefix("IP:") {
            return ip.parse().map(San::Ip).map_err(|_| invalid());
        }
        let name = s.strip_prefix("DNS:");
        if name.is_none() {
            if let Ok(ip) = s.parse() {
                return Ok(San::Ip(ip));
            }
        }
        let name = name.unwrap_or(s);
        if is_dns_name(name) {
            Ok(San::Dns(name.to_owned()))
        } else {
            Err(invalid())
        }
    }
}

impl std::fmt::Display for San {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            San::Dns(n) => write!(f, "DNS:{n}"),
            San::Ip(ip) => write!(f, "IP:{ip}"),
        }
    }
}

/// Letters, digits, `-` and `_` in dot-separated labels of 1 to 63 characters, an optional
/// leading `*.` wildcard.
fn is_dns_name(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A request for a leaf certificate.
#[derive(Debug, Clone)]
pub struct IssueRequest {
    /// Server or client.
    pub profile: CertProfile,
    /// The subject CN; for clients this is the identity OpenVPN uses (CCD file, readiness).
    pub common_name: String,
    /// Subject alternative names. A server certificate with none gets `DNS:<CN>` when the CN is
    /// a DNS name.
    pub sans: Vec<San>,
    /// The key to generate.
    pub key: KeySpec,
    /// The validity period.
    pub validity: Validity,
}

/// A certificate authority: its certificate and signing key.
#[derive(Debug, Clone)]
pub struct Ca {
    cert: X509,
    key: PKey<Private>,
}

impl Ca {
    /// Creates a self-signed CA with subject `CN=<common_name>` (Gardener's is "vpn").
    pub fn create(common_name: &str, key: KeySpec, validity: Validity) -> Result<Ca, IssueError> {
        let key = key.generate()?;
        let mut b = builder(common_name, &key, validity)?;
        b.set_issuer_name(b_subject(common_name)?.as_ref())?;
        b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()?,
        )?;
        let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(None, None))?;
        b.append_extension(ski)?;
        b.sign(&key, MessageDigest::sha256())?;
        Ok(Ca {
            cert: b.build(),
            key,
        })
    }

    /// A CA from a loaded certificate and key; checks that they match and that the certificate
    /// may sign certificates.
    pub fn from_parts(cert: X509, key: PKey<Private>) -> Result<Ca, IssueError> {
        // OpenSSL's `X509_check_ca` is not exposed by the `openssl` crate; a certificate whose
        // keyUsage lacks keyCertSign cannot sign leaves a verifier would accept.
        let can_sign = cert
            .key_usage()
            .is_none_or(|ku| ku.contains(X509KeyUsage::KEY_CERT_SIGN));
        if !can_sign {
            return Err(IssueError::NotACa);
        }
        let identity = Identity::new(vec![cert], key)?;
        Ok(Ca {
            cert: identity.leaf().to_owned(),
            key: identity.key().clone(),
        })
    }

    /// The CA certificate.
    pub fn cert(&self) -> &X509Ref {
        &self.cert
    }

    /// The CA's private key.
    pub fn key(&self) -> &PKeyRef<Private> {
        &self.key
    }

    /// Issues a leaf certificate with a fresh key. The returned identity's chain is the leaf
    /// alone (the CA goes in the trust bundle, `ca.crt`).
    pub fn issue(&self, req: &IssueRequest) -> Result<Identity, IssueError> {
        let key = req.key.generate()?;
        let cert = self.sign_leaf(req, &key)?;
        Ok(Identity::new(vec![cert], key)?)
    }

    /// Signs a leaf certificate for an existing key (`issue` generates one).
    pub fn sign_leaf(
        &self,
        req: &IssueRequest,
        key: &PKeyRef<Private>,
    ) -> Result<X509, IssueError> {
        let mut b = builder(&req.common_name, key, req.validity)?;
        b.set_issuer_name(self.cert.subject_name())?;
        b.append_extension(BasicConstraints::new().critical().build()?)?;
        let (ku, eku) = match req.profile {
            CertProfile::Server => (
                KeyUsage::new()
                    .critical()
                    .digital_signature()
                    .key_encipherment()
                    .build()?,
                ExtendedKeyUsage::new().server_auth().build()?,
            ),
            CertProfile::Client => (
                KeyUsage::new().critical().digital_signature().build()?,
                ExtendedKeyUsage::new().client_auth().build()?,
            ),
        };
        b.append_extension(ku)?;
        b.append_extension(eku)?;
        let mut sans = req.sans.clone();
        if sans.is_empty() && req.profile == CertProfile::Server && is_dns_name(&req.common_name) {
            sans.push(San::Dns(req.common_name.clone()));
        }
        if !sans.is_empty() {
            let mut alt = SubjectAlternativeName::new();
            for san in &sans {
                match san {
                    San::Dns(n) => alt.dns(n),
                    San::Ip(ip) => alt.ip(&ip.to_string()),
                };
            }
            let ext = alt.build(&b.x509v3_context(Some(&self.cert), None))?;
            b.append_extension(ext)?;
        }
        let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(Some(&self.cert), None))?;
        b.append_extension(ski)?;
        let aki = AuthorityKeyIdentifier::new()
            .keyid(true)
            .build(&b.x509v3_context(Some(&self.cert), None))?;
        b.append_extension(aki)?;
        b.sign(&self.key, MessageDigest::sha256())?;
        Ok(b.build())
    }
}

fn b_subject(cn: &str) -> Result<openssl::x509::X509Name, IssueError> {
    if cn.is_empty() || cn.chars().count() > 64 {
        return Err(IssueError::InvalidCommonName { cn: cn.to_owned() });
    }
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", cn)?;
    Ok(name.build())
}

/// Version, serial, subject, key and validity: what every certificate shares.
fn builder(
    cn: &str,
    key: &PKeyRef<Private>,
    validity: Validity,
) -> Result<X509Builder, IssueError> {
    if validity.not_after <= validity.not_before {
        return Err(IssueError::EmptyValidity);
    }
    let mut b = X509Builder::new()?;
    b.set_version(2)?;
    b.set_serial_number(random_serial()?.as_ref())?;
    b.set_subject_name(b_subject(cn)?.as_ref())?;
    b.set_pubkey(key)?;
    b.set_not_before(Asn1Time::from_unix(validity.not_before as _)?.as_ref())?;
    b.set_not_after(Asn1Time::from_unix(validity.not_after as _)?.as_ref())?;
    Ok(b)
}

fn random_serial() -> Result<Asn1Integer, ErrorStack> {
    let mut bn = BigNum::new()?;
    bn.rand(SERIAL_BITS, MsbOption::MAYBE_ZERO, false)?;
    bn.to_asn1_integer()
}
