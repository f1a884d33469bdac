//! vpn2's HA pods (vpn2 @ 0e5681c, as the HA switch replay needs them) on this machine's
//! kernel, which has no bonding and no `ip6tnl`, in [`super::ha`]'s namespaces. What runs
//! and what stands in:
//!
//! * **The two servers** (`vpn-seed-server-<i>`): upstream OpenVPN with the config vpn2
//!   renders in HA ([`server_config`]: `vpn_server::config::vpn2_lines` for the container's
//!   environment with `IS_HA`, so `dev tap0`, `server-ipv6` on the server's /112 of
//!   `VPN_NETWORK` (`…:1::100:0/112`, `…:1::101:0/112`), `client-to-client`, `duplicate-cn`,
//!   `keepalive 10 30`, the status file every 15 s, vpn2's PKI layout
//!   ([`super::ha_pods::write_secrets`]) and its client-config-dir with the empty
//!   `vpn-shoot-client-<j>` files). The `up` hook is our `vpn-server firewall`, as in
//!   [`super::vpn2_upstream`]: on `tap0` INPUT (and FORWARD) accept related and established
//!   packets and drop the rest, and `route replace <shoot net> dev tap0` (which carries
//!   nothing in HA, as vpn2's).
//! * **The kube-apiserver pod** ([`start_kapi_pod`]): two upstream clients with vpn2's client
//!   config (`dev tap0` / `tap1`, `remote` server 0 / 1 directly in the seed, CN
//!   `vpn-seed-client`, no `persist-tun`); the **bond stand-in** ([`bond`]): a Linux bridge
//!   named `bond0` with the taps as ports, one port forwarding (tap0 while its carrier is up,
//!   else tap1), the other disabled, the bond address `…:1::a:<replica+1>/104` (vpn2 leases
//!   `…::a:XXXX` through pod annotations; here it is fixed) without DAD; one **`ip6tnl`
//!   stand-in** per shoot pod j ([`ip6tnl`]: a tun device named `bond0-ip6tnl<j>` and a raw
//!   IPv6 socket pair from the bond address to `…::b:j`, as vpn2's init container creates
//!   the ip6tnl devices); vpn2's seed rules for `IP_FAMILIES=IPv4` (IPv4 INPUT on `bond+`:
//!   related and established accepted, the rest dropped; with IPv4 alone vpn2 sets no IPv6
//!   rules); the **path controller** ([`path`]: every 2 s an echo with vpn2's retries and a
//!   hello to every shoot pod, the shoot networks routed `dev bond0-ip6tnl<j>`).
//! * **The shoot pods** ([`start_shoot_pod`], `vpn-shoot-<j>`): two upstream clients each
//!   (`dev tap0` / `tap1`, through the ingress with `http-proxy` and the header
//!   `outbound|1194||vpn-seed-server-<i>.<ns>.svc.cluster.local`: our router is the ingress,
//!   as in `tests/gardener_ha.rs`; CN `vpn-shoot-client-<j>`), the bond stand-in with
//!   `…:1::b:<j>/104`, the **tunnel controller** ([`tunnel`]: UDP 5400 on the bond address,
//!   a `bond0ip6tnl<XX><YY>` stand-in and a host route to the pod IP per kube-apiserver that
//!   says hello), and vpn2's shoot rules on `bond*` (`vpn_client::vpn2::shoot_table` without
//!   the overlap mapping: forward what comes from `bond*`, which names the tunnel devices
//!   too, clamp the MSS, masquerade out of `eth0`).
//! * **On the wire** the frames between the pods are vpn2's (research note of issue 30,
//!   §1.6): Ethernet between the bonds' MAC addresses, found by neighbour discovery, carrying
//!   `IPv6(…::a:X → …::b:j, next header 4)` around the kube-apiserver's IPv4 packet (source
//!   the pod IP: the routes have no source, as vpn2's) and the mirror image back; the echoes
//!   and hellos as plain IPv6 between the bond addresses.
//! * **The bond's MAC address** is fixed (`02:00:00:` and the bond address's last three bytes):
//!   vpn2's bond takes the active tap's (`fail_over_mac=active`), so its MAC changes on a
//!   failover and the peers learn the new one from the unsolicited advertisements. Here the
//!   peers' neighbour entries stay valid; the advertisements (sent all the same) teach the
//!   server behind the newly active tap where the pod is, which is what vpn2 needs them for
//!   as well.
//!
//! Not modelled: the init containers' address broker, the tunnel controller's watchdog,
//! vpn2's kernel settings beyond forwarding and reverse-path filtering, the exporter, the
//! Envoy container, the overlap case's mappings.

pub mod bond;
pub mod ip6tnl;
pub mod path;
pub mod tunnel;

use std::net::Ipv6Addr;
use std::path::Path;
use std::time::Duration;

