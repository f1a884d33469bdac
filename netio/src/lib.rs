//! The tokio I/O shared by `vpn-server` and `vpn-client`.
//!
//! * [`tun`] - a layer-3 tun device under tokio with the kernel's TCP offloads: super-packets
//!   read are cut into MTU-sized packets in caller buffers with headroom for in-place
//!   encryption, consecutive segments of a flow are merged into one write.
//! * [`netlink`] - link state, MTU, txqueuelen, addresses and routes over rtnetlink, in the
//!   network namespace of the calling thread.
//! * [`transport`] - the framed OpenVPN TCP transport (`TCP_NODELAY`, split halves).
//! * [`http`] - re-export of [`protocol::http`], the CONNECT heads without I/O.
//! * [`http_connect`] - the CONNECT dialer (client through a proxy) and a small CONNECT
//!   acceptor (proxy side, for tests and the demo).
//! * [`ingress`] - the ingress side of one connection: optional PROXY header (trusted load
//!   balancers only), strict CONNECT head under a deadline, the client address to judge.
//! * [`relay`] - the bidirectional byte relay of every proxy: half-close both ways, idle
//!   timeout, byte counts, fixed buffers; `relay_tcp` does the same for two TCP sockets with
//!   `splice(2)` (zero-copy) on Linux.
//! * [`script`] - the `up` / `down` hooks: splitting the command, upstream's arguments and
//!   common variables, running it.
//!
//! What every binary needs around its sessions, in one place each:
//!
//! * [`listen`] - listening sockets (`[::]` beside `0.0.0.0`) and the accept step of every
//!   server loop.
//! * [`signals`] - SIGTERM / SIGINT as a cancelled token.
//! * [`clock`] - the wall-clock seconds the sessions take as an argument.
//! * [`rng`] - a session's CSPRNG, seeded from the OS once.
//! * [`report`] - an error and its causes on one line.
//! * [`logging`] - the log subscriber of the binaries.
//! * [`libm_pow`] - `pow(3)` defined in a binary, so it does not load `libm.so.6`.

pub use protocol::http;
pub mod clock;
pub mod http_connect;
pub mod ingress;
pub mod libm_pow;
pub mod listen;
pub mod logging;
pub mod netlink;
mod reactor;
pub mod relay;
pub mod report;
pub mod rng;
pub mod script;
pub mod signals;
#[cfg(target_os = "linux")]
mod splice;
pub mod transport;
pub mod tun;
