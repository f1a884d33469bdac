//! The router's runtime: listeners, admission, one task per connection (its listener's
//! handler, `crate::connect` or `crate::sni`, then the relay), the policy swap on SIGHUP and
//! the poll of a config directory.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use netio::admin::{AdminBindError, AdminServer, AdminState};
use netio::listen::{Admitted, PendingGuard};
use netio::report::chain;
use protocol::http::connect::Status;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::field::Empty;
use tracing::{info, info_span, warn, Instrument as _};

use crate::config::{ConfigError, ListenerConfig, ListenerKind, RouterConfig};
use crate::config_dir::{DirError, DirLoader};
use crate::conn::{carry, Open, Shared};
use crate::metrics::Counters;

/// A bound router: its listeners and the current policy.
#[derive(Debug)]
pub struct Router {
    listeners: Vec<(TcpListener, Arc<ListenerConfig>)>,
    admin: Option<AdminServer>,
    shared: Arc<Shared>,
    /// More parts of `/metrics` and `/readyz` (the Kubernetes source's).
    parts: Vec<Arc<dyn AdminState>>,
}

impl Router {
    /// Loads `path` and binds every listener. Must run inside a tokio runtime.
    pub async fn bind(path: &Path) -> Result<Self, RouterError> {
        let config = RouterConfig::load(path)?;
        let router = Self::bind_config(config, Some(path.to_owned())).await?;
        if let Some(name) = path.file_name() {
            let files = &router.shared.counters.files;
            files.set(&name.to_string_lossy(), true, false);
        }
        Ok(router)
    }

    /// Loads the directory `dir` (`--config-dir`, [`crate::config_dir`]) and binds every
    /// listener; [`Reloader::reload`] and the poll of [`Router::run_with_sighup`] read it
    /// again. Must run inside a tokio runtime.
    pub async fn bind_dir(dir: &Path) -> Result<Self, RouterError> {
        let counters = Arc::new(Counters::default());
        let (loader, config) = DirLoader::open(dir, &counters.files)?;
        Self::bind_with(config, None, Some(loader), counters).await
    }

    /// Binds the listeners of `config` and its `metrics_listen`; `path` is what
    /// [`Reloader::reload`] re-reads. Must run inside a tokio runtime.
    ///
    /// A `[::]` listener also takes IPv4 clients, as IPv4-mapped addresses, whatever
    /// `net.ipv6.bindv6only` says, unless an IPv4 address with its port is listed too
    /// (`netio::listen::bind_each`, as every listener of ours, the admin one included): one
    /// `[::]` listener serves both families, and the allow-lists match a mapped peer by its
    /// IPv4 address.
    pub async fn bind_config(
        config: RouterConfig,
        path: Option<PathBuf>,
    ) -> Result<Self, RouterError> {
        Self::bind_with(config, path, None, Arc::default()).await
    }

    async fn bind_with(
        config: RouterConfig,
        path: Option<PathBuf>,
        dir: Option<DirLoader>,
        counters: Arc<Counters>,
    ) -> Result<Self, RouterError> {
        let addresses: Vec<SocketAddr> = config.listeners.iter().map(|l| l.address).collect();
        let bound = netio::listen::bind_each(&addresses)
            .map_err(|(address, source)| RouterError::Bind { address, source })?;
        let mut listeners = Vec::new();
        for (listener, l) in bound.into_iter().zip(&config.listeners) {
            info!(address = %l.address, kind = ?l.kind, headers = ?l.headers, proxy = ?l.proxy, "router listening");
            listeners.push((listener, Arc::new(l.clone())));
        }
        let admin = match config.metrics_listen {
            None => None,
            Some(address) => Some(AdminServer::bind(&[address])?),
        };
        Ok(Self {
            listeners,
            admin,
            shared: Arc::new(Shared::new(config, path, dir, counters)),
            parts: Vec::new(),
        })
    }

