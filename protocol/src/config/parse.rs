//! One pass over the directives into [`Raw`] (everything set, with its line), then the role
//! checks and cross-directive validation ([`finish`]) into [`ServerOptions`] /
//! [`ClientOptions`].
//!
//! Directive parsing is a table: one row ([`Spec`]) per directive of a main config, with the
//! arguments it takes (counted before its parser runs), the role it belongs to if only one,
//! and its parser, a small function that stores what the directive sets into [`Raw`]. The
//! rows and their parsers live together, by family:
//!
//! | module | directives |
//! |---|---|
//! | [`role`] | what decides the role and the transport: `mode`, `tls-server`, `client`, `proto`, `topology`, ... |
//! | [`connection`] | the device, the socket, the keepalive timers: `dev`, `port`, `remote`, `mssfix`, `keepalive`, ... |
//! | [`crypto`] | keys, TLS, the data channel: `ca`, `tls-crypt`, `data-ciphers`, `compress`, `reneg-sec`, ... (and the inline blocks) |
//! | [`host`] | what the binary does on the host: `route`, `route-ipv6`, `up`, `down`, `status`, `verb`, ... |
//! | [`server`] | the server's: `server`, `server-ipv6`, `ifconfig-pool`, `push`, `max-clients`, ... |
//! | [`client`] | the client's: `http-proxy`, `pull-filter`, `route-nopull`, `connect-retry`, ... |
//! | [`ignored`] | accepted without effect (a [`Warning`](super::Warning)), and the client-config-dir directives refused here |
//!
//! A name in no row is [`ErrorReason::UnknownDirective`].
//!
//! A generated config's typed lines ([`Line`]) skip the text: [`typed`] stores each into
//! [`Raw`] as its row would, and the same [`finish`] follows.

mod client;
mod connection;
mod crypto;
mod finish;
mod host;
mod ignored;
mod raw;
mod role;
mod server;
mod typed;

use self::raw::Raw;
use super::args::Args;
use super::lex::{lex, Directive};
use super::line::Line;
use super::model::*;
use super::{ConfigError, ErrorReason, Parsed};
use crate::key::Role;

/// Parses a config of either role.
pub fn parse(file: &str, text: &str) -> Result<Parsed<Options>, ConfigError> {
    let raw = collect(file, text)?;
    let role = raw.roles.role(file)?;
    raw.finish(file, role)
}

impl ServerOptions {
    /// Parses a server config; a client config is [`ErrorReason::RoleMismatch`].
    pub fn parse(file: &str, text: &str) -> Result<Parsed<ServerOptions>, ConfigError> {
        ServerOptions::from_raw(file, collect(file, text)?)
    }

    /// The server config of typed `lines` (see [`Line`]), checked and completed as the
    /// parse of their text is; `file` names it in errors and warnings.
    pub fn from_lines(file: &str, lines: &[Line]) -> Result<Parsed<ServerOptions>, ConfigError> {
        ServerOptions::from_raw(file, typed::collect_lines(file, lines)?)
    }

    fn from_raw(file: &str, raw: Raw) -> Result<Parsed<ServerOptions>, ConfigError> {
        check_role(file, raw.roles.role(file)?, Role::Server)?;
        let parsed = raw.finish(file, Role::Server)?;
        match parsed.config {
            Options::Server(config) => Ok(Parsed {
                config,
                warnings: parsed.warnings,
            }),
            Options::Client(_) => Err(whole(file, role_mismatch(Role::Server, Role::Client))),
        }
    }
}

impl ClientOptions {
    /// Parses a client config; a server config is [`ErrorReason::RoleMismatch`].
    pub fn parse(file: &str, text: &str) -> Result<Parsed<ClientOptions>, ConfigError> {
        ClientOptions::from_raw(file, collect(file, text)?)
    }

    /// The client config of typed `lines` (see [`Line`]), checked and completed as the
    /// parse of their text is; `file` names it in errors and warnings.
    pub fn from_lines(file: &str, lines: &[Line]) -> Result<Parsed<ClientOptions>, ConfigError> {
        ClientOptions::from_raw(file, typed::collect_lines(file, lines)?)
    }

    fn from_raw(file: &str, raw: Raw) -> Result<Parsed<ClientOptions>, ConfigError> {
        check_role(file, raw.roles.role(file)?, Role::Client)?;
        let parsed = raw.finish(file, Role::Client)?;
        match parsed.config {
            Options::Client(config) => Ok(Parsed {
                config,
                warnings: parsed.warnings,
            }),
            Options::Server(_) => Err(whole(file, role_mismatch(Role::Client, Role::Server))),
        }
    }
}

