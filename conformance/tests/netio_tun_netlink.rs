//! `netio::tun` and `netio::netlink` inside a lab namespace: a tun device gets link settings,
//! addresses and routes through netlink (checked with our route listing and with `ip -n NS`),
//! a datagram routed into the tun is read from the tun fd byte by byte, and a reply written
//! into the tun reaches the sending socket. A tap device hands over the kernel's ARP request
//! as an Ethernet frame and takes the reply, which the kernel's neighbour table then shows.

// A long test here is one scenario read top to bottom; split up, its steps would scatter.
#![allow(clippy::too_many_lines)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Duration;

use bytes::BytesMut;
use conformance::netns::Netns;
use conformance::require_lab;
use netio::netlink::{Family, FwmarkRule, IpPrefix, Netlink, Route};
use netio::tun::{PacketLayout, RecvPool, Tun};

const TUN: &str = "vpnt-tun0";
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const ROUTED: &str = "10.200.0.0/16";
/// An address inside `ROUTED`, i.e. behind the tun.
const PEER: Ipv4Addr = Ipv4Addr::new(10, 200, 1, 1);
/// What the data path would reserve for the OpenVPN header in front of a packet.
const HEADROOM: usize = 24;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn ip_n(ns: &Netns, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", ns.name()])
        .args(args)
        .output()
        .expect("ip -n");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn p(s: &str) -> IpPrefix {
    s.parse().expect("prefix")
}

/// RFC 1071 ones'-complement sum.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[test]
fn tun_gets_link_settings_addresses_and_routes() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let tun = Tun::open(TUN).expect("open tun");
            assert_eq!(tun.name(), TUN);
            let nl = Netlink::open().expect("netlink");
            nl.set_mtu(TUN, 1400).await.expect("mtu");
            nl.set_txqueuelen(TUN, 500).await.expect("txqueuelen");
            nl.set_link_up(TUN).await.expect("up");
            let link = nl.link(TUN).await.expect("link");
            assert!(link.up);
            assert_eq!((link.mtu, link.txqueuelen), (Some(1400), Some(500)));

            nl.add_address(TUN, IpPrefix::new(LOCAL.into(), 24).expect("prefix"))
                .await
                .expect("address v4");
            nl.add_address(TUN, p("fd00:99::1/64"))
                .await
                .expect("address v6");
            let addrs = nl.addresses(TUN).await.expect("addresses");
            assert!(addrs.contains(&p("10.99.0.1/24")), "{addrs:?}");
            assert!(addrs.contains(&p("fd00:99::1/64")), "{addrs:?}");

            let v4 = Route {
                gateway: Some(GATEWAY.into()),
                metric: Some(77),
                ..Route::via_dev(p(ROUTED), TUN)
            };
            let v6 = Route {
                metric: Some(5),
                ..Route::via_dev(p("fd00:200::/48"), TUN)
            };
            nl.add_route(&v4).await.expect("route v4");
            nl.add_route(&v6).await.expect("route v6");
            let again = nl.add_route(&v4).await.expect_err("duplicate route");
            assert_eq!(again.raw_os_error(), Some(17), "EEXIST expected: {again}");

            let routes = nl.routes(Family::V4).await.expect("routes v4");
            let ours = routes
                .iter()
                .find(|r| r.dst == p(ROUTED))
                .unwrap_or_else(|| panic!("route missing: {routes:?}"));
            assert_eq!(ours.dev.as_deref(), Some(TUN));
            assert_eq!(ours.gateway, Some(IpAddr::V4(GATEWAY)));
            assert_eq!(ours.metric, Some(77));
            let routes6 = nl.routes(Family::V6).await.expect("routes v6");
            assert!(
                routes6
                    .iter()
                    .any(|r| r.dst == p("fd00:200::/48") && r.metric == Some(5)),
                "{routes6:?}"
            );

            // The same state as iproute2 sees it, while the tun (and so its routes) still exists.
            let shown = ip_n(&ns, &["route"]);
            assert!(
                // iproute2 does not print `proto boot`, its own default.
                shown.contains(&format!("{ROUTED} via {GATEWAY} dev {TUN} metric 77")),
                "{shown}"
            );
            let shown6 = ip_n(&ns, &["-6", "route"]);
            assert!(
                shown6.contains(&format!("fd00:200::/48 dev {TUN} metric 5 pref medium")),
                "{shown6}"
            );
            let link = ip_n(&ns, &["link", "show", TUN]);
            assert!(
                link.contains("mtu 1400") && link.contains("qlen 500"),
                "{link}"
            );
            // As `ip addr add 10.99.0.1/24 dev tun` leaves it: the broadcast address set.
            let addr = ip_n(&ns, &["addr", "show", TUN]);
            assert!(
                addr.contains("inet 10.99.0.1/24 brd 10.99.0.255 scope global"),
                "{addr}"
            );
            assert!(addr.contains("inet6 fd00:99::1/64 scope global"), "{addr}");
        })
    })
    .expect("run_in");
}

