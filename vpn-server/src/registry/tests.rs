//! Admission without root, a tun device or a socket: `max-clients`, pool exhaustion,
//! `duplicate-cn`, client-config-dir entries (`disable`, `ifconfig-push`, `iroute`, `push`);
//! before authentication (`admission`): the first packet, the deadlines on a virtual clock,
//! the pending bound beside `max-clients`, the log limits.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use openssl::ssl::{SslContext, SslMethod};
use protocol::km2::peer_info::PeerInfo;
use protocol::push::PushedOption;
use protocol::session::ControlProtection;
use protocol::tls::AcceptAnyPeer;

use super::*;
use crate::registry::hold::HoldLimits;
use crate::settings::IfconfigPush;

fn settings(pool: &str) -> Settings {
    let tls = SslContext::builder(SslMethod::tls())
        .expect("ssl context")
        .build();
    let mut s = Settings::new(tls, Arc::new(AcceptAnyPeer), ControlProtection::None);
    s.pool_v4 = Some(Ipv4Net::from_str(pool).expect("pool"));
    s
}

/// The arguments of the pushed `ifconfig`, as the client reads them.
fn ifconfig_args(settings: &ClientSettings) -> Option<String> {
    let (local, remote_netmask) = settings.ifconfig?;
    let option = PushedOption::Ifconfig {
        local,
        remote_netmask,
    };
    Some(option.to_string().strip_prefix("ifconfig ")?.to_owned())
}

