//! From the objects Gardener and the ACL extension create to the router's routes and rules.
//! Pure: [`translate`] takes the current objects ([`Objects`]), the router's [`Settings`] and
//! each shoot's last good translation, and returns the routes, the new last good state and
//! every object it could not translate, with the field at fault.
//!
//! Per shoot namespace `<ns>`:
//!
//! * **CONNECT routes**, from the Services the Istio gateway's `cluster_header` route can
//!   reach (reference section 2.5), each exported to the router's namespace (annotation
//!   `networking.istio.io/exportTo` naming it or `*`, or absent: Istio's default):
//!   `vpn-seed-server` and `vpn-seed-server-0..4` route
//!   `outbound|1194||<name>.<ns>.svc.cluster.local`; `kube-apiserver` routes
//!   `outbound|443||kube-apiserver.<ns>.svc.cluster.local` and `<ns>--kube-apiserver-socket`
//!   (the apiserver-proxy's value under Istio's TLS termination). The upstream is the
//!   Service's `spec.clusterIP` and the value's port (which the Service must have).
//! * **SNI routes**, from each Gateway in `<ns>` whose `spec.selector` the router's labels
//!   satisfy, its servers on port 443, and the VirtualServices in `<ns>` bound to it: a `tls`
//!   route's `sniHosts` (passthrough), or, for `http` routes (Istio's TLS termination), the
//!   VirtualService's `hosts` with the route without `match` (the default); in both only
//!   the hosts the Gateway serves. The upstream is the destination Service (in `<ns>`, one
//!   of those above) at the destination port. A server name several shoots claim goes by
//!   the rule of `--config-dir` (`config_dir::owners`).
//! * **Rules**, from the ACL extension's Extension (`spec.type: acl`) in `<ns>`, applied to
//!   every route of the shoot, CONNECT and SNI: first an allow of the networks the extension
//!   always adds (seed nodes and pods from the Cluster's seed, the operator's additional
//!   CIDRs, and for a shoot with workers its node network and its Infrastructure's
//!   `status.egressCIDRs`), judged by the client address; then the user's rule (`allow`:
//!   its CIDRs; `deny`: its CIDRs denied, everyone else allowed), judging the client address
//!   for `remote_ip` and the TCP peer for `direct_remote_ip` and `source_ip`. An Extension
//!   being deleted or migrated away has no rules.
//!
//! What the ACL extension does not reconcile, the router does not change either: without
//! the Cluster, without `status.advertisedAddresses` (a shoot still being created), or,
//! for a shoot with workers, without its Infrastructure, the shoot's last good rules stay
//! (none if it never had any) and the gap is reported. A hibernated shoot is translated
//! as any other: its objects stay while it sleeps, so its routes and rules do too (its
//! Services have no pods: a connection is answered 503).
//!
//! An object that cannot be translated (a bad CIDR, a Service without a cluster IP or the
//! port, a server name that is no DNS name, ...) is a [`Problem`] naming the object and the
//! field; the shoot's routes (or rules) keep their last good version, and every other shoot
//! changes as its objects say. A shoot whose objects are all gone has no routes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use netio::ingress::canonical_net;
use protocol::http::route::{RouteValue, Service as RoutedService, CLUSTER_SUFFIX};
use serde_json::Value;

use super::objects::{
    Decoded, Destination, Extension, Gateway, Kind, ObjectRef, Objects, Service, VirtualService,
};
use crate::access::{Action, Rule, Source};
use crate::client_hello::ServerName;
use crate::config_dir::owners::{owners, Owner};
use crate::policy::{Policy, Target};

/// The Service names routed, as the watcher selects them (`metadata.name=...`).
pub const ROUTED_SERVICES: [&str; 7] = [
    "vpn-seed-server",
    "vpn-seed-server-0",
    "vpn-seed-server-1",
    "vpn-seed-server-2",
    "vpn-seed-server-3",
    "vpn-seed-server-4",
    "kube-apiserver",
];

