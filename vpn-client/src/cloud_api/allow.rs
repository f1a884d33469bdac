//! The API endpoints one connection may reach: `HOST:PORT` entries, where `HOST` is an exact
//! name (`keystone.example`), a wildcard (`*.nsx.example`: any name below `nsx.example`, not
//! `nsx.example` itself), an address (`10.20.3.10`, `[fd00::10]`) or a network
//! (`10.20.0.0/22`, `[fd00::/64]`). An IPv4-mapped address or network
//! (`[::ffff:10.20.0.0/118]`) is the IPv4 one it carries (`10.20.0.0/22`), as everywhere
//! networks are configured (`netio::ingress::canonical_net`): as written it could never match.
//!
//! Names and addresses play different parts. A name entry says which names the seed may
//! *ask for*; only address and network entries say where the proxy may *connect*. A CONNECT
//! to a name passes when the name matches a name entry for that port, and then every address
//! the VM's resolver gives must lie in an address or network entry for the port: a name that
//! resolves outside the list (a changed or poisoned DNS record, a wildcard that covers more
//! than the API) is refused, and nothing reachable is added by DNS. A CONNECT to an address
//! passes when an address or network entry covers it.
//!
//! Whatever the list says, the proxy never connects to the [`special`] ranges (loopback,
//! link-local and cloud metadata, unspecified, multicast) nor to an address of the VM itself
//! (the proxy checks that, it needs the kernel).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use netio::ingress::canonical_net;

/// One `HOST:PORT` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    host: HostPattern,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Lower case, without a final dot.
    Name(String),
    /// `*.suffix`, kept as `.suffix` in lower case.
    Below(String),
    Net(IpNet),
}

/// Why an entry did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// No `:PORT`, or a port that is not 1 to 65535.
    #[error("{entry:?}: want HOST:PORT with a port from 1 to 65535")]
    Port {
        /// The entry as written.
        entry: String,
    },
    /// The host is neither a name, a `*.` wildcard, an address nor a network (IPv6 in
    /// brackets).
    #[error("{entry:?}: the host is not a DNS name, a *.name wildcard, an address or a network (IPv6 in brackets)")]
    Host {
        /// The entry as written.
        entry: String,
    },
}

impl FromStr for Entry {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Entry, EntryError> {
        let port_err = || EntryError::Port {
            entry: s.to_owned(),
        };
        let host_err = || EntryError::Host {
            entry: s.to_owned(),
        };
        let (host, port) = s.rsplit_once(':').ok_or_else(port_err)?;
        let port: u16 = match port.parse() {
            Ok(p) if p > 0 && !port.starts_with('0') => p,
            _ => return Err(port_err()),
        };
        let host = if let Some(inner) = host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or_else(host_err)?;
            let net = parse_net(inner).ok_or_else(host_err)?;
            if !matches!(net, IpNet::V6(_)) {
                return Err(host_err());
            }
            // An IPv4-mapped network is the IPv4 network it carries: addresses are compared
            // in their canonical form, so as written it could never match.
            HostPattern::Net(canonical_net(net))
        } else if let Some(net) = parse_net(host) {
            if !matches!(net, IpNet::V4(_)) {
                return Err(host_err());
            }
            HostPattern::Net(net)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalise(suffix).ok_or_else(host_err)?;
            HostPattern::Below(format!(".{suffix}"))
        } else {
            HostPattern::Name(normalise(host).ok_or_else(host_err)?)
        };
        Ok(Entry { host, port })
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Name(n) => write!(f, "{n}:{}", self.port),
            HostPattern::Below(s) => write!(f, "*{s}:{}", self.port),
            HostPattern::Net(IpNet::V6(n)) if n.prefix_len() == 128 => {
                write!(f, "[{}]:{}", n.addr(), self.port)
            }
            HostPattern::Net(IpNet::V4(n)) if n.prefix_len() == 32 => {
                write!(f, "{}:{}", n.addr(), self.port)
            }
            HostPattern::Net(IpNet::V6(n)) => write!(f, "[{n}]:{}", self.port),
            HostPattern::Net(n) => write!(f, "{n}:{}", self.port),
        }
    }
}

/// An address (a host network) or a network, truncated to its prefix.
fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    s.parse::<IpNet>().ok().map(|n| n.trunc())
}

/// A DNS name in lower case without its final dot; `None` if it is not one (letters, digits,
/// `-`, `_` in dot-separated labels of 1 to 63 bytes; not all digits and dots).
fn normalise(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let ok = !name.is_empty()
        && name.len() <= 253
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then(|| name.to_ascii_lowercase())
}

/// The allow-list of one connection; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// A list of `entries`.
    pub fn new(entries: Vec<Entry>) -> AllowList {
        AllowList { entries }
    }

    /// The entries, in the order given.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Whether the seed may ask for `name` on `port` (a name entry matches; any case, with or
    /// without the final dot).
    pub fn name_allowed(&self, name: &str, port: u16) -> bool {
        let Some(name) = normalise(name) else {
            return false;
        };
        self.entries.iter().any(|e| {
            e.port == port
                && match &e.host {
                    HostPattern::Name(n) => *n == name,
                    HostPattern::Below(suffix) => name.ends_with(suffix.as_str()),
                    HostPattern::Net(_) => false,
                }
        })
    }

    /// Whether the proxy may connect to `ip` on `port` (an address or network entry covers
    /// it). The [`special`] ranges and the VM's own addresses are checked apart.
    pub fn address_allowed(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.entries
            .iter()
            .any(|e| e.port == port && matches!(&e.host, HostPattern::Net(n) if n.contains(&ip)))
    }
}

