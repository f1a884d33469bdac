//! Property test: our pull-filter against a small, independent model of upstream's matching
//! (`apply_push_options` + `apply_pull_filter` in OpenVPN 2.6, reference 11).
//!
//! The model: split the options text at commas (a final empty piece is not an option), skip
//! leading C-`isspace` bytes, then the first filter (in order) whose text is a byte prefix of
//! the rest decides; `reject` aborts the whole message, `ignore` drops, `accept` or no match
//! keeps. Generated options use odd whitespace, quotes and names that are prefixes of each other
//! (`route` / `route-gateway` / `route-ipv6`), and filters are drawn from prefixes of the same.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use proptest::prelude::*;
use protocol::push::{DropReason, FilterAction, PullFilter, PullPolicy, PushError};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Keep,
    Ignore(usize),
    Reject(usize),
}

/// The reference model, written from the reference text without using the library.
fn model(filters: &[(FilterAction, String)], options_text: &str) -> Vec<(String, Verdict)> {
    let mut pieces: Vec<&str> = options_text.split(',').collect();
    if pieces.last() == Some(&"") {
        pieces.pop();
    }
    let mut out = Vec::new();
    for piece in pieces {
        let bytes = piece.as_bytes();
        let mut i = 0;
        while i < bytes.len() && b" \t\n\r\x0b\x0c".contains(&bytes[i]) {
            i += 1;
        }
        let line = &piece[i..];
        let mut verdict = Verdict::Keep;
        for (idx, (action, text)) in filters.iter().enumerate() {
            let n = text.len();
            if line.len() >= n && &line.as_bytes()[..n] == text.as_bytes() {
                verdict = match action {
                    FilterAction::Accept => Verdict::Keep,
                    FilterAction::Ignore => Verdict::Ignore(idx),
                    FilterAction::Reject => Verdict::Reject(idx),
                };
                break;
            }
        }
        let stop = matches!(verdict, Verdict::Reject(_));
        out.push((line.to_owned(), verdict));
        if stop {
            break;
        }
    }
    out
}

fn name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "route",
        "route-gateway",
        "route-ipv6",
        "route-metric",
        "ROUTE",
        "Route",
        "\"route\"",
        "'route'",
        "redirect-gateway",
        "redirect-private",
        "ifconfig",
        "ifconfig-ipv6",
        "dhcp-option",
        "dns",
        "ping",
        "ping-restart",
        "topology",
        "up",
        "x",
    ])
}

fn arg() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "10.0.0.0",
        "255.0.0.0",
        "'10.1.0.0'",
        "\"255.255.0.0\"",
        "fd00::/8",
        "def1",
        "DNS",
        "1.1.1.1",
        "subnet",
        "10",
        "a\\ b",
        "\"unclosed",
        "#c",
    ])
}

fn space() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![" ", "  ", "\t", " \t", "\x0b", "\x0c "])
}

fn lead() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", "", " ", "  ", "\t", " \t ", "\r", "\n"])
}

fn option() -> impl Strategy<Value = String> {
    (
        lead(),
        name(),
        prop::collection::vec((space(), arg()), 0..4),
        prop::option::of(space()),
    )
        .prop_map(|(lead, name, args, trail)| {
            let mut s = format!("{lead}{name}");
            for (sp, a) in args {
                s.push_str(sp);
                s.push_str(a);
            }
            s.push_str(trail.unwrap_or(""));
            s
        })
}

fn filter_text() -> impl Strategy<Value = String> {
    prop_oneof![
        // Prefixes of the generated names, at every length (including "").
        (name(), 0usize..20).prop_map(|(n, k)| n[..k.min(n.len())].to_owned()),
        // Name + separator, the classic bypassable form.
        (name(), space()).prop_map(|(n, s)| format!("{n}{s}")),
        prop::sample::select(vec![" route", "route 10", "\"", "'", "r"]).prop_map(String::from),
    ]
}

