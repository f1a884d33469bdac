//! The containers of Gardener's HA VPN layout as our binaries run them in [`super::ha`]'s
//! namespaces: each process with the environment Gardener gives its container
//! (gardener-pods.md §2.2, 2.3, 2.5), vpn2's secrets layout, the ingress router's routes to the
//! two servers, and the start of the init containers, the ingress and the servers. Shared by
//! `tests/gardener_ha.rs` (failover), `tests/ha_last_ref.rs` (the HA dashboard's client
//! count) and `tests/gardener_ha_overlap.rs` (the containers on overlapping networks,
//! [`HaPods::on_networks`]).

use std::path::Path;
use std::time::Duration;

use super::ha::{
    HaLandscape, HaNetworks, INGRESS_LB, SEED_POD_NETWORK, SERVER, SHOOT_NODE_NETWORK,
    SHOOT_NODE_NETWORK_V6, SHOOT_POD_NETWORKS, SHOOT_SERVICE_NETWORKS,
};
use super::pods::{start_router, Binaries, Container, Spec};
use crate::netns::Netns;
use crate::pki_fixture::TestPki;
use crate::LabError;

/// The header the shoot clients send through the ingress (`REVERSED_VPN_HEADER_KEY`).
pub const HEADER_KEY: &str = "X-Gardener-Destination";
/// The ingress port the shoot clients dial (`OPENVPN_PORT`).
pub const OPENVPN_PORT: u16 = 8443;

/// One HA shoot's containers: its control-plane namespace (in the header values) and whether
/// its nodes are dual-stack (`SHOOT_NODE_NETWORKS` with [`SHOOT_NODE_NETWORK_V6`]).
#[derive(Debug, Clone, Copy)]
pub struct HaPods {
    /// The shoot's namespace in the seed (`shoot--<project>--<name>`).
    pub shoot_ns: &'static str,
    /// Whether the node network has its IPv6 half.
    pub dual_stack_nodes: bool,
}

impl HaPods {
    /// `REVERSED_VPN_HEADER` of the shoot clients of server `i`.
    pub fn header_value(&self, i: usize) -> String {
        format!(
            "outbound|1194||vpn-seed-server-{i}.{}.svc.cluster.local",
            self.shoot_ns
        )
    }

