//! GEP-21's cloud side: `vpn-client cloud-api --connections DIR`. One process on a VM in the
//! private cloud holds a tunnel to each seed endpoint described by a file in `DIR`, and on each
//! tunnel an HTTP CONNECT proxy that forwards the endpoint's requests to that connection's
//! cloud-provider API endpoints and nowhere else.
//!
//! ```text
//!  seed endpoint (vpn-server --cloud-api-listen)           this VM
//!    controllers' CONNECT ─► tunnel address of a VM ──tun──► proxy [::]:3128 on the device
//!                                                               │ allow-list (allow.rs),
//!                                                               │ the VM's resolver
//!                                                               ▼
//!                                                        keystone / vCenter / NSX API
//! ```
//!
//! * **Files** ([`file`]): one connection per `*.conf` file (hidden names skipped, so
//!   Kubernetes' `..data` directories are not read twice). The directory is read every
//!   `--poll-interval`; each file is read through its symlinks, so a ConfigMap or Secret
//!   volume whose `..data` link is swapped is seen as a changed file, and all files of one
//!   read come from one version ([`scan`]). A new file starts its
//!   connection; a changed one restarts it; a removed one stops it (the tunnel device goes,
//!   the endpoint no longer reaches this VM through it). A file that does not parse, or
//!   wants a device another connection holds, is reported once (file and line) and changes
//!   nothing: a running connection of the same file keeps its last good version. A file over
//!   1 MiB (`netio::volume::MAX_FILE_BYTES`) is refused so, unread, with its size.
//! * **Tunnel** ([`crate::run`]) with `route-nopull` forced: only the tunnel address is
//!   applied, no pushed route.
//! * **Proxy** ([`proxy`]): bound to the tunnel device, so only what arrives through the
//!   tunnel reaches it.
//! * **Guard** ([`vm_table`]): while connections run, the process owns the nf_tables table
//!   `inet vpn-cloud-api`: from each tunnel device only replies and connections to its
//!   proxy's port come in, nothing is forwarded (the kernel removes the table when the process
//!   ends, also after `kill -9`).
//! * **Audit**: one log line per CONNECT (`vpn_client::cloud_api::access`) and the
//!   `vpn_cloud_api_*` series ([`metrics`]) on `--admin-listen`.
//!
//! Each connection runs on its own thread with a current-thread runtime, as `vpn-client` runs
//! its one tunnel.

pub mod allow;
pub mod file;
pub mod metrics;
pub mod proxy;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use netio::admin::{AdminBindError, AdminServer, AdminState};
use netio::firewall::{priority, Chain, Firewall, Hook, Rule, Table};
use netio::report::chain;
use netio::volume::{self, Listing, Snapshot, MAX_FILE_BYTES};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn, Instrument as _};

use file::ConnectionSpec;
use metrics::{CloudApiMetrics, ConnectionCounters};
use proxy::ProxyConfig;

/// The pause before a tunnel that failed to set up is started again.
pub const RESTART_PAUSE: Duration = Duration::from_secs(5);

/// `vpn-client cloud-api`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudApiArgs {
    /// The directory of connection files (`*.conf`, one per seed endpoint).
    #[arg(long, env = "VPN_CLIENT_CLOUD_API_CONNECTIONS", value_name = "DIR")]
    pub connections: PathBuf,
    /// How often the directory is read, in milliseconds (a smaller value than 10 reads it every 10).
    #[arg(long, env = "VPN_CLIENT_CLOUD_API_POLL_MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,
    /// Admin endpoint (`/metrics`, `/healthz`, `/readyz`) listen addresses, comma-separated;
    /// none by default. Plain HTTP: bind it where only the scraper reaches it.
    #[arg(long, env = "VPN_CLIENT_CLOUD_API_ADMIN_LISTEN", value_delimiter = ',')]
    pub admin_listen: Vec<SocketAddr>,
}

