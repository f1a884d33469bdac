//! `vpn_client::run` against upstream OpenVPN 2.6 through Debian's `tinyproxy`, in namespaces:
//!
//! ```text
//!  SHOOT (vpn_client::run, tun0)            SEED (openvpn server on 127.0.0.1:1194, tinyproxy)
//!   vpnt-shoot 10.78.0.2/24  ── veth ──  vpnt-seed 10.78.0.1/24, tinyproxy :8888
//!   tun0 192.168.123.2/24   ══ tunnel ══  tun 192.168.123.1/24, echo servers on it
//! ```
//!
//! The client sends `CONNECT 127.0.0.1:1194` with the `Reversed-VPN` header to tinyproxy, which
//! dials the server on SEED's loopback. Each test asserts on what the kernel in SHOOT shows
//! (`ip -n SHOOT addr|route`) and on a few MiB crossing the tunnel to an echo server bound to
//! the server's tun address, compared by SHA-256:
//!
//! * the tun gets the pushed 192.168.123.2/24, the pushed routes appear, traffic crosses;
//! * `pull-filter ignore "route 10.99"` keeps that route out while another pushed route is in;
//! * a direct connection (no proxy) after a remote that refuses, with `route-nopull`: the
//!   address is set, no route is;
//! * the server is killed and started again: the client reconnects by itself within 5 s of
//!   the new server listening, and traffic crosses again;
//! * the server is frozen (SIGSTOP) with `keepalive 1 3`: the client's ping-restart ends the
//!   session and a new one comes up once the server runs again;
//! * the server pushes `route-ipv6 2000::/3` (all of the IPv6 internet's global unicast space)
//!   to a client configured as vpn2 configures it (no pull-filters): the push guard refuses it
//!   with a warning naming the option (DEVIATIONS P12), the other pushed route is installed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use conformance::netns::Netns;
use conformance::our_client::ClientThread;
use conformance::our_settings::OurSettings;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{tcp_server_config, ControlWrap, UpstreamOpenvpn};
use netio::http::CustomHeader;
use netio::netlink::{IpPrefix, Netlink};
use openssl::sha::Sha256;
use protocol::push::{FilterAction, PullFilter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vpn_client::{HttpProxy, Remote, Settings, Stopped};

const SERVER_PORT: u16 = 1194;
const PROXY_PORT: u16 = 8888;
const SEED_VETH: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const SHOOT_VETH: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);
const CLIENT_TUN: &str = "192.168.123.2/24";
const TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes sent through the tunnel and echoed back per transfer.
const TRANSFER: usize = 4 << 20;

/// Two namespaces joined by a veth pair, a PKI, tinyproxy in SEED.
struct Lab {
    seed: Netns,
    shoot: Netns,
    pki: TestPki,
    _dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Lab {
        require_lab(&["openvpn", "openssl", "tinyproxy"]);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .with_ansi(false)
            .try_init();
        let seed = Netns::new().expect("netns seed");
        let shoot = Netns::new().expect("netns shoot");
        Netns::veth_pair(&shoot, "vpnt-shoot", &seed, "vpnt-seed").expect("veth");
        for (ns, dev, addr) in [
            (&seed, "vpnt-seed", SEED_VETH),
            (&shoot, "vpnt-shoot", SHOOT_VETH),
        ] {
            ns.run_in(|| {
                runtime().block_on(async {
                    let nl = Netlink::open().expect("netlink");
                    nl.add_address(dev, IpPrefix::new(addr.into(), 24).expect("prefix"))
                        .await
                        .expect("address");
                })
            })
            .expect("run_in");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        start_tinyproxy(&seed, dir.path());
        let pki = TestPki::generate().expect("pki");
        Lab {
            seed,
            shoot,
            pki,
            _dir: dir,
        }
    }

    /// Starts upstream OpenVPN in SEED (tls-auth SHA256, the 192.168.123.0/24 pool, `pushes`)
    /// and waits until it is up.
    fn start_server(&self, pushes: &[&str]) -> UpstreamOpenvpn<'_> {
        self.start_server_with(&[], pushes)
    }

