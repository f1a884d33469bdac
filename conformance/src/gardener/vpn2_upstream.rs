//! The rolling-upgrade partners: upstream OpenVPN 2.6 configured as vpn2 configures it, for
//! one side of the tunnel while ours runs the other (gardener-pods.md §2.1 and §2.4,
//! gardener-vpn2.md §1.3 and §1.9; vpn2 @ 0e5681c), for the landscape's networks and the
//! [`Mounts`](super::pods::Mounts) layout. The configs are the typed lines our binaries read
//! in environment mode (`vpn_server::config::vpn2_lines`, `vpn_client::vpn2::client_lines`),
//! rendered with what only upstream reads (hooks, client-config-dir, management); the golden
//! files in `golden/` hold the text as it was written here before, byte for byte.
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
use protocol::config::env::{Vpn2ClientEnv, Vpn2ServerEnv};
use protocol::config::netmap::Netmap;
use protocol::config::render;
use vpn_client::vpn2::{client_lines, Vpn2Reader as ClientReader};
use vpn_server::config::{vpn2_lines, vpn2_shoot_networks, Vpn2Reader};

use super::landscape::{SHOOT_NODE_NETWORKS, SHOOT_POD_NETWORKS, SHOOT_SERVICE_NETWORKS};
use super::pods::{seed_server_env, vpn_shoot_env};
use super::rules::LANDSCAPE_NETMAP;
use crate::netns::Netns;
use crate::LabError;

/// vpn2's route and iroute list for the landscape: each IPv4 shoot network replaced by its
/// reserved /8 (nodes 242, services 243, pods 244), IPv6 ones kept, sorted as strings, no
/// duplicates (`vpn_server::config::vpn2_shoot_networks` of the seed server's environment).
pub fn shoot_networks() -> Vec<String> {
    vpn2_shoot_networks(&seed_env(Path::new(STATUS_PLACEHOLDER)))
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// A status path for environments whose status file does not matter.
const STATUS_PLACEHOLDER: &str = "/srv/status/openvpn.status";

/// The `vpn-seed-server` container's environment of the landscape, status file at `status`.
fn seed_env(status: &Path) -> Vpn2ServerEnv {
    // The landscape's constants are a valid environment (the golden test reads them).
    Vpn2ServerEnv::parse(seed_server_env(status)).expect("the landscape's seed environment")
}

/// vpn2's `/openvpn-server.config` for the non-HA seed pod: secrets under `secrets`, the
/// client-config-dir `ccd`, the status file `status`, and our `vpn-server` as the hooks'
/// program (`/bin/vpn-server` in vpn2's image). The lines are vpn-server's
/// ([`vpn_server::config::vpn2_lines`]) for the seed server's environment.
pub fn server_config(secrets: &Path, ccd: &Path, status: &Path, vpn_server: &Path) -> String {
    let reader = Vpn2Reader::Upstream {
        client_config_dir: ccd,
        program: vpn_server,
    };
    render(&vpn2_lines(&seed_env(status), secrets, reader))
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
/// `tcp-client`), with the secrets under `secrets` and `endpoint` as `ENDPOINT`. The lines are
/// vpn-client's ([`vpn_client::vpn2::client_lines`]) for the vpn-shoot container's
/// environment.
pub fn client_config(secrets: &Path, endpoint: &str) -> String {
    let mut vars = vpn_shoot_env();
    vars.retain(|(k, _)| k != "ENDPOINT");
    vars.push(("ENDPOINT".to_owned(), endpoint.to_owned()));
    // The landscape's constants are a valid environment (the golden test reads them); an
    // endpoint that is not one word of config text is the caller's error.
    let env = Vpn2ClientEnv::parse(vars).expect("the landscape's vpn-shoot environment");
    let lines = client_lines(&env, secrets, ClientReader::Upstream)
        .expect("an endpoint and secrets directory vpn2's config can name");
    render(&lines)
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

    /// The configs upstream gets are byte for byte what this module wrote before the lines
    /// were vpn-server's and vpn-client's (Gardener's paths for the mounts).
    #[test]
    fn the_configs_are_the_golden_ones() {
        assert_eq!(
            server_config(
                Path::new("/srv/secrets"),
                Path::new("/client-config-dir"),
                Path::new("/srv/status/openvpn.status"),
                Path::new("/bin/vpn-server"),
            ),
            include_str!("golden/vpn2-server.conf")
        );
        assert_eq!(
            client_config(Path::new("/srv/secrets"), "203.0.113.10"),
            include_str!("golden/vpn2-client.conf")
        );
    }

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
