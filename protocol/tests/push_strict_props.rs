//! Property test: strict mode never lets through a route outside the allowed networks, nor a
//! `redirect-gateway` / `redirect-private` / DNS option, however the server spells the push
//! (spaces, tabs, vertical tabs, quotes, case, leading whitespace, `default` placeholders).
//! And it does let through a route inside the allowed networks however it is spelled, so the
//! property is not met by refusing everything.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use proptest::prelude::*;
use protocol::push::{
    FilterAction, OptionKind, PullFilter, PullPolicy, PushCollector, PushedOption, StrictPolicy,
};

/// Allowed: 10.1.0.0/16, 192.168.100.0/24, fd00:1::/64.
fn policy(filters: Vec<PullFilter>) -> PullPolicy {
    let strict = StrictPolicy::new()
        .allow(StrictPolicy::TUNNEL_BASICS)
        .allow([OptionKind::Route, OptionKind::RouteIpv6])
        .allow_networks([
            "10.1.0.0/16".parse::<IpNet>().unwrap(),
            "192.168.100.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ]);
    PullPolicy {
        filters,
        route_nopull: false,
        strict: Some(strict),
    }
}

/// Independent containment oracle on integers.
fn v4_inside(net: Ipv4Addr, mask: Ipv4Addr) -> bool {
    let (n, m) = (u32::from(net), u32::from(mask));
    let allowed = [
        (u32::from(Ipv4Addr::new(10, 1, 0, 0)), 16u32),
        (u32::from(Ipv4Addr::new(192, 168, 100, 0)), 24),
    ];
    allowed.iter().any(|&(a, bits)| {
        let am = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        m.leading_ones() >= bits && (n & am) == a
    })
}

fn v6_inside(net: Ipv6Addr, bits: u8) -> bool {
    let a = u128::from("fd00:1::".parse::<Ipv6Addr>().unwrap());
    let am = u128::MAX << 64;
    bits >= 64 && (u128::from(net) & am) == a
}

fn sep() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![" ", "  ", "\t", " \t ", "\x0b", "\x0c", "\r"])
}

fn lead() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", "\t", "  \t"])
}

/// Spells a token: bare, double-quoted, single-quoted, or with an escaped leading quote char.
fn spell(tok: String, how: u8) -> String {
    match how % 4 {
        0 => tok,
        1 => format!("\"{tok}\""),
        2 => format!("'{tok}'"),
        _ => tok,
    }
}

fn case(name: &str, how: u8) -> String {
    match how % 4 {
        0 | 1 => name.to_owned(),
        2 => name.to_uppercase(),
        _ => {
            let mut c = name.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect())
                .unwrap_or_default()
        }
    }
}

/// A prefix length biased towards the interesting range.
fn bits4() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..=32, 8u32..=24]
}

fn mask(bits: u32) -> Ipv4Addr {
    Ipv4Addr::from(if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    })
}

