//! OpenSSL contexts: the OpenVPN control channel (used by `protocol` over memory buffers) and
//! the mTLS HTTPS of the CONNECT sidecar.
//!
//! The control-channel contexts copy what OpenVPN 2.6 sets up with OpenSSL 3:
//!
//! - TLS 1.2 minimum, TLS 1.3 maximum;
//! - the TLS 1.2 cipher list [`OPENVPN_TLS12_CIPHER_LIST`] (ephemeral (EC)DHE only), OpenSSL's
//!   default TLS 1.3 suites and groups;
//! - no session tickets, no compression, server cipher preference, no TLS renegotiation, session
//!   cache off; security level 1 (`tls-cert-profile legacy`);
//! - the server requires a client certificate; both sides verify the peer chain against the CA
//!   bundle, with **no** hostname check; the [`PeerPolicy`] checks run on the leaf (depth 0)
//!   in the verify callback, where OpenVPN runs them.

use openssl::error::ErrorStack;
use openssl::ssl::{
    SslAcceptor, SslConnector, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions,
    SslSessionCacheMode, SslVerifyMode, SslVersion,
};
use openssl::x509::{X509Ref, X509VerifyResult};

use crate::check::{
    check_remote_cert_tls, check_verify_x509_name, CertCheckError, RemoteCertTls, VerifyX509Name,
};
use crate::pem::{CaBundle, Identity};

/// OpenVPN 2.6's TLS 1.2 cipher list when `--tls-cipher` is not set.
pub const OPENVPN_TLS12_CIPHER_LIST: &str =
    "DEFAULT:!EXP:!LOW:!MEDIUM:!kDH:!kECDH:!DSS:!PSK:!SRP:!kRSA";

/// OpenSSL security level of OpenVPN's default `tls-cert-profile legacy`.
pub const OPENVPN_SECURITY_LEVEL: u32 = 1;

/// Errors building a TLS context.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL refused a setting, the certificate or the key.
    #[error("building the TLS context failed")]
    OpenSsl(#[from] ErrorStack),
}

/// The identity checks applied to the peer's leaf certificate after its chain verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    /// `remote-cert-tls server|client`.
    pub remote_cert_tls: Option<RemoteCertTls>,
    /// `verify-x509-name`.
    pub verify_x509_name: Option<VerifyX509Name>,
}

impl PeerPolicy {
    /// What an OpenVPN client configured with `remote-cert-tls server` checks.
    pub fn server_peer() -> PeerPolicy {
        PeerPolicy {
            remote_cert_tls: Some(RemoteCertTls::Server),
            verify_x509_name: None,
        }
    }

    /// What our server checks of its clients: `remote-cert-tls client`.
    pub fn client_peer() -> PeerPolicy {
        PeerPolicy {
            remote_cert_tls: Some(RemoteCertTls::Client),
            verify_x509_name: None,
        }
    }

    /// Runs every configured check on the leaf.
    pub fn check(&self, leaf: &X509Ref) -> Result<(), CertCheckError> {
        if let Some(role) = self.remote_cert_tls {
            check_remote_cert_tls(leaf, role)?;
        }
        if let Some(rule) = &self.verify_x509_name {
            check_verify_x509_name(leaf, rule)?;
        }
        Ok(())
    }
}

/// The control-channel sessions of `protocol` run the policy through this hook (their TLS
/// engine installs its own verify callback, so the policy must travel with the session).
impl protocol::tls::PeerVerifier for PeerPolicy {
    fn verify_peer(&self, leaf: &X509Ref) -> Result<(), protocol::tls::PeerCertError> {
        self.check(leaf)
            .map_err(|e| protocol::tls::PeerCertError::Other(Box::new(e)))
    }
}

/// The OpenVPN server side of the control channel.
pub fn control_channel_server(
    identity: &Identity,
    trust: &CaBundle,
    policy: &PeerPolicy,
) -> Result<SslContext, TlsError> {
    let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
    control_channel_common(&mut b, identity, trust)?;
    b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
    verify_peer(
        &mut b,
        SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
        policy.clone(),
    );
    Ok(b.build())
}

/// The OpenVPN client side of the control channel. No SNI is sent and the server's name is
/// not checked at TLS level (use [`PeerPolicy`]).
pub fn control_channel_client(
    identity: &Identity,
    trust: &CaBundle,
    policy: &PeerPolicy,
) -> Result<SslContext, TlsError> {
    let mut b = SslContextBuilder::new(SslMethod::tls_client())?;
    control_channel_common(&mut b, identity, trust)?;
    verify_peer(&mut b, SslVerifyMode::PEER, policy.clone());
    Ok(b.build())
}

fn control_channel_common(
    b: &mut SslContextBuilder,
    identity: &Identity,
    trust: &CaBundle,
) -> Result<(), TlsError> {
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_security_level(OPENVPN_SECURITY_LEVEL);
    b.set_cipher_list(OPENVPN_TLS12_CIPHER_LIST)?;
    b.set_options(
        SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION | SslOptions::NO_RENEGOTIATION,
    );
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
    set_identity(b, identity)?;
    b.set_cert_store(trust.store()?);
    Ok(())
}

fn set_identity(b: &mut SslContextBuilder, identity: &Identity) -> Result<(), ErrorStack> {
    b.set_certificate(identity.leaf())?;
    for cert in identity.intermediates() {
        b.add_extra_chain_cert(cert.clone())?;
    }
    b.set_private_key(identity.key())?;
    b.check_private_key()
}

/// Chain verification by OpenSSL, then the policy on the leaf, as OpenVPN's verify callback
/// does. A policy failure is reported as `X509_V_ERR_APPLICATION_VERIFICATION`.
fn verify_peer(b: &mut SslContextBuilder, mode: SslVerifyMode, policy: PeerPolicy) {
    b.set_verify_callback(mode, move |preverified, ctx| {
        if !preverified {
            return false;
        }
        if ctx.error_depth() != 0 {
            return true;
        }
        let Some(leaf) = ctx.current_cert() else {
            return false;
        };
        match policy.check(leaf) {
            Ok(()) => true,
            Err(_) => {
                ctx.set_error(X509VerifyResult::APPLICATION_VERIFICATION);
                false
            }
        }
    });
}

/// Whether the CONNECT sidecar requires a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientCertMode {
    /// A verified client certificate is required (our default).
    #[default]
    Required,
    /// A client certificate is verified if presented (what Envoy did).
    Optional,
}

/// The CONNECT sidecar's HTTPS acceptor: Mozilla "intermediate" settings, the server identity,
/// client certificates verified against the bundle.
pub fn connect_proxy_acceptor(
    identity: &Identity,
    trust: &CaBundle,
    client_cert: ClientCertMode,
) -> Result<SslAcceptor, TlsError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
    set_identity(&mut b, identity)?;
    b.set_cert_store(trust.store()?);
    let mode = match client_cert {
        ClientCertMode::Required => SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
        ClientCertMode::Optional => SslVerifyMode::PEER,
    };
    b.set_verify(mode);
    Ok(b.build())
}

/// The HTTPS connector a client of the CONNECT sidecar uses (the kube-apiserver's role, and our
/// tests): trusts only the bundle, presents `identity` if given, checks the host name as usual.
pub fn connect_proxy_connector(
    identity: Option<&Identity>,
    trust: &CaBundle,
) -> Result<SslConnector, TlsError> {
    let mut b = SslConnector::builder(SslMethod::tls_client())?;
    b.set_cert_store(trust.store()?);
    if let Some(identity) = identity {
        set_identity(&mut b, identity)?;
    }
    Ok(b.build())
}
