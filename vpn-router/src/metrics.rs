//! The router's counters and their Prometheus series, served with `/healthz` and `/readyz` on
//! the optional `metrics_listen` address (`netio::admin::AdminServer`; [`Counters`] is the
//! router's [`AdminState`]: ready while the router serves, not once shutdown began).
//!
//! The series, their labels and meaning: `docs/metrics.md`, section "Ingress router", the one
//! catalogue (`conformance/tests/metrics_catalogue.rs` checks it against what this renders).
//!
//! Per shoot and flow: [`crate::shoots`]; the configuration files: [`crate::config_dir::ConfigFiles`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use netio::admin::{AdminState, Exposition, Kind};
use protocol::http::connect::Status;

use crate::config_dir::ConfigFiles;
use crate::policy::SniRefusal;
use crate::shoots::Shoots;

/// The status codes the router answers with, in the order of [`Counters::by_code`].
const CODES: [u16; 10] = [200, 400, 403, 405, 408, 414, 431, 502, 503, 504];

/// What the router has done so far (for `/metrics`, tests and the demo); the series are
/// catalogued in `docs/metrics.md`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests answered 200 (tunnels opened).
    pub tunnels: AtomicU64,
    /// Requests answered with a refusal (4xx / 5xx).
    pub refused: AtomicU64,
    /// Tunnels open now.
    pub active: AtomicU64,
    /// Bytes relayed client → upstream by tunnels that ended.
    pub to_upstream: AtomicU64,
    /// Bytes relayed upstream → client by tunnels that ended.
    pub to_client: AtomicU64,
    /// Connections before their head is routed, now.
    pub pending: AtomicU64,
    /// Pending connections evicted for newer ones.
    pub pending_evicted: AtomicU64,
    /// Connections closed by the PROXY header or head deadline.
    pub pending_timeouts: AtomicU64,
    /// Connections closed for their PROXY header, by [`ProxyRefusal`].
    proxy_refused: [AtomicU64; ProxyRefusal::ALL.len()],
    by_code: [AtomicU64; CODES.len()],
    /// Per-shoot and per-flow counters (`vpn_router_shoot_*`).
    pub shoots: Shoots,
    /// The configuration files' state and reloads (`vpn_router_config_*`).
    pub files: ConfigFiles,
    /// The SNI listeners' refusals and tunnels.
    pub sni: SniCounters,
    /// The router serves (`/readyz`): set when it starts, cleared when shutdown begins.
    serving: AtomicBool,
}

