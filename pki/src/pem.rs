//! Loading PEM text: certificate chains, CA bundles, private keys, and the pair of a chain and
//! its key ([`Identity`]).
//!
//! The text is first cut into `-----BEGIN X----- … -----END X-----` blocks by hand so that a
//! truncated file is reported as such (OpenSSL would silently stop at the last whole block), and
//! so that an encrypted key is recognised before OpenSSL asks for a password. Text outside the
//! blocks (comments, `Bag Attributes` lines) is ignored, as OpenSSL does.

use openssl::error::ErrorStack;
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::verify::X509VerifyParam;
use openssl::x509::{X509Ref, X509StoreContext, X509VerifyResult, X509};

/// PEM label of a certificate.
pub const LABEL_CERTIFICATE: &str = "CERTIFICATE";
/// PEM label of a PKCS#8 private key (what this crate writes).
pub const LABEL_PRIVATE_KEY: &str = "PRIVATE KEY";
/// PEM label of a PKCS#8 encrypted private key.
pub const LABEL_ENCRYPTED_PRIVATE_KEY: &str = "ENCRYPTED PRIVATE KEY";
/// PEM labels of the traditional (PKCS#1 / SEC1) private keys.
pub const LABELS_TRADITIONAL_KEY: [&str; 2] = ["RSA PRIVATE KEY", "EC PRIVATE KEY"];

/// Errors from loading PEM text.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The input is not UTF-8 text.
    #[error("not PEM text (invalid UTF-8)")]
    NotText,
    /// A `BEGIN` line has no matching `END` line: the file was cut short.
    #[error("truncated PEM: block {index} (\"{label}\") has no END line")]
    Truncated {
        /// Index of the block (0-based) among all blocks of the input.
        index: usize,
        /// Its label.
        label: String,
    },
    /// No block with the wanted label was found.
    #[error("no {wanted} found in PEM text")]
    Missing {
        /// What was looked for.
        wanted: &'static str,
    },
    /// More than one private key in one input.
    #[error("more than one private key in PEM text")]
    SeveralKeys,
    /// A certificate block did not parse.
    #[error("certificate {index} does not parse")]
    Certificate {
        /// Index of the certificate (0-based) among the certificates of the input.
        index: usize,
        /// OpenSSL's reason.
        #[source]
        source: ErrorStack,
    },
    /// The private key is encrypted; keys must be stored unencrypted (mode 0600) for an
    /// unattended daemon.
    #[error(
        "the private key is encrypted; decrypt it first (e.g. `openssl pkey -in KEY -out PLAIN`) \
         and protect the file with mode 0600"
    )]
    KeyEncrypted,
    /// An encrypted private key could not be decrypted with the password given.
    #[error("wrong password for the encrypted private key")]
    WrongPassword,
    /// The private key block did not parse.
    #[error("private key does not parse")]
    PrivateKey(#[source] ErrorStack),
    /// The private key does not belong to the leaf certificate.
    #[error("the private key does not match the certificate")]
    KeyMismatch,
    /// Serialising to PEM failed.
    #[error("PEM encoding failed")]
    Encode(#[source] ErrorStack),
}

/// One `BEGIN`/`END` block of a PEM text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PemBlock<'a> {
    /// The label between `BEGIN ` and the dashes.
    pub label: &'a str,
    /// The whole block, from the `BEGIN` line through the `END` line.
    pub text: &'a str,
}

/// Cuts `text` into its PEM blocks. Lines outside blocks are ignored.
pub fn blocks(text: &str) -> Result<Vec<PemBlock<'_>>, PemError> {
    let mut out = Vec::new();
    let mut open: Option<(&str, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim();
        if let Some(label) = marker(trimmed, "-----BEGIN ") {
            if let Some((label, _)) = open {
                return Err(PemError::Truncated {
                    index: out.len(),
                    label: label.to_owned(),
                });
            }
            open = Some((label, start));
        } else if let Some(label) = marker(trimmed, "-----END ") {
            if let Some((open_label, begin)) = open {
                if open_label != label {
                    return Err(PemError::Truncated {
                        index: out.len(),
                        label: open_label.to_owned(),
                    });
                }
                out.push(PemBlock {
                    label: open_label,
                    text: &text[begin..offset],
                });
                open = None;
            }
        }
    }
    match open {
        Some((label, _)) => Err(PemError::Truncated {
            index: out.len(),
            label: label.to_owned(),
        }),
        None => Ok(out),
    }
}

fn marker<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.strip_prefix(prefix)?.strip_suffix("-----")
}

fn text(pem: &[u8]) -> Result<&str, PemError> {
    std::str::from_utf8(pem).map_err(|_| PemError::NotText)
}

