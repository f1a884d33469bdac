//! The sidecar's Prometheus metrics (served by `netio::admin` on the metrics listeners).
//!
//! Every series Gardener's `reversed-vpn-envoy-side-car` scrape job keeps is written, under
//! Envoy's name and with Envoy's labels, so the job and the "envoy-proxy" dashboard keep
//! working with this sidecar in the `envoy-proxy` container:
//!
//! * connection-manager series: `envoy_http_conn_manager_prefix` = the `stat_prefix`
//!   (Gardener's `ingress_http`, our default too);
//! * per-listener series: also `envoy_listener_address`, the TLS listener's first address as
//!   Envoy writes it (`0.0.0.0_9443`);
//! * cluster series: `envoy_cluster_name="dynamic_forward_proxy_cluster"`;
//! * DNS-cache series: the cache name inside the series name
//!   (`envoy_dns_cache_dynamic_forward_proxy_cache_config_*`), no label;
//! * by-code series: `envoy_response_code` (`200`, `503`, `504`) or
//!   `envoy_response_code_class` (`1` … `5`).
//!
//! Counters keep Envoy's names (no `_total` added where Envoy has none); the `_ms` histograms
//! use Envoy's default buckets. Series that cannot happen here (retries, per-try timeouts,
//! connection pools, health-check panic) are written as 0 so queries and dashboards find
//! them. Series of our own start with `vpn_sidecar_`. The catalogue is [`CATALOGUE`] and
//! `docs/metrics.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netio::admin::{Exposition, Kind};

use super::policy::Denied;

/// Envoy's default histogram bucket bounds, in milliseconds.
pub const ENVOY_BUCKETS_MS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

/// Gardener's `stat_prefix` of the CONNECT listener's connection manager.
pub const DEFAULT_STAT_PREFIX: &str = "ingress_http";
/// The cluster every upstream series is labelled with (Gardener's cluster name).
pub const CLUSTER_NAME: &str = "dynamic_forward_proxy_cluster";
/// How the DNS-cache series start for Gardener's cache name; another cache name replaces
/// the part after `envoy_dns_cache_`.
const DNS_PREFIX: &str = "envoy_dns_cache_dynamic_forward_proxy_cache_config_";

/// The label values that come from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricLabels {
    /// `envoy_http_conn_manager_prefix`.
    pub stat_prefix: String,
    /// `envoy_listener_address`, e.g. `0.0.0.0_9443`.
    pub listener_address: String,
    /// The DNS cache's name (part of the DNS series' names).
    pub dns_cache: String,
}

impl Default for MetricLabels {
    fn default() -> Self {
        MetricLabels {
            stat_prefix: DEFAULT_STAT_PREFIX.into(),
            listener_address: "0.0.0.0_9443".into(),
            dns_cache: crate::DEFAULT_DNS_CACHE_NAME.into(),
        }
    }
}

impl MetricLabels {
    /// Envoy's spelling of a listener address in stat names: `:` becomes `_`
    /// (`0.0.0.0_9443`, `[__]_9443`).
    pub fn listener(addr: std::net::SocketAddr) -> String {
        addr.to_string().replace(':', "_")
    }
}

