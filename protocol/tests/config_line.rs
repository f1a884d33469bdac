//! Typed config lines (`protocol::config::Line`): reading them into the model gives what
//! parsing their rendered text gives, warnings and refusals included, at the same line.
#![allow(clippy::unwrap_used)]

use protocol::config::*;
use protocol::digest::Digest;
use protocol::key::{KeyDirection, Role};
use protocol::ncp::DataCiphers;
use protocol::push::{FilterAction, PullFilter};

fn server_lines() -> Vec<Line> {
    vec![
        Line::ModeServer,
        Line::TlsServer,
        Line::TopologySubnet,
        Line::Verb(3),
        Line::Txqueuelen(1000),
        Line::TcpNodelay,
        Line::DataCiphers(DataCiphers::parse("AES-256-GCM:AES-256-CBC").unwrap()),
        Line::Port(1194),
        Line::Keepalive(Keepalive {
            interval: 10,
            timeout: 30,
        }),
        Line::MaxRoutesPerClient(0),
        Line::ClientConfigDir("/client-config-dir".into()),
        Line::Key(FileArg::quoted("/s/tls.key")),
        Line::Cert(FileArg::plain("/s/tls.crt")),
        Line::Ca(FileArg::quoted("/s/ca.crt")),
        Line::DhNone,
        Line::Auth(Digest::Sha256),
        Line::TlsAuth(FileArg::quoted("/s/ta.key"), KeyDirection::Normal),
        Line::Proto(Family::V6, Role::Server),
        Line::ServerIpv6("fd8f:6d53:b97a:1::100:0/112".parse().unwrap()),
        Line::ClientToClient,
        Line::DuplicateCn,
        Line::Dev("tap0".into()),
        Line::ScriptSecurity(2),
        Line::Up("/bin/up --a=1,2 --b".into()),
        Line::Down("/bin/down".into()),
        Line::Status(Status {
            path: "/srv/status/openvpn.status".into(),
            interval: 15,
        }),
        Line::StatusVersion(2),
        Line::PullFilter(PullFilter::new(FilterAction::Ignore, "route")),
        Line::Management {
            host: "127.0.0.1".into(),
            port: 7505,
        },
    ]
}

fn client_lines() -> Vec<Line> {
    vec![
        Line::Verb(3),
        Line::AuthNocache,
        Line::Pull,
        Line::TlsClient,
        Line::ConnectRetry(ConnectRetry { initial: 1, max: 5 }),
        Line::Auth(Digest::Sha256),
        Line::TlsAuth(FileArg::quoted("/s/ta.key"), KeyDirection::Inverse),
        Line::RemoteCertTls(CertUsage::Server),
        Line::Proto(Family::Any, Role::Client),
        Line::Key(FileArg::plain("/s/tls.key")),
        Line::Cert(FileArg::plain("/s/tls.crt")),
        Line::Ca(FileArg::plain("/s/ca.crt")),
        Line::PingRestart(5),
        Line::PullFilter(PullFilter::new(FilterAction::Ignore, "ping-restart")),
        Line::PullFilter(PullFilter::new(FilterAction::Accept, "route 10.")),
        Line::HttpProxy {
            host: "api.example.com".into(),
            port: 8443,
        },
        Line::CustomHeader(CustomHeader {
            name: "X-Gardener-Destination".into(),
            content: Some("outbound|1194||vpn-seed-server.ns.svc.cluster.local".into()),
        }),
        Line::Management {
            host: "127.0.0.1".into(),
            port: 7505,
        },
        Line::Dev("tun1".into()),
        Line::Remote("api.example.com".into()),
        Line::ScriptSecurity(2),
        Line::Up("/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' -- ".into()),
    ]
}

#[test]
fn server_lines_read_as_their_text_parses() {
    let lines = server_lines();
    let text = render(&lines);
    assert_eq!(text.lines().count(), lines.len());
    let typed = ServerOptions::from_lines("gen", &lines).unwrap();
    assert_eq!(typed, ServerOptions::parse("gen", &text).unwrap());
    // The warnings name the same lines (pull-filter on a server, management).
    assert_eq!(typed.warnings.len(), 2, "{:?}", typed.warnings);
    assert_eq!(typed.config.max_routes_per_client, 1);
}

#[test]
fn client_lines_read_as_their_text_parses() {
    let lines = client_lines();
    let text = render(&lines);
    let typed = ClientOptions::from_lines("gen", &lines).unwrap();
    assert_eq!(typed, ClientOptions::parse("gen", &text).unwrap());
    assert_eq!(typed.config.pull_filters.len(), 2);
    assert_eq!(typed.warnings[0].line, 18);
}

#[test]
fn the_text_is_one_directive_per_line_as_written() {
    let text = render(&server_lines());
    for line in [
        "mode server\n",
        "key \"/s/tls.key\"\ncert /s/tls.crt\n",
        "tls-auth \"/s/ta.key\" 0\n",
        "proto tcp6-server\n",
        "up \"/bin/up --a=1,2 --b\"\n",
        "status /srv/status/openvpn.status 15\n",
        "pull-filter ignore \"route\"\n",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    let bidi = Line::TlsAuth(FileArg::plain("/k"), KeyDirection::Bidirectional);
    assert_eq!(bidi.to_string(), "tls-auth /k");
}

#[test]
fn refusals_are_the_texts_at_the_same_line() {
    let with = |mut lines: Vec<Line>, edit: &dyn Fn(&mut Vec<Line>)| {
        edit(&mut lines);
        lines
    };
    let cases = [
        // A directive of the other role; both roles' marks.
        with(client_lines(), &|l| l.push(Line::DuplicateCn)),
        with(client_lines(), &|l| l.insert(3, Line::ModeServer)),
        // Values out of range.
        with(server_lines(), &|l| {
            l[8] = Line::Keepalive(Keepalive {
                interval: 10,
                timeout: 15,
            });
        }),
        with(server_lines(), &|l| {
            l[18] = Line::ServerIpv6("fd00::/48".parse().unwrap());
        }),
        with(server_lines(), &|l| l[3] = Line::Verb(12)),
        with(server_lines(), &|l| l[7] = Line::Port(0)),
        with(server_lines(), &|l| l[22] = Line::ScriptSecurity(4)),
        // A missing directive.
        with(server_lines(), &|l| l.retain(|l| !matches!(l, Line::Ca(_)))),
    ];
    for lines in cases {
        let text = render(&lines);
        let server = ServerOptions::from_lines("gen", &lines).err();
        let client = ClientOptions::from_lines("gen", &lines).err();
        assert!(server.is_some() && client.is_some(), "{text}");
        assert_eq!(server, ServerOptions::parse("gen", &text).err(), "{text}");
        assert_eq!(client, ClientOptions::parse("gen", &text).err(), "{text}");
    }
}
