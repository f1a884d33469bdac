//! GEP-21's seed endpoint: `vpn-server --cloud-api-listen ADDR --cloud-api-clients CIDR`. An
//! HTTP CONNECT proxy (plain HTTP, what controllers take as `HTTPS_PROXY`) beside the OpenVPN
//! server whose clients are VMs in a private cloud (`vpn-client cloud-api`). Each CONNECT is
//! chained to the API proxy a VM runs on its end of the tunnel; that proxy holds the
//! allow-list and resolves names with the cloud's resolver. TLS stays end to end: this
//! endpoint sees only the CONNECT head and then relays bytes.
//!
//! ```text
//!  controller ──CONNECT keystone.example:5000──► listen (seed side only)
//!      peer outside --cloud-api-clients, or inside the VPN networks ─► 403, nothing read
//!      malformed head / not CONNECT / too slow ─► 400 / 405 / 408 ...
//!      no VM tunnel up ─► 503
//!      for each VM tunnel up (oldest tunnel first, the start rotating per request):
//!          TCP to <VM tunnel address>:--cloud-api-port, CONNECT target, within TRY_TIMEOUT
//!              unreachable / slow / closed ─► the next VM
//!              any answer other than 200 (403 from its allow-list, 502 ...) ─► passed on
//!      every VM failed ─► 502
//!      200, then relay (splice) until both sides close or the idle timeout
//! ```
//!
//! **The tunnel side reaches nothing here.** The endpoint only ever opens connections to the
//! tunnel addresses of connected VMs, on one port; it never takes a connection from the VPN
//! networks; and while it runs the server holds [`endpoint_table`]: the seed firewall of
//! vpn2's non-HA server (new connections in from the tunnel device dropped, replies pass) plus
//! the same for forwarding, so a VM cannot open a connection to this pod or through it.
//!
//! **HA.** Two or more VMs may dial the same endpoint (same CA, `duplicate-cn` or their own
//! certificates): whichever tunnels are up are tried in turn, starting at the next one for
//! each request. A VM that goes away costs a request at most [`TCP_TIMEOUT`] while the server
//! still lists it (a `kill -9` closes its TCP connection at once, so usually nothing); a VM
//! whose proxy failed is then tried last for [`SUSPECT_FOR`].
//!
//! **Audit.** One `info` line per CONNECT when it ends (`vpn_server::cloud_api::access`: the
//! controller, the target, the VM (CN and address) that carried it, the status, bytes each
//! way, the time, why it failed) and the `vpn_cloud_api_endpoint_*` series on the admin
//! endpoint.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netio::admin::{AdminState, Exposition, Kind};
use netio::firewall::Table;
use netio::http::ConnectRequest;
use netio::http_connect::{connect_over, ConnectError};
use netio::ingress::{accept_connect, canonical_ip, canonical_net, Accepted, Deadlines, ProxyMode};
use netio::relay::{relay_tcp, RelayConfig};
use netio::report::chain;
use protocol::http::connect::{Authority, Host, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

use crate::server::ClientRoutes;

/// The VMs' API proxy port by default (`vpn-client cloud-api`'s `cloud-api-port`).
pub const DEFAULT_CLOUD_PORT: u16 = 3128;
/// Bound on reaching one VM's proxy and getting its answer (its own connect to the API is
/// bounded by 10 s, so a slow API is still answered, with 504, within this).
pub const TRY_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on reaching one VM's proxy with TCP; a VM that is gone costs at most this.
pub const TCP_TIMEOUT: Duration = Duration::from_secs(3);
/// Tunnels open at once; more are answered 503.
pub const MAX_TUNNELS: usize = 4096;
/// A VM whose proxy failed is tried after the others for this long (until it answers
/// again), so a VM that went silent without its tunnel closing costs one request
/// [`TCP_TIMEOUT`], not every other one, until the server drops it.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// `vpn-server`'s GEP-21 flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudApiArgs {
    /// GEP-21 endpoint: HTTP CONNECT listen addresses for the seed's controllers
    /// (comma-separated); each CONNECT goes through a VM's tunnel to its API proxy. Needs
    /// --cloud-api-clients. Installs the seed firewall on the tunnel device.
    #[arg(long, env = "VPN_SERVER_CLOUD_API_LISTEN", value_delimiter = ',')]
    pub cloud_api_listen: Vec<SocketAddr>,
    /// The networks of the controllers that may use the endpoint (comma-separated CIDRs);
    /// others get 403. The VPN networks are never served.
    #[arg(long, env = "VPN_SERVER_CLOUD_API_CLIENTS", value_delimiter = ',')]
    pub cloud_api_clients: Vec<IpNet>,
    /// The port of the VMs' API proxy on their tunnel address.
    #[arg(long, env = "VPN_SERVER_CLOUD_API_PORT", default_value_t = DEFAULT_CLOUD_PORT)]
    pub cloud_api_port: u16,
}

