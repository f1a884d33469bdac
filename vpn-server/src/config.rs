//! From configuration to [`Settings`]: an OpenVPN server config file ([`load_file`]), an
//! already parsed [`ServerOptions`] ([`from_options`]), or the vpn2 environment variables with
//! vpn2's fixed file layout ([`from_vpn2_env`]).
//!
//! This is the only place the server reads files: every [`Source::Path`] (`ca`, `cert`, `key`,
//! `tls-auth`, `tls-crypt`) and every file of `client-config-dir` (by certificate CN, `DEFAULT`
//! for the rest). Relative paths are taken from the working directory, as upstream does. Each
//! file (the config too) is read only if it has at most 1 MiB (`netio::volume::MAX_FILE_BYTES`,
//! what a ConfigMap or Secret holds); a larger one is refused unread, with its size.
//!
//! Errors name what is at fault: a config or client-config-dir problem as `file:line:
//! 'directive': reason` ([`ConfigError`]), an unreadable or malformed key or certificate file by
//! its path. Directives that are accepted but have no effect come back as [`Loaded::warnings`]
//! for the binary to log at start; nothing is dropped silently.
//!
//! ```text
//!  server.conf ──ServerOptions::parse──► ServerOptions ──from_options──► Loaded { Settings, up/down, warnings }
//!  vpn2 env ──Vpn2ServerEnv──► vpn2_lines ──ServerOptions::from_lines──┘ (+ the vpn-shoot-client iroutes)
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};
use netio::script::ScriptType;
use openssl::ssl::SslContext;
use pki::check::{RemoteCertTls, VerifyX509Name, X509NameType as PkiNameType};
use pki::pem::PemError;
use pki::tls::{control_channel_server, PeerPolicy, TlsError};
use pki::{CaBundle, Identity};
use protocol::config::env::{EnvError, Vpn2ServerEnv};
use protocol::config::{
    CcdOptions, CertUsage, CommonOptions, ConfigError, DevType, Family, FileArg,
    Keepalive as ConfigKeepalive, Line, ServerOptions, Source, Status as ConfigStatus, TlsVersion,
    TlsWrapConfig, Warning, X509NameType,
};
use protocol::data::DataCipher;
use protocol::digest::Digest;
use protocol::key::{KeyDirection, Role};
use protocol::km2::occ::DevType as OccDevType;
use protocol::ncp::DataCiphers;
use protocol::push::options::SocketFlags;
use protocol::push::{PushItem, PushedOption};
use protocol::session::{ControlProtection, Keepalive};
use protocol::static_key::{self, StaticKeyError};

use crate::pool::{Pool, PoolError};
use crate::script::{Script, ScriptParseError};
use crate::settings::{ClientOptions, IfconfigIpv6Push, IfconfigPush, Settings, StatusFile};
use protocol::config::netmap::{MAPPED_NODE_NETWORK, MAPPED_POD_NETWORK, MAPPED_SERVICE_NETWORK};

/// The name of the client-config-dir file that applies to every CN without its own file.
pub const CCD_DEFAULT: &str = "DEFAULT";

/// vpn2's secrets directory (`/srv/secrets`).
pub const VPN2_SECRETS_DIR: &str = "/srv/secrets";

/// The CN of vpn2's (non-HA) shoot client, whose client-config-dir entry carries the iroutes.
pub const VPN2_SHOOT_CLIENT_CN: &str = "vpn-shoot-client";

/// vpn2's status-file interval in seconds.
pub const VPN2_STATUS_INTERVAL: u32 = 15;

/// The display name of the config vpn2 environment mode builds.
pub const VPN2_ENV_CONFIG_NAME: &str = "<vpn2 environment>";

/// What the server runs with, from a config file or the vpn2 environment.
#[derive(Debug)]
pub struct Loaded {
    /// The runtime settings.
    pub settings: Settings,
    /// `up CMD` (with `script-security 2`): run after the tun device is configured.
    pub up: Option<Script>,
    /// `down CMD` (with `script-security 2`): run after the server stopped.
    pub down: Option<Script>,
    /// `verb` (0 to 11): the log level when none is given on the command line.
    pub verb: u8,
    /// Directives accepted without effect, as `file:line: 'directive': why`, in file order.
    pub warnings: Vec<String>,
}

/// Why the server cannot start with this configuration.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file (the config, a key, a certificate, a client-config-dir file) cannot be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The `client-config-dir` directory cannot be listed.
    #[error("{}: cannot read client-config-dir", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The config or a client-config-dir file is malformed (`file:line: 'directive': reason`).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A certificate or key file does not hold what it should.
    #[error("{what}")]
    Pem {
        /// The path, or the inline block (`server.conf: <ca>`).
        what: String,
        /// Why.
        #[source]
        source: PemError,
    },
    /// A `tls-auth` / `tls-crypt` key file is not an OpenVPN static key.
    #[error("{what}")]
    StaticKey {
        /// The path, or the inline block.
        what: String,
        /// Why.
        #[source]
        source: StaticKeyError,
    },
    /// OpenSSL refused the certificate, the key or the CA as a TLS context.
    #[error("{file}: cannot build the TLS context from ca/cert/key")]
    Tls {
        /// The config.
        file: String,
        /// Why.
        #[source]
        source: TlsError,
    },
    /// A directive whose value we cannot run with (`dev-type tap`, an unresolvable `local`).
    #[error("{file}: '{directive}': {reason}")]
    Unsupported {
        /// The config.
        file: String,
        /// The directive.
        directive: &'static str,
        /// Why.
        reason: String,
    },
    /// The `ifconfig-pool` range does not fit the `server` network.
    #[error("{file}: 'ifconfig-pool'")]
    Pool {
        /// The config.
        file: String,
        /// Why.
        #[source]
        source: PoolError,
    },
    /// An `up` / `down` command cannot be split into a program and its arguments.
    #[error("{file}")]
    Script {
        /// The config.
        file: String,
        /// Why.
        #[source]
        source: ScriptParseError,
    },
    /// The `local` host name does not resolve.
    #[error("{file}: 'local': cannot resolve '{host}'")]
    Resolve {
        /// The config.
        file: String,
        /// The name.
        host: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A vpn2 environment variable is missing or invalid.
    #[error("{0}")]
    Env(#[from] EnvError),
}

/// Reads and parses a server config file and everything it names; see the module docs.
pub fn load_file(path: &Path) -> Result<Loaded, LoadError> {
    let text = read_text(path)?;
    let name = path.display().to_string();
    let parsed = ServerOptions::parse(&name, &text)?;
    let mut loaded = from_options(&name, &parsed.config)?;
    let mut warnings: Vec<String> = parsed.warnings.iter().map(Warning::to_string).collect();
    warnings.append(&mut loaded.warnings);
    loaded.warnings = warnings;
    Ok(loaded)
}

/// Maps a parsed server config (`file` names it in messages) to [`Settings`], reading the
/// files it names. The parser's own warnings are not included (see [`load_file`]).
///
/// One concern after another, each in its own function below, in the order the warnings
/// come back: TLS and control-channel protection, timers, the device, pools and kernel
/// routes, clients, the status file, the scripts.
pub fn from_options(file: &str, o: &ServerOptions) -> Result<Loaded, LoadError> {
    let c = &o.common;
    let mut warnings = Warnings {
        file,
        lines: Vec::new(),
    };
    let (tls, policy) = control_channel(file, c, &mut warnings)?;
    let protection = control_protection(file, c)?;
    let mut s = Settings::new(tls, Arc::new(policy), protection);
    s.listen = listen_addrs(file, c.family, c.local.as_deref(), c.port)?;
    s.data_ciphers = c.effective_data_ciphers();
    s.data_ciphers_fallback = c.data_ciphers_fallback.or(c.cipher);
    s.auth = c.auth;
    s.compression = c.compression;
    apply_timers(&mut s, c, &mut warnings);
    apply_device(file, &mut s, o, &mut warnings)?;
    (s.pool_v4, s.pool_v4_range) = pool_v4(file, o)?;
    s.pool_v6 = o.server_ipv6;
    apply_routes(&mut s, c, &mut warnings);
    apply_clients(&mut s, o, &mut warnings)?;
    s.status = status_file(c, &mut warnings);
    let (up, down) = scripts(file, c, &mut warnings)?;
    Ok(Loaded {
        settings: s,
        up,
        down,
        verb: c.verb,
        warnings: warnings.lines,
    })
}

/// The directives [`from_options`] accepts without (full) effect, as `file: 'directive': why`.
struct Warnings<'a> {
    file: &'a str,
    lines: Vec<String>,
}

