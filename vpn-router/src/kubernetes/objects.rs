//! The objects `--kubernetes` reads, as plain structs of only the fields it uses, and the
//! store of their current versions ([`Objects`]). Pure: decoding from JSON, no client.
//!
//! | kind | API | fields used |
//! | --- | --- | --- |
//! | `Service` | `v1`, names `vpn-seed-server`, `vpn-seed-server-0..4`, `kube-apiserver` | `spec.clusterIP`, `spec.ports[].port`, annotation `networking.istio.io/exportTo` |
//! | `Gateway` | `networking.istio.io/v1beta1` | `spec.selector`, `spec.servers[].port.number`, `.hosts`, `.tls.mode` |
//! | `VirtualService` | `networking.istio.io/v1beta1` | `spec.hosts`, `spec.gateways`, `spec.tls[].match[].sniHosts`, `spec.tls[].route[].destination`, `spec.http[].match`, `spec.http[].route[].destination` (`host`, `port.number`) |
//! | `Extension` | `extensions.gardener.cloud/v1alpha1`, `spec.type: acl` | `spec.type`, `spec.providerConfig.rule` (`action`, `type`, `cidrs`), `metadata.deletionTimestamp`, `status.lastOperation.type` |
//! | `Cluster` | `extensions.gardener.cloud/v1alpha1` (cluster-scoped, named after the shoot namespace) | `spec.shoot`: `metadata.name`, `spec.networking.nodes`, `spec.provider.workers`, `spec.hibernation.enabled`, `status.isHibernated`, `status.advertisedAddresses`; `spec.seed`: `spec.networks.nodes`, `spec.networks.pods` |
//! | `Infrastructure` | `extensions.gardener.cloud/v1alpha1` (named after the shoot) | `status.egressCIDRs` |
//!
//! Each is decoded leniently (every field optional); what a field must hold is checked by
//! the translation (`super::translate`), which names the field it refuses.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// The kinds read, in the order of their series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1` Service.
    Service,
    /// Istio Gateway.
    Gateway,
    /// Istio VirtualService.
    VirtualService,
    /// Gardener's extension object (`spec.type: acl`).
    Extension,
    /// Gardener's Cluster (the shoot and seed as the extensions see them).
    Cluster,
    /// Gardener's Infrastructure (the shoot's egress addresses).
    Infrastructure,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Kind::Service,
        Kind::Gateway,
        Kind::VirtualService,
        Kind::Extension,
        Kind::Cluster,
        Kind::Infrastructure,
    ];

    /// The `kind` label (the Kubernetes kind).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::Gateway => "Gateway",
            Kind::VirtualService => "VirtualService",
            Kind::Extension => "Extension",
            Kind::Cluster => "Cluster",
            Kind::Infrastructure => "Infrastructure",
        }
    }
}

/// One object: its kind, namespace (empty for a cluster-scoped one) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace; empty for `Cluster`.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ObjectRef {
    /// `kind` `namespace/name`.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind.label(), self.name)
        } else {
            write!(f, "{} {}/{}", self.kind.label(), self.namespace, self.name)
        }
    }
}

/// `(namespace, name)`.
pub type Key = (String, String);

/// A decoded object, or why its JSON did not decode.
pub type Decoded<T> = Result<T, String>;

/// The current version of every object read, decoded: the translation's only input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Objects {
    /// Services of the names routed.
    pub services: BTreeMap<Key, Decoded<Service>>,
    /// Gateways.
    pub gateways: BTreeMap<Key, Decoded<Gateway>>,
    /// VirtualServices.
    pub virtual_services: BTreeMap<Key, Decoded<VirtualService>>,
    /// Extensions (every type; only `acl` is used).
    pub extensions: BTreeMap<Key, Decoded<Extension>>,
    /// Clusters, by name (the shoot namespace; the namespace of the key is empty).
    pub clusters: BTreeMap<Key, Decoded<Cluster>>,
    /// Infrastructures.
    pub infrastructures: BTreeMap<Key, Decoded<Infrastructure>>,
}

