//! vpn2's path controller in the kube-apiserver pod (`vpn-path-controller`), as test code: every
//! [`TICK`] an ICMPv6 echo to each shoot pod's bond address (1 s timeout, all at once); it keeps
//! the current shoot pod while that answers, else moves the routes of every shoot network to
//! the first that answers (`ip route replace <net> via inet6 <bond address> dev bond0`, no
//! source address, as vpn2's `updateRouting`; vpn2 takes any good one in map order). With no
//! shoot pod answering the routes stay as they are. The UDP hellos to port 5400 that vpn2
//! sends beside the echo are not sent: the shoot pods' tunnel controllers they feed are
//! reduced to a static return route (see the parent module).

use std::fs::File;
use std::net::Ipv6Addr;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use super::bond::BOND;
use crate::netns::Netns;
use crate::LabError;

/// vpn2's path controller interval (`constants.go`).
pub const TICK: Duration = Duration::from_secs(2);

/// A route move: when, and to which shoot pod.
pub type Move = (Instant, usize);

/// The running path controller; dropping it stops it (the routes stay with the namespace).
#[derive(Debug)]
pub struct PathController {
    stop: Arc<AtomicBool>,
    moves: Arc<Mutex<Vec<Move>>>,
    thread: Option<JoinHandle<()>>,
}

impl PathController {
    /// Starts it in `ns` for the shoot pods at `shoots` (bond addresses, by pod index) and
    /// the shoot networks `nets`.
    pub fn start(
        ns: &Netns,
        shoots: Vec<Ipv6Addr>,
        nets: Vec<String>,
    ) -> Result<PathController, LabError> {
        let path = format!("/run/netns/{}", ns.name());
        let netns = File::open(&path).map_err(|source| LabError::io(&path, source))?;
        let stop = Arc::new(AtomicBool::new(false));
        let moves = Arc::new(Mutex::new(Vec::new()));
        let (stop_t, moves_t) = (Arc::clone(&stop), Arc::clone(&moves));
        let thread = std::thread::spawn(move || {
            if move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network)).is_err() {
                return;
            }
            drop(netns);
            let mut current: Option<usize> = None;
            let mut ticks: u32 = 0;
            // Bounded: 12 h of ticks.
            while !stop_t.load(Ordering::Relaxed) && ticks < 21_600 {
                ticks += 1;
                let began = Instant::now();
                let good = answering(&shoots);
                if current.is_none_or(|c| !good[c]) {
                    if let Some(j) = good.iter().position(|g| *g) {
                        if nets.iter().all(|net| route(net, shoots[j])) {
                            current = Some(j);
                            moves_t
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push((Instant::now(), j));
                        }
                    }
                }
                let next = began + TICK;
                while !stop_t.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Ok(PathController {
            stop,
            moves,
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
}

impl Drop for PathController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Which of `shoots` answer an ICMPv6 echo within 1 s (all asked at once).
fn answering(shoots: &[Ipv6Addr]) -> Vec<bool> {
    let children: Vec<_> = shoots
        .iter()
        .map(|a| {
            Command::new("ping")
                .args(["-6", "-n", "-q", "-c", "1", "-W", "1"])
                .arg(a.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            c.and_then(|mut c| c.wait().ok())
                .is_some_and(|s| s.success())
        })
        .collect()
}

/// `ip route replace NET via inet6 GW dev bond0`; whether it went in.
fn route(net: &str, gw: Ipv6Addr) -> bool {
    Command::new("ip")
        .args(["route", "replace", net, "via", "inet6"])
        .arg(gw.to_string())
        .args(["dev", BOND])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
