//! The router's TOML config file, parsed and checked into [`RouterConfig`]. The format is in
//! the [crate docs](crate).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use netio::ingress::{Deadlines, ProxyMode};
use netio::report::quote;
use protocol::http::route::{check_namespace, RouteError, RouteValue};
use serde::Deserialize;

use crate::access::{Action, AlwaysAllowed, Rule, Source};
use crate::client_hello::ServerName;
use crate::policy::{Policy, Target, ROUTING_HEADERS};

/// Default bound on connecting upstream (GEP-30's apiserver-proxy uses 5 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default idle timeout of an open tunnel: Envoy's 5 min stream idle timeout, which the
/// Istio ingress gateway applied to these tunnels. The OpenVPN tunnels through the router
/// carry keepalive pings every 10 s, so only dead or abandoned tunnels reach it; a long
/// `kubectl logs -f` through the apiserver route that stays silent longer than this is cut,
/// as it was behind Istio.
pub const DEFAULT_IDLE_TIMEOUT: Duration = netio::relay::DEFAULT_IDLE_TIMEOUT;
/// Default bound on connections served at once, all listeners together.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
/// Default bound on connections whose CONNECT head has not been routed yet (the PROXY header
/// and the head still arriving), all listeners together. A newcomer beyond it evicts the
/// oldest; so silent connections hold at most this many of the `max_connections`.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// Smallest `[relay] buffer_size`: one page (the kernel's smallest pipe).
pub const MIN_RELAY_BUFFER_SIZE: usize = 4096;

/// Default interval of `--config-dir`'s poll for changed files (`[watch] poll_ms`).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest `[watch] poll_ms` taken; a smaller value is raised to it.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Everything the config file says, checked.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// The listeners (fixed for the life of the process).
    pub listeners: Vec<ListenerConfig>,
    /// Deadlines of each accepted connection.
    pub deadlines: Deadlines,
    /// Bound on connecting upstream.
    pub connect_timeout: Duration,
    /// An open tunnel with no bytes either way for this long is closed (both sides shut).
    pub idle_timeout: Duration,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Connections before their head is routed, at most (within `max_connections`); a
    /// newcomer beyond it evicts the oldest.
    pub max_pending: usize,
    /// Where `GET /metrics` is served (plain HTTP), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Bytes buffered per direction of a tunnel: the pipe size `netio::relay::relay_tcp`
    /// asks for (`[relay] buffer_size`).
    pub relay_buffer_size: usize,
    /// How often `--config-dir` is read for changes (`[watch] poll_ms`; changes apply at
    /// the next poll).
    pub poll_interval: Duration,
    /// Routes and allow-lists (replaced as a whole on reload).
    pub policy: Policy,
}

/// One listening socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Where it listens.
    pub address: SocketAddr,
    /// The routing header names it honours, in their canonical spelling.
    pub headers: Vec<&'static str>,
    /// Its PROXY protocol mode.
    pub proxy: ProxyMode,
    /// What it serves after the PROXY stage.
    pub kind: ListenerKind,
}

/// What a listener serves after its PROXY stage (`kind` in the file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// HTTP CONNECT routed by a routing header to a `[[route]]` (`"connect"`, the default).
    #[default]
    Connect,
    /// TLS passed through, routed by the ClientHello's server name to an `[[sni_route]]`
    /// (`"sni"`; [`crate::sni`]).
    Sni,
}

impl RouterConfig {
    /// Reads and checks `path`; a refusal names the file and the line at fault
    /// ([`ConfigError::Toml`], [`ConfigError::Invalid`]).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = netio::volume::read_file_bounded(path, MAX_FILE_BYTES).map_err(read)?;
        let text = String::from_utf8(bytes).map_err(|e| {
            read(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.utf8_error(),
            ))
        })?;
        Self::parse_from(&text, path)
    }

    /// Parses and checks the text of a config file; a refused value is the bare refusal
    /// (its line: [`ConfigError::line_in`]).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_text(text)
    }

    /// Whether `new` changes a setting fixed at start (listeners, deadlines, timeouts,
    /// limits, the metrics address, the relay's buffer size): those apply after a restart.
    pub(crate) fn restart_needed(&self, new: &RouterConfig) -> bool {
        new.listeners != self.listeners
            || new.deadlines != self.deadlines
            || new.connect_timeout != self.connect_timeout
            || new.idle_timeout != self.idle_timeout
            || new.max_connections != self.max_connections
            || new.max_pending != self.max_pending
            || new.metrics_listen != self.metrics_listen
            || new.relay_buffer_size != self.relay_buffer_size
    }

    /// Parses and checks `text`, read from `path`; the error names the file and the line
    /// at fault.
    fn parse_from(text: &str, path: &Path) -> Result<Self, ConfigError> {
        Self::parse_text(text).map_err(|e| match e {
            ConfigError::Toml { line, source, .. } => ConfigError::Toml {
                path: Some(path.to_owned()),
                line,
                source,
            },
            e => ConfigError::Invalid {
                path: Some(path.to_owned()),
                line: e.line_in(text),
                source: Box::new(e),
            },
        })
    }

    /// Parses and checks `text`; the caller names the file (a refused value's line:
    /// [`ConfigError::line_in`]).
    pub(crate) fn parse_text(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = from_toml(text)?;
        raw.check()
    }
}