    /// The network variables every container gets.
    pub fn networks(&self) -> Vec<(&'static str, String)> {
        let nodes = if self.dual_stack_nodes {
            format!("{SHOOT_NODE_NETWORK},{SHOOT_NODE_NETWORK_V6}")
        } else {
            SHOOT_NODE_NETWORK.to_owned()
        };
        vec![
            ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS.into()),
            ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS.into()),
            ("SHOOT_NODE_NETWORKS", nodes),
            ("SEED_POD_NETWORK", SEED_POD_NETWORK.into()),
        ]
    }

    /// `spec` (one of this layout's containers) with the network variables of `nets`
    /// instead of the disjoint ones: an HA shoot whose networks overlap the seed's.
    pub fn on_networks(&self, nets: &HaNetworks, mut spec: Spec) -> Spec {
        let nodes = if self.dual_stack_nodes {
            format!("{},{SHOOT_NODE_NETWORK_V6}", nets.shoot_node_network)
        } else {
            nets.shoot_node_network.to_owned()
        };
        for (name, value) in &mut spec.env {
            *value = match name.as_str() {
                "SHOOT_SERVICE_NETWORKS" => nets.shoot_service_networks.to_owned(),
                "SHOOT_POD_NETWORKS" => nets.shoot_pod_networks.to_owned(),
                "SHOOT_NODE_NETWORKS" => nodes.clone(),
                "SEED_POD_NETWORK" => nets.seed_pod_network.to_owned(),
                _ => continue,
            };
        }
        spec
    }

    /// `vpn-seed-server-<i>`, its secrets under `root/server`, its status file
    /// [`status_path`].
    pub fn server_spec(&self, bins: &Binaries, root: &Path, i: usize) -> Spec {
        let mut e = self.networks();
        e.extend([
            ("IS_HA", "true".into()),
            ("POD_NAME", format!("vpn-seed-server-{i}")),
            ("HA_VPN_CLIENTS", "2".into()),
            ("OPENVPN_STATUS_PATH", status_path(root, i)),
            (
                "VPN_SERVER_SECRETS_DIR",
                root.join("server").display().to_string(),
            ),
        ]);
        Spec::new(&format!("vpn-seed-server-{i}"), &bins.server, &[], env(&e))
    }

    /// The init containers (`setup`: the kernel settings of each pod) of both kube-apiserver
    /// replicas and both shoot pods, run to their end.
    pub fn run_inits(&self, bins: &Binaries, l: &HaLandscape, logs: &Path) -> Result<(), LabError> {
        self.run_inits_with(bins, l, logs, |spec| spec)
    }

    /// As [`HaPods::run_inits`], each kube-apiserver init container's spec passed through
    /// `kapi` first (e.g. [`HaPods::on_networks`] for other shoot networks).
    pub fn run_inits_with(
        &self,
        bins: &Binaries,
        l: &HaLandscape,
        logs: &Path,
        kapi: impl Fn(Spec) -> Spec,
    ) -> Result<(), LabError> {
        for (i, ns) in l.kapi.iter().enumerate() {
            kapi(self.kapi_init_spec(bins, i)).run(ns, logs)?;
        }
        for (p, ns) in l.shoot.iter().enumerate() {
            self.shoot_init_spec(bins, p).run(ns, logs)?;
        }
        Ok(())
    }

    /// `vpn-client-init` of kube-apiserver replica `replica`.
    pub fn kapi_init_spec(&self, bins: &Binaries, replica: usize) -> Spec {
        let mut e = self.networks();
        e.extend([
            ("IS_HA", "true".into()),
            ("HA_VPN_SERVERS", "2".into()),
            ("HA_VPN_CLIENTS", "2".into()),
        ]);
        Spec::new(
            &format!("kapi{replica}-vpn-client-init"),
            &bins.client,
            &["setup"],
            env(&e),
        )
    }

    /// `vpn-shoot-init` of shoot pod `pod`.
    pub fn shoot_init_spec(&self, bins: &Binaries, pod: usize) -> Spec {
        let e = [
            ("IS_SHOOT_CLIENT", "true".into()),
            ("IS_HA", "true".into()),
            ("POD_NAME", format!("vpn-shoot-{pod}")),
        ];
        Spec::new(
            &format!("shoot{pod}-vpn-shoot-init"),
            &bins.client,
            &["setup"],
            env(&e),
        )
    }

    /// The ingress router in `ns` with [`HaPods::router_config`] (written to
    /// `root/router.toml`), once it logs that it listens (within `up`).
    pub fn start_ingress<'ns>(
        &self,
        bins: &Binaries,
        ns: &'ns Netns,
        root: &Path,
        up: Duration,
    ) -> Result<Container<'ns>, LabError> {
        start_router(bins, ns, root, "router.toml", &self.router_config(), up)
    }

    /// Server `i` ([`HaPods::server_spec`]) in `ns`, once its initialization completed
    /// (within `up`).
    pub fn start_server<'ns>(
        &self,
        bins: &Binaries,
        ns: &'ns Netns,
        root: &Path,
        i: usize,
        up: Duration,
    ) -> Result<Container<'ns>, LabError> {
        let server = self.server_spec(bins, root, i).start(ns, root)?;
        server.wait_log("Initialization Sequence Completed", up)?;
        Ok(server)
    }

    /// Both shoot pods' clients ([`HaPods::shoot_client_spec`]), by pod, then server.
    pub fn start_shoot_clients<'ns>(
        &self,
        bins: &Binaries,
        l: &'ns HaLandscape,
        root: &Path,
    ) -> Result<Vec<Vec<Container<'ns>>>, LabError> {
        start_per_pod_and_server(&l.shoot, root, |p, i| {
            self.shoot_client_spec(bins, root, p, i)
        })
    }

    /// Both kube-apiserver replicas' clients ([`HaPods::seed_client_spec`]), by replica,
    /// then server.
    pub fn start_seed_clients<'ns>(
        &self,
        bins: &Binaries,
        l: &'ns HaLandscape,
        root: &Path,
    ) -> Result<Vec<Vec<Container<'ns>>>, LabError> {
        start_per_pod_and_server(&l.kapi, root, |r, i| {
            self.seed_client_spec(bins, root, r, i)
        })
    }

    /// `vpn-client-<i>` of kube-apiserver replica `replica`.
    pub fn seed_client_spec(&self, bins: &Binaries, root: &Path, replica: usize, i: usize) -> Spec {
        let mut e = self.networks();
        e.extend([
            ("ENDPOINT", SERVER[i].to_string()),
            ("VPN_SERVER_INDEX", i.to_string()),
            ("IS_HA", "true".into()),
            ("HA_VPN_SERVERS", "2".into()),
            ("HA_VPN_CLIENTS", "2".into()),
            ("IP_FAMILIES", "IPv4".into()),
            ("VPN2_SECRETS_DIR", root.join("seed").display().to_string()),
        ]);
        Spec::new(
            &format!("kapi{replica}-vpn-client-{i}"),
            &bins.client,
            &[],
            env(&e),
        )
    }

    /// `vpn-shoot-s<i>` of shoot pod `pod`, through the ingress.
    pub fn shoot_client_spec(&self, bins: &Binaries, root: &Path, pod: usize, i: usize) -> Spec {
        let mut e = self.networks();
        e.extend([
            ("IS_SHOOT_CLIENT", "true".into()),
            ("ENDPOINT", INGRESS_LB.to_string()),
            ("OPENVPN_PORT", OPENVPN_PORT.to_string()),
            ("REVERSED_VPN_HEADER", self.header_value(i)),
            ("REVERSED_VPN_HEADER_KEY", HEADER_KEY.into()),
            ("IS_HA", "true".into()),
            ("VPN_SERVER_INDEX", i.to_string()),
            ("POD_NAME", format!("vpn-shoot-{pod}")),
            ("HA_VPN_SERVERS", "2".into()),
            ("HA_VPN_CLIENTS", "2".into()),
            ("IP_FAMILIES", "IPv4".into()),
            ("VPN2_SECRETS_DIR", root.join("shoot").display().to_string()),
        ]);
        Spec::new(
            &format!("shoot{pod}-vpn-shoot-s{i}"),
            &bins.client,
            &[],
            env(&e),
        )
    }

    /// The ingress router's configuration: one CONNECT listener, a route per server.
    pub fn router_config(&self) -> String {
        let mut text = format!(
            "[[listener]]\naddress = \"0.0.0.0:{OPENVPN_PORT}\"\nheaders = [\"{HEADER_KEY}\"]\n"
        );
        for (i, addr) in SERVER.iter().enumerate() {
            text.push_str(&format!(
                "\n[[route]]\nvalue = \"{}\"\nupstream = \"{addr}:1194\"\n",
                self.header_value(i)
            ));
        }
        text
    }
}

