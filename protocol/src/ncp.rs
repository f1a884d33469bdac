//! Data-channel cipher negotiation (NCP) and the protocol options a 2.6 server pushes
//! (reference 9).
//!
//! * [`DataCiphers`]: a parsed `--data-ciphers` list (`?NAME` optional entries, names
//!   case-insensitive, canonical when written back as `IV_CIPHERS`).
//! * Server side, [`select_server_cipher`]: the first of the server's ciphers the client
//!   offers (`IV_CIPHERS`, else AES-256-GCM and AES-128-GCM for `IV_NCP>=2`, else the `cipher`
//!   of its OCC string), else `--data-ciphers-fallback` for a client that said nothing, else
//!   [`NoSharedCipher`], which the server reports as [`NO_SHARED_CIPHER_AUTH_FAILED`].
//! * Client side, [`check_pushed_cipher`] and [`client_cipher_without_push`].
//! * [`protocol_push`]: which of `peer-id`, `cipher`, `key-derivation tls-ekm`,
//!   `protocol-flags ...` and `tun-mtu` a server pushes for a client's `IV_PROTO` bits and
//!   the features we implement, as typed [`ProtocolOption`]s: each is a [`PushedOption`] and
//!   prints as that one does, as upstream writes it.
//!
//! Cipher names are compared case-insensitively everywhere; OpenVPN compares its canonical
//! names byte for byte, which gives the same result for every peer that sends canonical names
//! (all OpenVPN versions do).

use std::fmt;

use crate::data::DataCipher;
use crate::ids::PeerId;
use crate::km2::peer_info::{
    IvProto, PeerInfo, IV_PROTO_CC_EXIT_NOTIFY, IV_PROTO_DATA_V2, IV_PROTO_DYN_TLS_CRYPT,
    IV_PROTO_REQUEST_PUSH, IV_PROTO_TLS_KEY_EXPORT,
};
use crate::push::options::{KeyDerivation, ProtocolFlags as PushedProtocolFlags};
use crate::push::PushedOption;

/// The reason text a server sends in `AUTH_FAILED` when no cipher is shared.
pub const NO_SHARED_CIPHER_REASON: &str =
    "Data channel cipher negotiation failed (no shared cipher)";

/// The whole control message a 2.6 server sends when no cipher is shared.
pub const NO_SHARED_CIPHER_AUTH_FAILED: &str =
    "AUTH_FAILED,Data channel cipher negotiation failed (no shared cipher)";

/// `MAX_NCP_CIPHERS_LENGTH`: the longest canonical `--data-ciphers` list OpenVPN accepts.
pub const MAX_NCP_CIPHERS_LENGTH: usize = 127;

/// What a client without `IV_CIPHERS` but with `IV_NCP>=2` is assumed to support.
pub const IV_NCP_2_CIPHERS: [DataCipher; 2] = [DataCipher::Aes256Gcm, DataCipher::Aes128Gcm];

/// A `--data-ciphers` list, in preference order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DataCiphers(Vec<DataCipher>);

impl DataCiphers {
    /// The 2.6 default: `AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305`.
    pub fn default_2_6() -> DataCiphers {
        DataCiphers(vec![
            DataCipher::Aes256Gcm,
            DataCipher::Aes128Gcm,
            DataCipher::ChaCha20Poly1305,
        ])
    }

    /// `first`, then `rest`: a list that cannot be empty.
    pub fn of(first: DataCipher, rest: &[DataCipher]) -> DataCiphers {
        let mut list = vec![first];
        list.extend_from_slice(rest);
        DataCiphers(list)
    }

    /// A list of these ciphers; [`NcpConfigError::Empty`] if there are none.
    pub fn new(ciphers: Vec<DataCipher>) -> Result<DataCiphers, NcpConfigError> {
        if ciphers.is_empty() {
            return Err(NcpConfigError::Empty);
        }
        Ok(DataCiphers(ciphers))
    }

    /// Parses a `--data-ciphers` value: `:`-separated names, case-insensitive; a name with a
    /// leading `?` is optional and skipped if unknown. An unknown mandatory name is an error
    /// naming it, as is an empty result.
    pub fn parse(list: &str) -> Result<DataCiphers, NcpConfigError> {
        let mut out = Vec::new();
        for token in list.split(':') {
            let (optional, name) = match token.strip_prefix('?') {
                Some(name) => (true, name),
                None => (false, token),
            };
            match DataCipher::from_name(name) {
                Some(c) => out.push(c),
                None if optional => {}
                None => {
                    return Err(NcpConfigError::UnsupportedCipher {
                        name: name.to_owned(),
                    })
                }
            }
        }
        let parsed = DataCiphers::new(out)?;
        let len = parsed.to_string().len();
        if len > MAX_NCP_CIPHERS_LENGTH {
            return Err(NcpConfigError::TooLong { len });
        }
        Ok(parsed)
    }

