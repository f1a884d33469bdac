//! The control channel's TLS engine: OpenSSL over memory buffers, never a socket.
//!
//! A [`TlsSession`] is an encrypted pipe. On one side go TLS bytes: the in-order payloads of
//! P_CONTROL_V1 packets as the reliability layer delivers them, and the ciphertext it cuts into
//! new P_CONTROL_V1 payloads (reference 4.4). On the other side go plaintext control messages:
//! the key-method-2 message and the NUL-terminated text messages (reference 6, 6.5, 10.1).
//!
//! ```text
//!   reliability layer                 TlsSession                      control messages
//!  ------------------  feed_ciphertext  +---------+  poll_plaintext   ------------------
//!  in-order payloads  ----------------> | OpenSSL | ----------------> km2, PUSH_REPLY, ...
//!  P_CONTROL_V1 data  <---------------- | memory  | <----------------
//!                      poll_ciphertext  +---------+   write_message
//! ```
//!
//! # What OpenSSL does and what the caller does
//!
//! The caller builds the [`SslContext`](openssl::ssl::SslContext) with OpenVPN's settings
//! (reference 5.1: TLS 1.2 minimum, ECDHE only, no tickets, no renegotiation, the CA store,
//! `PEER | FAIL_IF_NO_PEER_CERT` on a server). OpenSSL validates the peer's chain against that
//! store. The identity checks OpenVPN applies to the leaf certificate (`remote-cert-tls`,
//! `verify-x509-name`, reference 5.2 and 5.3) run behind the [`PeerVerifier`] trait, from
//! OpenSSL's verify callback at depth 0, so a refusal aborts the handshake there and the peer
//! gets an alert, as with OpenVPN. There is no hostname check at TLS level and the client sends
//! no SNI.
//!
//! Each key id of an OpenVPN session runs its own, brand-new TLS session (reference 12.3): make
//! a new `TlsSession` for every key id; TLS-level renegotiation is never used.
//!
//! # Records
//!
//! OpenVPN reads TLS plaintext one record at a time and treats each read as a unit (reference
//! 6.5), so [`TlsSession::write_message`] puts each message into exactly one TLS record (one
//! `SSL_write`; messages are limited to [`TLS_CHANNEL_BUF_SIZE`] bytes, well under the 16 KiB
//! record limit, and the memory transport never fails a write halfway). On the receiving side
//! OpenSSL returns at most one record per read; [`TlsSession::poll_plaintext`] hands out one
//! record's plaintext per call. Consumers should still parse the plaintext as a byte stream
//! (km2 by its length fields, text at NUL), as peers other than OpenVPN may coalesce.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Buf, Bytes, BytesMut};
use openssl::error::ErrorStack;
use openssl::ssl::{self, ErrorCode, Ssl, SslContextRef, SslStream, SslVersion};
use openssl::x509::{X509NameRef, X509Ref, X509StoreContextRef, X509VerifyResult, X509};

use crate::key::{Key2, Role, KEY2_LEN};

/// Largest plaintext control message, NUL included (`TLS_CHANNEL_BUF_SIZE`): OpenVPN reads TLS
/// plaintext into a buffer of this size.
pub use crate::reliable::TLS_CHANNEL_BUF_SIZE;

/// Exporter label of the dynamic tls-crypt key (`EXPORT_DYNAMIC_TLS_CRYPT_LABEL`, reference
/// 12.4), used with no context and [`KEY2_LEN`] bytes of output.
pub const EXPORT_DYNAMIC_TLS_CRYPT_LABEL: &str = "EXPORTER-OpenVPN-dynamic-tls-crypt";

/// Largest plaintext of one TLS record (`SSL3_RT_MAX_PLAIN_LENGTH`): the read buffer size, so a
/// read never splits a record.
const MAX_RECORD_PLAINTEXT: usize = 16 * 1024;

