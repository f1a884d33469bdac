//! The certificate checks OpenVPN applies to the peer's leaf certificate (depth 0) after the
//! chain has verified: `remote-cert-tls`, `verify-x509-name`, and the CN as client identity.
//!
//! Each takes the leaf as an [`X509Ref`] and returns a typed [`CertCheckError`]; the TLS
//! contexts in [`crate::tls`] call them from the verify callback, the tests call them directly.

use std::str::FromStr;

use openssl::nid::Nid;
use openssl::x509::{X509ExtendedKeyUsage, X509NameRef, X509Ref};

/// `remote-cert-tls server|client`: the role the peer's certificate must be issued for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteCertTls {
    /// The peer must be a server: keyUsage present, EKU contains serverAuth.
    Server,
    /// The peer must be a client: keyUsage present, EKU contains clientAuth.
    Client,
}

impl RemoteCertTls {
    /// The EKU OpenVPN looks for, by its OpenSSL long name.
    pub fn eku_name(self) -> &'static str {
        match self {
            RemoteCertTls::Server => "TLS Web Server Authentication",
            RemoteCertTls::Client => "TLS Web Client Authentication",
        }
    }
}

/// `verify-x509-name` types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum X509NameType {
    /// Exact match with the whole subject, printed as [`subject_string`] does (the default).
    #[default]
    Subject,
    /// Exact match with the CN.
    Name,
    /// The CN starts with the given text.
    NamePrefix,
}

/// A `verify-x509-name NAME TYPE` directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyX509Name {
    /// The name to compare with.
    pub name: String,
    /// How to compare.
    pub kind: X509NameType,
}

/// Why a leaf certificate fails a check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertCheckError {
    /// `remote-cert-tls` requires a keyUsage extension and there is none.
    #[error("certificate has no keyUsage extension (remote-cert-tls {expected:?})")]
    KeyUsageMissing {
        /// The role required.
        expected: RemoteCertTls,
    },
    /// `remote-cert-tls` requires an extendedKeyUsage extension and there is none.
    #[error("certificate has no extendedKeyUsage extension (remote-cert-tls {expected:?})")]
    ExtendedKeyUsageMissing {
        /// The role required.
        expected: RemoteCertTls,
    },
    /// The EKU does not contain the required purpose (e.g. a client certificate presented by a
    /// server).
    #[error("certificate EKU lacks {}", expected.eku_name())]
    ExtendedKeyUsageMismatch {
        /// The role required.
        expected: RemoteCertTls,
    },
    /// `verify-x509-name` did not match.
    #[error("verify-x509-name {kind:?} {expected:?} does not match {actual:?}")]
    NameMismatch {
        /// The comparison type.
        kind: X509NameType,
        /// The configured name.
        expected: String,
        /// What the certificate holds (subject string or CN).
        actual: String,
    },
    /// The subject has no CN.
    #[error("certificate subject has no common name")]
    CommonNameMissing,
    /// The subject has more than one CN, so the identity would be ambiguous.
    #[error("certificate subject has {count} common names")]
    SeveralCommonNames {
        /// How many.
        count: usize,
    },
    /// The CN holds characters not allowed in a client identity (it names a
    /// client-config-dir file).
    #[error("common name {cn:?} holds characters not allowed in a client identity")]
    InvalidIdentity {
        /// The CN.
        cn: String,
    },
}

/// Error parsing an [`X509NameType`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verify-x509-name type {value:?} (subject, name or name-prefix)")]
pub struct UnknownNameType {
    /// The text given.
    pub value: String,
}

impl FromStr for X509NameType {
    type Err = UnknownNameType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "subject" => Ok(X509NameType::Subject),
            "name" => Ok(X509NameType::Name),
            "name-prefix" => Ok(X509NameType::NamePrefix),
            _ => Err(UnknownNameType {
                value: s.to_owned(),
            }),
        }
    }
}