/// Why the flags cannot work.
#[derive(Debug, thiserror::Error)]
pub enum CloudApiArgsError {
    /// Listen addresses without client networks (nobody could use it), or the reverse.
    #[error("--cloud-api-listen and --cloud-api-clients go together")]
    Incomplete,
}

impl CloudApiArgs {
    /// The endpoint's configuration, `None` without `--cloud-api-listen`. `tunnel_networks`
    /// are the server's VPN networks (never served).
    pub fn resolve(
        &self,
        tunnel_networks: Vec<IpNet>,
    ) -> Result<Option<CloudApiConfig>, CloudApiArgsError> {
        match (
            self.cloud_api_listen.is_empty(),
            self.cloud_api_clients.is_empty(),
        ) {
            (true, true) => Ok(None),
            (false, false) => Ok(Some(CloudApiConfig {
                listen: self.cloud_api_listen.clone(),
                // Peers are compared in canonical form: an IPv4-mapped network as written
                // could never match one.
                clients: self
                    .cloud_api_clients
                    .iter()
                    .map(|n| canonical_net(n.trunc()))
                    .collect(),
                tunnel_networks,
                cloud_port: self.cloud_api_port,
                idle_timeout: netio::relay::DEFAULT_IDLE_TIMEOUT,
            })),
            _ => Err(CloudApiArgsError::Incomplete),
        }
    }
}

/// What the endpoint needs.
#[derive(Debug, Clone)]
pub struct CloudApiConfig {
    /// Listen addresses (seed side).
    pub listen: Vec<SocketAddr>,
    /// Who may use it.
    pub clients: Vec<IpNet>,
    /// Who never may: the VPN networks.
    pub tunnel_networks: Vec<IpNet>,
    /// The VMs' proxy port.
    pub cloud_port: u16,
    /// No bytes either way for this long closes a tunnel.
    pub idle_timeout: Duration,
}

/// The firewall the server holds while the endpoint runs, in its table `vpn-seed-server`:
/// `base` (vpn2's environment mode: the whole seed table), else the seed rules for `device`
/// without address mapping; either way only replies come in from the tunnel, to this host
/// and through it (the seed table's INPUT and FORWARD guards).
pub fn endpoint_table(base: Option<Table>, device: &str) -> Table {
    base.unwrap_or_else(|| crate::vpn2::seed_table(device, None, None))
}