/// The identity check applied to the peer's leaf certificate (depth 0) once OpenSSL has
/// validated its chain: OpenVPN's `remote-cert-tls`, `remote-cert-ku`, `remote-cert-eku` and
/// `verify-x509-name`.
///
/// [`TlsSession`] calls it from OpenSSL's verify callback, during the handshake, only when the
/// chain itself verified. If the caller's context does not ask OpenSSL to verify the peer
/// (`SslVerifyMode::NONE`) but the peer sent a certificate anyway, the session calls it when
/// the handshake completes instead. A server that does not request client certificates never
/// calls it.
pub trait PeerVerifier: Send + Sync + fmt::Debug {
    /// Accepts or refuses the peer's leaf certificate. Runs inside an OpenSSL callback: it
    /// must not panic.
    fn verify_peer(&self, leaf: &X509Ref) -> Result<(), PeerCertError>;
}

/// A [`PeerVerifier`] that accepts every certificate whose chain OpenSSL accepted (OpenVPN
/// without `remote-cert-tls` or `verify-x509-name`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAnyPeer;

impl PeerVerifier for AcceptAnyPeer {
    fn verify_peer(&self, _leaf: &X509Ref) -> Result<(), PeerCertError> {
        Ok(())
    }
}

/// Why a [`PeerVerifier`] refused the peer's leaf certificate.
#[derive(Debug, thiserror::Error)]
pub enum PeerCertError {
    /// `remote-cert-tls` / `remote-cert-ku`: the certificate has no keyUsage extension.
    #[error("peer certificate has no keyUsage extension")]
    MissingKeyUsage,
    /// `remote-cert-ku`: the keyUsage bits match none of the required values.
    #[error(
        "peer certificate keyUsage {actual:#06x} matches none of the required values {required:x?}"
    )]
    KeyUsageMismatch {
        /// The certificate's keyUsage as OpenVPN computes it (digitalSignature = 0x80).
        actual: u16,
        /// The accepted values (any one, all bits set, passes).
        required: Vec<u16>,
    },
    /// `remote-cert-tls` / `remote-cert-eku`: the certificate has no extendedKeyUsage extension.
    #[error("peer certificate has no extendedKeyUsage extension")]
    MissingExtendedKeyUsage,
    /// `remote-cert-tls` / `remote-cert-eku`: no extendedKeyUsage entry matches.
    #[error("peer certificate extendedKeyUsage lacks {expected}")]
    ExtendedKeyUsageMismatch {
        /// The expected usage, as configured (long name or dotted OID).
        expected: String,
    },
    /// `verify-x509-name`: the subject or common name does not match.
    #[error("peer certificate name {actual:?} does not match {expected:?}")]
    NameMismatch {
        /// The configured name.
        expected: String,
        /// The certificate's subject or CN as compared.
        actual: String,
    },
    /// A check of the verifier's own that has no variant above.
    #[error("peer certificate refused")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What went wrong in a [`TlsSession`]. [`TlsError::is_fatal`] tells whether the session is
