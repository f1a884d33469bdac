//! `docs/metrics.md` is the one catalogue of our series: every family a part of ours renders on
//! its admin endpoint is listed there, every series listed there is rendered by some part,
//! and where the catalogue spells out a label's values, every value the code writes is among
//! them.
//!
//! Each part is rendered fresh, as its `/metrics` would answer before any traffic (every
//! labelled series is written from the start, at 0), through the same renderers the admin
//! endpoint calls. The exporter reads a real status file of upstream OpenVPN's
//! (`vpn-server/fixtures/status/ha-2.6.status`) and this machine's `/proc/net/snmp`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use netio::admin::{AdminState, Exposition};

/// A row of the catalogue: the labels cell of each series named in its first cell.
type Catalogue = BTreeMap<String, String>;

/// The series names of the catalogue's tables (first cell, each backticked name with an
/// underscore; `<name>` stands for a part chosen by the configuration) with the row's labels
/// cell.
fn catalogue() -> Catalogue {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("docs/metrics.md");
    let mut out = Catalogue::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(first) = cells.first() else { continue };
        let labels = cells.get(2).copied().unwrap_or("");
        for name in backticked(first) {
            if is_series_name(&name) {
                out.insert(name, labels.to_owned());
            }
        }
    }
    out
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

fn is_series_name(name: &str) -> bool {
    name.contains('_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_<>".contains(c))
        && name.starts_with(|c: char| c.is_ascii_lowercase())
}

/// Whether the catalogue name `pattern` (with `<name>` placeholders) names `series`.
fn names(pattern: &str, series: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('<') else {
        return pattern == series;
    };
    let Some((_, tail)) = rest.split_once('>') else {
        return false;
    };
    let Some(after) = series.strip_prefix(head) else {
        return false;
    };
    (1..=after.len()).any(|i| {
        after[..i]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
            && names(tail, &after[i..])
    })
}

/// Every family an exposition declares (`# TYPE` lines), and each sample's labels.
#[derive(Default)]
struct Rendered {
    families: BTreeMap<String, &'static str>,
    labels: Vec<(String, String, String)>,
}

impl Rendered {
    fn add(&mut self, part: &'static str, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().expect("name");
                self.families.insert(name.to_owned(), part);
            } else if let Some((name, rest)) = line.split_once('{') {
                let labels = rest.rsplit_once('}').map_or("", |(l, _)| l);
                for pair in labels.split("\",") {
                    if let Some((k, v)) = pair.split_once("=\"") {
                        self.labels.push((
                            name.to_owned(),
                            k.to_owned(),
                            v.trim_end_matches('"').to_owned(),
                        ));
                    }
                }
            }
        }
    }
}

/// The family a sample belongs to (histogram samples carry `_bucket`, `_sum`, `_count`).
fn family_of<'a>(sample: &'a str, families: &BTreeMap<String, &'static str>) -> &'a str {
    if families.contains_key(sample) {
        return sample;
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| sample.strip_suffix(suffix))
        .filter(|f| families.contains_key(*f))
        .unwrap_or(sample)
}

fn exposition(part: &dyn AdminState) -> String {
    let mut out = Exposition::new();
    part.metrics(&mut out);
    out.into_string()
}

