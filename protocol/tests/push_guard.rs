//! The push guard (`protocol::push::guard`) holds in every pull mode, however the server spells
//! the push: leading whitespace, separators (space, tab, vertical tab, form feed, CR), single
//! and double quotes around the name and the arguments, `default` placeholders, and the case of
//! the option name (a name in another case is an unknown option and never applied, as
//! upstream).
//!
//! * a misaligned `route` / `route-ipv6` is never accepted, an aligned one always is (no
//!   filters), so the property is not met by refusing everything;
//! * a route that amounts to a default route (IPv4 wider than a /8, IPv6 wider than a /16
//!   outside `fc00::/7`) is never accepted, whatever the filters or strict mode let through,
//!   and vpn2's own routes always are;
//! * `ping 0` / `ping-restart 0` are never accepted, a `ping-restart` below the floor or below
//!   twice the `ping` pushed with it (in the same part or another) is accepted raised to that,
//!   any other value as pushed;
//! * after the path guard no accepted route contains an address of the path, and every route
//!   that contains none is still there (an integer oracle decides);
//! * in a session: a client with its own `ping-restart` keeps it when the server pushes
//!   `ping-restart 0`, and a pushed `ping 4`, `ping-restart 1` restarts after 8 s.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

mod common;
mod session_util;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use proptest::prelude::*;
use protocol::push::guard::{UNIQUE_LOCAL, WIDEST_IPV4_ROUTE};
use protocol::push::{
    DropReason, FilterAction, GuardRefusal, OptionKind, PathGuard, PullFilter, PullPolicy,
    PushCollector, PushItem, PushOutcome, PushedOption, StrictPolicy, PING_RESTART_FLOOR,
};
use protocol::session::{CloseReason, Event};
use session_util::Setup;

/// The pull modes the guard must hold in: no filters (a plain config, vpn2's environment),
/// upstream-style filters that accept routes by text prefix, accept-everything, and strict
/// mode allowing every route.
fn modes() -> Vec<PullPolicy> {
    let filters = |f: Vec<PullFilter>| PullPolicy {
        filters: f,
        ..PullPolicy::default()
    };
    let strict = PullPolicy {
        strict: Some(
            StrictPolicy::new()
                .allow(StrictPolicy::TUNNEL_BASICS)
                .allow([OptionKind::Route, OptionKind::RouteIpv6])
                .allow_networks([
                    "0.0.0.0/0".parse::<IpNet>().unwrap(),
                    "::/0".parse().unwrap(),
                ]),
        ),
        ..PullPolicy::default()
    };
    vec![
        PullPolicy::default(),
        filters(vec![
            PullFilter::new(FilterAction::Accept, "route 10."),
            PullFilter::new(FilterAction::Accept, "ping"),
            PullFilter::new(FilterAction::Ignore, "route "),
        ]),
        filters(vec![PullFilter::new(FilterAction::Accept, "")]),
        strict,
    ]
}

fn receive(policy: &PullPolicy, text: &str) -> PushOutcome {
    PushCollector::new()
        .push_part(policy, text)
        .unwrap()
        .unwrap()
}

fn sep() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![" ", "  ", "\t", " \t ", "\x0b", "\x0c", "\r"])
}

fn lead() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", "\t", "  \t"])
}

/// A token bare, double-quoted or single-quoted.
fn spell(tok: &str, how: u8) -> String {
    match how % 3 {
        0 => tok.to_owned(),
        1 => format!("\"{tok}\""),
        _ => format!("'{tok}'"),
    }
}

fn mask(bits: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::MAX.checked_shl(32 - bits).unwrap_or(0))
}

