//! The watches: one kube-runtime `watcher` per kind (per Service name), each feeding the
//! store of current objects, and the loop that rebuilds the policy from the store when it
//! changed.
//!
//! A watcher lists, then watches from the list's `resourceVersion`; a watch that ends is
//! resumed from the last version seen, one answered `410 Gone` (the version is too old)
//! lists again, and failures back off (kube-runtime's default: exponential, at most about a
//! minute between attempts). A list in progress is buffered and replaces the objects of its
//! stream only once complete (`InitDone`), so a relist never shows the rebuild a partial set:
//! no route is dropped between a broken watch and the new list.
//!
//! The rebuild waits [`DEBOUNCE`] after a change so a burst (a shoot's objects created
//! together, a relist) makes one policy, then translates the whole store
//! (`super::translate`), logs each problem that is new, and swaps the policy in. The first
//! build waits for a complete list of every stream; `/readyz` says ready from then on.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::objects::{Key, Kind, Objects};
use super::state::KubeState;
use super::translate::{translate, LastGood, Problem, Settings, ROUTED_SERVICES};
use crate::policy::Policy;

/// How long a rebuild waits after a change for more changes.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// One watched stream: a kind, with a Service name for Services (a field selector).
#[derive(Debug, Clone)]
struct Stream {
    kind: Kind,
    resource: ApiResource,
    name: Option<&'static str>,
}

/// Every stream watched.
fn streams() -> Vec<Stream> {
    let crd = |kind, group, version, k| Stream {
        kind,
        resource: ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, k)),
        name: None,
    };
    let mut out: Vec<Stream> = ROUTED_SERVICES
        .iter()
        .map(|name| Stream {
            kind: Kind::Service,
            resource: ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            name: Some(name),
        })
        .collect();
    out.extend([
        crd(Kind::Gateway, "networking.istio.io", "v1beta1", "Gateway"),
        crd(
            Kind::VirtualService,
            "networking.istio.io",
            "v1beta1",
            "VirtualService",
        ),
        crd(
            Kind::Extension,
            "extensions.gardener.cloud",
            "v1alpha1",
            "Extension",
        ),
        crd(
            Kind::Cluster,
            "extensions.gardener.cloud",
            "v1alpha1",
            "Cluster",
        ),
        crd(
            Kind::Infrastructure,
            "extensions.gardener.cloud",
            "v1alpha1",
            "Infrastructure",
        ),
    ]);
    out
}

/// The store every watcher writes and the rebuild reads.
#[derive(Debug, Default)]
struct Store {
    objects: Objects,
    /// The streams that completed a list at least once.
    listed: BTreeSet<usize>,
}

/// The shared parts of the source.
#[derive(Debug)]
struct Source {
    store: Mutex<Store>,
    changed: Notify,
    state: Arc<KubeState>,
    streams: usize,
}

/// Starts the watches and the rebuild loop; `install` swaps in each policy built (with
/// `base`'s routes, SNI routes and always-allowed networks over the translated ones). They
/// run until `shutdown`.
pub fn spawn(
    client: Client,
    settings: Settings,
    base: Policy,
    install: impl Fn(Policy) + Send + Sync + 'static,
    state: Arc<KubeState>,
    shutdown: &CancellationToken,
) {
    let streams = streams();
    let source = Arc::new(Source {
        store: Mutex::default(),
        changed: Notify::new(),
        state,
        streams: streams.len(),
    });
    for (i, stream) in streams.into_iter().enumerate() {
        let source = Arc::clone(&source);
        let client = client.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = watch(client, i, stream, &source) => {}
            }
        });
    }
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = rebuild(&source, &settings, &base, &install) => {}
        }
    });
}

/// Feeds stream `i` into the store, forever.
async fn watch(client: Client, i: usize, stream: Stream, source: &Source) {
    let api: Api<DynamicObject> = Api::all_with(client, &stream.resource);
    let mut config = watcher::Config::default();
    if let Some(name) = stream.name {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut buffer: Option<Vec<(Key, serde_json::Value)>> = None;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                source.state.watch_error(stream.kind);
                warn!(kind = stream.kind.label(), name = ?stream.name, "kubernetes list or watch failed, retrying: {e}");
                continue;
            }
        };
        let mut store = source.store.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Init => buffer = Some(Vec::new()),
            Event::InitApply(o) => buffer.get_or_insert_with(Vec::new).push(entry(&o)),
            Event::InitDone => {
                let all = buffer.take().unwrap_or_default();
                let n = all.len();
                store.objects.replace(stream.kind, stream.name, all);
                if store.listed.insert(i) {
                    info!(
                        kind = stream.kind.label(),
                        name = ?stream.name,
                        objects = n,
                        "kubernetes objects listed"
                    );
                }
            }
            Event::Apply(o) => {
                let (key, json) = entry(&o);
                store.objects.set(stream.kind, key, Some(&json));
            }
            Event::Delete(o) => {
                let (key, _) = entry(&o);
                store.objects.set(stream.kind, key, None);
            }
        }
        source
            .state
            .objects(stream.kind, store.objects.count(stream.kind));
        drop(store);
        source.changed.notify_one();
    }
}

/// An object's key and JSON.
fn entry(o: &DynamicObject) -> (Key, serde_json::Value) {
    let key = (
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    );
    (key, serde_json::to_value(o).unwrap_or_default())
}

/// Rebuilds and installs the policy after each change, forever.
async fn rebuild(
    source: &Source,
    settings: &Settings,
    base: &Policy,
    install: &(impl Fn(Policy) + Send + Sync),
) {
    let mut last = LastGood::default();
    let mut reported: BTreeSet<Problem> = BTreeSet::new();
    let seed_names = |name: &crate::client_hello::ServerName| base.sni_routes.contains_key(name);
    loop {
        source.changed.notified().await;
        tokio::time::sleep(DEBOUNCE).await;
        let translation = {
            let store = source.store.lock().unwrap_or_else(PoisonError::into_inner);
            if store.listed.len() < source.streams {
                continue;
            }
            translate(&store.objects, settings, &last, &seed_names)
        };
        for problem in &translation.problems {
            if !reported.contains(problem) {
                warn!(object = %problem.object, field = %problem.field, "kubernetes object not translated, the shoot keeps its last good routes and rules: {problem}");
            }
        }
        reported = translation.problems.iter().cloned().collect();
        last = translation.last_good;
        let policy = merged(base, translation.policy);
        let (routes, sni) = (policy.routes.len(), policy.sni_routes.len());
        install(policy);
        source.state.built(&translation.problems);
        if source.state.builds() == 1 {
            info!(
                routes,
                sni_routes = sni,
                problems = reported.len(),
                "first policy from kubernetes in force"
            );
        }
    }
}

/// The translated policy under `base` (the config file's): the file's routes and SNI routes
/// win, its always-allowed networks apply.
pub fn merged(base: &Policy, mut kube: Policy) -> Policy {
    kube.routes
        .extend(base.routes.iter().map(|(k, v)| (k.clone(), v.clone())));
    kube.sni_routes
        .extend(base.sni_routes.iter().map(|(k, v)| (k.clone(), v.clone())));
    kube.always_allowed = base.always_allowed.clone();
    kube
}