/// The port every SNI route is served on (the Gateway's, Istio's Service port 443 → 9443).
pub const SNI_PORT: i64 = 443;

/// The router's own settings the translation needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The router's namespace: Services must be exported to it.
    pub namespace: String,
    /// The router's pod labels: a Gateway applies when its selector is a subset.
    pub labels: BTreeMap<String, String>,
    /// The operator's additional always-allowed networks of the ACL extension
    /// (`--additional-allowed-cidrs`).
    pub additional_allowed: Vec<IpNet>,
}

/// One shoot's routes: CONNECT values and SNI names, with their upstreams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShootRoutes {
    /// Routing value → `host:port`.
    pub connect: Vec<(RouteValue, String)>,
    /// Server name → (`host:port`, the VirtualService that names it).
    pub sni: BTreeMap<ServerName, (String, ObjectRef)>,
}

/// Each shoot's last good translation: what stays while its objects cannot be translated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LastGood {
    /// Routes, by namespace.
    pub routes: BTreeMap<String, ShootRoutes>,
    /// Rules, by namespace (absent: no ACL).
    pub rules: BTreeMap<String, Vec<Rule>>,
}

/// An object, or a field of it, that cannot be translated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// The object.
    pub object: ObjectRef,
    /// The field at fault (`spec.providerConfig.rule.cidrs[1]`), empty for the whole object.
    pub field: String,
    /// Why.
    pub reason: String,
}

impl Problem {
    fn new(object: ObjectRef, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            object,
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.object, self.reason)
        } else {
            write!(f, "{} field {}: {}", self.object, self.field, self.reason)
        }
    }
}

/// What [`translate`] found.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// The routes and SNI routes (with their rules) of every shoot.
    pub policy: Policy,
    /// The new last good state.
    pub last_good: LastGood,
    /// What could not be translated, sorted.
    pub problems: Vec<Problem>,
}

/// Translates `objects` (see the module docs). `seed_names` are the server names the
/// router's own config file routes: no shoot may claim them.
pub fn translate(
    objects: &Objects,
    settings: &Settings,
    last: &LastGood,
    seed_names: &dyn Fn(&ServerName) -> bool,
) -> Translation {
    let mut problems = Vec::new();
    let mut last_good = LastGood::default();
    for ns in namespaces(objects) {
        let (routes, mut found) = shoot_routes(objects, settings, &ns);
        if found.is_empty() {
            last_good.routes.insert(ns.clone(), routes);
        } else if let Some(kept) = last.routes.get(&ns) {
            last_good.routes.insert(ns.clone(), kept.clone());
        }
        problems.append(&mut found);
        match shoot_rules(objects, settings, &ns) {
            Ok(Some(rules)) => {
                last_good.rules.insert(ns.clone(), rules);
            }
            Ok(None) => {}
            Err(mut found) => {
                if let Some(kept) = last.rules.get(&ns) {
                    last_good.rules.insert(ns.clone(), kept.clone());
                }
                problems.append(&mut found);
            }
        }
    }
    let mut policy = Policy::default();
    for (ns, routes) in &last_good.routes {
        let rules = last_good.rules.get(ns).cloned().unwrap_or_default();
        for (value, upstream) in &routes.connect {
            policy.routes.insert(
                value.clone(),
                Target {
                    upstream: upstream.clone(),
                    rules: rules.clone(),
                    shoot: None,
                },
            );
        }
    }
    policy.sni_routes = sni_routes(&last_good, seed_names, &mut problems);
    problems.sort();
    problems.dedup();
    Translation {
        policy,
        last_good,
        problems,
    }
}

