//! What vpn2's Go half of the seed-server entrypoint and its hooks did around OpenVPN, for the
//! drop-in image (reference gardener-pods.md §2.1, §3.1–3.3, §9):
//!
//! * [`setup`] (`vpn-server setup`, the privileged init container): IPv6 switched on in the
//!   pod's network namespace if it was off.
//! * [`seed_table`]: the rules of the vpn2 environment-mode start, in our nf_tables table
//!   `vpn-seed-server` (`netio::firewall`): new connections from the VPN device refused,
//!   for the pod itself (INPUT) and, beyond vpn2, for whatever the pod would forward (FORWARD:
//!   pods inherit `ip_forward=1` from the node, and vpn2 let the shoot reach other seed
//!   addresses through it); only replies come in. The seed's pod network mapped to `241/8` on the device both ways,
//!   and the connections of the proxy's group (`31415`) to the shoot's IPv4 networks mapped
//!   into `242–244/8` (iptables `NETMAP`, as vpn2); beyond vpn2, that group's TCP connections
//!   to the seed's own pod network, loopback and link-local addresses (cloud metadata) are
//!   refused after the mapping, so the proxy (ours or Envoy) cannot be turned against the
//!   seed while shoot addresses that overlap the seed's still reach the shoot (the mapping and
//!   guard chains are `netio::firewall::vpn2`'s, shared with a kube-apiserver pod's HA
//!   clients). The running server owns the table: it is gone when the process ends, also by
//!   `kill -9`.
//! * [`firewall`] (`vpn-server firewall --mode up|down --device D ...`, vpn2's OpenVPN hook):
//!   the first two parts for device `D`, plus the routes `<net> dev D`; `down` removes the
//!   whole table (vpn2's `down` left its NAT rules behind).

use ipnet::IpNet;
use netio::firewall::vpn2 as fw_vpn2;
use netio::firewall::{priority, Chain, Firewall, FirewallError, Hook, Table};
use netio::netlink::{IpPrefix, Netlink, NetlinkError, Route};
use netio::sysctl::{self, SysctlError};
use protocol::config::netmap::Netmap;

/// Our nf_tables table on the seed side.
pub const TABLE: &str = "vpn-seed-server";

/// The parameter `setup` turns off (GKE's nodes start pods with IPv6 disabled).
pub const DISABLE_IPV6: &str = "net.ipv6.conf.all.disable_ipv6";

/// `vpn-server setup`: `net.ipv6.conf.all.disable_ipv6` from 1 to 0; nothing else to do when
/// it is 0 already. Fails without privileges (the init container is privileged).
pub fn setup() -> Result<(), SysctlError> {
    if sysctl::read(DISABLE_IPV6)? == "1" {
        sysctl::write(DISABLE_IPV6, "0")?;
        tracing::info!("IPv6 was disabled in the pod: enabled");
    } else {
        tracing::info!("IPv6 is enabled in the pod: nothing to do");
    }
    Ok(())
}

/// Our second table on the seed side (vpn2 environment mode, non-HA): **not** owned, so it
/// outlives the server process. While the server restarts its device and routes are gone,
/// and so is the owned table's mapping of the proxy's connections; without this table the
/// proxy's (Envoy's) connections to the shoot would follow the pod's default route into the
/// seed's network, where overlapping addresses can exist. Applied at every start (replacing
/// the last one); nothing removes it, as it only ever drops what would leave by the wrong
/// interface.
pub const GUARD_TABLE: &str = "vpn-seed-server-guard";

/// [`GUARD_TABLE`] for `device`: packets to the networks routed into the tunnel (`tunnel`:
/// the mapped ranges and IPv6 shoot networks) and the proxy group's packets to the real IPv4
/// shoot networks (`shoot_v4`) leave by `device` or not at all ([`Chain::tunnel_only`]).
pub fn seed_guard(device: &str, tunnel: &[IpNet], shoot_v4: &[IpNet]) -> Table {
    let shoot_v4: Vec<IpNet> = shoot_v4
        .iter()
        .filter(|n| n.addr().is_ipv4())
        .map(IpNet::trunc)
        .collect();
    Table::new(GUARD_TABLE).chain(Chain::tunnel_only(device, tunnel, &shoot_v4))
}

