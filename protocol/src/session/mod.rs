//! Control-channel sessions: the state machines that run a whole OpenVPN session over one TCP
//! connection (hard reset, TLS, key-method 2, key derivation, push, keepalive,
//! renegotiation), without I/O.
//!
//! | type | what it is |
//! |---|---|
//! | [`ClientSession`] | the client of one connection |
//! | [`ServerEndpoint`] | shared server configuration; hands out peer ids and [`ServerSession`]s |
//! | [`ServerSession`] | the server side of one connection |
//! | [`link`] | the control packets of a connection: wrap, parse, session-id checks |
//! | `key_state` | one key generation: reliability, TLS, key-method 2, data key |
//!
//! # Driving contract (both [`ClientSession`] and [`ServerSession`])
//!
//! The driver owns the socket, the tun device and the clock. It frames the TCP stream with
//! [`framing::FrameDecoder`](crate::framing::FrameDecoder) and talks to the session through
//! three groups of methods, after quinn-proto's `Connection`:
//!
//! - **Input** (`handle_*`):
//!   - `handle_packet(now, packet)`: one decoded frame (without its length
//!     prefix). Control packets go through the [`link`] to their key state. A data packet is
//!     decrypted **in place** and its tun payload returned as `Ok(Some(buf))`; pings and OCC
//!     messages are swallowed (`Ok(None)`) but count as received traffic. `Err` means the
//!     packet was dropped ([`SessionError`]); only [`SessionError::Fatal`] ended the session.
//!   - `handle_timeout(now)`: when the instant from `poll_timeout` has passed.
//! - **Commands**: `send_tun_packet(now, buf, offset)` encrypts a tun packet in place into
//!   one *framed* wire packet (the driver writes `buf` as is); reserve [`SEND_HEADROOM`]
//!   bytes in front of the payload and [`DATA_TAILROOM`](crate::data::DATA_TAILROOM) behind
//!   it so nothing is copied. `renegotiate(now)`, `close(now)`; server only:
//!   [`ServerSession::accept_client`] / [`ServerSession::reject_client`] after
//!   [`Event::ClientIdentified`].
//! - **Output** (`poll_*`), after every input or command, in this order:
//!   1. `poll_transmit(now, unix_secs)` until `None`: framed control packets (and pings),
//!      several coalesced into one buffer; write them to the socket;
//!   2. `poll_event()` until `None`;
//!   3. `poll_timeout()`: when to call `handle_timeout` next (`None`: no timer).
//!
//! `now` must never go backwards. `unix_secs` (of `poll_transmit` only) is wall-clock time for
//! the replay ids of tls-auth/tls-crypt. Randomness (session ids, key-method-2 randoms, CBC IVs) comes from
//! the `RngCore + CryptoRng` given at construction. After [`Event::Closed`], poll
//! `poll_transmit` once more (e.g. `AUTH_FAILED` or an ACK), then drop the session and the
//! connection.
//!
//! # Policies
//!
//! * **Sending across a key switch.** Data is sent with the newest key once it is *active*:
//!   its data key exists here and every control message we sent on it was acknowledged, so
//!   the peer has processed our key-method-2 message and holds the key too. Until then the
//!   lame-duck key keeps sending. Received packets are decrypted by whichever live key has
//!   their key id; a key id with no data key is dropped silently ([`SessionError::NoKey`]).
//! * **Lame duck.** A soft reset (ours or the peer's) moves the current key to lame duck; it
//!   decrypts until `tran-window` after the reset or the next soft reset replaces it.
//! * **Renegotiation** starts when the current key has its data key and `reneg-sec` (drawn
//!   once per session from its RNG between `MIN` and `MAX`; without `MIN` a server takes
//!   0..10% off at random, a client none: [`reneg_interval`]), `reneg-bytes`, `reneg-pkts` or the packet-id trigger is
//!   reached, or on `renegotiate`. A peer's soft reset is answered only in the same state.
//!   Key ids go 1..=7 and wrap to 1.
//! * **hand-window** bounds every key negotiation (until both key-method-2 messages are
//!   exchanged); unlike upstream, a failed renegotiation ends the session instead of falling
//!   back to the lame duck until it expires.
//! * A fatal TLS, key-method-2 or data-channel error ends the session (TCP mode restarts the
//!   connection on those upstream too).

mod client;
mod config;
mod conn;
mod event;
mod key_state;
pub mod link;
mod server;
mod timers;

pub use client::ClientSession;
pub use config::reneg_interval;
pub use config::{
    ClientConfig, ControlProtection, Keepalive, ServerConfig, SessionConfig, DEFAULT_HAND_WINDOW,
    DEFAULT_RENEG_SEC, DEFAULT_TRAN_WINDOW, PUSH_REQUEST_INTERVAL,
};
pub use event::{ClientIdentity, CloseReason, Connected, Event, SessionError};
pub use server::{
    ClientSettings, ServerEndpoint, ServerSession, AUTH_FAILED_LINGER, PUSH_REQUEST_IGNORE,
};

/// Headroom a caller reserves in front of a tun payload for
/// [`ClientSession::send_tun_packet`]: the data channel's
/// [`DATA_HEADROOM`](crate::data::DATA_HEADROOM) (compression framing, header, HMAC, IV,
/// packet id) plus the 2-byte TCP length prefix.
pub const SEND_HEADROOM: usize = crate::data::DATA_HEADROOM + crate::framing::LENGTH_PREFIX_LEN;

#[cfg(test)]
mod tests;
