//! The push guard: what no server may push, whatever the client's pull-filters, `route-nopull`
//! or strict mode accept, and in every mode (a config file without filters, vpn2's
//! environment, strict).
//!
//! Nothing the server pushes may give the client a route wider than the server literally
//! named, redirect the client's traffic to the internet by routes, put the path to the server or the proxy into the tunnel, or switch the client's
//! liveness check off:
//!
//! | rule | decided by | upstream 2.6 with the same push |
//! |---|---|---|
//! | a `route` whose NETWORK has bits outside its NETMASK (`route 10.252.9.9 255.0.0.0`) is refused | [`check`], inside [`super::PullPolicy::process`] | the kernel refuses the route (`EINVAL`): not installed |
//! | a `route-ipv6` whose address has bits outside its prefix (`route-ipv6 fd00::1/64`) is refused | [`check`] | masked and installed (`fd00::/64`) |
//! | a `route` wider than [`WIDEST_IPV4_ROUTE`] (`0.0.0.0/1`, `128.0.0.0/1`, `0.0.0.0/0`), or a `route-ipv6` wider than [`WIDEST_IPV6_ROUTE`] outside the unique-local `fc00::/7` (`::/0`, `2000::/3`, `2000::/4`), is refused: it amounts to a default route | [`check`] | installed into the tunnel |
//! | `ping 0` and `ping-restart 0` are refused: the client keeps its own value, or none | [`check`] | applied: pings, or the restart on silence, switched off |
//! | a pushed `ping-restart` below [`PING_RESTART_FLOOR`] seconds, or below twice the `ping` pushed with it, is raised to that | [`check`], then [`finish`] on the complete push | applied as pushed |
//! | a `route`, `route-ipv6`, or the subnet of an `ifconfig` / `ifconfig-ipv6`, that contains an address the client dials (the server, or the HTTP proxy) is refused | [`PathGuard::apply`], by the client's driver with the addresses it dialed | IPv4: installed, and the tunnel carries its own packets until it dies; IPv6: installed with a host route to the server via the old gateway |
//!
//! Every rule decides on the typed option, after the text was tokenised and parsed as it would
//! take effect, so whitespace, quoting and case in the pushed text cannot get around it (an
//! option name in the wrong case is an unknown option and never takes effect at all).
//!
//! Why these keepalive bounds: `ping 0` / `ping-restart 0` mean "off", so refusing them leaves
//! the client with its own `ping` / `ping-restart` when it configured one and with nothing when
//! it did not, which is what accepting them would have given it then. A server sends a ping
//! when it sent nothing else for its `ping` seconds, and upstream's `keepalive N M` pushes that
//! N as `ping N`; a `ping-restart` not longer than that interval restarts a healthy idle tunnel
//! between two pings, again and again, and sends the client at the server in a loop. So a
//! pushed `ping-restart` is raised to twice the pushed `ping` (upstream's own `keepalive` rule,
//! M >= 2N) and to at least [`PING_RESTART_FLOOR`] (twice the shortest ping interval there
//! is). Raising it only makes the client notice a dead peer later; it never restarts a healthy
//! tunnel. The reverse changes are not made: `ping` has no floor above 1 s and neither value a
//! ceiling, because the client's `ping` is what keeps the *server's* restart timer (twice the
//! pushed `ping-restart`) satisfied, and a lowered `ping-restart` could fire between the pings
//! of a server that pings rarely; either could cut a healthy tunnel.
//!
//! Why "wider than a /8" is a default route: `redirect-gateway` never takes effect on our
//! client (DEVIATIONS P7), and the same redirect spelled as routes (`0.0.0.0/1` plus
//! `128.0.0.0/1`, `2000::/3`, `2000::/4` plus `3000::/4`) must meet the same refusal. The
//! networks a Gardener tunnel carries are a cluster's pod, service and node networks and vpn2's
//! mappings of them: private or reserved IPv4 ranges no wider than `10.0.0.0/8` (`100.64/10`,
//! `172.16/12`, `192.168/16`, vpn2's `241/8` to `244/8`), and IPv6 networks of a /48 or longer,
//! global or unique-local (the transfer network `fd8f:6d53:b97a:1::/96`). A /8 is the widest
//! any of them is, and every IPv4 route wider than that takes in public address space; no
//! organisation is allocated a global IPv6 network as wide as a /16 (regional registries are
//! given /12s), while `fc00::/7` is unique-local space, never routed on the internet. Each
//! route is judged alone: a push of many /8s that together cover the internet is not
//! recognised (strict mode and vpn2's environment mode, which accept only routes inside
//! their allowed networks, are the answer to that).
//!
//! `redirect-gateway`, `redirect-private` and routes via `net_gateway` / `remote_host` never take
//! effect on our client at all (DEVIATIONS P7), so they are not the guard's business.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::options::{OptionKind, PushedOption, RouteVia, Topology};
use super::outcome::{AdjustedOption, DropReason, DroppedOption, GuardRefusal, PushOutcome};

