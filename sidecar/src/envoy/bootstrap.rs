//! Reading an Envoy bootstrap file of the shape Gardener's `envoy-proxy` container gets in
//! the VPN pods (`/etc/envoy/envoy.yaml`): what the sidecar takes from it, and a refusal for
//! anything it cannot honour. (The apiserver-proxy's file is read by [`super::tunnel`]; the
//! helpers both readers share are here.)
//!
//! Taken:
//!
//! * the CONNECT listener (the one with a TLS transport socket): `address` and
//!   `additional_addresses`; certificate chain, key and trusted CA files;
//!   `require_client_certificate` (absent: optional, as Envoy); the connection manager's
//!   `stat_prefix`; its stdout access loggers (filter and `text_format_source`);
//! * the route to the dynamic forward proxy cluster: `connect_timeout`,
//!   `circuit_breakers.thresholds[0].max_connections`, and the DNS cache (`name`,
//!   `dns_lookup_family`, `max_hosts`), which the HTTP filter and the cluster must name alike;
//! * the metrics listener (plain HTTP, `GET /metrics` routed to the admin stats): its
//!   addresses. We serve `/metrics` there ourselves.
//!
//! Accepted because they change nothing here: names, `protocol: TCP`, the TLS inspector, the
//! `@type` of each `typed_config` (checked to be the one that goes with its filter),
//! `runtime_key`s, the routes' `name`s, `accept_http_10: true`, the `upgrade_configs`, the admin
//! interface on a unix pipe and the static cluster that points at it (we open no pipe: the
//! metrics listener answers without one). Anything else, or another value where we implement
//! only one, is an error naming its line and path.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use pki::tls::ClientCertMode;

use super::yaml::{self, Map, Node, Problem, YamlError};
use crate::access_log::{AccessLog, Comparison, LogFilter, LogFormat, Op};
use crate::dns::{DnsSettings, LookupFamily};

/// Envoy's defaults for fields the file may leave out.
pub(super) const ENVOY_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ENVOY_MAX_CONNECTIONS: u64 = 1024;
const ENVOY_MAX_HOSTS: u64 = 1024;

const TLS_INSPECTOR: (&str, &str) = (
    "envoy.filters.listener.tls_inspector",
    "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
);
const TLS_SOCKET: (&str, &str) = (
    "envoy.transport_sockets.tls",
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
);
pub(super) const HCM: (&str, &str) = (
    "envoy.filters.network.http_connection_manager",
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
);
pub(super) const STDOUT_LOG: (&str, &str) = (
    "envoy.access_loggers.stdout",
    "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
);
const DFP_FILTER: (&str, &str) = (
    "envoy.filters.http.dynamic_forward_proxy",
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig",
);
pub(super) const ROUTER: (&str, &str) = (
    "envoy.filters.http.router",
    "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
);
const DFP_CLUSTER: (&str, &str) = (
    "envoy.clusters.dynamic_forward_proxy",
    "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig",
);
/// The apiserver-proxy's filter ([`super::tunnel`]).
pub(super) const TCP_PROXY: (&str, &str) = (
    "envoy.filters.network.tcp_proxy",
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
);
const RAW_BUFFER: (&str, &str) = (
    "envoy.transport_sockets.raw_buffer",
    "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer",
);

/// What the sidecar takes from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// The CONNECT listener's addresses (`address`, then `additional_addresses`).
    pub listen: Vec<SocketAddr>,
    /// `certificate_chain.filename`.
    pub cert_chain: PathBuf,
    /// `private_key.filename`.
    pub private_key: PathBuf,
    /// `validation_context.trusted_ca.filename`.
    pub trusted_ca: PathBuf,
    /// `require_client_certificate` (absent: optional).
    pub client_cert: ClientCertMode,
    /// The connection manager's `stat_prefix`.
    pub stat_prefix: String,
    /// The stdout access loggers.
    pub access_logs: Vec<AccessLog>,
    /// The forward proxy cluster's `connect_timeout`.
    pub connect_timeout: Duration,
    /// Its circuit breaker's `max_connections`.
    pub max_connections: usize,
    /// Its DNS cache.
    pub dns: DnsSettings,
    /// The metrics listener's addresses (none without one).
    pub metrics_listen: Vec<SocketAddr>,
}

