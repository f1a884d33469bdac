//! The seed pod's tunnel-only rules (`vpn_server::vpn2::seed_guard`, table
//! `vpn-seed-server-guard`) outlive the server: after our server in vpn2's environment mode
//! is killed (`kill -9`), its device and routes are gone (its table stays until the next start,
//! DEVIATIONS V1; removed here as a clean stop removes it, with the proxy group's NETMAP), and
//! what the proxy sends to the shoot would follow the pod's default route into the seed's
//! network, where the shoot's pod addresses overlap the seed's own. With the guard
//! nothing to the shoot leaves by `eth0`, while the pod's own traffic to its seed neighbours
//! (the same addresses, not from the proxy group) still does, and so do the proxy group's
//! answers to them (a listener's SYN-ACK).
//!
//! ```text
//!   seed pod 100.96.0.10 fd00:1::10 ── eth0 ═══ eth0 ── seed network 100.96.0.1 fd00:1::1
//! ```

use std::time::Duration;

use conformance::gardener::capture::Capture;
use conformance::gardener::landscape::SEED_POD;
use conformance::gardener::pods::{seed_server_spec, Binaries, Mounts, SidecarMode, SERVER_READY};
use conformance::netns::Netns;
use conformance::require_lab;
use netio::firewall::VPN2_PROXY_GID;

fn sh(ns: &Netns, cmd: &str) {
    ns.run(cmd.split_whitespace()).expect(cmd);
}

