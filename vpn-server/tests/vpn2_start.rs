//! The vpn2 drop-in of the seed server in a lab namespace (the pod's network namespace), with
//! Debian's `nft` and `ip` as referees:
//!
//! * `vpn-server setup` turns `disable_ipv6` from 1 to 0 and is a no-op the second time;
//! * the environment-mode start (no `--config`) installs vpn2's rules in the table
//!   `vpn-seed-server` (replies only from `tun0`, the 241/8 mapping of the seed's pods, the
//!   proxy group's mapping of the shoot networks), routes only the mapped ranges and IPv6 shoot
//!   networks into `tun0`; after `kill -9` the table stays and the next start replaces it
//!   (no duplicates); SIGTERM removes it; the tunnel-only rules (`vpn-seed-server-guard`)
//!   stay after either; the first packet routed into `tun0` at a start (and at the start after
//!   `kill -9`) is already mapped;
//! * `vpn-server firewall --mode up|down` (vpn2's OpenVPN hooks) installs and removes the rules
//!   and routes for a device, and `up` twice is `up` once.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::pki_fixture::TestPki;
use lab::require_lab;
use netio::firewall::VPN2_PROXY_GID;

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const TIMEOUT: Duration = Duration::from_secs(20);

/// vpn2's secrets layout under `dir` (`vpn-server/{ca.crt,tls.crt,tls.key}`,
/// `tlsauth/vpn.tlsauth`), as Gardener mounts them.
fn secrets(pki: &TestPki, dir: &Path) {
    std::fs::create_dir_all(dir.join("vpn-server")).unwrap();
    std::fs::create_dir_all(dir.join("tlsauth")).unwrap();
    std::fs::copy(pki.ca_cert(), dir.join("vpn-server/ca.crt")).unwrap();
    std::fs::copy(pki.server_cert(), dir.join("vpn-server/tls.crt")).unwrap();
    std::fs::copy(pki.server_key(), dir.join("vpn-server/tls.key")).unwrap();
    std::fs::copy(pki.ta_key(), dir.join("tlsauth/vpn.tlsauth")).unwrap();
}

/// A seed pod for an environment-mode start: its secrets in a fresh directory, its namespace
/// and the server's log file.
fn env_lab() -> (tempfile::TempDir, Netns, std::path::PathBuf) {
    require_lab(&["nft", "openssl", "openvpn"]);
    let pki = TestPki::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    secrets(&pki, dir.path());
    let ns = Netns::new().unwrap();
    let log = dir.path().join("server.log");
    (dir, ns, log)
}

fn stdout(ns: &Netns, argv: &[&str]) -> String {
    String::from_utf8_lossy(&ns.run(argv.iter().copied()).unwrap().stdout).into_owned()
}

const SEED_TABLE: &str = "table inet vpn-seed-server {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname \"tun0\" ct state established,related accept
		iifname \"tun0\" drop
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname \"tun0\" ct state established,related accept
		iifname \"tun0\" drop
	}

	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname \"tun0\" ip daddr 241.0.0.0/8 dnat ip prefix to 10.1.0.0/16
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname \"tun0\" ip saddr 10.1.0.0/16 snat ip prefix to 241.0.0.0/8
	}

	chain output {
		type nat hook output priority -100; policy accept;
		meta skgid 31415 ip daddr 100.96.0.0/11 dnat ip prefix to 244.0.0.0/11
		meta skgid 31415 ip daddr 100.64.0.0/13 dnat ip prefix to 243.0.0.0/13
		meta skgid 31415 ip daddr 10.250.0.0/16 dnat ip prefix to 242.0.0.0/16
	}

	chain proxy-guard {
		type filter hook output priority filter; policy accept;
		meta skgid 31415 ct state new meta l4proto tcp ip daddr 10.1.0.0/16 reject with tcp reset
		meta skgid 31415 ct state new meta l4proto tcp ip daddr 127.0.0.0/8 reject with tcp reset
		meta skgid 31415 ct state new meta l4proto tcp ip daddr 169.254.0.0/16 reject with tcp reset
		meta skgid 31415 ct state new meta l4proto tcp ip6 daddr ::1 reject with tcp reset
		meta skgid 31415 ct state new meta l4proto tcp ip6 daddr fe80::/10 reject with tcp reset
	}
}
";

