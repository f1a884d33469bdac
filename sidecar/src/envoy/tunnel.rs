//! Reading the Envoy bootstrap file of Gardener's apiserver-proxy DaemonSet (the `proxy`
//! container, `/etc/apiserver-proxy/envoy.yaml`): a TCP proxy that tunnels every connection
//! with CONNECT to the shoot's API ingress, and a stats listener. What it is recognised by,
//! and what is taken:
//!
//! * one listener whose filter is a `tcp_proxy` with a `tunneling_config`: its addresses, its
//!   `per_connection_buffer_limit_bytes`; the proxy's `stat_prefix`, `cluster`, the tunnel's
//!   `hostname` (the CONNECT request target) and `headers_to_add` (sent as they are: a value
//!   with a `%` command operator is refused), its stdout access loggers;
//! * the `LOGICAL_DNS` cluster it names: the one endpoint's host and port (the ingress,
//!   looked up again after Envoy's default `dns_refresh_rate`, 5 s, when a connection needs
//!   it), `dns_lookup_family` (`V4_ONLY`, `V6_ONLY` or `ALL`),
//!   `connect_timeout`, `per_connection_buffer_limit_bytes` and the upstream TCP keepalive;
//! * the runtime's connection limits: `envoy.resource_limits.listener.<name>.connection_limit`
//!   and `overload.global_downstream_max_connections` (the smaller one holds);
//! * the stats listener (plain HTTP): its addresses and its two routes to the admin cluster,
//!   `/metrics` (rewritten to `/stats/prometheus`) and `/ready`. We answer both there
//!   ourselves; there is no admin interface and its pipe is never created.
//!
//! Accepted because they change nothing here: names, `lb_policy` with one endpoint, the
//! stats listener's `stat_prefix`, `use_remote_address`, `codec_type` `AUTO` or `HTTP1` (our
//! endpoint speaks HTTP/1.1), its HTTP/2 options, `max_headers_count` and
//! `headers_with_underscores_action` (the endpoint reads no header), its timeouts when they
//! are at least [`REQUEST_TIMEOUT`] (the endpoint closes every connection within that), the
//! admin interface on a pipe and the static cluster that points at it, and the admin access
//! log when its filter drops every request the stats listener forwards (we write none).
//! Anything else is an error naming its line and path.

use std::net::SocketAddr;
use std::time::Duration;

use netio::admin::REQUEST_TIMEOUT;

use super::bootstrap::{
    access_log, addresses, pipe_address, pipe_cluster, routes, single_endpoint, typed, typed_req,
    ENVOY_CONNECT_TIMEOUT, HCM, ROUTER, STDOUT_LOG, TCP_PROXY,
};
use super::yaml::{self, Map, Node, Problem, YamlError};
use crate::access_log::AccessLog;
use crate::apiserver_proxy::{connect_request, AddressFamily, Keepalive, TunnelProxyConfig};

/// Envoy's TCP proxy idle timeout when none is given (1 h).
pub const ENVOY_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Envoy's default `dns_refresh_rate` of a `LOGICAL_DNS` cluster.
pub const ENVOY_DNS_REFRESH: Duration = Duration::from_secs(5);
/// Envoy's `per_connection_buffer_limit_bytes` when none is given (1 MiB).
pub const ENVOY_BUFFER_LIMIT: u64 = 1024 * 1024;
/// The stats listener's path rewritten to the admin's stats.
pub const METRICS_PATH: &str = "/metrics";
/// The admin's readiness path, routed as it is.
pub const READY_PATH: &str = "/ready";
/// What `/metrics` is rewritten to on the admin interface.
const ADMIN_STATS_PATH: &str = "/stats/prometheus";

