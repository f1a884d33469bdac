//! Names in CONNECT targets: how the addresses a name resolves to are picked (Envoy's
//! `dns_lookup_family`) and the settings of the DNS cache (`dns_cache_config`).

use std::net::IpAddr;

/// Gardener's `max_hosts`.
pub const DEFAULT_MAX_HOSTS: usize = 8192;
/// Gardener's cache name (it becomes part of the DNS series' names).
pub const DEFAULT_CACHE_NAME: &str = "dynamic_forward_proxy_cache_config";

/// Envoy's `dns_lookup_family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupFamily {
    /// `AUTO` (Envoy's default): the IPv6 addresses if there are any, else the IPv4 ones.
    Auto,
    /// `V4_ONLY`.
    V4Only,
    /// `V6_ONLY`.
    V6Only,
    /// `V4_PREFERRED`: the IPv4 addresses if there are any, else the IPv6 ones.
    V4Preferred,
    /// `ALL` (Gardener's): every address, in the resolver's order.
    All,
}

impl LookupFamily {
    /// The value as Envoy spells it.
    pub fn from_envoy(s: &str) -> Option<LookupFamily> {
        Some(match s {
            "AUTO" => LookupFamily::Auto,
            "V4_ONLY" => LookupFamily::V4Only,
            "V6_ONLY" => LookupFamily::V6Only,
            "V4_PREFERRED" => LookupFamily::V4Preferred,
            "ALL" => LookupFamily::All,
            _ => return None,
        })
    }

    /// The addresses this family dials, in order.
    pub fn pick(self, addrs: Vec<IpAddr>) -> Vec<IpAddr> {
        let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = addrs.iter().partition(|a| a.is_ipv4());
        match self {
            LookupFamily::All => addrs,
            LookupFamily::V4Only => v4,
            LookupFamily::V6Only => v6,
            LookupFamily::Auto if v6.is_empty() => v4,
            LookupFamily::Auto => v6,
            LookupFamily::V4Preferred if v4.is_empty() => v6,
            LookupFamily::V4Preferred => v4,
        }
    }
}

/// The DNS cache's settings (`dns_cache_config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// `name`: the DNS series are `envoy_dns_cache_<name>_*`.
    pub cache_name: String,
    /// `dns_lookup_family`.
    pub family: LookupFamily,
    /// `max_hosts`.
    pub max_hosts: usize,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            cache_name: DEFAULT_CACHE_NAME.into(),
            family: LookupFamily::All,
            max_hosts: DEFAULT_MAX_HOSTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn families_pick_as_envoy() {
        let both = ips(&["192.0.2.1", "2001:db8::1", "192.0.2.2"]);
        let v4 = ips(&["192.0.2.1"]);
        use LookupFamily::*;
        assert_eq!(All.pick(both.clone()), both);
        assert_eq!(V4Only.pick(both.clone()), ips(&["192.0.2.1", "192.0.2.2"]));
        assert_eq!(V6Only.pick(both.clone()), ips(&["2001:db8::1"]));
        assert_eq!(Auto.pick(both.clone()), ips(&["2001:db8::1"]));
        assert_eq!(Auto.pick(v4.clone()), v4);
        assert_eq!(V4Preferred.pick(both), ips(&["192.0.2.1", "192.0.2.2"]));
        assert_eq!(V4Preferred.pick(ips(&["::1"])), ips(&["::1"]));
        assert_eq!(V6Only.pick(v4), Vec::<IpAddr>::new());
        assert_eq!(LookupFamily::from_envoy("ALL"), Some(All));
        assert_eq!(LookupFamily::from_envoy("all"), None);
    }
}
