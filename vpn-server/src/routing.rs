//! The server's internal routing table: IP prefix → client (upstream's `multi` route hash).
//!
//! Each connected client owns host routes for its assigned addresses (`/32`, `/128`) and a
//! route per `iroute` / `iroute-ipv6`. A packet read from the tun device goes to the client
//! owning the *longest* prefix containing its destination; a packet from one client whose
//! destination belongs to another client is forwarded internally only with
//! `client-to-client` (otherwise it goes to the tun device, and the kernel decides).
//!
//! Lookups walk the distinct prefix lengths present, longest first, with one hash lookup per
//! length: cost grows with the number of *lengths*, not routes.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::IpAddr;

use ipnet::IpNet;

/// Where a packet from a client goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward<C> {
    /// To the tun device (the seed's kernel).
    Tun,
    /// To another client, internally (`client-to-client`).
    Client(C),
}

/// Prefix → owner, with longest-prefix match; see the module docs.
#[derive(Debug, Clone)]
pub struct RoutingTable<C> {
    /// Per family (false = IPv4), per prefix length (longest first when iterated in reverse):
    /// network → owner.
    v4: BTreeMap<u8, HashMap<IpNet, C>>,
    v6: BTreeMap<u8, HashMap<IpNet, C>>,
}

impl<C> Default for RoutingTable<C> {
    fn default() -> Self {
        RoutingTable {
            v4: BTreeMap::new(),
            v6: BTreeMap::new(),
        }
    }
}