/// A bound endpoint; [`CloudApiEndpoint::run`] serves.
#[derive(Debug)]
pub struct CloudApiEndpoint {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: CloudApiConfig,
    routes: ClientRoutes,
    metrics: Arc<EndpointMetrics>,
    /// Where the next request starts in the list of tunnels.
    next: AtomicUsize,
    /// VM proxies that failed, and when (see [`SUSPECT_FOR`]).
    suspects: std::sync::Mutex<std::collections::HashMap<SocketAddr, Instant>>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl CloudApiEndpoint {
    /// Binds every listen address. Must run inside a tokio runtime.
    pub fn bind(
        config: CloudApiConfig,
        routes: ClientRoutes,
    ) -> Result<CloudApiEndpoint, (SocketAddr, std::io::Error)> {
        let listeners = netio::listen::bind_each(&config.listen)?;
        for l in &listeners {
            if let Ok(addr) = l.local_addr() {
                info!(%addr, clients = ?config.clients, cloud_port = config.cloud_port, "GEP-21 cloud API endpoint listening");
            }
        }
        Ok(CloudApiEndpoint {
            listeners,
            shared: Arc::new(Shared {
                config,
                routes,
                metrics: Arc::new(EndpointMetrics::default()),
                next: AtomicUsize::new(0),
                suspects: std::sync::Mutex::default(),
                permits: Arc::new(tokio::sync::Semaphore::new(MAX_TUNNELS)),
            }),
        })
    }

    /// The bound addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The endpoint's series, for an admin endpoint.
    pub fn metrics(&self) -> Arc<EndpointMetrics> {
        Arc::clone(&self.shared.metrics)
    }

    /// Serves until `shutdown`; then ends every tunnel and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        self.shared.metrics.serving.store(true, Ordering::Relaxed);
        for listener in self.listeners {
            let shared = Arc::clone(&self.shared);
            let shutdown = shutdown.clone();
            let conns = tracker.clone();
            tracker.spawn(async move {
                while let Some((stream, peer)) = netio::listen::accept(&listener, &shutdown).await {
                    let _ = stream.set_nodelay(true);
                    let shared = Arc::clone(&shared);
                    let shutdown = shutdown.clone();
                    conns.spawn(async move {
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            () = serve(&shared, stream, peer) => {}
                        }
                    });
                }
            });
        }
        shutdown.cancelled().await;
        self.shared.metrics.serving.store(false, Ordering::Relaxed);
        tracker.close();
        tracker.wait().await;
    }
}

/// What a CONNECT came to, for its log line.
struct Outcome {
    status: Status,
    target: String,
    /// The VM that carried it: CN and the proxy address.
    vm: Option<(String, SocketAddr)>,
    to_cloud: u64,
    to_seed: u64,
    detail: String,
}

impl Outcome {
    fn refused(status: Status, target: String, detail: impl Into<String>) -> Outcome {
        Outcome {
            status,
            target,
            vm: None,
            to_cloud: 0,
            to_seed: 0,
            detail: detail.into(),
        }
    }
}

async fn serve(shared: &Shared, mut stream: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    let metrics = &shared.metrics;
    let client = canonical_ip(peer.ip());
    if let Some(why) = client_refused(&shared.config, client) {
        metrics.client_denied.fetch_add(1, Ordering::Relaxed);
        metrics.responded(Status::FORBIDDEN.code);
        netio::ingress::refuse(&mut stream, Some(Status::FORBIDDEN)).await;
        log(
            peer,
            started,
            &Outcome::refused(Status::FORBIDDEN, "-".into(), why),
        );
        return;
    }
    let accepted = accept_connect(&mut stream, peer, &ProxyMode::Off, Deadlines::default()).await;
    let Accepted { head, early, .. } = match accepted {
        Ok(a) => a,
        Err(e) => {
            if let Some(status) = e.status() {
                metrics.responded(status.code);
                netio::ingress::refuse(&mut stream, Some(status)).await;
                log(
                    peer,
                    started,
                    &Outcome::refused(status, "-".into(), chain(&e)),
                );
            } else {
                debug!(%peer, error = %chain(&e), "closed before a CONNECT head");
            }
            return;
        }
    };
    let target = head.authority.to_string();
    let Ok(_permit) = Arc::clone(&shared.permits).try_acquire_owned() else {
        let status = Status::SERVICE_UNAVAILABLE;
        metrics.responded(status.code);
        netio::ingress::refuse(&mut stream, Some(status)).await;
        let why = format!("{MAX_TUNNELS} tunnels open (limit)");
        log(peer, started, &Outcome::refused(status, target, why));
        return;
    };
    let outcome = match through_a_vm(shared, &head.authority).await {
        Err(mut refused) => {
            netio::ingress::refuse(&mut stream, Some(refused.status)).await;
            refused.target = target;
            refused
        }
        Ok((cloud, vm)) => relay(shared, stream, cloud, early, target, vm).await,
    };
    metrics.responded(outcome.status.code);
    metrics.relayed(outcome.to_cloud, outcome.to_seed);
    log(peer, started, &outcome);
}

/// Why `client` may not use the endpoint, if it may not.
fn client_refused(config: &CloudApiConfig, client: IpAddr) -> Option<String> {
    if let Some(net) = config.tunnel_networks.iter().find(|n| n.contains(&client)) {
        return Some(format!("client {client} is inside the VPN network {net}"));
    }
    if !config.clients.iter().any(|n| n.contains(&client)) {
        return Some(format!("client {client} is not in --cloud-api-clients"));
    }
    None
}

