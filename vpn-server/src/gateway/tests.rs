//! The gateway on crafted frames: identities, neighbour discovery, hellos, encapsulation and
//! the choice of the shoot pod.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use super::*;

const KAPI: u32 = 1;
const SHOOT_0: u32 = 10;
const SHOOT_1: u32 = 11;
const MAC_0: MacAddr = MacAddr([0x5a, 0, 0, 0, 0, 0x10]);
const MAC_1: MacAddr = MacAddr([0x5a, 0, 0, 0, 0, 0x11]);

fn vpn_network() -> Ipv6Net {
    "fd8f:6d53:b97a:1::/96".parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The Internet checksum of an upper-layer segment in `frame` (IPv6 in Ethernet) with its
/// pseudo header: 0 when the checksum in the segment is right.
fn verify(frame: &[u8]) -> u16 {
    let ip = &frame[ETH_HEADER_LEN..];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&((ip.len() - 40) as u32).to_be_bytes());
    pseudo[39] = ip[6];
    checksum(&[&pseudo, &ip[40..]])
}

/// An IPv4 TCP SYN from `src` to `dst` with an MSS option, its checksum right.
fn syn(src: Ipv4Addr, dst: Ipv4Addr, mss: u16) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 44, 0, 0, 0x40, 0, 64, 6, 0, 0];
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = checksum(&[&p]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut tcp = vec![
        0x9c, 0x40, 0x27, 0x1a, 0, 0, 0, 1, 0, 0, 0, 0, 0x60, 0x02, 0xff, 0xff,
    ];
    tcp.extend_from_slice(&[0, 0, 0, 0, 2, 4]);
    tcp.extend_from_slice(&mss.to_be_bytes());
    tcp_checksum(&p, &mut tcp);
    p.extend_from_slice(&tcp);
    p
}

fn tcp_checksum(ip_header: &[u8], tcp: &mut [u8]) {
    tcp[16..18].copy_from_slice(&[0, 0]);
    let mut pseudo = ip_header[12..20].to_vec();
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
    let sum = checksum(&[&pseudo, tcp]);
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
}

#[test]
fn an_identity_is_outside_vpn2s_ranges_and_the_same_everywhere() {
    let me = identity(vpn_network(), ip("10.1.1.20"));
    assert_eq!(me, identity(vpn_network(), ip("::ffff:10.1.1.20")));
    let o = me.addr.octets();
    assert!(Ipv6Net::new(ip6("fd8f:6d53:b97a:1::"), 104)
        .unwrap()
        .contains(&me.addr));
    assert!(o[13] >= 0x0c, "{}", me.addr);
    assert_eq!(me.mac, MacAddr([0x02, 0x76, 0x70, o[13], o[14], o[15]]));
    assert!(me.mac.is_learnable());
    assert_ne!(me, identity(vpn_network(), ip("10.1.2.20")));
    assert_eq!(
        shoot_address(vpn_network(), 1),
        ip6("fd8f:6d53:b97a:1::b:1")
    );
    // A thousand pod IPs: none in …::a:* or …::b:*.
    for n in 0..1000u32 {
        let me = identity(vpn_network(), IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + n)));
        assert!(me.addr.octets()[13] >= 0x0c);
    }
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn neighbour_discovery_frames_read_back_with_valid_checksums() {
    let me = identity(vpn_network(), ip("10.1.1.20"));
    let shoot = shoot_address(vpn_network(), 1);
    let ns = neighbor_solicitation(&me, shoot);
    // To the solicited-node group of …::b:1, hop limit 255, from our identity.
    assert_eq!(&ns[..6], &[0x33, 0x33, 0xff, 0x0b, 0x00, 0x01]);
    assert_eq!(&ns[6..12], &me.mac.0);
    assert_eq!(&ns[12..14], &[0x86, 0xdd]);
    assert_eq!(ns[ETH_HEADER_LEN + 7], 255);
    assert_eq!(
        &ns[ETH_HEADER_LEN + 24..ETH_HEADER_LEN + 40],
        &ip6("ff02::1:ff0b:1").octets()
    );
    assert_eq!(verify(&ns), 0);
    assert_eq!(
        classify(&ns),
        Inbound::Solicitation {
            target: shoot,
            from_ip: me.addr,
            from: me.mac
        }
    );
    let na = neighbor_advertisement(&me, MAC_1, shoot);
    assert_eq!(&na[..6], &MAC_1.0);
    assert_eq!(na[ETH_HEADER_LEN + 40 + 4], 0x60, "solicited, override");
    assert_eq!(verify(&na), 0);
    assert_eq!(
        classify(&na),
        Inbound::Advertisement {
            target: me.addr,
            mac: me.mac
        }
    );
    // Without the link-layer option the frame's source is the address; a truncated option
    // list too.
    let mut bare = na.clone();
    bare.truncate(bare.len() - 8);
    let len = (bare.len() - ETH_HEADER_LEN - 40) as u16;
    bare[ETH_HEADER_LEN + 4..ETH_HEADER_LEN + 6].copy_from_slice(&len.to_be_bytes());
    assert_eq!(
        classify(&bare),
        Inbound::Advertisement {
            target: me.addr,
            mac: me.mac
        }
    );
    assert_eq!(classify(&na[..50]), Inbound::Other);
    let mut arp = na.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(classify(&arp), Inbound::Other);
}