/// Why `cloud-api` could not start.
#[derive(Debug, thiserror::Error)]
pub enum CloudApiError {
    /// The admin endpoint could not be bound.
    #[error(transparent)]
    Admin(#[from] AdminBindError),
}

/// Watches the directory and runs its connections until `shutdown`; then stops them all.
pub async fn run(args: CloudApiArgs, shutdown: CancellationToken) -> Result<(), CloudApiError> {
    let metrics = Arc::new(CloudApiMetrics::default());
    let admin = AdminServer::bind(&args.admin_listen)?;
    let part: Arc<dyn AdminState> = Arc::clone(&metrics) as Arc<dyn AdminState>;
    let admin = tokio::spawn(admin.serve(vec![part], shutdown.clone()));
    info!(dir = %args.connections.display(), "cloud API proxy: watching connection files");
    let mut watcher = Watcher {
        dir: args.connections.clone(),
        slots: BTreeMap::new(),
        metrics,
        dir_error: false,
        firewall: None,
        guarded: Vec::new(),
    };
    let poll = Duration::from_millis(args.poll_interval_ms.max(10));
    loop {
        watcher.reconcile().await;
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(poll) => {}
        }
    }
    for (_, slot) in std::mem::take(&mut watcher.slots) {
        if let Some(running) = slot.running {
            running.stop().await;
        }
    }
    let _ = admin.await;
    Ok(())
}

/// What the watcher knows of one file.
#[derive(Debug, Default)]
struct Slot {
    /// The connection of the file's last good version.
    running: Option<Running>,
    /// The content last refused (reported once).
    rejected: Option<Vec<u8>>,
    /// The size of the file last refused unread, over [`MAX_FILE_BYTES`] (reported once).
    too_large: Option<u64>,
}

struct Watcher {
    dir: PathBuf,
    slots: BTreeMap<String, Slot>,
    metrics: Arc<CloudApiMetrics>,
    /// The directory could not be read at the last poll (reported once).
    dir_error: bool,
    /// The netfilter socket that owns [`TABLE`] (opened with the first connection).
    firewall: Option<Firewall>,
    /// The tunnels [`TABLE`] guards now.
    guarded: Vec<(String, u16)>,
}

impl Watcher {
    /// Refuses the files of `too_large` (name -> size) not refused for that size already: a
    /// running connection keeps its last good version, as for a file that does not parse.
    fn refuse_too_large(&mut self, too_large: &BTreeMap<String, u64>) {
        for (name, &size) in too_large {
            let slot = self.slots.entry(name.clone()).or_default();
            if slot.too_large.replace(size) == Some(size) {
                continue;
            }
            slot.rejected = None;
            self.metrics.file_rejected();
            let keeps = if slot.running.is_some() {
                "the running connection keeps its last good version"
            } else {
                "no connection started"
            };
            error!(
                "connection file refused: {}: {size} bytes, more than the {MAX_FILE_BYTES} a connection file may have, not read ({keeps})",
                self.dir.join(name).display()
            );
        }
    }

    /// One poll: start, restart and stop connections to match the directory.
    async fn reconcile(&mut self) {
        let (files, too_large) = match scan(&self.dir) {
            Ok(f) => {
                self.dir_error = false;
                (f.files, f.too_large)
            }
            Err(e) => {
                if !self.dir_error {
                    warn!(dir = %self.dir.display(), error = %e, "cannot read the connection directory; nothing changed");
                    self.dir_error = true;
                }
                return;
            }
        };
        let gone: Vec<String> = self
            .slots
            .keys()
            .filter(|k| !files.contains_key(*k) && !too_large.contains_key(*k))
            .cloned()
            .collect();
        for name in gone {
            if let Some(Slot {
                running: Some(r), ..
            }) = self.slots.remove(&name)
            {
                info!(file = %name, "connection file removed: stopping its connection");
                r.stop().await;
            }
        }
        self.refuse_too_large(&too_large);
        for (name, content) in files {
            let slot = self.slots.entry(name.clone()).or_default();
            slot.too_large = None;
            let same = |c: &Vec<u8>| *c == content;
            if slot.running.as_ref().is_some_and(|r| same(&r.content))
                || slot.rejected.as_ref().is_some_and(same)
            {
                continue;
            }
            let path = self.dir.join(&name);
            let parsed = std::str::from_utf8(&content)
                .map_err(|_| format!("{}: not UTF-8 text", path.display()))
                .and_then(|text| file::parse(&path, text).map_err(|e| chain(&e).to_string()));
            let spec = parsed.and_then(|spec| {
                let taken = self.slots.iter().find(|(other, s)| {
                    **other != name && s.running.as_ref().is_some_and(|r| r.device == spec.device)
                });
                match taken {
                    Some((other, _)) => Err(format!(
                        "{}: device {} is used by {other}",
                        path.display(),
                        spec.device
                    )),
                    None => Ok(spec),
                }
            });
            let slot = self.slots.entry(name.clone()).or_default();
            let spec = match spec {
                Ok(s) => s,
                Err(why) => {
                    self.metrics.file_rejected();
                    let keeps = if slot.running.is_some() {
                        "the running connection keeps its last good version"
                    } else {
                        "no connection started"
                    };
                    error!("connection file refused: {why} ({keeps})");
                    slot.rejected = Some(content);
                    continue;
                }
            };
            slot.rejected = None;
            if let Some(old) = slot.running.take() {
                info!(file = %name, "connection file changed: restarting its connection");
                old.stop().await;
            }
            for w in &spec.warnings {
                warn!("{w}");
            }
            let counters = self.metrics.connection(&spec.name);
            // The device's guard is in the kernel before its tunnel can come up.
            self.guard(Some((&spec.device, spec.proxy_port)));
            let slot = self.slots.entry(name.clone()).or_default();
            info!(
                file = %name,
                device = %spec.device,
                port = spec.proxy_port,
                allow = %spec.allow.entries().iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
                "connection file added: starting its connection"
            );
            match Running::start(spec, content, counters) {
                Ok(r) => slot.running = Some(r),
                Err(e) => error!(file = %name, error = %e, "cannot start a connection thread"),
            }
        }
        self.guard(None);
    }