/// The CONNECT through the first VM whose proxy answers; its 200 leaves the tunnel open.
async fn through_a_vm(
    shared: &Shared,
    authority: &Authority,
) -> Result<(netio::http_connect::ProxiedStream, (String, SocketAddr)), Outcome> {
    let port = shared.config.cloud_port;
    let mut vms: Vec<(String, SocketAddr)> = shared
        .routes
        .tunnels()
        .into_iter()
        .flat_map(|t| {
            let cn = t.common_name;
            let v4 = t.v4.map(IpAddr::V4);
            let v6 = t.v6.map(IpAddr::V6);
            // One address per VM: IPv4 if it has one.
            v4.or(v6).map(|ip| (cn, SocketAddr::new(ip, port)))
        })
        .collect();
    if vms.is_empty() {
        return Err(Outcome::refused(
            Status::SERVICE_UNAVAILABLE,
            String::new(),
            "no cloud VM tunnel is up",
        ));
    }
    let start = shared.next.fetch_add(1, Ordering::Relaxed) % vms.len();
    vms.rotate_left(start);
    let suspect = |addr: &SocketAddr| {
        let mut s = shared
            .suspects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.retain(|_, since| since.elapsed() < SUSPECT_FOR);
        s.contains_key(addr)
    };
    // Stable: the rotation stays among the VMs that did not fail lately.
    vms.sort_by_key(|(_, addr)| suspect(addr));
    let mark = |addr: SocketAddr, failed: bool| {
        let mut s = shared
            .suspects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failed {
            s.insert(addr, Instant::now());
        } else {
            s.remove(&addr);
        }
    };
    let host = match &authority.host {
        Host::Name(n) => n.clone(),
        Host::Ipv4(a) => a.to_string(),
        Host::Ipv6(a) => format!("[{a}]"),
    };
    let request = ConnectRequest::new(host, authority.port);
    let mut failures = Vec::new();
    for (cn, addr) in vms {
        // The TCP connect has its own short bound: a VM that is gone is skipped after
        // TCP_TIMEOUT, not after the whole exchange's.
        let tcp = match tokio::time::timeout(TCP_TIMEOUT, netio::tcp::connect_nodelay(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                shared.metrics.vm_failed.fetch_add(1, Ordering::Relaxed);
                mark(addr, true);
                debug!(vm = %cn, %addr, error = %e, "cloud VM unreachable; trying the next");
                failures.push(format!("{cn} {addr}: {e}"));
                continue;
            }
            Err(_) => {
                shared.metrics.vm_failed.fetch_add(1, Ordering::Relaxed);
                mark(addr, true);
                debug!(vm = %cn, %addr, "cloud VM silent; trying the next");
                failures.push(format!(
                    "{cn} {addr}: no TCP connection within {TCP_TIMEOUT:?}"
                ));
                continue;
            }
        };
        match connect_over(tcp, &request, TRY_TIMEOUT).await {
            Ok(t) => {
                mark(addr, false);
                return Ok((t, (cn, addr)));
            }
            Err(ConnectError::Status { code, reason }) => {
                mark(addr, false);
                let mut o = Outcome::refused(
                    status_of(code),
                    String::new(),
                    format!("the VM's proxy answered {code} {reason}"),
                );
                o.vm = Some((cn, addr));
                return Err(o);
            }
            Err(e) => {
                shared.metrics.vm_failed.fetch_add(1, Ordering::Relaxed);
                mark(addr, true);
                debug!(vm = %cn, %addr, error = %chain(&e), "cloud VM failed; trying the next");
                failures.push(format!("{cn} {addr}: {}", chain(&e)));
            }
        }
    }
    Err(Outcome::refused(
        Status::BAD_GATEWAY,
        String::new(),
        format!("no cloud VM answered: {}", failures.join("; ")),
    ))
}

