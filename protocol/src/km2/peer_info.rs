//! Peer-info: the client's `KEY=VALUE` capability lines in its key-method-2 message
//! (reference 6.2).
//!
//! ```text
//! IV_VER=2.6.14\n
//! IV_PLAT=linux\n
//! ...            one line per key, each ended by '\n'; the string's NUL follows the last
//! ```
//!
//! [`PeerInfo`] holds the keys OpenVPN 2.6 acts on as typed fields and every other line
//! (`UV_*`, `IV_GUI_VER`, `IV_SSO`, `IV_LZO`, keys of later versions) in
//! [`extra`](PeerInfo::extra), in order. [`PeerInfo::to_text`] writes the typed keys in the
//! order a 2.6 client does (`push_peer_info`), then the extra lines. [`PeerInfo::parse`]
//! never fails as a whole: a line that is not `KEY=VALUE` with a key of letters, digits and
//! `_` and a value without control characters, a typed key whose value does not parse, and a
//! repeated typed key are reported in [`ParsedPeerInfo::malformed`] and otherwise ignored
//! (for a repeated key the first line counts, as in OpenVPN's lookup).

use std::fmt::{self, Write as _};
use std::ops::{BitOr, BitOrAssign};

use crate::data::DataCipher;

/// The `IV_PROTO` bit set: protocol features a peer implements.
///
/// Unknown bits are kept. The named constants carry OpenVPN's names (`IV_PROTO_*` in
/// `ssl.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IvProto(u32);

/// Bit 0, reserved: must be 0.
pub const IV_PROTO_RESERVED: IvProto = IvProto(1);
/// `IV_PROTO_DATA_V2`: supports P_DATA_V2 and `peer-id` (the server then pushes `peer-id`).
pub const IV_PROTO_DATA_V2: IvProto = IvProto(2);
/// `IV_PROTO_REQUEST_PUSH`: the server may send PUSH_REPLY without waiting for PUSH_REQUEST.
pub const IV_PROTO_REQUEST_PUSH: IvProto = IvProto(4);
/// `IV_PROTO_TLS_KEY_EXPORT`: supports data keys from the TLS keying-material exporter.
pub const IV_PROTO_TLS_KEY_EXPORT: IvProto = IvProto(8);
/// `IV_PROTO_AUTH_PENDING_KW`: understands `AUTH_PENDING,timeout N`.
pub const IV_PROTO_AUTH_PENDING_KW: IvProto = IvProto(16);
/// `IV_PROTO_NCP_P2P`: peer-to-peer cipher negotiation (not sent by pull clients).
pub const IV_PROTO_NCP_P2P: IvProto = IvProto(32);
/// `IV_PROTO_DNS_OPTION`: understands the pushed `dns` option.
pub const IV_PROTO_DNS_OPTION: IvProto = IvProto(64);
/// `IV_PROTO_CC_EXIT_NOTIFY`: EXIT over the control channel; understands `protocol-flags`.
pub const IV_PROTO_CC_EXIT_NOTIFY: IvProto = IvProto(128);
/// `IV_PROTO_AUTH_FAIL_TEMP`: understands `AUTH_FAILED,TEMP`.
pub const IV_PROTO_AUTH_FAIL_TEMP: IvProto = IvProto(256);
/// `IV_PROTO_DYN_TLS_CRYPT`: dynamic tls-crypt keys for renegotiations.
pub const IV_PROTO_DYN_TLS_CRYPT: IvProto = IvProto(512);

impl IvProto {
    /// No bit set.
    pub const EMPTY: IvProto = IvProto(0);

    /// The bits a stock 2.6.14 pull client sends: 990.
    pub const STOCK_2_6_CLIENT: IvProto = IvProto(990);

    /// The set with exactly these bits, unknown ones included.
    pub const fn from_bits(bits: u32) -> IvProto {
        IvProto(bits)
    }

    /// The bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: IvProto) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    pub const fn union(self, other: IvProto) -> IvProto {
        IvProto(self.0 | other.0)
    }
}

impl BitOr for IvProto {
    type Output = IvProto;
    fn bitor(self, rhs: IvProto) -> IvProto {
        self.union(rhs)
    }
}

impl BitOrAssign for IvProto {
    fn bitor_assign(&mut self, rhs: IvProto) {
        *self = self.union(rhs);
    }
}

