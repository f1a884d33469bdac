//! The vpn2 environment variables (reference gardener-vpn2.md 1.2): defaults and errors.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use protocol::config::env::*;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

const STATUS: (&str, &str) = ("OPENVPN_STATUS_PATH", "/srv/status/openvpn.status");

#[test]
fn server_defaults() {
    let e = Vpn2ServerEnv::parse([STATUS]).unwrap();
    assert_eq!(e.shoot_service_networks, nets(&["100.64.0.0/13"]));
    assert_eq!(e.shoot_pod_networks, nets(&["100.96.0.0/11"]));
    assert!(e.shoot_node_networks.is_empty());
    assert_eq!(e.vpn_network, "fd8f:6d53:b97a:1::/96".parse().unwrap());
    assert_eq!(e.seed_pod_network, None);
    assert_eq!(e.status_path, PathBuf::from("/srv/status/openvpn.status"));
    assert!(!e.is_ha && !e.auto_mtu);
    assert_eq!(e.ha_vpn_clients, 0);
    assert_eq!(e.local_node_ip, "255.255.255.255");
    assert_eq!(e.server_index, None);
    assert_eq!(e.device(), "tun0");
    assert_eq!(e.server_ipv6_network(), e.vpn_network);
    assert_eq!(
        e.shoot_networks(),
        nets(&["100.64.0.0/13", "100.96.0.0/11"])
    );
}

#[test]
fn server_values_and_empty_means_default() {
    let e = Vpn2ServerEnv::parse([
        STATUS,
        ("SHOOT_SERVICE_NETWORKS", "10.0.0.0/24,fd00:10::/112"),
        ("SHOOT_POD_NETWORKS", ""),
        ("SHOOT_NODE_NETWORKS", "10.250.0.0/16, 2001:db8::/64"),
        ("SEED_POD_NETWORK", "10.1.0.0/16"),
        ("VPN_NETWORK", "fd00:1:2:3::/96"),
        ("IP_FAMILIES", "IPv6"),
        ("OPENVPN_AUTO_MTU", "true"),
    ])
    .unwrap();
    assert_eq!(
        e.shoot_service_networks,
        nets(&["10.0.0.0/24", "fd00:10::/112"])
    );
    assert_eq!(e.shoot_pod_networks, nets(&["100.96.0.0/11"]));
    assert_eq!(
        e.shoot_node_networks,
        nets(&["10.250.0.0/16", "2001:db8::/64"])
    );
    assert_eq!(e.seed_pod_network, Some("10.1.0.0/16".parse().unwrap()));
    assert_eq!(e.vpn_network, "fd00:1:2:3::/96".parse().unwrap());
    assert!(e.auto_mtu);
}

