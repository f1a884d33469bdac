//! From an OpenVPN client config to [`Settings`]: the only place the client reads files.
//!
//! [`load`] reads the config file, parses it with [`protocol::config`] and maps the
//! [`ClientOptions`] with [`settings_from_options`], which reads every [`Source::Path`] (`ca`,
//! `cert`, `key`, `tls-auth`, `tls-crypt`, the `http-proxy` credentials file). Errors name what
//! the user has to fix: the path of a file that cannot be read or parsed, the config file and
//! line of a directive we refuse. A file over 1 MiB (`netio::volume::MAX_FILE_BYTES`, what a
//! Kubernetes Secret holds) is refused unread, with its size and the bound.
//!
//! What we do not act on is returned as a warning (to be logged at start), never dropped:
//! the parser's own warnings (`management`, `user`, ...) plus these of the mapping:
//! `local`, `mssfix`, `sndbuf`, `rcvbuf`, `replay-window`, `tls-version-min` above 1.2,
//! `status`, a client-side `route` / `route-ipv6`.
//!
//! `verb` sets the default log level ([`Loaded::verb`], mapped by [`verb_log_filter`] as the
//! server maps its own); `--log` / `VPN_CLIENT_LOG` overrides it.
//!
//! Directives that are satisfied by how the client always works need no warning:
//! `nobind` (the client never binds), `persist-tun` (the device is kept across reconnects),
//! `persist-key` (keys are never re-read), `tcp-nodelay` (always set), `auth-nocache`
//! (nothing is cached), `disable-dco` (there is no offload).
//!
//! `dev tap…` / `dev-type tap` run a layer-2 tap device ([`TunSettings::tap`]).
//!
//! Refused with an error: `up`/`down` without `script-security 2`,
//! proxy authentication other than a basic-auth file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use netio::http::{BasicAuth, CustomHeader, HttpVersion};
use netio::volume::{read_file_bounded, read_text_bounded, MAX_FILE_BYTES};
use pki::check::{RemoteCertTls, VerifyX509Name, X509NameType};
use pki::tls::PeerPolicy;
use pki::{CaBundle, Identity};
use protocol::config::{
    lex, CertUsage, ClientOptions, CommonOptions, ConfigError, DevType, Line, ProxyAuthMethod,
    ProxyCredentials, Source, TlsVersion, TlsWrapConfig, Warning,
};
use protocol::session::ControlProtection;
use protocol::static_key;

use crate::script::{ParseError, Script, Scripts};
use crate::settings::{HttpProxy, Remote, Settings, TlsMaterial, TunSettings};

/// The settings of a config file and what it asked for that we do not act on.
#[derive(Debug)]
pub struct Loaded {
    /// The settings.
    pub settings: Settings,
    /// One line per directive accepted without effect (`file:line: 'directive': why`).
    pub warnings: Vec<String>,
    /// `verb` (0 to 11, upstream's default 1): the default log level, see [`verb_log_filter`].
    pub verb: u8,
}

/// The log filter for upstream's `verb`, when no `--log` is given
/// ([`netio::logging::verb_filter`], the server's table too).
pub fn verb_log_filter(verb: u8) -> &'static str {
    netio::logging::verb_filter(verb)
}

/// Why a config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file (the config, a key, a certificate) cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config text is invalid (names file, line and directive).
    #[error("{0}")]
    Config(ConfigError),
    /// A directive we parse but refuse.
    #[error("{file}{}: '{directive}': {reason}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Unsupported {
        /// The config file.
        file: String,
        /// The directive's line, when known.
        line: Option<usize>,
        /// The directive.
        directive: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A `ca`, `cert` or `key` whose PEM cannot be used.
    #[error("{what} {origin}: invalid PEM")]
    Pem {
        /// `ca` or `cert/key`.
        what: &'static str,
        /// The file, or the inline block.
        origin: String,
        /// Why.
        #[source]
        source: pki::pem::PemError,
    },
    /// A `tls-auth` / `tls-crypt` key that is not an OpenVPN static key.
    #[error("{what} {origin}: invalid static key")]
    StaticKey {
        /// `tls-auth` or `tls-crypt`.
        what: &'static str,
        /// The file, or the inline block.
        origin: String,
        /// Why.
        #[source]
        source: static_key::StaticKeyError,
    },
    /// An `up` / `down` command that cannot be split into words.
    #[error("{file}{}: '{directive}'", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Script {
        /// The config file.
        file: String,
        /// The directive's line.
        line: Option<usize>,
        /// `up` or `down`.
        directive: &'static str,
        /// Why.
        #[source]
        source: ParseError,
    },
    /// The proxy credentials file has no user name and password lines.
    #[error("{}: expected the proxy user name and password on two lines", path.display())]
    ProxyCredentials {
        /// The file.
        path: PathBuf,
    },
}

