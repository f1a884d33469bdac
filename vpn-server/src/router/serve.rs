//! The router's runtime: listeners, one task per connection, the policy swap on SIGHUP.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use netio::ingress::{accept_connect, refuse, Accepted, Deadlines, IngressError};
use protocol::http::connect::Status;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::config::{ConfigError, ListenerConfig, RouterConfig};
use super::policy::{Policy, Refusal};

/// `vpn-server router`: the ingress router.
#[derive(Debug, clap::Args)]
pub struct RouterArgs {
    /// The router's TOML config file (see the `router` module docs).
    #[arg(long, env = "VPN_ROUTER_CONFIG")]
    pub config: PathBuf,
    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "VPN_ROUTER_LOG", default_value = "info")]
    pub log: String,
}

/// Runs the subcommand: loads the config, binds, serves until SIGTERM or SIGINT, reloads
/// the policy on SIGHUP.
pub fn main(args: RouterArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_writer(std::io::stderr)
        .init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RouterError::Io)
        .and_then(|rt| {
            rt.block_on(async {
                let router = Router::bind(&args.config).await?;
                let token = CancellationToken::new();
                let cancel = token.clone();
                tokio::spawn(async move {
                    if let Err(e) = crate::server::cancel_on_signals(cancel.clone()).await {
                        warn!("cannot wait for signals: {e}");
                        cancel.cancel();
                    }
                });
                router.run_with_sighup(token).await
            })
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                msg.push_str(": ");
                msg.push_str(&cause.to_string());
                source = cause.source();
            }
            eprintln!("vpn-server router: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Relays bytes both ways until both directions are closed, passing a half-close on.
/// Returns (client → upstream, upstream → client) byte counts.
pub async fn relay<A, B>(client: &mut A, upstream: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    tokio::io::copy_bidirectional(client, upstream).await
}

/// A bound router: its listeners and the current policy.
#[derive(Debug)]
pub struct Router {
    listeners: Vec<(TcpListener, Arc<ListenerConfig>)>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    path: Option<PathBuf>,
    config: RouterConfig,
    policy: RwLock<Arc<Policy>>,
    counters: Arc<Counters>,
}

/// What the router has done so far (for tests, the demo and, later, metrics).
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests answered 200 (tunnels opened).
    pub tunnels: AtomicU64,
    /// Requests answered with a refusal (4xx / 5xx).
    pub refused: AtomicU64,
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
        let policy = RwLock::new(Arc::new(config.policy.clone()));
        Ok(Self {
            listeners,
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
                        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
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
            || new.max_connections != self.shared.config.max_connections
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
            if status.is_some() {
                shared.counters.refused.fetch_add(1, Ordering::Relaxed);
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
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
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
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            refuse(&mut stream, Some(Status::SERVICE_UNAVAILABLE)).await;
            return;
        }
        Err(_) => {
            info!(%peer, %client, %route, upstream = %upstream_name, status = 504, "upstream connect timed out");
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            refuse(&mut stream, Some(Status::GATEWAY_TIMEOUT)).await;
            return;
        }
    };
    let mut ok = Vec::new();
    Status::ESTABLISHED.encode(&mut ok);
    if stream.write_all(&ok).await.is_err() || upstream.write_all(&early).await.is_err() {
        return;
    }
    shared.counters.tunnels.fetch_add(1, Ordering::Relaxed);
    debug!(%peer, %client, %route, upstream = %upstream_name, "tunnel open");
    match netio::relay::relay_tcp(
        &mut stream,
        &mut upstream,
        netio::relay::RelayConfig {
            buffer_size: shared.config.relay_buffer_size,
            ..netio::relay::RelayConfig::default()
        },
    )
    .await
    {
        Ok(netio::relay::RelayStats {
            a_to_b: up,
            b_to_a: down,
            ..
        }) => {
            debug!(%peer, %route, to_upstream = up + early.len() as u64, to_client = down, "tunnel closed")
        }
        Err(e) => debug!(%peer, %route, "tunnel ended: {e}"),
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
    let mut last = io::Error::from(io::ErrorKind::AddrNotAvailable);
    for addr in tokio::net::lookup_host(upstream).await? {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
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
