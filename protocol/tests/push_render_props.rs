//! Property test: every option our server can push reads back as itself. A typed
//! [`PushedOption`] is rendered by its `Display` (the one place the server writes option
//! text), packed into a `PUSH_REPLY` by `build_push_reply`, and read as the client reads it
//! (the message split at commas, the line tokenised, the option parsed): the client gets the
//! option it was rendered from, for every variant, with free text that needs quoting too.
//!
//! "Can push" means the values the client's parser itself returns: a contiguous netmask, a
//! `dhcp-option` of another type not named like one of the four it checks, `protocol-flags` /
//! `socket-flags` with at least one flag and unknown flags that are not known ones, no comma
//! or control character in free text (`build_push_reply` refuses those), at most 16 tokens
//! and under 256 bytes.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;
use proptest::prelude::*;
use protocol::control_msg::ControlMessage;
use protocol::ids::PeerId;
use protocol::push::options::{
    AuthToken, CompLzo, Compress, DhcpOption, KeyDerivation, ProtocolFlags, RedirectFlags, Route,
    RouteGatewayAddr, RouteIpv6, RouteVia, SocketFlags, Topology,
};
use protocol::push::tokenize::{self, OPTION_PARM_SIZE};
use protocol::push::{build_push_reply, split_options, OptionKind, PushItem, PushedOption};

/// Free text: anything but a comma or a control character, quotes, backslashes, `#`, `;`,
/// spaces and non-ASCII included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[^\\x00-\\x1f\\x7f,]{0,8}",
        "[ \"'\\\\#;a-z]{0,8}",
        Just(String::new()),
    ]
}

fn texts(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..=max)
}

fn v4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

fn v6net() -> impl Strategy<Value = Ipv6Net> {
    (v6(), 0u8..=128).prop_map(|(a, bits)| Ipv6Net::new(a, bits).unwrap())
}

fn netmask() -> impl Strategy<Value = Ipv4Addr> {
    (0u32..=32).prop_map(|bits| Ipv4Addr::from(u32::MAX.checked_shl(32 - bits).unwrap_or(0)))
}

fn route() -> impl Strategy<Value = Route> {
    let via = prop_oneof![
        v4().prop_map(RouteVia::Addr),
        Just(RouteVia::VpnGateway),
        Just(RouteVia::NetGateway),
        Just(RouteVia::RemoteHost),
    ];
    (v4(), netmask(), prop::option::of(via), any::<Option<u32>>()).prop_map(
        |(network, netmask, gateway, metric)| Route {
            network,
            netmask,
            gateway,
            metric,
        },
    )
}

fn route_ipv6() -> impl Strategy<Value = RouteIpv6> {
    (v6net(), prop::option::of(v6()), any::<Option<u32>>()).prop_map(
        |(network, gateway, metric)| RouteIpv6 {
            network,
            gateway,
            metric,
        },
    )
}

fn redirect_flags() -> impl Strategy<Value = RedirectFlags> {
    any::<[bool; 8]>().prop_map(|b| RedirectFlags {
        local: b[0],
        autolocal: b[1],
        def1: b[2],
        bypass_dhcp: b[3],
        bypass_dns: b[4],
        block_local: b[5],
        ipv4: b[6],
        ipv6: b[7],
    })
}

fn dhcp_option() -> impl Strategy<Value = DhcpOption> {
    let checked = ["DNS", "DNS6", "DOMAIN", "DOMAIN-SEARCH"];
    prop_oneof![
        prop_oneof![v4().prop_map(IpAddr::V4), v6().prop_map(IpAddr::V6)].prop_map(DhcpOption::Dns),
        v6().prop_map(DhcpOption::Dns6),
        text().prop_map(DhcpOption::Domain),
        text().prop_map(DhcpOption::DomainSearch),
        (
            text().prop_filter("a type the parser checks", move |k| !checked
                .contains(&k.as_str())),
            texts(4)
        )
            .prop_map(|(kind, args)| DhcpOption::Other { kind, args }),
    ]
}

fn unknown_flags(known: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        text().prop_filter("a known flag", move |f| !known.contains(&f.as_str())),
        0..=4,
    )
}

fn protocol_flags() -> impl Strategy<Value = ProtocolFlags> {
    let known = &["cc-exit", "tls-ekm", "dyn-tls-crypt"];
    (any::<[bool; 3]>(), unknown_flags(known))
        .prop_map(|(b, unknown)| ProtocolFlags {
            cc_exit: b[0],
            tls_ekm: b[1],
            dyn_tls_crypt: b[2],
            unknown,
        })
        .prop_filter("at least one flag", |f| {
            f.cc_exit || f.tls_ekm || f.dyn_tls_crypt || !f.unknown.is_empty()
        })
}

fn socket_flags() -> impl Strategy<Value = SocketFlags> {
    (any::<bool>(), unknown_flags(&["TCP_NODELAY"]))
        .prop_map(|(tcp_nodelay, unknown)| SocketFlags {
            tcp_nodelay,
            unknown,
        })
        .prop_filter("at least one flag", |f| {
            f.tcp_nodelay || !f.unknown.is_empty()
        })
}