/// The SNI routes by the ownership rule; a claim it does not grant is a problem of the
/// VirtualService that makes it.
fn sni_routes(
    last_good: &LastGood,
    seed_names: &dyn Fn(&ServerName) -> bool,
    problems: &mut Vec<Problem>,
) -> HashMap<ServerName, Target> {
    let claims: BTreeMap<String, BTreeSet<ServerName>> = last_good
        .routes
        .iter()
        .map(|(ns, r)| (ns.clone(), r.sni.keys().cloned().collect()))
        .collect();
    let owner_of = owners(&claims, seed_names);
    let mut out = HashMap::new();
    for (ns, routes) in &last_good.routes {
        let rules = last_good.rules.get(ns).cloned().unwrap_or_default();
        for (name, (upstream, object)) in &routes.sni {
            match &owner_of[name] {
                Owner::File(owner) if owner == ns => {
                    out.insert(
                        name.clone(),
                        Target {
                            upstream: upstream.clone(),
                            rules: rules.clone(),
                            shoot: Some(ns.clone()),
                        },
                    );
                }
                Owner::File(owner) => problems.push(Problem::new(
                    object.clone(),
                    "spec.hosts",
                    format!("server name {name} is shoot {owner}'s"),
                )),
                Owner::Seed => problems.push(Problem::new(
                    object.clone(),
                    "spec.hosts",
                    format!("server name {name} is routed by the router's config file"),
                )),
                Owner::Contested(all) => problems.push(Problem::new(
                    object.clone(),
                    "spec.hosts",
                    format!(
                        "server name {name} is claimed by {} and names none of them",
                        all.join(", ")
                    ),
                )),
            }
        }
    }
    out
}

/// Every namespace holding an object that routes or rules.
fn namespaces(objects: &Objects) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    out.extend(objects.services.keys().map(|(ns, _)| ns.clone()));
    out.extend(objects.gateways.keys().map(|(ns, _)| ns.clone()));
    out.extend(objects.virtual_services.keys().map(|(ns, _)| ns.clone()));
    out.extend(objects.extensions.keys().map(|(ns, _)| ns.clone()));
    out
}

/// The objects of `map` in namespace `ns`.
fn in_ns<'a, T>(
    map: &'a BTreeMap<(String, String), Decoded<T>>,
    ns: &'a str,
) -> impl Iterator<Item = (&'a str, &'a Decoded<T>)> + 'a {
    map.range((ns.to_owned(), String::new())..)
        .take_while(move |((n, _), _)| n == ns)
        .map(|((_, name), v)| (name.as_str(), v))
}

/// The Service routed as `name`, if it is one.
fn routed_service(name: &str) -> Option<RoutedService> {
    if name == "kube-apiserver" {
        return Some(RoutedService::KubeApiserver);
    }
    let rest = name.strip_prefix("vpn-seed-server")?;
    if rest.is_empty() {
        return Some(RoutedService::VpnSeedServer { replica: None });
    }
    let replica: u8 = rest.strip_prefix('-')?.parse().ok()?;
    (rest.len() == 2 && replica <= protocol::http::route::MAX_VPN_REPLICA).then_some(
        RoutedService::VpnSeedServer {
            replica: Some(replica),
        },
    )
}

/// Whether the Service is exported to namespace `ours`.
fn exported(service: &Service, ours: &str) -> bool {
    service
        .export_to()
        .is_none_or(|list| list.iter().any(|n| *n == "*" || *n == ours))
}

/// `clusterIP:port` of `service`, which must have `port`.
fn upstream(service: &Service, port: i64) -> Result<String, (&'static str, String)> {
    let ip = service.spec.cluster_ip.as_deref().unwrap_or_default();
    let ip: IpAddr = ip.parse().map_err(|_| {
        (
            "spec.clusterIP",
            format!("{ip:?} is no IP address (a headless Service cannot be routed)"),
        )
    })?;
    if !service.spec.ports.iter().any(|p| p.port == port) {
        return Err(("spec.ports", format!("no port {port}")));
    }
    let port = u16::try_from(port).map_err(|_| ("spec.ports", format!("port {port}")))?;
    Ok(SocketAddr::new(ip, port).to_string())
}