fn nft_table(ns: &Netns, name: &str) -> Option<String> {
    ns.run(["nft", "list", "table", "inet", name])
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Whether a UDP datagram to `dst` port 9, sent as `gid` (root's group otherwise), leaves the
/// socket (a dropped one fails the send: `EPERM`).
fn sends(ns: &Netns, gid: Option<u32>, dst: &str) -> bool {
    let script = format!("echo x > /dev/udp/{dst}/9");
    let gid = gid.map(|g| g.to_string());
    let mut argv: Vec<&str> = Vec::new();
    if let Some(gid) = &gid {
        argv.extend(["setpriv", "--regid", gid, "--clear-groups"]);
    }
    argv.extend(["bash", "-c", &script]);
    ns.run(argv).is_ok()
}

#[test]
fn the_tunnel_only_rules_outlive_a_killed_server() {
    require_lab(&["ip", "nft", "setpriv", "tcpdump", "bash"]);
    let bins = Binaries::locate().expect("binaries (cargo build -p vpn-server)");
    let mounts = Mounts::generate().expect("mounts");
    let logs = tempfile::Builder::new()
        .prefix("vpnt-seed-guard-")
        .tempdir()
        .expect("tempdir");
    let seed = Netns::new().expect("seed pod");
    let network = Netns::new().expect("seed network");
    Netns::veth_pair(&seed, "eth0", &network, "eth0").expect("pod interface");
    for cmd in [
        &format!("ip addr add {SEED_POD}/24 dev eth0"),
        "ip -6 addr add fd00:1::10/64 dev eth0 nodad",
        "ip route add default via 100.96.0.1",
        "ip -6 route add default via fd00:1::1",
    ] {
        sh(&seed, cmd);
    }
    sh(&network, "ip addr add 100.96.0.1/24 dev eth0");
    sh(&network, "ip -6 addr add fd00:1::1/64 dev eth0 nodad");

    let server = seed_server_spec(&bins, &mounts, SidecarMode::Standalone)
        .start(&seed, logs.path())
        .expect("server");
    server
        .wait_log(SERVER_READY, Duration::from_secs(30))
        .expect("server up");
    let guard = nft_table(&seed, "vpn-seed-server-guard").expect("the guard table");
    for line in [
        "oifname \"tun0\" accept",
        "ip daddr 244.0.0.0/8 drop",
        "ip6 daddr fd00:96::/48 drop",
        "meta skgid 31415 ct state new ip daddr 100.96.0.0/11 drop",
    ] {
        assert!(guard.contains(line), "{line} missing: {guard}");
    }

    // The proxy's answers to a seed neighbour whose address lies in the shoot's networks (the
    // kube-apiserver's, in an overlapping landscape) leave by eth0: only the proxy's new
    // connections to those networks are the guard's.
    answers_as_the_proxy(&seed, &network);

    server.signal("KILL").expect("kill -9");
    server
        .wait_exit(Duration::from_secs(10))
        .expect("server gone");
    assert!(
        seed.run(["ip", "link", "show", "tun0"]).is_err(),
        "the device went with the process"
    );
    // The mappings outlive kill -9 (DEVIATIONS V1); after a clean stop they are gone. Remove
    // them as a clean stop would: the guard alone must hold what is left.
    assert!(
        nft_table(&seed, "vpn-seed-server").is_some(),
        "the table (and its NETMAP) outlives kill -9"
    );
    sh(&seed, "nft delete table inet vpn-seed-server");
    assert_eq!(
        nft_table(&seed, "vpn-seed-server-guard").as_deref(),
        Some(guard.as_str()),
        "the tunnel-only rules stay"
    );

    let to_shoot = "dst net 100.96.0.0/11 or dst net 100.64.0.0/13 or dst net 10.250.0.0/16 \
                    or dst net 242.0.0.0/7 or dst net 244.0.0.0/8 or dst net fd00:96::/48 \
                    or dst net fd00:64::/112 or dst net fd00:250::/48";
    let capture = Capture::start(&seed, "eth0", to_shoot).expect("capture");
    let proxy = Some(VPN2_PROXY_GID);
    for (gid, dst, what) in [
        (proxy, "100.64.0.5", "the proxy to a shoot service"),
        (
            proxy,
            "100.96.5.5",
            "the proxy to a shoot pod (overlapping the seed's)",
        ),
        (proxy, "10.250.0.5", "the proxy to a shoot node"),
        (None, "244.0.0.5", "anyone to a mapped shoot range"),
        (None, "fd00:96::5", "anyone to an IPv6 shoot network"),
    ] {
        assert!(!sends(&seed, gid, dst), "{what} left the pod");
    }
    assert!(
        sends(&seed, None, "100.96.5.5"),
        "the pod's own traffic to its seed neighbours still leaves"
    );
    let seen = capture.finish().expect("capture");
    let leaked: Vec<_> = seen
        .iter()
        // Sent by the pod, but for its own sockets' datagram.
        .filter(|p| ["100.96.0.10", "fd00:1::10"].contains(&p.src.to_string().as_str()))
        .filter(|p| p.dst.to_string() != "100.96.5.5")
        .collect();
    assert!(leaked.is_empty(), "left by eth0: {leaked:?}");
    assert!(
        seen.iter().any(|p| p.dst.to_string() == "100.96.5.5"),
        "the capture sees what does leave: {seen:?}"
    );
}

/// A listener of the proxy group (gid 31415, as Envoy's and our sidecar's) in `seed` on 9443
/// accepts a connection from `network` (100.96.0.1, inside the shoot's 100.96.0.0/11) and
/// its answer comes back.
fn answers_as_the_proxy(seed: &Netns, network: &Netns) {
    let listener = seed
        .run_in(|| {
            // Per thread on Linux: only this (short-lived) thread takes the proxy's group.
            rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(VPN2_PROXY_GID))?;
            std::net::TcpListener::bind((SEED_POD, 9443))
        })
        .expect("in the seed pod")
        .expect("listener as the proxy group");
    let server = std::thread::spawn(move || {
        if let Ok((mut c, _)) = listener.accept() {
            let _ = std::io::Write::write_all(&mut c, b"ok");
        }
    });
    let got = network
        .run_in(|| -> std::io::Result<Vec<u8>> {
            let mut s = std::net::TcpStream::connect_timeout(
                &(SEED_POD, 9443).into(),
                Duration::from_secs(3),
            )?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut buf = vec![0u8; 2];
            std::io::Read::read_exact(&mut s, &mut buf)?;
            Ok(buf)
        })
        .expect("in the seed network");
    assert_eq!(
        got.as_ref().map(Vec::as_slice).ok(),
        Some(&b"ok"[..]),
        "the proxy's answer to 100.96.0.1 left by eth0: {got:?}"
    );
    server.join().expect("listener thread");
}