/// finished (the OpenVPN key state must be torn down) or the call was merely refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL could not create the session object from the context.
    #[error("cannot create a TLS session from the context")]
    Setup(#[source] ErrorStack),
    /// The handshake failed: a certificate OpenSSL's chain validation refused, a missing client
    /// certificate, no common version or cipher, an alert from the peer, or corrupted ciphertext.
    #[error("TLS handshake failed")]
    Handshake(#[source] ssl::Error),
    /// OpenSSL's chain validation refused a certificate the peer sent: expired or not yet
    /// valid, no trusted issuer, a bad signature. Says which certificate and OpenSSL's reason
    /// (OpenSSL's own error is only "certificate verify failed").
    #[error("peer certificate {subject} (chain depth {depth}) refused: {reason}")]
    ChainRejected {
        /// OpenSSL's verify error, e.g. "certificate has expired".
        reason: String,
        /// The refused certificate's place in the chain: 0 is the peer's own.
        depth: u32,
        /// Its subject on one line, `KEY=value` pairs, control characters escaped.
        subject: String,
        /// The handshake error OpenSSL reported.
        #[source]
        source: ssl::Error,
    },
    /// The peer's chain verified but the [`PeerVerifier`] refused its leaf certificate.
    #[error("peer certificate refused")]
    PeerRejected(#[source] PeerCertError),
    /// After the handshake, reading or writing a record failed: a corrupted or forged record,
    /// an alert from the peer, or a protocol violation.
    #[error("TLS record layer failed")]
    Record(#[source] ssl::Error),
    /// OpenSSL took only part of a message, so it would not travel as one record. Cannot
    /// happen with the memory transport; reported rather than silently splitting a message.
    #[error("TLS write took {written} of {len} bytes")]
    PartialWrite {
        /// Bytes OpenSSL accepted.
        written: usize,
        /// Bytes of the message.
        len: usize,
    },
    /// The session already failed or was closed; nothing more can pass through it.
    #[error("TLS session is no longer usable")]
    Finished,
    /// A control message longer than [`TLS_CHANNEL_BUF_SIZE`] (OpenVPN would cut it apart).
    #[error("control message of {len} bytes exceeds the TLS channel buffer of {max}")]
    MessageTooLong {
        /// Bytes given.
        len: usize,
        /// [`TLS_CHANNEL_BUF_SIZE`].
        max: usize,
    },
    /// An empty control message (it would produce no record at all).
    #[error("empty control message")]
    EmptyMessage,
    /// Keying material was asked for before the handshake completed.
    #[error("TLS handshake not complete")]
    HandshakeIncomplete,
    /// OpenSSL's keying-material exporter failed.
    #[error("TLS keying-material export with label {label:?} failed")]
    Export {
        /// The exporter label.
        label: String,
        /// OpenSSL's errors.
        #[source]
        source: ErrorStack,
    },
}

impl TlsError {
    /// `true` if the session is finished and must be dropped; `false` if only the refused call
    /// had no effect and the session goes on.
    pub fn is_fatal(&self) -> bool {
        match self {
            TlsError::Setup(_)
            | TlsError::Handshake(_)
            | TlsError::ChainRejected { .. }
            | TlsError::PeerRejected(_)
            | TlsError::Record(_)
            | TlsError::PartialWrite { .. }
            | TlsError::Finished
            | TlsError::Export { .. } => true,
            TlsError::MessageTooLong { .. }
            | TlsError::EmptyMessage
            | TlsError::HandshakeIncomplete => false,
        }
    }
}

/// One TLS session of one OpenVPN key id, over memory buffers.
///
/// # Driving contract
///
/// All calls are non-blocking and return at once; nothing happens between calls.
///
/// 1. Create with [`TlsSession::new`] when the key state reaches S_START (its own hard or soft
///    reset has been acknowledged, reference 4.5), then call [`process`](Self::process) once:
///    a client's ClientHello appears as ciphertext, a server produces nothing yet.
/// 2. Input: for every in-order control payload the reliability layer delivers, call
///    [`feed_ciphertext`](Self::feed_ciphertext), then [`process`](Self::process) (several
///    feeds may share one `process`). `process` advances the handshake, sends queued messages
///    once the handshake is complete and decrypts every complete record received.
/// 3. Commands: [`write_message`](Self::write_message) for each control message (the
///    key-method-2 message may be written before the handshake is done; it is queued and sent
///    as soon as the handshake completes, as OpenSSL does for OpenVPN);
///    [`close`](Self::close) to send close_notify.
/// 4. Output, after every call above: drain [`poll_ciphertext`](Self::poll_ciphertext) into
///    P_CONTROL_V1 packets, and [`poll_plaintext`](Self::poll_plaintext) (one record per call)
///    into the control-message parser.
/// 5. Queries: [`is_handshake_done`](Self::is_handshake_done) (then key export, peer
///    certificate, version and cipher are available), [`is_peer_closed`](Self::is_peer_closed).
///
/// A fatal error ([`TlsError::is_fatal`]) ends the session: later calls return
/// [`TlsError::Finished`]. Ciphertext still queued then may hold a TLS alert; sending it is
/// a courtesy, OpenVPN tears the key state down either way.
pub struct TlsSession {
    stream: SslStream<MemoryTransport>,
    role: Role,
    verifier: Arc<dyn PeerVerifier>,
    verdict: Arc<Mutex<Verdict>>,
    state: State,
    /// Messages written before the handshake completed.
    pending_writes: VecDeque<Bytes>,
    /// Decrypted records not yet polled, one entry per record.
    plaintext: VecDeque<BytesMut>,
    peer_closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Handshaking,
    Established,
    /// close_notify sent.
    Closed,
    Failed,
}

/// The outcome of the peer-certificate check, shared with OpenSSL's verify callback.
#[derive(Debug, Default)]
enum Verdict {
    /// The verifier has not run (yet).
    #[default]
    Pending,
    Accepted,
    Rejected(PeerCertError),
    /// OpenSSL's chain validation failed (the verifier did not run).
    ChainFailed {
        reason: String,
        depth: u32,
        subject: String,
    },
}

impl fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSession")
            .field("role", &self.role)
            .field("state", &self.state)
            .field("version", &self.protocol_version_str())
            .field("pending_writes", &self.pending_writes.len())
            .field("plaintext_records", &self.plaintext.len())
            .field("peer_closed", &self.peer_closed)
            .finish_non_exhaustive()
    }
}

impl TlsSession {
    /// A new TLS session from the caller's context: a TLS client for [`Role::Client`], a TLS
    /// server for [`Role::Server`] (the OpenVPN client is always the TLS client, whoever
    /// started the key exchange). The context's verify mode is kept; `verifier` is added as the
    /// leaf-certificate check. No SNI is set.
    pub fn new(
        ctx: &SslContextRef,
        role: Role,
        verifier: Arc<dyn PeerVerifier>,
    ) -> Result<TlsSession, TlsError> {
        let mut ssl = Ssl::new(ctx).map_err(TlsError::Setup)?;
        match role {
            Role::Client => ssl.set_connect_state(),
            Role::Server => ssl.set_accept_state(),
        }
        let verdict = Arc::new(Mutex::new(Verdict::Pending));
        let mode = ssl.verify_mode();
        let cb_verifier = Arc::clone(&verifier);
        let cb_verdict = Arc::clone(&verdict);
        ssl.set_verify_callback(mode, move |preverify_ok, store| {
            verify_callback(&*cb_verifier, &cb_verdict, preverify_ok, store)
        });
        let stream = SslStream::new(ssl, MemoryTransport::default()).map_err(TlsError::Setup)?;
        Ok(TlsSession {
            stream,
            role,
            verifier,
            verdict,
            state: State::Handshaking,
            pending_writes: VecDeque::new(),
            plaintext: VecDeque::new(),
            peer_closed: false,
        })
    }

    /// The role this session plays.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Queues TLS bytes received from the peer (the next in-order control payload). Takes
    /// effect at the next [`process`](Self::process). Ignored once the session has failed.
    pub fn feed_ciphertext(&mut self, bytes: &[u8]) {
        if self.state != State::Failed {
            self.stream.get_mut().incoming.extend_from_slice(bytes);
        }
    }

    /// Runs OpenSSL on everything fed so far: advances the handshake, checks the peer
    /// certificate, sends queued messages once established, and decrypts all complete records
    /// into the plaintext queue. Returns `Ok` also when it is merely waiting for more bytes.
    pub fn process(&mut self) -> Result<(), TlsError> {
        let result = self.process_inner();
        if let Err(e) = &result {
            if e.is_fatal() {
                self.state = State::Failed;
            }
        }
        result
    }

    /// Writes one control message as one TLS record. Before the handshake is complete the
    /// message is queued and sent by the `process` that completes it. At most
    /// [`TLS_CHANNEL_BUF_SIZE`] bytes (a text message's NUL included).
    pub fn write_message(&mut self, message: &[u8]) -> Result<(), TlsError> {
        if message.is_empty() {
            return Err(TlsError::EmptyMessage);
        }
        if message.len() > TLS_CHANNEL_BUF_SIZE {
            return Err(TlsError::MessageTooLong {
                len: message.len(),
                max: TLS_CHANNEL_BUF_SIZE,
            });
        }
        match self.state {
            State::Failed | State::Closed => Err(TlsError::Finished),
            State::Handshaking => {
                self.pending_writes
                    .push_back(Bytes::copy_from_slice(message));
                Ok(())
            }
            State::Established => {
                let result = self.write_record(message);
                if result.is_err() {
                    self.state = State::Failed;
                }
                result
            }
        }
    }

    /// Sends close_notify (after the handshake; before it there is nothing to close and the
    /// session is simply marked finished). Later writes return [`TlsError::Finished`]; records
    /// the peer still sends can be read.
    pub fn close(&mut self) -> Result<(), TlsError> {
        match self.state {
            State::Failed => Err(TlsError::Finished),
            State::Closed => Ok(()),
            State::Handshaking => {
                self.state = State::Closed;
                Ok(())
            }
            State::Established => {
                self.state = State::Closed;
                match self.stream.shutdown() {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        self.state = State::Failed;
                        Err(TlsError::Record(e))
                    }
                }
            }
        }
    }

    /// Takes up to `max` bytes of ciphertext to send (the payload of one P_CONTROL_V1 packet),
    /// or `None` if there is none. `max` must be non-zero.
    pub fn poll_ciphertext(&mut self, max: usize) -> Option<Bytes> {
        let out = &mut self.stream.get_mut().outgoing;
        if out.is_empty() || max == 0 {
            return None;
        }
        let n = out.len().min(max);
        Some(out.split_to(n).freeze())
    }

    /// Bytes of ciphertext waiting for [`poll_ciphertext`](Self::poll_ciphertext).
    pub fn pending_ciphertext_len(&self) -> usize {
        self.stream.get_ref().outgoing.len()
    }

    /// The plaintext of the next received TLS record, in order, or `None`.
    pub fn poll_plaintext(&mut self) -> Option<BytesMut> {
        self.plaintext.pop_front()
    }

    /// `true` once the TLS handshake completed and the peer certificate was accepted.
    pub fn is_handshake_done(&self) -> bool {
        matches!(self.state, State::Established | State::Closed)
            && self.stream.ssl().is_init_finished()
    }

    /// `true` once the peer's close_notify was received: it will send no more records.
    pub fn is_peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The peer's leaf certificate, once received.
    pub fn peer_certificate(&self) -> Option<X509> {
        self.stream.ssl().peer_certificate()
    }

    /// The peer's chain as OpenSSL verified it, leaf first and trust anchor last; empty if
    /// the peer was not verified (no certificate requested or none sent).
    pub fn peer_chain(&self) -> Vec<X509> {
        self.stream
            .ssl()
            .verified_chain()
            .map(|chain| chain.iter().map(ToOwned::to_owned).collect())
            .unwrap_or_default()
    }

    /// RFC 5705 / RFC 8446 7.5 keying material of this TLS session, with **no** context
    /// (`use_context = 0`, which differs from an empty context under TLS 1.2). OpenVPN's labels:
    /// `EXPORTER-OpenVPN-datakeys` (256 bytes, `key-derivation tls-ekm`) and
    /// [`EXPORT_DYNAMIC_TLS_CRYPT_LABEL`] (256 bytes).
    pub fn export_keying_material(&self, label: &str, len: usize) -> Result<Vec<u8>, TlsError> {
        let mut out = vec![0u8; len];
        self.export_into(label, &mut out)?;
        Ok(out)
    }

    /// [`export_keying_material`](Self::export_keying_material) of [`KEY2_LEN`] bytes, laid
    /// out as a [`Key2`].
    pub fn export_key2(&self, label: &str) -> Result<Key2, TlsError> {
        let mut out = [0u8; KEY2_LEN];
        self.export_into(label, &mut out)?;
        let key = Key2::from_bytes(&out);
        out.fill(0);
        Ok(key)
    }

    /// The negotiated protocol version, once the handshake has chosen one.
    pub fn protocol_version(&self) -> Option<SslVersion> {
        self.stream.ssl().version2()
    }

    /// The negotiated protocol version for logs, e.g. `TLSv1.3`.
    pub fn protocol_version_str(&self) -> &'static str {
        self.stream.ssl().version_str()
    }

    /// The negotiated cipher suite's OpenSSL name for logs, e.g. `TLS_AES_256_GCM_SHA384`.
    pub fn cipher_name(&self) -> Option<&'static str> {
        self.stream.ssl().current_cipher().map(|c| c.name())
    }

    fn export_into(&self, label: &str, out: &mut [u8]) -> Result<(), TlsError> {
        if !self.is_handshake_done() {
            return Err(TlsError::HandshakeIncomplete);
        }
        self.stream
            .ssl()
            .export_keying_material(out, label, None)
            .map_err(|source| TlsError::Export {
                label: label.to_owned(),
                source,
            })
    }

    fn process_inner(&mut self) -> Result<(), TlsError> {
        match self.state {
            State::Failed => return Err(TlsError::Finished),
            // Closed before the handshake completed: a read would resume the handshake.
            State::Closed if !self.stream.ssl().is_init_finished() => return Ok(()),
            State::Closed | State::Established | State::Handshaking => {}
        }
        if self.state == State::Handshaking {
            match self.stream.do_handshake() {
                Ok(()) => {}
                Err(e) if is_want(&e) => return Ok(()),
                Err(e) => return Err(self.handshake_error(e)),
            }
            self.check_peer_after_handshake()?;
            self.state = State::Established;
            while let Some(msg) = self.pending_writes.pop_front() {
                self.write_record(&msg)?;
            }
        }
        self.read_records()
    }

    /// The verdict of the verify callback explains a failed handshake better than OpenSSL's
    /// "certificate verify failed".
    fn handshake_error(&mut self, e: ssl::Error) -> TlsError {
        let verdict = std::mem::take(&mut *lock(&self.verdict));
        match verdict {
            Verdict::Rejected(reason) => TlsError::PeerRejected(reason),
            Verdict::ChainFailed {
                reason,
                depth,
                subject,
            } => TlsError::ChainRejected {
                reason,
                depth,
                subject,
                source: e,
            },
            Verdict::Pending | Verdict::Accepted => TlsError::Handshake(e),
        }
    }

    /// Runs the verifier if OpenSSL's callback did not (context without peer verification);
    /// refuses a rejection the callback recorded but OpenSSL ignored (verify mode `NONE`).
    fn check_peer_after_handshake(&mut self) -> Result<(), TlsError> {
        let verdict = std::mem::take(&mut *lock(&self.verdict));
        match verdict {
            Verdict::Accepted => Ok(()),
            Verdict::Rejected(reason) => Err(TlsError::PeerRejected(reason)),
            // A chain failure OpenSSL ignored (verify mode `NONE`): as if it never ran.
            Verdict::Pending | Verdict::ChainFailed { .. } => {
                match self.stream.ssl().peer_certificate() {
                    Some(leaf) => self
                        .verifier
                        .verify_peer(&leaf)
                        .map_err(TlsError::PeerRejected),
                    None => Ok(()),
                }
            }
        }
    }

    fn write_record(&mut self, message: &[u8]) -> Result<(), TlsError> {
        match self.stream.ssl_write(message) {
            Ok(n) if n == message.len() => Ok(()),
            // The memory transport accepts every write, so OpenSSL never stops halfway; if it
            // did, the record boundary would be lost, which the peer cannot recover from.
            Ok(written) => Err(TlsError::PartialWrite {
                written,
                len: message.len(),
            }),
            Err(e) => Err(TlsError::Record(e)),
        }
    }

    fn read_records(&mut self) -> Result<(), TlsError> {
        if self.peer_closed {
            return Ok(());
        }
        let mut buf = BytesMut::zeroed(MAX_RECORD_PLAINTEXT);
        loop {
            match self.stream.ssl_read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    let record = buf.split_to(n);
                    self.plaintext.push_back(record);
                    if buf.len() < MAX_RECORD_PLAINTEXT {
                        buf = BytesMut::zeroed(MAX_RECORD_PLAINTEXT);
                    }
                }
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => {
                    self.peer_closed = true;
                    return Ok(());
                }
                Err(e) if is_want(&e) => return Ok(()),
                Err(e) => return Err(TlsError::Record(e)),
            }
        }
    }
}