/// `route NET MASK [default METRIC]` spelled in one of the ways upstream reads alike.
fn route_text(
    (l, q, s1, s2): (&str, u8, &str, &str),
    net: Ipv4Addr,
    bits: u32,
    metric: bool,
) -> String {
    let mut text = format!(
        "{l}{}{s1}{}{s2}{}",
        spell("route", q),
        spell(&net.to_string(), q / 3),
        spell(&mask(bits).to_string(), q / 9)
    );
    if metric {
        text.push_str(&format!("{s1}default{s2}{}", spell("5", q / 27)));
    }
    text
}

fn spelling() -> impl Strategy<Value = (&'static str, u8, &'static str, &'static str)> {
    (lead(), any::<u8>(), sep(), sep())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn a_misaligned_route_is_never_accepted(
        how in spelling(),
        host in any::<u16>(),
        bits in 0u32..32,
        metric in any::<bool>(),
    ) {
        // 10.x.y.z with host bits under the mask (never 0 when bits < 32 and host odd).
        let net = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) | (u32::from(host) | 1));
        let text = route_text(how, net, bits, metric);
        for policy in modes() {
            let out = receive(&policy, &text);
            prop_assert!(out.accepted.is_empty(), "{:?} accepted: {:?}", text, out.accepted);
            if matches!(out.dropped[0].reason, DropReason::IgnoredByFilter { .. }) {
                continue;
            }
            let refused: Vec<_> = out.refused_by_guard().collect();
            prop_assert_eq!(refused.len(), 1, "{:?}: {:?}", text, out.dropped);
            let misaligned = matches!(refused[0].1, GuardRefusal::Misaligned { .. });
            prop_assert!(misaligned, "{:?}", refused);
            prop_assert_eq!(refused[0].0, text.trim_start_matches([' ', '\t']));
        }
    }

    #[test]
    fn an_aligned_route_is_accepted(
        how in spelling(),
        raw in any::<u32>(),
        bits in 0u32..=32,
        metric in any::<bool>(),
    ) {
        let net = Ipv4Addr::from(raw & u32::from(mask(bits)));
        let text = route_text(how, net, bits, metric);
        let out = receive(&PullPolicy::default(), &text);
        if bits < u32::from(WIDEST_IPV4_ROUTE) {
            // Wider than a /8: a default route, refused (the next property).
            prop_assert!(out.accepted.is_empty(), "{:?} accepted", text);
        } else {
            prop_assert_eq!(out.accepted.len(), 1, "{:?}: {:?}", text, out.dropped);
        }
    }

    #[test]
    fn a_route_that_amounts_to_a_default_route_is_never_accepted(
        how in spelling(),
        raw in any::<u32>(),
        bits in 0u32..8,
        raw6 in any::<u128>(),
        bits6 in 0u8..16,
    ) {
        let net = Ipv4Addr::from(raw & u32::from(mask(bits)));
        let v4 = route_text(how, net, bits, false);
        let net6 = ipnet::Ipv6Net::new(Ipv6Addr::from(raw6), bits6).unwrap().trunc();
        let (l, q, s1, _) = how;
        let v6 = format!("{l}{}{s1}{}", spell("route-ipv6", q), spell(&net6.to_string(), q / 3));
        let unique_local = UNIQUE_LOCAL.contains(&net6);
        for policy in modes() {
            for text in [&v4, &v6] {
                let out = receive(&policy, text);
                if text == &v6 && unique_local {
                    continue;
                }
                prop_assert!(out.accepted.is_empty(), "{:?} accepted", text);
                if matches!(out.dropped[0].reason, DropReason::IgnoredByFilter { .. }) {
                    continue;
                }
                let refused: Vec<_> = out.refused_by_guard().collect();
                prop_assert!(
                    matches!(refused[..], [(_, GuardRefusal::DefaultRoute { .. })]),
                    "{:?}: {:?}", text, out.dropped
                );
            }
        }
    }

    #[test]
    fn a_misaligned_route_ipv6_is_never_accepted(
        (l, q, s1, _) in spelling(),
        raw in any::<u128>(),
        bits in 0u8..128,
        upper in any::<bool>(),
    ) {
        let net = Ipv6Addr::from(raw | 1);
        let mut prefix = format!("{net}/{bits}");
        if upper {
            prefix = prefix.to_uppercase();
        }
        let text = format!("{l}{}{s1}{}", spell("route-ipv6", q), spell(&prefix, q / 3));
        for policy in modes() {
            let out = receive(&policy, &text);
            prop_assert!(out.accepted.is_empty(), "{:?} accepted", text);
            prop_assert!(
                out.refused_by_guard().any(|(_, r)| matches!(r, GuardRefusal::Misaligned { .. })),
                "{:?}: {:?}", text, out.dropped
            );
        }
    }

    #[test]
    fn keepalive_is_never_switched_off_nor_below_the_floor(
        (l, q, s1, _) in spelling(),
        restart in any::<bool>(),
        n in prop_oneof![0u32..12, any::<u32>()],
        zeros in 0usize..3,
    ) {
        let name = if restart { "ping-restart" } else { "ping" };
        let value = format!("{}{n}", "0".repeat(zeros));
        let text = format!("{l}{}{s1}{}", spell(name, q), spell(&value, q / 3));
        for policy in modes() {
            let out = receive(&policy, &text);
            let applied: Vec<u32> = out
                .accepted
                .iter()
                .filter_map(|o| match o {
                    PushedOption::Ping(v) | PushedOption::PingRestart(v) => Some(*v),
                    _ => None,
                })
                .collect();
            let want: Vec<u32> = match n {
                0 => vec![],
                n if restart => vec![n.max(PING_RESTART_FLOOR)],
                n => vec![n],
            };
            prop_assert_eq!(&applied, &want, "{:?}: {:?}", text, out.dropped);
            prop_assert_eq!(out.adjusted.len(), usize::from(restart && n > 0 && n < PING_RESTART_FLOOR));
        }
    }

    #[test]
    fn ping_restart_is_at_least_twice_the_ping_pushed_with_it(
        (l, q, s1, _) in spelling(),
        ping in 1u32..100,
        restart in 1u32..300,
        restart_first in any::<bool>(),
        split in any::<bool>(),
    ) {
        let p = format!("{l}{}{s1}{}", spell("ping", q), spell(&ping.to_string(), q / 3));
        let r = format!("{}{s1}{}", spell("ping-restart", q / 9), restart);
        let (first, second) = if restart_first { (r, p) } else { (p, r) };
        for policy in modes() {
            // One part, or two with push-continuation: the rule sees the complete push.
            let out = if split {
                let mut c = PushCollector::new();
                let none = c
                    .push_part(&policy, &format!("{first},push-continuation 2"))
                    .unwrap();
                prop_assert!(none.is_none());
                c.push_part(&policy, &format!("{second},push-continuation 1")).unwrap().unwrap()
            } else {
                receive(&policy, &format!("{first},{second}"))
            };
            let applied = out.accepted.iter().find_map(|o| match o {
                PushedOption::PingRestart(v) => Some(*v),
                _ => None,
            });
            let want = restart.max(PING_RESTART_FLOOR).max(2 * ping);
            prop_assert_eq!(applied, Some(want), "{:?} / {:?}", first, second);
            prop_assert_eq!(out.adjusted.len(), usize::from(want != restart));
        }
    }

    #[test]
    fn no_accepted_route_contains_a_path_address(
        routes in prop::collection::vec((any::<u32>(), 0u32..=32, any::<bool>()), 1..8),
        path in prop::collection::vec(any::<u32>(), 1..3),
        near in any::<bool>(),
    ) {
        // Half the time the path lies inside the first route, so containment is common.
        let mut path: Vec<u32> = path;
        if near {
            let (raw, bits, _) = routes[0];
            let m = u32::from(mask(bits));
            path[0] = (raw & m) | (path[0] & !m);
        }
        let text: Vec<String> = routes
            .iter()
            .map(|&(raw, bits, quoted)| {
                let net = Ipv4Addr::from(raw & u32::from(mask(bits)));
                let mut t = format!("route {net} {}", mask(bits));
                if quoted {
                    t = format!("\"route\"  '{net}' \"{}\"", mask(bits));
                }
                t
            })
            .collect();
        let guard = PathGuard::new(path.iter().map(|&a| IpAddr::V4(Ipv4Addr::from(a))));
        for policy in modes() {
            let mut out = receive(&policy, &text.join(","));
            let before = out.accepted.len();
            guard.apply(&mut out);
            for (raw, bits, _) in &routes {
                let m = u32::from(mask(*bits));
                let covers = path.iter().any(|a| a & m == raw & m);
                let there = out.accepted.iter().any(|o| matches!(o,
                    PushedOption::Route(r) if u32::from(r.network) == raw & m && u32::from(r.netmask) == m));
                prop_assert!(!(covers && there), "{}/{} over {:?} kept", raw & m, bits, path);
            }
            let captured = out.refused_by_guard()
                .filter(|(_, r)| matches!(r, GuardRefusal::CapturesPath { .. }))
                .count();
            prop_assert_eq!(out.accepted.len() + captured, before);
            prop_assert_eq!(out.accepted_texts.len(), out.accepted.len());
        }
    }
}

