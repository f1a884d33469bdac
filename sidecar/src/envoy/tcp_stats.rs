//! The apiserver-proxy's series and access log in Envoy mode: what Envoy's TCP proxy, its
//! listener and its cluster would count, under Envoy's names and labels, so that Gardener's
//! `apiserver-proxy` scrape job keeps the series it keeps from Envoy:
//!
//! * listener series: `envoy_listener_address`, the TCP proxy listener's first address as
//!   Envoy writes it (`240.168.102.23_443`, `[64_ff9b_1__c0a8_6617]_443`);
//! * TCP proxy series: `envoy_tcp_prefix`, its `stat_prefix` (Gardener's `kube_apiserver`);
//! * cluster series: `envoy_cluster_name`, the cluster's name (Gardener's `kube_apiserver`).
//!
//! There is no admin interface, so neither the `uds_admin` cluster's series nor the stats
//! listener's (`0.0.0.0_16910`) exist: the two the job drops. Bytes are counted when a
//! connection ends; the catalogue is [`CATALOGUE`] and `docs/metrics.md`.
//!
//! The access log is the TCP proxy's: one line per connection that reached it, when it ends,
//! with `%RESPONSE_CODE%` 0 (a TCP connection has none) and the response flags `UF` (the
//! ingress could not be reached, took longer than the connect timeout or refused the
//! CONNECT), `UH` (its name did not resolve to an address of the family), `SI` (the idle
//! timeout ended the tunnel), `-` otherwise. `%UPSTREAM_HOST%` is the ingress address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use netio::admin::{AdminState, Exposition, Kind};
use netio::relay::RelayEnd;

use crate::access_log::{self, AccessLog, Entry};
use crate::apiserver_proxy::{Outcome, TunnelEvents, TunnelReport};
use crate::metrics::{Histogram, MetricLabels};

/// Every series: (name, type, help).
pub const CATALOGUE: &[(&str, Kind, &str)] = &[
    (
        "envoy_listener_downstream_cx_total",
        Kind::Counter,
        "connections accepted and handed to the TCP proxy",
    ),
    (
        "envoy_listener_downstream_cx_active",
        Kind::Gauge,
        "connections open",
    ),
    (
        "envoy_listener_downstream_cx_destroy",
        Kind::Counter,
        "connections closed",
    ),
    (
        "envoy_listener_downstream_cx_overflow",
        Kind::Counter,
        "connections closed at accept by the connection limit",
    ),
    (
        "envoy_listener_downstream_cx_length_ms",
        Kind::Histogram,
        "connection lifetime, accept to close",
    ),
    (
        "envoy_tcp_downstream_cx_total",
        Kind::Counter,
        "connections the TCP proxy handled",
    ),
    (
        "envoy_tcp_downstream_cx_no_route",
        Kind::Counter,
        "always 0 (one cluster, always routed)",
    ),
    (
        "envoy_tcp_downstream_cx_rx_bytes_total",
        Kind::Counter,
        "bytes received from clients",
    ),
    (
        "envoy_tcp_downstream_cx_tx_bytes_total",
        Kind::Counter,
        "bytes sent to clients",
    ),
    (
        "envoy_tcp_idle_timeout",
        Kind::Counter,
        "tunnels closed by the idle timeout",
    ),
    (
        "envoy_cluster_update_attempt",
        Kind::Counter,
        "lookups of the ingress name (when a connection needs one, 5 s after the last)",
    ),
    (
        "envoy_cluster_update_failure",
        Kind::Counter,
        "lookups of the ingress name that failed",
    ),
    (
        "envoy_cluster_upstream_cx_none_healthy",
        Kind::Counter,
        "connections closed because the ingress name gave no address of the family",
    ),
    (
        "envoy_cluster_upstream_cx_total",
        Kind::Counter,
        "tunnels established (the ingress answered 200)",
    ),
    (
        "envoy_cluster_upstream_cx_active",
        Kind::Gauge,
        "tunnels open",
    ),
    (
        "envoy_cluster_upstream_cx_connect_fail",
        Kind::Counter,
        "tunnels not established: connect failed or timed out, or the CONNECT was refused",
    ),
    (
        "envoy_cluster_upstream_cx_connect_timeout",
        Kind::Counter,
        "tunnels not established within the connect timeout",
    ),
    (
        "envoy_cluster_upstream_cx_rx_bytes_total",
        Kind::Counter,
        "bytes received from the ingress after its 200",
    ),
    (
        "envoy_cluster_upstream_cx_tx_bytes_total",
        Kind::Counter,
        "bytes sent to the ingress after the CONNECT head",
    ),
    (
        "envoy_cluster_upstream_cx_connect_ms",
        Kind::Histogram,
        "connect latency, until the ingress's 200",
    ),
    (
        "envoy_cluster_upstream_cx_length_ms",
        Kind::Histogram,
        "tunnel lifetime, from the 200 to the close",
    ),
    (
        "envoy_cluster_bind_errors",
        Kind::Counter,
        "always 0 (no source address is bound)",
    ),
    (
        "envoy_cluster_lb_healthy_panic",
        Kind::Counter,
        "always 0 (no health checks)",
    ),
    (
        "vpn_apiserver_proxy_connect_refused_total",
        Kind::Counter,
        "CONNECTs the ingress answered with another status than 200",
    ),
];

