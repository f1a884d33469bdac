//! The admin HTTP endpoint every binary of ours serves (the server, the CONNECT sidecar, the
//! ingress router): plain HTTP/1.1, one request per connection, three paths.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | 200, the Prometheus text exposition (format 0.0.4) of every part |
//! | `GET /healthz` | 200 `ok` while the process serves |
//! | `GET /readyz` | 200 `ready` when every part is ready, else 503 `not ready` |
//! | `GET` another readiness path | the same, if the binary set one ([`AdminServer::with_ready_path`]) |
//! | `GET /` | 200, the binary's HTML index page if it set one ([`AdminServer::with_index`]), else 404 |
//! | `HEAD` of the above | the same status and headers, no body |
//! | another path | 404 |
//! | another method | 405 with `Allow: GET, HEAD` |
//! | a malformed head, or none within [`REQUEST_TIMEOUT`] | 400, or closed |
//!
//! A binary is made of parts (the VPN server, the sidecar, the router), each an [`AdminState`]
//! that writes its series into an [`Exposition`] and says whether it is ready. At most
//! [`MAX_CONCURRENT`] requests are served at once; more connections are closed unread. The
//! endpoint is plain HTTP: bind it where only the scraper reaches it (see
//! `docs/metrics.md`).

use std::fmt::{Display, Write as _};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::http::{parse_request_head, MAX_HEAD_LEN};

/// How long a client gets to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests served at once; further connections are closed unread.
pub const MAX_CONCURRENT: usize = 64;

/// One part of a binary as the admin endpoint sees it.
pub trait AdminState: Send + Sync + std::fmt::Debug + 'static {
    /// Appends this part's series.
    fn metrics(&self, out: &mut Exposition);
    /// Whether this part is ready for traffic (`/readyz`).
    fn ready(&self) -> bool {
        true
    }
}

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets with the process).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
    /// No type given (what Go's client library writes for its `UntypedValue`).
    Untyped,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Untyped => "untyped",
        }
    }
}

/// A Prometheus text exposition being written: a family's `# HELP` and `# TYPE` lines, then
/// its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts the family `name`.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let _ = writeln!(
            self.text,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.as_str()
        );
        self
    }

    /// One sample of `name` with `labels` (values escaped as the format asks).
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.text.push_str("\\\\"),
                        '"' => self.text.push_str("\\\""),
                        '\n' => self.text.push_str("\\n"),
                        c => self.text.push(c),
                    }
                }
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The finished text.
    pub fn into_string(self) -> String {
        self.text
    }
}

/// The exposition of `parts`, in order.
pub fn render(parts: &[Arc<dyn AdminState>]) -> String {
    let mut out = Exposition::new();
    for part in parts {
        part.metrics(&mut out);
    }
    out.into_string()
}

/// Bound admin listeners; [`AdminServer::serve`] answers on them.
#[derive(Debug)]
pub struct AdminServer {
    listeners: Vec<TcpListener>,
    paths: Paths,
}

/// The paths a binary adds to the three every endpoint has.
#[derive(Debug, Clone, Copy, Default)]
struct Paths {
    /// The page `GET /` answers with.
    index: Option<&'static str>,
    /// Another path answered as `/readyz`.
    ready: Option<&'static str>,
}

impl Paths {
    /// The request target as [`respond`] takes it: the readiness path is `/readyz`.
    fn target<'a>(&self, target: &'a str) -> &'a str {
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        match self.ready {
            Some(ready) if ready == path => "/readyz",
            _ => target,
        }
    }
}

