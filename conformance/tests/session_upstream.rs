//! Interop of `protocol`'s sessions with upstream OpenVPN 2.6, each case in its own network
//! namespace on 127.0.0.1, driven over real TCP by `conformance::driver`:
//!
//! * our `ClientSession` with an upstream server: handshake, `PUSH_REPLY` through our pull
//!   policy, then ICMP echo requests we encrypt to the server's tun address are answered by
//!   the server's kernel through the tunnel;
//! * an upstream client with our `ServerSession`: the client reports "Initialization Sequence
//!   Completed", and echo requests we send into the tunnel are answered by the client's kernel;
//! * both with tls-auth SHA256 and AES-256-GCM, and with AES-256-CBC;
//! * a renegotiation forced by the upstream side (`reneg-sec 5`) is completed by ours in both
//!   roles, with traffic still crossing afterwards.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::driver::Driver;
use conformance::icmp::{echo_request, is_echo_reply};
use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{
    tcp_client_config, tcp_server_config, ControlWrap, UpstreamOpenvpn, INITIALIZED_MARKER,
};
use pki::tls::{control_channel_client, control_channel_server, PeerPolicy};
use pki::{CaBundle, Identity};
use protocol::data::DataCipher;
use protocol::digest::Digest;
use protocol::key::KeyDirection;
use protocol::ncp::DataCiphers;
use protocol::push::options::{RouteGatewayAddr, Topology};
use protocol::push::PushedOption;
use protocol::session::{
    ClientConfig, ClientSession, ClientSettings, ControlProtection, Event, Keepalive, ServerConfig,
    ServerEndpoint, SessionConfig,
};
use protocol::static_key;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

const PORT: u16 = 11940;
const TIMEOUT: Duration = Duration::from_secs(20);
const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);
const CLIENT_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 2);

fn read(path: std::path::PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shared session settings: tls-auth with `auth SHA256`, the given data ciphers.
fn session_config(pki: &TestPki, server_side: bool, ciphers: &str) -> SessionConfig {
    let trust = CaBundle::from_pem(&read(pki.ca_cert())).expect("CA");
    let (ctx, policy, direction) = if server_side {
        let id = Identity::from_pem(&read(pki.server_cert()), &read(pki.server_key())).expect("id");
        let policy = PeerPolicy::client_peer();
        let ctx = control_channel_server(&id, &trust, &policy).expect("server context");
        (ctx, policy, KeyDirection::Normal)
    } else {
        let id = Identity::from_pem(&read(pki.client_cert()), &read(pki.client_key())).expect("id");
        let policy = PeerPolicy::server_peer();
        let ctx = control_channel_client(&id, &trust, &policy).expect("client context");
        (ctx, policy, KeyDirection::Inverse)
    };
    let key = static_key::parse(&pki.ta_key_text().expect("ta.key")).expect("parse ta.key");
    let mut config = SessionConfig::new(
        ctx,
        ControlProtection::TlsAuth {
            key,
            direction,
            digest: Digest::Sha256,
        },
    );
    config.verifier = Arc::new(policy);
    config.auth = Digest::Sha256;
    config.data_ciphers = DataCiphers::parse(ciphers).expect("data-ciphers");
    config
}

/// Sends `count` echo requests from `src` to `dst` and waits for every reply.
fn ping_through<S: conformance::driver::Session>(
    driver: &mut Driver<S>,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    count: u16,
    what: &str,
    log: &dyn Fn() -> String,
) {
    for seq in 0..count {
        let payload = format!("gardener vpn {what} {seq}");
        driver
            .send_payload(&echo_request(src, dst, 0x4242, seq, payload.as_bytes()))
            .expect("send echo request");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut answered = false;
        while Instant::now() < deadline && !answered {
            driver
                .run_until(Instant::now() + Duration::from_millis(100), |_, _| false)
                .expect("drive");
            answered = driver
                .received
                .iter()
                .any(|p| is_echo_reply(p, dst, src, 0x4242, seq, payload.as_bytes()));
        }
        assert!(
            answered,
            "{what}: no echo reply {seq} from {dst}; dropped: {:?}; peer log:\n{}",
            driver.dropped,
            log()
        );
    }
}

/// Runs the session for 13 s while the upstream side renegotiates every 5 s (`reneg-sec 5`)
/// and asserts that at least two renegotiations completed.
fn expect_renegotiations<S: conformance::driver::Session>(
    driver: &mut Driver<S>,
    log: &dyn Fn() -> String,
) {
    let mut renegotiations = 0;
    driver
        .run_until(Instant::now() + Duration::from_secs(13), |_, e| {
            if let Event::KeyRenegotiated { .. } = e {
                renegotiations += 1;
            }
            matches!(e, Event::Closed(_))
        })
        .expect("drive");
    assert!(
        renegotiations >= 2,
        "{renegotiations} renegotiations in 13 s with reneg-sec 5; log:\n{}",
        log()
    );
}

fn our_client_with_upstream_server(cipher: &str, server_extra: &[&str], reneg: bool) {
    require_lab(&["openvpn", "openssl"]);
    let ns = Netns::new().expect("namespace");
    let pki = TestPki::generate().expect("pki");
    let mut extra = vec!["auth SHA256", "data-ciphers AES-256-GCM:AES-256-CBC"];
    extra.extend_from_slice(server_extra);
    let server = UpstreamOpenvpn::start(
        &ns,
        &tcp_server_config(&pki, PORT, ControlWrap::TlsAuth, &extra),
        4,
    )
    .expect("start upstream server");
    server.wait_listening(TIMEOUT).expect("listening");
    let log = || server.log();

    let config = ClientConfig::new(session_config(&pki, false, cipher));
    ns.run_in(|| {
        let stream =
            TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, PORT))).expect("connect");
        let session = ClientSession::new(
            config,
            Box::new(ChaCha20Rng::seed_from_u64(1)),
            Instant::now(),
        );
        let mut driver = Driver::new(session, stream).expect("driver");
        let connected = driver
            .run_until(Instant::now() + TIMEOUT, |_, e| {
                matches!(e, Event::Connected(_) | Event::Closed(_))
            })
            .expect("drive");
        let Some(Event::Connected(c)) = connected else {
            panic!("not connected: {connected:?}; server log:\n{}", log());
        };
        assert_eq!(c.cipher, DataCipher::from_name(cipher).expect("cipher"));
        assert!(
            c.push
                .accepted
                .iter()
                .any(|o| matches!(o, PushedOption::Ifconfig { local, .. } if *local == CLIENT_TUN)),
            "pushed ifconfig: {:?}",
            c.push
        );
        ping_through(&mut driver, CLIENT_TUN, SERVER_TUN, 3, cipher, &log);

        if reneg {
            expect_renegotiations(&mut driver, &log);
            ping_through(&mut driver, CLIENT_TUN, SERVER_TUN, 3, "after reneg", &log);
        }
        assert!(driver.dropped.is_empty(), "dropped: {:?}", driver.dropped);
    })
    .expect("run in namespace");
    assert!(
        server.log().contains("Peer Connection Initiated"),
        "{}",
        server.log()
    );
}