/// Every series: (name, type, help). DNS names are Gardener's (see [`MetricLabels`]).
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
        "envoy_http_downstream_cx_length_ms",
        Kind::Histogram,
        "downstream connection lifetime",
    ),
    (
        "envoy_http_downstream_rq_total",
        Kind::Counter,
        "requests answered",
    ),
    (
        "envoy_http_downstream_rq_xx",
        Kind::Counter,
        "requests answered, by response code class",
    ),
    (
        "envoy_http_rq_total",
        Kind::Counter,
        "CONNECT requests routed to the forward proxy",
    ),
    (
        "envoy_http_no_route",
        Kind::Counter,
        "requests other than CONNECT (no route; answered 405)",
    ),
    (
        "envoy_listener_http_downstream_rq_xx",
        Kind::Counter,
        "requests answered on the listener, by response code class",
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
        "upstream connects that failed (timeouts included)",
    ),
    (
        "envoy_cluster_upstream_cx_connect_timeout",
        Kind::Counter,
        "upstream connects that timed out",
    ),
    (
        "envoy_cluster_upstream_cx_overflow",
        Kind::Counter,
        "CONNECTs refused by the connection limit (503)",
    ),
    (
        "envoy_cluster_upstream_cx_none_healthy",
        Kind::Counter,
        "CONNECTs refused because no VPN client routes the destination (503)",
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
        "envoy_cluster_upstream_cx_connect_attempts_exceeded",
        Kind::Counter,
        "always 0 (one connect attempt per address)",
    ),
    (
        "envoy_cluster_upstream_cx_max_requests",
        Kind::Counter,
        "always 0 (one request per connection)",
    ),
    (
        "envoy_cluster_upstream_cx_pool_overflow",
        Kind::Counter,
        "always 0 (no connection pool)",
    ),
    (
        "envoy_cluster_upstream_cx_protocol_error",
        Kind::Counter,
        "always 0 (no upstream protocol)",
    ),
    (
        "envoy_cluster_lb_healthy_panic",
        Kind::Counter,
        "always 0 (no health checks)",
    ),
    (
        "envoy_cluster_original_dst_host_invalid",
        Kind::Counter,
        "always 0 (no original-destination cluster)",
    ),
    (
        "envoy_cluster_upstream_rq",
        Kind::Counter,
        "requests that reached the upstream connect, by the code answered",
    ),
    (
        "envoy_cluster_upstream_rq_xx",
        Kind::Counter,
        "requests that reached the upstream connect, by code class",
    ),
    (
        "envoy_cluster_upstream_rq_total",
        Kind::Counter,
        "requests that reached the upstream connect",
    ),
    (
        "envoy_cluster_upstream_rq_completed",
        Kind::Counter,
        "upstream requests finished (refused or tunnel ended)",
    ),
    (
        "envoy_cluster_external_upstream_rq",
        Kind::Counter,
        "as envoy_cluster_upstream_rq (every request is external)",
    ),
    (
        "envoy_cluster_external_upstream_rq_xx",
        Kind::Counter,
        "as envoy_cluster_upstream_rq_xx",
    ),
    (
        "envoy_cluster_external_upstream_rq_completed",
        Kind::Counter,
        "as envoy_cluster_upstream_rq_completed",
    ),
    (
        "envoy_cluster_upstream_rq_pending_overflow",
        Kind::Counter,
        "requests refused by the connection limit (503)",
    ),
    (
        "envoy_cluster_upstream_rq_timeout",
        Kind::Counter,
        "always 0 (no response timeout on a tunnel)",
    ),
    (
        "envoy_cluster_upstream_rq_max_duration_reached",
        Kind::Counter,
        "always 0 (no maximum stream duration)",
    ),
    (
        "envoy_cluster_upstream_rq_per_try_timeout",
        Kind::Counter,
        "always 0 (no retries)",
    ),
    (
        "envoy_cluster_upstream_rq_retry",
        Kind::Counter,
        "always 0 (no retries)",
    ),
    (
        "envoy_cluster_upstream_rq_retry_limit_exceeded",
        Kind::Counter,
        "always 0 (no retries)",
    ),
    (
        "envoy_cluster_upstream_rq_retry_overflow",
        Kind::Counter,
        "always 0 (no retries)",
    ),
    (
        "envoy_cluster_upstream_rq_rx_reset",
        Kind::Counter,
        "always 0 (a relay's socket error is not attributed to a side; it is logged)",
    ),
    (
        "envoy_cluster_upstream_rq_tx_reset",
        Kind::Counter,
        "always 0 (see envoy_cluster_upstream_rq_rx_reset)",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_attempt",
        Kind::Counter,
        "name lookups started",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_success",
        Kind::Counter,
        "name lookups that gave an address of the configured family",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_dns_query_failure",
        Kind::Counter,
        "name lookups that failed, timed out or gave no address of the family",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_host_overflow",
        Kind::Counter,
        "new names refused because max_hosts names are cached (503)",
    ),
    (
        "envoy_dns_cache_dynamic_forward_proxy_cache_config_num_hosts",
        Kind::Gauge,
        "names cached",
    ),
    (
        "envoy_server_memory_allocated",
        Kind::Gauge,
        "resident anonymous memory (RssAnon of /proc/self/status), bytes",
    ),
    (
        "envoy_server_memory_heap_size",
        Kind::Gauge,
        "data and heap mappings (VmData of /proc/self/status), bytes",
    ),
    (
        "envoy_server_memory_physical_size",
        Kind::Gauge,
        "resident memory (VmRSS of /proc/self/status), bytes",
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
    (
        "vpn_sidecar_pending",
        Kind::Gauge,
        "connections before their CONNECT head (TLS handshake or head still arriving)",
    ),
    (
        "vpn_sidecar_pending_closed_total",
        Kind::Counter,
        "connections closed before their CONNECT head, by reason",
    ),
    (
        "vpn_sidecar_held",
        Kind::Gauge,
        "CONNECTs to the shoot waiting for a route (the tunnel) now",
    ),
    (
        "vpn_sidecar_held_total",
        Kind::Counter,
        "CONNECTs that waited for a route, by how the wait ended",
    ),
    (
        "vpn_sidecar_held_overflow_total",
        Kind::Counter,
        "CONNECTs answered 503 at once because max_held were waiting for a route",
    ),
    (
        "vpn_sidecar_hold_ms",
        Kind::Histogram,
        "how long CONNECTs waited for a route, milliseconds",
    ),
];