/// The ranges the proxy never connects to, whatever the list says: unspecified, loopback,
/// link-local (where cloud metadata services answer), multicast and broadcast. `None` for
/// any other address.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(a) if a.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V4(a) if a.is_loopback() => Some("loopback"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local"),
        IpAddr::V4(a) if a.is_multicast() || a.is_broadcast() => Some("multicast"),
        IpAddr::V6(a) if a.is_unspecified() => Some("unspecified"),
        IpAddr::V6(a) if a.is_loopback() => Some("loopback"),
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("link-local"),
        IpAddr::V6(a) if a.is_multicast() => Some("multicast"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().map(|e| e.parse().unwrap()).collect())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_parse_and_print_back() {
        for (text, shown) in [
            ("keystone.example:5000", "keystone.example:5000"),
            ("KeyStone.Example.:5000", "keystone.example:5000"),
            ("*.nsx.example:443", "*.nsx.example:443"),
            ("10.20.3.10:443", "10.20.3.10:443"),
            ("10.20.0.0/22:443", "10.20.0.0/22:443"),
            ("10.20.1.7/22:443", "10.20.0.0/22:443"),
            ("[fd00::10]:443", "[fd00::10]:443"),
            ("[fd00::/64]:443", "[fd00::/64]:443"),
        ] {
            let e: Entry = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(e.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn malformed_entries_are_refused_with_the_reason() {
        for text in ["keystone.example", "x:0", "x:65536", "x:05", "x:", ":443"] {
            let err = text.parse::<Entry>().unwrap_err();
            assert!(
                matches!(err, EntryError::Port { .. } | EntryError::Host { .. }),
                "{text}"
            );
        }
        for text in [
            "fd00::1:443",
            "[10.0.0.1]:443",
            "*.:443",
            "a..b:443",
            "under score!:443",
            "*.*.x:443",
            "1.2.3:443",
        ] {
            assert_eq!(
                text.parse::<Entry>(),
                Err(EntryError::Host {
                    entry: text.to_owned()
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard_on_the_same_port() {
        let l = list(&["api.private.example:443", "*.nsx.example:443"]);
        assert!(l.name_allowed("api.private.example", 443));
        assert!(l.name_allowed("API.private.example.", 443));
        assert!(!l.name_allowed("api.private.example", 8443));
        assert!(!l.name_allowed("private.example", 443));
        assert!(!l.name_allowed("xapi.private.example", 443));
        assert!(l.name_allowed("mgr.nsx.example", 443));
        assert!(l.name_allowed("a.b.nsx.example", 443));
        assert!(!l.name_allowed("nsx.example", 443));
        assert!(!l.name_allowed("evilnsx.example", 443));
        assert!(!l.name_allowed("10.20.3.10", 443));
    }

    #[test]
    fn only_address_and_network_entries_allow_a_connection() {
        let l = list(&[
            "api.private.example:443",
            "10.20.0.0/22:443",
            "[fd00::/64]:6443",
        ]);
        assert!(l.address_allowed(ip("10.20.3.10"), 443));
        assert!(l.address_allowed(ip("::ffff:10.20.3.10"), 443));
        assert!(!l.address_allowed(ip("10.20.4.20"), 443));
        assert!(!l.address_allowed(ip("10.20.3.10"), 22));
        assert!(l.address_allowed(ip("fd00::5"), 6443));
        assert!(!l.address_allowed(ip("fd00:1::5"), 6443));
        // A name entry never allows an address.
        assert!(!list(&["api.private.example:443"]).address_allowed(ip("10.20.3.10"), 443));
    }

    #[test]
    fn special_ranges() {
        for (a, why) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "multicast"),
            ("ff02::1", "multicast"),
        ] {
            assert_eq!(special(ip(a)), Some(why), "{a}");
        }
        assert_eq!(special(ip("10.20.3.10")), None);
        assert_eq!(special(ip("fd00::1")), None);
    }

    #[test]
    fn ipv4_mapped_entries_are_the_ipv4_networks_they_carry() {
        let list = AllowList::new(vec![
            "[::ffff:10.20.0.0/118]:443".parse().unwrap(),
            "[::ffff:10.30.0.7]:5000".parse().unwrap(),
        ]);
        let shown: Vec<String> = list.entries().iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.20.0.0/22:443", "10.30.0.7:5000"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(list.address_allowed(ip("10.20.3.255"), 443));
        assert!(list.address_allowed(ip("::ffff:10.20.0.1"), 443));
        assert!(list.address_allowed(ip("10.30.0.7"), 5000));
        assert!(!list.address_allowed(ip("10.20.4.0"), 443));
        assert!(!list.address_allowed(ip("10.30.0.8"), 5000));
    }
}
