//! One pass over the directives into [`Raw`] (everything set, with its line), then the role
//! checks and cross-directive validation into [`ServerOptions`] / [`ClientOptions`].

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::str::FromStr;

use ipnet::{Ipv4Net, Ipv6Net};

use super::lex::{lex, Directive};
use super::model::*;
use super::{ConfigError, ErrorReason, Parsed, Source, Warning, WarningKind};
use crate::data::{Compression, DataCipher};
use crate::digest::Digest;
use crate::key::{KeyDirection, Role};
use crate::ncp::{self, DataCiphers, NcpConfigError};
use crate::push::{FilterAction, PullFilter};

/// Parses a config of either role.
pub fn parse(file: &str, text: &str) -> Result<Parsed<Options>, ConfigError> {
    let raw = collect(file, text)?;
    let role = raw.role(file)?;
    raw.finish(file, role)
}

impl ServerOptions {
    /// Parses a server config; a client config is [`ErrorReason::RoleMismatch`].
    pub fn parse(file: &str, text: &str) -> Result<Parsed<ServerOptions>, ConfigError> {
        let raw = collect(file, text)?;
        check_role(file, raw.role(file)?, Role::Server)?;
        let parsed = raw.finish(file, Role::Server)?;
        match parsed.config {
            Options::Server(config) => Ok(Parsed {
                config,
                warnings: parsed.warnings,
            }),
            Options::Client(_) => Err(whole(file, role_mismatch(Role::Server, Role::Client))),
        }
    }
}

impl ClientOptions {
    /// Parses a client config; a server config is [`ErrorReason::RoleMismatch`].
    pub fn parse(file: &str, text: &str) -> Result<Parsed<ClientOptions>, ConfigError> {
        let raw = collect(file, text)?;
        check_role(file, raw.role(file)?, Role::Client)?;
        let parsed = raw.finish(file, Role::Client)?;
        match parsed.config {
            Options::Client(config) => Ok(Parsed {
                config,
                warnings: parsed.warnings,
            }),
            Options::Server(_) => Err(whole(file, role_mismatch(Role::Client, Role::Server))),
        }
    }
}

fn role_mismatch(expected: Role, found: Role) -> ErrorReason {
    ErrorReason::RoleMismatch { expected, found }
}

fn check_role(file: &str, found: Role, expected: Role) -> Result<(), ConfigError> {
    if found == expected {
        Ok(())
    } else {
        Err(whole(file, role_mismatch(expected, found)))
    }
}

fn whole(file: &str, reason: ErrorReason) -> ConfigError {
    let directive = match &reason {
        ErrorReason::MissingDirective { directive } => Some((*directive).to_owned()),
        _ => None,
    };
    ConfigError {
        file: file.to_owned(),
        line: None,
        directive,
        reason,
    }
}

fn at(file: &str, line: usize, directive: &str, reason: ErrorReason) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: Some(line),
        directive: Some(directive.to_owned()),
        reason,
    }
}

/// Directives only a client-config-dir file may hold.
pub(super) const CCD_ONLY: [&str; 7] = [
    "iroute",
    "iroute-ipv6",
    "ifconfig-push",
    "ifconfig-ipv6-push",
    "push-reset",
    "push-remove",
    "disable",
];

/// Directives accepted and ignored with [`WarningKind::NotImplemented`].
const NOT_IMPLEMENTED: [&str; 12] = [
    "management",
    "user",
    "group",
    "resolv-retry",
    "mute",
    "mute-replay-warnings",
    "remap-usr1",
    "ifconfig-pool-persist",
    "stale-routes-check",
    "daemon",
    "writepid",
    "tun-ipv6",
];

/// A `(value, line)` pair.
type At<T> = Option<(T, usize)>;

/// Everything a config sets, with the line that set it (the last one wins, as upstream).
#[derive(Default)]
struct Raw {
    server_marks: Vec<(String, usize)>,
    client_marks: Vec<(String, usize)>,
    mode_server: Option<usize>,
    tls_server: Option<usize>,
    tls_client: Option<usize>,
    pull: Option<usize>,
    proto: At<(Family, Option<Role>)>,
    server_only: Vec<(String, usize)>,
    client_only: Vec<(String, usize)>,

    dev: At<String>,
    dev_type: Option<DevType>,
    port: Option<u16>,
    local: Option<String>,
    ca: Option<Source>,
    cert: Option<Source>,
    key: Option<Source>,
    tls_auth: At<(Source, Option<KeyDirection>)>,
    tls_crypt: At<Source>,
    key_direction: Option<KeyDirection>,
    auth: Option<Digest>,
    data_ciphers: Option<DataCiphers>,
    data_ciphers_fallback: Option<DataCipher>,
    cipher: Option<DataCipher>,
    compression: Compression,
    remote_cert_tls: Option<CertUsage>,
    verify_x509_name: Option<VerifyX509Name>,
    tls_version_min: Option<TlsVersionMin>,
    reneg_sec: Option<RenegSec>,
    reneg_bytes: Option<u64>,
    reneg_pkts: Option<u64>,
    hand_window: Option<u32>,
    tls_timeout: Option<u32>,
    tran_window: Option<u32>,
    replay_window: Option<ReplayWindow>,
    keepalive: At<Keepalive>,
    ping: At<u32>,
    ping_restart: At<u32>,
    tun_mtu: Option<u32>,
    txqueuelen: Option<u32>,
    mssfix: Option<MssFix>,
    sndbuf: Option<u32>,
    rcvbuf: Option<u32>,
    tcp_nodelay: bool,
    routes: Vec<Route>,
    routes_ipv6: Vec<RouteIpv6>,
    script_security: Option<u8>,
    up: Option<String>,
    down: Option<String>,
    persist_key: bool,
    persist_tun: bool,
    disable_dco: bool,
    status: Option<Status>,
    status_version: Option<u8>,
    verb: Option<u8>,
    topology_subnet: bool,

