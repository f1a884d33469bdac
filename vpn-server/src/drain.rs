//! The server's part of a pod's termination: after SIGTERM it keeps its tunnel while the
//! pod's other processes still have TCP sockets open in its network namespace.
//!
//! The kubelet sends SIGTERM to every container of a pod at once. The CONNECT sidecar
//! (Envoy's container) then finishes the CONNECTs it is dialing and relaying (`sidecar`'s
//! drain), and those need the tunnel, which ends with this process. So the server waits
//! until no TCP socket of its namespace is open except its own (listening, connecting or
//! connected: `/proc/net/tcp` and `tcp6`, sockets left in `TIME_WAIT` or closed by their
//! process not counted), at most [`DRAIN_LIMIT`], and then shuts down as before. Alone in
//! its namespace it ends at once, but for a sidecar in its own process, whose drain the
//! tunnel also waits for (`crate::launch::run_with`). First it removes `setup`'s table
//! ([`crate::vpn2::START_TABLE`]); the sidecar's restart guard (`sidecar::RESTART_TABLE`)
//! stays, so a restart of the process finds the SYNs of the gap waiting.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

/// The longest the server waits for the other sockets (the sidecar drains for at most 5 s by
/// default; Gardener's grace period is 30 s).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How often the sockets are read while waiting.
const POLL: Duration = Duration::from_millis(5);

/// TCP states that do not keep the server: `TIME_WAIT` (06) and `CLOSE` (07).
const ENDED: [&str; 2] = ["06", "07"];

/// Cancels `tunnel` once `signal` is cancelled and no other process's TCP socket is open in
/// this network namespace, or [`DRAIN_LIMIT`] after `signal`. Spawn it.
pub async fn after_others(signal: CancellationToken, tunnel: CancellationToken) {
    tokio::select! {
        () = signal.cancelled() => {}
        () = tunnel.cancelled() => return,
    }
    // From now on a SYN to the sidecar's port is refused again once the sidecar is gone.
    crate::vpn2::remove_start_table();
    let started = tokio::time::Instant::now();
    let mut logged = false;
    while started.elapsed() < DRAIN_LIMIT {
        let others = others_open();
        if others == 0 {
            break;
        }
        if !logged {
            info!(
                sockets = others,
                limit_s = DRAIN_LIMIT.as_secs(),
                "the tunnel stays while the pod's other processes have connections open"
            );
            logged = true;
        }
        tokio::time::sleep(POLL).await;
    }
    if logged {
        info!(
            waited_ms = started.elapsed().as_millis(),
            "the pod's other processes are done (or the limit is reached): shutting down"
        );
    }
    tunnel.cancel();
}

/// Open TCP sockets of this network namespace that this process does not hold.
fn others_open() -> usize {
    let own = own_sockets();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|table| open_inodes(&table).filter(|i| !own.contains(i)).count())
        .sum()
}

/// The socket inodes of this process's descriptors.
fn own_sockets() -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The inodes of the sockets of a `/proc/net/tcp` table that a process holds and that have
/// not ended.
fn open_inodes(table: &str) -> impl Iterator<Item = u64> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let state = *fields.get(3)?;
        let inode: u64 = fields.get(9)?.parse().ok()?;
        (inode != 0 && !ENDED.contains(&state)).then_some(inode)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:24E3 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65532        0 4101 1 0000000000000000 100 0 0 10 0
   1: 0A000001:24E3 0A00000A:A1B2 01 00000000:00000000 00:00000000 00000000 65532        0 4102 1 0000000000000000 20 4 30 10 -1
   2: 0A000001:24E3 0A00000A:A1B3 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000
   3: 0A000001:24E3 0A00000A:A1B4 04 00000000:00000000 00:00000000 00000000 65532        0 0 1 0000000000000000 20 4 30 10 -1
   4: 0A000001:24E3 0A00000A:A1B5 07 00000000:00000000 00:00000000 00000000 65532        0 4105 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn listening_and_connected_sockets_count_ended_and_orphaned_ones_do_not() {
        assert_eq!(open_inodes(TABLE).collect::<Vec<_>>(), [4101, 4102]);
    }

    #[test]
    fn this_process_s_own_sockets_are_not_others() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let own = own_sockets();
        let table = std::fs::read_to_string("/proc/net/tcp").expect("table");
        let port = format!(":{:04X} ", l.local_addr().expect("addr").port());
        let line = table
            .lines()
            .find(|l| l.contains(&port) && l.split_whitespace().nth(3) == Some("0A"))
            .expect("the listener's line");
        let inode: u64 = line
            .split_whitespace()
            .nth(9)
            .expect("inode")
            .parse()
            .expect("number");
        assert!(own.contains(&inode), "{inode} in {own:?}");
    }
}
