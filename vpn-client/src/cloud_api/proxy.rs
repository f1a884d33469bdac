//! The API proxy of one connection: an HTTP CONNECT proxy on `[::]:PORT` bound to the tunnel
//! device (`SO_BINDTODEVICE`), so it takes only connections that came through this tunnel
//! (from the seed endpoint), never from the VM's other networks or its loopback.
//!
//! ```text
//! accept on the tunnel device ─► CONNECT head (strict, netio::ingress) ─► 400/405/408/...
//!   literal address: an address entry covers it, not special, not the VM's ─► else 403
//!   name: a name entry matches (else 403, no lookup) ─► the VM's resolver (getaddrinfo)
//!         ─► every address allowed, not special, not the VM's ─► else 403
//!   connect (addresses in order, CONNECT_TIMEOUT) ─► 502 / 504
//!   200, relay (splice) until both sides close or IDLE_TIMEOUT
//! ```
//!
//! One `info` line per CONNECT when it ends: the connection, the peer (the endpoint's tunnel
//! address), the target, the address connected to, the status, the bytes each way, the time
//! and why it was refused.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netio::ingress::{accept_connect, Accepted, Deadlines, ProxyMode};
use netio::relay::{relay_tcp, RelayConfig};
use netio::report::chain;
use protocol::http::connect::{Authority, Host, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

use super::allow::{special, AllowList};
use super::metrics::{ConnectionCounters, Denied};

/// Bound on the name lookup and on the connect to the API (all its addresses together).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// No bytes either way for this long closes a tunnel.
pub const IDLE_TIMEOUT: Duration = netio::relay::DEFAULT_IDLE_TIMEOUT;
/// Tunnels open at once; more are answered 503.
pub const MAX_TUNNELS: usize = 1024;

/// How often the proxy tries to bind while its device does not exist. The client makes the
/// device when the endpoint's push arrives, and the endpoint may try this VM as soon as the
/// tunnel is up, so the wait is kept short (it answers 502 for a VM whose proxy refuses).
pub const BIND_RETRY: Duration = Duration::from_millis(20);

/// What one connection's proxy needs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The connection's name (logs, metrics).
    pub name: String,
    /// The tunnel device.
    pub device: String,
    /// The port on the device.
    pub port: u16,
    /// What may be reached.
    pub allow: AllowList,
}