/// Parses every certificate in `pem`, in order (a chain: leaf first, then intermediates; or a
/// bundle of CAs). At least one is required.
pub fn certificates(pem: &[u8]) -> Result<Vec<X509>, PemError> {
    let certs = blocks(text(pem)?)?
        .into_iter()
        .filter(|b| b.label == LABEL_CERTIFICATE)
        .enumerate()
        .map(|(index, b)| {
            X509::from_pem(b.text.as_bytes())
                .map_err(|source| PemError::Certificate { index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(PemError::Missing {
            wanted: "certificate",
        });
    }
    Ok(certs)
}

/// Parses the one unencrypted private key in `pem`. An encrypted key is refused with
/// [`PemError::KeyEncrypted`].
pub fn private_key(pem: &[u8]) -> Result<PKey<Private>, PemError> {
    let block = key_block(pem)?;
    if is_encrypted(&block) {
        return Err(PemError::KeyEncrypted);
    }
    // A callback that refuses keeps OpenSSL from prompting on a terminal should an encrypted
    // form slip past the check above.
    PKey::private_key_from_pem_callback(block.text.as_bytes(), |_buf| Err(ErrorStack::get()))
        .map_err(PemError::PrivateKey)
}

/// Parses the one private key in `pem`, decrypting it with `password` if it is encrypted.
/// A wrong password gives [`PemError::WrongPassword`].
pub fn private_key_with_password(pem: &[u8], password: &[u8]) -> Result<PKey<Private>, PemError> {
    let block = key_block(pem)?;
    let encrypted = is_encrypted(&block);
    PKey::private_key_from_pem_passphrase(block.text.as_bytes(), password).map_err(|e| {
        if encrypted {
            PemError::WrongPassword
        } else {
            PemError::PrivateKey(e)
        }
    })
}

fn key_block(pem: &[u8]) -> Result<PemBlock<'_>, PemError> {
    let mut keys = blocks(text(pem)?)?.into_iter().filter(|b| {
        b.label == LABEL_PRIVATE_KEY
            || b.label == LABEL_ENCRYPTED_PRIVATE_KEY
            || LABELS_TRADITIONAL_KEY.contains(&b.label)
    });
    let Some(first) = keys.next() else {
        return Err(PemError::Missing {
            wanted: "private key",
        });
    };
    if keys.next().is_some() {
        return Err(PemError::SeveralKeys);
    }
    Ok(first)
}

/// PKCS#8 encrypted keys have their own label; traditional ones carry a `Proc-Type` header.
fn is_encrypted(block: &PemBlock<'_>) -> bool {
    block.label == LABEL_ENCRYPTED_PRIVATE_KEY
        || block
            .text
            .lines()
            .any(|l| l.trim_start().starts_with("Proc-Type:") && l.contains("ENCRYPTED"))
}

/// Serialises certificates as concatenated PEM blocks.
pub fn certificates_to_pem<'a>(
    certs: impl IntoIterator<Item = &'a X509Ref>,
) -> Result<Vec<u8>, PemError> {
    let mut out = Vec::new();
    for cert in certs {
        out.extend_from_slice(&cert.to_pem().map_err(PemError::Encode)?);
    }
    Ok(out)
}

/// Serialises a private key as unencrypted PKCS#8 PEM (`BEGIN PRIVATE KEY`).
pub fn private_key_to_pem(key: &PKey<Private>) -> Result<Vec<u8>, PemError> {
    key.private_key_to_pem_pkcs8().map_err(PemError::Encode)
}

/// The trusted CA certificates: usually one, two while a CA is being rotated (old and new both
/// trusted until every leaf has been reissued).
#[derive(Debug, Clone)]
pub struct CaBundle {
    certs: Vec<X509>,
}

/// Why a certificate was not accepted by [`CaBundle::verify`].
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The chain does not verify; `reason` is OpenSSL's verify result (e.g. "certificate has
    /// expired", "unable to get local issuer certificate").
    #[error("certificate verification failed at depth {depth}: {reason}")]
    Rejected {
        /// Depth in the chain at which verification failed (0 = leaf).
        depth: u32,
        /// OpenSSL's verify result code.
        code: i32,
        /// Its text.
        reason: &'static str,
    },
    /// OpenSSL failed outside the verification itself.
    #[error("building the verification context failed")]
    Setup(#[source] ErrorStack),
}

impl VerifyError {
    /// OpenSSL's `X509_V_ERR_CERT_HAS_EXPIRED`.
    pub const CERT_HAS_EXPIRED: i32 = 10;
    /// OpenSSL's `X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY`.
    pub const UNABLE_TO_GET_ISSUER_CERT_LOCALLY: i32 = 20;

    /// OpenSSL's verify result code, if verification itself failed.
    pub fn code(&self) -> Option<i32> {
        match self {
            VerifyError::Rejected { code, .. } => Some(*code),
            VerifyError::Setup(_) => None,
        }
    }
}

impl CaBundle {
    /// A bundle of the given CA certificates (at least one).
    pub fn new(certs: Vec<X509>) -> Result<CaBundle, PemError> {
        if certs.is_empty() {
            return Err(PemError::Missing {
                wanted: "CA certificate",
            });
        }
        Ok(CaBundle { certs })
    }

    /// Parses a bundle of one or more CA certificates.
    pub fn from_pem(pem: &[u8]) -> Result<CaBundle, PemError> {
        CaBundle::new(certificates(pem)?)
    }

    /// The CA certificates, in file order.
    pub fn certs(&self) -> &[X509] {
        &self.certs
    }

    /// Adds a CA (e.g. the new one during rotation) unless an identical one is present.
    pub fn push(&mut self, cert: X509) {
        let der = cert.to_der().ok();
        if der.is_some() && self.certs.iter().any(|c| c.to_der().ok() == der) {
            return;
        }
        self.certs.push(cert);
    }

    /// The bundle as concatenated PEM blocks.
    pub fn to_pem(&self) -> Result<Vec<u8>, PemError> {
        certificates_to_pem(self.certs.iter().map(|c| c.as_ref()))
    }

    /// An OpenSSL trust store holding every CA of the bundle.
    pub fn store(&self) -> Result<X509Store, ErrorStack> {
        self.store_at(None)
    }

    fn store_at(&self, at_unix: Option<i64>) -> Result<X509Store, ErrorStack> {
        let mut builder = X509StoreBuilder::new()?;
        for cert in &self.certs {
            builder.add_cert(cert.clone())?;
        }
        if let Some(t) = at_unix {
            let mut param = X509VerifyParam::new()?;
            param.set_time(t as _);
            builder.set_param(&param)?;
        }
        Ok(builder.build())
    }

    /// Verifies `leaf` (with optional untrusted intermediates) against the bundle, as the TLS
    /// handshake would: signature chain to one of the CAs and validity periods. `at_unix` fixes
    /// the verification time (seconds since the epoch); `None` uses the current time.
    pub fn verify(
        &self,
        leaf: &X509Ref,
        intermediates: &[X509],
        at_unix: Option<i64>,
    ) -> Result<(), VerifyError> {
        let store = self.store_at(at_unix).map_err(VerifyError::Setup)?;
        let mut chain = Stack::new().map_err(VerifyError::Setup)?;
        for c in intermediates {
            chain.push(c.clone()).map_err(VerifyError::Setup)?;
        }
        let mut ctx = X509StoreContext::new().map_err(VerifyError::Setup)?;
        let outcome = ctx
            .init(&store, leaf, &chain, |c| {
                let ok = c.verify_cert()?;
                Ok((ok, c.error(), c.error_depth()))
            })
            .map_err(VerifyError::Setup)?;
        match outcome {
            (true, _, _) => Ok(()),
            (false, result, depth) => Err(rejected(result, depth)),
        }
    }
}

fn rejected(result: X509VerifyResult, depth: u32) -> VerifyError {
    VerifyError::Rejected {
        depth,
        code: result.as_raw(),
        reason: result.error_string(),
    }
}

/// A certificate chain (leaf first) and the leaf's private key: what a TLS endpoint presents.
#[derive(Debug, Clone)]
pub struct Identity {
    chain: Vec<X509>,
    key: PKey<Private>,
}

impl Identity {
    /// Pairs a chain (leaf first, at least one) with its key, checking that they match.
    pub fn new(chain: Vec<X509>, key: PKey<Private>) -> Result<Identity, PemError> {
        let Some(leaf) = chain.first() else {
            return Err(PemError::Missing {
                wanted: "certificate",
            });
        };
        let public = leaf.public_key().map_err(PemError::PrivateKey)?;
        if !public.public_eq(&key) {
            return Err(PemError::KeyMismatch);
        }
        Ok(Identity { chain, key })
    }

    /// Parses a chain and an unencrypted key (they may be the same text).
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8]) -> Result<Identity, PemError> {
        Identity::new(certificates(chain_pem)?, private_key(key_pem)?)
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &X509Ref {
        // `new` guarantees a non-empty chain.
        &self.chain[0]
    }

    /// The whole chain, leaf first.
    pub fn chain(&self) -> &[X509] {
        &self.chain
    }

    /// The certificates after the leaf.
    pub fn intermediates(&self) -> &[X509] {
        &self.chain[1..]
    }

    /// The leaf's private key.
    pub fn key(&self) -> &PKey<Private> {
        &self.key
    }

    /// The chain as PEM (leaf first).
    pub fn chain_pem(&self) -> Result<Vec<u8>, PemError> {
        certificates_to_pem(self.chain.iter().map(|c| c.as_ref()))
    }

    /// The key as unencrypted PKCS#8 PEM.
    pub fn key_pem(&self) -> Result<Vec<u8>, PemError> {
        private_key_to_pem(&self.key)
    }
}