impl Warnings<'_> {
    fn add(&mut self, directive: &str, why: &str) {
        self.lines
            .push(format!("{}: '{directive}': {why}", self.file));
    }
}

/// The control channel's TLS context from `ca`, `cert` and `key`, and the peer policy
/// (`remote-cert-tls`, `verify-x509-name`) it enforces.
fn control_channel(
    file: &str,
    c: &CommonOptions,
    warnings: &mut Warnings<'_>,
) -> Result<(SslContext, PeerPolicy), LoadError> {
    let ca = read_source(file, "ca", &c.ca)?;
    let cert = read_source(file, "cert", &c.cert)?;
    let key = read_source(file, "key", &c.key)?;
    let trust = CaBundle::from_pem(ca.text.as_bytes()).map_err(|source| LoadError::Pem {
        what: ca.what.clone(),
        source,
    })?;
    let identity =
        Identity::from_pem(cert.text.as_bytes(), key.text.as_bytes()).map_err(|source| {
            LoadError::Pem {
                what: format!("{} / {}", cert.what, key.what),
                source,
            }
        })?;
    let policy = PeerPolicy {
        remote_cert_tls: c.remote_cert_tls.map(|u| match u {
            CertUsage::Client => RemoteCertTls::Client,
            CertUsage::Server => RemoteCertTls::Server,
        }),
        verify_x509_name: c.verify_x509_name.as_ref().map(|v| VerifyX509Name {
            name: v.name.clone(),
            kind: match v.kind {
                X509NameType::Subject => PkiNameType::Subject,
                X509NameType::Name => PkiNameType::Name,
                X509NameType::NamePrefix => PkiNameType::NamePrefix,
            },
        }),
    };
    let tls =
        control_channel_server(&identity, &trust, &policy).map_err(|source| LoadError::Tls {
            file: file.to_owned(),
            source,
        })?;
    if let Some(v) = c.tls_version_min {
        if v.version > TlsVersion::V1_2 {
            warnings.add(
                "tls-version-min",
                "the control channel always allows TLS 1.2 and 1.3; ignored",
            );
        }
    }
    Ok((tls, policy))
}

/// `tls-auth` / `tls-crypt`: the control channel's protection, its key file read.
fn control_protection(file: &str, c: &CommonOptions) -> Result<ControlProtection, LoadError> {
    Ok(match &c.tls_wrap {
        None => ControlProtection::None,
        Some(TlsWrapConfig::Auth { key, direction }) => ControlProtection::TlsAuth {
            key: read_static_key(file, "tls-auth", key)?,
            direction: *direction,
            digest: c.auth,
        },
        Some(TlsWrapConfig::Crypt { key }) => ControlProtection::TlsCrypt {
            key: read_static_key(file, "tls-crypt", key)?,
        },
    })
}

/// `keepalive`, renegotiation, `hand-window`, `tls-timeout`, `tran-window`.
fn apply_timers(s: &mut Settings, c: &CommonOptions, warnings: &mut Warnings<'_>) {
    s.keepalive = c.keepalive.map(|k| Keepalive {
        ping: k.interval,
        ping_restart: k.timeout,
    });
    if c.keepalive.is_none() && (c.ping.is_some() || c.ping_restart.is_some()) {
        warnings.add(
            "ping/ping-restart",
            "the server acts on 'keepalive N M' only; ping and ping-restart ignored",
        );
    }
    if let Some(r) = c.reneg_sec {
        s.reneg_sec = (r.max > 0).then(|| secs(r.max));
        s.reneg_sec_min = r.min.map(secs);
    }
    s.reneg_bytes = c.reneg_bytes;
    s.reneg_pkts = c.reneg_pkts;
    if let Some(h) = c.hand_window {
        s.hand_window = secs(h);
        s.handshake_timeout = secs(h);
    }
    if let Some(t) = c.tls_timeout {
        s.tls_timeout = Some(secs(t));
    }
    if let Some(t) = c.tran_window {
        s.tran_window = secs(t);
    }
    if c.replay_window.is_some() {
        warnings.add(
            "replay-window",
            "not implemented (TCP delivers in order); ignored",
        );
    }
}

/// `dev`, `dev-type`, `max-routes-per-client`, `tun-mtu`, `txqueuelen`, and the socket and
/// MSS directives that have no effect over TCP here.
fn apply_device(
    file: &str,
    s: &mut Settings,
    o: &ServerOptions,
    warnings: &mut Warnings<'_>,
) -> Result<(), LoadError> {
    let c = &o.common;
    s.dev = match c.dev.as_str() {
        "tun" | "tap" => format!("{}%d", c.dev),
        dev => dev.to_owned(),
    };
    s.dev_type = match c.dev_type {
        DevType::Tun => OccDevType::Tun,
        DevType::Tap => OccDevType::Tap,
    };
    s.max_routes_per_client = usize::try_from(o.max_routes_per_client).unwrap_or(usize::MAX);
    if let Some(mtu) = c.tun_mtu {
        s.tun_mtu = u16::try_from(mtu)
            .map_err(|_| unsupported(file, "tun-mtu", format!("{mtu} is larger than 65535")))?;
    }
    s.txqueuelen = c.txqueuelen;
    if c.mssfix.is_some() {
        warnings.add("mssfix", "not implemented over TCP; ignored");
    }
    if c.sndbuf.is_some() || c.rcvbuf.is_some() {
        warnings.add(
            "sndbuf/rcvbuf",
            "not implemented; the kernel defaults apply",
        );
    }
    Ok(())
}

/// `route` / `route-ipv6`: the kernel routes into the tun device.
fn apply_routes(s: &mut Settings, c: &CommonOptions, warnings: &mut Warnings<'_>) {
    s.routes = c
        .routes
        .iter()
        .map(|r| IpNet::V4(r.network))
        .chain(c.routes_ipv6.iter().map(|r| IpNet::V6(r.network)))
        .collect();
    if c.routes
        .iter()
        .any(|r| r.gateway.is_some() || r.metric.is_some())
        || c.routes_ipv6
            .iter()
            .any(|r| r.gateway.is_some() || r.metric.is_some())
    {
        warnings.add(
            "route",
            "gateway and metric are ignored: a server route always points into the tun device",
        );
    }
}