    /// The ciphers in order.
    pub fn as_slice(&self) -> &[DataCipher] {
        &self.0
    }

    /// Whether `cipher` is in the list.
    pub fn contains(&self, cipher: DataCipher) -> bool {
        self.0.contains(&cipher)
    }
}

impl fmt::Display for DataCiphers {
    /// The canonical `:`-separated list, as sent in `IV_CIPHERS`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            f.write_str(c.name())?;
        }
        Ok(())
    }
}

/// A `--data-ciphers` / `--data-ciphers-fallback` setting we cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcpConfigError {
    /// A mandatory cipher we do not implement (or a misspelling).
    #[error("Unsupported cipher in --data-ciphers: {name}")]
    UnsupportedCipher {
        /// The name as configured.
        name: String,
    },
    /// No usable cipher in the list.
    #[error("--data-ciphers contains no usable cipher")]
    Empty,
    /// The canonical list is longer than [`MAX_NCP_CIPHERS_LENGTH`].
    #[error("--data-ciphers is {len} characters, over the limit of {MAX_NCP_CIPHERS_LENGTH}")]
    TooLong {
        /// Length of the canonical list.
        len: usize,
    },
}

/// Parses a `--data-ciphers-fallback` value (one cipher, case-insensitive).
pub fn parse_fallback(name: &str) -> Result<DataCipher, NcpConfigError> {
    DataCipher::from_name(name).ok_or_else(|| NcpConfigError::UnsupportedCipher {
        name: name.to_owned(),
    })
}

/// The server found no cipher the client can use; the session answers
/// [`NO_SHARED_CIPHER_AUTH_FAILED`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{NO_SHARED_CIPHER_REASON}: server data-ciphers {server}, client ciphers {client_ciphers:?}, client OCC cipher {client_occ_cipher:?}")]
pub struct NoSharedCipher {
    /// The server's list.
    pub server: DataCiphers,
    /// The client's list as the server computed it (`IV_CIPHERS`, or the `IV_NCP=2` pair);
    /// empty if the client sent neither.
    pub client_ciphers: Vec<String>,
    /// The `cipher` field of the client's OCC string.
    pub client_occ_cipher: Option<String>,
}

impl NoSharedCipher {
    /// The control message to send: [`NO_SHARED_CIPHER_AUTH_FAILED`].
    pub const fn auth_failed_message(&self) -> &'static str {
        NO_SHARED_CIPHER_AUTH_FAILED
    }
}

/// The cipher list a server attributes to a client (OpenVPN's `tls_peer_ncp_list`):
/// `IV_CIPHERS` if present, else AES-256-GCM:AES-128-GCM for `IV_NCP>=2`, else empty.
pub fn peer_cipher_list(peer_info: Option<&PeerInfo>) -> Vec<String> {
    let Some(info) = peer_info else {
        return Vec::new();
    };
    if let Some(list) = &info.ciphers {
        return list.clone();
    }
    if info.ncp.is_some_and(|n| n >= 2) {
        return IV_NCP_2_CIPHERS
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
    }
    Vec::new()
}

/// The server's choice (reference 9.2): the first cipher of `data_ciphers` that is in the
/// client's list ([`peer_cipher_list`]) or equals the `cipher` of its OCC string; if none,
/// `fallback` when the client sent neither a list nor an OCC cipher; else [`NoSharedCipher`].
pub fn select_server_cipher(
    data_ciphers: &DataCiphers,
    fallback: Option<DataCipher>,
    peer_info: Option<&PeerInfo>,
    occ_cipher: Option<&str>,
) -> Result<DataCipher, NoSharedCipher> {
    let client = peer_cipher_list(peer_info);
    let offered = |c: DataCipher| {
        client.iter().any(|n| n.eq_ignore_ascii_case(c.name()))
            || occ_cipher.is_some_and(|o| o.eq_ignore_ascii_case(c.name()))
    };
    if let Some(&c) = data_ciphers.as_slice().iter().find(|&&c| offered(c)) {
        return Ok(c);
    }
    match fallback {
        Some(f) if client.is_empty() && occ_cipher.is_none() => Ok(f),
        _ => Err(NoSharedCipher {
            server: data_ciphers.clone(),
            client_ciphers: client,
            client_occ_cipher: occ_cipher.map(str::to_owned),
        }),
    }
}