/// What Envoy mode takes from the apiserver-proxy's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelBootstrap {
    /// The TCP proxy listener's addresses.
    pub listen: Vec<SocketAddr>,
    /// The TCP proxy's `stat_prefix` (the `envoy_tcp_prefix` label).
    pub stat_prefix: String,
    /// The cluster's name (the `envoy_cluster_name` label).
    pub cluster: String,
    /// The CONNECT request target: `tunneling_config.hostname`.
    pub target: (String, u16),
    /// `headers_to_add`, in order.
    pub headers: Vec<(String, String)>,
    /// The TCP proxy's stdout access loggers.
    pub access_logs: Vec<AccessLog>,
    /// The cluster's endpoint (the ingress): host and port.
    pub proxy: (String, u16),
    /// Its `dns_lookup_family`.
    pub family: AddressFamily,
    /// Its `connect_timeout`.
    pub connect_timeout: Duration,
    /// Its `upstream_connection_options.tcp_keepalive`.
    pub keepalive: Option<Keepalive>,
    /// The smaller of the listener's and the cluster's buffer limits.
    pub buffer_size: usize,
    /// The runtime's connection limit for the listener (`None`: no limit).
    pub max_connections: Option<usize>,
    /// The stats listener's addresses (none without one).
    pub stats_listen: Vec<SocketAddr>,
    /// Whether the stats listener routes `/ready`.
    pub ready: bool,
}

impl TunnelBootstrap {
    /// The data path's settings (`idle_timeout` is Envoy's TCP proxy default).
    pub fn tunnel_config(&self) -> TunnelProxyConfig {
        let request = connect_request(&self.target, self.headers.iter().cloned());
        TunnelProxyConfig {
            listen: self.listen.clone(),
            proxy: self.proxy.clone(),
            family: self.family,
            refresh: ENVOY_DNS_REFRESH,
            request,
            connect_timeout: self.connect_timeout,
            idle_timeout: ENVOY_IDLE_TIMEOUT,
            max_connections: self.max_connections.unwrap_or(usize::MAX),
            buffer_size: self.buffer_size,
            keepalive: self.keepalive,
        }
    }
}

/// Whether the document has the apiserver-proxy's shape: a listener whose filter is a
/// `tcp_proxy`. Looks without judging; the reader then checks everything.
pub fn recognised(root: &Node<'_, '_>) -> bool {
    let filter_names = || -> Option<Vec<String>> {
        let mut names = Vec::new();
        let listeners = root
            .map()
            .ok()?
            .get("static_resources")?
            .map()
            .ok()?
            .get("listeners")?;
        for listener in listeners.seq().ok()? {
            for chain in listener.map().ok()?.get("filter_chains")?.seq().ok()? {
                for filter in chain.map().ok()?.get("filters")?.seq().ok()? {
                    names.push(filter.map().ok()?.get("name")?.str().ok()?.to_owned());
                }
            }
        }
        Some(names)
    };
    filter_names().is_some_and(|names| names.iter().any(|n| n == TCP_PROXY.0))
}

/// Reads the bootstrap `text`.
pub fn parse(text: &str) -> Result<TunnelBootstrap, YamlError> {
    let doc = yaml::load(text)?;
    from_root(&Node::root(&doc, text))
}

/// Where a name was referenced, for an error once it is known to name nothing.
struct Reference {
    name: String,
    line: usize,
    path: String,
}

impl Reference {
    fn of(node: &Node<'_, '_>) -> Result<Reference, YamlError> {
        Ok(Reference {
            name: node.str()?.to_owned(),
            line: node.error(Problem::Unknown).line,
            path: node.path().to_owned(),
        })
    }

    fn dangling(self, why: &str) -> YamlError {
        YamlError {
            line: self.line,
            path: self.path,
            problem: Problem::Invalid {
                value: self.name,
                why: why.into(),
            },
        }
    }
}

/// The TCP proxy listener.
struct TcpListener {
    name: Option<String>,
    listen: Vec<SocketAddr>,
    buffer_limit: u64,
    stat_prefix: String,
    cluster: Reference,
    target: (String, u16),
    headers: Vec<(String, String)>,
    access_logs: Vec<AccessLog>,
}

