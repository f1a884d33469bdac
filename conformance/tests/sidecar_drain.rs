//! The sidecar at SIGTERM, in a lab namespace: it drains. A tunnel open at the signal carries
//! its answer to the end, a CONNECT made while it drains is still accepted and served (the
//! pod stays an endpoint of its Service until its processes have exited), and once none is
//! open the sidecar stops, its port refusing. Connections the kernel has queued when it stops
//! accepting are taken and served, not reset. With a drain time of 0 (Envoy's behaviour, the
//! vpn2 stand-in's setting) the open tunnel ends at the signal.
//!
//! ```text
//!  NS  lo 100.96.0.10: ":7005" echoes each line 600 ms after it came
//!      sidecar 127.0.0.1:9443 (metrics 127.0.0.1:15000)
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::require_lab;
use conformance::sidecar_lab::{
    config, connect_status, connector, ns_runtime, start_sidecar, tls, Pki, RunningSidecar,
};

const SHOOT: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
const TARGET: &str = "100.96.0.10:7005";
/// How long the far end takes to answer.
const SLOW: Duration = Duration::from_millis(600);

/// A namespace with the slow echo server and a sidecar draining for at most `drain`.
fn setup(drain: Duration) -> (Netns, Pki, RunningSidecar) {
    let pki = Pki::generate();
    let ns = Netns::new().expect("namespace");
    ns.run(["ip", "addr", "add", &format!("{SHOOT}/32"), "dev", "lo"])
        .expect("address");
    let listener = ns
        .run_in(|| TcpListener::bind((SHOOT, 7005)))
        .expect("run in namespace")
        .expect("bind");
    std::thread::spawn(move || {
        for s in listener.incoming().take(4) {
            let Ok(s) = s else { continue };
            std::thread::spawn(move || {
                let mut w = s.try_clone().expect("clone");
                for line in BufReader::new(s).lines() {
                    let Ok(line) = line else { return };
                    std::thread::sleep(SLOW);
                    if w.write_all(format!("{line}\n").as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut c = config(
        &pki,
        vec!["127.0.0.1:9443".parse().expect("addr")],
        vec!["127.0.0.1:15000".parse().expect("addr")],
        vec!["100.96.0.0/24".parse().expect("net")],
        vec![],
    );
    c.drain_timeout = drain;
    let sidecar = start_sidecar(ns_runtime(&ns), c, None);
    (ns, pki, sidecar)
}

/// Reads one line (or what came before EOF / an error).
fn line<S: Read>(s: &mut S) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = s.read(&mut byte) {
        out.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn wait_ended(sidecar: &RunningSidecar, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if sidecar.ended() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn open_tunnels_finish_and_new_connects_are_served_until_none_is_open() {
    require_lab(&[]);
    let (ns, pki, sidecar) = setup(Duration::from_secs(5));
    let addr = sidecar.addrs[0];
    let good = connector(&pki.bundle, Some(&pki.client));
    let (first, second, stopped, after) = ns
        .run_in(|| {
            let mut a = tls(&good, addr).expect("handshake");
            assert_eq!(connect_status(&mut a, TARGET), Some(200));
            a.write_all(b"before the signal\n").expect("write");
            sidecar.signal();
            std::thread::sleep(Duration::from_millis(100));
            let mut b = tls(&good, addr).expect("handshake while draining");
            assert_eq!(connect_status(&mut b, TARGET), Some(200));
            b.write_all(b"while draining\n").expect("write");
            let first = line(&mut a);
            let second = line(&mut b);
            assert!(!sidecar.ended(), "stopped with tunnels open");
            drop((a, b));
            let stopped = wait_ended(&sidecar, Duration::from_secs(3));
            let after = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map(drop);
            (first, second, stopped, after)
        })
        .expect("run in namespace");
    assert_eq!(
        first, "before the signal\n",
        "the tunnel open at the signal"
    );
    assert_eq!(second, "while draining\n", "a CONNECT made while draining");
    let stopped = stopped.expect("the sidecar stopped once no tunnel was open");
    assert!(
        stopped < Duration::from_secs(1),
        "stopped after {stopped:?}"
    );
    let refused = after.expect_err("the port after the drain");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    drop(sidecar);
}

#[test]
fn without_a_drain_time_open_tunnels_end_at_the_signal() {
    require_lab(&[]);
    let (ns, pki, sidecar) = setup(Duration::ZERO);
    let addr = sidecar.addrs[0];
    let good = connector(&pki.bundle, Some(&pki.client));
    let (got, stopped) = ns
        .run_in(|| {
            let mut a = tls(&good, addr).expect("handshake");
            assert_eq!(connect_status(&mut a, TARGET), Some(200));
            a.write_all(b"before the signal\n").expect("write");
            sidecar.signal();
            let stopped = wait_ended(&sidecar, Duration::from_secs(3));
            (line(&mut a), stopped)
        })
        .expect("run in namespace");
    assert_eq!(got, "", "the tunnel ended without its answer");
    let stopped = stopped.expect("stopped");
    assert!(stopped < SLOW, "stopped after {stopped:?}");
    drop(sidecar);
}

/// The sidecar's threads are busy (a loaded host) at the signal while connections arrive: the
/// kernel completes their handshakes and queues them, and the sidecar, finding none open, stops
/// accepting. Closing the listener with them queued would reset them; each is taken and
/// served. (This reset cut requests through a draining seed pod in `switch_nonha`.)
#[test]
fn connections_queued_when_the_sidecar_stops_accepting_are_served() {
    const QUEUED: usize = 3;
    require_lab(&[]);
    let (ns, pki, sidecar) = setup(Duration::from_secs(5));
    let addr = sidecar.addrs[0];
    let good = connector(&pki.bundle, Some(&pki.client));
    let (answers, stopped, after) = ns
        .run_in(|| {
            sidecar.stall(Duration::from_millis(300));
            sidecar.signal();
            let clients: Vec<_> = (0..QUEUED)
                .map(|i| {
                    let good = good.clone();
                    // Threads start in the namespace of the thread that made them.
                    std::thread::spawn(move || {
                        let mut s = match tls(&good, addr) {
                            Ok(s) => s,
                            Err(e) => return format!("handshake: {e}"),
                        };
                        if connect_status(&mut s, TARGET) != Some(200) {
                            return "CONNECT without 200".to_owned();
                        }
                        if s.write_all(format!("queued {i}\n").as_bytes()).is_err() {
                            return "write failed".to_owned();
                        }
                        line(&mut s)
                    })
                })
                .collect();
            let answers: Vec<String> = clients
                .into_iter()
                .map(|c| c.join().expect("client thread"))
                .collect();
            let stopped = wait_ended(&sidecar, Duration::from_secs(3));
            let after = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map(drop);
            (answers, stopped, after)
        })
        .expect("run in namespace");
    let want: Vec<String> = (0..QUEUED).map(|i| format!("queued {i}\n")).collect();
    assert_eq!(answers, want, "each queued connection carried its answer");
    stopped.expect("the sidecar stopped once they were done");
    let refused = after.expect_err("the port after the drain");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    drop(sidecar);
}