/// The least `ping-restart` a push may set, in seconds (twice the shortest `ping`, 1 s); a lower
/// pushed value is raised to it.
pub const PING_RESTART_FLOOR: u32 = 2;

/// The widest pushed `route` taken, as a prefix length: `10.0.0.0/8`, the widest private
/// range; a wider one amounts to a default route (module docs).
pub const WIDEST_IPV4_ROUTE: u8 = 8;

/// The widest pushed `route-ipv6` taken outside [`UNIQUE_LOCAL`], as a prefix length; a wider
/// one amounts to a default route (module docs).
pub const WIDEST_IPV6_ROUTE: u8 = 16;

/// `fc00::/7`, IPv6 unique-local space: never routed on the internet, so a route inside it may
/// be of any length.
pub const UNIQUE_LOCAL: Ipv6Net =
    Ipv6Net::new_assert(std::net::Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7);

/// What [`check`] decided for one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Take it as it is.
    Keep(PushedOption),
    /// Take it with a changed value.
    Adjust {
        /// The option with the value in force.
        option: PushedOption,
        /// The value pushed.
        pushed: u32,
        /// The value in force.
        applied: u32,
    },
    /// Refuse it.
    Refuse(GuardRefusal),
}

/// The rules that need nothing but the option itself (the first five of the module docs).
pub fn check(option: PushedOption) -> Verdict {
    let refuse = Verdict::Refuse;
    match &option {
        PushedOption::Route(r) if r.net().addr() != r.net().network() => {
            refuse(GuardRefusal::Misaligned {
                network: IpNet::V4(r.net()),
            })
        }
        PushedOption::RouteIpv6(r) if r.network.addr() != r.network.network() => {
            refuse(GuardRefusal::Misaligned {
                network: IpNet::V6(r.network),
            })
        }
        PushedOption::Route(r) if r.net().prefix_len() < WIDEST_IPV4_ROUTE => {
            refuse(GuardRefusal::DefaultRoute {
                network: IpNet::V4(r.net()),
            })
        }
        PushedOption::RouteIpv6(r) if amounts_to_default_v6(r.network) => {
            refuse(GuardRefusal::DefaultRoute {
                network: IpNet::V6(r.network),
            })
        }
        PushedOption::Ping(0) => refuse(GuardRefusal::KeepaliveOff {
            option: OptionKind::Ping,
        }),
        PushedOption::PingRestart(0) => refuse(GuardRefusal::KeepaliveOff {
            option: OptionKind::PingRestart,
        }),
        PushedOption::PingRestart(n) if *n < PING_RESTART_FLOOR => Verdict::Adjust {
            option: PushedOption::PingRestart(PING_RESTART_FLOOR),
            pushed: *n,
            applied: PING_RESTART_FLOOR,
        },
        _ => Verdict::Keep(option),
    }
}

/// The rules on the complete push (all its parts), once every option passed [`check`]: each
/// accepted `ping-restart` below twice the push's `ping` (the last one pushed, as it is the one
/// in force) is raised to that, and recorded in `outcome.adjusted` (its entry updated when
/// [`check`] had already raised it).
pub fn finish(outcome: &mut PushOutcome) {
    let Some(ping) = outcome.accepted.iter().rev().find_map(|o| match o {
        PushedOption::Ping(n) => Some(*n),
        _ => None,
    }) else {
        return;
    };
    let least = ping.saturating_mul(2);
    for (i, option) in outcome.accepted.iter_mut().enumerate() {
        let PushedOption::PingRestart(n) = option else {
            continue;
        };
        if *n >= least {
            continue;
        }
        let text = outcome.accepted_texts.get(i).cloned().unwrap_or_default();
        match outcome
            .adjusted
            .iter_mut()
            .find(|a| a.option == OptionKind::PingRestart && a.text == text && a.applied == *n)
        {
            Some(earlier) => earlier.applied = least,
            None => outcome.adjusted.push(AdjustedOption {
                text,
                option: OptionKind::PingRestart,
                pushed: *n,
                applied: least,
            }),
        }
        *n = least;
    }
}

