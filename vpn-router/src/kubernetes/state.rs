//! What `--kubernetes` tells `/metrics` and `/readyz` ([`KubeState`]).
//!
//! | series | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `vpn_router_kube_objects` | gauge | `kind` | objects of the kind held (as last listed and watched) |
//! | `vpn_router_kube_last_sync_timestamp_seconds` | gauge | | Unix time the policy was last built from the objects (0: not yet) |
//! | `vpn_router_kube_policy_builds_total` | counter | | policies built from the objects and swapped in |
//! | `vpn_router_kube_watch_errors_total` | counter | `kind` | failed lists and watches (a `410 Gone` too: the watch lists again) |
//! | `vpn_router_kube_object_problems` | gauge | `kind`, `namespace`, `name` | the object's fields the last build could not translate (the series goes once it translates) |
//!
//! Ready once the first policy built from a complete list of every kind is in force.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use netio::admin::{AdminState, Exposition, Kind as MetricKind};

use super::objects::{Kind, ObjectRef};
use super::translate::Problem;

/// The Kubernetes source's series and readiness.
#[derive(Debug, Default)]
pub struct KubeState {
    objects: [AtomicU64; Kind::ALL.len()],
    watch_errors: [AtomicU64; Kind::ALL.len()],
    last_sync: AtomicU64,
    builds: AtomicU64,
    problems: Mutex<BTreeMap<ObjectRef, usize>>,
    ready: AtomicBool,
}

fn index(kind: Kind) -> usize {
    Kind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or_default()
}

impl KubeState {
    /// `count` objects of `kind` are held.
    pub fn objects(&self, kind: Kind, count: usize) {
        self.objects[index(kind)].store(count as u64, Ordering::Relaxed);
    }

    /// A list or watch of `kind` failed.
    pub fn watch_error(&self, kind: Kind) {
        self.watch_errors[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    /// A policy built with `problems` is in force.
    pub fn built(&self, problems: &[Problem]) {
        let mut by_object: BTreeMap<ObjectRef, usize> = BTreeMap::new();
        for p in problems {
            *by_object.entry(p.object.clone()).or_default() += 1;
        }
        *self.problems.lock().unwrap_or_else(PoisonError::into_inner) = by_object;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last_sync.store(now, Ordering::Relaxed);
        self.builds.fetch_add(1, Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Policies built so far.
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }
}

impl AdminState for KubeState {
    fn metrics(&self, out: &mut Exposition) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let name = "vpn_router_kube_objects";
        out.family(name, MetricKind::Gauge, "Objects of the kind held.");
        for (kind, n) in Kind::ALL.iter().zip(&self.objects) {
            out.sample(name, &[("kind", kind.label())], get(n));
        }
        out.single(
            "vpn_router_kube_last_sync_timestamp_seconds",
            MetricKind::Gauge,
            "Unix time the policy was last built from the objects.",
            get(&self.last_sync),
        );
        out.single(
            "vpn_router_kube_policy_builds_total",
            MetricKind::Counter,
            "Policies built from the objects and swapped in.",
            get(&self.builds),
        );
        let name = "vpn_router_kube_watch_errors_total";
        out.family(name, MetricKind::Counter, "Failed lists and watches.");
        for (kind, n) in Kind::ALL.iter().zip(&self.watch_errors) {
            out.sample(name, &[("kind", kind.label())], get(n));
        }
        let name = "vpn_router_kube_object_problems";
        out.family(
            name,
            MetricKind::Gauge,
            "Fields of the object the last build could not translate.",
        );
        let problems = self.problems.lock().unwrap_or_else(PoisonError::into_inner);
        for (object, n) in problems.iter() {
            out.sample(
                name,
                &[
                    ("kind", object.kind.label()),
                    ("namespace", &object.namespace),
                    ("name", &object.name),
                ],
                *n as u64,
            );
        }
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}
