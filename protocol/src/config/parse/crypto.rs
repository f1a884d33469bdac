//! Keys, TLS and the data channel: `ca`, `cert`, `key`, `dh`, `tls-auth`, `tls-crypt`,
//! `key-direction`, `auth`, `data-ciphers` (and its old name `ncp-ciphers`),
//! `data-ciphers-fallback`, `cipher`, `comp-lzo`, `compress`, `remote-cert-tls`,
//! `verify-x509-name`, `tls-version-min`, `reneg-sec`, `reneg-bytes`, `reneg-pkts`,
//! `hand-window`, `tls-timeout`, `tran-window`, `replay-window`; and the inline blocks, the
//! other way to give `ca`, `cert`, `key`, `tls-auth` and `tls-crypt` ([`inline`]).

use super::raw::Raw;
use super::{takes, Spec};
use crate::config::args::{bad, key_direction, path_source, u32_arg, u64_arg, Args};
use crate::config::model::{
    CertUsage, RenegSec, ReplayWindow, TlsVersion, TlsVersionMin, VerifyX509Name, X509NameType,
};
use crate::config::{ErrorReason, Source, WarningKind};
use crate::data::{Compression, DataCipher};
use crate::digest::Digest;
use crate::ncp::{self, DataCiphers, NcpConfigError};

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new("ca", takes(1, 1, "FILE"), ca),
    Spec::new("cert", takes(1, 1, "FILE"), cert),
    Spec::new("key", takes(1, 1, "FILE"), key),
    Spec::new("dh", takes(1, 1, "none|FILE"), dh).server_only(),
    Spec::new("tls-auth", takes(1, 2, "FILE [0|1]"), tls_auth),
    Spec::new("tls-crypt", takes(1, 1, "FILE"), tls_crypt),
    Spec::new("key-direction", takes(1, 1, "0|1"), key_direction_directive),
    Spec::new("auth", takes(1, 1, "DIGEST"), auth),
    Spec::new(
        "data-ciphers",
        takes(1, 1, "CIPHER[:CIPHER...]"),
        data_ciphers,
    ),
    Spec::new(
        "ncp-ciphers",
        takes(1, 1, "CIPHER[:CIPHER...]"),
        data_ciphers,
    ),
    Spec::new(
        "data-ciphers-fallback",
        takes(1, 1, "CIPHER"),
        data_ciphers_fallback,
    ),
    Spec::new("cipher", takes(1, 1, "CIPHER"), cipher),
    Spec::new("comp-lzo", takes(0, 1, "no"), comp_lzo),
    Spec::new("compress", takes(0, 1, "[stub|stub-v2]"), compress),
    Spec::new(
        "remote-cert-tls",
        takes(1, 1, "server|client"),
        remote_cert_tls,
    ),
    Spec::new(
        "verify-x509-name",
        takes(1, 2, "NAME [subject|name|name-prefix]"),
        verify_x509_name,
    ),
    Spec::new(
        "tls-version-min",
        takes(1, 2, "1.0|1.1|1.2|1.3 [or-highest]"),
        tls_version_min,
    ),
    Spec::new("reneg-sec", takes(1, 2, "SECONDS [MIN]"), reneg_sec),
    Spec::new("reneg-bytes", takes(1, 1, "BYTES"), reneg_bytes),
    Spec::new("reneg-pkts", takes(1, 1, "PACKETS"), reneg_pkts),
    Spec::new("hand-window", takes(1, 1, "SECONDS"), hand_window),
    Spec::new("tls-timeout", takes(1, 1, "SECONDS"), tls_timeout),
    Spec::new("tran-window", takes(1, 1, "SECONDS"), tran_window),
    Spec::new("replay-window", takes(1, 2, "N [SECONDS]"), replay_window),
];

/// An inline block (`<ca>` ... `</ca>`): the content stands for the file; any tag but the
/// five key files' is [`ErrorReason::UnknownInlineTag`].
pub(super) fn inline(
    raw: &mut Raw,
    tag: &str,
    line: usize,
    content: &str,
) -> Result<(), ErrorReason> {
    let src = Source::Inline(content.to_owned());
    let common = &mut raw.common;
    match tag {
        "ca" => common.ca = Some(src),
        "cert" => common.cert = Some(src),
        "key" => common.key = Some(src),
        "tls-auth" => common.tls_auth = Some(((src, None), line)),
        "tls-crypt" => common.tls_crypt = Some((src, line)),
        _ => {
            return Err(ErrorReason::UnknownInlineTag {
                tag: tag.to_owned(),
            })
        }
    }
    Ok(())
}

fn ca(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.ca = Some(path_source(a.s(0)));
    Ok(())
}

fn cert(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.cert = Some(path_source(a.s(0)));
    Ok(())
}

