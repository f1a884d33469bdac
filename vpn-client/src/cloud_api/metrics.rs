//! The cloud side's counters and their series (catalogue: `docs/metrics.md`, "GEP-21 cloud
//! side"). Per connection (the file's stem) once it has started; a connection's series stay
//! after its file is removed, so counters never go back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use netio::admin::{AdminState, Exposition, Kind};

/// The status codes the proxy answers with.
pub const CODES: [u16; 10] = [200, 400, 403, 405, 408, 414, 431, 502, 503, 504];

/// Why the proxy refused a CONNECT with 403.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// A name no name entry matches (not looked up).
    Name,
    /// An address no address or network entry covers.
    Address,
    /// An allowed name that resolved to an address outside the list.
    Resolved,
    /// An address of the VM itself.
    Local,
    /// Loopback, link-local, unspecified, multicast.
    Special,
}

impl Denied {
    const ALL: [Denied; 5] = [
        Denied::Name,
        Denied::Address,
        Denied::Resolved,
        Denied::Local,
        Denied::Special,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Denied::Name => "name",
            Denied::Address => "address",
            Denied::Resolved => "resolved",
            Denied::Local => "local",
            Denied::Special => "special",
        }
    }
}

/// One connection's counters.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    by_code: [AtomicU64; CODES.len()],
    denied: [AtomicU64; Denied::ALL.len()],
    to_target: AtomicU64,
    to_seed: AtomicU64,
    active: AtomicU64,
    up: AtomicBool,
}

impl ConnectionCounters {
    /// A CONNECT was answered with `code`.
    pub fn responded(&self, code: u16) {
        if let Some(i) = CODES.iter().position(|&c| c == code) {
            self.by_code[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A CONNECT was refused by the allow-list.
    pub fn denied(&self, why: Denied) {
        let i = Denied::ALL.iter().position(|&d| d == why).unwrap_or(0);
        self.denied[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A tunnel opened; it is active until the guard drops.
    pub fn opened(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active(Arc::clone(self))
    }

    /// A tunnel ended having relayed these bytes.
    pub fn relayed(&self, to_target: u64, to_seed: u64) {
        self.to_target.fetch_add(to_target, Ordering::Relaxed);
        self.to_seed.fetch_add(to_seed, Ordering::Relaxed);
    }

    /// Whether the connection runs (its file is in force).
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }
}

/// An open tunnel in `vpn_cloud_api_tunnels_active`.
#[derive(Debug)]
pub struct Active(Arc<ConnectionCounters>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every connection's counters and the file watcher's.
#[derive(Debug, Default)]
pub struct CloudApiMetrics {
    connections: Mutex<BTreeMap<String, Arc<ConnectionCounters>>>,
    files_rejected: AtomicU64,
}

impl CloudApiMetrics {
    /// The counters of connection `name` (made on first use).
    pub fn connection(&self, name: &str) -> Arc<ConnectionCounters> {
        let mut map = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(name.to_owned()).or_default())
    }

    /// A connection file was refused (malformed, or its device taken).
    pub fn file_rejected(&self) {
        self.files_rejected.fetch_add(1, Ordering::Relaxed);
    }
}

impl AdminState for CloudApiMetrics {
    fn metrics(&self, out: &mut Exposition) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let map = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let up = map
            .values()
            .filter(|c| c.up.load(Ordering::Relaxed))
            .count();
        out.single(
            "vpn_cloud_api_connections",
            Kind::Gauge,
            "Connections whose file is in force.",
            up,
        );
        out.single(
            "vpn_cloud_api_connection_files_rejected_total",
            Kind::Counter,
            "Connection files refused (malformed, or their device taken).",
            get(&self.files_rejected),
        );
        let name = "vpn_cloud_api_requests_total";
        out.family(name, Kind::Counter, "CONNECTs answered, by status code.");
        for (conn, c) in map.iter() {
            for (code, n) in CODES.iter().zip(&c.by_code) {
                out.sample(
                    name,
                    &[("connection", conn), ("code", &code.to_string())],
                    get(n),
                );
            }
        }
        let name = "vpn_cloud_api_denied_total";
        out.family(name, Kind::Counter, "CONNECTs refused by the allow-list.");
        for (conn, c) in map.iter() {
            for (why, n) in Denied::ALL.iter().zip(&c.denied) {
                out.sample(
                    name,
                    &[("connection", conn), ("reason", why.as_str())],
                    get(n),
                );
            }
        }
        let name = "vpn_cloud_api_tunnel_bytes_total";
        out.family(
            name,
            Kind::Counter,
            "Bytes relayed, counted when a tunnel ends.",
        );
        for (conn, c) in map.iter() {
            out.sample(
                name,
                &[("connection", conn), ("direction", "to_target")],
                get(&c.to_target),
            );
            out.sample(
                name,
                &[("connection", conn), ("direction", "to_seed")],
                get(&c.to_seed),
            );
        }
        let name = "vpn_cloud_api_tunnels_active";
        out.family(name, Kind::Gauge, "Tunnels open now.");
        for (conn, c) in map.iter() {
            out.sample(name, &[("connection", conn)], get(&c.active));
        }
    }
}
