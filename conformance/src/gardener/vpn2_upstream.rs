//! The rolling-upgrade partners: upstream OpenVPN 2.6 configured as vpn2 configures it, for
//! one side of the tunnel while ours runs the other (gardener-pods.md §2.1 and §2.4,
//! gardener-vpn2.md §1.3 and §1.9; vpn2 @ 0e5681c). Our own rendering of the facts, for the
//! landscape's networks and the [`Mounts`](super::pods::Mounts) layout.
//!
//! vpn2's images run a Go step before OpenVPN that installs rules with iptables; here:
//!
//! * seed side ([`seed_proxy_nat`]): the group-31415 `nat OUTPUT` mapping, written with
//!   `nft` into a table of its own. Our `vpn-server` installs these rules only together with
//!   its own server (environment mode) and has no verb for them alone; the OpenVPN hook it
//!   provides (`firewall --mode up`) is the other half and runs as vpn2's does.
//! * shoot side ([`install_shoot_rules`]): the rules our `vpn-client` installs in
//!   environment mode, built by the same library function (`vpn_client::vpn2::shoot_table`),
//!   but not owned by a process, as vpn2's. The binary has no way to install only its rules
//!   without running the client.

use std::path::Path;

use ipnet::IpNet;
use netio::firewall::Firewall;
use protocol::config::netmap::Netmap;

use super::landscape::{
    SEED_POD_NETWORK, SHOOT_NODE_NETWORKS, SHOOT_POD_NETWORKS, SHOOT_SERVICE_NETWORKS,
};
use super::pods::{header_value, HEADER_KEY, OPENVPN_PORT};
use super::rules::LANDSCAPE_NETMAP;
use crate::netns::Netns;
use crate::LabError;

/// vpn2's default IPv6 transfer network (`VPN_NETWORK` unset).
pub const TRANSFER_NETWORK: &str = "fd8f:6d53:b97a:1::/96";

/// vpn2's route and iroute list for the landscape: each IPv4 shoot network replaced by its
/// reserved /8 (nodes 242, services 243, pods 244), IPv6 ones kept, sorted as strings, no
/// duplicates.
pub fn shoot_networks() -> Vec<String> {
    let mut nets: Vec<String> = [
        SHOOT_POD_NETWORKS,
        SHOOT_SERVICE_NETWORKS,
        SHOOT_NODE_NETWORKS,
    ]
    .iter()
    .flat_map(|list| list.split(','))
    .map(reserved_or_kept)
    .collect();
    nets.sort();
    nets.dedup();
    nets
}

/// An IPv4 shoot network of the landscape as its reserved /8; an IPv6 one as it is.
fn reserved_or_kept(net: &str) -> String {
    LANDSCAPE_NETMAP
        .iter()
        .find(|(real, _)| *real == net)
        .map(|(_, mapped)| format!("{}.0.0.0/8", &mapped[..3]))
        .unwrap_or_else(|| net.to_owned())
}

/// vpn2's `/openvpn-server.config` for the non-HA seed pod: secrets under `secrets`, the
/// client-config-dir `ccd`, the status file `status`, and our `vpn-server` as the hooks'
/// program (`/bin/vpn-server` in vpn2's image).
pub fn server_config(secrets: &Path, ccd: &Path, status: &Path, vpn_server: &Path) -> String {
    let s = |rel: &str| secrets.join(rel).display().to_string();
    let nets = shoot_networks().join(",");
    let bin = vpn_server.display();
    let lines = [
        "mode server".to_owned(),
        "tls-server".to_owned(),
        "topology subnet".to_owned(),
        "verb 3".to_owned(),
        "txqueuelen 1000".to_owned(),
        "tcp-nodelay".to_owned(),
        "data-ciphers AES-256-GCM:AES-256-CBC".to_owned(),
        "port 1194".to_owned(),
        "keepalive 10 30".to_owned(),
        // The sum of the shoot networks' host addresses, clamped to 1,048,576: an IPv6 /48
        // alone exceeds it.
        "max-routes-per-client 1048576".to_owned(),
        format!("client-config-dir {}", ccd.display()),
        format!("key \"{}\"", s("vpn-server/tls.key")),
        format!("cert \"{}\"", s("vpn-server/tls.crt")),
        format!("ca \"{}\"", s("vpn-server/ca.crt")),
        "dh none".to_owned(),
        "auth SHA256".to_owned(),
        format!("tls-auth \"{}\" 0", s("tlsauth/vpn.tlsauth")),
        "proto tcp6-server".to_owned(),
        format!("server-ipv6 {TRANSFER_NETWORK}"),
        "dev tun0".to_owned(),
        "script-security 2".to_owned(),
        format!(
            "up \"{bin} firewall --mode up --device tun0 --shoot-network={nets} --seed-pod-network={SEED_POD_NETWORK}\""
        ),
        format!("down \"{bin} firewall --mode down --device tun0\""),
        format!("status {} 15", status.display()),
        "status-version 2".to_owned(),
    ];
    lines.join("\n") + "\n"
}