/// What a listener turned out to be.
enum Listener {
    Connect {
        listen: Vec<SocketAddr>,
        tls: Tls,
        hcm: ConnectManager,
    },
    Metrics {
        listen: Vec<SocketAddr>,
        cluster: (String, usize, String),
    },
}

struct Tls {
    cert_chain: PathBuf,
    private_key: PathBuf,
    trusted_ca: PathBuf,
    client_cert: ClientCertMode,
}

struct ConnectManager {
    stat_prefix: String,
    access_logs: Vec<AccessLog>,
    /// The route's cluster, with line and path for errors.
    cluster: (String, usize, String),
    dns: (DnsSettings, usize, String),
}

/// Reads the bootstrap `text`.
pub fn parse(text: &str) -> Result<Bootstrap, YamlError> {
    let doc = yaml::load(text)?;
    from_root(&Node::root(&doc, text))
}

/// Reads the loaded document `root`.
pub fn from_root(root: &Node<'_, '_>) -> Result<Bootstrap, YamlError> {
    let mut top = root.map()?;
    let mut resources = top.req("static_resources")?.map()?;
    if let Some(admin) = top.get("admin") {
        pipe_address(&admin.map()?.req("address")?)?;
    }
    top.finish()?;

    let mut connect = None;
    let mut metrics = None;
    for node in resources.req("listeners")?.seq()? {
        match listener(&node)? {
            Listener::Connect { listen, tls, hcm } => {
                if connect.replace((listen, tls, hcm)).is_some() {
                    return Err(node.error(Problem::Unsupported {
                        value: "a second TLS listener".into(),
                        supported: "one CONNECT listener",
                    }));
                }
            }
            Listener::Metrics { listen, cluster } => {
                if metrics.replace((listen, cluster)).is_some() {
                    return Err(node.error(Problem::Unsupported {
                        value: "a second metrics listener".into(),
                        supported: "one metrics listener",
                    }));
                }
            }
        }
    }
    let Some((listen, tls, hcm)) = connect else {
        return Err(root.error(Problem::Missing("a listener with a TLS transport socket")));
    };

    let mut proxy = None;
    let mut stats_clusters = Vec::new();
    for node in resources.req("clusters")?.seq()? {
        match cluster(&node)? {
            Cluster::ForwardProxy(c) => {
                if c.name == hcm.cluster.0 {
                    proxy = Some((c, node));
                }
            }
            Cluster::AdminStats(name) => stats_clusters.push(name),
        }
    }
    resources.finish()?;
    let (route_cluster, line, path) = &hcm.cluster;
    let Some((proxy, proxy_node)) = proxy else {
        return Err(YamlError {
            line: *line,
            path: path.clone(),
            problem: Problem::Invalid {
                value: route_cluster.clone(),
                why: "no dynamic forward proxy cluster of that name".into(),
            },
        });
    };
    let (filter_dns, line, path) = hcm.dns;
    if filter_dns != proxy.dns {
        return Err(YamlError {
            line,
            path,
            problem: Problem::Invalid {
                value: filter_dns.cache_name,
                why: format!(
                    "differs from the DNS cache of cluster {:?} (line {})",
                    proxy.name,
                    proxy_node.error(Problem::Unknown).line
                ),
            },
        });
    }
    let metrics_listen = match metrics {
        None => Vec::new(),
        Some((listen, (name, line, path))) => {
            if !stats_clusters.contains(&name) {
                return Err(YamlError {
                    line,
                    path,
                    problem: Problem::Invalid {
                        value: name,
                        why: "no static cluster on the admin pipe of that name".into(),
                    },
                });
            }
            listen
        }
    };
    Ok(Bootstrap {
        listen,
        cert_chain: tls.cert_chain,
        private_key: tls.private_key,
        trusted_ca: tls.trusted_ca,
        client_cert: tls.client_cert,
        stat_prefix: hcm.stat_prefix,
        access_logs: hcm.access_logs,
        connect_timeout: proxy.connect_timeout,
        max_connections: proxy.max_connections,
        dns: proxy.dns,
        metrics_listen,
    })
}

