//! The sidecar's Prometheus metrics (served by `netio::admin` on the metrics listeners).
//!
//! Series carry Envoy's names where Gardener's `reversed-vpn-envoy-side-car` scrape job keeps
//! them, so the "envoy-proxy" dashboard keeps working: cluster series are labelled
//! `envoy_cluster_name="dynamic_forward_proxy_cluster"`, HTTP connection-manager series
//! `envoy_http_conn_manager_prefix="http_connect"`. Counters keep Envoy's names (no `_total`
//! added); the two `_ms` histograms use Envoy's default buckets. Series of our own start with
//! `vpn_sidecar_`. The catalogue is [`CATALOGUE`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netio::admin::{Exposition, Kind};

use super::policy::Denied;

/// Envoy's default histogram bucket bounds, in milliseconds.
pub const ENVOY_BUCKETS_MS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

const CLUSTER: (&str, &str) = ("envoy_cluster_name", "dynamic_forward_proxy_cluster");
const HCM: (&str, &str) = ("envoy_http_conn_manager_prefix", "http_connect");

/// Every series: (name, type, help).
pub const CATALOGUE: &[(&str, Kind, &str)] = &[
    (
        "envoy_http_downstream_cx_total",
        Kind::Counter,
        "TLS connections accepted",
    ),
    (
        "envoy_http_downstream_cx_active",
        Kind::Gauge,
        "TLS connections open",
    ),
    (
        "envoy_http_downstream_cx_rx_bytes_total",
        Kind::Counter,
        "bytes received from clients after the CONNECT head",
    ),
    (
        "envoy_http_downstream_cx_tx_bytes_total",
        Kind::Counter,
        "bytes sent to clients after the 200",
    ),
    (
        "envoy_http_downstream_rq_total",
        Kind::Counter,
        "CONNECT requests answered",
    ),
    (
        "envoy_http_downstream_rq_xx",
        Kind::Counter,
        "requests by response code class",
    ),
    (
        "envoy_cluster_upstream_cx_total",
        Kind::Counter,
        "upstream connections established",
    ),
    (
        "envoy_cluster_upstream_cx_active",
        Kind::Gauge,
        "upstream connections open",
    ),
    (
        "envoy_cluster_upstream_cx_connect_fail",
        Kind::Counter,
        "upstream connects that failed",
    ),
    (
        "envoy_cluster_upstream_cx_connect_timeout",
        Kind::Counter,
        "upstream connects that timed out",
    ),
    (
        "envoy_cluster_upstream_cx_overflow",
        Kind::Counter,
        "CONNECTs refused by the concurrency limit (503)",
    ),
    (
        "envoy_cluster_upstream_cx_none_healthy",
        Kind::Counter,
        "CONNECTs refused because no client routes the destination (503)",
    ),
    (
        "envoy_cluster_upstream_cx_rx_bytes_total",
        Kind::Counter,
        "bytes received from upstreams",
    ),
    (
        "envoy_cluster_upstream_cx_tx_bytes_total",
        Kind::Counter,
        "bytes sent to upstreams",
    ),
    (
        "envoy_cluster_upstream_cx_connect_ms",
        Kind::Histogram,
        "upstream connect latency",
    ),
    (
        "envoy_cluster_upstream_cx_length_ms",
        Kind::Histogram,
        "upstream connection lifetime",
    ),
    (
        "vpn_sidecar_tls_handshake_failures_total",
        Kind::Counter,
        "TLS handshakes that failed (e.g. no or untrusted client certificate)",
    ),
    (
        "vpn_sidecar_denied_total",
        Kind::Counter,
        "CONNECTs refused by the destination policy (403), by reason",
    ),
    (
        "vpn_sidecar_idle_timeouts_total",
        Kind::Counter,
        "tunnels closed by the idle timeout",
    ),
];

/// A histogram with [`ENVOY_BUCKETS_MS`].
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; ENVOY_BUCKETS_MS.len()],
    count: AtomicU64,
    /// Sum in microseconds (so sub-millisecond observations add up).
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        if let Some(i) = ENVOY_BUCKETS_MS.iter().position(|b| ms <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn write(&self, name: &str, out: &mut Exposition) {
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        let mut cumulative = 0;
        for (bound, n) in ENVOY_BUCKETS_MS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            out.sample(&bucket, &[CLUSTER, ("le", &bound.to_string())], cumulative);
        }
        let total = self.count.load(Ordering::Relaxed);
        out.sample(&bucket, &[CLUSTER, ("le", "+Inf")], total);
        let sum_ms = self.sum_us.load(Ordering::Relaxed) as f64 / 1000.0;
        out.sample(&sum, &[CLUSTER], sum_ms);
        out.sample(&count, &[CLUSTER], total);
    }
}