/// A generated pushed option: its text.
fn pushed() -> impl Strategy<Value = String> {
    let addr4 = prop_oneof![
        any::<u32>().prop_map(Ipv4Addr::from),
        any::<u16>().prop_map(|x| Ipv4Addr::new(10, 1, (x >> 8) as u8, x as u8)),
        any::<u8>().prop_map(|x| Ipv4Addr::new(192, 168, 100, x)),
        Just(Ipv4Addr::new(0, 0, 0, 0)),
        Just(Ipv4Addr::new(10, 0, 0, 0)),
    ];
    let addr6 = prop_oneof![
        any::<u128>().prop_map(Ipv6Addr::from),
        any::<u64>().prop_map(|x| Ipv6Addr::from((0xfd00_0001_u128 << 96) | u128::from(x))),
    ];
    let route = (
        lead(),
        any::<u8>(),
        any::<u8>(),
        sep(),
        addr4,
        sep(),
        any::<u8>(),
        bits4(),
        prop::option::of(sep()),
        prop::bool::ANY,
    )
        .prop_map(|(l, c, q1, s1, net, s2, q2, bits, trail, default_gw)| {
            let mut s = format!(
                "{l}{}{s1}{}{s2}{}",
                spell(case("route", c), q1),
                spell(net.to_string(), q2),
                spell(mask(bits).to_string(), q2 / 4)
            );
            if default_gw {
                s.push_str(" default 5");
            }
            s.push_str(trail.unwrap_or(""));
            s
        });
    let route6 = (lead(), any::<u8>(), any::<u8>(), sep(), addr6, 0u8..=128).prop_map(
        |(l, c, q, s1, net, bits)| {
            format!(
                "{l}{}{s1}{}",
                spell(case("route-ipv6", c), q),
                spell(format!("{net}/{bits}"), q / 4)
            )
        },
    );
    let redirect = (
        lead(),
        prop::sample::select(vec![
            "redirect-gateway",
            "redirect-private",
            "dhcp-option",
            "dns",
            "block-outside-dns",
        ]),
        any::<u8>(),
        any::<u8>(),
        sep(),
        prop::sample::select(vec![
            "",
            "def1",
            "def1 bypass-dhcp",
            "DNS 1.1.1.1",
            "ipv6 !ipv4",
        ]),
    )
        .prop_map(|(l, n, c, q, s, args)| format!("{l}{}{s}{args}", spell(case(n, c), q)));
    prop_oneof![3 => route, 2 => route6, 2 => redirect]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn strict_never_lets_through_an_outside_route_or_redirect(
        options in prop::collection::vec(pushed(), 1..8),
        // Upstream filters the user may have configured too; strict mode must hold whatever
        // they say (even "accept everything").
        accept_all in any::<bool>(),
    ) {
        let filters = if accept_all {
            vec![PullFilter::new(FilterAction::Accept, "")]
        } else {
            vec![PullFilter::new(FilterAction::Ignore, "route ")]
        };
        let text = options.join(",");
        let Ok(Some(out)) = PushCollector::new().push_part(&policy(filters), &text) else {
            panic!("no reject filter configured, single part");
        };
        for opt in &out.accepted {
            match opt {
                PushedOption::Route(r) => prop_assert!(
                    v4_inside(r.network, r.netmask),
                    "route {}/{} let through from {:?}", r.network, r.netmask, text
                ),
                PushedOption::RouteIpv6(r) => prop_assert!(
                    v6_inside(r.network.addr(), r.network.prefix_len()),
                    "route-ipv6 {} let through from {:?}", r.network, text
                ),
                PushedOption::RedirectGateway(_)
                | PushedOption::RedirectPrivate(_)
                | PushedOption::DhcpOption(_)
                | PushedOption::Dns(_)
                | PushedOption::BlockOutsideDns => {
                    prop_assert!(false, "{:?} let through from {:?}", opt, text)
                }
                _ => {}
            }
        }
        prop_assert_eq!(out.accepted.len() + out.dropped.len(), options.len());
    }

    #[test]
    fn strict_lets_through_an_inside_route_however_spelled(
        l in lead(),
        q1 in any::<u8>(),
        q2 in any::<u8>(),
        s1 in sep(),
        s2 in sep(),
        host in any::<u16>(),
        bits in 16u32..=32,
    ) {
        // Aligned to its mask: a network with host bits is refused by the push guard in every
        // mode (tests/push_guard.rs).
        let net = Ipv4Addr::from(
            (u32::from(Ipv4Addr::new(10, 1, 0, 0)) | u32::from(host)) & u32::from(mask(bits)),
        );
        // Lower-case name only: the option name is case-sensitive.
        let text = format!(
            "{l}{}{s1}{}{s2}{}",
            spell("route".into(), q1),
            spell(net.to_string(), q2),
            spell(mask(bits).to_string(), q2 / 4)
        );
        let out = PushCollector::new().push_part(&policy(vec![]), &text).unwrap().unwrap();
        prop_assert_eq!(out.accepted.len(), 1, "{:?}: {:?}", text, out.dropped);
    }
}

#[test]
fn case_and_quotes_are_decided_on_the_typed_option() {
    let p = policy(vec![PullFilter::new(FilterAction::Ignore, "route ")]);
    let out = PushCollector::new()
        .push_part(
            &p,
            "\"route\" '10.0.0.0' 255.0.0.0,ROUTE 0.0.0.0 0.0.0.0,Redirect-Gateway def1,\
             route\t10.1.2.0 255.255.255.0,'redirect-gateway' def1",
        )
        .unwrap()
        .unwrap();
    // Only the inside route survives; the quoted outside route passed upstream's filter but
    // not strict mode; ROUTE / Redirect-Gateway are unknown options.
    assert_eq!(out.accepted.len(), 1);
    assert!(matches!(out.accepted[0], PushedOption::Route(_)));
    let reasons: Vec<String> = out
        .dropped
        .iter()
        .map(|d| format!("{:?}", d.reason))
        .collect();
    assert_eq!(reasons.len(), 4);
    assert!(reasons[0].contains("RouteOutsideAllowedNetworks"));
    assert_eq!(reasons[1], "Unknown");
    assert_eq!(reasons[2], "Unknown");
    assert!(reasons[3].contains("KindNotAllowed"));
}