/// Binds the proxy on the tunnel device, waiting for the device to exist (the client makes it
/// when the first push arrives); `None` once `shutdown` is cancelled.
pub async fn bind(config: &ProxyConfig, shutdown: &CancellationToken) -> Option<TcpListener> {
    let mut logged = false;
    loop {
        match netio::listen::bind_on_device(config.port, &config.device) {
            Ok(l) => {
                info!(device = %config.device, port = config.port, "cloud API proxy listening on the tunnel");
                return Some(l);
            }
            // Mostly ENODEV until the client has made the device.
            Err(e) if !logged => {
                debug!(device = %config.device, error = %e, "cannot bind the cloud API proxy yet; retrying");
                logged = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(BIND_RETRY) => {}
        }
    }
}

/// Serves `listener` until `stop` is cancelled; then ends every tunnel and returns.
pub async fn serve(
    config: Arc<ProxyConfig>,
    counters: Arc<ConnectionCounters>,
    listener: TcpListener,
    stop: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_TUNNELS));
    while let Some((stream, peer)) = netio::listen::accept(&listener, &stop).await {
        let _ = stream.set_nodelay(true);
        let config = Arc::clone(&config);
        let counters = Arc::clone(&counters);
        let stop = stop.clone();
        let permits = Arc::clone(&permits);
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = one(&config, &counters, stream, peer, &permits) => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// What a CONNECT came to, for its log line.
struct Outcome {
    status: Status,
    target: String,
    upstream: Option<SocketAddr>,
    to_target: u64,
    to_seed: u64,
    detail: String,
}

async fn one(
    config: &ProxyConfig,
    counters: &Arc<ConnectionCounters>,
    mut stream: TcpStream,
    peer: SocketAddr,
    permits: &Arc<tokio::sync::Semaphore>,
) {
    let started = Instant::now();
    let accepted = accept_connect(&mut stream, peer, &ProxyMode::Off, Deadlines::default()).await;
    let Accepted { head, early, .. } = match accepted {
        Ok(a) => a,
        Err(e) => {
            if let Some(status) = e.status() {
                counters.responded(status.code);
                netio::ingress::refuse(&mut stream, Some(status)).await;
                log(
                    config,
                    peer,
                    started,
                    &refused(status, "-".into(), chain(&e)),
                );
            } else {
                debug!(%peer, error = %chain(&e), "closed before a CONNECT head");
            }
            return;
        }
    };
    let target = head.authority.to_string();
    let outcome = match open(config, counters, &head.authority, permits).await {
        Err((status, detail)) => {
            netio::ingress::refuse(&mut stream, Some(status)).await;
            refused(status, target, detail)
        }
        Ok((upstream, permit)) => {
            let o = relay(counters, stream, upstream, early, target).await;
            drop(permit);
            o
        }
    };
    counters.responded(outcome.status.code);
    counters.relayed(outcome.to_target, outcome.to_seed);
    log(config, peer, started, &outcome);
}

fn refused(status: Status, target: String, detail: String) -> Outcome {
    Outcome {
        status,
        target,
        upstream: None,
        to_target: 0,
        to_seed: 0,
        detail,
    }
}

type Refusal = (Status, String);

/// The checks of the module docs, then the connect; nothing is dialed unless every check
/// passed.
async fn open(
    config: &ProxyConfig,
    counters: &ConnectionCounters,
    authority: &Authority,
    permits: &Arc<tokio::sync::Semaphore>,
) -> Result<(TcpStream, tokio::sync::OwnedSemaphorePermit), Refusal> {
    let port = authority.port;
    let deny = |why: Denied, detail: String| {
        counters.denied(why);
        (Status::FORBIDDEN, detail)
    };
    let addrs: Vec<IpAddr> = match &authority.host {
        Host::Ipv4(a) => vec![IpAddr::V4(*a)],
        Host::Ipv6(a) => vec![IpAddr::V6(*a)],
        Host::Name(name) => {
            if !config.allow.name_allowed(name, port) {
                return Err(deny(Denied::Name, "name not on the allow-list".into()));
            }
            let lookup = tokio::net::lookup_host((name.as_str(), port));
            match tokio::time::timeout(CONNECT_TIMEOUT, lookup).await {
                Err(_) => {
                    return Err((
                        Status::GATEWAY_TIMEOUT,
                        format!("name lookup timed out after {CONNECT_TIMEOUT:?}"),
                    ))
                }
                Ok(Err(e)) => return Err((Status::BAD_GATEWAY, format!("name lookup: {e}"))),
                Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
            }
        }
    };
    if addrs.is_empty() {
        return Err((Status::BAD_GATEWAY, "the name has no address".into()));
    }
    let named = matches!(authority.host, Host::Name(_));
    for &ip in &addrs {
        if let Some(kind) = special(ip) {
            return Err(deny(Denied::Special, format!("{ip} is a {kind} address")));
        }
        if !config.allow.address_allowed(ip, port) {
            return Err(if named {
                deny(
                    Denied::Resolved,
                    format!("resolved to {ip}, outside the allow-list"),
                )
            } else {
                deny(Denied::Address, "address not on the allow-list".into())
            });
        }
        if is_local(ip) {
            return Err(deny(
                Denied::Local,
                format!("{ip} is an address of this VM"),
            ));
        }
    }
    let Ok(permit) = Arc::clone(permits).try_acquire_owned() else {
        return Err((
            Status::SERVICE_UNAVAILABLE,
            format!("{MAX_TUNNELS} tunnels open (limit)"),
        ));
    };
    let candidates = addrs.into_iter().map(|ip| SocketAddr::new(ip, port));
    match tokio::time::timeout(CONNECT_TIMEOUT, netio::tcp::connect_first(candidates)).await {
        Ok(Ok(s)) => Ok((s, permit)),
        Ok(Err(e)) => Err((Status::BAD_GATEWAY, format!("connect failed: {e}"))),
        Err(_) => Err((
            Status::GATEWAY_TIMEOUT,
            format!("connect timed out after {CONNECT_TIMEOUT:?}"),
        )),
    }
}

/// Whether `ip` is an address of this VM (of its network namespace): binding to it succeeds
/// only then.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip.to_canonical(), 0)).is_ok()
}

/// Answers 200, forwards the bytes that came with the head, relays to the end.
async fn relay(
    counters: &Arc<ConnectionCounters>,
    mut seed: TcpStream,
    mut upstream: TcpStream,
    early: Vec<u8>,
    target: String,
) -> Outcome {
    let _active = counters.opened();
    let mut outcome = Outcome {
        status: Status::ESTABLISHED,
        target,
        upstream: upstream.peer_addr().ok(),
        to_target: 0,
        to_seed: 0,
        detail: String::new(),
    };
    let mut ok = Vec::with_capacity(48);
    Status::ESTABLISHED.encode(&mut ok);
    let start: io::Result<()> = async {
        seed.write_all(&ok).await?;
        upstream.write_all(&early).await
    }
    .await;
    if let Err(e) = start {
        outcome.detail = format!("before the relay: {e}");
        return outcome;
    }
    let relay_config = RelayConfig {
        idle_timeout: IDLE_TIMEOUT,
        ..RelayConfig::default()
    };
    match relay_tcp(&mut seed, &mut upstream, relay_config).await {
        Ok(stats) => {
            outcome.to_target = stats.a_to_b + early.len() as u64;
            outcome.to_seed = stats.b_to_a;
        }
        Err(e) => {
            outcome.to_target = e.a_to_b + early.len() as u64;
            outcome.to_seed = e.b_to_a;
            outcome.detail = format!("relay ended: {}", e.source);
        }
    }
    outcome
}

/// The CONNECT's one log line.
fn log(config: &ProxyConfig, peer: SocketAddr, started: Instant, o: &Outcome) {
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let upstream = o.upstream.map_or_else(|| "-".to_owned(), |a| a.to_string());
    info!(
        target: "vpn_client::cloud_api::access",
        connection = %config.name,
        %peer,
        target_addr = %o.target,
        upstream = %upstream,
        status = o.status.code,
        bytes_to_target = o.to_target,
        bytes_to_seed = o.to_seed,
        duration_ms,
        detail = %o.detail,
        "CONNECT"
    );
}
