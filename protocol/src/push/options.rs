//! The typed model of pushed options, how one tokenised option line becomes one
//! ([`PushedOption::from_tokens`], one small parser per option, by family, in `parse`), and
//! how one becomes text again (its `Display`, in `render`: what our server pushes).
//!
//! Option names are matched **case-sensitively**, exactly as upstream does (`streq` on the
//! first token): `ROUTE` or `Redirect-Gateway` are not `route` / `redirect-gateway` but unknown
//! options, which never take effect. Arguments are checked as upstream checks them (count,
//! addresses, numbers, keywords), more strictly in a few places noted on the variants: we never
//! resolve host names, numbers must be plain decimal digits, netmasks must be contiguous.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::tokenize::TokenizeError;
use crate::ids::PeerId;

mod parse;
mod render;

/// One pushed option that we understand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushedOption {
    /// `ifconfig LOCAL REMOTE_OR_NETMASK`: the tunnel address, and the netmask (`topology
    /// subnet`) or the peer address (`net30`/`p2p`).
    Ifconfig {
        /// Our tunnel address.
        local: Ipv4Addr,
        /// Netmask or peer address, depending on the topology.
        remote_netmask: Ipv4Addr,
    },
    /// `ifconfig-ipv6 ADDR[/BITS] [REMOTE]` (BITS defaults to 128).
    IfconfigIpv6 {
        /// Our tunnel address with its prefix.
        local: Ipv6Net,
        /// The server's tunnel address, if given.
        remote: Option<Ipv6Addr>,
    },
    /// `route NETWORK [NETMASK [GATEWAY [METRIC]]]`.
    Route(Route),
    /// `route-ipv6 NETWORK/BITS [GATEWAY [METRIC]]`.
    RouteIpv6(RouteIpv6),
    /// `route-gateway ADDR|dhcp`.
    RouteGateway(RouteGatewayAddr),
    /// `route-metric N`: default metric of pushed routes.
    RouteMetric(u32),
    /// `topology net30|p2p|subnet`.
    Topology(Topology),
    /// `ping N`: seconds of send silence before a keepalive ping.
    Ping(u32),
    /// `ping-restart N`: seconds of receive silence before restarting.
    PingRestart(u32),
    /// `ping-exit N`: seconds of receive silence before exiting.
    PingExit(u32),
    /// `peer-id N`: our id in P_DATA_V2 packets.
    PeerId(PeerId),
    /// `cipher NAME`: the negotiated data-channel cipher.
    Cipher(String),
    /// `tun-mtu N`.
    TunMtu(u16),
    /// `redirect-gateway [flags]`: route all traffic through the tunnel.
    RedirectGateway(RedirectFlags),
    /// `redirect-private [flags]`: like `redirect-gateway` without the default-route change.
    RedirectPrivate(RedirectFlags),
    /// `dhcp-option TYPE [VALUE...]`.
    DhcpOption(DhcpOption),
    /// `dns ...` (2.6 structured DNS): the arguments, unparsed.
    Dns(Vec<String>),
    /// `block-outside-dns` (Windows).
    BlockOutsideDns,
    /// `register-dns` (Windows).
    RegisterDns,
    /// `key-derivation tls-ekm`: derive data keys with the TLS exporter.
    KeyDerivation(KeyDerivation),
    /// `protocol-flags FLAG...`.
    ProtocolFlags(ProtocolFlags),
    /// `comp-lzo [yes|no|adaptive]`.
    CompLzo(CompLzo),
    /// `compress [ALGO]`.
    Compress(Compress),
    /// `auth-token TOKEN`: the session token to use instead of the password.
    AuthToken(AuthToken),
    /// `socket-flags FLAG...`.
    SocketFlags(SocketFlags),
    /// `echo [ARGS...]`: text for a management client.
    Echo(Vec<String>),
    /// `setenv NAME [VALUE]`.
    Setenv {
        /// Variable name.
        name: String,
        /// Value (empty if not given).
        value: String,
    },
    /// `tun-ipv6` (obsolete in 2.6, accepted and ignored).
    TunIpv6,
    /// `push-continuation N`: 2 = more `PUSH_REPLY` parts follow, 1 = last part. Consumed by
    /// [`super::PushCollector`]; never in an outcome's accepted list.
    PushContinuation(u8),
}

