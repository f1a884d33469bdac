//! A half-open path on each leg (issue 19's fault catalogue): one of our clients reaches our
//! server through the ingress router, then one leg goes silent in both directions (blackhole
//! routes in the two namespaces at its ends: packets vanish, nobody sends a reset).
//!
//! ```text
//!  SHOOT 10.82.1.2 ── leg A ── 10.82.1.1 INGRESS 10.82.2.1 ── leg B ── 10.82.2.2 SEED
//!  our client (tun0)          router (in process, :8443,         our server (thread, :1194)
//!                             metrics 127.0.0.1:9182)            keepalive 2 8
//! ```
//!
//! With `keepalive 2 8` the server pushes `ping 2` / `ping-restart 8` and restarts a silent
//! client itself after 16 s (twice the pushed value, as upstream). Each end must notice within
//! its bound, measured from the moment the blackholes went in, by closing its TCP connection
//! (its socket leaves ESTABLISHED in `ss`):
//!
//! * client: after at least `ping-restart - ping` (the last ping may have arrived just before)
//!   and at most `ping-restart` + 2 s;
//! * server: after at least `2 × ping-restart - ping` and at most `2 × ping-restart` + 2 s.
//!
//! The router cannot see a silent leg, but once the end on the live leg closes, it must close
//! the leg to the dead side at once (its socket there sends FIN: leaves ESTABLISHED within
//! 2 s) and let go of the tunnel (`vpn_router_tunnels_active` back to 0) when its idle timeout
//! (10 s here; 5 min by default) has run after the last byte. Then the blackholes go and the
//! client must come back and carry an echo. Measured times are printed.

mod faults_common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::our_client::ClientThread;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use faults_common::*;
use netio::http::CustomHeader;
use protocol::session::Keepalive;
use tokio_util::sync::CancellationToken;
use vpn_client::{HttpProxy, Remote};

const SHOOT: Ipv4Addr = Ipv4Addr::new(10, 82, 1, 2);
const INGRESS_A: Ipv4Addr = Ipv4Addr::new(10, 82, 1, 1);
const INGRESS_B: Ipv4Addr = Ipv4Addr::new(10, 82, 2, 1);
const SEED: Ipv4Addr = Ipv4Addr::new(10, 82, 2, 2);
const ROUTER_PORT: u16 = 8443;
const METRICS: &str = "127.0.0.1:9182";
const ROUTE: &str = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local";
const PING: u64 = 2;
const PING_RESTART: u64 = 8;
const IDLE: Duration = Duration::from_secs(10);
/// Slack on the upper bounds: timer wake-ups, the 100 ms polling of `ss`.
const SLACK: Duration = Duration::from_secs(2);

struct Lab {
    shoot: Netns,
    ingress: Netns,
    seed: Netns,
}

impl Lab {
    fn new() -> Lab {
        let shoot = Netns::new().expect("shoot");
        let ingress = Netns::new().expect("ingress");
        let seed = Netns::new().expect("seed");
        Netns::veth_pair(&shoot, "vpnt-pa", &ingress, "vpnt-pa-i").expect("veth a");
        Netns::veth_pair(&ingress, "vpnt-pb-i", &seed, "vpnt-pb").expect("veth b");
        for (ns, addr, dev) in [
            (&shoot, "10.82.1.2/24", "vpnt-pa"),
            (&ingress, "10.82.1.1/24", "vpnt-pa-i"),
            (&ingress, "10.82.2.1/24", "vpnt-pb-i"),
            (&seed, "10.82.2.2/24", "vpnt-pb"),
        ] {
            ns.run(["ip", "addr", "add", addr, "dev", dev])
                .expect("addr");
        }
        Lab {
            shoot,
            ingress,
            seed,
        }
    }

    /// The two namespaces at the ends of a leg and the address each end has on it.
    fn leg(&self, leg: Leg) -> [(&Netns, Ipv4Addr); 2] {
        match leg {
            Leg::A => [(&self.shoot, SHOOT), (&self.ingress, INGRESS_A)],
            Leg::B => [(&self.ingress, INGRESS_B), (&self.seed, SEED)],
        }
    }