/// The last rule: no route into the tunnel may contain an address on the path to the server.
/// Only the client's driver knows that path (the addresses it resolved and dialed: the
/// server's, or the HTTP proxy's), so it builds a guard per connection and applies it to the
/// complete push before anything is installed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PathGuard {
    path: Vec<IpAddr>,
}

impl PathGuard {
    /// A guard for these addresses (IPv4-mapped IPv6 addresses are taken as IPv4).
    pub fn new(path: impl IntoIterator<Item = IpAddr>) -> PathGuard {
        let mut addrs: Vec<IpAddr> = path.into_iter().map(canonical).collect();
        addrs.sort_unstable();
        addrs.dedup();
        PathGuard { path: addrs }
    }

    /// The addresses guarded.
    pub fn path(&self) -> &[IpAddr] {
        &self.path
    }

    /// Moves every accepted option that would route an address of the path into the tunnel
    /// from `outcome.accepted` to `outcome.dropped` ([`GuardRefusal::CapturesPath`]), keeping
    /// the order of the rest. `texts` gives each accepted option's text, in the same order
    /// (see [`PushOutcome::accepted_texts`]); the topology is the push's own.
    ///
    /// Considered: `route` through the tunnel (no gateway, `vpn_gateway` or an address),
    /// `route-ipv6`, and the subnet an `ifconfig` / `ifconfig-ipv6` puts on the device (with
    /// `topology net30` / `p2p` the local address and the peer address).
    pub fn apply(&self, outcome: &mut PushOutcome) {
        if self.path.is_empty() {
            return;
        }
        let topology = Topology::of_push(&outcome.accepted);
        let accepted = std::mem::take(&mut outcome.accepted);
        let texts = std::mem::take(&mut outcome.accepted_texts);
        let mut texts = texts.into_iter();
        for option in accepted {
            let text = texts.next().unwrap_or_default();
            match self.captured(&option, topology) {
                Some(refusal) => outcome.dropped.push(DroppedOption {
                    text,
                    reason: DropReason::Guard(refusal),
                }),
                None => {
                    outcome.accepted.push(option);
                    outcome.accepted_texts.push(text);
                }
            }
        }
    }

    /// The refusal for `option`, if it routes a path address into the tunnel.
    pub fn captured(&self, option: &PushedOption, topology: Topology) -> Option<GuardRefusal> {
        let nets: Vec<IpNet> = match option {
            PushedOption::Route(r) => match r.gateway {
                Some(RouteVia::NetGateway | RouteVia::RemoteHost) => return None,
                _ => vec![IpNet::V4(r.net().trunc())],
            },
            PushedOption::RouteIpv6(r) => vec![IpNet::V6(r.network.trunc())],
            PushedOption::Ifconfig {
                local,
                remote_netmask,
            } => match topology {
                Topology::Subnet => {
                    let len = u32::from(*remote_netmask).leading_ones();
                    let len = u8::try_from(len).unwrap_or(32);
                    let subnet = Ipv4Net::new(*local, len).unwrap_or_else(|_| host4(*local));
                    vec![IpNet::V4(subnet.trunc())]
                }
                Topology::Net30 | Topology::P2p => {
                    vec![IpNet::V4(host4(*local)), IpNet::V4(host4(*remote_netmask))]
                }
            },
            PushedOption::IfconfigIpv6 { local, .. } => vec![IpNet::V6(local.trunc())],
            _ => return None,
        };
        nets.into_iter().find_map(|network| {
            self.path
                .iter()
                .find(|a| network.contains(*a))
                .map(|&path| GuardRefusal::CapturesPath { network, path })
        })
    }
}

/// Whether a pushed IPv6 route is wider than [`WIDEST_IPV6_ROUTE`] and not inside
/// [`UNIQUE_LOCAL`].
fn amounts_to_default_v6(network: Ipv6Net) -> bool {
    network.prefix_len() < WIDEST_IPV6_ROUTE && !UNIQUE_LOCAL.contains(&network)
}