use netio::firewall::Firewall;
use protocol::config::env::{Vpn2ClientEnv, Vpn2ServerEnv};
use protocol::config::netmap::Netmap;
use protocol::config::{render, Line};
use vpn_client::vpn2::{client_lines, Vpn2Reader as ClientReader};
use vpn_server::config::{vpn2_lines, Vpn2Reader};

use self::bond::Bond;
use self::ip6tnl::Ip6tnl;
use self::path::PathController;
use self::tunnel::TunnelController;
use super::ha::KAPI;
use super::ha_pods::HaPods;
use super::pods::Binaries;
use crate::netns::Netns;
use crate::upstream::{UpstreamOpenvpn, INITIALIZED_MARKER};
use crate::LabError;

/// vpn2's default `VPN_NETWORK` (`fd8f:6d53:b97a:1::/96`); the bonds' /104 is its start.
pub const VPN_NETWORK: Ipv6Addr = Ipv6Addr::new(0xfd8f, 0x6d53, 0xb97a, 1, 0, 0, 0, 0);
/// How long an upstream OpenVPN may take to serve.
pub const START: Duration = Duration::from_secs(45);
/// The log level of every upstream OpenVPN here.
const VERB: u8 = 3;

/// Kube-apiserver replica `replica`'s bond address, `…:1::a:<replica+1>`.
pub fn kapi_bond_address(replica: usize) -> Ipv6Addr {
    bond_address(0x000a_0000 | low16(replica + 1))
}

/// Shoot pod `pod`'s bond address, `…:1::b:<pod>` (vpn2: from the pod name's index).
pub fn shoot_bond_address(pod: usize) -> Ipv6Addr {
    bond_address(0x000b_0000 | low16(pod))
}

fn low16(n: usize) -> u128 {
    u128::from(u16::try_from(n).unwrap_or(u16::MAX))
}

fn bond_address(low: u128) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(VPN_NETWORK) | low)
}

/// The fixed MAC address of the bond stand-in holding `addr`.
pub fn bond_mac(addr: Ipv6Addr) -> [u8; 6] {
    let o = addr.octets();
    [0x02, 0, 0, o[13], o[14], o[15]]
}

/// The config vpn2 renders for `vpn-seed-server-<i>` in HA (see the module docs), the
/// client-config-dir `ccd` and the secrets under `root/server`.
pub fn server_config(pods: &HaPods, bins: &Binaries, root: &Path, i: usize) -> String {
    let spec = pods.server_spec(bins, root, i);
    // HaPods' environment is a valid one (gardener_ha starts our server with it).
    let env = Vpn2ServerEnv::parse(spec.env).expect("the HA server's environment");
    let ccd = ccd_dir(root, i);
    let reader = Vpn2Reader::Upstream {
        client_config_dir: &ccd,
        program: &bins.server,
    };
    render(&vpn2_lines(&env, &root.join("server"), reader))
}

fn ccd_dir(root: &Path, i: usize) -> std::path::PathBuf {
    root.join(format!("client-config-dir-{i}"))
}

/// vpn2's server `i` in `ns` ([`server_config`], with its client-config-dir written), once
/// it serves.
pub fn start_server<'ns>(
    ns: &'ns Netns,
    pods: &HaPods,
    bins: &Binaries,
    root: &Path,
    i: usize,
) -> Result<UpstreamOpenvpn<'ns>, LabError> {
    let ccd = ccd_dir(root, i);
    std::fs::create_dir_all(&ccd).map_err(|source| LabError::io(&ccd, source))?;
    for j in 0..2 {
        let file = ccd.join(format!("vpn-shoot-client-{j}"));
        std::fs::write(&file, "").map_err(|source| LabError::io(&file, source))?;
    }
    let server = UpstreamOpenvpn::start(ns, &server_config(pods, bins, root, i), VERB)?;
    server.wait_for_log(INITIALIZED_MARKER, START)?;
    Ok(server)
}

/// vpn2's client config for an environment of [`HaPods`] and the secrets under `secrets`,
/// with vpn2's HA device `tap<i>` (ours reads the same lines with `tun<i>`).
fn client_config(vars: Vec<(String, String)>, secrets: &Path, i: usize) -> String {
    // HaPods' environments are valid ones (gardener_ha starts our clients with them).
    let env = Vpn2ClientEnv::parse(vars).expect("an HA client's environment");
    let lines = client_lines(&env, secrets, ClientReader::Upstream)
        .expect("an endpoint and secrets directory vpn2's config can name");
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|l| match l {
            Line::Dev(_) => Line::Dev(format!("tap{i}")),
            l => l,
        })
        .collect();
    render(&lines)
}

/// `vpn-client-<i>` of kube-apiserver replica `replica`: to server `i` inside the seed.
pub fn seed_client_config(
    pods: &HaPods,
    bins: &Binaries,
    root: &Path,
    replica: usize,
    i: usize,
) -> String {
    let spec = pods.seed_client_spec(bins, root, replica, i);
    client_config(spec.env, &root.join("seed"), i)
}