/// An admin listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (admin endpoint)")]
pub struct AdminBindError {
    /// The address.
    pub addr: SocketAddr,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl AdminServer {
    /// Binds every address ([`crate::listen::bind_each`]). Must run inside a tokio runtime.
    pub fn bind(addrs: &[SocketAddr]) -> Result<AdminServer, AdminBindError> {
        let listeners = crate::listen::bind_each(addrs)
            .map_err(|(addr, source)| AdminBindError { addr, source })?;
        Ok(AdminServer {
            listeners,
            paths: Paths::default(),
        })
    }

    /// Answers `GET /` with `html` (a page linking `/metrics`, as exporters have) instead of
    /// 404.
    pub fn with_index(mut self, html: &'static str) -> AdminServer {
        self.paths.index = Some(html);
        self
    }

    /// Answers `path` as `/readyz` too (Envoy's admin `/ready`, which Gardener's probes of the
    /// apiserver-proxy ask for).
    pub fn with_ready_path(mut self, path: &'static str) -> AdminServer {
        self.paths.ready = Some(path);
        self
    }

    /// The bound addresses (with the port the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Answers requests about `parts` until `shutdown`, then returns once every request in
    /// progress has ended.
    pub async fn serve(self, parts: Vec<Arc<dyn AdminState>>, shutdown: CancellationToken) {
        let parts: Arc<[Arc<dyn AdminState>]> = parts.into();
        let paths = self.paths;
        let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
        let tracker = TaskTracker::new();
        for listener in self.listeners {
            let (parts, slots, shutdown, requests) = (
                Arc::clone(&parts),
                Arc::clone(&slots),
                shutdown.clone(),
                tracker.clone(),
            );
            tracker.spawn(async move {
                while let Some((stream, _)) = crate::listen::accept(&listener, &shutdown).await {
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        continue;
                    };
                    let parts = Arc::clone(&parts);
                    requests.spawn(async move {
                        let answer = answer(stream, &parts, paths);
                        let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer).await;
                        drop(slot);
                    });
                }
            });
        }
        shutdown.cancelled().await;
        tracker.close();
        tracker.wait().await;
    }
}

/// Reads one request head and answers it.
async fn answer(
    mut stream: TcpStream,
    parts: &[Arc<dyn AdminState>],
    paths: Paths,
) -> io::Result<()> {
    let mut buf = BytesMut::with_capacity(1024);
    let head = loop {
        match parse_request_head(&buf) {
            Ok(Some((head, _))) => break Some(head),
            Ok(None) => {}
            Err(_) => break None,
        }
        if buf.len() >= MAX_HEAD_LEN || stream.read_buf(&mut buf).await? == 0 {
            break None;
        }
    };
    let response = match head {
        None => Response::plain(400, "Bad Request", ""),
        Some(h) => respond(&h.method, paths.target(&h.target), parts, paths.index),
    };
    stream.write_all(&response.encode()).await?;
    stream.shutdown().await
}

/// What one request gets.
#[derive(Debug, PartialEq, Eq)]
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
    allow: bool,
    head_only: bool,
}

