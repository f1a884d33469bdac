//! The translation on objects shaped as Gardener and the ACL extension create them
//! (`docs/research/gardener-ingress-objects.md`: the fields and values their code sets,
//! written here as JSON by hand).

use serde_json::json;

use super::*;
use crate::access::{AlwaysAllowed, Client, Denial};

const ISTIO_NS: &str = "istio-ingress";

fn settings() -> Settings {
    Settings {
        namespace: ISTIO_NS.into(),
        labels: [
            ("app", "istio-ingressgateway"),
            ("istio", "ingressgateway"),
            ("istio-role", "seed"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        additional_allowed: vec!["198.18.0.0/15".parse().unwrap()],
    }
}

/// A Service as seedserver.go / apiserverexposure write it: ClusterIP, the ports, exported
/// to the ingress namespace.
fn service(ip: &str, ports: &[i64], export_to: &str) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"port": p})).collect();
    json!({
        "metadata": {"annotations": {"networking.istio.io/exportTo": export_to}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "ports": ports},
    })
}

/// Gateway `kube-apiserver` in passthrough mode (sni.go).
fn passthrough_gateway(hosts: &[&str]) -> Value {
    json!({"spec": {
        "selector": {"app": "istio-ingressgateway", "istio": "ingressgateway", "istio-role": "seed"},
        "servers": [{"port": {"number": 443, "name": "tls", "protocol": "TLS"},
                     "tls": {"mode": "PASSTHROUGH"}, "hosts": hosts}],
    }})
}

/// VirtualService `kube-apiserver` in passthrough mode.
fn passthrough_vs(ns: &str, hosts: &[&str]) -> Value {
    json!({"spec": {
        "hosts": hosts, "gateways": ["kube-apiserver"], "exportTo": [ISTIO_NS],
        "tls": [{"match": [{"port": 443, "sniHosts": hosts}],
                 "route": [{"destination": {"host": format!("kube-apiserver.{ns}.svc.cluster.local"),
                                            "port": {"number": 443}}}]}],
    }})
}

/// The Cluster of a shoot (cluster.go: the Shoot and Seed embedded whole; only some fields).
fn cluster(shoot: &str, workers: bool, hibernated: bool, addresses: bool) -> Value {
    let workers: Vec<Value> = if workers {
        vec![json!({"name": "worker-1"})]
    } else {
        vec![]
    };
    let addresses: Vec<Value> = if addresses {
        vec![json!({"name": "external", "url": format!("https://api.{shoot}.p.example.com")})]
    } else {
        vec![]
    };
    json!({"spec": {
        "shoot": {
            "metadata": {"name": shoot, "namespace": "garden-p"},
            "spec": {"networking": {"nodes": "10.180.0.0/16", "pods": "100.96.0.0/11"},
                     "provider": {"workers": workers},
                     "hibernation": {"enabled": hibernated}},
            "status": {"isHibernated": hibernated, "technicalID": format!("shoot--p--{shoot}"),
                       "advertisedAddresses": addresses},
        },
        "seed": {"spec": {"networks": {"nodes": "10.250.0.0/16", "pods": "10.96.0.0/11"}}},
    }})
}

/// Extension `acl` (extension.go names it after its type).
fn acl(action: &str, kind: &str, cidrs: &[&str]) -> Value {
    json!({"spec": {"type": "acl",
                    "providerConfig": {"rule": {"action": action, "type": kind, "cidrs": cidrs}}}})
}

fn infrastructure(egress: &[&str]) -> Value {
    json!({"status": {"egressCIDRs": egress}})
}

fn key(ns: &str, name: &str) -> Key {
    (ns.to_owned(), name.to_owned())
}

use super::super::objects::Key;