/// A `name` + `typed_config` pair that must be `want` (the `@type` checked, the rest of the
/// typed config handed back).
pub(super) fn typed<'a, 'i>(
    node: &Node<'a, 'i>,
    want: (&'static str, &'static str),
) -> Result<Option<Map<'a, 'i>>, YamlError> {
    let mut m = node.map()?;
    m.req("name")?.expect_str(want.0)?;
    let config = match m.get("typed_config") {
        None => None,
        Some(c) => {
            let mut c = c.map()?;
            c.req("@type")?.expect_str(want.1)?;
            Some(c)
        }
    };
    m.finish()?;
    Ok(config)
}

pub(super) fn typed_req<'a, 'i>(
    node: &Node<'a, 'i>,
    want: (&'static str, &'static str),
) -> Result<Map<'a, 'i>, YamlError> {
    typed(node, want)?.ok_or_else(|| node.error(Problem::Missing("typed_config")))
}

fn listener(node: &Node<'_, '_>) -> Result<Listener, YamlError> {
    let mut m = node.map()?;
    m.ignore("name");
    let listen = addresses(&mut m)?;
    if let Some(filters) = m.get("listener_filters") {
        for f in filters.seq()? {
            if let Some(config) = typed(&f, TLS_INSPECTOR)? {
                config.finish()?;
            }
        }
    }
    let chain = m.req("filter_chains")?.one()?;
    m.finish()?;
    let mut chain = chain.map()?;
    let tls = chain.get("transport_socket");
    let filter = chain.req("filters")?.one()?;
    chain.finish()?;
    let hcm = typed_req(&filter, HCM)?;
    Ok(match tls {
        Some(tls) => Listener::Connect {
            listen,
            tls: tls_context(&tls)?,
            hcm: connect_manager(hcm)?,
        },
        None => Listener::Metrics {
            listen,
            cluster: metrics_manager(hcm)?,
        },
    })
}

/// A listener's `address` and `additional_addresses`.
pub(super) fn addresses(m: &mut Map<'_, '_>) -> Result<Vec<SocketAddr>, YamlError> {
    let mut listen = vec![socket_address(&m.req("address")?)?];
    if let Some(extra) = m.get("additional_addresses") {
        for a in extra.seq()? {
            let mut a = a.map()?;
            listen.push(socket_address(&a.req("address")?)?);
            a.finish()?;
        }
    }
    Ok(listen)
}

fn socket_address(node: &Node<'_, '_>) -> Result<SocketAddr, YamlError> {
    let mut m = node.map()?;
    let mut sa = m.req("socket_address")?.map()?;
    m.finish()?;
    if let Some(p) = sa.get("protocol") {
        p.expect_str("TCP")?;
    }
    let address = sa.req("address")?;
    let ip: IpAddr = address
        .str()?
        .parse()
        .map_err(|_| address.invalid("not an IP address"))?;
    let port = sa.req("port_value")?;
    let port = u16::try_from(port.uint()?).map_err(|_| port.invalid("not a port"))?;
    sa.finish()?;
    Ok(SocketAddr::new(ip, port))
}

pub(super) fn pipe_address(node: &Node<'_, '_>) -> Result<String, YamlError> {
    let mut m = node.map()?;
    let mut pipe = m.req("pipe")?.map()?;
    m.finish()?;
    let path = pipe.req("path")?.str()?.to_owned();
    pipe.finish()?;
    Ok(path)
}