impl Response {
    fn plain(status: u16, reason: &'static str, body: &str) -> Response {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.to_owned(),
            allow: false,
            head_only: false,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        if self.allow {
            out.push_str("Allow: GET, HEAD\r\n");
        }
        out.push_str("\r\n");
        if !self.head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

/// The answer to `method target` (the decision, without I/O).
fn respond(
    method: &str,
    target: &str,
    parts: &[Arc<dyn AdminState>],
    index: Option<&'static str>,
) -> Response {
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            let mut r = Response::plain(405, "Method Not Allowed", "");
            r.allow = true;
            return r;
        }
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let mut response = match path {
        "/metrics" => Response {
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            ..Response::plain(200, "OK", &render(parts))
        },
        "/healthz" => Response::plain(200, "OK", "ok\n"),
        "/readyz" if parts.iter().all(|p| p.ready()) => Response::plain(200, "OK", "ready\n"),
        "/readyz" => Response::plain(503, "Service Unavailable", "not ready\n"),
        "/" => match index {
            Some(html) => Response {
                content_type: "text/html; charset=utf-8",
                ..Response::plain(200, "OK", html)
            },
            None => Response::plain(404, "Not Found", ""),
        },
        _ => Response::plain(404, "Not Found", ""),
    };
    response.head_only = head_only;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug, Default)]
    struct Part {
        ready: AtomicBool,
    }

    impl AdminState for Part {
        fn metrics(&self, out: &mut Exposition) {
            out.single("demo_up", Kind::Gauge, "Whether the demo is up.", 1)
                .family("demo_requests_total", Kind::Counter, "Requests.")
                .sample("demo_requests_total", &[("code", "200")], 7)
                .sample("demo_requests_total", &[("path", "a\"b\\c\nd")], 0.5);
        }
        fn ready(&self) -> bool {
            self.ready.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn exposition_lines_and_label_escaping() {
        let part: Arc<dyn AdminState> = Arc::new(Part::default());
        assert_eq!(
            render(&[part]),
            "# HELP demo_up Whether the demo is up.\n# TYPE demo_up gauge\ndemo_up 1\n\
             # HELP demo_requests_total Requests.\n# TYPE demo_requests_total counter\n\
             demo_requests_total{code=\"200\"} 7\n\
             demo_requests_total{path=\"a\\\"b\\\\c\\nd\"} 0.5\n"
        );
    }

    #[test]
    fn paths_methods_and_readiness() {
        let part = Arc::new(Part::default());
        let parts: Vec<Arc<dyn AdminState>> = vec![
            part.clone(),
            Arc::new(Part {
                ready: AtomicBool::new(true),
            }),
        ];
        assert_eq!(respond("GET", "/readyz", &parts, None).status, 503);
        part.ready.store(true, Ordering::Relaxed);
        assert_eq!(respond("GET", "/readyz", &parts, None).status, 200);
        assert_eq!(respond("GET", "/healthz", &parts, None).body, "ok\n");
        let metrics = respond("GET", "/metrics?name[]=x", &parts, None);
        assert_eq!(metrics.status, 200);
        assert!(metrics.body.starts_with("# HELP demo_up"));
        assert!(metrics.content_type.contains("version=0.0.4"));
        assert_eq!(respond("GET", "/", &parts, None).status, 404);
        assert_eq!(respond("GET", "/metricsx", &parts, None).status, 404);
        let post = respond("POST", "/metrics", &parts, None);
        assert_eq!(post.status, 405);
        assert!(String::from_utf8(post.encode())
            .unwrap()
            .contains("\r\nAllow: GET, HEAD\r\n"));
        let head = respond("HEAD", "/metrics", &parts, None).encode();
        let head = String::from_utf8(head).unwrap();
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        assert!(!head.contains("demo_up"));
    }

    #[test]
    fn index_page_only_when_set() {
        let parts: Vec<Arc<dyn AdminState>> = vec![Arc::new(Part::default())];
        let html = "<html><a href=\"/metrics\">metrics</a></html>\n";
        let index = respond("GET", "/", &parts, Some(html));
        assert_eq!(index.status, 200);
        assert_eq!(index.content_type, "text/html; charset=utf-8");
        assert_eq!(index.body, html);
        assert_eq!(respond("GET", "/?x=1", &parts, Some(html)).body, html);
        let head = respond("HEAD", "/", &parts, Some(html)).encode();
        assert!(String::from_utf8(head).unwrap().ends_with("\r\n\r\n"));
        // The other paths are unchanged.
        assert_eq!(
            respond("GET", "/index.html", &parts, Some(html)).status,
            404
        );
        assert_eq!(respond("GET", "/metrics", &parts, Some(html)).status, 200);
        assert_eq!(respond("GET", "/", &parts, None).status, 404);
    }

    #[test]
    fn a_readiness_path_of_the_binary() {
        let paths = Paths {
            index: None,
            ready: Some("/ready"),
        };
        assert_eq!(paths.target("/ready"), "/readyz");
        assert_eq!(paths.target("/ready?verbose"), "/readyz");
        assert_eq!(paths.target("/readyx"), "/readyx");
        assert_eq!(paths.target("/metrics"), "/metrics");
        assert_eq!(Paths::default().target("/ready"), "/ready");
    }

    #[test]
    fn untyped_family() {
        let mut out = Exposition::new();
        out.single("demo_untyped", Kind::Untyped, "No type.", 3);
        assert_eq!(
            out.as_str(),
            "# HELP demo_untyped No type.\n# TYPE demo_untyped untyped\ndemo_untyped 3\n"
        );
    }

    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_over_tcp_and_stops_on_shutdown() {
        let server = AdminServer::bind(&["127.0.0.1:0".parse().unwrap()])
            .unwrap()
            .with_index("<html>index</html>");
        let addr = server.local_addrs()[0];
        let shutdown = CancellationToken::new();
        let part: Arc<dyn AdminState> = Arc::new(Part::default());
        let task = tokio::spawn(server.serve(vec![part], shutdown.clone()));
        let metrics = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.ends_with("demo_requests_total{path=\"a\\\"b\\\\c\\nd\"} 0.5\n"));
        let index = get(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(index.starts_with("HTTP/1.1 200 OK\r\n"), "{index}");
        assert!(index.ends_with("\r\n\r\n<html>index</html>"), "{index}");
        let ready = get(addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
        assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
        let bad = get(addr, b"\x16\x03\x01 not http\r\n\r\n").await;
        assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
        shutdown.cancel();
        task.await.unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
