//! `vpn-server readiness` and `vpn-server liveness`: the exec probes Gardener runs in the
//! `vpn-seed-server` container (gardener-pods reference 2.1 and 3.4), deciding as vpn2's do
//! from the status file the server writes every 15 s.
//!
//! # Inputs
//!
//! - The vpn2 environment ([`Vpn2ServerEnv`]): `OPENVPN_STATUS_PATH` is required; `IS_HA`
//!   selects HA, which also needs `POD_NAME` (ending in `-0` to `-2`) and `HA_VPN_CLIENTS`;
//!   any other variable vpn2 reads must be valid too, as the server's start checks it.
//! - The status file at `OPENVPN_STATUS_PATH`, read as [`crate::status::read`] describes.
//!
//! # Rules
//!
//! | verb | exit 0 when |
//! |---|---|
//! | `liveness` | the file parses and its `TIME` is at most [`STALE_AFTER`] (17 s) before now (a `TIME` in the future counts as fresh) |
//! | `readiness`, not HA | the file parses and has no `CLIENT_LIST` row, or one whose CN starts with `vpn-shoot-client` (clients still in the handshake, CN `UNDEF`, alone are not enough) |
//! | `readiness`, HA | the file parses and has at least 2 `CLIENT_LIST` rows, at least one CN starting with `vpn-seed-client` and one starting with `vpn-shoot-client` |
//!
//! Otherwise the verb prints why, as one line on stdout, and exits 1 (vpn2 prints its errors
//! with `fmt.Println`, so stdout: the kubelet shows it as the probe's output). A file without
//! a `TIME` line is stale (vpn2 compares against the zero time). Nothing else is written and
//! no runtime is started: one environment parse and one file read.
//!
//! Differences from vpn2, on purpose: an invalid environment is reported with the variable
//! at fault (vpn2 prints only "could not parse environment"); not-ready and stale states are
//! printed on stdout (vpn2 logs them); the file is opened by its path (vpn2 refuses a symbolic
//! link leading out of its directory); with `IS_HA` the `POD_NAME` suffix is checked here as
//! the server's start checks it (vpn2's probes do not, but such a pod never starts).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::config::env::{EnvError, Vpn2ServerEnv};

use crate::status::read::{self, ParseError, Status, Timestamp, MAX_STATUS_BYTES};
use crate::status::read::{SEED_CLIENT_PREFIX, SHOOT_CLIENT_PREFIX};
use netio::volume::read_file_bounded;

/// How often OpenVPN (and our server) rewrites the status file (`status <path> 15`).
pub const STATUS_UPDATE_INTERVAL: Duration = Duration::from_secs(15);

/// How old the file's `TIME` may be for `liveness`: one update interval and 2 s.
pub const STALE_AFTER: Duration = Duration::from_secs(STATUS_UPDATE_INTERVAL.as_secs() + 2);

/// Clients HA readiness needs at least.
pub const HA_MIN_CLIENTS: usize = 2;

/// Why a probe fails.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A vpn2 variable is missing or invalid.
    #[error("invalid vpn2 environment")]
    Env(#[source] EnvError),
    /// The status file cannot be read.
    #[error("cannot read the OpenVPN status file {path}")]
    Read {
        /// `OPENVPN_STATUS_PATH`.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The status file is malformed.
    #[error("cannot parse the OpenVPN status file {path}")]
    Parse {
        /// `OPENVPN_STATUS_PATH`.
        path: PathBuf,
        /// The line at fault.
        #[source]
        source: ParseError,
    },
    /// `readiness`: the clients the rules ask for are not connected.
    #[error(transparent)]
    NotReady(#[from] NotReady),
    /// `liveness`: the file is not being rewritten.
    #[error(transparent)]
    Stale(#[from] Stale),
}

/// The clients the readiness rules ask for are not connected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// Not HA: clients are connected, none of them a shoot client.
    #[error("not ready: {clients} client(s) connected, none with a CN starting with {SHOOT_CLIENT_PREFIX}")]
    NoShootClient {
        /// `CLIENT_LIST` rows.
        clients: usize,
    },
    /// HA: fewer than [`HA_MIN_CLIENTS`] clients.
    #[error("not ready (HA): {clients} client(s) connected, at least {HA_MIN_CLIENTS} needed")]
    TooFewClients {
        /// `CLIENT_LIST` rows.
        clients: usize,
    },
    /// HA: a seed or a shoot client is missing.
    #[error(
        "not ready (HA): {clients} client(s) connected, {}",
        missing(*.seed_client, *.shoot_client)
    )]
    MissingSide {
        /// `CLIENT_LIST` rows.
        clients: usize,
        /// Whether a `vpn-seed-client*` is connected.
        seed_client: bool,
        /// Whether a `vpn-shoot-client*` is connected.
        shoot_client: bool,
    },
}