impl<C: Copy + Eq + Hash> RoutingTable<C> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn family(&mut self, net: &IpNet) -> &mut BTreeMap<u8, HashMap<IpNet, C>> {
        match net {
            IpNet::V4(_) => &mut self.v4,
            IpNet::V6(_) => &mut self.v6,
        }
    }

    /// Adds `net → owner` (host bits are cleared). An existing route for the same prefix is
    /// replaced (the newest client learns it, as upstream does) and its old owner returned.
    pub fn insert(&mut self, net: IpNet, owner: C) -> Option<C> {
        let net = net.trunc();
        self.family(&net)
            .entry(net.prefix_len())
            .or_default()
            .insert(net, owner)
            .filter(|old| *old != owner)
    }

    /// The owner of exactly `net`, if any.
    pub fn get(&self, net: IpNet) -> Option<C> {
        let net = net.trunc();
        let family = match net {
            IpNet::V4(_) => &self.v4,
            IpNet::V6(_) => &self.v6,
        };
        family.get(&net.prefix_len())?.get(&net).copied()
    }

    /// Removes `net` if `owner` owns it.
    pub fn remove(&mut self, net: IpNet, owner: C) {
        let net = net.trunc();
        let family = self.family(&net);
        if let Some(map) = family.get_mut(&net.prefix_len()) {
            if map.get(&net) == Some(&owner) {
                map.remove(&net);
            }
            if map.is_empty() {
                family.remove(&net.prefix_len());
            }
        }
    }

    /// Removes every route of `owner`.
    pub fn remove_owner(&mut self, owner: C) {
        for family in [&mut self.v4, &mut self.v6] {
            for map in family.values_mut() {
                map.retain(|_, o| *o != owner);
            }
            family.retain(|_, map| !map.is_empty());
        }
    }

    /// The owner of the longest prefix containing `addr`.
    pub fn lookup(&self, addr: IpAddr) -> Option<C> {
        let family = match addr {
            IpAddr::V4(_) => &self.v4,
            IpAddr::V6(_) => &self.v6,
        };
        for (&len, map) in family.iter().rev() {
            let Ok(net) = IpNet::new(addr, len) else {
                continue;
            };
            if let Some(owner) = map.get(&net.trunc()) {
                return Some(*owner);
            }
        }
        None
    }

    /// Where a packet from client `from` to `dst` goes: to another client only with
    /// `client_to_client` and a route owned by someone else; the tun device otherwise.
    pub fn forward(&self, from: C, dst: IpAddr, client_to_client: bool) -> Forward<C> {
        if !client_to_client {
            return Forward::Tun;
        }
        match self.lookup(dst) {
            Some(owner) if owner != from => Forward::Client(owner),
            _ => Forward::Tun,
        }
    }

    /// Every route, for the status file: (prefix, owner).
    pub fn entries(&self) -> impl Iterator<Item = (IpNet, C)> + '_ {
        self.v4
            .values()
            .chain(self.v6.values())
            .flat_map(|m| m.iter().map(|(n, c)| (*n, *c)))
    }

    /// The number of routes.
    pub fn len(&self) -> usize {
        self.v4
            .values()
            .chain(self.v6.values())
            .map(HashMap::len)
            .sum()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    #[test]
    fn longest_prefix_wins() {
        let mut t = RoutingTable::new();
        t.insert(n("192.168.123.2/32"), 1);
        t.insert(n("10.0.0.0/8"), 1);
        t.insert(n("10.1.0.0/16"), 2);
        t.insert(n("10.1.2.3/32"), 3);
        t.insert(n("fd00::/64"), 2);
        t.insert(n("fd00::1000/128"), 4);
        assert_eq!(t.lookup(a("192.168.123.2")), Some(1));
        assert_eq!(t.lookup(a("192.168.123.3")), None);
        assert_eq!(t.lookup(a("10.9.9.9")), Some(1));
        assert_eq!(t.lookup(a("10.1.9.9")), Some(2));
        assert_eq!(t.lookup(a("10.1.2.3")), Some(3));
        assert_eq!(t.lookup(a("fd00::1")), Some(2));
        assert_eq!(t.lookup(a("fd00::1000")), Some(4));
        assert_eq!(t.lookup(a("fd01::1")), None);
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn host_bits_are_ignored_and_newest_owner_wins() {
        let mut t = RoutingTable::new();
        assert_eq!(t.insert(n("10.1.2.3/16"), 1), None);
        assert_eq!(t.get(n("10.1.0.0/16")), Some(1));
        assert_eq!(t.insert(n("10.1.0.0/16"), 2), Some(1));
        assert_eq!(t.lookup(a("10.1.0.1")), Some(2));
        // The old owner's removal does not take the route away from the new one.
        t.remove(n("10.1.0.0/16"), 1);
        assert_eq!(t.lookup(a("10.1.0.1")), Some(2));
        t.remove(n("10.1.0.0/16"), 2);
        assert!(t.is_empty());
    }

    #[test]
    fn remove_owner_leaves_others() {
        let mut t = RoutingTable::new();
        t.insert(n("192.168.123.2/32"), 1);
        t.insert(n("10.0.0.0/8"), 1);
        t.insert(n("192.168.123.3/32"), 2);
        t.remove_owner(1);
        assert_eq!(t.lookup(a("10.1.1.1")), None);
        assert_eq!(t.lookup(a("192.168.123.3")), Some(2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn client_to_client_decides_internal_forwarding() {
        let mut t = RoutingTable::new();
        t.insert(n("192.168.123.2/32"), 1);
        t.insert(n("192.168.123.3/32"), 2);
        t.insert(n("10.2.0.0/16"), 2);
        let dst = a("10.2.0.9");
        assert_eq!(t.forward(1, dst, true), Forward::Client(2));
        assert_eq!(t.forward(1, dst, false), Forward::Tun);
        // Never back to the sender, nor for an unknown destination.
        assert_eq!(t.forward(2, dst, true), Forward::Tun);
        assert_eq!(t.forward(1, a("8.8.8.8"), true), Forward::Tun);
    }

    proptest::proptest! {
        /// The table agrees with a linear longest-prefix scan.
        #[test]
        fn matches_linear_scan(
            routes in proptest::collection::vec((proptest::prelude::any::<u32>(), 0u8..=32, 0u8..4), 0..40),
            probes in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..40),
        ) {
            let mut t = RoutingTable::new();
            let mut model: Vec<(ipnet::Ipv4Net, u8)> = Vec::new();
            for (addr, len, owner) in routes {
                let net = ipnet::Ipv4Net::new(addr.into(), len).unwrap().trunc();
                t.insert(IpNet::V4(net), owner);
                model.retain(|(m, _)| *m != net);
                model.push((net, owner));
            }
            for p in probes {
                let addr = std::net::Ipv4Addr::from(p);
                let want = model
                    .iter()
                    .filter(|(m, _)| m.contains(&addr))
                    .max_by_key(|(m, _)| m.prefix_len())
                    .map(|(_, o)| *o);
                proptest::prop_assert_eq!(t.lookup(IpAddr::V4(addr)), want);
            }
        }
    }
}