    /// Blackhole routes for the far end in both namespaces of `leg` (`add`), or gone again.
    fn blackhole(&self, leg: Leg, add: bool) {
        let [(a, a_addr), (b, b_addr)] = self.leg(leg);
        let verb = if add { "add" } else { "del" };
        a.run(["ip", "route", verb, "blackhole", &format!("{b_addr}/32")])
            .expect("blackhole");
        b.run(["ip", "route", verb, "blackhole", &format!("{a_addr}/32")])
            .expect("blackhole");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// Client ↔ router.
    A,
    /// Router ↔ server.
    B,
}

/// TCP sockets in `ns`: (state, local, peer), from `ss -tanH`.
fn sockets(ns: &Netns) -> Vec<(String, String, String)> {
    let out = ns.run(["ss", "-tanH"]).expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // v4-mapped addresses of the server's dual-stack socket as plain IPv4.
            let plain = |a: &str| a.replace("[::ffff:", "").replace(']', "");
            (f.len() >= 5).then(|| (f[0].to_owned(), plain(f[3]), plain(f[4])))
        })
        .collect()
}

/// The state of the socket in `ns` from `local` to `peer` (each `ADDR:PORT` or a suffix of
/// it, so v4-mapped addresses match), if there is one.
fn state(ns: &Netns, local: &str, peer: &str) -> Option<String> {
    sockets(ns)
        .into_iter()
        .find(|(_, l, p)| l.ends_with(local) && p.ends_with(peer))
        .map(|(s, _, _)| s)
}

fn router_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("router.toml");
    std::fs::write(
        &path,
        format!(
            "metrics_listen = \"{METRICS}\"\n\n[timeouts]\nidle_ms = {}\n\n\
             [[listener]]\naddress = \"{INGRESS_A}:{ROUTER_PORT}\"\n\
             headers = [\"Reversed-VPN\"]\n\n\
             [[route]]\nvalue = \"{ROUTE}\"\nupstream = \"{SEED}:{}\"\n",
            IDLE.as_millis(),
            PORT
        ),
    )
    .expect("router config");
    path
}

/// Our router in process in `ns`, until the token is cancelled.
fn start_router(ns: &Netns, path: &Path) -> (tokio::runtime::Runtime, CancellationToken) {
    let token = CancellationToken::new();
    let rt = ns_runtime(ns);
    let router = rt
        .block_on(async {
            // Bound on a runtime thread: its listener belongs to INGRESS.
            let path = path.to_path_buf();
            tokio::spawn(async move { vpn_router::Router::bind(&path).await })
                .await
                .expect("join")
        })
        .expect("router bind");
    rt.spawn(router.run(token.clone()));
    (rt, token)
}

fn router_tunnels(lab: &Lab) -> f64 {
    series(
        &scrape(&lab.ingress, METRICS.parse::<SocketAddr>().expect("addr")),
        "vpn_router_tunnels_active",
    )
    .unwrap_or(-1.0)
}

fn assert_within(what: &str, t: Duration, low: Duration, high: Duration) {
    eprintln!("  {what}: {t:?} (bounds {low:?} .. {high:?})");
    assert!(
        t >= low && t <= high,
        "{what} after {t:?}, outside {low:?} .. {high:?}"
    );
}