/// The label values that come from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpLabels {
    /// `envoy_listener_address`, e.g. `240.168.102.23_443`.
    pub listener_address: String,
    /// `envoy_tcp_prefix`: the TCP proxy's `stat_prefix`.
    pub tcp_prefix: String,
    /// `envoy_cluster_name`.
    pub cluster: String,
}

impl TcpLabels {
    /// The labels for a listener on `listen` (its first address), `stat_prefix` and `cluster`.
    pub fn new(listen: Option<SocketAddr>, stat_prefix: &str, cluster: &str) -> TcpLabels {
        TcpLabels {
            listener_address: listen.map(MetricLabels::listener).unwrap_or_default(),
            tcp_prefix: stat_prefix.to_owned(),
            cluster: cluster.to_owned(),
        }
    }
}

/// The counters of one apiserver-proxy and its access loggers. One method per event (the
/// [`TunnelEvents`] the tunnel proxy calls); ready while [`TcpProxyStats::set_serving`] says.
#[derive(Debug)]
pub struct TcpProxyStats {
    labels: TcpLabels,
    access_logs: Vec<AccessLog>,
    serving: AtomicBool,
    cx_total: AtomicU64,
    cx_active: AtomicU64,
    cx_destroy: AtomicU64,
    cx_overflow: AtomicU64,
    cx_length_ms: Histogram,
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
    idle_timeouts: AtomicU64,
    update_attempt: AtomicU64,
    update_failure: AtomicU64,
    none_healthy: AtomicU64,
    upstream_total: AtomicU64,
    upstream_active: AtomicU64,
    connect_fail: AtomicU64,
    connect_timeout: AtomicU64,
    upstream_rx_bytes: AtomicU64,
    upstream_tx_bytes: AtomicU64,
    connect_ms: Histogram,
    length_ms: Histogram,
    refused: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl TcpProxyStats {
    /// Counters at zero, written with `labels`; lines for `access_logs`.
    pub fn new(labels: TcpLabels, access_logs: Vec<AccessLog>) -> TcpProxyStats {
        TcpProxyStats {
            labels,
            access_logs,
            serving: AtomicBool::new(false),
            cx_total: AtomicU64::new(0),
            cx_active: AtomicU64::new(0),
            cx_destroy: AtomicU64::new(0),
            cx_overflow: AtomicU64::new(0),
            cx_length_ms: Histogram::default(),
            rx_bytes: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
            update_attempt: AtomicU64::new(0),
            update_failure: AtomicU64::new(0),
            none_healthy: AtomicU64::new(0),
            upstream_total: AtomicU64::new(0),
            upstream_active: AtomicU64::new(0),
            connect_fail: AtomicU64::new(0),
            connect_timeout: AtomicU64::new(0),
            upstream_rx_bytes: AtomicU64::new(0),
            upstream_tx_bytes: AtomicU64::new(0),
            connect_ms: Histogram::default(),
            length_ms: Histogram::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether the proxy serves (`/ready` answers 200 only then).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every series in [`CATALOGUE`].
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        self.write(&mut out);
        out.into_string()
    }

    fn write(&self, out: &mut Exposition) {
        let listener = (
            "envoy_listener_address",
            self.labels.listener_address.as_str(),
        );
        let tcp = ("envoy_tcp_prefix", self.labels.tcp_prefix.as_str());
        let cluster = ("envoy_cluster_name", self.labels.cluster.as_str());
        for &(name, kind, help) in CATALOGUE {
            out.family(name, kind, help);
            let label = if name.starts_with("envoy_listener_") {
                listener
            } else if name.starts_with("envoy_tcp_") {
                tcp
            } else {
                cluster
            };
            let value = match name {
                "envoy_listener_downstream_cx_length_ms" => {
                    self.cx_length_ms.write(name, listener, out);
                    continue;
                }
                "envoy_cluster_upstream_cx_connect_ms" => {
                    self.connect_ms.write(name, cluster, out);
                    continue;
                }
                "envoy_cluster_upstream_cx_length_ms" => {
                    self.length_ms.write(name, cluster, out);
                    continue;
                }
                "vpn_apiserver_proxy_connect_refused_total" => {
                    out.sample(name, &[], get(&self.refused));
                    continue;
                }
                "envoy_listener_downstream_cx_total" | "envoy_tcp_downstream_cx_total" => {
                    get(&self.cx_total)
                }
                "envoy_listener_downstream_cx_active" => get(&self.cx_active),
                "envoy_listener_downstream_cx_destroy" => get(&self.cx_destroy),
                "envoy_listener_downstream_cx_overflow" => get(&self.cx_overflow),
                "envoy_tcp_downstream_cx_rx_bytes_total" => get(&self.rx_bytes),
                "envoy_tcp_downstream_cx_tx_bytes_total" => get(&self.tx_bytes),
                "envoy_tcp_idle_timeout" => get(&self.idle_timeouts),
                "envoy_cluster_update_attempt" => get(&self.update_attempt),
                "envoy_cluster_update_failure" => get(&self.update_failure),
                "envoy_cluster_upstream_cx_none_healthy" => get(&self.none_healthy),
                "envoy_cluster_upstream_cx_total" => get(&self.upstream_total),
                "envoy_cluster_upstream_cx_active" => get(&self.upstream_active),
                "envoy_cluster_upstream_cx_connect_fail" => get(&self.connect_fail),
                "envoy_cluster_upstream_cx_connect_timeout" => get(&self.connect_timeout),
                "envoy_cluster_upstream_cx_rx_bytes_total" => get(&self.upstream_rx_bytes),
                "envoy_cluster_upstream_cx_tx_bytes_total" => get(&self.upstream_tx_bytes),
                // The series that cannot happen here.
                _ => 0,
            };
            out.sample(name, &[label], value);
        }
    }
}

/// The access-log entry of a connection (a TCP connection has no request: no method,
/// protocol, request id or authority, and status 0, as Envoy's TCP proxy writes it).
fn entry<'a>(r: &TunnelReport, header: &'a dyn Fn(&str) -> Option<&'a str>) -> Entry<'a> {
    Entry {
        start: r.start,
        method: None,
        protocol: None,
        status: 0,
        flags: flags(&r.outcome),
        bytes_received: r.to_proxy,
        bytes_sent: r.from_proxy,
        duration: r.duration,
        downstream: r.peer,
        request_id: None,
        authority: None,
        upstream: r.proxy,
        header,
    }
}

/// The access-log line's response flags for `outcome`.
fn flags(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::ConnectFailed(_) | Outcome::Refused { .. } => "UF",
        Outcome::ResolveFailed(_) | Outcome::NoAddress => "UH",
        Outcome::Relayed(RelayEnd::Idle) => "SI",
        Outcome::Relayed(RelayEnd::Closed) | Outcome::RelayFailed(_) | Outcome::ClientFailed(_) => {
            "-"
        }
    }
}

impl TunnelEvents for TcpProxyStats {
    fn accepted(&self, _peer: SocketAddr) {
        inc(&self.cx_total);
        inc(&self.cx_active);
    }