/// vpn2's `/client-config-dir/vpn-shoot-client`: an `iroute` per IPv4 network (dotted
/// mask), an `iroute-ipv6` per IPv6 network.
pub fn ccd_vpn_shoot_client() -> String {
    let mut out = String::new();
    for net in shoot_networks() {
        match net.parse::<IpNet>() {
            Ok(IpNet::V4(v4)) => {
                out.push_str(&format!("iroute {} {}\n", v4.network(), v4.netmask()));
            }
            _ => out.push_str(&format!("iroute-ipv6 {net}\n")),
        }
    }
    out
}

/// vpn2's `/openvpn-client.config` for the non-HA vpn-shoot pod (a dual-stack shoot, so
/// `tcp-client`), with the secrets under `secrets` and `endpoint` as `ENDPOINT`.
pub fn client_config(secrets: &Path, endpoint: &str) -> String {
    let s = |rel: &str| secrets.join(rel).display().to_string();
    let lines = [
        "verb 3".to_owned(),
        "auth-nocache".to_owned(),
        "txqueuelen 1000".to_owned(),
        "tcp-nodelay".to_owned(),
        "pull".to_owned(),
        "data-ciphers AES-256-GCM".to_owned(),
        "tls-client".to_owned(),
        "connect-retry 1 5".to_owned(),
        "auth SHA256".to_owned(),
        format!("tls-auth \"{}\" 1", s("tlsauth/vpn.tlsauth")),
        "remote-cert-tls server".to_owned(),
        "proto tcp-client".to_owned(),
        format!("key {}", s("vpn-client/tls.key")),
        format!("cert {}", s("vpn-client/tls.crt")),
        format!("ca {}", s("vpn-client/ca.crt")),
        format!("http-proxy {endpoint} {OPENVPN_PORT}"),
        format!(
            "http-proxy-option CUSTOM-HEADER {HEADER_KEY} {}",
            header_value()
        ),
        "management 127.0.0.1 7505".to_owned(),
        "dev tun0".to_owned(),
        format!("remote {endpoint}"),
        "script-security 2".to_owned(),
        "up \"/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' -- \"".to_owned(),
    ];
    lines.join("\n") + "\n"
}

/// The `nft` script of vpn2's Go start in the seed pod: the proxy group's connections to the
/// landscape's IPv4 shoot networks mapped into their reserved ranges (iptables `nat OUTPUT
/// -m owner --gid-owner 31415 -d REAL -j NETMAP --to MAPPED`), in table `ip vpn2-start`.
pub fn seed_proxy_nat() -> String {
    let mut s = String::from(
        "table ip vpn2-start {\n\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n",
    );
    for (real, mapped) in LANDSCAPE_NETMAP {
        s.push_str(&format!(
            "\t\tmeta skgid 31415 ip daddr {real} dnat ip prefix to {mapped}\n"
        ));
    }
    s.push_str("\t}\n}\n");
    s
}

/// Installs [`seed_proxy_nat`] in `ns` (it stays until the namespace goes, as vpn2's).
pub fn install_seed_proxy_nat(ns: &Netns, scratch: &Path) -> Result<(), LabError> {
    let path = scratch.join("vpn2-start.nft");
    std::fs::write(&path, seed_proxy_nat()).map_err(|source| LabError::io(&path, source))?;
    ns.run(["nft", "-f", &path.display().to_string()])?;
    Ok(())
}

/// Installs our vpn-client's environment-mode rules (vpn2's shoot rules) for the landscape
/// in `ns`, as vpn2's Go step installs its iptables rules: not tied to a process, they stay
/// until removed or the namespace goes (and `nft` can edit them). Run again, it replaces them.
pub fn install_shoot_rules(ns: &Netns) -> Result<(), LabError> {
    let nets =
        |list: &str| -> Vec<IpNet> { list.split(',').filter_map(|n| n.parse().ok()).collect() };
    let netmap = Netmap::vpn2(
        &nets(SHOOT_POD_NETWORKS),
        &nets(SHOOT_SERVICE_NETWORKS),
        &nets(SHOOT_NODE_NETWORKS),
    )
    .map_err(|e| LabError::Material {
        what: "the landscape's shoot networks".into(),
        source: Box::new(e),
    })?;
    let table =
        vpn_client::vpn2::shoot_table(vpn_client::vpn2::TABLE, vpn_client::vpn2::DEVICE, &netmap);
    ns.run_in(move || Firewall::open()?.apply(&table, false))?
        .map_err(|e| LabError::Ours {
            what: "vpn-client",
            source: Box::new(e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_list_is_vpn2s() {
        assert_eq!(
            shoot_networks(),
            [
                "242.0.0.0/8",
                "243.0.0.0/8",
                "244.0.0.0/8",
                "fd00:250::/48",
                "fd00:64::/112",
                "fd00:96::/48"
            ]
        );
        assert_eq!(
            ccd_vpn_shoot_client(),
            "iroute 242.0.0.0 255.0.0.0\niroute 243.0.0.0 255.0.0.0\niroute 244.0.0.0 255.0.0.0\n\
             iroute-ipv6 fd00:250::/48\niroute-ipv6 fd00:64::/112\niroute-ipv6 fd00:96::/48\n"
        );
    }
}