/// `(name, value)` pairs as a container's environment.
pub fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// Server `i`'s status file under `root`.
pub fn status_path(root: &Path, i: usize) -> String {
    root.join(format!("status-{i}")).display().to_string()
}

/// A directory for an HA replay's files (named `prefix…`, removed when dropped) holding
/// [`write_secrets`] of a fresh throwaway PKI.
pub fn secrets_dir(prefix: &str) -> Result<tempfile::TempDir, LabError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| LabError::io(Path::new(prefix), e))?;
    write_secrets(&TestPki::generate()?, dir.path())?;
    Ok(dir)
}

/// vpn2's secrets layout for every pod: `server/` (the servers' `/srv/secrets`), `seed/`
/// (the kube-apiservers': `vpn-client/` with CN `vpn-seed-client`), `shoot/` (the shoot pods':
/// `vpn-client-0/`, `vpn-client-1/` with CN `vpn-shoot-client-<j>`), each with `tlsauth/`.
pub fn write_secrets(pki: &TestPki, root: &Path) -> Result<(), LabError> {
    let copy = |from: &Path, to: &Path| -> Result<(), LabError> {
        std::fs::create_dir_all(to.parent().expect("a file in a directory"))
            .map_err(|e| LabError::io(to, e))?;
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| LabError::io(to, e))
    };
    for side in ["server", "seed", "shoot"] {
        copy(&pki.ta_key(), &root.join(side).join("tlsauth/vpn.tlsauth"))?;
    }
    let server = root.join("server/vpn-server");
    copy(&pki.ca_cert(), &server.join("ca.crt"))?;
    copy(&pki.server_cert(), &server.join("tls.crt"))?;
    copy(&pki.server_key(), &server.join("tls.key"))?;
    let mut clients = vec![("vpn-seed-client".to_owned(), root.join("seed/vpn-client"))];
    for j in 0..2 {
        clients.push((
            format!("vpn-shoot-client-{j}"),
            root.join(format!("shoot/vpn-client-{j}")),
        ));
    }
    for (cn, dir) in clients {
        let (crt, key) = pki.issue_client(&cn)?;
        copy(&pki.ca_cert(), &dir.join("ca.crt"))?;
        copy(&crt, &dir.join("tls.crt"))?;
        copy(&key, &dir.join("tls.key"))?;
    }
    Ok(())
}

/// One container a pod (in `pods`) and server (two servers): `spec(pod, server)`, started,
/// by pod, then server.
fn start_per_pod_and_server<'ns>(
    pods: &'ns [Netns],
    root: &Path,
    spec: impl Fn(usize, usize) -> Spec,
) -> Result<Vec<Vec<Container<'ns>>>, LabError> {
    pods.iter()
        .enumerate()
        .map(|(p, ns)| (0..2).map(|i| spec(p, i).start(ns, root)).collect())
        .collect()
}