/// A client's peer-info (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PeerInfo {
    /// `IV_VER`: the OpenVPN version string.
    pub version: Option<String>,
    /// `IV_PLAT`: `linux`, `win`, `mac`, ...
    pub platform: Option<String>,
    /// `IV_TCPNL=1`: no strict sequence numbers needed over TCP. Written only when true.
    pub tcp_nonlinear: bool,
    /// `IV_MTU`: the client's `--tun-max-mtu`; makes a server push `tun-mtu`.
    pub mtu: Option<u32>,
    /// `IV_NCP`: the cipher-negotiation version (2 when both GCM ciphers are allowed).
    pub ncp: Option<u32>,
    /// `IV_CIPHERS`: the client's `--data-ciphers`, names as sent (a peer may list ciphers
    /// we do not know).
    pub ciphers: Option<Vec<String>>,
    /// `IV_PROTO`: the protocol feature bits.
    pub proto: Option<IvProto>,
    /// `IV_LZO_STUB=1`. Written only when true.
    pub lzo_stub: bool,
    /// `IV_COMP_STUB=1`. Written only when true.
    pub comp_stub: bool,
    /// `IV_COMP_STUBv2=1`. Written only when true.
    pub comp_stub_v2: bool,
    /// Every other line, in order, as (key, value).
    pub extra: Vec<(String, String)>,
}

/// A received peer-info and the lines that were ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedPeerInfo {
    /// What could be read.
    pub info: PeerInfo,
    /// Lines ignored, in order.
    pub malformed: Vec<MalformedLine>,
}

/// A peer-info line that was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("peer-info line {line_no} {reason}: {line:?}")]
pub struct MalformedLine {
    /// 1-based line number.
    pub line_no: usize,
    /// The line as received.
    pub line: String,
    /// What is wrong with it.
    pub reason: LineProblem,
}

/// What is wrong with a peer-info line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineProblem {
    /// No `=`.
    NoEquals,
    /// An empty key or one with characters other than ASCII letters, digits and `_`.
    BadKey,
    /// A control character in the value.
    ControlCharacter,
    /// A typed key whose value does not parse (e.g. `IV_PROTO=abc`).
    BadValue,
    /// A typed key seen before; the first one counts.
    Duplicate,
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LineProblem::NoEquals => "has no '='",
            LineProblem::BadKey => "has an invalid key",
            LineProblem::ControlCharacter => "has a control character in its value",
            LineProblem::BadValue => "has a value that does not parse",
            LineProblem::Duplicate => "repeats a key",
        })
    }
}

impl PeerInfo {
    /// What a stock 2.6 pull client (`client`) sends, minus optional extras: version,
    /// platform, `IV_TCPNL=1`, `IV_MTU`, `IV_NCP=2` when both AES-GCM ciphers are in
    /// `data_ciphers`, `IV_CIPHERS`, `IV_PROTO` and the three compression stubs.
    pub fn pull_client(
        version: &str,
        platform: &str,
        tun_max_mtu: u32,
        data_ciphers: &[DataCipher],
        proto: IvProto,
    ) -> PeerInfo {
        let both_gcm = data_ciphers.contains(&DataCipher::Aes128Gcm)
            && data_ciphers.contains(&DataCipher::Aes256Gcm);
        PeerInfo {
            version: Some(version.to_owned()),
            platform: Some(platform.to_owned()),
            tcp_nonlinear: true,
            mtu: Some(tun_max_mtu),
            ncp: both_gcm.then_some(2),
            ciphers: Some(data_ciphers.iter().map(|c| c.name().to_owned()).collect()),
            proto: Some(proto),
            lzo_stub: true,
            comp_stub: true,
            comp_stub_v2: true,
            extra: Vec::new(),
        }
    }