    /// [`Lab::start_server`] with extra config lines (a later line wins, e.g. `local`).
    fn start_server_with(&self, lines: &[&str], pushes: &[&str]) -> UpstreamOpenvpn<'_> {
        let mut extra = vec!["auth SHA256".to_owned()];
        extra.extend(lines.iter().map(|l| (*l).to_owned()));
        extra.extend(pushes.iter().map(|p| format!("push \"{p}\"")));
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let config = tcp_server_config(&self.pki, SERVER_PORT, ControlWrap::TlsAuth, &extra);
        let server = UpstreamOpenvpn::start(&self.seed, &config, 3).expect("start openvpn");
        server
            .wait_for_log("Initialization Sequence Completed", TIMEOUT)
            .expect("server up");
        server
    }

    /// The client's settings: the remote through tinyproxy with the routing header, tls-auth
    /// SHA256, `connect-retry 1 2`.
    fn settings(&self) -> Settings {
        let mut settings = self
            .pki
            .our_client_settings(Remote::new("127.0.0.1", SERVER_PORT))
            .expect("client settings");
        let mut proxy = HttpProxy::new(SEED_VETH.to_string(), PROXY_PORT);
        proxy.options.custom_headers.push(CustomHeader::NameValue {
            name: "Reversed-VPN".into(),
            value: "outbound|1194||vpn-seed-server".into(),
        });
        settings.http_proxy = Some(proxy);
        settings.connect_retry = Duration::from_secs(1);
        settings.connect_retry_max = Duration::from_secs(2);
        settings.tun.txqueuelen = Some(1000);
        settings
    }

    /// `ip -n SHOOT ARGS...` output.
    fn ip_shoot(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["-n", self.shoot.name()])
            .args(args)
            .output()
            .expect("ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A TCP echo server on the server's tun address in SEED (the listening socket is made
    /// there; the runtime serving it may live anywhere).
    fn echo_listener(&self, port: u16) -> std::net::TcpListener {
        let listener = self
            .seed
            .run_in(|| std::net::TcpListener::bind((SERVER_TUN, port)))
            .expect("run_in")
            .expect("bind echo on the server tun address");
        listener.set_nonblocking(true).expect("nonblocking");
        listener
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn start_tinyproxy(seed: &Netns, dir: &Path) {
    conformance::tinyproxy::start(
        seed,
        dir,
        SEED_VETH,
        PROXY_PORT,
        "10.78.0.0/24",
        SERVER_PORT,
    )
    .expect("start tinyproxy");
}

/// Serves echo on `listener` until the task is aborted.
fn serve_echo(listener: std::net::TcpListener) -> tokio::task::JoinHandle<()> {
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    })
}

/// Sends [`TRANSFER`] pseudo-random bytes to the echo server through the tunnel and checks
/// that the same bytes come back (length and SHA-256).
async fn transfer(port: u16) -> Result<(), String> {
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        TcpStream::connect(SocketAddr::from((SERVER_TUN, port))),
    )
    .await
    .map_err(|_| "connect timed out".to_owned())?
    .map_err(|e| format!("connect: {e}"))?;
    let (mut r, mut w) = stream.split();
    let mut sent = Sha256::new();
    let writer = async {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = vec![0u8; 64 * 1024];
        for _ in 0..TRANSFER / chunk.len() {
            for b in chunk.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = state as u8;
            }
            sent.update(&chunk);
            w.write_all(&chunk).await?;
        }
        w.shutdown().await
    };
    let reader = async {
        let mut got = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0usize;
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got.update(&buf[..n]);
            total += n;
        }
        Ok::<_, std::io::Error>((total, got.finish()))
    };
    let (w, r) = tokio::time::timeout(TIMEOUT, async { tokio::join!(writer, reader) })
        .await
        .map_err(|_| "transfer timed out".to_owned())?;
    w.map_err(|e| format!("send: {e}"))?;
    let (total, got) = r.map_err(|e| format!("receive: {e}"))?;
    if total != TRANSFER {
        return Err(format!("{total} of {TRANSFER} bytes came back"));
    }
    if got != sent.finish() {
        return Err("echoed bytes differ (SHA-256)".to_owned());
    }
    Ok(())
}

/// Waits until `ip -n SHOOT addr show dev tun0` shows the pushed address.
fn wait_for_tun_address(lab: &Lab, client: &ClientThread<'_>) {
    client
        .wait_until(&format!("{CLIENT_TUN} on tun0"), TIMEOUT, || {
            let out = Command::new("ip")
                .args(["-n", lab.shoot.name(), "-4", "addr", "show", "dev", "tun0"])
                .output()
                .expect("ip");
            String::from_utf8_lossy(&out.stdout).contains(&format!("inet {CLIENT_TUN}"))
        })
        .expect("tunnel up");
}