/// The status to pass on for a VM proxy's `code` (one of ours; another becomes 502).
fn status_of(code: u16) -> Status {
    [
        Status::BAD_REQUEST,
        Status::FORBIDDEN,
        Status::METHOD_NOT_ALLOWED,
        Status::REQUEST_TIMEOUT,
        Status::URI_TOO_LONG,
        Status::HEADERS_TOO_LARGE,
        Status::BAD_GATEWAY,
        Status::SERVICE_UNAVAILABLE,
        Status::GATEWAY_TIMEOUT,
    ]
    .into_iter()
    .find(|s| s.code == code)
    .unwrap_or(Status::BAD_GATEWAY)
}

/// Answers 200 with what the VM sent after its own 200, forwards the early bytes, relays.
async fn relay(
    shared: &Shared,
    mut seed: TcpStream,
    cloud: netio::http_connect::ProxiedStream,
    early: Vec<u8>,
    target: String,
    vm: (String, SocketAddr),
) -> Outcome {
    let mut outcome = Outcome::refused(Status::ESTABLISHED, target, "");
    outcome.vm = Some(vm);
    let netio::http_connect::ProxiedStream {
        stream: mut cloud,
        leftover,
        ..
    } = cloud;
    let _active = shared.metrics.opened();
    let mut ok = Vec::with_capacity(48);
    Status::ESTABLISHED.encode(&mut ok);
    let start: std::io::Result<()> = async {
        seed.write_all(&ok).await?;
        seed.write_all(&leftover).await?;
        cloud.write_all(&early).await
    }
    .await;
    if let Err(e) = start {
        outcome.detail = format!("before the relay: {e}");
        return outcome;
    }
    let config = RelayConfig {
        idle_timeout: shared.config.idle_timeout,
        ..RelayConfig::default()
    };
    match relay_tcp(&mut seed, &mut cloud, config).await {
        Ok(stats) => {
            outcome.to_cloud = stats.a_to_b + early.len() as u64;
            outcome.to_seed = stats.b_to_a + leftover.len() as u64;
        }
        Err(e) => {
            outcome.to_cloud = e.a_to_b + early.len() as u64;
            outcome.to_seed = e.b_to_a + leftover.len() as u64;
            outcome.detail = format!("relay ended: {}", e.source);
        }
    }
    outcome
}

/// The CONNECT's one log line.
fn log(peer: SocketAddr, started: Instant, o: &Outcome) {
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let (vm, vm_addr) = match &o.vm {
        Some((cn, a)) => (cn.as_str(), a.to_string()),
        None => ("-", "-".to_owned()),
    };
    info!(
        target: "vpn_server::cloud_api::access",
        %peer,
        target_addr = %o.target,
        vm,
        vm_addr = %vm_addr,
        status = o.status.code,
        bytes_to_cloud = o.to_cloud,
        bytes_to_seed = o.to_seed,
        duration_ms,
        detail = %o.detail,
        "CONNECT"
    );
}

/// The status codes the endpoint answers with.
const CODES: [u16; 10] = [200, 400, 403, 405, 408, 414, 431, 502, 503, 504];

/// The endpoint's counters (catalogue: `docs/metrics.md`, "GEP-21 seed endpoint").
#[derive(Debug, Default)]
pub struct EndpointMetrics {
    by_code: [AtomicU64; CODES.len()],
    client_denied: AtomicU64,
    vm_failed: AtomicU64,
    to_cloud: AtomicU64,
    to_seed: AtomicU64,
    active: AtomicU64,
    serving: AtomicBool,
}

impl EndpointMetrics {
    fn responded(&self, code: u16) {
        if let Some(i) = CODES.iter().position(|&c| c == code) {
            self.by_code[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn relayed(&self, to_cloud: u64, to_seed: u64) {
        self.to_cloud.fetch_add(to_cloud, Ordering::Relaxed);
        self.to_seed.fetch_add(to_seed, Ordering::Relaxed);
    }

    fn opened(&self) -> ActiveTunnel<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveTunnel(self)
    }
}

struct ActiveTunnel<'a>(&'a EndpointMetrics);

impl Drop for ActiveTunnel<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AdminState for EndpointMetrics {
    fn metrics(&self, out: &mut Exposition) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let name = "vpn_cloud_api_endpoint_requests_total";
        out.family(name, Kind::Counter, "CONNECTs answered, by status code.");
        for (code, n) in CODES.iter().zip(&self.by_code) {
            out.sample(name, &[("code", &code.to_string())], get(n));
        }
        out.single(
            "vpn_cloud_api_endpoint_clients_denied_total",
            Kind::Counter,
            "Connections refused for their address (outside the client networks, or from the VPN).",
            get(&self.client_denied),
        )
        .single(
            "vpn_cloud_api_endpoint_vm_failures_total",
            Kind::Counter,
            "Tries of a VM's proxy that failed before another VM was tried.",
            get(&self.vm_failed),
        );
        let name = "vpn_cloud_api_endpoint_tunnel_bytes_total";
        out.family(
            name,
            Kind::Counter,
            "Bytes relayed, counted when a tunnel ends.",
        );
        out.sample(name, &[("direction", "to_cloud")], get(&self.to_cloud));
        out.sample(name, &[("direction", "to_seed")], get(&self.to_seed));
        out.single(
            "vpn_cloud_api_endpoint_tunnels_active",
            Kind::Gauge,
            "Tunnels open now.",
            get(&self.active),
        );
    }

