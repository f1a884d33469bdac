//! A config line as typed values ([`Line`]): what a generated config is made of, vpn2's
//! above all (the role crates build vpn2's lines from its environment).
//!
//! One list of lines is the single source of a generated config, read two ways:
//!
//! - into the typed model without text ([`ServerOptions::from_lines`],
//!   [`ClientOptions::from_lines`]): each line stores what its directive's row of the parse
//!   table stores, with its position as its line number, and the same checks across
//!   directives and defaults as for a file follow;
//! - as config text for upstream OpenVPN ([`render`]): one text line per [`Line`], so the
//!   line numbers of the text and of the typed reading agree.
//!
//! Only the directives vpn2 writes have a variant. Parsing [`render`]'s text gives what
//! `from_lines` gives (tested in `tests/config_line.rs`).
//!
//! [`ServerOptions::from_lines`]: super::ServerOptions::from_lines
//! [`ClientOptions::from_lines`]: super::ClientOptions::from_lines

use std::fmt;
use std::path::PathBuf;

use ipnet::Ipv6Net;

use super::model::{CertUsage, ConnectRetry, CustomHeader, Family, Keepalive, Status};
use crate::digest::Digest;
use crate::key::{KeyDirection, Role};
use crate::ncp::DataCiphers;
use crate::push::{FilterAction, PullFilter};

/// One directive with its arguments as typed values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `mode server`.
    ModeServer,
    /// `tls-server`.
    TlsServer,
    /// `tls-client`.
    TlsClient,
    /// `pull`.
    Pull,
    /// `topology subnet`.
    TopologySubnet,
    /// `proto tcp[4|6]-server|client`.
    Proto(Family, Role),
    /// `verb N`.
    Verb(u8),
    /// `txqueuelen N`.
    Txqueuelen(u32),
    /// `tcp-nodelay`.
    TcpNodelay,
    /// `auth-nocache`.
    AuthNocache,
    /// `data-ciphers A:B`.
    DataCiphers(DataCiphers),
    /// `port N`.
    Port(u16),
    /// `keepalive N M`.
    Keepalive(Keepalive),
    /// `ping-restart N`.
    PingRestart(u32),
    /// `max-routes-per-client N`.
    MaxRoutesPerClient(u32),
    /// `client-config-dir DIR`.
    ClientConfigDir(PathBuf),
    /// `key FILE`.
    Key(FileArg),
    /// `cert FILE`.
    Cert(FileArg),
    /// `ca FILE`.
    Ca(FileArg),
    /// `dh none`.
    DhNone,
    /// `auth DIGEST`.
    Auth(Digest),
    /// `tls-auth FILE [0|1]` (a bidirectional key is written without a direction).
    TlsAuth(FileArg, KeyDirection),
    /// `remote-cert-tls server|client`.
    RemoteCertTls(CertUsage),
    /// `connect-retry N MAX`.
    ConnectRetry(ConnectRetry),
    /// `server-ipv6 NET/BITS`.
    ServerIpv6(Ipv6Net),
    /// `client-to-client`.
    ClientToClient,
    /// `duplicate-cn`.
    DuplicateCn,
    /// `dev NAME`.
    Dev(String),
    /// `http-proxy HOST PORT` (no credentials).
    HttpProxy {
        /// The proxy host.
        host: String,
        /// The proxy port.
        port: u16,
    },
    /// `http-proxy-option CUSTOM-HEADER NAME [VALUE]`.
    CustomHeader(CustomHeader),
    /// `management HOST PORT` (accepted without effect: we have no management interface).
    Management {
        /// The address to listen on.
        host: String,
        /// The port.
        port: u16,
    },
    /// `remote HOST` (the port is `port`'s).
    Remote(String),
    /// `pull-filter ACTION "TEXT"`.
    PullFilter(PullFilter),
    /// `script-security N`.
    ScriptSecurity(u8),
    /// `up "COMMAND"`.
    Up(String),
    /// `down "COMMAND"`.
    Down(String),
    /// `status FILE N`.
    Status(Status),
    /// `status-version N`.
    StatusVersion(u8),
}

/// A file argument and whether the text writes it in double quotes (vpn2's templates quote
/// some paths and not others; the text upstream gets keeps that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileArg {
    /// The path.
    pub path: PathBuf,
    /// Written as `"PATH"`.
    pub quoted: bool,
}

impl FileArg {
    /// A path written in double quotes.
    pub fn quoted(path: impl Into<PathBuf>) -> FileArg {
        FileArg {
            path: path.into(),
            quoted: true,
        }
    }

    /// A path written as it is.
    pub fn plain(path: impl Into<PathBuf>) -> FileArg {
        FileArg {
            path: path.into(),
            quoted: false,
        }
    }
}

impl fmt::Display for FileArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.quoted {
            write!(f, "\"{}\"", self.path.display())
        } else {
            write!(f, "{}", self.path.display())
        }
    }
}