/// Shoot `ns` without HA: the VPN Service, the kube-apiserver Service, passthrough SNI.
fn plain_shoot(o: &mut Objects, ns: &str, octet: u8) {
    o.set(
        Kind::Service,
        key(ns, "vpn-seed-server"),
        Some(&service(
            &format!("10.0.{octet}.1"),
            &[1194, 9443, 15000],
            ISTIO_NS,
        )),
    );
    o.set(
        Kind::Service,
        key(ns, "kube-apiserver"),
        Some(&service(&format!("10.0.{octet}.2"), &[443], ISTIO_NS)),
    );
    let shoot = ns.rsplit("--").next().unwrap();
    let hosts = [
        format!("api.{shoot}.p.internal.example.com"),
        format!("api.{shoot}.p.example.com"),
    ];
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    o.set(
        Kind::Gateway,
        key(ns, "kube-apiserver"),
        Some(&passthrough_gateway(&hosts)),
    );
    o.set(
        Kind::VirtualService,
        key(ns, "kube-apiserver"),
        Some(&passthrough_vs(ns, &hosts)),
    );
}

fn no_seed_names(_: &ServerName) -> bool {
    false
}

fn run(o: &Objects, last: &LastGood) -> Translation {
    translate(o, &settings(), last, &no_seed_names)
}

fn value(v: &str) -> RouteValue {
    RouteValue::parse(v).unwrap()
}

fn sni(n: &str) -> ServerName {
    ServerName::parse(n.as_bytes()).unwrap()
}

fn upstream_of(t: &Translation, v: &str) -> Option<String> {
    t.policy.routes.get(&value(v)).map(|t| t.upstream.clone())
}

fn admitted(target: &Target, who: Client) -> bool {
    crate::access::admits(&target.rules, &AlwaysAllowed::default(), who).is_ok()
}

#[test]
fn services_become_connect_routes_in_gardeners_value_shapes() {
    let mut o = Objects::default();
    plain_shoot(&mut o, "shoot--p--a", 1);
    // HA: two Services, vpn-seed-server-0/1 (seedserver.go, StatefulSet pods).
    for i in 0..2 {
        o.set(
            Kind::Service,
            key("shoot--p--ha", &format!("vpn-seed-server-{i}")),
            Some(&service(
                &format!("10.0.9.{i}"),
                &[1194, 9443, 15000],
                ISTIO_NS,
            )),
        );
    }
    // Exported only to a zonal gateway's namespace: not ours.
    o.set(
        Kind::Service,
        key("shoot--p--z", "vpn-seed-server"),
        Some(&service("10.0.8.1", &[1194], "istio-ingress--zone-b")),
    );
    // IPv6 cluster IP, exported to every namespace.
    o.set(
        Kind::Service,
        key("shoot--p--v6", "kube-apiserver"),
        Some(&service("fd00:10::2", &[443], "*")),
    );
    let t = run(&o, &LastGood::default());
    assert_eq!(t.problems, vec![]);
    let vpn = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";
    assert_eq!(upstream_of(&t, vpn).as_deref(), Some("10.0.1.1:1194"));
    assert_eq!(
        upstream_of(
            &t,
            "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local"
        )
        .as_deref(),
        Some("10.0.1.2:443")
    );
    assert_eq!(
        upstream_of(&t, "shoot--p--a--kube-apiserver-socket").as_deref(),
        Some("10.0.1.2:443")
    );
    for i in 0..2 {
        let v = format!("outbound|1194||vpn-seed-server-{i}.shoot--p--ha.svc.cluster.local");
        assert_eq!(upstream_of(&t, &v), Some(format!("10.0.9.{i}:1194")), "{v}");
    }
    assert_eq!(
        upstream_of(
            &t,
            "outbound|1194||vpn-seed-server.shoot--p--ha.svc.cluster.local"
        ),
        None
    );
    assert_eq!(
        upstream_of(
            &t,
            "outbound|1194||vpn-seed-server.shoot--p--z.svc.cluster.local"
        ),
        None
    );
    assert_eq!(
        upstream_of(&t, "shoot--p--v6--kube-apiserver-socket").as_deref(),
        Some("[fd00:10::2]:443")
    );
    // a: 3 values, ha: 2, v6: 2.
    assert_eq!(t.policy.routes.len(), 7);
    // No ACL: every route admits anyone.
    assert!(t.policy.routes.values().all(|r| r.rules.is_empty()));
}