    /// The bound addresses, in config order (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|(l, _)| l.local_addr().ok())
            .collect()
    }

    /// The bound admin address (`GET /metrics`, `/healthz`, `/readyz`), if the config has
    /// a `metrics_listen`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.admin
            .as_ref()
            .and_then(|a| a.local_addrs().first().copied())
    }

    /// The router's counters (shared; they keep counting while it runs).
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.shared.counters)
    }

    /// Adds `part` to the admin endpoint: its series in `/metrics`, and `/readyz` only
    /// while it is ready too.
    pub fn add_admin_part(&mut self, part: Arc<dyn AdminState>) {
        self.parts.push(part);
    }

    /// The policy of the config file the router was bound with.
    pub fn file_policy(&self) -> crate::Policy {
        self.shared.config.policy.clone()
    }

    /// A handle that reloads this router's policy from its file (what SIGHUP does).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until `shutdown`, reloading the policy on every SIGHUP (and, with
    /// `--config-dir`, whenever a poll finds the directory changed).
    pub async fn run_with_sighup(self, shutdown: CancellationToken) -> Result<(), RouterError> {
        let reloader = self.reloader();
        let hup = netio::signals::on_sighup(shutdown.clone(), move || {
            info!("SIGHUP received, reloading the router policy");
            let reloader = reloader.clone();
            async move {
                let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
            }
        })
        .map_err(RouterError::Signal)?;
        if self.shared.dir.is_some() {
            tokio::spawn(self.reloader().poll(shutdown.clone()));
        }
        tokio::spawn(hup);
        self.run(shutdown).await;
        Ok(())
    }

    /// Serves until `shutdown`; open tunnels are cut then. Ready (`/readyz`) from the start
    /// until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let slots = Arc::new(Semaphore::new(self.shared.config.max_connections));
        let counters = Arc::clone(&self.shared.counters);
        counters.set_serving(true);
        if let Some(admin) = self.admin {
            let part: Arc<dyn AdminState> = Arc::clone(&counters) as _;
            let mut parts = vec![part];
            parts.extend(self.parts);
            tracker.spawn(admin.serve(parts, shutdown.clone()));
        }
        for (listener, config) in self.listeners {
            let slots = Arc::clone(&slots);
            let shared = Arc::clone(&self.shared);
            let shutdown = shutdown.clone();
            let conns = tracker.clone();
            tracker.spawn(async move {
                while let Some((stream, peer)) = netio::listen::accept(&listener, &shutdown).await {
                    // Every line about this connection carries its peer and listener, and
                    // the client address and route once `handle` knows them.
                    let span = info_span!(
                        "router_conn",
                        %peer,
                        listener = %config.address,
                        client = Empty,
                        route = Empty,
                    );
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        if config.kind == ListenerKind::Sni {
                            // No answer a TLS client could read: closed.
                            crate::sni::over_limit(&shared, &span);
                            continue;
                        }
                        shared.counters.responded(Status::SERVICE_UNAVAILABLE);
                        span.in_scope(|| warn!("connection limit reached, answering 503"));
                        conns.spawn(crate::connect::over_limit(stream).instrument(span));
                        continue;
                    };
                    let Admitted { guard, evicted } = shared.pending.admit();
                    if evicted.is_some() {
                        let total = shared.counters.pending_evicted();
                        if let Some(unlogged) = shared.log(|l| &mut l.evicted) {
                            span.in_scope(|| {
                                info!(
                                    max_pending = shared.config.max_pending,
                                    evicted_total = total,
                                    unlogged,
                                    "pending connections full: the oldest was closed for a new one"
                                )
                            });
                        }
                    }
                    let shared = Arc::clone(&shared);
                    let config = Arc::clone(&config);
                    let shutdown = shutdown.clone();
                    let conn = async move {
                        let _slot = slot;
                        let serve = handle(stream, peer, &config, &shared, guard);
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            () = serve => {}
                        }
                    };
                    conns.spawn(conn.instrument(span));
                }
            });
        }
        shutdown.cancelled().await;
        counters.set_serving(false);
        tracker.close();
        tracker.wait().await;
    }
}

/// Reloads a router's policy from its config file.
#[derive(Debug, Clone)]
pub struct Reloader {
    shared: Arc<Shared>,
}

