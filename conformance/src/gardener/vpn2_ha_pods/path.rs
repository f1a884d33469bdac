//! vpn2's path controller in the kube-apiserver pod (`vpn-path-controller`, vpn2 @ 0e5681c
//! `cmd/vpn_client/app/pathcontroller`), as test code. Every [`TICK`], for every shoot pod j
//! at once:
//!
//! * an ICMPv6 echo to its bond address `…::b:j` (payload `HELLO-R-U-THERE`, 1 s for the
//!   answer, [`RETRIES`] more tries after a failed one; the kernel picks the source, the
//!   pod's bond address), and
//! * a UDP datagram to `[…::b:j]:5400` whose payload is the pod IP as text (the hello that
//!   the shoot pod's tunnel controller turns into its tunnel back, [`super::tunnel`]).
//!
//! The tick waits for all of them (so while a shoot pod does not answer, a tick lasts the
//! ten tries, about 10 s, as vpn2's; the next starts at once, as a Go ticker delivers one
//! missed tick, and the ones after on the 2 s beat). A shoot pod that answered is good, one whose tries all
//! failed is not. When the current shoot pod is not good, the routes of every shoot network
//! move to a good one: `ip route replace <net> dev bond0-ip6tnl<j>`, no source address
//! (vpn2's `updateRouting`). vpn2 takes any good one (Go's map order, random); here the
//! lowest index. With none good the routes stay as they are.
//!
//! Not modelled: the overlap case's 241/8 image of the pod IP and mapped routes (the model's
//! networks are disjoint). A vpn2 version seen in the code index beside the pinned one
//! (commit 0c5168f, not in the 0e5681c snapshot) runs one loop per shoot pod (the hello
//! every tick whatever the echoes do) and routes the shoot networks through a resilient ECMP
//! next-hop group over every `bond0-ip6tnl<j>`, weighted by the echoes; if a release ships
//! it, this controller should follow.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use socket2::{Domain, Protocol, Socket, Type};

use super::ip6tnl::kapi_name;
use super::tunnel::PORT;
use crate::netns::Netns;
use crate::LabError;

/// vpn2's path controller interval (`constants.go`).
pub const TICK: Duration = Duration::from_secs(2);
/// How long one echo waits for its answer (vpn2's pinger `timeout`).
pub const ECHO_TIMEOUT: Duration = Duration::from_secs(1);
/// Tries after a failed echo (vpn2's pinger `retries`).
pub const RETRIES: u32 = 9;
/// The echo's payload.
pub const ECHO_PAYLOAD: &[u8] = b"HELLO-R-U-THERE";

/// A route move: when, and to which shoot pod.
pub type Move = (Instant, usize);

/// The running path controller; dropping it stops it (the routes stay with the namespace).
#[derive(Debug)]
pub struct PathController {
    stop: Arc<AtomicBool>,
    moves: Arc<Mutex<Vec<Move>>>,
    hellos: Arc<AtomicU16>,
    thread: Option<JoinHandle<()>>,
}

impl PathController {
    /// Starts it in `ns` for the shoot pods at `shoots` (bond addresses, by pod index), the
    /// shoot networks `nets` and the pod IP `pod_ip` (the hellos' payload).
    pub fn start(
        ns: &Netns,
        shoots: Vec<Ipv6Addr>,
        nets: Vec<String>,
        pod_ip: Ipv4Addr,
    ) -> Result<PathController, LabError> {
        let path = format!("/run/netns/{}", ns.name());
        let netns = File::open(&path).map_err(|source| LabError::io(&path, source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let moves = Arc::new(Mutex::new(Vec::new()));
        let hellos = Arc::new(AtomicU16::new(0));
        let controller = Controller {
            shoots,
            nets,
            hello: pod_ip.to_string(),
            stop: Arc::clone(&stop),
            moves: Arc::clone(&moves),
            hellos: Arc::clone(&hellos),
            seq: AtomicU16::new(0),
        };
        let thread = std::thread::spawn(move || {
            if move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network)).is_ok() {
                drop(netns);
                controller.run();
            }
        });
        Ok(PathController {
            stop,
            moves,
            hellos,
            thread: Some(thread),
        })
    }

    /// The shoot pod the routes lead to (`None` before the first answer).
    pub fn current(&self) -> Option<usize> {
        self.moves().last().map(|m| m.1)
    }