    server: At<(ServerNetwork, String)>,
    server_ipv6: Option<Ipv6Net>,
    ifconfig_pool: At<IfconfigPool>,
    push: Vec<String>,
    client_config_dir: Option<PathBuf>,
    duplicate_cn: bool,
    client_to_client: bool,
    max_clients: Option<u32>,
    max_routes_per_client: Option<u32>,

    remotes: Vec<(String, Option<u16>, Option<Family>)>,
    nobind: bool,
    http_proxy: Option<HttpProxy>,
    http_proxy_options: HttpProxyOptions,
    pull_filters: At<Vec<PullFilter>>,
    route_nopull: bool,
    connect_retry: Option<ConnectRetry>,
    connect_retry_max: Option<u32>,
    auth_nocache: bool,

    warnings: Vec<(usize, String, WarningKind)>,
}

fn collect(file: &str, text: &str) -> Result<Raw, ConfigError> {
    let mut raw = Raw::default();
    for d in lex(file, text)? {
        if let Err(reason) = raw.apply(&d) {
            return Err(at(file, d.line, &d.name, reason));
        }
    }
    Ok(raw)
}

impl Raw {
    fn mark(&mut self, role: Role, what: &str, line: usize) -> Result<(), ErrorReason> {
        let (mine, other) = match role {
            Role::Server => (&mut self.server_marks, &self.client_marks),
            Role::Client => (&mut self.client_marks, &self.server_marks),
        };
        if let Some((other, other_line)) = other.first() {
            return Err(ErrorReason::Conflict {
                other: other.clone(),
                other_line: *other_line,
            });
        }
        mine.push((what.to_owned(), line));
        Ok(())
    }

