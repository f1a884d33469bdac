//! DEVIATIONS C2: the kernel sends IPv6 packets of its own into a fresh tun device (a router
//! solicitation from the link-local address, MLD reports); an upstream client carries them to
//! the server, which can only drop them. Our client does not send them.
//!
//! ```text
//!   SHOOT1 upstream client   vu 10.201.1.2/30 ── 10.201.1.1/30 ┐
//!                                                               SEED  our vpn-server (counts
//!   SHOOT2 vpn_client::run   vo 10.201.2.2/30 ── 10.201.2.1/30 ┘        what it ignores)
//! ```
//!
//! The kernel's own counters show the packets going into each client's tun
//! (`/proc/net/dev_snmp6/tun0`, `Icmp6OutMsgs`); the server's `ignored` counter shows what
//! reached it: more with the upstream client (the control), nothing more with ours, while a
//! ping crosses our client's tunnel.

use std::net::Ipv4Addr;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};
use conformance::wait::wait_until_every;
use vpn_client::{Remote, Stopped};

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(30);
/// How often a wait checks: its checks start a process in a namespace.
const POLL: Duration = Duration::from_millis(50);

/// ICMPv6 messages the kernel in `ns` has sent into `tun0` (0 while there is no tun0).
fn icmp6_out(ns: &Netns) -> u64 {
    let Ok(out) = ns.run(["cat", "/proc/net/dev_snmp6/tun0"]) else {
        return 0;
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Icmp6OutMsgs"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn veth(seed: &Netns, shoot: &Netns, name: &str, n: u8) -> Ipv4Addr {
    Netns::veth_pair(shoot, name, seed, &format!("{name}s")).expect("veth");
    for (ns, dev, host) in [(shoot, name.to_owned(), 2), (seed, format!("{name}s"), 1)] {
        let out = ns
            .run([
                "ip",
                "addr",
                "add",
                &format!("10.201.{n}.{host}/30"),
                "dev",
                &dev,
            ])
            .expect("ip addr");
        assert!(out.status.success(), "{out:?}");
    }
    Ipv4Addr::new(10, 201, n, 1)
}

#[test]
fn link_scoped_ipv6_from_the_tun_never_reaches_the_server() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let shoot_upstream = Netns::new().expect("shoot1");
    let shoot_ours = Netns::new().expect("shoot2");
    let via_upstream = veth(&seed, &shoot_upstream, "vu", 1);
    let via_ours = veth(&seed, &shoot_ours, "vo", 2);
    let mut settings = pki.our_server_settings(PORT).expect("server settings");
    // Both clients carry the same certificate.
    settings.duplicate_cn = true;
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &seed, settings).expect("our server");
        let stats = server.stats();

        // The control: an upstream client carries the kernel's packets to the server.
        {
            let config = tcp_client_config(&pki, PORT, ControlWrap::TlsAuth, &["auth SHA256"])
                .replace(
                    &format!("remote 127.0.0.1 {PORT}"),
                    &format!("remote {via_upstream} {PORT}"),
                );
            let client = UpstreamOpenvpn::start(&shoot_upstream, &config, 3).expect("upstream");
            client
                .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
                .expect("upstream client up");
            wait_until_every(
                "ICMPv6 into the upstream client's tun",
                TIMEOUT,
                POLL,
                || icmp6_out(&shoot_upstream) > 0,
            );
            wait_until_every(
                "the server ignoring the upstream client's packets",
                TIMEOUT,
                POLL,
                || stats.ignored() > 0,
            );
        }
        let ignored = stats.ignored();

        // Ours: the same packets go into its tun, none reaches the server.
        let client_settings = pki
            .our_client_settings(Remote::new(via_ours.to_string(), PORT))
            .expect("client settings");
        let client = ClientThread::spawn(scope, &shoot_ours, client_settings);
        wait_until_every("ICMPv6 into our client's tun", TIMEOUT, POLL, || {
            icmp6_out(&shoot_ours) > 0
        });
        // The tunnel carries traffic meanwhile.
        let out = seed
            .run(["ping", "-c", "3", "-i", "0.2", "-W", "2", "192.168.123.2"])
            .expect("ping");
        assert!(out.status.success(), "ping through our client: {out:?}");
        assert_eq!(client.stop().expect("our client"), Stopped::Shutdown);
        assert_eq!(
            stats.ignored(),
            ignored,
            "link-scoped packets from our client reached the server"
        );
        server.stop().result.expect("our server's run");
    });
}
