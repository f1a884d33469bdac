//! The client address pool of `server NET MASK` (topology subnet) and `server-ipv6 P/len`
//! (reference 10.5), as one unified pool like upstream's `ifconfig_pool`.
//!
//! ```text
//!  IPv4  server NET/len:   NET+0  NET+1    NET+2   NET+3  ...  BCAST-1   BCAST
//!                          (net)  server   entry0  entry1      entryN-1  (bcast)
//!  IPv6  server-ipv6 P/len: P+1 server; entries from P+0x1000 (len < 112) or P+2 (len >= 112)
//!        entry i of the IPv6 pool is base+i, the same index as the IPv4 entry.
//! ```
//!
//! One entry is one client: entry `i` carries the `i`-th IPv4 *and* the `i`-th IPv6 address.
//! The pool size is the smaller of the two (upstream warns when the IPv6 pool is the smaller
//! one); with only one family configured, that family's size. An IPv6 pool of a prefix
//! shorter than /112 is capped at [`IFCONFIG_POOL_MAX`] entries.
//!
//! Allocation: with `duplicate-cn` off, the entry this CN held last if it is free; otherwise the
//! free entry released longest ago, never-used entries first in address order (so the first
//! client gets NET+2). With `duplicate-cn` on, the first free entry. An entry in use is never
//! handed out; exhaustion is [`PoolError::Exhausted`].

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Upstream's `IFCONFIG_POOL_MAX`: the most entries a pool can have.
pub const IFCONFIG_POOL_MAX: u32 = 65536;

/// Upstream's `IFCONFIG_POOL_MIN_NETBITS`: the shortest IPv4 prefix `server` accepts.
pub const IFCONFIG_POOL_MIN_NETBITS: u8 = 16;

/// The longest IPv4 prefix `server` accepts for `dev tun` (/29: server plus five clients).
pub const IFCONFIG_POOL_MAX_NETBITS_TUN: u8 = 29;

/// Offset of the first client address in an IPv6 pool of a prefix shorter than /112.
pub const IPV6_POOL_OFFSET: u128 = 0x1000;

/// Prefix length from which the IPv6 pool starts at P+2 instead of P+0x1000.
pub const IPV6_SMALL_POOL_NETBITS: u8 = 112;

/// Why a pool cannot be built or an address not handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The IPv4 `server` network is outside /16 ..= /29.
    #[error("IPv4 pool network {net} must be between /{IFCONFIG_POOL_MIN_NETBITS} and /{IFCONFIG_POOL_MAX_NETBITS_TUN}")]
    BadIpv4Network {
        /// The network.
        net: Ipv4Net,
    },
    /// The IPv6 `server-ipv6` network is too small for a server and two clients.
    #[error("IPv6 pool network {net} is too small")]
    BadIpv6Network {
        /// The network.
        net: Ipv6Net,
    },
    /// An `ifconfig-pool` range outside the network, over the server's address or the
    /// broadcast address, or reversed.
    #[error("IPv4 pool range {start} to {end} is not inside {net} after the server's address")]
    BadRange {
        /// The `server` network.
        net: Ipv4Net,
        /// First address of the range.
        start: Ipv4Addr,
        /// Last address of the range.
        end: Ipv4Addr,
    },
    /// Neither an IPv4 nor an IPv6 network was given.
    #[error("no pool network configured")]
    Empty,
    /// Every entry is in use.
    #[error("address pool exhausted ({size} addresses in use)")]
    Exhausted {
        /// The pool size.
        size: u32,
    },
    /// A fixed address (`ifconfig-push`) inside the pool is held by another client.
    #[error("address {addr} is in use by another client")]
    InUse {
        /// The address.
        addr: Ipv4Addr,
    },
}

/// The addresses of one pool entry, handed to one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The entry index (release it with [`Pool::release`]).
    pub index: u32,
    /// The IPv4 address, if the pool has an IPv4 part.
    pub v4: Option<Ipv4Addr>,
    /// The IPv6 address, if the pool has an IPv6 part.
    pub v6: Option<Ipv6Addr>,
}