    /// Reads one directive.
    fn apply(&mut self, d: &Directive) -> Result<(), ErrorReason> {
        let a = Args(d);
        let line = d.line;
        let name = d.name.as_str();
        if let Some(content) = &d.inline {
            let src = Source::Inline(content.clone());
            match name {
                "ca" => self.ca = Some(src),
                "cert" => self.cert = Some(src),
                "key" => self.key = Some(src),
                "tls-auth" => self.tls_auth = Some(((src, None), line)),
                "tls-crypt" => self.tls_crypt = Some((src, line)),
                _ => {
                    return Err(ErrorReason::UnknownInlineTag {
                        tag: name.to_owned(),
                    })
                }
            }
            return Ok(());
        }
        match name {
            // Role.
            "mode" => {
                a.count(1, 1, "server")?;
                if a.s(0) != "server" {
                    return Err(ErrorReason::UnsupportedMode {
                        mode: a.s(0).to_owned(),
                    });
                }
                self.mark(Role::Server, name, line)?;
                self.mode_server = Some(line);
            }
            "tls-server" => {
                a.count(0, 0, "")?;
                self.mark(Role::Server, name, line)?;
                self.tls_server = Some(line);
            }
            "tls-client" => {
                a.count(0, 0, "")?;
                self.mark(Role::Client, name, line)?;
                self.tls_client = Some(line);
            }
            "pull" => {
                a.count(0, 0, "")?;
                self.mark(Role::Client, name, line)?;
                self.pull = Some(line);
            }
            "client" => {
                a.count(0, 0, "")?;
                self.mark(Role::Client, name, line)?;
                self.tls_client = Some(line);
                self.pull = Some(line);
            }
            "proto" => {
                a.count(1, 1, "tcp-server|tcp-client|tcp4-*|tcp6-*")?;
                let (family, role) = parse_proto(a.s(0))?;
                if let Some(role) = role {
                    self.mark(role, name, line)?;
                }
                self.proto = Some(((family, role), line));
            }
            "topology" => {
                a.count(1, 1, "subnet")?;
                if a.s(0) != "subnet" {
                    return Err(ErrorReason::UnsupportedTopology {
                        topology: a.s(0).to_owned(),
                    });
                }
                self.topology_subnet = true;
            }

            // Device and socket.
            "dev" => {
                a.count(1, 1, "DEVICE")?;
                self.dev = Some((a.s(0).to_owned(), line));
            }
            "dev-type" => {
                a.count(1, 1, "tun|tap")?;
                self.dev_type = Some(match a.s(0) {
                    "tun" => DevType::Tun,
                    "tap" => DevType::Tap,
                    v => return Err(bad(v, "tun or tap")),
                });
            }
            "port" => {
                a.count(1, 1, "PORT")?;
                self.port = Some(port(a.s(0))?);
            }
            "local" => {
                a.count(1, 1, "HOST")?;
                self.local = Some(a.s(0).to_owned());
            }
            "nobind" => {
                a.count(0, 0, "")?;
                self.client_only.push((name.to_owned(), line));
                self.nobind = true;
            }
            "remote" => {
                a.count(1, 3, "HOST [PORT [PROTO]]")?;
                let p = a.opt(1).map(port).transpose()?;
                let family = match a.opt(2) {
                    Some(proto) => {
                        let (family, role) = parse_proto(proto)?;
                        if role == Some(Role::Server) {
                            return Err(bad(
                                proto,
                                "a client protocol (tcp-client, tcp4-client, tcp6-client)",
                            ));
                        }
                        Some(family)
                    }
                    None => None,
                };
                self.client_only.push((name.to_owned(), line));
                self.remotes.push((a.s(0).to_owned(), p, family));
            }
            "tcp-nodelay" => {
                a.count(0, 0, "")?;
                self.tcp_nodelay = true;
            }
            "tun-mtu" => {
                a.count(1, 1, "MTU")?;
                self.tun_mtu = Some(u32_arg(a.s(0))?);
            }
            "txqueuelen" => {
                a.count(1, 1, "N")?;
                self.txqueuelen = Some(u32_arg(a.s(0))?);
            }
            "mssfix" => {
                a.count(0, 2, "[N [mtu|fixed]]")?;
                let value = a.opt(0).map(u32_arg).transpose()?;
                let (mut mtu, mut fixed) = (false, false);
                match a.opt(1) {
                    None => {}
                    Some("mtu") => mtu = true,
                    Some("fixed") => fixed = true,
                    Some(v) => return Err(bad(v, "mtu or fixed")),
                }
                self.mssfix = Some(MssFix { value, mtu, fixed });
            }
            "sndbuf" => {
                a.count(1, 1, "BYTES")?;
                self.sndbuf = Some(u32_arg(a.s(0))?);
            }
            "rcvbuf" => {
                a.count(1, 1, "BYTES")?;
                self.rcvbuf = Some(u32_arg(a.s(0))?);
            }
            "disable-dco" => {
                a.count(0, 0, "")?;
                self.disable_dco = true;
            }
            "persist-key" => {
                a.count(0, 0, "")?;
                self.persist_key = true;
            }
            "persist-tun" => {
                a.count(0, 0, "")?;
                self.persist_tun = true;
            }

            // Crypto.
            "ca" => {
                a.count(1, 1, "FILE")?;
                self.ca = Some(path_source(a.s(0)));
            }
            "cert" => {
                a.count(1, 1, "FILE")?;
                self.cert = Some(path_source(a.s(0)));
            }
            "key" => {
                a.count(1, 1, "FILE")?;
                self.key = Some(path_source(a.s(0)));
            }
            "dh" => {
                a.count(1, 1, "none|FILE")?;
                if a.s(0) != "none" {
                    // Older templates (GEP-14) name a DH parameter file. We offer ECDHE only
                    // (every 2.6 peer supports it), so the file is not needed: warn, do not
                    // refuse, so those configs start unchanged.
                    self.warnings
                        .push((line, name.to_owned(), WarningKind::DhFileIgnored));
                }
                self.server_only.push((name.to_owned(), line));
            }
            "tls-auth" => {
                a.count(1, 2, "FILE [0|1]")?;
                let dir = a.opt(1).map(key_direction).transpose()?;
                self.tls_auth = Some(((path_source(a.s(0)), dir), line));
            }
            "tls-crypt" => {
                a.count(1, 1, "FILE")?;
                self.tls_crypt = Some((path_source(a.s(0)), line));
            }
            "key-direction" => {
                a.count(1, 1, "0|1")?;
                self.key_direction = Some(key_direction(a.s(0))?);
            }
            "auth" => {
                a.count(1, 1, "DIGEST")?;
                self.auth = Some(
                    Digest::from_name(a.s(0))
                        .ok_or_else(|| bad(a.s(0), "SHA1, SHA256 or SHA512"))?,
                );
            }
            "data-ciphers" | "ncp-ciphers" => {
                a.count(1, 1, "CIPHER[:CIPHER...]")?;
                self.data_ciphers = Some(DataCiphers::parse(a.s(0)).map_err(ErrorReason::Ncp)?);
            }
            "data-ciphers-fallback" => {
                a.count(1, 1, "CIPHER")?;
                self.data_ciphers_fallback =
                    Some(ncp::parse_fallback(a.s(0)).map_err(ErrorReason::Ncp)?);
            }
            "cipher" => {
                a.count(1, 1, "CIPHER")?;
                self.cipher = Some(DataCipher::from_name(a.s(0)).ok_or_else(|| {
                    ErrorReason::Ncp(NcpConfigError::UnsupportedCipher {
                        name: a.s(0).to_owned(),
                    })
                })?);
            }
            "comp-lzo" => {
                a.count(0, 1, "no")?;
                match a.opt(0) {
                    Some("no") => self.compression = Compression::LzoStub,
                    v => {
                        return Err(ErrorReason::UnsupportedCompression {
                            value: format!("comp-lzo {}", v.unwrap_or(""))
                                .trim_end()
                                .to_owned(),
                        })
                    }
                }
            }
            "compress" => {
                a.count(0, 1, "[stub|stub-v2]")?;
                self.compression = match a.opt(0) {
                    None | Some("stub") => Compression::StubSwap,
                    Some("stub-v2") => Compression::StubV2,
                    Some(v) => {
                        return Err(ErrorReason::UnsupportedCompression {
                            value: format!("compress {v}"),
                        })
                    }
                };
            }
            "remote-cert-tls" => {
                a.count(1, 1, "server|client")?;
                self.remote_cert_tls = Some(match a.s(0) {
                    "server" => CertUsage::Server,
                    "client" => CertUsage::Client,
                    v => return Err(bad(v, "server or client")),
                });
            }
            "verify-x509-name" => {
                a.count(1, 2, "NAME [subject|name|name-prefix]")?;
                let kind = match a.opt(1) {
                    None | Some("subject") => X509NameType::Subject,
                    Some("name") => X509NameType::Name,
                    Some("name-prefix") => X509NameType::NamePrefix,
                    Some(v) => return Err(bad(v, "subject, name or name-prefix")),
                };
                self.verify_x509_name = Some(VerifyX509Name {
                    name: a.s(0).to_owned(),
                    kind,
                });
            }
            "tls-version-min" => {
                a.count(1, 2, "1.0|1.1|1.2|1.3 [or-highest]")?;
                let version = match a.s(0) {
                    "1.0" => TlsVersion::V1_0,
                    "1.1" => TlsVersion::V1_1,
                    "1.2" => TlsVersion::V1_2,
                    "1.3" => TlsVersion::V1_3,
                    v => return Err(bad(v, "1.0, 1.1, 1.2 or 1.3")),
                };
                let or_highest = match a.opt(1) {
                    None => false,
                    Some("or-highest") => true,
                    Some(v) => return Err(bad(v, "or-highest")),
                };
                self.tls_version_min = Some(TlsVersionMin {
                    version,
                    or_highest,
                });
            }
            "reneg-sec" => {
                a.count(1, 2, "SECONDS [MIN]")?;
                self.reneg_sec = Some(RenegSec {
                    max: u32_arg(a.s(0))?,
                    min: a.opt(1).map(u32_arg).transpose()?,
                });
            }
            "reneg-bytes" => {
                a.count(1, 1, "BYTES")?;
                self.reneg_bytes = Some(u64_arg(a.s(0))?);
            }
            "reneg-pkts" => {
                a.count(1, 1, "PACKETS")?;
                self.reneg_pkts = Some(u64_arg(a.s(0))?);
            }
            "hand-window" => {
                a.count(1, 1, "SECONDS")?;
                self.hand_window = Some(u32_arg(a.s(0))?);
            }
            "tls-timeout" => {
                a.count(1, 1, "SECONDS")?;
                self.tls_timeout = Some(u32_arg(a.s(0))?);
            }
            "tran-window" => {
                a.count(1, 1, "SECONDS")?;
                self.tran_window = Some(u32_arg(a.s(0))?);
            }
            "replay-window" => {
                a.count(1, 2, "N [SECONDS]")?;
                self.replay_window = Some(ReplayWindow {
                    size: u32_arg(a.s(0))?,
                    time: a.opt(1).map(u32_arg).transpose()?,
                });
            }

            // Timers.
            "keepalive" => {
                a.count(2, 2, "INTERVAL TIMEOUT")?;
                let interval = u32_arg(a.s(0))?;
                let timeout = u32_arg(a.s(1))?;
                if interval == 0 || timeout == 0 || timeout < interval.saturating_mul(2) {
                    return Err(ErrorReason::KeepaliveRatio { interval, timeout });
                }
                self.keepalive = Some((Keepalive { interval, timeout }, line));
            }
            "ping" => {
                a.count(1, 1, "SECONDS")?;
                self.ping = Some((u32_arg(a.s(0))?, line));
            }
            "ping-restart" => {
                a.count(1, 1, "SECONDS")?;
                self.ping_restart = Some((u32_arg(a.s(0))?, line));
            }

            // Routes and scripts.
            "route" => {
                a.count(1, 4, "NETWORK [NETMASK [GATEWAY [METRIC]]]")?;
                let network = ipv4_net(a.s(0), a.opt(1).unwrap_or("255.255.255.255"))?;
                let gateway = match a.opt(2) {
                    None | Some("default") => None,
                    Some("vpn_gateway") => Some(RouteGateway::VpnGateway),
                    Some("net_gateway") => Some(RouteGateway::NetGateway),
                    Some("remote_host") => Some(RouteGateway::RemoteHost),
                    Some(v) => Some(RouteGateway::Addr(ipv4(v)?)),
                };
                let metric = a.opt(3).map(u32_arg).transpose()?;
                self.routes.push(Route {
                    network,
                    gateway,
                    metric,
                });
            }
            "route-ipv6" => {
                a.count(1, 3, "NETWORK/BITS [GATEWAY [METRIC]]")?;
                let network = ipv6_net(a.s(0))?;
                let gateway = match a.opt(1) {
                    None | Some("default") => None,
                    Some(v) => Some(ipv6(v)?),
                };
                let metric = a.opt(2).map(u32_arg).transpose()?;
                self.routes_ipv6.push(RouteIpv6 {
                    network,
                    gateway,
                    metric,
                });
            }
            "script-security" => {
                a.count(1, 1, "0|1|2|3")?;
                self.script_security = Some(small(a.s(0), 3, "0, 1, 2 or 3")?);
            }
            "up" => {
                a.count(1, 1, "COMMAND")?;
                self.up = Some(a.s(0).to_owned());
            }
            "down" => {
                a.count(1, 1, "COMMAND")?;
                self.down = Some(a.s(0).to_owned());
            }
            "status" => {
                a.count(1, 2, "FILE [SECONDS]")?;
                self.status = Some(Status {
                    path: PathBuf::from(a.s(0)),
                    interval: a
                        .opt(1)
                        .map(u32_arg)
                        .transpose()?
                        .unwrap_or(DEFAULT_STATUS_INTERVAL),
                });
            }
            "status-version" => {
                a.count(1, 1, "1|2|3")?;
                let v = small(a.s(0), 3, "1, 2 or 3")?;
                if v == 0 {
                    return Err(bad(a.s(0), "1, 2 or 3"));
                }
                self.status_version = Some(v);
            }
            "verb" => {
                a.count(1, 1, "0..11")?;
                self.verb = Some(small(a.s(0), 11, "0 to 11")?);
            }

            // Server.
            "server" => {
                a.count(2, 3, "NETWORK NETMASK [nopool]")?;
                let network = ipv4_net(a.s(0), a.s(1))?;
                let nopool = match a.opt(2) {
                    None => false,
                    Some("nopool") => true,
                    Some(v) => return Err(bad(v, "nopool")),
                };
                self.mark(Role::Server, name, line)?;
                self.server = Some(((ServerNetwork { network, nopool }, a.s(1).to_owned()), line));
            }
            "server-ipv6" => {
                a.count(1, 1, "NETWORK/BITS")?;
                let net = ipv6_net(a.s(0))?;
                if net.network() != net.addr() {
                    return Err(ErrorReason::NotNetworkAddress {
                        network: a.s(0).to_owned(),
                    });
                }
                let bits = net.prefix_len();
                if !(SERVER_IPV6_MIN_NETBITS..=SERVER_IPV6_MAX_NETBITS).contains(&bits) {
                    return Err(ErrorReason::PrefixOutOfRange {
                        bits,
                        min: SERVER_IPV6_MIN_NETBITS,
                        max: SERVER_IPV6_MAX_NETBITS,
                    });
                }
                self.mark(Role::Server, name, line)?;
                self.server_ipv6 = Some(net);
            }
            "ifconfig-pool" => {
                a.count(2, 3, "START END [NETMASK]")?;
                let start = ipv4(a.s(0))?;
                let end = ipv4(a.s(1))?;
                if start > end {
                    return Err(ErrorReason::PoolRange {
                        start: a.s(0).to_owned(),
                        end: a.s(1).to_owned(),
                    });
                }
                let netmask = match a.opt(2) {
                    Some(m) => {
                        netmask_bits(m)?;
                        Some(ipv4(m)?)
                    }
                    None => None,
                };
                self.server_only.push((name.to_owned(), line));
                self.ifconfig_pool = Some((
                    IfconfigPool {
                        start,
                        end,
                        netmask,
                    },
                    line,
                ));
            }
            "push" => {
                a.count(1, 1, "\"OPTION\"")?;
                self.server_only.push((name.to_owned(), line));
                self.push.push(a.s(0).to_owned());
            }
            "client-config-dir" => {
                a.count(1, 1, "DIR")?;
                self.server_only.push((name.to_owned(), line));
                self.client_config_dir = Some(PathBuf::from(a.s(0)));
            }
            "duplicate-cn" => {
                a.count(0, 0, "")?;
                self.server_only.push((name.to_owned(), line));
                self.duplicate_cn = true;
            }
            "client-to-client" => {
                a.count(0, 0, "")?;
                self.server_only.push((name.to_owned(), line));
                self.client_to_client = true;
            }
            "max-clients" => {
                a.count(1, 1, "N")?;
                self.server_only.push((name.to_owned(), line));
                let n = u32_arg(a.s(0))?;
                if n == 0 {
                    return Err(bad(a.s(0), "a number > 0"));
                }
                self.max_clients = Some(n);
            }
            "max-routes-per-client" => {
                a.count(1, 1, "N")?;
                self.server_only.push((name.to_owned(), line));
                // Upstream raises anything below 1 to 1.
                self.max_routes_per_client = Some(u32_arg(a.s(0))?.max(1));
            }

            // Client.
            "http-proxy" => {
                a.count(2, 4, "HOST PORT [AUTHFILE|auto|auto-nct] [basic|ntlm2]")?;
                let auth = match a.opt(2) {
                    None => None,
                    Some(cred) => {
                        let credentials = match cred {
                            "auto" => ProxyCredentials::Auto,
                            "auto-nct" => ProxyCredentials::AutoNct,
                            f => ProxyCredentials::File(PathBuf::from(f)),
                        };
                        let method = match a.opt(3) {
                            None => None,
                            Some("basic") => Some(ProxyAuthMethod::Basic),
                            Some("ntlm2") => Some(ProxyAuthMethod::Ntlm2),
                            Some(v) => return Err(bad(v, "basic or ntlm2")),
                        };
                        Some(ProxyAuth {
                            credentials,
                            method,
                        })
                    }
                };
                self.client_only.push((name.to_owned(), line));
                self.http_proxy = Some(HttpProxy {
                    host: a.s(0).to_owned(),
                    port: port(a.s(1))?,
                    auth,
                });
            }
            "http-proxy-option" => {
                a.count(2, 3, "VERSION|AGENT|CUSTOM-HEADER VALUE...")?;
                self.client_only.push((name.to_owned(), line));
                let o = &mut self.http_proxy_options;
                match a.s(0) {
                    "VERSION" => {
                        a.count(2, 2, "VERSION 1.0|1.1")?;
                        match a.s(1) {
                            "1.0" | "1.1" => o.version = Some(a.s(1).to_owned()),
                            v => return Err(bad(v, "1.0 or 1.1")),
                        }
                    }
                    "AGENT" => {
                        a.count(2, 2, "AGENT STRING")?;
                        o.agent = Some(a.s(1).to_owned());
                    }
                    "CUSTOM-HEADER" | "EXT1" | "EXT2" => {
                        if o.custom_headers.len() >= MAX_CUSTOM_HTTP_HEADER {
                            return Err(ErrorReason::TooMany {
                                max: MAX_CUSTOM_HTTP_HEADER,
                            });
                        }
                        o.custom_headers.push(CustomHeader {
                            name: a.s(1).to_owned(),
                            content: a.opt(2).map(str::to_owned),
                        });
                    }
                    v => return Err(bad(v, "VERSION, AGENT, CUSTOM-HEADER, EXT1 or EXT2")),
                }
            }
            "pull-filter" => {
                a.count(2, 2, "accept|ignore|reject TEXT")?;
                let action = match a.s(0) {
                    "accept" => FilterAction::Accept,
                    "ignore" => FilterAction::Ignore,
                    "reject" => FilterAction::Reject,
                    v => return Err(bad(v, "accept, ignore or reject")),
                };
                let filters = self.pull_filters.get_or_insert_with(|| (Vec::new(), line));
                filters.0.push(PullFilter::new(action, a.s(1)));
            }
            "route-nopull" => {
                a.count(0, 0, "")?;
                self.client_only.push((name.to_owned(), line));
                self.route_nopull = true;
            }
            "connect-retry" => {
                a.count(1, 2, "SECONDS [MAX]")?;
                let initial = u32_arg(a.s(0))?;
                let max = a
                    .opt(1)
                    .map(u32_arg)
                    .transpose()?
                    .unwrap_or(DEFAULT_CONNECT_RETRY.max);
                self.client_only.push((name.to_owned(), line));
                self.connect_retry = Some(ConnectRetry { initial, max });
            }
            "connect-retry-max" => {
                a.count(1, 1, "N")?;
                self.client_only.push((name.to_owned(), line));
                self.connect_retry_max = Some(u32_arg(a.s(0))?);
            }
            "auth-nocache" => {
                a.count(0, 0, "")?;
                self.auth_nocache = true;
            }

            // Accepted without effect.
            "explicit-exit-notify" => {
                a.count(0, 1, "[N]")?;
                self.warnings
                    .push((line, name.to_owned(), WarningKind::NoEffectOverTcp));
            }
            n if NOT_IMPLEMENTED.contains(&n) => {
                self.warnings
                    .push((line, name.to_owned(), WarningKind::NotImplemented));
            }
            n if CCD_ONLY.contains(&n) => return Err(ErrorReason::OnlyInClientConfigDir),
            _ => return Err(ErrorReason::UnknownDirective),
        }
        Ok(())
    }

