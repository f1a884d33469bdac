//! The seed table (`vpn_server::vpn2::seed_table`) forwards nothing the shoot starts, with real
//! kernel rules in lab namespaces:
//!
//! ```text
//!   shoot ── sh0 ═══ tun0 ── seed pod (forwarding on) ── eth0 ═══ eth0 ── other seed host
//!   192.168.100.2     .1                                 10.1.0.1         10.1.0.2
//!   fd00:100::2       ::1                                fd00:1::1        fd00:1::2
//! ```
//!
//! The tunnel device is a veth named `tun0`: every rule of the table matches by `iifname` /
//! `oifname`, so the name is all that makes it the tunnel. Unlike a tun device, a veth needs
//! neighbour discovery, which the table's INPUT guard drops on `tun0` like any other packet
//! the shoot starts; the two ends therefore know each other's link addresses statically. A
//! TCP SYN and a ping from the shoot
//! to the other seed host (its own address, and its 241/8 image for IPv4) do not reach it
//! (nf_tables counters on the far side stay at zero); connections the seed side opens towards
//! the shoot get their replies.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use conformance::netns::Netns;
use conformance::require_lab;
use netio::firewall::Firewall;

const PORT: u16 = 8080;

fn net(s: &str) -> ipnet::IpNet {
    s.parse().expect("network")
}

fn nft(ns: &Netns, args: &[&str]) -> String {
    let out = ns
        .run(std::iter::once("nft").chain(args.iter().copied()))
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(ns: &Netns, cmd: &str) {
    ns.run(cmd.split_whitespace()).expect(cmd);
}

/// The three namespaces, addressed and routed as drawn in the module docs.
struct Lab {
    shoot: Netns,
    seed: Netns,
    other: Netns,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            shoot: Netns::new().expect("shoot"),
            seed: Netns::new().expect("seed pod"),
            other: Netns::new().expect("other seed host"),
        };
        Netns::veth_pair(&lab.shoot, "sh0", &lab.seed, "tun0").expect("tunnel stand-in");
        Netns::veth_pair(&lab.seed, "eth0", &lab.other, "eth0").expect("pod network");
        for (ns, cmds) in [
            (
                &lab.shoot,
                &[
                    "ip link set sh0 address 02:00:00:00:64:02",
                    "ip -6 neigh add fd00:100::1 lladdr 02:00:00:00:64:01 dev sh0 nud permanent",
                    "ip neigh add 192.168.100.1 lladdr 02:00:00:00:64:01 dev sh0 nud permanent",
                    "ip addr add 192.168.100.2/24 dev sh0",
                    "ip -6 addr add fd00:100::2/64 dev sh0 nodad",
                    "ip route add default via 192.168.100.1",
                    "ip -6 route add default via fd00:100::1",
                ][..],
            ),
            (
                &lab.seed,
                &[
                    "ip link set tun0 address 02:00:00:00:64:01",
                    "ip -6 neigh add fd00:100::2 lladdr 02:00:00:00:64:02 dev tun0 nud permanent",
                    "ip neigh add 192.168.100.2 lladdr 02:00:00:00:64:02 dev tun0 nud permanent",
                    "ip addr add 192.168.100.1/24 dev tun0",
                    "ip -6 addr add fd00:100::1/64 dev tun0 nodad",
                    "ip addr add 10.1.0.1/24 dev eth0",
                    "ip -6 addr add fd00:1::1/64 dev eth0 nodad",
                    "sysctl -qw net.ipv4.ip_forward=1",
                    "sysctl -qw net.ipv6.conf.all.forwarding=1",
                ][..],
            ),
            (
                &lab.other,
                &[
                    "ip addr add 10.1.0.2/24 dev eth0",
                    "ip -6 addr add fd00:1::2/64 dev eth0 nodad",
                    "ip route add default via 10.1.0.1",
                    "ip -6 route add default via fd00:1::1",
                ][..],
            ),
        ] {
            for cmd in cmds {
                sh(ns, cmd);
            }
        }
        lab
    }

    /// The seed table for `tun0`, the seed pod network mapped to 241/8, as the server holds it.
    fn install_seed_table(&self) {
        let table = vpn_server::vpn2::seed_table("tun0", Some(net("10.1.0.0/16")), None);
        self.seed
            .run_in(|| {
                Firewall::open()
                    .expect("netfilter socket")
                    .apply(&table, false)
                    .expect("seed table")
            })
            .expect("in seed pod");
    }
}

