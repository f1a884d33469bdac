//! Key method 2: the first message each peer writes into the TLS tunnel (reference 6.1, 6.4),
//! sent again after every TLS renegotiation (12.3) with fresh randoms.
//!
//! ```text
//! +----------+------+=================+============+============+
//! | 0 (u32)  | 0x02 | pre_master [48] | random1[32]| random2[32]|
//! +----------+------+=================+============+============+
//!              key    client only
//!              method
//! +-----+=========+-----+==========+-----+==========+-----+===========+
//! | len | options | len | username | len | password | len | peer-info |
//! +-----+=========+-----+==========+-----+==========+-----+===========+
//!  u16   OCC text  u16    (client)  u16    (client)  u16   (client)
//! ```
//!
//! Each string is a `u16` length that **counts the terminating NUL**, then the bytes and the
//! NUL; an absent string is just `00 00`. A stock client fills every string
//! ([`ClientKeyMethod2`]); a 2.6 server in `mode server` sends its OCC options string and
//! three absent strings ([`ServerKeyMethod2`]).
//!
//! The pieces inside the strings live in submodules: [`occ`] builds and reads the options
//! string, [`peer_info`] the client's `IV_*` capability list.
//!
//! # Parsing
//!
//! [`ClientKeyMethod2::parse`] and [`ServerKeyMethod2::parse`] take the TLS plaintext as
//! received so far. [`Km2Error::Truncated`] means more plaintext is needed; every other error
//! ([`Malformed`]) is final. On success they return the message and the number of bytes it
//! used. OpenVPN reads the message from one TLS record and **discards the rest of that
//! record**; a caller that reads plaintext as a stream should likewise drop what follows the
//! message in the same record, or (when it cannot see record boundaries) treat the rest as the
//! start of the NUL-terminated text messages that follow (reference 6.5).
//!
//! Where we are stricter than OpenVPN (each is a message no OpenVPN peer produces):
//!
//! * the leading `u32` must be 0 (OpenVPN skips it unread);
//! * the high four "flag" bits of the key-method byte are accepted and ignored like upstream,
//!   but [`emit`](ClientKeyMethod2::emit) always writes 0 there;
//! * a present string must end in its NUL and contain no other NUL (OpenVPN overwrites the
//!   last byte with a NUL and then reads a C string, silently truncating);
//! * an absent OCC options string is an error (OpenVPN treats it as empty and then warns
//!   that the options differ);
//! * all four strings must be there: OpenVPN treats a record that ends early as one without
//!   peer-info, but in a byte stream that is indistinguishable from "not arrived yet";
//! * the options string and peer-info must be UTF-8 (they are ASCII in every implementation).
//!
//! Username and password are bytes, not text, and their length is not checked here: OpenVPN
//! answers an over-long credential (more than [`USER_PASS_LEN`] bytes, or
//! [`USER_PASS_LEN_PKCS11`] in builds with PKCS#11) with `AUTH_FAILED`, which is the session's
//! decision; see [`ClientKeyMethod2::credentials_exceed`].

pub mod occ;
pub mod peer_info;

use bytes::{BufMut, BytesMut};
use rand_core::{CryptoRng, RngCore};

/// `KEY_METHOD_2`: the only key method OpenVPN 2.6 speaks.
pub const KEY_METHOD_2: u8 = 2;

/// `KEY_METHOD_MASK`: the low bits of the key-method byte that hold the method; the high bits
/// are flags (none defined).
pub const KEY_METHOD_MASK: u8 = 0x0f;

/// Length of the leading literal `u32` 0.
pub const LITERAL_LEN: usize = 4;

/// Length of the client's pre-master secret.
pub const PRE_MASTER_LEN: usize = 48;

/// Length of each of the two randoms.
pub const RANDOM_LEN: usize = 32;