/// What kind of option a [`PushedOption`] is, without its arguments: the unit of the strict
/// mode's allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // each variant is the option named by `OptionKind::name`
pub enum OptionKind {
    Ifconfig,
    IfconfigIpv6,
    Route,
    RouteIpv6,
    RouteGateway,
    RouteMetric,
    Topology,
    Ping,
    PingRestart,
    PingExit,
    PeerId,
    Cipher,
    TunMtu,
    RedirectGateway,
    RedirectPrivate,
    DhcpOption,
    Dns,
    BlockOutsideDns,
    RegisterDns,
    KeyDerivation,
    ProtocolFlags,
    CompLzo,
    Compress,
    AuthToken,
    SocketFlags,
    Echo,
    Setenv,
    TunIpv6,
    PushContinuation,
}

/// Upstream's permission classes (`OPT_P_*`): a pulled option is applied only if its class is
/// in the client's pull permission mask (reference 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionClass {
    /// `OPT_P_UP`: interface settings (`ifconfig`, `topology`, ...).
    Up,
    /// `OPT_P_ROUTE`: routes and gateway redirection. Removed by `route-nopull`.
    Route,
    /// `OPT_P_ROUTE_EXTRAS`: `route-gateway`.
    RouteExtras,
    /// `OPT_P_DHCPDNS`: DNS / DHCP settings. Removed by `route-nopull`.
    DhcpDns,
    /// `OPT_P_SOCKFLAGS`.
    SockFlags,
    /// `OPT_P_SETENV`.
    SetEnv,
    /// `OPT_P_TIMER`.
    Timer,
    /// `OPT_P_COMP`.
    Comp,
    /// `OPT_P_ECHO`: `echo`, `auth-token`.
    Echo,
    /// `OPT_P_PULL_MODE`: `push-continuation`.
    PullMode,
    /// `OPT_P_PEER_ID`.
    PeerId,
    /// `OPT_P_NCP`: `cipher`, `key-derivation`, `protocol-flags`.
    Ncp,
    /// `OPT_P_PUSH_MTU`: `tun-mtu`.
    PushMtu,
    /// `OPT_P_GENERIC`: everything upstream never accepts from a server (`dev`, `remote`, keys...).
    Generic,
    /// `OPT_P_SCRIPT`: script hooks (`up`, `down`, `route-up`, ...). Never pullable.
    Script,
    /// `OPT_P_CONFIG`: `config`. Never pullable.
    Config,
    /// `OPT_P_PLUGIN`: `plugin`. Never pullable.
    Plugin,
    /// `OPT_P_INSTANCE`: server-side per-client options (`iroute`, `push`, ...). Never pullable.
    Instance,
}

impl OptionClass {
    /// Whether a pull client accepts options of this class (`pull_permission_mask`), with
    /// `route-nopull` removing [`OptionClass::Route`] and [`OptionClass::DhcpDns`].
    pub const fn pullable(self, route_nopull: bool) -> bool {
        match self {
            OptionClass::Route | OptionClass::DhcpDns => !route_nopull,
            OptionClass::Up
            | OptionClass::RouteExtras
            | OptionClass::SockFlags
            | OptionClass::SetEnv
            | OptionClass::Timer
            | OptionClass::Comp
            | OptionClass::Echo
            | OptionClass::PullMode
            | OptionClass::PeerId
            | OptionClass::Ncp
            | OptionClass::PushMtu => true,
            OptionClass::Generic
            | OptionClass::Script
            | OptionClass::Config
            | OptionClass::Plugin
            | OptionClass::Instance => false,
        }
    }
}

