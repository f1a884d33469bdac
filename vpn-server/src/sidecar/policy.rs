//! Which destinations the sidecar may dial: only the shoot's networks, never the seed.
//!
//! A destination is checked in this order, the first match deciding:
//!
//! 1. an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is checked as the IPv4 address;
//! 2. **always denied**: unspecified (`0.0.0.0/8`, `::`), loopback (`127.0.0.0/8`, `::1`),
//!    link-local (`169.254.0.0/16`, `fe80::/10`, where cloud metadata services live),
//!    multicast and the IPv4 broadcast address;
//! 3. **denied**: the configured seed networks (they win over an overlapping shoot network:
//!    the sidecar dials addresses as they are, so an overlap would reach the seed);
//! 4. **allowed**: the configured shoot networks (pod, service, node CIDRs and their mapped
//!    ranges);
//! 5. everything else is denied.
//!
//! [`Netmap`] then rewrites an allowed IPv4 address of a shoot network into its mapped range,
//! as vpn2's NAT rules did for Envoy's connections (see its docs).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

/// vpn2's double-NAT target for shoot node networks (`242.0.0.0/8`).
pub const MAPPED_NODE_NETWORK: Ipv4Net = v4net(242);
/// vpn2's double-NAT target for shoot service networks (`243.0.0.0/8`).
pub const MAPPED_SERVICE_NETWORK: Ipv4Net = v4net(243);
/// vpn2's double-NAT target for shoot pod networks (`244.0.0.0/8`).
pub const MAPPED_POD_NETWORK: Ipv4Net = v4net(244);

const fn v4net(first: u8) -> Ipv4Net {
    match Ipv4Net::new(std::net::Ipv4Addr::new(first, 0, 0, 0), 8) {
        Ok(n) => n,
        Err(_) => panic!("a /8 is valid"),
    }
}

/// Why a destination was refused (answered 403).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// `0.0.0.0/8` or `::`.
    #[error("unspecified address")]
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    #[error("loopback address")]
    Loopback,
    /// `169.254.0.0/16` or `fe80::/10`.
    #[error("link-local address")]
    LinkLocal,
    /// Multicast or the IPv4 broadcast address.
    #[error("multicast or broadcast address")]
    Multicast,
    /// Inside a seed network.
    #[error("inside seed network {network}")]
    SeedNetwork {
        /// The seed network.
        network: IpNet,
    },
    /// Outside every shoot network.
    #[error("outside the shoot networks")]
    NotShoot,
}

/// The sidecar's destination allow-list; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    allowed: Vec<IpNet>,
    seed: Vec<IpNet>,
}

impl DestinationPolicy {
    /// Allows `shoot` networks, denies `seed` networks (and the always-denied ranges).
    pub fn new(shoot: Vec<IpNet>, seed: Vec<IpNet>) -> Self {
        let norm = |v: Vec<IpNet>| v.into_iter().map(|n| n.trunc()).collect();
        DestinationPolicy {
            allowed: norm(shoot),
            seed: norm(seed),
        }
    }

    /// vpn2's shoot networks: pod, service and node CIDRs, plus the mapped `/8` of each kind
    /// that has an IPv4 network (vpn2 NETMAPs those into `244/8`, `243/8`, `242/8`).
    pub fn from_shoot_networks(
        pods: &[IpNet],
        services: &[IpNet],
        nodes: &[IpNet],
        seed: Vec<IpNet>,
    ) -> Self {
        let mut allowed: Vec<IpNet> = Vec::new();
        for (nets, mapped) in [
            (pods, MAPPED_POD_NETWORK),
            (services, MAPPED_SERVICE_NETWORK),
            (nodes, MAPPED_NODE_NETWORK),
        ] {
            allowed.extend_from_slice(nets);
            if nets.iter().any(|n| matches!(n, IpNet::V4(_))) {
                allowed.push(IpNet::V4(mapped));
            }
        }
        Self::new(allowed, seed)
    }

