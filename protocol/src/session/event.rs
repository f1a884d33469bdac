//! What a session tells its driver ([`Event`]), why it ended ([`CloseReason`]) and why a
//! packet was dropped ([`SessionError`]).

use std::time::Duration;

use crate::control_msg::{ControlMsgError, ServerSignal};
use crate::data::{DataCipher, DataError};
use crate::ids::{KeyId, PeerId};
use crate::km2::occ::DevTypeMismatch;
use crate::km2::peer_info::{MalformedLine, PeerInfo};
use crate::km2::Km2Error;
use crate::ncp::{ClientNcpError, NoSharedCipher};
use crate::push::{PushError, PushOutcome};
use crate::tls::TlsError;

use super::link::LinkError;

/// Something the driver must know or act on. Polled with `poll_event`.
#[derive(Debug)]
pub enum Event {
    /// Server only: the client finished TLS and key-method 2. Look at its identity, then call
    /// `accept_client` or `reject_client`.
    ClientIdentified(ClientIdentity),
    /// The tunnel is up: data keys exist. The client gets it after applying `PUSH_REPLY`, the
    /// server after sending it.
    Connected(Connected),
    /// A soft reset completed: a new key generation carries the data from now on.
    KeyRenegotiated {
        /// The new key id.
        key_id: KeyId,
    },
    /// The peer sent a text control message that is dropped, as upstream drops it (a control
    /// character, not UTF-8, no terminating NUL); the session goes on. Only this event tells:
    /// a dropped `PUSH_REPLY` otherwise ends as [`CloseReason::NoPushReply`]. Drivers log it
    /// (rate-limited: the peer decides how often).
    ControlMessageDropped(ControlMsgError),
    /// The session is over; nothing more will be received. Packets already queued can still
    /// be polled (e.g. `AUTH_FAILED` to the client), then drop the session and its connection.
    Closed(CloseReason),
}