    /// The role the directives say this config has.
    fn role(&self, file: &str) -> Result<Role, ConfigError> {
        match (self.server_marks.is_empty(), self.client_marks.is_empty()) {
            (false, _) => Ok(Role::Server),
            (true, false) => Ok(Role::Client),
            (true, true) => Err(whole(file, ErrorReason::NoRole)),
        }
    }

    /// Validates across directives and builds the model for `role`.
    fn finish(self, file: &str, role: Role) -> Result<Parsed<Options>, ConfigError> {
        let Raw {
            server_marks: _,
            client_marks: _,
            mode_server,
            tls_server,
            tls_client,
            pull,
            proto,
            server_only,
            client_only,
            dev,
            dev_type,
            port,
            local,
            ca,
            cert,
            key,
            tls_auth,
            tls_crypt,
            key_direction,
            auth,
            data_ciphers,
            data_ciphers_fallback,
            cipher,
            compression,
            remote_cert_tls,
            verify_x509_name,
            tls_version_min,
            reneg_sec,
            reneg_bytes,
            reneg_pkts,
            hand_window,
            tls_timeout,
            tran_window,
            replay_window,
            keepalive,
            ping,
            ping_restart,
            tun_mtu,
            txqueuelen,
            mssfix,
            sndbuf,
            rcvbuf,
            tcp_nodelay,
            routes,
            routes_ipv6,
            script_security,
            up,
            down,
            persist_key,
            persist_tun,
            disable_dco,
            status,
            status_version,
            verb,
            topology_subnet,
            server,
            server_ipv6,
            ifconfig_pool,
            push,
            client_config_dir,
            duplicate_cn,
            client_to_client,
            max_clients,
            max_routes_per_client,
            remotes,
            nobind,
            http_proxy,
            http_proxy_options,
            pull_filters,
            route_nopull,
            connect_retry,
            connect_retry_max,
            auth_nocache,
            mut warnings,
        } = self;

        // Directives of the other role.
        let wrong = match role {
            Role::Server => client_only.first().map(|w| (w, Role::Client)),
            Role::Client => server_only.first().map(|w| (w, Role::Server)),
        };
        if let Some(((directive, line), owner)) = wrong {
            return Err(at(
                file,
                *line,
                directive,
                ErrorReason::WrongRole { role: owner },
            ));
        }
        let Some(((family, _), _)) = proto else {
            return Err(whole(file, ErrorReason::NoProto));
        };
        let Some((dev, dev_line)) = dev else {
            return Err(whole(file, missing("dev")));
        };
        let dev_type = match dev_type {
            Some(t) => t,
            None if dev.starts_with("tun") => DevType::Tun,
            None if dev.starts_with("tap") => DevType::Tap,
            None => {
                return Err(at(
                    file,
                    dev_line,
                    "dev",
                    bad(&dev, "a tun* or tap* name, or a dev-type line"),
                ))
            }
        };
        let ca = ca.ok_or_else(|| whole(file, missing("ca")))?;
        let cert = cert.ok_or_else(|| whole(file, missing("cert")))?;
        let key = key.ok_or_else(|| whole(file, missing("key")))?;
        let tls_wrap = match (tls_auth, tls_crypt) {
            (Some((_, la)), Some((_, lc))) => {
                let (line, directive, other, other_line) = if la > lc {
                    (la, "tls-auth", "tls-crypt", lc)
                } else {
                    (lc, "tls-crypt", "tls-auth", la)
                };
                return Err(at(file, line, directive, conflict(other, other_line)));
            }
            (Some(((src, dir), _)), None) => Some(TlsWrapConfig::Auth {
                key: src,
                direction: dir.or(key_direction).unwrap_or(KeyDirection::Bidirectional),
            }),
            (None, Some((src, _))) => Some(TlsWrapConfig::Crypt { key: src }),
            (None, None) => None,
        };
        if let Some((_, kl)) = keepalive {
            for (other, l) in [
                ("ping", ping.map(|p| p.1)),
                ("ping-restart", ping_restart.map(|p| p.1)),
            ] {
                if let Some(l) = l {
                    return Err(if l > kl {
                        at(file, l, other, conflict("keepalive", kl))
                    } else {
                        at(file, kl, "keepalive", conflict(other, l))
                    });
                }
            }
        }

        let common = CommonOptions {
            dev,
            dev_type,
            family,
            port: port.unwrap_or(DEFAULT_PORT),
            local,
            ca,
            cert,
            key,
            tls_wrap,
            auth: auth.unwrap_or(Digest::Sha1),
            data_ciphers: data_ciphers.unwrap_or_else(DataCiphers::default_2_6),
            data_ciphers_fallback,
            cipher,
            compression,
            remote_cert_tls,
            verify_x509_name,
            tls_version_min,
            reneg_sec,
            reneg_bytes,
            reneg_pkts,
            hand_window,
            tls_timeout,
            tran_window,
            replay_window,
            keepalive: keepalive.map(|k| k.0),
            ping: ping.map(|p| p.0),
            ping_restart: ping_restart.map(|p| p.0),
            tun_mtu,
            txqueuelen,
            mssfix,
            sndbuf,
            rcvbuf,
            tcp_nodelay,
            routes,
            routes_ipv6,
            script_security: script_security.unwrap_or(1),
            up,
            down,
            persist_key,
            persist_tun,
            disable_dco,
            status,
            status_version: status_version.unwrap_or(1),
            verb: verb.unwrap_or(1),
        };

        let config = match role {
            Role::Server => {
                if let Some((_, line)) = &pull_filters {
                    warnings.push((
                        *line,
                        "pull-filter".to_owned(),
                        WarningKind::IgnoredForRole { role },
                    ));
                }
                let implied = server.is_some() || server_ipv6.is_some();
                if mode_server.is_none() && !implied {
                    return Err(whole(file, missing("mode server")));
                }
                if tls_server.is_none() && !implied {
                    return Err(whole(file, missing("tls-server")));
                }
                if !implied {
                    return Err(whole(file, missing("server or server-ipv6")));
                }
                let ipv4_pool = server.as_ref().map(|s| s.1).or(ifconfig_pool.map(|p| p.1));
                if let (DevType::Tun, false, Some(line)) = (dev_type, topology_subnet, ipv4_pool) {
                    let directive = if server.is_some() {
                        "server"
                    } else {
                        "ifconfig-pool"
                    };
                    return Err(at(
                        file,
                        line,
                        directive,
                        ErrorReason::UnsupportedTopology {
                            topology: "net30 (upstream's default without 'topology subnet')"
                                .to_owned(),
                        },
                    ));
                }
                if let Some(((net, _), line)) = &server {
                    let max = match dev_type {
                        DevType::Tun => SERVER_MAX_NETBITS_TUN,
                        DevType::Tap => SERVER_MAX_NETBITS_TAP,
                    };
                    let bits = net.network.prefix_len();
                    if !(IFCONFIG_POOL_MIN_NETBITS..=max).contains(&bits) {
                        return Err(at(
                            file,
                            *line,
                            "server",
                            ErrorReason::PrefixOutOfRange {
                                bits,
                                min: IFCONFIG_POOL_MIN_NETBITS,
                                max,
                            },
                        ));
                    }
                }
                Options::Server(ServerOptions {
                    common,
                    server: server.map(|s| s.0 .0),
                    server_ipv6,
                    ifconfig_pool: ifconfig_pool.map(|p| p.0),
                    push,
                    client_config_dir,
                    duplicate_cn,
                    client_to_client,
                    max_clients: max_clients.unwrap_or(DEFAULT_MAX_CLIENTS),
                    max_routes_per_client: max_routes_per_client
                        .unwrap_or(DEFAULT_MAX_ROUTES_PER_CLIENT),
                })
            }
            Role::Client => {
                if tls_client.is_none() {
                    return Err(whole(file, missing("tls-client")));
                }
                if pull.is_none() {
                    return Err(whole(file, missing("pull")));
                }
                if remotes.is_empty() {
                    return Err(whole(file, missing("remote")));
                }
                let default_port = common.port;
                let remotes = remotes
                    .into_iter()
                    .map(|(host, p, f)| Remote {
                        host,
                        port: p.unwrap_or(default_port),
                        family: f.unwrap_or(family),
                    })
                    .collect();
                Options::Client(ClientOptions {
                    common,
                    remotes,
                    nobind,
                    http_proxy,
                    http_proxy_options,
                    pull_filters: pull_filters.map(|p| p.0).unwrap_or_default(),
                    route_nopull,
                    connect_retry: connect_retry.unwrap_or(DEFAULT_CONNECT_RETRY),
                    connect_retry_max,
                    auth_nocache,
                })
            }
        };
        warnings.sort_by_key(|w| w.0);
        let warnings = warnings
            .into_iter()
            .map(|(line, directive, kind)| Warning {
                file: file.to_owned(),
                line,
                directive,
                kind,
            })
            .collect();
        Ok(Parsed { config, warnings })
    }
}