/// The tun, up, with 10.99.0.1/24 and the route to `ROUTED` through it.
async fn routed_tun() -> Tun {
    let tun = Tun::open(TUN).expect("open tun");
    let nl = Netlink::open().expect("netlink");
    nl.set_link_up(TUN).await.expect("up");
    nl.add_address(TUN, p("10.99.0.1/24"))
        .await
        .expect("address");
    nl.add_route(&Route::via_dev(p(ROUTED), TUN))
        .await
        .expect("route");
    tun
}

#[test]
fn datagram_routed_into_the_tun_is_read_and_a_reply_written_back() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let tun = routed_tun().await;

            // A UDP socket of this namespace sends to an address routed into the tun.
            let sock = tokio::net::UdpSocket::bind((LOCAL, 0)).await.expect("bind");
            let port = sock.local_addr().expect("addr").port();
            sock.send_to(b"into the tun", (PEER, 7777))
                .await
                .expect("send_to");

            // Skip anything else the kernel sends into the tun (e.g. IPv6 solicitations).
            let mut pool = RecvPool::default();
            let layout = PacketLayout {
                headroom: HEADROOM,
                max_len: 1500,
                tailroom: 16,
            };
            let request = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let mut batch = Vec::new();
                    tun.recv_many(&mut pool, layout, &mut batch, 1)
                        .await
                        .expect("recv_many");
                    for buf in batch {
                        assert!(buf[..HEADROOM].iter().all(|&b| b == 0), "headroom zeroed");
                        assert!(buf.capacity() >= buf.len() + 16, "tailroom");
                        let pkt = &buf[HEADROOM..];
                        if pkt[0] >> 4 == 4 && pkt[9] == 17 && pkt[16..20] == PEER.octets() {
                            return pkt.to_vec();
                        }
                    }
                }
            })
            .await
            .expect("datagram never reached the tun");

            // IPv4 without options, UDP, from our address to the routed one, valid header
            // checksum, our ports and payload.
            assert_eq!(request[0], 0x45);
            assert_eq!(
                usize::from(u16::from_be_bytes([request[2], request[3]])),
                request.len()
            );
            assert_eq!(request.len(), 20 + 8 + 12);
            assert_eq!(&request[12..16], &LOCAL.octets());
            assert_eq!(checksum(&request[..20]), 0, "IP header checksum");
            assert_eq!(u16::from_be_bytes([request[20], request[21]]), port);
            assert_eq!(u16::from_be_bytes([request[22], request[23]]), 7777);
            assert_eq!(&request[28..], b"into the tun");
            // The kernel left the UDP checksum to the device (the tun offers TUN_F_CSUM); the
            // packet read is finished: its checksum over the pseudo header is valid.
            let mut pseudo = request[12..20].to_vec();
            pseudo.extend_from_slice(&[0, 17, 0, 20]);
            pseudo.extend_from_slice(&request[20..]);
            assert_ne!(u16::from_be_bytes([request[26], request[27]]), 0);
            assert_eq!(checksum(&pseudo), 0, "UDP checksum");

            // The answer written into the tun reaches the socket.
            tun.send(&udp_reply(&request, b"out of the tun"))
                .await
                .expect("send reply");
            let mut got = [0u8; 64];
            let (n, from) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut got))
                .await
                .expect("reply never arrived")
                .expect("recv_from");
            assert_eq!(&got[..n], b"out of the tun");
            assert_eq!(from, (PEER, 7777).into());
        })
    })
    .expect("run_in");
}