/// The stats listener.
struct StatsListener {
    listen: Vec<SocketAddr>,
    /// The admin cluster every route goes to (each reference).
    admin: Vec<Reference>,
    ready: bool,
}

enum Listener {
    Tcp(TcpListener),
    Stats(StatsListener),
}

/// The upstream cluster.
struct Upstream {
    name: String,
    proxy: (String, u16),
    family: AddressFamily,
    connect_timeout: Duration,
    buffer_limit: u64,
    keepalive: Option<Keepalive>,
}

enum Cluster {
    Upstream(Upstream),
    /// The static cluster on the admin pipe (its name).
    Admin(String),
}

/// Reads the loaded document `root` (see the module docs).
pub fn from_root(root: &Node<'_, '_>) -> Result<TunnelBootstrap, YamlError> {
    let mut top = root.map()?;
    let mut resources = top.req("static_resources")?.map()?;
    let mut tcp = None;
    let mut stats = None;
    for node in resources.req("listeners")?.seq()? {
        let second = |what: &str, supported| {
            node.error(Problem::Unsupported {
                value: format!("a second {what}"),
                supported,
            })
        };
        match listener(&node)? {
            Listener::Tcp(l) => {
                if tcp.replace(l).is_some() {
                    return Err(second("TCP proxy listener", "one TCP proxy listener"));
                }
            }
            Listener::Stats(l) => {
                if stats.replace(l).is_some() {
                    return Err(second("stats listener", "one stats listener"));
                }
            }
        }
    }
    let Some(tcp) = tcp else {
        return Err(root.error(Problem::Missing("a listener with a tcp_proxy filter")));
    };
    let mut upstreams = Vec::new();
    let mut admin_clusters = Vec::new();
    for node in resources.req("clusters")?.seq()? {
        match cluster(&node)? {
            Cluster::Upstream(c) => upstreams.push((c, node)),
            Cluster::Admin(name) => admin_clusters.push(name),
        }
    }
    resources.finish()?;
    let Some(i) = upstreams
        .iter()
        .position(|(c, _)| c.name == tcp.cluster.name)
    else {
        return Err(tcp.cluster.dangling("no LOGICAL_DNS cluster of that name"));
    };
    let (upstream, _) = upstreams.swap_remove(i);
    if let Some((unused, node)) = upstreams.first() {
        return Err(node.error(Problem::Unsupported {
            value: format!("cluster {:?}, which no TCP proxy uses", unused.name),
            supported: "the TCP proxy's cluster and the admin cluster",
        }));
    }
    let (stats_listen, ready) = match stats {
        None => (Vec::new(), false),
        Some(s) => {
            for r in s.admin {
                if !admin_clusters.contains(&r.name) {
                    return Err(r.dangling("no static cluster on the admin pipe of that name"));
                }
            }
            (s.listen, s.ready)
        }
    };
    let forwarded: &[&str] = if ready {
        &[ADMIN_STATS_PATH, READY_PATH]
    } else {
        &[ADMIN_STATS_PATH]
    };
    if let Some(admin_node) = top.get("admin") {
        admin(&admin_node, forwarded)?;
    }
    let max_connections = match top.get("layered_runtime") {
        None => None,
        Some(runtime) => runtime_limit(&runtime, tcp.name.as_deref())?,
    };
    top.finish()?;
    let buffer = tcp.buffer_limit.min(upstream.buffer_limit);
    Ok(TunnelBootstrap {
        listen: tcp.listen,
        stat_prefix: tcp.stat_prefix,
        cluster: upstream.name,
        target: tcp.target,
        headers: tcp.headers,
        access_logs: tcp.access_logs,
        proxy: upstream.proxy,
        family: upstream.family,
        connect_timeout: upstream.connect_timeout,
        keepalive: upstream.keepalive,
        buffer_size: usize::try_from(buffer).unwrap_or(usize::MAX),
        max_connections,
        stats_listen,
        ready,
    })
}