#[test]
fn names_in_another_case_are_unknown_and_never_applied() {
    for text in [
        "PING 0",
        "Ping-Restart 0",
        "ROUTE 10.252.9.9 255.0.0.0",
        "Route-IPv6 fd00::1/64",
        "'Route' 0.0.0.0 0.0.0.0",
    ] {
        for policy in modes() {
            let out = receive(&policy, text);
            assert!(out.accepted.is_empty(), "{text}");
            if out.dropped.iter().any(|d| d.reason == DropReason::Unknown) {
                continue;
            }
            // Only a filter may have dropped it first.
            assert!(
                matches!(out.dropped[0].reason, DropReason::IgnoredByFilter { .. }),
                "{text}: {:?}",
                out.dropped
            );
        }
    }
}

#[test]
fn a_redirect_spelled_as_routes_is_refused_in_vpn2s_mode_and_vpn2s_routes_kept() {
    // vpn2's client renders no pull-filters: the default policy.
    let out = receive(
        &PullPolicy::default(),
        "route-ipv6 2000::/3,route 0.0.0.0 128.0.0.0,route 128.0.0.0 128.0.0.0,\
         route-ipv6 2000::/4,route-ipv6 3000::/4,route-ipv6 ::/0,\
         route 241.0.0.0 255.0.0.0,route 100.64.0.0 255.255.0.0,\
         route-ipv6 fd8f:6d53:b97a:1::/96,route-ipv6 2001:db8:10::/48",
    );
    let refused: Vec<&str> = out
        .refused_by_guard()
        .filter(|(_, r)| matches!(r, GuardRefusal::DefaultRoute { .. }))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(
        refused,
        [
            "route-ipv6 2000::/3",
            "route 0.0.0.0 128.0.0.0",
            "route 128.0.0.0 128.0.0.0",
            "route-ipv6 2000::/4",
            "route-ipv6 3000::/4",
            "route-ipv6 ::/0"
        ]
    );
    assert_eq!(
        out.accepted_texts,
        [
            "route 241.0.0.0 255.0.0.0",
            "route 100.64.0.0 255.255.0.0",
            "route-ipv6 fd8f:6d53:b97a:1::/96",
            "route-ipv6 2001:db8:10::/48"
        ]
    );
}