/// Denial reasons, in the order of [`SidecarMetrics::denied`].
const DENY_REASONS: [&str; 7] = [
    "unspecified",
    "loopback",
    "link_local",
    "multicast",
    "seed_network",
    "not_shoot",
    "local",
];

/// All counters of one sidecar. One method per event.
#[derive(Debug, Default)]
pub struct SidecarMetrics {
    downstream_cx_total: AtomicU64,
    downstream_cx_active: AtomicU64,
    downstream_rx_bytes: AtomicU64,
    downstream_tx_bytes: AtomicU64,
    rq_total: AtomicU64,
    /// By class: index 1..=5 for 1xx..5xx.
    rq_xx: [AtomicU64; 6],
    upstream_cx_total: AtomicU64,
    upstream_cx_active: AtomicU64,
    connect_fail: AtomicU64,
    connect_timeout: AtomicU64,
    overflow: AtomicU64,
    none_healthy: AtomicU64,
    upstream_rx_bytes: AtomicU64,
    upstream_tx_bytes: AtomicU64,
    connect_ms: Histogram,
    length_ms: Histogram,
    tls_failures: AtomicU64,
    denied: [AtomicU64; DENY_REASONS.len()],
    idle_timeouts: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl SidecarMetrics {
    /// A TLS connection was accepted (before the handshake).
    pub fn downstream_opened(&self) {
        inc(&self.downstream_cx_total);
        inc(&self.downstream_cx_active);
    }

    /// A TLS connection ended.
    pub fn downstream_closed(&self) {
        self.downstream_cx_active.fetch_sub(1, Ordering::Relaxed);
    }

    /// A TLS handshake failed.
    pub fn tls_failed(&self) {
        inc(&self.tls_failures);
    }

    /// A request was answered with `status`.
    pub fn responded(&self, status: u16) {
        inc(&self.rq_total);
        if let Some(c) = self.rq_xx.get(usize::from(status / 100)) {
            inc(c);
        }
    }

    /// The policy refused a destination.
    pub fn denied(&self, why: Denied) {
        let i = match why {
            Denied::Unspecified => 0,
            Denied::Loopback => 1,
            Denied::LinkLocal => 2,
            Denied::Multicast => 3,
            Denied::SeedNetwork { .. } => 4,
            Denied::NotShoot => 5,
            Denied::Local => 6,
        };
        inc(&self.denied[i]);
    }

    /// The concurrency limit refused a CONNECT.
    pub fn overflowed(&self) {
        inc(&self.overflow);
    }

    /// No client route covers the destination.
    pub fn no_route(&self) {
        inc(&self.none_healthy);
    }

    /// An upstream connect failed (`timed_out`: by the connect timeout).
    pub fn connect_failed(&self, timed_out: bool) {
        inc(&self.connect_fail);
        if timed_out {
            inc(&self.connect_timeout);
        }
    }

    /// An upstream connection was established after `latency`.
    pub fn upstream_opened(&self, latency: Duration) {
        inc(&self.upstream_cx_total);
        inc(&self.upstream_cx_active);
        self.connect_ms.observe(latency);
    }

    /// An upstream connection ended after `length`, having carried these bytes.
    pub fn upstream_closed(&self, length: Duration, to_upstream: u64, from_upstream: u64) {
        self.upstream_cx_active.fetch_sub(1, Ordering::Relaxed);
        self.length_ms.observe(length);
        self.upstream_tx_bytes
            .fetch_add(to_upstream, Ordering::Relaxed);
        self.upstream_rx_bytes
            .fetch_add(from_upstream, Ordering::Relaxed);
        self.downstream_rx_bytes
            .fetch_add(to_upstream, Ordering::Relaxed);
        self.downstream_tx_bytes
            .fetch_add(from_upstream, Ordering::Relaxed);
    }

    /// A tunnel was closed by the idle timeout.
    pub fn idle_timeout(&self) {
        inc(&self.idle_timeouts);
    }

    /// The Prometheus text exposition (format 0.0.4) of every series in [`CATALOGUE`].
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        self.write(&mut out);
        out.into_string()
    }

