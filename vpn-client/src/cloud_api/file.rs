//! One connection file: an OpenVPN client config (the tunnel to one seed endpoint, as for
//! `vpn-client --config`, inline `<ca>`/`<cert>`/`<key>`/`<tls-auth>` blocks included) plus
//! the directives of the API proxy on that tunnel:
//!
//! ```text
//! cloud-api-allow HOST:PORT [HOST:PORT ...]   the allow-list (allow.rs), at least one entry
//! cloud-api-port PORT                         the proxy's port on the tunnel (default 3128,
//!                                             the endpoint's --cloud-api-port)
//! ```
//!
//! The tunnel device is the config's `dev` when it names one (`dev cpa0`); `dev tun` (a
//! pattern) gets `cpa-` and the file's stem, cut to 15 bytes. Pushed routes are never applied
//! (`route-nopull` is forced): the tunnel carries the endpoint's connections to the proxy and
//! nothing else. An error names the file and line, in both parts.

use std::path::Path;

use crate::config::{load_text, LoadError};
use crate::Settings;

use super::allow::{AllowList, Entry, EntryError};

/// The port the proxy listens on by default (the endpoint's default `--cloud-api-port`).
pub const DEFAULT_PROXY_PORT: u16 = 3128;
/// Connection files end in this.
pub const EXTENSION: &str = "conf";
/// What a derived device name starts with.
pub const DEVICE_PREFIX: &str = "cpa-";
/// The longest interface name Linux takes (`IFNAMSIZ` less the NUL).
pub const MAX_DEVICE_LEN: usize = 15;

const ALLOW: &str = "cloud-api-allow";
const PORT: &str = "cloud-api-port";

/// A parsed connection file.
#[derive(Debug, Clone)]
pub struct ConnectionSpec {
    /// The file's stem: the connection's name in logs and metrics.
    pub name: String,
    /// The tunnel device (the proxy takes connections arriving on it only).
    pub device: String,
    /// The proxy's port on the tunnel.
    pub proxy_port: u16,
    /// What the proxy may reach.
    pub allow: AllowList,
    /// The tunnel's client settings.
    pub settings: Settings,
    /// The OpenVPN part's warnings (directives without effect), `file:line: ...`.
    pub warnings: Vec<String>,
}

/// Why a connection file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A `cloud-api-*` line is malformed.
    #[error("{file}:{line}: '{directive}': {reason}")]
    Directive {
        /// The file.
        file: String,
        /// The line (from 1).
        line: usize,
        /// The directive.
        directive: &'static str,
        /// Why.
        reason: DirectiveError,
    },
    /// The file has no `cloud-api-allow` entry.
    #[error("{file}: no '{ALLOW}' line: the proxy would reach nothing")]
    NoAllow {
        /// The file.
        file: String,
    },
    /// The OpenVPN part is invalid (the error names the file and line).
    #[error(transparent)]
    Config(#[from] LoadError),
}

/// What is wrong with a `cloud-api-*` line.
#[derive(Debug, thiserror::Error)]
pub enum DirectiveError {
    /// An allow-list entry.
    #[error(transparent)]
    Entry(#[from] EntryError),
    /// `cloud-api-allow` with no entry.
    #[error("needs at least one HOST:PORT")]
    Empty,
    /// `cloud-api-port` without one port from 1 to 65535.
    #[error("want one port from 1 to 65535")]
    Port,
    /// `cloud-api-port` given twice.
    #[error("given twice")]
    Twice,
}

/// Parses the connection file `path` holding `text`.
pub fn parse(path: &Path, text: &str) -> Result<ConnectionSpec, FileError> {
    let file = path.display().to_string();
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entries = Vec::new();
    let mut port = None;
    // Our lines become empty lines, so the OpenVPN parser's line numbers stay true.
    let mut openvpn = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        let words: Vec<&str> = line
            .split_whitespace()
            .take_while(|w| !w.starts_with('#') && !w.starts_with(';'))
            .collect();
        let err = |directive, reason| FileError::Directive {
            file: file.clone(),
            line: i + 1,
            directive,
            reason,
        };
        match words.split_first() {
            Some((&ALLOW, rest)) => {
                if rest.is_empty() {
                    return Err(err(ALLOW, DirectiveError::Empty));
                }
                for w in rest {
                    entries.push(w.parse::<Entry>().map_err(|e| err(ALLOW, e.into()))?);
                }
            }
            Some((&PORT, rest)) => {
                let p = match rest {
                    [p] => p.parse::<u16>().ok().filter(|p| *p > 0),
                    _ => None,
                };
                let p = p.ok_or_else(|| err(PORT, DirectiveError::Port))?;
                if port.replace(p).is_some() {
                    return Err(err(PORT, DirectiveError::Twice));
                }
            }
            _ => openvpn.push_str(line),
        }
        openvpn.push('\n');
    }
    if entries.is_empty() {
        return Err(FileError::NoAllow { file });
    }
    let loaded = load_text(&file, &openvpn)?;
    let mut settings = loaded.settings;
    settings.pull.route_nopull = true;
    let device = if settings.tun.name.contains('%') {
        let mut d = format!("{DEVICE_PREFIX}{name}");
        while d.len() > MAX_DEVICE_LEN {
            d.pop();
        }
        d
    } else {
        settings.tun.name.clone()
    };
    settings.tun.name = device.clone();
    Ok(ConnectionSpec {
        name,
        device,
        proxy_port: port.unwrap_or(DEFAULT_PROXY_PORT),
        allow: AllowList::new(entries),
        settings,
        warnings: loaded.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TUNNEL: &str = "client\nproto tcp-client\nremote 10.1.0.2 1194\ndev tun\n\
        ca /nonexistent/ca.crt\ncert /nonexistent/c.crt\nkey /nonexistent/c.key\n";

    fn path(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/etc/cloud-api/{name}"))
    }

    #[test]
    fn our_lines_are_errors_with_file_and_line() {
        let text = "cloud-api-port 3128\n# comment\ncloud-api-allow api.example:443 nope\n";
        let err = parse(&path("seed-a.conf"), text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/cloud-api/seed-a.conf:3: 'cloud-api-allow': \"nope\": want HOST:PORT with a port from 1 to 65535"
        );
        let err = parse(&path("b.conf"), "cloud-api-port 1 2\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/cloud-api/b.conf:1: 'cloud-api-port': want one port from 1 to 65535"
        );
        let err = parse(&path("c.conf"), "cloud-api-port 1\ncloud-api-port 2\n").unwrap_err();
        assert!(
            err.to_string().starts_with("/etc/cloud-api/c.conf:2:"),
            "{err}"
        );
        let err = parse(&path("d.conf"), TUNNEL).unwrap_err();
        assert!(matches!(err, FileError::NoAllow { .. }), "{err}");
    }

    #[test]
    fn the_openvpn_part_keeps_its_line_numbers() {
        let text = format!("cloud-api-allow 10.20.0.0/22:443\n\n{TUNNEL}bogus-directive 1\n");
        let err = parse(&path("e.conf"), &text).unwrap_err();
        let shown = err.to_string();
        // The bogus directive sits on line 10 of the file.
        assert!(shown.contains("/etc/cloud-api/e.conf:10"), "{shown}");
    }
}
