//! Key material for every component: a CA, server and client certificates with the key usages
//! OpenVPN checks, OpenVPN static keys (tls-auth / tls-crypt), the OpenSSL contexts the control
//! channel and the CONNECT sidecar use, and the certificate policy (`remote-cert-tls`,
//! `verify-x509-name`, CN as client identity).
//!
//! Not built yet: see the `pki` issue.
