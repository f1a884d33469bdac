//! `vpn-server sidecar`'s restart guard (`SIDECAR_RESTART_GUARD_MS`, issue 29) in a lab
//! namespace: the sidecar is killed (`SIGKILL`) and started again 100 ms later while a client
//! connects in the gap.
//!
//! ```text
//!  NS  vpn-server sidecar (0.0.0.0:9443, [::]:9443), killed and restarted
//!      this test: TCP connects to 127.0.0.1:9443 in the gap and after it
//! ```
//!
//! With the guard (2 s) the connect made in the gap completes once the restarted sidecar
//! listens (its SYN was dropped, the kernel sent it again); with the sidecar killed for good
//! the port refuses again once the guard has expired. Without the guard (0) the connect in
//! the gap is refused at once.

#![allow(clippy::unwrap_used)] // test: a failed unwrap is a failed test

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::netns::Netns;
use lab::require_lab;
use lab::sidecar_client::Pki;
use rustix::process::{kill_process, Pid, Signal};

const BIN: &str = env!("CARGO_BIN_EXE_vpn-server");
const ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9443);
/// When the client connects after the kill.
const CONNECT_AFTER: Duration = Duration::from_millis(20);
/// When the sidecar starts again after the kill.
const RESTART_AFTER: Duration = Duration::from_millis(100);

/// Starts `vpn-server sidecar` in `ns` with the guard `guard_ms` and waits until it listens.
fn start(ns: &Netns, dir: &Path, guard_ms: &str, n: usize) -> u32 {
    start_as(ns, dir, guard_ms, n, &[])
}

/// [`start`], the binary started by `wrapper` (`setpriv ... --`) if not empty.
fn start_as(ns: &Netns, dir: &Path, guard_ms: &str, n: usize, wrapper: &[&str]) -> u32 {
    let log = std::fs::File::create(dir.join(format!("sidecar-{n}.log"))).unwrap();
    let file = |name: &str| dir.join(name).display().to_string();
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut cmd = ns.command(program);
            cmd.args(args).arg(BIN);
            cmd
        }
        None => ns.command(BIN),
    };
    let pid = ns
        .spawn(
            cmd.args(["sidecar", "--sidecar-metrics-listen", "none"])
                .args(["--sidecar-cert", &file("server.crt")])
                .args(["--sidecar-key", &file("server.key")])
                .args(["--sidecar-ca", &file("ca.crt")])
                .args(["--sidecar-allow", "100.96.0.0/24"])
                // The variable, not the flag: a binary without the guard ignores it.
                .env("SIDECAR_RESTART_GUARD_MS", guard_ms)
                .env("VPN_SERVER_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
        )
        .unwrap();
    wait_listening(ns, pid);
    pid
}

