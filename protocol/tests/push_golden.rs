//! Exact-text tests of push/pull: the PUSH_REPLY strings a real OpenVPN 2.6.14 server sent
//! (reference 10.4, observed), the 940/1024-byte continuation boundaries (10.3), and the
//! splitting of TLS plaintext into control messages at NUL (6.5).

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::net::Ipv4Addr;

use protocol::control_msg::{split_messages, ControlMessage, ControlMsgError};
use protocol::ids::PeerId;
use protocol::push::options::{
    CompLzo, DhcpOption, ProtocolFlags, Route, RouteGatewayAddr, Topology,
};
use protocol::push::{
    build_push_reply, DropReason, PullPolicy, PushBuildError, PushCollector, PushItem,
    PushedOption, PUSH_BUNDLE_SIZE, PUSH_REPLY_SAFE_CAP,
};

/// Observed from `openvpn` 2.6.14, `server 192.168.123.0 255.255.255.0`, `topology subnet`,
/// `keepalive 10 60`, stock 2.6 client (reference 10.4).
const OBSERVED_GCM: &str = "PUSH_REPLY,route-gateway 192.168.123.1,topology subnet,ping 10,ping-restart 60,ifconfig 192.168.123.2 255.255.255.0,peer-id 0,cipher AES-256-GCM,protocol-flags cc-exit tls-ekm dyn-tls-crypt,tun-mtu 1500";

/// Observed with extra `push` lines and `data-ciphers AES-256-CBC` (reference 10.4).
const OBSERVED_CBC_EXTRA: &str = "PUSH_REPLY,comp-lzo no,route 10.99.0.0 255.255.0.0,dhcp-option DNS 192.168.123.1,route-gateway 192.168.123.1,topology subnet,ping 10,ping-restart 60,ifconfig 192.168.123.2 255.255.255.0,peer-id 0,cipher AES-256-CBC,protocol-flags cc-exit tls-ekm dyn-tls-crypt,tun-mtu 1500";

/// Observed for a client announcing only IV_PROTO=2 (reference 10.4).
const OBSERVED_MINIMAL: &str = "PUSH_REPLY,route-gateway 192.168.123.1,topology subnet,ping 10,ping-restart 60,ifconfig 192.168.123.2 255.255.255.0,peer-id 0,cipher AES-256-GCM";

fn receive(text: &str, policy: &PullPolicy) -> protocol::push::PushOutcome {
    let ControlMessage::PushReply { options } = ControlMessage::parse(text) else {
        panic!("not a PUSH_REPLY: {text}")
    };
    PushCollector::new()
        .push_part(policy, &options)
        .unwrap()
        .expect("single part")
}

fn common_head() -> Vec<PushedOption> {
    vec![
        PushedOption::RouteGateway(RouteGatewayAddr::Addr(Ipv4Addr::new(192, 168, 123, 1))),
        PushedOption::Topology(Topology::Subnet),
        PushedOption::Ping(10),
        PushedOption::PingRestart(60),
        PushedOption::Ifconfig {
            local: Ipv4Addr::new(192, 168, 123, 2),
            remote_netmask: Ipv4Addr::new(255, 255, 255, 0),
        },
        PushedOption::PeerId(PeerId::new(0).unwrap()),
    ]
}

fn flags() -> PushedOption {
    PushedOption::ProtocolFlags(ProtocolFlags {
        cc_exit: true,
        tls_ekm: true,
        dyn_tls_crypt: true,
        unknown: vec![],
    })
}

#[test]
fn observed_gcm_reply_parses() {
    let out = receive(OBSERVED_GCM, &PullPolicy::default());
    let mut want = common_head();
    want.extend([
        PushedOption::Cipher("AES-256-GCM".into()),
        flags(),
        PushedOption::TunMtu(1500),
    ]);
    assert_eq!(out.accepted, want);
    assert!(out.dropped.is_empty());
}

#[test]
fn observed_cbc_reply_with_extra_pushes_parses() {
    let out = receive(OBSERVED_CBC_EXTRA, &PullPolicy::default());
    let mut want = vec![
        PushedOption::CompLzo(CompLzo::No),
        PushedOption::Route(Route {
            network: Ipv4Addr::new(10, 99, 0, 0),
            netmask: Ipv4Addr::new(255, 255, 0, 0),
            gateway: None,
            metric: None,
        }),
        PushedOption::DhcpOption(DhcpOption::Dns(Ipv4Addr::new(192, 168, 123, 1).into())),
    ];
    want.extend(common_head());
    want.extend([
        PushedOption::Cipher("AES-256-CBC".into()),
        flags(),
        PushedOption::TunMtu(1500),
    ]);
    assert_eq!(out.accepted, want);
    assert!(out.dropped.is_empty());
}