/// The name of a filter, if it has one (for telling the listeners apart).
fn filter_name(node: &Node<'_, '_>) -> Option<String> {
    Some(node.map().ok()?.get("name")?.str().ok()?.to_owned())
}

fn listener(node: &Node<'_, '_>) -> Result<Listener, YamlError> {
    let mut m = node.map()?;
    let name = m
        .get("name")
        .map(|n| n.str().map(str::to_owned))
        .transpose()?;
    let listen = addresses(&mut m)?;
    let buffer_limit = buffer_limit(&mut m)?;
    let chain = m.req("filter_chains")?.one()?;
    m.finish()?;
    let mut chain = chain.map()?;
    let filter = chain.req("filters")?.one()?;
    chain.finish()?;
    if filter_name(&filter).as_deref() == Some(TCP_PROXY.0) {
        let config = typed_req(&filter, TCP_PROXY)?;
        let buffer_limit = buffer_limit.unwrap_or(ENVOY_BUFFER_LIMIT);
        return tcp_proxy(config, name, listen, buffer_limit).map(Listener::Tcp);
    }
    if buffer_limit.is_some() {
        // Only the TCP proxy's buffers are ours to size.
        return Err(node.error(Problem::Unsupported {
            value: "per_connection_buffer_limit_bytes on the stats listener".into(),
            supported: "the admin endpoint's own bounds",
        }));
    }
    let hcm = typed_req(&filter, HCM)?;
    stats_manager(hcm, listen).map(Listener::Stats)
}

fn buffer_limit(m: &mut Map<'_, '_>) -> Result<Option<u64>, YamlError> {
    match m.get("per_connection_buffer_limit_bytes") {
        None => Ok(None),
        Some(n) => match n.uint()? {
            0 => Err(n.invalid("must be positive")),
            v => Ok(Some(v)),
        },
    }
}

