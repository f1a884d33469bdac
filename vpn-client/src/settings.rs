//! [`Settings`]: everything the client's event loop needs, already typed. The OpenVPN config
//! file parser (`protocol::config`) and the vpn2 environment variables are mapped onto this;
//! nothing here reads a file or an environment variable.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use netio::firewall::Table;
use netio::http::{ConnectOptions, ConnectRequest};
use openssl::ssl::SslContext;
use pki::tls::{control_channel_client, PeerPolicy};
use pki::{CaBundle, Identity};
use protocol::config::Family;
use protocol::data::{Compression, DataCipher, PacketIdLimits};
use protocol::digest::Digest;
use protocol::km2::occ::DevType;
use protocol::ncp::DataCiphers;
use protocol::push::PullPolicy;
use protocol::session::{
    ClientConfig, ControlProtection, SessionConfig, DEFAULT_HAND_WINDOW, DEFAULT_RENEG_SEC,
};
use protocol::tls::PeerVerifier;

use crate::script::Scripts;

/// Upstream's default `--connect-retry`: the first pause between connection attempts.
pub const DEFAULT_CONNECT_RETRY: Duration = Duration::from_secs(1);
/// Upstream's default `--connect-retry` maximum: the longest pause.
pub const DEFAULT_CONNECT_RETRY_MAX: Duration = Duration::from_secs(300);
/// Upstream's default `--connect-timeout`: TCP connect plus proxy exchange.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = netio::http_connect::DEFAULT_CONNECT_TIMEOUT;
/// Default `--tun-mtu`.
pub const DEFAULT_TUN_MTU: u16 = protocol::framing::DEFAULT_TUN_MTU;

/// The client's runtime settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `remote HOST PORT` lines, tried in order (the list wraps around).
    pub remotes: Vec<Remote>,
    /// `http-proxy` with its `http-proxy-option`s; `None` dials the remotes directly.
    pub http_proxy: Option<HttpProxy>,
    /// `ca`, `cert`, `key`, `remote-cert-tls`, `verify-x509-name`.
    pub tls: TlsMaterial,
    /// `tls-auth` / `tls-crypt`.
    pub protection: ControlProtection,
    /// `data-ciphers`.
    pub data_ciphers: DataCiphers,
    /// `data-ciphers-fallback`.
    pub data_ciphers_fallback: Option<DataCipher>,
    /// `auth`.
    pub auth: Digest,
    /// `reneg-sec MAX` (`None`: 0, off).
    pub reneg_sec: Option<Duration>,
    /// `reneg-sec MAX MIN` (`None`: upstream's default for a client, `MAX`; see
    /// [`protocol::session::reneg_interval`]).
    pub reneg_sec_min: Option<Duration>,
    /// `hand-window`.
    pub hand_window: Duration,
    /// `pull-filter`, `route-nopull` and strict mode.
    pub pull: PullPolicy,
    /// `auth-user-pass` username and password.
    pub credentials: Option<(Vec<u8>, Vec<u8>)>,
    /// Local `ping` (a pushed one replaces it).
    pub ping: Option<Duration>,
    /// Local `ping-restart` (a pushed one replaces it).
    pub ping_restart: Option<Duration>,
    /// `dev`, `tun-mtu`, `txqueuelen`.
    pub tun: TunSettings,
    /// `connect-retry N`: the pause after the first failed attempt.
    pub connect_retry: Duration,
    /// `connect-retry N MAX`: the longest pause.
    pub connect_retry_max: Duration,
    /// `connect-timeout`: bound on one TCP connect (and proxy exchange).
    pub connect_timeout: Duration,
    /// `connect-retry-max N`: stop after N failed attempts per remote in a row (`None`:
    /// retry forever, upstream's default).
    pub connect_retry_attempts: Option<u32>,
    /// The address family from `proto tcp4-client|tcp6-client` (the remote or the proxy is
    /// reached over this family only).
    pub family: Family,
    /// `comp-lzo no` / `compress stub|stub-v2` framing of data packets.
    pub compression: Compression,
    /// `tls-timeout` (`None`: upstream's default).
    pub tls_timeout: Option<Duration>,
    /// `tran-window` (`None`: upstream's default).
    pub tran_window: Option<Duration>,
    /// `reneg-bytes`.
    pub reneg_bytes: Option<u64>,
    /// `reneg-pkts`.
    pub reneg_pkts: Option<u64>,
    /// When a data key asks for a renegotiation and stops sending: upstream's limits; no
    /// directive changes them, tests lower them to reach them quickly.
    pub packet_ids: PacketIdLimits,
    /// Announce and use the TLS keying-material exporter for data keys (IV_PROTO
    /// `TLS_KEY_EXPORT`); without it the server falls back to the TLS 1.0 PRF. On by default
    /// as upstream 2.6; no config directive turns it off (the conformance matrix does, to
    /// prove the PRF against upstream).
    pub tls_ekm: bool,
    /// `up` / `down` commands (allowed by `script-security 2`).
    pub scripts: Scripts,
    /// Firewall and NAT rules held while the client runs (vpn2 mode: the shoot side's
    /// forwarding, NAT and MSS clamping), owned by the process (gone when it ends).
    pub firewall: Option<Table>,
    /// Rules applied at start that outlive the process, never removed (vpn2 mode, a
    /// kube-apiserver's HA client: `crate::vpn2::ha_seed_guard`, so the shoot's networks
    /// never leave the pod by another interface while the tunnels are down).
    pub guard: Option<Table>,
}

