//! OpenVPN config files as text, parsed into a typed model ([`ServerOptions`],
//! [`ClientOptions`], [`CcdOptions`]), and the vpn2 environment variables ([`mod@env`]).
//!
//! This module never opens a file: the caller reads the text and passes a display name for
//! errors. Directives that name a file (`ca`, `cert`, `key`, `tls-auth`, `tls-crypt`,
//! `client-config-dir`, `status`) keep the path ([`Source::Path`]) or the inline block's text
//! ([`Source::Inline`]); the binaries read them later.
//!
//! An unknown or malformed directive is a [`ConfigError`] naming the file, the line and the
//! directive (`server.conf:12: unknown directive 'tls-authh'`); nothing is silently ignored.
//! Directives we accept without acting on them (`management`, `user`, ...) come back as
//! [`Warning`]s beside the config, for the binary to log.
//!
//! Pipeline: [`lex()`] (lines, comments, quoting via [`crate::push::tokenize`], inline blocks) →
//! one pass over the directives into a collection of everything set, with line numbers →
//! role checks and upstream's cross-directive validation → the typed model. A generated
//! config (vpn2's, built from its environment by the role crates) is a list of typed
//! [`Line`]s instead: read into the same collection without text
//! ([`ServerOptions::from_lines`]), or rendered as text for upstream OpenVPN ([`render`]).
//!
//! What upstream does that we refuse, with a clear error: UDP (`proto udp`: TCP only),
//! `topology net30`/`p2p` (and `server` without `topology subnet`, since net30 is upstream's
//! default), a `dh` file (we are ECDHE only: `dh none`), real compression (`comp-lzo yes`,
//! `compress lz4`), `mode p2p`.

mod args;
mod ccd;
pub mod env;
pub mod lex;
pub mod line;
mod model;
pub mod netmap;
mod parse;

use std::fmt;
use std::path::PathBuf;

pub use self::ccd::{CcdOptions, IfconfigIpv6Push, IfconfigPush};
pub use self::lex::{lex, Directive, INLINE_TAGS};
pub use self::line::{render, FileArg, Line};
pub use self::model::*;
pub use self::parse::parse;

use crate::key::Role;
use crate::ncp::NcpConfigError;
use crate::push::tokenize::TokenizeError;

/// Where a key or certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A file path (`ca /srv/secrets/ca.crt`), read by the binary.
    Path(PathBuf),
    /// The content of an inline block (`<ca>` ... `</ca>`), exactly as written.
    Inline(String),
}

/// A parsed config and what was accepted without effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<T> {
    /// The config.
    pub config: T,
    /// Directives accepted but not acted on, in file order.
    pub warnings: Vec<Warning>,
}

