//! vpn2's `ip6tnl` devices stood in for on a kernel without the `ip6_tunnel` module: a tun
//! device with the name vpn2 gives the tunnel (`bond0-ip6tnl<j>` in a kube-apiserver pod,
//! [`kapi_name`]; `bond0ip6tnl<XX><YY>` in a shoot pod, [`shoot_name`]) and a thread in the
//! pod's namespace that moves packets between it and two raw IPv6 sockets, one for next
//! header 4 (IPv4 inside) and one for 41 (IPv6 inside), each bound to the pod's own bond
//! address and connected to the peer's.
//!
//! * **Out:** an IP packet the kernel routes into the device goes out as the payload of an
//!   IPv6 packet the kernel builds from the socket (no `IPV6_HDRINCL`): source the bond
//!   address, destination the peer, next header 4 or 41 by the inner packet's version, hop
//!   limit 64, and no extension header. vpn2 creates its tunnels with encapsulation limit 0
//!   and `IP6_TNL_F_IGN_ENCAP_LIMIT` (`pkg/network/link.go` `CreateTunnel`), so ip6tnl adds
//!   no encapsulation-limit destination option either: the bytes on the bond are the same.
//! * **In:** the kernel hands an IPv6 packet with next header 4 or 41 to the raw sockets of
//!   that protocol whose bound and connected addresses match (payload only, the IPv6 header
//!   stripped); the thread writes it into the device, which delivers it as if received
//!   there, as ip6tnl does for the packets of its (local, remote) pair. Checked on this
//!   machine (2026-11-28, in a namespace pair): a raw `AF_INET6` socket of protocol 4 or 41
//!   receives such packets and sends them with the header described above (tcpdump:
//!   `next-header IPv6 (41)`, `hlim 64`, no options).
//! * **MTU:** the bond's less the 40 bytes of the outer header, as the kernel sizes an
//!   ip6tnl device whose route to the peer leaves by the bond (with `encaplimit none`).
//!
//! `tests/ip6tnl_standin.rs` runs a pair of them over a veth pair: IPv4 (TCP) and IPv6
//! (ICMPv6 echo) through them, next header 4 and 41 on the link between the bond addresses.
//!
//! What differs from ip6tnl: a packet from an address with no stand-in reaches no device
//! (ip6tnl has no tunnel for it either; what the kernel answers may differ); the outer path
//! MTU is not learned from ICMPv6 "packet too big" (the bond is the only hop here); the
//! outer traffic class is 0 and the flow label the kernel's own, which is what an ip6tnl
//! device without `tclass inherit` / `flowlabel inherit` sends too (vpn2 sets neither).

use std::fs::File;
use std::io::{self, Read};
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::BytesMut;
use netio::tun::{PacketLayout, RecvPool, Tun};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use socket2::{Domain, Protocol, Socket, Type};

use super::bond::BOND;
use crate::netns::Netns;
use crate::LabError;

/// The outer IPv6 header.
pub const OVERHEAD: u32 = 40;
/// Next header of an IPv4 packet inside IPv6.
pub const IPIP: u8 = 4;
/// Next header of an IPv6 packet inside IPv6.
pub const IPV6_IN_IPV6: u8 = 41;
/// How long the device may take to appear.
const CREATE: Duration = Duration::from_secs(10);
/// How often the pump looks at its stop flag.
const LOOK: Duration = Duration::from_millis(100);

/// The kube-apiserver pod's tunnel to shoot pod `j` (vpn2's `BondIP6TunnelLinkName`).
pub fn kapi_name(j: usize) -> String {
    format!("{BOND}-ip6tnl{j}")
}

/// A shoot pod's tunnel to the kube-apiserver pod at `remote`: the last two bytes of its
/// address in hex (vpn2's tunnel controller's `linkName`; 15 characters, IFNAMSIZ's limit).
pub fn shoot_name(remote: Ipv6Addr) -> String {
    let o = remote.octets();
    format!("{BOND}ip6tnl{:02x}{:02x}", o[14], o[15])
}

/// Packets moved so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// Read from the device and sent to the peer.
    pub encapsulated: AtomicU64,
    /// Received from the peer and written into the device.
    pub decapsulated: AtomicU64,
}

