//! One side of a matrix case: our implementation (`matrix-peer server|client`) or upstream
//! `openvpn`, started from a config file in a lab namespace with its output in a log file.
//!
//! Both implementations read the same config text (see [`super::config`]); only the program
//! differs. The log is opened for appending, so a peer that is stopped and started again
//! (server restart) keeps one log.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::netns::Netns;
use crate::LabError;

/// Which implementation runs a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Impl {
    /// Ours (`vpn-server` / `vpn-client` as libraries, in `matrix-peer`).
    Ours,
    /// Upstream OpenVPN 2.6 (`openvpn`).
    Upstream,
}

impl Impl {
    /// `ours` or `upstream`.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Upstream => "upstream",
        }
    }
}

/// Server or client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The side that listens.
    Server,
    /// The side that dials.
    Client,
}

impl Side {
    /// `server` or `client`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }
}

/// A peer process (running or stopped) and its log.
#[derive(Debug)]
pub struct Peer<'ns> {
    ns: &'ns Netns,
    imp: Impl,
    side: Side,
    ours_bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    ekm: bool,
    pid: Option<u32>,
}

impl<'ns> Peer<'ns> {
    /// Writes `config` to `dir/<side>.conf` and starts the peer. `ours_bin` is the
    /// `matrix-peer` binary; `ekm` false turns the TLS exporter off in ours.
    pub fn start(
        ns: &'ns Netns,
        (imp, side): (Impl, Side),
        ours_bin: &Path,
        dir: &Path,
        config: &str,
        ekm: bool,
    ) -> Result<Self, LabError> {
        let path = dir.join(format!("{}.conf", side.name()));
        std::fs::write(&path, config).map_err(|source| LabError::io(&path, source))?;
        let mut peer = Self {
            ns,
            imp,
            side,
            ours_bin: ours_bin.to_owned(),
            config: path,
            log: dir.join(format!("{}.log", side.name())),
            ekm,
            pid: None,
        };
        peer.restart()?;
        Ok(peer)
    }

    /// Starts the process again (after [`Peer::stop`]); the log continues.
    pub fn restart(&mut self) -> Result<(), LabError> {
        self.stop();
        let open = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|source| LabError::io(&self.log, source))
        };
        let mut cmd = match self.imp {
            Impl::Ours => {
                let mut c = self.ns.command(&self.ours_bin.display().to_string());
                c.arg(self.side.name());
                if !self.ekm {
                    c.env("MATRIX_PEER_TLS_EKM", "0");
                }
                c
            }
            Impl::Upstream => {
                let mut c = self.ns.command(&crate::upstream::referee());
                c.args(["--verb", "4"]);
                c
            }
        };
        cmd.arg("--config")
            .arg(&self.config)
            .current_dir(self.config.parent().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?);
        self.pid = Some(self.ns.spawn(&mut cmd)?);
        Ok(())
    }

    /// Stops the process (SIGTERM, then SIGKILL); the log stays.
    pub fn stop(&mut self) {
        if let Some(pid) = self.pid.take() {
            self.ns.stop(pid);
        }
    }

    /// Whether the process has exited (or was never started).
    pub fn exited(&self) -> bool {
        self.pid.is_none_or(|pid| self.ns.try_wait(pid).is_some())
    }

    /// The implementation.
    pub fn imp(&self) -> Impl {
        self.imp
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log.
    pub fn tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until `pred` holds for the log; `Err` with what was awaited on timeout.
    pub fn wait_log(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let log = self.log();
            if pred(&log) {
                return Ok(log);
            }
            if start.elapsed() >= timeout {
                return Err(format!(
                    "{} {}: no {what} after {timeout:?}{}",
                    self.imp.name(),
                    self.side.name(),
                    if self.exited() {
                        " (process exited)"
                    } else {
                        ""
                    }
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Peer<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}