/// Starts the server in vpn2 environment mode in `ns`; returns its pid once it serves.
fn start(ns: &Netns, secrets_dir: &Path, log: &Path) -> u32 {
    start_with(ns, secrets_dir, log, &[])
}

fn start_with(ns: &Netns, secrets_dir: &Path, log: &Path, extra: &[(&str, &str)]) -> u32 {
    let mut cmd = ns.command(BIN);
    cmd.env_clear()
        .envs(extra.iter().copied())
        .env("VPN_SERVER_SECRETS_DIR", secrets_dir)
        .env("OPENVPN_STATUS_PATH", secrets_dir.join("openvpn.status"))
        .env("SHOOT_POD_NETWORKS", "100.96.0.0/11")
        .env("SHOOT_SERVICE_NETWORKS", "100.64.0.0/13")
        .env("SHOOT_NODE_NETWORKS", "10.250.0.0/16,fd00:10::/64")
        .env("SEED_POD_NETWORK", "10.1.0.0/16")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let pid = ns.spawn(&mut cmd).unwrap();
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("Initialization Sequence Completed") {
            return pid;
        }
        assert!(started.elapsed() < TIMEOUT, "no start:\n{text}");
        assert!(ns.try_wait(pid).is_none(), "vpn-server ended:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(ns: &Netns, pid: u32, signal: &str) -> std::process::ExitStatus {
    assert!(Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let sent = Instant::now();
    loop {
        if let Some(status) = ns.try_wait(pid) {
            return status;
        }
        assert!(sent.elapsed() < TIMEOUT, "still running after {signal}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn setup_switches_ipv6_on_once() {
    require_lab(&[]);
    let ns = Netns::new().unwrap();
    ns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
        .unwrap();
    for _ in 0..2 {
        let out = ns.run([BIN, "setup"]).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            stdout(&ns, &["sysctl", "-n", "net.ipv6.conf.all.disable_ipv6"]).trim(),
            "0"
        );
    }
}

#[test]
fn the_env_mode_start_holds_vpn2s_rules_and_a_clean_stop_leaves_none() {
    let (dir, ns, log) = env_lab();

    let pid = start(&ns, dir.path(), &log);
    assert_eq!(
        stdout(&ns, &["nft", "list", "table", "inet", "vpn-seed-server"]),
        SEED_TABLE
    );
    // Only the mapped ranges and the IPv6 shoot network go into the tunnel.
    let v4 = stdout(&ns, &["ip", "-4", "route", "show", "dev", "tun0"]);
    for mapped in ["242.0.0.0/8", "243.0.0.0/8", "244.0.0.0/8"] {
        assert!(v4.contains(mapped), "{mapped} not routed:\n{v4}");
    }
    for real in ["100.96.0.0/11", "100.64.0.0/13", "10.250.0.0/16"] {
        assert!(!v4.contains(real), "{real} routed:\n{v4}");
    }
    let v6 = stdout(&ns, &["ip", "-6", "route", "show", "dev", "tun0"]);
    assert!(v6.contains("fd00:10::/64"), "{v6}");
    assert!(v6.contains("fd8f:6d53:b97a:1::/96"), "{v6}");

    // The proxy group reaches nothing of the seed's over TCP: a seed pod address and loopback
    // refuse it at once (the guard answers its SYN with a reset), while root gets through.
    ns.run(["ip", "addr", "add", "10.1.0.5/32", "dev", "lo"])
        .unwrap();
    let listeners = ns
        .run_in(|| {
            [
                std::net::TcpListener::bind("10.1.0.5:8080").unwrap(),
                std::net::TcpListener::bind("127.0.0.1:8080").unwrap(),
            ]
        })
        .unwrap();
    for target in ["10.1.0.5", "127.0.0.1"] {
        let connect = format!("exec 3<>/dev/tcp/{target}/8080");
        let as_group = |gid: &str| {
            ns.command("timeout")
                .args(["5", "setpriv", "--regid", gid, "--clear-groups"])
                .args(["bash", "-c", &connect])
                .status()
                .unwrap()
                .success()
        };
        assert!(!as_group("31415"), "the proxy group reached {target}");
        assert!(as_group("0"), "root did not reach {target}");
    }
    drop(listeners);
    // Connections to the proxy group's own listeners are answered (the kube-apiserver's to the
    // CONNECT proxy come from the seed pod network).
    let answered = ns
        .run_in(|| {
            let (bound, is_bound) = std::sync::mpsc::channel();
            let server = std::thread::spawn(move || {
                use std::io::Write;
                // This thread only: its sockets belong to the proxy group.
                let gid = rustix::process::Gid::from_raw(VPN2_PROXY_GID);
                rustix::thread::set_thread_res_gid(gid, gid, gid).unwrap();
                let listener = std::net::TcpListener::bind("10.1.0.5:8081").unwrap();
                bound.send(()).unwrap();
                let (mut s, _) = listener.accept().unwrap();
                s.write_all(b"answer").unwrap();
            });
            is_bound.recv().unwrap();
            use std::io::Read;
            let to = "10.1.0.5:8081".parse().unwrap();
            let mut c = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let read = c.read_to_end(&mut got).map(|_| got);
            server.join().unwrap();
            read
        })
        .unwrap();
    assert_eq!(answered.unwrap(), b"answer");

    // kill -9: the mappings stay (the device went with the process), with the tunnel-only
    // rules (DEVIATIONS V1, V8); the next start replaces them.
    assert!(!stop(&ns, pid, "-KILL").success());
    assert_eq!(
        stdout(&ns, &["nft", "list", "table", "inet", "vpn-seed-server"]),
        SEED_TABLE
    );
    let ruleset = stdout(&ns, &["nft", "list", "ruleset"]);
    assert!(
        ruleset.contains("table inet vpn-seed-server-guard {"),
        "{ruleset}"
    );

    // A restart installs the same rules once; SIGTERM removes them and exits 0.
    let pid = start(&ns, dir.path(), &log);
    assert_eq!(
        stdout(&ns, &["nft", "list", "table", "inet", "vpn-seed-server"]),
        SEED_TABLE
    );
    assert_eq!(
        stdout(&ns, &["nft", "list", "tables"])
            .matches("table inet vpn-seed-server\n")
            .count(),
        1
    );
    let status = stop(&ns, pid, "-TERM");
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let ruleset = stdout(&ns, &["nft", "list", "ruleset"]);
    assert!(
        !ruleset.contains("table inet vpn-seed-server {"),
        "{ruleset}"
    );
    // Only the tunnel-only rules stay (DEVIATIONS V8).
    assert!(
        ruleset.contains("table inet vpn-seed-server-guard {"),
        "{ruleset}"
    );
}

#[test]
fn the_firewall_hook_installs_and_removes_rules_and_routes() {
    require_lab(&["nft"]);
    let ns = Netns::new().unwrap();
    // A tun device for the hook to work on, as OpenVPN would have opened it.
    ns.run(["ip", "tuntap", "add", "dev", "tun0", "mode", "tun"])
        .unwrap();
    ns.run(["ip", "link", "set", "tun0", "up"]).unwrap();
    let up = [
        BIN,
        "firewall",
        "--mode",
        "up",
        "--device",
        "tun0",
        "--shoot-network=242.0.0.0/8,243.0.0.0/8",
        "--shoot-network=fd00:10::/64",
        "--seed-pod-network=10.1.0.0/16",
        // What OpenVPN appends to a hook's command line.
        "tun0",
        "1500",
        "0",
        "init",
    ];
    for _ in 0..2 {
        let out = ns.run(up).unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let table = stdout(&ns, &["nft", "list", "table", "inet", "vpn-seed-server"]);
    // One drop in INPUT and one in FORWARD: applied twice is applied once.
    assert_eq!(table.matches("iifname \"tun0\" drop").count(), 2, "{table}");
    assert!(table.contains("dnat ip prefix to 10.1.0.0/16"), "{table}");
    assert!(!table.contains("flags owner"), "{table}");
    assert!(!table.contains("skgid"), "{table}");
    let v4 = stdout(&ns, &["ip", "-4", "route", "show", "dev", "tun0"]);
    assert!(
        v4.contains("242.0.0.0/8") && v4.contains("243.0.0.0/8"),
        "{v4}"
    );
    let v6 = stdout(&ns, &["ip", "-6", "route", "show", "dev", "tun0"]);
    assert!(v6.contains("fd00:10::/64"), "{v6}");

    let out = ns
        .run([BIN, "firewall", "--mode", "down", "--device", "tun0"])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ruleset = stdout(&ns, &["nft", "list", "ruleset"]);
    assert!(!ruleset.contains("vpn-seed-server"), "{ruleset}");

    // A device that does not exist is an error, as in vpn2.
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name(), BIN, "firewall", "--mode", "up"])
        .args(["--device", "tun9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("device tun9 not found"), "{stderr}");
}

#[test]
fn auto_mtu_takes_the_default_routes_link_less_130() {
    require_lab(&["openssl", "openvpn"]);
    let pki = TestPki::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    secrets(&pki, dir.path());
    let pod = Netns::new().unwrap();
    let node = Netns::new().unwrap();
    Netns::veth_pair(&pod, "eth0", &node, "veth0").unwrap();
    pod.run(["ip", "link", "set", "eth0", "mtu", "8930"])
        .unwrap();
    pod.run(["ip", "addr", "add", "10.1.0.5/24", "dev", "eth0"])
        .unwrap();
    pod.run(["ip", "route", "add", "default", "via", "10.1.0.1"])
        .unwrap();
    let log = dir.path().join("server.log");
    let pid = start_with(&pod, dir.path(), &log, &[("OPENVPN_AUTO_MTU", "true")]);
    let link = stdout(&pod, &["ip", "link", "show", "tun0"]);
    assert!(link.contains("mtu 8800 "), "{link}");
    assert!(stop(&pod, pid, "-TERM").success());
}

/// Sends one UDP flow (`from` → the shoot's `244.0.20.20:9`, a mapped address) every 50 µs
/// from inside `ns` until `stop` is set: at most 400,000 datagrams or 20 s. Send errors (no
/// route yet, the server's unreachable answers) are the point and are ignored.
fn send_flow(ns: &Netns, from: std::net::SocketAddr, stop: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    ns.run_in(|| {
        let socket = std::net::UdpSocket::bind(from).unwrap();
        let to: std::net::SocketAddr = "244.0.20.20:9".parse().unwrap();
        let started = Instant::now();
        for _ in 0..400_000 {
            if stop.load(Ordering::Relaxed) || started.elapsed() > TIMEOUT {
                break;
            }
            let _ = socket.send_to(b"first", to);
            std::thread::sleep(Duration::from_micros(50));
        }
    })
    .unwrap();
}

/// The kernel's connection entry for the UDP flow from `from`, as `/proc/net/nf_conntrack`
/// of `ns` shows it.
fn flow_entry(ns: &Netns, from: std::net::SocketAddr) -> String {
    let table = stdout(ns, &["cat", "/proc/net/nf_conntrack"]);
    let needle = format!("src={} dst=244.0.20.20 sport={}", from.ip(), from.port());
    table
        .lines()
        .find(|l| l.contains(" udp ") && l.contains(&needle))
        .unwrap_or_else(|| panic!("no entry for {from}:\n{table}"))
        .to_owned()
}

/// The first packet a seed pod routes into `tun0` is already mapped: the rules are in force
/// before any route leads into the device, on the first start and on the one after `kill -9`
/// (whose owned table went with the process). A flow whose first packet left unmapped keeps
/// that in conntrack for its life, and the shoot's answers to the seed pod's own address never
/// come back: issue 29's replay lost a webhook connection for 25 s to this after a server
/// restart. A sender streams one UDP flow to a mapped shoot address through each start; its
/// entry must name the 241/8 mapping as the answers' destination.
#[test]
fn the_first_packet_into_the_tunnel_is_already_mapped() {
    let (dir, ns, log) = env_lab();
    // The seed pod's own address (SEED_POD_NETWORK is 10.1.0.0/16); tun0 has no IPv4
    // address, so a packet routed into it leaves from this one, mapped to 241.1.0.5.
    ns.run(["ip", "addr", "add", "10.1.0.5/32", "dev", "lo"])
        .unwrap();
    let mut pid = None;
    for port in [40_001, 40_002] {
        if let Some(pid) = pid.take() {
            assert!(!stop(&ns, pid, "-KILL").success());
        }
        let from = std::net::SocketAddr::from(([10, 1, 0, 5], port));
        let sending = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| send_flow(&ns, from, &sending));
            pid = Some(start(&ns, dir.path(), &log));
            sending.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let entry = flow_entry(&ns, from);
        assert!(
            entry.contains("src=244.0.20.20 dst=241.1.0.5"),
            "start {}: the flow's first packet left unmapped:\n{entry}",
            port - 40_000
        );
    }
    if let Some(pid) = pid {
        stop(&ns, pid, "-TERM");
    }
}