fn filename(node: &Node<'_, '_>) -> Result<PathBuf, YamlError> {
    let mut m = node.map()?;
    let f = m.req("filename")?.str()?;
    m.finish()?;
    Ok(PathBuf::from(f))
}

fn tls_context(node: &Node<'_, '_>) -> Result<Tls, YamlError> {
    let mut ctx = typed_req(node, TLS_SOCKET)?;
    let client_cert = match ctx.get("require_client_certificate") {
        Some(b) if b.bool()? => ClientCertMode::Required,
        _ => ClientCertMode::Optional,
    };
    let mut common = ctx.req("common_tls_context")?.map()?;
    ctx.finish()?;
    let mut cert = common.req("tls_certificates")?.one()?.map()?;
    let cert_chain = filename(&cert.req("certificate_chain")?)?;
    let private_key = filename(&cert.req("private_key")?)?;
    cert.finish()?;
    let mut validation = common.req("validation_context")?.map()?;
    let trusted_ca = filename(&validation.req("trusted_ca")?)?;
    validation.finish()?;
    common.finish()?;
    Ok(Tls {
        cert_chain,
        private_key,
        trusted_ca,
        client_cert,
    })
}

fn connect_manager(mut hcm: Map<'_, '_>) -> Result<ConnectManager, YamlError> {
    let stat_prefix = hcm.req("stat_prefix")?.str()?.to_owned();
    let mut access_logs = Vec::new();
    if let Some(logs) = hcm.get("access_log") {
        for log in logs.seq()? {
            access_logs.push(access_log(&log)?);
        }
    }
    // The one route: any CONNECT to the forward proxy cluster, the CONNECT terminated here.
    let route_list = routes(&mut hcm)?;
    let mut route = route_list.one()?.map()?;
    let mut matcher = route.req("match")?.map()?;
    matcher.req("connect_matcher")?.empty()?;
    matcher.finish()?;
    let mut action = route.req("route")?.map()?;
    route.finish()?;
    let cluster_node = action.req("cluster")?;
    let cluster = (
        cluster_node.str()?.to_owned(),
        cluster_node.error(Problem::Unknown).line,
        cluster_node.path().to_owned(),
    );
    let mut upgrade = action.req("upgrade_configs")?.one()?.map()?;
    action.finish()?;
    upgrade.req("upgrade_type")?.expect_str("CONNECT")?;
    upgrade.req("connect_config")?.empty()?;
    upgrade.finish()?;
    // The HTTP filters: the forward proxy's DNS cache, then the router.
    let filters = hcm.req("http_filters")?;
    let list = filters.seq()?;
    let [dfp, router] = list.as_slice() else {
        return Err(filters.error(Problem::Count {
            expected: "the dynamic forward proxy and the router",
            found: list.len(),
        }));
    };
    let mut dfp_config = typed_req(dfp, DFP_FILTER)?;
    let dns_node = dfp_config.req("dns_cache_config")?;
    let dns = (
        dns_cache(&dns_node)?,
        dns_node.error(Problem::Unknown).line,
        dns_node.path().to_owned(),
    );
    dfp_config.finish()?;
    if let Some(r) = typed(router, ROUTER)? {
        r.finish()?;
    }
    if let Some(options) = hcm.get("http_protocol_options") {
        let mut options = options.map()?;
        if let Some(v) = options.get("accept_http_10") {
            if !v.bool()? {
                return Err(v.unsupported("true (HTTP/1.0 CONNECTs are always accepted)"));
            }
        }
        options.finish()?;
    }
    if let Some(upgrades) = hcm.get("upgrade_configs") {
        let mut u = upgrades.one()?.map()?;
        u.req("upgrade_type")?.expect_str("CONNECT")?;
        u.finish()?;
    }
    hcm.finish()?;
    Ok(ConnectManager {
        stat_prefix,
        access_logs,
        cluster,
        dns,
    })
}