/// `vpn-shoot-s<i>` of shoot pod `pod`: to server `i` through the ingress.
pub fn shoot_client_config(
    pods: &HaPods,
    bins: &Binaries,
    root: &Path,
    pod: usize,
    i: usize,
) -> String {
    let spec = pods.shoot_client_spec(bins, root, pod, i);
    client_config(spec.env, &root.join("shoot"), i)
}

/// The IPv4 shoot networks of `pods` (services, pods, nodes): what the path controller
/// routes.
pub fn shoot_networks(pods: &HaPods) -> Vec<String> {
    pods.networks()
        .into_iter()
        .filter(|(k, _)| k.starts_with("SHOOT_"))
        .flat_map(|(_, v)| {
            v.split(',')
                .filter(|n| !n.contains(':'))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A vpn2 kube-apiserver pod: its clients (by server), path controller, bond and tunnels
/// (dropped in that order).
#[derive(Debug)]
pub struct KapiPod<'ns> {
    /// The clients, `tap0` then `tap1`.
    pub clients: Vec<UpstreamOpenvpn<'ns>>,
    /// The path controller.
    pub path: PathController,
    /// The bond stand-in.
    pub bond: Bond,
    /// The `ip6tnl` stand-ins `bond0-ip6tnl<j>`, by shoot pod.
    pub tunnels: Vec<Ip6tnl>,
}

/// vpn2's kube-apiserver pod `replica` (pod IP `KAPI[replica]`) in `ns` (see the module
/// docs), its clients started (not yet connected), the path controller choosing among
/// `shoot_pods` shoot pods.
pub fn start_kapi_pod<'ns>(
    ns: &'ns Netns,
    pods: &HaPods,
    bins: &Binaries,
    root: &Path,
    replica: usize,
    shoot_pods: usize,
) -> Result<KapiPod<'ns>, LabError> {
    ns.run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])?;
    let script = "add table ip vpn2-bond\n\
         add chain ip vpn2-bond input { type filter hook input priority 0; }\n\
         add rule ip vpn2-bond input iifname \"bond*\" ct state established,related accept\n\
         add rule ip vpn2-bond input iifname \"bond*\" drop\n";
    ns.run(["nft", script])?;
    let addr = kapi_bond_address(replica);
    let bond = Bond::build(ns, 2, bond_mac(addr), addr)?;
    let tunnels = (0..shoot_pods)
        .map(|j| Ip6tnl::create(ns, &ip6tnl::kapi_name(j), addr, shoot_bond_address(j)))
        .collect::<Result<Vec<_>, _>>()?;
    let clients = (0..2)
        .map(|i| {
            let config = seed_client_config(pods, bins, root, replica, i);
            UpstreamOpenvpn::start(ns, &config, VERB)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let path = PathController::start(
        ns,
        (0..shoot_pods).map(shoot_bond_address).collect(),
        shoot_networks(pods),
        KAPI[replica],
    )?;
    Ok(KapiPod {
        clients,
        path,
        bond,
        tunnels,
    })
}

/// A vpn2 shoot pod: its clients (by server), tunnel controller and bond (dropped in that
/// order).
#[derive(Debug)]
pub struct ShootPod<'ns> {
    /// The clients, `tap0` then `tap1`.
    pub clients: Vec<UpstreamOpenvpn<'ns>>,
    /// The tunnel controller.
    pub tunnel: TunnelController,
    /// The bond stand-in.
    pub bond: Bond,
}

/// vpn2's shoot pod `pod` in `ns` (see the module docs), its tunnel controller listening,
/// its clients started.
pub fn start_shoot_pod<'ns>(
    ns: &'ns Netns,
    pods: &HaPods,
    bins: &Binaries,
    root: &Path,
    pod: usize,
) -> Result<ShootPod<'ns>, LabError> {
    for s in ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0"] {
        ns.run(["sysctl", "-qw", s])?;
    }
    let table = vpn_client::vpn2::shoot_table(vpn_client::vpn2::TABLE, "bond*", &Netmap::none());
    ns.run_in(move || Firewall::open()?.apply(&table, false))?
        .map_err(|e| LabError::Ours {
            what: "vpn-client",
            source: Box::new(e),
        })?;
    let addr = shoot_bond_address(pod);
    let bond = Bond::build(ns, 2, bond_mac(addr), addr)?;
    let tunnel = TunnelController::start(ns, addr)?;
    let clients = (0..2)
        .map(|i| {
            let config = shoot_client_config(pods, bins, root, pod, i);
            UpstreamOpenvpn::start(ns, &config, VERB)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ShootPod {
        clients,
        tunnel,
        bond,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bond_addresses_are_vpn2s() {
        assert_eq!(kapi_bond_address(0).to_string(), "fd8f:6d53:b97a:1::a:1");
        assert_eq!(shoot_bond_address(1).to_string(), "fd8f:6d53:b97a:1::b:1");
        assert_eq!(bond_mac(shoot_bond_address(1)), [2, 0, 0, 0x0b, 0, 1]);
    }
}