/// Runs the client in SHOOT while `body` runs beside it on a runtime of its own, also in
/// SHOOT (its transfers start there); then stops the client and checks it stopped cleanly and
/// removed its tun device.
fn with_client<F>(lab: &Lab, settings: Settings, body: F)
where
    F: AsyncFnOnce(&ClientThread<'_>) + Send,
{
    std::thread::scope(|scope| {
        let client = ClientThread::spawn(scope, &lab.shoot, settings);
        lab.shoot
            .run_in(|| runtime().block_on(body(&client)))
            .expect("run_in shoot");
        assert_eq!(client.stop().expect("our client"), Stopped::Shutdown);
    });
    assert!(
        !lab.ip_shoot(&["link"]).contains("tun0"),
        "tun0 left behind: {}",
        lab.ip_shoot(&["link"])
    );
}

#[test]
fn client_through_tinyproxy_gets_the_pushed_address_and_route_and_carries_traffic() {
    let lab = Lab::new();
    let server = lab.start_server(&["route 10.99.0.0 255.255.0.0"]);
    let echo = lab.echo_listener(5001);
    with_client(&lab, lab.settings(), async |client| {
        let echo = serve_echo(echo);
        wait_for_tun_address(&lab, client);
        let routes = lab.ip_shoot(&["route"]);
        assert!(
            routes.contains("10.99.0.0/16 dev tun0"),
            "pushed route missing: {routes}"
        );
        let link = lab.ip_shoot(&["link", "show", "dev", "tun0"]);
        assert!(
            link.contains("mtu 1500") && link.contains("qlen 1000"),
            "{link}"
        );
        transfer(5001)
            .await
            .unwrap_or_else(|e| panic!("{e}; server log:\n{}", server.log()));
        echo.abort();
    });
    assert!(server.log().contains("Peer Connection Initiated"));
}

#[test]
fn pull_filter_ignore_keeps_a_pushed_route_out_while_another_one_is_added() {
    let lab = Lab::new();
    let _server = lab.start_server(&["route 10.99.0.0 255.255.0.0", "route 10.98.0.0 255.255.0.0"]);
    let mut settings = lab.settings();
    settings
        .pull
        .filters
        .push(PullFilter::new(FilterAction::Ignore, "route 10.99"));
    with_client(&lab, settings, async |client| {
        wait_for_tun_address(&lab, client);
        // Both routes come in one PUSH_REPLY, applied together after the address.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut routes = lab.ip_shoot(&["route"]);
        while !routes.contains("10.98.0.0/16 dev tun0") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            routes = lab.ip_shoot(&["route"]);
        }
        assert!(
            routes.contains("10.98.0.0/16 dev tun0"),
            "accepted route missing: {routes}"
        );
        assert!(
            !routes.contains("10.99."),
            "filtered route present: {routes}"
        );
    });
}

#[test]
fn client_reconnects_by_itself_after_the_server_restarts() {
    let lab = Lab::new();
    let server = lab.start_server(&["route 10.99.0.0 255.255.0.0"]);
    let first_echo = lab.echo_listener(5001);
    with_client(&lab, lab.settings(), async |client| {
        let echo = serve_echo(first_echo);
        wait_for_tun_address(&lab, client);
        transfer(5001).await.expect("traffic before the restart");
        echo.abort();

        drop(server); // SIGTERM; the TCP connection through tinyproxy closes
        let server = lab.start_server(&["route 10.99.0.0 255.255.0.0"]);
        let restarted = Instant::now();
        let echo = serve_echo(lab.echo_listener(5002));
        loop {
            if server.log().contains("Peer Connection Initiated") {
                break;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(5),
                "no reconnect within 5 s; server log:\n{}",
                server.log()
            );
            assert!(!client.is_finished(), "the client stopped");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let reconnect = restarted.elapsed();
        // The data keys of the new session are in place shortly after the server's line.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match transfer(5002).await {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("transfer after reconnect not yet through: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("traffic after the reconnect: {e}; log:\n{}", server.log()),
            }
        }
        echo.abort();
        eprintln!("reconnected {reconnect:?} after the server restart listened");
        let routes = lab.ip_shoot(&["route"]);
        assert_eq!(
            routes.matches("10.99.0.0/16 dev tun0").count(),
            1,
            "route after reconnect: {routes}"
        );
        assert!(lab
            .ip_shoot(&["addr", "show", "dev", "tun0"])
            .contains(CLIENT_TUN));
    });
}

