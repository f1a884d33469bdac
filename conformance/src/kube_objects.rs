//! The objects Gardener and the ACL extension create in a seed for a shoot, as the
//! Kubernetes API stand-in ([`crate::kube_api`]) serves them to `vpn-router --kubernetes`:
//! the fields the router reads, with the shapes Gardener's and the extension's code give
//! them (reference: `docs/research` and `/work/shared/reference/gardener-vpn2.md` section
//! 2.5; written from the facts, nothing copied). The `router_kubernetes` tests build three
//! shoots from these, the `kube-scale` measurement 500.

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::kube_api::{self, ApiServer};

/// The router's namespace, where Gardener's default ingress gateway lives.
pub const ISTIO_NS: &str = "istio-ingress";

/// The labels of Gardener's default ingress gateway, which the Gateways select.
pub const GATEWAY_LABELS: [(&str, &str); 3] = [
    ("app", "istio-ingressgateway"),
    ("istio", "ingressgateway"),
    ("istio-role", "seed"),
];

/// Service `name` in `ns` with cluster IP `ip` and `ports`, exported to [`ISTIO_NS`].
pub fn service(ip: Ipv4Addr, ns: &str, name: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"port": p})).collect();
    json!({
        "metadata": {"namespace": ns, "name": name,
                     "annotations": {"networking.istio.io/exportTo": ISTIO_NS}},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "ports": ports},
    })
}

/// The Cluster `ns` of shoot `shoot` (project `p`, with workers), hibernated or not.
pub fn cluster(ns: &str, shoot: &str, hibernated: bool) -> Value {
    json!({
        "metadata": {"name": ns},
        "spec": {
            "shoot": {
                "metadata": {"name": shoot, "namespace": "garden-p"},
                "spec": {"networking": {"nodes": "10.180.0.0/16"},
                         "provider": {"workers": [{"name": "w"}]},
                         "hibernation": {"enabled": hibernated}},
                "status": {"isHibernated": hibernated, "technicalID": ns,
                           "advertisedAddresses": [{"name": "external",
                                                    "url": format!("https://api.{shoot}.p.example.com")}]},
            },
            "seed": {"spec": {"networks": {"nodes": "10.250.0.0/16", "pods": "10.96.0.0/11"}}},
        },
    })
}

/// The ACL Extension of `ns`: allow `cidrs` (`remote_ip`).
pub fn acl(ns: &str, cidrs: &[&str]) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": "acl"},
        "spec": {"type": "acl",
                 "providerConfig": {"rule": {"action": "ALLOW", "type": "remote_ip", "cidrs": cidrs}}},
    })
}

/// The Infrastructure of shoot `shoot` in `ns`, with one egress CIDR.
pub fn infrastructure(ns: &str, shoot: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": shoot},
           "status": {"egressCIDRs": ["203.0.113.10/32"]}})
}

/// The passthrough Gateway and VirtualService `kube-apiserver` of `ns` for `hosts`.
pub fn sni_objects(api: &ApiServer, ns: &str, hosts: &[&str]) {
    let selector: serde_json::Map<String, Value> = GATEWAY_LABELS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    api.apply(
        kube_api::GATEWAY,
        json!({"metadata": {"namespace": ns, "name": "kube-apiserver"},
               "spec": {"selector": selector,
                        "servers": [{"port": {"number": 443, "name": "tls", "protocol": "TLS"},
                                     "tls": {"mode": "PASSTHROUGH"}, "hosts": hosts}]}}),
    );
    api.apply(
        kube_api::VIRTUAL_SERVICE,
        json!({"metadata": {"namespace": ns, "name": "kube-apiserver"},
               "spec": {"hosts": hosts, "gateways": ["kube-apiserver"], "exportTo": [ISTIO_NS],
                        "tls": [{"match": [{"port": 443, "sniHosts": hosts}],
                                 "route": [{"destination": {
                                     "host": format!("kube-apiserver.{ns}.svc.cluster.local"),
                                     "port": {"number": 443}}}]}]}}),
    );
}

/// `X-Gardener-Destination` for the VPN of `ns` (`replica`: the HA Service's index).
pub fn vpn_value(ns: &str, replica: Option<u8>) -> String {
    match replica {
        None => format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local"),
        Some(i) => format!("outbound|1194||vpn-seed-server-{i}.{ns}.svc.cluster.local"),
    }
}