#[test]
fn tap_device_reads_the_kernels_arp_request_and_takes_the_reply() {
    require_lab(&[]);
    const TAP: &str = "vpnt-tap0";
    const PEER_MAC: [u8; 6] = [0x02, 0x42, 0, 0, 0, 0x07];
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let tap = Tun::open_tap(TAP).expect("open tap");
            assert!(tap.is_tap() && !tap.offload());
            let nl = Netlink::open().expect("netlink");
            nl.set_mtu(TAP, 1400).await.expect("mtu");
            nl.set_link_up(TAP).await.expect("up");
            nl.add_address(TAP, p("10.98.0.1/24"))
                .await
                .expect("address");
            let sock = tokio::net::UdpSocket::bind(("10.98.0.1", 0))
                .await
                .expect("bind");
            sock.send_to(b"x", ("10.98.0.2", 7777))
                .await
                .expect("send_to");

            let mut pool = RecvPool::default();
            let layout = PacketLayout {
                headroom: HEADROOM,
                max_len: 1400 + 18,
                tailroom: 16,
            };
            let request = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let mut batch = Vec::new();
                    tap.recv_many(&mut pool, layout, &mut batch, 1)
                        .await
                        .expect("recv_many");
                    for buf in batch {
                        let f = &buf[HEADROOM..];
                        // ARP (0x0806), a request (op 1) for 10.98.0.2.
                        if f.len() >= 42
                            && f[12..14] == [8, 6]
                            && f[21] == 1
                            && f[38..42] == [10, 98, 0, 2]
                        {
                            return f.to_vec();
                        }
                    }
                }
            })
            .await
            .expect("no ARP request from the tap device");
            assert_eq!(request[..6], [0xff; 6], "broadcast");
            let own_mac = request[6..12].to_vec();
            assert!(ip_n(&ns, &["link", "show", TAP]).contains(&format!(
                "link/ether {}",
                own_mac
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":")
            )));

            // The reply: to the device's address, from PEER_MAC for 10.98.0.2.
            let mut reply = own_mac.clone();
            reply.extend_from_slice(&PEER_MAC);
            reply.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 2]);
            reply.extend_from_slice(&PEER_MAC);
            reply.extend_from_slice(&[10, 98, 0, 2]);
            reply.extend_from_slice(&own_mac);
            reply.extend_from_slice(&[10, 98, 0, 1]);
            let mut batch = vec![BytesMut::from(&reply[..])];
            let mut gro = netio::tun::Coalescer::with_capacity(4);
            assert_eq!(tap.send_many_sync(&mut batch, &mut gro).expect("write"), 1);
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let neigh = ip_n(&ns, &["neigh", "show", "10.98.0.2", "dev", TAP]);
                if neigh.contains("lladdr 02:42:00:00:00:07") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "not resolved: {neigh}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    })
    .expect("run_in");
}