#[test]
fn a_hello_is_udp_5400_with_the_pod_ip_as_text() {
    let me = identity(vpn_network(), ip("10.1.1.20"));
    let shoot = shoot_address(vpn_network(), 0);
    let f = hello(&me, MAC_0, shoot, ip("::ffff:10.1.1.20"));
    assert_eq!(&f[..6], &MAC_0.0);
    let ip = &f[ETH_HEADER_LEN..];
    assert_eq!(ip[6], 17);
    assert_eq!(&ip[8..24], &me.addr.octets());
    assert_eq!(&ip[24..40], &shoot.octets());
    let udp = &ip[40..];
    assert_eq!(&udp[..4], &[0x15, 0x18, 0x15, 0x18]);
    assert_eq!(&udp[8..], b"10.1.1.20");
    assert_eq!(usize::from(u16::from_be_bytes([udp[4], udp[5]])), udp.len());
    assert_eq!(verify(&f), 0);
}

#[test]
fn encapsulation_is_ip_in_ipv6_with_the_syn_mss_clamped() {
    let me = identity(vpn_network(), ip("10.1.1.20"));
    let shoot = shoot_address(vpn_network(), 0);
    let packet = syn(
        Ipv4Addr::new(10, 1, 1, 20),
        Ipv4Addr::new(10, 250, 0, 5),
        1460,
    );
    let f = encapsulate(&me, MAC_0, shoot, &packet).expect("fits");
    assert_eq!(&f[..6], &MAC_0.0);
    assert_eq!(&f[6..12], &me.mac.0);
    let outer = &f[ETH_HEADER_LEN..];
    assert_eq!((outer[0], outer[6], outer[7]), (0x60, 4, 64));
    assert_eq!(
        usize::from(u16::from_be_bytes([outer[4], outer[5]])),
        packet.len()
    );
    assert_eq!(&outer[8..24], &me.addr.octets());
    assert_eq!(&outer[24..40], &shoot.octets());
    let inner = &outer[40..];
    // The MSS: 1500 - 40 (IPv6) - 20 - 20.
    assert_eq!(u16::from_be_bytes([inner[42], inner[43]]), 1420);
    let mut check = inner[20..].to_vec();
    tcp_checksum(&inner[..20], &mut check);
    assert_eq!(
        &check[16..18],
        &inner[36..38],
        "the checksum fixed as a full sum gives"
    );
    assert_eq!(&inner[..20], &packet[..20], "the IPv4 header untouched");
    assert_eq!(
        classify(&f),
        Inbound::Tunnelled {
            src: me.addr,
            dst: shoot,
            inner
        }
    );
    // A small MSS stays; not a SYN: untouched.
    let small = syn(
        Ipv4Addr::new(10, 1, 1, 20),
        Ipv4Addr::new(10, 250, 0, 5),
        1200,
    );
    let mut copy = small.clone();
    assert!(!clamp_mss(&mut copy, MAX_INNER));
    assert_eq!(copy, small);
    let mut ack = packet.clone();
    ack[33] = 0x10;
    assert!(!clamp_mss(&mut ack, MAX_INNER));
    // IPv6 inside: next header 41; too long or not IP: refused.
    let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
    v6.extend_from_slice(&[0; 32]);
    let f = encapsulate(&me, MAC_0, shoot, &v6).expect("fits");
    assert_eq!(f[ETH_HEADER_LEN + 6], 41);
    assert!(encapsulate(&me, MAC_0, shoot, &vec![0x45; MAX_INNER]).is_some());
    assert!(encapsulate(&me, MAC_0, shoot, &vec![0x45; MAX_INNER + 1]).is_none());
    assert!(encapsulate(&me, MAC_0, shoot, &[0x20; 40]).is_none());
}

