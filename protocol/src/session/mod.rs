//! Control-channel sessions: the state machines that run a whole OpenVPN session over the
//! wire layer (hard reset, TLS, key-method 2, key derivation, push, keepalive, renegotiation).
//!
//! Being built in parts; [`link`] is the packet layer every session stands on.

pub mod link;

#[cfg(test)]
mod tests;