fn key(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.key = Some(path_source(a.s(0)));
    Ok(())
}

/// `dh none`, or a DH parameter file, which is ignored with a warning.
fn dh(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    if a.s(0) != "none" {
        // Older templates (GEP-14) name a DH parameter file. We offer ECDHE only (every 2.6
        // peer supports it), so the file is not needed: warn, do not refuse, so those configs
        // start unchanged.
        raw.warn(a.line(), a.name(), WarningKind::DhFileIgnored);
    }
    Ok(())
}

/// `tls-auth FILE [DIRECTION]`; without a direction, `key-direction`'s applies.
fn tls_auth(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let dir = a.opt(1).map(key_direction).transpose()?;
    raw.common.tls_auth = Some(((path_source(a.s(0)), dir), a.line()));
    Ok(())
}

fn tls_crypt(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.tls_crypt = Some((path_source(a.s(0)), a.line()));
    Ok(())
}

fn key_direction_directive(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.key_direction = Some(key_direction(a.s(0))?);
    Ok(())
}

fn auth(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let digest = Digest::from_name(a.s(0)).ok_or_else(|| bad(a.s(0), "SHA1, SHA256 or SHA512"))?;
    raw.common.auth = Some(digest);
    Ok(())
}

fn data_ciphers(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.data_ciphers = Some(DataCiphers::parse(a.s(0)).map_err(ErrorReason::Ncp)?);
    Ok(())
}

fn data_ciphers_fallback(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.data_ciphers_fallback = Some(ncp::parse_fallback(a.s(0)).map_err(ErrorReason::Ncp)?);
    Ok(())
}

fn cipher(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let cipher = DataCipher::from_name(a.s(0)).ok_or_else(|| {
        ErrorReason::Ncp(NcpConfigError::UnsupportedCipher {
            name: a.s(0).to_owned(),
        })
    })?;
    raw.common.cipher = Some(cipher);
    Ok(())
}

/// `comp-lzo no` only: the LZO stub framing, no compression.
fn comp_lzo(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    match a.opt(0) {
        Some("no") => raw.common.compression = Compression::LzoStub,
        v => {
            return Err(ErrorReason::UnsupportedCompression {
                value: format!("comp-lzo {}", v.unwrap_or(""))
                    .trim_end()
                    .to_owned(),
            })
        }
    }
    Ok(())
}

/// `compress`, `compress stub` or `compress stub-v2`: framing only, no algorithm.
fn compress(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.compression = match a.opt(0) {
        None | Some("stub") => Compression::StubSwap,
        Some("stub-v2") => Compression::StubV2,
        Some(v) => {
            return Err(ErrorReason::UnsupportedCompression {
                value: format!("compress {v}"),
            })
        }
    };
    Ok(())
}

fn remote_cert_tls(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.remote_cert_tls = Some(match a.s(0) {
        "server" => CertUsage::Server,
        "client" => CertUsage::Client,
        v => return Err(bad(v, "server or client")),
    });
    Ok(())
}

fn verify_x509_name(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let kind = match a.opt(1) {
        None | Some("subject") => X509NameType::Subject,
        Some("name") => X509NameType::Name,
        Some("name-prefix") => X509NameType::NamePrefix,
        Some(v) => return Err(bad(v, "subject, name or name-prefix")),
    };
    raw.common.verify_x509_name = Some(VerifyX509Name {
        name: a.s(0).to_owned(),
        kind,
    });
    Ok(())
}

fn tls_version_min(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let version = match a.s(0) {
        "1.0" => TlsVersion::V1_0,
        "1.1" => TlsVersion::V1_1,
        "1.2" => TlsVersion::V1_2,
        "1.3" => TlsVersion::V1_3,
        v => return Err(bad(v, "1.0, 1.1, 1.2 or 1.3")),
    };
    let or_highest = match a.opt(1) {
        None => false,
        Some("or-highest") => true,
        Some(v) => return Err(bad(v, "or-highest")),
    };
    raw.common.tls_version_min = Some(TlsVersionMin {
        version,
        or_highest,
    });
    Ok(())
}

fn reneg_sec(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.reneg_sec = Some(RenegSec {
        max: u32_arg(a.s(0))?,
        min: a.opt(1).map(u32_arg).transpose()?,
    });
    Ok(())
}

fn reneg_bytes(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.reneg_bytes = Some(u64_arg(a.s(0))?);
    Ok(())
}

fn reneg_pkts(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.reneg_pkts = Some(u64_arg(a.s(0))?);
    Ok(())
}

fn hand_window(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.hand_window = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn tls_timeout(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.tls_timeout = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn tran_window(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.tran_window = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn replay_window(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.replay_window = Some(ReplayWindow {
        size: u32_arg(a.s(0))?,
        time: a.opt(1).map(u32_arg).transpose()?,
    });
    Ok(())
}
