//! What a replay of Gardener's non-HA VPN pods must show, as functions a test calls against
//! a running [`Landscape`]. Each returns what crossed, or a [`CheckError`] that says what did
//! or did not cross.
//!
//! The seed side is driven as the kube-apiserver drives it: mTLS to the sidecar on the seed
//! pod's 9443 with the `kube-apiserver-http-proxy-client` certificate, then `CONNECT
//! host:port HTTP/1.1` (its egress selector's `cluster` entry, gardener-pods.md §2.3/§2.6):
//! [`Egress`]. The far end is a [`FarEnd`] in the destination's namespace that reports the
//! source address it saw and echoes.
//!
//! | check | proves |
//! |---|---|
//! | [`wait_tunnel`] | the seed pod reaches a shoot node through the tunnel (ICMP, vpn2's 242/8) |
//! | [`kubelet`] | kube-apiserver → kubelet (node TCP 10250) through the sidecar, IPv4 and IPv6: source is the vpn-shoot pod, bytes come back exactly |
//! | [`webhook`] | the same to a webhook pod (TCP 9443 on its pod address) |
//! | [`tunnel_check`] | the gardenlet's tunnel check (its lab equivalent, see there) within its 5 s |
//! | [`overlap`] | an address of the overlapping pod network reaches the shoot; the seed pod's own neighbours are never reached through the sidecar |
//! | [`shoot_cannot_reach_seed`] | every connection the shoot side opens toward the seed is dropped without any answer, and did arrive at the seed's tunnel device |
//! | [`mss_clamped`] | the SYN at the node and the SYN-ACK at the seed carry an MSS that fits the path's narrowest link |
//! | [`rules`] | the rules in a pod's namespace are exactly the expected ones (none missing, doubled or extra) |
//!
//! The checks use fixed ports in the landscape's namespaces: run one at a time.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use openssl::ssl::{SslConnector, SslStream};
use pki::{CaBundle, Identity};

use super::capture::{flags, Capture, Packet, Transport};
use super::far_end::{parse_greeting, FarEnd};
use super::landscape::{
    seen_from_shoot, Landscape, INGRESS_POD, KUBE_APISERVER, NODE, SEED_POD, TWIN, VPN_SHOOT,
    WEBHOOK,
};
use super::rules::{self, Expected, RuleDiff, Ruleset};
use crate::netns::Netns;
use crate::LabError;

/// The name the kube-apiserver checks in the sidecar's certificate (non-HA).
pub const SIDECAR_NAME: &str = "vpn-seed-server";
/// The sidecar's port in the seed pod.
pub const SIDECAR_PORT: u16 = 9443;
/// The kubelet's port.
pub const KUBELET_PORT: u16 = 10250;
/// A webhook server's port in its pod (a webhook Service's usual target port).
pub const WEBHOOK_PORT: u16 = 9443;
/// The port the overlap check listens on in the seed's pods and the shoot's twin.
pub const NEIGHBOUR_PORT: u16 = 8080;
/// The gardenlet's tunnel check timeout (gardener-pods.md §6).
pub const GARDENLET_TUNNEL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a check waits for an answer that must not come.
pub const SILENCE: Duration = Duration::from_secs(2);
/// Bytes echoed through each crossing.
pub const ECHO_BYTES: usize = 64 * 1024;
/// Bound for each step that must succeed (never a speed assertion).
const STEP: Duration = Duration::from_secs(15);
/// Bytes per write in the echo exchange (written, then read back, in turn).
const ECHO_CHUNK: usize = 16 * 1024;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// Both, IPv4 first.
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// The address of a `(v4, v6)` pair.
    pub fn pick(self, pair: (Ipv4Addr, std::net::Ipv6Addr)) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(pair.0),
            Family::V6 => IpAddr::V6(pair.1),
        }
    }

    /// IP plus TCP header bytes without options: what an MSS leaves of an MTU.
    pub fn tcp_overhead(self) -> u32 {
        match self {
            Family::V4 => 40,
            Family::V6 => 60,
        }
    }
}

/// How the kube-apiserver reaches the sidecar: its TLS client (trusting the `ca-vpn`
/// bundle, presenting its client certificate) and the sidecar's address.
#[derive(Debug, Clone)]
pub struct Egress {
    tls: SslConnector,
    sidecar: SocketAddr,
}

