//! `vpn-server`: the seed side. An OpenVPN-compatible TCP server ([`run`], [`Server`]) and the
//! CONNECT sidecar that replaces Envoy ([`sidecar`]). The ingress router is its own crate,
//! `vpn-router`.
//!
//! | module | what it is |
//! |---|---|
//! | [`settings`] | [`Settings`]: typed runtime settings (the config parser maps onto them) |
//! | [`config`] | config file / vpn2 environment → [`Settings`]; the only place files are read |
//! | [`script`] | `up` / `down` commands with upstream's arguments and environment |
//! | [`pool`] | the unified IPv4/IPv6 client address pool (`server`, `server-ipv6`) |
//! | [`routing`] | prefix → client table with longest-prefix match, `client-to-client` |
//! | [`spoof`] | the source-address check on packets from clients |
//! | [`status`] | the `status-version 2` status file |
//! | [`unreachable`](mod@unreachable) | ICMP "destination unreachable" for tun packets no client routes |
//! | [`server`] | the tokio runtime: listener, connections, tun device, status, shutdown |
//! | [`sidecar`] | the mTLS HTTP CONNECT sidecar (in-process or `vpn-server sidecar`) |

pub mod config;
pub mod connection;
pub mod device;
pub mod launch;
pub mod metrics;
pub mod pool;
pub mod registry;
pub mod routing;
pub mod script;
pub mod server;
pub mod settings;
pub mod sidecar;
pub mod spoof;
pub mod status;
pub mod unreachable;

pub use config::{from_options, from_vpn2_env, load_file, LoadError, Loaded};
pub use metrics::ServerMetrics;
pub use registry::ClientId;
pub use script::{Script, ScriptError, ScriptParseError};
pub use server::{run, ClientRoutes, Server, ServerError};
pub use settings::{ClientOptions, IfconfigIpv6Push, IfconfigPush, Settings, StatusFile};
