//! The bond stand-in of one pod: a Linux bridge named `bond0` with the pod's taps as ports
//! (STP off, multicast snooping off, learning off on the ports, a fixed MAC address), the
//! bond address `/104 nodad` on it, and a watcher thread inside the pod's namespace that
//! every 100 ms (the bond's `miimon`) looks at the taps' carriers and keeps exactly one port
//! forwarding: `tap0` if its carrier is up, else `tap1`; the other port's state is
//! `disabled`, so the bridge neither sends on it nor accepts what arrives there
//! (active-backup's one transmit path and its drop of frames on the inactive slave). With
//! learning off a unicast frame is flooded to the forwarding ports, which is the active one
//! alone: no bridge table can point at the inactive tap. The kernel's bridge turns a port
//! forwarding by itself the moment its carrier comes up (STP off), before the next look can
//! disable it, where a bond keeps a returning slave a backup: so the bridge-family table
//! `bond0-active` (its `input`, `output` and `forward` chains, rewritten in one transaction
//! with each change) also drops every frame to or from a port other than the active one,
//! and every frame between ports. Its `count` chain, after the guard, counts the frames
//! carrying an IPv4 packet in IPv6 (next header 4, the `ip6tnl` stand-ins' data path) that
//! left by each tap ([`tunnelled_sent`]; neighbour discovery, MLD, the path controller's
//! echoes and hellos are not counted). When the active port changes the watcher sends 5 unsolicited neighbour advertisements for the bond address, one per tick
//! (the bond's `num_peer_notif 5`), from the bond address to all nodes with its MAC address
//! as the target link-layer option and the override flag, so the server behind the newly
//! active tap learns the pod's MAC address at once.

use std::fs::File;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::Netns;
use crate::LabError;

/// The bridge's name (vpn2's bond's).
pub const BOND: &str = "bond0";
/// How often the watcher looks (the bond's `miimon 100`).
pub const MIIMON: Duration = Duration::from_millis(100);
/// Unsolicited neighbour advertisements after a change of the active port.
pub const PEER_NOTIFICATIONS: u32 = 5;

/// A change of the active port: when, and to which tap (`None`: no carrier on either).
pub type Change = (Instant, Option<usize>);

/// The running bond stand-in of one pod; dropping it stops the watcher (the devices go with
/// the namespace).
#[derive(Debug)]
pub struct Bond {
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<Vec<Change>>>,
    thread: Option<JoinHandle<()>>,
}

impl Bond {
    /// Builds `bond0` in `ns` with `taps` persistent tap devices `tap0..` as its ports (vpn2's
    /// init container creates them so; OpenVPN without `persist-tun` opens and closes them,
    /// which raises and drops their carrier), MAC address `mac`, `addr/104` without DAD, and
    /// starts the watcher.
    pub fn build(ns: &Netns, taps: usize, mac: [u8; 6], addr: Ipv6Addr) -> Result<Bond, LabError> {
        let mac_text = mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        ns.run([
            "ip",
            "link",
            "add",
            BOND,
            "address",
            &mac_text,
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
        ])?;
        for i in 0..taps {
            let tap = format!("tap{i}");
            ns.run(["ip", "tuntap", "add", "dev", &tap, "mode", "tap"])?;
            ns.run(["ip", "link", "set", &tap, "master", BOND])?;
            ns.run(["bridge", "link", "set", "dev", &tap, "learning", "off"])?;
            ns.run(["ip", "link", "set", &tap, "up"])?;
        }
        ns.run(["nft", &guard(None, true)])?;
        ns.run(["ip", "link", "set", BOND, "up"])?;
        ns.run([
            "ip",
            "addr",
            "add",
            &format!("{addr}/104"),
            "dev",
            BOND,
            "nodad",
        ])?;
        let path = format!("/run/netns/{}", ns.name());
        let netns = File::open(&path).map_err(|source| LabError::io(&path, source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(Mutex::new(Vec::new()));
        let watcher = Watcher {
            taps,
            mac,
            addr,
            stop: Arc::clone(&stop),
            changes: Arc::clone(&changes),
        };
        let thread = std::thread::spawn(move || {
            if move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network)).is_ok() {
                drop(netns);
                watcher.run();
            }
        });
        Ok(Bond {
            stop,
            changes,
            thread: Some(thread),
        })
    }

