//! The seed–shoot–pod topology of the in-process tunnel tests (`sidecar_tunnel.rs`,
//! `hold_reconnect.rs`): [`TunnelLab::new`] makes the three namespaces, their links and
//! addresses; [`server_settings`] and [`client_settings`] are our server (in SEED) and client
//! (in SHOOT) for the test [`Pki`]; [`wait_route`] waits for the server's view of the client's
//! route. Test-only: failures panic with a message.
//!
//! ```text
//!  SEED  10.250.0.1/30 ──veth── 10.250.0.2/30  SHOOT  ip_forward=1
//!                                              100.96.0.1/24 ──veth── 100.96.0.10/24  POD
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use lab::netns::Netns;
use lab::sidecar_client::{Pki, VPN_CLIENT_CN, WAIT};
use pki::tls::{control_channel_server, PeerPolicy};
use protocol::digest::Digest;
use protocol::key::{Key2, KeyDirection};
use protocol::session::{ControlProtection, Keepalive};
use sidecar::RouteCheck as _;
use vpn_client::{Remote, TlsMaterial};
use vpn_server::{ClientOptions, ClientRoutes, Settings};

/// SEED's end of the link to SHOOT (the server listens here).
pub const SEED_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// SHOOT's end of the link to SEED.
pub const SHOOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
/// SHOOT's end of the link to POD (the pod's default gateway).
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 1);
/// The pod.
pub const POD_ADDR: Ipv4Addr = Ipv4Addr::new(100, 96, 0, 10);
/// The pod network, routed through the tunnel.
pub const POD_NETWORK: &str = "100.96.0.0/24";
/// The port the tests' pod listens on.
pub const POD_PORT: u16 = 8080;

/// The three namespaces, linked and addressed; deleted on drop.
#[derive(Debug)]
pub struct TunnelLab {
    /// Our server (and the sidecars).
    pub seed: Netns,
    /// Our client; forwards into the pod network.
    pub shoot: Netns,
    /// The pod, its default route via SHOOT.
    pub pod: Netns,
}

impl TunnelLab {
    /// Makes the namespaces, the veth pairs `seed-shoot`/`shoot-seed` and
    /// `shoot-pod`/`pod0`, the addresses above, the pod's default route and SHOOT's
    /// forwarding.
    #[must_use]
    pub fn new() -> Self {
        let seed = Netns::new().expect("seed");
        let shoot = Netns::new().expect("shoot");
        let pod = Netns::new().expect("pod");
        Netns::veth_pair(&seed, "seed-shoot", &shoot, "shoot-seed").expect("veth");
        Netns::veth_pair(&shoot, "shoot-pod", &pod, "pod0").expect("veth");
        let addresses: [(&Netns, String, &str); 4] = [
            (&seed, format!("{SEED_ADDR}/30"), "seed-shoot"),
            (&shoot, format!("{SHOOT_ADDR}/30"), "shoot-seed"),
            (&shoot, format!("{POD_GATEWAY}/24"), "shoot-pod"),
            (&pod, format!("{POD_ADDR}/24"), "pod0"),
        ];
        for (ns, cidr, dev) in &addresses {
            ns.run(["ip", "addr", "add", cidr, "dev", dev])
                .expect("address");
        }
        pod.run([
            "ip",
            "route",
            "add",
            "default",
            "via",
            &POD_GATEWAY.to_string(),
        ])
        .expect("route");
        shoot
            .run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            .expect("forwarding");
        Self { seed, shoot, pod }
    }
}

impl Default for TunnelLab {
    fn default() -> Self {
        Self::new()
    }
}

/// Our server on `[::]:1194` (tls-auth, SHA-256, keepalive 10/60, drain 2 s), routing
/// `routes` to the one client ([`VPN_CLIENT_CN`], iroutes the same), holding packets for it
/// for `hold`.
#[must_use]
pub fn server_settings(pki: &Pki, tls_auth: &Key2, routes: &[IpNet], hold: Duration) -> Settings {
    let policy = PeerPolicy::client_peer();
    let ctx = control_channel_server(&pki.server, &pki.bundle, &policy).expect("server context");
    let mut s = Settings::new(
        ctx,
        Arc::new(policy),
        ControlProtection::TlsAuth {
            key: tls_auth.clone(),
            direction: KeyDirection::Normal,
            digest: Digest::Sha256,
        },
    );
    s.listen = vec![SocketAddr::from(([0u16; 8], 1194))];
    s.auth = Digest::Sha256;
    s.keepalive = Some(Keepalive {
        ping: 10,
        ping_restart: 60,
    });
    s.routes = routes.to_vec();
    s.clients.insert(
        VPN_CLIENT_CN.into(),
        ClientOptions {
            iroutes: routes.to_vec(),
            ..ClientOptions::default()
        },
    );
    s.drain_timeout = Duration::from_secs(2);
    s.hold_timeout = hold;
    s
}

/// Our client towards the server at [`SEED_ADDR`], retrying after 1 s (at most 2 s).
#[must_use]
pub fn client_settings(pki: &Pki, tls_auth: &Key2) -> vpn_client::Settings {
    let mut s = vpn_client::Settings::new(
        vec![Remote::new(SEED_ADDR.to_string(), 1194)],
        TlsMaterial::Pem {
            ca: pki.bundle.to_pem().expect("pem"),
            cert: pki.vpn_client.chain_pem().expect("pem"),
            key: pki.vpn_client.key_pem().expect("pem"),
            peer: PeerPolicy::server_peer(),
        },
        ControlProtection::TlsAuth {
            key: tls_auth.clone(),
            direction: KeyDirection::Inverse,
            digest: Digest::Sha256,
        },
    );
    s.auth = Digest::Sha256;
    s.connect_retry = Duration::from_secs(1);
    s.connect_retry_max = Duration::from_secs(2);
    s
}

/// Waits (bounded by [`WAIT`]) until `routes` says `want` for the pod address; when it did.
pub fn wait_route(routes: &ClientRoutes, want: bool) -> Instant {
    let deadline = Instant::now() + WAIT;
    while routes.has_route(POD_ADDR.into()) != want {
        assert!(
            Instant::now() < deadline,
            "the server's client routes never became {want}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Instant::now()
}
