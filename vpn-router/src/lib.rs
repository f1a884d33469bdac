//! The seed's ingress router (the `vpn-router --config FILE` or `--config-dir DIR` binary):
//! replaces the Istio ingress
//! gateway's CONNECT routes (reference section 2.5) and the ACL extension's allow-lists
//! (section 4.1) with one small, strict proxy.
//!
//! Per connection ([`Router::run`]):
//!
//! 0. Admission: at most `max_connections` at once (one more is answered 503); of those, at
//!    most `max_pending` before their head is routed (steps 1 and 2). A connection beyond
//!    that evicts the oldest pending one (closed unanswered), so silent connections can
//!    never hold the places of tunnels, nor keep a newer client out.
//! 1. PROXY header, by the listener's `proxy_protocol` and the TCP peer: `"required"` takes
//!    connections only from its trusted load-balancer networks (anyone else is closed
//!    unread); `"from-trusted"` requires a header from the trusted networks and forbids one
//!    from everyone else, on the same port (an untrusted peer whose first bytes are `PROXY `
//!    or the version 2 signature is closed unanswered; one sending a plain CONNECT is served
//!    with its own address); `"off"` takes none. A header must be complete within the PROXY
//!    deadline, else the connection is closed; its source address becomes the client address.
//!    Every connection closed for its PROXY header is counted by reason.
//! 2. The CONNECT head, strictly parsed and complete within the header deadline
//!    (`netio::ingress`); a refusal is answered (400 / 405 / 408 / 414 / 431) and closed.
//!    These refusals, timeouts and evictions are logged at most once a second each (with the
//!    number left out), as a flood would repeat them; every one is counted.
//! 3. The routing decision against one snapshot of the [`Policy`] ([`Policy::decide`]):
//!    exactly one routing header under a name the listener honours, a valid value
//!    (`protocol::http::route`), an exact route, the connection admitted by the route's rules
//!    ([`access`]: always-allowed networks first, then the first matching rule, each judging
//!    the client address or the TCP peer as it says; no rules: anyone). Anything else: 400
//!    (403 for a denial), one log line, closed, no upstream connection, never a fallback
//!    route.
//! 4. Connect upstream (503 on failure, 504 on timeout), answer 200, forward the bytes the
//!    client sent after its head, relay both ways ([`relay`]: `netio::relay`, a half-close
//!    passed on in each direction, both sides shut after the idle timeout).
//!
//! A listener with `kind = "sni"` serves Gardener's TLS SNI passthrough port instead (the
//! Istio gateway's 443 → 9443, routed to the shoots' kube-apiservers; reference section
//! 2.5): steps 0 and 1 as above, then the ClientHello read without terminating TLS
//! ([`client_hello`]), its server name looked up exactly among the `[[sni_route]]` names and
//! judged by that route's rules (the same [`access`] model), then the buffered bytes and the
//! relay. Every refusal there is a close without an answer and without an upstream
//! connection ([`sni`]).
//!
//! Bytes after a refused head are never parsed or forwarded: they are read and discarded
//! (bounded) only so the client sees the answer rather than a reset.
//!
//! A connection's log lines carry its `router_conn` span: `peer` (the TCP peer) and
//! `listener` from the accept, `client` once the PROXY header (if any) is read, `route` once
//! decided.
//!
//! SIGHUP re-reads the config file: on success the routes, allow-lists and always-allowed
//! networks are replaced in one atomic swap (a request in flight keeps the snapshot it
//! started deciding with); a bad file is logged and the old policy stays. Listeners and
//! timeouts are fixed at start (a change to them is logged and needs a restart). A reload
//! never touches an open tunnel: it changes how new connections are decided, nothing else.
//!
//! # A config directory (`--config-dir DIR`)
//!
//! What a controller writes into a ConfigMap or Secret ([`config_dir`]): `DIR/seed.toml`
//! holds everything of the file below but the routes, and `DIR/<shoot>.toml` (e.g.
//! `shoot--p--a.toml`) holds that shoot's `[[route]]` tables, each of which must name the
//! shoot's namespace, so no file can claim another shoot's route, and its `[[sni_route]]`
//! tables, whose server names belong to the first file (or `seed.toml`) routing them: a
//! file claiming a name another routes is refused as a whole. Names starting with a dot
//! and names not ending in `.toml` are ignored; a Kubernetes volume is read through its
//! `..data` link, one version at a time. The directory is read every `[watch] poll_ms`
//! (default 1000) and on SIGHUP; a read that finds a file changed swaps in a new policy. A
//! refused shoot file is logged with its name and line and counted
//! (`vpn_router_config_file_ok`, `vpn_router_config_errors_total`), and that shoot keeps its
//! last good routes while the others change; a refused or removed `seed.toml` keeps the last
//! good seed settings; a removed shoot file removes its routes for new connections.
//! `vpn-router/examples/router.d/` is an example.
//!
//! # From Kubernetes (`--config FILE --kubernetes`)
//!
//! The routes, SNI routes and rules come from the objects Gardener and the ACL extension
//! create in the seed ([`kubernetes`]: Services, Istio Gateways and VirtualServices, the
//! ACL Extension with its Cluster and Infrastructure), watched and translated by each
//! replica itself; the file holds the rest (listeners, timeouts, trusted load balancers,
//! router-wide always-allowed networks, and any routes of its own, which win). A change is
//! in force for new connections within a fraction of a second ([`kubernetes::DEBOUNCE`]
//! after the watch event); `/readyz` waits for the first policy built from complete lists.
//!
//! # Metrics per shoot
//!
//! Beside the router-wide series, each configured shoot has its own, by flow (`vpn`,
//! `apiserver-proxy`, `kube-apiserver-socket`, `legacy`): tunnels opened and open, bytes each
//! way, refusals by reason ([`shoots`]; catalogue in `docs/metrics.md`).
//!
//! # Modules
//!
//! In layers, each using only those above it:
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`access`], [`client_hello`] | the rule model (who may use a route); the ClientHello parser (its server name) |
//! | `policy` | the routes and the decisions: [`Policy::decide`] (CONNECT), [`Policy::decide_sni`], their refusals |
//! | `config` | the TOML file parsed and checked into a [`RouterConfig`] and its [`Policy`] (`[[route]]` and `[[sni_route]]` tables alike) |
//! | [`config_dir`] | `--config-dir`: the directory read one version at a time, each file's last good version, the `vpn_router_config_*` series |
//! | [`kubernetes`] | `--kubernetes`: the routes and rules from Gardener's and the ACL extension's objects, watched; the `vpn_router_kube_*` series |
//! | [`shoots`] | the per-shoot series |
//! | `metrics` | the router's [`Counters`] (with the shoots', the files' and the SNI listeners') and `/metrics` |
//! | `conn` | what every connection shares: the router's state, the open tunnel and its [`relay`], the wait for its first bytes a newer connection may cut short, the upstream connect (within the timeout), a refused head counted and logged |
//! | `connect`, [`sni`] | a CONNECT listener's connection up to its open tunnel; an SNI listener's |
//! | `serve` | [`Router`]: listeners, admission, one task per connection, reloads ([`Reloader`]) |
//!
//! # Where it differs from Gardener's Istio gateway, and why
//!
//! Each difference is listed with its test in `conformance/DEVIATIONS.md` (R1 onwards).
//!
//! * A CONNECT without a usable routing header gets 400, and a non-CONNECT request 405 with
//!   `Allow: CONNECT`; Istio redirects both to https:443. A redirect is no answer a tunnel
//!   client can use, and the issue asks for 400 and never a fallback.
//! * Routing values are checked strictly (`protocol::http::route`): the namespace is one DNS
//!   label and the port must be the service's. Istio's expression accepts any text between
//!   the service name and `.svc.cluster.local`. The `<id>--kube-apiserver-socket` shape
//!   (Istio TLS termination) is a value like the others: routed where a route lists it.
//! * Routes are listed in the config, not derived from Services: a valid value without a
//!   route is 400.
//! * A listener with `proxy_protocol = "required"` accepts connections only from its trusted
//!   networks and only with a header; Istio's listener filter also accepts connections without
//!   one, which lets a client spoof its address (reference section 2.5). Hairpin traffic that
//!   bypasses the load balancer needs its own listener with `"off"`, or one listener with
//!   `"from-trusted"`: headers from the load balancers honoured, headers from anyone else
//!   refused as spoofing, plain requests from anyone else judged by their TCP peer.
//! * At most `max_pending` connections wait for their head; a newcomer beyond evicts the
//!   oldest. Envoy (Istio's gateway) has no bound of its own on connections before their
//!   request by default; a connection limit, where one is configured, refuses newcomers.
//! * Rules are keyed by the exact routing value (the ACL extension matches the header with
//!   `.<id>.` anchors); a route has any number of ordered ALLOW and DENY rules, each judging
//!   the PROXY source or the TCP peer (the ACL extension: one ALLOW rule per shoot); the
//!   always-allowed networks come before every rule, so a DENY cannot lock the nodes out.
//!
//! * On an SNI listener a ClientHello without a server name, or with one no `[[sni_route]]`
//!   lists, is closed: the same outcome as Envoy's `tls_inspector` finding no filter chain
//!   when the gateway has no default chain. The router also closes a hello with several
//!   host names (RFC 6066 forbids them) and one over its bound (16 KiB of ClientHello over
//!   at most 16 records), and routes by exact names only (no wildcard chains).
//!
//! # Config file (TOML)
//!
//! ```toml
//! # Networks that may reach every target whatever its rules say (seed nodes and pods,
//! # shoot nodes, egress NAT addresses, the operator's additional CIDRs), judged by the
//! # client address (the PROXY source when there is one) ...
//! always_allowed = ["10.250.0.0/16", "100.64.0.0/12"]
//! # ... and by the TCP peer (e.g. nodes whose hairpin traffic skips the load balancer).
//! always_allowed_peers = ["10.250.0.0/16"]
//! max_connections = 8192      # optional; one more is answered 503 and closed
//! max_pending = 1024          # optional; connections before their head is routed, within
//!                             # max_connections; one more evicts the oldest
//! metrics_listen = "127.0.0.1:15001"  # optional; plain-HTTP /metrics (series: src/metrics.rs),
//!                             # /healthz, /readyz (`netio::admin`)
//!
//! [timeouts]                  # optional, milliseconds; every limit and timeout is at least 1
//! proxy_header_ms = 5000      # PROXY header complete after accept
//! header_ms = 10000           # CONNECT head complete after accept
//! connect_ms = 5000           # upstream connect
//! idle_ms = 300000            # open tunnel with no bytes either way (Envoy's 5 min)
//!
//! [relay]                     # optional
//! buffer_size = 32768         # bytes per direction: the splice pipe size (4096..=1048576,
//!                             # rounded up to a power of two pages; fixed at start)
//!
//! [watch]                     # optional; used by --config-dir
//! poll_ms = 1000              # read the directory for changes this often (at least 10)
//!
//! [[listener]]
//! address = "0.0.0.0:8443"
//! headers = ["X-Gardener-Destination", "X-Gardener-API-Route"]
//! proxy_protocol = "required" # "from-trusted" (per source), or "off" (default)
//! trusted_proxies = ["10.180.0.0/16"]   # needed by "required" and "from-trusted",
//!                             # none with "off"
//!
//! [[listener]]
//! address = "0.0.0.0:8132"    # legacy port
//! headers = ["Reversed-VPN"]
//!
//! [[listener]]
//! address = "0.0.0.0:9443"    # TLS SNI passthrough (Istio's 443 -> 9443)
//! kind = "sni"                # "connect" (the default) or "sni"; "sni" takes no headers
//! proxy_protocol = "from-trusted"       # as on CONNECT listeners
//! trusted_proxies = ["10.180.0.0/16"]
//!
//! [[route]]
//! value = "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local"
//! upstream = "vpn-seed-server.shoot--p--a.svc.cluster.local:1194"
//! # Ordered rules, first match wins; with rules, a client no rule matches is denied;
//! # without any, every client may use the route.
//! [[route.rule]]
//! action = "deny"             # or "allow"
//! from = ["203.0.113.66"]     # CIDRs or addresses, IPv4 and IPv6
//! [[route.rule]]
//! action = "allow"
//! from = ["203.0.113.0/24", "2001:db8::/32"]
//! source = "proxy"            # the PROXY source, else the TCP peer (default);
//!                             # "peer": always the TCP peer
//!
//! [[route]]
//! value = "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local"
//! upstream = "10.0.12.7:443"
//! allow = ["203.0.113.0/24"]  # short for one allow rule with source "proxy"
//!                             # (not beside [[route.rule]])
//!
//! [[sni_route]]               # for kind = "sni" listeners
//! # Exact DNS names (ASCII case ignored; no wildcards; IDNs as xn-- A-labels), each in
//! # one sni_route only; e.g. a shoot's external and internal API names.
//! server_names = ["api.p-a.example.com", "api.p-a.internal.example.com"]
//! upstream = "kube-apiserver.shoot--p--a.svc.cluster.local:443"
//! allow = ["203.0.113.0/24"]  # or ordered [[sni_route.rule]] tables, as for [[route]]
//! shoot = "shoot--p--a"       # optional: whose vpn_router_shoot_* series (flow "sni")
//!                             # count it; in a --config-dir shoot file, that file's shoot
//! ```
//!
//! Unknown keys are errors. A `[[listener]]` on an IPv6 address also takes IPv4 clients (as
//! IPv4-mapped addresses; rules match them by their IPv4 address).
//! `vpn-router/examples/router.toml` is a complete example.

pub mod access;
pub mod client_hello;
mod config;
pub mod config_dir;
mod conn;
mod connect;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod kubernetes;
mod metrics;
mod policy;
mod serve;
pub mod shoots;
pub mod sni;

pub use config::{
    ConfigError, ListenerConfig, ListenerKind, RouterConfig, TomlError, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING,
};
pub use conn::relay;
pub use metrics::{ActiveTunnel, Counters, PendingHead, ProxyRefusal};
pub use policy::{Decision, Policy, Refusal, Target, ROUTING_HEADERS};
pub use serve::{Reloader, Router, RouterError};