    /// Writes every series in [`CATALOGUE`].
    pub fn write(&self, out: &mut Exposition) {
        let hcm = [HCM];
        let cluster = [CLUSTER];
        for &(name, kind, help) in CATALOGUE {
            out.family(name, kind, help);
            let mut one = |c: &AtomicU64, labels: &[(&str, &str)]| {
                out.sample(name, labels, c.load(Ordering::Relaxed));
            };
            match name {
                "envoy_http_downstream_cx_total" => one(&self.downstream_cx_total, &hcm),
                "envoy_http_downstream_cx_active" => one(&self.downstream_cx_active, &hcm),
                "envoy_http_downstream_cx_rx_bytes_total" => one(&self.downstream_rx_bytes, &hcm),
                "envoy_http_downstream_cx_tx_bytes_total" => one(&self.downstream_tx_bytes, &hcm),
                "envoy_http_downstream_rq_total" => one(&self.rq_total, &hcm),
                "envoy_http_downstream_rq_xx" => {
                    for (class, c) in ["1", "2", "3", "4", "5"].iter().zip(&self.rq_xx[1..]) {
                        one(c, &[HCM, ("envoy_response_code_class", class)]);
                    }
                }
                "envoy_cluster_upstream_cx_total" => one(&self.upstream_cx_total, &cluster),
                "envoy_cluster_upstream_cx_active" => one(&self.upstream_cx_active, &cluster),
                "envoy_cluster_upstream_cx_connect_fail" => one(&self.connect_fail, &cluster),
                "envoy_cluster_upstream_cx_connect_timeout" => one(&self.connect_timeout, &cluster),
                "envoy_cluster_upstream_cx_overflow" => one(&self.overflow, &cluster),
                "envoy_cluster_upstream_cx_none_healthy" => one(&self.none_healthy, &cluster),
                "envoy_cluster_upstream_cx_rx_bytes_total" => {
                    one(&self.upstream_rx_bytes, &cluster)
                }
                "envoy_cluster_upstream_cx_tx_bytes_total" => {
                    one(&self.upstream_tx_bytes, &cluster)
                }
                "envoy_cluster_upstream_cx_connect_ms" => self.connect_ms.write(name, out),
                "envoy_cluster_upstream_cx_length_ms" => self.length_ms.write(name, out),
                "vpn_sidecar_tls_handshake_failures_total" => one(&self.tls_failures, &[]),
                "vpn_sidecar_denied_total" => {
                    for (reason, c) in DENY_REASONS.iter().zip(&self.denied) {
                        one(c, &[("reason", reason)]);
                    }
                }
                "vpn_sidecar_idle_timeouts_total" => one(&self.idle_timeouts, &[]),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_types_and_values() {
        let m = SidecarMetrics::default();
        m.downstream_opened();
        m.responded(200);
        m.responded(403);
        m.denied(Denied::Loopback);
        m.upstream_opened(Duration::from_millis(3));
        m.upstream_closed(Duration::from_millis(2000), 10, 20);
        let text = m.render();
        for line in [
            "# TYPE envoy_cluster_upstream_cx_total counter",
            "envoy_cluster_upstream_cx_total{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 1",
            "envoy_cluster_upstream_cx_active{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 0",
            "envoy_cluster_upstream_cx_tx_bytes_total{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 10",
            "envoy_cluster_upstream_cx_rx_bytes_total{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 20",
            "envoy_cluster_upstream_cx_connect_ms_bucket{envoy_cluster_name=\"dynamic_forward_proxy_cluster\",le=\"1\"} 0",
            "envoy_cluster_upstream_cx_connect_ms_bucket{envoy_cluster_name=\"dynamic_forward_proxy_cluster\",le=\"5\"} 1",
            "envoy_cluster_upstream_cx_connect_ms_count{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 1",
            "envoy_cluster_upstream_cx_length_ms_bucket{envoy_cluster_name=\"dynamic_forward_proxy_cluster\",le=\"+Inf\"} 1",
            "envoy_http_downstream_rq_xx{envoy_http_conn_manager_prefix=\"http_connect\",envoy_response_code_class=\"4\"} 1",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"http_connect\"} 2",
            "vpn_sidecar_denied_total{reason=\"loopback\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Every catalogued series is rendered.
        for (name, _, _) in CATALOGUE {
            assert!(text.contains(&format!("\n{name}")), "{name}");
        }
    }
}