#[test]
fn gateways_and_virtual_services_become_sni_routes_in_both_istio_modes() {
    let mut o = Objects::default();
    plain_shoot(&mut o, "shoot--p--a", 1);
    // shoot b: Istio TLS termination (GatewayWithMutualTLS, http routes).
    let ns = "shoot--p--b";
    o.set(
        Kind::Service,
        key(ns, "kube-apiserver"),
        Some(&service("10.0.2.2", &[443], ISTIO_NS)),
    );
    let hosts = ["api.b.p.internal.example.com", "api.b.p.example.com"];
    o.set(
        Kind::Gateway,
        key(ns, "kube-apiserver"),
        Some(&json!({"spec": {
            "selector": {"app": "istio-ingressgateway", "istio": "ingressgateway", "istio-role": "seed"},
            "servers": [{"port": {"number": 443, "name": "tls", "protocol": "HTTPS"},
                         "tls": {"mode": "OPTIONAL_MUTUAL", "credentialName": "shoot--p--b-kube-apiserver-tls"},
                         "hosts": hosts}],
        }})),
    );
    o.set(
        Kind::VirtualService,
        key(ns, "kube-apiserver"),
        Some(&json!({"spec": {
            "hosts": hosts, "gateways": ["kube-apiserver"],
            "http": [
                {"name": "connection-upgrade",
                 "match": [{"headers": {"Connection": {"exact": "Upgrade"}, "Upgrade": {"regex": ".+"}}}],
                 "route": [{"destination": {"host": "kube-apiserver-connection-upgrade.shoot--p--b.svc.cluster.local", "port": {"number": 443}}}]},
                {"route": [{"destination": {"host": "kube-apiserver.shoot--p--b.svc.cluster.local", "port": {"number": 443}}}]},
            ],
        }})),
    );
    // shoot c: its Gateway selects a zonal gateway, not this router.
    let mut zonal = passthrough_gateway(&["api.c.p.example.com"]);
    zonal["spec"]["selector"]["istio"] = json!("ingressgateway--zone--b");
    o.set(
        Kind::Service,
        key("shoot--p--c", "kube-apiserver"),
        Some(&service("10.0.3.2", &[443], "*")),
    );
    o.set(
        Kind::Gateway,
        key("shoot--p--c", "kube-apiserver"),
        Some(&zonal),
    );
    o.set(
        Kind::VirtualService,
        key("shoot--p--c", "kube-apiserver"),
        Some(&passthrough_vs("shoot--p--c", &["api.c.p.example.com"])),
    );
    let t = run(&o, &LastGood::default());
    assert_eq!(t.problems, vec![]);
    let got = |n: &str| {
        t.policy
            .sni_routes
            .get(&sni(n))
            .map(|t| t.upstream.as_str())
    };
    assert_eq!(got("api.a.p.internal.example.com"), Some("10.0.1.2:443"));
    assert_eq!(got("api.a.p.example.com"), Some("10.0.1.2:443"));
    assert_eq!(got("api.b.p.internal.example.com"), Some("10.0.2.2:443"));
    assert_eq!(got("api.b.p.example.com"), Some("10.0.2.2:443"));
    assert_eq!(got("api.c.p.example.com"), None);
    assert_eq!(t.policy.sni_routes.len(), 4);
    assert_eq!(
        t.policy.sni_routes[&sni("api.b.p.example.com")]
            .shoot
            .as_deref(),
        Some("shoot--p--b")
    );
}

/// Shoot `ns` with an ACL, its Cluster and Infrastructure.
fn acl_shoot(o: &mut Objects, ns: &str, rule: &Value) {
    plain_shoot(o, ns, 1);
    let shoot = ns.rsplit("--").next().unwrap();
    o.set(Kind::Extension, key(ns, "acl"), Some(rule));
    o.set(
        Kind::Cluster,
        key("", ns),
        Some(&cluster(shoot, true, false, true)),
    );
    o.set(
        Kind::Infrastructure,
        key(ns, shoot),
        Some(&infrastructure(&["203.0.113.10/32"])),
    );
}