#[test]
fn observed_minimal_reply_parses() {
    let out = receive(OBSERVED_MINIMAL, &PullPolicy::default());
    let mut want = common_head();
    want.push(PushedOption::Cipher("AES-256-GCM".into()));
    assert_eq!(out.accepted, want);
}

#[test]
fn route_nopull_refuses_route_and_dns_but_keeps_the_rest() {
    let policy = PullPolicy {
        route_nopull: true,
        ..PullPolicy::default()
    };
    let out = receive(OBSERVED_CBC_EXTRA, &policy);
    let dropped: Vec<&str> = out.dropped.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(
        dropped,
        [
            "route 10.99.0.0 255.255.0.0",
            "dhcp-option DNS 192.168.123.1"
        ]
    );
    assert!(out
        .dropped
        .iter()
        .all(|d| matches!(d.reason, DropReason::NotPermitted { .. })));
    assert_eq!(out.accepted.len(), 10); // comp-lzo + route-gateway ... tun-mtu
}

#[test]
fn our_builder_reproduces_the_observed_text() {
    let options: Vec<&str> = OBSERVED_GCM
        .strip_prefix("PUSH_REPLY,")
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(build_push_reply(&options).unwrap(), [OBSERVED_GCM]);
    assert_eq!(
        build_push_reply::<&str>(&[]).unwrap(),
        ["PUSH_REPLY"],
        "an empty push is a bare PUSH_REPLY"
    );
}

#[test]
fn our_typed_push_reproduces_the_observed_text() {
    let typed = |options: Vec<PushedOption>| options.into_iter().map(PushItem::Typed);
    let tail = |cipher: &str| {
        vec![
            PushedOption::Cipher(cipher.into()),
            flags(),
            PushedOption::TunMtu(1500),
        ]
    };
    let mut items: Vec<PushItem> = typed(common_head()).collect();
    items.extend(typed(tail("AES-256-GCM")));
    assert_eq!(build_push_reply(&items).unwrap(), [OBSERVED_GCM]);
    // The configuration's push lines go first, as written.
    let mut items: Vec<PushItem> = [
        "comp-lzo no",
        "route 10.99.0.0 255.255.0.0",
        "dhcp-option DNS 192.168.123.1",
    ]
    .map(|line| PushItem::Verbatim(line.into()))
    .into();
    items.extend(typed(common_head()));
    items.extend(typed(tail("AES-256-CBC")));
    assert_eq!(build_push_reply(&items).unwrap(), [OBSERVED_CBC_EXTRA]);
}

#[test]
fn continuation_splits_before_940_bytes() {
    assert_eq!(PUSH_REPLY_SAFE_CAP, 940);
    // "PUSH_REPLY" (10) + "," + 900-byte option = 911; the next option of 28 bytes makes
    // 911 + 28 = 939 < 940: it still fits.
    let first = format!("echo {}", "a".repeat(895));
    assert_eq!(first.len(), 900);
    let fits = format!("echo {}", "b".repeat(23));
    assert_eq!(fits.len(), 28);
    let msgs = build_push_reply(&[first.as_str(), fits.as_str()]).unwrap();
    assert_eq!(msgs, [format!("PUSH_REPLY,{first},{fits}")]);
    assert_eq!(msgs[0].len(), 940);

    // One byte more (911 + 29 = 940) starts a new message.
    let spills = format!("echo {}", "b".repeat(24));
    let msgs = build_push_reply(&[first.as_str(), spills.as_str()]).unwrap();
    assert_eq!(
        msgs,
        [
            format!("PUSH_REPLY,{first},push-continuation 2"),
            format!("PUSH_REPLY,{spills},push-continuation 1"),
        ]
    );
}