#[test]
fn the_issue_examples_in_vpn2s_mode() {
    // vpn2's client renders no pull-filters: the default policy.
    let policy = PullPolicy::default();
    let mut out = receive(
        &policy,
        "route 10.252.9.9 255.0.0.0, route  10.250.3.1 \"255.255.255.0\",'route-ipv6' fd00::1/64,\
         ping 0,ping-restart \"0\",ping-restart 1,route 10.200.0.0 255.255.0.0,\
         route 10.250.0.0 255.255.0.0",
    );
    PathGuard::new(["10.200.2.2".parse().unwrap()]).apply(&mut out);
    let refused: Vec<(&str, String)> = out
        .refused_by_guard()
        .map(|(t, r)| (t, r.to_string()))
        .collect();
    let texts: Vec<&str> = refused.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        texts,
        [
            "route 10.252.9.9 255.0.0.0",
            "route  10.250.3.1 \"255.255.255.0\"",
            "'route-ipv6' fd00::1/64",
            "ping 0",
            "ping-restart \"0\"",
            "route 10.200.0.0 255.255.0.0"
        ]
    );
    assert_eq!(
        refused[0].1,
        "10.252.9.9/8 has bits outside its /8 prefix: the route would be wider than pushed"
    );
    assert_eq!(
        out.accepted,
        [
            PushedOption::PingRestart(PING_RESTART_FLOOR),
            receive(&policy, "route 10.250.0.0 255.255.0.0").accepted[0].clone()
        ]
    );
}