/// OpenSSL's verify callback: OpenSSL's chain verdict stands (its reason is recorded for
/// [`TlsSession`]); at depth 0 with a good chain the [`PeerVerifier`] decides and its verdict
/// is recorded.
fn verify_callback(
    verifier: &dyn PeerVerifier,
    verdict: &Mutex<Verdict>,
    preverify_ok: bool,
    store: &mut X509StoreContextRef,
) -> bool {
    if !preverify_ok {
        let mut verdict = lock(verdict);
        // The first failure is the reason; OpenSSL stops there unless told to go on.
        if matches!(*verdict, Verdict::Pending) {
            *verdict = Verdict::ChainFailed {
                reason: store.error().error_string().to_owned(),
                depth: store.error_depth(),
                subject: store
                    .current_cert()
                    .map_or_else(|| "(none)".to_owned(), |c| one_line(c.subject_name())),
            };
        }
        return false;
    }
    if store.error_depth() != 0 {
        return true;
    }
    let Some(leaf) = store.current_cert() else {
        return false;
    };
    match verifier.verify_peer(leaf) {
        Ok(()) => {
            *lock(verdict) = Verdict::Accepted;
            true
        }
        Err(reason) => {
            *lock(verdict) = Verdict::Rejected(reason);
            store.set_error(X509VerifyResult::APPLICATION_VERIFICATION);
            false
        }
    }
}

