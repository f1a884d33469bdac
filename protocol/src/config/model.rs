//! The typed config: what both roles share ([`CommonOptions`]), the server's
//! ([`ServerOptions`]) and the client's ([`ClientOptions`]).
//!
//! `Option` fields are `None` when the directive was not given; the consumer applies
//! OpenVPN 2.6's default then (see [`crate::session::config`] for the timer defaults). Fields
//! whose default is simple carry it already (`auth SHA1`, `port 1194`, `data-ciphers`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use ipnet::{Ipv4Net, Ipv6Net};

use super::Source;
use crate::data::{Compression, DataCipher};
use crate::digest::Digest;
use crate::key::KeyDirection;
use crate::ncp::DataCiphers;
use crate::push::{PullFilter, PullPolicy};

/// Upstream's default port (`--port`, `--lport`, `--rport`).
pub const DEFAULT_PORT: u16 = 1194;
/// Upstream's default `--max-routes-per-client`.
pub const DEFAULT_MAX_ROUTES_PER_CLIENT: u32 = 256;
/// Upstream's default `--max-clients`.
pub const DEFAULT_MAX_CLIENTS: u32 = 1024;
/// Upstream's default `--status` update interval in seconds.
pub const DEFAULT_STATUS_INTERVAL: u32 = 60;
/// `MAX_CUSTOM_HTTP_HEADER`: the most `http-proxy-option CUSTOM-HEADER` lines.
pub const MAX_CUSTOM_HTTP_HEADER: usize = 10;
/// `IFCONFIG_POOL_MIN_NETBITS`: the shortest `server` netmask.
pub const IFCONFIG_POOL_MIN_NETBITS: u8 = 16;
/// The longest `server` netmask in tun mode (a /30 in tap mode).
pub const SERVER_MAX_NETBITS_TUN: u8 = 29;
/// The longest `server` netmask in tap mode.
pub const SERVER_MAX_NETBITS_TAP: u8 = 30;
/// The shortest `server-ipv6` prefix.
pub const SERVER_IPV6_MIN_NETBITS: u8 = 64;
/// The longest `server-ipv6` prefix.
pub const SERVER_IPV6_MAX_NETBITS: u8 = 124;
/// Upstream's `--connect-retry` defaults: 1 s first, back-off capped at 300 s.
pub const DEFAULT_CONNECT_RETRY: ConnectRetry = ConnectRetry {
    initial: 1,
    max: 300,
};

/// Which address family the TCP socket uses (`tcp`, `tcp4`, `tcp6` in `proto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Family {
    /// `tcp-server` / `tcp-client`: either (a server listens dual-stack).
    #[default]
    Any,
    /// `tcp4-*`: IPv4 only.
    V4,
    /// `tcp6-*`: IPv6 (a `tcp6-server` socket also takes IPv4-mapped clients).
    V6,
}

/// `dev-type`, or what the `dev` name implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DevType {
    /// Layer 3.
    Tun,
    /// Layer 2.
    Tap,
}

/// `remote-cert-tls server|client`: the extended key usage the peer's certificate must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CertUsage {
    /// TLS Web Server Authentication.
    Server,
    /// TLS Web Client Authentication.
    Client,
}

/// What `verify-x509-name` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum X509NameType {
    /// `subject` (default): the whole subject DN.
    #[default]
    Subject,
    /// `name`: the common name, exactly.
    Name,
    /// `name-prefix`: the common name starts with the value.
    NamePrefix,
}

/// `verify-x509-name NAME [TYPE]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifyX509Name {
    /// The name.
    pub name: String,
    /// What it is compared with.
    pub kind: X509NameType,
}

/// Control-channel protection: `tls-auth` or `tls-crypt`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TlsWrapConfig {
    /// `tls-auth FILE [DIR]` / `<tls-auth>` with `key-direction`.
    Auth {
        /// The static key.
        key: Source,
        /// The direction argument, else `key-direction`, else bidirectional.
        direction: KeyDirection,
    },
    /// `tls-crypt FILE` / `<tls-crypt>`.
    Crypt {
        /// The static key.
        key: Source,
    },
}

/// `keepalive N M`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Keepalive {
    /// N: ping interval in seconds.
    pub interval: u32,
    /// M: restart timeout in seconds (at least 2N).
    pub timeout: u32,
}