impl Reloader {
    /// Re-reads the file and swaps the policy in one step; on error the old policy stays and
    /// the error is logged and returned.
    ///
    /// With `--config-dir`, reads the directory and swaps in a new policy if any file
    /// changed (refused files keep their last good version, [`crate::config_dir`]); an
    /// unreadable directory is logged and returned, the policy stays.
    pub fn reload(&self) -> Result<(), RouterError> {
        if let Some(dir) = &self.shared.dir {
            return self.reload_dir(dir, true);
        }
        let Some(path) = &self.shared.path else {
            return Err(RouterError::NoFile);
        };
        let file = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let files = &self.shared.counters.files;
        let new = match RouterConfig::load(path) {
            Ok(new) => new,
            Err(e) => {
                warn!(path = %path.display(), "router policy reload failed, keeping the old policy: {}", chain(&e));
                files.set(&file, false, true);
                files.reloaded();
                return Err(e.into());
            }
        };
        files.set(&file, true, false);
        if self.shared.config.restart_needed(&new) {
            warn!("router listeners or timeouts changed in the file; they apply after a restart");
        }
        self.shared.install(new.policy);
        files.reloaded();
        Ok(())
    }

    /// Swaps `policy` in, in one step (a request being decided keeps its snapshot): what
    /// a source of routes other than the file calls (`crate::kubernetes`).
    pub fn install(&self, policy: crate::Policy) {
        self.shared.install(policy);
    }

    /// Reads the config directory (all of it if `force`d, else a volume only when its
    /// `..data` moved) and swaps in a new policy if a file changed.
    fn reload_dir(&self, dir: &Mutex<DirLoader>, force: bool) -> Result<(), RouterError> {
        let mut loader = dir.lock().unwrap_or_else(PoisonError::into_inner);
        let change = match loader.poll(&self.shared.counters.files, force) {
            Ok(Some(change)) => change,
            Ok(None) => return Ok(()),
            Err(e) => {
                warn!(
                    "router config directory not read, keeping the policy: {}",
                    chain(&e)
                );
                return Err(e.into());
            }
        };
        if change.seed_changed && self.shared.config.restart_needed(&change.config) {
            warn!(
                "router listeners or timeouts changed in the seed file; they apply after a restart"
            );
        }
        self.shared.install(change.config.policy);
        self.shared.counters.files.reloaded();
        Ok(())
    }

    /// The interval of the directory poll: the last good seed file's `[watch] poll_ms`.
    fn poll_interval(&self) -> Duration {
        match &self.shared.dir {
            Some(dir) => {
                dir.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .seed()
                    .poll_interval
            }
            None => self.shared.config.poll_interval,
        }
    }

    /// Reads the config directory every poll interval until `shutdown` (a blocking task
    /// each time: files are read with blocking calls).
    async fn poll(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.poll_interval()) => {}
            }
            let reloader = self.clone();
            let _ = tokio::task::spawn_blocking(move || match &reloader.shared.dir {
                Some(dir) => reloader.reload_dir(dir, false),
                None => Ok(()),
            })
            .await;
        }
    }
}

/// Serves one connection to the end: its listener's kind opens the tunnel (CONNECT:
/// [`crate::connect::open`]; SNI: [`crate::sni::open`]), then [`carry`] relays it. Refusals
/// log one line each (at most one a second for a head refused before routing). Runs inside the connection's
/// `router_conn` span, which the opening records `client` and `route` in. `pending` is the
/// connection's place until its head is read; it is closed unanswered if evicted from there.
async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    listener: &ListenerConfig,
    shared: &Shared,
    pending: PendingGuard,
) {
    // Everything before the relay runs on the heap and is freed once the tunnel is open (the
    // head's read buffers, the name lookup, the refusals): the task of an open tunnel keeps
    // only what the relay needs (tests/idle_memory.rs).
    let opening: Pin<Box<dyn Future<Output = Option<Open<'_>>> + Send + '_>> = match listener.kind {
        ListenerKind::Connect => Box::pin(crate::connect::open(
            stream, peer, listener, shared, pending,
        )),
        ListenerKind::Sni => Box::pin(crate::sni::open(stream, peer, listener, shared, pending)),
    };
    if let Some(open) = opening.await {
        carry(open, shared).await;
    }
}

/// Why the router cannot start or reload.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The config file is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The config directory is refused (`--config-dir`).
    #[error(transparent)]
    Dir(#[from] DirError),
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
    /// The `metrics_listen` address cannot be bound.
    #[error(transparent)]
    Admin(#[from] AdminBindError),
    /// The SIGHUP handler cannot be installed.
    #[error("cannot install the SIGHUP handler")]
    Signal(#[source] io::Error),
}