/// The most bytes a config file (`--config`, each `--config-dir` file) may have; a larger one
/// is refused unread, with its size. A ConfigMap or Secret holds at most 1 MiB in all (the API
/// server's limit), so no file of a volume is larger, and a shoot's file is about a KiB (the
/// examples'): a larger file is a mistake or an attack, and reading it whole would cost memory
/// at every change.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The TOML parser's error, printed with each line cut to its first
/// [`netio::report::QUOTE_CHARS`] characters: the parser quotes the line at fault, which may be
/// the whole file.
#[derive(Debug)]
pub struct TomlError(pub toml::de::Error);

impl TomlError {
    /// The parser's message, without the line it quotes.
    pub fn message(&self) -> &str {
        self.0.message()
    }
}

impl std::fmt::Display for TomlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&netio::report::cut_lines(&self.0.to_string()))
    }
}

impl std::error::Error for TomlError {}

/// The 1-based line of the first (or `last`) occurrence of `"value"` in `text`.
pub(crate) fn line_of_value(text: &str, value: &str, last: bool) -> Option<usize> {
    let quoted = format!("\"{value}\"");
    let at = if last {
        text.rfind(&quoted)
    } else {
        text.find(&quoted)
    }?;
    Some(line_of(text, at))
}

/// [`line_of_value`] ignoring ASCII case (server names are compared lower-cased).
pub(crate) fn line_of_value_caseless(text: &str, value: &str, last: bool) -> Option<usize> {
    line_of_value(
        &text.to_ascii_lowercase(),
        &value.to_ascii_lowercase(),
        last,
    )
}

/// The 1-based line of the first line that sets `key` (`key =` at the line's start).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}

/// `text` read as TOML into `T` (a whole config or a shoot file's routes): a syntax or type
/// error names its line; the caller names the file.
fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|source| ConfigError::Toml {
        path: None,
        line: source.span().map(|span| line_of(text, span.start)),
        source: Box::new(TomlError(source)),
    })
}

/// The 1-based line of byte offset `at` in `text`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    let before = text.get(..at).unwrap_or(text);
    before.bytes().filter(|&b| b == b'\n').count() + 1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    always_allowed: Vec<String>,
    #[serde(default)]
    always_allowed_peers: Vec<String>,
    max_connections: Option<usize>,
    max_pending: Option<usize>,
    metrics_listen: Option<String>,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    relay: RawRelay,
    #[serde(default)]
    watch: RawWatch,
    #[serde(default, rename = "listener")]
    listeners: Vec<RawListener>,
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
    #[serde(default, rename = "sni_route")]
    sni_routes: Vec<RawSniRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    proxy_header_ms: Option<u64>,
    header_ms: Option<u64>,
    connect_ms: Option<u64>,
    idle_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
    buffer_size: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWatch {
    poll_ms: Option<u64>,
}

/// A shoot file of `--config-dir`: its `[[route]]` tables and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoutes {
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
    #[serde(default, rename = "sni_route")]
    sni_routes: Vec<RawSniRoute>,
}