/// The CONNECT and SNI routes of namespace `ns`, and what could not be translated.
fn shoot_routes(objects: &Objects, settings: &Settings, ns: &str) -> (ShootRoutes, Vec<Problem>) {
    let mut routes = ShootRoutes::default();
    let mut problems = Vec::new();
    for (name, service) in in_ns(&objects.services, ns) {
        let Some(routed) = routed_service(name) else {
            continue;
        };
        let object = ObjectRef::new(Kind::Service, ns, name);
        let service = match service {
            Ok(s) => s,
            Err(e) => {
                problems.push(Problem::new(object, "", e.clone()));
                continue;
            }
        };
        if !exported(service, &settings.namespace) {
            continue;
        }
        let to = match upstream(service, i64::from(routed.port())) {
            Ok(to) => to,
            Err((field, reason)) => {
                problems.push(Problem::new(object, field, reason));
                continue;
            }
        };
        let mut values = vec![RouteValue::new(routed, ns)];
        if routed == RoutedService::KubeApiserver {
            values.push(RouteValue::new(RoutedService::KubeApiserverSocket, ns));
        }
        for value in values {
            match value {
                Ok(v) => routes.connect.push((v, to.clone())),
                Err(e) => problems.push(Problem::new(
                    object.clone(),
                    "metadata.namespace",
                    format!("no routing value: {e}"),
                )),
            }
        }
    }
    for (name, gateway) in in_ns(&objects.gateways, ns) {
        let object = ObjectRef::new(Kind::Gateway, ns, name);
        match gateway {
            Ok(g) if selects(g, &settings.labels) => {
                sni_of_gateway(objects, ns, name, g, &mut routes, &mut problems);
            }
            Ok(_) => {}
            Err(e) => problems.push(Problem::new(object, "", e.clone())),
        }
    }
    (routes, problems)
}