fn wait_listening(ns: &Netns, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ns
        .run_in(|| TcpStream::connect_timeout(&ADDR, Duration::from_millis(200)).is_err())
        .unwrap()
    {
        assert!(ns.try_wait(pid).is_none(), "the sidecar exited");
        assert!(Instant::now() < deadline, "the sidecar never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kill -9`, waited for (the process reaped and forgotten).
fn kill(ns: &Netns, pid: u32) {
    kill_process(
        Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(),
        Signal::KILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ns.try_wait(pid).is_none() {
        assert!(Instant::now() < deadline, "the sidecar outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(2));
    }
    ns.stop(pid);
}

/// Kills the sidecar, connects [`CONNECT_AFTER`] later (bounded by 5 s) while it is gone,
/// starts it again [`RESTART_AFTER`] after the kill; the connect's outcome and time.
fn connect_across_a_restart(
    ns: &Netns,
    dir: &Path,
    pid: u32,
    guard_ms: &str,
) -> (Result<Duration, ErrorKind>, u32) {
    kill(ns, pid);
    let killed = Instant::now();
    std::thread::scope(|s| {
        let client = s.spawn(|| {
            std::thread::sleep(CONNECT_AFTER.saturating_sub(killed.elapsed()));
            ns.run_in(|| {
                let started = Instant::now();
                TcpStream::connect_timeout(&ADDR, Duration::from_secs(5))
                    .map(|_| started.elapsed())
                    .map_err(|e| e.kind())
            })
            .unwrap()
        });
        std::thread::sleep(RESTART_AFTER.saturating_sub(killed.elapsed()));
        let next = start(ns, dir, guard_ms, 2);
        (client.join().unwrap(), next)
    })
}

fn nft_list(ns: &Netns) -> String {
    let out = ns
        .run(["nft", "list", "table", "inet", sidecar::RESTART_TABLE])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_connect_while_the_sidecar_restarts_waits_for_it_and_the_guard_expires_after_its_end() {
    require_lab(&["nft"]);
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let ns = Netns::new().unwrap();

    let pid = start(&ns, dir.path(), "2000", 1);
    let listed = nft_list(&ns);
    for rule in [
        "tcp dport 9443 tcp flags syn / syn,rst socket wildcard != 2 accept",
        "meta nfproto ipv4 tcp dport 9443 tcp flags syn / syn,rst tcp dport @serving drop",
        "meta nfproto ipv6 tcp dport 9443 tcp flags syn / syn,rst tcp dport @serving drop",
    ] {
        assert!(listed.contains(rule), "no {rule:?} in\n{listed}");
    }
    assert!(listed.contains("elements = { 9443 "), "{listed}");

    let (gap, pid) = connect_across_a_restart(&ns, dir.path(), pid, "2000");
    let log = || std::fs::read_to_string(dir.path().join("sidecar-2.log")).unwrap_or_default();
    let took = gap.unwrap_or_else(|e| {
        panic!(
            "the connect in the gap failed ({e:?}); the restarted sidecar's log:\n{}",
            log()
        )
    });
    // The first SYN was dropped; the kernel's retransmission (1 s, or 3 s on a slow start)
    // found the new listener.
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(4),
        "the connect in the gap took {took:?}"
    );
    assert!(
        log().contains("SYNs to the listeners' ports wait while this process restarts"),
        "{}",
        log()
    );

    // Killed for good: dropped at first, refused once the guard has expired.
    kill(&ns, pid);
    let gone = Instant::now();
    let early = ns
        .run_in(|| {
            TcpStream::connect_timeout(&ADDR, Duration::from_millis(300)).map_err(|e| e.kind())
        })
        .unwrap();
    assert!(
        matches!(early, Err(ErrorKind::TimedOut | ErrorKind::WouldBlock)),
        "a connect right after the end: {early:?}"
    );
    std::thread::sleep(Duration::from_millis(2300).saturating_sub(gone.elapsed()));
    let late = ns
        .run_in(|| TcpStream::connect_timeout(&ADDR, Duration::from_secs(2)).map_err(|e| e.kind()))
        .unwrap();
    assert_eq!(
        late.map(drop),
        Err(ErrorKind::ConnectionRefused),
        "a connect 2.3 s after the end"
    );
}

#[test]
fn without_the_guard_a_connect_while_the_sidecar_restarts_is_refused() {
    require_lab(&["nft"]);
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    let ns = Netns::new().unwrap();

    let pid = start(&ns, dir.path(), "0", 1);
    let (gap, pid) = connect_across_a_restart(&ns, dir.path(), pid, "0");
    assert_eq!(gap.map(drop), Err(ErrorKind::ConnectionRefused));
    assert!(
        ns.run(["nft", "list", "table", "inet", sidecar::RESTART_TABLE])
            .is_err(),
        "a table without the guard"
    );
    ns.stop(pid);
}

#[test]
fn an_unprivileged_sidecar_serves_without_the_guard_and_says_so() {
    require_lab(&["nft", "setpriv"]);
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    pki.write(dir.path());
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let ns = Netns::new().unwrap();
    // Envoy's container in Gardener's seed pod: uid 65532, no capabilities.
    let unprivileged = [
        "setpriv",
        "--reuid",
        "65532",
        "--regid",
        "65532",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ];
    let pid = start_as(&ns, dir.path(), "2000", 1, &unprivileged);
    let started = Instant::now();
    // Serving at once: the refusal is the kernel's first answer, not a timeout.
    let log = || std::fs::read_to_string(dir.path().join("sidecar-1.log")).unwrap_or_default();
    while !log().contains("CONNECT sidecar listening") {
        assert!(started.elapsed() < Duration::from_secs(2), "{}", log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = log();
    assert!(
        log.contains("no restart guard: this process may not change the firewall"),
        "{log}"
    );
    assert!(
        ns.run(["nft", "list", "table", "inet", sidecar::RESTART_TABLE])
            .is_err(),
        "a table from an unprivileged sidecar"
    );
    ns.stop(pid);
}
