//! vpn2's tunnel controller in a shoot pod (`tunnel-controller`, vpn2 @ 0e5681c
//! `pkg/shoot_client/tunnel/tunnel.go`), as test code: it listens on UDP `[bond address]:5400`
//! ([`BIND_TRIES`] binds [`BIND_PAUSE`] apart, a read deadline of [`READ_DEADLINE`]). A hello
//! from a new sender, or with a pod IP other than the sender's last one, (re)creates that
//! sender's tunnel: the device `bond0ip6tnl<XX><YY>` (the sender's last two address bytes)
//! deleted and created again from the own bond address to the sender (here the `ip6tnl`
//! stand-in, [`super::ip6tnl`]), then `ip route replace <pod IP>/32 dev` it (`/128` for an
//! IPv6 pod IP). A failed creation is tried again on a hello [`RETRY_BACKOFF`] later.
//! Senders unseen for [`EXPIRY`] are dropped with their device (looked at every
//! [`CLEAN_PERIOD`], as vpn2). [`TunnelController::ready`] is vpn2's `/readyz`: at least one
//! kube-apiserver known, and every known one's tunnel and route in place.
//!
//! Not modelled: the watchdog that sends `SIGHUP` to the pod's OpenVPN clients through their
//! management ports after 10 of 20 reads without a hello (40 s and more of silence).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use super::ip6tnl::{shoot_name, Ip6tnl};
use crate::netns::Netns;
use crate::LabError;

/// The tunnel controller's UDP port.
pub const PORT: u16 = 5400;
/// How often it tries to bind.
pub const BIND_TRIES: u32 = 30;
/// The pause between binds.
pub const BIND_PAUSE: Duration = Duration::from_millis(500);
/// The read deadline (twice the path controller's interval).
pub const READ_DEADLINE: Duration = Duration::from_secs(4);
/// A failed tunnel is created again no sooner than this.
pub const RETRY_BACKOFF: Duration = Duration::from_secs(30);
/// A sender unseen this long is dropped.
pub const EXPIRY: Duration = Duration::from_secs(600);
/// How often expired senders are looked for.
pub const CLEAN_PERIOD: Duration = Duration::from_secs(900);

/// One tunnel made: when, to which sender, for which pod IP, under which device name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    /// When the route was in place.
    pub at: Instant,
    /// The sender's bond address.
    pub remote: Ipv6Addr,
    /// The pod IP its hello named.
    pub pod_ip: String,
    /// The device.
    pub device: String,
}

/// One known kube-apiserver (by sender address).
struct Sender {
    pod_ip: String,
    last_seen: Instant,
    tunnel: Option<Ip6tnl>,
    failed_at: Option<Instant>,
}

/// What the thread shares with the handle.
#[derive(Default)]
struct Shared {
    senders: BTreeMap<Ipv6Addr, Sender>,
    made: Vec<Made>,
    listening: bool,
}

/// The running tunnel controller; dropping it stops it and removes its devices.
pub struct TunnelController {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TunnelController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelController")
            .field("made", &self.made())
            .finish_non_exhaustive()
    }
}