    fn ready(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn config() -> CloudApiConfig {
        CloudApiArgs {
            cloud_api_listen: vec!["10.0.0.1:3128".parse().unwrap()],
            cloud_api_clients: vec![net("10.0.0.0/16"), net("fd10::/64")],
            cloud_api_port: DEFAULT_CLOUD_PORT,
        }
        .resolve(vec![net("10.0.200.0/24")])
        .unwrap()
        .unwrap()
    }

    #[test]
    fn clients_inside_the_vpn_or_outside_the_list_are_refused() {
        let c = config();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(client_refused(&c, ip("10.0.0.2")), None);
        assert_eq!(client_refused(&c, ip("fd10::2")), None);
        let vpn = client_refused(&c, ip("10.0.200.2")).unwrap();
        assert!(
            vpn.contains("inside the VPN network 10.0.200.0/24"),
            "{vpn}"
        );
        let out = client_refused(&c, ip("10.1.0.2")).unwrap();
        assert!(out.contains("not in --cloud-api-clients"), "{out}");
    }

    #[test]
    fn ipv4_mapped_clients_are_the_ipv4_networks_they_carry() {
        let c = CloudApiArgs {
            cloud_api_listen: vec!["10.0.0.1:3128".parse().unwrap()],
            cloud_api_clients: vec![net("::ffff:10.0.0.0/112")],
            cloud_api_port: DEFAULT_CLOUD_PORT,
        }
        .resolve(Vec::new())
        .unwrap()
        .unwrap();
        assert_eq!(c.clients, [net("10.0.0.0/16")]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(client_refused(&c, ip("10.0.3.4")), None);
        assert!(client_refused(&c, ip("10.1.0.2")).is_some());
    }

    #[test]
    fn listen_and_clients_go_together() {
        let mut args = CloudApiArgs {
            cloud_api_listen: Vec::new(),
            cloud_api_clients: Vec::new(),
            cloud_api_port: DEFAULT_CLOUD_PORT,
        };
        assert!(args.resolve(Vec::new()).unwrap().is_none());
        args.cloud_api_clients.push(net("10.0.0.0/16"));
        assert!(matches!(
            args.resolve(Vec::new()),
            Err(CloudApiArgsError::Incomplete)
        ));
    }

    #[test]
    fn a_vms_answer_is_passed_on_as_one_of_ours() {
        assert_eq!(status_of(403), Status::FORBIDDEN);
        assert_eq!(status_of(504), Status::GATEWAY_TIMEOUT);
        assert_eq!(status_of(418), Status::BAD_GATEWAY);
        assert_eq!(status_of(200), Status::BAD_GATEWAY);
    }

    #[test]
    fn the_endpoint_table_guards_input_and_forwarding_from_the_tunnel() {
        let t = endpoint_table(None, "tun7");
        let text = format!("{t:?}");
        for hook in ["Input", "Forward"] {
            assert!(text.contains(hook), "{text}");
        }
        assert!(text.contains("tun7"), "{text}");
        // vpn2's table (environment mode) keeps its chains and gains the forward guard.
        let env = crate::vpn2::seed_table("tun0", Some(net("100.96.0.0/11")), None);
        let text = format!("{:?}", endpoint_table(Some(env), "tun0"));
        assert!(
            text.contains("Prerouting") && text.contains("Forward"),
            "{text}"
        );
    }
}