/// `reneg-sec MAX [MIN]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RenegSec {
    /// The upper bound in seconds (0 turns time-based renegotiation off).
    pub max: u32,
    /// The lower bound of the randomised interval, if given.
    pub min: Option<u32>,
}

/// `replay-window N [T]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReplayWindow {
    /// Window size in packets.
    pub size: u32,
    /// Time window in seconds, if given.
    pub time: Option<u32>,
}

/// A TLS protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TlsVersion {
    /// `1.0`.
    V1_0,
    /// `1.1`.
    V1_1,
    /// `1.2`.
    V1_2,
    /// `1.3`.
    V1_3,
}

/// `tls-version-min V [or-highest]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TlsVersionMin {
    /// The version.
    pub version: TlsVersion,
    /// `or-highest`: fall back to the highest supported version if V is not.
    pub or_highest: bool,
}

/// `status FILE [N]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Status {
    /// The status file.
    pub path: PathBuf,
    /// Seconds between rewrites ([`DEFAULT_STATUS_INTERVAL`] if not given).
    pub interval: u32,
}

/// `mssfix [N [mtu|fixed]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MssFix {
    /// N (`None`: bare `mssfix`, upstream's default 1492; `Some(0)`: off).
    pub value: Option<u32>,
    /// `mtu`: N counts the whole packet.
    pub mtu: bool,
    /// `fixed`: N is taken as is.
    pub fixed: bool,
}

/// The gateway of a `route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteGateway {
    /// An address.
    Addr(Ipv4Addr),
    /// `vpn_gateway`: the tunnel's remote end.
    VpnGateway,
    /// `net_gateway`: the pre-existing default gateway.
    NetGateway,
    /// `remote_host`: the address of the `remote`.
    RemoteHost,
}

/// `route NETWORK [NETMASK [GATEWAY [METRIC]]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// The network (netmask default 255.255.255.255).
    pub network: Ipv4Net,
    /// The gateway, if given (`default` counts as not given).
    pub gateway: Option<RouteGateway>,
    /// The metric, if given.
    pub metric: Option<u32>,
}

/// `route-ipv6 NETWORK/BITS [GATEWAY [METRIC]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteIpv6 {
    /// The network.
    pub network: Ipv6Net,
    /// The gateway, if given.
    pub gateway: Option<Ipv6Addr>,
    /// The metric, if given.
    pub metric: Option<u32>,
}