impl Egress {
    /// The kube-apiserver's egress to the sidecar at `SEED_POD:9443`.
    pub fn new(bundle: &CaBundle, client: &Identity) -> Result<Egress, LabError> {
        let tls = pki::tls::connect_proxy_connector(Some(client), bundle).map_err(|e| {
            LabError::Material {
                what: "the kube-apiserver's client certificate".into(),
                source: Box::new(e),
            }
        })?;
        Ok(Egress {
            tls,
            sidecar: SocketAddr::from((SEED_POD, SIDECAR_PORT)),
        })
    }

    /// The sidecar's address.
    pub fn sidecar(&self) -> SocketAddr {
        self.sidecar
    }

    /// The same client toward another address (a Service's in front of the seed pods).
    pub fn toward(&self, sidecar: SocketAddr) -> Egress {
        Egress {
            tls: self.tls.clone(),
            sidecar,
        }
    }
}

/// One kube-apiserver connection through the sidecar (call it inside the kube-apiserver's
/// namespace): TLS to the sidecar, `CONNECT target`, the stream once answered 200; each step
/// waits at most `wait`.
pub fn connect(
    egress: &Egress,
    target: SocketAddr,
    wait: Duration,
) -> Result<SslStream<TcpStream>, CheckError> {
    let mut s = open(egress, wait)?;
    match request(&mut s, target, wait)? {
        Answer::Status(200) => Ok(s),
        answer => Err(CheckError::NotConnected { target, answer }),
    }
}

/// How a CONNECT was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A status line with this code.
    Status(u16),
    /// The sidecar closed the connection before a whole response head.
    Closed,
    /// Nothing within the wait.
    Silent,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Status(c) => write!(f, "status {c}"),
            Answer::Closed => f.write_str("closed without an answer"),
            Answer::Silent => f.write_str("no answer"),
        }
    }
}

/// One connection the kube-apiserver made through the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    /// What it asked for.
    pub target: SocketAddr,
    /// The source address the far end saw.
    pub source: SocketAddr,
    /// Bytes that went there and came back identical.
    pub echoed: usize,
    /// From the TCP connect to the sidecar to the last echoed byte.
    pub took: Duration,
}

/// A connection the shoot side tries to open toward the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connect.
    Tcp(SocketAddr),
    /// A UDP datagram that waits for any reply.
    Udp(SocketAddr),
    /// ICMP echo requests.
    Ping(IpAddr),
}

impl Probe {
    fn addr(&self) -> IpAddr {
        match self {
            Probe::Tcp(a) | Probe::Udp(a) => a.ip(),
            Probe::Ping(ip) => *ip,
        }
    }

    /// Whether `p` (seen on the seed's tunnel device) is this probe arriving.
    fn arrived(&self, p: &Packet) -> bool {
        if p.dst != self.addr() {
            return false;
        }
        match (self, p.transport) {
            (Probe::Tcp(a), Transport::Tcp { dst, .. }) => dst == a.port(),
            (Probe::Udp(a), Transport::Udp { dst, .. }) => dst == a.port(),
            // Echo request: 8 (ICMP), 128 (ICMPv6).
            (Probe::Ping(_), Transport::Icmp { kind, .. }) => kind == 8 || kind == 128,
            _ => false,
        }
    }

    /// Whether `p` answers `arrival` (a packet of this probe): from the probed address to
    /// the probe's source, from the probed port to the source port (any ICMP).
    fn answers(&self, arrival: &Packet, p: &Packet) -> bool {
        if p.src != self.addr() || p.dst != arrival.src {
            return false;
        }
        match (arrival.transport, p.transport) {
            (Transport::Tcp { src, dst, .. }, Transport::Tcp { src: s, dst: d, .. })
            | (Transport::Udp { src, dst }, Transport::Udp { src: s, dst: d }) => {
                s == dst && d == src
            }
            (_, Transport::Icmp { .. }) => true,
            _ => false,
        }
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Tcp(a) => write!(f, "TCP connect to {a}"),
            Probe::Udp(a) => write!(f, "UDP datagram to {a}"),
            Probe::Ping(ip) => write!(f, "ping {ip}"),
        }
    }
}

/// What the shoot side got for a [`Probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Nothing came back within the wait (the only acceptable outcome).
    Silent,
    /// An answer of some kind (connected, reset, ICMP error, echo reply, datagram).
    Answered(String),
}

/// The result of [`shoot_cannot_reach_seed`]: every probe with the packets of it that
/// arrived on the seed's tunnel device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silence {
    /// Each probe and how many of its packets the seed received (and dropped).
    pub dropped: Vec<(Probe, usize)>,
}

/// What [`overlap`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The connection to the shoot pod that shares the seed kube-apiserver's address.
    pub twin: Crossing,
    /// The seed's own pods the sidecar was asked for, and how it answered (never 200).
    pub seed_pods: Vec<(SocketAddr, Answer)>,
}

