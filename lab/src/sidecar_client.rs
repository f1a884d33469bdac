//! The test's side of the CONNECT sidecar tests: a PKI made with the `pki` crate (including a
//! foreign CA and an expired client certificate), a runtime inside a lab namespace, a blocking
//! mTLS client speaking CONNECT, a listener that proves nobody connected, and a metrics scrape.
//! The sidecar itself is the `vpn-server` binary or, in process, `conformance::sidecar_lab`.
//! Test-only: failures panic with a message.

#![allow(clippy::unwrap_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openssl::ssl::{SslConnector, SslStream};
use pki::{Ca, CaBundle, CertProfile, Identity, IssueRequest, KeySpec, San, Validity};

use crate::netns::Netns;

/// The name in the sidecar's certificate (what the client checks).
pub const SERVER_NAME: &str = "vpn-seed-server";
/// Generous bound for lab steps (never a speed assertion).
pub const WAIT: Duration = Duration::from_secs(30);

/// The certificates of a sidecar test.
#[derive(Debug)]
pub struct Pki {
    /// The `ca-vpn` bundle.
    pub bundle: CaBundle,
    /// The sidecar's server certificate (CN and SAN `vpn-seed-server`).
    pub server: Identity,
    /// The kube-apiserver's client certificate.
    pub client: Identity,
    /// A client certificate from another CA.
    pub foreign_client: Identity,
    /// A client certificate from the right CA whose validity ended yesterday.
    pub expired_client: Identity,
    /// The OpenVPN client's certificate (CN [`VPN_CLIENT_CN`]).
    pub vpn_client: Identity,
}

/// The CN of the OpenVPN client certificate (the server's iroute is keyed on it).
pub const VPN_CLIENT_CN: &str = "vpn-shoot-client";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn leaf(profile: CertProfile, cn: &str, validity: Validity) -> IssueRequest {
    IssueRequest {
        profile,
        common_name: cn.into(),
        sans: match profile {
            CertProfile::Server => vec![San::Dns(SERVER_NAME.into())],
            CertProfile::Client => Vec::new(),
        },
        key: KeySpec::EcdsaP256,
        validity,
    }
}

impl Pki {
    /// Issues everything.
    pub fn generate() -> Pki {
        let valid = Validity::days_from(now(), 1);
        let ca = Ca::create("vpn", KeySpec::EcdsaP256, valid).expect("CA");
        let other = Ca::create("vpn", KeySpec::EcdsaP256, valid).expect("other CA");
        let expired = Validity {
            not_before: now() - 10 * 86_400,
            not_after: now() - 86_400,
        };
        let cn = "kube-apiserver-http-proxy-client";
        Pki {
            bundle: CaBundle::new(vec![ca.cert().to_owned()]).expect("bundle"),
            server: ca
                .issue(&leaf(CertProfile::Server, SERVER_NAME, valid))
                .expect("server"),
            client: ca
                .issue(&leaf(CertProfile::Client, cn, valid))
                .expect("client"),
            foreign_client: other
                .issue(&leaf(CertProfile::Client, cn, valid))
                .expect("foreign client"),
            expired_client: ca
                .issue(&leaf(CertProfile::Client, cn, expired))
                .expect("expired client"),
            vpn_client: ca
                .issue(&leaf(CertProfile::Client, VPN_CLIENT_CN, valid))
                .expect("vpn client"),
        }
    }
}

/// A multi-thread runtime whose worker threads live in `ns` (threads inherit the namespace of
/// the thread that starts them), so sockets its tasks open belong to the namespace. Spawn
/// onto it; do not `block_on` socket work (that runs on the caller's thread).
pub fn ns_runtime(ns: &Netns) -> tokio::runtime::Runtime {
    ns.run_in(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    })
    .expect("enter namespace")
    .expect("runtime")
}

impl Pki {
    /// Writes `server.crt`, `server.key`, `ca.crt`, `client.crt`, `client.key` into `dir`.
    pub fn write(&self, dir: &std::path::Path) {
        let files = [
            ("server.crt", self.server.chain_pem()),
            ("server.key", self.server.key_pem()),
            ("ca.crt", self.bundle.to_pem()),
            ("client.crt", self.client.chain_pem()),
            ("client.key", self.client.key_pem()),
        ];
        for (name, pem) in files {
            std::fs::write(dir.join(name), pem.expect("PEM")).expect("write PEM");
        }
    }
}

/// The kube-apiserver's side: trusts `bundle`, presents `identity` if given.
pub fn connector(bundle: &CaBundle, identity: Option<&Identity>) -> SslConnector {
    pki::tls::connect_proxy_connector(identity, bundle).expect("connector")
}

/// Connects and completes the TLS handshake (call inside the namespace).
pub fn tls(
    connector: &SslConnector,
    addr: SocketAddr,
) -> Result<SslStream<TcpStream>, openssl::ssl::HandshakeError<TcpStream>> {
    let tcp = TcpStream::connect_timeout(&addr, WAIT).expect("TCP connect to the sidecar");
    tcp.set_read_timeout(Some(WAIT)).expect("timeout");
    connector.connect(SERVER_NAME, tcp)
}

/// Sends `CONNECT target` and reads the response head; returns the status code, or `None`
/// when the connection failed or closed before a whole head.
pub fn connect_status<S: Read + Write>(stream: &mut S, target: &str) -> Option<u16> {
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(req.as_bytes()).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 8192 {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&head);
    text.split(' ').nth(1)?.parse().ok()
}

/// A listener whose accept queue shows whether anybody connected.
#[derive(Debug)]
pub struct Recorder {
    listener: TcpListener,
}

impl Recorder {
    /// Listens on `addr` (call inside the namespace).
    pub fn bind(addr: SocketAddr) -> Recorder {
        let listener = TcpListener::bind(addr).expect("recorder bind");
        listener.set_nonblocking(true).expect("nonblocking");
        Recorder { listener }
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("addr")
    }

    /// Connections completed so far (each is taken off the queue and closed).
    pub fn accepted(&self) -> usize {
        let mut n = 0;
        loop {
            match self.listener.accept() {
                Ok(_) => n += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
                Err(e) => panic!("recorder accept: {e}"),
            }
        }
    }
}

/// `GET /metrics` over plain HTTP (call inside the namespace); the body.
pub fn scrape(addr: SocketAddr) -> String {
    try_scrape(addr).unwrap_or_else(|e| panic!("GET /metrics from {addr}: {e}"))
}

/// `GET /metrics` over plain HTTP (call inside the namespace): the body of a 200, else why
/// not (nothing listening yet, another status, no body).
pub fn try_scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, WAIT)?;
    s.set_read_timeout(Some(WAIT))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text
        .strip_prefix("HTTP/1.1 200 OK\r\n")
        .and_then(|rest| rest.split_once("\r\n\r\n"))
        .map(|(_, body)| body.to_owned());
    body.ok_or_else(|| std::io::Error::other(format!("not a 200 with a body: {text}")))
}

/// The value of the series line `series` (name with labels) in a scrape.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}