fn half_open(leg: Leg) {
    require_lab(&["openssl", "openvpn", "ping", "ss"]);
    init_tracing();
    let lab = Lab::new();
    allow_asymmetric_replies(&lab.shoot);
    let pki = TestPki::generate().expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let (router_rt, router_token) = start_router(&lab.ingress, &router_config(dir.path()));
    let mut server_settings = pki.our_server_settings(PORT).expect("server settings");
    server_settings.keepalive = Some(Keepalive {
        ping: PING as u32,
        ping_restart: PING_RESTART as u32,
    });
    let mut client_settings = pki
        .our_client_settings(Remote::new(SEED.to_string(), PORT))
        .expect("client settings");
    let mut proxy = HttpProxy::new(INGRESS_A.to_string(), ROUTER_PORT);
    proxy.options.custom_headers.push(CustomHeader::NameValue {
        name: "Reversed-VPN".into(),
        value: ROUTE.into(),
    });
    client_settings.http_proxy = Some(proxy);
    client_settings.connect_retry = Duration::from_secs(1);
    client_settings.connect_retry_max = Duration::from_secs(2);

    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &lab.seed, server_settings).expect("server");
        let client = ClientThread::spawn(scope, &lab.shoot, client_settings);
        let devs = vec!["tun0".to_owned()];
        let up = ping_all(&lab.shoot, &devs, SERVER_TUN, Duration::from_secs(30));
        assert_eq!(up.len(), 1, "tunnel up through the router");
        assert_eq!(router_tunnels(&lab), 1.0);

        // The four sockets of the tunnel, named by their ends.
        let client_sock = sockets(&lab.shoot)
            .into_iter()
            .find(|(s, _, p)| s == "ESTAB" && p.ends_with(&format!("{INGRESS_A}:{ROUTER_PORT}")))
            .expect("the client's connection");
        let client_local = client_sock.1.clone();
        let router_b = sockets(&lab.ingress)
            .into_iter()
            .find(|(s, _, p)| s == "ESTAB" && p.ends_with(&format!("{SEED}:{PORT}")))
            .expect("the router's upstream connection");
        let router_b_local = router_b.1.clone();
        // Each end's view: client → router (leg A), router ← client, router → server,
        // server ← router (leg B).
        let client_open = || state(&lab.shoot, &client_local, &format!(":{ROUTER_PORT}"));
        let router_a = || state(&lab.ingress, &format!(":{ROUTER_PORT}"), &client_local);
        let router_b = || state(&lab.ingress, &router_b_local, &format!(":{PORT}"));
        let server_open = || state(&lab.seed, &format!(":{PORT}"), &router_b_local);
        for (what, s) in [
            ("client", client_open()),
            ("router leg A", router_a()),
            ("router leg B", router_b()),
            ("server", server_open()),
        ] {
            assert_eq!(
                s.as_deref(),
                Some("ESTAB"),
                "{what}'s socket before the fault"
            );
        }
        let established = server.stats().connected();

        let t0 = Instant::now();
        lab.blackhole(leg, true);
        eprintln!("half-open leg {leg:?} (keepalive {PING} {PING_RESTART}):");
        let estab = |s: Option<String>| s.as_deref() == Some("ESTAB");
        let limit = Duration::from_secs(2 * PING_RESTART) + IDLE + 3 * SLACK;
        let mut client_closed = None;
        let mut server_closed = None;
        let mut router_a_closed = None;
        let mut router_b_closed = None;
        let mut router_released = None;
        while t0.elapsed() < limit && router_released.is_none() {
            let t = t0.elapsed();
            if client_closed.is_none() && !estab(client_open()) {
                client_closed = Some(t);
            }
            if server_closed.is_none() && !estab(server_open()) {
                server_closed = Some(t);
            }
            if router_a_closed.is_none()
                && !matches!(router_a().as_deref(), Some("ESTAB" | "CLOSE-WAIT"))
            {
                router_a_closed = Some(t);
            }
            if router_b_closed.is_none()
                && !matches!(router_b().as_deref(), Some("ESTAB" | "CLOSE-WAIT"))
            {
                router_b_closed = Some(t);
            }
            if router_tunnels(&lab) == 0.0 {
                router_released = Some(t);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let ping = Duration::from_secs(PING);
        let restart = Duration::from_secs(PING_RESTART);
        let client_t = client_closed.expect("the client never closed its connection");
        assert_within(
            "client closed its connection (ping-restart)",
            client_t,
            restart - ping,
            restart + SLACK,
        );
        let server_t = server_closed.expect("the server never closed its connection");
        assert_within(
            "server closed its connection (2 × ping-restart)",
            server_t,
            2 * restart - ping,
            2 * restart + SLACK,
        );
        // The router's leg to the dead side: FIN sent as soon as the live end's FIN came.
        let (live_end_closed, dead_leg, dead_leg_closed) = match leg {
            Leg::A => (server_t, "A (to the client)", router_a_closed),
            Leg::B => (client_t, "B (to the server)", router_b_closed),
        };
        let dead_leg_closed =
            dead_leg_closed.unwrap_or_else(|| panic!("the router never closed leg {dead_leg}"));
        assert_within(
            &format!("router closed leg {dead_leg}"),
            dead_leg_closed,
            live_end_closed.saturating_sub(SLACK),
            live_end_closed + SLACK,
        );
        let released = router_released.expect("the router kept the tunnel");
        assert_within(
            "router released the tunnel (idle timeout)",
            released,
            live_end_closed,
            live_end_closed + IDLE + SLACK,
        );

        // The path comes back: so does the tunnel.
        lab.blackhole(leg, false);
        let healed = Instant::now();
        let back = ping_all(&lab.shoot, &devs, SERVER_TUN, Duration::from_secs(60));
        assert_eq!(back.len(), 1, "tunnel back after the path healed");
        assert!(server.stats().connected() > established);
        eprintln!("  tunnel back {:?} after the path healed", healed.elapsed());
        assert!(!client.is_finished());
        client.stop().expect("client");
        server.stop().result.expect("server");
    });
    router_token.cancel();
    router_rt.shutdown_timeout(Duration::from_secs(2));
}

#[test]
fn half_open_client_leg_is_detected_on_both_ends() {
    half_open(Leg::A);
}

#[test]
fn half_open_server_leg_is_detected_on_both_ends() {
    half_open(Leg::B);
}
