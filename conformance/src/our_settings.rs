//! Our server's and client's settings for the lab's throwaway PKI ([`TestPki`]), matching the
//! upstream configs of [`lab::upstream`]. An extension trait because `TestPki` lives in `lab`,
//! which does not depend on our binaries' crates; import [`OurSettings`] to call them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use lab::pki_fixture::TestPki;
use lab::LabError;
use pki::tls::{control_channel_server, PeerPolicy};
use pki::{CaBundle, Identity};
use protocol::digest::Digest;
use protocol::key::KeyDirection;
use protocol::session::ControlProtection;
use protocol::static_key;
use vpn_client::{Remote, TlsMaterial};

/// Settings of our server and client built from a [`TestPki`].
pub trait OurSettings {
    /// Our server's settings with this PKI, matching the upstream configs of
    /// [`lab::upstream`]: tls-auth with HMAC-SHA256 (key direction 0), `auth SHA256`,
    /// listening on `[::]:port`; everything else at its default.
    fn our_server_settings(&self, port: u16) -> Result<vpn_server::Settings, LabError>;

    /// Our client's settings with this PKI for one `remote`, matching
    /// [`Self::our_server_settings`] (key direction 1); everything else at its default.
    fn our_client_settings(&self, remote: Remote) -> Result<vpn_client::Settings, LabError>;
}

impl OurSettings for TestPki {
    fn our_server_settings(&self, port: u16) -> Result<vpn_server::Settings, LabError> {
        let trust = CaBundle::from_pem(&read(self.ca_cert())?).map_err(refused("CA"))?;
        let id = Identity::from_pem(&read(self.server_cert())?, &read(self.server_key())?)
            .map_err(refused("server certificate"))?;
        let policy = PeerPolicy::client_peer();
        let ctx =
            control_channel_server(&id, &trust, &policy).map_err(refused("server TLS context"))?;
        let mut s =
            vpn_server::Settings::new(ctx, Arc::new(policy), tls_auth(self, KeyDirection::Normal)?);
        s.listen = vec![SocketAddr::from(([0u16; 8], port))];
        s.auth = Digest::Sha256;
        Ok(s)
    }

    fn our_client_settings(&self, remote: Remote) -> Result<vpn_client::Settings, LabError> {
        let mut s = vpn_client::Settings::new(
            vec![remote],
            TlsMaterial::Pem {
                ca: read(self.ca_cert())?,
                cert: read(self.client_cert())?,
                key: read(self.client_key())?,
                peer: PeerPolicy::server_peer(),
            },
            tls_auth(self, KeyDirection::Inverse)?,
        );
        s.auth = Digest::Sha256;
        Ok(s)
    }
}

fn read(path: PathBuf) -> Result<Vec<u8>, LabError> {
    std::fs::read(&path).map_err(|source| LabError::io(&path, source))
}

/// The fixture's `ta.key` as tls-auth with HMAC-SHA256 in `direction`.
fn tls_auth(pki: &TestPki, direction: KeyDirection) -> Result<ControlProtection, LabError> {
    let key = static_key::parse(&pki.ta_key_text()?).map_err(refused("ta.key"))?;
    Ok(ControlProtection::TlsAuth {
        key,
        direction,
        digest: Digest::Sha256,
    })
}

/// Maps our crates' refusal of `what` into the lab's error.
fn refused<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> LabError {
    move |e| LabError::Material {
        what: what.to_owned(),
        source: Box::new(e),
    }
}
