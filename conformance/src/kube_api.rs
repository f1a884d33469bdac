//! A stand-in for the Kubernetes API server, for the tests of `vpn-router --kubernetes`.
//!
//! **Why a stand-in.** No Kubernetes API server can run on the test machines: none is
//! packaged in the registries they reach, and a kind or k3s cluster needs images and a
//! container runtime they do not have. So the tests talk to this instead: the part of the
//! API that kube-rs's client and `kube-runtime`'s watcher use (kube 2.0: a paged list, then
//! a watch from the list's `resourceVersion` with bookmarks, resumed from the last version
//! seen, a list again after `410 Gone`), spoken over HTTPS the way the API server speaks it,
//! so the router runs its real client code against it. It speaks no more of the API than
//! that: no writes through HTTP, no label selectors, no `StreamingList`.
//!
//! What it serves, for the collections registered ([`Resource`], cluster-wide paths only:
//! `/api/v1/services`, `/apis/<group>/<version>/<plural>`):
//!
//! * **list**: `GET <path>`: a `<Kind>List` with `metadata.resourceVersion` and every object
//!   (each with its own `metadata.resourceVersion`); `fieldSelector=metadata.name=<n>` and
//!   `metadata.namespace=<ns>` filter; `limit=<n>` pages (kube-runtime asks for 500 at a
//!   time) with a `metadata.continue` token the next page's `continue=` hands back. Unlike
//!   the API server, a later page shows the objects as they are then, not as of the first
//!   page's version (which the list reports): a watch from that version replays the changes
//!   in between, so the client ends up with the same objects.
//! * **watch**: `GET <path>?watch=true&resourceVersion=<rv>`: a chunked stream of one JSON
//!   event per line, `ADDED`, `MODIFIED` and `DELETED` for every change after `<rv>`,
//!   `BOOKMARK`s (the current resourceVersion) every [`BOOKMARK_EVERY`] when
//!   `allowWatchBookmarks=true`, ended after `timeoutSeconds` as the API server ends it; a
//!   `resourceVersion` older than the history kept ([`ApiServer::expire`]) gets the
//!   API server's `ERROR` event with a `410 Gone` `Status` (`reason: Expired`).
//! * Every request must carry `Authorization: Bearer <token>` (401 otherwise), and every
//!   one is recorded ([`ApiServer::requests`]).
//! * Faults: [`ApiServer::drop_connections`] cuts every open watch mid-stream (no final
//!   chunk, as a restarted API server or a lost connection does); [`ApiServer::set_delay`]
//!   answers every request late; [`ApiServer::expire`] forgets the history, so every watch
//!   resumed from an older version gets `410` and lists again; [`ApiServer::down`] closes the
//!   listener and every connection (connections are refused) and [`ApiServer::up`] serves
//!   again on a new listener at the same address, with the objects and history kept (a
//!   restarted API server whose watch cache lost the history: [`ApiServer::expire`] too).
//!
//! One shared resourceVersion counter, as etcd's revision: every change takes the next.
//! Answers close the connection (`Connection: close`); the client opens a new one each time.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openssl::ssl::{Ssl, SslAcceptor, SslMethod};
use pki::{Ca, CertProfile, IssueRequest, KeySpec, San, Validity};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_openssl::SslStream;

/// How often a watch that asked for bookmarks gets one.
pub const BOOKMARK_EVERY: Duration = Duration::from_millis(500);

/// A collection the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The cluster-wide path (`/api/v1/services`).
    pub path: &'static str,
    /// `apiVersion` of its objects.
    pub api_version: &'static str,
    /// `kind` of its objects.
    pub kind: &'static str,
}

/// `v1` Service.
pub const SERVICE: Resource = Resource {
    path: "/api/v1/services",
    api_version: "v1",
    kind: "Service",
};
/// Istio Gateway.
pub const GATEWAY: Resource = Resource {
    path: "/apis/networking.istio.io/v1beta1/gateways",
    api_version: "networking.istio.io/v1beta1",
    kind: "Gateway",
};
/// Istio VirtualService.
pub const VIRTUAL_SERVICE: Resource = Resource {
    path: "/apis/networking.istio.io/v1beta1/virtualservices",
    api_version: "networking.istio.io/v1beta1",
    kind: "VirtualService",
};
/// Gardener's Extension.
pub const EXTENSION: Resource = Resource {
    path: "/apis/extensions.gardener.cloud/v1alpha1/extensions",
    api_version: "extensions.gardener.cloud/v1alpha1",
    kind: "Extension",
};
/// Gardener's Cluster (cluster-scoped).
pub const CLUSTER: Resource = Resource {
    path: "/apis/extensions.gardener.cloud/v1alpha1/clusters",
    api_version: "extensions.gardener.cloud/v1alpha1",
    kind: "Cluster",
};
/// Gardener's Infrastructure.
pub const INFRASTRUCTURE: Resource = Resource {
    path: "/apis/extensions.gardener.cloud/v1alpha1/infrastructures",
    api_version: "extensions.gardener.cloud/v1alpha1",
    kind: "Infrastructure",
};
/// Every collection `vpn-router --kubernetes` reads.
pub const ROUTER_RESOURCES: [Resource; 6] = [
    SERVICE,
    GATEWAY,
    VIRTUAL_SERVICE,
    EXTENSION,
    CLUSTER,
    INFRASTRUCTURE,
];