#[test]
fn server_ha() {
    let e = Vpn2ServerEnv::parse([
        STATUS,
        ("IS_HA", "true"),
        ("POD_NAME", "vpn-seed-server-1"),
        ("HA_VPN_CLIENTS", "2"),
    ])
    .unwrap();
    assert_eq!(e.server_index, Some(1));
    assert_eq!(e.device(), "tap0");
    assert_eq!(
        e.server_ipv6_network(),
        "fd8f:6d53:b97a:1::101:0/112".parse().unwrap()
    );
    let err = Vpn2ServerEnv::parse([STATUS, ("IS_HA", "true"), ("HA_VPN_CLIENTS", "2")]);
    assert_eq!(
        err,
        Err(EnvError::HaNeeds {
            variable: "POD_NAME"
        })
    );
    let err = Vpn2ServerEnv::parse([
        STATUS,
        ("IS_HA", "true"),
        ("POD_NAME", "vpn-seed-server-7"),
        ("HA_VPN_CLIENTS", "2"),
    ]);
    assert_eq!(
        err,
        Err(EnvError::HaNeeds {
            variable: "POD_NAME"
        })
    );
    let err = Vpn2ServerEnv::parse([STATUS, ("IS_HA", "1"), ("POD_NAME", "vpn-seed-server-0")]);
    assert_eq!(
        err,
        Err(EnvError::HaNeeds {
            variable: "HA_VPN_CLIENTS"
        })
    );
    // vpn2: an HA server's pod name without IS_HA is a mismatch, refused; a Deployment's
    // pod name (random suffix) or one ending in two digits is not an HA name.
    for name in ["vpn-seed-server-0", "vpn-seed-server-2"] {
        for is_ha in [None, Some("false")] {
            let mut vars = vec![STATUS, ("POD_NAME", name)];
            vars.extend(is_ha.map(|v| ("IS_HA", v)));
            let err = Vpn2ServerEnv::parse(vars).unwrap_err();
            assert_eq!(
                err,
                EnvError::HaPodName {
                    value: name.to_owned()
                }
            );
            assert!(err.to_string().contains(name), "{err}");
        }
    }
    for name in [
        "vpn-seed-server-7d9f8c5b4-x2k9p",
        "vpn-seed-server-12",
        "vpn-seed-server-3",
        "vpn-seed-server",
    ] {
        let e = Vpn2ServerEnv::parse([STATUS, ("POD_NAME", name)]).unwrap();
        assert_eq!(e.server_index, None, "{name}");
    }
    let err = Vpn2ServerEnv::parse([
        STATUS,
        ("IS_HA", "true"),
        ("POD_NAME", "vpn-seed-server-01"),
        ("HA_VPN_CLIENTS", "2"),
    ]);
    assert_eq!(
        err,
        Err(EnvError::HaNeeds {
            variable: "POD_NAME"
        })
    );
}

#[test]
fn server_errors_name_the_variable() {
    assert_eq!(
        Vpn2ServerEnv::parse::<_, &str, &str>([]),
        Err(EnvError::Missing {
            variable: "OPENVPN_STATUS_PATH"
        })
    );
    let e = Vpn2ServerEnv::parse([STATUS, ("VPN_NETWORK", "fd00::/64")]).unwrap_err();
    assert_eq!(
        e,
        EnvError::VpnNetwork {
            value: "fd00::/64".into()
        }
    );
    assert!(e.to_string().starts_with("VPN_NETWORK="), "{e}");
    let e = Vpn2ServerEnv::parse([STATUS, ("VPN_NETWORK", "10.0.0.0/8")]).unwrap_err();
    assert!(matches!(e, EnvError::VpnNetwork { .. }));
    let e =
        Vpn2ServerEnv::parse([STATUS, ("SHOOT_POD_NETWORKS", "100.96.0.0/11,nope")]).unwrap_err();
    assert_eq!(
        e,
        EnvError::Invalid {
            variable: "SHOOT_POD_NETWORKS",
            value: "nope".into(),
            expected: "a CIDR such as 10.0.0.0/8 or fd00::/64"
        }
    );
    let e = Vpn2ServerEnv::parse([STATUS, ("IS_HA", "yes")]).unwrap_err();
    assert!(matches!(
        e,
        EnvError::Invalid {
            variable: "IS_HA",
            ..
        }
    ));
}

#[test]
fn client_defaults() {
    let e = Vpn2ClientEnv::parse::<_, &str, &str>([]).unwrap();
    assert_eq!(
        e.ip_families,
        IpFamilies {
            primary: IpFamily::V4,
            secondary: None
        }
    );
    assert_eq!(e.ip_families.client_proto(), "tcp4-client");
    assert_eq!(e.endpoint, None);
    assert_eq!(e.openvpn_port, 8132);
    assert_eq!(e.vpn_network, "fd8f:6d53:b97a:1::/96".parse().unwrap());
    assert!(e.shoot_pod_networks.is_empty() && e.shoot_service_networks.is_empty());
    assert!(!e.is_shoot_client && !e.is_ha);
    assert_eq!(e.reversed_vpn_header, "invalid-host");
    assert_eq!(e.reversed_vpn_header_key, "Reversed-VPN");
    assert_eq!(e.pod_label_selector, "app=kubernetes,role=apiserver");
    assert_eq!(e.wait_time, Duration::from_secs(2));
    assert_eq!(e.bonding_mode, BondingMode::ActiveBackup);
    assert_eq!(e.client_index, None);
}

