//! Each kind of bad config gives its own error, naming the file, the line and the directive.
#![allow(clippy::unwrap_used)]

use protocol::config::*;
use protocol::key::Role;
use protocol::ncp::NcpConfigError;
use protocol::push::tokenize::TokenizeError;

/// A valid client config; tests append or replace lines.
const CLIENT: &str = "\
client
proto tcp-client
remote vpn.example.net
dev tun0
ca ca.crt
cert c.crt
key c.key
";

/// A valid server config.
const SERVER: &str = "\
mode server
tls-server
topology subnet
proto tcp-server
dev tun0
server 10.8.0.0 255.255.255.0
ca ca.crt
cert s.crt
key s.key
dh none
";

fn server_err(text: &str) -> ConfigError {
    ServerOptions::parse("server.conf", text).unwrap_err()
}

fn client_err(text: &str) -> ConfigError {
    ClientOptions::parse("client.conf", text).unwrap_err()
}

/// `SERVER` with `line` appended (as line 11).
fn server_plus(line: &str) -> ConfigError {
    server_err(&format!("{SERVER}{line}\n"))
}

fn client_plus(line: &str) -> ConfigError {
    client_err(&format!("{CLIENT}{line}\n"))
}

fn check(e: &ConfigError, line: usize, directive: &str, reason: ErrorReason) {
    assert_eq!(e.line, Some(line), "{e}");
    assert_eq!(e.directive.as_deref(), Some(directive), "{e}");
    assert_eq!(e.reason, reason, "{e}");
}

fn bad(value: &str, expected: &'static str) -> ErrorReason {
    ErrorReason::BadArgument {
        value: value.into(),
        expected,
    }
}

#[test]
fn baselines_parse() {
    ServerOptions::parse("server.conf", SERVER).unwrap();
    ClientOptions::parse("client.conf", CLIENT).unwrap();
}

#[test]
fn typo_is_unknown_directive() {
    let text = SERVER.replace("dh none", "tls-authh ta.key 0");
    let e = server_err(&text);
    check(&e, 10, "tls-authh", ErrorReason::UnknownDirective);
    assert_eq!(
        e.to_string(),
        "server.conf:10: unknown directive 'tls-authh'"
    );
}

#[test]
fn missing_argument() {
    let e = server_plus("keepalive 10");
    check(
        &e,
        11,
        "keepalive",
        ErrorReason::MissingArgument {
            expected: "INTERVAL TIMEOUT",
        },
    );
    assert_eq!(
        e.to_string(),
        "server.conf:11: 'keepalive': missing argument: expected INTERVAL TIMEOUT"
    );
    check(
        &server_plus("server-ipv6"),
        11,
        "server-ipv6",
        ErrorReason::MissingArgument {
            expected: "NETWORK/BITS",
        },
    );
    check(
        &server_plus("tls-server extra"),
        11,
        "tls-server",
        ErrorReason::TooManyArguments { max: 0 },
    );
}

#[test]
fn bad_addresses() {
    let text = SERVER.replace(
        "server 10.8.0.0 255.255.255.0",
        "server 10.8.0.300 255.255.255.0",
    );
    check(
        &server_err(&text),
        6,
        "server",
        bad("10.8.0.300", "an IPv4 address"),
    );
    let text = SERVER.replace("255.255.255.0", "255.0.255.0");
    check(
        &server_err(&text),
        6,
        "server",
        ErrorReason::BadNetmask {
            mask: "255.0.255.0".into(),
        },
    );
    let text = SERVER.replace("10.8.0.0 255", "10.8.0.1 255");
    check(
        &server_err(&text),
        6,
        "server",
        ErrorReason::NotNetworkAddress {
            network: "10.8.0.1 255.255.255.0".into(),
        },
    );
    check(
        &server_plus("server-ipv6 fd00::/200"),
        11,
        "server-ipv6",
        bad("fd00::/200", "an IPv6 network ADDR/BITS"),
    );
    check(
        &server_plus("route 10.0.0.0 255.255.255.0 not-an-address"),
        11,
        "route",
        bad("not-an-address", "an IPv4 address"),
    );
    check(
        &client_plus("remote vpn.example.net 99999"),
        8,
        "remote",
        bad("99999", "a port 1-65535"),
    );
}

