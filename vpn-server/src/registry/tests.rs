//! Admission without root, a tun device or a socket: `max-clients`, pool exhaustion,
//! `duplicate-cn`, client-config-dir entries (`disable`, `ifconfig-push`, `iroute`, `push`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use openssl::ssl::{SslContext, SslMethod};
use protocol::km2::peer_info::PeerInfo;
use protocol::session::ControlProtection;
use protocol::tls::AcceptAnyPeer;

use super::*;
use crate::settings::IfconfigPush;

fn settings(pool: &str) -> Settings {
    let tls = SslContext::builder(SslMethod::tls())
        .expect("ssl context")
        .build();
    let mut s = Settings::new(tls, Arc::new(AcceptAnyPeer), ControlProtection::None);
    s.pool_v4 = Some(Ipv4Net::from_str(pool).expect("pool"));
    s
}

fn registry(s: &Settings) -> Registry {
    Registry::new(Some(Pool::new(s.pool_v4, s.pool_v6).expect("pool")))
}

fn identity(cn: &str) -> ClientIdentity {
    ClientIdentity {
        common_name: Some(cn.into()),
        certificate_der: None,
        username: None,
        password: None,
        peer_info: PeerInfo::default(),
        options: String::new(),
    }
}

fn conn(port: u16) -> ConnHandle {
    let (tx, _rx) = mpsc::channel(1);
    ConnHandle {
        peer: SocketAddr::from(([192, 0, 2, 1], port)),
        peer_id: u32::from(port),
        tx,
        kicked: CancellationToken::new(),
        traffic: Arc::default(),
    }
}

fn admit(reg: &mut Registry, s: &Settings, id: ClientId, cn: &str) -> Result<Admitted, Refused> {
    reg.admit(s, id, &identity(cn), conn(1000 + id as u16), 1_700_000_000)
}

fn v4(reg: &Registry, id: ClientId) -> Option<Ipv4Addr> {
    reg.get(id).and_then(|c| c.v4)
}

#[test]
fn max_clients_counts_open_connections() {
    let slots = Slots::new(2);
    let a = slots.take().expect("first");
    let _b = slots.take().expect("second");
    assert!(matches!(slots.take(), Err(Refused::MaxClients { max: 2 })));
    drop(a);
    assert!(slots.take().is_ok(), "a closed connection frees its slot");
    assert_eq!(
        Refused::MaxClients { max: 2 }.to_string(),
        "2 connections open (max-clients)"
    );
}

#[test]
fn an_exhausted_pool_refuses_and_never_reuses_a_live_address() {
    // /29: server .1, clients .2 ..= .6 (five).
    let s = settings("10.8.0.0/29");
    let mut reg = registry(&s);
    for id in 0..5 {
        let admitted = admit(&mut reg, &s, id, &format!("c{id}")).expect("admitted");
        let want = Ipv4Addr::new(10, 8, 0, 2 + id as u8);
        assert_eq!(v4(&reg, id), Some(want));
        assert_eq!(
            admitted.settings.ifconfig.as_deref(),
            Some(format!("{want} 255.255.255.248").as_str())
        );
    }
    let refused = admit(&mut reg, &s, 5, "c5").expect_err("pool is full");
    assert!(matches!(refused, Refused::PoolExhausted { .. }));
    // The reason the client gets with AUTH_FAILED; the pool's detail is the source.
    assert_eq!(refused.to_string(), "no address available");
    assert!(std::error::Error::source(&refused).is_some());
    assert_eq!(reg.len(), 5);
    // A client leaves: its address is free again, and only then.
    reg.remove(2).expect("was admitted");
    admit(&mut reg, &s, 6, "c6").expect("admitted after a leave");
    assert_eq!(v4(&reg, 6), Some(Ipv4Addr::new(10, 8, 0, 4)));
    let live: Vec<_> = (0..7).filter_map(|id| v4(&reg, id)).collect();
    let mut unique = live.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(live.len(), unique.len(), "an address handed out twice");
}

#[test]
fn without_duplicate_cn_a_new_connection_replaces_the_old_one() {
    let s = settings("10.8.0.0/24");
    let mut reg = registry(&s);
    let old = conn(1);
    let kicked = old.kicked.clone();
    reg.admit(&s, 1, &identity("shoot"), old, 1).expect("first");
    let first = v4(&reg, 1);
    reg.admit(&s, 2, &identity("shoot"), conn(2), 2)
        .expect("second");
    assert!(kicked.is_cancelled(), "the older connection is told to go");
    assert!(reg.get(1).is_none());
    assert_eq!(reg.len(), 1);
    // The CN keeps its address.
    assert_eq!(v4(&reg, 2), first);
    assert_eq!(
        reg.route(IpAddr::V4(first.unwrap()))
            .map(|c| c.conn.peer_id),
        Some(2)
    );
}