/// How the wait of a held CONNECT ended, in the order of the `vpn_sidecar_held_total`
/// samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// The route came (back); the CONNECT went on.
    Routed,
    /// The bound passed without a route: 503.
    Timeout,
    /// The client or the sidecar went away first.
    Cancelled,
}

const HOLD_ENDS: [&str; 3] = ["routed", "timeout", "cancelled"];

/// Why a pending connection was closed, in the order of the `vpn_sidecar_pending_closed_total`
/// samples.
const PENDING_CLOSED_REASONS: [&str; 2] = ["evicted", "timeout"];

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

    /// Writes `name_bucket`, `name_sum` and `name_count` with `label`.
    pub(crate) fn write(&self, name: &str, label: (&str, &str), out: &mut Exposition) {
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        let mut cumulative = 0;
        for (bound, n) in ENVOY_BUCKETS_MS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            out.sample(&bucket, &[label, ("le", &bound.to_string())], cumulative);
        }
        let total = self.count.load(Ordering::Relaxed);
        out.sample(&bucket, &[label, ("le", "+Inf")], total);
        let sum_ms = self.sum_us.load(Ordering::Relaxed) as f64 / 1000.0;
        out.sample(&sum, &[label], sum_ms);
        out.sample(&count, &[label], total);
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

/// The response codes of the upstream step, written from the start.
const UPSTREAM_CODES: [u16; 3] = [200, 503, 504];

