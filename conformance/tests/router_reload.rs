//! SIGHUP reloads the router's policy atomically, under load.
//!
//! Two policies for one routing value, sent from 10.79.0.3:
//!
//! * A: `always_allowed = [10.79.0.3/32]`, the route leads to upstream U1 with an empty
//!   allow-list → 200 and U1's greeting;
//! * B: no always-allowed networks, the route leads to U2 with an allow-list that excludes
//!   the client → 403.
//!
//! A request decided by a mixture (A's always-allowed with B's route) would reach U2, which
//! neither policy allows; a request answered with anything but those two outcomes (no
//! answer, 400, 503) would show a window without a policy. Eight clients send requests in a
//! loop while the test rewrites the file (atomically, by rename) and sends the process
//! SIGHUP 40 times; every answer must be A's or B's. Then a broken file is loaded: the old
//! policy stays.

mod router_common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use router_common::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    U1,
    U2,
    Forbidden,
    Other,
}

fn policy(a: bool, u1: SocketAddr, u2: SocketAddr) -> String {
    let (always, upstream, allow) = if a {
        ("\"10.79.0.3/32\"", u1, "")
    } else {
        ("", u2, "\"10.0.0.1/32\"")
    };
    format!(
        "always_allowed = [{always}]\n\n[[listener]]\naddress = \"10.79.0.1:0\"\n\
         headers = [\"X-Gardener-Destination\"]\n\n[[route]]\nvalue = \"{}\"\n\
         upstream = \"{upstream}\"\nallow = [{allow}]\n",
        vpn("shoot--p--a")
    )
}

fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn sighup() {
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP)
        .expect("SIGHUP");
}

fn request(lab: &Lab, addr: SocketAddr) -> Outcome {
    let mut c = lab.connect_from(SHOOT_B.into(), addr);
    c.send(&connect(&[format!(
        "X-Gardener-Destination: {}",
        vpn("shoot--p--a")
    )]));
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    use std::io::Read;
    loop {
        match status(&out) {
            Some(403) if out.ends_with(b"\r\n\r\n") => return Outcome::Forbidden,
            Some(200) if out.ends_with(b"U1\n") => return Outcome::U1,
            Some(200) if out.ends_with(b"U2\n") => return Outcome::U2,
            _ => {}
        }
        match c.stream.read(&mut buf) {
            Ok(0) | Err(_) => return Outcome::Other,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Sends SIGHUP until a request sees `want` (the router's own handler may not be registered
/// the first time).
fn reload_until(lab: &Lab, addr: SocketAddr, want: Outcome) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        sighup();
        std::thread::sleep(Duration::from_millis(100));
        if request(lab, addr) == want {
            return;
        }
        assert!(Instant::now() < deadline, "policy never became {want:?}");
    }
}

#[test]
fn sighup_swaps_the_policy_atomically_under_load() {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let u2 = lab.upstream("U2", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &policy(true, u1.addr, u2.addr));
    let addr = router.addr(0);
    assert_eq!(request(&lab, addr), Outcome::U1);
    write_atomically(&router.path, &policy(false, u1.addr, u2.addr));
    reload_until(&lab, addr, Outcome::Forbidden);

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let lab = &lab;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    while seen.len() < 20 || !stop.load(Ordering::SeqCst) {
                        seen.push(request(lab, addr));
                        if seen.len() >= 2000 {
                            break;
                        }
                    }
                    seen
                })
            })
            .collect();
        for flip in 0..40 {
            write_atomically(&router.path, &policy(flip % 2 == 0, u1.addr, u2.addr));
            sighup();
            std::thread::sleep(Duration::from_millis(25));
        }
        stop.store(true, Ordering::SeqCst);
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    let count = |o: Outcome| outcomes.iter().filter(|&&x| x == o).count();
    assert_eq!(
        count(Outcome::U2),
        0,
        "a request was decided by a mixed policy"
    );
    assert_eq!(count(Outcome::Other), 0, "a request got no policy's answer");
    assert!(
        count(Outcome::U1) > 0 && count(Outcome::Forbidden) > 0,
        "both policies should have decided requests: {} U1, {} 403",
        count(Outcome::U1),
        count(Outcome::Forbidden)
    );

    // Last flip wrote B; settle on A, then a broken file keeps A.
    write_atomically(&router.path, &policy(true, u1.addr, u2.addr));
    reload_until(&lab, addr, Outcome::U1);
    write_atomically(&router.path, "[[listener]]\naddress = nonsense\n");
    sighup();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        assert_eq!(
            request(&lab, addr),
            Outcome::U1,
            "a bad file replaced the policy"
        );
    }
    assert_eq!(u2.connects(), 0);
}