/// Option names upstream knows but never accepts from a server, with their class. An option
/// named here is reported as not permitted rather than unknown.
const NEVER_PULLED: &[(&str, OptionClass)] = &[
    ("dev", OptionClass::Generic),
    ("dev-type", OptionClass::Generic),
    ("dev-node", OptionClass::Generic),
    ("remote", OptionClass::Generic),
    ("proto", OptionClass::Generic),
    ("port", OptionClass::Generic),
    ("lport", OptionClass::Generic),
    ("rport", OptionClass::Generic),
    ("local", OptionClass::Generic),
    ("client", OptionClass::Generic),
    ("pull", OptionClass::Generic),
    ("tls-client", OptionClass::Generic),
    ("tls-server", OptionClass::Generic),
    ("mode", OptionClass::Generic),
    ("server", OptionClass::Generic),
    ("ca", OptionClass::Generic),
    ("cert", OptionClass::Generic),
    ("key", OptionClass::Generic),
    ("pkcs12", OptionClass::Generic),
    ("tls-auth", OptionClass::Generic),
    ("tls-crypt", OptionClass::Generic),
    ("tls-crypt-v2", OptionClass::Generic),
    ("secret", OptionClass::Generic),
    ("auth-user-pass", OptionClass::Generic),
    ("management", OptionClass::Generic),
    ("daemon", OptionClass::Generic),
    ("log", OptionClass::Generic),
    ("log-append", OptionClass::Generic),
    ("cd", OptionClass::Generic),
    ("chroot", OptionClass::Generic),
    ("user", OptionClass::Generic),
    ("group", OptionClass::Generic),
    ("writepid", OptionClass::Generic),
    ("http-proxy", OptionClass::Generic),
    ("socks-proxy", OptionClass::Generic),
    ("remote-cert-tls", OptionClass::Generic),
    ("verify-x509-name", OptionClass::Generic),
    ("pull-filter", OptionClass::Generic),
    ("route-nopull", OptionClass::Generic),
    ("up", OptionClass::Script),
    ("down", OptionClass::Script),
    ("route-up", OptionClass::Script),
    ("route-pre-down", OptionClass::Script),
    ("ipchange", OptionClass::Script),
    ("tls-verify", OptionClass::Script),
    ("client-connect", OptionClass::Script),
    ("client-disconnect", OptionClass::Script),
    ("learn-address", OptionClass::Script),
    ("auth-user-pass-verify", OptionClass::Script),
    ("script-security", OptionClass::Script),
    ("config", OptionClass::Config),
    ("plugin", OptionClass::Plugin),
    ("iroute", OptionClass::Instance),
    ("iroute-ipv6", OptionClass::Instance),
    ("ifconfig-push", OptionClass::Instance),
    ("ifconfig-ipv6-push", OptionClass::Instance),
    ("push", OptionClass::Instance),
    ("push-reset", OptionClass::Instance),
    ("push-remove", OptionClass::Instance),
];

impl OptionKind {
    /// Every kind, in declaration order.
    pub const ALL: [OptionKind; 29] = [
        OptionKind::Ifconfig,
        OptionKind::IfconfigIpv6,
        OptionKind::Route,
        OptionKind::RouteIpv6,
        OptionKind::RouteGateway,
        OptionKind::RouteMetric,
        OptionKind::Topology,
        OptionKind::Ping,
        OptionKind::PingRestart,
        OptionKind::PingExit,
        OptionKind::PeerId,
        OptionKind::Cipher,
        OptionKind::TunMtu,
        OptionKind::RedirectGateway,
        OptionKind::RedirectPrivate,
        OptionKind::DhcpOption,
        OptionKind::Dns,
        OptionKind::BlockOutsideDns,
        OptionKind::RegisterDns,
        OptionKind::KeyDerivation,
        OptionKind::ProtocolFlags,
        OptionKind::CompLzo,
        OptionKind::Compress,
        OptionKind::AuthToken,
        OptionKind::SocketFlags,
        OptionKind::Echo,
        OptionKind::Setenv,
        OptionKind::TunIpv6,
        OptionKind::PushContinuation,
    ];