    /// The active port now (`None` before the first look or with no carrier).
    pub fn active(&self) -> Option<usize> {
        self.changes().last().and_then(|c| c.1)
    }

    /// Every change of the active port so far.
    pub fn changes(&self) -> Vec<Change> {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// When the active port last became `port` after `after`, waited for at most `limit`.
    pub fn wait_active(&self, port: usize, after: Instant, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            let at = self
                .changes()
                .into_iter()
                .rev()
                .find(|c| c.0 >= after && c.1 == Some(port))
                .map(|c| c.0);
            if at.is_some() && self.active() == Some(port) {
                return at;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bond {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the watcher thread owns.
struct Watcher {
    taps: usize,
    mac: [u8; 6],
    addr: Ipv6Addr,
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<Vec<Change>>>,
}

/// One port as `bridge -j link show` lists it.
struct Port {
    carrier: bool,
    forwarding: bool,
}

impl Watcher {
    /// Until stopped (bounded: 24 h of ticks): look, set the ports' states, announce.
    fn run(self) {
        let socket = self.na_socket();
        let all_nodes: socket2::SockAddr = SocketAddrV6::new(ALL_NODES, 0, 0, bond_index()).into();
        let mut last: Option<Option<usize>> = None;
        let mut notifications = 0;
        let mut ticks: u64 = 0;
        while !self.stop.load(Ordering::Relaxed) && ticks < 864_000 {
            ticks += 1;
            let ports = self.ports();
            if ports.len() == self.taps {
                let active = ports.iter().position(|p| p.carrier);
                if last != Some(active) {
                    quiet(Command::new("nft").arg(guard(active, false)));
                }
                for (i, p) in ports.iter().enumerate() {
                    let want = Some(i) == active;
                    if p.forwarding != want {
                        let state = if want { "3" } else { "0" };
                        quiet(Command::new("bridge").args([
                            "link",
                            "set",
                            "dev",
                            &format!("tap{i}"),
                            "state",
                            state,
                        ]));
                    }
                }
                if last != Some(active) {
                    last = Some(active);
                    self.changes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), active));
                    notifications = if active.is_some() {
                        PEER_NOTIFICATIONS
                    } else {
                        0
                    };
                }
            }
            if notifications > 0 {
                notifications -= 1;
                if let Some(s) = &socket {
                    let _ = s.send_to(&self.unsolicited_na(), &all_nodes);
                }
            }
            std::thread::sleep(MIIMON);
        }
    }

    /// The ports' carriers and states, in tap order (fewer when a tap is missing).
    fn ports(&self) -> Vec<Port> {
        let Ok(out) = Command::new("bridge")
            .args(["-j", "link", "show"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        else {
            return Vec::new();
        };
        let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (0..self.taps)
            .filter_map(|i| {
                let name = format!("tap{i}");
                let p = list.iter().find(|p| p["ifname"] == name.as_str())?;
                let flags = p["flags"].as_array()?;
                Some(Port {
                    carrier: flags.iter().any(|f| f == "LOWER_UP"),
                    forwarding: p["state"] == "forwarding",
                })
            })
            .collect()
    }

    /// A raw ICMPv6 socket bound to the bond address, hop limit 255 (as neighbour discovery
    /// requires), in the bond's namespace.
    fn na_socket(&self) -> Option<Socket> {
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).ok()?;
        s.set_multicast_hops_v6(255).ok()?;
        s.bind(&SocketAddrV6::new(self.addr, 0, 0, 0).into()).ok()?;
        Some(s)
    }

    /// An unsolicited neighbour advertisement for the bond address (RFC 4861 §4.4: type 136,
    /// override flag, target, target link-layer address option); the kernel fills in the
    /// checksum of a raw ICMPv6 socket.
    fn unsolicited_na(&self) -> Vec<u8> {
        let mut p = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
        p.extend_from_slice(&self.addr.octets());
        p.extend_from_slice(&[2, 1]);
        p.extend_from_slice(&self.mac);
        p
    }
}

/// All nodes on the link (`ff02::1`), where the advertisements go (on `bond0`: its interface
/// index as the scope).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// `bond0`'s interface index from `ip -j link` (this thread's namespace; `/sys` is the root
/// namespace's).
fn bond_index() -> u32 {
    Command::new("ip")
        .args(["-j", "link", "show", "dev", BOND])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v[0]["ifindex"].as_u64())
        .and_then(|i| u32::try_from(i).ok())
        .unwrap_or(0)
}

/// The frames with an IPv4 packet in IPv6 the bond stand-in in `ns` has sent by `tap<i>`
/// (`i` < 2).
pub fn tunnelled_sent(ns: &Netns, i: usize) -> Result<u64, LabError> {
    let out = ns.run([
        "nft",
        "-j",
        "list",
        "counter",
        "bridge",
        GUARD,
        &format!("ip6tnl-tap{i}"),
    ])?;
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| LabError::Material {
            what: "nft -j list counter".into(),
            source: Box::new(e),
        })?;
    v["nftables"]
        .as_array()
        .and_then(|items| items.iter().find_map(|i| i["counter"]["packets"].as_u64()))
        .ok_or_else(|| LabError::Material {
            what: format!("the counter ip6tnl-tap{i}: {v}"),
            source: "no packets field".into(),
        })
}

/// The bridge table's name.
const GUARD: &str = "bond0-active";

/// The `nft` script that lets frames through the `active` port only (none with `None`), and
/// none between ports; with `create`, the table and its chains first.
fn guard(active: Option<usize>, create: bool) -> String {
    let mut s = String::new();
    if create {
        s.push_str(&format!("add table bridge {GUARD}\n"));
        s.push_str(&format!(
            "add chain bridge {GUARD} count {{ type filter hook output priority 10; }}\n"
        ));
        for i in 0..2 {
            s.push_str(&format!(
                "add counter bridge {GUARD} ip6tnl-tap{i}\n\
                 add rule bridge {GUARD} count oifname \"tap{i}\" ip6 nexthdr 4 \
                 counter name \"ip6tnl-tap{i}\"\n"
            ));
        }
        for (chain, policy) in [
            ("input", "accept"),
            ("output", "accept"),
            ("forward", "drop"),
        ] {
            s.push_str(&format!(
                "add chain bridge {GUARD} {chain} {{ type filter hook {chain} priority 0; \
                 policy {policy}; }}\n"
            ));
        }
    }
    for (chain, dir) in [("input", "iifname"), ("output", "oifname")] {
        s.push_str(&format!("flush chain bridge {GUARD} {chain}\n"));
        match active {
            Some(i) => s.push_str(&format!(
                "add rule bridge {GUARD} {chain} {dir} != \"tap{i}\" drop\n"
            )),
            None => s.push_str(&format!("add rule bridge {GUARD} {chain} drop\n")),
        }
    }
    s
}

/// Runs `cmd` to its end, its output discarded (the next look sees whether it worked).
fn quiet(cmd: &mut Command) {
    let _ = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertisement_is_an_unsolicited_override_with_the_bond_mac() {
        let addr: Ipv6Addr = "fd8f:6d53:b97a:1::b:1".parse().expect("address");
        let w = Watcher {
            taps: 2,
            mac: [2, 0, 0, 0x0b, 0, 1],
            addr,
            stop: Arc::new(AtomicBool::new(false)),
            changes: Arc::new(Mutex::new(Vec::new())),
        };
        let na = w.unsolicited_na();
        // Type 136, code 0, checksum left to the kernel; flags R=0 S=0 O=1.
        assert_eq!(na[..8], [136, 0, 0, 0, 0x20, 0, 0, 0]);
        assert_eq!(na[8..24], addr.octets());
        // Option 2 (target link-layer address), length 1 (8 bytes).
        assert_eq!(na[24..], [2, 1, 2, 0, 0, 0x0b, 0, 1]);
    }

    #[test]
    fn the_guard_lets_the_active_tap_alone_through() {
        let tap1 = guard(Some(1), false);
        assert_eq!(
            tap1,
            "flush chain bridge bond0-active input\n\
             add rule bridge bond0-active input iifname != \"tap1\" drop\n\
             flush chain bridge bond0-active output\n\
             add rule bridge bond0-active output oifname != \"tap1\" drop\n"
        );
        let none = guard(None, true);
        assert!(
            none.contains("hook forward priority 0; policy drop;"),
            "{none}"
        );
        assert!(
            none.ends_with("add rule bridge bond0-active output drop\n"),
            "{none}"
        );
        assert!(
            none.contains("add rule bridge bond0-active count oifname \"tap0\" ip6 nexthdr 4 counter name \"ip6tnl-tap0\"\n"),
            "{none}"
        );
    }
}
