//! What a session is configured with: the settings both roles share ([`SessionConfig`]), the
//! client's ([`ClientConfig`]) and the server's ([`ServerConfig`]).
//!
//! Defaults are OpenVPN 2.6's: `tls-timeout 2`, `hand-window 60`, `tran-window 3600`,
//! `reneg-sec 3600`, no `reneg-bytes` / `reneg-pkts`, `data-ciphers
//! AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305`, `auth SHA1`, `tls-mtu 1250`.

use std::sync::Arc;
use std::time::Duration;

use openssl::ssl::SslContext;

use crate::data::{Compression, DataCipher, PacketIdLimits};
use crate::digest::Digest;
use crate::key::{Key2, KeyDirection, Role};
use crate::km2::occ::{DevType, OccSettings};
use crate::ncp::{DataCiphers, ServerCapabilities};
use crate::push::{PullPolicy, PushItem};
use crate::reliable::{PayloadLimits, PeerFamily, TlsMtu, WrapOverhead, DEFAULT_TLS_TIMEOUT};
use crate::tls::{AcceptAnyPeer, PeerVerifier};
use crate::wrap::{ControlWrap, TlsAuth, TlsCrypt};

/// Default `--hand-window`: how long one key negotiation may take.
pub const DEFAULT_HAND_WINDOW: Duration = Duration::from_secs(60);
/// Default `--tran-window`: how long a lame-duck key keeps decrypting after a soft reset.
pub const DEFAULT_TRAN_WINDOW: Duration = Duration::from_secs(3600);
/// Default `--reneg-sec`.
pub const DEFAULT_RENEG_SEC: Duration = Duration::from_secs(3600);
/// A session's renegotiation interval for `reneg-sec max [min]` (`min` `None`: not given),
/// as upstream 2.6 draws it once per session: `max` less a random part of `max - min`, so
/// above `min` and at most `max`; without `min` a server takes up to a tenth of `max` off
/// and a client uses `max` as it is. `random` is called only when there is a range to draw
/// from. Our unit is the millisecond (upstream's the second), so sessions started together
/// spread even over a short range.
pub fn reneg_interval(
    max: Duration,
    min: Option<Duration>,
    role: Role,
    random: impl FnOnce() -> u64,
) -> Duration {
    let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    let range = match (min, role) {
        (Some(min), _) => max_ms.saturating_sub(u64::try_from(min.as_millis()).unwrap_or(0)),
        (None, Role::Server) => max_ms / 10,
        (None, Role::Client) => 0,
    };
    if range == 0 {
        return max;
    }
    max.saturating_sub(Duration::from_millis(random() % range))
}

/// How often a client repeats `PUSH_REQUEST` until a reply arrives (reference 10.2).
pub const PUSH_REQUEST_INTERVAL: Duration = Duration::from_secs(5);

/// The control-channel protection and its static key (`--tls-auth`, `--tls-crypt`).
///
/// The key is kept (not only the wrapping context) because dynamic tls-crypt (reference 12.4)
/// XORs it into the exported key.
#[derive(Debug, Clone)]
pub enum ControlProtection {
    /// Neither tls-auth nor tls-crypt.
    None,
    /// `--tls-auth FILE DIRECTION` with `--auth DIGEST`.
    TlsAuth {
        /// The static key.
        key: Key2,
        /// This side's `key-direction` (0 on a server, 1 on a client, usually).
        direction: KeyDirection,
        /// `--auth`.
        digest: Digest,
    },
    /// `--tls-crypt FILE` (v1).
    TlsCrypt {
        /// The static key.
        key: Key2,
    },
}

impl ControlProtection {
    /// A fresh wrapping context for `role`.
    pub(crate) fn wrap(&self, role: Role) -> ControlWrap {
        match self {
            ControlProtection::None => ControlWrap::None,
            ControlProtection::TlsAuth {
                key,
                direction,
                digest,
            } => ControlWrap::Auth(TlsAuth::new(key, *direction, *digest)),
            ControlProtection::TlsCrypt { key } => ControlWrap::Crypt(TlsCrypt::new(key, role)),
        }
    }