/// `recv_many` returns a packet that arrives while it waits at once, alone (the read that
/// finds the device empty comes on the next call); packets already queued when it is called
/// are read together.
#[test]
fn recv_many_returns_a_packet_it_waited_for_alone() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    // Nothing but our datagrams in the tun: no IPv6 solicitations.
    let sysctl = ns
        .run([
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ])
        .expect("sysctl");
    assert!(sysctl.status.success(), "sysctl: {sysctl:?}");
    ns.run_in(|| {
        runtime().block_on(async {
            let tun = routed_tun().await;
            let sock = std::net::UdpSocket::bind((LOCAL, 0)).expect("bind");
            let send = |tag: u8| {
                sock.send_to(&[tag], (PEER, 7777)).expect("send_to");
            };
            let layout = PacketLayout {
                headroom: HEADROOM,
                max_len: 1500,
                tailroom: 16,
            };
            let tags = |batch: &[BytesMut]| -> Vec<u8> {
                batch.iter().map(|p| p[HEADROOM + 28]).collect()
            };
            let mut pool = RecvPool::default();
            let mut batch = Vec::new();

            // Queued before the call (and seen by the reactor): read in one call.
            for tag in 1..=3 {
                send(tag);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let n = tun
                .recv_many(&mut pool, layout, &mut batch, 32)
                .await
                .expect("recv_many");
            assert_eq!((n, tags(&batch)), (3, vec![1, 2, 3]));
            batch.clear();

            // Arriving while the call waits: the first comes back alone, the rest next call.
            {
                let waiting = tun.recv_many(&mut pool, layout, &mut batch, 32);
                tokio::pin!(waiting);
                tokio::select! {
                    r = &mut waiting => panic!("nothing was sent, yet recv_many returned {r:?}"),
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                for tag in 4..=6 {
                    send(tag);
                }
                let n = tokio::time::timeout(Duration::from_secs(5), waiting)
                    .await
                    .expect("the waiting call never returned")
                    .expect("recv_many");
                assert_eq!(n, 1);
            }
            assert_eq!(tags(&batch), vec![4]);
            batch.clear();
            let n = tun
                .recv_many(&mut pool, layout, &mut batch, 32)
                .await
                .expect("recv_many");
            assert_eq!((n, tags(&batch)), (2, vec![5, 6]));
            batch.clear();

            // Empty: the next call waits.
            let idle = tokio::time::timeout(
                Duration::from_millis(100),
                tun.recv_many(&mut pool, layout, &mut batch, 32),
            )
            .await;
            assert!(
                idle.is_err(),
                "recv_many returned without a packet: {idle:?}"
            );
        })
    })
    .expect("run_in");
}

/// A UDP/IPv4 reply to `request`: addresses and ports swapped, `payload`, IP checksum set,
/// UDP checksum 0 (allowed for IPv4).
fn udp_reply(request: &[u8], payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut reply = vec![0u8; total];
    reply[0] = 0x45;
    reply[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    reply[8] = 64;
    reply[9] = 17;
    reply[12..16].copy_from_slice(&request[16..20]);
    reply[16..20].copy_from_slice(&request[12..16]);
    let c = checksum(&reply[..20]);
    reply[10..12].copy_from_slice(&c.to_be_bytes());
    reply[20..22].copy_from_slice(&request[22..24]);
    reply[22..24].copy_from_slice(&request[20..22]);
    reply[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    reply[28..].copy_from_slice(payload);
    reply
}

#[test]
fn routes_and_addresses_can_be_removed() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let _tun = Tun::open(TUN).expect("open tun");
            let nl = Netlink::open().expect("netlink");
            nl.set_link_up(TUN).await.expect("up");
            nl.add_address(TUN, p("10.99.0.1/24"))
                .await
                .expect("address");
            let route = Route {
                metric: Some(9),
                ..Route::via_dev(p(ROUTED), TUN)
            };
            nl.add_route(&route).await.expect("route");
            nl.del_route(&route).await.expect("del route");
            let routes = nl.routes(Family::V4).await.expect("routes");
            assert!(!routes.iter().any(|r| r.dst == p(ROUTED)), "{routes:?}");
            nl.del_address(TUN, p("10.99.0.1/24"))
                .await
                .expect("del address");
            let left = nl.addresses(TUN).await.expect("addresses");
            assert!(!left.contains(&p("10.99.0.1/24")), "{left:?}");
            nl.set_link_down(TUN).await.expect("down");
            assert!(!nl.link(TUN).await.expect("link").up);
            let missing = nl.link("nonexistent0").await.expect_err("no such link");
            assert!(
                matches!(missing, netio::netlink::NetlinkError::NoSuchLink { .. }),
                "{missing:?}"
            );
            // Checked while the tun exists: its routes would vanish with it anyway.
            assert!(!ip_n(&ns, &["route"]).contains(ROUTED));
            assert!(!ip_n(&ns, &["addr"]).contains("10.99.0.1"));
        })
    })
    .expect("run_in");
}

/// A route as both sides can describe it: destination, gateway, device, metric.
type RouteView = (IpPrefix, Option<IpAddr>, Option<String>, Option<u32>);

/// The main table's routes as `ip [-6] route` prints them (`default`, `DST`, `via GW`,
/// `dev D`, `metric M`), link-local (`fe80::/64`) left out, sorted.
fn ip_routes(ns: &Netns, family: &str) -> Vec<RouteView> {
    let shown = ip_n(ns, &[family, "route", "show", "table", "main"]);
    let mut routes: Vec<RouteView> = shown
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| words.get(i + 1))
                    .copied()
            };
            let dst = match (words[0], family) {
                ("default", "-4") => p("0.0.0.0/0"),
                ("default", _) => p("::/0"),
                (dst, _) => p(dst),
            };
            (
                dst,
                after("via").map(|gw| gw.parse().expect("gateway")),
                after("dev").map(str::to_owned),
                after("metric").map(|m| m.parse().expect("metric")),
            )
        })
        .filter(|(dst, ..)| !p("fe80::/10").contains(dst.addr()))
        .collect();
    routes.sort_by_key(|r| format!("{r:?}"));
    routes
}

