//! `max-clients`, the pending bound and the deadline before authentication: idle TCP
//! connections fill every pending place, a further one evicts the oldest, the idle ones are
//! closed by the deadline, an upstream OpenVPN 2.6 client gets in (so half-open connections
//! cannot lock clients out), and with `max-clients` clients authenticated a further
//! connection is closed at once (as upstream).

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};
use vpn_server::Settings;

const HANDSHAKE: Duration = Duration::from_secs(2);

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(30);

fn settings(pki: &TestPki) -> Settings {
    let mut s = pki.our_server_settings(PORT).expect("server settings");
    s.max_clients = 1;
    s.max_pending = 2;
    s.first_packet_timeout = HANDSHAKE;
    s.handshake_timeout = HANDSHAKE;
    s
}

/// Waits until the server closes `s` (EOF or reset), reading past whatever it sends;
/// returns how long that took.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 256];
    while start.elapsed() < limit {
        s.set_read_timeout(Some(limit - start.elapsed() + Duration::from_millis(1)))
            .expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(start.elapsed())
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}

#[test]
fn idle_connections_cannot_lock_clients_out() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let shoot = Netns::new().expect("shoot");
    Netns::veth_pair(&seed, "vs1", &shoot, "vc1").expect("veth");
    seed.run(["ip", "addr", "add", "10.200.1.1/30", "dev", "vs1"])
        .expect("addr");
    shoot
        .run(["ip", "addr", "add", "10.200.1.2/30", "dev", "vc1"])
        .expect("addr");
    let settings = settings(&pki);
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &seed, settings).expect("our server");
        let stats = server.stats();
        let target = SocketAddr::from(([10, 200, 1, 1], PORT));
        let connect = || {
            shoot
                .run_in(move || TcpStream::connect_timeout(&target, TIMEOUT))
                .expect("run in shoot")
                .expect("connect")
        };
        // Two idle connections take both pending places (give the accept loop a moment for
        // each).
        let mut idle: Vec<TcpStream> = (0..2)
            .map(|_| {
                let s = connect();
                std::thread::sleep(Duration::from_millis(100));
                s
            })
            .collect();
        // A third evicts the oldest, which is closed at once.
        let third = connect();
        let t = closed_within(&mut idle[0], Duration::from_secs(1)).expect("oldest evicted");
        assert!(t < Duration::from_secs(1));
        assert_eq!(stats.evicted(), 1);
        assert_eq!(stats.refused_max_clients(), 0);
        idle[0] = third;
        // The idle ones are closed by the deadline.
        for s in &mut idle {
            closed_within(s, HANDSHAKE + Duration::from_secs(3))
                .expect("idle connection closed by the deadline");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while stats.first_packet_timeouts() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stats.first_packet_timeouts(), 2);
        // Keep the idle sockets open on our side: the server let go of them anyway.
        let config = tcp_client_config(
            &pki,
            PORT,
            ControlWrap::TlsAuth,
            &["auth SHA256", "connect-retry 1 1"],
        )
        .replace(
            &format!("remote 127.0.0.1 {PORT}"),
            &format!("remote 10.200.1.1 {PORT}"),
        );
        let client = UpstreamOpenvpn::start(&shoot, &config, 3).expect("client");
        client
            .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
            .expect("client gets in");
        assert_eq!(stats.connected(), 1);
        // Its max-clients slot is taken: a further connection is closed at once.
        let mut over = connect();
        let t = closed_within(&mut over, Duration::from_secs(1)).expect("closed at accept");
        assert!(t < Duration::from_secs(1));
        assert_eq!(stats.refused_max_clients(), 1);
        server.stop().result.expect("run failed");
        drop(idle);
        drop(client);
    });
}
