//! Our server before authentication (issue 19), in lab namespaces:
//!
//! * a first frame that is not a client hard reset with a valid tls-auth HMAC (bad HMAC,
//!   random bytes, a length no packet has, too short, another opcode) is closed at once,
//!   long before any deadline could close it, and counted;
//! * a connection that stays silent, or sends only part of a frame, is closed by the
//!   first-packet deadline, not before it, and counted;
//! * pending connections have their own bound: a flood of silent and bogus connections
//!   beyond it evicts its own kind, never an authenticated client, and a second client still
//!   gets in during the flood.
//!
//! ```text
//!  SHOOT 10.200.2.2 (probes, flood, upstream clients) ── veth ── SEED 10.200.2.1:1194 (ours)
//! ```
//!
//! The waits are bounded and generous; what is asserted is that a close happened (or did not
//! yet), never how fast.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use conformance::flood::{BogusFrame, Flood, FloodPath};
use conformance::netns::Netns;
use conformance::our_server::ServerThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};
use vpn_server::{ServerMetrics, Settings};

const PORT: u16 = 1194;
const SERVER: [u8; 4] = [10, 200, 2, 1];
const TIMEOUT: Duration = Duration::from_secs(30);

struct Lab {
    pki: TestPki,
    seed: Netns,
    shoot: Netns,
}

impl Lab {
    fn new(tools: &[&str]) -> Lab {
        require_lab(tools);
        let pki = TestPki::generate().expect("pki");
        let seed = Netns::new().expect("seed");
        let shoot = Netns::new().expect("shoot");
        Netns::veth_pair(&seed, "vpa1", &shoot, "vpa2").expect("veth");
        seed.run(["ip", "addr", "add", "10.200.2.1/30", "dev", "vpa1"])
            .expect("addr");
        shoot
            .run(["ip", "addr", "add", "10.200.2.2/30", "dev", "vpa2"])
            .expect("addr");
        Lab { pki, seed, shoot }
    }

    fn settings(&self) -> Settings {
        self.pki.our_server_settings(PORT).expect("server settings")
    }

    fn connect(&self) -> TcpStream {
        let target = SocketAddr::from((SERVER, PORT));
        self.shoot
            .run_in(move || TcpStream::connect_timeout(&target, TIMEOUT))
            .expect("run in shoot")
            .expect("connect")
    }

    /// An upstream client (tls-auth, `auth SHA256` as our settings) in the shoot.
    fn upstream_client(&self) -> UpstreamOpenvpn<'_> {
        let config = tcp_client_config(
            &self.pki,
            PORT,
            ControlWrap::TlsAuth,
            &["auth SHA256", "connect-retry 1 1"],
        )
        .replace(
            &format!("remote 127.0.0.1 {PORT}"),
            &format!("remote 10.200.2.1 {PORT}"),
        );
        UpstreamOpenvpn::start(&self.shoot, &config, 3).expect("upstream client")
    }
}

/// Waits until the server closes `s` (EOF or reset), reading past whatever it sends; how
/// long that took, or `None` if it was still open after `limit`.
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

/// Waits (at most 5 s) until `get` reaches `want`; its last value.
fn counter(stats: &ServerMetrics, get: fn(&ServerMetrics) -> u64, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(stats) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    get(stats)
}

#[test]
fn a_bogus_first_frame_is_closed_at_once() {
    let lab = Lab::new(&[]);
    let mut settings = lab.settings();
    // Neither deadline can explain a close within a second.
    settings.first_packet_timeout = Duration::from_secs(30);
    settings.handshake_timeout = Duration::from_secs(60);
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &lab.seed, settings).expect("our server");
        let stats = server.stats();
        let frames: Vec<(&str, Vec<u8>)> = vec![
            (
                "hard reset with a random HMAC",
                BogusFrame::BadHmacReset { hmac_len: 32 }.bytes(),
            ),
            ("random bytes in a frame", BogusFrame::RandomFrame.bytes()),
            ("a length no packet has", BogusFrame::BadLength.bytes()),
            ("zero length", vec![0, 0]),
            ("too short to be a packet", vec![0, 1, 0x38]),
            // A P_ACK_V1 (opcode 5): not a hard reset, whatever follows.
            ("not a hard reset", {
                let mut f = BogusFrame::BadHmacReset { hmac_len: 32 }.bytes();
                f[2] = 0x28;
                f
            }),
        ];
        for (what, bytes) in &frames {
            let mut s = lab.connect();
            s.write_all(bytes).expect("send");
            let closed = closed_within(&mut s, Duration::from_secs(1));
            assert!(closed.is_some(), "{what}: still open after 1 s");
        }
        let n = frames.len() as u64;
        assert_eq!(counter(stats, ServerMetrics::bad_first_packets, n), n);
        assert_eq!(stats.first_packet_timeouts(), 0);
        assert_eq!(stats.handshake_timeouts(), 0);
        server.stop().result.expect("run failed");
    });
}

