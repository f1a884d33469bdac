//! Which destinations the sidecar may dial: the shoot's networks through the tunnel, other
//! destinations directly when [`External::Allow`] (as Envoy's dynamic forward proxy does for
//! the kube-apiserver's webhooks with external URLs), never the seed.
//!
//! A destination is checked in this order, the first match deciding:
//!
//! 1. an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is checked as the IPv4 address (and an
//!    IPv4-mapped network among the shoot or seed networks is the IPv4 network it carries,
//!    `netio::ingress::canonical_net`: as written it could never match, and a seed network so
//!    written would deny nothing);
//! 2. **always denied**: unspecified (`0.0.0.0/8`, `::`), loopback (`127.0.0.0/8`, `::1`),
//!    link-local (`169.254.0.0/16`, `fe80::/10`, where cloud metadata services live),
//!    multicast and the IPv4 broadcast address;
//! 3. **shoot, mapped**: with vpn2's [`Netmap`] ([`DestinationPolicy::check_with`]), an
//!    address the mapping rewrites lies in a shoot network and is dialed in its mapped range,
//!    so it reaches the shoot even inside an overlapping seed network, as Envoy's connections
//!    did through vpn2's NETMAP rules;
//! 4. **denied**: the configured seed networks (without a mapping they win over an
//!    overlapping shoot network);
//! 5. **shoot**: the configured shoot networks (pod, service, node CIDRs and their mapped
//!    ranges): dialed, the kernel routes them into the tunnel;
//! 6. **external**: everything else, dialed directly if [`External::Allow`], else denied.
//!
//! A name is checked after resolution, address by address. The proxy also refuses an
//! external address that belongs to this host (`Denied::Local`: the pod's own listeners).
//!
//! [`Netmap`] rewrites an IPv4 address of a shoot network into its mapped range, as vpn2's
//! NAT rules did for Envoy's connections (see its docs).

pub use protocol::config::netmap::{
    Netmap, NetmapError, MAPPED_NODE_NETWORK, MAPPED_POD_NETWORK, MAPPED_SERVICE_NETWORK,
};

use std::net::IpAddr;

use ipnet::IpNet;
use netio::ingress::canonical_net;

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
    /// Outside every shoot network, and external destinations are not allowed.
    #[error("outside the shoot networks")]
    NotShoot,
    /// An external destination that is an address of this host.
    #[error("an address of this host")]
    Local,
}

/// Whether destinations outside the shoot networks are dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum External {
    /// Dialed directly, as Envoy's dynamic forward proxy does (the default in Envoy mode).
    Allow,
    /// Refused with 403 (the default of `vpn-server --sidecar` and `vpn-server sidecar`).
    #[default]
    Deny,
}

/// Where an allowed destination goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Inside a shoot network: through the tunnel.
    Shoot,
    /// Elsewhere: dialed directly.
    External,
}

/// The sidecar's destination allow-list; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    allowed: Vec<IpNet>,
    seed: Vec<IpNet>,
    external: External,
}

impl DestinationPolicy {
    /// Allows `shoot` networks, denies `seed` networks (and the always-denied ranges) and
    /// every other destination (see [`DestinationPolicy::with_external`]).
    pub fn new(shoot: Vec<IpNet>, seed: Vec<IpNet>) -> Self {
        let norm = |v: Vec<IpNet>| v.into_iter().map(|n| canonical_net(n.trunc())).collect();
        DestinationPolicy {
            allowed: norm(shoot),
            seed: norm(seed),
            external: External::Deny,
        }
    }

    /// The same policy with `external` for destinations outside the shoot networks.
    pub fn with_external(mut self, external: External) -> Self {
        self.external = external;
        self
    }