fn host4(addr: std::net::Ipv4Addr) -> Ipv4Net {
    Ipv4Net::from(addr)
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        IpAddr::V4(_) => addr,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::push::PullPolicy;

    fn one(text: &str) -> PushOutcome {
        PullPolicy::default().process(text).unwrap().outcome
    }

    fn refusal(text: &str) -> Option<GuardRefusal> {
        one(text).refused_by_guard().map(|(_, r)| *r).next()
    }

    #[test]
    fn misaligned_routes_are_refused_aligned_ones_kept() {
        assert_eq!(
            refusal("route 10.252.9.9 255.0.0.0"),
            Some(GuardRefusal::Misaligned {
                network: "10.252.9.9/8".parse().unwrap()
            })
        );
        assert_eq!(
            refusal("route-ipv6 fd00::1/64"),
            Some(GuardRefusal::Misaligned {
                network: "fd00::1/64".parse().unwrap()
            })
        );
        // `route 10.0.0.0 0.0.0.0` names 10.0.0.0 with a /0 mask: everything.
        assert!(refusal("route 10.0.0.0 0.0.0.0").is_some());
        for aligned in [
            "route 10.252.0.0 255.255.0.0",
            "route 10.1.2.3",
            "route 10.1.2.3 default vpn_gateway",
            "route 10.0.0.0 255.0.0.0",
            "route-ipv6 fd00::/64",
            "route-ipv6 fd00::1",
            "route-ipv6 fc00::/7",
        ] {
            let out = one(aligned);
            assert_eq!(out.accepted.len(), 1, "{aligned}: {:?}", out.dropped);
        }
    }

    #[test]
    fn routes_that_amount_to_a_default_route_are_refused() {
        for wide in [
            "route 0.0.0.0 0.0.0.0",
            "route 0.0.0.0 128.0.0.0",
            "route 128.0.0.0 128.0.0.0 vpn_gateway",
            "route 64.0.0.0 192.0.0.0",
            "route 8.0.0.0 254.0.0.0",
            "route-ipv6 ::/0",
            "route-ipv6 ::/1",
            "route-ipv6 2000::/3",
            "route-ipv6 2000::/4",
            "route-ipv6 3000::/4",
            "route-ipv6 2000::/15",
            "route-ipv6 fc00::/6",
        ] {
            let refused = refusal(wide);
            assert!(
                matches!(refused, Some(GuardRefusal::DefaultRoute { .. })),
                "{wide}: {refused:?}"
            );
        }
        let out = one("route 0.0.0.0 128.0.0.0,route 128.0.0.0 128.0.0.0,route-ipv6 2000::/4");
        assert!(out.accepted.is_empty(), "{:?}", out.accepted);
        assert_eq!(
            out.refused_by_guard().next().map(|(_, r)| r.to_string()),
            Some(
                "0.0.0.0/1 is wider than any network a tunnel carries: it amounts to a default \
                 route, and this client never redirects its gateway"
                    .to_owned()
            )
        );
        // What Gardener's tunnels carry: private ranges up to a /8, vpn2's mappings, IPv6
        // networks of a /16 and longer, and anything unique-local.
        for narrow in [
            "route 10.0.0.0 255.0.0.0",
            "route 241.0.0.0 255.0.0.0",
            "route 100.64.0.0 255.192.0.0",
            "route 172.16.0.0 255.240.0.0",
            "route 192.168.0.0 255.255.0.0",
            "route-ipv6 fd8f:6d53:b97a:1::/96",
            "route-ipv6 fd00::/8",
            "route-ipv6 2001:db8::/32",
            "route-ipv6 2a05::/16",
        ] {
            let out = one(narrow);
            assert_eq!(out.accepted.len(), 1, "{narrow}: {:?}", out.dropped);
        }
    }

    #[test]
    fn keepalive_off_is_refused_and_a_short_restart_raised() {
        assert_eq!(
            refusal("ping 0"),
            Some(GuardRefusal::KeepaliveOff {
                option: OptionKind::Ping
            })
        );
        assert_eq!(
            refusal("ping-restart 00"),
            Some(GuardRefusal::KeepaliveOff {
                option: OptionKind::PingRestart
            })
        );
        let out = one("ping-restart 1,ping-restart 2,ping-restart 3600");
        assert_eq!(
            out.accepted,
            [
                PushedOption::PingRestart(PING_RESTART_FLOOR),
                PushedOption::PingRestart(2),
                PushedOption::PingRestart(3600)
            ]
        );
        assert_eq!(
            out.adjusted,
            [AdjustedOption {
                text: "ping-restart 1".into(),
                option: OptionKind::PingRestart,
                pushed: 1,
                applied: PING_RESTART_FLOOR
            }]
        );
        assert_eq!(out.accepted_texts[0], "ping-restart 1");
    }

    #[test]
    fn ping_restart_is_raised_to_twice_the_last_pushed_ping() {
        let mut out = one("ping-restart 1,ping 5,ping-restart 12,ping 10,ping-restart 30");
        finish(&mut out);
        assert_eq!(
            out.accepted,
            [
                PushedOption::PingRestart(20),
                PushedOption::Ping(5),
                PushedOption::PingRestart(20),
                PushedOption::Ping(10),
                PushedOption::PingRestart(30)
            ]
        );
        let adjusted: Vec<(&str, u32, u32)> = out
            .adjusted
            .iter()
            .map(|a| (a.text.as_str(), a.pushed, a.applied))
            .collect();
        assert_eq!(
            adjusted,
            [("ping-restart 1", 1, 20), ("ping-restart 12", 12, 20)]
        );
        // Without a pushed ping only the floor holds.
        let mut out = one("ping-restart 3");
        finish(&mut out);
        assert_eq!(out.accepted, [PushedOption::PingRestart(3)]);
        assert!(out.adjusted.is_empty());
    }

    #[test]
    fn the_path_guard_refuses_what_routes_the_server_into_the_tunnel() {
        let guard = PathGuard::new([
            "10.200.2.2".parse().unwrap(),
            "::ffff:10.200.1.1".parse().unwrap(),
            "fd00:200::2".parse().unwrap(),
        ]);
        assert_eq!(
            guard.path(),
            [
                "10.200.1.1".parse::<IpAddr>().unwrap(),
                "10.200.2.2".parse().unwrap(),
                "fd00:200::2".parse().unwrap()
            ]
        );
        let mut out = one(
            "topology subnet,route 10.200.0.0 255.255.0.0,route 10.250.0.0 255.255.0.0,\
             route 10.200.2.2 255.255.255.255 net_gateway,route 10.0.0.0 255.0.0.0,\
             route 10.192.0.0 255.192.0.0 vpn_gateway,route-ipv6 fd00:200::/64,route-ipv6 fd00:201::/64,\
             ifconfig 10.200.1.5 255.255.255.0,ifconfig-ipv6 fd00:200::1000/96 fd00:200::1",
        );
        guard.apply(&mut out);
        let kept: Vec<&str> = out.accepted_texts.iter().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "topology subnet",
                "route 10.250.0.0 255.255.0.0",
                "route 10.200.2.2 255.255.255.255 net_gateway",
                "route-ipv6 fd00:201::/64"
            ]
        );
        assert_eq!(out.accepted.len(), kept.len());
        let refused: Vec<String> = out
            .refused_by_guard()
            .map(|(t, r)| format!("{t}: {r}"))
            .collect();
        assert_eq!(refused.len(), 6, "{refused:?}");
        assert_eq!(
            refused[0],
            "route 10.200.0.0 255.255.0.0: 10.200.0.0/16 contains 10.200.1.1, on the path to \
             the server: the tunnel would carry itself"
        );
        assert!(refused[4].starts_with("ifconfig 10.200.1.5 255.255.255.0: 10.200.1.0/24"));
    }

    #[test]
    fn net30_ifconfig_is_checked_by_its_two_host_addresses() {
        let guard = PathGuard::new(["10.8.0.5".parse().unwrap()]);
        let mut out = one("ifconfig 10.8.0.6 10.8.0.5");
        guard.apply(&mut out);
        assert!(out.accepted.is_empty());
        let mut out = one("ifconfig 10.8.0.10 10.8.0.9");
        guard.apply(&mut out);
        assert_eq!(out.accepted.len(), 1);
        // No path known: nothing to guard.
        let mut out = one("route 10.0.0.0 255.0.0.0");
        PathGuard::default().apply(&mut out);
        assert_eq!(out.accepted.len(), 1);
    }
}