fn action() -> impl Strategy<Value = FilterAction> {
    prop::sample::select(vec![
        FilterAction::Accept,
        FilterAction::Ignore,
        FilterAction::Ignore,
        FilterAction::Reject,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn pull_filter_agrees_with_reference_model(
        filters in prop::collection::vec((action(), filter_text()), 0..6),
        options in prop::collection::vec(option(), 0..10),
        trailing_comma in any::<bool>(),
    ) {
        let mut text = options.join(",");
        if trailing_comma {
            text.push(',');
        }
        let policy = PullPolicy {
            filters: filters.iter().map(|(a, t)| PullFilter::new(*a, t.clone())).collect(),
            ..PullPolicy::default()
        };
        let expected = model(&filters, &text);
        let got = policy.process(&text);

        if let Some((line, Verdict::Reject(idx))) = expected.last() {
            prop_assert_eq!(got, Err(PushError::Rejected { option: line.clone(), filter: *idx }));
            return Ok(());
        }
        let part = got.unwrap();

        // Exactly the options the model ignores are dropped by a filter, in order, naming the
        // same filter.
        let want_ignored: Vec<(String, usize)> = expected
            .iter()
            .filter_map(|(l, v)| match v { Verdict::Ignore(i) => Some((l.clone(), *i)), _ => None })
            .collect();
        let got_ignored: Vec<(String, usize)> = part
            .outcome
            .dropped
            .iter()
            .filter_map(|d| match d.reason {
                DropReason::IgnoredByFilter { filter } => Some((d.text.clone(), filter)),
                _ => None,
            })
            .collect();
        prop_assert_eq!(want_ignored, got_ignored);

        // Every option the model keeps went on to the later stages: it was accepted or dropped
        // for another reason (except lines that tokenise to nothing, which vanish).
        let kept_nonempty = expected
            .iter()
            .filter(|(l, v)| {
                *v == Verdict::Keep
                    && protocol::push::tokenize::tokenize(l).map(|t| !t.is_empty()).unwrap_or(true)
            })
            .count();
        let other_drops = part
            .outcome
            .dropped
            .iter()
            .filter(|d| !matches!(d.reason, DropReason::IgnoredByFilter { .. }))
            .count();
        prop_assert_eq!(kept_nonempty, part.outcome.accepted.len() + other_drops);
    }
}

/// The documented upstream behaviours, spelled out.
#[test]
fn upstream_examples() {
    let ignore_route = PullPolicy {
        filters: vec![PullFilter::new(FilterAction::Ignore, "route")],
        ..PullPolicy::default()
    };
    // Prefix semantics: "route" also removes route-gateway and route-ipv6.
    let part = ignore_route
        .process("route 10.0.0.0 255.0.0.0,route-gateway 10.8.0.1,route-ipv6 fd00::/8,ping 10")
        .unwrap();
    assert_eq!(part.outcome.dropped.len(), 3);
    assert_eq!(part.outcome.accepted.len(), 1);

    // Leading whitespace is skipped before matching, quotes are not interpreted.
    let part = ignore_route
        .process("   route 10.0.0.0,\"route\" 10.1.0.0")
        .unwrap();
    assert_eq!(part.outcome.dropped[0].text, "route 10.0.0.0");
    assert!(matches!(
        part.outcome.dropped[0].reason,
        DropReason::IgnoredByFilter { filter: 0 }
    ));
    // The quoted spelling passes the filter (as upstream) and is a real route.
    assert_eq!(part.outcome.accepted.len(), 1);

    // First match wins: accept before ignore keeps it.
    let policy = PullPolicy {
        filters: vec![
            PullFilter::new(FilterAction::Accept, "route 10."),
            PullFilter::new(FilterAction::Ignore, "route"),
            PullFilter::new(FilterAction::Reject, "redirect-gateway"),
        ],
        ..PullPolicy::default()
    };
    let part = policy
        .process("route 10.0.0.0 255.0.0.0,route 192.168.0.0 255.255.0.0")
        .unwrap();
    assert_eq!(part.outcome.accepted.len(), 1);
    assert_eq!(part.outcome.dropped.len(), 1);
    assert_eq!(
        policy.process("ping 10,redirect-gateway def1,route 10.0.0.0"),
        Err(PushError::Rejected {
            option: "redirect-gateway def1".into(),
            filter: 2
        })
    );
}
