//! The router before routing (issue 19), in the `router_*` lab: connections whose CONNECT
//! head has not arrived have their own bound (`max_pending`); a newcomer beyond it evicts the
//! oldest pending one (closed unanswered), never a routed tunnel; a silent connection gets
//! 408 at the head deadline; both are counted in `vpn_router_pending_closed_total`.

mod router_common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use router_common::{connect, status, vpn, Lab, SHOOT_A};

const METRICS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 19101);

fn config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        "max_pending = 2\nmetrics_listen = \"{METRICS}\"\n{extra}\n\
         [[listener]]\naddress = \"10.79.0.1:0\"\nheaders = [\"X-Gardener-Destination\"]\n\n\
         [[route]]\nvalue = \"{}\"\nupstream = \"{upstream}\"\n",
        vpn("shoot--p--ab")
    )
}

fn hdr(name: &str, value: &str) -> String {
    format!("{name}: {value}")
}

/// `name{labels} value` from the router's `/metrics`, scraped inside SEED.
fn metric(lab: &Lab, series: &str) -> u64 {
    let text = lab
        .seed
        .run_in(|| {
            let mut s = TcpStream::connect(METRICS).expect("metrics connect");
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
                .expect("request");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read metrics");
            out
        })
        .expect("run_in seed");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
}

#[test]
fn a_full_pending_set_evicts_its_oldest_never_a_tunnel() {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &config(u1.addr, "[timeouts]\nheader_ms = 30000\n"));
    let addr = router.addr(0);
    let head = connect(&[hdr("X-Gardener-Destination", &vpn("shoot--p--ab"))]);

    // Two silent connections fill the pending set.
    let mut a = lab.connect_from(SHOOT_A.into(), addr);
    std::thread::sleep(Duration::from_millis(100));
    let mut b = lab.connect_from(SHOOT_A.into(), addr);
    std::thread::sleep(Duration::from_millis(100));
    // A third evicts the oldest: closed without an answer, long before the head deadline.
    let mut c = lab.connect_from(SHOOT_A.into(), addr);
    let (out, closed) = a.read_all();
    assert!(
        closed && out.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(
        metric(&lab, "vpn_router_pending_closed_total{reason=\"evicted\"}"),
        1
    );
    // The newcomer is served; once routed it is pending no more.
    c.send(&head);
    let got = c.read_until(b"U1\n");
    assert_eq!(status(&got), Some(200));
    assert_eq!(metric(&lab, "vpn_router_pending"), 1);

    // Two more silent ones: the second finds the set full again and evicts `b`, the oldest
    // pending one; the tunnel is not pending and stays.
    let _d = lab.connect_from(SHOOT_A.into(), addr);
    std::thread::sleep(Duration::from_millis(100));
    let _e = lab.connect_from(SHOOT_A.into(), addr);
    let (_, closed) = b.read_all();
    assert!(closed, "the older silent connection was evicted");
    c.send(b"ping\n");
    c.read_until(b"ping\n");
    assert_eq!(
        metric(&lab, "vpn_router_pending_closed_total{reason=\"evicted\"}"),
        2
    );
    assert_eq!(u1.connects(), 1);
}

#[test]
fn a_silent_connection_gets_408_at_the_head_deadline() {
    let lab = Lab::new(&[]);
    let u1 = lab.upstream("U1", 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let router = lab.router(&dir, &config(u1.addr, "[timeouts]\nheader_ms = 1000\n"));
    let mut silent = lab.connect_from(SHOOT_A.into(), router.addr(0));
    // `read_all` waits up to 5 s: the deadline is 1 s.
    let (out, closed) = silent.read_all();
    assert!(closed);
    assert_eq!(status(&out), Some(408));
    assert_eq!(
        metric(&lab, "vpn_router_pending_closed_total{reason=\"timeout\"}"),
        1
    );
    assert_eq!(metric(&lab, "vpn_router_requests_total{code=\"408\"}"), 1);
    assert_eq!(metric(&lab, "vpn_router_pending"), 0);
    assert_eq!(u1.connects(), 0);
}