/// One shoot file's routes (`--config-dir`): CONNECT routes by value, SNI routes by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShootRoutes {
    pub(crate) routes: HashMap<RouteValue, Target>,
    pub(crate) sni_routes: HashMap<ServerName, Target>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    address: String,
    #[serde(default)]
    kind: ListenerKind,
    #[serde(default)]
    headers: Vec<String>,
    #[serde(default)]
    proxy_protocol: RawProxyMode,
    #[serde(default)]
    trusted_proxies: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawProxyMode {
    #[default]
    Off,
    Required,
    #[serde(rename = "from-trusted")]
    FromTrusted,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    value: String,
    upstream: String,
    allow: Option<Vec<String>>,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    action: RawAction,
    from: Vec<String>,
    #[serde(default)]
    source: RawSource,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawAction {
    Allow,
    Deny,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawSource {
    #[default]
    Proxy,
    Peer,
}

impl RawRoute {
    /// The route's rules: its `[[route.rule]]` tables in order, or `allow = [...]` as one
    /// allow rule judged by the client address; never both.
    fn rules(&self) -> Result<Vec<Rule>, ConfigError> {
        rules(self.allow.as_deref(), &self.rules, &self.value)
    }
}

/// A route's rules (CONNECT or SNI): its rule tables in order, or `allow = [...]` as one
/// allow rule judged by the client address; never both (`route` names it in the error).
pub(crate) fn rules(
    allow: Option<&[String]>,
    raw_rules: &[RawRule],
    route: &str,
) -> Result<Vec<Rule>, ConfigError> {
    match (allow, raw_rules.is_empty()) {
        (Some(_), false) => Err(ConfigError::AllowAndRules {
            value: route.to_owned(),
        }),
        (Some(allow), true) => Ok(vec![Rule::allow(cidrs(allow)?)]),
        (None, _) => raw_rules
            .iter()
            .map(|raw| {
                Ok(Rule {
                    action: match raw.action {
                        RawAction::Allow => Action::Allow,
                        RawAction::Deny => Action::Deny,
                    },
                    from: cidrs(&raw.from)?,
                    source: match raw.source {
                        RawSource::Proxy => Source::Proxy,
                        RawSource::Peer => Source::Peer,
                    },
                })
            })
            .collect(),
    }
}

impl RawConfig {
    fn check(self) -> Result<RouterConfig, ConfigError> {
        if self.listeners.is_empty() {
            return Err(ConfigError::NoListener);
        }
        let listeners = self
            .listeners
            .into_iter()
            .map(RawListener::check)
            .collect::<Result<Vec<_>, _>>()?;
        let routes = check_routes(self.routes)?;
        let sni_routes = check_sni_routes(self.sni_routes)?;
        let metrics_listen = match self.metrics_listen {
            None => None,
            Some(address) => Some(
                address
                    .parse()
                    .map_err(|_| ConfigError::Address { address })?,
            ),
        };
        let relay_buffer_size = self
            .relay
            .buffer_size
            .unwrap_or(netio::relay::DEFAULT_BUFFER_SIZE);
        if !(MIN_RELAY_BUFFER_SIZE..=netio::relay::MAX_PIPE_SIZE).contains(&relay_buffer_size) {
            return Err(ConfigError::RelayBufferSize {
                size: relay_buffer_size,
            });
        }
        // A zero limit or timeout would refuse or cut every connection: a mistake, refused.
        for (key, value) in [
            ("max_connections", self.max_connections.map(|n| n as u64)),
            ("max_pending", self.max_pending.map(|n| n as u64)),
            ("proxy_header_ms", self.timeouts.proxy_header_ms),
            ("header_ms", self.timeouts.header_ms),
            ("connect_ms", self.timeouts.connect_ms),
            ("idle_ms", self.timeouts.idle_ms),
        ] {
            if value == Some(0) {
                return Err(ConfigError::Zero { key });
            }
        }
        let ms = |v: Option<u64>, d: Duration| v.map_or(d, Duration::from_millis);
        let defaults = Deadlines::default();
        Ok(RouterConfig {
            listeners,
            deadlines: Deadlines {
                proxy_header: ms(self.timeouts.proxy_header_ms, defaults.proxy_header),
                header: ms(self.timeouts.header_ms, defaults.header),
            },
            connect_timeout: ms(self.timeouts.connect_ms, DEFAULT_CONNECT_TIMEOUT),
            idle_timeout: ms(self.timeouts.idle_ms, DEFAULT_IDLE_TIMEOUT),
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            max_pending: self.max_pending.unwrap_or(DEFAULT_MAX_PENDING),
            metrics_listen,
            relay_buffer_size,
            poll_interval: ms(self.watch.poll_ms, DEFAULT_POLL_INTERVAL).max(MIN_POLL_INTERVAL),
            policy: Policy {
                routes,
                sni_routes,
                always_allowed: AlwaysAllowed {
                    proxy: cidrs(&self.always_allowed)?,
                    peer: cidrs(&self.always_allowed_peers)?,
                },
            },
        })
    }
}

/// Checks that `upstream` is `host:port` (a name or address, a port number), as every route
/// table's `upstream` must be.
pub(crate) fn check_upstream(upstream: &str) -> Result<(), ConfigError> {
    if upstream
        .rsplit_once(':')
        .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    {
        return Err(ConfigError::Upstream {
            upstream: upstream.to_owned(),
        });
    }
    Ok(())
}

/// Checks `[[route]]` tables: valid values, `host:port` upstreams, rules, no value twice.
fn check_routes(raw_routes: Vec<RawRoute>) -> Result<HashMap<RouteValue, Target>, ConfigError> {
    let mut routes = HashMap::new();
    for raw in raw_routes {
        let value = RouteValue::parse(&raw.value).map_err(|source| ConfigError::Route {
            value: raw.value.clone(),
            source,
        })?;
        check_upstream(&raw.upstream)?;
        let rules = raw.rules()?;
        let target = Target {
            upstream: raw.upstream,
            rules,
            shoot: None,
        };
        if routes.insert(value, target).is_some() {
            return Err(ConfigError::DuplicateRoute { value: raw.value });
        }
    }
    Ok(routes)
}

impl RawListener {
    fn check(self) -> Result<ListenerConfig, ConfigError> {
        let address = self.address.parse().map_err(|_| ConfigError::Address {
            address: self.address.clone(),
        })?;
        match self.kind {
            ListenerKind::Connect if self.headers.is_empty() => {
                return Err(ConfigError::NoHeaders { address });
            }
            ListenerKind::Sni if !self.headers.is_empty() => {
                return Err(ConfigError::SniHeaders { address });
            }
            _ => {}
        }
        let mut headers = Vec::new();
        for name in &self.headers {
            let Some(known) = ROUTING_HEADERS
                .iter()
                .find(|k| k.eq_ignore_ascii_case(name))
            else {
                return Err(ConfigError::Header { name: name.clone() });
            };
            if !headers.contains(known) {
                headers.push(*known);
            }
        }
        let trusted = cidrs(&self.trusted_proxies)?;
        let proxy = match self.proxy_protocol {
            RawProxyMode::Off if trusted.is_empty() => ProxyMode::Off,
            RawProxyMode::Required if !trusted.is_empty() => ProxyMode::Required { trusted },
            RawProxyMode::FromTrusted if !trusted.is_empty() => ProxyMode::FromTrusted { trusted },
            _ => return Err(ConfigError::ProxyMode { address }),
        };
        Ok(ListenerConfig {
            address,
            headers,
            proxy,
            kind: self.kind,
        })
    }
}

/// One `[[sni_route]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSniRoute {
    server_names: Vec<String>,
    upstream: String,
    allow: Option<Vec<String>>,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
    /// The shoot whose series count the route (a namespace such as `shoot--p--a`); in a
    /// shoot's file of `--config-dir`, that file's shoot whether given or not.
    shoot: Option<String>,
}

/// Checks the `[[sni_route]]` tables (for `kind = "sni"` listeners, `crate::sni`): every name a DNS host name, no name twice, the
/// upstream `host:port`, the rules as for CONNECT routes, the shoot a namespace.
fn check_sni_routes(raw: Vec<RawSniRoute>) -> Result<HashMap<ServerName, Target>, ConfigError> {
    let mut routes = HashMap::new();
    for route in raw {
        let Some(first) = route.server_names.first() else {
            return Err(ConfigError::NoServerNames {
                upstream: route.upstream,
            });
        };
        check_upstream(&route.upstream)?;
        if let Some(shoot) = &route.shoot {
            check_namespace(shoot).map_err(|source| ConfigError::SniShoot {
                shoot: shoot.clone(),
                source,
            })?;
        }
        let target = Target {
            rules: rules(route.allow.as_deref(), &route.rules, first)?,
            upstream: route.upstream,
            shoot: route.shoot,
        };
        for name in &route.server_names {
            let key =
                ServerName::parse(name.as_bytes()).map_err(|source| ConfigError::ServerName {
                    name: name.clone(),
                    source,
                })?;
            if routes.contains_key(&key) {
                return Err(ConfigError::DuplicateServerName {
                    name: key.to_string(),
                });
            }
            routes.insert(key, target.clone());
        }
    }
    Ok(routes)
}

/// Parses and checks the `[[route]]` and `[[sni_route]]` tables of a shoot file
/// (`--config-dir`); anything else in it is an error. The caller names the file.
pub(crate) fn parse_routes(text: &str) -> Result<ShootRoutes, ConfigError> {
    let raw: RawRoutes = from_toml(text)?;
    Ok(ShootRoutes {
        routes: check_routes(raw.routes)?,
        sni_routes: check_sni_routes(raw.sni_routes)?,
    })
}

/// Parses CIDRs; a bare address is a host network (/32 or /128). An IPv4-mapped network
/// (`::ffff:203.0.113.0/120`) is its IPv4 network (`203.0.113.0/24`,
/// `netio::ingress::canonical_net`): clients and peers are compared by their IPv4 address, so
/// as written it could never match. Every list goes through here: rules, `allow`,
/// `always_allowed`, `always_allowed_peers`, `trusted_proxies`.
pub(crate) fn cidrs(list: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    list.iter()
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(|n| netio::ingress::canonical_net(n.trunc()))
                .map_err(|_| ConfigError::Cidr { cidr: s.clone() })
        })
        .collect()
}