    /// The static key, if any.
    pub fn static_key(&self) -> Option<&Key2> {
        match self {
            ControlProtection::None => None,
            ControlProtection::TlsAuth { key, .. } | ControlProtection::TlsCrypt { key } => {
                Some(key)
            }
        }
    }

    /// The per-packet overhead for the control payload budget.
    pub(crate) fn overhead(&self) -> WrapOverhead {
        match self {
            ControlProtection::None => WrapOverhead::None,
            ControlProtection::TlsAuth { digest, .. } => WrapOverhead::TlsAuth {
                hmac_len: digest.output_len(),
            },
            ControlProtection::TlsCrypt { .. } => WrapOverhead::TlsCrypt,
        }
    }
}

/// Settings both roles share.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The TLS context, built with OpenVPN's settings (reference 5.1); see
    /// [`TlsSession`](crate::tls::TlsSession).
    pub tls: SslContext,
    /// The leaf-certificate check (`remote-cert-tls`, `verify-x509-name`).
    pub verifier: Arc<dyn PeerVerifier>,
    /// tls-auth / tls-crypt.
    pub protection: ControlProtection,
    /// `--tls-timeout`: first control retransmission timeout.
    pub tls_timeout: Duration,
    /// `--hand-window`.
    pub hand_window: Duration,
    /// `--tran-window`.
    pub tran_window: Duration,
    /// `--reneg-sec MAX` (`None`: 0, off): the longest a data key is used.
    pub reneg_sec: Option<Duration>,
    /// `--reneg-sec MAX MIN`: the shortest. Each session renegotiates after its own interval,
    /// drawn once from the session's RNG, above `MIN` and at most `MAX` ([`reneg_interval`]).
    /// `None` takes upstream's default: a server `MAX` less up to a tenth, a client `MAX`.
    pub reneg_sec_min: Option<Duration>,
    /// `--reneg-bytes` (bytes sent plus received on one key).
    pub reneg_bytes: Option<u64>,
    /// `--reneg-pkts` (packets sent plus received on one key).
    pub reneg_pkts: Option<u64>,
    /// `--data-ciphers`.
    pub data_ciphers: DataCiphers,
    /// `--data-ciphers-fallback`.
    pub data_ciphers_fallback: Option<DataCipher>,
    /// `--auth`: the HMAC of CBC data packets.
    pub auth: Digest,
    /// The compression framing of data packets (`comp-lzo no` and friends). A client takes
    /// the pushed one instead when the server pushes one.
    pub compression: Compression,
    /// `--tls-mtu`.
    pub tls_mtu: TlsMtu,
    /// `--tun-mtu`.
    pub tun_mtu: u16,
    /// `--dev-type`: what the data channel carries, IP packets (`tun`) or Ethernet frames
    /// (`tap`). The session never looks inside a payload; this only goes into the OCC
    /// options string (`dev-type`, and `link-mtu`, which grows by 32 for tap).
    pub dev_type: DevType,
    /// When a data key asks for a renegotiation and stops sending: upstream's, unless a test
    /// lowers them (no directive does).
    pub packet_ids: PacketIdLimits,
}

impl SessionConfig {
    /// OpenVPN 2.6 defaults around a TLS context and a protection, accepting any peer
    /// certificate the context's CA store accepts.
    pub fn new(tls: SslContext, protection: ControlProtection) -> SessionConfig {
        SessionConfig {
            tls,
            verifier: Arc::new(AcceptAnyPeer),
            protection,
            tls_timeout: DEFAULT_TLS_TIMEOUT,
            hand_window: DEFAULT_HAND_WINDOW,
            tran_window: DEFAULT_TRAN_WINDOW,
            reneg_sec: Some(DEFAULT_RENEG_SEC),
            reneg_sec_min: None,
            reneg_bytes: None,
            reneg_pkts: None,
            data_ciphers: DataCiphers::default_2_6(),
            data_ciphers_fallback: None,
            auth: Digest::Sha1,
            compression: Compression::None,
            tls_mtu: TlsMtu::DEFAULT,
            tun_mtu: 1500,
            dev_type: DevType::Tun,
            packet_ids: PacketIdLimits::UPSTREAM,
        }
    }