/// Reads and maps the client config at `path`.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    let text = read_text_bounded(path, MAX_FILE_BYTES).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    load_text(&path.display().to_string(), &text)
}

/// Parses and maps config `text`; `file` names it in errors and warnings.
pub fn load_text(file: &str, text: &str) -> Result<Loaded, LoadError> {
    let parsed = ClientOptions::parse(file, text).map_err(LoadError::Config)?;
    // Line numbers for the mapping's own messages (the model keeps none).
    let directives = lex(file, text).map_err(LoadError::Config)?;
    let lines = Lines {
        file,
        at: directives
            .iter()
            .map(|d| (d.name.as_str(), d.line))
            .collect(),
    };
    settings_from_options(&parsed.config, &parsed.warnings, &lines)
}

/// Reads and maps a generated config's typed `lines` (vpn2's, [`crate::vpn2`]) without text,
/// as [`load_text`] does their text; `file` names it in errors and warnings.
pub fn load_lines(file: &str, typed: &[Line]) -> Result<Loaded, LoadError> {
    let parsed = ClientOptions::from_lines(file, typed).map_err(LoadError::Config)?;
    let lines = Lines {
        file,
        at: typed.iter().zip(1..).map(|(l, n)| (l.name(), n)).collect(),
    };
    settings_from_options(&parsed.config, &parsed.warnings, &lines)
}

/// Where each directive is, for messages.
struct Lines<'a> {
    file: &'a str,
    /// Each directive's name and line, in config order.
    at: Vec<(&'a str, usize)>,
}

impl Lines<'_> {
    fn of(&self, name: &str) -> Option<usize> {
        self.at
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, line)| *line)
    }

    fn unsupported(&self, directive: &'static str, reason: &'static str) -> LoadError {
        LoadError::Unsupported {
            file: self.file.to_owned(),
            line: self.of(directive),
            directive,
            reason,
        }
    }

    fn warn(&self, out: &mut Vec<String>, directive: &str, why: &str) {
        let at = self
            .of(directive)
            .map(|l| format!(":{l}"))
            .unwrap_or_default();
        out.push(format!("{}{at}: '{directive}': {why}", self.file));
    }
}

/// The [`Settings`] of a parsed config, each concern in its own step, in the order their
/// errors take precedence; the warnings are the parser's, then the mapping's.
fn settings_from_options(
    o: &ClientOptions,
    parser_warnings: &[Warning],
    lines: &Lines<'_>,
) -> Result<Loaded, LoadError> {
    let c = &o.common;
    let mut warnings: Vec<String> = parser_warnings.iter().map(ToString::to_string).collect();

    let tls = tls_material(c)?;
    let protection = control_protection(c)?;
    let remotes = o
        .remotes
        .iter()
        .map(|r| Remote::new(r.host.clone(), r.port))
        .collect();
    let mut s = Settings::new(remotes, tls, protection);
    s.family = c.family;
    s.data_ciphers = c.effective_data_ciphers();
    s.data_ciphers_fallback = c.data_ciphers_fallback;
    s.auth = c.auth;
    s.compression = c.compression;
    apply_timers(&mut s, c);
    s.pull = o.pull_policy();
    s.tun = tun_settings(c, s.tun.mtu, lines)?;
    s.connect_retry = secs(o.connect_retry.initial);
    s.connect_retry_max = secs(o.connect_retry.max);
    s.connect_retry_attempts = o.connect_retry_max;
    s.http_proxy = http_proxy(o, lines)?;
    s.scripts = scripts(o, lines)?;
    warn_not_acted_on(c, lines, &mut warnings);
    Ok(Loaded {
        settings: s,
        warnings,
        verb: c.verb,
    })
}