/// Our route listing in the same form.
async fn our_routes(nl: &Netlink, family: Family) -> Vec<RouteView> {
    let mut routes: Vec<RouteView> = nl
        .routes(family)
        .await
        .expect("routes")
        .into_iter()
        .map(|r| {
            assert_eq!(r.table, 254, "main table only: {r:?}");
            (r.dst, r.gateway, r.dev, r.metric)
        })
        .filter(|(dst, ..)| !p("fe80::/10").contains(dst.addr()))
        .collect();
    routes.sort_by_key(|r| format!("{r:?}"));
    routes
}

/// The addresses of `dev` as `ip -o addr` prints them (`inet[6] ADDR/LEN`), link-local left
/// out, sorted.
fn ip_addresses(ns: &Netns, dev: &str) -> Vec<IpPrefix> {
    let shown = ip_n(ns, &["-o", "addr", "show", "dev", dev]);
    let mut addrs: Vec<IpPrefix> = shown
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "inet" || *w == "inet6")?;
            Some(p(words.get(i + 1)?))
        })
        .filter(|a| !p("fe80::/10").contains(a.addr()))
        .collect();
    addrs.sort_by_key(|a| a.to_string());
    addrs
}

async fn our_addresses(nl: &Netlink, dev: &str) -> Vec<IpPrefix> {
    let mut addrs: Vec<IpPrefix> = nl
        .addresses(dev)
        .await
        .expect("addresses")
        .into_iter()
        .filter(|a| !p("fe80::/10").contains(a.addr()))
        .collect();
    addrs.sort_by_key(|a| a.to_string());
    addrs
}