/// What [`mss_clamped`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MssSeen {
    /// The SYN's MSS at the node.
    pub syn: u16,
    /// The SYN-ACK's MSS at the seed's tunnel device.
    pub syn_ack: u16,
    /// The largest MSS the path allows.
    pub limit: u16,
}

/// Why a check failed: what crossed that should not have, or what did not cross.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A lab step (a namespace, a program, a socket of the lab's own) failed.
    #[error("lab step failed")]
    Lab(#[from] LabError),
    /// The kube-apiserver could not open its TLS connection to the sidecar.
    #[error("kube-apiserver → sidecar {sidecar}: {why}")]
    Sidecar {
        /// The sidecar's address.
        sidecar: SocketAddr,
        /// What failed (TCP connect or TLS handshake).
        why: String,
    },
    /// The sidecar did not open the tunnel.
    #[error("CONNECT {target}: {answer} (want 200)")]
    NotConnected {
        /// The requested destination.
        target: SocketAddr,
        /// How the sidecar answered.
        answer: Answer,
    },
    /// The far end said nothing, or not its greeting.
    #[error("CONNECT {target}: 200, but the far end did not greet ({got:?})")]
    NoGreeting {
        /// The requested destination.
        target: SocketAddr,
        /// What arrived instead.
        got: String,
    },
    /// The far end saw another source than the vpn-shoot pod.
    #[error("CONNECT {target}: the far end saw source {saw}, not the vpn-shoot pod's {want}")]
    WrongSource {
        /// The requested destination.
        target: SocketAddr,
        /// The source the far end saw.
        saw: SocketAddr,
        /// The vpn-shoot pod's address.
        want: IpAddr,
    },
    /// The echoed bytes were not the bytes sent.
    #[error(
        "CONNECT {target}: sent {sent} bytes, {got} came back, first difference at {first_difference:?} ({why})"
    )]
    Echo {
        /// The requested destination.
        target: SocketAddr,
        /// Bytes sent.
        sent: usize,
        /// Bytes received back.
        got: usize,
        /// The first offset where they differ.
        first_difference: Option<usize>,
        /// Why the exchange ended.
        why: String,
    },
    /// A far end in a pod that must not be reached was reached.
    #[error("{what}: {pod} was reached from {peers:?}")]
    Reached {
        /// What was asked.
        what: String,
        /// The pod that saw a connection.
        pod: &'static str,
        /// Who it saw.
        peers: Vec<SocketAddr>,
    },
    /// The sidecar opened a tunnel to one of the seed's own pods.
    #[error("CONNECT {target} (the seed's {pod}) answered 200")]
    SeedPodConnected {
        /// The requested destination.
        target: SocketAddr,
        /// The seed pod whose address it is.
        pod: &'static str,
    },
    /// The gardenlet's tunnel check took too long.
    #[error("the tunnel check took {took:?}; the gardenlet gives up after {limit:?}")]
    TunnelCheckSlow {
        /// How long it took.
        took: Duration,
        /// The gardenlet's timeout.
        limit: Duration,
    },
    /// The seed answered a connection the shoot side opened.
    #[error("the shoot's {probe} was answered: {answer}; seed tun0 saw: {seen:?}")]
    ShootAnswered {
        /// The probe.
        probe: Probe,
        /// What came back.
        answer: String,
        /// The packets the seed sent from the probed address.
        seen: Vec<String>,
    },
    /// A probe never reached the seed, so its silence proves nothing.
    #[error("the shoot's {probe} never arrived at the seed's tunnel device; it saw: {seen:?}")]
    ProbeLost {
        /// The probe.
        probe: Probe,
        /// Everything the seed's tunnel device saw.
        seen: Vec<String>,
    },
    /// No handshake packet was captured where it must pass.
    #[error("{what}: not captured; saw {seen:?}")]
    NotCaptured {
        /// Which packet, where.
        what: &'static str,
        /// What was captured.
        seen: Vec<String>,
    },
    /// A handshake carried an MSS that does not fit the path.
    #[error("{what} carried MSS {mss}, more than the {limit} that {path}")]
    MssTooLarge {
        /// Which packet, where.
        what: &'static str,
        /// Its MSS.
        mss: u16,
        /// The largest that fits.
        limit: u16,
        /// The MTUs the limit comes from.
        path: String,
    },
    /// The rules in a pod's namespace are not the expected ones.
    #[error("rules in the {pod} pod differ:\n{diff}listed:\n{listed}")]
    Rules {
        /// The pod.
        pod: &'static str,
        /// The differences.
        diff: Box<RuleDiff>,
        /// Everything listed.
        listed: Box<Ruleset>,
    },
    /// The tunnel did not carry a ping within the wait.
    #[error("no echo reply from {target} through the tunnel within {waited:?}")]
    NoTunnel {
        /// The address pinged from the seed pod.
        target: Ipv4Addr,
        /// How long it tried.
        waited: Duration,
    },
}