impl Settings {
    /// Settings with upstream 2.6's defaults for everything but the remotes, the TLS material
    /// and the control-channel protection.
    pub fn new(remotes: Vec<Remote>, tls: TlsMaterial, protection: ControlProtection) -> Settings {
        Settings {
            remotes,
            http_proxy: None,
            tls,
            protection,
            data_ciphers: DataCiphers::default_2_6(),
            data_ciphers_fallback: None,
            auth: Digest::Sha1,
            reneg_sec: Some(DEFAULT_RENEG_SEC),
            reneg_sec_min: None,
            hand_window: DEFAULT_HAND_WINDOW,
            pull: PullPolicy::default(),
            credentials: None,
            ping: None,
            ping_restart: None,
            tun: TunSettings::default(),
            connect_retry: DEFAULT_CONNECT_RETRY,
            connect_retry_max: DEFAULT_CONNECT_RETRY_MAX,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connect_retry_attempts: None,
            family: Family::Any,
            compression: Compression::default(),
            tls_timeout: None,
            tran_window: None,
            reneg_bytes: None,
            reneg_pkts: None,
            packet_ids: PacketIdLimits::UPSTREAM,
            tls_ekm: true,
            scripts: Scripts::default(),
            firewall: None,
            guard: None,
        }
    }

    /// The session configuration every connection starts from (the TLS context is built
    /// here, once).
    pub fn client_config(&self) -> Result<ClientConfig, SettingsError> {
        if self.remotes.is_empty() {
            return Err(SettingsError::NoRemote);
        }
        let (context, verifier) = self.tls.context()?;
        let mut session = SessionConfig::new(context, self.protection.clone());
        session.verifier = verifier;
        session.data_ciphers = self.data_ciphers.clone();
        session.data_ciphers_fallback = self.data_ciphers_fallback;
        session.auth = self.auth;
        session.reneg_sec = self.reneg_sec;
        session.reneg_sec_min = self.reneg_sec_min;
        session.hand_window = self.hand_window;
        session.tun_mtu = self.tun.mtu;
        session.dev_type = if self.tun.tap {
            DevType::Tap
        } else {
            DevType::Tun
        };
        session.compression = self.compression;
        session.reneg_bytes = self.reneg_bytes;
        session.reneg_pkts = self.reneg_pkts;
        session.packet_ids = self.packet_ids;
        if let Some(t) = self.tls_timeout {
            session.tls_timeout = t;
        }
        if let Some(t) = self.tran_window {
            session.tran_window = t;
        }
        let mut config = ClientConfig::new(session);
        config.pull = self.pull.clone();
        config.credentials = self.credentials.clone();
        config.ping = self.ping;
        config.ping_restart = self.ping_restart;
        config.tls_ekm = self.tls_ekm;
        Ok(config)
    }
}

/// One `remote HOST PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// Host name or address literal. Through a proxy it is sent verbatim in the CONNECT
    /// request; directly it is resolved here.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Remote {
    /// `remote HOST PORT`.
    pub fn new(host: impl Into<String>, port: u16) -> Remote {
        Remote {
            host: host.into(),
            port,
        }
    }
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// `http-proxy HOST PORT` and its `http-proxy-option`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpProxy {
    /// The proxy's host name or address.
    pub host: String,
    /// The proxy's port.
    pub port: u16,
    /// The `http-proxy-option`s every CONNECT request carries (version, custom headers such
    /// as `Reversed-VPN: outbound|1194||vpn-seed-server`, agent, credentials).
    pub options: ConnectOptions,
}

impl HttpProxy {
    /// A proxy with upstream's defaults (HTTP/1.0, no extra headers).
    pub fn new(host: impl Into<String>, port: u16) -> HttpProxy {
        HttpProxy {
            host: host.into(),
            port,
            options: ConnectOptions::default(),
        }
    }

    /// The CONNECT request for `remote`.
    pub fn request(&self, remote: &Remote) -> ConnectRequest {
        self.options.request(remote.host.clone(), remote.port)
    }
}

/// The client's certificate material.
#[derive(Clone)]
pub enum TlsMaterial {
    /// PEM bytes (from files or inline blocks) and the checks on the server's certificate.
    Pem {
        /// `ca`: the trusted CA certificates.
        ca: Vec<u8>,
        /// `cert`: the client certificate (and its chain).
        cert: Vec<u8>,
        /// `key`: the client's private key (unencrypted).
        key: Vec<u8>,
        /// `remote-cert-tls`, `verify-x509-name`.
        peer: PeerPolicy,
    },
    /// A context built elsewhere (e.g. by a test), with its leaf-certificate check.
    Context {
        /// The control-channel TLS context.
        context: SslContext,
        /// The check of the server's leaf certificate.
        verifier: Arc<dyn PeerVerifier>,
    },
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsMaterial::Pem { peer, .. } => f
                .debug_struct("Pem")
                .field("peer", peer)
                .finish_non_exhaustive(),
            TlsMaterial::Context { .. } => f.debug_struct("Context").finish_non_exhaustive(),
        }
    }
}