/// One change of a collection.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct Collection {
    objects: BTreeMap<(String, String), Value>,
    changes: Vec<Change>,
}

#[derive(Debug)]
struct World {
    rv: u64,
    /// Watches from a version older than this get 410.
    oldest: u64,
    collections: BTreeMap<&'static str, (Resource, Collection)>,
    delay: Duration,
    requests: Vec<String>,
}

#[derive(Debug)]
struct Shared {
    world: Mutex<World>,
    token: String,
    /// Bumped on every change: open watches wake up.
    changed: watch::Sender<u64>,
    /// Bumped by `drop_connections`: open watches are cut.
    cut: watch::Sender<u64>,
}

impl Shared {
    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The running stand-in; stops when dropped.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Arc<SslAcceptor>,
    stop: tokio_util::sync::CancellationToken,
    /// The runtime the stand-in's thread drives.
    runtime: tokio::runtime::Handle,
    /// Stops the current listener and its connections (`down`).
    listening: Mutex<Option<tokio_util::sync::CancellationToken>>,
    thread: Option<JoinHandle<()>>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ApiServer {
    /// Serves `resources` on `listener` (bind it where the client runs, e.g. inside a lab
    /// namespace), with a fresh CA and a server certificate for the listener's address, and
    /// writes a kubeconfig (server, CA, bearer token) for clients.
    pub fn start(listener: TcpListener, resources: &[Resource]) -> io::Result<ApiServer> {
        let addr = listener.local_addr()?;
        let (acceptor, ca_pem) = tls(addr).map_err(io::Error::other)?;
        let dir = tempfile::tempdir()?;
        let token = "stand-in-token".to_owned();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(addr, &ca_pem, &token))?;
        let collections = resources
            .iter()
            .map(|r| (r.path, (*r, Collection::default())))
            .collect();
        let shared = Arc::new(Shared {
            world: Mutex::new(World {
                rv: 1,
                oldest: 0,
                collections,
                delay: Duration::ZERO,
                requests: Vec::new(),
            }),
            token,
            changed: watch::channel(0).0,
            cut: watch::channel(0).0,
        });
        let stop = tokio_util::sync::CancellationToken::new();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kube-api-stand-in".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("stand-in runtime");
                let _ = handle_tx.send(rt.handle().clone());
                rt.block_on(st.cancelled());
            })?;
        let runtime = handle_rx
            .recv()
            .map_err(|_| io::Error::other("the stand-in's runtime did not start"))?;
        let server = ApiServer {
            addr,
            shared,
            acceptor: Arc::new(acceptor),
            stop,
            runtime,
            listening: Mutex::new(None),
            thread: Some(thread),
            kubeconfig,
            _dir: dir,
        };
        server.up(listener)?;
        Ok(server)
    }

    /// Serves on `listener` (at the stand-in's address) after [`ApiServer::down`], as a
    /// restarted API server: the objects and the history are those of before.
    pub fn up(&self, listener: TcpListener) -> io::Result<()> {
        if listener.local_addr()? != self.addr {
            return Err(io::Error::other(
                "the stand-in comes back at its own address",
            ));
        }
        listener.set_nonblocking(true)?;
        let token = self.stop.child_token();
        let old = self
            .listening
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(token.clone());
        if let Some(old) = old {
            old.cancel();
        }
        let (acceptor, shared) = (Arc::clone(&self.acceptor), Arc::clone(&self.shared));
        self.runtime
            .spawn(async move { serve(listener, acceptor, shared, token).await });
        Ok(())
    }

    /// Stops serving, as an API server that goes away: the listener is closed (connecting
    /// is refused) and every open connection is closed mid-answer.
    pub fn down(&self) {
        let token = self
            .listening
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(token) = token {
            token.cancel();
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig file for it.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Creates or replaces `object` (its `metadata.namespace` and `metadata.name` name it;
    /// `apiVersion`, `kind` and `metadata.resourceVersion` are set), as `ADDED` or `MODIFIED`.
    pub fn apply(&self, resource: Resource, mut object: Value) {
        let mut world = self.shared.world();
        world.rv += 1;
        let rv = world.rv;
        object["apiVersion"] = json!(resource.api_version);
        object["kind"] = json!(resource.kind);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(&object);
        let (_, c) = world
            .collections
            .get_mut(resource.path)
            .expect("registered resource");
        let kind = if c.objects.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        c.changes.push(Change { rv, kind, object });
        drop(world);
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Deletes the object `namespace/name` (`DELETED`), if there is one.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) {
        let mut world = self.shared.world();
        world.rv += 1;
        let rv = world.rv;
        let (_, c) = world
            .collections
            .get_mut(resource.path)
            .expect("registered resource");
        let Some(mut object) = c.objects.remove(&(namespace.to_owned(), name.to_owned())) else {
            return;
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        c.changes.push(Change {
            rv,
            kind: "DELETED",
            object,
        });
        drop(world);
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Forgets the history: every watch resumed from a version before now gets `410 Gone`
    /// (those open now are cut, so they resume).
    pub fn expire(&self) {
        let mut world = self.shared.world();
        world.rv += 1;
        world.oldest = world.rv;
        for (_, c) in world.collections.values_mut() {
            c.changes.clear();
        }
        drop(world);
        self.drop_connections();
    }

    /// Cuts every open watch mid-stream.
    pub fn drop_connections(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// Answers every request `delay` late.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.world().delay = delay;
    }

    /// Every request so far (`path?query`), in order.
    pub fn requests(&self) -> Vec<String> {
        self.shared.world().requests.clone()
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn key_of(object: &Value) -> (String, String) {
    let text = |k: &str| {
        object["metadata"][k]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (text("namespace"), text("name"))
}

/// A fresh CA, a server certificate for `addr` signed by it, the acceptor; the CA in PEM.
fn tls(
    addr: SocketAddr,
) -> Result<(SslAcceptor, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let validity = Validity::days_from(i64::try_from(now)?, 1);
    let ca = Ca::create("kube-api-stand-in-ca", KeySpec::EcdsaP256, validity)?;
    let server = ca.issue(&IssueRequest {
        profile: CertProfile::Server,
        common_name: "kube-apiserver".into(),
        sans: vec![San::Ip(addr.ip()), San::Dns("localhost".into())],
        key: KeySpec::EcdsaP256,
        validity,
    })?;
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
    b.set_certificate(server.leaf())?;
    b.set_private_key(server.key())?;
    Ok((b.build(), ca.cert().to_pem()?))
}

fn kubeconfig_text(addr: SocketAddr, ca_pem: &[u8], token: &str) -> String {
    let ca = openssl::base64::encode_block(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\nusers:\n- name: router\n  user:\n    token: {token}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: router\ncurrent-context: stand-in\n"
    )
}

async fn serve(
    listener: TcpListener,
    acceptor: Arc<SslAcceptor>,
    shared: Arc<Shared>,
    stop: tokio_util::sync::CancellationToken,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let (acceptor, shared, stop) = (Arc::clone(&acceptor), Arc::clone(&shared), stop.clone());
        tokio::spawn(async move {
            let Ok(ssl) = Ssl::new(acceptor.context()) else {
                return;
            };
            let Ok(mut tls) = SslStream::new(ssl, tcp) else {
                return;
            };
            if Pin::new(&mut tls).accept().await.is_err() {
                return;
            }
            tokio::select! {
                () = stop.cancelled() => {}
                _ = answer(&mut tls, &shared) => {}
            }
        });
    }
}

type Tls = SslStream<tokio::net::TcpStream>;

/// Reads one request and answers it.
async fn answer(tls: &mut Tls, shared: &Shared) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut buf).await?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let authorized = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.eq_ignore_ascii_case("authorization")
                && v.trim() == format!("Bearer {}", shared.token)
        })
    });
    let delay = {
        let mut world = shared.world();
        world.requests.push(target.clone());
        world.delay
    };
    tokio::time::sleep(delay).await;
    if !authorized {
        return respond(
            tls,
            401,
            &status(401, "Unauthorized", "no or wrong bearer token"),
        )
        .await;
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = parse_query(query);
    let resource = shared.world().collections.get(path).map(|(r, _)| *r);
    let Some(resource) = resource else {
        return respond(tls, 404, &status(404, "NotFound", "no such collection")).await;
    };
    let filter = Filter::parse(query.get("fieldSelector").map_or("", String::as_str));
    if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
        return watch_stream(tls, shared, resource, &query, &filter).await;
    }
    let page = Page::of(&query);
    let body = {
        let world = shared.world();
        let (_, c) = &world.collections[resource.path];
        let rv = page.rv.unwrap_or(world.rv);
        let items: Vec<&Value> = c
            .objects
            .values()
            .filter(|o| filter.admits(o))
            .skip(page.offset)
            .collect();
        let (items, more) = match page.limit {
            Some(limit) if items.len() > limit => (&items[..limit], true),
            _ => (&items[..], false),
        };
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if more {
            metadata["continue"] = json!(format!("{rv}-{}", page.offset + items.len()));
        }
        json!({
            "apiVersion": resource.api_version,
            "kind": format!("{}List", resource.kind),
            "metadata": metadata,
            "items": items,
        })
    };
    respond(tls, 200, &body).await
}