/// The routes of a connection manager's one virtual host, which takes every domain.
pub(super) fn routes<'a, 'i>(hcm: &mut Map<'a, 'i>) -> Result<Node<'a, 'i>, YamlError> {
    let mut config = hcm.req("route_config")?.map()?;
    config.ignore("name");
    let mut host = config.req("virtual_hosts")?.one()?.map()?;
    config.finish()?;
    host.ignore("name");
    host.req("domains")?.one()?.expect_str("*")?;
    let routes = host.req("routes")?;
    host.finish()?;
    Ok(routes)
}

pub(super) fn access_log(node: &Node<'_, '_>) -> Result<AccessLog, YamlError> {
    let mut m = node.map()?;
    m.req("name")?.expect_str(STDOUT_LOG.0)?;
    let filter = match m.get("filter") {
        None => None,
        Some(f) => Some(log_filter(&f)?),
    };
    let mut config = m.req("typed_config")?.map()?;
    m.finish()?;
    config.req("@type")?.expect_str(STDOUT_LOG.1)?;
    let mut format = config.req("log_format")?.map()?;
    config.finish()?;
    let mut source = format.req("text_format_source")?.map()?;
    format.finish()?;
    let inline = source.req("inline_string")?;
    source.finish()?;
    let format = LogFormat::parse(inline.str()?).map_err(|e| inline.invalid(e.to_string()))?;
    Ok(AccessLog { filter, format })
}

fn log_filter(node: &Node<'_, '_>) -> Result<LogFilter, YamlError> {
    let mut m = node.map()?;
    let filter = if let Some(f) = m.get("or_filter") {
        LogFilter::Or(filter_list(&f)?)
    } else if let Some(f) = m.get("and_filter") {
        LogFilter::And(filter_list(&f)?)
    } else if let Some(f) = m.get("status_code_filter") {
        LogFilter::Status(comparison(&f)?)
    } else if let Some(f) = m.get("duration_filter") {
        LogFilter::Duration(comparison(&f)?)
    } else {
        return Err(node.error(Problem::Missing(
            "status_code_filter, duration_filter, or_filter or and_filter",
        )));
    };
    m.finish()?;
    Ok(filter)
}

fn filter_list(node: &Node<'_, '_>) -> Result<Vec<LogFilter>, YamlError> {
    let mut m = node.map()?;
    let list = m.req("filters")?.seq()?;
    m.finish()?;
    list.iter().map(log_filter).collect()
}

fn comparison(node: &Node<'_, '_>) -> Result<Comparison, YamlError> {
    let mut m = node.map()?;
    let mut c = m.req("comparison")?.map()?;
    m.finish()?;
    let op_node = c.get("op");
    let op = match op_node.as_ref().map(Node::str).transpose()? {
        None | Some("EQ") => Op::Eq,
        Some("GE") => Op::Ge,
        Some("LE") => Op::Le,
        Some(_) => {
            return Err(
                op_node.map_or_else(|| node.invalid("op"), |n| n.unsupported("EQ, GE or LE"))
            )
        }
    };
    let mut value = c.req("value")?.map()?;
    c.finish()?;
    let default = value.req("default_value")?.uint()?;
    // No runtime here: the key names a value that is never set, so the default holds.
    value.ignore("runtime_key");
    value.finish()?;
    Ok(Comparison { op, value: default })
}

fn dns_cache(node: &Node<'_, '_>) -> Result<DnsSettings, YamlError> {
    let mut m = node.map()?;
    let cache_name = m.req("name")?.str()?.to_owned();
    let family = match m.get("dns_lookup_family") {
        None => LookupFamily::Auto,
        Some(f) => LookupFamily::from_envoy(f.str()?)
            .ok_or_else(|| f.unsupported("AUTO, V4_ONLY, V6_ONLY, V4_PREFERRED or ALL"))?,
    };
    let max_hosts = match m.get("max_hosts") {
        None => ENVOY_MAX_HOSTS,
        Some(n) => n.uint()?,
    };
    m.finish()?;
    Ok(DnsSettings {
        cache_name,
        family,
        max_hosts: usize::try_from(max_hosts).unwrap_or(usize::MAX),
    })
}