impl Line {
    /// The directive's name, as in the parse table.
    pub fn name(&self) -> &'static str {
        match self {
            Line::ModeServer => "mode",
            Line::TlsServer => "tls-server",
            Line::TlsClient => "tls-client",
            Line::Pull => "pull",
            Line::TopologySubnet => "topology",
            Line::Proto(..) => "proto",
            Line::Verb(_) => "verb",
            Line::Txqueuelen(_) => "txqueuelen",
            Line::TcpNodelay => "tcp-nodelay",
            Line::AuthNocache => "auth-nocache",
            Line::DataCiphers(_) => "data-ciphers",
            Line::Port(_) => "port",
            Line::Keepalive(_) => "keepalive",
            Line::PingRestart(_) => "ping-restart",
            Line::MaxRoutesPerClient(_) => "max-routes-per-client",
            Line::ClientConfigDir(_) => "client-config-dir",
            Line::Key(_) => "key",
            Line::Cert(_) => "cert",
            Line::Ca(_) => "ca",
            Line::DhNone => "dh",
            Line::Auth(_) => "auth",
            Line::TlsAuth(..) => "tls-auth",
            Line::RemoteCertTls(_) => "remote-cert-tls",
            Line::ConnectRetry(_) => "connect-retry",
            Line::ServerIpv6(_) => "server-ipv6",
            Line::ClientToClient => "client-to-client",
            Line::DuplicateCn => "duplicate-cn",
            Line::Dev(_) => "dev",
            Line::HttpProxy { .. } => "http-proxy",
            Line::CustomHeader(_) => "http-proxy-option",
            Line::Management { .. } => "management",
            Line::Remote(_) => "remote",
            Line::PullFilter(_) => "pull-filter",
            Line::ScriptSecurity(_) => "script-security",
            Line::Up(_) => "up",
            Line::Down(_) => "down",
            Line::Status(_) => "status",
            Line::StatusVersion(_) => "status-version",
        }
    }

    /// The arguments as the text writes them, after the name (empty for none).
    fn args(&self) -> String {
        match self {
            Line::ModeServer => "server".to_owned(),
            Line::TopologySubnet => "subnet".to_owned(),
            Line::DhNone => "none".to_owned(),
            Line::TlsServer
            | Line::TlsClient
            | Line::Pull
            | Line::TcpNodelay
            | Line::AuthNocache
            | Line::ClientToClient
            | Line::DuplicateCn => String::new(),
            Line::Proto(family, role) => proto(*family, *role).to_owned(),
            Line::Verb(n) | Line::ScriptSecurity(n) | Line::StatusVersion(n) => n.to_string(),
            Line::Txqueuelen(n) | Line::PingRestart(n) | Line::MaxRoutesPerClient(n) => {
                n.to_string()
            }
            Line::Port(p) => p.to_string(),
            Line::DataCiphers(list) => list.to_string(),
            Line::Keepalive(k) => format!("{} {}", k.interval, k.timeout),
            Line::ClientConfigDir(dir) => dir.display().to_string(),
            Line::Key(file) | Line::Cert(file) | Line::Ca(file) => file.to_string(),
            Line::Auth(digest) => digest.name().to_owned(),
            Line::TlsAuth(file, KeyDirection::Bidirectional) => file.to_string(),
            Line::TlsAuth(file, KeyDirection::Normal) => format!("{file} 0"),
            Line::TlsAuth(file, KeyDirection::Inverse) => format!("{file} 1"),
            Line::RemoteCertTls(CertUsage::Server) => "server".to_owned(),
            Line::RemoteCertTls(CertUsage::Client) => "client".to_owned(),
            Line::ConnectRetry(r) => format!("{} {}", r.initial, r.max),
            Line::ServerIpv6(net) => net.to_string(),
            Line::Dev(name) | Line::Remote(name) => name.clone(),
            Line::HttpProxy { host, port } | Line::Management { host, port } => {
                format!("{host} {port}")
            }
            Line::CustomHeader(h) => match &h.content {
                Some(content) => format!("CUSTOM-HEADER {} {content}", h.name),
                None => format!("CUSTOM-HEADER {}", h.name),
            },
            Line::PullFilter(filter) => {
                let action = match filter.action {
                    FilterAction::Accept => "accept",
                    FilterAction::Ignore => "ignore",
                    FilterAction::Reject => "reject",
                };
                format!("{action} \"{}\"", filter.text)
            }
            Line::Up(cmd) | Line::Down(cmd) => format!("\"{cmd}\""),
            Line::Status(s) => format!("{} {}", s.path.display(), s.interval),
        }
    }
}

impl fmt::Display for Line {
    /// The line of config text, without its newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = self.args();
        if args.is_empty() {
            f.write_str(self.name())
        } else {
            write!(f, "{} {args}", self.name())
        }
    }
}

/// The config text of `lines`: one text line each, every one ending in a newline.
pub fn render(lines: &[Line]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// `proto`'s argument for a family and role (`tcp6-server`, `tcp-client`, ...).
fn proto(family: Family, role: Role) -> &'static str {
    match (family, role) {
        (Family::Any, Role::Server) => "tcp-server",
        (Family::V4, Role::Server) => "tcp4-server",
        (Family::V6, Role::Server) => "tcp6-server",
        (Family::Any, Role::Client) => "tcp-client",
        (Family::V4, Role::Client) => "tcp4-client",
        (Family::V6, Role::Client) => "tcp6-client",
    }
}
