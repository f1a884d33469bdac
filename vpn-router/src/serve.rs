//! The router's runtime: listeners, one task per connection, the policy swap on SIGHUP.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use netio::ingress::{accept_connect, refuse, Accepted, Deadlines, IngressError};
use netio::relay::{RelayConfig, RelayError, RelayStats};
use netio::report::chain;
use netio::signals::cancel_on_signals;
use netio::tcp::connect_first;
use protocol::http::connect::Status;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::config::{ConfigError, ListenerConfig, RouterConfig};
use crate::metrics::Counters;
use crate::policy::{Policy, Refusal};

/// The command line of `vpn-router`, the ingress router.
#[derive(Debug, clap::Args)]
pub struct RouterArgs {
    /// The router's TOML config file (see the crate docs).
    #[arg(long, env = "VPN_ROUTER_CONFIG")]
    pub config: PathBuf,
    /// Log filter (`LEVEL` and `target=LEVEL` directives, e.g. `info,vpn_router=debug`).
    #[arg(long, env = "VPN_ROUTER_LOG", default_value = "info")]
    pub log: String,
}

/// Runs `vpn-router`: loads the config, binds, serves until SIGTERM or SIGINT, reloads
/// the policy on SIGHUP.
pub fn main(args: RouterArgs) -> ExitCode {
    if let Err(e) = netio::logging::init(&args.log) {
        eprintln!("vpn-router: error: --log {:?}: {e}", args.log);
        return ExitCode::FAILURE;
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RouterError::Io)
        .and_then(|rt| {
            rt.block_on(async {
                let router = Router::bind(&args.config).await?;
                let token = CancellationToken::new();
                tokio::spawn(cancel_on_signals(token.clone()).map_err(RouterError::Io)?);
                router.run_with_sighup(token).await
            })
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpn-router: error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Relays an open tunnel until both directions have ended (a half-close passed on each way)
/// or nothing moved for the idle timeout, with zero-copy `splice(2)` (`relay_tcp`). The router's
/// only call into the byte relay.
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    config: &RouterConfig,
) -> Result<RelayStats, RelayError> {
    let relay = RelayConfig {
        idle_timeout: config.idle_timeout,
        buffer_size: config.relay_buffer_size,
    };
    netio::relay::relay_tcp(client, upstream, relay).await
}

/// A bound router: its listeners and the current policy.
#[derive(Debug)]
pub struct Router {
    listeners: Vec<(TcpListener, Arc<ListenerConfig>)>,
    metrics: Option<TcpListener>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    path: Option<PathBuf>,
    config: RouterConfig,
    policy: RwLock<Arc<Policy>>,
    counters: Arc<Counters>,
}

impl Router {
    /// Loads `path` and binds every listener. Must run inside a tokio runtime.
    pub async fn bind(path: &Path) -> Result<Self, RouterError> {
        let config = RouterConfig::load(path)?;
        Self::bind_config(config, Some(path.to_owned())).await
    }

    /// Binds the listeners of `config`; `path` is what [`Reloader::reload`] re-reads.
    pub async fn bind_config(
        config: RouterConfig,
        path: Option<PathBuf>,
    ) -> Result<Self, RouterError> {
        let mut listeners = Vec::new();
        for l in &config.listeners {
            let listener =
                TcpListener::bind(l.address)
                    .await
                    .map_err(|source| RouterError::Bind {
                        address: l.address,
                        source,
                    })?;
            info!(address = %l.address, headers = ?l.headers, proxy = ?l.proxy, "router listening");
            listeners.push((listener, Arc::new(l.clone())));
        }
        let metrics = match config.metrics_listen {
            None => None,
            Some(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|source| RouterError::Bind { address, source })?,
            ),
        };
        let policy = RwLock::new(Arc::new(config.policy.clone()));
        Ok(Self {
            listeners,
            metrics,
            shared: Arc::new(Shared {
                path,
                config,
                policy,
                counters: Arc::default(),
            }),
        })
    }

    /// The bound addresses, in config order (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|(l, _)| l.local_addr().ok())
            .collect()
    }

    /// The bound `GET /metrics` address, if the config has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The router's counters (shared; they keep counting while it runs).
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.shared.counters)
    }

    /// A handle that reloads this router's policy from its file (what SIGHUP does).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until `shutdown`, reloading the policy on every SIGHUP.
    pub async fn run_with_sighup(self, shutdown: CancellationToken) -> Result<(), RouterError> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).map_err(RouterError::Io)?;
        let reloader = self.reloader();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    got = hup.recv() => {
                        if got.is_none() {
                            return;
                        }
                        info!("SIGHUP received, reloading the router policy");
                        let _ = reloader.reload();
                    }
                }
            }
        });
        self.run(shutdown).await;
        Ok(())
    }

    /// Serves until `shutdown`; open tunnels are cut then.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let slots = Arc::new(Semaphore::new(self.shared.config.max_connections));
        if let Some(listener) = self.metrics {
            let counters = Arc::clone(&self.shared.counters);
            tracker.spawn(vpn_server::sidecar::metrics::serve_metrics(
                listener,
                move || counters.render(),
                shutdown.clone(),
            ));
        }
        for (listener, config) in self.listeners {
            let slots = Arc::clone(&slots);
            let shared = Arc::clone(&self.shared);
            let shutdown = shutdown.clone();
            let conns = tracker.clone();
            tracker.spawn(async move {
                loop {
                    let accepted = tokio::select! {
                        () = shutdown.cancelled() => return,
                        a = listener.accept() => a,
                    };
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        shared.counters.responded(Status::SERVICE_UNAVAILABLE);
                        warn!(%peer, "connection limit reached, answering 503");
                        conns.spawn(over_limit(stream));
                        continue;
                    };
                    let shared = Arc::clone(&shared);
                    let config = Arc::clone(&config);
                    let shutdown = shutdown.clone();
                    conns.spawn(async move {
                        let _slot = slot;
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            () = handle(stream, peer, &config, &shared) => {}
                        }
                    });
                }
            });
        }
        tracker.close();
        tracker.wait().await;
    }
}