impl Objects {
    /// How many objects of `kind` are held.
    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Service => self.services.len(),
            Kind::Gateway => self.gateways.len(),
            Kind::VirtualService => self.virtual_services.len(),
            Kind::Extension => self.extensions.len(),
            Kind::Cluster => self.clusters.len(),
            Kind::Infrastructure => self.infrastructures.len(),
        }
    }

    /// Stores (`Some`) or removes (`None`) the object `key` of `kind` from its JSON (the
    /// whole object: `metadata`, `spec`, `status`).
    pub fn set(&mut self, kind: Kind, key: Key, json: Option<&Value>) {
        fn put<T: for<'de> Deserialize<'de>>(
            map: &mut BTreeMap<Key, Decoded<T>>,
            key: Key,
            json: Option<&Value>,
        ) {
            match json {
                None => {
                    map.remove(&key);
                }
                Some(v) => {
                    map.insert(key, T::deserialize(v).map_err(|e| e.to_string()));
                }
            }
        }
        match kind {
            Kind::Service => put(&mut self.services, key, json),
            Kind::Gateway => put(&mut self.gateways, key, json),
            Kind::VirtualService => put(&mut self.virtual_services, key, json),
            Kind::Extension => put(&mut self.extensions, key, json),
            Kind::Cluster => put(&mut self.clusters, key, json),
            Kind::Infrastructure => put(&mut self.infrastructures, key, json),
        }
    }

    /// Replaces every object of `kind` (named `name`, if given: a stream selected by name)
    /// with `all` (a complete list: a relist).
    pub fn replace(&mut self, kind: Kind, name: Option<&str>, all: Vec<(Key, Value)>) {
        fn clear<T>(map: &mut BTreeMap<Key, Decoded<T>>, name: Option<&str>) {
            map.retain(|(_, n), _| name.is_some_and(|name| name != n));
        }
        match kind {
            Kind::Service => clear(&mut self.services, name),
            Kind::Gateway => clear(&mut self.gateways, name),
            Kind::VirtualService => clear(&mut self.virtual_services, name),
            Kind::Extension => clear(&mut self.extensions, name),
            Kind::Cluster => clear(&mut self.clusters, name),
            Kind::Infrastructure => clear(&mut self.infrastructures, name),
        }
        for (key, json) in all {
            self.set(kind, key, Some(&json));
        }
    }
}

/// `metadata` fields used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Meta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp`.
    pub deletion_timestamp: Option<String>,
}

/// A `v1` Service: where a route leads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Service {
    /// Its metadata.
    pub metadata: Meta,
    /// Its spec.
    pub spec: ServiceSpec,
}

/// The annotation through which Istio exports a Service to other namespaces.
pub const EXPORT_TO: &str = "networking.istio.io/exportTo";

impl Service {
    /// The namespaces the Service is exported to (`networking.istio.io/exportTo`, a comma
    /// list; `*` is every one); `None` without the annotation (Istio's default: all).
    pub fn export_to(&self) -> Option<Vec<&str>> {
        let list = self.metadata.annotations.get(EXPORT_TO)?;
        Some(list.split(',').map(str::trim).collect())
    }
}

/// `spec` fields of a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSpec {
    /// `spec.clusterIP`.
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// `spec.ports`.
    pub ports: Vec<ServicePort>,
}

/// One port of a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ServicePort {
    /// `port`.
    pub port: i64,
}

/// An Istio Gateway: which hosts a gateway (selected by labels) serves on which port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Gateway {
    /// Its spec.
    pub spec: GatewaySpec,
}

/// `spec` of a Gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct GatewaySpec {
    /// The labels of the gateway pods it applies to.
    pub selector: BTreeMap<String, String>,
    /// Its servers.
    pub servers: Vec<GatewayServer>,
}

/// One server of a Gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct GatewayServer {
    /// `port`.
    pub port: PortRef,
    /// `hosts` (`host` or `namespace/host`).
    pub hosts: Vec<String>,
    /// `tls`.
    pub tls: Option<ServerTls>,
}

/// `tls` of a Gateway server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ServerTls {
    /// `mode` (`PASSTHROUGH`, `SIMPLE`, `MUTUAL`, `OPTIONAL_MUTUAL`, ...).
    pub mode: Option<String>,
}

/// `port` (a Gateway server's, a destination's, a match's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PortRef {
    /// `number`.
    pub number: Option<i64>,
}

/// An Istio VirtualService: where a Gateway's hosts lead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VirtualService {
    /// Its spec.
    pub spec: VirtualServiceSpec,
}

/// `spec` of a VirtualService.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VirtualServiceSpec {
    /// `hosts`.
    pub hosts: Vec<String>,
    /// `gateways` (`name` or `namespace/name`).
    pub gateways: Vec<String>,
    /// `tls` routes (TLS passthrough).
    pub tls: Vec<TlsRoute>,
    /// `http` routes (Istio's TLS termination).
    pub http: Vec<HttpRoute>,
}

