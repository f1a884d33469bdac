//! [`RestartGuard`]: while a process lives, a SYN to one of its listeners' ports that no
//! socket takes is dropped, not refused, and for a moment after it ends too: a restarted
//! process (a container restart) finds the connections its predecessor's listener would have
//! taken waiting for it, since the sender's kernel sends a dropped SYN again (after 1 s, then
//! 3 s, ...) where a refused one fails the connect at once.
//!
//! ```text
//!  table inet NAME {                                         not owned: outlives the process
//!    set serving { type inet_service; flags timeout; timeout T; elements = { P timeout T } }
//!    chain input { type filter hook input priority filter; policy accept;
//!      tcp dport P tcp flags syn / syn,rst socket wildcard != 2 accept    a listener is there
//!      meta nfproto ipv4 tcp dport P tcp flags syn / syn,rst tcp dport @serving drop
//!    } }                                   (one drop rule per listen address: its family, or
//!                                           `ip daddr A` for a listener on one address)
//! ```
//!
//! The process adds the elements again every quarter of `T` ([`Firewall::refresh`], from a
//! thread of its own, so a busy runtime cannot let them lapse), until the guard is dropped or,
//! after [`RestartGuard::keep_for_life`], until the process ends; once it is gone, the last
//! ones expire at most `T` later and the port refuses again. The next start replaces the
//! table in one transaction ([`Firewall::apply`]). Only SYNs to the listeners' ports are
//! ever looked at, and only while no socket would take them: an accepted connection's
//! packets are never touched.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use ipnet::IpNet;

use super::{priority, Chain, Firewall, FirewallError, Hook, PortSet, Rule, Table};
use crate::report::chain;

/// The set of ports whose process lives.
const SET: &str = "serving";

/// The guard of a process's listeners, refreshed until dropped (then it expires by itself) or,
/// after [`RestartGuard::keep_for_life`], until the process ends.
#[derive(Debug)]
pub struct RestartGuard {
    stop: Option<mpsc::Sender<()>>,
    refresher: Option<JoinHandle<()>>,
}

impl RestartGuard {
    /// The guard's table `name` for the listeners at `listen` (port 0 skipped), each port
    /// guarded for `lifetime` after its last refresh.
    pub fn table(name: &str, listen: &[SocketAddr], lifetime: Duration) -> Table {
        let mut ports: Vec<u16> = listen.iter().map(SocketAddr::port).collect();
        ports.retain(|&p| p != 0);
        ports.sort_unstable();
        ports.dedup();
        let syn = |port: u16| Rule::new().tcp_dport(port).tcp_syn();
        let drops = listen.iter().filter(|a| a.port() != 0).map(|a| {
            let ip = a.ip();
            let bits = match (ip.is_unspecified(), ip) {
                (true, _) => 0,
                (false, IpAddr::V4(_)) => 32,
                (false, IpAddr::V6(_)) => 128,
            };
            let net = IpNet::new(ip, bits).unwrap_or_else(|_| IpNet::from(ip));
            Rule::new()
                .daddr(net)
                .tcp_dport(a.port())
                .tcp_syn()
                .tcp_dport_in(SET)
                .drop()
        });
        Table::new(name)
            .set(PortSet::new(SET, lifetime, &ports))
            .chain(
                Chain::filter("input", Hook::Input, priority::FILTER)
                    .rules(ports.iter().map(|&p| syn(p).socket_found().accept()))
                    .rules(drops),
            )
    }

    /// Applies [`RestartGuard::table`] (blocking, in the calling thread's network namespace),
    /// replacing one a previous process left, and refreshes it from a thread until dropped.
    pub fn install(
        name: &str,
        listen: &[SocketAddr],
        lifetime: Duration,
    ) -> Result<RestartGuard, FirewallError> {
        let table = Self::table(name, listen, lifetime);
        let mut firewall = Firewall::open()?;
        firewall.apply(&table, false)?;
        let set = PortSet::new(SET, lifetime, &[]);
        let set = table.sets.first().cloned().unwrap_or(set);
        let (stop, stopped) = mpsc::channel::<()>();
        let period = (lifetime / 4).max(Duration::from_millis(1));
        let refresher = std::thread::Builder::new()
            .name("restart-guard".into())
            .spawn(move || refresh_until(&mut firewall, &table, &set, period, &stopped))
            .map_err(FirewallError::Io)?;
        tracing::info!(
            table = name,
            lifetime_ms = lifetime.as_millis(),
            "SYNs to the listeners' ports wait while this process restarts"
        );
        Ok(RestartGuard {
            stop: Some(stop),
            refresher: Some(refresher),
        })
    }
}

/// Adds the set's elements again every `period` until `stopped` says so; if its sender is
/// gone without a word ([`RestartGuard::keep_for_life`]), until the process ends. A failed
/// refresh applies the whole table again (someone removed it).
fn refresh_until(
    firewall: &mut Firewall,
    table: &Table,
    set: &PortSet,
    period: Duration,
    stopped: &mpsc::Receiver<()>,
) {
    let mut failing = false;
    loop {
        match stopped.recv_timeout(period) {
            Ok(()) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(period),
        }
        let result = firewall
            .refresh(table.name(), set)
            .or_else(|_| firewall.apply(table, false));
        match result {
            Ok(()) if failing => {
                tracing::info!(table = table.name(), "restart guard refreshed again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(table = table.name(), error = %chain(&e), "cannot refresh the restart guard");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

impl RestartGuard {
    /// Keeps refreshing until the process ends (its listeners closed, the process still has
    /// work to finish): a restart after that finds the guard in force.
    pub fn keep_for_life(mut self) {
        // Dropping the sender without a word leaves the thread refreshing; nothing joins it.
        drop(self.stop.take());
        drop(self.refresher.take());
    }
}

impl Drop for RestartGuard {
    /// Stops the refreshing; the table's elements expire by themselves.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
    }
}