/// Answers a connection over the limit with 503 and closes it, without reading it.
async fn over_limit(mut stream: TcpStream) {
    let mut out = Vec::new();
    Status::SERVICE_UNAVAILABLE.encode(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
}

/// Reloads a router's policy from its config file.
#[derive(Debug, Clone)]
pub struct Reloader {
    shared: Arc<Shared>,
}

impl Reloader {
    /// Re-reads the file and swaps the policy in one step; on error the old policy stays and
    /// the error is logged and returned.
    pub fn reload(&self) -> Result<(), RouterError> {
        let Some(path) = &self.shared.path else {
            return Err(RouterError::NoFile);
        };
        let new = match RouterConfig::load(path) {
            Ok(new) => new,
            Err(e) => {
                warn!(path = %path.display(), "router policy reload failed, keeping the old policy: {e}");
                return Err(e.into());
            }
        };
        if new.listeners != self.shared.config.listeners
            || new.deadlines != self.shared.config.deadlines
            || new.connect_timeout != self.shared.config.connect_timeout
            || new.idle_timeout != self.shared.config.idle_timeout
            || new.max_connections != self.shared.config.max_connections
            || new.metrics_listen != self.shared.config.metrics_listen
            || new.relay_buffer_size != self.shared.config.relay_buffer_size
        {
            warn!("router listeners or timeouts changed in the file; they apply after a restart");
        }
        let routes = new.policy.routes.len();
        let fresh = Arc::new(new.policy);
        match self.shared.policy.write() {
            Ok(mut guard) => *guard = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        info!(routes, "router policy reloaded");
        Ok(())
    }
}

impl Shared {
    fn snapshot(&self) -> Arc<Policy> {
        match self.policy.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

/// Serves one connection to the end; logs one line for a refusal.
async fn handle(
    mut stream: TcpStream,
    peer: SocketAddr,
    listener: &ListenerConfig,
    shared: &Shared,
) {
    let _ = stream.set_nodelay(true);
    let deadlines: Deadlines = shared.config.deadlines;
    let accepted = match accept_connect(&mut stream, peer, &listener.proxy, deadlines).await {
        Ok(a) => a,
        Err(e) => {
            let status = e.status();
            match &e {
                IngressError::Closed { .. } | IngressError::Io { .. } => {
                    debug!(%peer, "connection ended before a request: {e}")
                }
                _ => {
                    info!(%peer, listener = %listener.address, status = status.map(|s| s.code), "refused: {}", chain(&e))
                }
            }
            if let Some(status) = status {
                shared.counters.responded(status);
            }
            refuse(&mut stream, status).await;
            return;
        }
    };
    let Accepted {
        head,
        client,
        early,
        ..
    } = accepted;
    // One snapshot decides this request, whatever a reload does meanwhile.
    let policy = shared.snapshot();
    let decision = match policy.decide(&head, &listener.headers, client) {
        Ok(d) => d,
        Err(refusal) => {
            log_refusal(peer, client, listener, &refusal);
            shared.counters.responded(refusal.status());
            refuse(&mut stream, Some(refusal.status())).await;
            return;
        }
    };
    let route = decision.route.to_string();
    let upstream_name = decision.target.upstream.clone();
    drop(policy);
    let connect =
        tokio::time::timeout(shared.config.connect_timeout, connect(&upstream_name)).await;
    let mut upstream = match connect {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            info!(%peer, %client, %route, upstream = %upstream_name, status = 503, "upstream connect failed: {e}");
            shared.counters.responded(Status::SERVICE_UNAVAILABLE);
            refuse(&mut stream, Some(Status::SERVICE_UNAVAILABLE)).await;
            return;
        }
        Err(_) => {
            info!(%peer, %client, %route, upstream = %upstream_name, status = 504, "upstream connect timed out");
            shared.counters.responded(Status::GATEWAY_TIMEOUT);
            refuse(&mut stream, Some(Status::GATEWAY_TIMEOUT)).await;
            return;
        }
    };
    let mut ok = Vec::new();
    Status::ESTABLISHED.encode(&mut ok);
    if stream.write_all(&ok).await.is_err() || upstream.write_all(&early).await.is_err() {
        return;
    }
    shared.counters.responded(Status::ESTABLISHED);
    let _active = shared.counters.tunnel_opened();
    debug!(%peer, %client, %route, upstream = %upstream_name, "tunnel open");
    let early = early.len() as u64;
    match relay(&mut stream, &mut upstream, &shared.config).await {
        Ok(stats) => {
            shared.counters.relayed(stats.a_to_b + early, stats.b_to_a);
            debug!(%peer, %route, to_upstream = stats.a_to_b + early, to_client = stats.b_to_a, end = ?stats.end, "tunnel closed")
        }
        Err(e) => {
            shared.counters.relayed(e.a_to_b + early, e.b_to_a);
            debug!(%peer, %route, "tunnel ended: {e}")
        }
    }
}

fn log_refusal(peer: SocketAddr, client: IpAddr, listener: &ListenerConfig, refusal: &Refusal) {
    info!(
        %peer,
        %client,
        listener = %listener.address,
        status = refusal.status().code,
        "refused: {}",
        chain(refusal)
    );
}

async fn connect(upstream: &str) -> io::Result<TcpStream> {
    connect_first(tokio::net::lookup_host(upstream).await?).await
}

/// Why the router cannot start or reload.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The config file is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener cannot bind.
    #[error("cannot listen on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reload asked of a router built without a file.
    #[error("router has no config file to reload")]
    NoFile,
    /// Runtime or signal set-up failed.
    #[error("router runtime")]
    Io(#[source] io::Error),
}