/// Waits until the seed pod's ping of the shoot node (as vpn2 maps it, `242/8`) is answered:
/// the tunnel is up, its routes and both sides' NAT in place. Returns how long it took.
pub fn wait_tunnel(l: &Landscape, timeout: Duration) -> Result<Duration, CheckError> {
    let target = mapped_node();
    let started = Instant::now();
    loop {
        let replied = l
            .seed_pod
            .command("ping")
            .args(["-c", "1", "-W", "1", &target.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|source| LabError::Spawn {
                command: "ping".into(),
                source,
            })?
            .success();
        if replied {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= timeout {
            return Err(CheckError::NoTunnel {
                target,
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The shoot node's IPv4 address as the seed addresses it (vpn2's mapping of the node
/// network into `242/8`).
fn mapped_node() -> Ipv4Addr {
    rules::LANDSCAPE_NETMAP
        .iter()
        .filter_map(|(real, mapped)| {
            let real: ipnet::Ipv4Net = real.parse().ok()?;
            let mapped: ipnet::Ipv4Net = mapped.parse().ok()?;
            real.contains(&NODE.0).then(|| {
                let host = u32::from(NODE.0) & u32::from(real.hostmask());
                Ipv4Addr::from(u32::from(mapped.network()) | host)
            })
        })
        .next()
        .unwrap_or(NODE.0)
}

/// kube-apiserver → kubelet: `CONNECT <node>:10250` through the sidecar, with the node's
/// real address (the seed pod maps IPv4 into `242/8`, vpn2 style). The kubelet (a
/// [`FarEnd`] in the node's namespace) must see the vpn-shoot pod's address as the source
/// (vpn2 masquerades out of the pod's `eth0`) and echo [`ECHO_BYTES`] exactly.
pub fn kubelet(l: &Landscape, egress: &Egress, family: Family) -> Result<Crossing, CheckError> {
    let target = SocketAddr::new(family.pick(NODE), KUBELET_PORT);
    let far = FarEnd::start(&l.node, target)?;
    cross(l, egress, &far, family.pick(VPN_SHOOT), ECHO_BYTES)
}

/// kube-apiserver → webhook: `CONNECT <webhook pod>:9443` through the sidecar, as
/// [`kubelet`] (the pod address is in the pod network, which the seed's overlaps).
pub fn webhook(l: &Landscape, egress: &Egress, family: Family) -> Result<Crossing, CheckError> {
    let target = SocketAddr::new(family.pick(WEBHOOK), WEBHOOK_PORT);
    let far = FarEnd::start(&l.webhook, target)?;
    cross(l, egress, &far, family.pick(VPN_SHOOT), ECHO_BYTES)
}

/// The gardenlet's tunnel check, lab equivalent.
///
/// Gardener opens a port-forward to a running `app=vpn-shoot` pod (remote port 22, 5 s
/// timeout) and counts it a success once the forwarder is ready (gardener-pods.md §6):
/// the kube-apiserver has dialed the kubelet of that pod's node through its egress selector
/// (the sidecar, the tunnel) and the kubelet accepted the stream. Nothing has to listen on
/// port 22, and the last leg (kubelet into the pod's namespace) never crosses the VPN. The
/// honest equivalent in the lab is therefore that leg through the VPN and nothing more: an
/// mTLS `CONNECT <node>:10250` from the kube-apiserver's namespace answered 200, and the
/// kubelet (a [`FarEnd`] on the node) accepting the connection, both within the gardenlet's
/// 5 s ([`GARDENLET_TUNNEL_TIMEOUT`]). Returns how long it took.
pub fn tunnel_check(l: &Landscape, egress: &Egress) -> Result<Duration, CheckError> {
    let target = SocketAddr::new(IpAddr::V4(NODE.0), KUBELET_PORT);
    let kubelet = FarEnd::start(&l.node, target)?;
    let started = Instant::now();
    let answer = l.kube_apiserver.run_in(|| -> Result<Answer, CheckError> {
        let mut s = open(egress, GARDENLET_TUNNEL_TIMEOUT)?;
        request(&mut s, target, GARDENLET_TUNNEL_TIMEOUT)
    })??;
    if answer != Answer::Status(200) {
        return Err(CheckError::NotConnected { target, answer });
    }
    while kubelet.peers().is_empty() && started.elapsed() < GARDENLET_TUNNEL_TIMEOUT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed();
    if kubelet.peers().is_empty() || took > GARDENLET_TUNNEL_TIMEOUT {
        return Err(CheckError::TunnelCheckSlow {
            took,
            limit: GARDENLET_TUNNEL_TIMEOUT,
        });
    }
    Ok(took)
}

/// Overlapping seed and shoot pod networks (the landscape's are equal).
///
/// * `CONNECT <kube-apiserver's address>:8080`: the shoot pod `twin`, which has that address,
///   answers and sees the vpn-shoot pod as source, and the bytes come back; the seed's
///   kube-apiserver, listening on the same address and port, sees nothing.
/// * `CONNECT` to the seed pod's own address and the ingress pod's (no shoot pod has them):
///   never 200 within [`SILENCE`], and their listeners see nothing.
pub fn overlap(l: &Landscape, egress: &Egress) -> Result<Overlap, CheckError> {
    let at = |ip: Ipv4Addr| SocketAddr::from((ip, NEIGHBOUR_PORT));
    let seed_side = [
        (
            "kube-apiserver",
            FarEnd::start(&l.kube_apiserver, at(KUBE_APISERVER))?,
        ),
        (
            "seed (vpn-seed-server)",
            FarEnd::start(&l.seed_pod, at(SEED_POD))?,
        ),
        ("ingress", FarEnd::start(&l.ingress, at(INGRESS_POD))?),
    ];
    let twin = FarEnd::start(&l.twin, at(TWIN))?;
    let crossing = cross(l, egress, &twin, IpAddr::V4(VPN_SHOOT.0), ECHO_BYTES);
    let mut seed_pods = Vec::new();
    if crossing.is_ok() {
        for (pod, far) in &seed_side[1..] {
            let target = far.addr();
            let answer = l.kube_apiserver.run_in(|| -> Result<Answer, CheckError> {
                let mut s = open(egress, STEP)?;
                request(&mut s, target, SILENCE)
            })??;
            if answer == Answer::Status(200) {
                return Err(CheckError::SeedPodConnected { target, pod });
            }
            seed_pods.push((target, answer));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // A seed pod that saw a connection says more than how the twin's crossing failed.
    for (pod, far) in &seed_side {
        let peers = far.peers();
        if !peers.is_empty() {
            return Err(CheckError::Reached {
                what: format!("CONNECT {} through the sidecar", far.addr()),
                pod,
                peers,
            });
        }
    }
    let crossing = crossing?;
    Ok(Overlap {
        twin: crossing,
        seed_pods,
    })
}

/// The connections the shoot side can try toward the seed pod: to each of the seed's tunnel
/// addresses (`tun_addrs`, what the seed pod's `tun0` has) and to the seed pod as the shoot
/// sees it (`241/8`), TCP to `ports` and a high port, UDP to 1194 and a high port, ping;
/// and TCP 443 to the seed kube-apiserver as the shoot sees it (a seed neighbour).
pub fn seed_probes(tun_addrs: &[IpAddr], ports: &[u16]) -> Vec<Probe> {
    let high = random_port();
    let mut addrs: Vec<IpAddr> = tun_addrs.to_vec();
    addrs.push(IpAddr::V4(seen_from_shoot(SEED_POD)));
    let mut probes = Vec::new();
    for ip in &addrs {
        for port in ports.iter().copied().chain([high]) {
            probes.push(Probe::Tcp(SocketAddr::new(*ip, port)));
        }
        for port in [1194, high] {
            probes.push(Probe::Udp(SocketAddr::new(*ip, port)));
        }
        probes.push(Probe::Ping(*ip));
    }
    probes.push(Probe::Tcp(SocketAddr::new(
        IpAddr::V4(seen_from_shoot(KUBE_APISERVER)),
        443,
    )));
    probes
}

/// The global addresses of `dev` in `ns` (`ip -j addr show dev`).
pub fn addresses(ns: &Netns, dev: &str) -> Result<Vec<IpAddr>, LabError> {
    let out = ns.run(["ip", "-j", "addr", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut found = Vec::new();
    for link in v.as_array().into_iter().flatten() {
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if a["scope"] == "global" {
                if let Some(ip) = a["local"].as_str().and_then(|s| s.parse().ok()) {
                    found.push(ip);
                }
            }
        }
    }
    Ok(found)
}

/// The MTU of `dev` in `ns`.
pub fn mtu(ns: &Netns, dev: &str) -> Result<u32, LabError> {
    let out = ns.run(["ip", "-j", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .ok_or_else(|| LabError::CommandFailed {
            command: format!("ip -j link show dev {dev} (no mtu)"),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stdout).into_owned(),
        })
}

/// Every connection the shoot side opens toward the seed gets no answer.
///
/// From the vpn-shoot pod's namespace each probe runs at once (in parallel) and waits
/// [`SILENCE`]: a TCP connect must time out (no SYN-ACK, no reset, no ICMP error), a UDP
/// datagram get no reply (not even "port unreachable"), a ping no echo reply. Meanwhile the
/// seed pod's `tun0` is sniffed: every probe must have arrived there (else its silence proves
/// nothing), and no packet may have left the seed from a probed address. Run it when no other
/// traffic crosses the tunnel.
pub fn shoot_cannot_reach_seed(l: &Landscape, probes: &[Probe]) -> Result<Silence, CheckError> {
    let capture = Capture::start(&l.seed_pod, "tun0", "")?;
    let outcomes: Vec<Result<ProbeOutcome, LabError>> = std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| s.spawn(move || l.vpn_shoot.run_in(|| run_probe(&l.vpn_shoot, *p))?))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let packets = capture.finish()?;
    let seen = |keep: &dyn Fn(&Packet) -> bool| -> Vec<String> {
        packets
            .iter()
            .filter(|p| keep(p))
            .map(ToString::to_string)
            .collect()
    };
    let mut dropped = Vec::new();
    for (probe, outcome) in probes.iter().zip(outcomes) {
        let arrivals: Vec<&Packet> = packets.iter().filter(|p| probe.arrived(p)).collect();
        if arrivals.is_empty() {
            return Err(CheckError::ProbeLost {
                probe: *probe,
                seen: seen(&|_| true),
            });
        }
        // Anything from the probed address back to where the probe came from.
        let answers = seen(&|p| arrivals.iter().any(|a| probe.answers(a, p)));
        match outcome? {
            ProbeOutcome::Answered(answer) => {
                return Err(CheckError::ShootAnswered {
                    probe: *probe,
                    answer,
                    seen: answers,
                })
            }
            ProbeOutcome::Silent if !answers.is_empty() => {
                return Err(CheckError::ShootAnswered {
                    probe: *probe,
                    answer: "nothing the shoot noticed".into(),
                    seen: answers,
                })
            }
            ProbeOutcome::Silent => {}
        }
        dropped.push((*probe, arrivals.len()));
    }
    Ok(Silence { dropped })
}

/// One probe from the calling thread's namespace (`ns` runs `ping`).
fn run_probe(ns: &Netns, probe: Probe) -> Result<ProbeOutcome, LabError> {
    Ok(match probe {
        Probe::Tcp(addr) => match TcpStream::connect_timeout(&addr, SILENCE) {
            Ok(_) => ProbeOutcome::Answered("connected (SYN-ACK)".into()),
            Err(e) if e.kind() == ErrorKind::TimedOut => ProbeOutcome::Silent,
            Err(e) => ProbeOutcome::Answered(format!("connect failed at once: {e}")),
        },
        Probe::Udp(addr) => {
            let bind: SocketAddr = match addr {
                SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let sock = UdpSocket::bind(bind).map_err(|source| LabError::Socket {
                what: "probe UDP bind",
                source,
            })?;
            let setup = sock
                .connect(addr)
                .and_then(|()| sock.set_read_timeout(Some(SILENCE)));
            setup.map_err(|source| LabError::Socket {
                what: "probe UDP connect",
                source,
            })?;
            // Twice: an ICMP error for the first is reported on the second call at the latest.
            let mut buf = [0u8; 1500];
            let first = sock.send(b"probe from the shoot");
            let reply = first.and_then(|_| sock.recv(&mut buf));
            let second = sock.send(b"probe from the shoot");
            match (reply, second) {
                (Ok(n), _) => ProbeOutcome::Answered(format!("a {n}-byte reply")),
                (Err(e), _) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    ProbeOutcome::Answered(format!("error: {e}"))
                }
                (Err(_), Err(e)) => {
                    ProbeOutcome::Answered(format!("error on the second send: {e}"))
                }
                (Err(_), Ok(_)) => ProbeOutcome::Silent,
            }
        }
        Probe::Ping(ip) => {
            let out = ns
                .command("ping")
                .args(["-n", "-c", "2", "-i", "0.5", "-W", "2", &ip.to_string()])
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|source| LabError::Spawn {
                    command: "ping".into(),
                    source,
                })?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains(" 0 received") && !text.contains("error") {
                ProbeOutcome::Silent
            } else {
                ProbeOutcome::Answered(text.trim().replace('\n', " | "))
            }
        }
    })
}

/// MSS clamping (vpn2's rule in the vpn-shoot pod, both directions).
///
/// The kubelet check's handshake is captured at both ends: the SYN as it arrives at the
/// node, the SYN-ACK as it arrives on the seed pod's `tun0`. vpn2's rule clamps every SYN
/// the vpn-shoot pod sends to the MTU of the route out and of the route back to its source
/// (iptables' `--clamp-mss-to-pmtu`, nftables' `rt mtu`), so both must carry at most what
/// the narrowest link of the path allows: the vpn-shoot pod's `eth0` and `tun0`, the seed's
/// `tun0`. Unclamped, the SYN carries the tunnel's MSS (the seed pod's `tun0` route) and the
/// SYN-ACK the node's (its jumbo link); the landscape's MTUs make both larger than the limit.
pub fn mss_clamped(l: &Landscape, egress: &Egress, family: Family) -> Result<MssSeen, CheckError> {
    let filter = format!("tcp port {KUBELET_PORT}");
    let at_node = Capture::start(&l.node, "eth0", &filter)?;
    let at_seed = Capture::start(&l.seed_pod, "tun0", &filter)?;
    // A short exchange: the handshake is what counts, not how the path copes with segments
    // of the wrong size.
    let target = SocketAddr::new(family.pick(NODE), KUBELET_PORT);
    let far = FarEnd::start(&l.node, target)?;
    cross(l, egress, &far, family.pick(VPN_SHOOT), 1024)?;
    drop(far);
    let node_packets = at_node.finish()?;
    let seed_packets = at_seed.finish()?;
    let shoot_eth = mtu(&l.vpn_shoot, "eth0")?;
    let shoot_tun = mtu(&l.vpn_shoot, "tun0")?;
    let seed_tun = mtu(&l.seed_pod, "tun0")?;
    let path = shoot_eth.min(shoot_tun).min(seed_tun);
    let limit = u16::try_from(path.saturating_sub(family.tcp_overhead())).unwrap_or(u16::MAX);
    let mtus = format!(
        "the path allows (MTUs: vpn-shoot eth0 {shoot_eth}, vpn-shoot tun0 {shoot_tun}, seed tun0 {seed_tun})"
    );
    let find = |packets: &[Packet], want: u8, what: &'static str| {
        packets
            .iter()
            .find(|p| p.is_tcp(want))
            .and_then(Packet::syn_mss)
            .ok_or_else(|| CheckError::NotCaptured {
                what,
                seen: packets.iter().map(ToString::to_string).collect(),
            })
    };
    let syn = find(&node_packets, flags::SYN, "the SYN with an MSS at the node")?;
    let syn_ack = find(
        &seed_packets,
        flags::SYN | flags::ACK,
        "the SYN-ACK with an MSS at the seed's tun0",
    )?;
    for (what, mss) in [
        ("the SYN at the node", syn),
        ("the SYN-ACK at the seed's tun0", syn_ack),
    ] {
        if mss > limit {
            return Err(CheckError::MssTooLarge {
                what,
                mss,
                limit,
                path: mtus,
            });
        }
    }
    Ok(MssSeen {
        syn,
        syn_ack,
        limit,
    })
}

/// The rules in `ns` (the `pod`'s namespace) are exactly `expected`: none missing, none
/// twice, none else (an empty `expected`: no rules at all). Returns the listing.
pub fn rules(ns: &Netns, pod: &'static str, expected: &[Expected]) -> Result<Ruleset, CheckError> {
    let listed = rules::list(ns)?;
    let diff = rules::compare(&listed, expected);
    if diff.is_empty() {
        Ok(listed)
    } else {
        Err(CheckError::Rules {
            pod,
            diff: Box::new(diff),
            listed: Box::new(listed),
        })
    }
}

/// Through the sidecar to `far`, from the kube-apiserver's namespace: CONNECT, the greeting
/// must name `source`, `bytes` bytes must come back exactly.
fn cross(
    l: &Landscape,
    egress: &Egress,
    far: &FarEnd,
    source: IpAddr,
    bytes: usize,
) -> Result<Crossing, CheckError> {
    cross_from(&l.kube_apiserver, egress, far, source, bytes)
}

/// One kube-apiserver connection from namespace `kube_apiserver` through the sidecar of
/// `egress` to `far`: answered 200, the far end greets with `source` as the address it saw,
/// and `bytes` bytes come back identical (what [`kubelet`] and [`webhook`] check, for a
/// landscape of another shape).
pub fn cross_from(
    kube_apiserver: &Netns,
    egress: &Egress,
    far: &FarEnd,
    source: IpAddr,
    bytes: usize,
) -> Result<Crossing, CheckError> {
    let target = far.addr();
    let payload = pattern(bytes, target.port());
    let started = Instant::now();
    let crossing = kube_apiserver.run_in(|| -> Result<Crossing, CheckError> {
        let mut s = open(egress, STEP)?;
        let answer = request(&mut s, target, STEP)?;
        if answer != Answer::Status(200) {
            return Err(CheckError::NotConnected { target, answer });
        }
        let line = read_line(&mut s);
        let Some(saw) = parse_greeting(&line) else {
            return Err(CheckError::NoGreeting { target, got: line });
        };
        if saw.ip() != source {
            return Err(CheckError::WrongSource {
                target,
                saw,
                want: source,
            });
        }
        let mut back = Vec::with_capacity(payload.len());
        let mut why = String::from("complete");
        for chunk in payload.chunks(ECHO_CHUNK) {
            if let Err(e) = s.write_all(chunk) {
                why = format!("write: {e}");
                break;
            }
            let mut got = vec![0u8; chunk.len()];
            match s.read_exact(&mut got) {
                Ok(()) => back.extend_from_slice(&got),
                Err(e) => {
                    why = format!("read: {e}");
                    break;
                }
            }
        }
        if back != payload {
            return Err(CheckError::Echo {
                target,
                sent: payload.len(),
                got: back.len(),
                first_difference: back.iter().zip(&payload).position(|(a, b)| a != b),
                why,
            });
        }
        Ok(Crossing {
            target,
            source: saw,
            echoed: back.len(),
            took: started.elapsed(),
        })
    })??;
    Ok(crossing)
}

/// TCP and TLS to the sidecar, from the calling thread's namespace, within `wait`.
fn open(egress: &Egress, wait: Duration) -> Result<SslStream<TcpStream>, CheckError> {
    let sidecar = egress.sidecar;
    let fail = |why: String| CheckError::Sidecar { sidecar, why };
    let tcp =
        TcpStream::connect_timeout(&sidecar, wait).map_err(|e| fail(format!("connect: {e}")))?;
    tcp.set_read_timeout(Some(wait))
        .and_then(|()| tcp.set_write_timeout(Some(wait)))
        .map_err(|e| fail(format!("socket: {e}")))?;
    egress
        .tls
        .connect(SIDECAR_NAME, tcp)
        .map_err(|e| fail(format!("TLS handshake: {e}")))
}

/// Sends the kube-apiserver's `CONNECT target HTTP/1.1` and reads the response head, waiting
/// at most `wait` for it. The stream's read timeout is `STEP` afterwards.
fn request(
    s: &mut SslStream<TcpStream>,
    target: SocketAddr,
    wait: Duration,
) -> Result<Answer, CheckError> {
    let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let sidecar = s.get_ref().peer_addr().ok();
    s.write_all(head.as_bytes())
        .map_err(|e| CheckError::Sidecar {
            sidecar: sidecar.unwrap_or_else(|| SocketAddr::from((SEED_POD, SIDECAR_PORT))),
            why: format!("write CONNECT: {e}"),
        })?;
    let _ = s.get_ref().set_read_timeout(Some(wait));
    let deadline = Instant::now() + wait;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let answer = loop {
        if head.ends_with(b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head);
            break text
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .map_or(Answer::Closed, Answer::Status);
        }
        if Instant::now() >= deadline || head.len() > 8192 {
            break Answer::Silent;
        }
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => break Answer::Closed,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break Answer::Silent
            }
            Err(_) => break Answer::Closed,
        }
    };
    let _ = s.get_ref().set_read_timeout(Some(STEP));
    Ok(answer)
}

/// One line (without its newline), at most 256 bytes; whatever came if it ended early.
fn read_line<S: Read>(s: &mut S) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 256 {
        match s.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// `len` bytes that differ with `seed` and along the buffer.
fn pattern(len: usize, seed: u16) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8) ^ usize::from(seed)) as u8)
        .collect()
}

/// A port above the well-known ones, different from run to run.
fn random_port() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    20_000 + u16::try_from(nanos % 30_000).unwrap_or(0)
}