/// What the clients get and how many may come: `push`, `client-to-client`, `duplicate-cn`,
/// `max-clients`, and the `client-config-dir` entries (read here).
fn apply_clients(
    s: &mut Settings,
    o: &ServerOptions,
    warnings: &mut Warnings<'_>,
) -> Result<(), LoadError> {
    s.push = o.push.iter().cloned().map(PushItem::Verbatim).collect();
    if o.common.tcp_nodelay {
        // Our sockets always have TCP_NODELAY; upstream's server also pushes it.
        let flags = SocketFlags {
            tcp_nodelay: true,
            unknown: Vec::new(),
        };
        s.push.push(PushedOption::SocketFlags(flags).into());
    }
    s.client_to_client = o.client_to_client;
    s.duplicate_cn = o.duplicate_cn;
    s.max_clients = usize::try_from(o.max_clients).unwrap_or(usize::MAX);
    if let Some(dir) = &o.client_config_dir {
        let max_routes = usize::try_from(o.max_routes_per_client).unwrap_or(usize::MAX);
        let (clients, default) = read_client_config_dir(dir, max_routes, &mut warnings.lines)?;
        s.clients = clients;
        s.default_client = default;
    }
    Ok(())
}

/// `status FILE N`; always written in `status-version 2`.
fn status_file(c: &CommonOptions, warnings: &mut Warnings<'_>) -> Option<StatusFile> {
    let st = c.status.as_ref()?;
    if c.status_version != 2 {
        warnings.add(
            "status-version",
            &format!(
                "version {} requested; the status file is written in version 2",
                c.status_version
            ),
        );
    }
    Some(StatusFile {
        path: st.path.clone(),
        interval: secs(st.interval.max(1)),
    })
}

/// `up` and `down`, run only with `script-security 2` (else a warning each).
fn scripts(
    file: &str,
    c: &CommonOptions,
    warnings: &mut Warnings<'_>,
) -> Result<(Option<Script>, Option<Script>), LoadError> {
    let mut up = None;
    let mut down = None;
    for (cmd, kind) in [(&c.up, ScriptType::Up), (&c.down, ScriptType::Down)] {
        let Some(line) = cmd else { continue };
        if c.script_security < 2 {
            warnings.add(
                &kind.to_string(),
                &format!(
                    "not run: external programs need 'script-security 2' (it is {})",
                    c.script_security
                ),
            );
            continue;
        }
        let parsed = Script::parse(kind, line).map_err(|source| LoadError::Script {
            file: file.to_owned(),
            source,
        })?;
        if kind == ScriptType::Up {
            up = Some(parsed);
        } else {
            down = Some(parsed);
        }
    }
    Ok((up, down))
}

/// Who reads [`vpn2_lines`].
#[derive(Debug, Clone, Copy)]
pub enum Vpn2Reader<'a> {
    /// Our server: vpn2's lines without what it does in process (the `client-config-dir`
    /// entry and its route limit, [`from_vpn2_env`]; the firewall hooks, `crate::vpn2`).
    Ours,
    /// Upstream OpenVPN playing vpn2 (the conformance tests): every line vpn2 writes, with
    /// the client-config-dir `client_config_dir` and `program` as the hooks' `vpn-server`
    /// (`/bin/vpn-server` in vpn2's image).
    Upstream {
        /// vpn2's `/client-config-dir`.
        client_config_dir: &'a Path,
        /// The program the `up` and `down` hooks run.
        program: &'a Path,
    },
}

/// The server config vpn2 writes for `env` (reference gardener-vpn2.md 1.3, vpn2's
/// `server-config.template`), typed, with the secrets under `secrets` (vpn2:
/// [`VPN2_SECRETS_DIR`]) and what `reader` takes of it. Our server reads the lines into its
/// [`ServerOptions`] ([`from_vpn2_env`]); rendered ([`protocol::config::render`]) they are
/// the config upstream OpenVPN gets.
pub fn vpn2_lines(env: &Vpn2ServerEnv, secrets: &Path, reader: Vpn2Reader<'_>) -> Vec<Line> {
    let secret = |rel: &str| FileArg::quoted(secrets.join(rel));
    let device = env.device();
    let mut lines = vec![
        Line::ModeServer,
        Line::TlsServer,
        Line::TopologySubnet,
        Line::Verb(3),
        Line::Txqueuelen(1000),
        Line::TcpNodelay,
        Line::DataCiphers(DataCiphers::of(
            DataCipher::Aes256Gcm,
            &[DataCipher::Aes256Cbc],
        )),
        Line::Port(VPN2_PORT),
        Line::Keepalive(VPN2_KEEPALIVE),
    ];
    if let Vpn2Reader::Upstream {
        client_config_dir, ..
    } = reader
    {
        lines.push(Line::MaxRoutesPerClient(vpn2_max_routes_per_client(env)));
        lines.push(Line::ClientConfigDir(client_config_dir.to_owned()));
    }
    lines.extend([
        Line::Key(secret("vpn-server/tls.key")),
        Line::Cert(secret("vpn-server/tls.crt")),
        Line::Ca(secret("vpn-server/ca.crt")),
        Line::DhNone,
        Line::Auth(Digest::Sha256),
        Line::TlsAuth(secret("tlsauth/vpn.tlsauth"), KeyDirection::Normal),
        Line::Proto(Family::V6, Role::Server),
        Line::ServerIpv6(env.server_ipv6_network()),
    ]);
    if env.is_ha {
        lines.extend([Line::ClientToClient, Line::DuplicateCn]);
    }
    lines.push(Line::Dev(device.to_owned()));
    if let Vpn2Reader::Upstream { program, .. } = reader {
        let nets: Vec<String> = vpn2_shoot_networks(env)
            .iter()
            .map(ToString::to_string)
            .collect();
        let seed = env
            .seed_pod_network
            .map(|n| n.to_string())
            .unwrap_or_default();
        let program = program.display();
        lines.extend([
            Line::ScriptSecurity(2),
            Line::Up(format!(
                "{program} firewall --mode up --device {device} --shoot-network={} \
                 --seed-pod-network={seed}",
                nets.join(",")
            )),
            Line::Down(format!("{program} firewall --mode down --device {device}")),
        ]);
    }
    lines.extend([
        Line::Status(ConfigStatus {
            path: env.status_path.clone(),
            interval: VPN2_STATUS_INTERVAL,
        }),
        Line::StatusVersion(2),
    ]);
    lines
}

/// vpn2's server port (not visible outside the pod: the Service maps it).
const VPN2_PORT: u16 = 1194;

/// vpn2's `keepalive 10 30`.
const VPN2_KEEPALIVE: ConfigKeepalive = ConfigKeepalive {
    interval: 10,
    timeout: 30,
};

/// Whether the seed's pod network overlaps one of the shoot's networks (vpn2 then maps the
/// IPv4 ones, and a kube-apiserver's pod IP into 241/8).
pub fn vpn2_overlap(env: &Vpn2ServerEnv) -> bool {
    env.seed_pod_network.is_some_and(|seed| {
        env.shoot_networks()
            .iter()
            .any(|n| n.contains(&seed.network()) || seed.contains(&n.network()))
    })
}