/// Which of the two CN prefixes no client has.
fn missing(seed: bool, shoot: bool) -> String {
    let none = |prefix| format!("none with a CN starting with {prefix}");
    match (seed, shoot) {
        (false, false) => format!(
            "{} and {}",
            none(SEED_CLIENT_PREFIX),
            none(SHOOT_CLIENT_PREFIX)
        ),
        (false, true) => none(SEED_CLIENT_PREFIX),
        _ => none(SHOOT_CLIENT_PREFIX),
    }
}

/// The status file is not being rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// `TIME` is older than [`STALE_AFTER`].
    #[error(
        "OpenVPN status is stale: TIME {updated_at} is {:.1} s old, at most {} s allowed",
        *.age_ms as f64 / 1000.0,
        STALE_AFTER.as_secs()
    )]
    TooOld {
        /// The file's `TIME`.
        updated_at: Timestamp,
        /// How old it is, in milliseconds.
        age_ms: i128,
    },
    /// The file has no `TIME` line.
    #[error("OpenVPN status is stale: the file has no TIME line")]
    NoTime,
}

/// `vpn-server readiness` on the environment `vars`.
pub fn readiness<I, K, V>(vars: I) -> Result<(), ProbeError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let (env, status) = env_and_status(vars)?;
    Ok(check_ready(&status, env.is_ha)?)
}

/// `vpn-server liveness` on the environment `vars` at wall-clock time `now`.
pub fn liveness<I, K, V>(vars: I, now: SystemTime) -> Result<(), ProbeError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let (_, status) = env_and_status(vars)?;
    Ok(check_alive(&status, now)?)
}

/// What both probes read first: vpn2's environment (its HA checks included) and the status
/// file it names.
fn env_and_status<I, K, V>(vars: I) -> Result<(Vpn2ServerEnv, Status), ProbeError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let env = Vpn2ServerEnv::parse(vars).map_err(ProbeError::Env)?;
    let status = read_status(&env.status_path)?;
    Ok((env, status))
}

/// Reads and parses the status file at `path`.
pub fn read_status(path: &Path) -> Result<Status, ProbeError> {
    let bytes = read_file_bounded(path, MAX_STATUS_BYTES).map_err(|source| ProbeError::Read {
        path: path.to_owned(),
        source,
    })?;
    read::parse(&bytes).map_err(|source| ProbeError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The readiness rule for a parsed file (the table in the module docs).
pub fn check_ready(status: &Status, ha: bool) -> Result<(), NotReady> {
    let clients = status.clients.len();
    let any = |prefix: &str| {
        status
            .clients
            .iter()
            .any(|c| c.common_name.starts_with(prefix))
    };
    if !ha {
        if clients == 0 || any(SHOOT_CLIENT_PREFIX) {
            return Ok(());
        }
        return Err(NotReady::NoShootClient { clients });
    }
    if clients < HA_MIN_CLIENTS {
        return Err(NotReady::TooFewClients { clients });
    }
    let (seed_client, shoot_client) = (any(SEED_CLIENT_PREFIX), any(SHOOT_CLIENT_PREFIX));
    if seed_client && shoot_client {
        return Ok(());
    }
    Err(NotReady::MissingSide {
        clients,
        seed_client,
        shoot_client,
    })
}

/// The liveness rule for a parsed file at wall-clock time `now`.
pub fn check_alive(status: &Status, now: SystemTime) -> Result<(), Stale> {
    let Some(updated_at) = status.updated_at else {
        return Err(Stale::NoTime);
    };
    let now_nanos = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    };
    let age = now_nanos - updated_at.unix_nanos();
    if age <= STALE_AFTER.as_nanos() as i128 {
        return Ok(());
    }
    Err(Stale::TooOld {
        updated_at,
        age_ms: age / 1_000_000,
    })
}

#[cfg(test)]
mod tests;