#[test]
fn server_netmask_range() {
    let text = SERVER.replace("255.255.255.0", "255.255.255.252");
    check(
        &server_err(&text),
        6,
        "server",
        ErrorReason::PrefixOutOfRange {
            bits: 30,
            min: 16,
            max: 29,
        },
    );
    let text = SERVER.replace("10.8.0.0 255.255.255.0", "10.0.0.0 255.0.0.0");
    check(
        &server_err(&text),
        6,
        "server",
        ErrorReason::PrefixOutOfRange {
            bits: 8,
            min: 16,
            max: 29,
        },
    );
    // A /30 is fine on tap.
    let text = SERVER
        .replace("255.255.255.0", "255.255.255.252")
        .replace("dev tun0", "dev tap0");
    ServerOptions::parse("server.conf", &text).unwrap();
    check(
        &server_plus("server-ipv6 fd00::/48"),
        11,
        "server-ipv6",
        ErrorReason::PrefixOutOfRange {
            bits: 48,
            min: 64,
            max: 124,
        },
    );
}

#[test]
fn udp_is_refused() {
    let text = SERVER.replace("proto tcp-server", "proto udp");
    let e = server_err(&text);
    check(
        &e,
        4,
        "proto",
        ErrorReason::TcpOnly {
            proto: "udp".into(),
        },
    );
    assert!(e.to_string().contains("TCP only"), "{e}");
    check(
        &client_plus("remote other.example.net 1194 udp"),
        8,
        "remote",
        ErrorReason::TcpOnly {
            proto: "udp".into(),
        },
    );
    let text = SERVER.replace("proto tcp-server\n", "");
    let e = server_err(&text);
    assert_eq!(e.line, None);
    assert_eq!(e.reason, ErrorReason::NoProto);
}

#[test]
fn net30_is_refused() {
    let text = SERVER.replace("topology subnet", "topology net30");
    check(
        &server_err(&text),
        3,
        "topology",
        ErrorReason::UnsupportedTopology {
            topology: "net30".into(),
        },
    );
    let text = SERVER.replace("topology subnet", "topology p2p");
    assert!(matches!(
        server_err(&text).reason,
        ErrorReason::UnsupportedTopology { .. }
    ));
    // Without `topology subnet`, an IPv4 `server` would be net30 upstream.
    let text = SERVER.replace("topology subnet\n", "");
    let e = server_err(&text);
    assert_eq!((e.line, e.directive.as_deref()), (Some(5), Some("server")));
    assert!(matches!(e.reason, ErrorReason::UnsupportedTopology { .. }));
}

#[test]
fn unterminated_and_stray_inline_blocks() {
    let text = format!("{CLIENT}<ca>\n-----BEGIN CERTIFICATE-----\n");
    check(
        &client_err(&text),
        8,
        "ca",
        ErrorReason::UnterminatedInline { tag: "ca".into() },
    );
    let text = format!("{CLIENT}</cert>\n");
    check(
        &client_err(&text),
        8,
        "cert",
        ErrorReason::UnexpectedInlineEnd { tag: "cert".into() },
    );
    let text = format!("{CLIENT}<dh>\nx\n</dh>\n");
    check(
        &client_err(&text),
        8,
        "dh",
        ErrorReason::UnknownInlineTag { tag: "dh".into() },
    );
    let text = format!("{CLIENT}<ca> x\n</ca>\n");
    check(
        &client_err(&text),
        8,
        "ca",
        ErrorReason::InlineTrailingText { tag: "ca".into() },
    );
    // A block closed by another tag's end is still open.
    let text = format!("{CLIENT}<key>\nk\n</ca>\n");
    check(
        &client_err(&text),
        8,
        "key",
        ErrorReason::UnterminatedInline { tag: "key".into() },
    );
}

#[test]
fn line_numbers_count_block_lines() {
    let text = format!("{CLIENT}<ca>\na\nb\n</ca>\nbogus\n");
    check(
        &client_err(&text),
        12,
        "bogus",
        ErrorReason::UnknownDirective,
    );
}

#[test]
fn tokenizer_errors_carry_the_line() {
    let e = client_plus("up \"/bin/true");
    check(
        &e,
        8,
        "up",
        ErrorReason::Tokenize(TokenizeError::UnclosedDoubleQuote),
    );
}