/// vpn2's shoot networks as its `firewall` hook names them: IPv4 ones replaced by their
/// mapped /8 (always without HA; with HA only where the seed's pod network overlaps one),
/// IPv6 ones kept, sorted as strings, without duplicates (vpn2's `BuildValues`).
pub fn vpn2_shoot_networks(env: &Vpn2ServerEnv) -> Vec<IpNet> {
    let map = !env.is_ha || vpn2_overlap(env);
    let mut out: Vec<IpNet> = Vec::new();
    for (nets, mapped) in [
        (&env.shoot_service_networks, MAPPED_SERVICE_NETWORK),
        (&env.shoot_pod_networks, MAPPED_POD_NETWORK),
        (&env.shoot_node_networks, MAPPED_NODE_NETWORK),
    ] {
        out.extend(nets.iter().map(|net| match net {
            IpNet::V4(_) if map => IpNet::V4(mapped),
            _ => *net,
        }));
    }
    out.sort_by_key(ToString::to_string);
    out.dedup();
    out
}

/// vpn2's `max-routes-per-client`: the host addresses of every shoot network summed (an
/// IPv4 network up to /30 without its network and broadcast addresses), within 256 and
/// 1,048,576.
pub fn vpn2_max_routes_per_client(env: &Vpn2ServerEnv) -> u32 {
    const MIN: u128 = 256;
    const MAX: u128 = 1 << 20;
    let hosts = |net: &IpNet| -> u128 {
        let bits = u32::from(net.max_prefix_len() - net.prefix_len());
        let all = 1u128.checked_shl(bits).unwrap_or(u128::MAX);
        match net {
            IpNet::V4(n) if n.prefix_len() <= 30 => all - 2,
            _ => all,
        }
    };
    let sum = env
        .shoot_networks()
        .iter()
        .map(hosts)
        .fold(0u128, u128::saturating_add);
    u32::try_from(sum.clamp(MIN, MAX)).unwrap_or(u32::MAX)
}

