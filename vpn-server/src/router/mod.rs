//! The seed's ingress router (`vpn-server router --config FILE`): replaces the Istio ingress
//! gateway's CONNECT routes (reference section 2.5) and the ACL extension's allow-lists
//! (section 4.1) with one small, strict proxy.
//!
//! Per connection ([`Router::run`]):
//!
//! 1. PROXY header, when the listener requires one: only from its trusted load-balancer
//!    networks (anyone else is closed unread), complete within the PROXY deadline, else
//!    closed. Its source address becomes the client address.
//! 2. The CONNECT head, strictly parsed and complete within the header deadline
//!    (`netio::ingress`); a refusal is answered (400 / 405 / 408 / 414 / 431) and closed.
//! 3. The routing decision against one snapshot of the [`Policy`] ([`Policy::decide`]):
//!    exactly one routing header under a name the listener honours, a valid value
//!    (`protocol::http::route`), an exact route, the client on the target's allow-list.
//!    Anything else: 400 (403 for an allow-list denial), one log line, closed, no upstream
//!    connection, never a fallback route.
//! 4. Connect upstream (503 on failure, 504 on timeout), answer 200, forward the bytes the
//!    client sent after its head, relay both ways ([`relay`]).
//!
//! Bytes after a refused head are never parsed or forwarded: they are read and discarded
//! (bounded) only so the client sees the answer rather than a reset.
//!
//! SIGHUP re-reads the config file: on success the routes, allow-lists and always-allowed
//! networks are replaced in one atomic swap (a request in flight keeps the snapshot it
//! started deciding with); a bad file is logged and the old policy stays. Listeners and
//! timeouts are fixed at start (a change to them is logged and needs a restart).
//!
//! # Config file (TOML)
//!
//! ```toml
//! # Networks that may reach every target with an allow-list (seed nodes and pods,
//! # shoot nodes, egress NAT addresses, the operator's additional CIDRs).
//! always_allowed = ["10.250.0.0/16", "100.64.0.0/12"]
//!
//! [timeouts]                  # optional, milliseconds
//! proxy_header_ms = 5000      # PROXY header complete after accept
//! header_ms = 10000           # CONNECT head complete after accept
//! connect_ms = 5000           # upstream connect
//!
//! [[listener]]
//! address = "0.0.0.0:8443"
//! headers = ["X-Gardener-Destination", "X-Gardener-API-Route"]
//! proxy_protocol = "required" # or "off" (default)
//! trusted_proxies = ["10.180.0.0/16"]   # required with "required", none with "off"
//!
//! [[listener]]
//! address = "0.0.0.0:8132"    # legacy port
//! headers = ["Reversed-VPN"]
//!
//! [[route]]
//! value = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local"
//! upstream = "vpn-seed-server.shoot--p--a.svc.cluster.local:1194"
//! allow = ["203.0.113.0/24"]  # optional; without it any client may use the route
//!
//! [[route]]
//! value = "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local"
//! upstream = "10.0.12.7:443"
//! allow = ["203.0.113.0/24"]
//! ```
//!
//! Unknown keys are errors. `vpn-server/examples/router.toml` is a complete example.

mod config;
mod policy;
mod serve;

pub use config::{ConfigError, ListenerConfig, RouterConfig, DEFAULT_CONNECT_TIMEOUT};
pub use policy::{Decision, Policy, Refusal, Target, ROUTING_HEADERS};
pub use serve::{main, relay, Counters, Reloader, Router, RouterArgs, RouterError};