/// The CA, certificate and key, checked here so that errors name the file, and the checks
/// on the server's certificate.
fn tls_material(c: &CommonOptions) -> Result<TlsMaterial, LoadError> {
    let ca = read_source(&c.ca)?;
    let cert = read_source(&c.cert)?;
    let key = read_source(&c.key)?;
    CaBundle::from_pem(&ca).map_err(|source| LoadError::Pem {
        what: "ca",
        origin: origin(&c.ca),
        source,
    })?;
    Identity::from_pem(&cert, &key).map_err(|source| LoadError::Pem {
        what: "cert/key",
        origin: format!("{} + {}", origin(&c.cert), origin(&c.key)),
        source,
    })?;
    let peer = PeerPolicy {
        remote_cert_tls: c.remote_cert_tls.map(|u| match u {
            CertUsage::Server => RemoteCertTls::Server,
            CertUsage::Client => RemoteCertTls::Client,
        }),
        verify_x509_name: c.verify_x509_name.as_ref().map(|v| VerifyX509Name {
            name: v.name.clone(),
            kind: match v.kind {
                protocol::config::X509NameType::Subject => X509NameType::Subject,
                protocol::config::X509NameType::Name => X509NameType::Name,
                protocol::config::X509NameType::NamePrefix => X509NameType::NamePrefix,
            },
        }),
    };
    Ok(TlsMaterial::Pem {
        ca,
        cert,
        key,
        peer,
    })
}

/// `tls-auth` or `tls-crypt`, with the key file read.
fn control_protection(c: &CommonOptions) -> Result<ControlProtection, LoadError> {
    Ok(match &c.tls_wrap {
        None => ControlProtection::None,
        Some(TlsWrapConfig::Auth { key, direction }) => ControlProtection::TlsAuth {
            key: read_static_key(key, "tls-auth")?,
            direction: *direction,
            digest: c.auth,
        },
        Some(TlsWrapConfig::Crypt { key }) => ControlProtection::TlsCrypt {
            key: read_static_key(key, "tls-crypt")?,
        },
    })
}

/// Renegotiation, the handshake windows and the keepalive.
fn apply_timers(s: &mut Settings, c: &CommonOptions) {
    if let Some(r) = c.reneg_sec {
        s.reneg_sec = (r.max > 0).then(|| secs(r.max));
        s.reneg_sec_min = r.min.map(secs);
    }
    s.reneg_bytes = c.reneg_bytes;
    s.reneg_pkts = c.reneg_pkts;
    if let Some(h) = c.hand_window {
        s.hand_window = secs(h);
    }
    s.tls_timeout = c.tls_timeout.map(secs);
    s.tran_window = c.tran_window.map(secs);
    // On a client `keepalive N M` is `ping N` + `ping-restart M`.
    match c.keepalive {
        Some(k) => {
            s.ping = Some(secs(k.interval));
            s.ping_restart = Some(secs(k.timeout));
        }
        None => {
            s.ping = c.ping.filter(|p| *p > 0).map(secs);
            s.ping_restart = c.ping_restart.filter(|p| *p > 0).map(secs);
        }
    }
}

/// The tun (or tap) device; `default_mtu` when the config sets none.
fn tun_settings(
    c: &CommonOptions,
    default_mtu: u16,
    lines: &Lines<'_>,
) -> Result<TunSettings, LoadError> {
    Ok(TunSettings {
        // `dev tun` / `dev tap` mean "the next free device" (the kernel names it tun0,
        // tun1, ...), as upstream and our server read it; any other name is taken literally.
        name: match c.dev.as_str() {
            "tun" | "tap" => format!("{}%d", c.dev),
            dev => dev.to_owned(),
        },
        tap: c.dev_type == DevType::Tap,
        mtu: match c.tun_mtu {
            Some(m) => u16::try_from(m)
                .map_err(|_| lines.unsupported("tun-mtu", "the MTU must be at most 65535"))?,
            None => default_mtu,
        },
        txqueuelen: c.txqueuelen,
        ..TunSettings::default()
    })
}

