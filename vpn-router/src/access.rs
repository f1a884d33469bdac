//! Who may use a route: the allow-list model shared by every flow of a shoot. Pure: the
//! caller supplies the route's rules, the always-allowed networks and both addresses of the
//! connection.
//!
//! A target's rules are ordered; the first whose networks contain the address it looks at
//! decides (`allow` or `deny`). Each rule looks at one address of the connection
//! ([`Source`]): the client as the PROXY header names it (the TCP peer when there is no
//! header), or the TCP peer itself. The always-allowed networks are checked before any rule,
//! so a deny rule can never lock out the seed's and the shoot's own nodes. Then:
//!
//! * no rules: anyone (IPv4 and IPv6);
//! * rules, none matching: denied.
//!
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are judged as the IPv4 address they carry,
//! and the networks of rules and lists are loaded so (`::ffff:a.b.c.d/n` with `n >= 96` as
//! `a.b.c.d/(n - 96)`, `netio::ingress::canonical_net`), so no rule loads that cannot match.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// The two addresses of a connection a rule can look at, IPv4-mapped ones as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The PROXY header's source address when the connection carried one, else the TCP peer
    /// (Envoy's "remote address", the ACL extension's `remote_ip`).
    pub address: IpAddr,
    /// The TCP peer (`direct_remote_ip`): the load balancer when there was a PROXY header.
    pub peer: IpAddr,
}

impl Client {
    /// The connection's addresses; IPv4-mapped ones are stored as IPv4.
    pub fn new(address: IpAddr, peer: IpAddr) -> Self {
        Self {
            address: unmapped(address),
            peer: unmapped(peer),
        }
    }

    /// A connection without a PROXY header: both addresses are the TCP peer.
    pub fn direct(peer: IpAddr) -> Self {
        Self::new(peer, peer)
    }

    /// The address `source` names.
    pub fn at(self, source: Source) -> IpAddr {
        match source {
            Source::Proxy => self.address,
            Source::Peer => self.peer,
        }
    }
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Which address of a connection a rule judges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Source {
    /// The client as the PROXY header names it, else the TCP peer (`source = "proxy"`, the
    /// default; the ACL extension's `remote_ip`).
    #[default]
    Proxy,
    /// The TCP peer, even behind a PROXY header (`source = "peer"`; the ACL extension's
    /// `direct_remote_ip`).
    Peer,
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The connection may use the route.
    Allow,
    /// It may not.
    Deny,
}

/// One rule: `action` for connections whose `source` address is in `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// What it does when it matches.
    pub action: Action,
    /// The networks it matches.
    pub from: Vec<IpNet>,
    /// The address it looks at.
    pub source: Source,
}

impl Rule {
    /// `allow` from `from`, judged by the client address: what `allow = [...]` means.
    pub fn allow(from: Vec<IpNet>) -> Self {
        Self {
            action: Action::Allow,
            from,
            source: Source::Proxy,
        }
    }

    /// Whether the rule's networks contain the address it looks at.
    pub fn matches(&self, who: Client) -> bool {
        let ip = who.at(self.source);
        self.from.iter().any(|net| net.contains(&ip))
    }
}

/// Networks allowed to reach every route whatever its rules say: the seed's nodes and pods,
/// the shoots' nodes, egress NAT addresses, the operator's additional ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlwaysAllowed {
    /// Judged by the client address (`always_allowed`).
    pub proxy: Vec<IpNet>,
    /// Judged by the TCP peer (`always_allowed_peers`).
    pub peer: Vec<IpNet>,
}

impl AlwaysAllowed {
    /// Whether `who` is always allowed.
    pub fn contains(&self, who: Client) -> bool {
        let any = |nets: &[IpNet], ip: IpAddr| nets.iter().any(|net| net.contains(&ip));
        any(&self.proxy, who.address) || any(&self.peer, who.peer)
    }
}

/// Why a connection may not use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The rule at this index (0-based) matched and denies.
    Rule(usize),
    /// The route has rules and none matched.
    NoMatch,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Rule(i) => write!(f, "deny rule {}", i + 1),
            Denial::NoMatch => f.write_str("no rule matched"),
        }
    }
}