/// The client as the server sees it after key-method 2. `Debug` shows neither the password
/// nor the certificate bytes.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The common name of the client's leaf certificate, if it has one.
    pub common_name: Option<String>,
    /// The DER of the client's leaf certificate.
    pub certificate_der: Option<Vec<u8>>,
    /// `--auth-user-pass` username, if sent.
    pub username: Option<Vec<u8>>,
    /// `--auth-user-pass` password, if sent.
    pub password: Option<Vec<u8>>,
    /// The client's peer-info (`IV_*`), as parsed.
    pub peer_info: PeerInfo,
    /// Peer-info lines that were ignored (malformed, control characters, repeated keys), for
    /// the driver to count and log; their `Display` escapes what they hold.
    pub peer_info_ignored: Vec<MalformedLine>,
    /// The client's OCC options string.
    pub options: String,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("common_name", &self.common_name)
            .field(
                "username",
                &self.username.as_deref().map(String::from_utf8_lossy),
            )
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("peer_info", &self.peer_info)
            .field("peer_info_ignored", &self.peer_info_ignored.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What a session settled when the tunnel came up.
#[derive(Debug, Clone)]
pub struct Connected {
    /// The data-channel cipher.
    pub cipher: DataCipher,
    /// The peer id in P_DATA_V2 headers, `None` for P_DATA_V1.
    pub peer_id: Option<PeerId>,
    /// Data keys from the TLS exporter (`tls-ekm`) rather than the PRF.
    pub tls_ekm: bool,
    /// Renegotiations are wrapped with dynamic tls-crypt.
    pub dyn_tls_crypt: bool,
    /// Client: the pushed options that passed the pull policy, and the dropped ones with
    /// their reasons. Server: the options it pushed, as typed by the same parser.
    pub push: PushOutcome,
    /// The client's identity (server only).
    pub client: Option<ClientIdentity>,
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum CloseReason {
    /// The driver called `close`.
    #[error("closed locally")]
    Local,
    /// The server sent `AUTH_FAILED` (client), or the application rejected the client
    /// (server; the reason was sent to the client).
    #[error("authentication failed: {reason:?}")]
    AuthFailed {
        /// The text after `AUTH_FAILED,`, if any.
        reason: Option<String>,
    },
    /// The server sent `RESTART`: reconnect.
    #[error("server requested restart: {0:?}")]
    Restart(ServerSignal),
    /// The server sent `HALT`: do not reconnect.
    #[error("server requested halt: {0:?}")]
    Halt(ServerSignal),
    /// The peer sent `EXIT` (or an OCC exit).
    #[error("peer exited")]
    PeerExit,
    /// `ping-restart`: nothing was received for this long.
    #[error("ping-restart: nothing received for {0:?}")]
    PingRestart(Duration),
    /// A key negotiation did not finish within `hand-window`.
    #[error("key negotiation for key id {} did not finish within hand-window", .key_id.get())]
    HandWindowExpired {
        /// The key id being negotiated.
        key_id: KeyId,
    },
    /// Client: the server's OCC options string names the other `dev-type` (`tap` against our
    /// `tun` or the other way round): its packets could not cross, so the session ends before
    /// `PUSH_REQUEST` (conformance/DEVIATIONS.md W4).
    #[error("the server's device type is not ours")]
    DevTypeMismatch(#[source] DevTypeMismatch),
    /// The client got no `PUSH_REPLY` within `hand-window`.
    #[error("no PUSH_REPLY within hand-window")]
    NoPushReply,
    /// The TLS session failed; a refused peer certificate is
    /// [`TlsError::PeerRejected`].
    #[error("TLS failed on key id {}", .key_id.get())]
    Tls {
        /// The key id.
        key_id: KeyId,
        /// What failed.
        #[source]
        source: TlsError,
    },
    /// The peer's key-method-2 message could not be read.
    #[error("bad key-method-2 message")]
    KeyMethod(#[source] Km2Error),
    /// The pull policy rejected the push (`pull-filter reject`).
    #[error("push refused")]
    PushRejected(#[source] PushError),
    /// The client could not accept the server's cipher.
    #[error("cipher negotiation failed")]
    ClientCipher(#[source] ClientNcpError),
    /// The server found no cipher shared with the client (`AUTH_FAILED` sent).
    #[error("cipher negotiation failed")]
    NoSharedCipher(#[source] NoSharedCipher),
    /// Data keys could not be made.
    #[error("data channel key setup failed")]
    DataKey(#[source] DataError),
    /// A received data packet failed in a way that ends a TCP session ("fatal decryption
    /// error").
    #[error("fatal data channel error")]
    Data(#[source] DataError),
    /// A control packet could not be built (an invariant broke, or packet ids ran out).
    #[error("control channel failure")]
    Link(#[source] LinkError),
    /// The peer broke the protocol in a way we cannot recover from.
    #[error("protocol violation: {what}")]
    Protocol {
        /// What happened.
        what: &'static str,
    },
}

/// Why `handle_packet` or `send_tun_packet` did nothing with a packet. None of these ends the
/// session by itself; a fatal condition also produces [`Event::Closed`].
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A control packet failed the link checks (authentication, replay, session ids).
    #[error("control packet dropped")]
    Link(#[source] LinkError),
    /// A data packet for a key id that has no data key (yet, or any more).
    #[error("no data key for key id {}", .key_id.get())]
    NoKey {
        /// The key id.
        key_id: KeyId,
    },
    /// No data key exists yet to send with.
    #[error("no data key to send with")]
    NotConnected,
    /// A data packet could not be opened or built.
    #[error("data packet dropped")]
    Data(#[source] DataError),
    /// A control packet for a key id no key state has.
    #[error("control packet for unknown key id {}", .key_id.get())]
    UnknownKeyId {
        /// The key id.
        key_id: KeyId,
    },
    /// The session is closed.
    #[error("session closed")]
    Closed,
    /// The packet ended the session (see the [`Event::Closed`] that follows).
    #[error("packet ended the session")]
    Fatal,
}