    /// Holds [`vm_table`] for the running connections (and `adding`), applied when it
    /// changed; removed when no connection runs.
    fn guard(&mut self, adding: Option<(&str, u16)>) {
        let mut tunnels: Vec<(String, u16)> = self
            .slots
            .values()
            .filter_map(|s| s.running.as_ref())
            .map(|r| (r.device.clone(), r.port))
            .chain(adding.map(|(d, p)| (d.to_owned(), p)))
            .collect();
        tunnels.sort();
        tunnels.dedup();
        if self.guarded == tunnels {
            return;
        }
        let fw = match &mut self.firewall {
            Some(fw) => fw,
            None => match Firewall::open() {
                Ok(fw) => self.firewall.insert(fw),
                Err(e) => {
                    error!(error = %chain(&e), "cannot open the firewall: the tunnels are not guarded");
                    return;
                }
            },
        };
        let done = if tunnels.is_empty() {
            fw.remove(TABLE)
        } else {
            fw.apply(&vm_table(&tunnels), true)
        };
        match done {
            Ok(()) => {
                info!(
                    table = TABLE,
                    tunnels = tunnels.len(),
                    "tunnel guard rules in force"
                );
                self.guarded = tunnels;
            }
            Err(e) => error!(error = %chain(&e), "cannot install the tunnel guard rules"),
        }
    }
}

/// Our nf_tables table on the VM, owned by the process (gone when it ends).
pub const TABLE: &str = "vpn-cloud-api";

/// The VM's rules for its tunnels, each `(device, proxy port)`: from a tunnel device only
/// replies and new connections to the proxy's port come in, and nothing is forwarded. The
/// endpoint's server delivers only packets for the VM's own tunnel address; these rules keep
/// the VM's other services, and the private network behind it, out of the tunnel's reach
/// even if that were not so.
pub fn vm_table(tunnels: &[(String, u16)]) -> Table {
    let mut input = Chain::filter("input", Hook::Input, priority::FILTER);
    let mut forward = Chain::filter("forward", Hook::Forward, priority::FILTER);
    for (device, port) in tunnels {
        input = input
            .rule(
                Rule::new()
                    .iifname(device)
                    .established_or_related()
                    .accept(),
            )
            .rule(Rule::new().iifname(device).tcp_dport(*port).accept())
            .rule(Rule::new().iifname(device).drop());
        forward = forward.rule(Rule::new().iifname(device).drop());
    }
    Table::new(TABLE).chain(input).chain(forward)
}

/// The `*.conf` files of `dir` (not hidden) and their contents, read through symlinks.
/// Entries that cannot be read (a directory, a dangling link) are skipped. A Kubernetes
/// volume's files are read as one version: a read during which `..data` moved is done again
/// (`netio::volume`, [`Listing::Links`]). A file over [`MAX_FILE_BYTES`] is not read: it is
/// listed in [`Snapshot::too_large`] with its size.
pub fn scan(dir: &Path) -> io::Result<Snapshot> {
    volume::read_bounded(dir, file::EXTENSION, Listing::Links, MAX_FILE_BYTES)
}

/// A running connection: its thread, and the token that stops it.
#[derive(Debug)]
struct Running {
    content: Vec<u8>,
    device: String,
    port: u16,
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
    counters: Arc<ConnectionCounters>,
}