#[derive(Debug, Clone, Default)]
struct Entry {
    in_use: bool,
    /// The CN that held it last (or holds it).
    common_name: Option<String>,
    /// Release sequence number; 0 = never used.
    released: u64,
}

/// The unified IPv4/IPv6 client pool; see the module docs.
#[derive(Debug, Clone)]
pub struct Pool {
    v4: Option<Ipv4Net>,
    v6: Option<Ipv6Net>,
    v4_base: u32,
    v6_base: u128,
    entries: Vec<Entry>,
    release_seq: u64,
}

impl Pool {
    /// The pool of `server v4` and/or `server-ipv6 v6` (topology subnet, `dev tun`). The
    /// networks' host bits are ignored.
    pub fn new(v4: Option<Ipv4Net>, v6: Option<Ipv6Net>) -> Result<Pool, PoolError> {
        Pool::with_range(v4, None, v6)
    }

    /// Like [`Pool::new`], the IPv4 entries from `range` (`ifconfig-pool START END`) instead of
    /// the whole network: it must lie inside the network, after the server's own address
    /// (NET+1) and before the broadcast address.
    pub fn with_range(
        v4: Option<Ipv4Net>,
        range: Option<(Ipv4Addr, Ipv4Addr)>,
        v6: Option<Ipv6Net>,
    ) -> Result<Pool, PoolError> {
        let v4 = v4.map(|n| n.trunc());
        let v6 = v6.map(|n| n.trunc());
        let mut size: Option<u32> = None;
        let mut v4_base = 0;
        if let Some(net) = v4 {
            if !(IFCONFIG_POOL_MIN_NETBITS..=IFCONFIG_POOL_MAX_NETBITS_TUN)
                .contains(&net.prefix_len())
            {
                return Err(PoolError::BadIpv4Network { net });
            }
            let (first, last) = match range {
                None => (u32::from(net.network()) + 2, u32::from(net.broadcast()) - 1),
                Some((start, end)) => {
                    let (first, last) = (u32::from(start), u32::from(end));
                    let inside = u32::from(net.network()) + 2..u32::from(net.broadcast());
                    if first > last || !inside.contains(&first) || !inside.contains(&last) {
                        return Err(PoolError::BadRange { net, start, end });
                    }
                    (first, last)
                }
            };
            v4_base = first;
            size = Some((last - first + 1).min(IFCONFIG_POOL_MAX));
        }
        let mut v6_base = 0;
        if let Some(net) = v6 {
            let host_bits = 128 - u32::from(net.prefix_len());
            let offset = if net.prefix_len() >= IPV6_SMALL_POOL_NETBITS {
                2
            } else {
                IPV6_POOL_OFFSET
            };
            v6_base = u128::from(net.network()) + offset;
            let v6_size = if net.prefix_len() >= IPV6_SMALL_POOL_NETBITS {
                // 2^host_bits addresses minus the offset (host part 0 and the server).
                (1u32 << host_bits).saturating_sub(offset as u32)
            } else {
                IFCONFIG_POOL_MAX
            };
            if v6_size < 2 {
                return Err(PoolError::BadIpv6Network { net });
            }
            size = Some(size.map_or(v6_size, |s| s.min(v6_size)));
        }
        let size = size.ok_or(PoolError::Empty)?;
        Ok(Pool {
            v4,
            v6,
            v4_base,
            v6_base,
            entries: vec![Entry::default(); size as usize],
            release_seq: 0,
        })
    }

    /// The IPv4 network, if any.
    pub fn v4_network(&self) -> Option<Ipv4Net> {
        self.v4
    }

    /// The IPv6 network, if any.
    pub fn v6_network(&self) -> Option<Ipv6Net> {
        self.v6
    }

    /// The server's own IPv4 address and prefix (NET+1/len).
    pub fn server_v4(&self) -> Option<Ipv4Net> {
        let net = self.v4?;
        Ipv4Net::new(
            Ipv4Addr::from(u32::from(net.network()) + 1),
            net.prefix_len(),
        )
        .ok()
    }