fn missing(directive: &'static str) -> ErrorReason {
    ErrorReason::MissingDirective { directive }
}

fn conflict(other: &str, other_line: usize) -> ErrorReason {
    ErrorReason::Conflict {
        other: other.to_owned(),
        other_line,
    }
}

/// The arguments of one directive.
pub(super) struct Args<'a>(pub(super) &'a Directive);

impl Args<'_> {
    /// Checks the argument count.
    pub(super) fn count(
        &self,
        min: usize,
        max: usize,
        expected: &'static str,
    ) -> Result<(), ErrorReason> {
        let n = self.0.args.len();
        if n < min {
            return Err(ErrorReason::MissingArgument { expected });
        }
        if n > max {
            return Err(ErrorReason::TooManyArguments { max });
        }
        Ok(())
    }

    /// Argument `i` (after [`Args::count`] made sure it exists; else empty).
    pub(super) fn s(&self, i: usize) -> &str {
        self.0.args.get(i).map_or("", String::as_str)
    }

    /// Argument `i`, if given.
    pub(super) fn opt(&self, i: usize) -> Option<&str> {
        self.0.args.get(i).map(String::as_str)
    }
}

pub(super) fn bad(value: &str, expected: &'static str) -> ErrorReason {
    ErrorReason::BadArgument {
        value: value.to_owned(),
        expected,
    }
}