impl TunnelController {
    /// Starts it in `ns`, listening on `[bond]:5400` (`bond` is on `bond0` already).
    pub fn start(ns: &Netns, bond: Ipv6Addr) -> Result<TunnelController, LabError> {
        let path = format!("/run/netns/{}", ns.name());
        let netns = File::open(&path).map_err(|source| LabError::io(&path, source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (stop_t, shared_t) = (Arc::clone(&stop), Arc::clone(&shared));
        let thread = std::thread::spawn(move || {
            if move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network)).is_err() {
                return;
            }
            drop(netns);
            run(&path, bond, &stop_t, &shared_t);
            // The devices go before the thread ends (their pumps are in the namespace).
            shared_t
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .senders
                .clear();
        });
        Ok(TunnelController {
            stop,
            shared,
            thread: Some(thread),
        })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every tunnel made so far, in order.
    pub fn made(&self) -> Vec<Made> {
        self.shared().made.clone()
    }

    /// Whether it listens.
    pub fn listening(&self) -> bool {
        self.shared().listening
    }

    /// vpn2's `/readyz` (module docs).
    pub fn ready(&self) -> bool {
        let s = self.shared();
        !s.senders.is_empty() && s.senders.values().all(|k| k.tunnel.is_some())
    }

    /// The devices' packet counts (encapsulated, decapsulated), by sender.
    pub fn counts(&self) -> Vec<(Ipv6Addr, (u64, u64))> {
        self.shared()
            .senders
            .iter()
            .filter_map(|(a, k)| Some((*a, k.tunnel.as_ref()?.counts())))
            .collect()
    }
}

impl Drop for TunnelController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener loop (bounded: a day of read deadlines).
fn run(netns_path: &str, bond: Ipv6Addr, stop: &AtomicBool, shared: &Mutex<Shared>) {
    let Some(socket) = listen(bond, stop) else {
        return;
    };
    shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .listening = true;
    // Short reads so a stop is seen; a deadline passes after READ_DEADLINE without a hello.
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let mut next_clean = Instant::now() + CLEAN_PERIOD;
    let mut buf = [0u8; 1024];
    let mut polls: u64 = 0;
    while !stop.load(Ordering::Relaxed) && polls < 432_000 {
        polls += 1;
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let SocketAddr::V6(from) = from else {
            continue;
        };
        let pod_ip = String::from_utf8_lossy(&buf[..n]).into_owned();
        hello(netns_path, bond, *from.ip(), pod_ip, shared);
        if Instant::now() > next_clean {
            next_clean = Instant::now() + CLEAN_PERIOD;
            let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
            s.senders.retain(|_, k| k.last_seen.elapsed() <= EXPIRY);
        }
    }
}

/// The UDP socket on `[bond]:5400`, after at most [`BIND_TRIES`] tries.
fn listen(bond: Ipv6Addr, stop: &AtomicBool) -> Option<UdpSocket> {
    for _ in 0..BIND_TRIES {
        if let Ok(s) = UdpSocket::bind((bond, PORT)) {
            return Some(s);
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::sleep(BIND_PAUSE);
    }
    None
}

/// One hello from `remote` naming `pod_ip`.
fn hello(
    netns_path: &str,
    bond: Ipv6Addr,
    remote: Ipv6Addr,
    pod_ip: String,
    shared: &Mutex<Shared>,
) {
    let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let k = s.senders.entry(remote).or_insert_with(|| Sender {
        pod_ip: pod_ip.clone(),
        last_seen: Instant::now(),
        tunnel: None,
        failed_at: None,
    });
    k.last_seen = Instant::now();
    let changed = k.pod_ip != pod_ip;
    let due = k.tunnel.is_none() && k.failed_at.is_none_or(|t| t.elapsed() > RETRY_BACKOFF);
    if !changed && !due {
        return;
    }
    k.pod_ip = pod_ip.clone();
    // The old device first (vpn2 deletes the link by name before creating it).
    k.tunnel = None;
    let device = shoot_name(remote);
    let made = Ip6tnl::create_in(netns_path, &device, bond, remote)
        .ok()
        .filter(|_| host_route(&pod_ip, &device));
    match made {
        Some(t) => {
            k.tunnel = Some(t);
            k.failed_at = None;
            s.made.push(Made {
                at: Instant::now(),
                remote,
                pod_ip,
                device,
            });
        }
        None => k.failed_at = Some(Instant::now()),
    }
}

/// `ip route replace <pod IP>/32 (or /128) dev DEVICE`; whether it went in.
fn host_route(pod_ip: &str, device: &str) -> bool {
    let Ok(ip) = pod_ip.trim().parse::<IpAddr>() else {
        return false;
    };
    let len = if ip.is_ipv4() { 32 } else { 128 };
    Command::new("ip")
        .args(["route", "replace", &format!("{ip}/{len}"), "dev", device])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
