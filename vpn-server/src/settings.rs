//! [`Settings`]: the typed runtime settings of the server. The config-file parser (and the
//! vpn2 environment variables) map onto it; nothing here reads files or strings.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use openssl::ssl::SslContext;
use protocol::data::{Compression, DataCipher, PacketIdLimits};
use protocol::digest::Digest;
use protocol::km2::occ::DevType;
use protocol::ncp::DataCiphers;
use protocol::push::options::{RouteGatewayAddr, Topology};
use protocol::push::{PushItem, PushedOption};
use protocol::session::{
    ControlProtection, Keepalive, ServerConfig, SessionConfig, DEFAULT_HAND_WINDOW,
    DEFAULT_RENEG_SEC, DEFAULT_TRAN_WINDOW,
};
use protocol::tls::PeerVerifier;

/// OpenVPN's default port.
pub const DEFAULT_PORT: u16 = 1194;

/// The default IPv4 pool: `server 192.168.123.0 255.255.255.0` (design decision 4).
pub const DEFAULT_POOL_V4: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(192, 168, 123, 0), 24) {
    Ok(n) => n,
    Err(_) => panic!("constant network"),
};

/// Upstream's default `--max-clients` (1024).
pub const DEFAULT_MAX_CLIENTS: usize = 1024;

/// Upstream's default `--max-routes-per-client` (256): in tap mode, the MAC addresses one
/// client may own.
pub const DEFAULT_MAX_ROUTES_PER_CLIENT: usize = 256;

/// How long a connection may take from accept to an established tunnel by default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = DEFAULT_HAND_WINDOW;

/// How long a new connection may take from accept to its first whole, valid packet (a client
/// hard reset) by default. A real client sends it as soon as it is connected (through a
/// proxy: as soon as the proxy answered its CONNECT), one round trip after our accept at
/// most; upstream has no such deadline (a silent connection stays for `hand-window`, 60 s).
pub const DEFAULT_FIRST_PACKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections not yet authenticated (before TLS and key-method 2 are done) kept at once by
/// default; a newcomer beyond it evicts the oldest (`registry::admission`). Upstream's
/// default `max-clients`, so a full set holds as many handshakes as upstream would.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// How long shutdown waits for clients to acknowledge `RESTART` and close.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// [`Settings::hold_timeout`]: Envoy's `connect_timeout` in Gardener (gardener#4362), the
/// sidecar's hold bound too.
pub const DEFAULT_HOLD_TIMEOUT: Duration = Duration::from_secs(20);

/// `ifconfig-push LOCAL NETMASK` (topology subnet): a fixed IPv4 address for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfconfigPush {
    /// The client's address.
    pub local: Ipv4Addr,
    /// The netmask (or, in net30, the remote end), pushed verbatim.
    pub remote_netmask: Ipv4Addr,
}

/// `ifconfig-ipv6-push ADDR/LEN [REMOTE]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfconfigIpv6Push {
    /// The client's address and prefix length.
    pub local: Ipv6Net,
    /// The server side (default: the server's own IPv6 address).
    pub remote: Option<Ipv6Addr>,
}

/// One client's `client-config-dir` file, already parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// `iroute` / `iroute-ipv6`: networks behind this client.
    pub iroutes: Vec<IpNet>,
    /// `ifconfig-push`: replaces the pool address.
    pub ifconfig_push: Option<IfconfigPush>,
    /// `ifconfig-ipv6-push`.
    pub ifconfig_ipv6_push: Option<IfconfigIpv6Push>,
    /// `push "..."` lines for this client (after the server's), sent as written
    /// ([`PushItem::Verbatim`]).
    pub push: Vec<String>,
    /// `push-reset`: drop the server's own `push` lines for this client.
    pub push_reset: bool,
    /// `push-remove OPT`: drop the inherited `push` lines containing OPT.
    pub push_remove: Vec<String>,
    /// `disable`: refuse this client.
    pub disable: bool,
}

/// The status file (`status FILE N` with `status-version 2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusFile {
    /// Where to write it (atomically: a temporary file renamed over it).
    pub path: PathBuf,
    /// How often.
    pub interval: Duration,
}

