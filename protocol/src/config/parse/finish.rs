//! What can only be decided once every directive is read, one named step each, in the order
//! their errors take precedence: directives of the other role, what both roles need
//! ([`RawCommon::finish`]), then the server's ([`RawServer::finish`]) or the client's
//! ([`RawClient::finish`]); and the typed model the steps build.

use super::raw::{At, Raw, RawClient, RawCommon, RawServer, Roles};
use super::{at, conflict, missing, whole};
use crate::config::args::bad;
use crate::config::model::*;
use crate::config::{ConfigError, ErrorReason, Parsed, Source, Warning, WarningKind};
use crate::digest::Digest;
use crate::key::{KeyDirection, Role};
use crate::ncp::DataCiphers;

impl Raw {
    /// Validates across directives and builds the model for `role`.
    pub(super) fn finish(self, file: &str, role: Role) -> Result<Parsed<Options>, ConfigError> {
        let Raw {
            roles,
            common,
            server,
            client,
            mut warnings,
        } = self;
        roles.refuse_other_role(file, role)?;
        let common = common.finish(file)?;
        let config = match role {
            Role::Server => {
                if let Some((_, line)) = &client.pull_filters {
                    warnings.push((
                        *line,
                        "pull-filter".to_owned(),
                        WarningKind::IgnoredForRole { role },
                    ));
                }
                Options::Server(server.finish(file, &roles, common)?)
            }
            Role::Client => Options::Client(client.finish(file, &roles, common)?),
        };
        Ok(Parsed {
            config,
            warnings: in_file_order(file, warnings),
        })
    }
}

impl Roles {
    /// The first directive that belongs to the other role is an error at its line.
    fn refuse_other_role(&self, file: &str, role: Role) -> Result<(), ConfigError> {
        let wrong = match role {
            Role::Server => self.client_only.first().map(|w| (w, Role::Client)),
            Role::Client => self.server_only.first().map(|w| (w, Role::Server)),
        };
        match wrong {
            Some(((directive, line), owner)) => Err(at(
                file,
                *line,
                directive,
                ErrorReason::WrongRole { role: owner },
            )),
            None => Ok(()),
        }
    }
}

impl RawCommon {
    /// What both roles need: `proto`, the device, the key files; then the directives that
    /// exclude each other; then the defaults of what was not given.
    fn finish(self, file: &str) -> Result<CommonOptions, ConfigError> {
        let Some(((family, _), _)) = self.proto else {
            return Err(whole(file, ErrorReason::NoProto));
        };
        let (dev, dev_type) = device(file, self.dev, self.dev_type)?;
        let ca = required(file, self.ca, "ca")?;
        let cert = required(file, self.cert, "cert")?;
        let key = required(file, self.key, "key")?;
        let tls_wrap = tls_wrap(file, self.tls_auth, self.tls_crypt, self.key_direction)?;
        keepalive_or_ping(file, self.keepalive, self.ping, self.ping_restart)?;
        Ok(CommonOptions {
            dev,
            dev_type,
            family,
            port: self.port.unwrap_or(DEFAULT_PORT),
            local: self.local,
            ca,
            cert,
            key,
            tls_wrap,
            auth: self.auth.unwrap_or(Digest::Sha1),
            data_ciphers: self.data_ciphers.unwrap_or_else(DataCiphers::default_2_6),
            data_ciphers_fallback: self.data_ciphers_fallback,
            cipher: self.cipher,
            compression: self.compression,
            remote_cert_tls: self.remote_cert_tls,
            verify_x509_name: self.verify_x509_name,
            tls_version_min: self.tls_version_min,
            reneg_sec: self.reneg_sec,
            reneg_bytes: self.reneg_bytes,
            reneg_pkts: self.reneg_pkts,
            hand_window: self.hand_window,
            tls_timeout: self.tls_timeout,
            tran_window: self.tran_window,
            replay_window: self.replay_window,
            keepalive: self.keepalive.map(|k| k.0),
            ping: self.ping.map(|p| p.0),
            ping_restart: self.ping_restart.map(|p| p.0),
            tun_mtu: self.tun_mtu,
            txqueuelen: self.txqueuelen,
            mssfix: self.mssfix,
            sndbuf: self.sndbuf,
            rcvbuf: self.rcvbuf,
            tcp_nodelay: self.tcp_nodelay,
            routes: self.routes,
            routes_ipv6: self.routes_ipv6,
            script_security: self.script_security.unwrap_or(1),
            up: self.up,
            down: self.down,
            persist_key: self.persist_key,
            persist_tun: self.persist_tun,
            disable_dco: self.disable_dco,
            status: self.status,
            status_version: self.status_version.unwrap_or(1),
            verb: self.verb.unwrap_or(1),
        })
    }
}