#[test]
fn dh_file_is_accepted_with_a_warning() {
    // GEP-14-era templates name a DH file; they must start unchanged (ECDHE only here).
    let text = SERVER.replace("dh none", "dh /srv/secrets/dh/dh2048.pem");
    let parsed = ServerOptions::parse("server.conf", &text).unwrap();
    assert!(
        parsed
            .warnings
            .iter()
            .any(|w| w.line == 10 && w.kind == WarningKind::DhFileIgnored),
        "{:?}",
        parsed.warnings
    );
}

#[test]
fn role_conflicts() {
    let e = client_err(&format!("{CLIENT}mode server\n"));
    check(
        &e,
        8,
        "mode",
        ErrorReason::Conflict {
            other: "client".into(),
            other_line: 1,
        },
    );
    assert_eq!(
        e.to_string(),
        "client.conf:8: 'mode': conflicts with 'client' on line 1"
    );
    check(
        &server_plus("tls-client"),
        11,
        "tls-client",
        ErrorReason::Conflict {
            other: "mode".into(),
            other_line: 1,
        },
    );
    check(
        &client_plus("push \"route 10.0.0.0 255.0.0.0\""),
        8,
        "push",
        ErrorReason::WrongRole { role: Role::Server },
    );
    check(
        &server_plus("http-proxy proxy 3128"),
        11,
        "http-proxy",
        ErrorReason::WrongRole { role: Role::Client },
    );
    check(
        &server_plus("mode p2p"),
        11,
        "mode",
        ErrorReason::UnsupportedMode { mode: "p2p".into() },
    );
    // tls-client without pull is p2p TLS mode, which we do not do.
    let e = ClientOptions::parse("c.conf", &CLIENT.replacen("client\n", "tls-client\n", 1))
        .unwrap_err();
    assert_eq!(
        e.reason,
        ErrorReason::MissingDirective { directive: "pull" }
    );
    assert_eq!(e.to_string(), "c.conf: missing required directive 'pull'");
    let e = parse("x.conf", "dev tun\n").unwrap_err();
    assert_eq!(e.reason, ErrorReason::NoRole);
}

#[test]
fn missing_directives() {
    for (drop, what) in [
        ("remote vpn.example.net\n", "remote"),
        ("dev tun0\n", "dev"),
        ("ca ca.crt\n", "ca"),
        ("cert c.crt\n", "cert"),
        ("key c.key\n", "key"),
    ] {
        let e = client_err(&CLIENT.replace(drop, ""));
        assert_eq!(e.reason, ErrorReason::MissingDirective { directive: what });
        assert_eq!(e.line, None);
    }
    let e = server_err(&SERVER.replace("server 10.8.0.0 255.255.255.0\n", ""));
    assert_eq!(
        e.reason,
        ErrorReason::MissingDirective {
            directive: "server or server-ipv6"
        }
    );
    let e = client_err(&CLIENT.replace("dev tun0", "dev vpn0"));
    assert_eq!(e.line, Some(4));
    assert!(matches!(e.reason, ErrorReason::BadArgument { .. }));
    let ok = CLIENT.replace("dev tun0", "dev vpn0\ndev-type tun");
    assert_eq!(
        ClientOptions::parse("c", &ok)
            .unwrap()
            .config
            .common
            .dev_type,
        DevType::Tun
    );
}