/// A client's cipher could not be settled (reference 9.3); the client restarts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientNcpError {
    /// The server pushed a cipher not in `--data-ciphers` and not the fallback.
    #[error("negotiated cipher not allowed - {cipher} not in {data_ciphers}")]
    CipherNotAllowed {
        /// The pushed name.
        cipher: String,
        /// Our list.
        data_ciphers: DataCiphers,
    },
    /// No push, and the server's OCC cipher is not in `--data-ciphers`.
    #[error("failed to negotiate cipher with server: add the server's cipher ('{cipher}') to --data-ciphers (currently '{data_ciphers}')")]
    ServerCipherNotAllowed {
        /// The server's OCC cipher.
        cipher: String,
        /// Our list.
        data_ciphers: DataCiphers,
    },
    /// No push, no OCC cipher, no `--data-ciphers-fallback`.
    #[error("failed to negotiate cipher with server: configure --data-ciphers-fallback")]
    NoCipher,
}

/// Checks a pushed `cipher NAME` on the client: allowed if in `data_ciphers` or equal to
/// `fallback` (OpenVPN's `check_session_cipher`).
pub fn check_pushed_cipher(
    pushed: &str,
    data_ciphers: &DataCiphers,
    fallback: Option<DataCipher>,
) -> Result<DataCipher, ClientNcpError> {
    match DataCipher::from_name(pushed) {
        Some(c) if data_ciphers.contains(c) || fallback == Some(c) => Ok(c),
        _ => Err(ClientNcpError::CipherNotAllowed {
            cipher: pushed.to_owned(),
            data_ciphers: data_ciphers.clone(),
        }),
    }
}

/// The client's cipher when the server pushed none (OpenVPN's `check_pull_client_ncp`): the
/// server's OCC `cipher` if it is in `data_ciphers` ("poor man's NCP"); without an OCC cipher
/// the fallback; otherwise an error.
pub fn client_cipher_without_push(
    server_occ_cipher: Option<&str>,
    data_ciphers: &DataCiphers,
    fallback: Option<DataCipher>,
) -> Result<DataCipher, ClientNcpError> {
    match (server_occ_cipher, fallback) {
        (Some(name), _) => DataCipher::from_name(name)
            .filter(|&c| data_ciphers.contains(c))
            .ok_or_else(|| ClientNcpError::ServerCipherNotAllowed {
                cipher: name.to_owned(),
                data_ciphers: data_ciphers.clone(),
            }),
        (None, Some(f)) => Ok(f),
        (None, None) => Err(ClientNcpError::NoCipher),
    }
}

/// Protocol features the server side implements; a flag off means it is never negotiated,
/// whatever the client announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServerCapabilities {
    /// Data keys from the TLS keying-material exporter (`tls-ekm`).
    pub tls_ekm: bool,
    /// Dynamic tls-crypt keys for renegotiations (`dyn-tls-crypt`).
    pub dyn_tls_crypt: bool,
    /// EXIT over the control channel (`cc-exit`).
    pub cc_exit: bool,
}

/// The `protocol-flags` pushed to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProtocolFlags {
    /// `cc-exit`.
    pub cc_exit: bool,
    /// `tls-ekm`.
    pub tls_ekm: bool,
    /// `dyn-tls-crypt`.
    pub dyn_tls_crypt: bool,
}

impl ProtocolFlags {
    /// Whether no flag is set (then nothing is pushed).
    pub const fn is_empty(&self) -> bool {
        !(self.cc_exit || self.tls_ekm || self.dyn_tls_crypt)
    }
}

/// A protocol option a server pushes (reference 9.4): the [`PushedOption`] it converts to, and
/// whose `Display` it shares (exactly as OpenVPN writes it in PUSH_REPLY).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolOption {
    /// `peer-id N`.
    PeerId(PeerId),
    /// `cipher NAME`.
    Cipher(DataCipher),
    /// `key-derivation tls-ekm`: for a client that exports keys but does not understand
    /// `protocol-flags`.
    KeyDerivationTlsEkm,
    /// `protocol-flags cc-exit tls-ekm dyn-tls-crypt` (the flags that are set).
    ProtocolFlags(ProtocolFlags),
    /// `tun-mtu N`.
    TunMtu(u16),
}

