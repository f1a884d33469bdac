//! The tokio I/O shared by `vpn-server`, `vpn-client` and `vpn-router`: everything between the
//! sans-IO `protocol` crate and the kernel, written once for every role.
//!
//! A packet's way through here: the socket's bytes become packets in [`framed::FrameReader`],
//! the session decrypts them in place, and [`tun::TunWriter`] writes them into the device; the
//! other way, [`tun::Tun::recv_many`] reads packets into pooled buffers with headroom, the
//! session encrypts them in place, and [`framed::FrameWriter`] writes them to the socket in
//! one vectored write. [`pump::Pump`] runs those steps and the session's timers for both
//! roles; which driver file supplies the rest (the tun side, the events): the crate docs of
//! `vpn-server` and `vpn-client`.
//!
//! * [`pump`] - the session pump: one connection's loop for both roles (transmit, events,
//!   timers, batched receive and send) after the sessions' driving contract; the role
//!   ([`pump::Role`]) handles its own inputs, the events and the decrypted packets.
//! * [`tun`] - a layer-3 tun device under tokio with the kernel's TCP offloads: super-packets
//!   read are cut into MTU-sized packets in caller buffers with headroom for in-place
//!   encryption, consecutive segments of a flow are merged into one write; the writer thread
//!   every decrypted packet goes through ([`tun::TunWriter`]). [`tun::Tun::open_tap`] opens a
//!   layer-2 tap device through the same calls (Ethernet frames, no offloads).
//! * [`netlink`] - link state, MTU, txqueuelen, addresses and routes over rtnetlink, in the
//!   network namespace of the calling thread.
//! * [`framed`] - one connection's two directions for both roles: packets cut out of the
//!   socket's stream ([`framed::FrameReader`]) and queued packets written together with one
//!   vectored write ([`framed::FrameWriter`]).
//! * [`tcp`] - connects with `TCP_NODELAY`, the first-address-that-answers connect, a read of
//!   what has arrived that never waits.
//! * [`http`] - re-export of [`protocol::http`], the CONNECT heads without I/O.
//! * [`http_connect`] - the CONNECT dialer (client through a proxy).
//! * [`ingress`] - the ingress side of one connection: optional PROXY header (trusted load
//!   balancers only), strict CONNECT head under a deadline, the client address to judge, and
//!   configured networks in the form that address is compared in (`canonical_net`).
//! * [`firewall`] - firewall and NAT rules in nf_tables over netlink: one table of ours,
//!   replaced atomically, optionally owned by the process (gone when it ends); the restart
//!   guard (`RestartGuard`: SYNs to a listener's port dropped, not refused, while its process
//!   restarts).
//! * [`relay`] - the bidirectional byte relay of every proxy: half-close both ways, idle
//!   timeout, byte counts, fixed buffers; `relay_tcp` does the same for two TCP sockets with
//!   `splice(2)` (zero-copy) on Linux.
//! * [`script`] - the `up` / `down` hooks: splitting the command, upstream's arguments and
//!   common variables, running it.
//!
//! What every binary needs around its sessions, in one place each:
//!
//! * [`admin`] - the admin HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) and the
//!   Prometheus text every binary's metrics module writes.
//! * [`listen`] - listening sockets (`[::]` beside `0.0.0.0`) and the accept step of every
//!   server loop.
//! * [`log_limit`] - one log line per interval for events a flood repeats, with the count
//!   left out.
//! * [`signals`] - SIGTERM / SIGINT as a cancelled token; SIGHUP as an action of the caller's.
//! * [`clock`] - the wall-clock seconds the sessions take as an argument.
//! * [`rng`] - a session's CSPRNG, seeded from the OS once.
//! * [`report`] - an error and its causes on one line; a refused value quoted by a prefix.
//! * [`sysctl`] - kernel parameters by name (the init containers' settings).
//! * [`logging`] - the log subscriber of the binaries.
//! * [`volume`] - a directory's files read as one version (a Kubernetes ConfigMap or Secret
//!   volume and its `..data` swaps, or a plain directory): the router's `--config-dir`, the
//!   cloud-api client's connection files; a read bounded per file, and one file read bounded.
//! * [`libm_pow`] - `pow(3)` defined in a binary, so it does not load `libm.so.6`.

pub use protocol::http;
pub mod admin;
pub mod clock;
pub mod firewall;
pub mod framed;
pub mod http_connect;
pub mod ingress;
pub mod libm_pow;
pub mod listen;
pub mod log_limit;
pub mod logging;
pub mod netlink;
pub mod pump;
mod reactor;
pub mod relay;
pub mod report;
pub mod rng;
pub mod script;
pub mod signals;
pub mod sysctl;
pub mod tcp;
pub mod tun;
pub mod volume;
