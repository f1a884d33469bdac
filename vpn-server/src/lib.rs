//! `vpn-server`: the seed side. An OpenVPN-compatible TCP server ([`run`], [`Server`]); the
//! binary also runs the CONNECT sidecar that replaces Envoy, in this process or alone, and
//! its Envoy mode: they are the `sidecar` crate, which this one hands its client routes
//! ([`ClientRoutes`] as `sidecar::RouteCheck`, in [`launch`]). The ingress router is its own
//! crate, `vpn-router`.
//!
//! The binary also answers Gardener's other calls into the vpn2 `vpn-server` image:
//!
//! | verb | what | inputs | exit |
//! |---|---|---|---|
//! | `vpn-server readiness` | exec readiness probe of `vpn-seed-server` ([`probes`]) | vpn2 env (`OPENVPN_STATUS_PATH`; `IS_HA`, `POD_NAME`, `HA_VPN_CLIENTS`), the status file | 0 ready; 1 with the reason on stdout |
//! | `vpn-server liveness` | exec liveness probe: the status file's `TIME` at most 17 s old ([`probes`]) | the same | 0 alive; 1 with the reason on stdout |
//! | `vpn-server exporter` | the HA `openvpn-exporter` container: `/metrics` on port 15000 ([`exporter`]) | `OPENVPN_STATUS_PATH`, `/proc/net/snmp`, `--listen` | runs until SIGTERM / SIGINT (0); 1 if the environment is invalid or a listener cannot be bound |
//! | `envoy` (a link to the binary; or `vpn-server envoy`) | Envoy mode, Gardener's `envoy-proxy` image: the VPN pods' CONNECT sidecar, or the shoot's apiserver-proxy DaemonSet (`sidecar::apiserver_proxy` with Envoy's series and `/ready`), whichever the bootstrap file's structure is (`sidecar::envoy`) | `-c envoy.yaml`, `--concurrency`, `--log-level` | runs until SIGTERM / SIGINT (0); 1 naming the file, line and path of what it cannot honour; 2 for a flag Envoy mode does not take |
//!
//! # A packet's way, file by file
//!
//! Shoot → seed (a client's packet into the seed):
//!
//! | step | where |
//! |---|---|
//! | accept, `max-clients` slot, the connection's task and span | [`server`] (accept loop), [`connection`] (`serve`) |
//! | socket → framed packets (length limit from the MTU) | [`netio::framed::FrameReader`], read in batches by the session pump ([`netio::pump`]) |
//! | packet → decrypted payload (in place), or control traffic | `protocol::session::ServerSession::handle_packet` |
//! | admission on `ClientIdentified`: CCD, addresses, iroutes | [`registry::Registry::admit`] |
//! | source check (anti-spoofing) | [`spoof::SourceFilter`], called by the packet mode (`shared::mode`, `PacketMode::forward_from_client`) for [`connection`] |
//! | payload → tun device (writer thread, lone-packet shortcut) or, with `client-to-client`, another client's queue | [`netio::tun::TunWriter`]; [`registry::Registry::forward`] |
//!
//! Seed → shoot (a packet from the tun device to a client):
//!
//! | step | where |
//! |---|---|
//! | tun → packets (batches, offloads cut to the MTU) | [`netio::tun::Tun::recv_many`] in [`device`] (`read_loop`) |
//! | destination → the client owning the longest prefix (address or iroute) | the packet mode (`PacketMode::forward_from_device`), [`registry::Registry::route`] ([`routing`]) |
//! | no client: ICMP unreachable to the sender | [`unreachable`](mod@unreachable) |
//! | the client's queue → encrypted framed packet (in place) | [`connection`] (its `Queued` input), [`netio::pump::Pump::send_tun_packets`], `ServerSession::send_tun_packet` |
//! | framed packets → socket (one vectored write) | [`netio::framed::FrameWriter`] |
//!
//! The packet mode, chosen once when the server binds (`shared::mode`), decides both ways in
//! one method each. Routed (`dev tun`) is the way above. Switched (`dev tap`): the payloads
//! are Ethernet frames; instead of the source check and the routing table, [`switch`] learns
//! each client's MAC addresses and picks the client, all clients (broadcast), or the tap
//! device ([`registry::Registry::switch_from_client`], [`registry::Registry::switch_from_tap`]).
//! HA: no device; [`ha`] switches each packet between kube-apiserver and shoot connections
//! ([`registry::Registry::switch_ha`]).
//!
//! Around them: [`config`] and [`settings`] (what to run), [`launch`] (the process: server,
//! in-process sidecar, admin endpoint, `up`/`down` [`script`]s), [`device`] (the tun set-up),
//! [`status`] (the status file), [`metrics`] (counters and series, `docs/metrics.md`).
//!
//! | module | what it is |
//! |---|---|
//! | [`settings`] | [`Settings`]: typed runtime settings (the config parser maps onto them) |
//! | [`config`] | config file / vpn2 environment (its typed lines, [`config::vpn2_lines`]) → [`Settings`]; the only place files are read |
//! | [`launch`] | what the binary runs: server, in-process sidecar, admin endpoint, `up` / `down` |
//! | [`drain`] | after SIGTERM in Gardener's pod: the tunnel stays while the pod's other processes (the sidecar) have TCP connections open |
//! | [`server`] | the composition root: binds (device, listeners) and builds the shared state; one task per connection, the tun reader, status writer, shutdown |
//! | `shared` | what every task of one server shares (settings, packet mode, endpoint, registry, counters, device, slots) and `lock`; imports none of the tasks' modules |
//! | `shared::mode` | the packet mode (routed, switched, HA), chosen once at bind: a packet's way from a client and from the device |
//! | [`connection`] | one client's connection inside its span: the server's role in netio's session pump (its inputs, events, deadlines) |
//! | [`registry`] | pool, routing table and clients; `max-clients` and admission; packets held for reconnecting clients ([`registry::hold`]) (pure) |
//! | [`device`] | the tun device's set-up and reader (and the held packets' bound) |
//! | [`metrics`] | the server's counters and their Prometheus series |
//! | [`script`] | `up` / `down` commands with upstream's arguments and environment |
//! | [`pool`] | the unified IPv4/IPv6 client address pool (`server`, `server-ipv6`) |
//! | [`routing`] | prefix → client table with longest-prefix match, `client-to-client` |
//! | [`spoof`] | the source-address check on packets from clients |
//! | [`ha`] | the HA server's packet switch between kube-apiserver and shoot connections (`docs/ha.md`): HA mode opens no device |
//! | [`switch`] | tap mode: MAC learning and where a frame goes (unicast, flood, drop) |
//! | [`gateway`] | HA: our layer-3 kube-apiservers as vpn2 kube-apiserver pods towards vpn2's layer-2 shoot pods (identity, NDP, hellos, IPv6 encapsulation), and vpn2's kube-apiservers towards our shoot pods, pure; the registry keeps it, the packet mode feeds it |
//! | [`status`] | the `status-version 2` status file; [`status::read`] reads it as vpn2's probes do |
//! | [`probes`] | `vpn-server readiness` / `liveness` |
//! | [`exporter`] | `vpn-server exporter`: kumina's and vpn2's series from the status file |
//! | [`unreachable`](mod@unreachable) | ICMP "destination unreachable" for tun packets no client routes (or held past the bound) |
//! | [`vpn2`] | vpn2's drop-in verbs and rules: `setup`, `firewall`, the env-mode firewall table |

pub mod cloud_api;
pub mod config;
pub mod connection;
pub mod device;
pub mod drain;
pub mod exporter;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod gateway;
pub mod ha;
pub mod launch;
pub mod metrics;
pub mod pool;
pub mod probes;
pub mod registry;
pub mod routing;
pub mod script;
pub mod server;
pub mod settings;
mod shared;
pub mod spoof;
pub mod status;
pub mod switch;
pub mod unreachable;
pub mod vpn2;

pub use config::{from_options, from_vpn2_env, load_file, LoadError, Loaded};
pub use metrics::ServerMetrics;
pub use registry::ClientId;
pub use script::{Script, ScriptError, ScriptParseError};
pub use server::{run, ClientRoutes, Server, ServerError};
pub use settings::{
    ClientOptions, HaSettings, IfconfigIpv6Push, IfconfigPush, Settings, StatusFile,
};