/// `CN=name,O=org`: the entries of `name` in order, each value with control characters (and
/// quotes and backslashes) escaped, so a hostile certificate cannot forge a log line.
fn one_line(name: &X509NameRef) -> String {
    name.entries()
        .map(|entry| {
            let key = entry.object().nid().short_name().unwrap_or("?");
            let value = String::from_utf8_lossy(entry.data().as_slice());
            format!("{key}={}", value.escape_debug())
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn lock(verdict: &Mutex<Verdict>) -> std::sync::MutexGuard<'_, Verdict> {
    verdict.lock().unwrap_or_else(PoisonError::into_inner)
}

/// OpenSSL waits for more input (or, never with memory buffers, for output space).
fn is_want(e: &ssl::Error) -> bool {
    matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) && e.ssl_error().is_none()
}

/// The byte queues OpenSSL reads from and writes to instead of a socket. Reading an empty queue
/// returns `WouldBlock`, which OpenSSL reports as `WANT_READ`.
#[derive(Debug, Default)]
struct MemoryTransport {
    incoming: BytesMut,
    outgoing: BytesMut,
}

impl io::Read for MemoryTransport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.incoming.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.incoming.len().min(buf.len());
        buf[..n].copy_from_slice(&self.incoming[..n]);
        self.incoming.advance(n);
        Ok(n)
    }
}

impl io::Write for MemoryTransport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