/// One row of the directive table.
struct Spec {
    /// The directive's name.
    name: &'static str,
    /// The arguments it takes.
    args: Arity,
    /// The role it belongs to, if only one: a config of the other role refuses it
    /// ([`ErrorReason::WrongRole`]).
    only: Option<Role>,
    /// Stores what it sets, after its arguments were counted.
    parse: Parser,
}

/// A directive's parser: reads its arguments and stores what they set.
type Parser = fn(&mut Raw, &Args<'_>) -> Result<(), ErrorReason>;

impl Spec {
    /// A directive of either role.
    const fn new(name: &'static str, args: Arity, parse: Parser) -> Spec {
        Spec {
            name,
            args,
            only: None,
            parse,
        }
    }

    /// The same directive, valid in a server config only.
    const fn server_only(self) -> Spec {
        Spec {
            only: Some(Role::Server),
            ..self
        }
    }

    /// The same directive, valid in a client config only.
    const fn client_only(self) -> Spec {
        Spec {
            only: Some(Role::Client),
            ..self
        }
    }
}

/// How many arguments a directive takes, and what they are (for
/// [`ErrorReason::MissingArgument`]).
#[derive(Clone, Copy)]
struct Arity {
    min: usize,
    max: usize,
    expected: &'static str,
}

/// `min` to `max` arguments, described as `expected` (e.g. `HOST [PORT [PROTO]]`).
const fn takes(min: usize, max: usize, expected: &'static str) -> Arity {
    Arity { min, max, expected }
}

/// A directive without arguments.
const NO_ARGS: Arity = takes(0, 0, "");

/// Whatever arguments are given (for the directives ignored or refused as a whole).
const ANY_ARGS: Arity = takes(0, usize::MAX, "");

/// The directive table, by family.
static TABLE: [&[Spec]; 7] = [
    role::DIRECTIVES,
    connection::DIRECTIVES,
    crypto::DIRECTIVES,
    host::DIRECTIVES,
    server::DIRECTIVES,
    client::DIRECTIVES,
    ignored::DIRECTIVES,
];

/// The row for `name`.
fn lookup(name: &str) -> Option<&'static Spec> {
    TABLE
        .iter()
        .flat_map(|family| family.iter())
        .find(|spec| spec.name == name)
}

fn collect(file: &str, text: &str) -> Result<Raw, ConfigError> {
    let mut raw = Raw::default();
    for d in lex(file, text)? {
        if let Err(reason) = raw.apply(&d) {
            return Err(at(file, d.line, &d.name, reason));
        }
    }
    Ok(raw)
}

impl Raw {
    /// Reads one directive: an inline block, or the arguments of its row.
    fn apply(&mut self, d: &Directive) -> Result<(), ErrorReason> {
        if let Some(content) = &d.inline {
            return crypto::inline(self, &d.name, d.line, content);
        }
        let Some(spec) = lookup(&d.name) else {
            return Err(ErrorReason::UnknownDirective);
        };
        let a = Args(d);
        a.count(spec.args.min, spec.args.max, spec.args.expected)?;
        (spec.parse)(self, &a)?;
        if let Some(role) = spec.only {
            self.roles.only_in(role, &d.name, d.line);
        }
        Ok(())
    }
}

fn role_mismatch(expected: Role, found: Role) -> ErrorReason {
    ErrorReason::RoleMismatch { expected, found }
}

fn check_role(file: &str, found: Role, expected: Role) -> Result<(), ConfigError> {
    if found == expected {
        Ok(())
    } else {
        Err(whole(file, role_mismatch(expected, found)))
    }
}

/// An error of the file as a whole (no line).
fn whole(file: &str, reason: ErrorReason) -> ConfigError {
    let directive = match &reason {
        ErrorReason::MissingDirective { directive } => Some((*directive).to_owned()),
        _ => None,
    };
    ConfigError {
        file: file.to_owned(),
        line: None,
        directive,
        reason,
    }
}

/// An error of `directive` at `line`.
fn at(file: &str, line: usize, directive: &str, reason: ErrorReason) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: Some(line),
        directive: Some(directive.to_owned()),
        reason,
    }
}

fn missing(directive: &'static str) -> ErrorReason {
    ErrorReason::MissingDirective { directive }
}

fn conflict(other: &str, other_line: usize) -> ErrorReason {
    ErrorReason::Conflict {
        other: other.to_owned(),
        other_line,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::TABLE;

    #[test]
    fn each_directive_has_one_row() {
        let mut seen = HashSet::new();
        for spec in TABLE.iter().flat_map(|family| family.iter()) {
            assert!(seen.insert(spec.name), "two rows for {}", spec.name);
        }
    }
}