/// Length of the fixed part of a client message: literal, key method, pre-master, randoms.
pub const CLIENT_FIXED_LEN: usize = LITERAL_LEN + 1 + PRE_MASTER_LEN + 2 * RANDOM_LEN;

/// Length of the fixed part of a server message: literal, key method, randoms.
pub const SERVER_FIXED_LEN: usize = LITERAL_LEN + 1 + 2 * RANDOM_LEN;

/// `TLS_OPTIONS_LEN`: the largest OCC options string OpenVPN reads or writes, NUL included.
pub const TLS_OPTIONS_LEN: usize = 512;

/// `USER_PASS_LEN`: the longest username or password (NUL included) an OpenVPN server
/// accepts in a build without PKCS#11; longer ones get `AUTH_FAILED`.
pub const USER_PASS_LEN: usize = 128;

/// `USER_PASS_LEN` in builds with PKCS#11 (Debian's among them).
pub const USER_PASS_LEN_PKCS11: usize = 4096;

/// `TLS_CHANNEL_BUF_SIZE`: the plaintext buffer one TLS record is read into; a key-method-2
/// message longer than this cannot be received by OpenVPN.
pub use crate::reliable::TLS_CHANNEL_BUF_SIZE;

/// The random material of one side of a key-method-2 exchange (OpenVPN's `struct key_source`).
///
/// Both sides generate two randoms; only the client's pre-master secret goes on the wire. A
/// server's [`KeySource`] has an all-zero `pre_master`, as upstream leaves it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeySource {
    /// The client's pre-master secret (all zero for a server).
    pub pre_master: [u8; PRE_MASTER_LEN],
    /// First random, seeds the master secret.
    pub random1: [u8; RANDOM_LEN],
    /// Second random, seeds the key expansion.
    pub random2: [u8; RANDOM_LEN],
}

impl KeySource {
    /// Fresh client material: pre-master secret and both randoms from `rng`.
    pub fn client<R: RngCore + CryptoRng>(rng: &mut R) -> KeySource {
        let mut ks = KeySource::server(rng);
        rng.fill_bytes(&mut ks.pre_master);
        ks
    }

    /// Fresh server material: both randoms from `rng`, pre-master all zero.
    pub fn server<R: RngCore + CryptoRng>(rng: &mut R) -> KeySource {
        let mut ks = KeySource {
            pre_master: [0; PRE_MASTER_LEN],
            random1: [0; RANDOM_LEN],
            random2: [0; RANDOM_LEN],
        };
        rng.fill_bytes(&mut ks.random1);
        rng.fill_bytes(&mut ks.random2);
        ks
    }
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secret material stays out of logs.
        f.write_str("KeySource { .. }")
    }
}

/// The key-method-2 message a client sends (reference 6.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientKeyMethod2 {
    /// Pre-master secret and the client's two randoms.
    pub key_source: KeySource,
    /// The OCC options string, without its NUL (see [`occ`]).
    pub options: String,
    /// Username (`--auth-user-pass`), without NUL; `None` is sent as an absent string.
    pub username: Option<Vec<u8>>,
    /// Password or auth-token, without NUL; `None` is sent as an absent string.
    pub password: Option<Vec<u8>>,
    /// Peer-info text (`IV_*` lines, see [`peer_info`]), without NUL.
    pub peer_info: Option<String>,
}

/// The key-method-2 message a server sends (reference 6.4): no pre-master secret.
///
/// A 2.6 server in `mode server` leaves username, password and peer-info absent; a client
/// still reads the three fields, so they are kept when present.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerKeyMethod2 {
    /// The server's two randoms (`pre_master` is all zero and not sent).
    pub key_source: KeySource,
    /// The OCC options string, without its NUL.
    pub options: String,
    /// Username field: absent from an OpenVPN server.
    pub username: Option<Vec<u8>>,
    /// Password field: absent from an OpenVPN server.
    pub password: Option<Vec<u8>>,
    /// Peer-info: absent from an OpenVPN server in `mode server`.
    pub peer_info: Option<String>,
}