fn close_reason(events: &[Event]) -> Option<&CloseReason> {
    events.iter().find_map(|e| match e {
        Event::Closed(r) => Some(r),
        _ => None,
    })
}

fn connected_push(events: &[Event]) -> &PushOutcome {
    events
        .iter()
        .find_map(|e| match e {
            Event::Connected(c) => Some(&c.push),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_pushed_ping_restart_0_leaves_the_clients_own_in_force() {
    let mut setup = Setup::new(41);
    // The server sends no pings of its own; it pushes keepalive off.
    setup.server.keepalive = None;
    setup
        .server
        .push
        .extend(["ping 0", "ping-restart 0"].map(|line| PushItem::Verbatim(line.into())));
    setup.client.ping = Some(Duration::from_secs(3));
    setup.client.ping_restart = Some(Duration::from_secs(12));
    let mut pair = setup.build();
    pair.connect();
    let push = connected_push(&pair.client_events);
    assert_eq!(push.refused_by_guard().count(), 2, "{:?}", push.dropped);
    let cut = pair.elapsed;
    pair.blackhole_s2c = true;
    assert!(pair.run_until(Duration::from_secs(60), |p| p.client_closed()));
    let silence = pair.elapsed - cut;
    match close_reason(&pair.client_events) {
        Some(CloseReason::PingRestart(d)) => {
            assert!(*d >= Duration::from_secs(12), "{d:?}");
            assert!(silence <= Duration::from_secs(13), "{silence:?}");
        }
        other => panic!("the client's own ping-restart did not fire: {other:?}"),
    }
}

#[test]
fn a_pushed_ping_restart_below_twice_the_ping_fires_at_twice_the_ping() {
    let mut setup = Setup::new(42);
    setup.server.keepalive = None;
    setup
        .server
        .push
        .extend(["ping 4", "ping-restart 1"].map(|line| PushItem::Verbatim(line.into())));
    let mut pair = setup.build();
    pair.connect();
    let push = connected_push(&pair.client_events);
    assert_eq!(push.adjusted.len(), 1);
    assert_eq!((push.adjusted[0].pushed, push.adjusted[0].applied), (1, 8));
    let cut = pair.elapsed;
    pair.blackhole_s2c = true;
    assert!(pair.run_until(Duration::from_secs(30), |p| p.client_closed()));
    let silence = pair.elapsed - cut;
    match close_reason(&pair.client_events) {
        Some(CloseReason::PingRestart(d)) => {
            assert!(*d >= Duration::from_secs(8), "{d:?}");
            assert!(silence <= Duration::from_secs(9), "{silence:?}");
        }
        other => panic!("unexpected close {other:?}"),
    }
}
