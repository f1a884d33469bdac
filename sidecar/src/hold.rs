//! CONNECTs held while their route to the shoot is away (a client reconnecting, the tunnel
//! down): at most `max_held` at once ([`HeldSet::enter`]; the next gets 503 at once), each
//! timed and counted by how its wait ended ([`SidecarMetrics::hold_ended`]), and one log line
//! when the first begins to wait and one when the last stopped (a *reconnect window*), never a
//! line per request.
//!
//! What a held CONNECT waits on is the caller's (`proxy::open`): in process, the server's
//! route changes ([`crate::RouteCheck::changes`]); alone, the next dial [`crate::HOLD_RETRY`]
//! later.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::metrics::{HoldEnd, SidecarMetrics};

/// The CONNECTs waiting for a route now, and the reconnect window they belong to.
#[derive(Debug, Default)]
pub(crate) struct HeldSet {
    state: Mutex<Window>,
}

/// One reconnect window: from the first CONNECT held to the moment none is.
#[derive(Debug, Default)]
struct Window {
    /// CONNECTs waiting now.
    waiting: usize,
    /// When the window opened (the first one held).
    since: Option<Instant>,
    routed: u64,
    timed_out: u64,
    cancelled: u64,
    overflowed: u64,
    longest: Duration,
}

/// One held CONNECT; [`Held::end`] says how its wait ended (dropped without: cancelled, the
/// client or the sidecar went away).
#[derive(Debug)]
pub(crate) struct Held<'a> {
    set: &'a HeldSet,
    metrics: &'a SidecarMetrics,
    started: Instant,
    ended: bool,
}

impl HeldSet {
    /// A place for a CONNECT to `target` that finds no route, or `None` when `max` wait
    /// already (counted: the caller answers 503 at once). The first in a window logs that
    /// requests now wait, with the bound.
    pub(crate) fn enter<'a>(
        &'a self,
        max: usize,
        bound: Duration,
        target: &str,
        metrics: &'a SidecarMetrics,
    ) -> Option<Held<'a>> {
        let mut w = self.lock();
        if w.waiting >= max {
            w.overflowed += 1;
            let total = metrics.hold_overflowed();
            if w.overflowed == 1 {
                warn!(
                    max_held = max,
                    overflowed_total = total,
                    "CONNECTs waiting for a route: limit reached, the next get 503 at once (logged once per window)"
                );
            }
            return None;
        }
        if w.waiting == 0 && w.since.is_none() {
            w.since = Some(Instant::now());
            info!(
                first_target = target,
                bound_ms = millis(bound),
                "no VPN route to the shoot: CONNECTs wait for the tunnel (one line when it is back)"
            );
        }
        w.waiting += 1;
        metrics.hold_started();
        Some(Held {
            set: self,
            metrics,
            started: Instant::now(),
            ended: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One wait ended after `waited`; the last one of a window logs the window.
    fn leave(&self, end: HoldEnd, waited: Duration) {
        let mut w = self.lock();
        w.waiting = w.waiting.saturating_sub(1);
        w.longest = w.longest.max(waited);
        match end {
            HoldEnd::Routed => w.routed += 1,
            HoldEnd::Timeout => w.timed_out += 1,
            HoldEnd::Cancelled => w.cancelled += 1,
        }
        if w.waiting > 0 {
            return;
        }
        let window = std::mem::take(&mut *w);
        drop(w);
        let open_ms = window.since.map_or(0, |s| millis(s.elapsed()));
        info!(
            routed = window.routed,
            timed_out = window.timed_out,
            cancelled = window.cancelled,
            overflowed = window.overflowed,
            longest_wait_ms = millis(window.longest),
            window_ms = open_ms,
            "CONNECTs no longer wait for a VPN route"
        );
    }
}

impl Held<'_> {
    /// The wait ended (`Routed` or `Timeout`); how long it took.
    pub(crate) fn end(mut self, end: HoldEnd) -> Duration {
        self.ended = true;
        let waited = self.started.elapsed();
        self.metrics.hold_ended(end, waited);
        self.set.leave(end, waited);
        waited
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let waited = self.started.elapsed();
            self.metrics.hold_ended(HoldEnd::Cancelled, waited);
            self.set.leave(HoldEnd::Cancelled, waited);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_every_end_is_counted() {
        let metrics = SidecarMetrics::default();
        let set = HeldSet::default();
        let a = set
            .enter(2, Duration::from_secs(1), "a", &metrics)
            .expect("first");
        let b = set
            .enter(2, Duration::from_secs(1), "b", &metrics)
            .expect("second");
        assert!(set
            .enter(2, Duration::from_secs(1), "c", &metrics)
            .is_none());
        a.end(HoldEnd::Routed);
        drop(b);
        let text = metrics.render();
        for line in [
            "vpn_sidecar_held 0",
            "vpn_sidecar_held_total{end=\"routed\"} 1",
            "vpn_sidecar_held_total{end=\"cancelled\"} 1",
            "vpn_sidecar_held_total{end=\"timeout\"} 0",
            "vpn_sidecar_held_overflow_total 1",
            "vpn_sidecar_hold_ms_count{envoy_cluster_name=\"dynamic_forward_proxy_cluster\"} 2",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "{line} in\n{text}");
        }
        // The window closed: a new one admits again.
        assert!(set
            .enter(2, Duration::from_secs(1), "d", &metrics)
            .is_some());
    }
}