/// Everything the server runs with. Build with [`Settings::new`] and adjust the fields.
#[derive(Clone)]
pub struct Settings {
    /// TCP listen addresses. `[::]:port` is one dual-stack socket (IPv4 arrives v4-mapped),
    /// as `proto tcp6-server` in vpn2.
    pub listen: Vec<SocketAddr>,
    /// The control channel's TLS context (e.g. `pki::tls::control_channel_server`).
    pub tls: SslContext,
    /// The client-certificate check (`remote-cert-tls client`, `verify-x509-name`).
    pub verifier: Arc<dyn PeerVerifier>,
    /// tls-auth / tls-crypt and its key.
    pub protection: ControlProtection,
    /// `data-ciphers`.
    pub data_ciphers: DataCiphers,
    /// `data-ciphers-fallback` (or `cipher`).
    pub data_ciphers_fallback: Option<DataCipher>,
    /// `auth`.
    pub auth: Digest,
    /// `keepalive N M`.
    pub keepalive: Option<Keepalive>,
    /// `reneg-sec MAX` (`None`: 0, off).
    pub reneg_sec: Option<Duration>,
    /// `reneg-sec MAX MIN` (`None`: upstream's default, see
    /// [`protocol::session::reneg_interval`]).
    pub reneg_sec_min: Option<Duration>,
    /// `hand-window`.
    pub hand_window: Duration,
    /// `tran-window`.
    pub tran_window: Duration,
    /// `tls-timeout` (`None`: the protocol default).
    pub tls_timeout: Option<Duration>,
    /// `reneg-bytes`.
    pub reneg_bytes: Option<u64>,
    /// `reneg-pkts`.
    pub reneg_pkts: Option<u64>,
    /// When a data key asks for a renegotiation and stops sending: upstream's limits; no
    /// directive changes them, tests lower them to reach them quickly.
    pub packet_ids: PacketIdLimits,
    /// Offer the TLS keying-material exporter for data keys to clients that announce it; without
    /// it every client uses the TLS 1.0 PRF. On by default as upstream 2.6; no config directive
    /// turns it off (the conformance matrix does, to prove the PRF against upstream).
    pub tls_ekm: bool,
    /// The compression framing of data packets (`comp-lzo no`, `compress stub-v2`, ...).
    pub compression: Compression,
    /// `tun-mtu`.
    pub tun_mtu: u16,
    /// `dev` (e.g. `tun0`; `tun%d` lets the kernel choose).
    pub dev: String,
    /// `dev-type` (or the `dev` name's prefix): [`DevType::Tun`] routes IP packets,
    /// [`DevType::Tap`] switches Ethernet frames ([`crate::switch`]).
    pub dev_type: DevType,
    /// `max-routes-per-client`: in tap mode, the MAC addresses one client may own.
    pub max_routes_per_client: usize,
    /// `txqueuelen`.
    pub txqueuelen: Option<u32>,
    /// `server NET MASK` (topology subnet); `None` for no IPv4 pool (vpn2 runs IPv6-only).
    pub pool_v4: Option<Ipv4Net>,
    /// `ifconfig-pool START END` with `server ... nopool`: the IPv4 addresses handed out,
    /// inside `pool_v4` (`None`: NET+2 to the last address before the broadcast).
    pub pool_v4_range: Option<(Ipv4Addr, Ipv4Addr)>,
    /// `server-ipv6 P/len`.
    pub pool_v6: Option<Ipv6Net>,
    /// What every client is pushed first: the configuration's `push "..."` lines as written,
    /// and the options the server adds to them (`socket-flags TCP_NODELAY`, the `tun-mtu` of
    /// [`Settings::auto_mtu`]), in order.
    pub push: Vec<PushItem>,
    /// `client-config-dir`, by certificate CN.
    pub clients: HashMap<String, ClientOptions>,
    /// `client-config-dir/DEFAULT`: for a CN without its own file.
    pub default_client: Option<ClientOptions>,
    /// `route` / `route-ipv6` on the server: kernel routes into the tun device.
    pub routes: Vec<IpNet>,
    /// `client-to-client`.
    pub client_to_client: bool,
    /// `duplicate-cn`.
    pub duplicate_cn: bool,
    /// `max-clients`: concurrent authenticated clients. Connections still in their handshake
    /// do not count (upstream counts every TCP connection); they have `max_pending`.
    pub max_clients: usize,
    /// Connections not yet authenticated kept at once; a newcomer beyond it evicts the oldest
    /// one that has not sent a valid packet, else the oldest pending one
    /// (`registry::admission`). No config directive; [`DEFAULT_MAX_PENDING`].
    pub max_pending: usize,
    /// A connection whose first whole, valid packet has not arrived this long after accept
    /// is closed. No config directive; [`DEFAULT_FIRST_PACKET_TIMEOUT`].
    pub first_packet_timeout: Duration,
    /// A connection without an established tunnel after this long is closed (`hand-window`).
    pub handshake_timeout: Duration,
    /// How long shutdown waits for clients after telling them.
    pub drain_timeout: Duration,
    /// How long a packet from the tun device to a reconnecting client is held
    /// ([`crate::registry::hold`]): a client whose tunnel is not up yet, or a destination a
    /// client routed less than this ago. Zero: none is (ICMP unreachable at once).
    pub hold_timeout: Duration,
    /// `status FILE N`.
    pub status: Option<StatusFile>,
    /// vpn2's `OPENVPN_AUTO_MTU`: `tun_mtu` is the default route's link MTU less 130 bytes,
    /// read when the server binds, and pushed to the clients.
    pub auto_mtu: bool,
    /// HA mode (vpn2's `IS_HA=true`; `docs/ha.md`): no device, no pool; packets are switched
    /// in the process between kube-apiserver and shoot connections ([`crate::ha`]).
    pub ha: Option<HaSettings>,
}

