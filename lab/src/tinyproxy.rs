//! Debian's `tinyproxy` as the HTTP CONNECT proxy of a lab test: a config in a directory of
//! the test's, started inside a lab namespace (tracked by the [`Netns`], so it is stopped with
//! it) and waited for until it accepts connections.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::netns::Netns;
use crate::LabError;

/// How long [`start`] waits for tinyproxy to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts tinyproxy in `ns` listening on `listen:port`, accepting clients from `allow` (a
/// CIDR) and CONNECT only to `connect_port`; its config and log go into `dir`. Returns its PID
/// once it accepts connections.
pub fn start(
    ns: &Netns,
    dir: &Path,
    listen: Ipv4Addr,
    port: u16,
    allow: &str,
    connect_port: u16,
) -> Result<u32, LabError> {
    start_sized(ns, dir, listen, port, allow, connect_port, 8)
}

/// [`start`] with room for `max_clients` connections at once (tinyproxy's `MaxClients`).
pub fn start_sized(
    ns: &Netns,
    dir: &Path,
    listen: Ipv4Addr,
    port: u16,
    allow: &str,
    connect_port: u16,
    max_clients: usize,
) -> Result<u32, LabError> {
    let config = dir.join("tinyproxy.conf");
    let log = dir.join("tinyproxy.log");
    std::fs::write(
        &config,
        format!(
            "Port {port}\nListen {listen}\nTimeout 600\nMaxClients {max_clients}\n\
             Allow {allow}\nConnectPort {connect_port}\nLogFile \"{}\"\nLogLevel Info\n",
            log.display()
        ),
    )
    .map_err(|source| LabError::io(&config, source))?;
    let pid = ns.spawn(ns.command("tinyproxy").arg("-d").arg("-c").arg(&config))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if ns.run_in(|| std::net::TcpStream::connect((listen, port)).is_ok())? {
            return Ok(pid);
        }
        if let Some(status) = ns.try_wait(pid) {
            return Err(LabError::Exited {
                what: "tinyproxy".into(),
                status,
                log: std::fs::read_to_string(&log).unwrap_or_default(),
            });
        }
        if Instant::now() >= deadline {
            return Err(LabError::Timeout {
                what: format!("tinyproxy listening on {listen}:{port}"),
                waited: START_TIMEOUT,
                log: std::fs::read_to_string(&log).unwrap_or_default(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
