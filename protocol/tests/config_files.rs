//! The vpn2 (reference gardener-vpn2.md 1.3) and GEP-14-era configs, rendered with example
//! values under `tests/data/config/`, parse into the expected typed values.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use protocol::config::*;
use protocol::data::{Compression, DataCipher};
use protocol::digest::Digest;
use protocol::key::{KeyDirection, Role};
use protocol::ncp::DataCiphers;
use protocol::push::{FilterAction, PullFilter};

fn path(p: &str) -> Source {
    Source::Path(PathBuf::from(p))
}

fn server(name: &str, text: &str) -> Parsed<ServerOptions> {
    ServerOptions::parse(name, text).unwrap_or_else(|e| panic!("{e}"))
}

fn client(name: &str, text: &str) -> Parsed<ClientOptions> {
    ClientOptions::parse(name, text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn vpn2_server() {
    let p = server(
        "vpn2-server.conf",
        include_str!("data/config/vpn2-server.conf"),
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let s = p.config;
    let c = &s.common;
    assert_eq!(c.dev, "tun0");
    assert_eq!(c.dev_type, DevType::Tun);
    assert_eq!(c.family, Family::V6);
    assert_eq!(c.port, 1194);
    assert_eq!(c.verb, 3);
    assert_eq!(c.txqueuelen, Some(1000));
    assert!(c.tcp_nodelay);
    assert_eq!(
        c.data_ciphers,
        DataCiphers::new(vec![DataCipher::Aes256Gcm, DataCipher::Aes256Cbc]).unwrap()
    );
    assert_eq!(c.data_ciphers, c.effective_data_ciphers());
    assert_eq!(
        c.keepalive,
        Some(Keepalive {
            interval: 10,
            timeout: 30
        })
    );
    assert_eq!(s.local_ping(), (Some(10), Some(60)));
    assert_eq!(s.pushed_ping(), Some((10, 30)));
    assert_eq!(s.max_routes_per_client, 1_048_576);
    assert_eq!(s.max_clients, DEFAULT_MAX_CLIENTS);
    assert_eq!(
        s.client_config_dir,
        Some(PathBuf::from("/client-config-dir"))
    );
    assert_eq!(c.key, path("/srv/secrets/vpn-server/tls.key"));
    assert_eq!(c.cert, path("/srv/secrets/vpn-server/tls.crt"));
    assert_eq!(c.ca, path("/srv/secrets/vpn-server/ca.crt"));
    assert_eq!(c.auth, Digest::Sha256);
    assert_eq!(
        c.tls_wrap,
        Some(TlsWrapConfig::Auth {
            key: path("/srv/secrets/tlsauth/vpn.tlsauth"),
            direction: KeyDirection::Normal
        })
    );
    assert_eq!(s.server, None);
    assert_eq!(
        s.server_ipv6,
        Some("fd8f:6d53:b97a:1::/96".parse().unwrap())
    );
    assert!(!s.client_to_client && !s.duplicate_cn);
    assert_eq!(c.script_security, 2);
    assert_eq!(
        c.up.as_deref(),
        Some(
            "/bin/vpn-server firewall --mode up --device tun0 --shoot-network=100.64.0.0/13 \
             --shoot-network=100.96.0.0/11 --shoot-network=10.250.0.0/16"
        )
    );
    assert_eq!(
        c.down.as_deref(),
        Some("/bin/vpn-server firewall --mode down --device tun0")
    );
    assert_eq!(
        c.status,
        Some(Status {
            path: PathBuf::from("/srv/status/openvpn.status"),
            interval: 15
        })
    );
    assert_eq!(c.status_version, 2);
    assert!(s.push.is_empty());
    assert_eq!(c.compression, Compression::None);
}

#[test]
fn vpn2_server_ha() {
    let s = server(
        "vpn2-server-ha.conf",
        include_str!("data/config/vpn2-server-ha.conf"),
    )
    .config;
    assert_eq!(s.common.dev, "tap0");
    assert_eq!(s.common.dev_type, DevType::Tap);
    assert_eq!(s.common.tun_mtu, Some(8800));
    assert_eq!(s.push, ["tun-mtu 8800"]);
    assert!(s.client_to_client && s.duplicate_cn);
    assert_eq!(
        s.server_ipv6,
        Some("fd8f:6d53:b97a:1::101:0/112".parse().unwrap())
    );
}

#[test]
fn vpn2_shoot_client() {
    let p = client(
        "vpn2-client-shoot.conf",
        include_str!("data/config/vpn2-client-shoot.conf"),
    );
    // `management` is accepted, reported, and does nothing.
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].directive, "management");
    assert_eq!(p.warnings[0].line, 29);
    assert_eq!(p.warnings[0].kind, WarningKind::NotImplemented);
    assert_eq!(
        p.warnings[0].to_string(),
        "vpn2-client-shoot.conf:29: 'management': accepted but not implemented; ignored"
    );
    let cl = p.config;
    let c = &cl.common;
    assert_eq!(c.verb, 3);
    assert!(cl.auth_nocache);
    assert_eq!(c.family, Family::V4);
    assert_eq!(
        c.data_ciphers,
        DataCiphers::new(vec![DataCipher::Aes256Gcm]).unwrap()
    );
    assert_eq!(cl.connect_retry, ConnectRetry { initial: 1, max: 5 });
    assert_eq!(cl.connect_retry_max, None);
    assert_eq!(c.auth, Digest::Sha256);
    assert_eq!(
        c.tls_wrap,
        Some(TlsWrapConfig::Auth {
            key: path("/srv/secrets/tlsauth/vpn.tlsauth"),
            direction: KeyDirection::Inverse
        })
    );
    assert_eq!(c.remote_cert_tls, Some(CertUsage::Server));
    assert_eq!(c.verify_x509_name, None);
    assert_eq!(c.ca, path("/srv/secrets/vpn-client/ca.crt"));
    assert_eq!(
        cl.http_proxy,
        Some(HttpProxy {
            host: "api.demo.proj.example.com".into(),
            port: 8443,
            auth: None
        })
    );
    assert_eq!(
        cl.http_proxy_options.custom_headers,
        [CustomHeader {
            name: "X-Gardener-Destination".into(),
            content: Some(
                "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local".into()
            )
        }]
    );
    assert_eq!(cl.http_proxy_options.version, None);
    // No port on the `remote` line: the tunnel target is 1194.
    assert_eq!(
        cl.remotes,
        [Remote {
            host: "api.demo.proj.example.com".into(),
            port: 1194,
            family: Family::V4
        }]
    );
    assert_eq!(
        c.up.as_deref(),
        Some("/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' -- ")
    );
    assert!(cl.pull_filters.is_empty());
}

#[test]
fn vpn2_seed_client_ha() {
    let cl = client(
        "vpn2-client-seed-ha.conf",
        include_str!("data/config/vpn2-client-seed-ha.conf"),
    )
    .config;
    assert_eq!(cl.common.family, Family::Any);
    assert_eq!(cl.common.dev_type, DevType::Tap);
    assert_eq!(cl.http_proxy, None);
    assert_eq!(cl.remotes[0].host, "vpn-seed-server-0");
    assert_eq!(cl.remotes[0].port, 1194);
}

#[test]
fn vpn2_ccd() {
    let ccd = CcdOptions::parse(
        "vpn-shoot-client",
        include_str!("data/config/vpn-shoot-client.ccd"),
    )
    .unwrap();
    assert_eq!(
        ccd.iroutes,
        [
            "242.0.0.0/8".parse().unwrap(),
            "243.0.0.0/8".parse().unwrap(),
            "244.0.0.0/8".parse().unwrap()
        ]
    );
    assert_eq!(ccd.iroutes_ipv6, ["2001:db8:100::/56".parse().unwrap()]);
    assert!(!ccd.disable && !ccd.push_reset && ccd.push.is_empty());
}

#[test]
fn ccd_every_directive() {
    let text = "\
ifconfig-push 192.168.123.10 255.255.255.0
ifconfig-ipv6-push fd8f:6d53:b97a:1::10/96 fd8f:6d53:b97a:1::1
iroute 10.1.2.0 255.255.255.0
iroute 10.9.9.9
push-reset
push-remove route
push \"route 10.20.0.0 255.255.0.0\"
disable
";
    let ccd = CcdOptions::parse("ccd/alice", text).unwrap();
    assert_eq!(
        ccd.ifconfig_push,
        Some(IfconfigPush {
            local: Ipv4Addr::new(192, 168, 123, 10),
            remote_netmask: Ipv4Addr::new(255, 255, 255, 0)
        })
    );
    assert_eq!(
        ccd.ifconfig_ipv6_push,
        Some(IfconfigIpv6Push {
            local: "fd8f:6d53:b97a:1::10/96".parse().unwrap(),
            remote: Some("fd8f:6d53:b97a:1::1".parse::<Ipv6Addr>().unwrap())
        })
    );
    assert_eq!(
        ccd.iroutes,
        [
            "10.1.2.0/24".parse().unwrap(),
            "10.9.9.9/32".parse().unwrap()
        ]
    );
    assert!(ccd.push_reset && ccd.disable);
    assert_eq!(ccd.push_remove, ["route"]);
    assert_eq!(ccd.push, ["route 10.20.0.0 255.255.0.0"]);
    assert_eq!(
        CcdOptions::parse("empty", "").unwrap(),
        CcdOptions::default()
    );
}

#[test]
fn gep14_server() {
    let s = server(
        "gep14-server.conf",
        include_str!("data/config/gep14-server.conf"),
    )
    .config;
    assert_eq!(
        s.server,
        Some(ServerNetwork {
            network: "192.168.123.0/24".parse().unwrap(),
            nopool: true
        })
    );
    assert_eq!(
        s.ifconfig_pool,
        Some(IfconfigPool {
            start: Ipv4Addr::new(192, 168, 123, 2),
            end: Ipv4Addr::new(192, 168, 123, 254),
            netmask: None
        })
    );
    assert_eq!(s.common.family, Family::V4);
    assert_eq!(s.common.cipher, Some(DataCipher::Aes256Cbc));
    assert_eq!(s.common.auth, Digest::Sha1);
    assert_eq!(s.local_ping(), (Some(10), Some(120)));
}

#[test]
fn gep14_client() {
    let p = client(
        "gep14-client.conf",
        include_str!("data/config/gep14-client.conf"),
    );
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].directive, "remap-usr1");
    let cl = p.config;
    assert_eq!(cl.http_proxy.as_ref().unwrap().port, 8132);
    assert_eq!(cl.http_proxy_options.custom_headers[0].name, "Reversed-VPN");
    assert_eq!(
        cl.common.effective_data_ciphers(),
        DataCiphers::new(vec![DataCipher::Aes256Cbc]).unwrap()
    );
    assert_eq!(cl.connect_retry, DEFAULT_CONNECT_RETRY);
}