/// The seed side's rules for VPN device `device`: replies only in from the device, for this
/// host (INPUT) and for what it forwards (FORWARD, both families: nothing of Gardener's is
/// forwarded from the tunnel, since the seed's side reaches the shoot by connections it opens
/// and the GEP-21 endpoint relays in the process); with an IPv4 `seed_pod` network, its 241/8
/// mapping on the device both ways. With `proxy` (the environment-mode start; the OpenVPN hook
/// has none): for each IPv4 shoot network of the netmap, the proxy group's connections to it
/// mapped into its reserved range, then that group's TCP connections to the seed pod network,
/// loopback and link-local refused. The chains are `netio::firewall::vpn2`'s, which a
/// kube-apiserver pod's HA clients install too.
pub fn seed_table(device: &str, seed_pod: Option<IpNet>, proxy: Option<&Netmap>) -> Table {
    let mut table = Table::new(TABLE)
        .chain(Chain::filter("input", Hook::Input, priority::FILTER).replies_only_from(device))
        .chain(Chain::filter("forward", Hook::Forward, priority::FILTER).replies_only_from(device));
    for chain in seed_pod
        .and_then(|seed| fw_vpn2::seed_pod_mapping(device, seed))
        .into_iter()
        .flatten()
    {
        table = table.chain(chain);
    }
    let Some(netmap) = proxy else {
        return table;
    };
    if let Some(output) = fw_vpn2::proxy_netmap(netmap) {
        table = table.chain(output);
    }
    table.chain(fw_vpn2::proxy_guard(seed_pod))
}

/// `--mode` of the `firewall` verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Install the rules and routes.
    Up,
    /// Remove the rules.
    Down,
}

