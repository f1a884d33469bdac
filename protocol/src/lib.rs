//! The OpenVPN 2.6 wire protocol in TCP mode, without I/O.
//!
//! This crate never opens a socket, reads a clock or touches a file. Bytes, tun packets and
//! time go in as arguments; bytes, packets and events come out. Randomness comes in through
//! one trait, [`rand_core::RngCore`] + [`rand_core::CryptoRng`], so tests run on seeded
//! generators. OpenSSL is used over memory buffers only.
//!
//! Layers, bottom up:
//!
//! | module | what it is |
//! |---|---|
//! | [`framing`] | the 2-byte length prefix of every packet on a TCP stream |
//! | [`ids`] | newtypes: session id, key id, message id, peer id |
//! | [`opcode`] | the opcode / key-id byte |
//! | [`packet`] | control packets with ACK lists and remote session id, early-negotiation TLVs |
//! | [`key`], [`static_key`] | the 256-byte two-key block, key directions, the static key file |
//! | [`digest`] | the `--auth` HMAC digests |
//! | [`packet_id`] | replay protection for data and control packet ids |
//! | [`wrap`] | control-channel protection: tls-auth (HMAC) and tls-crypt (v1) |
//! | [`reliable`] | the control channel's reliability layer: windows, ACKs, retransmission |
//! | [`tls`] | the control channel's TLS engine: OpenSSL over memory buffers, one record per message |
//! | [`kdf`] | data-channel key derivation: OpenVPN's TLS 1.0 PRF and the key mapping |
//! | [`data`] | the data channel: P_DATA_V1/V2 headers, AEAD and CBC+HMAC, pings, compression |
//! | [`km2`] | key method 2 inside TLS: the key-exchange messages, peer-info, the OCC options string |
//! | [`ncp`] | cipher negotiation and the protocol options a server pushes |
//! | [`control_msg`] | the NUL-terminated text messages inside TLS: `PUSH_REQUEST`, `AUTH_FAILED`, `RESTART`, ... |
//! | [`push`] | `PUSH_REPLY` building and continuation, the typed pushed options (parsed by the client, rendered by the server), pull-filter, strict mode |
//! | [`session`] | control-channel sessions: `ClientSession`, `ServerEndpoint`/`ServerSession`, key states, the packet link |
//! | [`http`] | the HTTP/1.x CONNECT request and response heads (client, proxy and router sides) |
//! | [`proxy_protocol`] | the PROXY protocol v1/v2 header a load balancer puts before a relayed TCP stream |
//! | [`config`] | OpenVPN config text (server, client, client-config-dir files) and the vpn2 environment variables, parsed into a typed model; typed config lines (a generated config such as vpn2's) read into it without text or rendered as text |
//!
//! The drivers (`vpn-server`, `vpn-client`) use [`session`]: its module docs hold the one
//! driving contract (`handle_*` in, commands, `poll_*` out, time as arguments). The I/O around
//! it, the same for both roles, is the `netio` crate (read its crate docs next).
//!
//! Every multi-byte integer on the wire is big-endian. Constants carry the name of the
//! OpenVPN symbol they mirror so behaviour can be looked up upstream.

pub mod config;
pub mod control_msg;
pub mod data;
pub mod digest;
pub mod framing;
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod http;
pub mod ids;
pub mod kdf;
pub mod key;
pub mod km2;
pub mod ncp;
pub mod opcode;
pub mod packet;
pub mod packet_id;
pub mod proxy_protocol;
pub mod push;
pub mod reliable;
pub mod session;
pub mod static_key;
pub mod tls;
pub mod wrap;

pub use rand_core::{CryptoRng, RngCore};