fn metrics_manager(mut hcm: Map<'_, '_>) -> Result<(String, usize, String), YamlError> {
    hcm.ignore("stat_prefix");
    let mut route = routes(&mut hcm)?.one()?.map()?;
    let mut matcher = route.req("match")?.map()?;
    matcher.req("prefix")?.expect_str("/metrics")?;
    if let Some(headers) = matcher.get("headers") {
        let mut h = headers.one()?.map()?;
        h.req("name")?.expect_str(":method")?;
        let mut sm = h.req("string_match")?.map()?;
        h.finish()?;
        sm.req("exact")?.expect_str("GET")?;
        sm.finish()?;
    }
    matcher.finish()?;
    let mut action = route.req("route")?.map()?;
    route.finish()?;
    let cluster = action.req("cluster")?;
    let found = (
        cluster.str()?.to_owned(),
        cluster.error(Problem::Unknown).line,
        cluster.path().to_owned(),
    );
    action
        .req("prefix_rewrite")?
        .expect_str("/stats/prometheus")?;
    action.finish()?;
    if let Some(r) = typed(&hcm.req("http_filters")?.one()?, ROUTER)? {
        r.finish()?;
    }
    hcm.finish()?;
    Ok(found)
}

struct ForwardProxy {
    name: String,
    connect_timeout: Duration,
    max_connections: usize,
    dns: DnsSettings,
}

enum Cluster {
    ForwardProxy(ForwardProxy),
    /// The static cluster that reaches the admin interface's pipe (its name).
    AdminStats(String),
}

fn cluster(node: &Node<'_, '_>) -> Result<Cluster, YamlError> {
    let mut m = node.map()?;
    let name = m.req("name")?.str()?.to_owned();
    let connect_timeout = match m.get("connect_timeout") {
        None => ENVOY_CONNECT_TIMEOUT,
        Some(t) => t.duration()?,
    };
    if let Some(kind) = m.get("type") {
        // Envoy's enum, case-insensitive in YAML.
        if !kind.str()?.eq_ignore_ascii_case("static") {
            return Err(kind.unsupported("STATIC (for the admin stats cluster)"));
        }
        pipe_cluster(m)?;
        return Ok(Cluster::AdminStats(name));
    }
    let mut max_connections = ENVOY_MAX_CONNECTIONS;
    if let Some(breakers) = m.get("circuit_breakers") {
        let mut b = breakers.map()?;
        let mut t = b.req("thresholds")?.one()?.map()?;
        b.finish()?;
        if let Some(n) = t.get("max_connections") {
            max_connections = n.uint()?;
        }
        t.finish()?;
    }
    if let Some(lb) = m.get("lb_policy") {
        lb.expect_str("CLUSTER_PROVIDED")?;
    }
    let mut cluster_type = typed_req(&m.req("cluster_type")?, DFP_CLUSTER)?;
    m.finish()?;
    let dns = dns_cache(&cluster_type.req("dns_cache_config")?)?;
    cluster_type.finish()?;
    Ok(Cluster::ForwardProxy(ForwardProxy {
        name,
        connect_timeout,
        max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
        dns,
    }))
}