#[test]
fn inline_blocks_keep_their_content() {
    let p = client(
        "inline-client.conf",
        include_str!("data/config/inline-client.conf"),
    );
    let cl = p.config;
    let c = &cl.common;
    assert_eq!(
        c.ca,
        Source::Inline(
            "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUEXAMPLE\n   indented line kept as is   \n\
             -----END CERTIFICATE-----\n"
                .into()
        )
    );
    assert_eq!(
        c.cert,
        Source::Inline("-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n".into())
    );
    assert_eq!(
        c.key,
        Source::Inline("-----BEGIN PRIVATE KEY-----\nMIGHAgEA\n-----END PRIVATE KEY-----\n".into())
    );
    // Comment lines inside a block are content, and `key-direction` applies to it.
    assert_eq!(
        c.tls_wrap,
        Some(TlsWrapConfig::Auth {
            key: Source::Inline(
                "#\n# 2048 bit OpenVPN static key\n#\n-----BEGIN OpenVPN Static key V1-----\n\
                 00112233445566778899aabbccddeeff\n-----END OpenVPN Static key V1-----\n"
                    .into()
            ),
            direction: KeyDirection::Inverse
        })
    );
    assert_eq!(
        cl.remotes,
        [
            Remote {
                host: "vpn1.example.net".into(),
                port: 443,
                family: Family::Any
            },
            Remote {
                host: "vpn2.example.net".into(),
                port: 11940,
                family: Family::Any
            },
            Remote {
                host: "2001:db8::1".into(),
                port: 1194,
                family: Family::V6
            },
        ]
    );
    assert!(cl.nobind && c.persist_key && c.persist_tun && cl.route_nopull);
    assert_eq!(
        c.verify_x509_name,
        Some(VerifyX509Name {
            name: "vpn-seed-server".into(),
            kind: X509NameType::Name
        })
    );
    assert_eq!(
        cl.pull_filters,
        [
            PullFilter::new(FilterAction::Ignore, "route 10."),
            PullFilter::new(FilterAction::Accept, "route"),
            PullFilter::new(FilterAction::Reject, "redirect-gateway"),
        ]
    );
    let policy = cl.pull_policy();
    assert!(policy.route_nopull && policy.filters.len() == 3 && policy.strict.is_none());
}