    fn overflowed(&self, _peer: SocketAddr) {
        inc(&self.cx_overflow);
    }

    fn resolved(&self, answered: bool) {
        inc(&self.update_attempt);
        if !answered {
            inc(&self.update_failure);
        }
    }

    fn connected(&self, latency: Duration) {
        inc(&self.upstream_total);
        inc(&self.upstream_active);
        self.connect_ms.observe(latency);
    }

    fn closed(&self, r: &TunnelReport) {
        self.cx_active.fetch_sub(1, Ordering::Relaxed);
        inc(&self.cx_destroy);
        self.cx_length_ms.observe(r.duration);
        add(&self.rx_bytes, r.to_proxy);
        add(&self.tx_bytes, r.from_proxy);
        if let Some(length) = r.tunnel {
            self.upstream_active.fetch_sub(1, Ordering::Relaxed);
            self.length_ms.observe(length);
            add(&self.upstream_tx_bytes, r.to_proxy);
            add(&self.upstream_rx_bytes, r.from_proxy);
        }
        match &r.outcome {
            Outcome::ResolveFailed(_) | Outcome::NoAddress => inc(&self.none_healthy),
            Outcome::ConnectFailed(e) => {
                inc(&self.connect_fail);
                if matches!(e, netio::http_connect::ConnectError::Timeout { .. }) {
                    inc(&self.connect_timeout);
                }
            }
            Outcome::Refused { .. } => {
                inc(&self.connect_fail);
                inc(&self.refused);
            }
            Outcome::Relayed(RelayEnd::Idle) => inc(&self.idle_timeouts),
            Outcome::Relayed(RelayEnd::Closed)
            | Outcome::RelayFailed(_)
            | Outcome::ClientFailed(_) => {}
        }
        if !self.access_logs.is_empty() {
            let header = |_: &str| None;
            access_log::write(&self.access_logs, &entry(r, &header));
        }
    }
}

impl AdminState for TcpProxyStats {
    fn metrics(&self, out: &mut Exposition) {
        self.write(out);
    }