/// Whether the Gateway applies to the router (its selector a subset of the labels).
fn selects(gateway: &Gateway, labels: &BTreeMap<String, String>) -> bool {
    gateway
        .spec
        .selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// A Gateway host without its `namespace/` part.
fn bare_host(host: &str) -> &str {
    host.split_once('/').map_or(host, |(_, h)| h)
}

/// The SNI routes of the VirtualServices of `ns` bound to Gateway `gw_name`.
fn sni_of_gateway(
    objects: &Objects,
    ns: &str,
    gw_name: &str,
    gateway: &Gateway,
    routes: &mut ShootRoutes,
    problems: &mut Vec<Problem>,
) {
    let served: BTreeSet<&str> = gateway
        .spec
        .servers
        .iter()
        .filter(|s| s.port.number == Some(SNI_PORT))
        .flat_map(|s| s.hosts.iter().map(|h| bare_host(h)))
        .collect();
    if served.is_empty() {
        return;
    }
    let qualified = format!("{ns}/{gw_name}");
    for (vs_name, vs) in in_ns(&objects.virtual_services, ns) {
        let object = ObjectRef::new(Kind::VirtualService, ns, vs_name);
        let vs = match vs {
            Ok(vs) => vs,
            Err(e) => {
                problems.push(Problem::new(object, "", e.clone()));
                continue;
            }
        };
        if !vs
            .spec
            .gateways
            .iter()
            .any(|g| *g == gw_name || *g == qualified)
        {
            continue;
        }
        for (field, host, destination) in vs_targets(vs) {
            if !served.contains(bare_host(host)) {
                continue;
            }
            let name = match ServerName::parse(bare_host(host).as_bytes()) {
                Ok(n) => n,
                Err(e) => {
                    problems.push(Problem::new(
                        object.clone(),
                        field,
                        format!("{host:?}: {e}"),
                    ));
                    continue;
                }
            };
            match destination_upstream(objects, ns, destination) {
                Ok(Some(to)) => {
                    routes.sni.insert(name, (to, object.clone()));
                }
                // The destination Service is not (yet, or no longer) there: no route.
                Ok(None) => {}
                Err((field, reason)) => problems.push(Problem::new(object.clone(), field, reason)),
            }
        }
    }
}

/// Each host a VirtualService routes, with the field naming it and its destination: a
/// `tls` route's `sniHosts` (on port 443 or any), or, for `http` routes, its `hosts` with
/// the destination of the route without `match`.
fn vs_targets(vs: &VirtualService) -> Vec<(String, &str, &Destination)> {
    let mut out = Vec::new();
    for (i, route) in vs.spec.tls.iter().enumerate() {
        let Some(first) = route.route.first() else {
            continue;
        };
        for (j, m) in route.matches.iter().enumerate() {
            if m.port.is_some_and(|p| p != SNI_PORT) {
                continue;
            }
            for host in &m.sni_hosts {
                out.push((
                    format!("spec.tls[{i}].match[{j}].sniHosts"),
                    host.as_str(),
                    &first.destination,
                ));
            }
        }
    }
    let default = vs.spec.http.iter().find(|r| r.matches.is_empty());
    if let Some(first) = default.and_then(|r| r.route.first()) {
        for host in &vs.spec.hosts {
            out.push(("spec.hosts".to_owned(), host.as_str(), &first.destination));
        }
    }
    out
}

/// `clusterIP:port` of a destination: a routed Service of namespace `ns`. `Ok(None)`: the
/// Service is not there.
fn destination_upstream(
    objects: &Objects,
    ns: &str,
    destination: &Destination,
) -> Result<Option<String>, (&'static str, String)> {
    let host = destination.host.as_str();
    let short = host.strip_suffix(CLUSTER_SUFFIX).unwrap_or(host);
    let (service, namespace) = short.split_once('.').unwrap_or((short, ns));
    if namespace != ns {
        return Err((
            "destination.host",
            format!("{host:?} is not a Service of namespace {ns}"),
        ));
    }
    let Some(found) = objects.services.get(&(ns.to_owned(), service.to_owned())) else {
        return Ok(None);
    };
    let Ok(found) = found else {
        // Reported with the Service.
        return Ok(None);
    };
    let port = match destination.port.number {
        Some(p) => p,
        None => match found.spec.ports.as_slice() {
            [one] => one.port,
            _ => {
                return Err((
                    "destination.port",
                    format!("none, and Service {service} has not exactly one"),
                ))
            }
        },
    };
    upstream(found, port).map(Some).map_err(|(field, reason)| {
        (
            "destination",
            format!("Service {service} {field}: {reason}"),
        )
    })
}

/// The rules of namespace `ns` from its ACL Extension: `Ok(None)` without one.
fn shoot_rules(
    objects: &Objects,
    settings: &Settings,
    ns: &str,
) -> Result<Option<Vec<Rule>>, Vec<Problem>> {
    let mut acl = None;
    for (name, ext) in in_ns(&objects.extensions, ns) {
        let object = ObjectRef::new(Kind::Extension, ns, name);
        match ext {
            Ok(e) if e.spec.kind == "acl" => acl = Some((object, e)),
            Ok(_) => {}
            Err(e) => return Err(vec![Problem::new(object, "", e.clone())]),
        }
    }
    let Some((object, ext)) = acl else {
        return Ok(None);
    };
    let migrated = ext
        .status
        .last_operation
        .as_ref()
        .is_some_and(|op| op.kind == "Migrate");
    if ext.metadata.deletion_timestamp.is_some() || migrated {
        return Ok(None);
    }
    let rule = user_rule(&object, ext).map_err(|p| vec![p])?;
    let always = always_allowed(objects, settings, ns, &object)?;
    let mut rules = Vec::new();
    if !always.is_empty() {
        rules.push(Rule::allow(always));
    }
    let deny = rule.action == Action::Deny;
    rules.push(rule);
    if deny {
        rules.push(Rule::allow(vec![
            "0.0.0.0/0".parse().expect("literal"),
            "::/0".parse().expect("literal"),
        ]));
    }
    Ok(Some(rules))
}

/// The rule of an ACL Extension's `spec.providerConfig.rule`, checked as the extension
/// checks it.
fn user_rule(object: &ObjectRef, ext: &Extension) -> Result<Rule, Problem> {
    let field = "spec.providerConfig.rule";
    let bad = |f: &str, why: String| Problem::new(object.clone(), f, why);
    let rule = ext
        .spec
        .provider_config
        .as_ref()
        .and_then(|c| c.get("rule"))
        .ok_or_else(|| bad(field, "missing".into()))?;
    let text = |key: &str| rule.get(key).and_then(Value::as_str).map(str::to_lowercase);
    let action = match text("action").as_deref() {
        Some("allow") => Action::Allow,
        Some("deny") => Action::Deny,
        other => {
            return Err(bad(
                "spec.providerConfig.rule.action",
                format!("{other:?}: must be allow or deny"),
            ))
        }
    };
    let source = match text("type").as_deref() {
        Some("remote_ip") => Source::Proxy,
        Some("direct_remote_ip" | "source_ip") => Source::Peer,
        other => {
            return Err(bad(
                "spec.providerConfig.rule.type",
                format!("{other:?}: must be remote_ip, direct_remote_ip or source_ip"),
            ))
        }
    };
    let cidrs = rule.get("cidrs").and_then(Value::as_array);
    let Some(cidrs) = cidrs.filter(|c| !c.is_empty()) else {
        return Err(bad(
            "spec.providerConfig.rule.cidrs",
            "missing or empty".into(),
        ));
    };
    let mut from = Vec::new();
    for (i, cidr) in cidrs.iter().enumerate() {
        let net = cidr.as_str().and_then(|s| s.parse::<IpNet>().ok());
        let Some(net) = net else {
            return Err(bad(
                &format!("spec.providerConfig.rule.cidrs[{i}]"),
                format!("{cidr} is no CIDR"),
            ));
        };
        from.push(canonical_net(net.trunc()));
    }
    Ok(Rule {
        action,
        from,
        source,
    })
}

/// The networks the ACL extension always allows for shoot `ns`.
fn always_allowed(
    objects: &Objects,
    settings: &Settings,
    ns: &str,
    extension: &ObjectRef,
) -> Result<Vec<IpNet>, Vec<Problem>> {
    let cluster_ref = ObjectRef::new(Kind::Cluster, "", ns);
    let cluster = match objects.clusters.get(&(String::new(), ns.to_owned())) {
        None => {
            return Err(vec![Problem::new(
                extension.clone(),
                "",
                format!("no {cluster_ref} yet: the shoot's last allow-list stays"),
            )])
        }
        Some(Err(e)) => return Err(vec![Problem::new(cluster_ref, "", e.clone())]),
        Some(Ok(c)) => c,
    };
    let shoot = &cluster.spec.shoot;
    if shoot.status.advertised_addresses.is_empty() {
        return Err(vec![Problem::new(
            cluster_ref,
            "spec.shoot.status.advertisedAddresses",
            "none yet (the ACL extension waits for them too): the shoot's last allow-list stays",
        )]);
    }
    let seed = &cluster.spec.seed.spec.networks;
    let mut texts: Vec<&str> = [seed.nodes.as_deref(), seed.pods.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    if !shoot.spec.provider.workers.is_empty() {
        texts.extend(shoot.spec.networking.nodes.as_deref());
        let key = (ns.to_owned(), shoot.metadata.name.clone());
        let infra_ref = ObjectRef::new(Kind::Infrastructure, ns, &shoot.metadata.name);
        match objects.infrastructures.get(&key) {
            None => {
                return Err(vec![Problem::new(
                    extension.clone(),
                    "",
                    format!("no {infra_ref} yet: the shoot's last allow-list stays"),
                )])
            }
            Some(Err(e)) => return Err(vec![Problem::new(infra_ref, "", e.clone())]),
            Some(Ok(infra)) => texts.extend(infra.status.egress_cidrs.iter().map(String::as_str)),
        }
    }
    // As the extension: a network that does not parse is left out.
    let mut nets: Vec<IpNet> = texts
        .into_iter()
        .filter_map(|t| t.parse::<IpNet>().ok())
        .map(|n| canonical_net(n.trunc()))
        .collect();
    nets.extend(settings.additional_allowed.iter().copied());
    Ok(nets)
}

#[cfg(test)]
mod tests;