fn path_source(s: &str) -> Source {
    Source::Path(PathBuf::from(s))
}

fn parse_proto(s: &str) -> Result<(Family, Option<Role>), ErrorReason> {
    let (base, role) = if let Some(b) = s.strip_suffix("-server") {
        (b, Some(Role::Server))
    } else if let Some(b) = s.strip_suffix("-client") {
        (b, Some(Role::Client))
    } else {
        (s, None)
    };
    let family = match base {
        "tcp" => Family::Any,
        "tcp4" => Family::V4,
        "tcp6" => Family::V6,
        "udp" | "udp4" | "udp6" => {
            return Err(ErrorReason::TcpOnly {
                proto: s.to_owned(),
            })
        }
        _ => return Err(bad(s, "tcp-server, tcp-client, tcp4-*, tcp6-* or tcp")),
    };
    Ok((family, role))
}

fn key_direction(s: &str) -> Result<KeyDirection, ErrorReason> {
    KeyDirection::from_arg(s).ok_or_else(|| bad(s, "0 or 1"))
}

fn u32_arg(s: &str) -> Result<u32, ErrorReason> {
    s.parse().map_err(|_| bad(s, "a non-negative number"))
}

fn u64_arg(s: &str) -> Result<u64, ErrorReason> {
    s.parse().map_err(|_| bad(s, "a non-negative number"))
}