/// What the HA switch needs ([`Settings::ha`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    /// The shoot's networks as the tunnel sees them: a packet from a kube-apiserver
    /// connection may go only there, one from a shoot connection must come from there.
    pub shoot_networks: Vec<IpNet>,
    /// vpn2's `VPN_NETWORK` (a /96): an IPv4 kube-apiserver also owns its address there
    /// ([`crate::ha::seed_addresses`]), its source towards IPv6 shoot networks.
    pub transfer_v6: Option<Ipv6Net>,
    /// vpn2's `server-ipv6` of this server (its /112 of `VPN_NETWORK`): the pool vpn2's
    /// layer-2 (`dev tap`) clients get their `ifconfig-ipv6` from, as from vpn2's server.
    pub layer2_v6: Option<Ipv6Net>,
    /// The seed's pod network overlaps a shoot network: vpn2 maps a kube-apiserver's IPv4
    /// pod IP into 241/8, and its path controller's hellos carry that image (the gateway's
    /// do too, [`crate::gateway`]).
    pub overlap: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("data_ciphers", &self.data_ciphers)
            .field("auth", &self.auth)
            .field("keepalive", &self.keepalive)
            .field("dev", &self.dev)
            .field("dev_type", &self.dev_type)
            .field("pool_v4", &self.pool_v4)
            .field("pool_v6", &self.pool_v6)
            .field("push", &self.push)
            .field("clients", &self.clients.keys().collect::<Vec<_>>())
            .field("routes", &self.routes)
            .field("client_to_client", &self.client_to_client)
            .field("duplicate_cn", &self.duplicate_cn)
            .field("max_clients", &self.max_clients)
            .field("max_pending", &self.max_pending)
            .field("first_packet_timeout", &self.first_packet_timeout)
            .field("hold_timeout", &self.hold_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("status", &self.status)
            .field("ha", &self.ha)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// OpenVPN 2.6 server defaults around a TLS context, a peer check and a control-channel
    /// protection: `[::]:1194`, `dev tun0`, the `192.168.123.0/24` pool, no IPv6 pool,
    /// `data-ciphers AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305`, `auth SHA1`.
    pub fn new(
        tls: SslContext,
        verifier: Arc<dyn PeerVerifier>,
        protection: ControlProtection,
    ) -> Settings {
        Settings {
            listen: vec![SocketAddr::new(
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                DEFAULT_PORT,
            )],
            tls,
            verifier,
            protection,
            data_ciphers: DataCiphers::default_2_6(),
            data_ciphers_fallback: None,
            auth: Digest::Sha1,
            keepalive: None,
            reneg_sec: Some(DEFAULT_RENEG_SEC),
            reneg_sec_min: None,
            hand_window: DEFAULT_HAND_WINDOW,
            tran_window: DEFAULT_TRAN_WINDOW,
            tls_timeout: None,
            reneg_bytes: None,
            reneg_pkts: None,
            packet_ids: PacketIdLimits::UPSTREAM,
            tls_ekm: true,
            compression: Compression::None,
            tun_mtu: 1500,
            dev: "tun0".into(),
            dev_type: DevType::Tun,
            max_routes_per_client: DEFAULT_MAX_ROUTES_PER_CLIENT,
            txqueuelen: None,
            pool_v4: Some(DEFAULT_POOL_V4),
            pool_v4_range: None,
            pool_v6: None,
            push: Vec::new(),
            clients: HashMap::new(),
            default_client: None,
            routes: Vec::new(),
            client_to_client: false,
            duplicate_cn: false,
            max_clients: DEFAULT_MAX_CLIENTS,
            max_pending: DEFAULT_MAX_PENDING,
            first_packet_timeout: DEFAULT_FIRST_PACKET_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            hold_timeout: DEFAULT_HOLD_TIMEOUT,
            status: None,
            auto_mtu: false,
            ha: None,
        }
    }

    /// The client-config-dir entry for `common_name` (its own, else `DEFAULT`).
    pub fn client_options(&self, common_name: Option<&str>) -> Option<&ClientOptions> {
        common_name
            .and_then(|cn| self.clients.get(cn))
            .or(self.default_client.as_ref())
    }

    /// Whether the device is a tap device (frames switched by MAC address).
    pub fn is_tap(&self) -> bool {
        self.dev_type == DevType::Tap
    }

    /// The session configuration every connection shares. Its `push` list stays empty: the
    /// pushes are per client ([`Settings::push_for`]) so `push-reset` and the iroute rule can
    /// apply.
    pub fn server_config(&self) -> ServerConfig {
        let mut session = SessionConfig::new(self.tls.clone(), self.protection.clone());
        session.verifier = Arc::clone(&self.verifier);
        session.data_ciphers = self.data_ciphers.clone();
        session.data_ciphers_fallback = self.data_ciphers_fallback;
        session.auth = self.auth;
        session.reneg_sec = self.reneg_sec;
        session.reneg_sec_min = self.reneg_sec_min;
        session.hand_window = self.hand_window;
        session.tran_window = self.tran_window;
        if let Some(t) = self.tls_timeout {
            session.tls_timeout = t;
        }
        session.reneg_bytes = self.reneg_bytes;
        session.reneg_pkts = self.reneg_pkts;
        session.packet_ids = self.packet_ids;
        session.compression = self.compression;
        session.tun_mtu = self.tun_mtu;
        session.dev_type = self.dev_type;
        let mut config = ServerConfig::new(session);
        config.keepalive = self.keepalive;
        config.capabilities.tls_ekm = self.tls_ekm;
        config
    }

    /// The `push` part of one client's `PUSH_REPLY` (before keepalive and the per-client
    /// options): [`Settings::push`], what the `server` helper adds (`route-gateway NET+1`,
    /// and `topology subnet` for tun only) and `tun-ipv6` for `server-ipv6` (reference 10.4,
    /// 10.5), then the client's own `push` lines. `push-reset` drops the
    /// inherited part, `push-remove OPT` the inherited lines containing OPT; a pushed
    /// `route` equal to one of the client's own iroutes is left out (reference 10.6).
    pub fn push_for(&self, client: Option<&ClientOptions>) -> Vec<PushItem> {
        let mut push = Vec::new();
        if !client.is_some_and(|c| c.push_reset) {
            push.extend(self.push.iter().cloned());
            push.extend(self.helper_push().into_iter().map(PushItem::Typed));
            if let Some(c) = client {
                push.retain(|item| {
                    let text = item.to_string();
                    !c.push_remove.iter().any(|p| push_option_matches(&text, p))
                });
            }
        }
        if let Some(c) = client {
            push.extend(c.push.iter().cloned().map(PushItem::Verbatim));
            push.retain(|item| !c.iroutes.iter().any(|n| routes_to(item, *n)));
        }
        push
    }

    /// What the `server` / `server-ipv6` helpers add to the pushes: `route-gateway NET+1` and,
    /// for tun only, `topology subnet` for an IPv4 pool; `tun-ipv6` for an IPv6 pool.
    fn helper_push(&self) -> Vec<PushedOption> {
        let mut push = Vec::new();
        if let Some(net) = self.pool_v4 {
            let gateway = Ipv4Addr::from(u32::from(net.network()) + 1);
            push.push(PushedOption::RouteGateway(RouteGatewayAddr::Addr(gateway)));
            // Upstream's helper pushes the topology for tun only: tap has none.
            if self.dev_type != DevType::Tap {
                push.push(PushedOption::Topology(Topology::Subnet));
            }
        }
        if self.pool_v6.is_some() {
            push.push(PushedOption::TunIpv6);
        }
        push
    }
}