/// The interface and the routes.
fn interface_and_routes() -> impl Strategy<Value = PushedOption> {
    prop_oneof![
        (v4(), v4()).prop_map(|(local, remote_netmask)| PushedOption::Ifconfig {
            local,
            remote_netmask
        }),
        (v6net(), prop::option::of(v6()))
            .prop_map(|(local, remote)| PushedOption::IfconfigIpv6 { local, remote }),
        prop_oneof![
            Just(Topology::Net30),
            Just(Topology::P2p),
            Just(Topology::Subnet)
        ]
        .prop_map(PushedOption::Topology),
        any::<u16>().prop_map(PushedOption::TunMtu),
        Just(PushedOption::TunIpv6),
        route().prop_map(PushedOption::Route),
        route_ipv6().prop_map(PushedOption::RouteIpv6),
        prop_oneof![
            v4().prop_map(RouteGatewayAddr::Addr),
            Just(RouteGatewayAddr::Dhcp)
        ]
        .prop_map(PushedOption::RouteGateway),
        any::<u32>().prop_map(PushedOption::RouteMetric),
        redirect_flags().prop_map(PushedOption::RedirectGateway),
        redirect_flags().prop_map(PushedOption::RedirectPrivate),
    ]
}

/// Keepalive, DNS, the data channel and the session, the rest.
fn session_and_rest() -> impl Strategy<Value = PushedOption> {
    prop_oneof![
        any::<u32>().prop_map(PushedOption::Ping),
        any::<u32>().prop_map(PushedOption::PingRestart),
        any::<u32>().prop_map(PushedOption::PingExit),
        dhcp_option().prop_map(PushedOption::DhcpOption),
        prop::collection::vec(text(), 1..=4).prop_map(PushedOption::Dns),
        Just(PushedOption::BlockOutsideDns),
        Just(PushedOption::RegisterDns),
        (0..=PeerId::UNDEFINED.get()).prop_map(|id| PushedOption::PeerId(PeerId::new(id).unwrap())),
        text().prop_map(PushedOption::Cipher),
        Just(PushedOption::KeyDerivation(KeyDerivation::TlsEkm)),
        protocol_flags().prop_map(PushedOption::ProtocolFlags),
        prop_oneof![
            Just(CompLzo::Yes),
            Just(CompLzo::No),
            Just(CompLzo::Adaptive)
        ]
        .prop_map(PushedOption::CompLzo),
        prop_oneof![
            Just(Compress::Stub),
            Just(Compress::StubV2),
            Just(Compress::Lzo),
            Just(Compress::Lz4),
            Just(Compress::Lz4V2)
        ]
        .prop_map(PushedOption::Compress),
        text().prop_map(|t| PushedOption::AuthToken(AuthToken(t))),
        socket_flags().prop_map(PushedOption::SocketFlags),
        texts(4).prop_map(PushedOption::Echo),
        (text(), text()).prop_map(|(name, value)| PushedOption::Setenv { name, value }),
        any::<u8>().prop_map(PushedOption::PushContinuation),
    ]
}

fn option() -> impl Strategy<Value = PushedOption> {
    prop_oneof![interface_and_routes(), session_and_rest()]
}

/// What the client makes of the one option of a `PUSH_REPLY`: the text between the commas,
/// and the option its parser reads from it.
fn client_reads(message: &str) -> (String, PushedOption) {
    let ControlMessage::PushReply { options } = ControlMessage::parse(message) else {
        panic!("not a PUSH_REPLY: {message:?}")
    };
    let pieces: Vec<&str> = split_options(&options).collect();
    assert_eq!(pieces.len(), 1, "{message:?}");
    let line = tokenize::skip_leading_space(pieces[0]);
    let tokens = tokenize::tokenize(line).unwrap();
    let kind = OptionKind::from_name(&tokens[0]).unwrap();
    let option = PushedOption::from_tokens(kind, &tokens, line).unwrap();
    (pieces[0].to_owned(), option)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_option_reads_back_as_itself(option in option()) {
        let text = option.to_string();
        prop_assert!(text.len() < OPTION_PARM_SIZE, "{text:?} is too long to be read");
        let messages = build_push_reply(&[PushItem::Typed(option.clone())]).unwrap();
        prop_assert_eq!(messages.len(), 1);
        let (sent, read) = client_reads(&messages[0]);
        prop_assert_eq!(sent, text);
        prop_assert_eq!(read, option);
    }

    #[test]
    fn a_configuration_line_is_sent_as_written(line in "[^\\x00-\\x1f\\x7f,]{1,100}") {
        let messages = build_push_reply(&[PushItem::Verbatim(line.clone())]).unwrap();
        prop_assert_eq!(messages, [format!("PUSH_REPLY,{line}")]);
    }
}