    /// The option name as written in a push (and in a config file).
    pub const fn name(self) -> &'static str {
        match self {
            OptionKind::Ifconfig => "ifconfig",
            OptionKind::IfconfigIpv6 => "ifconfig-ipv6",
            OptionKind::Route => "route",
            OptionKind::RouteIpv6 => "route-ipv6",
            OptionKind::RouteGateway => "route-gateway",
            OptionKind::RouteMetric => "route-metric",
            OptionKind::Topology => "topology",
            OptionKind::Ping => "ping",
            OptionKind::PingRestart => "ping-restart",
            OptionKind::PingExit => "ping-exit",
            OptionKind::PeerId => "peer-id",
            OptionKind::Cipher => "cipher",
            OptionKind::TunMtu => "tun-mtu",
            OptionKind::RedirectGateway => "redirect-gateway",
            OptionKind::RedirectPrivate => "redirect-private",
            OptionKind::DhcpOption => "dhcp-option",
            OptionKind::Dns => "dns",
            OptionKind::BlockOutsideDns => "block-outside-dns",
            OptionKind::RegisterDns => "register-dns",
            OptionKind::KeyDerivation => "key-derivation",
            OptionKind::ProtocolFlags => "protocol-flags",
            OptionKind::CompLzo => "comp-lzo",
            OptionKind::Compress => "compress",
            OptionKind::AuthToken => "auth-token",
            OptionKind::SocketFlags => "socket-flags",
            OptionKind::Echo => "echo",
            OptionKind::Setenv => "setenv",
            OptionKind::TunIpv6 => "tun-ipv6",
            OptionKind::PushContinuation => "push-continuation",
        }
    }

    /// The kind named exactly `name` (case-sensitive, as upstream).
    pub fn from_name(name: &str) -> Option<OptionKind> {
        OptionKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Upstream's permission class of this option.
    pub const fn class(self) -> OptionClass {
        match self {
            OptionKind::Ifconfig
            | OptionKind::IfconfigIpv6
            | OptionKind::Topology
            | OptionKind::TunIpv6 => OptionClass::Up,
            OptionKind::Route
            | OptionKind::RouteIpv6
            | OptionKind::RouteMetric
            | OptionKind::RedirectGateway
            | OptionKind::RedirectPrivate => OptionClass::Route,
            OptionKind::RouteGateway => OptionClass::RouteExtras,
            OptionKind::DhcpOption
            | OptionKind::Dns
            | OptionKind::BlockOutsideDns
            | OptionKind::RegisterDns => OptionClass::DhcpDns,
            OptionKind::Ping | OptionKind::PingRestart | OptionKind::PingExit => OptionClass::Timer,
            OptionKind::PeerId => OptionClass::PeerId,
            OptionKind::Cipher | OptionKind::KeyDerivation | OptionKind::ProtocolFlags => {
                OptionClass::Ncp
            }
            OptionKind::TunMtu => OptionClass::PushMtu,
            OptionKind::CompLzo | OptionKind::Compress => OptionClass::Comp,
            OptionKind::AuthToken | OptionKind::Echo => OptionClass::Echo,
            OptionKind::SocketFlags => OptionClass::SockFlags,
            OptionKind::Setenv => OptionClass::SetEnv,
            OptionKind::PushContinuation => OptionClass::PullMode,
        }
    }
}

impl fmt::Display for OptionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an option name is known: one we model, or one upstream never pulls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownName {
    /// An option of our typed model.
    Kind(OptionKind),
    /// An option upstream knows but refuses from a server, with its class.
    NeverPulled(OptionClass),
}

impl KnownName {
    /// Looks `name` up (case-sensitive); `None` for an unknown option.
    pub fn lookup(name: &str) -> Option<KnownName> {
        if let Some(kind) = OptionKind::from_name(name) {
            return Some(KnownName::Kind(kind));
        }
        NEVER_PULLED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, class)| KnownName::NeverPulled(class))
    }

    /// The permission class.
    pub const fn class(self) -> OptionClass {
        match self {
            KnownName::Kind(k) => k.class(),
            KnownName::NeverPulled(c) => c,
        }
    }
}

/// `route NETWORK [NETMASK [GATEWAY [METRIC]]]`. The word `default` in the netmask, gateway
/// or metric position means "not given", as upstream. NETWORK must be a literal IPv4 address
/// (upstream would also resolve a host name or take `vpn_gateway`/`net_gateway`/`remote_host`;
/// we refuse those) and the netmask must be contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The destination network as written.
    pub network: Ipv4Addr,
    /// The netmask (255.255.255.255 when not given).
    pub netmask: Ipv4Addr,
    /// The gateway, if given (otherwise the `route-gateway`).
    pub gateway: Option<RouteVia>,
    /// The metric, if given.
    pub metric: Option<u32>,
}

impl Route {
    /// The destination as a network (prefix length from the contiguous netmask).
    pub fn net(&self) -> Ipv4Net {
        let prefix = u32::from(self.netmask).leading_ones() as u8;
        // The prefix length is at most 32, so construction cannot fail.
        Ipv4Net::new(self.network, prefix).unwrap_or_default()
    }
}