/// The arguments of the pushed `ifconfig-ipv6`, as the client reads them.
fn ifconfig_ipv6_args(settings: &ClientSettings) -> Option<String> {
    let (local, remote) = settings.ifconfig_ipv6?;
    let option = PushedOption::IfconfigIpv6 { local, remote };
    Some(
        option
            .to_string()
            .strip_prefix("ifconfig-ipv6 ")?
            .to_owned(),
    )
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
        peer_info_ignored: Vec::new(),
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
fn max_clients_counts_authenticated_clients() {
    let slots = Slots::new(2);
    let a = slots.take().expect("first");
    assert!(!slots.is_full());
    let _b = slots.take().expect("second");
    assert!(slots.is_full(), "new connections are closed at accept now");
    assert!(matches!(slots.take(), Err(Refused::MaxClients { max: 2 })));
    drop(a);
    assert!(!slots.is_full());
    assert!(slots.take().is_ok(), "a closed connection frees its slot");
    assert_eq!(
        Refused::MaxClients { max: 2 }.to_string(),
        "2 clients connected (max-clients)"
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
            ifconfig_args(&admitted.settings).as_deref(),
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
        ifconfig_args(&admitted.settings).as_deref(),
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
        ifconfig_ipv6_args(&admitted.settings).as_deref(),
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

#[test]
fn a_common_name_that_is_no_identity_is_refused_and_never_reaches_the_status() {
    let s = settings("10.8.0.0/24");
    let mut reg = registry(&s);
    for cn in [
        "evil\nCLIENT_LIST,vpn-shoot-client,1.2.3.4:1",
        "a,b",
        "esc\u{1b}]0;x\u{7}",
        "with space",
        "..",
    ] {
        let refused = admit(&mut reg, &s, 1, cn).expect_err(cn);
        assert!(
            matches!(&refused, Refused::InvalidCommonName { cn: c } if c == cn),
            "{refused:?}"
        );
        let text = refused.to_string();
        assert!(!text.chars().any(char::is_control), "{text:?}");
    }
    assert!(reg.status(1_700_000_200).clients.is_empty());
    assert_eq!(v4(&reg, 1), None);
    // Every character an identity may have.
    admit(&mut reg, &s, 2, "vpn-shoot_client.0@seed").expect("admitted");
}

mod pre_auth {
    use std::time::{Duration, Instant};

    use netio::listen::PendingSet;
    use protocol::digest::Digest;
    use protocol::framing::FrameDecoder;
    use protocol::key::KeyDirection;
    use protocol::session::{
        ClientConfig, ClientSession, ServerConfig, ServerEndpoint, SessionConfig, SessionError,
    };

    use super::super::admission::{
        check_first_opcode, first_packet, BogusFirstPacket, Deadlines, Expired, PreAuthEvent,
        PreAuthLogs,
    };
    use super::*;

    const FIRST: Duration = Duration::from_secs(5);
    const HAND: Duration = Duration::from_secs(60);

    #[test]
    fn the_first_packet_deadline_comes_first_and_goes_with_the_packet() {
        // A virtual clock: instants computed from one origin, nothing sleeps.
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, FIRST, HAND);
        assert!(d.awaiting_first_packet());
        assert_eq!(d.next(), Some(t0 + FIRST));
        assert_eq!(d.expired(t0 + FIRST - Duration::from_millis(1)), None);
        assert_eq!(d.expired(t0 + FIRST), Some(Expired::FirstPacket(FIRST)));
        // Both passed: the first packet's is the one reported.
        assert_eq!(d.expired(t0 + HAND), Some(Expired::FirstPacket(FIRST)));

        // The packet came at 1 s: only the handshake deadline is left.
        d.first_packet_arrived();
        assert!(!d.awaiting_first_packet());
        assert_eq!(d.next(), Some(t0 + HAND));
        assert_eq!(d.expired(t0 + FIRST), None);
        assert_eq!(d.expired(t0 + HAND), Some(Expired::Handshake(HAND)));

        // The tunnel is up: no deadline.
        d.established();
        assert_eq!(d.next(), None);
        assert_eq!(d.expired(t0 + 10 * HAND), None);

        // A hand-window shorter than the first-packet deadline bounds the wait too.
        let short = Deadlines::new(t0, FIRST, Duration::from_secs(3));
        assert_eq!(short.next(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(
            short.expired(t0 + Duration::from_secs(3)),
            Some(Expired::Handshake(Duration::from_secs(3)))
        );
    }

    #[test]
    fn only_a_client_hard_reset_may_open_a_connection() {
        for ok in [0x38u8, 0x3f, 0x50] {
            assert!(check_first_opcode(&[ok, 1, 2]).is_ok(), "{ok:#x}");
        }
        // Server reset, control, ACK, data v1/v2, key-method 1, unknown, empty.
        for (bytes, opcode) in [
            (&[0x40u8][..], 8),
            (&[0x20], 4),
            (&[0x28], 5),
            (&[0x30], 6),
            (&[0x48, 0, 0, 1], 9),
            (&[0x08], 1),
            (&[0xf8], 31),
            (&[], 0),
        ] {
            match check_first_opcode(bytes) {
                Err(BogusFirstPacket::NotHardReset { opcode: got }) => assert_eq!(got, opcode),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }

    fn tls_auth(key: &protocol::key::Key2, direction: KeyDirection) -> ControlProtection {
        ControlProtection::TlsAuth {
            key: key.clone(),
            direction,
            digest: Digest::Sha1,
        }
    }

    /// A client's first frame (the hard reset), without its length prefix.
    fn client_reset(protection: ControlProtection, now: Instant) -> BytesMut {
        let tls = SslContext::builder(SslMethod::tls()).expect("ssl").build();
        let config = ClientConfig::new(SessionConfig::new(tls, protection));
        let mut client = ClientSession::new(config, netio::rng::session_rng(), now);
        let mut out = client
            .poll_transmit(now, 1_700_000_000)
            .expect("hard reset");
        FrameDecoder::new()
            .decode(&mut out)
            .expect("framed")
            .expect("one packet")
    }

    #[test]
    fn the_session_verifies_the_first_packets_tls_auth_hmac() {
        let now = Instant::now();
        let key = protocol::static_key::generate(&mut rand_core::OsRng);
        let other = protocol::static_key::generate(&mut rand_core::OsRng);
        let tls = SslContext::builder(SslMethod::tls()).expect("ssl").build();
        let mut endpoint = ServerEndpoint::new(ServerConfig::new(SessionConfig::new(
            tls,
            tls_auth(&key, KeyDirection::Normal),
        )));
        let mut session = || endpoint.new_session(netio::rng::session_rng(), now);

        let good = client_reset(tls_auth(&key, KeyDirection::Inverse), now);
        first_packet(&mut session(), now, good.clone()).expect("a real client's reset");

        // Another key: the HMAC fails.
        let forged = client_reset(tls_auth(&other, KeyDirection::Inverse), now);
        assert!(matches!(
            first_packet(&mut session(), now, forged),
            Err(BogusFirstPacket::Refused(SessionError::Link(_)))
        ));
        // The right opcode, one flipped bit in the HMAC.
        let mut flipped = good.clone();
        flipped[10] ^= 1;
        assert!(matches!(
            first_packet(&mut session(), now, flipped),
            Err(BogusFirstPacket::Refused(_))
        ));
        // Too short to be a packet.
        assert!(matches!(
            first_packet(&mut session(), now, BytesMut::from(&good[..1])),
            Err(BogusFirstPacket::Refused(_))
        ));
        // A reset without tls-auth.
        let plain = client_reset(ControlProtection::None, now);
        assert!(first_packet(&mut session(), now, plain).is_err());
    }

    #[test]
    fn pending_connections_never_take_an_authenticated_clients_slot() {
        // max-clients 1, two pending places.
        let slots = Slots::new(1);
        let pending = PendingSet::new(2);
        // The client: accepted, proves itself with its hard reset, authenticates.
        let client = pending.admit().guard;
        client.prove();
        let slot = slots.take().expect("the client's slot");
        drop(client);
        assert!(pending.is_empty());
        // A flood of silent or bogus connections: each evicts an older one of its own kind,
        // never the client, whose slot is not a pending place.
        let mut flood = Vec::new();
        for i in 0..1000 {
            let a = pending.admit();
            assert_eq!(a.evicted.is_some(), i >= 2);
            assert!(a.evicted.is_none_or(|e| !e.proven));
            flood.push(a.guard);
        }
        assert_eq!(pending.len(), 2);
        assert_eq!(flood.iter().filter(|g| !g.is_evicted()).count(), 2);
        assert!(slots.is_full(), "the client still holds its slot");
        drop(slot);
        assert!(!slots.is_full());
    }

    #[test]
    fn a_proven_handshake_survives_a_flood_of_unproven_connections() {
        let pending = PendingSet::new(3);
        let idle = pending.admit().guard;
        let real = pending.admit().guard;
        real.prove();
        let mut flood = Vec::new();
        for _ in 0..500 {
            flood.push(pending.admit().guard);
            assert!(!real.is_evicted());
        }
        assert!(idle.is_evicted(), "the oldest unproven one went first");
        let live: Vec<_> = flood.iter().filter(|g| !g.is_evicted()).collect();
        assert_eq!(live.len(), 2, "the newest two of the flood");
        // Only when every place is proven does the oldest proven one go.
        for g in live {
            g.prove();
        }
        let newcomer = pending.admit();
        assert_eq!(
            newcomer.evicted.map(|e| (e.seq, e.proven)),
            Some((real.seq(), true))
        );
    }

    #[test]
    fn each_kind_of_pre_auth_event_logs_once_a_second() {
        let t0 = Instant::now();
        let mut logs = PreAuthLogs::default();
        assert_eq!(logs.allow(PreAuthEvent::BadFirstPacket, t0), Some(0));
        for _ in 0..999 {
            assert_eq!(logs.allow(PreAuthEvent::BadFirstPacket, t0), None);
        }
        // Another kind is not hidden by the flood of the first.
        assert_eq!(logs.allow(PreAuthEvent::Evicted, t0), Some(0));
        assert_eq!(logs.allow(PreAuthEvent::NoFirstPacket, t0), Some(0));
        assert_eq!(logs.allow(PreAuthEvent::MaxClients, t0), Some(0));
        assert_eq!(
            logs.allow(PreAuthEvent::BadFirstPacket, t0 + Duration::from_secs(1)),
            Some(999)
        );
    }
}

/// The username a client sends is never verified here (no `auth-user-pass-verify`), so it is
/// not shown: the status file says UNDEF for it, as upstream's does.
#[test]
fn an_unverified_username_never_reaches_the_status_file() {
    let s = settings("192.168.123.0/24");
    let mut reg = registry(&s);
    let mut who = identity("vpn-shoot-client");
    who.username = Some(b"x\nTIME,2000-01-01 00:00:00,946684800".to_vec());
    reg.admit(&s, 1, &who, conn(1001), 1_700_000_000)
        .expect("admitted");
    let snapshot = reg.status(1_700_000_001);
    assert_eq!(snapshot.clients.len(), 1);
    assert_eq!(snapshot.clients[0].username, None);
    let text = crate::status::render(&snapshot);
    assert!(!text.contains("TIME,2000"), "{text}");
}

/// An ARP request from `src` (broadcast destination).
fn arp_from(src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06]);
    f.resize(42, 0);
    f
}

#[test]
fn tap_mode_switches_by_learned_mac_addresses_and_keeps_no_ip_routes() {
    let mut s = settings("10.8.0.0/24");
    s.default_client = Some(ClientOptions {
        iroutes: vec![IpNet::from_str("10.99.0.0/16").unwrap()],
        ..ClientOptions::default()
    });
    let mut reg = Registry::tap(Some(Pool::new(s.pool_v4, None).expect("pool")), 4);
    let a = admit(&mut reg, &s, 1, "a").expect("a");
    admit(&mut reg, &s, 2, "b").expect("b");
    assert_eq!(
        ifconfig_args(&a.settings).as_deref(),
        Some("10.8.0.2 255.255.255.0")
    );
    // No host routes, no iroutes: nothing is routed by IP.
    assert!(reg.route("10.8.0.2".parse().unwrap()).is_none());
    assert!(reg.route("10.99.0.1".parse().unwrap()).is_none());
    // Only clients with their tunnel up get flooded frames.
    reg.established(2, "AES-256-GCM", 1_700_000_100);
    let (mac_a, mac_b) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    assert!(matches!(
        reg.switch_from_client(1, &arp_from(mac_a), true, 1_700_000_101),
        Some(FromClient::Flood)
    ));
    let targets: Vec<&str> = reg
        .flood_targets(Some(1))
        .map(|c| c.common_name.as_str())
        .collect();
    assert_eq!(targets, ["b"]);
    reg.switch_from_client(2, &arp_from(mac_b), true, 1_700_000_102);
    let mut to_a = mac_a.to_vec();
    to_a.extend_from_slice(&mac_b);
    to_a.resize(60, 0);
    assert!(matches!(
        reg.switch_from_client(2, &to_a, true, 1_700_000_103),
        Some(FromClient::Client(c)) if c.common_name == "a"
    ));
    assert!(matches!(
        reg.switch_from_tap(&to_a),
        Some(FromTap::Client(c)) if c.common_name == "a"
    ));
    let status = reg.status(1_700_000_200);
    assert!(status.routes.is_empty());
    let macs: Vec<(String, &str)> = status
        .mac_routes
        .iter()
        .map(|r| (r.mac.to_string(), r.common_name.as_str()))
        .collect();
    assert_eq!(macs.len(), 2);
    assert!(macs.contains(&("02:00:00:00:00:0a".into(), "a")));
    // A client that leaves takes its addresses along.
    reg.remove(1);
    assert!(matches!(reg.switch_from_tap(&to_a), Some(FromTap::Drop(_))));
    assert_eq!(reg.status(1_700_000_300).mac_routes.len(), 1);
    // Tun mode has no switch.
    assert!(registry(&s).switch_from_tap(&to_a).is_none());
}

/// An IPv4 UDP packet header from `src` to `dst` (the HA switch reads addresses and ports).
fn udp(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    p
}

#[test]
fn ha_admission_learns_the_pod_ip_and_switches_between_the_sides() {
    let mut s = settings("192.168.123.0/24");
    // As `config::from_vpn2_env_ha` makes them: no pool, duplicate-cn.
    s.pool_v4 = None;
    s.duplicate_cn = true;
    s.ha = Some(crate::settings::HaSettings {
        shoot_networks: vec!["100.64.0.0/13".parse().expect("net")],
        transfer_v6: None,
        layer2_v6: None,
        overlap: false,
    });
    let mut reg = Registry::ha(s.ha.as_ref().expect("ha").shoot_networks.clone(), None, 8);
    let apiserver = |port: u16, ip: [u8; 4]| ConnHandle {
        peer: SocketAddr::from((ip, port)),
        ..conn(port)
    };
    let now = 1_700_000_000;
    // A kube-apiserver: nothing assigned, its pod IP (the TCP peer) owned.
    let a = reg
        .admit(
            &s,
            1,
            &identity("vpn-seed-client"),
            apiserver(1, [10, 1, 1, 20]),
            now,
        )
        .expect("seed client");
    assert_eq!(
        (a.settings.ifconfig, a.settings.ifconfig_ipv6),
        (None, None)
    );
    assert!(
        a.settings
            .push
            .iter()
            .all(|p| !p.to_string().starts_with("route")),
        "{:?}",
        a.settings.push
    );
    assert_eq!(v4(&reg, 1), Some(Ipv4Addr::new(10, 1, 1, 20)));
    // Two shoot pods; a second connection for index 0 replaces the first.
    reg.admit(&s, 2, &identity("vpn-shoot-client-0"), conn(2), now)
        .expect("shoot 0");
    reg.admit(&s, 3, &identity("vpn-shoot-client-1"), conn(3), now)
        .expect("shoot 1");
    let kicked = reg.get(2).expect("shoot 0").conn.kicked.clone();
    reg.admit(&s, 4, &identity("vpn-shoot-client-0"), conn(4), now)
        .expect("shoot 0 again");
    assert!(kicked.is_cancelled() && reg.get(2).is_none());
    // Any other name has no place in the layout.
    let refused = reg.admit(&s, 5, &identity("vpn-shoot-client"), conn(5), now);
    assert!(
        matches!(refused, Err(Refused::NotHaClient { .. })),
        "{refused:?}"
    );
    let t = Instant::now();
    let to_shoot = udp([10, 1, 1, 20], [100, 64, 0, 10]);
    assert!(
        matches!(
            reg.switch_ha(1, &to_shoot, t),
            Some(Err(crate::ha::Dropped::NoShoot))
        ),
        "a shoot connection joins the switch when its tunnel is up"
    );
    for id in [3, 4] {
        reg.established(id, "AES-256-GCM", now);
    }
    let target = reg
        .switch_ha(1, &to_shoot, t)
        .expect("HA")
        .map(|c| c.common_name.clone());
    assert_eq!(target.as_deref(), Ok("vpn-shoot-client-0"));
    let back = udp([100, 64, 0, 10], [10, 1, 1, 20]);
    let target = reg
        .switch_ha(4, &back, t)
        .expect("HA")
        .map(|c| c.common_name.clone());
    assert_eq!(target.as_deref(), Ok("vpn-seed-client"));
    // The status file lists one row per connection, as vpn2's tap server learns one MAC
    // address per client: the kube-apiserver by its pod IP, each shoot connection by index.
    let status = reg.status(now);
    let routes: Vec<String> = status
        .routes
        .iter()
        .map(|r| format!("{} {}", r.prefix, r.common_name))
        .collect();
    assert_eq!(routes, ["10.1.1.20/32 vpn-seed-client"]);
    let mut shoots: Vec<String> = status
        .shoot_routes
        .iter()
        .map(|r| format!("{} {}", r.index, r.common_name))
        .collect();
    shoots.sort();
    assert_eq!(shoots, ["0 vpn-shoot-client-0", "1 vpn-shoot-client-1"]);
    // Spoofed source, and the kube-apiserver gone: nothing reaches it any more.
    let spoofed = udp([10, 1, 1, 21], [100, 64, 0, 10]);
    assert!(matches!(
        reg.switch_ha(1, &spoofed, t),
        Some(Err(crate::ha::Dropped::Spoofed))
    ));
    reg.remove(1);
    assert!(matches!(
        reg.switch_ha(4, &back, t),
        Some(Err(crate::ha::Dropped::NotSeed))
    ));
    // The non-HA registry has no switch.
    assert!(Registry::new(None).switch_ha(1, &to_shoot, t).is_none());
}

#[test]
fn a_packet_for_a_reconnecting_client_is_held_and_sent_when_its_tunnel_is_up_again() {
    let mut s = settings("10.8.0.0/24");
    let pod = IpNet::from_str("100.96.0.0/24").expect("net");
    s.clients.insert(
        "shoot".into(),
        ClientOptions {
            iroutes: vec![pod],
            ..ClientOptions::default()
        },
    );
    let bound = Duration::from_secs(2);
    let mut reg = registry(&s).hold_for(bound, HoldLimits::default());
    let mut changes = reg.route_changes();
    let dst: IpAddr = "100.96.0.10".parse().expect("addr");
    let t0 = Instant::now();
    assert!(matches!(
        reg.route_from_device(dst, t0),
        DeviceRoute::Unroutable
    ));
    admit(&mut reg, &s, 1, "shoot").expect("admitted");
    assert!(
        matches!(reg.route_from_device(dst, t0), DeviceRoute::Hold(p) if p == pod),
        "admitted, tunnel not up: held"
    );
    reg.established(1, "AES-256-GCM", 1_700_000_000);
    assert!(
        changes.has_changed().expect("open"),
        "a tunnel up is a change"
    );
    changes.borrow_and_update();
    assert!(matches!(
        reg.route_from_device(dst, t0),
        DeviceRoute::Client(_)
    ));
    reg.remove(1).expect("removed");
    let now = Instant::now();
    let DeviceRoute::Hold(prefix) = reg.route_from_device(dst, now) else {
        panic!("a route that left just now is held");
    };
    assert_eq!(prefix, pod);
    reg.hold_packet(prefix, dst, BytesMut::from(&b"syn"[..]), now)
        .expect("held");
    assert!(
        matches!(
            reg.route_from_device("100.97.0.1".parse().expect("addr"), now),
            DeviceRoute::Unroutable
        ),
        "never routed: not held"
    );
    assert!(matches!(
        reg.route_from_device(dst, now + bound),
        DeviceRoute::Unroutable
    ));
    // The client comes back: its tunnel up sends the held packet, first in its queue.
    let (tx, mut rx) = mpsc::channel(4);
    let handle = ConnHandle { tx, ..conn(2000) };
    reg.admit(&s, 2, &identity("shoot"), handle, 1_700_000_001)
        .expect("admitted again");
    assert!(rx.try_recv().is_err(), "not before its tunnel is up");
    reg.established(2, "AES-256-GCM", 1_700_000_001);
    assert_eq!(&rx.try_recv().expect("released")[..], b"syn");
    let c = reg.hold_counts();
    assert_eq!((c.packets, c.held, c.released, c.expired), (0, 1, 1, 0));
    assert!(changes.has_changed().expect("open"));
}

/// An HA registry over 100.64.0.0/13 holding for `bound` within `limits`, started at `t0`,
/// with the kube-apiserver 10.1.1.20 connected (id 1, tunnel up).
fn ha_registry(bound: Duration, limits: HoldLimits, t0: Instant) -> (Settings, Registry) {
    let mut s = settings("192.168.123.0/24");
    s.pool_v4 = None;
    s.duplicate_cn = true;
    let nets: Vec<IpNet> = vec!["100.64.0.0/13".parse().expect("net")];
    s.ha = Some(crate::settings::HaSettings {
        shoot_networks: nets.clone(),
        transfer_v6: None,
        layer2_v6: None,
        overlap: false,
    });
    let mut reg = Registry::ha(nets.clone(), None, 8)
        .hold_for(bound, limits)
        .expecting(nets, t0);
    let seed = ConnHandle {
        peer: SocketAddr::from(([10, 1, 1, 20], 1)),
        ..conn(1)
    };
    reg.admit(&s, 1, &identity("vpn-seed-client"), seed, 1_700_000_000)
        .expect("seed client");
    reg.established(1, "AES-256-GCM", 1_700_000_000);
    (s, reg)
}

/// `ip` laid out as a connection's queue takes it.
fn laid_out(ip: &[u8]) -> BytesMut {
    let mut p = BytesMut::zeroed(SEND_HEADROOM);
    p.extend_from_slice(ip);
    p
}

/// A UDP packet from the kube-apiserver to the shoot with source port `sport`.
fn to_shoot(sport: u16) -> Vec<u8> {
    let mut p = udp([10, 1, 1, 20], [100, 64, 0, 10]);
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p
}

/// Switches `packet` from connection 1 and, finding no shoot connection, holds it as the
/// server does.
fn switch_or_hold(reg: &mut Registry, packet: &[u8], now: Instant) -> Result<(), BytesMut> {
    assert!(matches!(
        reg.switch_ha(1, packet, now),
        Some(Err(crate::ha::Dropped::NoShoot))
    ));
    let dst = IpAddr::from([100, 64, 0, 10]);
    reg.hold_ha(1, dst, laid_out(packet), now)
}

#[test]
fn ha_packets_to_the_shoot_wait_for_the_first_shoot_connection_and_go_in_order() {
    let t0 = Instant::now();
    let bound = Duration::from_secs(2);
    let (s, mut reg) = ha_registry(bound, HoldLimits::default(), t0);
    // Just started: a shoot connection is expected, so packets wait, in order, also while
    // the first shoot connection is admitted but its tunnel not up yet.
    switch_or_hold(&mut reg, &to_shoot(1), t0).expect("held");
    switch_or_hold(&mut reg, &to_shoot(2), t0).expect("held");
    let (tx0, mut rx0) = mpsc::channel(8);
    reg.admit(
        &s,
        2,
        &identity("vpn-shoot-client-1"),
        ConnHandle { tx: tx0, ..conn(2) },
        1_700_000_001,
    )
    .expect("shoot 1");
    switch_or_hold(&mut reg, &to_shoot(3), t0).expect("held");
    assert!(rx0.try_recv().is_err(), "not before its tunnel is up");
    assert_eq!(reg.hold_counts().packets, 3);
    reg.established(2, "AES-256-GCM", 1_700_000_001);
    for sport in 1..=3u16 {
        let p = rx0.try_recv().expect("released");
        assert_eq!(&p[SEND_HEADROOM..], &to_shoot(sport)[..], "in order");
    }
    assert!(rx0.try_recv().is_err());
    let c = reg.hold_counts();
    assert_eq!((c.packets, c.held, c.released, c.expired), (0, 3, 3, 0));
    // The released flows were learned: they stay on that connection when a lower index
    // comes up.
    reg.admit(
        &s,
        3,
        &identity("vpn-shoot-client-0"),
        conn(3),
        1_700_000_002,
    )
    .expect("shoot 0");
    reg.established(3, "AES-256-GCM", 1_700_000_002);
    let now = Instant::now();
    let on = |reg: &mut Registry, sport: u16| {
        reg.switch_ha(1, &to_shoot(sport), now)
            .expect("HA")
            .map(|c| c.common_name.clone())
    };
    assert_eq!(on(&mut reg, 1).as_deref(), Ok("vpn-shoot-client-1"));
    assert_eq!(on(&mut reg, 9).as_deref(), Ok("vpn-shoot-client-0"));
}

#[test]
fn ha_held_packets_expire_to_their_kube_apiserver_at_the_bound_within_limits() {
    let t0 = Instant::now();
    let bound = Duration::from_secs(2);
    let limits = HoldLimits {
        prefix_packets: 2,
        ..HoldLimits::default()
    };
    let (s, mut reg) = ha_registry(bound, limits, t0);
    // Long after the start, no shoot connection ever came: nothing is expected, not held.
    let late = t0 + bound * 3;
    assert!(switch_or_hold(&mut reg, &to_shoot(1), late).is_err());
    // A shoot connection up, then gone: held for the bound from then, at most the limit.
    reg.admit(
        &s,
        2,
        &identity("vpn-shoot-client-0"),
        conn(2),
        1_700_000_001,
    )
    .expect("shoot 0");
    reg.established(2, "AES-256-GCM", 1_700_000_001);
    reg.remove(2).expect("removed");
    let left = Instant::now();
    switch_or_hold(&mut reg, &to_shoot(2), left).expect("held");
    switch_or_hold(&mut reg, &to_shoot(3), left).expect("held");
    let over = switch_or_hold(&mut reg, &to_shoot(4), left).expect_err("over the limit");
    assert_eq!(&over[SEND_HEADROOM..], &to_shoot(4)[..]);
    assert_eq!(reg.next_hold_expiry(), Some(left + bound));
    assert!(reg.expire_held(left + bound / 2).is_empty());
    let expired = reg.expire_held(left + bound);
    let got: Vec<(Option<ClientId>, Vec<u8>)> = expired
        .into_iter()
        .map(|(from, p)| (from, p[SEND_HEADROOM..].to_vec()))
        .collect();
    assert_eq!(got, [(Some(1), to_shoot(2)), (Some(1), to_shoot(3))]);
    assert!(
        switch_or_hold(&mut reg, &to_shoot(5), left + bound).is_err(),
        "the bound passed: nothing expected any more"
    );
    let c = reg.hold_counts();
    assert_eq!(
        (c.packets, c.bytes, c.held, c.expired, c.over_limit),
        (0, 0, 2, 2, 1)
    );
}

#[test]
fn a_fresh_registry_holds_for_the_configured_clients_routes_until_the_bound() {
    let mut s = settings("10.8.0.0/24");
    let pod = IpNet::from_str("100.96.0.0/24").expect("net");
    s.clients.insert(
        "shoot".into(),
        ClientOptions {
            iroutes: vec![pod],
            ..ClientOptions::default()
        },
    );
    let bound = Duration::from_secs(2);
    let t0 = Instant::now();
    let reg = registry(&s)
        .hold_for(bound, HoldLimits::default())
        .expecting(s.clients.values().flat_map(|c| c.iroutes.clone()), t0);
    let dst: IpAddr = "100.96.0.10".parse().expect("addr");
    assert!(
        matches!(reg.route_from_device(dst, t0), DeviceRoute::Hold(p) if p == pod),
        "just started: the shoot client's route is held for"
    );
    assert!(matches!(
        reg.route_from_device("100.97.0.1".parse().expect("addr"), t0),
        DeviceRoute::Unroutable
    ));
    assert!(matches!(
        reg.route_from_device(dst, t0 + bound),
        DeviceRoute::Unroutable
    ));
}

/// The `Last Ref` of each row (the status file's, `openvpn_server_route_last_reference_time_seconds`).
fn last_refs(status: &StatusSnapshot) -> Vec<(String, u64)> {
    let routes = status
        .routes
        .iter()
        .map(|r| (r.prefix.to_string(), r.last_ref));
    let shoots = status
        .shoot_routes
        .iter()
        .map(|r| (format!("shoot-{}", r.index), r.last_ref));
    let mut rows: Vec<(String, u64)> = routes.chain(shoots).collect();
    rows.sort();
    rows
}

#[test]
fn routed_last_ref_follows_packets_to_the_clients_own_address_and_iroutes_keep_theirs() {
    let mut s = settings("10.8.0.0/24");
    s.clients.insert(
        "vpn-shoot-client".into(),
        ClientOptions {
            iroutes: vec![IpNet::from_str("100.96.0.0/11").unwrap()],
            ..ClientOptions::default()
        },
    );
    let mut reg = registry(&s);
    admit(&mut reg, &s, 1, "vpn-shoot-client").expect("admitted");
    let up = 1_700_000_100;
    reg.established(1, "AES-256-GCM", up);
    // Idle: upstream's learn time (the tunnel up) stays.
    let idle = reg.status(up + 60);
    assert_eq!(
        last_refs(&idle),
        [("10.8.0.2/32".into(), up), ("100.96.0.0/11".into(), up)]
    );
    // Busy: a packet routed to the client's address (as `route_from_device` marks it) moves
    // the address's row to the next status; the iroute keeps its learn time, as upstream's
    // network rows do.
    let client = reg.route("10.8.0.2".parse().unwrap()).expect("routed");
    assert!(client.is_own_address("10.8.0.2".parse().unwrap()));
    assert!(!client.is_own_address("100.96.0.9".parse().unwrap()));
    client.conn.traffic.mark_referenced();
    client.conn.traffic.mark_referenced();
    let busy = reg.status(up + 75);
    assert_eq!(
        last_refs(&busy),
        [
            ("10.8.0.2/32".into(), up + 75),
            ("100.96.0.0/11".into(), up)
        ]
    );
    // Idle again: the mark was taken; the time stays.
    assert_eq!(last_refs(&reg.status(up + 90)), last_refs(&busy));
    // Received bytes (keepalive pings) do not count in routed mode, as upstream's.
    let client = reg.get(1).expect("client");
    client.conn.traffic.received.store(4096, Ordering::Relaxed);
    assert_eq!(last_refs(&reg.status(up + 105)), last_refs(&busy));
}

#[test]
fn ha_last_ref_follows_packets_switched_to_a_connection_and_what_it_receives() {
    let mut s = settings("192.168.123.0/24");
    s.pool_v4 = None;
    s.duplicate_cn = true;
    let mut reg = Registry::ha(vec!["100.64.0.0/13".parse().expect("net")], None, 8);
    let apiserver = ConnHandle {
        peer: SocketAddr::from(([10, 1, 1, 20], 40000)),
        ..conn(1)
    };
    let t0 = 1_700_000_000;
    reg.admit(&s, 1, &identity("vpn-seed-client"), apiserver, t0)
        .expect("seed");
    reg.admit(&s, 2, &identity("vpn-shoot-client-0"), conn(2), t0)
        .expect("shoot 0");
    reg.admit(&s, 3, &identity("vpn-shoot-client-1"), conn(3), t0)
        .expect("shoot 1");
    for id in 1..=3 {
        reg.established(id, "AES-256-GCM", t0);
    }
    // Idle, not even a keepalive: every row keeps the connect time.
    assert_eq!(
        last_refs(&reg.status(t0 + 15)),
        [
            ("10.1.1.20/32".into(), t0),
            ("shoot-0".into(), t0),
            ("shoot-1".into(), t0)
        ]
    );
    // A packet switched from the kube-apiserver to shoot 0 and its reply: both move (the
    // destination's lookup, as upstream's tap switch); shoot 1 carried nothing.
    let now = Instant::now();
    let to = reg
        .switch_ha(1, &udp([10, 1, 1, 20], [100, 64, 0, 10]), now)
        .expect("HA")
        .expect("switched");
    to.conn.traffic.mark_referenced();
    let back = reg
        .switch_ha(2, &udp([100, 64, 0, 10], [10, 1, 1, 20]), now)
        .expect("HA")
        .expect("switched");
    back.conn.traffic.mark_referenced();
    assert_eq!(
        last_refs(&reg.status(t0 + 30)),
        [
            ("10.1.1.20/32".into(), t0 + 30),
            ("shoot-0".into(), t0 + 30),
            ("shoot-1".into(), t0)
        ]
    );
    // Idle tunnels still send keepalive pings: in HA mode what a connection receives moves
    // its row, so the HA panel counts every connected client.
    for id in 1..=3 {
        let c = reg.get(id).expect("client");
        c.conn.traffic.received.fetch_add(26, Ordering::Relaxed);
    }
    let rows = last_refs(&reg.status(t0 + 45));
    assert!(rows.iter().all(|(_, t)| *t == t0 + 45), "{rows:?}");
    // Nothing received, nothing routed: the times stay.
    assert_eq!(last_refs(&reg.status(t0 + 60)), rows);
}

/// A TCP segment from the kube-apiserver to the shoot with source port `sport` and `flags`.
fn tcp_to_shoot(sport: u16, flags: u8) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0];
    p.extend_from_slice(&[10, 1, 1, 20, 100, 64, 0, 10]);
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&[0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, flags, 0xff, 0xff]);
    p.extend_from_slice(&[0; 4]);
    p
}

/// Admits shoot connection `id` as `vpn-shoot-client-<index>` and brings its tunnel up; its
/// queue.
fn shoot_up(reg: &mut Registry, s: &Settings, id: ClientId, index: u8) -> mpsc::Receiver<BytesMut> {
    let (tx, rx) = mpsc::channel(8);
    let name = format!("vpn-shoot-client-{index}");
    reg.admit(
        s,
        id,
        &identity(&name),
        ConnHandle {
            tx,
            ..conn(u16::try_from(id).expect("small id"))
        },
        1_700_000_001,
    )
    .expect("shoot");
    reg.established(id, "AES-256-GCM", 1_700_000_001);
    rx
}

#[test]
fn ha_held_segments_of_connections_begun_before_wait_for_shoot_pod_0() {
    const ACK: u8 = 0x10;
    const SYN: u8 = 0x02;
    let t0 = Instant::now();
    let bound = Duration::from_secs(20);
    let (s, mut reg) = ha_registry(bound, HoldLimits::default(), t0);
    assert_eq!(reg.ha_settles_until(), None, "no shoot connection yet");
    // A just restarted server: a segment of a connection begun before, and a new one.
    switch_or_hold(&mut reg, &tcp_to_shoot(1, ACK), t0).expect("held");
    switch_or_hold(&mut reg, &tcp_to_shoot(2, SYN), t0).expect("held");
    // Shoot pod 1's client is back first: it gets the new connection only.
    let mut rx1 = shoot_up(&mut reg, &s, 2, 1);
    let p = rx1.try_recv().expect("the SYN");
    assert_eq!(&p[SEND_HEADROOM..], &tcp_to_shoot(2, SYN)[..]);
    assert!(
        rx1.try_recv().is_err(),
        "the old connection's segment waits"
    );
    assert_eq!(reg.hold_counts().packets, 1);
    // Pod 0's client: the waiting segment goes there.
    let mut rx0 = shoot_up(&mut reg, &s, 3, 0);
    let p = rx0.try_recv().expect("the old connection's segment");
    assert_eq!(&p[SEND_HEADROOM..], &tcp_to_shoot(1, ACK)[..]);
    assert_eq!(reg.hold_counts().packets, 0);

    // Pod 0 does not come: at the end of the settle time the segment goes to pod 1.
    let (s, mut reg) = ha_registry(bound, HoldLimits::default(), t0);
    switch_or_hold(&mut reg, &tcp_to_shoot(1, ACK), t0).expect("held");
    let mut rx1 = shoot_up(&mut reg, &s, 2, 1);
    assert!(rx1.try_recv().is_err());
    let until = reg.ha_settles_until().expect("settling");
    assert!(reg
        .switch_held_ha(until - Duration::from_millis(1))
        .is_empty());
    let send = reg.switch_held_ha(until);
    assert_eq!(send.len(), 1);
    reg.send_switched(send);
    let p = rx1.try_recv().expect("sent at the end of the settle time");
    assert_eq!(&p[SEND_HEADROOM..], &tcp_to_shoot(1, ACK)[..]);
}

/// Upstream 2.6's OCC options string of a vpn2 client (`auth SHA256`, tls-auth direction 1)
/// with `dev tap` (vpn2's HA clients) or `dev tun`.
fn upstream_options(dev_type: &str, link_mtu: u32) -> String {
    format!(
        "V4,dev-type {dev_type},link-mtu {link_mtu},tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,\
         auth SHA256,keysize 128,tls-auth,key-method 2,tls-client"
    )
}

/// An HA server's settings and registry as `config::from_vpn2_env_ha` and the packet mode
/// make them for `vpn-seed-server-0`: no IPv4 pool, duplicate-cn, tun semantics, vpn2's
/// `server-ipv6` (`…:1::100:0/112`) as the layer-2 clients' pool.
fn ha_layer2_registry() -> (Settings, Registry) {
    let mut s = settings("192.168.123.0/24");
    s.pool_v4 = None;
    s.duplicate_cn = true;
    s.dev_type = protocol::km2::occ::DevType::Tun;
    let layer2: Ipv6Net = "fd8f:6d53:b97a:1::100:0/112".parse().expect("net");
    s.ha = Some(crate::settings::HaSettings {
        shoot_networks: vec!["100.64.0.0/13".parse().expect("net")],
        transfer_v6: None,
        layer2_v6: Some(layer2),
        overlap: false,
    });
    let pool = Pool::new(None, Some(layer2)).expect("pool");
    let nets = s.ha.as_ref().expect("ha").shoot_networks.clone();
    (s, Registry::ha(nets, Some(pool), 8))
}

/// An Ethernet frame from `src` to `dst` (IPv6 ethertype, padded).
fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.resize(60, 0);
    f
}

