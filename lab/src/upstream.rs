//! A real upstream `openvpn` process inside a lab namespace: Debian's 2.6, or the program
//! `OPENVPN_REFEREE` names ([`referee`]).
//!
//! [`UpstreamOpenvpn::start`] writes the config into a fresh temporary directory, starts
//! `openvpn --config FILE --verb N --log FILE` there under `ip netns exec`, and returns a guard.
//! The process's stderr goes to a file beside the log, so errors printed before the log is
//! opened are not lost; [`UpstreamOpenvpn::log`] returns both. Dropping the guard stops the
//! process (SIGTERM, then SIGKILL); dropping the [`Netns`] would as well.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::netns::Netns;
use crate::pki_fixture::TestPki;
use crate::LabError;

pub use crate::referee::{referee, REFEREE_ENV};

/// What a TCP server logs once its listening socket is bound.
pub const LISTENING_MARKER: &str = "Listening for incoming TCP connection";

/// What a client logs once the tunnel is up.
pub const INITIALIZED_MARKER: &str = "Initialization Sequence Completed";

/// Control-channel wrapping of a generated config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlWrap {
    /// `tls-auth ta.key 0` on the server, `1` on the client.
    TlsAuth,
    /// `tls-crypt ta.key`.
    TlsCrypt,
}

/// A running upstream `openvpn`; stopped on drop.
#[derive(Debug)]
pub struct UpstreamOpenvpn<'ns> {
    ns: &'ns Netns,
    pid: u32,
    dir: TempDir,
    log_path: PathBuf,
    stderr_path: PathBuf,
}

impl<'ns> UpstreamOpenvpn<'ns> {
    /// Starts `openvpn` in `ns` with `config` as its config file and log level `verb`.
    pub fn start(ns: &'ns Netns, config: &str, verb: u8) -> Result<Self, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-openvpn-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        let config_path = dir.path().join("openvpn.conf");
        std::fs::write(&config_path, config)
            .map_err(|source| LabError::io(&config_path, source))?;
        let log_path = dir.path().join("openvpn.log");
        let stderr_path = dir.path().join("stderr.txt");
        let stderr =
            File::create(&stderr_path).map_err(|source| LabError::io(&stderr_path, source))?;
        let mut cmd = ns.command(&referee());
        cmd.arg("--config")
            .arg(&config_path)
            .arg("--verb")
            .arg(verb.to_string())
            .arg("--log")
            .arg(&log_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let pid = ns.spawn(&mut cmd)?;
        Ok(Self {
            ns,
            pid,
            dir,
            log_path,
            stderr_path,
        })
    }

    /// The process id of `openvpn`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The working directory (config, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the process has logged so far (log file, then stderr if not empty).
    pub fn log(&self) -> String {
        let mut text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        if !stderr.trim().is_empty() {
            text.push_str("\n--- stderr ---\n");
            text.push_str(&stderr);
        }
        text
    }

    /// Waits until the log contains `needle`. Fails early if the process exits.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Result<(), LabError> {
        let start = Instant::now();
        loop {
            if self.log().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.ns.try_wait(self.pid) {
                return Err(LabError::Exited {
                    what: format!("openvpn (waiting for {needle:?})"),
                    status,
                    log: self.log(),
                });
            }
            if start.elapsed() >= timeout {
                return Err(LabError::Timeout {
                    what: format!("{needle:?} in the openvpn log"),
                    waited: timeout,
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until a TCP server logs that it listens.
    pub fn wait_listening(&self, timeout: Duration) -> Result<(), LabError> {
        self.wait_for_log(LISTENING_MARKER, timeout)
    }
}

impl Drop for UpstreamOpenvpn<'_> {
    fn drop(&mut self) {
        self.ns.stop(self.pid);
    }
}

/// A `proto tcp-server` config for `local 127.0.0.1`, `port`, `dev tun` with the default
/// `server 192.168.123.0 255.255.255.0` pool, the fixture's certificates and `ta.key` under
/// `wrap`, followed by `extra` lines (e.g. `auth SHA256`).
pub fn tcp_server_config(pki: &TestPki, port: u16, wrap: ControlWrap, extra: &[&str]) -> String {
    let wrap_line = match wrap {
        ControlWrap::TlsAuth => format!("tls-auth {} 0", pki.ta_key().display()),
        ControlWrap::TlsCrypt => format!("tls-crypt {}", pki.ta_key().display()),
    };
    let mut lines = vec![
        "proto tcp-server".to_owned(),
        "local 127.0.0.1".to_owned(),
        format!("port {port}"),
        "dev tun".to_owned(),
        "topology subnet".to_owned(),
        "server 192.168.123.0 255.255.255.0".to_owned(),
        "keepalive 10 60".to_owned(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.server_cert().display()),
        format!("key {}", pki.server_key().display()),
        "dh none".to_owned(),
        wrap_line,
    ];
    lines.extend(extra.iter().map(|s| (*s).to_owned()));
    lines.join("\n") + "\n"
}

/// A `client` / `proto tcp-client` config for `remote 127.0.0.1 port`, `dev tun`,
/// `remote-cert-tls server`, the fixture's client certificate and `ta.key` under `wrap`,
/// followed by `extra` lines.
pub fn tcp_client_config(pki: &TestPki, port: u16, wrap: ControlWrap, extra: &[&str]) -> String {
    let wrap_line = match wrap {
        ControlWrap::TlsAuth => format!("tls-auth {} 1", pki.ta_key().display()),
        ControlWrap::TlsCrypt => format!("tls-crypt {}", pki.ta_key().display()),
    };
    let mut lines = vec![
        "client".to_owned(),
        "proto tcp-client".to_owned(),
        format!("remote 127.0.0.1 {port}"),
        "dev tun".to_owned(),
        "nobind".to_owned(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.client_cert().display()),
        format!("key {}", pki.client_key().display()),
        "remote-cert-tls server".to_owned(),
        wrap_line,
    ];
    lines.extend(extra.iter().map(|s| (*s).to_owned()));
    lines.join("\n") + "\n"
}
