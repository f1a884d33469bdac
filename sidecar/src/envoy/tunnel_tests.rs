//! The reader on our rendering of Gardener's apiserver-proxy template: IPv4 and IPv6 shoots,
//! both routing-header shapes, and what it refuses.

use super::*;
use crate::access_log::LogFormat;

const GARDENER: &str = include_str!("../../fixtures/gardener-apiserver-proxy.yaml");
const VPN: &str = include_str!("../../fixtures/gardener-envoy.yaml");
const HOST: &str = "api.bar.foo.internal.example.com.";
const ROUTE: &str = "outbound|443||kube-apiserver.shoot--foo--bar.svc.cluster.local";
const SOCKET_ROUTE: &str = "shoot--foo--bar--kube-apiserver-socket";

/// `GARDENER` with each `from` replaced by its `to` (each must occur).
fn edit(edits: &[(&str, &str)]) -> String {
    let mut text = GARDENER.to_owned();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replacen(from, to, 1);
    }
    text
}

fn expected() -> TunnelBootstrap {
    TunnelBootstrap {
        listen: vec!["240.168.102.23:443".parse().unwrap()],
        stat_prefix: "kube_apiserver".into(),
        cluster: "kube_apiserver".into(),
        target: (HOST.into(), 443),
        headers: vec![("X-Gardener-Destination".into(), ROUTE.into())],
        access_logs: vec![AccessLog {
            filter: None,
            format: LogFormat::parse(
                "[%START_TIME%] %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% rx \
                 %BYTES_SENT% tx %DURATION%ms \"%DOWNSTREAM_REMOTE_ADDRESS%\" \
                 \"%UPSTREAM_HOST%\"\n",
            )
            .unwrap(),
        }],
        proxy: (HOST.into(), 8443),
        family: AddressFamily::V4Only,
        connect_timeout: Duration::from_secs(5),
        keepalive: Some(Keepalive {
            time: Some(Duration::from_secs(7200)),
            interval: Some(Duration::from_secs(55)),
            probes: None,
        }),
        buffer_size: 32 * 1024,
        max_connections: Some(10_000),
        stats_listen: vec![
            "0.0.0.0:16910".parse().unwrap(),
            "[::]:16910".parse().unwrap(),
        ],
        ready: true,
    }
}

fn recognised_text(text: &str) -> bool {
    let doc = yaml::load(text).unwrap();
    recognised(&Node::root(&doc, text))
}

#[test]
fn gardeners_file_for_an_ipv4_shoot() {
    assert!(recognised_text(GARDENER));
    assert_eq!(parse(GARDENER).unwrap(), expected());
}

#[test]
fn gardeners_file_for_ipv6_shoots() {
    // IPv6 preferred: the seed's IPv4 ClusterIP behind Gardener's NAT64 prefix, as Gardener
    // writes it (the IPv4 part dotted); or an IPv6 ClusterIP as it is.
    for (advertise, listen) in [
        ("64:ff9b:1::192.168.102.23", "[64:ff9b:1::c0a8:6617]:443"),
        ("fd00:10:2::1", "[fd00:10:2::1]:443"),
    ] {
        let text = edit(&[
            ("address: 240.168.102.23", &format!("address: {advertise}")),
            ("dns_lookup_family: V4_ONLY", "dns_lookup_family: V6_ONLY"),
        ]);
        let b = parse(&text).unwrap();
        assert_eq!(b.listen, [listen.parse::<SocketAddr>().unwrap()]);
        assert_eq!(b.family, AddressFamily::V6Only);
        assert_eq!(
            TunnelBootstrap {
                listen: expected().listen,
                family: AddressFamily::V4Only,
                ..b
            },
            expected()
        );
    }
}