#[test]
fn continuation_over_many_messages_stays_under_the_bundle_size() {
    let options: Vec<String> = (0..200)
        .map(|i| format!("route 10.{}.{}.0 255.255.255.0", i / 256, i % 256))
        .collect();
    let msgs = build_push_reply(&options).unwrap();
    assert!(msgs.len() > 1);
    for (i, m) in msgs.iter().enumerate() {
        assert!(m.starts_with("PUSH_REPLY,"));
        assert!(
            m.len() < PUSH_BUNDLE_SIZE,
            "message {i} is {} bytes",
            m.len()
        );
        let tail = if i + 1 == msgs.len() {
            ",push-continuation 1"
        } else {
            ",push-continuation 2"
        };
        assert!(m.ends_with(tail), "message {i}");
        // Without its continuation option, a message is at most 940 bytes (the comma in
        // front of an option is not counted by the cut rule).
        assert!(m.len() - tail.len() <= PUSH_REPLY_SAFE_CAP);
    }
    // Each non-last message was cut because the next option would have reached 940 bytes.
    for (i, m) in msgs.iter().enumerate().take(msgs.len() - 1) {
        let body = m.strip_suffix(",push-continuation 2").unwrap();
        let next_first = msgs[i + 1]
            .strip_prefix("PUSH_REPLY,")
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        assert!(body.len() + next_first.len() >= PUSH_REPLY_SAFE_CAP);
    }

    // The client collects the parts and gets every route back, in order.
    let mut collector = PushCollector::new();
    let mut outcome = None;
    for (i, m) in msgs.iter().enumerate() {
        let ControlMessage::PushReply { options } = ControlMessage::parse(m) else {
            panic!()
        };
        let r = collector
            .push_part(&PullPolicy::default(), &options)
            .unwrap();
        assert_eq!(r.is_some(), i + 1 == msgs.len());
        outcome = r;
    }
    let outcome = outcome.unwrap();
    assert_eq!(outcome.accepted.len(), 200);
    assert!(outcome.dropped.is_empty());
    assert!(!collector.in_progress());
}

#[test]
fn builder_refuses_commas_and_oversized_options() {
    assert_eq!(
        build_push_reply(&["ping 10", "echo a,b"]),
        Err(PushBuildError::OptionContainsComma {
            index: 1,
            option: "echo a,b".into()
        })
    );
    // 10 + 929 = 939 fits; 930 does not.
    let ok = "x".repeat(929);
    assert_eq!(build_push_reply(&[ok.as_str()]).unwrap().len(), 1);
    let long = "x".repeat(930);
    assert_eq!(
        build_push_reply(&[long.as_str()]),
        Err(PushBuildError::OptionTooLong { index: 0, len: 930 })
    );
    assert!(matches!(
        build_push_reply(&["echo a\tb"]),
        Err(PushBuildError::InvalidCharacter { index: 0, byte: 9 })
    ));
}

#[test]
fn control_messages_split_at_nul_and_trailing_piece_is_discarded() {
    let mut plaintext = Vec::new();
    ControlMessage::parse(OBSERVED_MINIMAL)
        .encode(&mut plaintext)
        .unwrap();
    plaintext.extend_from_slice(b"RESTART,[N]maintenance\r\n\0");
    plaintext.extend_from_slice(b"HALT,broken\x01\0");
    plaintext.extend_from_slice(b"PUSH_REPLY,ping 10"); // no NUL: discarded
    let got: Vec<_> = split_messages(&plaintext).collect();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0], Ok(ControlMessage::parse(OBSERVED_MINIMAL)));
    let Ok(ControlMessage::Restart(sig)) = &got[1] else {
        panic!("{:?}", got[1])
    };
    assert!(sig.next_remote && !sig.keep_password);
    assert_eq!(sig.message, "maintenance");
    assert!(matches!(
        got[2],
        Err(ControlMsgError::InvalidCharacter {
            byte: 1,
            offset: 11,
            ..
        })
    ));
    assert_eq!(got[3], Err(ControlMsgError::Unterminated { len: 18 }));
}

/// DEVIATIONS.md P2: an option of 256 bytes or more is dropped whole, never cut into pieces.
#[test]
fn overlong_pushed_option_is_dropped_whole() {
    let long_route = format!("route 10.0.0.0 255.0.0.0 {}", "1".repeat(240));
    let outcome = receive(
        &format!("PUSH_REPLY,ping 10,{long_route},ping-restart 60"),
        &PullPolicy::default(),
    );
    assert_eq!(
        outcome.accepted,
        vec![PushedOption::Ping(10), PushedOption::PingRestart(60)]
    );
    assert_eq!(outcome.dropped.len(), 1);
    assert!(matches!(
        outcome.dropped[0].reason,
        DropReason::TooLong { .. }
    ));
}

/// DEVIATIONS.md P5: at most 64 continuation parts; the 65th refuses the whole push.
#[test]
fn too_many_continuation_parts_refuse_the_push() {
    let policy = PullPolicy::default();
    let mut collector = PushCollector::new();
    for _ in 0..64 {
        assert_eq!(
            collector
                .push_part(&policy, ",ping 10,push-continuation 2")
                .unwrap(),
            None
        );
    }
    assert!(collector
        .push_part(&policy, ",ping 10,push-continuation 2")
        .is_err());
    assert!(
        !collector.in_progress(),
        "a refused push leaves nothing behind"
    );
}