    pub(crate) fn payload_limits(&self) -> PayloadLimits {
        PayloadLimits {
            tls_mtu: self.tls_mtu,
            wrap: self.protection.overhead(),
            peer_family: PeerFamily::Ipv4,
        }
    }

    /// The OCC options string settings for `role` (reference 6.3).
    pub(crate) fn occ(&self, role: Role) -> OccSettings {
        let mut occ = OccSettings::new(role);
        occ.tun_mtu = self.tun_mtu;
        occ.dev_type = self.dev_type;
        occ.compression = self.compression;
        occ.auth = self.auth;
        if let ControlProtection::TlsAuth { direction, .. } = &self.protection {
            occ = occ.with_tls_auth(*direction);
        }
        occ
    }
}

/// A client's settings (`client`, i.e. `pull` + `tls-client`).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The shared settings.
    pub session: SessionConfig,
    /// `pull-filter`, `route-nopull`, strict mode.
    pub pull: PullPolicy,
    /// `--auth-user-pass`: username and password.
    pub credentials: Option<(Vec<u8>, Vec<u8>)>,
    /// `IV_VER`.
    pub version: String,
    /// `IV_PLAT`.
    pub platform: String,
    /// `--tun-max-mtu` for `IV_MTU` (default tun-mtu + 100).
    pub tun_max_mtu: u32,
    /// Local `--ping` (a pushed `ping` replaces it).
    pub ping: Option<Duration>,
    /// Local `--ping-restart` (a pushed `ping-restart` replaces it).
    pub ping_restart: Option<Duration>,
    /// Announce and use `key-derivation tls-ekm` (IV_PROTO `TLS_KEY_EXPORT`).
    pub tls_ekm: bool,
    /// Announce and use dynamic tls-crypt (IV_PROTO `DYN_TLS_CRYPT`, reference 12.4).
    pub dyn_tls_crypt: bool,
}

impl ClientConfig {
    /// A client with OpenVPN 2.6 defaults, EKM and dynamic tls-crypt enabled.
    pub fn new(session: SessionConfig) -> ClientConfig {
        let tun_max_mtu = u32::from(session.tun_mtu) + 100;
        ClientConfig {
            session,
            pull: PullPolicy::default(),
            credentials: None,
            version: concat!("gardener-vpn-", env!("CARGO_PKG_VERSION")).to_owned(),
            platform: "linux".to_owned(),
            tun_max_mtu,
            ping: None,
            ping_restart: None,
            tls_ekm: true,
            dyn_tls_crypt: true,
        }
    }
}

/// `--keepalive N M` on a server: local `ping N`, `ping-restart 2M`; pushes `ping N`,
/// `ping-restart M` (reference 12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// N, seconds.
    pub ping: u32,
    /// M, seconds.
    pub ping_restart: u32,
}

/// A server's settings, shared by every connection of a [`ServerEndpoint`](super::ServerEndpoint).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The shared settings.
    pub session: SessionConfig,
    /// The configuration's `push "..."` lines and what the `server` helper adds
    /// (`route-gateway`, `topology`), in order: the first part of every `PUSH_REPLY`.
    pub push: Vec<PushItem>,
    /// `--keepalive`.
    pub keepalive: Option<Keepalive>,
    /// Protocol features we offer.
    pub capabilities: ServerCapabilities,
}

impl ServerConfig {
    /// A server with OpenVPN 2.6 defaults, offering EKM, dynamic tls-crypt and cc-exit.
    pub fn new(session: SessionConfig) -> ServerConfig {
        ServerConfig {
            session,
            push: Vec::new(),
            keepalive: None,
            capabilities: ServerCapabilities {
                tls_ekm: true,
                dyn_tls_crypt: true,
                cc_exit: true,
            },
        }
    }
}
