//! Typed lines ([`Line`]) read into [`Raw`] without text: each stores what its directive's
//! row stores (the values are already typed, so only the checks of their range are left),
//! with its 1-based position as its line; the row's role restriction applies as for a file.
//! [`Raw::finish`] then checks across directives and fills in the defaults, as for a file.

use super::client::{add_custom_header, add_pull_filter};
use super::connection::check_keepalive;
use super::raw::Raw;
use super::server::check_server_ipv6;
use super::{at, lookup};
use crate::config::args::bad;
use crate::config::line::Line;
use crate::config::model::HttpProxy;
use crate::config::{ConfigError, ErrorReason, Source, WarningKind};
use crate::key::Role;

/// `lines` read into [`Raw`]; an error names the line's position and directive.
pub(super) fn collect_lines(file: &str, lines: &[Line]) -> Result<Raw, ConfigError> {
    let mut raw = Raw::default();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        if let Err(reason) = raw.store(line, n) {
            return Err(at(file, n, line.name(), reason));
        }
    }
    Ok(raw)
}

impl Raw {
    /// Stores `line`, at line `n`.
    fn store(&mut self, line: &Line, n: usize) -> Result<(), ErrorReason> {
        let name = line.name();
        if !self.store_role(line, n)? {
            self.store_value(line, n)?;
        }
        if let Some(role) = lookup(name).and_then(|spec| spec.only) {
            self.roles.only_in(role, name, n);
        }
        Ok(())
    }

    /// The lines that decide the role; `false` for the others.
    fn store_role(&mut self, line: &Line, n: usize) -> Result<bool, ErrorReason> {
        let name = line.name();
        let roles = &mut self.roles;
        match line {
            Line::ModeServer => {
                roles.mark(Role::Server, name, n)?;
                roles.mode_server = Some(n);
            }
            Line::TlsServer => {
                roles.mark(Role::Server, name, n)?;
                roles.tls_server = Some(n);
            }
            Line::TlsClient => {
                roles.mark(Role::Client, name, n)?;
                roles.tls_client = Some(n);
            }
            Line::Pull => {
                roles.mark(Role::Client, name, n)?;
                roles.pull = Some(n);
            }
            Line::Proto(family, role) => {
                roles.mark(*role, name, n)?;
                self.common.proto = Some(((*family, Some(*role)), n));
            }
            Line::ServerIpv6(net) => {
                check_server_ipv6(*net, &net.to_string())?;
                roles.mark(Role::Server, name, n)?;
                self.server.server_ipv6 = Some(*net);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The lines that set a value.
    fn store_value(&mut self, line: &Line, n: usize) -> Result<(), ErrorReason> {
        if let Line::Management { .. } = line {
            self.warn(n, line.name(), WarningKind::NotImplemented);
            return Ok(());
        }
        let (c, s) = (&mut self.common, &mut self.server);
        match line {
            Line::TopologySubnet => s.topology_subnet = true,
            Line::Verb(v) => c.verb = Some(at_most(*v, 11, "0 to 11")?),
            Line::Txqueuelen(q) => c.txqueuelen = Some(*q),
            Line::TcpNodelay => c.tcp_nodelay = true,
            Line::AuthNocache => self.client.auth_nocache = true,
            Line::DataCiphers(list) => c.data_ciphers = Some(list.clone()),
            Line::Port(0) => return Err(bad("0", "a port 1-65535")),
            Line::Port(p) => c.port = Some(*p),
            Line::Keepalive(k) => {
                check_keepalive(*k)?;
                c.keepalive = Some((*k, n));
            }
            Line::PingRestart(secs) => c.ping_restart = Some((*secs, n)),
            // Upstream raises anything below 1 to 1.
            Line::MaxRoutesPerClient(m) => s.max_routes_per_client = Some((*m).max(1)),
            Line::ClientConfigDir(dir) => s.client_config_dir = Some(dir.clone()),
            Line::Key(f) => c.key = Some(Source::Path(f.path.clone())),
            Line::Cert(f) => c.cert = Some(Source::Path(f.path.clone())),
            Line::Ca(f) => c.ca = Some(Source::Path(f.path.clone())),
            Line::DhNone => {}
            Line::Auth(digest) => c.auth = Some(*digest),
            Line::TlsAuth(f, dir) => {
                c.tls_auth = Some(((Source::Path(f.path.clone()), Some(*dir)), n));
            }
            Line::RemoteCertTls(usage) => c.remote_cert_tls = Some(*usage),
            Line::ConnectRetry(retry) => self.client.connect_retry = Some(*retry),
            Line::ClientToClient => s.client_to_client = true,
            Line::DuplicateCn => s.duplicate_cn = true,
            Line::Dev(dev) => c.dev = Some((dev.clone(), n)),
            Line::HttpProxy { port: 0, .. } => return Err(bad("0", "a port 1-65535")),
            Line::HttpProxy { host, port } => {
                self.client.http_proxy = Some(HttpProxy {
                    host: host.clone(),
                    port: *port,
                    auth: None,
                });
            }
            Line::CustomHeader(h) => {
                add_custom_header(&mut self.client.http_proxy_options, h.clone())?;
            }
            Line::Remote(host) => self.client.remotes.push((host.clone(), None, None)),
            Line::PullFilter(filter) => add_pull_filter(&mut self.client, filter.clone(), n),
            Line::ScriptSecurity(v) => {
                c.script_security = Some(at_most(*v, 3, "0, 1, 2 or 3")?);
            }
            Line::Up(cmd) => c.up = Some(cmd.clone()),
            Line::Down(cmd) => c.down = Some(cmd.clone()),
            Line::Status(status) => c.status = Some(status.clone()),
            Line::StatusVersion(0) => return Err(bad("0", "1, 2 or 3")),
            Line::StatusVersion(v) => c.status_version = Some(at_most(*v, 3, "1, 2 or 3")?),
            Line::ModeServer
            | Line::TlsServer
            | Line::TlsClient
            | Line::Pull
            | Line::Proto(..)
            | Line::ServerIpv6(_)
            | Line::Management { .. } => {}
        }
        Ok(())
    }
}

/// `v` if at most `max`, else the argument error a file's line would get.
fn at_most(v: u8, max: u8, expected: &'static str) -> Result<u8, ErrorReason> {
    if v <= max {
        Ok(v)
    } else {
        Err(bad(&v.to_string(), expected))
    }
}