    /// Every route move so far.
    pub fn moves(&self) -> Vec<Move> {
        self.moves
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Hellos sent so far (wrapping at 65536).
    pub fn hellos(&self) -> u16 {
        self.hellos.load(Ordering::Relaxed)
    }
}

impl Drop for PathController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the controller's thread owns.
struct Controller {
    shoots: Vec<Ipv6Addr>,
    nets: Vec<String>,
    hello: String,
    stop: Arc<AtomicBool>,
    moves: Arc<Mutex<Vec<Move>>>,
    hellos: Arc<AtomicU16>,
    seq: AtomicU16,
}

impl Controller {
    /// Until stopped (bounded: 12 h of ticks).
    fn run(self) {
        let mut good = BTreeSet::new();
        let mut current: Option<usize> = None;
        let mut next = Instant::now() + TICK;
        for _ in 0..21_600 {
            while !self.stop.load(Ordering::Relaxed) && Instant::now() < next {
                std::thread::sleep(Duration::from_millis(50));
            }
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            for (j, ok) in self.tick().into_iter().enumerate() {
                if ok {
                    good.insert(j);
                } else {
                    good.remove(&j);
                }
            }
            if current.is_none_or(|c| !good.contains(&c)) {
                if let Some(&j) = good.first() {
                    if self.nets.iter().all(|net| route(net, j)) {
                        current = Some(j);
                        self.moves
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((Instant::now(), j));
                    }
                }
            }
            // A Go ticker keeps one tick a slow round missed (the next round starts at once)
            // and drops the others.
            let now = Instant::now();
            next += TICK;
            while next + TICK <= now {
                next += TICK;
            }
        }
    }

    /// One round: echo (with retries) and hello to every shoot pod at once; which answered.
    fn tick(&self) -> Vec<bool> {
        std::thread::scope(|s| {
            let pings: Vec<_> = self
                .shoots
                .iter()
                .map(|&a| s.spawn(move || self.ping(a)))
                .collect();
            for &a in &self.shoots {
                s.spawn(move || {
                    if hello(a, &self.hello) {
                        self.hellos.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            pings
                .into_iter()
                .map(|p| p.join().unwrap_or(false))
                .collect()
        })
    }

    /// vpn2's `Ping`: up to 1 + [`RETRIES`] echoes, each waiting [`ECHO_TIMEOUT`].
    fn ping(&self, to: Ipv6Addr) -> bool {
        (0..=RETRIES).any(|_| {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            echo(to, seq)
        })
    }
}

/// One ICMPv6 echo to `to` on a raw socket connected to it (the kernel passes it only what
/// `to` sends, fills in the checksum and picks the source); whether the matching reply came
/// within [`ECHO_TIMEOUT`].
fn echo(to: Ipv6Addr, seq: u16) -> bool {
    let deadline = Instant::now() + ECHO_TIMEOUT;
    let Ok(s) = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)) else {
        return false;
    };
    if s.connect(&SocketAddrV6::new(to, 0, 0, 0).into()).is_err() {
        return false;
    }
    let id = (std::process::id() & 0xffff) as u16;
    let mut request = vec![128, 0, 0, 0];
    request.extend_from_slice(&id.to_be_bytes());
    request.extend_from_slice(&seq.to_be_bytes());
    request.extend_from_slice(ECHO_PAYLOAD);
    if s.send(&request).is_err() {
        return false;
    }
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        let Ok(n) = (&s).read(&mut buf) else {
            return false;
        };
        let reply = &buf[..n];
        if reply.len() == request.len()
            && reply[0] == 129
            && reply[4..8] == request[4..8]
            && reply[8..] == *ECHO_PAYLOAD
        {
            return true;
        }
    }
}

/// The hello to `to`'s tunnel controller (vpn2's `tunnel.Send`: an unbound UDP socket, so the
/// kernel picks the bond address as the source); whether it went out.
fn hello(to: Ipv6Addr, payload: &str) -> bool {
    UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))
        .and_then(|s| s.send_to(payload.as_bytes(), (to, PORT)))
        .is_ok()
}

/// `ip route replace NET dev bond0-ip6tnl<j>`; whether it went in.
fn route(net: &str, j: usize) -> bool {
    Command::new("ip")
        .args(["route", "replace", net, "dev", &kapi_name(j)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
