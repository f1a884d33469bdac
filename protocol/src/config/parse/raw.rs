//! [`Raw`]: everything a config sets, with the line that set it (the last one wins, as
//! upstream), before any check across directives. Grouped as [`super::finish`] consumes it:
//! what decides the role, what both roles share, the server's, the client's.

use std::path::PathBuf;

use ipnet::Ipv6Net;

use super::whole;
use crate::config::model::*;
use crate::config::{ConfigError, ErrorReason, Source, WarningKind};
use crate::data::{Compression, DataCipher};
use crate::digest::Digest;
use crate::key::{KeyDirection, Role};
use crate::ncp::DataCiphers;
use crate::push::PullFilter;

/// A `(value, line)` pair.
pub(super) type At<T> = Option<(T, usize)>;

/// Everything a config sets.
#[derive(Default)]
pub(super) struct Raw {
    pub(super) roles: Roles,
    pub(super) common: RawCommon,
    pub(super) server: RawServer,
    pub(super) client: RawClient,
    /// Directives accepted without effect: line, directive, why.
    pub(super) warnings: Vec<(usize, String, WarningKind)>,
}

impl Raw {
    /// Notes that the directive at `line` has no effect.
    pub(super) fn warn(&mut self, line: usize, directive: &str, kind: WarningKind) {
        self.warnings.push((line, directive.to_owned(), kind));
    }
}

/// What decides the config's role, and the directives that belong to one role.
#[derive(Default)]
pub(super) struct Roles {
    /// Directives that make this a server config (`mode server`, `server`, `proto
    /// tcp-server`, ...), with their lines.
    pub(super) server_marks: Vec<(String, usize)>,
    /// Directives that make this a client config (`client`, `pull`, ...).
    pub(super) client_marks: Vec<(String, usize)>,
    pub(super) mode_server: Option<usize>,
    pub(super) tls_server: Option<usize>,
    pub(super) tls_client: Option<usize>,
    pub(super) pull: Option<usize>,
    /// Directives only a server config may hold (a client config refuses them).
    pub(super) server_only: Vec<(String, usize)>,
    /// Directives only a client config may hold.
    pub(super) client_only: Vec<(String, usize)>,
}

impl Roles {
    /// Records that `what` at `line` makes this a `role` config; a mark of the other role is
    /// a conflict with the first one.
    pub(super) fn mark(&mut self, role: Role, what: &str, line: usize) -> Result<(), ErrorReason> {
        let (mine, other) = match role {
            Role::Server => (&mut self.server_marks, &self.client_marks),
            Role::Client => (&mut self.client_marks, &self.server_marks),
        };
        if let Some((other, other_line)) = other.first() {
            return Err(ErrorReason::Conflict {
                other: other.clone(),
                other_line: *other_line,
            });
        }
        mine.push((what.to_owned(), line));
        Ok(())
    }

    /// Records that `what` at `line` is only valid in a `role` config.
    pub(super) fn only_in(&mut self, role: Role, what: &str, line: usize) {
        let list = match role {
            Role::Server => &mut self.server_only,
            Role::Client => &mut self.client_only,
        };
        list.push((what.to_owned(), line));
    }

    /// The role the directives say this config has.
    pub(super) fn role(&self, file: &str) -> Result<Role, ConfigError> {
        match (self.server_marks.is_empty(), self.client_marks.is_empty()) {
            (false, _) => Ok(Role::Server),
            (true, false) => Ok(Role::Client),
            (true, true) => Err(whole(file, ErrorReason::NoRole)),
        }
    }
}

/// What both roles set: becomes [`CommonOptions`].
#[derive(Default)]
pub(super) struct RawCommon {
    pub(super) proto: At<(Family, Option<Role>)>,
    pub(super) dev: At<String>,
    pub(super) dev_type: Option<DevType>,
    pub(super) port: Option<u16>,
    pub(super) local: Option<String>,
    pub(super) ca: Option<Source>,
    pub(super) cert: Option<Source>,
    pub(super) key: Option<Source>,
    pub(super) tls_auth: At<(Source, Option<KeyDirection>)>,
    pub(super) tls_crypt: At<Source>,
    pub(super) key_direction: Option<KeyDirection>,
    pub(super) auth: Option<Digest>,
    pub(super) data_ciphers: Option<DataCiphers>,
    pub(super) data_ciphers_fallback: Option<DataCipher>,
    pub(super) cipher: Option<DataCipher>,
    pub(super) compression: Compression,
    pub(super) remote_cert_tls: Option<CertUsage>,
    pub(super) verify_x509_name: Option<VerifyX509Name>,
    pub(super) tls_version_min: Option<TlsVersionMin>,
    pub(super) reneg_sec: Option<RenegSec>,
    pub(super) reneg_bytes: Option<u64>,
    pub(super) reneg_pkts: Option<u64>,
    pub(super) hand_window: Option<u32>,
    pub(super) tls_timeout: Option<u32>,
    pub(super) tran_window: Option<u32>,
    pub(super) replay_window: Option<ReplayWindow>,
    pub(super) keepalive: At<Keepalive>,
    pub(super) ping: At<u32>,
    pub(super) ping_restart: At<u32>,
    pub(super) tun_mtu: Option<u32>,
    pub(super) txqueuelen: Option<u32>,
    pub(super) mssfix: Option<MssFix>,
    pub(super) sndbuf: Option<u32>,
    pub(super) rcvbuf: Option<u32>,
    pub(super) tcp_nodelay: bool,
    pub(super) routes: Vec<Route>,
    pub(super) routes_ipv6: Vec<RouteIpv6>,
    pub(super) script_security: Option<u8>,
    pub(super) up: Option<String>,
    pub(super) down: Option<String>,
    pub(super) persist_key: bool,
    pub(super) persist_tun: bool,
    pub(super) disable_dco: bool,
    pub(super) status: Option<Status>,
    pub(super) status_version: Option<u8>,
    pub(super) verb: Option<u8>,
}

/// What only a server sets: becomes [`ServerOptions`].
#[derive(Default)]
pub(super) struct RawServer {
    pub(super) topology_subnet: bool,
    /// The network and the netmask as written.
    pub(super) server: At<(ServerNetwork, String)>,
    pub(super) server_ipv6: Option<Ipv6Net>,
    pub(super) ifconfig_pool: At<IfconfigPool>,
    pub(super) push: Vec<String>,
    pub(super) client_config_dir: Option<PathBuf>,
    pub(super) duplicate_cn: bool,
    pub(super) client_to_client: bool,
    pub(super) max_clients: Option<u32>,
    pub(super) max_routes_per_client: Option<u32>,
}

/// What only a client sets: becomes [`ClientOptions`].
#[derive(Default)]
pub(super) struct RawClient {
    /// Host, port and family as written (the defaults are `port` and `proto`'s).
    pub(super) remotes: Vec<(String, Option<u16>, Option<Family>)>,
    pub(super) nobind: bool,
    pub(super) http_proxy: Option<HttpProxy>,
    pub(super) http_proxy_options: HttpProxyOptions,
    /// The filters, with the line of the first (a server warns about it).
    pub(super) pull_filters: At<Vec<PullFilter>>,
    pub(super) route_nopull: bool,
    pub(super) connect_retry: Option<ConnectRetry>,
    pub(super) connect_retry_max: Option<u32>,
    pub(super) auth_nocache: bool,
}
