//! `vpn-server`: the seed side. An OpenVPN-compatible TCP server ([`run`], [`Server`]); the
//! CONNECT sidecar and the ingress router come later.
//!
//! | module | what it is |
//! |---|---|
//! | [`settings`] | [`Settings`]: typed runtime settings (the config parser maps onto them) |
//! | [`pool`] | the unified IPv4/IPv6 client address pool (`server`, `server-ipv6`) |
//! | [`routing`] | prefix → client table with longest-prefix match, `client-to-client` |
//! | [`spoof`] | the source-address check on packets from clients |
//! | [`status`] | the `status-version 2` status file |
//! | [`server`] | the tokio runtime: listener, connections, tun device, status, shutdown |

pub mod pool;
pub mod routing;
pub mod server;
pub mod settings;
pub mod spoof;
pub mod status;

pub use server::{cancel_on_signals, run, ClientId, Server, ServerError, Stats};
pub use settings::{ClientOptions, IfconfigIpv6Push, IfconfigPush, Settings, StatusFile};