/// A running stand-in; dropping it stops the thread and removes the device.
#[derive(Debug)]
pub struct Ip6tnl {
    name: String,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ip6tnl {
    /// Creates device `name` in `ns` from `local` (the pod's bond address, already on `bond0`)
    /// to `remote`, up, and starts moving packets.
    pub fn create(
        ns: &Netns,
        name: &str,
        local: Ipv6Addr,
        remote: Ipv6Addr,
    ) -> Result<Ip6tnl, LabError> {
        Ip6tnl::create_in(&format!("/run/netns/{}", ns.name()), name, local, remote)
    }

    /// [`Ip6tnl::create`] in the namespace at `netns_path` (`/run/netns/<name>`).
    pub fn create_in(
        netns_path: &str,
        name: &str,
        local: Ipv6Addr,
        remote: Ipv6Addr,
    ) -> Result<Ip6tnl, LabError> {
        let netns = File::open(netns_path).map_err(|source| LabError::io(netns_path, source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let (ready_tx, ready_rx) = mpsc::channel();
        let pump = Pump {
            name: name.to_owned(),
            local,
            remote,
            stop: Arc::clone(&stop),
            counts: Arc::clone(&counts),
        };
        let thread = std::thread::spawn(move || {
            if let Err(e) =
                move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network))
            {
                let _ = ready_tx.send(Err(format!("setns: {e}")));
                return;
            }
            drop(netns);
            pump.run(&ready_tx);
        });
        let failed = |why: String| LabError::Material {
            what: format!("the ip6tnl stand-in {name} ({local} -> {remote})"),
            source: why.into(),
        };
        match ready_rx.recv_timeout(CREATE) {
            Ok(Ok(())) => Ok(Ip6tnl {
                name: name.to_owned(),
                counts,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(why)) => {
                let _ = thread.join();
                Err(failed(why))
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                Err(failed("not created in time".into()))
            }
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Packets moved so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counts.encapsulated.load(Ordering::Relaxed),
            self.counts.decapsulated.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Ip6tnl {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the thread owns.
struct Pump {
    name: String,
    local: Ipv6Addr,
    remote: Ipv6Addr,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
}

/// The device and the two sockets (next header 4, then 41).
struct Ends {
    tun: Tun,
    ipip: Socket,
    ip6ip6: Socket,
    mtu: usize,
}

impl Pump {
    /// In the pod's namespace: creates everything, says so on `ready`, then moves packets
    /// until stopped: the device's on this thread's runtime, each socket's on a thread of
    /// its own (blocking reads of at most [`LOOK`]). The device goes with the [`Tun`].
    fn run(self, ready: &mpsc::Sender<Result<(), String>>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready.send(Err(format!("runtime: {e}")));
                return;
            }
        };
        let _in_runtime = rt.enter();
        let ends = match self.ends() {
            Ok(ends) => ends,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        std::thread::scope(|s| {
            s.spawn(|| self.decapsulate(&ends.tun, &ends.ipip, 4));
            s.spawn(|| self.decapsulate(&ends.tun, &ends.ip6ip6, 6));
            rt.block_on(self.encapsulate(&ends));
        });
    }

    fn ends(&self) -> Result<Ends, String> {
        let tun = Tun::open(&self.name).map_err(|e| e.to_string())?;
        let socket = |proto: u8| -> io::Result<Socket> {
            let s = Socket::new(
                Domain::IPV6,
                Type::RAW,
                Some(Protocol::from(i32::from(proto))),
            )?;
            s.bind(&SocketAddrV6::new(self.local, 0, 0, 0).into())?;
            s.connect(&SocketAddrV6::new(self.remote, 0, 0, 0).into())?;
            s.set_read_timeout(Some(LOOK))?;
            s.set_write_timeout(Some(LOOK))?;
            Ok(s)
        };
        let ipip = socket(IPIP).map_err(|e| format!("raw socket 4: {e}"))?;
        let ip6ip6 = socket(IPV6_IN_IPV6).map_err(|e| format!("raw socket 41: {e}"))?;
        let mtu = bond_mtu().saturating_sub(OVERHEAD).max(1280);
        let ok = Command::new("ip")
            .args([
                "link",
                "set",
                "dev",
                &self.name,
                "mtu",
                &mtu.to_string(),
                "up",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!("ip link set dev {} mtu {mtu} up failed", self.name));
        }
        Ok(Ends {
            tun,
            ipip,
            ip6ip6,
            mtu: usize::try_from(mtu).unwrap_or(1280),
        })
    }

    /// What the device reads, to the peer by the socket of each packet's version, until
    /// stopped.
    async fn encapsulate(&self, e: &Ends) {
        let layout = PacketLayout {
            headroom: 0,
            max_len: e.mtu,
            tailroom: 0,
        };
        let mut pool = RecvPool::default();
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(Ok(packets)) =
                tokio::time::timeout(LOOK, read_tun(&e.tun, &mut pool, layout)).await
            else {
                continue;
            };
            for p in &packets {
                let socket = match p.first().map(|b| b >> 4) {
                    Some(4) => &e.ipip,
                    Some(6) => &e.ip6ip6,
                    _ => continue,
                };
                if socket.send(p).is_ok() {
                    self.counts.encapsulated.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// What `socket` receives from the peer into the device (each packet of the IP
    /// `version` its next header says), until stopped.
    fn decapsulate(&self, tun: &Tun, socket: &Socket, version: u8) {
        let mut buf = vec![0u8; 65536];
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(n) = (&*socket).read(&mut buf) else {
                continue;
            };
            if buf[..n].first().map(|b| b >> 4) == Some(version) && tun.send_sync(&buf[..n]).is_ok()
            {
                self.counts.decapsulated.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The packets of one read from `tun`.
async fn read_tun(
    tun: &Tun,
    pool: &mut RecvPool,
    layout: PacketLayout,
) -> io::Result<Vec<BytesMut>> {
    let mut out = Vec::new();
    tun.recv_many(pool, layout, &mut out, 64).await?;
    Ok(out)
}

/// `bond0`'s MTU in this thread's namespace (1500 if it cannot be read).
fn bond_mtu() -> u32 {
    Command::new("ip")
        .args(["-j", "link", "show", "dev", BOND])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v[0]["mtu"].as_u64())
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(1500)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_vpn2s_and_fit_ifnamsiz() {
        assert_eq!(kapi_name(1), "bond0-ip6tnl1");
        let a: Ipv6Addr = "fd8f:6d53:b97a:1::a:1".parse().expect("address");
        assert_eq!(shoot_name(a), "bond0ip6tnl0001");
        let b: Ipv6Addr = "fd8f:6d53:b97a:1::a:beef".parse().expect("address");
        assert_eq!(shoot_name(b), "bond0ip6tnlbeef");
        assert!(shoot_name(b).len() <= netio::tun::IFNAMSIZ_MAX);
    }
}