/// The gateway of a `route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteVia {
    /// A literal address.
    Addr(Ipv4Addr),
    /// `vpn_gateway`: the tunnel's gateway.
    VpnGateway,
    /// `net_gateway`: the pre-existing default gateway.
    NetGateway,
    /// `remote_host`: the address of the server.
    RemoteHost,
}

/// `route-ipv6 NETWORK/BITS [GATEWAY [METRIC]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteIpv6 {
    /// The destination (BITS defaults to 128).
    pub network: Ipv6Net,
    /// The gateway, if given.
    pub gateway: Option<Ipv6Addr>,
    /// The metric, if given.
    pub metric: Option<u32>,
}

/// The argument of `route-gateway`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteGatewayAddr {
    /// A literal address.
    Addr(Ipv4Addr),
    /// `dhcp`: learn it from DHCP (tap).
    Dhcp,
}

/// `topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// `net30`: a /30 per client.
    Net30,
    /// `p2p`: point-to-point.
    P2p,
    /// `subnet`: one shared subnet.
    Subnet,
}

impl Topology {
    /// The topology a push sets: its `topology` option, else upstream's default `net30`.
    pub fn of_push(accepted: &[PushedOption]) -> Topology {
        accepted
            .iter()
            .find_map(|o| match o {
                PushedOption::Topology(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(Topology::Net30)
    }
}

/// The flags of `redirect-gateway` / `redirect-private`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectFlags {
    /// `local`.
    pub local: bool,
    /// `autolocal`.
    pub autolocal: bool,
    /// `def1`: two /1 routes instead of replacing the default route.
    pub def1: bool,
    /// `bypass-dhcp`.
    pub bypass_dhcp: bool,
    /// `bypass-dns`.
    pub bypass_dns: bool,
    /// `block-local`.
    pub block_local: bool,
    /// IPv4 redirection (on unless `!ipv4`).
    pub ipv4: bool,
    /// IPv6 redirection (`ipv6`).
    pub ipv6: bool,
}

impl Default for RedirectFlags {
    fn default() -> Self {
        RedirectFlags {
            local: false,
            autolocal: false,
            def1: false,
            bypass_dhcp: false,
            bypass_dns: false,
            block_local: false,
            ipv4: true,
            ipv6: false,
        }
    }
}

/// `dhcp-option TYPE [VALUE...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DhcpOption {
    /// `DNS ADDR` (IPv4 or, in 2.6, IPv6).
    Dns(IpAddr),
    /// `DNS6 ADDR`.
    Dns6(Ipv6Addr),
    /// `DOMAIN NAME`.
    Domain(String),
    /// `DOMAIN-SEARCH NAME`.
    DomainSearch(String),
    /// Any other type, with its arguments.
    Other {
        /// The type word.
        kind: String,
        /// Its arguments.
        args: Vec<String>,
    },
}

/// `key-derivation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDerivation {
    /// `tls-ekm`: the TLS keying-material exporter.
    TlsEkm,
}

/// `protocol-flags`: the flags we know, and the rest (which a client ignores with a warning).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProtocolFlags {
    /// `cc-exit`: the peer understands the EXIT control message.
    pub cc_exit: bool,
    /// `tls-ekm`: data keys from the TLS exporter.
    pub tls_ekm: bool,
    /// `dyn-tls-crypt`: dynamic tls-crypt keys on renegotiation.
    pub dyn_tls_crypt: bool,
    /// Flags we do not know.
    pub unknown: Vec<String>,
}

/// `comp-lzo [MODE]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompLzo {
    /// `yes`.
    Yes,
    /// `no`: framing byte only.
    No,
    /// `adaptive` (also with no argument).
    Adaptive,
}

/// `compress [ALGO]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compress {
    /// No argument, or `stub`.
    Stub,
    /// `stub-v2`.
    StubV2,
    /// `lzo`.
    Lzo,
    /// `lz4`.
    Lz4,
    /// `lz4-v2`.
    Lz4V2,
}

/// `auth-token TOKEN`. The token is a credential: `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(pub String);

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthToken(<{} bytes>)", self.0.len())
    }
}

/// `socket-flags`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SocketFlags {
    /// `TCP_NODELAY`.
    pub tcp_nodelay: bool,
    /// Flags we do not know (upstream warns and ignores them).
    pub unknown: Vec<String>,
}