/// Whether `who` may use a route with `rules`: always-allowed first, then the first
/// matching rule; no rules at all admit anyone, rules without a match deny.
pub fn admits(rules: &[Rule], always: &AlwaysAllowed, who: Client) -> Result<(), Denial> {
    if rules.is_empty() || always.contains(who) {
        return Ok(());
    }
    match rules.iter().position(|rule| rule.matches(who)) {
        Some(i) if rules[i].action == Action::Allow => Ok(()),
        Some(i) => Err(Denial::Rule(i)),
        None => Err(Denial::NoMatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn rule(action: Action, from: &[&str], source: Source) -> Rule {
        Rule {
            action,
            from: nets(from),
            source,
        }
    }

    fn always() -> AlwaysAllowed {
        AlwaysAllowed {
            proxy: nets(&["10.250.0.0/16", "fd50::/64"]),
            peer: nets(&["10.96.0.0/16"]),
        }
    }

    #[test]
    fn no_rules_admit_anyone_of_either_family() {
        for who in [
            "203.0.113.9",
            "2001:db8::9",
            "::ffff:203.0.113.9",
            "0.0.0.0",
            "::",
        ] {
            let who = Client::direct(ip(who));
            assert_eq!(admits(&[], &AlwaysAllowed::default(), who), Ok(()));
            assert_eq!(admits(&[], &always(), who), Ok(()));
        }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        use Action::*;
        let rules = [
            rule(Deny, &["192.0.2.128/25"], Source::Proxy),
            rule(Allow, &["192.0.2.0/24", "2001:db8::/32"], Source::Proxy),
            rule(Deny, &["0.0.0.0/0"], Source::Proxy),
            rule(Allow, &["198.51.100.0/24"], Source::Proxy),
        ];
        let none = AlwaysAllowed::default();
        for (who, want) in [
            ("192.0.2.200", Err(Denial::Rule(0))),
            ("192.0.2.128", Err(Denial::Rule(0))),
            ("192.0.2.127", Ok(())),
            ("192.0.2.0", Ok(())),
            ("::ffff:192.0.2.1", Ok(())),
            ("::ffff:192.0.2.129", Err(Denial::Rule(0))),
            ("2001:db8::1", Ok(())),
            // Shadowed by the deny-all before it.
            ("198.51.100.1", Err(Denial::Rule(2))),
            ("2001:db9::1", Err(Denial::NoMatch)),
        ] {
            assert_eq!(
                admits(&rules, &none, Client::direct(ip(who))),
                want,
                "{who}"
            );
        }
    }

    #[test]
    fn rules_without_a_match_deny_and_an_empty_allow_admits_only_the_always_allowed() {
        let rules = [Rule::allow(vec![])];
        assert_eq!(
            admits(
                &rules,
                &AlwaysAllowed::default(),
                Client::direct(ip("10.250.0.1"))
            ),
            Err(Denial::NoMatch)
        );
        assert_eq!(
            admits(&rules, &always(), Client::direct(ip("10.250.0.1"))),
            Ok(())
        );
        assert_eq!(
            admits(&rules, &always(), Client::direct(ip("fd50::1"))),
            Ok(())
        );
        assert_eq!(
            admits(&rules, &always(), Client::direct(ip("10.251.0.1"))),
            Err(Denial::NoMatch)
        );
    }

    #[test]
    fn always_allowed_comes_before_a_deny_and_each_list_judges_its_own_address() {
        let rules = [rule(Action::Deny, &["0.0.0.0/0", "::/0"], Source::Proxy)];
        let a = always();
        // The client address in `proxy`, the peer anything.
        let via_lb = Client::new(ip("10.250.1.1"), ip("192.0.2.1"));
        assert_eq!(admits(&rules, &a, via_lb), Ok(()));
        // The peer in `peer`.
        let from_node = Client::new(ip("192.0.2.1"), ip("10.96.1.1"));
        assert_eq!(admits(&rules, &a, from_node), Ok(()));
        // The client address in `peer` only, the peer in `proxy` only: neither list.
        let crossed = Client::new(ip("10.96.1.1"), ip("10.250.1.1"));
        assert_eq!(admits(&rules, &a, crossed), Err(Denial::Rule(0)));
        assert_eq!(
            admits(&rules, &a, Client::direct(ip("::ffff:10.96.0.1"))),
            Ok(()),
            "a mapped peer is judged as IPv4"
        );
    }

    #[test]
    fn each_rule_looks_at_its_own_source() {
        // The load balancer 10.180.0.5 speaks for 203.0.113.9.
        let who = Client::new(ip("203.0.113.9"), ip("::ffff:10.180.0.5"));
        let none = AlwaysAllowed::default();
        let by_peer = [rule(Action::Allow, &["10.180.0.0/16"], Source::Peer)];
        let by_client = [rule(Action::Allow, &["10.180.0.0/16"], Source::Proxy)];
        assert_eq!(admits(&by_peer, &none, who), Ok(()));
        assert_eq!(admits(&by_client, &none, who), Err(Denial::NoMatch));
        let deny_lb_allow_client = [
            rule(Action::Deny, &["10.180.0.5/32"], Source::Peer),
            rule(Action::Allow, &["203.0.113.0/24"], Source::Proxy),
        ];
        assert_eq!(
            admits(&deny_lb_allow_client, &none, who),
            Err(Denial::Rule(0))
        );
        let direct = Client::direct(ip("203.0.113.9"));
        assert_eq!(admits(&deny_lb_allow_client, &none, direct), Ok(()));
        assert_eq!(who.at(Source::Peer), ip("10.180.0.5"));
        assert_eq!(who.at(Source::Proxy), ip("203.0.113.9"));
    }

    #[test]
    fn denials_name_the_rule() {
        assert_eq!(Denial::Rule(0).to_string(), "deny rule 1");
        assert_eq!(Denial::NoMatch.to_string(), "no rule matched");
    }
}