    /// The allowed (shoot) networks.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allowed
    }

    /// The denied seed networks.
    pub fn seed(&self) -> &[IpNet] {
        &self.seed
    }

    /// Whether the sidecar may dial `addr`.
    pub fn check(&self, addr: IpAddr) -> Result<(), Denied> {
        let addr = addr.to_canonical();
        if let Some(reason) = always_denied(addr) {
            return Err(reason);
        }
        if let Some(network) = self.seed.iter().find(|n| n.contains(&addr)) {
            return Err(Denied::SeedNetwork { network: *network });
        }
        if self.allowed.iter().any(|n| n.contains(&addr)) {
            Ok(())
        } else {
            Err(Denied::NotShoot)
        }
    }
}

fn always_denied(addr: IpAddr) -> Option<Denied> {
    match addr {
        IpAddr::V4(a) => {
            if a.octets()[0] == 0 {
                Some(Denied::Unspecified)
            } else if a.is_loopback() {
                Some(Denied::Loopback)
            } else if a.is_link_local() {
                Some(Denied::LinkLocal)
            } else if a.is_multicast() || a.is_broadcast() {
                Some(Denied::Multicast)
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            if a.is_unspecified() {
                Some(Denied::Unspecified)
            } else if a.is_loopback() {
                Some(Denied::Loopback)
            } else if a.is_unicast_link_local() {
                Some(Denied::LinkLocal)
            } else if a.is_multicast() {
                Some(Denied::Multicast)
            } else {
                None
            }
        }
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

    fn policy() -> DestinationPolicy {
        DestinationPolicy::from_shoot_networks(
            &[n("100.96.0.0/11"), n("fd00:10::/64")],
            &[n("100.64.0.0/13")],
            &[n("10.250.0.0/16")],
            vec![n("10.0.0.0/8"), n("100.96.5.0/24")],
        )
    }

    #[test]
    fn shoot_networks_and_mapped_ranges_are_allowed() {
        let p = policy();
        for ok in [
            "100.96.1.2",
            "100.64.0.10",
            "fd00:10::5",
            "244.1.2.3",
            "243.0.0.1",
            "242.9.9.9",
            "::ffff:100.96.1.2",
        ] {
            assert_eq!(p.check(a(ok)), Ok(()), "{ok}");
        }
    }

    #[test]
    fn loopback_link_local_seed_and_others_are_denied() {
        let p = policy();
        let cases = [
            ("127.0.0.1", Denied::Loopback),
            ("::1", Denied::Loopback),
            ("::ffff:127.0.0.1", Denied::Loopback),
            ("169.254.169.254", Denied::LinkLocal),
            ("fe80::1", Denied::LinkLocal),
            ("0.0.0.0", Denied::Unspecified),
            ("::", Denied::Unspecified),
            ("224.0.0.1", Denied::Multicast),
            ("255.255.255.255", Denied::Multicast),
            ("ff02::1", Denied::Multicast),
            // The seed wins over an overlapping shoot network, and the node network lies in it.
            (
                "100.96.5.7",
                Denied::SeedNetwork {
                    network: n("100.96.5.0/24"),
                },
            ),
            (
                "10.250.0.1",
                Denied::SeedNetwork {
                    network: n("10.0.0.0/8"),
                },
            ),
            ("8.8.8.8", Denied::NotShoot),
            ("fd00:11::1", Denied::NotShoot),
        ];
        for (addr, want) in cases {
            assert_eq!(p.check(a(addr)), Err(want), "{addr}");
        }
    }

    #[test]
    fn no_ipv4_network_no_mapped_range() {
        let p = DestinationPolicy::from_shoot_networks(&[n("fd00::/64")], &[], &[], vec![]);
        assert_eq!(p.check(a("244.0.0.1")), Err(Denied::NotShoot));
        assert_eq!(p.allowed(), &[n("fd00::/64")]);
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