const VPN_A: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";

#[test]
fn an_acl_rules_every_route_of_its_shoot_with_the_always_allowed_first() {
    let mut o = Objects::default();
    acl_shoot(
        &mut o,
        "shoot--p--a",
        &acl("ALLOW", "remote_ip", &["192.0.2.0/24", "2001:db8::/32"]),
    );
    plain_shoot(&mut o, "shoot--p--ab", 3);
    let t = run(&o, &LastGood::default());
    assert_eq!(t.problems, vec![]);
    let nets = |l: &[&str]| -> Vec<IpNet> { l.iter().map(|s| s.parse().unwrap()).collect() };
    let want = vec![
        Rule::allow(nets(&[
            "10.250.0.0/16",
            "10.96.0.0/11",
            "10.180.0.0/16",
            "203.0.113.10/32",
            "198.18.0.0/15",
        ])),
        Rule::allow(nets(&["192.0.2.0/24", "2001:db8::/32"])),
    ];
    for v in [
        VPN_A,
        "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local",
        "shoot--p--a--kube-apiserver-socket",
    ] {
        assert_eq!(t.policy.routes[&value(v)].rules, want, "{v}");
    }
    assert_eq!(t.policy.sni_routes[&sni("api.a.p.example.com")].rules, want);
    // The neighbour whose name the shoot's is a prefix of has no rules.
    let ab =
        &t.policy.routes[&value("outbound|1194||vpn-seed-server.shoot--p--ab.svc.cluster.local")];
    assert!(ab.rules.is_empty());
    let a = &t.policy.routes[&value(VPN_A)];
    let at = |s: &str| Client::direct(s.parse().unwrap());
    assert!(admitted(a, at("192.0.2.7")));
    assert!(admitted(a, at("2001:db8::7")));
    assert!(admitted(a, at("203.0.113.10")));
    assert!(admitted(a, at("10.180.3.3")));
    assert!(!admitted(a, at("198.51.100.1")));
    assert!(!admitted(a, at("203.0.113.11")));
    assert!(admitted(ab, at("198.51.100.1")));
}

#[test]
fn rule_types_and_deny() {
    let mut o = Objects::default();
    acl_shoot(
        &mut o,
        "shoot--p--a",
        &acl("allow", "direct_remote_ip", &["192.0.2.0/24"]),
    );
    let t = run(&o, &LastGood::default());
    let a = &t.policy.routes[&value(VPN_A)];
    assert_eq!(a.rules[1].source, Source::Peer);
    // A PROXY source in the list, the load balancer not: denied (the TCP peer is judged).
    let via_lb = Client::new("192.0.2.7".parse().unwrap(), "10.1.1.1".parse().unwrap());
    assert!(!admitted(a, via_lb));
    o.set(
        Kind::Extension,
        key("shoot--p--a", "acl"),
        Some(&acl("Deny", "remote_ip", &["192.0.2.0/24"])),
    );
    let t = run(&o, &LastGood::default());
    let a = &t.policy.routes[&value(VPN_A)];
    let at = |s: &str| Client::direct(s.parse().unwrap());
    assert_eq!(
        crate::access::admits(&a.rules, &AlwaysAllowed::default(), at("192.0.2.7")),
        Err(Denial::Rule(1))
    );
    assert!(admitted(a, at("198.51.100.1")));
    assert!(admitted(a, at("2001:db8::1")));
    // The seed's nodes stay allowed even inside a denied range.
    assert!(admitted(a, at("10.250.0.9")));
}

