//! Who routes a server name that several `--config-dir` files claim depends on the files
//! alone (`vpn_router::config_dir` ownership rule): in lab namespaces, routers started on
//! directories where a thief's file claims the rightful shoot's SNI name — the thief's file
//! name sorting before and after the rightful one, each file arriving before and after the
//! other while a router runs, and routers started on the same directory at different times —
//! all route every name and CONNECT value to the same upstream, and the rightful shoot loses
//! nothing (its SNI name, its CONNECT route).

mod router_common;

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::tls_hello::client_hello;
use conformance::wait::wait_until;
use router_common::*;

/// The rightful shoot's file and its API name (Gardener's `api.<shoot>.<project>.` domain).
const RIGHTFUL: &str = "shoot--p--a.toml";
const NAME: &str = "api.a.p.example.com";
/// The thief's own name.
const THIEF_NAME: &str = "api.x.example.com";

fn seed_file() -> String {
    "[watch]\npoll_ms = 50\n\
     [[listener]]\naddress = \"10.79.0.1:0\"\nheaders = [\"Reversed-VPN\"]\n\
     [[listener]]\naddress = \"10.79.0.1:0\"\nkind = \"sni\"\n"
        .to_owned()
}

fn rightful_file(up: &Upstream) -> String {
    format!(
        "[[route]]\nvalue = \"{}\"\nupstream = \"{}\"\nallow = [\"10.79.0.0/24\"]\n\
         [[sni_route]]\nserver_names = [\"{NAME}\"]\nupstream = \"{}\"\nallow = [\"10.79.0.0/24\"]\n",
        vpn("shoot--p--a"),
        up.addr,
        up.addr
    )
}

fn thief_file(stem: &str, up: &Upstream) -> String {
    format!(
        "[[route]]\nvalue = \"{}\"\nupstream = \"{}\"\nallow = [\"10.79.0.0/24\"]\n\
         [[sni_route]]\nserver_names = [\"{NAME}\", \"{THIEF_NAME}\"]\nupstream = \"{}\"\n\
         allow = [\"10.79.0.0/24\"]\n",
        vpn(stem),
        up.addr,
        up.addr
    )
}

/// The upstream greeting after sending `hello` to `addr`, or `None` if the router closed.
fn reached(lab: &Lab, addr: std::net::SocketAddr, hello: &[u8]) -> Option<String> {
    let mut c = lab.connect_from(SHOOT_A.into(), addr);
    c.send(hello);
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        for up in ["up-a\n", "up-x\n"] {
            if out.windows(up.len()).any(|w| w == up.as_bytes()) {
                return Some(up.trim().to_owned());
            }
        }
        match c.stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    None
}

/// Where each SNI name and CONNECT value goes through `router`.
fn routing(lab: &Lab, router: &RouterGuard, thief: &str) -> Vec<(String, Option<String>)> {
    let mut table = Vec::new();
    for name in [NAME, THIEF_NAME] {
        let got = reached(lab, router.addr(1), &client_hello(name));
        table.push((name.to_owned(), got));
    }
    for ns in ["shoot--p--a", thief] {
        let head = connect(&[format!("Reversed-VPN: {}", vpn(ns))]);
        table.push((vpn(ns), reached(lab, router.addr(0), &head)));
    }
    table
}

fn want(thief: &str) -> Vec<(String, Option<String>)> {
    vec![
        (NAME.to_owned(), Some("up-a".to_owned())),
        (THIEF_NAME.to_owned(), Some("up-x".to_owned())),
        (vpn("shoot--p--a"), Some("up-a".to_owned())),
        (vpn(thief), Some("up-x".to_owned())),
    ]
}

fn write(dir: &Path, name: &str, text: &str) {
    // Whole files only: written aside, renamed in.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

/// Waits until `router` has read `file` and holds it as `ok` or not.
fn wait_for(router: &RouterGuard, file: &str) {
    wait_until(
        &format!("router read {file}"),
        Duration::from_secs(5),
        || router.counters.files.state(file).is_some(),
    );
}

#[test]
fn sni_name_ownership_depends_on_the_directory_alone() {
    let lab = Lab::new(&[]);
    let up_a = lab.upstream("up-a", 0);
    let up_x = lab.upstream("up-x", 0);
    // The thief's file sorting before and after the rightful one.
    for stem in ["shoot--a--x", "shoot--z--x"] {
        let thief = format!("{stem}.toml");
        let want = want(stem);
        // Both files there at start.
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "seed.toml", &seed_file());
        write(dir.path(), RIGHTFUL, &rightful_file(&up_a));
        write(dir.path(), &thief, &thief_file(stem, &up_x));
        let router = lab.router_dir(dir.path());
        assert_eq!(routing(&lab, &router, stem), want, "{thief} at start");
        drop(router);
        // Each file arriving while a router runs, then a second router started on the
        // same directory later.
        for (first, second) in [
            (
                (RIGHTFUL, rightful_file(&up_a)),
                (thief.as_str(), thief_file(stem, &up_x)),
            ),
            (
                (thief.as_str(), thief_file(stem, &up_x)),
                (RIGHTFUL, rightful_file(&up_a)),
            ),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            write(dir.path(), "seed.toml", &seed_file());
            write(dir.path(), first.0, &first.1);
            let early = lab.router_dir(dir.path());
            write(dir.path(), second.0, &second.1);
            wait_for(&early, second.0);
            assert_eq!(
                routing(&lab, &early, stem),
                want,
                "{} arriving after {}",
                second.0,
                first.0
            );
            let late = lab.router_dir(dir.path());
            assert_eq!(
                routing(&lab, &late, stem),
                want,
                "a router started later, {} after {}",
                second.0,
                first.0
            );
            assert_eq!(
                early.counters.files.state(RIGHTFUL).map(|s| s.0),
                Some(true),
                "the rightful file is wholly in force"
            );
            assert_eq!(late.counters.files.state(RIGHTFUL), Some((true, 0)));
        }
    }
}