/// All counters of one sidecar. One method per event.
#[derive(Debug, Default)]
pub struct SidecarMetrics {
    labels: MetricLabels,
    downstream_cx_total: AtomicU64,
    downstream_cx_active: AtomicU64,
    downstream_rx_bytes: AtomicU64,
    downstream_tx_bytes: AtomicU64,
    downstream_length_ms: Histogram,
    rq_total: AtomicU64,
    /// By class: index 1..=5 for 1xx..5xx.
    rq_xx: [AtomicU64; 6],
    routed: AtomicU64,
    no_route: AtomicU64,
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
    /// By [`UPSTREAM_CODES`].
    upstream_rq: [AtomicU64; UPSTREAM_CODES.len()],
    upstream_rq_completed: AtomicU64,
    dns_attempt: AtomicU64,
    dns_success: AtomicU64,
    dns_failure: AtomicU64,
    dns_overflow: AtomicU64,
    dns_hosts: AtomicU64,
    tls_failures: AtomicU64,
    denied: [AtomicU64; DENY_REASONS.len()],
    idle_timeouts: AtomicU64,
    pending: AtomicU64,
    /// By [`PENDING_CLOSED_REASONS`].
    pending_closed: [AtomicU64; PENDING_CLOSED_REASONS.len()],
    held: AtomicU64,
    held_ends: [AtomicU64; HOLD_ENDS.len()],
    held_overflow: AtomicU64,
    hold_ms: Histogram,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl SidecarMetrics {
    /// Counters at zero, written with `labels`.
    pub fn new(labels: MetricLabels) -> SidecarMetrics {
        SidecarMetrics {
            labels,
            ..SidecarMetrics::default()
        }
    }

    /// A TLS connection was accepted (before the handshake).
    pub fn downstream_opened(&self) {
        inc(&self.downstream_cx_total);
        inc(&self.downstream_cx_active);
    }

    /// A TLS connection ended after `length`.
    pub fn downstream_closed(&self, length: Duration) {
        self.downstream_cx_active.fetch_sub(1, Ordering::Relaxed);
        self.downstream_length_ms.observe(length);
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

    /// A CONNECT head was accepted and goes to the forward proxy.
    pub fn routed(&self) {
        inc(&self.routed);
    }

    /// A request with another method was refused.
    pub fn not_routed(&self) {
        inc(&self.no_route);
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

    /// The connection limit refused a CONNECT.
    pub fn overflowed(&self) {
        inc(&self.overflow);
        self.upstream_answered(503);
    }

    /// A CONNECT began to wait for a route.
    pub fn hold_started(&self) {
        inc(&self.held);
    }

    /// A CONNECT's wait for a route ended after `waited`.
    pub fn hold_ended(&self, end: HoldEnd, waited: Duration) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        inc(&self.held_ends[end as usize]);
        self.hold_ms.observe(waited);
    }

    /// A CONNECT found `max_held` waiting (answered 503 at once, counted by the caller in
    /// [`SidecarMetrics::no_route`] too); the total so far.
    pub fn hold_overflowed(&self) -> u64 {
        self.held_overflow.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// No client route covers the destination.
    pub fn no_route(&self) {
        inc(&self.none_healthy);
        self.upstream_answered(503);
    }

    /// An upstream connect failed (`timed_out`: by the connect timeout; answered 504, else 503).
    pub fn connect_failed(&self, timed_out: bool) {
        inc(&self.connect_fail);
        if timed_out {
            inc(&self.connect_timeout);
        }
        self.upstream_answered(if timed_out { 504 } else { 503 });
    }

    /// An upstream connection was established after `latency`.
    pub fn upstream_opened(&self, latency: Duration) {
        inc(&self.upstream_cx_total);
        inc(&self.upstream_cx_active);
        self.connect_ms.observe(latency);
        self.count_upstream_rq(200);
    }

    /// An upstream connection ended after `length`, having carried these bytes.
    pub fn upstream_closed(&self, length: Duration, to_upstream: u64, from_upstream: u64) {
        self.upstream_cx_active.fetch_sub(1, Ordering::Relaxed);
        self.length_ms.observe(length);
        inc(&self.upstream_rq_completed);
        let add = |c: &AtomicU64, n| c.fetch_add(n, Ordering::Relaxed);
        add(&self.upstream_tx_bytes, to_upstream);
        add(&self.upstream_rx_bytes, from_upstream);
        add(&self.downstream_rx_bytes, to_upstream);
        add(&self.downstream_tx_bytes, from_upstream);
    }

    /// A tunnel was closed by the idle timeout.
    pub fn idle_timeout(&self) {
        inc(&self.idle_timeouts);
    }

    /// A connection is before its CONNECT head; pending until the returned guard drops.
    pub fn pending_opened(&self) -> PendingConnection<'_> {
        inc(&self.pending);
        PendingConnection(self)
    }

    /// A pending connection was evicted for a newer one (`max_pending`); returns the total.
    pub fn pending_evicted(&self) -> u64 {
        self.pending_closed[0].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A connection was closed by the header timeout before its head (the TLS handshake
    /// included); returns the total.
    pub fn pending_timed_out(&self) -> u64 {
        self.pending_closed[1].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A name lookup went to the resolver.
    pub fn dns_attempt(&self) {
        inc(&self.dns_attempt);
    }

    /// A name lookup ended.
    pub fn dns_result(&self, success: bool) {
        inc(if success {
            &self.dns_success
        } else {
            &self.dns_failure
        });
    }

    /// A new name found the DNS cache full.
    pub fn dns_overflow(&self) {
        inc(&self.dns_overflow);
    }

    /// The DNS cache holds `n` names.
    pub fn dns_hosts(&self, n: usize) {
        self.dns_hosts
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The upstream step refused a request with `code` (it never had a connection).
    fn upstream_answered(&self, code: u16) {
        self.count_upstream_rq(code);
        inc(&self.upstream_rq_completed);
    }

    fn count_upstream_rq(&self, code: u16) {
        if let Some(i) = UPSTREAM_CODES.iter().position(|c| *c == code) {
            inc(&self.upstream_rq[i]);
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of every series in [`CATALOGUE`].
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        self.write(&mut out);
        out.into_string()
    }

    /// Writes every series in [`CATALOGUE`].
    pub fn write(&self, out: &mut Exposition) {
        let memory = read_memory();
        let dns_prefix = format!("envoy_dns_cache_{}_", sanitize(&self.labels.dns_cache));
        let hcm = (
            "envoy_http_conn_manager_prefix",
            self.labels.stat_prefix.as_str(),
        );
        let listener = (
            "envoy_listener_address",
            self.labels.listener_address.as_str(),
        );
        let cluster = ("envoy_cluster_name", CLUSTER_NAME);
        let classes = ["1", "2", "3", "4", "5"];
        let upstream_class = |class: usize| -> u64 {
            UPSTREAM_CODES
                .iter()
                .zip(&self.upstream_rq)
                .filter(|(code, _)| usize::from(**code / 100) == class)
                .map(|(_, c)| get(c))
                .sum()
        };
        let upstream_total: u64 = self.upstream_rq.iter().map(get).sum();
        for &(name, kind, help) in CATALOGUE {
            let renamed;
            let name = match name.strip_prefix(DNS_PREFIX) {
                Some(stat) => {
                    renamed = format!("{dns_prefix}{stat}");
                    renamed.as_str()
                }
                None => name,
            };
            out.family(name, kind, help);
            let mut one = |labels: &[(&str, &str)], value: u64| {
                out.sample(name, labels, value);
            };
            let stat = name.strip_prefix(dns_prefix.as_str()).unwrap_or(name);
            match stat {
                "envoy_http_downstream_cx_total" => one(&[hcm], get(&self.downstream_cx_total)),
                "envoy_http_downstream_cx_active" => one(&[hcm], get(&self.downstream_cx_active)),
                "envoy_http_downstream_cx_rx_bytes_total" => {
                    one(&[hcm], get(&self.downstream_rx_bytes))
                }
                "envoy_http_downstream_cx_tx_bytes_total" => {
                    one(&[hcm], get(&self.downstream_tx_bytes))
                }
                "envoy_http_downstream_cx_length_ms" => {
                    self.downstream_length_ms.write(name, hcm, out)
                }
                "envoy_http_downstream_rq_total" => one(&[hcm], get(&self.rq_total)),
                "envoy_http_downstream_rq_xx" => {
                    for (class, c) in classes.iter().zip(&self.rq_xx[1..]) {
                        one(&[hcm, ("envoy_response_code_class", class)], get(c));
                    }
                }
                "envoy_http_rq_total" => one(&[hcm], get(&self.routed)),
                "envoy_http_no_route" => one(&[hcm], get(&self.no_route)),
                "envoy_listener_http_downstream_rq_xx" => {
                    for (class, c) in classes.iter().zip(&self.rq_xx[1..]) {
                        let labels = [listener, hcm, ("envoy_response_code_class", class)];
                        one(&labels, get(c));
                    }
                }
                "envoy_cluster_upstream_cx_total" => one(&[cluster], get(&self.upstream_cx_total)),
                "envoy_cluster_upstream_cx_active" => {
                    one(&[cluster], get(&self.upstream_cx_active))
                }
                "envoy_cluster_upstream_cx_connect_fail" => {
                    one(&[cluster], get(&self.connect_fail))
                }
                "envoy_cluster_upstream_cx_connect_timeout" => {
                    one(&[cluster], get(&self.connect_timeout))
                }
                "envoy_cluster_upstream_cx_overflow"
                | "envoy_cluster_upstream_rq_pending_overflow" => {
                    one(&[cluster], get(&self.overflow))
                }
                "envoy_cluster_upstream_cx_none_healthy" => {
                    one(&[cluster], get(&self.none_healthy))
                }
                "envoy_cluster_upstream_cx_rx_bytes_total" => {
                    one(&[cluster], get(&self.upstream_rx_bytes))
                }
                "envoy_cluster_upstream_cx_tx_bytes_total" => {
                    one(&[cluster], get(&self.upstream_tx_bytes))
                }
                "envoy_cluster_upstream_cx_connect_ms" => self.connect_ms.write(name, cluster, out),
                "envoy_cluster_upstream_cx_length_ms" => self.length_ms.write(name, cluster, out),
                "envoy_cluster_upstream_rq" | "envoy_cluster_external_upstream_rq" => {
                    for (code, c) in UPSTREAM_CODES.iter().zip(&self.upstream_rq) {
                        let code = code.to_string();
                        one(&[cluster, ("envoy_response_code", &code)], get(c));
                    }
                }
                "envoy_cluster_upstream_rq_xx" | "envoy_cluster_external_upstream_rq_xx" => {
                    for (i, class) in classes.iter().enumerate() {
                        let labels = [cluster, ("envoy_response_code_class", class)];
                        one(&labels, upstream_class(i + 1));
                    }
                }
                "envoy_cluster_upstream_rq_total" => one(&[cluster], upstream_total),
                "envoy_cluster_upstream_rq_completed"
                | "envoy_cluster_external_upstream_rq_completed" => {
                    one(&[cluster], get(&self.upstream_rq_completed))
                }
                "dns_query_attempt" => one(&[], get(&self.dns_attempt)),
                "dns_query_success" => one(&[], get(&self.dns_success)),
                "dns_query_failure" => one(&[], get(&self.dns_failure)),
                "host_overflow" => one(&[], get(&self.dns_overflow)),
                "num_hosts" => one(&[], get(&self.dns_hosts)),
                "envoy_server_memory_allocated" => one(&[], memory.rss_anon),
                "envoy_server_memory_heap_size" => one(&[], memory.data),
                "envoy_server_memory_physical_size" => one(&[], memory.rss),
                "vpn_sidecar_tls_handshake_failures_total" => one(&[], get(&self.tls_failures)),
                "vpn_sidecar_denied_total" => {
                    for (reason, c) in DENY_REASONS.iter().zip(&self.denied) {
                        one(&[("reason", reason)], get(c));
                    }
                }
                "vpn_sidecar_idle_timeouts_total" => one(&[], get(&self.idle_timeouts)),
                "vpn_sidecar_pending" => one(&[], get(&self.pending)),
                "vpn_sidecar_pending_closed_total" => {
                    for (reason, c) in PENDING_CLOSED_REASONS.iter().zip(&self.pending_closed) {
                        one(&[("reason", reason)], get(c));
                    }
                }
                "vpn_sidecar_held" => one(&[], get(&self.held)),
                "vpn_sidecar_held_total" => {
                    for (end, c) in HOLD_ENDS.iter().zip(&self.held_ends) {
                        one(&[("end", end)], get(c));
                    }
                }
                "vpn_sidecar_held_overflow_total" => one(&[], get(&self.held_overflow)),
                "vpn_sidecar_hold_ms" => self.hold_ms.write(name, cluster, out),
                // The series that cannot happen here.
                _ if name.starts_with("envoy_cluster_") => one(&[cluster], 0),
                _ => one(&[], 0),
            }
        }
    }
}

/// Keeps a connection in `vpn_sidecar_pending` until its head arrived or it ended.
#[derive(Debug)]
pub struct PendingConnection<'a>(&'a SidecarMetrics);

impl Drop for PendingConnection<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Envoy's stat-name sanitising: anything but letters, digits and `_` becomes `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The process's memory as `/proc/self/status` reports it, in bytes (0 when unreadable).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Memory {
    rss_anon: u64,
    data: u64,
    rss: u64,
}

fn read_memory() -> Memory {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| parse_status(&s))
        .unwrap_or_default()
}

fn parse_status(status: &str) -> Memory {
    let kib = |field: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    Memory {
        rss_anon: kib("RssAnon"),
        data: kib("VmData"),
        rss: kib("VmRSS"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "envoy_cluster_name=\"dynamic_forward_proxy_cluster\"";

    #[test]
    fn render_names_types_and_values() {
        let m = SidecarMetrics::default();
        m.downstream_opened();
        m.responded(200);
        m.responded(403);
        m.routed();
        m.denied(Denied::Loopback);
        m.upstream_opened(Duration::from_millis(3));
        m.upstream_closed(Duration::from_millis(2000), 10, 20);
        m.connect_failed(true);
        let pending = m.pending_opened();
        assert_eq!(m.pending_evicted(), 1);
        assert_eq!(m.pending_timed_out(), 1);
        let text = m.render();
        drop(pending);
        assert!(m.render().contains("\nvpn_sidecar_pending 0\n"));
        let hcm = "envoy_http_conn_manager_prefix=\"ingress_http\"";
        for line in [
            "# TYPE envoy_cluster_upstream_cx_total counter".to_owned(),
            format!("envoy_cluster_upstream_cx_total{{{CLUSTER}}} 1"),
            format!("envoy_cluster_upstream_cx_active{{{CLUSTER}}} 0"),
            format!("envoy_cluster_upstream_cx_tx_bytes_total{{{CLUSTER}}} 10"),
            format!("envoy_cluster_upstream_cx_rx_bytes_total{{{CLUSTER}}} 20"),
            format!("envoy_cluster_upstream_cx_connect_ms_bucket{{{CLUSTER},le=\"1\"}} 0"),
            format!("envoy_cluster_upstream_cx_connect_ms_bucket{{{CLUSTER},le=\"5\"}} 1"),
            format!("envoy_cluster_upstream_cx_connect_ms_bucket{{{CLUSTER},le=\"3600000\"}} 1"),
            format!("envoy_cluster_upstream_cx_connect_ms_count{{{CLUSTER}}} 1"),
            format!("envoy_cluster_upstream_cx_length_ms_bucket{{{CLUSTER},le=\"+Inf\"}} 1"),
            format!("envoy_cluster_upstream_rq{{{CLUSTER},envoy_response_code=\"200\"}} 1"),
            format!("envoy_cluster_upstream_rq{{{CLUSTER},envoy_response_code=\"504\"}} 1"),
            format!("envoy_cluster_upstream_rq_xx{{{CLUSTER},envoy_response_code_class=\"5\"}} 1"),
            format!("envoy_cluster_external_upstream_rq_completed{{{CLUSTER}}} 2"),
            format!("envoy_cluster_upstream_rq_total{{{CLUSTER}}} 2"),
            format!("envoy_cluster_upstream_rq_retry{{{CLUSTER}}} 0"),
            format!("envoy_cluster_lb_healthy_panic{{{CLUSTER}}} 0"),
            format!("envoy_http_downstream_rq_xx{{{hcm},envoy_response_code_class=\"4\"}} 1"),
            format!("envoy_http_downstream_rq_total{{{hcm}}} 2"),
            format!("envoy_http_rq_total{{{hcm}}} 1"),
            format!("envoy_http_no_route{{{hcm}}} 0"),
            format!(
                "envoy_listener_http_downstream_rq_xx{{envoy_listener_address=\"0.0.0.0_9443\",\
                 {hcm},envoy_response_code_class=\"2\"}} 1"
            ),
            "envoy_dns_cache_dynamic_forward_proxy_cache_config_num_hosts 0".to_owned(),
            "vpn_sidecar_denied_total{reason=\"loopback\"} 1".to_owned(),
            "vpn_sidecar_pending 1".to_owned(),
            "vpn_sidecar_pending_closed_total{reason=\"evicted\"} 1".to_owned(),
            "vpn_sidecar_pending_closed_total{reason=\"timeout\"} 1".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Every catalogued series is rendered.
        for (name, _, _) in CATALOGUE {
            assert!(text.contains(&format!("\n{name}")), "{name}");
        }
    }

    #[test]
    fn labels_from_the_configuration() {
        let m = SidecarMetrics::new(MetricLabels {
            stat_prefix: "egress".into(),
            listener_address: MetricLabels::listener("[::]:9443".parse().unwrap()),
            dns_cache: "my.cache".into(),
        });
        let text = m.render();
        assert!(text.contains("envoy_http_rq_total{envoy_http_conn_manager_prefix=\"egress\"} 0"));
        assert!(
            text.contains("envoy_listener_address=\"[__]_9443\""),
            "{text}"
        );
        assert!(
            text.contains("\nenvoy_dns_cache_my_cache_num_hosts 0\n"),
            "{text}"
        );
        assert!(!text.contains("dynamic_forward_proxy_cache_config"));
        assert_eq!(
            MetricLabels::listener("0.0.0.0:9443".parse().unwrap()),
            "0.0.0.0_9443"
        );
    }

    #[test]
    fn memory_from_proc_status() {
        let status =
            "Name:\tenvoy\nVmData:\t    2048 kB\nVmRSS:\t    1024 kB\nRssAnon:\t     512 kB\n";
        assert_eq!(
            parse_status(status),
            Memory {
                rss_anon: 512 * 1024,
                data: 2048 * 1024,
                rss: 1024 * 1024
            }
        );
        let live = read_memory();
        assert!(
            live.rss > 0 && live.rss_anon > 0 && live.data >= live.rss_anon,
            "{live:?}"
        );
    }
}