#[test]
fn with_duplicate_cn_both_stay_with_their_own_addresses() {
    let mut s = settings("10.8.0.0/24");
    s.duplicate_cn = true;
    let mut reg = registry(&s);
    let first = conn(1);
    let kicked = first.kicked.clone();
    reg.admit(&s, 1, &identity("seed"), first, 1)
        .expect("first");
    reg.admit(&s, 2, &identity("seed"), conn(2), 2)
        .expect("second");
    assert!(!kicked.is_cancelled());
    assert_eq!(reg.len(), 2);
    assert_ne!(v4(&reg, 1), v4(&reg, 2));
}

#[test]
fn a_ccd_entry_disables_fixes_the_address_and_adds_iroutes_and_pushes() {
    let mut s = settings("10.8.0.0/24");
    let iroute = IpNet::from_str("100.96.0.0/11").unwrap();
    s.clients.insert(
        "vpn-shoot-client".into(),
        ClientOptions {
            iroutes: vec![iroute],
            ifconfig_push: Some(IfconfigPush {
                local: Ipv4Addr::new(10, 8, 0, 100),
                remote_netmask: Ipv4Addr::new(255, 255, 255, 0),
            }),
            push: vec!["route 10.0.0.0 255.0.0.0".into()],
            ..ClientOptions::default()
        },
    );
    s.clients.insert(
        "blocked".into(),
        ClientOptions {
            disable: true,
            ..ClientOptions::default()
        },
    );
    let mut reg = registry(&s);
    assert!(matches!(
        admit(&mut reg, &s, 1, "blocked"),
        Err(Refused::Disabled)
    ));
    assert!(reg.is_empty());

    let admitted = admit(&mut reg, &s, 2, "vpn-shoot-client").expect("admitted");
    assert_eq!(v4(&reg, 2), Some(Ipv4Addr::new(10, 8, 0, 100)));
    assert_eq!(
        admitted.settings.ifconfig.as_deref(),
        Some("10.8.0.100 255.255.255.0")
    );
    assert!(admitted
        .settings
        .push
        .iter()
        .any(|p| p == "route 10.0.0.0 255.0.0.0"));
    // Packets to the iroute go to this client, and it may send from there.
    let pod: IpAddr = "100.100.1.1".parse().unwrap();
    assert_eq!(reg.route(pod).map(|c| c.conn.peer_id), Some(1002));
    assert!(admitted.filter.allows(pod));
    assert!(!admitted.filter.allows("100.128.0.1".parse().unwrap()));

    // The fixed address is taken: another CN with the same entry (DEFAULT) is refused.
    s.default_client = s.clients.get("vpn-shoot-client").cloned();
    let refused = admit(&mut reg, &s, 3, "other").expect_err("address taken");
    assert!(
        matches!(refused, Refused::FixedAddress(PoolError::InUse { .. })),
        "{refused:?}"
    );

    // Leaving frees the fixed address and the iroute.
    reg.remove(2).expect("admitted");
    assert!(reg.route(pod).is_none());
    admit(&mut reg, &s, 4, "other").expect("free again");
}

#[test]
fn a_fixed_address_outside_the_pool_is_refused_while_in_use() {
    let mut s = settings("10.8.0.0/24");
    s.default_client = Some(ClientOptions {
        ifconfig_push: Some(IfconfigPush {
            local: Ipv4Addr::new(172, 16, 0, 9),
            remote_netmask: Ipv4Addr::new(255, 255, 255, 0),
        }),
        ..ClientOptions::default()
    });
    s.duplicate_cn = true;
    let mut reg = registry(&s);
    admit(&mut reg, &s, 1, "a").expect("first");
    let refused = admit(&mut reg, &s, 2, "b").expect_err("in use");
    assert_eq!(refused.to_string(), "address 172.16.0.9 in use");
}

#[test]
fn the_ipv6_pool_comes_with_the_ipv4_lease() {
    let mut s = settings("10.8.0.0/24");
    s.pool_v6 = Some("fd8f:6d53:b97a:1::/96".parse().unwrap());
    let mut reg = registry(&s);
    let admitted = admit(&mut reg, &s, 1, "c").expect("admitted");
    let v6 = reg.get(1).and_then(|c| c.v6).expect("an IPv6 address");
    assert_eq!(v6, "fd8f:6d53:b97a:1::1000".parse::<Ipv6Addr>().unwrap());
    assert_eq!(
        admitted.settings.ifconfig_ipv6.as_deref(),
        Some("fd8f:6d53:b97a:1::1000/96 fd8f:6d53:b97a:1::1")
    );
}

#[test]
fn the_status_shows_clients_and_routes() {
    let s = settings("10.8.0.0/24");
    let mut reg = registry(&s);
    admit(&mut reg, &s, 7, "vpn-shoot-client").expect("admitted");
    reg.established(7, "AES-256-GCM", 1_700_000_100);
    let status = reg.status(1_700_000_200);
    assert_eq!(status.clients.len(), 1);
    let c = &status.clients[0];
    assert_eq!(
        (
            c.common_name.as_str(),
            c.client_id,
            c.cipher.as_str(),
            c.connected_since
        ),
        ("vpn-shoot-client", 7, "AES-256-GCM", 1_700_000_100)
    );
    assert_eq!(status.routes.len(), 1);
    assert_eq!(
        status.routes[0].prefix,
        IpNet::from_str("10.8.0.2/32").unwrap()
    );
}