    /// The peer-info text (without the string's NUL).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_lines(&mut out);
        out
    }

    fn write_lines(&self, out: &mut String) -> fmt::Result {
        if let Some(v) = &self.version {
            writeln!(out, "IV_VER={v}")?;
        }
        if let Some(v) = &self.platform {
            writeln!(out, "IV_PLAT={v}")?;
        }
        if self.tcp_nonlinear {
            writeln!(out, "IV_TCPNL=1")?;
        }
        if let Some(v) = self.mtu {
            writeln!(out, "IV_MTU={v}")?;
        }
        if let Some(v) = self.ncp {
            writeln!(out, "IV_NCP={v}")?;
        }
        if let Some(v) = &self.ciphers {
            writeln!(out, "IV_CIPHERS={}", v.join(":"))?;
        }
        if let Some(v) = self.proto {
            writeln!(out, "IV_PROTO={}", v.bits())?;
        }
        if self.lzo_stub {
            writeln!(out, "IV_LZO_STUB=1")?;
        }
        if self.comp_stub {
            writeln!(out, "IV_COMP_STUB=1")?;
        }
        if self.comp_stub_v2 {
            writeln!(out, "IV_COMP_STUBv2=1")?;
        }
        for (k, v) in &self.extra {
            writeln!(out, "{k}={v}")?;
        }
        Ok(())
    }

    /// Reads a received peer-info text (see the module docs). A missing final `\n` and empty
    /// lines are accepted. A stub key (`IV_TCPNL`, `IV_LZO_STUB`, ...) with a value other than
    /// `1` is kept in `extra`.
    pub fn parse(text: &str) -> ParsedPeerInfo {
        let mut parsed = ParsedPeerInfo::default();
        let mut seen: Vec<&str> = Vec::new();
        for (i, line) in text.split('\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let bad = |reason| MalformedLine {
                line_no: i + 1,
                line: line.to_owned(),
                reason,
            };
            let Some((key, value)) = line.split_once('=') else {
                parsed.malformed.push(bad(LineProblem::NoEquals));
                continue;
            };
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                parsed.malformed.push(bad(LineProblem::BadKey));
                continue;
            }
            if value.chars().any(char::is_control) {
                parsed.malformed.push(bad(LineProblem::ControlCharacter));
                continue;
            }
            let typed = is_typed(key, value);
            if typed {
                if seen.contains(&key) {
                    parsed.malformed.push(bad(LineProblem::Duplicate));
                    continue;
                }
                seen.push(key);
            }
            if !parsed.info.set(key, value) {
                parsed.malformed.push(bad(LineProblem::BadValue));
            }
        }
        parsed
    }

    /// Stores one valid line; false if a typed key's value does not parse.
    fn set(&mut self, key: &str, value: &str) -> bool {
        let info = self;
        match key {
            "IV_VER" => info.version = Some(value.to_owned()),
            "IV_PLAT" => info.platform = Some(value.to_owned()),
            "IV_MTU" => match value.parse() {
                Ok(v) => info.mtu = Some(v),
                Err(_) => return false,
            },
            "IV_NCP" => match value.parse() {
                Ok(v) => info.ncp = Some(v),
                Err(_) => return false,
            },
            "IV_PROTO" => match value.parse() {
                Ok(v) => info.proto = Some(IvProto(v)),
                Err(_) => return false,
            },
            "IV_CIPHERS" => {
                info.ciphers = Some(if value.is_empty() {
                    Vec::new()
                } else {
                    value.split(':').map(str::to_owned).collect()
                })
            }
            "IV_TCPNL" if value == "1" => info.tcp_nonlinear = true,
            "IV_LZO_STUB" if value == "1" => info.lzo_stub = true,
            "IV_COMP_STUB" if value == "1" => info.comp_stub = true,
            "IV_COMP_STUBv2" if value == "1" => info.comp_stub_v2 = true,
            _ => info.extra.push((key.to_owned(), value.to_owned())),
        }
        true
    }

    /// Whether the peer negotiates ciphers: `IV_NCP >= 2` or `IV_CIPHERS` present
    /// (OpenVPN's `tls_peer_supports_ncp`).
    pub fn supports_ncp(&self) -> bool {
        self.ncp.is_some_and(|n| n >= 2) || self.ciphers.is_some()
    }

    /// The `IV_PROTO` bits, empty if absent.
    pub fn proto_bits(&self) -> IvProto {
        self.proto.unwrap_or_default()
    }
}

/// Whether a line with this key and value lands in a typed field (and so may not repeat).
/// An empty `IV_CIPHERS=` line is an empty list, which `to_text` writes back identically.
fn is_typed(key: &str, value: &str) -> bool {
    match key {
        "IV_VER" | "IV_PLAT" | "IV_MTU" | "IV_NCP" | "IV_PROTO" | "IV_CIPHERS" => true,
        "IV_TCPNL" | "IV_LZO_STUB" | "IV_COMP_STUB" | "IV_COMP_STUBv2" => value == "1",
        _ => false,
    }
}

impl fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