/// Counters in `ns` for what a connection attempt leaves on arrival: TCP SYNs to [`PORT`] and
/// echo requests, both families.
fn count_arrivals(ns: &Netns) {
    for rule in [
        "add table inet seen",
        "add chain inet seen in { type filter hook prerouting priority -300; }",
        "add rule inet seen in tcp dport 8080 tcp flags syn / syn,ack counter",
        "add rule inet seen in icmp type echo-request counter",
        "add rule inet seen in icmpv6 type echo-request counter",
    ] {
        ns.run(["nft", rule]).expect(rule);
    }
}

fn arrivals(ns: &Netns) -> String {
    nft(ns, &["list", "chain", "inet", "seen", "in"])
}

/// A TCP connection from `from` to `to`; true when it was accepted.
fn connects(from: &Netns, to: SocketAddr) -> bool {
    from.run_in(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok())
        .expect("in namespace")
}

fn pings(from: &Netns, to: IpAddr) -> bool {
    from.run(["ping", "-c", "1", "-W", "2", &to.to_string()])
        .is_ok()
}

/// A listener on [`PORT`] on every address of `ns`, both families, kept open by the caller.
fn listen(ns: &Netns) -> TcpListener {
    ns.run_in(|| TcpListener::bind(("::", PORT)).expect("listen"))
        .expect("in namespace")
}

#[test]
fn nothing_the_shoot_starts_is_forwarded_from_the_tunnel() {
    require_lab(&["nft", "ping", "sysctl"]);
    let lab = Lab::new();
    lab.install_seed_table();
    count_arrivals(&lab.other);
    let _listener = listen(&lab.other);
    for to in ["10.1.0.2", "241.0.0.2", "fd00:1::2"] {
        let to: IpAddr = to.parse().expect("address");
        assert!(
            !connects(&lab.shoot, SocketAddr::new(to, PORT)),
            "the shoot connected to {to}"
        );
        assert!(!pings(&lab.shoot, to), "the shoot pinged {to}");
    }
    let seen = arrivals(&lab.other);
    assert_eq!(
        seen.matches("counter packets 0 ").count(),
        3,
        "something arrived at the other seed host:\n{seen}"
    );
    // And the rule that did it is in the kernel.
    let listed = nft(
        &lab.seed,
        &["list", "table", "inet", vpn_server::vpn2::TABLE],
    );
    for line in [
        "type filter hook forward priority filter; policy accept;",
        "iifname \"tun0\" ct state established,related accept",
        "iifname \"tun0\" drop",
    ] {
        assert!(listed.contains(line), "{line} missing:\n{listed}");
    }
    let forward = listed
        .split("chain forward")
        .nth(1)
        .expect("a forward chain");
    assert!(forward.contains("iifname \"tun0\" drop"), "{listed}");
}

#[test]
fn connections_the_seed_side_opens_towards_the_tunnel_get_their_replies() {
    require_lab(&["nft", "ping", "sysctl"]);
    let lab = Lab::new();
    lab.install_seed_table();
    let _listener = listen(&lab.shoot);
    for to in ["192.168.100.2", "fd00:100::2"] {
        let to: IpAddr = to.parse().expect("address");
        assert!(
            connects(&lab.other, SocketAddr::new(to, PORT)),
            "no connection to {to}"
        );
        assert!(pings(&lab.other, to), "no echo reply from {to}");
    }
}