impl Counters {
    /// A request was answered with `status`.
    pub fn responded(&self, status: Status) {
        let total = match status.code {
            200 => &self.tunnels,
            _ => &self.refused,
        };
        total.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = CODES.iter().position(|&c| c == status.code) {
            self.by_code[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A tunnel opened; it counts as active until the returned guard drops.
    pub fn tunnel_opened(&self) -> ActiveTunnel<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveTunnel(self)
    }

    /// A connection is waiting for its head; it counts as pending until the returned guard
    /// drops.
    pub fn pending_opened(&self) -> PendingHead<'_> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        PendingHead(self)
    }

    /// A pending connection was evicted for a newer one; returns the total so far.
    pub fn pending_evicted(&self) -> u64 {
        self.pending_evicted.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A connection was closed by the PROXY header or head deadline; returns the total so far.
    pub fn pending_timed_out(&self) -> u64 {
        self.pending_timeouts.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A connection was closed for its PROXY header.
    pub fn proxy_refused(&self, why: ProxyRefusal) {
        self.proxy_refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed so far for `why`.
    pub fn proxy_refused_total(&self, why: ProxyRefusal) -> u64 {
        self.proxy_refused[why as usize].load(Ordering::Relaxed)
    }

    /// A tunnel ended having relayed these bytes.
    pub fn relayed(&self, to_upstream: u64, to_client: u64) {
        self.to_upstream.fetch_add(to_upstream, Ordering::Relaxed);
        self.to_client.fetch_add(to_client, Ordering::Relaxed);
    }

    /// The router started serving (`true`) or began to shut down (`false`).
    pub(crate) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of the router's series alone (what its `/metrics`
    /// serves).
    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        self.metrics(&mut out);
        out.into_string()
    }
}

impl AdminState for Counters {
    fn metrics(&self, out: &mut Exposition) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let name = "vpn_router_requests_total";
        out.family(name, Kind::Counter, "Requests answered, by status code.");
        for (code, n) in CODES.iter().zip(&self.by_code) {
            out.sample(name, &[("code", &code.to_string())], get(n));
        }
        out.single(
            "vpn_router_tunnels_total",
            Kind::Counter,
            "Tunnels opened.",
            get(&self.tunnels),
        )
        .single(
            "vpn_router_tunnels_active",
            Kind::Gauge,
            "Tunnels open now.",
            get(&self.active),
        );
        let name = "vpn_router_tunnel_bytes_total";
        out.family(name, Kind::Counter, "Bytes relayed by ended tunnels.");
        for (direction, n) in [
            ("to_upstream", &self.to_upstream),
            ("to_client", &self.to_client),
        ] {
            out.sample(name, &[("direction", direction)], get(n));
        }
        out.single(
            "vpn_router_pending",
            Kind::Gauge,
            "Connections before their head is routed.",
            get(&self.pending),
        );
        let name = "vpn_router_pending_closed_total";
        out.family(
            name,
            Kind::Counter,
            "Connections closed before their head arrived, by reason.",
        );
        for (reason, n) in [
            ("evicted", &self.pending_evicted),
            ("timeout", &self.pending_timeouts),
        ] {
            out.sample(name, &[("reason", reason)], get(n));
        }
        let name = "vpn_router_proxy_refused_total";
        out.family(
            name,
            Kind::Counter,
            "Connections closed for their PROXY header, by reason.",
        );
        for why in ProxyRefusal::ALL {
            out.sample(
                name,
                &[("reason", why.label())],
                self.proxy_refused_total(why),
            );
        }
        self.shoots.metrics(out);
        self.files.metrics(out);
        self.sni.metrics(out);
    }

    fn ready(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

/// Why a connection was closed for its PROXY header (the `reason` of
/// `vpn_router_proxy_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyRefusal {
    /// A `"required"` listener and a peer outside its trusted networks.
    Untrusted = 0,
    /// A `"from-trusted"` listener and a header from a peer outside its trusted networks.
    Forbidden = 1,
    /// A header missing, malformed, or not a TCP connection's, from a trusted peer.
    Malformed = 2,
}

impl ProxyRefusal {
    /// Every reason, in index order.
    pub const ALL: [ProxyRefusal; 3] = [
        ProxyRefusal::Untrusted,
        ProxyRefusal::Forbidden,
        ProxyRefusal::Malformed,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            ProxyRefusal::Untrusted => "untrusted",
            ProxyRefusal::Forbidden => "forbidden",
            ProxyRefusal::Malformed => "malformed",
        }
    }
}

/// The SNI listeners' counters (part of [`Counters`]).
#[derive(Debug, Default)]
pub struct SniCounters {
    refused: [AtomicU64; SniRefusal::LABELS.len()],
    tunnels: AtomicU64,
}

impl SniCounters {
    /// Connections refused so far with the reason labelled `label`.
    pub fn refused_total(&self, label: &str) -> u64 {
        SniRefusal::LABELS
            .iter()
            .position(|l| *l == label)
            .map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Passthrough tunnels opened so far.
    pub fn tunnels_total(&self) -> u64 {
        self.tunnels.load(Ordering::Relaxed)
    }

    /// A connection was refused for `why`; returns the total of its reason so far.
    pub(crate) fn refused(&self, why: SniRefusal) -> u64 {
        self.refused[why.index()].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A passthrough tunnel opened.
    pub(crate) fn tunnel_opened(&self) {
        self.tunnels.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends `vpn_router_sni_refused_total` and `vpn_router_sni_tunnels_total`.
    pub(crate) fn metrics(&self, out: &mut Exposition) {
        let name = "vpn_router_sni_refused_total";
        out.family(
            name,
            Kind::Counter,
            "SNI connections closed before an upstream, by reason.",
        );
        for (label, n) in SniRefusal::LABELS.iter().zip(&self.refused) {
            out.sample(name, &[("reason", label)], n.load(Ordering::Relaxed));
        }
        out.single(
            "vpn_router_sni_tunnels_total",
            Kind::Counter,
            "SNI passthrough tunnels opened.",
            self.tunnels_total(),
        );
    }
}

/// Keeps a tunnel in `vpn_router_tunnels_active` while it lives (also when the relay is
/// dropped at shutdown).
#[derive(Debug)]
pub struct ActiveTunnel<'a>(&'a Counters);

impl Drop for ActiveTunnel<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keeps a connection in `vpn_router_pending` until its head is routed or it ends.
#[derive(Debug)]
pub struct PendingHead<'a>(&'a Counters);

impl Drop for PendingHead<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Denial;

    #[test]
    fn render_counts_by_code_and_direction() {
        let c = Counters::default();
        c.responded(Status::ESTABLISHED);
        c.responded(Status::BAD_REQUEST);
        c.responded(Status::BAD_REQUEST);
        let open = c.tunnel_opened();
        c.relayed(5, 7);
        let text = c.render();
        assert!(
            text.contains("vpn_router_requests_total{code=\"200\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("vpn_router_requests_total{code=\"400\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("vpn_router_tunnels_total 1\n"), "{text}");
        assert!(text.contains("vpn_router_tunnels_active 1\n"), "{text}");
        assert!(text.contains("vpn_router_tunnel_bytes_total{direction=\"to_upstream\"} 5\n"));
        assert!(text.contains("vpn_router_tunnel_bytes_total{direction=\"to_client\"} 7\n"));
        drop(open);
        assert!(c.render().contains("vpn_router_tunnels_active 0\n"));
        let head = c.pending_opened();
        assert_eq!(c.pending_evicted(), 1);
        assert_eq!(c.pending_timed_out(), 1);
        assert_eq!(c.pending_timed_out(), 2);
        let text = c.render();
        assert!(text.contains("vpn_router_pending 1\n"), "{text}");
        assert!(text.contains("vpn_router_pending_closed_total{reason=\"evicted\"} 1\n"));
        assert!(text.contains("vpn_router_pending_closed_total{reason=\"timeout\"} 2\n"));
        drop(head);
        assert!(c.render().contains("vpn_router_pending 0\n"));
        c.proxy_refused(ProxyRefusal::Forbidden);
        c.proxy_refused(ProxyRefusal::Forbidden);
        c.proxy_refused(ProxyRefusal::Malformed);
        let text = c.render();
        for (reason, n) in [("untrusted", 0), ("forbidden", 2), ("malformed", 1)] {
            let line = format!("vpn_router_proxy_refused_total{{reason=\"{reason}\"}} {n}\n");
            assert!(text.contains(&line), "{line}: {text}");
        }
        assert_eq!(c.refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn every_refusal_has_its_label() {
        let c = SniCounters::default();
        c.refused(SniRefusal::Denied(Denial::NoMatch));
        c.refused(SniRefusal::NotTls);
        c.refused(SniRefusal::NotTls);
        let mut out = Exposition::new();
        c.metrics(&mut out);
        let text = out.into_string();
        for (label, n) in [("not_tls", 2), ("denied", 1), ("no_sni", 0), ("unknown", 0)] {
            let line = format!("vpn_router_sni_refused_total{{reason=\"{label}\"}} {n}\n");
            assert!(text.contains(&line), "{line}: {text}");
        }
        assert_eq!(c.refused_total("not_tls"), 2);
        assert!(text.contains("vpn_router_sni_tunnels_total 0\n"));
    }
}