impl From<ProtocolOption> for PushedOption {
    fn from(option: ProtocolOption) -> PushedOption {
        match option {
            ProtocolOption::PeerId(id) => PushedOption::PeerId(id),
            ProtocolOption::Cipher(c) => PushedOption::Cipher(c.name().to_owned()),
            ProtocolOption::KeyDerivationTlsEkm => {
                PushedOption::KeyDerivation(KeyDerivation::TlsEkm)
            }
            ProtocolOption::ProtocolFlags(flags) => {
                PushedOption::ProtocolFlags(PushedProtocolFlags {
                    cc_exit: flags.cc_exit,
                    tls_ekm: flags.tls_ekm,
                    dyn_tls_crypt: flags.dyn_tls_crypt,
                    unknown: Vec::new(),
                })
            }
            ProtocolOption::TunMtu(mtu) => PushedOption::TunMtu(mtu),
        }
    }
}

impl fmt::Display for ProtocolOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        PushedOption::from(*self).fmt(f)
    }
}

/// What a server decided for one client: the options to push and the features in effect.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProtocolPush {
    /// The options, in the order OpenVPN puts them in PUSH_REPLY.
    pub options: Vec<ProtocolOption>,
    /// P_DATA_V2 with the peer id (client bit `DATA_V2`).
    pub data_v2: bool,
    /// PUSH_REPLY may be sent without waiting for PUSH_REQUEST (client bit `REQUEST_PUSH`).
    pub request_push: bool,
    /// Data keys come from the keying-material exporter.
    pub tls_ekm: bool,
    /// Renegotiations use dynamic tls-crypt.
    pub dyn_tls_crypt: bool,
    /// The client may send EXIT over the control channel.
    pub cc_exit: bool,
}

/// The protocol options a 2.6 server pushes to a client (reference 9.4, OpenVPN's
/// `multi_client_set_protocol_options` and `prepare_push_reply`), in PUSH_REPLY order:
///
/// * `peer-id N` if the client set `DATA_V2`;
/// * `cipher NAME` if the client negotiates ciphers ([`PeerInfo::supports_ncp`]);
/// * `key-derivation tls-ekm` if it exports keys (`TLS_KEY_EXPORT`) but lacks
///   `CC_EXIT_NOTIFY`, which is also what says it understands `protocol-flags`;
/// * `protocol-flags` with `cc-exit` (`CC_EXIT_NOTIFY`), `tls-ekm` (`TLS_KEY_EXPORT` with
///   `CC_EXIT_NOTIFY`) and `dyn-tls-crypt` (`DYN_TLS_CRYPT`), if any applies;
/// * `tun-mtu N` (our `tun_mtu`) if the client sent `IV_MTU`.
///
/// A feature also needs the matching flag in `caps`.
pub fn protocol_push(
    client: &PeerInfo,
    caps: ServerCapabilities,
    peer_id: PeerId,
    cipher: DataCipher,
    tun_mtu: u16,
) -> ProtocolPush {
    let bits: IvProto = client.proto_bits();
    let data_v2 = bits.contains(IV_PROTO_DATA_V2);
    let tls_ekm = caps.tls_ekm && bits.contains(IV_PROTO_TLS_KEY_EXPORT);
    let cc_exit = caps.cc_exit && bits.contains(IV_PROTO_CC_EXIT_NOTIFY);
    let dyn_tls_crypt = caps.dyn_tls_crypt && bits.contains(IV_PROTO_DYN_TLS_CRYPT);
    // Upstream pushes `tls-ekm` in protocol-flags only to clients that announce CC_EXIT_NOTIFY
    // (they parse protocol-flags), whether or not the server itself uses cc-exit.
    let understands_flags = bits.contains(IV_PROTO_CC_EXIT_NOTIFY);

    let mut options = Vec::new();
    if data_v2 {
        options.push(ProtocolOption::PeerId(peer_id));
    }
    if client.supports_ncp() {
        options.push(ProtocolOption::Cipher(cipher));
    }
    if tls_ekm && !understands_flags {
        options.push(ProtocolOption::KeyDerivationTlsEkm);
    }
    let flags = ProtocolFlags {
        cc_exit,
        tls_ekm: tls_ekm && understands_flags,
        dyn_tls_crypt,
    };
    if !flags.is_empty() {
        options.push(ProtocolOption::ProtocolFlags(flags));
    }
    if client.mtu.is_some() {
        options.push(ProtocolOption::TunMtu(tun_mtu));
    }
    ProtocolPush {
        options,
        data_v2,
        request_push: bits.contains(IV_PROTO_REQUEST_PUSH),
        tls_ekm,
        dyn_tls_crypt,
        cc_exit,
    }
}