/// A list request's page: `limit`, and where `continue` says the previous page ended (the
/// token is `<first page's version>-<objects before>`).
#[derive(Debug, Default)]
struct Page {
    limit: Option<usize>,
    rv: Option<u64>,
    offset: usize,
}

impl Page {
    fn of(query: &BTreeMap<String, String>) -> Page {
        let limit = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0);
        let token = query.get("continue").and_then(|t| {
            let (rv, offset) = t.split_once('-')?;
            Some((rv.parse().ok()?, offset.parse().ok()?))
        });
        Page {
            limit,
            rv: token.map(|(rv, _)| rv),
            offset: token.map_or(0, |(_, offset)| offset),
        }
    }
}

async fn respond(tls: &mut Tls, code: u16, body: &Value) -> io::Result<()> {
    let body = body.to_string();
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(body.as_bytes()).await?;
    tls.shutdown().await
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

async fn chunk(tls: &mut Tls, event: &Value) -> io::Result<()> {
    let mut line = event.to_string();
    line.push('\n');
    tls.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
        .await?;
    tls.flush().await
}

/// Streams the changes of `resource` after the request's `resourceVersion`.
async fn watch_stream(
    tls: &mut Tls,
    shared: &Shared,
    resource: Resource,
    query: &BTreeMap<String, String>,
    filter: &Filter,
) -> io::Result<()> {
    let mut cut = shared.cut.subscribe();
    let mut changed = shared.changed.subscribe();
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(290), Duration::from_secs);
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let mut from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    tls.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let expired = {
        let world = shared.world();
        from != 0 && from < world.oldest
    };
    if expired {
        let gone = status(410, "Expired", "too old resource version");
        chunk(tls, &json!({"type": "ERROR", "object": gone})).await?;
        tls.write_all(b"0\r\n\r\n").await?;
        return tls.shutdown().await;
    }
    if from == 0 {
        // "Any" version: the current objects as ADDED, then the changes.
        let (events, rv) = {
            let world = shared.world();
            let (_, c) = &world.collections[resource.path];
            let events: Vec<Value> = c
                .objects
                .values()
                .filter(|o| filter.admits(o))
                .map(|o| json!({"type": "ADDED", "object": o}))
                .collect();
            (events, world.rv)
        };
        for e in &events {
            chunk(tls, e).await?;
        }
        from = rv;
    }
    let end = Instant::now() + timeout;
    let mut last_bookmark = Instant::now();
    loop {
        let (events, rv) = {
            let world = shared.world();
            let (_, c) = &world.collections[resource.path];
            let events: Vec<Value> = c
                .changes
                .iter()
                .filter(|ch| ch.rv > from && filter.admits(&ch.object))
                .map(|ch| json!({"type": ch.kind, "object": ch.object}))
                .collect();
            (events, world.rv)
        };
        for e in &events {
            chunk(tls, e).await?;
        }
        from = from.max(
            events
                .iter()
                .filter_map(|e| e["object"]["metadata"]["resourceVersion"].as_str())
                .filter_map(|v| v.parse().ok())
                .max()
                .unwrap_or(from),
        );
        if bookmarks && last_bookmark.elapsed() >= BOOKMARK_EVERY {
            let mark = json!({"type": "BOOKMARK", "object": {
                "apiVersion": resource.api_version, "kind": resource.kind,
                "metadata": {"resourceVersion": rv.to_string()}}});
            chunk(tls, &mark).await?;
            from = from.max(rv);
            last_bookmark = Instant::now();
        }
        if Instant::now() >= end {
            tls.write_all(b"0\r\n\r\n").await?;
            return tls.shutdown().await;
        }
        tokio::select! {
            _ = cut.changed() => return Ok(()),
            _ = changed.changed() => {}
            () = tokio::time::sleep(BOOKMARK_EVERY.min(end - Instant::now())) => {}
        }
    }
}

/// A field selector of `metadata.name` and `metadata.namespace` terms.
#[derive(Debug, Default)]
struct Filter {
    terms: Vec<(String, String)>,
}

impl Filter {
    fn parse(selector: &str) -> Filter {
        let terms = selector
            .split(',')
            .filter_map(|t| {
                let (k, v) = t.split_once("==").or_else(|| t.split_once('='))?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect();
        Filter { terms }
    }

    fn admits(&self, object: &Value) -> bool {
        self.terms.iter().all(|(k, v)| {
            let field = k.strip_prefix("metadata.").unwrap_or(k);
            object["metadata"][field].as_str().unwrap_or_default() == v
        })
    }
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => out.push(b),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