/// The rest of a static cluster (after `name`, `connect_timeout` and `type`) whose one
/// endpoint is the admin interface's pipe: its path. `lb_policy` makes no difference with one
/// endpoint, and a raw-buffer transport socket is what a cluster has without one.
pub(super) fn pipe_cluster(mut m: Map<'_, '_>) -> Result<String, YamlError> {
    let mut assignment = m.req("load_assignment")?.map()?;
    m.ignore("lb_policy");
    if let Some(socket) = m.get("transport_socket") {
        if let Some(config) = typed(&socket, RAW_BUFFER)? {
            config.finish()?;
        }
    }
    m.finish()?;
    assignment.ignore("cluster_name");
    let endpoint = single_endpoint(assignment)?;
    pipe_address(&endpoint)
}

/// The address of the one endpoint of a `load_assignment`.
pub(super) fn single_endpoint<'a, 'i>(
    mut assignment: Map<'a, 'i>,
) -> Result<Node<'a, 'i>, YamlError> {
    let mut endpoints = assignment.req("endpoints")?.one()?.map()?;
    assignment.finish()?;
    let mut lb = endpoints.req("lb_endpoints")?.one()?.map()?;
    endpoints.finish()?;
    let mut endpoint = lb.req("endpoint")?.map()?;
    lb.finish()?;
    let address = endpoint.req("address")?;
    endpoint.finish()?;
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GARDENER: &str = include_str!("../../fixtures/gardener-envoy.yaml");

    fn gardener_format() -> LogFormat {
        LogFormat::parse(
            "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" \
             %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% rx %BYTES_SENT% tx %DURATION%ms \
             \"%DOWNSTREAM_REMOTE_ADDRESS%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \
             \"%UPSTREAM_HOST%\"\n",
        )
        .unwrap()
    }

    fn expected() -> Bootstrap {
        let dir = PathBuf::from("/srv/secrets/envoy-proxy");
        Bootstrap {
            listen: vec![
                "0.0.0.0:9443".parse().unwrap(),
                "[::]:9443".parse().unwrap(),
            ],
            cert_chain: dir.join("tls.crt"),
            private_key: dir.join("tls.key"),
            trusted_ca: dir.join("ca.crt"),
            client_cert: ClientCertMode::Optional,
            stat_prefix: "ingress_http".into(),
            access_logs: vec![AccessLog {
                filter: Some(LogFilter::Or(vec![
                    LogFilter::Status(Comparison {
                        op: Op::Ge,
                        value: 500,
                    }),
                    LogFilter::Duration(Comparison {
                        op: Op::Ge,
                        value: 1000,
                    }),
                ])),
                format: gardener_format(),
            }],
            connect_timeout: Duration::from_secs(20),
            max_connections: 8192,
            dns: DnsSettings {
                cache_name: "dynamic_forward_proxy_cache_config".into(),
                family: LookupFamily::All,
                max_hosts: 8192,
            },
            metrics_listen: vec![
                "0.0.0.0:15000".parse().unwrap(),
                "[::]:15000".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn gardeners_file_for_the_non_ha_seed_server_pod() {
        assert_eq!(parse(GARDENER).unwrap(), expected());
    }

    #[test]
    fn gardeners_file_for_the_kube_apiserver_pod_of_an_ha_shoot_with_overlap() {
        // Gardener renders one file for both pods; only the mounted certificates differ
        // (`kube-apiserver-http-proxy`, whose chain includes the CA; see `envoy::tests`).
        // A client certificate stays optional; the listener and metrics addresses, the DNS
        // cache and the limits are the non-HA pod's.
        let b = parse(GARDENER).unwrap();
        assert_eq!(b.client_cert, ClientCertMode::Optional);
        assert_eq!(b, expected());
    }

    /// `GARDENER` with `from` replaced by `to` (which must occur).
    fn edit(from: &str, to: &str) -> String {
        assert!(GARDENER.contains(from), "{from}");
        GARDENER.replacen(from, to, 1)
    }

    fn refused(text: &str) -> YamlError {
        parse(text).unwrap_err()
    }

    #[test]
    fn what_we_honour_is_taken_from_the_file() {
        let b = parse(
            &edit(
                "dns_lookup_family: ALL\n                max_hosts: 8192",
                "dns_lookup_family: V4_ONLY\n                max_hosts: 10",
            )
            .replacen(
                "dns_lookup_family: ALL\n          max_hosts: 8192",
                "dns_lookup_family: V4_ONLY\n          max_hosts: 10",
                1,
            )
            .replacen("connect_timeout: 20s", "connect_timeout: 1.5s", 1)
            .replacen("maxConnections: 8192", "max_connections: 7", 1)
            .replacen("stat_prefix: ingress_http", "stat_prefix: egress", 1)
            .replacen(
                "          common_tls_context:",
                "          require_client_certificate: true\n          common_tls_context:",
                1,
            ),
        )
        .unwrap();
        assert_eq!(b.dns.family, LookupFamily::V4Only);
        assert_eq!(b.dns.max_hosts, 10);
        assert_eq!(b.connect_timeout, Duration::from_millis(1500));
        assert_eq!(b.max_connections, 7);
        assert_eq!(b.stat_prefix, "egress");
        assert_eq!(b.client_cert, ClientCertMode::Required);
    }

    #[test]
    fn what_we_cannot_honour_is_named_with_line_and_path() {
        let cases: Vec<(String, usize, &str, &str)> = vec![
            (
                edit("    lb_policy: CLUSTER_PROVIDED", "    lb_policy: ROUND_ROBIN"),
                131,
                "static_resources.clusters[0].lb_policy",
                "ROUND_ROBIN",
            ),
            (
                edit("          stat_prefix: ingress_http", "          stat_prefix: ingress_http\n          stream_idle_timeout: 10s"),
                39,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.stream_idle_timeout",
                "unknown field",
            ),
            (
                edit("                      op: GE\n                      value:\n                        default_value: 500", "                      op: GT\n                      value:\n                        default_value: 500"),
                46,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.access_log[0].filter.or_filter.filters[0].status_code_filter.comparison.op",
                "GT",
            ),
            (
                edit("%UPSTREAM_HOST%", "%UPSTREAM_CLUSTER%"),
                60,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.access_log[0].typed_config.log_format.text_format_source.inline_string",
                "%UPSTREAM_CLUSTER%",
            ),
            (
                edit("                dns_lookup_family: ALL", "                dns_lookup_family: V4_ONLY"),
                80,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.dns_cache_config",
                "differs from the DNS cache",
            ),
            (
                edit("            accept_http_10: true", "            accept_http_10: false"),
                87,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_protocol_options.accept_http_10",
                "false",
            ),
            (
                edit("        address: \"0.0.0.0\"\n        port_value: 9443", "        address: \"any\"\n        port_value: 9443"),
                12,
                "static_resources.listeners[0].address.socket_address.address",
                "not an IP address",
            ),
            (
                edit("                  cluster: dynamic_forward_proxy_cluster", "                  cluster: elsewhere"),
                71,
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route.cluster",
                "no dynamic forward proxy cluster",
            ),
            (
                edit("          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", "          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport"),
                27,
                "static_resources.listeners[0].filter_chains[0].transport_socket.typed_config.@type",
                "QuicDownstreamTransport",
            ),
            (
                edit("admin:\n", "overload_manager: {}\nadmin:\n"),
                151,
                "overload_manager",
                "unknown field",
            ),
            (
                edit("    connect_timeout: 20s", "    connect_timeout: 20"),
                127,
                "static_resources.clusters[0].connect_timeout",
                "expected a string",
            ),
        ];
        for (text, line, path, words) in cases {
            let e = refused(&text);
            assert_eq!((e.line, e.path.as_str()), (line, path), "{e}");
            assert!(e.to_string().contains(words), "{e} lacks {words:?}");
        }
        let e = refused("static_resources: {listeners: [], clusters: []}\n");
        assert!(e.to_string().contains("TLS transport socket"), "{e}");
        assert!(matches!(refused("[1, 2]\n").problem, Problem::Expected(_)));
    }
}