impl TlsMaterial {
    fn context(&self) -> Result<(SslContext, Arc<dyn PeerVerifier>), SettingsError> {
        match self {
            TlsMaterial::Pem {
                ca,
                cert,
                key,
                peer,
            } => {
                let trust = CaBundle::from_pem(ca)
                    .map_err(|source| SettingsError::Pem { what: "ca", source })?;
                let identity =
                    Identity::from_pem(cert, key).map_err(|source| SettingsError::Pem {
                        what: "cert/key",
                        source,
                    })?;
                let context =
                    control_channel_client(&identity, &trust, peer).map_err(SettingsError::Tls)?;
                Ok((context, Arc::new(peer.clone())))
            }
            TlsMaterial::Context { context, verifier } => {
                Ok((context.clone(), Arc::clone(verifier)))
            }
        }
    }
}

/// The tun device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunSettings {
    /// `dev`: the interface name (`tun%d` lets the kernel pick).
    pub name: String,
    /// `dev-type tap` (or a `dev tap...` name): a layer-2 tap device; the tunnel carries
    /// Ethernet frames, the pushed `ifconfig` is an address and netmask, and routes go via
    /// the pushed `route-gateway`.
    pub tap: bool,
    /// `tun-mtu` (a pushed `tun-mtu` replaces it).
    pub mtu: u16,
    /// `txqueuelen` (`None`: the kernel's default).
    pub txqueuelen: Option<u32>,
    /// Routes into the device besides the pushed ones, installed with them (vpn2 mode: the
    /// seed's pod network, which vpn2 routed with an `up` hook).
    pub routes: Vec<IpNet>,
    /// vpn2's `OPENVPN_AUTO_MTU`: `mtu` is the default route's link MTU less 130 bytes, read
    /// when the client starts.
    pub auto_mtu: bool,
    /// HA mode (`docs/ha.md`): `routes` exist only while the tunnel is up.
    pub ha: Option<HaRoutes>,
}

/// How an HA client holds its routes ([`TunSettings::ha`]): `routes` go into the device with
/// `metric` (and, with `source_from_socket`, the source address of the connection to the
/// server) once the tunnel is up, `hold_down` later if an earlier tunnel of this process went
/// down (unless no other tunnel carries the traffic then); they are withdrawn the moment a
/// connection ends, so the kernel moves the traffic to the other server's device (a higher
/// metric), or, with `standby_metric`, to the device of the first server to come back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaRoutes {
    /// The routes' metric: `100 + VPN_SERVER_INDEX`.
    pub metric: u32,
    /// Whether the routes carry `src` = the local address of the TCP connection to the
    /// server (the kube-apiserver's pod IP).
    pub source_from_socket: bool,
    /// How long a tunnel that came back must stay up before it takes its routes back.
    pub hold_down: Duration,
    /// Shoot side: replies return through the tunnel their request last came in by. The
    /// client's firewall table marks each connection coming in from its device with this
    /// value and each reply of it with the same packet mark; while the tunnel is up, a
    /// routing rule sends packets with the mark to a table of this number holding `routes`
    /// through the device (a table without them falls through to the main table's metrics).
    pub return_by_mark: Option<u32>,
    /// Kube-apiserver side: vpn2's `VPN_NETWORK` (a /96). With an IPv4 pod IP, the address
    /// in it whose low 32 bits are the pod IP goes on the device and is the IPv6 routes'
    /// source (the server owns it for this pod).
    pub transfer_v6: Option<ipnet::Ipv6Net>,
    /// Kube-apiserver side: the routes' metric while the tunnel is down (`1000 +
    /// VPN_SERVER_INDEX`). They stay in the device with it for as long as the process runs,
    /// so a connection the kube-apiserver starts while both tunnels are down waits in the
    /// device's queue and leaves the moment this client's tunnel is back, rather than being
    /// dropped by the pod's tunnel-only rules and retried seconds later.
    pub standby_metric: Option<u32>,
}

impl Default for TunSettings {
    fn default() -> Self {
        TunSettings {
            name: "tun0".to_owned(),
            tap: false,
            mtu: DEFAULT_TUN_MTU,
            txqueuelen: None,
            routes: Vec::new(),
            auto_mtu: false,
            ha: None,
        }
    }
}

/// Settings that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No `remote` was given.
    #[error("no remote to connect to")]
    NoRemote,
    /// A PEM input could not be read.
    #[error("cannot read the {what} PEM")]
    Pem {
        /// Which input.
        what: &'static str,
        /// Why.
        #[source]
        source: pki::pem::PemError,
    },
    /// The TLS context could not be built.
    #[error("cannot build the TLS context")]
    Tls(#[source] pki::tls::TlsError),
}