/// Why a config file is refused (the whole file; nothing of it is applied).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read router config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, or a field is unknown or of the wrong type.
    #[error("router config{}: not valid TOML for the router", location(.path, .line))]
    Toml {
        /// The file, when the text came from one ([`RouterConfig::load`]).
        path: Option<PathBuf>,
        /// The line the parser points at (1-based), when it points at one.
        line: Option<usize>,
        /// What the parser says (with line, column and the line's text, cut: [`TomlError`]);
        /// boxed, as it is several times the size of the other variants.
        #[source]
        source: Box<TomlError>,
    },
    /// The file is valid TOML, but a value in it is refused (the cause says which).
    #[error("router config{}", location(.path, .line))]
    Invalid {
        /// The file, when the text came from one ([`RouterConfig::load`]).
        path: Option<PathBuf>,
        /// The line quoting the value refused, when one does.
        line: Option<usize>,
        /// What is refused.
        #[source]
        source: Box<ConfigError>,
    },
    /// `[relay] buffer_size` outside one page ..= `netio::relay::MAX_PIPE_SIZE`.
    #[error("[relay] buffer_size {size} is outside 4096..=1048576")]
    RelayBufferSize {
        /// The size given.
        size: usize,
    },
    /// No `[[listener]]`.
    #[error("no [[listener]]")]
    NoListener,
    /// A limit or timeout of 0.
    #[error("{key} must be at least 1")]
    Zero {
        /// The key.
        key: &'static str,
    },
    /// A listener address is not `ip:port`.
    #[error("listener address {} is not ip:port", quote(address))]
    Address {
        /// The value.
        address: String,
    },
    /// A CONNECT listener without `headers`.
    #[error("listener {address}: a CONNECT listener routes by headers; name one or more of X-Gardener-Destination, Reversed-VPN, X-Gardener-API-Route")]
    NoHeaders {
        /// The listener.
        address: SocketAddr,
    },
    /// A header name is not one of the routing headers.
    #[error(
        "{} is not a routing header (X-Gardener-Destination, Reversed-VPN, X-Gardener-API-Route)",
        quote(name)
    )]
    Header {
        /// The value.
        name: String,
    },
    /// `proxy_protocol = "required"` or `"from-trusted"` without `trusted_proxies`, or trusted
    /// proxies with `"off"`.
    #[error("listener {address}: proxy_protocol \"required\" and \"from-trusted\" need trusted_proxies, \"off\" takes none")]
    ProxyMode {
        /// The listener.
        address: SocketAddr,
    },
    /// A CIDR does not parse.
    #[error("{} is not a CIDR", quote(cidr))]
    Cidr {
        /// The value.
        cidr: String,
    },
    /// A route's value is not a valid routing value.
    #[error("route {}", quote(value))]
    Route {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: RouteError,
    },
    /// A route's upstream is not `host:port`.
    #[error("upstream {} is not host:port", quote(upstream))]
    Upstream {
        /// The value.
        upstream: String,
    },
    /// A route with both `allow = [...]` and `[[route.rule]]` tables.
    #[error(
        "route {} has both allow and [[route.rule]]; write the allow list as a rule",
        quote(value)
    )]
    AllowAndRules {
        /// The route's value.
        value: String,
    },
    /// Two routes with the same value.
    #[error("route {} appears twice", quote(value))]
    DuplicateRoute {
        /// The value.
        value: String,
    },
    /// A `kind = "sni"` listener with `headers` (it routes by the TLS server name).
    #[error("listener {address}: kind \"sni\" routes by the TLS server name and takes no headers")]
    SniHeaders {
        /// The listener.
        address: SocketAddr,
    },
    /// An `[[sni_route]]` server name that is not a DNS host name.
    #[error("sni_route server name {}", quote(name))]
    ServerName {
        /// The value.
        name: String,
        /// Why.
        #[source]
        source: crate::client_hello::NameError,
    },
    /// An `[[sni_route]]` without server names.
    #[error("an sni_route to {} has no server_names", quote(upstream))]
    NoServerNames {
        /// Its upstream.
        upstream: String,
    },
    /// A server name in two `[[sni_route]]` tables (or twice in one).
    #[error("sni_route server name {} appears twice", quote(name))]
    DuplicateServerName {
        /// The name, lower-cased.
        name: String,
    },
    /// An `[[sni_route]]`'s `shoot` that is not a namespace.
    #[error("sni_route shoot {} is not a namespace", quote(shoot))]
    SniShoot {
        /// The value.
        shoot: String,
        /// Why.
        #[source]
        source: protocol::http::route::RouteError,
    },
}