fn small(s: &str, max: u8, expected: &'static str) -> Result<u8, ErrorReason> {
    match s.parse::<u8>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(bad(s, expected)),
    }
}

fn port(s: &str) -> Result<u16, ErrorReason> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(s, "a port 1-65535")),
    }
}

pub(super) fn ipv4(s: &str) -> Result<Ipv4Addr, ErrorReason> {
    Ipv4Addr::from_str(s).map_err(|_| bad(s, "an IPv4 address"))
}

pub(super) fn ipv6(s: &str) -> Result<Ipv6Addr, ErrorReason> {
    Ipv6Addr::from_str(s).map_err(|_| bad(s, "an IPv6 address"))
}

/// `ADDR/BITS` (the address may have host bits set).
pub(super) fn ipv6_net(s: &str) -> Result<Ipv6Net, ErrorReason> {
    Ipv6Net::from_str(s).map_err(|_| bad(s, "an IPv6 network ADDR/BITS"))
}

/// The prefix length of a dotted netmask.
pub(super) fn netmask_bits(s: &str) -> Result<u8, ErrorReason> {
    let mask = ipv4(s).map_err(|_| bad(s, "a dotted netmask"))?;
    let m = u32::from(mask);
    if m.leading_ones() + m.trailing_zeros() != 32 {
        return Err(ErrorReason::BadNetmask { mask: s.to_owned() });
    }
    // At most 32, so it fits.
    Ok(u8::try_from(m.leading_ones()).unwrap_or(32))
}

/// `NETWORK NETMASK` as a network; host bits are an error.
pub(super) fn ipv4_net(net: &str, mask: &str) -> Result<Ipv4Net, ErrorReason> {
    let addr = ipv4(net)?;
    let bits = netmask_bits(mask)?;
    let n = Ipv4Net::new(addr, bits).map_err(|_| ErrorReason::BadNetmask {
        mask: mask.to_owned(),
    })?;
    if n.network() != addr {
        return Err(ErrorReason::NotNetworkAddress {
            network: format!("{net} {mask}"),
        });
    }
    Ok(n)
}