#[test]
fn both_header_shapes_are_sent_as_they_are() {
    let b = parse(&edit(&[(ROUTE, SOCKET_ROUTE)])).unwrap();
    assert_eq!(
        b.headers,
        [("X-Gardener-Destination".to_owned(), SOCKET_ROUTE.to_owned())]
    );
    for (b, value) in [(expected(), ROUTE), (b, SOCKET_ROUTE)] {
        let request = b.tunnel_config().request.to_bytes().unwrap();
        let text = String::from_utf8(request).unwrap();
        assert!(
            text.starts_with(&format!("CONNECT {HOST}:443 HTTP/1.1\r\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("\r\nX-Gardener-Destination: {value}\r\n")),
            "{text}"
        );
    }
}

#[test]
fn the_data_path_gets_gardeners_limits() {
    let c = expected().tunnel_config();
    assert_eq!(c.proxy, (HOST.to_owned(), 8443));
    assert_eq!(c.family, AddressFamily::V4Only);
    assert_eq!(c.connect_timeout, Duration::from_secs(5));
    assert_eq!(c.idle_timeout, ENVOY_IDLE_TIMEOUT);
    assert_eq!(c.refresh, ENVOY_DNS_REFRESH);
    assert_eq!(c.max_connections, 10_000);
    assert_eq!(c.buffer_size, 32 * 1024);
    assert_eq!(c.listen, expected().listen);
    // The smaller runtime limit holds; without any, no limit.
    let b = parse(&edit(&[(
        "global_downstream_max_connections: 10000",
        "global_downstream_max_connections: 500",
    )]))
    .unwrap();
    assert_eq!(b.max_connections, Some(500));
    let cut = GARDENER
        .split_once("admin:\n")
        .map(|(_, rest)| format!("admin:\n{rest}"))
        .unwrap();
    assert_eq!(parse(&cut).unwrap().max_connections, None);
}

#[test]
fn the_vpn_pods_file_is_not_this_one() {
    assert!(!recognised_text(VPN));
    assert!(!recognised_text("static_resources: {listeners: []}\n"));
    assert!(!recognised_text("[1, 2]\n"));
}

#[test]
fn what_we_cannot_honour_is_named_with_line_and_path() {
    let tcp = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config";
    let hcm = "static_resources.listeners[1].filter_chains[0].filters[0].typed_config";
    let cases: Vec<(String, usize, String, &str)> = vec![
        (
            edit(&[(ROUTE, "%DOWNSTREAM_REMOTE_ADDRESS%")]),
            62,
            format!("{tcp}.tunneling_config.headers_to_add[0].header.value"),
            "without % command operators",
        ),
        (
            edit(&[(
                "            headers_to_add:",
                "            use_post: true\n            headers_to_add:",
            )]),
            59,
            format!("{tcp}.tunneling_config.use_post"),
            "unknown field",
        ),
        (
            edit(&[(
                "                value: \"outbound",
                "                append_action: OVERWRITE_IF_EXISTS_OR_ADD\n                value: \"outbound",
            )]),
            62,
            format!("{tcp}.tunneling_config.headers_to_add[0].header.append_action"),
            "unknown field",
        ),
        (
            edit(&[(
                "hostname: \"api.bar.foo.internal.example.com.:443\"",
                "hostname: \"api.bar.foo.internal.example.com.\"",
            )]),
            58,
            format!("{tcp}.tunneling_config.hostname"),
            "expected host:port",
        ),
        (
            edit(&[("          tunneling_config:\n", "          tunneling_config_x:\n")]),
            54,
            tcp.to_owned(),
            "missing field `tunneling_config`",
        ),
        (
            edit(&[("          cluster: kube_apiserver", "          cluster: elsewhere")]),
            56,
            format!("{tcp}.cluster"),
            "no LOGICAL_DNS cluster",
        ),
        (
            edit(&[("dns_lookup_family: V4_ONLY", "dns_lookup_family: AUTO")]),
            125,
            "static_resources.clusters[0].dns_lookup_family".into(),
            "V4_ONLY, V6_ONLY or ALL",
        ),
        (
            edit(&[("type: LOGICAL_DNS", "type: STRICT_DNS")]),
            124,
            "static_resources.clusters[0].type".into(),
            "STRICT_DNS",
        ),
        (
            edit(&[("        keepalive_interval: 55", "        keepalive_interval: 55\n        keepalive_jitter: 3")]),
            140,
            "static_resources.clusters[0].upstream_connection_options.tcp_keepalive.keepalive_jitter".into(),
            "unknown field",
        ),
        (
            edit(&[("                  path: /ready", "                  path: /stats")]),
            111,
            format!("{hcm}.route_config.virtual_hosts[0].routes[1]"),
            "/stats → /stats",
        ),
        (
            edit(&[("          request_timeout: 9s", "          request_timeout: 1s")]),
            98,
            format!("{hcm}.request_timeout"),
            "at least 5s",
        ),
        (
            edit(&[("          codec_type: AUTO", "          codec_type: HTTP2")]),
            99,
            format!("{hcm}.codec_type"),
            "HTTP2",
        ),
        (
            edit(&[("                exact: /ready", "                exact: /readyz")]),
            21,
            "admin.access_log[0]".into(),
            "an admin access log of /ready requests",
        ),
        (
            edit(&[("              kube_apiserver:\n", "              other:\n")]),
            15,
            "layered_runtime.layers[0].static_layer.envoy.resource_limits.listener.other".into(),
            "unknown field",
        ),
        (
            edit(&[("                  cluster: uds_admin\n                  prefix_rewrite", "                  cluster: kube_apiserver\n                  prefix_rewrite")]),
            109,
            format!("{hcm}.route_config.virtual_hosts[0].routes[0].route.cluster"),
            "no static cluster on the admin pipe",
        ),
        (
            edit(&[("    per_connection_buffer_limit_bytes: 32768\n    filter_chains", "    per_connection_buffer_limit_bytes: 0\n    filter_chains")]),
            49,
            "static_resources.listeners[0].per_connection_buffer_limit_bytes".into(),
            "must be positive",
        ),
    ];
    let mut bad = Vec::new();
    for (text, line, path, words) in cases {
        let e = parse(&text).unwrap_err();
        if (e.line, e.path.as_str()) != (line, path.as_str()) || !e.to_string().contains(words) {
            bad.push(format!("want {line} {path} {words:?}: got {e}"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn an_admin_access_log_without_a_filter_is_refused() {
    let start = GARDENER.find("    filter:\n      and_filter:").unwrap();
    let end = GARDENER.find("    typed_config:\n      \"@type\"").unwrap();
    let text = format!("{}{}", &GARDENER[..start], &GARDENER[end..]);
    let e = parse(&text).unwrap_err();
    assert_eq!(
        (e.line, e.path.as_str()),
        (21, "admin.access_log[0]"),
        "{e}"
    );
    assert!(e.to_string().contains("/stats/prometheus requests"), "{e}");
}