fn frames(out: &[Out<u32>]) -> Vec<(u32, &[u8])> {
    out.iter()
        .filter_map(|o| match o {
            Out::Frame { to, frame } => Some((*to, frame.as_slice())),
            Out::Packet { .. } => None,
        })
        .collect()
}

/// A shoot pod's advertisement of its bond address `j` at `mac` (unsolicited or not).
fn advert(j: u8, mac: MacAddr) -> Vec<u8> {
    let shoot = Identity {
        addr: shoot_address(vpn_network(), j),
        mac,
    };
    neighbor_advertisement(&shoot, MacAddr([0x33, 0x33, 0, 0, 0, 1]), ip6("ff02::1"))
}

#[test]
fn the_gateway_finds_a_shoot_pod_says_hello_and_carries_both_ways() {
    let t0 = Instant::now();
    let mut g = Gateway::new(vpn_network());
    let pod = ip("10.1.1.20");
    let me = g
        .kapi_connected(KAPI, pod, vec![pod, ip("241.1.1.20")], t0)
        .expect("identity");
    assert_eq!(g.next_tick(), None, "no shoot pod yet");
    g.shoot_connected(SHOOT_1, 1, t0);
    g.shoot_connected(SHOOT_0, 0, t0);
    let to_node = syn(
        Ipv4Addr::new(10, 1, 1, 20),
        Ipv4Addr::new(10, 250, 0, 5),
        1400,
    );
    assert_eq!(g.from_layer3(KAPI, &to_node), Err(ToShoot::NoShoot));
    // At once: a solicitation to each shoot pod, none twice within HELLO_EVERY.
    assert_eq!(g.next_tick(), Some(t0));
    let out = g.tick(t0);
    let asked: HashMap<u32, Inbound<'_>> = frames(&out)
        .into_iter()
        .map(|(to, f)| (to, classify(f)))
        .collect();
    assert_eq!(asked.len(), 2);
    assert!(matches!(
        asked[&SHOOT_1],
        Inbound::Solicitation { target, from, .. }
            if target == shoot_address(vpn_network(), 1) && from == me.mac
    ));
    assert!(g.tick(t0 + Duration::from_secs(1)).is_empty());
    // Shoot pod 1 answers first: hello at once, and the kube-apiserver's packets go there.
    let out = g.from_layer2(SHOOT_1, &advert(1, MAC_1));
    let hellos = frames(&out);
    assert_eq!(hellos.len(), 1);
    assert_eq!(hellos[0].0, SHOOT_1);
    assert!(hellos[0].1.ends_with(b"10.1.1.20") && hellos[0].1.starts_with(&MAC_1.0));
    // An advertisement on the wrong connection, or for another address, teaches nothing.
    assert!(g.from_layer2(SHOOT_0, &advert(1, MAC_0)).is_empty());
    let Ok(Out::Frame { to, frame }) = g.from_layer3(KAPI, &to_node) else {
        panic!("to shoot pod 1")
    };
    assert_eq!((to, &frame[..6]), (SHOOT_1, &MAC_1.0[..]));
    // Shoot pod 0 answers: the kube-apiserver stays on pod 1 while pod 1 is there.
    g.from_layer2(SHOOT_0, &advert(0, MAC_0));
    assert!(matches!(
        g.from_layer3(KAPI, &to_node),
        Ok(Out::Frame { to: SHOOT_1, .. })
    ));
    // Every HELLO_EVERY, a hello from each kube-apiserver to each pod with a known address.
    let due = t0 + HELLO_EVERY;
    let sent: Vec<u32> = frames(&g.tick(due)).into_iter().map(|(to, _)| to).collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    // Pod 1's bond fails over: its new MAC address is announced and used.
    let moved = MacAddr([0x5a, 0, 0, 0, 0, 0x21]);
    assert_eq!(frames(&g.from_layer2(SHOOT_1, &advert(1, moved))).len(), 1);
    let Ok(Out::Frame { frame, .. }) = g.from_layer3(KAPI, &to_node) else {
        panic!("to shoot pod 1")
    };
    assert_eq!(&frame[..6], &moved.0);
    // Pod 1 gone: the lowest index known.
    g.shoot_disconnected(SHOOT_1);
    assert!(matches!(
        g.from_layer3(KAPI, &to_node),
        Ok(Out::Frame { to: SHOOT_0, .. })
    ));
    // A source that is not the kube-apiserver's, or a connection without identity.
    let spoofed = syn(
        Ipv4Addr::new(10, 1, 1, 21),
        Ipv4Addr::new(10, 250, 0, 5),
        1400,
    );
    assert_eq!(g.from_layer3(KAPI, &spoofed), Err(ToShoot::Unknown));
    assert_eq!(g.from_layer3(99, &to_node), Err(ToShoot::Unknown));

    // Pod 0 asks for our identity: answered on its connection, to its MAC address.
    let shoot0 = Identity {
        addr: shoot_address(vpn_network(), 0),
        mac: MAC_0,
    };
    let out = g.from_layer2(SHOOT_0, &neighbor_solicitation(&shoot0, me.addr));
    let answers = frames(&out);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, SHOOT_0);
    assert_eq!(
        classify(answers[0].1),
        Inbound::Advertisement {
            target: me.addr,
            mac: me.mac
        }
    );
    assert!(answers[0].1.starts_with(&MAC_0.0));
    // A solicitation for anyone else: no answer.
    assert!(g
        .from_layer2(
            SHOOT_0,
            &neighbor_solicitation(&shoot0, ip6("fd8f:6d53:b97a:1::a:1"))
        )
        .is_empty());
    // Pod 0's reply, tunnelled to our identity: the inner packet to the kube-apiserver.
    let reply = syn(
        Ipv4Addr::new(10, 250, 0, 5),
        Ipv4Addr::new(10, 1, 1, 20),
        1400,
    );
    let back = Identity {
        addr: shoot0.addr,
        mac: MAC_0,
    };
    let tunnelled = encapsulate(&back, me.mac, me.addr, &reply).expect("fits");
    assert_eq!(
        g.from_layer2(SHOOT_0, &tunnelled),
        [Out::Packet {
            to: KAPI,
            packet: {
                let mut clamped = reply.clone();
                clamp_mss(&mut clamped, MAX_INNER);
                clamped
            }
        }]
    );
    // From another pod's address, on the wrong connection, or to another address inside:
    // nothing.
    let pod1 = Identity {
        addr: shoot_address(vpn_network(), 1),
        mac: MAC_1,
    };
    let wrong = encapsulate(&pod1, me.mac, me.addr, &reply).expect("fits");
    assert!(g.from_layer2(SHOOT_0, &wrong).is_empty());
    let elsewhere = syn(
        Ipv4Addr::new(10, 250, 0, 5),
        Ipv4Addr::new(10, 1, 1, 21),
        1400,
    );
    let wrong = encapsulate(&back, me.mac, me.addr, &elsewhere).expect("fits");
    assert!(g.from_layer2(SHOOT_0, &wrong).is_empty());
    // The kube-apiserver gone: its identity answers nothing.
    g.kapi_disconnected(KAPI);
    assert!(g.from_layer2(SHOOT_0, &tunnelled).is_empty());
    assert_eq!(g.next_tick(), None);
}