/// The iroutes vpn2 writes into `client-config-dir/vpn-shoot-client` (non-HA): per IPv4 shoot
/// network its mapped /8 (nodes 242/8, services 243/8, pods 244/8), per IPv6 one the network
/// itself; duplicates removed (reference gardener-vpn2.md 1.3, 1.9).
pub fn vpn2_shoot_iroutes(env: &Vpn2ServerEnv) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    for (nets, mapped) in [
        (&env.shoot_node_networks, MAPPED_NODE_NETWORK),
        (&env.shoot_service_networks, MAPPED_SERVICE_NETWORK),
        (&env.shoot_pod_networks, MAPPED_POD_NETWORK),
    ] {
        for net in nets {
            let n = match net {
                IpNet::V4(_) => IpNet::V4(mapped),
                IpNet::V6(n) => IpNet::V6(n.trunc()),
            };
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// vpn2 environment mode: the config of [`vpn2_lines`] mapped as a file would be, plus
/// the client-config-dir entry of `vpn-shoot-client` ([`vpn2_shoot_iroutes`]) and kernel
/// routes into the tun for those iroutes (what vpn2's `firewall up` hook adds: the mapped
/// IPv4 ranges and the IPv6 shoot networks, never the real IPv4 ones, which may overlap the
/// seed's). HA is refused: tap devices work, but its layout (two servers, bonded taps on the
/// seed clients, per-index networks) is not built yet. The firewall rules are
/// `crate::vpn2::seed_table`'s.
pub fn from_vpn2_env(env: &Vpn2ServerEnv, secrets: &Path) -> Result<Loaded, LoadError> {
    if env.is_ha {
        return from_vpn2_env_ha(env, secrets);
    }
    let lines = vpn2_lines(env, secrets, Vpn2Reader::Ours);
    let parsed = ServerOptions::from_lines(VPN2_ENV_CONFIG_NAME, &lines)?;
    let mut loaded = from_options(VPN2_ENV_CONFIG_NAME, &parsed.config)?;
    let iroutes = vpn2_shoot_iroutes(env);
    let s = &mut loaded.settings;
    // Only the mapped ranges (and IPv6 shoot networks) go into the tunnel, as vpn2 routes
    // them: the real IPv4 shoot networks may overlap the seed's own.
    for net in &iroutes {
        if !s.routes.contains(net) {
            s.routes.push(*net);
        }
    }
    s.clients.insert(
        VPN2_SHOOT_CLIENT_CN.to_owned(),
        ClientOptions {
            iroutes,
            ..ClientOptions::default()
        },
    );
    loaded.settings.auto_mtu = env.auto_mtu;
    Ok(loaded)
}

/// Keepalive of the HA server (`docs/ha.md` §4): a ping every second each way; the clients
/// are pushed `ping-restart 10` (our kube-apiserver clients cut it to 5 s themselves: inside
/// the seed), the server restarts a connection silent for 20 s.
pub const HA_KEEPALIVE: Keepalive = Keepalive {
    ping: 1,
    ping_restart: 10,
};

/// vpn2 environment mode with `IS_HA=true` (`docs/ha.md`): vpn2's server config (TLS, ciphers,
/// port, status file, `duplicate-cn`), but no device and no pool: the server switches in the
/// process between `vpn-seed-client` connections (kube-apiservers, each owning its pod IP) and
/// `vpn-shoot-client-<j>` connections ([`crate::ha`]). The shoot networks the switch lets
/// through are the real ones and their mapped /8 images (vpn2 maps IPv4 ones when the seed's
/// pod network overlaps).
fn from_vpn2_env_ha(env: &Vpn2ServerEnv, secrets: &Path) -> Result<Loaded, LoadError> {
    let lines = vpn2_lines(env, secrets, Vpn2Reader::Ours);
    let parsed = ServerOptions::from_lines(VPN2_ENV_CONFIG_NAME, &lines)?;
    let mut loaded = from_options(VPN2_ENV_CONFIG_NAME, &parsed.config)?;
    let s = &mut loaded.settings;
    let mut shoot_networks = env.shoot_networks();
    for net in vpn2_shoot_iroutes(env) {
        if !shoot_networks.contains(&net) {
            shoot_networks.push(net);
        }
    }
    s.ha = Some(crate::settings::HaSettings {
        shoot_networks,
        transfer_v6: Some(env.vpn_network),
        layer2_v6: s.pool_v6,
        overlap: vpn2_overlap(env),
    });
    s.dev_type = OccDevType::Tun;
    s.pool_v4 = None;
    s.pool_v6 = None;
    s.routes.clear();
    s.client_to_client = false;
    s.keepalive = Some(HA_KEEPALIVE);
    s.auto_mtu = env.auto_mtu;
    Ok(loaded)
}

/// The listen addresses: `local` (an address or a name) or the wildcard of the family;
/// `[::]` is one dual-stack socket.
fn listen_addrs(
    file: &str,
    family: Family,
    local: Option<&str>,
    port: u16,
) -> Result<Vec<SocketAddr>, LoadError> {
    let Some(host) = local else {
        let ip = match family {
            Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Family::Any | Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        return Ok(vec![SocketAddr::new(ip, port)]);
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| LoadError::Resolve {
            file: file.to_owned(),
            host: host.to_owned(),
            source,
        })?
        .filter(|a| match family {
            Family::Any => true,
            Family::V4 => a.is_ipv4(),
            Family::V6 => a.is_ipv6(),
        })
        .collect();
    found.first().map(|a| vec![*a]).ok_or_else(|| {
        unsupported(
            file,
            "local",
            format!("'{host}' has no address of the proto's family"),
        )
    })
}

/// The IPv4 pool: `server NET MASK`, or with `nopool` the `ifconfig-pool START END` range
/// inside it (upstream accepts any range there; a range under the server's own address, over
/// the broadcast address or outside the network is refused with the reason).
type PoolV4 = (Option<Ipv4Net>, Option<(Ipv4Addr, Ipv4Addr)>);

fn pool_v4(file: &str, o: &ServerOptions) -> Result<PoolV4, LoadError> {
    let Some(server) = o.server else {
        if o.ifconfig_pool.is_some() {
            return Err(unsupported(
                file,
                "ifconfig-pool",
                "needs 'server NET MASK nopool' (a pool without 'server' is not supported)".into(),
            ));
        }
        return Ok((None, None));
    };
    let net = server.network.trunc();
    match (server.nopool, o.ifconfig_pool) {
        (false, None) => Ok((Some(net), None)),
        (_, Some(p)) => {
            let range = Some((p.start, p.end));
            Pool::with_range(Some(net), range, None).map_err(|source| LoadError::Pool {
                file: file.to_owned(),
                source,
            })?;
            Ok((Some(net), range))
        }
        (true, None) => Err(unsupported(
            file,
            "server",
            "'nopool' without 'ifconfig-pool' is not supported (clients would need ifconfig-push)"
                .into(),
        )),
    }
}

/// Reads every file of a client-config-dir: `DEFAULT` and one per CN. Names starting with a
/// dot (Kubernetes' `..data` links) and entries that are not files are skipped.
fn read_client_config_dir(
    dir: &Path,
    max_routes: usize,
    warnings: &mut Vec<String>,
) -> Result<(HashMap<String, ClientOptions>, Option<ClientOptions>), LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LoadError::ReadDir {
        path: dir.to_owned(),
        source,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| LoadError::ReadDir {
            path: dir.to_owned(),
            source,
        })?;
        let Ok(name) = entry.file_name().into_string() else {
            warnings.push(format!(
                "{}: file name is not UTF-8; skipped",
                entry.path().display()
            ));
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symlinks (ConfigMap mounts are links).
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            names.push((name, path));
        }
    }
    names.sort();
    let mut clients = HashMap::new();
    let mut default = None;
    for (name, path) in names {
        let text = read_text(&path)?;
        let ccd = CcdOptions::parse(&path.display().to_string(), &text)?;
        let mut opts = client_options(ccd);
        if opts.iroutes.len() > max_routes {
            warnings.push(format!(
                "{}: {} iroutes exceed max-routes-per-client {max_routes}; only the first {max_routes} are used",
                path.display(),
                opts.iroutes.len()
            ));
            opts.iroutes.truncate(max_routes);
        }
        if name == CCD_DEFAULT {
            default = Some(opts);
        } else {
            clients.insert(name, opts);
        }
    }
    Ok((clients, default))
}

/// One client-config-dir file as the server's [`ClientOptions`].
pub fn client_options(c: CcdOptions) -> ClientOptions {
    ClientOptions {
        iroutes: c
            .iroutes
            .into_iter()
            .map(IpNet::V4)
            .chain(c.iroutes_ipv6.into_iter().map(IpNet::V6))
            .collect(),
        ifconfig_push: c.ifconfig_push.map(|p| IfconfigPush {
            local: p.local,
            remote_netmask: p.remote_netmask,
        }),
        ifconfig_ipv6_push: c.ifconfig_ipv6_push.map(|p| IfconfigIpv6Push {
            local: p.local,
            remote: p.remote,
        }),
        push: c.push,
        push_reset: c.push_reset,
        push_remove: c.push_remove,
        disable: c.disable,
    }
}

fn secs(n: u32) -> Duration {
    Duration::from_secs(u64::from(n))
}

fn unsupported(file: &str, directive: &'static str, reason: String) -> LoadError {
    LoadError::Unsupported {
        file: file.to_owned(),
        directive,
        reason,
    }
}

/// Reads a file we were given (config, CCD file, certificate, key): at most 1 MiB
/// (`netio::volume::MAX_FILE_BYTES`), else refused unread with its size.
fn read_text(path: &Path) -> Result<String, LoadError> {
    netio::volume::read_text_bounded(path, netio::volume::MAX_FILE_BYTES).map_err(|source| {
        LoadError::Read {
            path: path.to_owned(),
            source,
        }
    })
}

/// A key or certificate's text and how to name it in errors.
struct SourceText {
    text: String,
    what: String,
}

impl fmt::Debug for SourceText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceText")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

fn read_source(file: &str, directive: &str, source: &Source) -> Result<SourceText, LoadError> {
    match source {
        Source::Path(p) => Ok(SourceText {
            text: read_text(p)?,
            what: p.display().to_string(),
        }),
        Source::Inline(text) => Ok(SourceText {
            text: text.clone(),
            what: format!("{file}: <{directive}>"),
        }),
    }
}

fn read_static_key(
    file: &str,
    directive: &str,
    source: &Source,
) -> Result<protocol::key::Key2, LoadError> {
    let s = read_source(file, directive, source)?;
    static_key::parse(&s.text).map_err(|source| LoadError::StaticKey {
        what: s.what,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use netio::report::chain;
    use protocol::data::DataCipher;
    use protocol::digest::Digest;
    use protocol::key::KeyDirection;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/tests/data/config");

    /// vpn2's secrets layout (`vpn-server/{ca.crt,tls.crt,tls.key}`, `tlsauth/vpn.tlsauth`)
    /// with a fresh CA, server certificate and static key, in a temporary directory.
    fn secrets() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let now = 1_700_000_000;
        let validity = pki::Validity::days_from(now, 3650);
        let ca = pki::Ca::create("vpn", pki::KeySpec::EcdsaP256, validity).unwrap();
        let id = ca
            .issue(&pki::IssueRequest {
                profile: pki::CertProfile::Server,
                common_name: "vpn-seed-server".into(),
                sans: vec![],
                key: pki::KeySpec::EcdsaP256,
                validity,
            })
            .unwrap();
        let server = dir.path().join("vpn-server");
        std::fs::create_dir_all(&server).unwrap();
        std::fs::write(server.join("ca.crt"), ca.cert().to_pem().unwrap()).unwrap();
        std::fs::write(server.join("tls.crt"), id.chain_pem().unwrap()).unwrap();
        std::fs::write(server.join("tls.key"), id.key_pem().unwrap()).unwrap();
        let ta = dir.path().join("tlsauth");
        std::fs::create_dir_all(&ta).unwrap();
        let key = static_key::generate(&mut rand_core::OsRng);
        std::fs::write(ta.join("vpn.tlsauth"), static_key::write(&key)).unwrap();
        dir
    }

    /// A fixture with `/srv/secrets` and `/client-config-dir` pointed into `dir`.
    fn fixture(name: &str, dir: &Path) -> String {
        std::fs::read_to_string(Path::new(FIXTURES).join(name))
            .unwrap()
            .replace("/srv/secrets", &dir.display().to_string())
            .replace("/client-config-dir", &dir.join("ccd").display().to_string())
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn vpn2_server_fixture() {
        let dir = secrets();
        let ccd = dir.path().join("ccd");
        std::fs::create_dir(&ccd).unwrap();
        std::fs::copy(
            Path::new(FIXTURES).join("vpn-shoot-client.ccd"),
            ccd.join("vpn-shoot-client"),
        )
        .unwrap();
        // Kubernetes ConfigMap mounts carry dot entries: skipped.
        std::fs::create_dir(ccd.join("..data")).unwrap();
        let conf = dir.path().join("server.conf");
        std::fs::write(&conf, fixture("vpn2-server.conf", dir.path())).unwrap();
        let l = load_file(&conf).unwrap();
        let s = &l.settings;
        assert_eq!(s.listen, [SocketAddr::from(([0u16; 8], 1194))]);
        assert_eq!(
            s.data_ciphers.as_slice(),
            [DataCipher::Aes256Gcm, DataCipher::Aes256Cbc]
        );
        assert_eq!(s.data_ciphers_fallback, None);
        assert_eq!(s.auth, Digest::Sha256);
        assert!(matches!(
            s.protection,
            ControlProtection::TlsAuth {
                direction: KeyDirection::Normal,
                digest: Digest::Sha256,
                ..
            }
        ));
        assert_eq!(
            s.keepalive,
            Some(Keepalive {
                ping: 10,
                ping_restart: 30
            })
        );
        assert_eq!(s.dev, "tun0");
        assert_eq!(s.txqueuelen, Some(1000));
        assert_eq!(s.tun_mtu, 1500);
        assert_eq!(s.pool_v4, None);
        assert_eq!(s.pool_v6, Some("fd8f:6d53:b97a:1::/96".parse().unwrap()));
        assert_eq!(s.push, ["socket-flags TCP_NODELAY"]);
        assert!(s.routes.is_empty());
        assert!(!s.client_to_client && !s.duplicate_cn);
        assert_eq!(s.max_clients, 1024);
        assert_eq!(
            s.status,
            Some(StatusFile {
                path: "/srv/status/openvpn.status".into(),
                interval: Duration::from_secs(15)
            })
        );
        assert_eq!(s.clients.len(), 1);
        assert_eq!(
            s.clients["vpn-shoot-client"].iroutes,
            [
                net("242.0.0.0/8"),
                net("243.0.0.0/8"),
                net("244.0.0.0/8"),
                net("2001:db8:100::/56")
            ]
        );
        assert_eq!(s.default_client, None);
        let up = l.up.as_ref().unwrap();
        assert_eq!(
            up.command.argv()[..4],
            ["/bin/vpn-server", "firewall", "--mode", "up"]
        );
        assert_eq!(
            l.down.as_ref().unwrap().command.argv(),
            [
                "/bin/vpn-server",
                "firewall",
                "--mode",
                "down",
                "--device",
                "tun0"
            ]
        );
        assert_eq!(l.verb, 3);
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        // The pushes a client gets: no IPv4 pool, so no route-gateway / topology.
        assert_eq!(
            s.push_for(s.client_options(Some("vpn-shoot-client"))),
            ["socket-flags TCP_NODELAY", "tun-ipv6"]
        );
    }

    #[test]
    fn tap_server_config() {
        let dir = secrets();
        let d = dir.path().display();
        let conf = dir.path().join("server.conf");
        let text = format!(
            "proto tcp-server\ndev tap\nserver 10.8.0.0 255.255.255.0\nclient-to-client\nduplicate-cn\n\
             max-routes-per-client 16\nca {d}/vpn-server/ca.crt\ncert {d}/vpn-server/tls.crt\n\
             key {d}/vpn-server/tls.key\ndh none\n"
        );
        std::fs::write(&conf, text).unwrap();
        let l = load_file(&conf).unwrap();
        let s = &l.settings;
        assert!(s.is_tap());
        assert_eq!(s.dev, "tap%d");
        assert_eq!(s.max_routes_per_client, 16);
        assert!(s.client_to_client && s.duplicate_cn);
        assert_eq!(s.pool_v4, Some("10.8.0.0/24".parse().unwrap()));
        // Upstream's helper for tap: route-gateway, no topology.
        assert_eq!(s.push_for(None), ["route-gateway 10.8.0.1"]);
        // A named device keeps its name; dev-type makes it a tap.
        std::fs::write(
            &conf,
            std::fs::read_to_string(&conf)
                .unwrap()
                .replace("dev tap", "dev vpn0\ndev-type tap"),
        )
        .unwrap();
        let s = load_file(&conf).unwrap().settings;
        assert!(s.is_tap());
        assert_eq!(s.dev, "vpn0");
    }

    #[test]
    fn gep14_server_fixture() {
        let dir = secrets();
        let ccd = dir.path().join("ccd");
        std::fs::create_dir(&ccd).unwrap();
        std::fs::write(ccd.join("DEFAULT"), "push \"route 10.9.0.0 255.255.0.0\"\n").unwrap();
        std::fs::write(
            ccd.join("shoot"),
            "iroute 10.250.0.0 255.255.0.0\npush-reset\n",
        )
        .unwrap();
        let conf = dir.path().join("server.conf");
        std::fs::write(&conf, fixture("gep14-server.conf", dir.path())).unwrap();
        let l = load_file(&conf).unwrap();
        let s = &l.settings;
        assert_eq!(s.listen, [SocketAddr::from(([0, 0, 0, 0], 1194))]);
        assert_eq!(s.data_ciphers.as_slice(), [DataCipher::Aes256Cbc]);
        assert_eq!(s.data_ciphers_fallback, Some(DataCipher::Aes256Cbc));
        assert_eq!(s.auth, Digest::Sha1);
        assert_eq!(
            s.keepalive,
            Some(Keepalive {
                ping: 10,
                ping_restart: 60
            })
        );
        assert_eq!(s.pool_v4, Some("192.168.123.0/24".parse().unwrap()));
        assert_eq!(s.pool_v6, None);
        assert_eq!(s.status, None);
        assert_eq!(s.clients["shoot"].iroutes, [net("10.250.0.0/16")]);
        assert!(s.clients["shoot"].push_reset);
        assert_eq!(
            s.default_client.as_ref().unwrap().push,
            ["route 10.9.0.0 255.255.0.0"]
        );
        assert!(l.up.is_none() && l.down.is_none());
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    }

    #[test]
    fn files_over_a_mebibyte_are_refused_unread_with_their_size() {
        let dir = secrets();
        let conf = dir.path().join("server.conf");
        let big = "#".repeat(usize::try_from(netio::volume::MAX_FILE_BYTES).unwrap() + 1);
        let too_large = "cannot read: 1048577 bytes, more than the 1048576 bytes a file may have";
        std::fs::write(&conf, fixture("gep14-server.conf", dir.path())).unwrap();
        let ccd = dir.path().join("ccd");
        std::fs::create_dir(&ccd).unwrap();
        std::fs::write(ccd.join("shoot"), &big).unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(e.ends_with(&format!("ccd/shoot: {too_large}")), "{e}");
        std::fs::remove_file(ccd.join("shoot")).unwrap();
        let cert = dir.path().join("vpn-server/tls.crt");
        let keep = std::fs::read(&cert).unwrap();
        std::fs::write(&cert, &big).unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(
            e.ends_with(&format!("vpn-server/tls.crt: {too_large}")),
            "{e}"
        );
        std::fs::write(&cert, keep).unwrap();
        load_file(&conf).expect("the files within the bound load");
        std::fs::write(&conf, &big).unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(e.ends_with(&format!("server.conf: {too_large}")), "{e}");
    }

    #[test]
    fn errors_name_the_path_or_the_line() {
        let dir = secrets();
        let conf = dir.path().join("server.conf");
        // A missing certificate: the error names its path.
        let text = fixture("gep14-server.conf", dir.path()).replace("tls.crt", "missing.crt");
        std::fs::write(&conf, text).unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(e.contains("vpn-server/missing.crt: cannot read"), "{e}");
        // A missing client-config-dir.
        let text = fixture("gep14-server.conf", dir.path());
        std::fs::write(&conf, text).unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(e.contains("ccd: cannot read client-config-dir"), "{e}");
        // A typo in a client-config-dir file: file, line and directive.
        let ccd = dir.path().join("ccd");
        std::fs::create_dir(&ccd).unwrap();
        std::fs::write(
            ccd.join("shoot"),
            "iroute 10.0.0.0 255.0.0.0\niroutee 10.1.0.0\n",
        )
        .unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(
            e.ends_with("ccd/shoot:2: unknown directive 'iroutee'"),
            "{e}"
        );
        std::fs::remove_file(ccd.join("shoot")).unwrap();
        // An ifconfig-pool range narrower than the network is taken, as upstream does (low
        // addresses kept for ifconfig-push); one over the broadcast address is refused.
        let narrowed = |range: &str| {
            from_options(
                "x.conf",
                &ServerOptions::parse(
                    "x.conf",
                    &fixture("gep14-server.conf", dir.path())
                        .replace("192.168.123.2 192.168.123.254", range),
                )
                .unwrap()
                .config,
            )
        };
        let s = narrowed("192.168.123.10 192.168.123.20").unwrap().settings;
        assert_eq!(
            s.pool_v4_range,
            Some((
                "192.168.123.10".parse().unwrap(),
                "192.168.123.20".parse().unwrap()
            ))
        );
        let e = chain(&narrowed("192.168.123.10 192.168.123.255").unwrap_err());
        assert!(
            e.starts_with("x.conf: 'ifconfig-pool': IPv4 pool range"),
            "{e}"
        );
        // A garbage tls-auth key names the key file.
        std::fs::write(dir.path().join("tlsauth/vpn.tlsauth"), "nonsense\n").unwrap();
        let e = chain(&load_file(&conf).unwrap_err());
        assert!(e.contains("tlsauth/vpn.tlsauth: "), "{e}");
    }

    #[test]
    fn unused_directives_warn() {
        let dir = secrets();
        let text = fixture("gep14-server.conf", dir.path())
            .replace("client-config-dir", "# client-config-dir")
            .replace("keepalive 10 60", "")
            + "ping 5\nscript-security 1\nup /bin/true\nstatus /tmp/s 5\nroute 10.1.0.0 255.255.0.0 10.0.0.1\n";
        let parsed = ServerOptions::parse("w.conf", &text).unwrap();
        let l = from_options("w.conf", &parsed.config).unwrap();
        let w = l.warnings.join("\n");
        for needle in [
            "'ping/ping-restart'",
            "'up': not run",
            "'status-version'",
            "'route'",
        ] {
            assert!(w.contains(needle), "{needle} in {w}");
        }
        assert!(l.up.is_none());
        assert_eq!(l.settings.routes, [net("10.1.0.0/16")]);
    }

    #[test]
    fn reneg_sec_min_is_taken_quietly() {
        let dir = secrets();
        for (line, max, min) in [
            ("reneg-sec 30 10", 30, Some(10)),
            ("reneg-sec 30", 30, None),
        ] {
            let text = fixture("gep14-server.conf", dir.path())
                .replace("client-config-dir", "# client-config-dir")
                + line
                + "\n";
            let parsed = ServerOptions::parse("r.conf", &text).unwrap();
            let l = from_options("r.conf", &parsed.config).unwrap();
            assert!(
                !l.warnings.iter().any(|w| w.contains("reneg-sec")),
                "{:?}",
                l.warnings
            );
            let session = l.settings.server_config().session;
            assert_eq!(session.reneg_sec, Some(Duration::from_secs(max)));
            assert_eq!(session.reneg_sec_min, min.map(Duration::from_secs));
        }
    }

    fn env(vars: &[(&str, &str)]) -> Vpn2ServerEnv {
        Vpn2ServerEnv::parse(vars.iter().copied()).unwrap()
    }

    #[test]
    fn vpn2_environment_mode() {
        let dir = secrets();
        let e = env(&[
            ("OPENVPN_STATUS_PATH", "/srv/status/openvpn.status"),
            ("SHOOT_NODE_NETWORKS", "10.250.0.0/16,2001:db8:1::/64"),
        ]);
        let l = from_vpn2_env(&e, dir.path()).unwrap();
        let s = &l.settings;
        assert_eq!(s.listen, [SocketAddr::from(([0u16; 8], 1194))]);
        assert_eq!(s.auth, Digest::Sha256);
        assert_eq!(
            s.data_ciphers.as_slice(),
            [DataCipher::Aes256Gcm, DataCipher::Aes256Cbc]
        );
        assert!(matches!(
            s.protection,
            ControlProtection::TlsAuth {
                direction: KeyDirection::Normal,
                ..
            }
        ));
        assert_eq!(s.pool_v4, None);
        assert_eq!(s.pool_v6, Some("fd8f:6d53:b97a:1::/96".parse().unwrap()));
        assert_eq!(s.dev, "tun0");
        assert_eq!(
            s.keepalive,
            Some(Keepalive {
                ping: 10,
                ping_restart: 30
            })
        );
        assert_eq!(
            s.status,
            Some(StatusFile {
                path: "/srv/status/openvpn.status".into(),
                interval: Duration::from_secs(15)
            })
        );
        let iroutes = [
            net("242.0.0.0/8"),
            net("2001:db8:1::/64"),
            net("243.0.0.0/8"),
            net("244.0.0.0/8"),
        ];
        assert_eq!(s.clients["vpn-shoot-client"].iroutes, iroutes);
        // The mapped ranges and IPv6 networks are routed into the tunnel, as vpn2 routes them;
        // the real IPv4 networks are not (they may overlap the seed's own).
        assert_eq!(s.routes, iroutes);
        for n in [
            net("100.64.0.0/13"),
            net("100.96.0.0/11"),
            net("10.250.0.0/16"),
        ] {
            assert!(!s.routes.contains(&n), "{n} in {:?}", s.routes);
        }
        assert!(l.up.is_none() && l.down.is_none());
        // A missing secret names its path under the secrets directory.
        std::fs::remove_file(dir.path().join("tlsauth/vpn.tlsauth")).unwrap();
        let err = from_vpn2_env(&e, dir.path()).unwrap_err().to_string();
        assert!(err.contains("tlsauth/vpn.tlsauth: cannot read"), "{err}");
    }

    #[test]
    fn vpn2_env_ha_switches_without_a_device_or_pool() {
        let dir = secrets();
        let ha = env(&[
            ("OPENVPN_STATUS_PATH", "/s"),
            ("IS_HA", "true"),
            ("POD_NAME", "vpn-seed-server-1"),
            ("HA_VPN_CLIENTS", "2"),
            ("SHOOT_NODE_NETWORKS", "10.250.0.0/16"),
        ]);
        let l = from_vpn2_env(&ha, dir.path()).unwrap();
        let s = &l.settings;
        let nets = &s.ha.as_ref().expect("HA settings").shoot_networks;
        for n in [
            "100.64.0.0/13",
            "100.96.0.0/11",
            "10.250.0.0/16",
            "242.0.0.0/8",
            "243.0.0.0/8",
            "244.0.0.0/8",
        ] {
            assert!(nets.contains(&net(n)), "{n} not in {nets:?}");
        }
        assert_eq!(nets.len(), 6, "{nets:?}");
        assert_eq!((s.pool_v4, s.pool_v6), (None, None));
        // vpn2's `server-ipv6` of server 1: the pool of vpn2's layer-2 clients only.
        assert_eq!(
            s.ha.as_ref().and_then(|h| h.layer2_v6),
            Some("fd8f:6d53:b97a:1::101:0/112".parse().unwrap())
        );
        assert!(s.routes.is_empty(), "{:?}", s.routes);
        assert!(s.duplicate_cn && !s.client_to_client);
        assert!(!s.is_tap());
        assert_eq!(s.keepalive, Some(HA_KEEPALIVE));
        assert!(
            s.push_for(None)
                .iter()
                .all(|p| !p.to_string().starts_with("route")),
            "{:?}",
            s.push_for(None)
        );
    }

    /// The server config text vpn2 environment mode rendered and parsed before its lines
    /// were typed, kept verbatim as the referee of [`vpn2_lines`].
    fn rendered_before(env: &Vpn2ServerEnv, secrets: &Path) -> String {
        let s = |rel: &str| secrets.join(rel).display().to_string();
        let mut lines = vec![
            "mode server".to_owned(),
            "tls-server".to_owned(),
            "topology subnet".to_owned(),
            "verb 3".to_owned(),
            "txqueuelen 1000".to_owned(),
            "tcp-nodelay".to_owned(),
            "data-ciphers AES-256-GCM:AES-256-CBC".to_owned(),
            "port 1194".to_owned(),
            "keepalive 10 30".to_owned(),
            format!("key \"{}\"", s("vpn-server/tls.key")),
            format!("cert \"{}\"", s("vpn-server/tls.crt")),
            format!("ca \"{}\"", s("vpn-server/ca.crt")),
            "dh none".to_owned(),
            "auth SHA256".to_owned(),
            format!("tls-auth \"{}\" 0", s("tlsauth/vpn.tlsauth")),
            "proto tcp6-server".to_owned(),
            format!("server-ipv6 {}", env.server_ipv6_network()),
            format!("dev {}", env.device()),
            format!(
                "status \"{}\" {VPN2_STATUS_INTERVAL}",
                env.status_path.display()
            ),
            "status-version 2".to_owned(),
        ];
        if env.is_ha {
            lines.push("client-to-client".to_owned());
            lines.push("duplicate-cn".to_owned());
        }
        lines.join("\n") + "\n"
    }

    #[test]
    fn vpn2_lines_read_as_the_rendered_text_parsed() {
        const STATUS: (&str, &str) = ("OPENVPN_STATUS_PATH", "/srv/status/openvpn.status");
        let ha = |i: &'static str| {
            vec![
                STATUS,
                ("IS_HA", "true"),
                ("POD_NAME", i),
                ("HA_VPN_CLIENTS", "2"),
            ]
        };
        let envs: Vec<Vec<(&str, &str)>> = vec![
            vec![STATUS],
            // Gardener's seed server (gardener-pods.md 2.1), dual-stack shoot.
            vec![
                STATUS,
                ("IP_FAMILIES", "IPv4,IPv6"),
                ("SHOOT_SERVICE_NETWORKS", "100.64.0.0/13,fd00:64::/112"),
                ("SHOOT_POD_NETWORKS", "100.96.0.0/11,fd00:96::/48"),
                ("SHOOT_NODE_NETWORKS", "10.250.0.0/16,fd00:250::/48"),
                ("SEED_POD_NETWORK", "100.96.0.0/11"),
                ("LOCAL_NODE_IP", "10.0.0.7"),
                ("POD_NAME", "vpn-seed-server-6d9c5b7f4-x2k8q"),
                ("OPENVPN_AUTO_MTU", "true"),
            ],
            // IPv6 only, another transfer network.
            vec![
                STATUS,
                ("SHOOT_SERVICE_NETWORKS", "2001:db8:64::/112"),
                ("SHOOT_POD_NETWORKS", "2001:db8:96::/48"),
                ("SHOOT_NODE_NETWORKS", "2001:db8:250::/64"),
                ("SEED_POD_NETWORK", "2001:db8:10::/64"),
                ("VPN_NETWORK", "fd00:1:2:3::/96"),
            ],
            ha("vpn-seed-server-0"),
            ha("vpn-seed-server-1"),
            ha("vpn-seed-server-2"),
            // Odd values: a status path with spaces and quotes, one network listed twice.
            vec![
                ("OPENVPN_STATUS_PATH", "/tmp/odd dir/it's \"here\""),
                ("SHOOT_POD_NETWORKS", "10.0.0.0/8,10.0.0.0/8"),
            ],
        ];
        let dir = Path::new("/srv/secrets");
        for vars in envs {
            let e = env(&vars);
            let typed = ServerOptions::from_lines(
                VPN2_ENV_CONFIG_NAME,
                &vpn2_lines(&e, dir, Vpn2Reader::Ours),
            );
            let text = rendered_before(&e, dir);
            let parsed = ServerOptions::parse(VPN2_ENV_CONFIG_NAME, &text);
            if e.status_path.to_string_lossy().contains('"') {
                // The text could not say it; the typed lines can.
                let typed = typed.unwrap();
                assert!(parsed.is_err(), "{text}");
                assert_eq!(typed.config.common.status.unwrap().path, e.status_path);
                continue;
            }
            assert_eq!(typed.unwrap(), parsed.unwrap(), "{vars:?}");
        }
    }

    #[test]
    fn vpn2s_hook_networks_and_route_limit() {
        let e = env(&[
            ("OPENVPN_STATUS_PATH", "/s"),
            ("SHOOT_SERVICE_NETWORKS", "100.64.0.0/13,fd00:64::/112"),
            ("SHOOT_POD_NETWORKS", "100.96.0.0/11,fd00:96::/48"),
            ("SHOOT_NODE_NETWORKS", "10.250.0.0/16,fd00:250::/48"),
        ]);
        let nets: Vec<String> = vpn2_shoot_networks(&e)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            nets,
            [
                "242.0.0.0/8",
                "243.0.0.0/8",
                "244.0.0.0/8",
                "fd00:250::/48",
                "fd00:64::/112",
                "fd00:96::/48"
            ]
        );
        // An IPv6 /48 alone is over the limit.
        assert_eq!(vpn2_max_routes_per_client(&e), 1 << 20);
        // 100.64.0.0/13 and 100.96.0.0/11 (the defaults): 2^19 - 2 + 2^21 - 2 is over it too;
        // one /24 is under the floor, a /20 and a /31 are between.
        let small = |pods: &str| {
            vpn2_max_routes_per_client(&env(&[
                ("OPENVPN_STATUS_PATH", "/s"),
                ("SHOOT_SERVICE_NETWORKS", "10.1.0.0/31"),
                ("SHOOT_POD_NETWORKS", pods),
            ]))
        };
        assert_eq!(small("10.0.0.0/24"), 256);
        assert_eq!(small("10.0.0.0/20"), 4096 - 2 + 2);
        // HA maps only where the seed's pod network overlaps a shoot network.
        let ha = |seed: &str| {
            vpn2_shoot_networks(&env(&[
                ("OPENVPN_STATUS_PATH", "/s"),
                ("IS_HA", "true"),
                ("POD_NAME", "vpn-seed-server-0"),
                ("HA_VPN_CLIENTS", "2"),
                ("SEED_POD_NETWORK", seed),
            ]))
        };
        assert_eq!(
            ha("10.1.0.0/16"),
            [net("100.64.0.0/13"), net("100.96.0.0/11")]
        );
        assert_eq!(
            ha("100.96.0.0/16"),
            [net("243.0.0.0/8"), net("244.0.0.0/8")]
        );
    }
}