#[test]
fn value_checks() {
    check(
        &server_plus("keepalive 10 15"),
        11,
        "keepalive",
        ErrorReason::KeepaliveRatio {
            interval: 10,
            timeout: 15,
        },
    );
    check(
        &server_plus("data-ciphers AES-256-GCM:BF-CBC"),
        11,
        "data-ciphers",
        ErrorReason::Ncp(NcpConfigError::UnsupportedCipher {
            name: "BF-CBC".into(),
        }),
    );
    check(
        &server_plus("cipher BF-CBC"),
        11,
        "cipher",
        ErrorReason::Ncp(NcpConfigError::UnsupportedCipher {
            name: "BF-CBC".into(),
        }),
    );
    check(
        &server_plus("auth MD5"),
        11,
        "auth",
        bad("MD5", "SHA1, SHA256 or SHA512"),
    );
    check(
        &server_plus("comp-lzo yes"),
        11,
        "comp-lzo",
        ErrorReason::UnsupportedCompression {
            value: "comp-lzo yes".into(),
        },
    );
    check(
        &server_plus("compress lz4"),
        11,
        "compress",
        ErrorReason::UnsupportedCompression {
            value: "compress lz4".into(),
        },
    );
    check(
        &server_plus("ifconfig-pool 10.8.0.100 10.8.0.50"),
        11,
        "ifconfig-pool",
        ErrorReason::PoolRange {
            start: "10.8.0.100".into(),
            end: "10.8.0.50".into(),
        },
    );
    check(
        &server_plus("iroute 10.1.0.0 255.255.0.0"),
        11,
        "iroute",
        ErrorReason::OnlyInClientConfigDir,
    );
    check(&server_plus("verb 12"), 11, "verb", bad("12", "0 to 11"));
    check(
        &client_plus("pull-filter drop route"),
        8,
        "pull-filter",
        bad("drop", "accept, ignore or reject"),
    );
    check(
        &client_plus("http-proxy-option VERSION 2.0"),
        8,
        "http-proxy-option",
        bad("2.0", "1.0 or 1.1"),
    );
    check(
        &client_plus("http-proxy-option FOO bar"),
        8,
        "http-proxy-option",
        bad("FOO", "VERSION, AGENT, CUSTOM-HEADER, EXT1 or EXT2"),
    );
    let many: String = (0..11)
        .map(|i| format!("http-proxy-option CUSTOM-HEADER X-H{i} v\n"))
        .collect();
    check(
        &client_err(&format!("{CLIENT}{many}")),
        18,
        "http-proxy-option",
        ErrorReason::TooMany { max: 10 },
    );
}

#[test]
fn cross_directive_conflicts() {
    let e = server_plus("tls-auth ta.key 0\ntls-crypt tc.key");
    check(
        &e,
        12,
        "tls-crypt",
        ErrorReason::Conflict {
            other: "tls-auth".into(),
            other_line: 11,
        },
    );
    let e = server_plus("ping 5\nkeepalive 10 60");
    check(
        &e,
        12,
        "keepalive",
        ErrorReason::Conflict {
            other: "ping".into(),
            other_line: 11,
        },
    );
}

#[test]
fn ccd_errors() {
    let e = CcdOptions::parse(
        "ccd/vpn-shoot-client",
        "iroute 10.0.0.0 255.255.0.0\nirout 1.2.3.4\n",
    )
    .unwrap_err();
    check(&e, 2, "irout", ErrorReason::UnknownDirective);
    assert_eq!(
        e.to_string(),
        "ccd/vpn-shoot-client:2: unknown directive 'irout'"
    );
    let e = CcdOptions::parse("ccd/x", "\n# c\nserver 10.8.0.0 255.255.255.0\n").unwrap_err();
    check(&e, 3, "server", ErrorReason::NotInClientConfigDir);
    let e = CcdOptions::parse("ccd/x", "iroute 10.0.0.1 255.255.255.0\n").unwrap_err();
    check(
        &e,
        1,
        "iroute",
        ErrorReason::NotNetworkAddress {
            network: "10.0.0.1 255.255.255.0".into(),
        },
    );
    let e =
        CcdOptions::parse("ccd/x", "ifconfig-push 192.168.123.300 255.255.255.0\n").unwrap_err();
    check(
        &e,
        1,
        "ifconfig-push",
        bad("192.168.123.300", "an IPv4 address"),
    );
    let e = CcdOptions::parse("ccd/x", "<ca>\nx\n</ca>\n").unwrap_err();
    check(&e, 1, "ca", ErrorReason::NotInClientConfigDir);
}

#[test]
fn leading_dashes_and_comments() {
    let text = "# comment\n; other comment\n\n--client\n--proto tcp-client\nremote a # trailing\n--dev tun\nca a\ncert b\nkey c ; x\n";
    let cl = ClientOptions::parse("c", text).unwrap().config;
    assert_eq!(cl.remotes[0].host, "a");
    assert_eq!(cl.common.key, Source::Path("c".into()));
}