#[test]
fn a_bad_acl_is_reported_by_field_and_keeps_the_last_good_rules_while_others_change() {
    let mut o = Objects::default();
    acl_shoot(
        &mut o,
        "shoot--p--a",
        &acl("allow", "remote_ip", &["192.0.2.0/24"]),
    );
    plain_shoot(&mut o, "shoot--p--b", 2);
    let first = run(&o, &LastGood::default());
    let good_rules = first.policy.routes[&value(VPN_A)].rules.clone();
    o.set(
        Kind::Extension,
        key("shoot--p--a", "acl"),
        Some(&acl(
            "allow",
            "remote_ip",
            &["192.0.2.0/24", "192.0.2.300/24"],
        )),
    );
    // Meanwhile shoot b goes HA.
    o.set(Kind::Service, key("shoot--p--b", "vpn-seed-server"), None);
    o.set(
        Kind::Service,
        key("shoot--p--b", "vpn-seed-server-0"),
        Some(&service("10.0.2.10", &[1194], ISTIO_NS)),
    );
    let t = run(&o, &first.last_good);
    assert_eq!(
        t.problems,
        vec![Problem::new(
            ObjectRef::new(Kind::Extension, "shoot--p--a", "acl"),
            "spec.providerConfig.rule.cidrs[1]",
            "\"192.0.2.300/24\" is no CIDR",
        )]
    );
    assert_eq!(t.policy.routes[&value(VPN_A)].rules, good_rules);
    assert!(t.policy.routes.contains_key(&value(
        "outbound|1194||vpn-seed-server-0.shoot--p--b.svc.cluster.local"
    )));
    assert!(!t.policy.routes.contains_key(&value(
        "outbound|1194||vpn-seed-server.shoot--p--b.svc.cluster.local"
    )));
    // A replica that starts now has no last good rules for a: the shoot has none (as the
    // ACL extension leaves a shoot it never reconciled), and says why.
    let fresh = run(&o, &LastGood::default());
    assert!(fresh.policy.routes[&value(VPN_A)].rules.is_empty());
    for (field, bad) in [
        (
            "spec.providerConfig.rule.action",
            acl("permit", "remote_ip", &["192.0.2.0/24"]),
        ),
        (
            "spec.providerConfig.rule.type",
            acl("allow", "peer_ip", &["192.0.2.0/24"]),
        ),
        (
            "spec.providerConfig.rule.cidrs",
            acl("allow", "remote_ip", &[]),
        ),
    ] {
        o.set(Kind::Extension, key("shoot--p--a", "acl"), Some(&bad));
        let t = run(&o, &first.last_good);
        assert_eq!(t.problems.len(), 1, "{field}");
        assert_eq!(t.problems[0].field, field);
        assert_eq!(t.policy.routes[&value(VPN_A)].rules, good_rules, "{field}");
    }
}

#[test]
fn a_bad_service_keeps_the_shoots_last_good_routes() {
    let mut o = Objects::default();
    plain_shoot(&mut o, "shoot--p--a", 1);
    let first = run(&o, &LastGood::default());
    o.set(
        Kind::Service,
        key("shoot--p--a", "vpn-seed-server"),
        Some(&service("None", &[1194], ISTIO_NS)),
    );
    let t = run(&o, &first.last_good);
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        t.problems[0].object,
        ObjectRef::new(Kind::Service, "shoot--p--a", "vpn-seed-server")
    );
    assert_eq!(t.problems[0].field, "spec.clusterIP");
    assert_eq!(
        t.problems[0].to_string(),
        "Service shoot--p--a/vpn-seed-server field spec.clusterIP: \"None\" is no IP address (a headless Service cannot be routed)"
    );
    assert_eq!(t.policy, first.policy);
    o.set(
        Kind::Service,
        key("shoot--p--a", "vpn-seed-server"),
        Some(&service("10.0.1.1", &[9443], ISTIO_NS)),
    );
    let t = run(&o, &first.last_good);
    assert_eq!(t.problems[0].field, "spec.ports");
    assert_eq!(t.policy, first.policy);
}

