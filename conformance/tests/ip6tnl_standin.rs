//! The `ip6tnl` stand-in of the vpn2 HA model (`conformance::gardener::vpn2_ha_pods::ip6tnl`)
//! between two namespaces, each a pod with its bond address on a link named `bond0` (a veth
//! pair here, no OpenVPN): the kube-apiserver side's `bond0-ip6tnl0` (`…::a:1` → `…::b:0`) and
//! the shoot side's `bond0ip6tnl0001` (`…::b:0` → `…::a:1`). A TCP echo over IPv4 and an
//! ICMPv6 echo over IPv6 cross it; a capture on the kube-apiserver side's `bond0` shows what
//! ip6tnl with vpn2's settings sends: IPv6 between the bond addresses, next header 4 around
//! the IPv4 packets and 41 around the IPv6 ones, no extension header.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use conformance::gardener::capture::{Capture, Packet, Transport};
use conformance::gardener::vpn2_ha_pods::ip6tnl::{kapi_name, shoot_name, Ip6tnl};
use conformance::gardener::vpn2_ha_pods::{kapi_bond_address, shoot_bond_address};
use conformance::netns::Netns;
use conformance::require_lab;

const KAPI_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 20);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 5);
const KAPI_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 0x20);
const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 5);
const PORT: u16 = 7002;

#[test]
fn the_ip6tnl_stand_in_carries_ipv4_and_ipv6_in_ipv6_between_the_bond_addresses() {
    require_lab(&["ip", "tcpdump", "ping"]);
    let kapi = Netns::with_prefix("vpnt-7m").expect("namespace");
    let shoot = Netns::with_prefix("vpnt-7m").expect("namespace");
    Netns::veth_pair(&kapi, "bond0", &shoot, "bond0").expect("veth");
    let (a, b) = (kapi_bond_address(0), shoot_bond_address(0));
    for (ns, addr, own4, own6) in [(&kapi, a, KAPI_IP, KAPI_IP6), (&shoot, b, NODE, NODE_IP6)] {
        ns.run([
            "ip",
            "addr",
            "add",
            &format!("{addr}/104"),
            "dev",
            "bond0",
            "nodad",
        ])
        .expect("bond address");
        ns.run(["ip", "addr", "add", &format!("{own4}/32"), "dev", "lo"])
            .expect("address");
        ns.run(["ip", "addr", "add", &format!("{own6}/128"), "dev", "lo"])
            .expect("address");
    }
    let to_shoot = Ip6tnl::create(&kapi, &kapi_name(0), a, b).expect("kube-apiserver side");
    let to_kapi = Ip6tnl::create(&shoot, &shoot_name(a), b, a).expect("shoot side");
    assert_eq!(to_kapi.name(), "bond0ip6tnl0001");
    for (ns, dev, peer4, peer6) in [
        (&kapi, "bond0-ip6tnl0", NODE, NODE_IP6),
        (&shoot, "bond0ip6tnl0001", KAPI_IP, KAPI_IP6),
    ] {
        ns.run(["ip", "route", "add", &format!("{peer4}/32"), "dev", dev])
            .expect("route");
        ns.run([
            "ip",
            "-6",
            "route",
            "add",
            &format!("{peer6}/128"),
            "dev",
            dev,
        ])
        .expect("route");
        let link = ns
            .run(["ip", "-j", "link", "show", "dev", dev])
            .expect("link");
        let v: serde_json::Value = serde_json::from_slice(&link.stdout).expect("json");
        assert_eq!(v[0]["mtu"], 1460, "{dev}: the bond's 1500 less 40");
    }
    let listener = shoot
        .run_in(|| TcpListener::bind(SocketAddr::from((NODE, PORT))))
        .expect("setns")
        .expect("listen");
    let echo = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).expect("read");
        s.write_all(&buf[..n]).expect("write");
        peer
    });
    let capture = Capture::start(&kapi, "bond0", "ip6 proto 4 or ip6 proto 41").expect("capture");
    let line = b"through the stand-in\n";
    let back = kapi
        .run_in(|| -> std::io::Result<Vec<u8>> {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.bind(&SocketAddr::from((KAPI_IP, 0)).into())?;
            socket.connect_timeout(
                &SocketAddr::from((NODE, PORT)).into(),
                Duration::from_secs(5),
            )?;
            let mut s: TcpStream = socket.into();
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(line)?;
            let mut back = vec![0u8; line.len()];
            s.read_exact(&mut back)?;
            Ok(back)
        })
        .expect("setns")
        .expect("the TCP echo over IPv4");
    assert_eq!(back, line);
    assert_eq!(echo.join().expect("echo").ip(), IpAddr::V4(KAPI_IP));
    let ping = kapi
        .run([
            "ping",
            "-6",
            "-n",
            "-q",
            "-c",
            "2",
            "-W",
            "2",
            "-I",
            &KAPI_IP6.to_string(),
            &NODE_IP6.to_string(),
        ])
        .expect("an ICMPv6 echo over IPv6");
    assert!(ping.status.success(), "{ping:?}");
    let seen = capture.finish().expect("capture");
    let tunnelled = |p: &Packet, from: Ipv6Addr, to: Ipv6Addr, nh: u8| {
        p.src == IpAddr::V6(from) && p.dst == IpAddr::V6(to) && p.transport == Transport::Other(nh)
    };
    let shown: Vec<String> = seen.iter().map(ToString::to_string).collect();
    assert!(
        seen.iter().any(|p| tunnelled(p, a, b, 4)
            && p.inner.is_some_and(|i| i.src == KAPI_IP
                && i.dst == NODE
                && matches!(i.transport, Transport::Tcp { dst: PORT, .. }))),
        "{shown:?}"
    );
    assert!(
        seen.iter()
            .any(|p| tunnelled(p, b, a, 4)
                && p.inner.is_some_and(|i| i.src == NODE && i.dst == KAPI_IP)),
        "{shown:?}"
    );
    assert!(
        seen.iter().any(|p| tunnelled(p, a, b, 41)
            && p.inner.is_some_and(
                |i| i.dst == NODE_IP6 && i.transport == Transport::Icmp { kind: 128, code: 0 }
            )),
        "{shown:?}"
    );
    assert!(
        seen.iter().any(|p| tunnelled(p, b, a, 41)
            && p.inner.is_some_and(
                |i| i.src == NODE_IP6 && i.transport == Transport::Icmp { kind: 129, code: 0 }
            )),
        "{shown:?}"
    );
    let (out, into) = to_shoot.counts();
    assert!(
        out >= 5 && into >= 5,
        "kube-apiserver side moved {out} out, {into} in"
    );
    eprintln!(
        "ip6tnl stand-in: {} tunnelled packets, e.g. {}",
        seen.len(),
        shown[0]
    );
}