/// Where a frame from layer-2 connection `from` goes: the CNs and ids of the connections.
fn layer2_targets(reg: &mut Registry, from: ClientId, f: &[u8]) -> Vec<ClientId> {
    let now = 1_700_000_010;
    let flood = match reg.switch_layer2(from, f, now).expect("HA") {
        FromClient::Client(c) => return vec![c.conn.peer_id.into()],
        FromClient::Flood => true,
        FromClient::Tap | FromClient::Drop(_) => return Vec::new(),
    };
    assert!(flood);
    let mut ids: Vec<ClientId> = reg
        .layer2_flood_targets(from)
        .map(|c| c.conn.peer_id.into())
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn an_ha_server_carries_tap_clients_at_layer_2_apart_from_its_tun_clients() {
    let (s, mut reg) = ha_layer2_registry();
    let now = 1_700_000_000;
    let tap = upstream_options("tap", 1587);
    // vpn2's HA clients: two kube-apiservers' and two shoot pods' tap connections.
    for (id, cn) in [
        (1, "vpn-seed-client"),
        (2, "vpn-seed-client"),
        (3, "vpn-shoot-client-0"),
        (4, "vpn-shoot-client-1"),
    ] {
        let who = ClientIdentity {
            options: tap.clone(),
            ..identity(cn)
        };
        let a = reg
            .admit(&s, id, &who, conn(id as u16), now)
            .expect("a tap client at the HA server");
        // What vpn2's server-0 pushes: an address of its /112 (from +2) and its own (+1),
        // with tun-ipv6.
        assert_eq!(
            ifconfig_ipv6_args(&a.settings),
            Some(format!(
                "fd8f:6d53:b97a:1::100:{}/112 fd8f:6d53:b97a:1::100:1",
                id + 1
            ))
        );
        assert!(a.settings.ifconfig.is_none());
        assert!(
            a.settings
                .push
                .iter()
                .any(|p| matches!(p, PushItem::Typed(PushedOption::TunIpv6))),
            "{:?}",
            a.settings.push
        );
        assert!(reg.is_layer2(id));
        reg.established(id, "AES-256-GCM", now);
    }
    // Ours, next to them: a kube-apiserver and a shoot pod at layer 3.
    let ours = |cn: &str| ClientIdentity {
        options: upstream_options("tun", 1555),
        ..identity(cn)
    };
    let kapi = ConnHandle {
        peer: SocketAddr::from(([10, 1, 1, 20], 5)),
        ..conn(5)
    };
    let a = reg
        .admit(&s, 5, &ours("vpn-seed-client"), kapi, now)
        .expect("our seed client");
    assert_eq!(a.settings.ifconfig_ipv6, None, "layer 3: nothing assigned");
    reg.admit(&s, 6, &ours("vpn-shoot-client-1"), conn(6), now)
        .expect("our shoot client");
    for id in [5, 6] {
        assert!(!reg.is_layer2(id));
        reg.established(id, "AES-256-GCM", now);
    }
    // A duplicate CN at layer 2 (vpn2's `duplicate-cn`) does not replace our shoot client 1,
    // nor is it replaced by it.
    assert!(reg.get(4).is_some() && reg.get(6).is_some());
    // Layer 2: a group destination to every other layer-2 connection, never to ours.
    let (kapi_mac, shoot0_mac, shoot1_mac) = (
        [2, 0, 0, 0x0a, 0, 1],
        [2, 0, 0, 0x0b, 0, 0],
        [2, 0, 0, 0x0b, 0, 1],
    );
    let ns_for_shoot0 = frame([0x33, 0x33, 0xff, 0x0b, 0, 0], kapi_mac);
    assert_eq!(layer2_targets(&mut reg, 1, &ns_for_shoot0), [2, 3, 4]);
    // Learned unicast to its owner only; unknown unicast nowhere (no device).
    assert_eq!(
        layer2_targets(&mut reg, 3, &frame(kapi_mac, shoot0_mac)),
        [1]
    );
    assert_eq!(
        layer2_targets(&mut reg, 1, &frame(shoot0_mac, kapi_mac)),
        [3]
    );
    assert!(matches!(
        reg.switch_layer2(1, &frame(shoot1_mac, kapi_mac), now),
        Some(FromClient::Tap)
    ));
    assert_eq!(
        layer2_targets(&mut reg, 4, &frame([0xff; 6], shoot1_mac)),
        [1, 2, 3]
    );
    assert_eq!(
        layer2_targets(&mut reg, 1, &frame(shoot1_mac, kapi_mac)),
        [4]
    );

    // Layer 3: our kube-apiserver's packets go to our shoot connection, never to a layer-2
    // one (vpn2's shoot pod 0 is connected, ours has index 1 only).
    let t = Instant::now();
    let to_shoot = udp([10, 1, 1, 20], [100, 64, 0, 10]);
    let target = reg
        .switch_ha(5, &to_shoot, t)
        .expect("HA")
        .map(|c| c.conn.peer_id);
    assert_eq!(target, Ok(6));
    let back = udp([100, 64, 0, 10], [10, 1, 1, 20]);
    let target = reg
        .switch_ha(6, &back, t)
        .expect("HA")
        .map(|c| c.conn.peer_id);
    assert_eq!(target, Ok(5));
    // The layer-3 switch knows no layer-2 connection: a packet from one is nobody's.
    assert!(matches!(
        reg.switch_ha(3, &back, t),
        Some(Err(
            crate::ha::Dropped::NotSeed | crate::ha::Dropped::Spoofed
        ))
    ));
    // Our shoot client gone: our kube-apiserver's packets wait (held), they never go to
    // vpn2's shoot connections.
    reg.remove(6);
    assert!(matches!(
        reg.switch_ha(5, &to_shoot, t),
        Some(Err(crate::ha::Dropped::NoShoot))
    ));

    // The status file: layer-2 clients with their leased address and MAC rows (as upstream's
    // tap server), ours as before; Ready on the layer-2 pair.
    let status = reg.status(now + 5);
    let text = crate::status::render(&status);
    assert!(
        text.contains("CLIENT_LIST,vpn-shoot-client-0,192.0.2.1:3,,fd8f:6d53:b97a:1::100:4,"),
        "{text}"
    );
    for mac in [
        "02:00:00:0a:00:01@0",
        "02:00:00:0b:00:00@0",
        "02:00:00:0b:00:01@0",
    ] {
        assert!(
            text.contains(&format!("ROUTING_TABLE,{mac},")),
            "{mac}: {text}"
        );
    }
    assert!(
        text.contains("ROUTING_TABLE,10.1.1.20,vpn-seed-client,"),
        "{text}"
    );
    let parsed = crate::status::read::parse(text.as_bytes()).expect("status file");
    crate::probes::check_ready(&parsed, true).expect("Ready on the layer-2 pair");
    // A client that leaves frees its lease and its MAC rows.
    reg.remove(3);
    assert_eq!(reg.status(now + 6).mac_routes.len(), 2);
    assert!(matches!(
        reg.switch_layer2(1, &frame(shoot0_mac, kapi_mac), now),
        Some(FromClient::Tap)
    ));
    let who = ClientIdentity {
        options: tap,
        ..identity("vpn-shoot-client-0")
    };
    let a = reg.admit(&s, 7, &who, conn(7), now).expect("again");
    assert_eq!(
        ifconfig_ipv6_args(&a.settings).as_deref(),
        Some("fd8f:6d53:b97a:1::100:4/112 fd8f:6d53:b97a:1::100:1")
    );
}

#[test]
fn an_ha_server_is_ready_on_a_seed_and_a_shoot_client_of_either_layer() {
    let (s, mut reg) = ha_layer2_registry();
    let now = 1_700_000_000;
    let ready = |reg: &mut Registry| {
        let text = crate::status::render(&reg.status(now));
        let parsed = crate::status::read::parse(text.as_bytes()).expect("status file");
        crate::probes::check_ready(&parsed, true).map_err(|e| e.to_string())
    };
    // A vpn2 kube-apiserver (layer 2) and our shoot pod (layer 3): carried between each
    // other through the gateway (`crate::gateway`, direction 1), so vpn2's rule holds.
    let tap_seed = ClientIdentity {
        options: upstream_options("tap", 1587),
        ..identity("vpn-seed-client")
    };
    reg.admit(&s, 1, &tap_seed, conn(1), now).expect("tap seed");
    reg.established(1, "AES-256-GCM", now);
    assert!(ready(&mut reg).is_err(), "a seed client alone");
    let tun_shoot = ClientIdentity {
        options: upstream_options("tun", 1555),
        ..identity("vpn-shoot-client-0")
    };
    reg.admit(&s, 2, &tun_shoot, conn(2), now)
        .expect("tun shoot");
    reg.established(2, "AES-256-GCM", now);
    assert_eq!(ready(&mut reg), Ok(()));
    // Any other CN has no place in the layout, at layer 2 too.
    let who = ClientIdentity {
        options: upstream_options("tap", 1587),
        ..identity("vpn-shoot-client")
    };
    assert!(matches!(
        reg.admit(&s, 8, &who, conn(8), now),
        Err(Refused::NotHaClient { .. })
    ));
}

#[test]
fn a_tap_server_refuses_tun_clients_and_a_tun_server_tap_clients() {
    let mut s = settings("10.8.0.0/24");
    for (ours, theirs, link_mtu) in [("tun", "tap", 1587), ("tap", "tun", 1555)] {
        s.dev_type = protocol::km2::occ::DevType::from_name(ours).expect("dev type");
        let mut reg = registry(&s);
        let who = ClientIdentity {
            options: upstream_options(theirs, link_mtu),
            ..identity("client")
        };
        let refused = reg
            .admit(&s, 1, &who, conn(1), 1)
            .expect_err("the other device type");
        assert_eq!(
            refused.to_string(),
            format!("dev-type {theirs}, this server is {ours}")
        );
        assert_eq!(reg.len(), 0);
        let who = ClientIdentity {
            options: upstream_options(ours, 1555),
            ..identity("client")
        };
        reg.admit(&s, 2, &who, conn(2), 1)
            .expect("the same device type");
        // Without dev-type in the string: admitted, as before the check.
        reg.admit(&s, 3, &identity("other"), conn(3), 1)
            .expect("no dev-type");
    }
}