impl ClientKeyMethod2 {
    /// Parses a client message from the start of `bytes`; returns it and its length.
    pub fn parse(bytes: &[u8]) -> Result<(ClientKeyMethod2, usize), Km2Error> {
        let (body, used) = parse_message(bytes, true)?;
        Ok((
            ClientKeyMethod2 {
                key_source: body.key_source,
                options: body.options,
                username: body.username,
                password: body.password,
                peer_info: body.peer_info,
            },
            used,
        ))
    }

    /// Length of the emitted message.
    pub fn emitted_len(&self) -> usize {
        CLIENT_FIXED_LEN
            + string_len(Some(self.options.as_bytes()))
            + string_len(self.username.as_deref())
            + string_len(self.password.as_deref())
            + string_len(self.peer_info.as_deref().map(str::as_bytes))
    }

    /// Appends the message to `dst`; writes nothing on error.
    pub fn emit(&self, dst: &mut BytesMut) -> Result<(), Malformed> {
        let fields = Fields {
            options: &self.options,
            username: self.username.as_deref(),
            password: self.password.as_deref(),
            peer_info: self.peer_info.as_deref(),
        };
        fields.validate()?;
        dst.reserve(self.emitted_len());
        emit_fixed(dst, &self.key_source, true);
        fields.emit(dst);
        Ok(())
    }

    /// Whether the username or password is longer than `limit` bytes **including** the NUL,
    /// which OpenVPN answers with `AUTH_FAILED` ("Username or password is too long"). Pass
    /// [`USER_PASS_LEN`] or [`USER_PASS_LEN_PKCS11`].
    pub fn credentials_exceed(&self, limit: usize) -> bool {
        [&self.username, &self.password]
            .into_iter()
            .any(|s| s.as_ref().is_some_and(|s| s.len() + 1 > limit))
    }
}

impl ServerKeyMethod2 {
    /// A server message as a 2.6 server in `mode server` sends it: randoms, options string,
    /// no username, password or peer-info.
    pub fn new(key_source: KeySource, options: String) -> ServerKeyMethod2 {
        ServerKeyMethod2 {
            key_source,
            options,
            username: None,
            password: None,
            peer_info: None,
        }
    }

    /// Parses a server message from the start of `bytes`; returns it and its length. The
    /// returned `key_source.pre_master` is all zero.
    pub fn parse(bytes: &[u8]) -> Result<(ServerKeyMethod2, usize), Km2Error> {
        let (body, used) = parse_message(bytes, false)?;
        Ok((
            ServerKeyMethod2 {
                key_source: body.key_source,
                options: body.options,
                username: body.username,
                password: body.password,
                peer_info: body.peer_info,
            },
            used,
        ))
    }

    /// Length of the emitted message.
    pub fn emitted_len(&self) -> usize {
        SERVER_FIXED_LEN
            + string_len(Some(self.options.as_bytes()))
            + string_len(self.username.as_deref())
            + string_len(self.password.as_deref())
            + string_len(self.peer_info.as_deref().map(str::as_bytes))
    }

    /// Appends the message to `dst`; writes nothing on error.
    pub fn emit(&self, dst: &mut BytesMut) -> Result<(), Malformed> {
        let fields = Fields {
            options: &self.options,
            username: self.username.as_deref(),
            password: self.password.as_deref(),
            peer_info: self.peer_info.as_deref(),
        };
        fields.validate()?;
        dst.reserve(self.emitted_len());
        emit_fixed(dst, &self.key_source, false);
        fields.emit(dst);
        Ok(())
    }
}