/// A known option whose arguments are wrong. Every variant names the option text (after the
/// leading whitespace) as received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The line could not be tokenised.
    #[error("cannot tokenise pushed option {text:?}")]
    Tokenize {
        /// The option text.
        text: String,
        /// Why.
        #[source]
        source: TokenizeError,
    },
    /// Too few arguments.
    #[error("pushed option {text:?}: missing argument for {option}")]
    MissingArgument {
        /// The option text.
        text: String,
        /// The option.
        option: OptionKind,
    },
    /// Too many arguments.
    #[error("pushed option {text:?}: too many arguments for {option}")]
    ExtraArgument {
        /// The option text.
        text: String,
        /// The option.
        option: OptionKind,
    },
    /// An argument that should be an address (or network) is not.
    #[error("pushed option {text:?}: {value:?} is not a valid address for {option}")]
    BadAddress {
        /// The option text.
        text: String,
        /// The option.
        option: OptionKind,
        /// The argument.
        value: String,
    },
    /// An argument that should be a number is not (or is out of range).
    #[error("pushed option {text:?}: {value:?} is not a valid number for {option}")]
    BadNumber {
        /// The option text.
        text: String,
        /// The option.
        option: OptionKind,
        /// The argument.
        value: String,
    },
    /// A keyword or flag argument is not one the option knows.
    #[error("pushed option {text:?}: unknown value {value:?} for {option}")]
    BadValue {
        /// The option text.
        text: String,
        /// The option.
        option: OptionKind,
        /// The argument.
        value: String,
    },
}