    /// Whether external destinations are dialed.
    pub fn external(&self) -> External {
        self.external
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

    /// Whether the sidecar may dial `addr`, and where it goes.
    pub fn check(&self, addr: IpAddr) -> Result<Destination, Denied> {
        self.check_with(addr, &Netmap::none())
    }

    /// [`DestinationPolicy::check`] for a sidecar that rewrites with `netmap` before dialing:
    /// an address `netmap` maps lies in a shoot network and is dialed in its mapped range, so
    /// it goes to the shoot even where a seed network overlaps it (as Envoy's connections
    /// did through vpn2's NETMAP rules); only the always-denied ranges apply to it.
    pub fn check_with(&self, addr: IpAddr, netmap: &Netmap) -> Result<Destination, Denied> {
        let addr = addr.to_canonical();
        if let Some(reason) = always_denied(addr) {
            return Err(reason);
        }
        if netmap.map(addr) != addr {
            return Ok(Destination::Shoot);
        }
        if let Some(network) = self.seed.iter().find(|n| n.contains(&addr)) {
            return Err(Denied::SeedNetwork { network: *network });
        }
        if self.allowed.iter().any(|n| n.contains(&addr)) {
            return Ok(Destination::Shoot);
        }
        match self.external {
            External::Allow => Ok(Destination::External),
            External::Deny => Err(Denied::NotShoot),
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
    fn with_vpn2s_mapping_the_overlap_goes_to_the_shoot_and_the_rest_of_the_seed_stays_denied() {
        // The seed's pod network overlaps the shoot's (Gardener allows it without HA).
        let seed = vec![n("100.96.0.0/11"), n("10.0.0.0/8")];
        let p = DestinationPolicy::from_shoot_networks(
            &[n("100.96.0.0/11")],
            &[n("100.64.0.0/13")],
            &[],
            seed,
        );
        let netmap = Netmap::vpn2(&[n("100.96.0.0/11")], &[n("100.64.0.0/13")], &[]).unwrap();
        assert_eq!(
            p.check_with(a("100.96.20.20"), &netmap),
            Ok(Destination::Shoot)
        );
        assert_eq!(
            p.check(a("100.96.20.20")),
            Err(Denied::SeedNetwork {
                network: n("100.96.0.0/11")
            }),
            "without the mapping the seed wins"
        );
        assert_eq!(
            p.check_with(a("10.1.2.3"), &netmap),
            Err(Denied::SeedNetwork {
                network: n("10.0.0.0/8")
            })
        );
        assert_eq!(p.check_with(a("127.0.0.1"), &netmap), Err(Denied::Loopback));
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
            assert_eq!(p.check(a(ok)), Ok(Destination::Shoot), "{ok}");
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
    fn external_destinations_when_allowed_but_never_the_seed_or_the_always_denied() {
        let p = policy().with_external(External::Allow);
        for ok in ["8.8.8.8", "2001:db8::1", "192.0.2.1", "::ffff:198.51.100.7"] {
            assert_eq!(p.check(a(ok)), Ok(Destination::External), "{ok}");
        }
        assert_eq!(p.check(a("100.96.1.2")), Ok(Destination::Shoot));
        assert_eq!(p.check(a("244.1.2.3")), Ok(Destination::Shoot));
        for (addr, want) in [
            ("127.0.0.1", Denied::Loopback),
            ("169.254.169.254", Denied::LinkLocal),
            ("fe80::1", Denied::LinkLocal),
            ("0.0.0.0", Denied::Unspecified),
            ("ff02::1", Denied::Multicast),
            (
                "10.1.2.3",
                Denied::SeedNetwork {
                    network: n("10.0.0.0/8"),
                },
            ),
        ] {
            assert_eq!(p.check(a(addr)), Err(want), "{addr}");
        }
        assert_eq!(policy().external(), External::Deny);
    }

    #[test]
    fn no_ipv4_network_no_mapped_range() {
        let p = DestinationPolicy::from_shoot_networks(&[n("fd00::/64")], &[], &[], vec![]);
        assert_eq!(p.check(a("244.0.0.1")), Err(Denied::NotShoot));
        assert_eq!(p.allowed(), &[n("fd00::/64")]);
    }

    #[test]
    fn ipv4_mapped_networks_are_the_ipv4_networks_they_carry() {
        let p = DestinationPolicy::new(
            vec![n("10.0.0.0/8"), n("::ffff:100.64.0.0/106")],
            vec![n("::ffff:10.250.0.0/112")],
        );
        assert_eq!(p.seed(), [n("10.250.0.0/16")]);
        assert_eq!(p.allowed(), [n("10.0.0.0/8"), n("100.64.0.0/10")]);
        assert_eq!(
            p.check(a("10.250.1.1")),
            Err(Denied::SeedNetwork {
                network: n("10.250.0.0/16")
            })
        );
        assert_eq!(
            p.check(a("::ffff:10.250.1.1")),
            Err(Denied::SeedNetwork {
                network: n("10.250.0.0/16")
            })
        );
        assert_eq!(p.check(a("100.64.0.1")), Ok(Destination::Shoot));
        assert_eq!(p.check(a("10.1.0.1")), Ok(Destination::Shoot));
    }
}