/// Whether `push-remove OPT` removes a pushed option: OPT is matched as a substring of the
/// whole option text (upstream's documented rule, so `route` also removes `route-ipv6`).
fn push_option_matches(line: &str, opt: &str) -> bool {
    line.contains(opt)
}

/// Whether a pushed item is a route to exactly `net` (the iroute rule of [`Settings::push_for`]).
fn routes_to(item: &PushItem, net: IpNet) -> bool {
    match (item, net) {
        (PushItem::Verbatim(line), _) => is_route_to(line, net),
        (PushItem::Typed(PushedOption::Route(r)), IpNet::V4(n)) => r.net().trunc() == n.trunc(),
        (PushItem::Typed(PushedOption::RouteIpv6(r)), IpNet::V6(n)) => {
            r.network.trunc() == n.trunc()
        }
        _ => false,
    }
}

/// Whether a push line is `route NET MASK` / `route-ipv6 NET/LEN` for exactly `net`.
fn is_route_to(line: &str, net: IpNet) -> bool {
    let mut words = line.split_whitespace();
    let (Some(verb), Some(dest)) = (words.next(), words.next()) else {
        return false;
    };
    match (verb, net) {
        ("route", IpNet::V4(n)) => {
            let mask = words
                .next()
                .and_then(|m| m.parse::<Ipv4Addr>().ok())
                .unwrap_or(Ipv4Addr::BROADCAST);
            let (Ok(addr), Ok(len)) = (dest.parse::<Ipv4Addr>(), ipnet::ipv4_mask_to_prefix(mask))
            else {
                return false;
            };
            Ipv4Net::new(addr, len).is_ok_and(|p| p.trunc() == n.trunc())
        }
        ("route-ipv6", IpNet::V6(n)) => dest
            .parse::<Ipv6Net>()
            .is_ok_and(|p| p.trunc() == n.trunc()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let ctx = openssl::ssl::SslContext::builder(openssl::ssl::SslMethod::tls())
            .unwrap()
            .build();
        Settings::new(
            ctx,
            Arc::new(protocol::tls::AcceptAnyPeer),
            ControlProtection::None,
        )
    }

    #[test]
    fn pushes_in_upstream_order() {
        let mut s = settings();
        s.push = vec![
            PushItem::Verbatim("route 10.99.0.0 255.255.0.0".into()),
            PushItem::Verbatim("route 10.98.0.0 255.255.0.0".into()),
        ];
        assert_eq!(
            s.push_for(None),
            [
                "route 10.99.0.0 255.255.0.0",
                "route 10.98.0.0 255.255.0.0",
                "route-gateway 192.168.123.1",
                "topology subnet"
            ]
        );
        s.pool_v6 = Some("fd00::/96".parse().unwrap());
        let c = ClientOptions {
            iroutes: vec!["10.99.0.0/16".parse().unwrap()],
            push: vec!["dhcp-option DNS 10.0.0.1".into()],
            ..ClientOptions::default()
        };
        assert_eq!(
            s.push_for(Some(&c)),
            [
                "route 10.98.0.0 255.255.0.0",
                "route-gateway 192.168.123.1",
                "topology subnet",
                "tun-ipv6",
                "dhcp-option DNS 10.0.0.1"
            ]
        );
        let reset = ClientOptions {
            push_reset: true,
            push: vec!["route 10.1.0.0 255.255.0.0".into()],
            ..ClientOptions::default()
        };
        assert_eq!(s.push_for(Some(&reset)), ["route 10.1.0.0 255.255.0.0"]);
    }

    #[test]
    fn route_matching() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert!(is_route_to(
            "route 10.99.0.0 255.255.0.0",
            n("10.99.0.0/16")
        ));
        assert!(is_route_to("route 10.99.0.1", n("10.99.0.1/32")));
        assert!(!is_route_to(
            "route 10.99.0.0 255.255.0.0",
            n("10.99.0.0/24")
        ));
        assert!(is_route_to("route-ipv6 fd00:1::/64", n("fd00:1::/64")));
        assert!(!is_route_to("route-gateway 10.99.0.0", n("10.99.0.0/32")));
    }

    #[test]
    fn client_options_fall_back_to_default() {
        let mut s = settings();
        let own = ClientOptions {
            disable: true,
            ..ClientOptions::default()
        };
        let dflt = ClientOptions {
            push: vec!["x".into()],
            ..ClientOptions::default()
        };
        s.clients.insert("a".into(), own.clone());
        assert_eq!(s.client_options(Some("a")), Some(&own));
        assert_eq!(s.client_options(Some("b")), None);
        s.default_client = Some(dflt.clone());
        assert_eq!(s.client_options(Some("b")), Some(&dflt));
        assert_eq!(s.client_options(None), Some(&dflt));
    }
}