impl PushedOption {
    /// The kind of this option.
    pub const fn kind(&self) -> OptionKind {
        match self {
            PushedOption::Ifconfig { .. } => OptionKind::Ifconfig,
            PushedOption::IfconfigIpv6 { .. } => OptionKind::IfconfigIpv6,
            PushedOption::Route(_) => OptionKind::Route,
            PushedOption::RouteIpv6(_) => OptionKind::RouteIpv6,
            PushedOption::RouteGateway(_) => OptionKind::RouteGateway,
            PushedOption::RouteMetric(_) => OptionKind::RouteMetric,
            PushedOption::Topology(_) => OptionKind::Topology,
            PushedOption::Ping(_) => OptionKind::Ping,
            PushedOption::PingRestart(_) => OptionKind::PingRestart,
            PushedOption::PingExit(_) => OptionKind::PingExit,
            PushedOption::PeerId(_) => OptionKind::PeerId,
            PushedOption::Cipher(_) => OptionKind::Cipher,
            PushedOption::TunMtu(_) => OptionKind::TunMtu,
            PushedOption::RedirectGateway(_) => OptionKind::RedirectGateway,
            PushedOption::RedirectPrivate(_) => OptionKind::RedirectPrivate,
            PushedOption::DhcpOption(_) => OptionKind::DhcpOption,
            PushedOption::Dns(_) => OptionKind::Dns,
            PushedOption::BlockOutsideDns => OptionKind::BlockOutsideDns,
            PushedOption::RegisterDns => OptionKind::RegisterDns,
            PushedOption::KeyDerivation(_) => OptionKind::KeyDerivation,
            PushedOption::ProtocolFlags(_) => OptionKind::ProtocolFlags,
            PushedOption::CompLzo(_) => OptionKind::CompLzo,
            PushedOption::Compress(_) => OptionKind::Compress,
            PushedOption::AuthToken(_) => OptionKind::AuthToken,
            PushedOption::SocketFlags(_) => OptionKind::SocketFlags,
            PushedOption::Echo(_) => OptionKind::Echo,
            PushedOption::Setenv { .. } => OptionKind::Setenv,
            PushedOption::TunIpv6 => OptionKind::TunIpv6,
            PushedOption::PushContinuation(_) => OptionKind::PushContinuation,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(text: &str) -> Result<PushedOption, OptionError> {
        let tokens = super::super::tokenize::tokenize(text).unwrap();
        let kind = OptionKind::from_name(&tokens[0]).unwrap();
        PushedOption::from_tokens(kind, &tokens, text)
    }

    #[test]
    fn kinds_round_trip_names() {
        for k in OptionKind::ALL {
            assert_eq!(OptionKind::from_name(k.name()), Some(k));
        }
        assert_eq!(OptionKind::from_name("ROUTE"), None);
        assert_eq!(
            KnownName::lookup("up"),
            Some(KnownName::NeverPulled(OptionClass::Script))
        );
        assert_eq!(KnownName::lookup("Route"), None);
    }

    #[test]
    fn routes() {
        assert_eq!(
            parse("route 10.0.0.0 255.0.0.0").unwrap(),
            PushedOption::Route(Route {
                network: Ipv4Addr::new(10, 0, 0, 0),
                netmask: Ipv4Addr::new(255, 0, 0, 0),
                gateway: None,
                metric: None
            })
        );
        let PushedOption::Route(r) = parse("route 10.1.0.0 default vpn_gateway 7").unwrap() else {
            panic!()
        };
        assert_eq!(r.net().to_string(), "10.1.0.0/32");
        assert_eq!(r.gateway, Some(RouteVia::VpnGateway));
        assert_eq!(r.metric, Some(7));
        assert!(matches!(
            parse("route 10.0.0.0 255.0.255.0"),
            Err(OptionError::BadAddress { .. })
        ));
        assert!(matches!(
            parse("route example.com"),
            Err(OptionError::BadAddress { .. })
        ));
        assert!(matches!(
            parse("route 10.0.0.0 255.0.0.0 1.2.3.4 +5"),
            Err(OptionError::BadNumber { .. })
        ));
        assert!(matches!(
            parse("route 1.2.3.4 255.255.255.255 1.2.3.4 5 6"),
            Err(OptionError::ExtraArgument { .. })
        ));
        assert_eq!(
            parse("route-ipv6 fd00::/8 fe80::1 10").unwrap(),
            PushedOption::RouteIpv6(RouteIpv6 {
                network: "fd00::/8".parse().unwrap(),
                gateway: Some("fe80::1".parse().unwrap()),
                metric: Some(10)
            })
        );
        assert!(matches!(
            parse("route-ipv6 fd00::/129"),
            Err(OptionError::BadAddress { .. })
        ));
    }

    #[test]
    fn the_topology_of_a_push_defaults_to_net30() {
        assert_eq!(Topology::of_push(&[]), Topology::Net30);
        let pushed = [
            parse("route 10.0.0.0 255.0.0.0").unwrap(),
            parse("topology subnet").unwrap(),
        ];
        assert_eq!(Topology::of_push(&pushed), Topology::Subnet);
    }

    #[test]
    fn errors_name_the_text() {
        let e = parse("ping ten").unwrap_err();
        assert_eq!(
            e,
            OptionError::BadNumber {
                text: "ping ten".into(),
                option: OptionKind::Ping,
                value: "ten".into()
            }
        );
        assert!(e.to_string().contains("\"ping ten\""));
        assert!(matches!(
            parse("peer-id 16777216"),
            Err(OptionError::BadNumber { .. })
        ));
        assert!(matches!(
            parse("ifconfig 1.2.3"),
            Err(OptionError::MissingArgument { .. })
        ));
        assert!(matches!(
            parse("redirect-gateway DEF1"),
            Err(OptionError::BadValue { .. })
        ));
    }

    #[test]
    fn assorted() {
        assert_eq!(
            parse("redirect-gateway def1 !ipv4 ipv6").unwrap(),
            PushedOption::RedirectGateway(RedirectFlags {
                def1: true,
                ipv4: false,
                ipv6: true,
                ..RedirectFlags::default()
            })
        );
        assert_eq!(
            parse("dhcp-option DNS fd00::53").unwrap(),
            PushedOption::DhcpOption(DhcpOption::Dns("fd00::53".parse().unwrap()))
        );
        assert_eq!(
            parse("comp-lzo").unwrap(),
            PushedOption::CompLzo(CompLzo::Adaptive)
        );
        assert_eq!(
            parse("setenv FOO").unwrap(),
            PushedOption::Setenv {
                name: "FOO".into(),
                value: String::new()
            }
        );
        let tok = parse("auth-token secret123").unwrap();
        assert!(!format!("{tok:?}").contains("secret123"));
        assert_eq!(
            parse("ifconfig-ipv6 fd00::1000/96 fd00::1").unwrap(),
            PushedOption::IfconfigIpv6 {
                local: "fd00::1000/96".parse().unwrap(),
                remote: Some("fd00::1".parse().unwrap())
            }
        );
    }
}