/// Every call of the netlink API, each checked against what iproute2 shows in the same
/// namespace: links (`ip -d -o link`), addresses (`ip -o addr`), routes of both families
/// (`ip route`, `ip -6 route`, `ip -d route` for protocol and scope), and the removals.
#[test]
fn netlink_agrees_with_iproute2() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let _tun = Tun::open(TUN).expect("open tun");
            let nl = Netlink::open().expect("netlink");

            // Links: mtu, qlen, up, and the list of all links.
            nl.set_mtu(TUN, 1280).await.expect("mtu");
            nl.set_txqueuelen(TUN, 42).await.expect("txqueuelen");
            nl.set_link_up(TUN).await.expect("up");
            let link = nl.link(TUN).await.expect("link");
            let shown = ip_n(&ns, &["-d", "-o", "link", "show", TUN]);
            assert!(
                shown.starts_with(&format!("{}: {TUN}: <", link.index)),
                "{shown}"
            );
            assert!(
                shown.contains(",UP") && shown.contains("mtu 1280 "),
                "{shown}"
            );
            assert!(shown.contains(" qlen 42"), "{shown}");
            assert_eq!(
                (link.up, link.mtu, link.txqueuelen),
                (true, Some(1280), Some(42))
            );
            let mut ours: Vec<String> = nl
                .links()
                .await
                .expect("links")
                .into_iter()
                .map(|l| format!("{}: {}", l.index, l.name))
                .collect();
            ours.sort();
            let mut theirs: Vec<String> = ip_n(&ns, &["-o", "link"])
                .lines()
                .filter_map(|l| l.split_once(": <").map(|(head, _)| head.to_owned()))
                .collect();
            theirs.sort();
            assert_eq!(ours, theirs);
            assert_eq!(nl.link_index(TUN).await.expect("index"), link.index);

            // Addresses: IPv4 with and without a broadcast address, IPv6.
            for a in ["10.99.0.1/24", "10.98.0.1/32", "fd00:99::1/64"] {
                nl.add_address(TUN, p(a)).await.expect("add address");
            }
            let again = nl
                .add_address(TUN, p("10.99.0.1/24"))
                .await
                .expect_err("duplicate address");
            assert_eq!(again.raw_os_error(), Some(17), "EEXIST expected: {again}");
            let shown = ip_n(&ns, &["-o", "addr", "show", "dev", TUN]);
            for line in [
                format!("inet 10.99.0.1/24 brd 10.99.0.255 scope global {TUN}"),
                format!("inet 10.98.0.1/32 scope global {TUN}"),
                "inet6 fd00:99::1/64 scope global".to_owned(),
            ] {
                assert!(shown.contains(&line), "{line:?} missing in {shown}");
            }
            assert_eq!(our_addresses(&nl, TUN).await, ip_addresses(&ns, TUN));
            assert_eq!(
                our_addresses(&nl, TUN).await,
                [p("10.98.0.1/32"), p("10.99.0.1/24"), p("fd00:99::1/64")]
            );

            // Routes of both families, with and without gateway and metric, and a default.
            let routes = [
                Route {
                    gateway: Some(GATEWAY.into()),
                    metric: Some(77),
                    ..Route::via_dev(p(ROUTED), TUN)
                },
                Route::via_dev(p("10.201.0.0/16"), TUN),
                Route {
                    gateway: Some(Ipv4Addr::new(10, 99, 0, 254).into()),
                    metric: Some(100),
                    ..Route::via_dev(p("0.0.0.0/0"), TUN)
                },
                Route {
                    gateway: Some("fd00:99::2".parse().expect("gw")),
                    metric: Some(5),
                    ..Route::via_dev(p("fd00:200::/48"), TUN)
                },
                Route::via_dev(p("fd00:201::/48"), TUN),
            ];
            for r in &routes {
                nl.add_route(r).await.expect("add route");
            }
            let v4 = our_routes(&nl, Family::V4).await;
            assert_eq!(v4, ip_routes(&ns, "-4"));
            let tun = Some(TUN.to_owned());
            for expected in [
                (p(ROUTED), Some(IpAddr::V4(GATEWAY)), tun.clone(), Some(77)),
                (p("10.201.0.0/16"), None, tun.clone(), None),
                (
                    p("0.0.0.0/0"),
                    Some("10.99.0.254".parse().expect("ip")),
                    tun.clone(),
                    Some(100),
                ),
                // The kernel's own route for the /24.
                (p("10.99.0.0/24"), None, tun.clone(), None),
            ] {
                assert!(v4.contains(&expected), "{expected:?} missing in {v4:?}");
            }
            let v6 = our_routes(&nl, Family::V6).await;
            assert_eq!(v6, ip_routes(&ns, "-6"));
            for expected in [
                (
                    p("fd00:200::/48"),
                    Some("fd00:99::2".parse().expect("ip")),
                    tun.clone(),
                    Some(5),
                ),
                // IPv6 routes added without a metric get the kernel's default, 1024.
                (p("fd00:201::/48"), None, tun.clone(), Some(1024)),
            ] {
                assert!(v6.contains(&expected), "{expected:?} missing in {v6:?}");
            }
            // Protocol boot; scope link without a gateway, global with one.
            let detail = ip_n(&ns, &["-d", "route"]);
            for line in [
                format!(
                    "unicast {ROUTED} via {GATEWAY} dev {TUN} proto boot scope global metric 77"
                ),
                format!("unicast 10.201.0.0/16 dev {TUN} proto boot scope link"),
            ] {
                assert!(detail.contains(&line), "{line:?} missing in {detail}");
            }

            // A deletion must match: a wrong metric is ESRCH (3, "No such process").
            let wrong = Route {
                metric: Some(9),
                ..routes[1].clone()
            };
            let missing = nl.del_route(&wrong).await.expect_err("no such route");
            assert_eq!(missing.raw_os_error(), Some(3), "ESRCH expected: {missing}");
            // Removals: routes with gateway and metric of both families, the default route,
            // an IPv4 and the IPv6 address.
            for r in [&routes[0], &routes[2], &routes[3]] {
                nl.del_route(r).await.expect("del route");
            }
            let v4 = our_routes(&nl, Family::V4).await;
            assert_eq!(v4, ip_routes(&ns, "-4"));
            assert!(
                !v4.iter().any(|r| r.0 == p(ROUTED) || r.0 == p("0.0.0.0/0")),
                "{v4:?}"
            );
            assert!(v4.iter().any(|r| r.0 == p("10.201.0.0/16")), "{v4:?}");
            let v6 = our_routes(&nl, Family::V6).await;
            assert_eq!(v6, ip_routes(&ns, "-6"));
            assert!(!v6.iter().any(|r| r.0 == p("fd00:200::/48")), "{v6:?}");
            assert!(v6.iter().any(|r| r.0 == p("fd00:201::/48")), "{v6:?}");

            nl.del_address(TUN, p("10.98.0.1/32"))
                .await
                .expect("del v4");
            nl.del_address(TUN, p("fd00:99::1/64"))
                .await
                .expect("del v6");
            assert_eq!(our_addresses(&nl, TUN).await, [p("10.99.0.1/24")]);
            assert_eq!(ip_addresses(&ns, TUN), [p("10.99.0.1/24")]);

            nl.set_link_down(TUN).await.expect("down");
            let shown = ip_n(&ns, &["-o", "link", "show", TUN]);
            assert!(!shown.contains(",UP"), "{shown}");
            assert!(!nl.link(TUN).await.expect("link").up);
        })
    })
    .expect("run_in");
}