/// A config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The display name the caller gave for the file.
    pub file: String,
    /// The 1-based line, or `None` for a problem of the file as a whole (a missing directive).
    pub line: Option<usize>,
    /// The directive at fault, when there is one.
    pub directive: Option<String>,
    /// What is wrong.
    pub reason: ErrorReason,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        match (&self.reason, &self.directive) {
            (ErrorReason::UnknownDirective, Some(d)) => write!(f, ": unknown directive '{d}'"),
            (reason @ ErrorReason::MissingDirective { .. }, _) => write!(f, ": {reason}"),
            (reason, Some(d)) => write!(f, ": '{d}': {reason}"),
            (reason, None) => write!(f, ": {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a config was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorReason {
    /// The line could not be split into tokens (quoting, backslashes, length).
    #[error("{0}")]
    Tokenize(TokenizeError),
    /// `<tag>` for a directive that has no inline form here.
    #[error("unknown inline block <{tag}> (inline blocks: ca, cert, key, tls-auth, tls-crypt)")]
    UnknownInlineTag {
        /// The tag.
        tag: String,
    },
    /// `<tag>` without a `</tag>` line before the end of the file.
    #[error("inline block <{tag}> is not closed by </{tag}>")]
    UnterminatedInline {
        /// The tag.
        tag: String,
    },
    /// `</tag>` outside a block.
    #[error("</{tag}> without an opening <{tag}>")]
    UnexpectedInlineEnd {
        /// The tag.
        tag: String,
    },
    /// Something after `<tag>` on its line.
    #[error("text after <{tag}> on the same line")]
    InlineTrailingText {
        /// The tag.
        tag: String,
    },
    /// A directive we do not know (or a typo).
    #[error("unknown directive")]
    UnknownDirective,
    /// Fewer arguments than the directive needs.
    #[error("missing argument: expected {expected}")]
    MissingArgument {
        /// What was expected, e.g. `NETWORK NETMASK`.
        expected: &'static str,
    },
    /// More arguments than the directive takes.
    #[error("too many arguments (at most {max})")]
    TooManyArguments {
        /// The most it takes.
        max: usize,
    },
    /// An argument of the wrong form.
    #[error("bad argument '{value}': expected {expected}")]
    BadArgument {
        /// The argument as written.
        value: String,
        /// What was expected, e.g. `an IPv4 address`.
        expected: &'static str,
    },
    /// A UDP protocol: we speak OpenVPN over TCP only.
    #[error("'{proto}' is not supported: TCP only (tcp-server, tcp-client, tcp4-*, tcp6-*)")]
    TcpOnly {
        /// The protocol as written.
        proto: String,
    },
    /// `proto` was not given: upstream would use UDP.
    #[error(
        "no 'proto' given (upstream defaults to udp): TCP only, add proto tcp-server or tcp-client"
    )]
    NoProto,
    /// A topology other than `subnet`.
    #[error("topology '{topology}' is not supported: only 'topology subnet'")]
    UnsupportedTopology {
        /// The topology as written, or `net30 (the default)`.
        topology: String,
    },
    /// Real compression (we only frame with the compression stubs).
    #[error(
        "'{value}': compression is not supported (only 'comp-lzo no' and 'compress stub|stub-v2')"
    )]
    UnsupportedCompression {
        /// The setting as written.
        value: String,
    },
    /// `mode p2p` or another mode than `server`.
    #[error("mode '{mode}' is not supported: only 'mode server' (or a client config)")]
    UnsupportedMode {
        /// The mode as written.
        mode: String,
    },
    /// A `data-ciphers` / `data-ciphers-fallback` / `cipher` value we cannot use.
    #[error("{0}")]
    Ncp(NcpConfigError),
    /// A netmask that is not contiguous ones then zeros.
    #[error("'{mask}' is not a valid netmask")]
    BadNetmask {
        /// The mask as written.
        mask: String,
    },
    /// A network with host bits set (`server 10.8.0.1 255.255.255.0`).
    #[error("'{network}' has host bits set for its netmask")]
    NotNetworkAddress {
        /// The network as written.
        network: String,
    },
    /// A `server` netmask outside what upstream accepts.
    #[error("netmask /{bits} is out of range: /{min} to /{max}")]
    PrefixOutOfRange {
        /// The prefix length given.
        bits: u8,
        /// The shortest accepted.
        min: u8,
        /// The longest accepted.
        max: u8,
    },
    /// `keepalive N M` with M < 2N or a zero.
    #[error("keepalive {interval} {timeout}: both must be > 0 and the timeout at least twice the interval")]
    KeepaliveRatio {
        /// N.
        interval: u32,
        /// M.
        timeout: u32,
    },
    /// `ifconfig-pool START END` with START after END, or in another network.
    #[error("pool start {start} is after pool end {end}")]
    PoolRange {
        /// Start as written.
        start: String,
        /// End as written.
        end: String,
    },
    /// This directive cannot be combined with another one.
    #[error("conflicts with '{other}' on line {other_line}")]
    Conflict {
        /// The other directive.
        other: String,
        /// Its line.
        other_line: usize,
    },
    /// A directive of the other role (`push` in a client config, `remote` in a server one).
    #[error("only valid in a {} config", role_name(*role))]
    WrongRole {
        /// The role the directive belongs to.
        role: Role,
    },
    /// A server-config directive inside a client-config-dir file.
    #[error("not allowed in a client-config-dir file")]
    NotInClientConfigDir,
    /// A client-config-dir directive (`iroute`, `ifconfig-push`, ...) in the main config.
    #[error("only allowed in a client-config-dir file")]
    OnlyInClientConfigDir,
    /// More of a repeatable directive than allowed.
    #[error("at most {max} allowed")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// A directive the config cannot do without.
    #[error("missing required directive '{directive}'")]
    MissingDirective {
        /// What is missing (may name alternatives, e.g. `server or server-ipv6`).
        directive: &'static str,
    },
    /// Neither a server nor a client config.
    #[error("neither a server ('mode server', 'server') nor a client ('client', 'tls-client' + 'pull') config")]
    NoRole,
    /// The config is of the other role than the caller asked for.
    #[error("this is a {} config, a {} config was expected", role_name(*found), role_name(*expected))]
    RoleMismatch {
        /// The role the caller wanted.
        expected: Role,
        /// The role of the config.
        found: Role,
    },
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Client => "client",
        Role::Server => "server",
    }
}

/// A directive accepted without acting on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The display name of the file.
    pub file: String,
    /// The 1-based line.
    pub line: usize,
    /// The directive.
    pub directive: String,
    /// Why it has no effect.
    pub kind: WarningKind,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: '{}': {}",
            self.file, self.line, self.directive, self.kind
        )
    }
}

/// Why an accepted directive has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WarningKind {
    /// Harmless, but we do not implement it (`management`, `user`, `resolv-retry`, ...).
    #[error("accepted but not implemented; ignored")]
    NotImplemented,
    /// Upstream ignores it in this role too (`pull-filter` on a server).
    #[error("has no effect in a {} config; ignored", role_name(*role))]
    IgnoredForRole {
        /// The role of the config.
        role: Role,
    },
    /// `dh FILE`: finite-field DH parameters are not used; the TLS key exchange is ECDHE only.
    #[error("DH parameter file ignored: key exchange is ECDHE only (as with `dh none`)")]
    DhFileIgnored,
    /// Upstream ignores it in TCP mode (`explicit-exit-notify`).
    #[error("has no effect over TCP; ignored")]
    NoEffectOverTcp,
}