/// `remote-cert-tls`: keyUsage must be present (any bits; OpenSSL checks them against the
/// cipher suite) and extendedKeyUsage must contain serverAuth or clientAuth.
pub fn check_remote_cert_tls(
    leaf: &X509Ref,
    expected: RemoteCertTls,
) -> Result<(), CertCheckError> {
    if leaf.key_usage().is_none() {
        return Err(CertCheckError::KeyUsageMissing { expected });
    }
    let Some(eku) = leaf.extended_key_usage() else {
        return Err(CertCheckError::ExtendedKeyUsageMissing { expected });
    };
    let wanted = match expected {
        RemoteCertTls::Server => X509ExtendedKeyUsage::SSL_SERVER,
        RemoteCertTls::Client => X509ExtendedKeyUsage::SSL_CLIENT,
    };
    // anyExtendedKeyUsage does not count: OpenVPN compares each listed purpose by name.
    if eku.contains(wanted) {
        Ok(())
    } else {
        Err(CertCheckError::ExtendedKeyUsageMismatch { expected })
    }
}

/// `verify-x509-name`.
pub fn check_verify_x509_name(leaf: &X509Ref, rule: &VerifyX509Name) -> Result<(), CertCheckError> {
    let (actual, ok) = match rule.kind {
        X509NameType::Subject => {
            let s = subject_string(leaf.subject_name());
            let ok = s == rule.name;
            (s, ok)
        }
        X509NameType::Name => {
            let cn = common_name(leaf)?;
            let ok = cn == rule.name;
            (cn, ok)
        }
        X509NameType::NamePrefix => {
            let cn = common_name(leaf)?;
            let ok = cn.starts_with(&rule.name);
            (cn, ok)
        }
    };
    if ok {
        Ok(())
    } else {
        Err(CertCheckError::NameMismatch {
            kind: rule.kind,
            expected: rule.name.clone(),
            actual,
        })
    }
}

/// The single CN of the leaf's subject.
pub fn common_name(leaf: &X509Ref) -> Result<String, CertCheckError> {
    let mut cns = leaf.subject_name().entries_by_nid(Nid::COMMONNAME);
    let Some(first) = cns.next() else {
        return Err(CertCheckError::CommonNameMissing);
    };
    let rest = cns.count();
    if rest > 0 {
        return Err(CertCheckError::SeveralCommonNames { count: rest + 1 });
    }
    Ok(asn1_text(first.data()))
}

/// The client identity: the CN, restricted to letters, digits and `-_.@` (it names the
/// client-config-dir file and decides readiness classes such as `vpn-shoot-client`).
///
/// Upstream remaps other characters to `_`; we refuse them instead, so two distinct
/// certificates can never map to one identity.
pub fn client_identity(leaf: &X509Ref) -> Result<String, CertCheckError> {
    let cn = common_name(leaf)?;
    if is_valid_identity(&cn) {
        Ok(cn)
    } else {
        Err(CertCheckError::InvalidIdentity { cn })
    }
}

/// Whether `name` is usable as a client identity (and so as a file name): non-empty, only
/// letters, digits and `-_.@`, not `.` or `..`.
pub fn is_valid_identity(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

/// The subject as OpenVPN prints and compares it: RDNs in certificate order, short names,
/// `", "` between them, values as UTF-8 with control characters written `\XX` and `\` as `\\`
/// (OpenSSL `X509_NAME_print_ex` with `XN_FLAG_SEP_CPLUS_SPC | XN_FLAG_FN_SN |
/// ASN1_STRFLGS_UTF8_CONVERT | ASN1_STRFLGS_ESC_CTRL`). Multi-valued RDNs are printed as
/// separate RDNs (the `openssl` crate does not expose RDN set membership).
pub fn subject_string(name: &X509NameRef) -> String {
    let mut out = String::new();
    for (i, entry) in name.entries().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let nid = entry.object().nid();
        match nid.short_name() {
            Ok(sn) if nid != Nid::UNDEF => out.push_str(sn),
            _ => out.push_str(&entry.object().to_string()),
        }
        out.push('=');
        for c in asn1_text(entry.data()).chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    out.push_str(&format!("\\{:02X}", c as u32));
                }
                c => out.push(c),
            }
        }
    }
    out
}

fn asn1_text(s: &openssl::asn1::Asn1StringRef) -> String {
    match s.to_string() {
        Ok(t) => t,
        Err(_) => String::from_utf8_lossy(s.as_slice()).into_owned(),
    }
}