fn upstream_client_with_our_server(cipher: &str, client_extra: &[&str], reneg: bool) {
    require_lab(&["openvpn", "openssl"]);
    let ns = Netns::new().expect("namespace");
    let pki = TestPki::generate().expect("pki");
    let mut config = ServerConfig::new(session_config(&pki, true, cipher));
    config.push = vec![
        PushedOption::RouteGateway(RouteGatewayAddr::Addr(Ipv4Addr::new(192, 168, 123, 1))).into(),
        PushedOption::Topology(Topology::Subnet).into(),
    ];
    config.keepalive = Some(Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    let mut endpoint = ServerEndpoint::new(config);

    let listener = ns
        .run_in(|| TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, PORT))))
        .expect("run in namespace")
        .expect("listen");
    let mut extra = vec!["auth SHA256"];
    extra.extend_from_slice(client_extra);
    let client = UpstreamOpenvpn::start(
        &ns,
        &tcp_client_config(&pki, PORT, ControlWrap::TlsAuth, &extra),
        4,
    )
    .expect("start upstream client");
    let log = || client.log();

    let (stream, _) = listener.accept().expect("accept");
    let session = endpoint.new_session(Box::new(ChaCha20Rng::seed_from_u64(2)), Instant::now());
    let mut driver = Driver::new(session, stream).expect("driver");
    let connected = driver
        .run_until(Instant::now() + TIMEOUT, |session, e| {
            if let Event::ClientIdentified(id) = e {
                assert_eq!(
                    id.common_name.as_deref(),
                    Some("client"),
                    "the fixture client CN"
                );
                session.accept_client(
                    Instant::now(),
                    ClientSettings {
                        ifconfig: Some((
                            Ipv4Addr::new(192, 168, 123, 2),
                            Ipv4Addr::new(255, 255, 255, 0),
                        )),
                        ..ClientSettings::default()
                    },
                );
            }
            matches!(e, Event::Connected(_) | Event::Closed(_))
        })
        .expect("drive");
    let Some(Event::Connected(c)) = connected else {
        panic!("not connected: {connected:?}; client log:\n{}", log());
    };
    assert_eq!(c.cipher, DataCipher::from_name(cipher).expect("cipher"));
    // Wait until the client has configured its tun, then ping its kernel through the tunnel.
    let deadline = Instant::now() + TIMEOUT;
    while !client.log().contains(INITIALIZED_MARKER) && Instant::now() < deadline {
        driver
            .run_until(Instant::now() + Duration::from_millis(100), |_, _| false)
            .expect("drive");
    }
    assert!(client.log().contains(INITIALIZED_MARKER), "{}", log());
    ping_through(&mut driver, SERVER_TUN, CLIENT_TUN, 3, cipher, &log);

    if reneg {
        expect_renegotiations(&mut driver, &log);
        ping_through(&mut driver, SERVER_TUN, CLIENT_TUN, 3, "after reneg", &log);
    }
    assert!(driver.dropped.is_empty(), "dropped: {:?}", driver.dropped);
}

#[test]
fn our_client_upstream_server_tls_auth_sha256_aes_256_gcm() {
    our_client_with_upstream_server("AES-256-GCM", &[], false);
}

#[test]
fn our_client_upstream_server_aes_256_cbc() {
    our_client_with_upstream_server("AES-256-CBC", &[], false);
}

#[test]
fn upstream_client_our_server_tls_auth_sha256_aes_256_gcm() {
    upstream_client_with_our_server("AES-256-GCM", &[], false);
}

#[test]
fn upstream_client_our_server_aes_256_cbc() {
    upstream_client_with_our_server("AES-256-CBC", &["data-ciphers AES-256-CBC"], false);
}

#[test]
fn upstream_server_forces_renegotiation_every_5s() {
    our_client_with_upstream_server("AES-256-GCM", &["reneg-sec 5"], true);
}

#[test]
fn upstream_client_forces_renegotiation_every_5s() {
    upstream_client_with_our_server("AES-256-GCM", &["reneg-sec 5"], true);
}
