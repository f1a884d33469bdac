//! vpn2's address plan for IPv4: the shoot's networks and the seed's pod network are
//! translated (iptables `NETMAP`) into reserved /8s, so seed and shoot networks may overlap.
//!
//! | range | what is mapped into it | where the translation happens |
//! |---|---|---|
//! | `241.0.0.0/8` | the seed's pod network | the seed server's tun device, both ways |
//! | `242.0.0.0/8` | the shoot's node networks | the seed proxy's own connections; reversed on the shoot client's tun |
//! | `243.0.0.0/8` | the shoot's service networks | likewise |
//! | `244.0.0.0/8` | the shoot's pod networks | likewise |
//!
//! IPv6 networks are never mapped (reference gardener-vpn2.md 1.9, 1.12, 1.13).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

/// vpn2's double-NAT target for the seed's pod network (`241.0.0.0/8`).
pub const MAPPED_SEED_POD_NETWORK: Ipv4Net = v4net(241);
/// vpn2's double-NAT target for shoot node networks (`242.0.0.0/8`).
pub const MAPPED_NODE_NETWORK: Ipv4Net = v4net(242);
/// vpn2's double-NAT target for shoot service networks (`243.0.0.0/8`).
pub const MAPPED_SERVICE_NETWORK: Ipv4Net = v4net(243);
/// vpn2's double-NAT target for shoot pod networks (`244.0.0.0/8`).
pub const MAPPED_POD_NETWORK: Ipv4Net = v4net(244);

const fn v4net(first: u8) -> Ipv4Net {
    match Ipv4Net::new(Ipv4Addr::new(first, 0, 0, 0), 8) {
        Ok(n) => n,
        Err(_) => panic!("a /8 is valid"),
    }
}

/// vpn2's translation of IPv4 shoot networks into their reserved ranges (pods `244/8`,
/// services `243/8`, nodes `242/8`), which vpn2 applied with `NETMAP` rules to the sidecar's
/// own connections and which its shoot client reverses. The server's iroute for the shoot
/// client covers only the mapped ranges, so an IPv4 destination must be dialed mapped.
///
/// Packing, as vpn2 does it: per kind, the IPv4 networks sorted by prefix length, shortest
/// first (ties keep their order), each placed at the next free aligned block of the range; an
/// address keeps its host bits. Example (vpn2's): nodes `10.100.80.0/16`, `10.99.14.0/24`,
/// `10.99.15.0/24` become `242.0.0.0/16`, `242.1.0.0/24`, `242.1.1.0/24`. IPv6 networks are
/// not mapped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Netmap {
    /// (real network, mapped network), first match wins: pods, services, nodes.
    entries: Vec<(Ipv4Net, Ipv4Net)>,
}

/// The networks of one kind do not fit into its mapped range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the IPv4 networks {networks:?} do not fit into {range}")]
pub struct NetmapError {
    /// The networks of that kind.
    pub networks: Vec<Ipv4Net>,
    /// The mapped range.
    pub range: Ipv4Net,
}

impl Netmap {
    /// No translation.
    pub fn none() -> Self {
        Self::default()
    }

    /// vpn2's mapping of the shoot's pod, service and node networks.
    pub fn vpn2(pods: &[IpNet], services: &[IpNet], nodes: &[IpNet]) -> Result<Self, NetmapError> {
        let mut entries = Vec::new();
        for (nets, range) in [
            (pods, MAPPED_POD_NETWORK),
            (services, MAPPED_SERVICE_NETWORK),
            (nodes, MAPPED_NODE_NETWORK),
        ] {
            entries.extend(pack(nets, range)?);
        }
        Ok(Netmap { entries })
    }

    /// The (real, mapped) pairs.
    pub fn entries(&self) -> &[(Ipv4Net, Ipv4Net)] {
        &self.entries
    }

    /// `addr` mapped if it lies in a mapped network, else unchanged.
    pub fn map(&self, addr: IpAddr) -> IpAddr {
        let IpAddr::V4(a) = addr.to_canonical() else {
            return addr;
        };
        for (real, mapped) in &self.entries {
            if real.contains(&a) {
                let host = u32::from(a) & u32::from(real.hostmask());
                return IpAddr::V4(Ipv4Addr::from(u32::from(mapped.network()) | host));
            }
        }
        addr
    }
}

fn pack(nets: &[IpNet], range: Ipv4Net) -> Result<Vec<(Ipv4Net, Ipv4Net)>, NetmapError> {
    let mut v4: Vec<Ipv4Net> = nets
        .iter()
        .filter_map(|n| match n {
            IpNet::V4(n) => Some(n.trunc()),
            IpNet::V6(_) => None,
        })
        .collect();
    v4.sort_by_key(Ipv4Net::prefix_len); // stable: ties keep their order
    let too_big = || NetmapError {
        networks: v4.clone(),
        range,
    };
    let range_size = 1u64 << (32 - range.prefix_len());
    let mut offset = 0u64;
    let mut out = Vec::with_capacity(v4.len());
    for net in &v4 {
        if net.prefix_len() < range.prefix_len() {
            return Err(too_big());
        }
        let size = 1u64 << (32 - net.prefix_len());
        if offset + size > range_size {
            return Err(too_big());
        }
        let base = u64::from(u32::from(range.network())) + offset;
        let base = Ipv4Addr::from(u32::try_from(base).map_err(|_| too_big())?);
        let mapped = Ipv4Net::new(base, net.prefix_len()).map_err(|_| too_big())?;
        out.push((*net, mapped));
        offset += size;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn netmap_packs_like_vpn2() {
        // The example in vpn2's documentation of its packing.
        let m = Netmap::vpn2(
            &[n("100.96.0.0/11"), n("fd00::/64")],
            &[n("100.64.0.0/13")],
            &[n("10.99.14.0/24"), n("10.100.80.0/16"), n("10.99.15.0/24")],
        )
        .unwrap();
        let want: Vec<(Ipv4Net, Ipv4Net)> = [
            ("100.96.0.0/11", "244.0.0.0/11"),
            ("100.64.0.0/13", "243.0.0.0/13"),
            ("10.100.0.0/16", "242.0.0.0/16"),
            ("10.99.14.0/24", "242.1.0.0/24"),
            ("10.99.15.0/24", "242.1.1.0/24"),
        ]
        .iter()
        .map(|(r, m)| (r.parse().unwrap(), m.parse().unwrap()))
        .collect();
        assert_eq!(m.entries(), &want[..]);
        assert_eq!(m.map(a("100.96.5.6")), a("244.0.5.6"));
        assert_eq!(m.map(a("100.127.255.1")), a("244.31.255.1"));
        assert_eq!(m.map(a("10.99.15.7")), a("242.1.1.7"));
        assert_eq!(m.map(a("10.100.3.4")), a("242.0.3.4"));
        assert_eq!(m.map(a("fd00::1")), a("fd00::1"), "IPv6 is not mapped");
        assert_eq!(m.map(a("192.0.2.1")), a("192.0.2.1"));
    }

    #[test]
    fn netmap_refuses_what_does_not_fit() {
        assert!(Netmap::vpn2(&[n("10.0.0.0/7")], &[], &[]).is_err());
        assert!(Netmap::vpn2(&[n("10.0.0.0/8"), n("11.0.0.0/24")], &[], &[]).is_err());
        assert_eq!(Netmap::vpn2(&[], &[], &[]).unwrap(), Netmap::none());
    }
}