/// `host:port` as the tunnel's `hostname` has it (`[v6]:port` keeps its brackets: the text
/// goes into the request line as it is).
fn host_port(node: &Node<'_, '_>) -> Result<(String, u16), YamlError> {
    let text = no_operator(node)?;
    let bad = || node.invalid("expected host:port");
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

/// A string sent as it is: Envoy would expand `%…%` command operators in it, we do not.
fn no_operator<'a>(node: &Node<'a, '_>) -> Result<&'a str, YamlError> {
    let text = node.str()?;
    if text.contains('%') {
        return Err(node.unsupported("a value without % command operators"));
    }
    Ok(text)
}

fn tcp_proxy(
    mut config: Map<'_, '_>,
    name: Option<String>,
    listen: Vec<SocketAddr>,
    buffer_limit: u64,
) -> Result<TcpListener, YamlError> {
    let stat_prefix = config.req("stat_prefix")?.str()?.to_owned();
    let cluster = Reference::of(&config.req("cluster")?)?;
    let mut tunneling = config.req("tunneling_config")?.map()?;
    let mut access_logs = Vec::new();
    if let Some(logs) = config.get("access_log") {
        for log in logs.seq()? {
            access_logs.push(access_log(&log)?);
        }
    }
    config.finish()?;
    let target = host_port(&tunneling.req("hostname")?)?;
    let mut headers = Vec::new();
    if let Some(list) = tunneling.get("headers_to_add") {
        for option in list.seq()? {
            let mut option = option.map()?;
            let mut header = option.req("header")?.map()?;
            option.finish()?;
            let key = header.req("key")?.str()?.to_owned();
            let value = no_operator(&header.req("value")?)?.to_owned();
            header.finish()?;
            headers.push((key, value));
        }
    }
    tunneling.finish()?;
    Ok(TcpListener {
        name,
        listen,
        buffer_limit,
        stat_prefix,
        cluster,
        target,
        headers,
        access_logs,
    })
}

/// A duration the admin endpoint honours: at least [`REQUEST_TIMEOUT`].
fn admin_bound(node: &Node<'_, '_>) -> Result<(), YamlError> {
    if node.duration()? < REQUEST_TIMEOUT {
        return Err(
            node.unsupported("at least 5s (the admin endpoint closes every connection within 5 s)")
        );
    }
    Ok(())
}

fn stats_manager(
    mut hcm: Map<'_, '_>,
    listen: Vec<SocketAddr>,
) -> Result<StatsListener, YamlError> {
    hcm.ignore("stat_prefix");
    if let Some(b) = hcm.get("use_remote_address") {
        b.bool()?;
    }
    if let Some(codec) = hcm.get("codec_type") {
        if !matches!(codec.str()?, "AUTO" | "HTTP1") {
            return Err(codec.unsupported("AUTO or HTTP1 (the admin endpoint speaks HTTP/1.1)"));
        }
    }
    for key in ["stream_idle_timeout", "request_timeout"] {
        if let Some(t) = hcm.get(key) {
            admin_bound(&t)?;
        }
    }
    if let Some(options) = hcm.get("common_http_protocol_options") {
        let mut o = options.map()?;
        for key in [
            "idle_timeout",
            "max_connection_duration",
            "max_stream_duration",
        ] {
            if let Some(t) = o.get(key) {
                admin_bound(&t)?;
            }
        }
        if let Some(n) = o.get("max_headers_count") {
            n.uint()?;
        }
        if let Some(action) = o.get("headers_with_underscores_action") {
            if !matches!(action.str()?, "ALLOW" | "REJECT_REQUEST" | "DROP_HEADER") {
                return Err(action.unsupported("ALLOW, REJECT_REQUEST or DROP_HEADER"));
            }
        }
        o.finish()?;
    }
    if let Some(options) = hcm.get("http2_protocol_options") {
        let mut o = options.map()?;
        for key in [
            "max_concurrent_streams",
            "initial_stream_window_size",
            "initial_connection_window_size",
        ] {
            if let Some(n) = o.get(key) {
                n.uint()?;
            }
        }
        o.finish()?;
    }
    let mut admin = Vec::new();
    let (mut metrics, mut ready) = (false, false);
    let routes_node = routes(&mut hcm)?;
    for route in routes_node.seq()? {
        let mut r = route.map()?;
        let mut matcher = r.req("match")?.map()?;
        let path_node = matcher.req("path")?;
        matcher.finish()?;
        let mut action = r.req("route")?.map()?;
        r.finish()?;
        admin.push(Reference::of(&action.req("cluster")?)?);
        let rewrite = action.get("prefix_rewrite");
        let rewritten = rewrite.as_ref().map(Node::str).transpose()?;
        let path = path_node.str()?;
        let seen = match (path, rewritten) {
            (METRICS_PATH, Some(ADMIN_STATS_PATH)) => &mut metrics,
            (READY_PATH, None | Some(READY_PATH)) => &mut ready,
            _ => {
                return Err(route.error(Problem::Unsupported {
                    value: format!("{path} → {}", rewritten.unwrap_or(path)),
                    supported: "/metrics → /stats/prometheus and /ready → /ready",
                }))
            }
        };
        if std::mem::replace(seen, true) {
            return Err(path_node.invalid("routed twice"));
        }
        action.finish()?;
    }
    if !metrics {
        return Err(routes_node.error(Problem::Missing("a route for /metrics")));
    }
    if let Some(r) = typed(&hcm.req("http_filters")?.one()?, ROUTER)? {
        r.finish()?;
    }
    hcm.finish()?;
    Ok(StatsListener {
        listen,
        admin,
        ready,
    })
}

/// The admin interface: on a pipe, its access log silent for `forwarded` (the admin paths
/// the stats listener sends requests to).
fn admin(node: &Node<'_, '_>, forwarded: &[&str]) -> Result<(), YamlError> {
    let mut m = node.map()?;
    pipe_address(&m.req("address")?)?;
    if let Some(logs) = m.get("access_log") {
        for log in logs.seq()? {
            let mut l = log.map()?;
            l.req("name")?.expect_str(STDOUT_LOG.0)?;
            let filter = match l.get("filter") {
                None => PathFilter::And(Vec::new()),
                Some(f) => path_filter(&f)?,
            };
            let mut config = l.req("typed_config")?.map()?;
            l.finish()?;
            config.req("@type")?.expect_str(STDOUT_LOG.1)?;
            config.finish()?;
            if let Some(path) = forwarded.iter().find(|p| filter.logs(p)) {
                return Err(log.error(Problem::Unsupported {
                    value: format!("an admin access log of {path} requests"),
                    supported: "no admin access log (a filter that drops the stats listener's \
                                requests)",
                }));
            }
        }
    }
    m.finish()
}

/// An admin access-log filter on `:path` (the only header an admin request has here that
/// a filter could tell apart).
enum PathFilter {
    /// `header_filter` on `:path` with an exact match, possibly inverted.
    Exact {
        path: String,
        invert: bool,
    },
    And(Vec<PathFilter>),
    Or(Vec<PathFilter>),
}

impl PathFilter {
    fn logs(&self, path: &str) -> bool {
        match self {
            PathFilter::Exact { path: p, invert } => (p == path) != *invert,
            PathFilter::And(fs) => fs.iter().all(|f| f.logs(path)),
            PathFilter::Or(fs) => fs.iter().any(|f| f.logs(path)),
        }
    }
}

fn path_filter(node: &Node<'_, '_>) -> Result<PathFilter, YamlError> {
    let mut m = node.map()?;
    let list = |f: &Node<'_, '_>| -> Result<Vec<PathFilter>, YamlError> {
        let mut fm = f.map()?;
        let filters = fm.req("filters")?.seq()?;
        fm.finish()?;
        filters.iter().map(path_filter).collect()
    };
    let filter = if let Some(f) = m.get("and_filter") {
        PathFilter::And(list(&f)?)
    } else if let Some(f) = m.get("or_filter") {
        PathFilter::Or(list(&f)?)
    } else if let Some(f) = m.get("header_filter") {
        let mut hf = f.map()?;
        let mut header = hf.req("header")?.map()?;
        hf.finish()?;
        let name = header.req("name")?;
        if !name.str()?.eq_ignore_ascii_case(":path") {
            return Err(name.unsupported(":path"));
        }
        let mut sm = header.req("string_match")?.map()?;
        let path = sm.req("exact")?.str()?.to_owned();
        sm.finish()?;
        let invert = match header.get("invert_match") {
            None => false,
            Some(b) => b.bool()?,
        };
        header.finish()?;
        PathFilter::Exact { path, invert }
    } else {
        return Err(node.error(Problem::Missing("header_filter, and_filter or or_filter")));
    };
    m.finish()?;
    Ok(filter)
}

fn cluster(node: &Node<'_, '_>) -> Result<Cluster, YamlError> {
    let mut m = node.map()?;
    let name = m.req("name")?.str()?.to_owned();
    let kind = m.req("type")?;
    if kind.str()?.eq_ignore_ascii_case("static") {
        m.ignore("connect_timeout");
        return Ok(Cluster::Admin(pipe_cluster(m).map(|_| name)?));
    }
    // Envoy's enum, case-insensitive in YAML.
    if !kind.str()?.eq_ignore_ascii_case("logical_dns") {
        return Err(kind.unsupported("LOGICAL_DNS, or STATIC for the admin cluster"));
    }
    let connect_timeout = match m.get("connect_timeout") {
        None => ENVOY_CONNECT_TIMEOUT,
        Some(t) => t.duration()?,
    };
    let buffer_limit = buffer_limit(&mut m)?.unwrap_or(ENVOY_BUFFER_LIMIT);
    let family = match m.get("dns_lookup_family") {
        None => {
            return Err(node.error(Problem::Missing(
                "dns_lookup_family (V4_ONLY, V6_ONLY or ALL; Envoy's AUTO is not supported)",
            )))
        }
        Some(f) => match f.str()? {
            "V4_ONLY" => AddressFamily::V4Only,
            "V6_ONLY" => AddressFamily::V6Only,
            "ALL" => AddressFamily::Any,
            _ => return Err(f.unsupported("V4_ONLY, V6_ONLY or ALL")),
        },
    };
    if let Some(lb) = m.get("lb_policy") {
        lb.expect_str("ROUND_ROBIN")?;
    }
    let mut assignment = m.req("load_assignment")?.map()?;
    let keepalive = match m.get("upstream_connection_options") {
        None => None,
        Some(o) => {
            let mut o = o.map()?;
            let k = o.req("tcp_keepalive")?;
            o.finish()?;
            Some(keepalive(&k)?)
        }
    };
    m.finish()?;
    assignment.ignore("cluster_name");
    let endpoint = single_endpoint(assignment)?;
    let mut address = endpoint.map()?;
    let mut socket = address.req("socket_address")?.map()?;
    address.finish()?;
    if let Some(p) = socket.get("protocol") {
        p.expect_str("TCP")?;
    }
    let host = socket.req("address")?.str()?.to_owned();
    let port = socket.req("port_value")?;
    let port = u16::try_from(port.uint()?).map_err(|_| port.invalid("not a port"))?;
    socket.finish()?;
    Ok(Cluster::Upstream(Upstream {
        name,
        proxy: (host, port),
        family,
        connect_timeout,
        buffer_limit,
        keepalive,
    }))
}

fn keepalive(node: &Node<'_, '_>) -> Result<Keepalive, YamlError> {
    let mut m = node.map()?;
    let mut secs = |key: &str| -> Result<Option<u32>, YamlError> {
        let Some(n) = m.get(key) else {
            return Ok(None);
        };
        let v = u32::try_from(n.uint()?).map_err(|_| n.invalid("out of range"))?;
        Ok(Some(v))
    };
    let time = secs("keepalive_time")?;
    let interval = secs("keepalive_interval")?;
    let probes = secs("keepalive_probes")?;
    m.finish()?;
    let duration = |s: Option<u32>| s.map(|s| Duration::from_secs(u64::from(s)));
    Ok(Keepalive {
        time: duration(time),
        interval: duration(interval),
        probes,
    })
}

/// The connection limit of the runtime's static layers for the listener `name` (later
/// layers override earlier ones, as Envoy's).
fn runtime_limit(node: &Node<'_, '_>, name: Option<&str>) -> Result<Option<usize>, YamlError> {
    let mut m = node.map()?;
    let layers = m.req("layers")?.seq()?;
    m.finish()?;
    let (mut listener_limit, mut global_limit) = (None, None);
    for layer in layers {
        let mut l = layer.map()?;
        l.ignore("name");
        let mut values = l.req("static_layer")?.map()?;
        l.finish()?;
        if let Some(envoy) = values.get("envoy") {
            let mut envoy = envoy.map()?;
            let mut limits = envoy.req("resource_limits")?.map()?;
            envoy.finish()?;
            let mut listeners = limits.req("listener")?.map()?;
            limits.finish()?;
            let ours = name.map(yaml::snake_case);
            if let Some(entry) = ours.and_then(|n| listeners.get(&n)) {
                let mut entry = entry.map()?;
                listener_limit = Some(entry.req("connection_limit")?.uint()?);
                entry.finish()?;
            }
            // A limit for another listener names nothing here.
            listeners.finish()?;
        }
        if let Some(overload) = values.get("overload") {
            let mut overload = overload.map()?;
            global_limit = Some(overload.req("global_downstream_max_connections")?.uint()?);
            overload.finish()?;
        }
        values.finish()?;
    }
    let limit = match (listener_limit, global_limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

#[cfg(test)]
#[path = "tunnel_tests.rs"]
mod tests;