impl ConfigError {
    /// The line of `text` this refusal points at: the parser's, or the first line quoting the
    /// value refused (the last for a value given twice); `None` when no line holds it.
    pub fn line_in(&self, text: &str) -> Option<usize> {
        match self {
            ConfigError::Toml { line, .. } | ConfigError::Invalid { line, .. } => *line,
            ConfigError::Cidr { cidr } => line_of_value(text, cidr, false),
            ConfigError::Route { value, .. } | ConfigError::AllowAndRules { value } => {
                line_of_value(text, value, false)
            }
            ConfigError::Upstream { upstream } | ConfigError::NoServerNames { upstream } => {
                line_of_value(text, upstream, false)
            }
            ConfigError::SniShoot { shoot, .. } => line_of_value(text, shoot, false),
            ConfigError::DuplicateRoute { value } => line_of_value(text, value, true),
            ConfigError::Address { address } => line_of_value(text, address, false),
            ConfigError::ProxyMode { address }
            | ConfigError::SniHeaders { address }
            | ConfigError::NoHeaders { address } => {
                line_of_value(text, &address.to_string(), false)
            }
            ConfigError::Header { name } => line_of_value(text, name, false),
            ConfigError::ServerName { name, .. } => line_of_value(text, name, false),
            ConfigError::DuplicateServerName { name } => line_of_value_caseless(text, name, true),
            ConfigError::RelayBufferSize { .. } => line_of_key(text, "buffer_size"),
            ConfigError::Zero { key } => line_of_key(text, key),
            ConfigError::Read { .. } | ConfigError::NoListener => None,
        }
    }
}