/// Why a key-method-2 message could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Km2Error {
    /// The plaintext ends inside the message: wait for more.
    #[error("key-method-2 message truncated: needs at least {needed} bytes, have {had}")]
    Truncated {
        /// Bytes the message needs as far as its length fields could be read.
        needed: usize,
        /// Bytes available.
        had: usize,
    },
    /// The message can never be valid.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl Km2Error {
    /// Whether more bytes could complete the message (as opposed to malformed).
    pub const fn is_truncated(&self) -> bool {
        matches!(self, Km2Error::Truncated { .. })
    }
}

/// A string field of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Km2Field {
    /// The OCC options string.
    Options,
    /// The username.
    Username,
    /// The password.
    Password,
    /// The peer-info text.
    PeerInfo,
}

/// A key-method-2 message that breaks the format: the peer misbehaves (when parsing) or the
/// caller built an invalid message (when emitting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// The leading `u32` is not 0.
    #[error("key-method-2 message starts with {literal:#010x}, not 0")]
    BadLiteral {
        /// The value found.
        literal: u32,
    },
    /// Key method 1, removed in OpenVPN 2.5.
    #[error("key-method 1 is not supported (OpenVPN 2.5 removed it)")]
    KeyMethod1Unsupported,
    /// A key method other than 1 or 2.
    #[error("unknown key method {method} (key-method byte {byte:#04x})")]
    UnknownKeyMethod {
        /// The method (low four bits).
        method: u8,
        /// The whole byte, flags included.
        byte: u8,
    },
    /// The OCC options string is absent (`00 00`).
    #[error("key-method-2 message without an OCC options string")]
    MissingOptions,
    /// The OCC options string is longer than [`TLS_OPTIONS_LEN`] (NUL included).
    #[error("OCC options string of {len} bytes (with NUL) exceeds {TLS_OPTIONS_LEN}")]
    OptionsTooLong {
        /// Its length with the NUL.
        len: usize,
    },
    /// A present string whose last byte is not NUL.
    #[error("{field:?} string is not NUL-terminated")]
    MissingNul {
        /// Which string.
        field: Km2Field,
    },
    /// A string with a NUL before its end (or, when emitting, any NUL).
    #[error("{field:?} string contains a NUL at offset {offset}")]
    InteriorNul {
        /// Which string.
        field: Km2Field,
        /// Offset of the NUL in the string.
        offset: usize,
    },
    /// The options string or peer-info is not UTF-8.
    #[error("{field:?} string is not UTF-8")]
    NotUtf8 {
        /// Which string.
        field: Km2Field,
    },
    /// A string too long for its `u16` length (emit only).
    #[error("{field:?} string of {len} bytes does not fit a u16 length with its NUL")]
    StringTooLong {
        /// Which string.
        field: Km2Field,
        /// Its length without the NUL.
        len: usize,
    },
}

// ---------------------------------------------------------------------------------------------

/// What both message kinds carry after the fixed part.
struct Body {
    key_source: KeySource,
    options: String,
    username: Option<Vec<u8>>,
    password: Option<Vec<u8>>,
    peer_info: Option<String>,
}

/// A cursor that reports truncation with the total length needed.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Km2Error> {
        let end = self.pos + n;
        let Some(slice) = self.bytes.get(self.pos..end) else {
            return Err(Km2Error::Truncated {
                needed: end,
                had: self.bytes.len(),
            });
        };
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Km2Error> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A length-prefixed string without its NUL; `None` if absent.
    fn string(&mut self, field: Km2Field) -> Result<Option<&'a [u8]>, Km2Error> {
        let len = usize::from(u16::from_be_bytes(self.array()?));
        if field == Km2Field::Options && len > TLS_OPTIONS_LEN {
            return Err(Malformed::OptionsTooLong { len }.into());
        }
        if len == 0 {
            return Ok(None);
        }
        let raw = self.take(len)?;
        let Some((&0, text)) = raw.split_last() else {
            return Err(Malformed::MissingNul { field }.into());
        };
        if let Some(offset) = text.iter().position(|&b| b == 0) {
            return Err(Malformed::InteriorNul { field, offset }.into());
        }
        Ok(Some(text))
    }
}