/// Settings both roles share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommonOptions {
    /// `dev NAME` (`tun0`, `tap0`, or bare `tun` for the next free one).
    pub dev: String,
    /// `dev-type`, else from the `dev` name's `tun`/`tap` prefix.
    pub dev_type: DevType,
    /// The socket family from `proto`.
    pub family: Family,
    /// `port` (listen port of a server; default remote port of a client).
    pub port: u16,
    /// `local HOST`: the address to bind.
    pub local: Option<String>,
    /// `ca`.
    pub ca: Source,
    /// `cert`.
    pub cert: Source,
    /// `key`.
    pub key: Source,
    /// `tls-auth` / `tls-crypt`.
    pub tls_wrap: Option<TlsWrapConfig>,
    /// `auth` (default SHA1).
    pub auth: Digest,
    /// `data-ciphers` (default `AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305`), as written; see
    /// [`CommonOptions::effective_data_ciphers`].
    pub data_ciphers: DataCiphers,
    /// `data-ciphers-fallback`.
    pub data_ciphers_fallback: Option<DataCipher>,
    /// `cipher`.
    pub cipher: Option<DataCipher>,
    /// `comp-lzo no` / `compress [stub|stub-v2]` framing.
    pub compression: Compression,
    /// `remote-cert-tls`.
    pub remote_cert_tls: Option<CertUsage>,
    /// `verify-x509-name`.
    pub verify_x509_name: Option<VerifyX509Name>,
    /// `tls-version-min`.
    pub tls_version_min: Option<TlsVersionMin>,
    /// `reneg-sec`.
    pub reneg_sec: Option<RenegSec>,
    /// `reneg-bytes`.
    pub reneg_bytes: Option<u64>,
    /// `reneg-pkts`.
    pub reneg_pkts: Option<u64>,
    /// `hand-window` in seconds.
    pub hand_window: Option<u32>,
    /// `tls-timeout` in seconds.
    pub tls_timeout: Option<u32>,
    /// `tran-window` in seconds.
    pub tran_window: Option<u32>,
    /// `replay-window`.
    pub replay_window: Option<ReplayWindow>,
    /// `keepalive` (see [`ServerOptions::local_ping`] for the server's expansion).
    pub keepalive: Option<Keepalive>,
    /// `ping` in seconds.
    pub ping: Option<u32>,
    /// `ping-restart` in seconds.
    pub ping_restart: Option<u32>,
    /// `tun-mtu`.
    pub tun_mtu: Option<u32>,
    /// `txqueuelen`.
    pub txqueuelen: Option<u32>,
    /// `mssfix`.
    pub mssfix: Option<MssFix>,
    /// `sndbuf`.
    pub sndbuf: Option<u32>,
    /// `rcvbuf`.
    pub rcvbuf: Option<u32>,
    /// `tcp-nodelay` (a server also pushes `socket-flags TCP_NODELAY`).
    pub tcp_nodelay: bool,
    /// `route` (on a server: kernel routes into the tun, e.g. for iroutes).
    pub routes: Vec<Route>,
    /// `route-ipv6`.
    pub routes_ipv6: Vec<RouteIpv6>,
    /// `script-security` (default 1: no user scripts run).
    pub script_security: u8,
    /// `up CMD`: the command line as written (one token), run after the tun is up.
    pub up: Option<String>,
    /// `down CMD`.
    pub down: Option<String>,
    /// `persist-key`.
    pub persist_key: bool,
    /// `persist-tun`.
    pub persist_tun: bool,
    /// `disable-dco` (we have no kernel offload, so it changes nothing).
    pub disable_dco: bool,
    /// `status FILE [N]`.
    pub status: Option<Status>,
    /// `status-version` (1 to 3, default 1).
    pub status_version: u8,
    /// `verb` (0 to 11, default 1).
    pub verb: u8,
}

impl CommonOptions {
    /// `data-ciphers` as upstream 2.6 uses it: a `cipher` not in the list is appended.
    pub fn effective_data_ciphers(&self) -> DataCiphers {
        match self.cipher {
            Some(c) if !self.data_ciphers.contains(c) => {
                let mut list = self.data_ciphers.as_slice().to_vec();
                list.push(c);
                DataCiphers::new(list).unwrap_or_else(|_| self.data_ciphers.clone())
            }
            _ => self.data_ciphers.clone(),
        }
    }
}

/// `server NETWORK NETMASK [nopool]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerNetwork {
    /// The network (a /16 to /29 in tun mode).
    pub network: Ipv4Net,
    /// `nopool`: no address pool from this network.
    pub nopool: bool,
}

/// `ifconfig-pool START END [NETMASK]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfconfigPool {
    /// First address.
    pub start: Ipv4Addr,
    /// Last address.
    pub end: Ipv4Addr,
    /// The netmask pushed with each address, if given.
    pub netmask: Option<Ipv4Addr>,
}

/// A server config (`mode server`, `tls-server`, `topology subnet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// Settings both roles share.
    pub common: CommonOptions,
    /// `server NETWORK NETMASK [nopool]`.
    pub server: Option<ServerNetwork>,
    /// `server-ipv6 NETWORK/BITS`.
    pub server_ipv6: Option<Ipv6Net>,
    /// `ifconfig-pool`.
    pub ifconfig_pool: Option<IfconfigPool>,
    /// `push "OPTION"`, in config order.
    pub push: Vec<String>,
    /// `client-config-dir DIR`.
    pub client_config_dir: Option<PathBuf>,
    /// `duplicate-cn`.
    pub duplicate_cn: bool,
    /// `client-to-client`.
    pub client_to_client: bool,
    /// `max-clients` ([`DEFAULT_MAX_CLIENTS`] if not given).
    pub max_clients: u32,
    /// `max-routes-per-client` ([`DEFAULT_MAX_ROUTES_PER_CLIENT`] if not given).
    pub max_routes_per_client: u32,
}