/// `dev` is required; its type is `dev-type`'s, or told by the name (`tun0`, `tap-x`).
fn device(
    file: &str,
    dev: At<String>,
    dev_type: Option<DevType>,
) -> Result<(String, DevType), ConfigError> {
    let Some((dev, dev_line)) = dev else {
        return Err(whole(file, missing("dev")));
    };
    let dev_type = match dev_type {
        Some(t) => t,
        None if dev.starts_with("tun") => DevType::Tun,
        None if dev.starts_with("tap") => DevType::Tap,
        None => {
            return Err(at(
                file,
                dev_line,
                "dev",
                bad(&dev, "a tun* or tap* name, or a dev-type line"),
            ))
        }
    };
    Ok((dev, dev_type))
}

/// A key file both roles need.
fn required(
    file: &str,
    source: Option<Source>,
    directive: &'static str,
) -> Result<Source, ConfigError> {
    source.ok_or_else(|| whole(file, missing(directive)))
}

/// `tls-auth` or `tls-crypt`, not both (the later one is the error). `tls-auth` without a
/// direction takes `key-direction`'s, else is bidirectional.
fn tls_wrap(
    file: &str,
    tls_auth: At<(Source, Option<KeyDirection>)>,
    tls_crypt: At<Source>,
    key_direction: Option<KeyDirection>,
) -> Result<Option<TlsWrapConfig>, ConfigError> {
    Ok(match (tls_auth, tls_crypt) {
        (Some((_, la)), Some((_, lc))) => {
            let (line, directive, other, other_line) = if la > lc {
                (la, "tls-auth", "tls-crypt", lc)
            } else {
                (lc, "tls-crypt", "tls-auth", la)
            };
            return Err(at(file, line, directive, conflict(other, other_line)));
        }
        (Some(((src, dir), _)), None) => Some(TlsWrapConfig::Auth {
            key: src,
            direction: dir.or(key_direction).unwrap_or(KeyDirection::Bidirectional),
        }),
        (None, Some((src, _))) => Some(TlsWrapConfig::Crypt { key: src }),
        (None, None) => None,
    })
}

/// `keepalive` sets `ping` and `ping-restart` itself, so it excludes both (the later line is
/// the error).
fn keepalive_or_ping(
    file: &str,
    keepalive: At<Keepalive>,
    ping: At<u32>,
    ping_restart: At<u32>,
) -> Result<(), ConfigError> {
    let Some((_, kl)) = keepalive else {
        return Ok(());
    };
    for (other, l) in [
        ("ping", ping.map(|p| p.1)),
        ("ping-restart", ping_restart.map(|p| p.1)),
    ] {
        if let Some(l) = l {
            return Err(if l > kl {
                at(file, l, other, conflict("keepalive", kl))
            } else {
                at(file, kl, "keepalive", conflict(other, l))
            });
        }
    }
    Ok(())
}

impl RawServer {
    /// The server's own checks, then its model with upstream's defaults.
    fn finish(
        self,
        file: &str,
        roles: &Roles,
        common: CommonOptions,
    ) -> Result<ServerOptions, ConfigError> {
        self.require_server(file, roles)?;
        self.refuse_net30(file, common.dev_type)?;
        self.check_server_netmask(file, common.dev_type)?;
        Ok(ServerOptions {
            common,
            server: self.server.map(|s| s.0 .0),
            server_ipv6: self.server_ipv6,
            ifconfig_pool: self.ifconfig_pool.map(|p| p.0),
            push: self.push,
            client_config_dir: self.client_config_dir,
            duplicate_cn: self.duplicate_cn,
            client_to_client: self.client_to_client,
            max_clients: self.max_clients.unwrap_or(DEFAULT_MAX_CLIENTS),
            max_routes_per_client: self
                .max_routes_per_client
                .unwrap_or(DEFAULT_MAX_ROUTES_PER_CLIENT),
        })
    }