/// A `tls` route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct TlsRoute {
    /// `match`.
    #[serde(rename = "match")]
    pub matches: Vec<TlsMatch>,
    /// `route`.
    pub route: Vec<RouteDestination>,
}

/// One `match` of a `tls` route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsMatch {
    /// `sniHosts`.
    pub sni_hosts: Vec<String>,
    /// `port`.
    pub port: Option<i64>,
}

/// An `http` route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct HttpRoute {
    /// `match`: present on the `connection-upgrade` route, absent on the default route.
    #[serde(rename = "match")]
    pub matches: Vec<Value>,
    /// `route`.
    pub route: Vec<RouteDestination>,
}

/// A `route` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RouteDestination {
    /// `destination`.
    pub destination: Destination,
}

/// A destination.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Destination {
    /// `host`: a Service (`name`, `name.namespace...` or its cluster-local FQDN).
    pub host: String,
    /// `port`.
    pub port: PortRef,
}

/// Gardener's Extension object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Extension {
    /// Its metadata.
    pub metadata: Meta,
    /// Its spec.
    pub spec: ExtensionSpec,
    /// Its status.
    pub status: ExtensionStatus,
}

/// `spec` of an Extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtensionSpec {
    /// `type` (`acl` for the ACL extension).
    #[serde(rename = "type")]
    pub kind: String,
    /// `providerConfig`: the ACL extension's `{rule: {action, type, cidrs}}`.
    pub provider_config: Option<Value>,
}

/// `status` of an Extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtensionStatus {
    /// `lastOperation`.
    pub last_operation: Option<LastOperation>,
}

/// `status.lastOperation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LastOperation {
    /// `type` (`Reconcile`, `Migrate`, `Delete`, ...).
    #[serde(rename = "type")]
    pub kind: String,
}

/// Gardener's Cluster: the shoot and the seed as every extension sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Cluster {
    /// Its spec.
    pub spec: ClusterSpec,
}

/// `spec` of a Cluster (the shoot and seed are embedded whole; only these fields are read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ClusterSpec {
    /// `spec.shoot`.
    pub shoot: Shoot,
    /// `spec.seed`.
    pub seed: Seed,
}

/// The embedded Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Shoot {
    /// `metadata` (its name names the Infrastructure).
    pub metadata: Meta,
    /// `spec`.
    pub spec: ShootSpec,
    /// `status`.
    pub status: ShootStatus,
}

/// `spec` of the embedded Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ShootSpec {
    /// `networking`.
    pub networking: ShootNetworking,
    /// `provider`.
    pub provider: ShootProvider,
    /// `hibernation`.
    pub hibernation: Hibernation,
}

/// `spec.networking` of the Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ShootNetworking {
    /// `nodes`: the shoot's node network.
    pub nodes: Option<String>,
}

/// `spec.provider` of the Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ShootProvider {
    /// `workers` (only their number is used: a workerless shoot has none).
    pub workers: Vec<Value>,
}

/// `spec.hibernation` of the Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Hibernation {
    /// `enabled`.
    pub enabled: Option<bool>,
}

/// `status` of the Shoot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ShootStatus {
    /// `isHibernated`.
    pub is_hibernated: bool,
    /// `advertisedAddresses` (only whether there are any is used).
    pub advertised_addresses: Vec<Value>,
}

impl Shoot {
    /// Hibernated as the extensions judge it: hibernation enabled and done.
    pub fn is_hibernated(&self) -> bool {
        self.spec.hibernation.enabled == Some(true) && self.status.is_hibernated
    }
}

/// The embedded Seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Seed {
    /// `spec`.
    pub spec: SeedSpec,
}

/// `spec` of the embedded Seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct SeedSpec {
    /// `networks`.
    pub networks: SeedNetworks,
}

/// `spec.networks` of the Seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct SeedNetworks {
    /// `nodes` (optional in the Seed API).
    pub nodes: Option<String>,
    /// `pods`.
    pub pods: Option<String>,
}

/// Gardener's Infrastructure object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Infrastructure {
    /// `status`.
    pub status: InfrastructureStatus,
}

/// `status` of an Infrastructure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InfrastructureStatus {
    /// `egressCIDRs`: the shoot's NAT addresses, as the provider extension reports them.
    #[serde(rename = "egressCIDRs")]
    pub egress_cidrs: Vec<String>,
}