/// Directives accepted but not acted on by the client: say so.
fn warn_not_acted_on(c: &CommonOptions, lines: &Lines<'_>, warnings: &mut Vec<String>) {
    let mut warn = |directive: &str, why: &str| lines.warn(warnings, directive, why);
    if c.local.is_some() {
        warn("local", "the client does not bind its socket; ignored");
    }
    if c.mssfix.is_some() {
        warn("mssfix", "TCP MSS clamping is not implemented; ignored");
    }
    if c.sndbuf.is_some() {
        warn(
            "sndbuf",
            "socket buffer sizes are left to the kernel; ignored",
        );
    }
    if c.rcvbuf.is_some() {
        warn(
            "rcvbuf",
            "socket buffer sizes are left to the kernel; ignored",
        );
    }
    if c.replay_window.is_some() {
        warn(
            "replay-window",
            "the data channel uses upstream's default window; ignored",
        );
    }
    if c.tls_version_min
        .is_some_and(|v| v.version > TlsVersion::V1_2)
    {
        warn(
            "tls-version-min",
            "the control channel always allows TLS 1.2 and 1.3; ignored",
        );
    }
    if c.status.is_some() {
        warn("status", "the client writes no status file; ignored");
    }
    if !c.routes.is_empty() {
        warn(
            "route",
            "only pushed routes are installed on the client; ignored",
        );
    }
    if !c.routes_ipv6.is_empty() {
        warn(
            "route-ipv6",
            "only pushed routes are installed on the client; ignored",
        );
    }
}

fn http_proxy(o: &ClientOptions, lines: &Lines<'_>) -> Result<Option<HttpProxy>, LoadError> {
    let Some(p) = &o.http_proxy else {
        if o.http_proxy_options != Default::default() {
            return Err(lines.unsupported("http-proxy-option", "needs an 'http-proxy' to apply to"));
        }
        return Ok(None);
    };
    let mut proxy = HttpProxy::new(p.host.clone(), p.port);
    let opts = &o.http_proxy_options;
    if opts.version.as_deref() == Some("1.1") {
        proxy.options.version = HttpVersion::Http11;
    }
    proxy.options.user_agent = opts.agent.clone();
    proxy.options.custom_headers = opts
        .custom_headers
        .iter()
        .map(|h| match &h.content {
            Some(value) => CustomHeader::NameValue {
                name: h.name.clone(),
                value: value.clone(),
            },
            None => CustomHeader::Line(h.name.clone()),
        })
        .collect();
    if let Some(auth) = &p.auth {
        match (&auth.credentials, auth.method) {
            (ProxyCredentials::File(path), None | Some(ProxyAuthMethod::Basic)) => {
                let text =
                    read_text_bounded(path, MAX_FILE_BYTES).map_err(|source| LoadError::Read {
                        path: path.clone(),
                        source,
                    })?;
                let mut it = text.lines();
                match (it.next(), it.next()) {
                    (Some(user), Some(password)) if !user.is_empty() => {
                        proxy.options.basic_auth = Some(BasicAuth {
                            user: user.to_owned(),
                            password: password.to_owned(),
                        })
                    }
                    _ => return Err(LoadError::ProxyCredentials { path: path.clone() }),
                }
            }
            _ => {
                return Err(lines.unsupported(
                    "http-proxy",
                    "proxy authentication: only basic with a credentials file is supported",
                ))
            }
        }
    }
    Ok(Some(proxy))
}