/// ` PATH, line N` (the parts known) for [`ConfigError::Toml`] and [`ConfigError::Invalid`].
fn location(path: &Option<PathBuf>, line: &Option<usize>) -> String {
    let mut out = String::new();
    if let Some(path) = path {
        let _ = write!(out, " {}", path.display());
    }
    if let Some(line) = line {
        let _ = write!(out, ", line {line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_parses() {
        let text = include_str!("../examples/router.toml");
        let config = RouterConfig::parse(text).unwrap();
        assert_eq!(config.listeners.len(), 3);
        assert_eq!(config.listeners[2].kind, ListenerKind::Sni);
        assert_eq!(config.policy.sni_routes.len(), 2);
        assert_eq!(config.policy.routes.len(), 3);
        assert!(matches!(
            config.listeners[1].proxy,
            ProxyMode::FromTrusted { .. }
        ));
        let kapi =
            RouteValue::parse("outbound|443||kube-apiserver.shoot--dev--a.svc.cluster.local")
                .unwrap();
        let rules = &config.policy.routes[&kapi].rules;
        let actions: Vec<_> = rules.iter().map(|r| (r.action, r.source)).collect();
        assert_eq!(
            actions,
            [
                (Action::Deny, Source::Proxy),
                (Action::Allow, Source::Proxy),
                (Action::Allow, Source::Peer),
            ]
        );
        assert_eq!(config.policy.always_allowed.peer.len(), 1);
        assert_eq!(config.listeners[1].headers, ["Reversed-VPN"]);
        assert_eq!(config.relay_buffer_size, 32 * 1024);
    }

    #[test]
    fn proxy_modes() {
        let listener = |mode: &str| {
            format!("[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n{mode}")
        };
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        for (mode, want) in [
            ("", ProxyMode::Off),
            ("proxy_protocol = \"off\"\n", ProxyMode::Off),
            (
                "proxy_protocol = \"required\"\ntrusted_proxies = [\"10.1.2.3/8\"]\n",
                ProxyMode::Required {
                    trusted: trusted.clone(),
                },
            ),
            (
                "proxy_protocol = \"from-trusted\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
                ProxyMode::FromTrusted {
                    trusted: trusted.clone(),
                },
            ),
        ] {
            let config = RouterConfig::parse(&listener(mode)).unwrap();
            assert_eq!(config.listeners[0].proxy, want, "{mode}");
        }
    }

    #[test]
    fn rules_in_order_and_allow_as_one_rule() {
        let text = format!(
            "always_allowed = [\"10.250.0.0/16\"]\nalways_allowed_peers = [\"10.96.0.0/16\"]\n\
             [[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n\
             [[route]]\nvalue = \"{a}\"\nupstream = \"x:1\"\n\
             [[route.rule]]\naction = \"deny\"\nfrom = [\"192.0.2.9\"]\n\
             [[route.rule]]\naction = \"allow\"\nfrom = [\"192.0.2.0/24\", \"2001:db8::/32\"]\nsource = \"peer\"\n\
             [[route]]\nvalue = \"{b}\"\nupstream = \"x:1\"\nallow = [\"192.0.2.0/24\"]\n\
             [[route]]\nvalue = \"{c}\"\nupstream = \"x:1\"\n",
            a = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local",
            b = "outbound|1194||vpn-seed-server.shoot--p--b.svc.cluster.local",
            c = "outbound|1194||vpn-seed-server.shoot--p--c.svc.cluster.local",
        );
        let config = RouterConfig::parse(&text).unwrap();
        let rules = |ns: &str| {
            let v = format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local");
            config.policy.routes[&RouteValue::parse(&v).unwrap()]
                .rules
                .clone()
        };
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            rules("shoot--p--a"),
            [
                Rule {
                    action: Action::Deny,
                    from: vec![net("192.0.2.9/32")],
                    source: Source::Proxy,
                },
                Rule {
                    action: Action::Allow,
                    from: vec![net("192.0.2.0/24"), net("2001:db8::/32")],
                    source: Source::Peer,
                },
            ]
        );
        assert_eq!(
            rules("shoot--p--b"),
            [Rule::allow(vec![net("192.0.2.0/24")])]
        );
        assert!(rules("shoot--p--c").is_empty());
        assert_eq!(
            config.policy.always_allowed,
            AlwaysAllowed {
                proxy: vec![net("10.250.0.0/16")],
                peer: vec![net("10.96.0.0/16")],
            }
        );

        let route = "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n\
             [[route]]\nvalue = \"outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local\"\n\
             upstream = \"x:1\"\n";
        for bad in [
            format!(
                "{route}allow = [\"10.0.0.0/8\"]\n[[route.rule]]\naction = \"allow\"\nfrom = []\n"
            ),
            format!("{route}[[route.rule]]\naction = \"permit\"\nfrom = []\n"),
            format!("{route}[[route.rule]]\naction = \"allow\"\nfrom = [\"10.0.0.0/33\"]\n"),
            format!(
                "{route}[[route.rule]]\naction = \"allow\"\nfrom = []\nsource = \"remote_ip\"\n"
            ),
            format!("{route}[[route.rule]]\naction = \"allow\"\n"),
            format!("{route}[[route.rule]]\naction = \"allow\"\nfrom = []\ncidrs = []\n"),
            format!("always_allowed_peers = [\"x\"]\n{route}"),
        ] {
            assert!(RouterConfig::parse(&bad).is_err(), "{bad}");
        }
        assert!(matches!(
            RouterConfig::parse(&format!(
                "{route}allow = []\n[[route.rule]]\naction = \"allow\"\nfrom = []\n"
            )),
            Err(ConfigError::AllowAndRules { .. })
        ));
    }

    #[test]
    fn relay_buffer_size_defaults_and_bounds() {
        let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n";
        let config = RouterConfig::parse(listener).unwrap();
        assert_eq!(config.relay_buffer_size, netio::relay::DEFAULT_BUFFER_SIZE);
        let config =
            RouterConfig::parse(&format!("[relay]\nbuffer_size = 4096\n{listener}")).unwrap();
        assert_eq!(config.relay_buffer_size, 4096);
        for bad in [0, 4095, netio::relay::MAX_PIPE_SIZE + 1] {
            let text = format!("[relay]\nbuffer_size = {bad}\n{listener}");
            assert!(matches!(
                RouterConfig::parse(&text),
                Err(ConfigError::RelayBufferSize { size }) if size == bad
            ));
        }
    }

    #[test]
    fn toml_errors_name_the_file_and_line_and_keep_the_parser_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.toml");
        std::fs::write(&path, "[[listener]]\naddress = 7\n").unwrap();
        let err = RouterConfig::load(&path).unwrap_err();
        let ConfigError::Toml {
            path: Some(at),
            line: Some(2),
            source,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(at, &path);
        let top = err.to_string();
        assert!(
            top.contains(&format!("{}, line 2", path.display())),
            "{top}"
        );
        // The parser's message is the cause, not part of the top line.
        assert!(!top.contains(source.message()), "{top}");
        let line = netio::report::chain(&err);
        assert_eq!(line.matches(source.message()).count(), 1, "{line}");

        let err = RouterConfig::parse("[[listener]]\naddress = 7\n").unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Toml {
                path: None,
                line: Some(2),
                ..
            }
        ));
    }

    #[test]
    fn refused_values_name_the_file_and_the_line_quoting_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.toml");
        let connect = "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n";
        let sni = "[[listener]]\naddress = \"127.0.0.1:2\"\nkind = \"sni\"\n";
        let route =
            "[[route]]\nvalue = \"outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local\"\n";
        // (file, line at fault, what the cause says)
        let cases: Vec<(String, usize, &str)> = vec![
            (
                "[[listener]]\naddress = \"127.0.0.1:99999\"\nheaders = [\"Reversed-VPN\"]\n".into(),
                2,
                "is not ip:port",
            ),
            (
                "[[listener]]\naddress = \"127.0.0.1:1\"\n".into(),
                2,
                "routes by headers",
            ),
            (
                "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\", \"X-Other\"]\n".into(),
                3,
                "\"X-Other\" is not a routing header",
            ),
            (
                "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\nproxy_protocol = \"required\"\n".into(),
                2,
                "need trusted_proxies",
            ),
            (format!("metrics_listen = \"localhost\"\n{connect}"), 1, "is not ip:port"),
            (format!("always_allowed = [\"10.0.0.0/8\",\n  \"10.1.0.0/33\"]\n{connect}"), 2, "is not a CIDR"),
            (format!("{connect}\n[relay]\nbuffer_size = 10\n"), 6, "buffer_size 10"),
            (format!("max_connections = 0\n{connect}"), 1, "max_connections must be at least 1"),
            (format!("max_pending = 0\n{connect}"), 1, "max_pending must be at least 1"),
            (format!("{connect}[timeouts]\nheader_ms = 5\nidle_ms = 0\n"), 6, "idle_ms must be at least 1"),
            (format!("{connect}[timeouts]\nconnect_ms = 0\n"), 5, "connect_ms must be at least 1"),
            (format!("{connect}{route}upstream = \"nowhere\"\n"), 6, "is not host:port"),
            (
                format!("{connect}{route}upstream = \"a:1\"\nallow = [\"10.0.0.0/8\"]\n[[route.rule]]\naction = \"allow\"\nfrom = []\n"),
                5,
                "has both allow and",
            ),
            (format!("{connect}{route}upstream = \"a:1\"\n{route}upstream = \"b:1\"\n"), 8, "appears twice"),
            (format!("{connect}[[route]]\nvalue = \"outbound|1194||nope\"\nupstream = \"a:1\"\n"), 5, "route \"outbound|1194||nope\""),
            (
                format!("{sni}[[sni_route]]\nserver_names = [\"a.example\",\n  \"-b.example\"]\nupstream = \"a:1\"\n"),
                6,
                "server name \"-b.example\"",
            ),
            (
                format!("{sni}[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"a:1\"\n[[sni_route]]\nserver_names = [\"A.Example\"]\nupstream = \"b:1\"\n"),
                8,
                "appears twice",
            ),
            (format!("{sni}[[sni_route]]\nserver_names = []\nupstream = \"c:1\"\n"), 6, "has no server_names"),
            (
                format!("{sni}[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"a:1\"\nshoot = \"Shoot\"\n"),
                7,
                "is not a namespace",
            ),
            (
                format!("{connect}[[listener]]\naddress = \"127.0.0.1:2\"\nkind = \"sni\"\nheaders = [\"Reversed-VPN\"]\n"),
                5,
                "takes no headers",
            ),
        ];
        for (text, line, cause) in cases {
            std::fs::write(&path, &text).unwrap();
            let err = RouterConfig::load(&path).unwrap_err();
            let ConfigError::Invalid {
                path: Some(at),
                line: Some(got),
                source,
            } = &err
            else {
                panic!("{text}: {err:?}");
            };
            assert_eq!((at, *got), (&path, line), "{text}: {err}: {source}");
            let said = netio::report::chain(&err);
            assert!(
                said.starts_with(&format!("router config {}, line {line}: ", path.display()))
                    && said.contains(cause),
                "{text}: {said}"
            );
            // The bare refusal, as `parse` gives it, points at the same line.
            let bare = RouterConfig::parse(&text).unwrap_err();
            assert_eq!(bare.line_in(&text), Some(line), "{text}: {bare}");
        }
        // What no line holds: the file is named.
        std::fs::write(&path, "# nothing\n").unwrap();
        let said = netio::report::chain(&RouterConfig::load(&path).unwrap_err());
        assert_eq!(
            said,
            format!("router config {}: no [[listener]]", path.display())
        );
    }

    #[test]
    fn bad_files_are_refused() {
        let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\n";
        for bad in [
            String::new(),
            format!("{listener}unknown = 1\n"),
            "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Host\"]\n".to_owned(),
            "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\nproxy_protocol = \"required\"\n".to_owned(),
            "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\nproxy_protocol = \"from-trusted\"\n".to_owned(),
            "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\nproxy_protocol = \"from_trusted\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n".to_owned(),
            "[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"Reversed-VPN\"]\ntrusted_proxies = [\"10.0.0.0/8\"]\n".to_owned(),
            format!("{listener}[[route]]\nvalue = \"outbound|443||vpn-seed-server.a.svc.cluster.local\"\nupstream = \"x:1\"\n"),
            format!("{listener}[[route]]\nvalue = \"outbound|1194||vpn-seed-server.a.svc.cluster.local\"\nupstream = \"x\"\n"),
            format!("{listener}[[route]]\nvalue = \"outbound|1194||vpn-seed-server.a.svc.cluster.local\"\nupstream = \"x:1\"\nallow = [\"10.0.0.0/33\"]\n"),
        ] {
            assert!(RouterConfig::parse(&bad).is_err(), "{bad}");
        }
    }

    /// A config with one SNI listener and `routes`.
    fn sni_config(routes: &str) -> Result<RouterConfig, ConfigError> {
        RouterConfig::parse(&format!(
            "always_allowed = [\"10.250.0.0/16\"]\n\
             [[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n{routes}"
        ))
    }

    #[test]
    fn bad_sni_configs_are_refused() {
        for (routes, what) in [
            ("[[sni_route]]\nserver_names = []\nupstream = \"x:1\"\n", "no names"),
            ("[[sni_route]]\nserver_names = [\"a.example.\"]\nupstream = \"x:1\"\n", "dot"),
            ("[[sni_route]]\nserver_names = [\"*.example\"]\nupstream = \"x:1\"\n", "wildcard"),
            ("[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x\"\n", "upstream"),
            (
                "[[sni_route]]\nserver_names = [\"a.example\", \"A.example\"]\nupstream = \"x:1\"\n",
                "twice",
            ),
            (
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\n\
                 [[sni_route]]\nserver_names = [\"a.EXAMPLE\"]\nupstream = \"y:1\"\n",
                "two routes",
            ),
            (
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\nallow = []\n\
                 [[sni_route.rule]]\naction = \"allow\"\nfrom = []\n",
                "allow and rules",
            ),
            ("[[sni_route]]\nserver_name = \"a.example\"\nupstream = \"x:1\"\n", "key"),
        ] {
            assert!(sni_config(routes).is_err(), "{what}");
        }
        // `shoot` is a namespace, exactly: no upper case, no dots, no empty value.
        for shoot in [
            "Shoot--p--a",
            "shoot--p--a.svc",
            "",
            "-shoot",
            "shoot--p--a-",
        ] {
            let routes = format!(
                "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\nshoot = {shoot:?}\n"
            );
            assert!(
                matches!(sni_config(&routes), Err(ConfigError::SniShoot { .. })),
                "{shoot:?}"
            );
        }
        let routes = "[[sni_route]]\nserver_names = [\"a.example\"]\nupstream = \"x:1\"\n\
                      shoot = \"shoot--p--a\"\n";
        let parsed = sni_config(routes).unwrap();
        let target = parsed.policy.sni_routes.values().next().unwrap();
        assert_eq!(target.shoot.as_deref(), Some("shoot--p--a"));
        // An SNI listener takes no headers; a CONNECT listener needs them.
        let with_headers = "[[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n\
                            headers = [\"Reversed-VPN\"]\n";
        assert!(matches!(
            RouterConfig::parse(with_headers),
            Err(ConfigError::SniHeaders { .. })
        ));
        assert!(RouterConfig::parse("[[listener]]\naddress = \"127.0.0.1:1\"\n").is_err());
        assert!(
            RouterConfig::parse("[[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"tls\"\n")
                .is_err()
        );
    }

    #[test]
    fn a_file_over_the_bound_is_refused_unread_and_refusals_quote_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.toml");
        // Over the bound: refused with the file and its size.
        let size = MAX_FILE_BYTES + 1;
        std::fs::write(&path, "#".repeat(usize::try_from(size).unwrap())).unwrap();
        let err = RouterConfig::load(&path).unwrap_err();
        let line = netio::report::chain(&err);
        assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
        assert!(line.contains(&path.display().to_string()), "{line}");
        assert!(line.contains(&format!("{size} bytes")), "{line}");
        // Under the bound, a refused line of 500 KiB: the log line quotes a prefix of it.
        let long = "x".repeat(500 << 10);
        for text in [
            format!("[[listener]]\naddress = {long}\n"),
            format!("[[listener]]\naddress = \"{long}\"\n"),
            format!("{long} = 1\n"),
            format!("[[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"{long}\"]\n"),
        ] {
            std::fs::write(&path, &text).unwrap();
            let err = RouterConfig::load(&path).unwrap_err();
            let line = netio::report::chain(&err);
            assert!(line.len() < 1024, "{} bytes: {}", line.len(), &line[..1024]);
            assert!(line.contains("xxxxxxxxxx"), "{line}");
        }
    }

    #[test]
    fn mapped_networks_load_as_ipv4_in_every_list() {
        let text = "always_allowed = [\"::ffff:10.250.0.0/112\"]\n\
             always_allowed_peers = [\"::ffff:10.96.0.1\"]\n\
             [[listener]]\naddress = \"[::]:1\"\nheaders = [\"Reversed-VPN\"]\n\
             proxy_protocol = \"required\"\ntrusted_proxies = [\"::ffff:10.180.0.0/112\"]\n\
             [[route]]\nvalue = \"outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local\"\n\
             upstream = \"x:1\"\n\
             [[route.rule]]\naction = \"deny\"\nfrom = [\"::ffff:203.0.113.66/128\"]\n\
             [[route.rule]]\naction = \"allow\"\nfrom = [\"203.0.113.0/24\"]\n";
        let config = RouterConfig::parse(text).unwrap();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            config.policy.always_allowed.proxy,
            vec![net("10.250.0.0/16")]
        );
        assert_eq!(config.policy.always_allowed.peer, vec![net("10.96.0.1/32")]);
        assert_eq!(
            config.listeners[0].proxy,
            netio::ingress::ProxyMode::Required {
                trusted: vec![net("10.180.0.0/16")]
            }
        );
        // The deny fires, for the IPv4 client and for its mapped form alike.
        let target = config.policy.routes.values().next().unwrap();
        let none = crate::access::AlwaysAllowed::default();
        for client in ["203.0.113.66", "::ffff:203.0.113.66"] {
            let who = crate::access::Client::direct(client.parse().unwrap());
            assert_eq!(
                crate::access::admits(&target.rules, &none, who),
                Err(crate::access::Denial::Rule(0)),
                "{client}"
            );
        }
        let other = crate::access::Client::direct("203.0.113.9".parse().unwrap());
        assert_eq!(crate::access::admits(&target.rules, &none, other), Ok(()));
    }
}