#[test]
fn hibernated_half_created_and_deleted_shoots_as_the_acl_extension_treats_them() {
    // Hibernated: its objects stay, so do its routes and rules.
    let mut o = Objects::default();
    acl_shoot(
        &mut o,
        "shoot--p--h",
        &acl("allow", "remote_ip", &["192.0.2.0/24"]),
    );
    o.set(
        Kind::Cluster,
        key("", "shoot--p--h"),
        Some(&cluster("h", true, true, true)),
    );
    let t = run(&o, &LastGood::default());
    assert_eq!(t.problems, vec![]);
    let vpn_h = value("outbound|1194||vpn-seed-server.shoot--p--h.svc.cluster.local");
    assert_eq!(t.policy.routes[&vpn_h].rules.len(), 2);
    let hibernated = t.last_good.clone();

    // No advertised addresses yet: no rules computed, reported; the last ones stay.
    o.set(
        Kind::Cluster,
        key("", "shoot--p--h"),
        Some(&cluster("h", true, false, false)),
    );
    let t = run(&o, &LastGood::default());
    assert!(t.policy.routes[&vpn_h].rules.is_empty());
    assert_eq!(t.problems[0].field, "spec.shoot.status.advertisedAddresses");
    let t = run(&o, &hibernated);
    assert_eq!(t.policy.routes[&vpn_h].rules.len(), 2);

    // Workers but no Infrastructure yet: the same.
    o.set(
        Kind::Cluster,
        key("", "shoot--p--h"),
        Some(&cluster("h", true, false, true)),
    );
    o.set(Kind::Infrastructure, key("shoot--p--h", "h"), None);
    let t = run(&o, &hibernated);
    assert_eq!(
        t.problems[0].reason,
        "no Infrastructure shoot--p--h/h yet: the shoot's last allow-list stays"
    );
    assert_eq!(t.policy.routes[&vpn_h].rules.len(), 2);
    // Workerless: no Infrastructure needed, no shoot node network added.
    o.set(
        Kind::Cluster,
        key("", "shoot--p--h"),
        Some(&cluster("h", false, false, true)),
    );
    let t = run(&o, &LastGood::default());
    assert_eq!(t.problems, vec![]);
    assert_eq!(t.policy.routes[&vpn_h].rules[0].from.len(), 3);

    // The Extension being deleted: no rules.
    let mut deleting = acl("allow", "remote_ip", &["192.0.2.0/24"]);
    deleting["metadata"] = json!({"deletionTimestamp": "2026-11-28T03:00:00Z"});
    o.set(Kind::Extension, key("shoot--p--h", "acl"), Some(&deleting));
    let t = run(&o, &hibernated);
    assert!(t.policy.routes[&vpn_h].rules.is_empty());

    // The shoot deleted: its routes are gone, last good or not.
    for name in ["vpn-seed-server", "kube-apiserver"] {
        o.set(Kind::Service, key("shoot--p--h", name), None);
    }
    o.set(Kind::Gateway, key("shoot--p--h", "kube-apiserver"), None);
    o.set(
        Kind::VirtualService,
        key("shoot--p--h", "kube-apiserver"),
        None,
    );
    o.set(Kind::Extension, key("shoot--p--h", "acl"), None);
    let t = run(&o, &hibernated);
    assert!(t.policy.routes.is_empty());
    assert!(t.policy.sni_routes.is_empty());
    assert!(t.last_good.routes.is_empty());
}