fn scripts(o: &ClientOptions, lines: &Lines<'_>) -> Result<Scripts, LoadError> {
    let c = &o.common;
    let mut scripts = Scripts::default();
    for (directive, text, slot) in [
        ("up", &c.up, &mut scripts.up),
        ("down", &c.down, &mut scripts.down),
    ] {
        let Some(text) = text else { continue };
        if c.script_security < 2 {
            return Err(lines.unsupported(
                directive,
                "running a command needs 'script-security 2' (or higher)",
            ));
        }
        *slot = Some(Script::parse(text).map_err(|source| LoadError::Script {
            file: lines.file.to_owned(),
            line: lines.of(directive),
            directive,
            source,
        })?);
    }
    Ok(scripts)
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

fn origin(source: &Source) -> String {
    match source {
        Source::Path(p) => p.display().to_string(),
        Source::Inline(_) => "(inline block)".to_owned(),
    }
}

fn read_source(source: &Source) -> Result<Vec<u8>, LoadError> {
    match source {
        Source::Inline(text) => Ok(text.as_bytes().to_vec()),
        Source::Path(path) => {
            read_file_bounded(path, MAX_FILE_BYTES).map_err(|source| LoadError::Read {
                path: path.clone(),
                source,
            })
        }
    }
}

fn read_static_key(source: &Source, what: &'static str) -> Result<protocol::key::Key2, LoadError> {
    let bytes = read_source(source)?;
    let text = String::from_utf8_lossy(&bytes);
    static_key::parse(&text).map_err(|e| LoadError::StaticKey {
        what,
        origin: origin(source),
        source: e,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use protocol::data::DataCipher;
    use protocol::digest::Digest;
    use protocol::key::KeyDirection;

    /// The vpn2 shoot client config fixture of the protocol crate.
    pub const VPN2_CLIENT_SHOOT: &str =
        include_str!("../../protocol/tests/data/config/vpn2-client-shoot.conf");

    /// vpn2's secrets layout under a temp dir: a self-signed certificate (made by the
    /// `openssl` CLI) serves as CA and client certificate; a fresh static key.
    pub fn secrets() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let client = dir.path().join("vpn-client");
        std::fs::create_dir_all(&client).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("tlsauth")).expect("mkdir");
        let status = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=vpn-shoot-client", "-keyout"])
            .arg(client.join("tls.key"))
            .arg("-out")
            .arg(client.join("tls.crt"))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl");
        assert!(status.success());
        std::fs::copy(client.join("tls.crt"), client.join("ca.crt")).expect("ca");
        let key = static_key::generate(&mut rand_core::OsRng);
        std::fs::write(
            dir.path().join("tlsauth/vpn.tlsauth"),
            static_key::write(&key),
        )
        .expect("ta");
        dir
    }

    fn fixture_in(dir: &Path) -> String {
        VPN2_CLIENT_SHOOT.replace("/srv/secrets", &dir.display().to_string())
    }

    #[test]
    fn verb_sets_the_default_log_level_without_a_warning() {
        let dir = secrets();
        let base: String = fixture_in(dir.path())
            .lines()
            .filter(|l| !l.starts_with("verb"))
            .map(|l| format!("{l}\n"))
            .collect();
        for (verb, filter) in [(None, "info"), (Some(0), "error"), (Some(4), "info")]
            .into_iter()
            .chain([(Some(5), "debug"), (Some(6), "debug"), (Some(7), "trace")])
            .chain([(Some(11), "trace")])
        {
            let text = match verb {
                Some(v) => format!("{base}verb {v}\n"),
                None => base.clone(),
            };
            let loaded = load_text("client.conf", &text).expect("loads");
            assert_eq!(loaded.verb, verb.unwrap_or(1));
            assert_eq!(verb_log_filter(loaded.verb), filter, "verb {verb:?}");
            assert!(
                !loaded.warnings.iter().any(|w| w.contains("'verb'")),
                "{:?}",
                loaded.warnings
            );
        }
    }

    #[test]
    fn reneg_sec_min_is_taken_quietly() {
        let dir = secrets();
        let base = fixture_in(dir.path());
        for (line, min) in [("reneg-sec 30 10", Some(10)), ("reneg-sec 30", None)] {
            let loaded = load_text("client.conf", &format!("{base}{line}\n")).expect("loads");
            assert!(
                !loaded.warnings.iter().any(|w| w.contains("reneg-sec")),
                "{:?}",
                loaded.warnings
            );
            let session = loaded.settings.client_config().expect("config").session;
            assert_eq!(session.reneg_sec, Some(secs(30)));
            assert_eq!(session.reneg_sec_min, min.map(secs));
        }
    }

    #[test]
    fn dev_tun_lets_the_kernel_number_the_device() {
        let dir = secrets();
        let text = fixture_in(dir.path()).replace("dev tun0", "dev tun");
        let loaded = load_text("c.conf", &text).expect("loads");
        assert_eq!(loaded.settings.tun.name, "tun%d");
    }

    #[test]
    fn the_vpn2_shoot_client_template_maps_to_its_settings() {
        let dir = secrets();
        let loaded = load_text("client.conf", &fixture_in(dir.path())).expect("load");
        let s = &loaded.settings;
        assert_eq!(s.remotes, [Remote::new("api.demo.proj.example.com", 1194)]);
        let proxy = s.http_proxy.as_ref().expect("proxy");
        assert_eq!(
            (proxy.host.as_str(), proxy.port, proxy.options.version),
            ("api.demo.proj.example.com", 8443, HttpVersion::Http10)
        );
        assert_eq!(
            proxy.options.custom_headers,
            [CustomHeader::NameValue {
                name: "X-Gardener-Destination".into(),
                value: "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local".into()
            }]
        );
        assert_eq!(s.auth, Digest::Sha256);
        assert_eq!(s.data_ciphers.as_slice(), [DataCipher::Aes256Gcm]);
        match &s.protection {
            ControlProtection::TlsAuth {
                direction, digest, ..
            } => assert_eq!(
                (*direction, *digest),
                (KeyDirection::Inverse, Digest::Sha256)
            ),
            other => panic!("{other:?}"),
        }
        match &s.tls {
            TlsMaterial::Pem { peer, .. } => assert_eq!(*peer, PeerPolicy::server_peer()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (s.connect_retry, s.connect_retry_max),
            (Duration::from_secs(1), Duration::from_secs(5))
        );
        assert_eq!(s.family, protocol::config::Family::V4);
        assert_eq!(
            s.tun,
            TunSettings {
                name: "tun0".into(),
                mtu: 1500,
                txqueuelen: Some(1000),
                ..TunSettings::default()
            }
        );
        assert_eq!(
            s.scripts.up.as_ref().expect("up").argv(),
            [
                "/bin/sh",
                "-c",
                "/sbin/ip route replace 241.0.0.0/8 dev $1",
                "--"
            ]
        );
        assert!(s.scripts.down.is_none());
        assert_eq!((s.ping, s.ping_restart), (None, None));
        // `management` is reported, with its line; `verb 3` sets the log level, quietly.
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.starts_with("client.conf:29: 'management'")),
            "{:?}",
            loaded.warnings
        );
        assert!(
            !loaded.warnings.iter().any(|w| w.contains("'verb'")),
            "{:?}",
            loaded.warnings
        );
        assert_eq!(loaded.verb, 3);
        assert_eq!(verb_log_filter(loaded.verb), "info");
        s.client_config().expect("a usable session config");
    }

    /// The GEP-14-era shoot client config (file paths aside) loads unchanged: AES-256-CBC,
    /// tls-auth direction 1, the proxy with its custom header, tun0.
    #[test]
    fn the_gep14_client_config_maps_to_its_settings() {
        let dir = secrets();
        let text = include_str!("../../protocol/tests/data/config/gep14-client.conf")
            .replace("/srv/secrets", &dir.path().display().to_string());
        let loaded = load_text("gep14-client.conf", &text).expect("load");
        let s = &loaded.settings;
        assert_eq!(s.remotes, [Remote::new("api.demo.proj.example.com", 1194)]);
        let proxy = s.http_proxy.as_ref().expect("proxy");
        assert_eq!(proxy.port, 8132);
        assert_eq!(
            proxy.options.custom_headers,
            [CustomHeader::NameValue {
                name: "Reversed-VPN".into(),
                value: "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local".into()
            }]
        );
        assert_eq!(s.data_ciphers.as_slice(), [DataCipher::Aes256Cbc]);
        assert!(matches!(
            s.protection,
            ControlProtection::TlsAuth {
                direction: KeyDirection::Inverse,
                ..
            }
        ));
        assert_eq!(s.tun.name, "tun0");
        // `remap-usr1` is accepted and reported, never silently ignored.
        assert!(
            loaded.warnings.iter().any(|w| w.contains("'remap-usr1'")),
            "{:?}",
            loaded.warnings
        );
        s.client_config().expect("a usable session config");
    }

    #[test]
    fn pull_filters_keepalive_and_proxy_options_map() {
        let dir = secrets();
        let text = format!(
            "{}\npull-filter ignore \"route 10.99\"\nroute-nopull\nkeepalive 10 30\n\
             http-proxy-option VERSION 1.1\nhttp-proxy-option AGENT vpnt\n\
             verify-x509-name vpn-seed-server name\ntun-mtu 1400\nconnect-retry-max 3\n",
            fixture_in(dir.path())
        );
        let s = load_text("c.conf", &text).expect("load").settings;
        assert!(s.pull.route_nopull);
        assert_eq!(s.pull.filters.len(), 1);
        assert_eq!(
            (s.ping, s.ping_restart),
            (Some(Duration::from_secs(10)), Some(Duration::from_secs(30)))
        );
        let proxy = s.http_proxy.expect("proxy");
        assert_eq!(proxy.options.version, HttpVersion::Http11);
        assert_eq!(proxy.options.user_agent.as_deref(), Some("vpnt"));
        assert_eq!(s.tun.mtu, 1400);
        assert_eq!(s.connect_retry_attempts, Some(3));
        match s.tls {
            TlsMaterial::Pem { peer, .. } => assert_eq!(
                peer.verify_x509_name,
                Some(VerifyX509Name {
                    name: "vpn-seed-server".into(),
                    kind: X509NameType::Name
                })
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn inline_tls_auth_takes_key_direction() {
        let dir = secrets();
        let ta = std::fs::read_to_string(dir.path().join("tlsauth/vpn.tlsauth")).expect("ta");
        let text = fixture_in(dir.path()).replace(
            &format!(
                "tls-auth \"{}/tlsauth/vpn.tlsauth\" 1",
                dir.path().display()
            ),
            &format!("key-direction 1\n<tls-auth>\n{ta}</tls-auth>"),
        );
        let s = load_text("c.conf", &text).expect("load").settings;
        assert!(matches!(
            s.protection,
            ControlProtection::TlsAuth {
                direction: KeyDirection::Inverse,
                ..
            }
        ));
    }

    #[test]
    fn a_missing_certificate_names_its_path() {
        let dir = secrets();
        let cert = dir.path().join("vpn-client/tls.crt");
        std::fs::remove_file(&cert).expect("rm");
        let err = load_text("c.conf", &fixture_in(dir.path())).expect_err("missing cert");
        assert!(matches!(&err, LoadError::Read { path, .. } if *path == cert));
        assert!(err.to_string().contains(&cert.display().to_string()));
    }

    #[test]
    fn files_over_a_mebibyte_are_refused_unread_with_their_size() {
        let dir = secrets();
        let big = usize::try_from(MAX_FILE_BYTES).unwrap() + 1;
        for file in [
            "vpn-client/ca.crt",
            "vpn-client/tls.crt",
            "vpn-client/tls.key",
            "tlsauth/vpn.tlsauth",
        ] {
            let path = dir.path().join(file);
            let keep = std::fs::read(&path).expect("secret");
            std::fs::write(&path, "x".repeat(big)).expect("grow");
            let err = load_text("c.conf", &fixture_in(dir.path())).expect_err(file);
            assert_eq!(
                netio::report::chain(&err),
                format!(
                    "cannot read {}: 1048577 bytes, more than the 1048576 bytes a file may have",
                    path.display()
                )
            );
            std::fs::write(&path, keep).expect("restore");
        }
        let conf = dir.path().join("c.conf");
        std::fs::write(&conf, "#".repeat(big)).expect("config");
        let err = load(&conf).expect_err("config too large");
        assert!(
            netio::report::chain(&err)
                .ends_with("1048577 bytes, more than the 1048576 bytes a file may have"),
            "{err}"
        );
    }

    #[test]
    fn a_typo_names_file_line_and_directive() {
        let dir = secrets();
        let text = fixture_in(dir.path()).replace("remote-cert-tls", "remote-cert-tsl");
        let err = load_text("c.conf", &text).expect_err("typo");
        assert_eq!(
            err.to_string(),
            "c.conf:22: unknown directive 'remote-cert-tsl'"
        );
    }

    #[test]
    fn refused_directives_name_their_line() {
        let dir = secrets();
        let text = fixture_in(dir.path()).replace("script-security 2\n", "");
        let err = load_text("c.conf", &text).expect_err("no script-security");
        assert!(err.to_string().starts_with("c.conf:33: 'up': "), "{err}");
    }

    #[test]
    fn a_tap_device_is_taken() {
        let dir = secrets();
        let text = fixture_in(dir.path()).replace("dev tun0", "dev tap0");
        let s = load_text("c.conf", &text).expect("tap").settings;
        assert!(s.tun.tap);
        assert_eq!(s.tun.name, "tap0");
        let text = fixture_in(dir.path()).replace("dev tun0", "dev tap");
        let s = load_text("c.conf", &text).expect("tap").settings;
        assert!(s.tun.tap);
        assert_eq!(s.tun.name, "tap%d");
        let text = fixture_in(dir.path()).replace("dev tun0", "dev tun0\ndev-type tap");
        assert!(load_text("c.conf", &text).expect("tap").settings.tun.tap);
    }
}