    /// The server's own IPv6 address and prefix (P+1/len).
    pub fn server_v6(&self) -> Option<Ipv6Net> {
        let net = self.v6?;
        Ipv6Net::new(
            Ipv6Addr::from(u128::from(net.network()) + 1),
            net.prefix_len(),
        )
        .ok()
    }

    /// How many entries the pool has.
    pub fn size(&self) -> u32 {
        self.entries.len() as u32
    }

    /// How many entries are in use.
    pub fn in_use(&self) -> u32 {
        self.entries.iter().filter(|e| e.in_use).count() as u32
    }

    /// The addresses of entry `index` (whether in use or not).
    pub fn lease(&self, index: u32) -> Lease {
        Lease {
            index,
            v4: self.v4.map(|_| Ipv4Addr::from(self.v4_base + index)),
            v6: self
                .v6
                .map(|_| Ipv6Addr::from(self.v6_base + u128::from(index))),
        }
    }

    /// Hands out an entry to a client with certificate CN `common_name` (see the module docs
    /// for the order). With `duplicate_cn`, the CN plays no part.
    pub fn acquire(
        &mut self,
        common_name: Option<&str>,
        duplicate_cn: bool,
    ) -> Result<Lease, PoolError> {
        let cn = if duplicate_cn { None } else { common_name };
        let index = self
            .find(cn)
            .ok_or(PoolError::Exhausted { size: self.size() })?;
        let entry = &mut self.entries[index];
        entry.in_use = true;
        entry.common_name = cn.map(str::to_owned);
        Ok(self.lease(index as u32))
    }

    fn find(&self, cn: Option<&str>) -> Option<usize> {
        let free = || self.entries.iter().enumerate().filter(|(_, e)| !e.in_use);
        let Some(cn) = cn else {
            // duplicate-cn: simply the first free entry.
            return free().map(|(i, _)| i).next();
        };
        if let Some((i, _)) = free().find(|(_, e)| e.common_name.as_deref() == Some(cn)) {
            return Some(i);
        }
        free().min_by_key(|(i, e)| (e.released, *i)).map(|(i, _)| i)
    }

    /// Marks the entry holding `addr` (an `ifconfig-push` address) as in use. `Ok(None)` if
    /// `addr` is outside the pool; [`PoolError::InUse`] if another client holds it.
    pub fn acquire_fixed(
        &mut self,
        addr: Ipv4Addr,
        common_name: Option<&str>,
    ) -> Result<Option<Lease>, PoolError> {
        let Some(index) = self.index_of(addr) else {
            return Ok(None);
        };
        let entry = &mut self.entries[index as usize];
        if entry.in_use {
            return Err(PoolError::InUse { addr });
        }
        entry.in_use = true;
        entry.common_name = common_name.map(str::to_owned);
        Ok(Some(self.lease(index)))
    }

    fn index_of(&self, addr: Ipv4Addr) -> Option<u32> {
        self.v4?;
        let index = u32::from(addr).checked_sub(self.v4_base)?;
        (index < self.size()).then_some(index)
    }

    /// Whether the entry holding `addr` is in use.
    pub fn is_in_use(&self, addr: Ipv4Addr) -> bool {
        self.index_of(addr)
            .is_some_and(|i| self.entries[i as usize].in_use)
    }