#[test]
fn a_silent_connection_is_closed_by_the_first_packet_deadline() {
    const FIRST: Duration = Duration::from_secs(1);
    let lab = Lab::new(&[]);
    let mut settings = lab.settings();
    settings.first_packet_timeout = FIRST;
    settings.handshake_timeout = Duration::from_secs(60);
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &lab.seed, settings).expect("our server");
        let stats = server.stats();
        let mut silent = lab.connect();
        // Half a frame: a length prefix of 100 and 10 bytes of it.
        let mut partial = lab.connect();
        partial.write_all(&[0, 100]).expect("send");
        partial.write_all(&[0x38; 10]).expect("send");
        // Not before the deadline: both still open half-way to it ...
        std::thread::sleep(FIRST / 2);
        for s in [&mut silent, &mut partial] {
            s.set_nonblocking(true).expect("nonblocking");
            let mut buf = [0u8; 16];
            match s.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!("closed before the deadline: {other:?}"),
            }
            s.set_nonblocking(false).expect("blocking");
        }
        // ... but by it (with a generous margin).
        for s in [&mut silent, &mut partial] {
            closed_within(s, FIRST + Duration::from_secs(4)).expect("closed by the deadline");
        }
        assert_eq!(counter(stats, ServerMetrics::first_packet_timeouts, 2), 2);
        assert_eq!(stats.bad_first_packets(), 0);
        assert_eq!(stats.handshake_timeouts(), 0);
        server.stop().result.expect("run failed");
    });
}

#[test]
fn an_authenticated_client_is_never_evicted_by_pending_connections() {
    let lab = Lab::new(&["openvpn", "openssl"]);
    let mut settings = lab.settings();
    settings.max_clients = 2;
    settings.max_pending = 4;
    // Both clients use the fixture's one certificate.
    settings.duplicate_cn = true;
    std::thread::scope(|scope| {
        let server = ServerThread::spawn(scope, &lab.seed, settings).expect("our server");
        let stats = server.stats();
        let first = lab.upstream_client();
        first
            .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
            .expect("the first client gets in");
        // A flood far beyond the pending bound: 100 silent and 100 bogus connections, held.
        let flood = Flood::start(
            &lab.shoot,
            FloodPath::Direct(SocketAddr::from((SERVER, PORT))),
            100,
            100,
            500,
        )
        .expect("flood");
        let deadline = Instant::now() + TIMEOUT;
        while stats.evicted() < 50 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            stats.evicted() >= 50,
            "the flood evicted {}",
            stats.evicted()
        );
        // A second client still gets in while the flood goes on.
        let second = lab.upstream_client();
        second
            .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
            .unwrap_or_else(|e| panic!("the second client is locked out: {e:?}"));
        assert_eq!(stats.connected(), 2);
        // Both hold the max-clients slots now: the flood is closed at accept.
        assert!(counter(stats, ServerMetrics::refused_max_clients, 1) >= 1);
        let counts = flood.counts();
        drop(flood);
        // The first client never lost its tunnel.
        let log = first.log();
        for restart in ["SIGUSR1", "Connection reset", "restarting"] {
            assert!(
                !log.contains(restart),
                "the first client restarted ({restart}); flood {counts:?}:\n{log}"
            );
        }
        assert_eq!(log.matches(INITIALIZED_MARKER).count(), 1, "{log}");
        server.stop().result.expect("run failed");
        drop(first);
        drop(second);
    });
}