#[test]
fn a_server_name_goes_to_the_shoot_it_names() {
    let mut o = Objects::default();
    plain_shoot(&mut o, "shoot--p--a", 1);
    plain_shoot(&mut o, "shoot--p--b", 2);
    // b's objects also claim a's name.
    let hosts = ["api.b.p.example.com", "api.a.p.example.com"];
    o.set(
        Kind::Gateway,
        key("shoot--p--b", "kube-apiserver"),
        Some(&passthrough_gateway(&hosts)),
    );
    o.set(
        Kind::VirtualService,
        key("shoot--p--b", "kube-apiserver"),
        Some(&passthrough_vs("shoot--p--b", &hosts)),
    );
    let t = run(&o, &LastGood::default());
    assert_eq!(
        t.policy.sni_routes[&sni("api.a.p.example.com")].upstream,
        "10.0.1.2:443"
    );
    assert_eq!(
        t.policy.sni_routes[&sni("api.b.p.example.com")].upstream,
        "10.0.2.2:443"
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        t.problems[0].object,
        ObjectRef::new(Kind::VirtualService, "shoot--p--b", "kube-apiserver")
    );
    assert_eq!(
        t.problems[0].reason,
        "server name api.a.p.example.com is shoot shoot--p--a's"
    );
    // A name the router's file routes is nobody's else.
    let seed = |n: &ServerName| n.as_str() == "api.b.p.example.com";
    let t = translate(&o, &settings(), &LastGood::default(), &seed);
    assert!(!t
        .policy
        .sni_routes
        .contains_key(&sni("api.b.p.example.com")));
}

#[test]
fn undecodable_objects_are_reported_whole() {
    let mut o = Objects::default();
    plain_shoot(&mut o, "shoot--p--a", 1);
    let first = run(&o, &LastGood::default());
    o.set(
        Kind::Gateway,
        key("shoot--p--a", "kube-apiserver"),
        Some(&json!({"spec": {"servers": "not a list"}})),
    );
    let t = run(&o, &first.last_good);
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        t.problems[0].object,
        ObjectRef::new(Kind::Gateway, "shoot--p--a", "kube-apiserver")
    );
    assert!(
        t.problems[0].reason.contains("invalid type"),
        "{}",
        t.problems[0]
    );
    assert_eq!(t.policy, first.policy);
}

/// Two replicas route identically however differently they came to the same objects: one
/// that followed the seed's history (an ACL replaced, a shoot created, another going HA, its
/// last good rules carried along) and one started at the end, the objects arriving in another
/// order. (With an object that cannot be translated they may differ: the early one keeps its
/// last good rules, `a_bad_acl_is_reported_by_field_and_keeps_the_last_good_rules_while_others_change`.)
#[test]
fn replicas_started_at_different_times_route_identically() {
    let ha = |o: &mut Objects| {
        o.set(Kind::Service, key("shoot--p--c", "vpn-seed-server"), None);
        for (i, ip) in ["10.0.3.10", "10.0.3.11"].into_iter().enumerate() {
            o.set(
                Kind::Service,
                key("shoot--p--c", &format!("vpn-seed-server-{i}")),
                Some(&service(ip, &[1194], ISTIO_NS)),
            );
        }
    };
    let final_acl = acl("deny", "remote_ip", &["198.51.100.0/24", "2001:db8::/32"]);

    let mut early = Objects::default();
    acl_shoot(
        &mut early,
        "shoot--p--a",
        &acl("allow", "remote_ip", &["192.0.2.0/24"]),
    );
    let mut last = run(&early, &LastGood::default()).last_good;
    plain_shoot(&mut early, "shoot--p--c", 3);
    last = run(&early, &last).last_good;
    early.set(Kind::Extension, key("shoot--p--a", "acl"), Some(&final_acl));
    last = run(&early, &last).last_good;
    plain_shoot(&mut early, "shoot--p--b", 2);
    last = run(&early, &last).last_good;
    ha(&mut early);
    let early = run(&early, &last);

    let mut late = Objects::default();
    plain_shoot(&mut late, "shoot--p--c", 3);
    ha(&mut late);
    plain_shoot(&mut late, "shoot--p--b", 2);
    acl_shoot(&mut late, "shoot--p--a", &final_acl);
    let late = run(&late, &LastGood::default());

    assert!(early.problems.is_empty() && late.problems.is_empty());
    assert_eq!(early.policy, late.policy);
    assert!(early.policy.routes.contains_key(&value(
        "outbound|1194||vpn-seed-server-1.shoot--p--c.svc.cluster.local"
    )));
    assert!(!early.policy.routes[&value(VPN_A)].rules.is_empty());
}