    fn ready(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn report(outcome: Outcome, tunnel: Option<Duration>, bytes: (u64, u64)) -> TunnelReport {
        TunnelReport {
            start: UNIX_EPOCH + Duration::from_millis(1_795_623_739_123),
            duration: Duration::from_millis(30),
            peer: "10.250.0.7:40000".parse().unwrap(),
            proxy: Some("203.0.113.10:8443".parse().unwrap()),
            tunnel,
            to_proxy: bytes.0,
            from_proxy: bytes.1,
            outcome,
        }
    }

    #[test]
    fn series_names_labels_and_values() {
        let labels = TcpLabels::new(
            Some("240.168.102.23:443".parse().unwrap()),
            "kube_apiserver",
            "kube_apiserver",
        );
        let s = TcpProxyStats::new(labels, Vec::new());
        let peer = "10.250.0.7:40000".parse().unwrap();
        s.accepted(peer);
        s.resolved(true);
        s.connected(Duration::from_millis(3));
        s.closed(&report(
            Outcome::Relayed(RelayEnd::Closed),
            Some(Duration::from_millis(20)),
            (100, 2000),
        ));
        s.accepted(peer);
        s.resolved(true);
        s.closed(&report(Outcome::Refused { status: 403 }, None, (0, 0)));
        s.overflowed(peer);
        s.accepted(peer);
        s.resolved(false);
        let e = std::io::Error::other("no such host");
        s.closed(&report(Outcome::ResolveFailed(e), None, (0, 0)));
        let text = s.render();
        let l = "envoy_listener_address=\"240.168.102.23_443\"";
        let t = "envoy_tcp_prefix=\"kube_apiserver\"";
        let c = "envoy_cluster_name=\"kube_apiserver\"";
        for line in [
            format!("envoy_listener_downstream_cx_total{{{l}}} 3"),
            format!("envoy_listener_downstream_cx_active{{{l}}} 0"),
            format!("envoy_listener_downstream_cx_destroy{{{l}}} 3"),
            format!("envoy_listener_downstream_cx_overflow{{{l}}} 1"),
            format!("envoy_listener_downstream_cx_length_ms_bucket{{{l},le=\"50\"}} 3"),
            format!("envoy_tcp_downstream_cx_total{{{t}}} 3"),
            format!("envoy_tcp_downstream_cx_no_route{{{t}}} 0"),
            format!("envoy_tcp_downstream_cx_rx_bytes_total{{{t}}} 100"),
            format!("envoy_tcp_downstream_cx_tx_bytes_total{{{t}}} 2000"),
            format!("envoy_cluster_update_attempt{{{c}}} 3"),
            format!("envoy_cluster_update_failure{{{c}}} 1"),
            format!("envoy_cluster_upstream_cx_none_healthy{{{c}}} 1"),
            format!("envoy_cluster_upstream_cx_total{{{c}}} 1"),
            format!("envoy_cluster_upstream_cx_active{{{c}}} 0"),
            format!("envoy_cluster_upstream_cx_connect_fail{{{c}}} 1"),
            format!("envoy_cluster_upstream_cx_rx_bytes_total{{{c}}} 2000"),
            format!("envoy_cluster_upstream_cx_tx_bytes_total{{{c}}} 100"),
            format!("envoy_cluster_upstream_cx_connect_ms_bucket{{{c},le=\"5\"}} 1"),
            format!("envoy_cluster_upstream_cx_length_ms_bucket{{{c},le=\"25\"}} 1"),
            format!("envoy_cluster_bind_errors{{{c}}} 0"),
            format!("envoy_cluster_lb_healthy_panic{{{c}}} 0"),
            "vpn_apiserver_proxy_connect_refused_total 1".to_owned(),
            "# TYPE envoy_listener_downstream_cx_length_ms histogram".to_owned(),
            "# TYPE envoy_cluster_upstream_cx_active gauge".to_owned(),
        ] {
            assert!(
                text.lines().any(|x| x == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!s.ready());
        s.set_serving(true);
        assert!(s.ready());
    }

    #[test]
    fn ipv6_listener_label() {
        let labels = TcpLabels::new(
            Some("[64:ff9b:1::c0a8:6617]:443".parse().unwrap()),
            "kube_apiserver",
            "kube_apiserver",
        );
        assert_eq!(labels.listener_address, "[64_ff9b_1__c0a8_6617]_443");
    }

    #[test]
    fn access_log_lines_in_gardeners_format() {
        let format = access_log::LogFormat::parse(
            "[%START_TIME%] %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% rx %BYTES_SENT% \
             tx %DURATION%ms \"%DOWNSTREAM_REMOTE_ADDRESS%\" \"%UPSTREAM_HOST%\"\n",
        )
        .unwrap();
        let header = |_: &str| None;
        let line = |r: &TunnelReport| format.render(&entry(r, &header));
        let ok = report(
            Outcome::Relayed(RelayEnd::Closed),
            Some(Duration::from_millis(20)),
            (517, 4096),
        );
        assert_eq!(
            line(&ok),
            "[2026-11-25T16:22:19.123Z] 0 - 517 rx 4096 tx 30ms \"10.250.0.7:40000\" \
             \"203.0.113.10:8443\"\n"
        );
        let refused = report(Outcome::Refused { status: 403 }, None, (0, 0));
        assert!(line(&refused).contains("] 0 UF 0 rx 0 tx 30ms"));
        let idle = report(Outcome::Relayed(RelayEnd::Idle), None, (1, 1));
        assert!(line(&idle).contains(" SI "));
        assert!(line(&report(Outcome::NoAddress, None, (0, 0))).contains(" UH "));
    }
}
