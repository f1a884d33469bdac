//! The lab's error type.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a lab step failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The test process does not run as root (namespaces and tun devices need it).
    #[error("not running as root (effective uid is not 0)")]
    NotRoot,
    /// `/dev/net/tun` does not exist.
    #[error("/dev/net/tun is missing")]
    MissingTun,
    /// A required program could not be started.
    #[error("required program `{tool}` cannot be run")]
    MissingTool {
        /// Program name as looked up on `PATH`, or the path `OPENVPN_REFEREE` names.
        tool: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// A program could not be spawned.
    #[error("cannot spawn `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A program ran but exited unsuccessfully.
    #[error("`{command}` failed with {status}: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// Entering a namespace with setns(2) failed.
    #[error("cannot enter network namespace {name}")]
    EnterNamespace {
        /// Namespace name.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file in the lab could not be read or written.
    #[error("I/O error on {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A socket operation of the lab's own client failed.
    #[error("{what} failed")]
    Socket {
        /// The operation.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Our protocol code refused or could not produce a packet in an exchange with a peer.
    #[error("{what}")]
    Protocol {
        /// What was being done, with the bytes involved.
        what: String,
        /// The protocol crate's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Our crates refused the lab's own material (a certificate, a key).
    #[error("{what} refused")]
    Material {
        /// Which material.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// One of our programs, run as a library by a test (`conformance` runs our server and
    /// client this way), failed.
    #[error("our {what} failed")]
    Ours {
        /// Which program (`vpn-server`, `vpn-client`).
        what: &'static str,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Our vpn-client, run as a library, ended on its own before what the lab waited for.
    #[error("our vpn-client ended before {what}")]
    OurClientEnded {
        /// What was awaited.
        what: String,
    },
    /// Something the lab waited for did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}; log so far:\n{log}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The log of the process waited on.
        log: String,
    },
    /// A process the lab waited on exited early.
    #[error("{what} exited early with {status}; log:\n{log}")]
    Exited {
        /// Which process.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its log.
        log: String,
    },
}

impl LabError {
    /// The [`LabError::Io`] for `source` on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
