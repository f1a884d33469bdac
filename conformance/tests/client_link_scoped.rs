//! DEVIATIONS C2: the kernel sends IPv6 packets of its own into a fresh tun device (a router
//! solicitation from the link-local address, MLD reports); an upstream client carries them to
//! the server, which can only drop them. Our client does not send them.
//!
//! ```text
//!   SHOOT1 upstream client   vu 10.201.1.2/30 ── 10.201.1.1/30 ┐
//!                                                               SEED  our vpn-server (counts
//!   SHOOT2 vpn_client::run   vo 10.201.2.2/30 ── 10.201.2.1/30 ┘        what it ignores)
//! ```
//!
//! The kernel's own counters show the packets going into each client's tun
//! (`/proc/net/dev_snmp6/tun0`, `Icmp6OutMsgs`); the server's `ignored` counter shows what
//! reached it: more with the upstream client (the control), nothing more with ours, while a
//! ping crosses our client's tunnel.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_client_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER};
use pki::tls::{control_channel_server, PeerPolicy};
use pki::{CaBundle, Identity};
use protocol::digest::Digest;
use protocol::key::KeyDirection;
use protocol::session::ControlProtection;
use protocol::static_key;
use tokio_util::sync::CancellationToken;
use vpn_client::{Remote, Stopped, TlsMaterial};
use vpn_server::{Server, Settings, Stats};

const PORT: u16 = 1194;
const TIMEOUT: Duration = Duration::from_secs(30);

fn read(path: std::path::PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn server_settings(pki: &TestPki) -> Settings {
    let trust = CaBundle::from_pem(&read(pki.ca_cert())).expect("CA");
    let id = Identity::from_pem(&read(pki.server_cert()), &read(pki.server_key())).expect("id");
    let policy = PeerPolicy::client_peer();
    let ctx = control_channel_server(&id, &trust, &policy).expect("server context");
    let key = static_key::parse(&pki.ta_key_text().expect("ta.key")).expect("ta.key");
    let mut s = Settings::new(
        ctx,
        Arc::new(policy),
        ControlProtection::TlsAuth {
            key,
            direction: KeyDirection::Normal,
            digest: Digest::Sha256,
        },
    );
    s.listen = vec![SocketAddr::from(([0u16; 8], PORT))];
    s.auth = Digest::Sha256;
    s.duplicate_cn = true;
    s
}

fn client_settings(pki: &TestPki, server: Ipv4Addr) -> vpn_client::Settings {
    let key = static_key::parse(&pki.ta_key_text().expect("ta.key")).expect("ta.key");
    let mut s = vpn_client::Settings::new(
        vec![Remote::new(server.to_string(), PORT)],
        TlsMaterial::Pem {
            ca: read(pki.ca_cert()),
            cert: read(pki.client_cert()),
            key: read(pki.client_key()),
            peer: PeerPolicy::server_peer(),
        },
        ControlProtection::TlsAuth {
            key,
            direction: KeyDirection::Inverse,
            digest: Digest::Sha256,
        },
    );
    s.auth = Digest::Sha256;
    s
}

/// ICMPv6 messages the kernel in `ns` has sent into `tun0` (0 while there is no tun0).
fn icmp6_out(ns: &Netns) -> u64 {
    let Ok(out) = ns.run(["cat", "/proc/net/dev_snmp6/tun0"]) else {
        return 0;
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Icmp6OutMsgs"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `cond` holds, at most `TIMEOUT`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < TIMEOUT, "{what}: not within {TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn veth(seed: &Netns, shoot: &Netns, name: &str, n: u8) -> Ipv4Addr {
    Netns::veth_pair(shoot, name, seed, &format!("{name}s")).expect("veth");
    for (ns, dev, host) in [(shoot, name.to_owned(), 2), (seed, format!("{name}s"), 1)] {
        let out = ns
            .run([
                "ip",
                "addr",
                "add",
                &format!("10.201.{n}.{host}/30"),
                "dev",
                &dev,
            ])
            .expect("ip addr");
        assert!(out.status.success(), "{out:?}");
    }
    Ipv4Addr::new(10, 201, n, 1)
}

#[test]
fn link_scoped_ipv6_from_the_tun_never_reaches_the_server() {
    require_lab(&["openvpn", "openssl"]);
    let pki = TestPki::generate().expect("pki");
    let seed = Netns::new().expect("seed");
    let shoot_upstream = Netns::new().expect("shoot1");
    let shoot_ours = Netns::new().expect("shoot2");
    let via_upstream = veth(&seed, &shoot_upstream, "vu", 1);
    let via_ours = veth(&seed, &shoot_ours, "vo", 2);
    let settings = server_settings(&pki);
    let token = CancellationToken::new();

    std::thread::scope(|scope| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Arc<Stats>>();
        let server_token = token.clone();
        let seed_ref = &seed;
        scope.spawn(move || {
            seed_ref
                .run_in(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(async move {
                        let server = Server::bind(settings).await.expect("bind");
                        ready_tx.send(server.stats()).expect("ready");
                        server.run(server_token).await.expect("server run");
                    })
                })
                .expect("run in seed")
        });
        let guard = CancelGuard(token.clone());
        let stats = ready_rx.recv_timeout(TIMEOUT).expect("server ready");

        // The control: an upstream client carries the kernel's packets to the server.
        {
            let config = tcp_client_config(&pki, PORT, ControlWrap::TlsAuth, &["auth SHA256"])
                .replace(
                    &format!("remote 127.0.0.1 {PORT}"),
                    &format!("remote {via_upstream} {PORT}"),
                );
            let client = UpstreamOpenvpn::start(&shoot_upstream, &config, 3).expect("upstream");
            client
                .wait_for_log(INITIALIZED_MARKER, TIMEOUT)
                .expect("upstream client up");
            wait_until("ICMPv6 into the upstream client's tun", || {
                icmp6_out(&shoot_upstream) > 0
            });
            wait_until("the server ignoring the upstream client's packets", || {
                stats.ignored.load(Ordering::Relaxed) > 0
            });
        }
        let ignored = stats.ignored.load(Ordering::Relaxed);

        // Ours: the same packets go into its tun, none reaches the server.
        let client_settings = client_settings(&pki, via_ours);
        shoot_ours
            .run_in(|| {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let shutdown = CancellationToken::new();
                    let client = tokio::spawn(vpn_client::run(client_settings, shutdown.clone()));
                    // The client runs on the runtime's workers; this thread may block.
                    wait_until("ICMPv6 into our client's tun", || {
                        icmp6_out(&shoot_ours) > 0
                    });
                    // The tunnel carries traffic meanwhile.
                    let out = seed
                        .run(["ping", "-c", "3", "-i", "0.2", "-W", "2", "192.168.123.2"])
                        .expect("ping");
                    assert!(out.status.success(), "ping through our client: {out:?}");
                    shutdown.cancel();
                    let stopped = tokio::time::timeout(Duration::from_secs(10), client)
                        .await
                        .expect("client stops")
                        .expect("client task")
                        .expect("client result");
                    assert_eq!(stopped, Stopped::Shutdown);
                });
            })
            .expect("run in shoot2");
        assert_eq!(
            stats.ignored.load(Ordering::Relaxed),
            ignored,
            "link-scoped packets from our client reached the server"
        );
        drop(guard);
    });
}

/// Cancels the server when the test ends, also on a panic.
struct CancelGuard(CancellationToken);
impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