/// The `firewall` verb's flags, as vpn2's OpenVPN hooks pass them; the positional arguments
/// OpenVPN appends (`tun0 1500 0 init`, ...) are accepted and ignored.
#[derive(Debug, Clone, clap::Args)]
pub struct FirewallArgs {
    /// `up` or `down`.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// The VPN device.
    #[arg(long)]
    pub device: String,
    /// Networks routed into the device (repeat, or comma-separated).
    #[arg(long = "shoot-network", value_delimiter = ',')]
    pub shoot_networks: Vec<IpNet>,
    /// The seed's pod network (IPv4: mapped to 241/8 on the device).
    #[arg(long = "seed-pod-network")]
    pub seed_pod_network: Option<IpNet>,
    /// What OpenVPN appends to a hook's command line.
    #[arg(hide = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// Why the `firewall` verb failed.
#[derive(Debug, thiserror::Error)]
pub enum FirewallVerbError {
    /// The device does not exist.
    #[error("device {device} not found")]
    NoDevice {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: NetlinkError,
    },
    /// The rules were refused.
    #[error("cannot install the firewall rules")]
    Rules(#[from] FirewallError),
    /// A route could not be added.
    #[error("cannot route {net} into {device}")]
    Route {
        /// The network.
        net: IpNet,
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: NetlinkError,
    },
    /// Netlink could not be opened.
    #[error("netlink")]
    Netlink(#[source] NetlinkError),
}

/// `vpn-server firewall`: `up` applies [`seed_table`] without the proxy group's mapping (the
/// table persists: the hook's process ends at once) and replaces the routes; `down` removes
/// the table. Run inside a tokio runtime.
pub async fn firewall(args: &FirewallArgs) -> Result<(), FirewallVerbError> {
    if args.mode == Mode::Down {
        Firewall::open()?.remove(TABLE)?;
        tracing::info!(table = TABLE, "firewall rules removed");
        return Ok(());
    }
    let nl = Netlink::open().map_err(FirewallVerbError::Netlink)?;
    nl.link(&args.device)
        .await
        .map_err(|source| FirewallVerbError::NoDevice {
            device: args.device.clone(),
            source,
        })?;
    // vpn2 maps the seed's pods only on its non-HA device.
    let seed_pod = args.seed_pod_network.filter(|_| args.device == "tun0");
    Firewall::open()?.apply(&seed_table(&args.device, seed_pod, None), false)?;
    for net in &args.shoot_networks {
        route_into(&nl, &args.device, *net).await?;
    }
    tracing::info!(
        table = TABLE,
        device = args.device,
        routes = args.shoot_networks.len(),
        "firewall rules and routes installed"
    );
    Ok(())
}

/// `ip route replace NET dev DEVICE`: an existing identical route is fine.
async fn route_into(nl: &Netlink, device: &str, net: IpNet) -> Result<(), FirewallVerbError> {
    let prefix = IpPrefix::from(net.trunc());
    match nl.add_route(&Route::via_dev(prefix, device)).await {
        Err(e) if !e.already_exists() => Err(FirewallVerbError::Route {
            net,
            device: device.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_env_mode_table_has_vpn2s_three_parts() {
        let netmap = Netmap::vpn2(
            &[net("100.96.0.0/11")],
            &[net("100.64.0.0/13")],
            &[net("10.250.0.0/16"), net("fd00::/64")],
        )
        .unwrap();
        let t = seed_table("tun0", Some(net("10.1.0.0/16")), Some(&netmap));
        let text = format!("{t:?}");
        for part in [
            "\"input\"",
            "\"prerouting\"",
            "\"postrouting\"",
            "\"output\"",
            "\"proxy-guard\"",
        ] {
            assert!(text.contains(part), "{part} missing: {text}");
        }
        // An IPv6 seed pod network is not mapped; without shoot networks, no output chain;
        // without a proxy (the hook), no guard.
        let t = seed_table("tun0", Some(net("fd00:1::/64")), Some(&Netmap::none()));
        let text = format!("{t:?}");
        assert!(
            !text.contains("prerouting") && !text.contains("\"output\""),
            "{text}"
        );
        assert!(text.contains("proxy-guard"), "{text}");
        let t = seed_table("tun0", Some(net("10.1.0.0/16")), None);
        let text = format!("{t:?}");
        assert!(
            !text.contains("\"output\"") && !text.contains("proxy-guard"),
            "{text}"
        );
    }

    #[test]
    fn every_seed_table_refuses_new_connections_forwarded_from_the_tunnel() {
        let netmap = Netmap::none();
        let guard =
            Chain::filter("forward", Hook::Forward, priority::FILTER).replies_only_from("tun0");
        for t in [
            seed_table("tun0", None, None),
            seed_table("tun0", Some(net("10.1.0.0/16")), None),
            seed_table("tun0", Some(net("10.1.0.0/16")), Some(&netmap)),
        ] {
            let text = format!("{t:?}");
            assert!(text.contains(&format!("{guard:?}")), "{text}");
        }
    }

    #[test]
    fn the_verb_takes_vpn2s_flags_and_openvpns_trailing_arguments() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: FirewallArgs,
        }
        let cli = Cli::try_parse_from([
            "firewall",
            "--mode",
            "up",
            "--device",
            "tun0",
            "--shoot-network=100.64.0.0/13",
            "--shoot-network=100.96.0.0/11,10.250.0.0/16",
            "--seed-pod-network=10.1.0.0/16",
            "tun0",
            "1500",
            "0",
            "init",
        ])
        .expect("parses");
        assert_eq!(cli.args.mode, Mode::Up);
        assert_eq!(cli.args.shoot_networks.len(), 3);
        assert_eq!(cli.args.seed_pod_network, Some(net("10.1.0.0/16")));
        assert_eq!(cli.args.rest, ["tun0", "1500", "0", "init"]);
        let err = Cli::try_parse_from(["firewall", "--mode", "sideways", "--device", "tun0"])
            .expect_err("bad mode");
        assert!(err.to_string().contains("sideways"), "{err}");
    }
}