    /// Returns an entry to the pool; it remembers its last CN. Releasing a free entry or an
    /// index outside the pool does nothing.
    pub fn release(&mut self, index: u32) {
        let Some(entry) = self.entries.get_mut(index as usize) else {
            return;
        };
        if !entry.in_use {
            return;
        }
        self.release_seq += 1;
        entry.in_use = false;
        entry.released = self.release_seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }
    fn v6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }
    fn a4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }
    fn a6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn default_pool_layout() {
        let mut p = Pool::new(Some(v4("192.168.123.0/24")), None).unwrap();
        assert_eq!(p.size(), 253, ".2 ..= .254");
        assert_eq!(p.server_v4(), Some(v4("192.168.123.1/24")));
        let first = p.acquire(Some("a"), false).unwrap();
        assert_eq!(first.v4, Some(a4("192.168.123.2")));
        assert_eq!(first.v6, None);
        let second = p.acquire(Some("b"), false).unwrap();
        assert_eq!(second.v4, Some(a4("192.168.123.3")));
    }

    #[test]
    fn ipv6_pool_offsets() {
        // /96 (vpn2's default): server P+1, clients from P+0x1000, capped size.
        let p = Pool::new(None, Some(v6("fd8f:6d53:b97a:1::/96"))).unwrap();
        assert_eq!(p.server_v6(), Some(v6("fd8f:6d53:b97a:1::1/96")));
        assert_eq!(p.size(), IFCONFIG_POOL_MAX);
        assert_eq!(p.lease(0).v6, Some(a6("fd8f:6d53:b97a:1::1000")));
        // /112 and longer: clients from P+2.
        let p = Pool::new(None, Some(v6("fd00::/112"))).unwrap();
        assert_eq!(p.lease(0).v6, Some(a6("fd00::2")));
        assert_eq!(p.size(), 65536 - 2);
        let p = Pool::new(None, Some(v6("fd00::/126"))).unwrap();
        assert_eq!(p.size(), 2);
        assert!(Pool::new(None, Some(v6("fd00::/127"))).is_err());
    }

    #[test]
    fn dual_stack_entries_are_linked_and_sized_by_the_smaller() {
        // Observed with openvpn 2.6.14: the first client of `server 192.168.123.0/24` plus
        // `server-ipv6 fd8f:6d53:b97a:1::/96` got 192.168.123.2 and fd8f:6d53:b97a:1::1000.
        let mut p = Pool::new(
            Some(v4("192.168.123.0/24")),
            Some(v6("fd8f:6d53:b97a:1::/96")),
        )
        .unwrap();
        assert_eq!(p.size(), 253);
        let l = p.acquire(Some("x"), false).unwrap();
        assert_eq!(l.v4, Some(a4("192.168.123.2")));
        assert_eq!(l.v6, Some(a6("fd8f:6d53:b97a:1::1000")));
        let l = p.acquire(Some("y"), false).unwrap();
        assert_eq!(l.v6, Some(a6("fd8f:6d53:b97a:1::1001")));
        let small = Pool::new(Some(v4("10.0.0.0/16")), Some(v6("fd00::/120"))).unwrap();
        assert_eq!(small.size(), 254, "the IPv6 pool is the smaller one");
    }

    #[test]
    fn bad_networks() {
        assert!(matches!(
            Pool::new(Some(v4("10.0.0.0/8")), None),
            Err(PoolError::BadIpv4Network { .. })
        ));
        assert!(matches!(
            Pool::new(Some(v4("10.0.0.0/30")), None),
            Err(PoolError::BadIpv4Network { .. })
        ));
        assert_eq!(Pool::new(None, None).unwrap_err(), PoolError::Empty);
        // An ifconfig-pool range inside the network, after the server's address.
        let range = |a: &str, b: &str| Some((a.parse().unwrap(), b.parse().unwrap()));
        let net = Some(v4("192.168.123.0/24"));
        let p = Pool::with_range(net, range("192.168.123.100", "192.168.123.149"), None).unwrap();
        assert_eq!(p.size(), 50);
        assert_eq!(p.lease(0).v4, Some("192.168.123.100".parse().unwrap()));
        assert_eq!(p.lease(49).v4, Some("192.168.123.149".parse().unwrap()));
        for (a, b) in [
            ("192.168.123.1", "192.168.123.10"), // the server's own address
            ("192.168.123.200", "192.168.123.255"), // the broadcast address
            ("192.168.123.50", "192.168.123.40"), // reversed
            ("192.168.124.2", "192.168.124.9"),  // another network
        ] {
            assert!(
                matches!(
                    Pool::with_range(net, range(a, b), None),
                    Err(PoolError::BadRange { .. })
                ),
                "{a}-{b}"
            );
        }
        assert_eq!(Pool::new(Some(v4("10.0.0.0/29")), None).unwrap().size(), 5);
    }

    #[test]
    fn sticky_per_cn_then_longest_released() {
        let mut p = Pool::new(Some(v4("10.8.0.0/29")), None).unwrap(); // .2 ..= .6
        let a = p.acquire(Some("a"), false).unwrap(); // .2
        let b = p.acquire(Some("b"), false).unwrap(); // .3
        let c = p.acquire(Some("c"), false).unwrap(); // .4
        p.release(b.index);
        p.release(a.index);
        // A new CN takes a never-used entry first (released 0 = longest ago).
        let d = p.acquire(Some("d"), false).unwrap();
        assert_eq!(d.v4, Some(a4("10.8.0.5")));
        let e = p.acquire(Some("e"), false).unwrap();
        assert_eq!(e.v4, Some(a4("10.8.0.6")));
        // Now only .3 (released first) and .2 (released second) are free; "a" gets its own back.
        let a2 = p.acquire(Some("a"), false).unwrap();
        assert_eq!(a2.v4, Some(a4("10.8.0.2")));
        p.release(a2.index);
        // "f" is new: .3 was released longest ago.
        let f = p.acquire(Some("f"), false).unwrap();
        assert_eq!(f.v4, Some(a4("10.8.0.3")));
        let _ = c;
    }

    #[test]
    fn exhaustion_is_an_error_and_live_addresses_are_never_reused() {
        let mut p = Pool::new(Some(v4("10.8.0.0/29")), None).unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..5 {
            let l = p.acquire(Some("same"), true).unwrap();
            assert!(seen.insert(l.v4), "entry {i} handed out twice");
        }
        assert_eq!(
            p.acquire(Some("x"), false),
            Err(PoolError::Exhausted { size: 5 })
        );
        assert_eq!(p.in_use(), 5);
    }

    #[test]
    fn duplicate_cn_takes_first_free() {
        let mut p = Pool::new(Some(v4("10.8.0.0/29")), None).unwrap();
        let a = p.acquire(Some("a"), true).unwrap();
        let b = p.acquire(Some("a"), true).unwrap();
        assert_eq!(a.v4, Some(a4("10.8.0.2")));
        assert_eq!(b.v4, Some(a4("10.8.0.3")));
        p.release(a.index);
        let c = p.acquire(Some("z"), true).unwrap();
        assert_eq!(c.v4, Some(a4("10.8.0.2")));
    }

    #[test]
    fn fixed_addresses() {
        let mut p = Pool::new(Some(v4("10.8.0.0/29")), None).unwrap();
        assert_eq!(p.acquire_fixed(a4("10.9.0.7"), Some("a")), Ok(None));
        let l = p.acquire_fixed(a4("10.8.0.2"), Some("a")).unwrap().unwrap();
        assert!(p.is_in_use(a4("10.8.0.2")));
        assert_eq!(
            p.acquire_fixed(a4("10.8.0.2"), Some("b")),
            Err(PoolError::InUse {
                addr: a4("10.8.0.2")
            })
        );
        // The dynamic allocator skips it.
        assert_eq!(p.acquire(None, false).unwrap().v4, Some(a4("10.8.0.3")));
        p.release(l.index);
        assert!(!p.is_in_use(a4("10.8.0.2")));
    }

    proptest::proptest! {
        #[test]
        fn never_two_live_holders(ops in proptest::collection::vec((0u8..4, 0usize..8), 1..200)) {
            let mut p = Pool::new(Some(v4("10.8.0.0/28")), Some(v6("fd00::/64"))).unwrap();
            let mut live: Vec<Lease> = Vec::new();
            for (op, arg) in ops {
                match op {
                    0..=2 => {
                        let cn = format!("cn{}", arg % 5);
                        match p.acquire(Some(&cn), op == 2) {
                            Ok(l) => {
                                proptest::prop_assert!(live.iter().all(|x| x.v4 != l.v4 && x.v6 != l.v6));
                                live.push(l);
                            }
                            Err(PoolError::Exhausted { .. }) => {
                                proptest::prop_assert_eq!(live.len() as u32, p.size());
                            }
                            Err(e) => proptest::prop_assert!(false, "{e}"),
                        }
                    }
                    _ => {
                        if !live.is_empty() {
                            let l = live.remove(arg % live.len());
                            p.release(l.index);
                        }
                    }
                }
                proptest::prop_assert_eq!(p.in_use() as usize, live.len());
            }
        }
    }
}