#[test]
fn inline_block_keeps_crlf() {
    let cl = client(
        "inline-crlf.conf",
        include_str!("data/config/inline-crlf.conf"),
    )
    .config;
    assert_eq!(
        cl.common.ca,
        Source::Inline(
            "-----BEGIN CERTIFICATE-----\r\nMIIB\r\n-----END CERTIFICATE-----\r\n".into()
        )
    );
    assert_eq!(cl.remotes[0].port, 11940);
}

#[test]
fn any_role_parse_and_role_mismatch() {
    let text = include_str!("data/config/vpn2-server.conf");
    assert!(matches!(
        parse("s.conf", text).unwrap().config,
        Options::Server(_)
    ));
    let e = ClientOptions::parse("s.conf", text).unwrap_err();
    assert_eq!(
        e.reason,
        ErrorReason::RoleMismatch {
            expected: Role::Client,
            found: Role::Server
        }
    );
    let text = include_str!("data/config/vpn2-client-shoot.conf");
    assert!(matches!(
        parse("c.conf", text).unwrap().config,
        Options::Client(_)
    ));
    assert!(ServerOptions::parse("c.conf", text).is_err());
}

#[test]
fn minimal_server_with_ipv4_pool_and_extras() {
    let text = "\
server 10.8.0.0 255.255.255.0
topology subnet
proto tcp-server
dev tun
ca ca.crt
cert server.crt
key server.key
tls-crypt ta.key
push \"route 10.20.0.0 255.255.0.0\"
route 10.20.0.0 255.255.0.0
route-ipv6 2001:db8:20::/48
comp-lzo no
reneg-sec 5
hand-window 30
tls-timeout 4
tran-window 60
reneg-bytes 1000000
reneg-pkts 5000
replay-window 128 30
tls-version-min 1.2 or-highest
data-ciphers-fallback AES-128-CBC
mssfix 1400
sndbuf 393216
rcvbuf 393216
max-clients 10
disable-dco
pull-filter ignore route
explicit-exit-notify 1
";
    let p = ServerOptions::parse("min.conf", text).unwrap();
    let s = &p.config;
    assert_eq!(
        s.server.unwrap().network,
        "10.8.0.0/24".parse::<ipnet::Ipv4Net>().unwrap()
    );
    assert!(!s.server.unwrap().nopool);
    assert_eq!(
        s.common.tls_wrap,
        Some(TlsWrapConfig::Crypt {
            key: path("ta.key")
        })
    );
    assert_eq!(s.push, ["route 10.20.0.0 255.255.0.0"]);
    assert_eq!(
        s.common.routes,
        [Route {
            network: "10.20.0.0/16".parse().unwrap(),
            gateway: None,
            metric: None
        }]
    );
    assert_eq!(
        s.common.routes_ipv6[0].network,
        "2001:db8:20::/48".parse().unwrap()
    );
    assert_eq!(s.common.compression, Compression::LzoStub);
    assert_eq!(s.common.reneg_sec, Some(RenegSec { max: 5, min: None }));
    assert_eq!(s.common.hand_window, Some(30));
    assert_eq!(s.common.tls_timeout, Some(4));
    assert_eq!(s.common.tran_window, Some(60));
    assert_eq!(s.common.reneg_bytes, Some(1_000_000));
    assert_eq!(s.common.reneg_pkts, Some(5000));
    assert_eq!(
        s.common.replay_window,
        Some(ReplayWindow {
            size: 128,
            time: Some(30)
        })
    );
    assert_eq!(
        s.common.tls_version_min,
        Some(TlsVersionMin {
            version: TlsVersion::V1_2,
            or_highest: true
        })
    );
    assert_eq!(s.common.data_ciphers_fallback, Some(DataCipher::Aes128Cbc));
    assert_eq!(s.common.data_ciphers, DataCiphers::default_2_6());
    assert_eq!(s.common.mssfix.unwrap().value, Some(1400));
    assert_eq!(s.common.sndbuf, Some(393_216));
    assert_eq!(s.max_clients, 10);
    assert!(s.common.disable_dco);
    assert_eq!(s.local_ping(), (None, None));
    let kinds: Vec<_> = p.warnings.iter().map(|w| (w.line, w.kind)).collect();
    assert_eq!(
        kinds,
        [
            (27, WarningKind::IgnoredForRole { role: Role::Server }),
            (28, WarningKind::NoEffectOverTcp)
        ]
    );
}