fn render_every_part() -> Rendered {
    let mut r = Rendered::default();

    let mut out = Exposition::new();
    vpn_server::ServerMetrics::default().render(0, 0, &mut out);
    vpn_server::metrics::render_hold(&vpn_server::registry::hold::HoldCounts::default(), &mut out);
    r.add("vpn-server", out.as_str());
    r.add(
        "GEP-21 seed endpoint",
        &exposition(&vpn_server::cloud_api::EndpointMetrics::default()),
    );

    let exporter = vpn_server::exporter::Exporter::new(vpn_server::exporter::ExporterConfig {
        status_paths: vec![concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../vpn-server/fixtures/status/ha-2.6.status"
        )
        .to_owned()],
        snmp_path: "/proc/net/snmp".into(),
        listen: Vec::new(),
    });
    let mut out = Exposition::new();
    vpn_server::exporter::render(exporter.collect(), &mut out);
    r.add("vpn-server exporter", out.as_str());

    let labels = sidecar::metrics::MetricLabels {
        stat_prefix: "ingress_http".to_owned(),
        listener_address: "0.0.0.0_9443".to_owned(),
        dns_cache: "dynamic_forward_proxy_cache_config".to_owned(),
    };
    r.add(
        "sidecar",
        &sidecar::metrics::SidecarMetrics::new(labels).render(),
    );
    let tcp = sidecar::envoy::tcp_stats::TcpProxyStats::new(
        sidecar::envoy::tcp_stats::TcpLabels::new(None, "kube_apiserver", "kube_apiserver"),
        Vec::new(),
    );
    r.add("apiserver-proxy (Envoy mode)", &tcp.render());

    r.add("vpn-router", &vpn_router::Counters::default().render());
    r.add(
        "vpn-router --kubernetes",
        &exposition(&vpn_router::kubernetes::KubeState::default()),
    );

    r.add(
        "GEP-21 cloud side",
        &exposition(&vpn_client::cloud_api::metrics::CloudApiMetrics::default()),
    );
    r.add(
        "HA shoot pod",
        &exposition(&vpn_client::ha::Tunnels::default()),
    );
    r
}

#[test]
fn every_rendered_series_is_in_the_catalogue_and_every_catalogued_one_is_rendered() {
    let catalogue = catalogue();
    assert!(
        catalogue.len() > 50,
        "the catalogue's tables were read: {} names",
        catalogue.len()
    );
    let rendered = render_every_part();

    let missing: Vec<String> = rendered
        .families
        .iter()
        .filter(|(name, _)| !catalogue.keys().any(|p| names(p, name)))
        .map(|(name, part)| format!("{name} ({part})"))
        .collect();
    assert!(
        missing.is_empty(),
        "rendered but not in docs/metrics.md: {missing:?}"
    );

    let unrendered: Vec<&String> = catalogue
        .keys()
        .filter(|p| !rendered.families.keys().any(|name| names(p, name)))
        .collect();
    assert!(
        unrendered.is_empty(),
        "in docs/metrics.md but rendered by no part: {unrendered:?}"
    );
}

#[test]
fn every_label_value_the_code_writes_is_in_the_catalogue_where_it_lists_them() {
    let catalogue = catalogue();
    let rendered = render_every_part();
    let mut unlisted = BTreeSet::new();
    for (sample, label, value) in &rendered.labels {
        let family = family_of(sample, &rendered.families);
        let Some((_, cell)) = catalogue.iter().find(|(p, _)| names(p, family)) else {
            continue; // the first test names it
        };
        // A cell lists a label's values as "`label`: `a`, `b`" or "`label` = `a` (...)";
        // labels whose values come from the configuration are named without a list.
        let lists_values =
            cell.contains(&format!("`{label}`:")) || cell.contains(&format!("`{label}` ="));
        if lists_values && !lists(cell, value) {
            unlisted.insert(format!("{family}{{{label}=\"{value}\"}}"));
        }
    }
    assert!(
        unlisted.is_empty(),
        "label values written by the code but not listed in docs/metrics.md: {unlisted:?}"
    );
}

/// Whether `cell` names `value`, backticked or as a bare word (status codes: "200, 400").
fn lists(cell: &str, value: &str) -> bool {
    cell.contains(&format!("`{value}`"))
        || cell
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == value)
}

#[test]
fn the_name_patterns_match_what_they_stand_for() {
    assert!(names(
        "envoy_dns_cache_<name>_num_hosts",
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_num_hosts"
    ));
    assert!(!names(
        "envoy_dns_cache_<name>_num_hosts",
        "envoy_dns_cache__num_hosts"
    ));
    assert!(names("vpn_router_pending", "vpn_router_pending"));
    assert!(!names(
        "vpn_router_pending",
        "vpn_router_pending_closed_total"
    ));
    assert!(lists("`code`: 200, 400", "400"));
    assert!(!lists("`code`: 200, 400", "40"));
    assert!(lists("`reason`: `evicted`, `timeout`", "timeout"));
}