#[test]
fn direct_connection_with_route_nopull_gets_the_address_but_no_pushed_route() {
    let lab = Lab::new();
    // The server also listens on the veth address, so SHOOT can reach it without the proxy.
    let _server = lab.start_server_with(
        &[&format!("local {SEED_VETH}")],
        &["route 10.99.0.0 255.255.0.0"],
    );
    let mut settings = lab.settings();
    settings.http_proxy = None;
    settings.remotes = vec![
        // Nothing listens there: the client moves on to the next remote.
        Remote::new(SEED_VETH.to_string(), SERVER_PORT + 1),
        Remote::new(SEED_VETH.to_string(), SERVER_PORT),
    ];
    settings.pull.route_nopull = true;
    let echo = lab.echo_listener(5001);
    with_client(&lab, settings, async |client| {
        let echo = serve_echo(echo);
        wait_for_tun_address(&lab, client);
        let routes = lab.ip_shoot(&["route"]);
        assert!(!routes.contains("10.99."), "route-nopull: {routes}");
        transfer(5001)
            .await
            .expect("traffic over a direct connection");
        echo.abort();
    });
}

#[test]
fn client_restarts_on_ping_restart_when_the_server_freezes() {
    use rustix::process::{kill_process, Pid, Signal};
    let lab = Lab::new();
    // Pushes `ping 1`, `ping-restart 3`.
    let server = lab.start_server_with(&["keepalive 1 3"], &[]);
    let pid = Pid::from_raw(i32::try_from(server.pid()).expect("pid")).expect("pid");
    let echo = lab.echo_listener(5001);
    with_client(&lab, lab.settings(), async |client| {
        let echo = serve_echo(echo);
        wait_for_tun_address(&lab, client);
        transfer(5001).await.expect("traffic before the freeze");
        // The TCP connection stays open while the server is stopped: only the client's
        // ping-restart (3 s of silence) can end it.
        kill_process(pid, Signal::STOP).expect("SIGSTOP");
        tokio::time::sleep(Duration::from_secs(5)).await;
        kill_process(pid, Signal::CONT).expect("SIGCONT");
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.log().matches("Peer Connection Initiated").count() < 2 {
            assert!(
                Instant::now() < deadline,
                "no second session after ping-restart; server log:\n{}",
                server.log()
            );
            assert!(!client.is_finished(), "the client stopped");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = transfer(5001).await {
            assert!(Instant::now() < deadline, "traffic after ping-restart: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        echo.abort();
    });
}

/// A log buffer for [`ClientThread::spawn_logged`].
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    fn dispatch(&self) -> tracing::Dispatch {
        let buffer = self.clone();
        tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_env_filter("info")
                .with_writer(move || buffer.clone())
                .with_ansi(false)
                .finish(),
        )
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

#[test]
fn a_pushed_route_ipv6_2000_slash_3_is_refused_by_a_vpn2_configured_client() {
    let lab = Lab::new();
    let server = lab.start_server(&["route-ipv6 2000::/3", "route 10.99.0.0 255.255.0.0"]);
    let log = LogBuffer::default();
    // vpn2's client config: no pull-filters, no strict mode.
    let settings = lab.settings();
    assert!(settings.pull.filters.is_empty());
    std::thread::scope(|scope| {
        let client = ClientThread::spawn_logged(scope, &lab.shoot, settings, Some(log.dispatch()));
        wait_for_tun_address(&lab, &client);
        client
            .wait_until("10.99.0.0/16 on tun0", TIMEOUT, || {
                lab.ip_shoot(&["route"]).contains("10.99.0.0/16 dev tun0")
            })
            .expect("the other pushed route");
        let v6 = lab.ip_shoot(&["-6", "route"]);
        assert!(!v6.contains("2000::/3"), "refused route installed: {v6}");
        let text = log.text();
        let line = text
            .lines()
            .find(|l| l.contains("pushed option refused by the push guard"))
            .unwrap_or_else(|| panic!("no refusal logged:\n{text}"));
        assert!(line.contains(" WARN "), "{line}");
        assert!(
            line.contains("2000::/3 is wider than any network a tunnel carries: it amounts to a default route")
                && line.contains("option=\"route-ipv6 2000::/3\""),
            "{line}"
        );
        assert_eq!(client.stop().expect("our client"), Stopped::Shutdown);
    });
    assert!(
        server.log().contains("PUSH_REPLY") || server.log().contains("Peer Connection Initiated")
    );
}