#[test]
fn a_second_pod_ip_with_the_same_identity_gets_none() {
    let t0 = Instant::now();
    let mut seen: HashMap<Ipv6Addr, IpAddr> = HashMap::new();
    let (first, second) = (0..200_000u32)
        .map(|n| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
        .find_map(|pod| {
            let addr = identity(vpn_network(), pod).addr;
            seen.insert(addr, pod).map(|other| (other, pod))
        })
        .expect("a collision among 200,000 pod IPs (24 bits)");
    let mut g = Gateway::new(vpn_network());
    g.kapi_connected(1, first, vec![first], t0).expect("first");
    let err = g
        .kapi_connected(2, second, vec![second], t0)
        .expect_err("collision");
    assert_eq!((err.pod_ip, err.other), (second, first));
    // The same pod IP again (a reconnect) takes its identity over.
    g.kapi_connected(3, first, vec![first], t0).expect("again");
}

/// An IPv4 UDP datagram from `src` to `dst` (no checksums: the gateway reads addresses).
fn udp4(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 32, 0, 0, 0x40, 0, 64, 17, 0, 0];
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&[0x9c, 0x40, 0x27, 0x1a, 0, 12, 0, 0, b'p', b'i', b'n', b'g']);
    p
}

#[test]
fn direction_1_vpn2s_kube_apiserver_reaches_our_shoot_pod_and_back() {
    const OUR_SHOOT_1: u32 = 21;
    const VPN2_KAPI: u32 = 30;
    let mut g = Gateway::new(vpn_network());
    g.l3_shoot_connected(OUR_SHOOT_1, 1);
    let b1 = shoot_address(vpn_network(), 1);
    let ours = shoot_identity(vpn_network(), 1);
    assert_eq!(ours.mac, MacAddr([0x02, 0x76, 0x70, 0x0b, 0x00, 0x01]));
    let kapi = Identity {
        addr: ip6("fd8f:6d53:b97a:1::a:1"),
        mac: MacAddr([0x5a, 0, 0, 0, 0x0a, 0x01]),
    };
    // vpn2's kube-apiserver asks for …::b:1: answered with our shoot pod's identity.
    let out = g.from_layer2(VPN2_KAPI, &neighbor_solicitation(&kapi, b1));
    let answers = frames(&out);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, VPN2_KAPI);
    assert!(answers[0].1.starts_with(&kapi.mac.0));
    assert_eq!(
        classify(answers[0].1),
        Inbound::Advertisement {
            target: b1,
            mac: ours.mac
        }
    );
    // …::b:0 is no shoot pod of ours: no answer.
    let b0 = shoot_address(vpn_network(), 0);
    assert!(g
        .from_layer2(VPN2_KAPI, &neighbor_solicitation(&kapi, b0))
        .is_empty());
    // Its path controller's ping: answered with the same identifier, sequence and data.
    let mut body = vec![ICMPV6_ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 7];
    body.extend_from_slice(b"HELLO-R-U-THERE");
    let sum = upper_checksum(kapi.addr, b1, NH_ICMPV6, &body);
    body[2..4].copy_from_slice(&sum.to_be_bytes());
    let ping = ipv6_frame(ours.mac, kapi.mac, (kapi.addr, b1), NH_ICMPV6, 64, &body);
    let out = g.from_layer2(VPN2_KAPI, &ping);
    let replies = frames(&out);
    assert_eq!(replies.len(), 1);
    let reply = replies[0].1;
    assert!(reply.starts_with(&kapi.mac.0));
    let icmp = &reply[ETH_HEADER_LEN + 40..];
    assert_eq!(icmp[0], ICMPV6_ECHO_REPLY);
    assert_eq!(&icmp[4..], &body[4..]);
    assert_eq!(verify(reply), 0);
    // Its hello (pod IP 10.1.1.20) is swallowed and recorded; then its tunnelled packets
    // from that pod IP go to our shoot pod 1's connection as they are.
    let pod = Ipv4Addr::new(10, 1, 1, 20);
    let hi = hello(&kapi, ours.mac, b1, IpAddr::V4(pod));
    assert!(matches!(classify(&hi), Inbound::Hello { .. }));
    assert!(g.from_layer2(VPN2_KAPI, &hi).is_empty());
    let request = udp4(pod, Ipv4Addr::new(10, 250, 0, 5));
    let tunnelled = encapsulate(&kapi, ours.mac, b1, &request).expect("fits");
    assert_eq!(
        g.from_layer2(VPN2_KAPI, &tunnelled),
        [Out::Packet {
            to: OUR_SHOOT_1,
            packet: request.clone()
        }]
    );
    // Not from the pod IP its hellos carry, not on its connection, not from its address, or
    // to a shoot pod that is not ours: nothing.
    let spoofed = udp4(Ipv4Addr::new(10, 1, 1, 21), Ipv4Addr::new(10, 250, 0, 5));
    let t = encapsulate(&kapi, ours.mac, b1, &spoofed).expect("fits");
    assert!(g.from_layer2(VPN2_KAPI, &t).is_empty());
    assert!(g.from_layer2(99, &tunnelled).is_empty());
    let other = Identity {
        addr: ip6("fd8f:6d53:b97a:1::a:2"),
        mac: kapi.mac,
    };
    let t = encapsulate(&other, ours.mac, b1, &request).expect("fits");
    assert!(g.from_layer2(VPN2_KAPI, &t).is_empty());
    let t = encapsulate(&kapi, ours.mac, b0, &request).expect("fits");
    assert!(g.from_layer2(VPN2_KAPI, &t).is_empty());
    // Our shoot pod's answer to the pod IP: inside IPv6 from …::b:1 to its bond address.
    let answer = udp4(Ipv4Addr::new(10, 250, 0, 5), pod);
    let Some(Out::Frame { to, frame }) = g.from_l3_shoot(OUR_SHOOT_1, &answer) else {
        panic!("to vpn2's kube-apiserver")
    };
    assert_eq!(to, VPN2_KAPI);
    assert!(frame.starts_with(&kapi.mac.0) && frame[6..12] == ours.mac.0);
    assert_eq!(
        classify(&frame),
        Inbound::Tunnelled {
            src: b1,
            dst: kapi.addr,
            inner: &answer
        }
    );
    // The shoot opens nothing into the seed; a pod IP no hello told, or a connection that
    // is no shoot pod of ours: nothing.
    let syn_into_seed = syn(Ipv4Addr::new(10, 250, 0, 5), pod, 1400);
    assert_eq!(g.from_l3_shoot(OUR_SHOOT_1, &syn_into_seed), None);
    let elsewhere = udp4(Ipv4Addr::new(10, 250, 0, 5), Ipv4Addr::new(10, 1, 1, 21));
    assert_eq!(g.from_l3_shoot(OUR_SHOOT_1, &elsewhere), None);
    assert_eq!(g.from_l3_shoot(VPN2_KAPI, &answer), None);
    // vpn2's kube-apiserver gone: its hellos forgotten.
    g.shoot_disconnected(VPN2_KAPI);
    assert_eq!(g.from_l3_shoot(OUR_SHOOT_1, &answer), None);
    // Our shoot pod gone: …::b:1 no longer answered.
    g.l3_shoot_disconnected(OUR_SHOOT_1);
    assert!(g
        .from_layer2(VPN2_KAPI, &neighbor_solicitation(&kapi, b1))
        .is_empty());
}

#[test]
fn on_overlapping_networks_the_hello_carries_the_pod_ips_241_image() {
    let t0 = Instant::now();
    let mut g = Gateway::new(vpn_network()).hello_images(true);
    let pod = ip("10.1.1.20");
    let me = g
        .kapi_connected(KAPI, pod, vec![pod, ip("241.1.1.20")], t0)
        .expect("identity");
    // The identity is the pod IP's, as without overlap.
    assert_eq!(me, identity(vpn_network(), pod));
    g.shoot_connected(SHOOT_0, 0, t0);
    let out = g.from_layer2(SHOOT_0, &advert(0, MAC_0));
    let hellos = frames(&out);
    assert_eq!(hellos.len(), 1);
    assert!(hellos[0].1.ends_with(b"241.1.1.20"), "{:?}", hellos[0].1);
    // Its packets from the image go through; the image's replies come back to it.
    let from_image = syn(
        Ipv4Addr::new(241, 1, 1, 20),
        Ipv4Addr::new(10, 250, 0, 5),
        1400,
    );
    assert!(matches!(
        g.from_layer3(KAPI, &from_image),
        Ok(Out::Frame { to: SHOOT_0, .. })
    ));
}