#[test]
fn client_gardener_values() {
    let e = Vpn2ClientEnv::parse([
        ("IP_FAMILIES", "IPv6,IPv4"),
        ("ENDPOINT", "api.demo.proj.example.com"),
        ("OPENVPN_PORT", "8443"),
        (
            "REVERSED_VPN_HEADER",
            "outbound|1194||vpn-seed-server-1.shoot--proj--demo.svc.cluster.local",
        ),
        ("REVERSED_VPN_HEADER_KEY", "X-Gardener-Destination"),
        ("IS_SHOOT_CLIENT", "true"),
        ("POD_NAME", "vpn-shoot-1"),
        ("VPN_SERVER_INDEX", "1"),
        ("IS_HA", "true"),
        ("HA_VPN_CLIENTS", "2"),
        ("HA_VPN_SERVERS", "2"),
        ("SEED_POD_NETWORK", "10.1.0.0/16"),
        ("WAIT_TIME", "1m30s"),
        ("BONDING_MODE", "balance-rr"),
    ])
    .unwrap();
    assert_eq!(
        e.ip_families,
        IpFamilies {
            primary: IpFamily::V6,
            secondary: Some(IpFamily::V4)
        }
    );
    assert_eq!(e.ip_families.client_proto(), "tcp-client");
    assert_eq!(e.endpoint.as_deref(), Some("api.demo.proj.example.com"));
    assert_eq!(e.openvpn_port, 8443);
    assert_eq!(e.reversed_vpn_header_key, "X-Gardener-Destination");
    assert!(e.is_shoot_client && e.is_ha);
    assert_eq!(e.client_index, Some(1));
    assert_eq!(e.vpn_server_index, Some(1));
    assert_eq!((e.ha_vpn_clients, e.ha_vpn_servers), (2, 2));
    assert_eq!(e.wait_time, Duration::from_secs(90));
    assert_eq!(e.bonding_mode, BondingMode::BalanceRr);
    let e = Vpn2ClientEnv::parse([("WAIT_TIME", "500ms"), ("POD_NAME", "vpn-shoot-abc")]).unwrap();
    assert_eq!(e.wait_time, Duration::from_millis(500));
    assert_eq!(e.client_index, None);
}

#[test]
fn client_errors_name_the_variable() {
    for (var, value) in [
        ("IP_FAMILIES", "IPv5"),
        ("IP_FAMILIES", "IPv4,IPv4"),
        ("IP_FAMILIES", "IPv4,IPv6,IPv4"),
        ("OPENVPN_PORT", "0"),
        ("OPENVPN_PORT", "http"),
        ("WAIT_TIME", "2 seconds"),
        ("BONDING_MODE", "802.3ad"),
        ("IS_SHOOT_CLIENT", "maybe"),
        ("SEED_POD_NETWORK", "10.1.0.0"),
    ] {
        match Vpn2ClientEnv::parse([(var, value)]) {
            Err(EnvError::Invalid {
                variable, value: v, ..
            }) => {
                assert_eq!((variable, v.as_str()), (var, value));
            }
            other => panic!("{var}={value}: {other:?}"),
        }
    }
    assert_eq!(
        Vpn2ClientEnv::parse([("HA_VPN_CLIENTS", "2")]),
        Err(EnvError::Missing {
            variable: "HA_VPN_SERVERS"
        })
    );
    assert!(matches!(
        Vpn2ClientEnv::parse([("VPN_NETWORK", "fd00::/112")]),
        Err(EnvError::VpnNetwork { .. })
    ));
}