fn utf8(bytes: &[u8], field: Km2Field) -> Result<String, Malformed> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Malformed::NotUtf8 { field })
}

fn parse_message(bytes: &[u8], client: bool) -> Result<(Body, usize), Km2Error> {
    let mut r = Reader { bytes, pos: 0 };
    let literal = u32::from_be_bytes(r.array()?);
    if literal != 0 {
        return Err(Malformed::BadLiteral { literal }.into());
    }
    let [byte] = r.array()?;
    match byte & KEY_METHOD_MASK {
        KEY_METHOD_2 => {}
        1 => return Err(Malformed::KeyMethod1Unsupported.into()),
        method => return Err(Malformed::UnknownKeyMethod { method, byte }.into()),
    }
    let pre_master = if client {
        r.array()?
    } else {
        [0; PRE_MASTER_LEN]
    };
    let key_source = KeySource {
        pre_master,
        random1: r.array()?,
        random2: r.array()?,
    };
    let options = r.string(Km2Field::Options)?;
    let username = r.string(Km2Field::Username)?.map(<[u8]>::to_vec);
    let password = r.string(Km2Field::Password)?.map(<[u8]>::to_vec);
    let peer_info = r.string(Km2Field::PeerInfo)?;
    // Checked only once the whole message is there, so that a truncated message is always
    // reported as truncated.
    let options = utf8(options.ok_or(Malformed::MissingOptions)?, Km2Field::Options)?;
    let peer_info = peer_info.map(|p| utf8(p, Km2Field::PeerInfo)).transpose()?;
    Ok((
        Body {
            key_source,
            options,
            username,
            password,
            peer_info,
        },
        r.pos,
    ))
}

/// Emitted length of a string field.
fn string_len(s: Option<&[u8]>) -> usize {
    2 + s.map_or(0, |s| s.len() + 1)
}

struct Fields<'a> {
    options: &'a str,
    username: Option<&'a [u8]>,
    password: Option<&'a [u8]>,
    peer_info: Option<&'a str>,
}

impl Fields<'_> {
    fn all(&self) -> [(Km2Field, Option<&[u8]>); 4] {
        [
            (Km2Field::Options, Some(self.options.as_bytes())),
            (Km2Field::Username, self.username),
            (Km2Field::Password, self.password),
            (Km2Field::PeerInfo, self.peer_info.map(str::as_bytes)),
        ]
    }

    fn validate(&self) -> Result<(), Malformed> {
        if self.options.len() + 1 > TLS_OPTIONS_LEN {
            return Err(Malformed::OptionsTooLong {
                len: self.options.len() + 1,
            });
        }
        for (field, s) in self.all() {
            let Some(s) = s else { continue };
            if let Some(offset) = s.iter().position(|&b| b == 0) {
                return Err(Malformed::InteriorNul { field, offset });
            }
            if s.len() >= usize::from(u16::MAX) {
                return Err(Malformed::StringTooLong {
                    field,
                    len: s.len(),
                });
            }
        }
        Ok(())
    }

    /// Writes the four strings; `validate` must have passed.
    fn emit(&self, dst: &mut BytesMut) {
        for (_, s) in self.all() {
            match s {
                None => dst.put_u16(0),
                Some(s) => {
                    // validate() bounded the length below u16::MAX.
                    dst.put_u16(u16::try_from(s.len() + 1).unwrap_or(u16::MAX));
                    dst.put_slice(s);
                    dst.put_u8(0);
                }
            }
        }
    }
}

fn emit_fixed(dst: &mut BytesMut, ks: &KeySource, client: bool) {
    dst.put_u32(0);
    dst.put_u8(KEY_METHOD_2);
    if client {
        dst.put_slice(&ks.pre_master);
    }
    dst.put_slice(&ks.random1);
    dst.put_slice(&ks.random2);
}