impl ServerOptions {
    /// The server's own `(ping, ping-restart)` in seconds: `keepalive N M` gives `(N, 2M)`
    /// (reference 12.1); otherwise `ping` / `ping-restart` as given.
    pub fn local_ping(&self) -> (Option<u32>, Option<u32>) {
        match self.common.keepalive {
            Some(k) => (Some(k.interval), Some(k.timeout.saturating_mul(2))),
            None => (self.common.ping, self.common.ping_restart),
        }
    }

    /// The `(ping, ping-restart)` a `keepalive N M` pushes to clients: `(N, M)`.
    pub fn pushed_ping(&self) -> Option<(u32, u32)> {
        self.common.keepalive.map(|k| (k.interval, k.timeout))
    }
}

/// `remote HOST [PORT]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Remote {
    /// Host name or address.
    pub host: String,
    /// The port: as given, else `port`, else 1194.
    pub port: u16,
    /// The family from a third `tcp4-client`-style argument, else from `proto`.
    pub family: Family,
}

/// `http-proxy HOST PORT [AUTH [METHOD]]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpProxy {
    /// Proxy host.
    pub host: String,
    /// Proxy port.
    pub port: u16,
    /// Proxy authentication, if configured.
    pub auth: Option<ProxyAuth>,
}

/// Where proxy credentials come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProxyCredentials {
    /// A file with user name and password on two lines (or `stdin`).
    File(PathBuf),
    /// `auto`: find out from the proxy's 407 answer.
    Auto,
    /// `auto-nct`: as `auto`, but never send clear-text passwords.
    AutoNct,
}

/// The HTTP proxy authentication method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyAuthMethod {
    /// `basic`.
    Basic,
    /// `ntlm2`.
    Ntlm2,
}

/// `http-proxy ... AUTH [METHOD]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProxyAuth {
    /// Where the credentials come from.
    pub credentials: ProxyCredentials,
    /// The method, if given (upstream's default with a file is basic).
    pub method: Option<ProxyAuthMethod>,
}

/// One `http-proxy-option CUSTOM-HEADER NAME [CONTENT]` (or `EXT1` / `EXT2`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CustomHeader {
    /// The name, or the whole header line if `content` is `None`.
    pub name: String,
    /// The value.
    pub content: Option<String>,
}

/// The `http-proxy-option` lines.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HttpProxyOptions {
    /// `VERSION v` (`1.0` if not given).
    pub version: Option<String>,
    /// `AGENT string`.
    pub agent: Option<String>,
    /// `CUSTOM-HEADER`s in config order (at most [`MAX_CUSTOM_HTTP_HEADER`]).
    pub custom_headers: Vec<CustomHeader>,
}

/// `connect-retry N [MAX]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectRetry {
    /// Seconds before the first retry.
    pub initial: u32,
    /// Cap of the doubling back-off in seconds.
    pub max: u32,
}

/// A client config (`client`, or `tls-client` + `pull`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Settings both roles share.
    pub common: CommonOptions,
    /// `remote`s, tried in order.
    pub remotes: Vec<Remote>,
    /// `nobind`.
    pub nobind: bool,
    /// `http-proxy`.
    pub http_proxy: Option<HttpProxy>,
    /// `http-proxy-option`s.
    pub http_proxy_options: HttpProxyOptions,
    /// `pull-filter`s, in config order.
    pub pull_filters: Vec<PullFilter>,
    /// `route-nopull`.
    pub route_nopull: bool,
    /// `connect-retry` ([`DEFAULT_CONNECT_RETRY`] if not given).
    pub connect_retry: ConnectRetry,
    /// `connect-retry-max`: give up after this many failed attempts.
    pub connect_retry_max: Option<u32>,
    /// `auth-nocache`.
    pub auth_nocache: bool,
}

impl ClientOptions {
    /// The pull policy (`pull-filter` + `route-nopull`), without strict mode.
    pub fn pull_policy(&self) -> PullPolicy {
        PullPolicy {
            filters: self.pull_filters.clone(),
            route_nopull: self.route_nopull,
            strict: None,
        }
    }
}

/// A config of either role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Options {
    /// A server config.
    Server(ServerOptions),
    /// A client config.
    Client(ClientOptions),
}