/// What the HA clients ask of netlink (`docs/ha.md`): a route with a source address and a
/// metric, an IPv6 address usable at once as a source, a route in a table of its own, and a
/// fwmark rule to that table, each as iproute2 reads it back, and each removable.
#[test]
fn sources_tables_and_fwmark_rules_as_iproute2_sees_them() {
    require_lab(&[]);
    let ns = Netns::new().expect("netns");
    ns.run_in(|| {
        runtime().block_on(async {
            let _tun = Tun::open(TUN).expect("open tun");
            let nl = Netlink::open().expect("netlink");
            nl.set_link_up(TUN).await.expect("up");
            nl.add_address(TUN, p("10.99.0.1/24")).await.expect("v4");
            nl.add_address_nodad(TUN, p("fd8f:6d53:b97a:1::a63:1/128"))
                .await
                .expect("v6 nodad");
            let v4 = Route {
                metric: Some(101),
                source: Some(LOCAL.into()),
                ..Route::via_dev(p(ROUTED), TUN)
            };
            // Refused while the address is tentative: nodad makes it usable at once.
            let v6 = Route {
                metric: Some(101),
                source: Some("fd8f:6d53:b97a:1::a63:1".parse().expect("v6")),
                ..Route::via_dev(p("fd00:250::/64"), TUN)
            };
            let table = Route {
                table: Some(101),
                ..Route::via_dev(p("10.1.0.0/16"), TUN)
            };
            for r in [&v4, &v6, &table] {
                nl.add_route(r).await.expect("route");
            }
            let rule = FwmarkRule {
                family: Family::V4,
                fwmark: 101,
                table: 101,
                priority: 101,
            };
            nl.add_rule(&rule).await.expect("rule");
            let shown = ip_n(&ns, &["route", "show", "dev", TUN]);
            assert!(
                shown.contains("10.200.0.0/16 scope link src 10.99.0.1 metric 101"),
                "{shown}"
            );
            let shown = ip_n(&ns, &["-6", "route", "show", "dev", TUN]);
            assert!(
                shown.contains("fd00:250::/64 src fd8f:6d53:b97a:1::a63:1 metric 101"),
                "{shown}"
            );
            assert!(!ip_n(&ns, &["-6", "addr"]).contains("tentative"));
            let shown = ip_n(&ns, &["route", "show", "table", "101"]);
            assert!(shown.contains("10.1.0.0/16 dev vpnt-tun0"), "{shown}");
            assert!(!ip_n(&ns, &["route", "show"]).contains("10.1.0.0/16"));
            let shown = ip_n(&ns, &["rule"]);
            assert!(
                shown.contains("101:\tfrom all fwmark 0x65 lookup 101"),
                "{shown}"
            );
            // Read back by our own dump (main table only).
            let routes = nl.routes(Family::V4).await.expect("routes");
            let ours = routes
                .iter()
                .find(|r| r.dst == p(ROUTED))
                .expect("our route");
            assert_eq!((ours.source, ours.metric), (Some(LOCAL.into()), Some(101)));
            assert!(
                !routes.iter().any(|r| r.dst == p("10.1.0.0/16")),
                "{routes:?}"
            );
            nl.del_rule(&rule).await.expect("del rule");
            nl.del_route(&table).await.expect("del table route");
            assert!(!ip_n(&ns, &["rule"]).contains("fwmark"));
            assert!(ip_n(&ns, &["route", "show", "table", "101"]).is_empty());
        })
    })
    .expect("run_in");
}