    /// `server` or `server-ipv6` is required; either implies `mode server` and `tls-server`,
    /// which are required without them.
    fn require_server(&self, file: &str, roles: &Roles) -> Result<(), ConfigError> {
        let implied = self.server.is_some() || self.server_ipv6.is_some();
        if roles.mode_server.is_none() && !implied {
            return Err(whole(file, missing("mode server")));
        }
        if roles.tls_server.is_none() && !implied {
            return Err(whole(file, missing("tls-server")));
        }
        if !implied {
            return Err(whole(file, missing("server or server-ipv6")));
        }
        Ok(())
    }

    /// An IPv4 pool on a tun device without `topology subnet` would be upstream's net30.
    fn refuse_net30(&self, file: &str, dev_type: DevType) -> Result<(), ConfigError> {
        let ipv4_pool = self
            .server
            .as_ref()
            .map(|s| s.1)
            .or(self.ifconfig_pool.map(|p| p.1));
        let (DevType::Tun, false, Some(line)) = (dev_type, self.topology_subnet, ipv4_pool) else {
            return Ok(());
        };
        let directive = if self.server.is_some() {
            "server"
        } else {
            "ifconfig-pool"
        };
        Err(at(
            file,
            line,
            directive,
            ErrorReason::UnsupportedTopology {
                topology: "net30 (upstream's default without 'topology subnet')".to_owned(),
            },
        ))
    }

    /// `server`'s netmask within upstream's range for the device type.
    fn check_server_netmask(&self, file: &str, dev_type: DevType) -> Result<(), ConfigError> {
        let Some(((net, _), line)) = &self.server else {
            return Ok(());
        };
        let max = match dev_type {
            DevType::Tun => SERVER_MAX_NETBITS_TUN,
            DevType::Tap => SERVER_MAX_NETBITS_TAP,
        };
        let bits = net.network.prefix_len();
        if (IFCONFIG_POOL_MIN_NETBITS..=max).contains(&bits) {
            return Ok(());
        }
        Err(at(
            file,
            *line,
            "server",
            ErrorReason::PrefixOutOfRange {
                bits,
                min: IFCONFIG_POOL_MIN_NETBITS,
                max,
            },
        ))
    }
}

impl RawClient {
    /// `tls-client`, `pull` and a `remote` are required; a remote without a port or family
    /// takes `port`'s and `proto`'s.
    fn finish(
        self,
        file: &str,
        roles: &Roles,
        common: CommonOptions,
    ) -> Result<ClientOptions, ConfigError> {
        if roles.tls_client.is_none() {
            return Err(whole(file, missing("tls-client")));
        }
        if roles.pull.is_none() {
            return Err(whole(file, missing("pull")));
        }
        if self.remotes.is_empty() {
            return Err(whole(file, missing("remote")));
        }
        let remotes = self
            .remotes
            .into_iter()
            .map(|(host, port, family)| Remote {
                host,
                port: port.unwrap_or(common.port),
                family: family.unwrap_or(common.family),
            })
            .collect();
        Ok(ClientOptions {
            common,
            remotes,
            nobind: self.nobind,
            http_proxy: self.http_proxy,
            http_proxy_options: self.http_proxy_options,
            pull_filters: self.pull_filters.map(|p| p.0).unwrap_or_default(),
            route_nopull: self.route_nopull,
            connect_retry: self.connect_retry.unwrap_or(DEFAULT_CONNECT_RETRY),
            connect_retry_max: self.connect_retry_max,
            auth_nocache: self.auth_nocache,
        })
    }
}

/// The warnings sorted by line, naming the file.
fn in_file_order(file: &str, mut warnings: Vec<(usize, String, WarningKind)>) -> Vec<Warning> {
    warnings.sort_by_key(|w| w.0);
    warnings
        .into_iter()
        .map(|(line, directive, kind)| Warning {
            file: file.to_owned(),
            line,
            directive,
            kind,
        })
        .collect()
}