impl Running {
    fn start(
        spec: ConnectionSpec,
        content: Vec<u8>,
        counters: Arc<ConnectionCounters>,
    ) -> io::Result<Running> {
        let stop = CancellationToken::new();
        let device = spec.device.clone();
        let port = spec.proxy_port;
        let token = stop.clone();
        let c = Arc::clone(&counters);
        let span = tracing::info_span!("cloud_api", connection = %spec.name);
        let thread = std::thread::Builder::new()
            .name(format!("cloud-api-{}", spec.name))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => rt.block_on(connection(spec, c, token).instrument(span)),
                    Err(e) => error!(error = %e, "cannot build a runtime for the connection"),
                }
            })?;
        counters.set_up(true);
        Ok(Running {
            content,
            device,
            port,
            stop,
            thread,
            counters,
        })
    }

    /// Stops the connection and waits until its tunnel device is gone.
    async fn stop(self) {
        self.stop.cancel();
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        self.counters.set_up(false);
    }
}

/// One connection: the client (started again after [`RESTART_PAUSE`] if it fails) and the
/// proxy on its device (bound again whenever the client made the device anew).
async fn connection(
    spec: ConnectionSpec,
    counters: Arc<ConnectionCounters>,
    stop: CancellationToken,
) {
    let config = Arc::new(ProxyConfig {
        name: spec.name.clone(),
        device: spec.device.clone(),
        port: spec.proxy_port,
        allow: spec.allow.clone(),
    });
    let (generation, mut generations) = watch::channel(0u64);
    let client = async {
        loop {
            match crate::run(spec.settings.clone(), stop.clone()).await {
                Ok(crate::Stopped::Shutdown) => {}
                Ok(crate::Stopped::Halted { message }) => {
                    warn!(%message, "the endpoint halted the tunnel");
                }
                Err(e) => error!(error = %chain(&e), "tunnel failed"),
            }
            generation.send_modify(|g| *g += 1);
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(RESTART_PAUSE) => {}
            }
        }
    };
    let proxy = async {
        loop {
            let seen = *generations.borrow_and_update();
            let Some(listener) = proxy::bind(&config, &stop).await else {
                break;
            };
            let round = stop.child_token();
            let serve = proxy::serve(
                Arc::clone(&config),
                Arc::clone(&counters),
                listener,
                round.clone(),
            );
            tokio::select! {
                () = serve => {}
                _ = generations.wait_for(|g| *g != seen) => round.cancel(),
            }
            if stop.is_cancelled() {
                break;
            }
        }
    };
    tokio::join!(client, proxy);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_guard_lets_in_replies_and_the_proxy_port_only() {
        let t = vm_table(&[("cpa-a".into(), 3128), ("cpa-b".into(), 8080)]);
        let text = format!("{t:?}");
        for needle in [
            "cpa-a",
            "cpa-b",
            "TcpDport(3128)",
            "TcpDport(8080)",
            "Forward",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    /// Kubernetes' atomic writer: files are links into `..data`, itself a link to a
    /// timestamped directory that a new version replaces with one rename.
    #[test]
    fn scan_follows_a_swapped_kubernetes_volume_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/seed-a.conf"), "one").unwrap();
        symlink("..v1", d.join("..data")).unwrap();
        symlink("..data/seed-a.conf", d.join("seed-a.conf")).unwrap();
        std::fs::write(d.join("notes.txt"), "not a connection").unwrap();
        std::fs::write(d.join(".hidden.conf"), "skipped").unwrap();
        symlink("..data/gone.conf", d.join("dangling.conf")).unwrap();
        std::fs::create_dir(d.join("dir.conf")).unwrap();
        let got = scan(d).unwrap().files;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got["seed-a.conf"], b"one");

        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/seed-a.conf"), "two").unwrap();
        symlink("..v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        assert_eq!(scan(d).unwrap().files["seed-a.conf"], b"two");

        std::fs::remove_file(d.join("seed-a.conf")).unwrap();
        assert!(scan(d).unwrap().files.is_empty());
        assert!(scan(&d.join("missing")).is_err());
    }

    #[test]
    fn a_connection_file_over_a_mebibyte_is_listed_unread_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let size = usize::try_from(MAX_FILE_BYTES).unwrap();
        std::fs::write(d.join("big.conf"), "#".repeat(size + 1)).unwrap();
        std::fs::write(d.join("edge.conf"), "#".repeat(size)).unwrap();
        let got = scan(d).unwrap();
        assert_eq!(got.files.keys().collect::<Vec<_>>(), ["edge.conf"]);
        assert_eq!(
            got.too_large,
            BTreeMap::from([("big.conf".to_owned(), 1_048_577)])
        );
    }
}
