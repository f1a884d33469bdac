//! Key material for every component: a CA, server and client certificates with the key usages
//! OpenVPN checks, OpenVPN static keys (tls-auth / tls-crypt), the OpenSSL contexts the control
//! channel and the CONNECT sidecar use, and the certificate policy (`remote-cert-tls`,
//! `verify-x509-name`, CN as client identity).
//!
//! | module | what it is |
//! |---|---|
//! | [`keys`] | private key generation: ECDSA P-256 (default), RSA 2048 / 3072 |
//! | [`issue`] | a CA and the server / client certificates it issues |
//! | [`pem`] | loading PEM: chains, CA bundles (rotation), keys (encrypted ones refused), [`pem::Identity`] |
//! | [`check`] | `remote-cert-tls`, `verify-x509-name`, client identity from the CN |
//! | [`tls`] | OpenSSL contexts for the OpenVPN control channel and the CONNECT sidecar |
//! | [`summary`] | a human summary of a certificate (`vpn-pki show`) |
//! | [`files`] | the only file I/O: reading PEM, writing keys with mode 0600, no silent overwrite |
//!
//! Everything but [`files`] works on bytes and OpenSSL objects; nothing reads the clock
//! (validity periods take the current time as an argument).

pub mod check;
pub mod files;
pub mod issue;
pub mod keys;
pub mod pem;
pub mod summary;
pub mod tls;

pub use check::{CertCheckError, RemoteCertTls, VerifyX509Name, X509NameType};
pub use issue::{Ca, CertProfile, IssueError, IssueRequest, San, Validity};
pub use keys::KeySpec;
pub use pem::{CaBundle, Identity, PemError, VerifyError};
pub use tls::PeerPolicy;
