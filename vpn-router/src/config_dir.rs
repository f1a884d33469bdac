//! `vpn-router --config-dir DIR`: the configuration as a directory a controller writes into a
//! ConfigMap or Secret, one file for the seed and one per shoot, read again whenever it
//! changes.
//!
//! * `DIR/seed.toml` ([`SEED_FILE`]): the seed's settings, in the format of `--config FILE`
//!   without `[[route]]` tables: listeners, timeouts, limits, trusted proxies,
//!   `always_allowed`, `metrics_listen`, `[watch] poll_ms`.
//! * `DIR/<shoot>.toml`: one shoot's `[[route]]` tables (and their rules), nothing else. The
//!   file's stem is the shoot: every route in it must name that namespace
//!   (`...vpn-seed-server.<shoot>.svc.cluster.local`, `<shoot>--kube-apiserver-socket`). So a
//!   routing value can belong to one file only, and a shoot's file cannot claim, shadow or
//!   hijack another shoot's routes (`shoot--p--a.toml` cannot route `shoot--p--ab`): such a
//!   route refuses its whole file.
//! * `[[sni_route]]` server names name no namespace the parser could check, so who routes a
//!   name several files claim is decided over the whole directory by a rule of the files'
//!   content alone ([`owners`]: the seed's names, then the shoot a name names, then a sole
//!   claimant; a contested name is nobody's): the same files give the same routes whatever
//!   the order they arrived in, their names and the router's start time. A claim the rule does
//!   not grant is refused alone (logged with file and line, counted), the claimant's other
//!   routes apply, and the owner's file is never touched.
//! * Other names are ignored: names starting with a dot (Kubernetes' `..data` and
//!   `..<timestamp>` entries, editors' temporary files) and names not ending in `.toml`.
//!
//! **Kubernetes volumes.** A ConfigMap or Secret volume holds the files in a directory
//! `..<timestamp>/`, a link `..data` to it, and a link `<name> -> ..data/<name>` per file; a new
//! version is a new directory and one atomic rename of `..data`. When `DIR/..data` exists,
//! the files are read from the directory it names (resolved once per read, and read again if
//! `..data` moved meanwhile: `netio::volume`), so one read sees one version, never a mix, and
//! neither links not yet made nor links left dangling. Without `..data`, the files of `DIR`
//! are read, through their links.
//!
//! **Reload.** The directory is read every `[watch] poll_ms` (default 1 s) and on SIGHUP (a
//! Kubernetes volume only when `..data` names another version than the one read last, or on
//! SIGHUP); a read that finds any file's bytes changed builds a new policy off to the side
//! and swaps it in one step (requests being decided keep the snapshot they started with). Only the
//! changed files are parsed again. Open tunnels are never touched by a reload: a shoot whose
//! file changed or was deleted keeps its tunnels; the change applies to new connections.
//!
//! * A shoot file that is refused (not TOML, an unknown key, a bad CIDR, a route of another
//!   shoot, ...) is logged with its file name and line and counted
//!   (`vpn_router_config_errors_total{file}`, `vpn_router_config_file_ok{file} 0`); that
//!   shoot keeps its last good routes (none if it never had a good version), and every other
//!   file's changes apply.
//! * A file of more than [`MAX_FILE_BYTES`] (1 MiB) is not read: it is refused as above, with
//!   its size. Refusals quote a value or a line of a file by at most its first 80 characters
//!   (`netio::report::QUOTE_CHARS`).
//! * A refused or deleted `seed.toml` keeps the last good seed settings as a whole.
//! * A deleted shoot file removes its routes (for new connections).
//! * Listener, timeout and limit changes in `seed.toml` are logged and apply after a
//!   restart, as with `--config FILE`; `always_allowed`, `always_allowed_peers` and `[watch]`
//!   apply at once.
//!
//! At start, `seed.toml` must be present and good (else the router does not start); a shoot
//! file refused at start is reported and its shoot has no routes until a good version comes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use netio::admin::{Exposition, Kind};
use netio::report::{chain, quote};
use netio::volume::{self, Listing, Snapshot};
use tracing::{info, warn};

use crate::client_hello::ServerName;
use crate::config::ShootRoutes;
use crate::config::{
    line_of_value, line_of_value_caseless, parse_routes, ConfigError, RouterConfig,
};
use crate::policy::Target;
use owners::Owner;

/// The seed's file.
pub const SEED_FILE: &str = "seed.toml";
/// Configuration files end in this.
pub const EXTENSION: &str = "toml";
/// Kubernetes' link to the version of an atomically written volume in force.
pub const DATA_LINK: &str = netio::volume::DATA_LINK;

/// Configuration files by name, with their bytes.
pub type Files = BTreeMap<String, Vec<u8>>;

/// The most bytes a configuration file may have ([`crate::config::MAX_FILE_BYTES`]); a larger
/// one is not read but refused, with its size.
pub const MAX_FILE_BYTES: u64 = crate::config::MAX_FILE_BYTES;

/// The configuration files of `dir` and their bytes, by name (see the module docs for which
/// names count and how a Kubernetes volume is read).
/// Files over [`MAX_FILE_BYTES`] are left out (see [`DirLoader`] for how they count).
pub fn scan(dir: &Path) -> io::Result<Files> {
    scan_version(dir).map(|snapshot| snapshot.files)
}

/// [`scan`], the sizes of the files over [`MAX_FILE_BYTES`] (not read), and the target of
/// `..data` the files were read through (`None`: no `..data`): the names of the version in
/// force (`netio::volume`, [`Listing::Version`]).
fn scan_version(dir: &Path) -> io::Result<Snapshot> {
    volume::read_bounded(dir, EXTENSION, Listing::Version, MAX_FILE_BYTES)
}

/// The directory's state: what was read last, the last good seed settings, each shoot
/// file's last good routes.
#[derive(Debug)]
pub struct DirLoader {
    dir: PathBuf,
    /// Every configuration file's bytes as last read.
    seen: Files,
    /// The target of `..data` they were read through, if any.
    version: Option<PathBuf>,
    /// The last good seed settings (their policy has no routes).
    seed: RouterConfig,
    /// The files over [`MAX_FILE_BYTES`] as last read, with their sizes.
    too_large: BTreeMap<String, u64>,
    /// Each shoot file present: its last good routes (`None`: never good).
    shoots: BTreeMap<String, Option<ShootRoutes>>,
    /// The shoot files whose current version is refused.
    broken: BTreeSet<String>,
    /// Each shoot file's server names the ownership rule does not grant it, as last
    /// reported.
    claims_refused: BTreeMap<String, BTreeSet<ServerName>>,
}

/// A new configuration read from the directory.
#[derive(Debug)]
pub struct Change {
    /// The seed settings in force with every shoot's routes in force.
    pub config: RouterConfig,
    /// `seed.toml` changed and was taken.
    pub seed_changed: bool,
}

impl DirLoader {
    /// Reads `dir` the first time: `seed.toml` must be good; shoot files that are refused
    /// are reported in the log and `files`. Returns the loader and the configuration.
    pub fn open(dir: &Path, files: &ConfigFiles) -> Result<(DirLoader, RouterConfig), DirError> {
        let snapshot = scan_version(dir).map_err(|source| DirError::Scan {
            dir: dir.to_owned(),
            source,
        })?;
        DirLoader::open_snapshot(dir, snapshot, files)
    }

    /// [`DirLoader::open`] on the files already read from `dir`: no I/O.
    pub(crate) fn open_snapshot(
        dir: &Path,
        snapshot: Snapshot,
        files: &ConfigFiles,
    ) -> Result<(DirLoader, RouterConfig), DirError> {
        let Snapshot {
            files: found,
            too_large,
            version,
        } = snapshot;
        if let Some(&size) = too_large.get(SEED_FILE) {
            return Err(DirError::TooLarge {
                file: dir.join(SEED_FILE),
                size,
            });
        }
        let Some(text) = found.get(SEED_FILE) else {
            return Err(DirError::NoSeed {
                dir: dir.to_owned(),
            });
        };
        let seed = parse_seed(&dir.join(SEED_FILE), text)?;
        files.set(SEED_FILE, true, false);
        let mut loader = DirLoader {
            dir: dir.to_owned(),
            seen: BTreeMap::from([(SEED_FILE.to_owned(), text.clone())]),
            version,
            seed,
            too_large: BTreeMap::new(),
            shoots: BTreeMap::new(),
            broken: BTreeSet::new(),
            claims_refused: BTreeMap::new(),
        };
        let change = loader.apply(found, too_large, files);
        Ok((loader, change.config))
    }

    /// The last good seed settings.
    pub fn seed(&self) -> &RouterConfig {
        &self.seed
    }

    /// Reads the directory again: `None` if no file's bytes changed, else the new
    /// configuration (refused files reported in the log and `files`, their last good
    /// version kept).
    ///
    /// Unless `force`d (SIGHUP), a Kubernetes volume whose `..data` still names the version
    /// read last is not read again: the kubelet never changes a version in place, it writes
    /// a new one and renames `..data`. So the regular poll of a large volume costs one
    /// `readlink(2)`.
    pub fn poll(&mut self, files: &ConfigFiles, force: bool) -> Result<Option<Change>, DirError> {
        if !force && self.version.is_some() && volume::version(&self.dir) == self.version {
            return Ok(None);
        }
        let snapshot = scan_version(&self.dir).map_err(|source| DirError::Scan {
            dir: self.dir.clone(),
            source,
        })?;
        Ok(self.poll_snapshot(snapshot, files))
    }

    /// [`DirLoader::poll`] on the files already read: no I/O.
    pub(crate) fn poll_snapshot(
        &mut self,
        snapshot: Snapshot,
        files: &ConfigFiles,
    ) -> Option<Change> {
        let Snapshot {
            files: found,
            too_large,
            version,
        } = snapshot;
        self.version = version;
        if found == self.seen && too_large == self.too_large {
            return None;
        }
        Some(self.apply(found, too_large, files))
    }

    /// Takes the files of `found` that changed since the last read; those of `too_large`
    /// are refused as a changed file that does not parse is.
    fn apply(
        &mut self,
        found: Files,
        too_large: BTreeMap<String, u64>,
        files: &ConfigFiles,
    ) -> Change {
        let mut seed_changed = false;
        self.refuse_too_large(&too_large, files);
        match found.get(SEED_FILE) {
            None if self.seen.contains_key(SEED_FILE) && !too_large.contains_key(SEED_FILE) => {
                warn!(
                    file = SEED_FILE,
                    "config file removed, keeping the last good seed settings"
                );
                files.set(SEED_FILE, false, true);
            }
            Some(text) if self.seen.get(SEED_FILE) != Some(text) => {
                match parse_seed(&self.dir.join(SEED_FILE), text) {
                    Ok(seed) => {
                        self.seed = seed;
                        seed_changed = true;
                        files.set(SEED_FILE, true, false);
                    }
                    Err(e) => {
                        refused(SEED_FILE, &e, "keeping the last good seed settings");
                        files.set(SEED_FILE, false, true);
                    }
                }
            }
            _ => {}
        }
        for (name, text) in &found {
            if name == SEED_FILE || self.seen.get(name) == Some(text) {
                continue;
            }
            let parsed = parse_shoot(&self.dir.join(name), owners::shoot_of(name), text);
            let last = self.shoots.entry(name.clone()).or_insert(None);
            match parsed {
                Ok(routes) => {
                    *last = Some(routes);
                    self.broken.remove(name);
                    self.claims_refused.remove(name);
                    files.set(name, true, false);
                }
                Err(e) => {
                    self.broken.insert(name.clone());
                    let keeping = if last.is_some() {
                        "keeping its last good routes"
                    } else {
                        "the shoot has no routes"
                    };
                    refused(name, &e, keeping);
                    files.set(name, false, true);
                }
            }
        }
        self.shoots.retain(|name, _| {
            let keep = found.contains_key(name) || too_large.contains_key(name);
            if !keep {
                info!(file = %name, "config file removed: its routes are gone for new connections");
                files.remove(name);
            }
            keep
        });
        self.seen = found;
        self.too_large = too_large;
        self.claims_refused
            .retain(|name, _| self.shoots.contains_key(name));
        let mut config = self.seed.clone();
        for routes in self.shoots.values().flatten() {
            config
                .policy
                .routes
                .extend(routes.routes.iter().map(|(v, t)| (v.clone(), t.clone())));
        }
        let granted = self.sni_owners(files);
        config.policy.sni_routes.extend(granted);
        Change {
            config,
            seed_changed,
        }
    }

    /// Refuses each file of `too_large` not refused for the same size last time: its last good
    /// version stays in force.
    fn refuse_too_large(&mut self, too_large: &BTreeMap<String, u64>, files: &ConfigFiles) {
        for (name, &size) in too_large {
            if self.too_large.get(name) == Some(&size) {
                continue;
            }
            let e = DirError::TooLarge {
                file: self.dir.join(name),
                size,
            };
            if name == SEED_FILE {
                refused(name, &e, "keeping the last good seed settings");
            } else {
                let last = self.shoots.entry(name.clone()).or_insert(None);
                let keeping = if last.is_some() {
                    "keeping its last good routes"
                } else {
                    "the shoot has no routes"
                };
                refused(name, &e, keeping);
                self.broken.insert(name.clone());
                self.claims_refused.remove(name);
            }
            files.set(name, false, true);
        }
    }

    /// The SNI routes the shoot files hold by the ownership rule ([`owners`]); a claim the
    /// rule does not grant is refused alone, logged (once per file version and name) with its
    /// file and line and counted, and the file shows as not wholly in force.
    fn sni_owners(&mut self, files: &ConfigFiles) -> Vec<(ServerName, Target)> {
        let claims = self
            .shoots
            .iter()
            .filter_map(|(file, r)| {
                Some((
                    file.clone(),
                    r.as_ref()?.sni_routes.keys().cloned().collect(),
                ))
            })
            .collect();
        let seed = &self.seed.policy.sni_routes;
        let owners = owners::owners(&claims, |name| seed.contains_key(name));
        let mut granted = Vec::new();
        let mut refused_now: BTreeMap<String, BTreeSet<ServerName>> = BTreeMap::new();
        for (file, routes) in &self.shoots {
            for (name, target) in routes.iter().flat_map(|r| &r.sni_routes) {
                match &owners[name] {
                    Owner::File(owner) if owner == file => {
                        granted.push((name.clone(), target.clone()));
                    }
                    owner => {
                        let before = self.claims_refused.get(file);
                        if !before.is_some_and(|b| b.contains(name)) {
                            self.claim_refused(file, name, owner);
                            files.set(file, false, true);
                        }
                        refused_now
                            .entry(file.clone())
                            .or_default()
                            .insert(name.clone());
                    }
                }
            }
        }
        for file in self.claims_refused.keys() {
            if !refused_now.contains_key(file) && !self.broken.contains(file) {
                info!(file = %file, "config file's server names all granted now");
                files.set(file, true, false);
            }
        }
        self.claims_refused = refused_now;
        granted
    }

    /// Logs the refused claim of shoot file `file` on `name`, which `owner` holds.
    fn claim_refused(&self, file: &str, name: &ServerName, owner: &Owner) {
        let text = self
            .seen
            .get(file)
            .map(|t| String::from_utf8_lossy(t))
            .unwrap_or_default();
        let e = DirError::TakenName {
            file: self.dir.join(file),
            line: line_of_value_caseless(&text, name.as_str(), false),
            name: name.to_string(),
            holder: match owner {
                Owner::Seed => SEED_FILE.to_owned(),
                Owner::File(owner) => owner.clone(),
                Owner::Contested(all) => {
                    format!("nobody: it names none of its claimants {}", all.join(", "))
                }
            },
        };
        warn!(file = %file, line = e.line(), "server name claim refused, the file's other routes apply: {}", chain(&e));
    }
}

/// Logs a refused file.
fn refused(name: &str, e: &DirError, keeping: &str) {
    warn!(file = %name, line = e.line(), "config file refused, {keeping}: {}", chain(e));
}

/// Whether file `name` of `dir` holding `text` is refused for its own content, and the line
/// the refusal names (for the fuzz target's check).
#[cfg(feature = "fuzzing")]
pub(crate) fn refused_at(dir: &Path, name: &str, text: &[u8]) -> Option<Option<usize>> {
    let path = dir.join(name);
    let e = if name == SEED_FILE {
        parse_seed(&path, text).err()
    } else {
        parse_shoot(&path, owners::shoot_of(name), text).err()
    }?;
    Some(e.line())
}

/// Parses `seed.toml`: a router config without routes.
fn parse_seed(path: &Path, text: &[u8]) -> Result<RouterConfig, DirError> {
    let text = std::str::from_utf8(text).map_err(|_| DirError::NotUtf8 {
        file: path.to_owned(),
    })?;
    // The error names the file once, here (`DirError::File`).
    let config = RouterConfig::parse_text(text).map_err(|source| DirError::File {
        file: path.to_owned(),
        line: source.line_in(text),
        source,
    })?;
    if !config.policy.routes.is_empty() {
        return Err(DirError::SeedRoutes {
            file: path.to_owned(),
            line: text
                .lines()
                .position(|l| l.trim_start().starts_with("[[route"))
                .map(|i| i + 1),
        });
    }
    Ok(config)
}

/// Parses a shoot file: routes of namespace `shoot` only.
fn parse_shoot(path: &Path, shoot: &str, text: &[u8]) -> Result<ShootRoutes, DirError> {
    let text = std::str::from_utf8(text).map_err(|_| DirError::NotUtf8 {
        file: path.to_owned(),
    })?;
    let routes = parse_routes(text).map_err(|source| DirError::File {
        file: path.to_owned(),
        line: source.line_in(text),
        source,
    })?;
    if let Some(foreign) = routes.routes.keys().find(|v| v.namespace() != shoot) {
        let value = foreign.to_string();
        return Err(DirError::ForeignRoute {
            file: path.to_owned(),
            line: line_of_value(text, &value, false),
            value,
            shoot: shoot.to_owned(),
        });
    }
    let mut routes = routes;
    for target in routes.sni_routes.values_mut() {
        match &target.shoot {
            Some(named) if named != shoot => {
                return Err(DirError::ForeignShoot {
                    file: path.to_owned(),
                    line: line_of_value(text, named, false),
                    named: named.clone(),
                    shoot: shoot.to_owned(),
                })
            }
            Some(_) => {}
            None => target.shoot = Some(shoot.to_owned()),
        }
    }
    Ok(routes)
}

/// The state of each configuration file, and the reloads, for `/metrics`.
///
/// | series | type | labels | meaning |
/// | --- | --- | --- | --- |
/// | `vpn_router_config_reloads_total` | counter | | new versions of the configuration read (a poll or SIGHUP that found a file changed, added or removed; with `--config FILE`, each SIGHUP), counted once the new policy is in force |
/// | `vpn_router_config_file_ok` | gauge | `file` | 1 while the file's current version is in force, 0 while it is refused (its last good version, if any, is in force) |
/// | `vpn_router_config_errors_total` | counter | `file` | versions of the file refused; the series goes when the file is removed |
#[derive(Debug, Default)]
pub struct ConfigFiles {
    files: Mutex<BTreeMap<String, FileState>>,
    /// New versions read (counted once in force).
    reloads: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct FileState {
    ok: bool,
    errors: u64,
}

impl ConfigFiles {
    /// Records `name`'s current version as taken (`ok`) or refused (`error`: one more).
    pub fn set(&self, name: &str, ok: bool, error: bool) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let state = files.entry(name.to_owned()).or_default();
        state.ok = ok;
        state.errors += u64::from(error);
    }

    /// A new version of the configuration was read and is in force (or refused, with
    /// `--config FILE`).
    pub fn reloaded(&self) {
        self.reloads.fetch_add(1, Ordering::Relaxed);
    }

    /// New versions read so far.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// `name` is gone: its series go too.
    pub fn remove(&self, name: &str) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.remove(name);
    }

    /// Versions of `name` refused so far, and whether its current one is in force.
    pub fn state(&self, name: &str) -> Option<(bool, u64)> {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.get(name).map(|s| (s.ok, s.errors))
    }

    /// Writes the `vpn_router_config_*` series.
    pub fn metrics(&self, out: &mut Exposition) {
        out.single(
            "vpn_router_config_reloads_total",
            Kind::Counter,
            "New versions of the configuration read.",
            self.reloads.load(Ordering::Relaxed),
        );
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let name = "vpn_router_config_file_ok";
        out.family(
            name,
            Kind::Gauge,
            "1 while the file's current version is in force, 0 while it is refused.",
        );
        for (file, state) in files.iter() {
            out.sample(name, &[("file", file)], u8::from(state.ok));
        }
        let name = "vpn_router_config_errors_total";
        out.family(name, Kind::Counter, "Versions of the file refused.");
        for (file, state) in files.iter() {
            out.sample(name, &[("file", file)], state.errors);
        }
    }
}

/// Why a configuration file, or the directory, is refused.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The directory cannot be read.
    #[error("cannot read config directory {}", dir.display())]
    Scan {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No `seed.toml` at start.
    #[error("config directory {} has no {SEED_FILE}", dir.display())]
    NoSeed {
        /// The directory.
        dir: PathBuf,
    },
    /// A file has more than [`MAX_FILE_BYTES`]: not read.
    #[error("config file {}: {size} bytes, more than the {MAX_FILE_BYTES} a config file may have", file.display())]
    TooLarge {
        /// The file.
        file: PathBuf,
        /// Its size.
        size: u64,
    },
    /// A file is not UTF-8.
    #[error("config file {}: not UTF-8", file.display())]
    NotUtf8 {
        /// The file.
        file: PathBuf,
    },
    /// A file does not parse or check.
    #[error("config file {}{}: refused", file.display(), at(*line))]
    File {
        /// The file.
        file: PathBuf,
        /// The line at fault, when known.
        line: Option<usize>,
        /// Why.
        #[source]
        source: ConfigError,
    },
    /// `seed.toml` has routes.
    #[error("config file {}{}: {SEED_FILE} takes no [[route]]; each shoot's routes go in the shoot's own file", file.display(), at(*line))]
    SeedRoutes {
        /// The file.
        file: PathBuf,
        /// The first `[[route]]` line.
        line: Option<usize>,
    },
    /// A shoot file routes a value of another namespace.
    #[error("config file {}{}: route {} is not shoot {shoot}'s; a shoot's file routes only values of its own namespace", file.display(), at(*line), quote(value))]
    ForeignRoute {
        /// The file.
        file: PathBuf,
        /// The line quoting the value.
        line: Option<usize>,
        /// The value.
        value: String,
        /// The file's shoot (its stem).
        shoot: String,
    },
    /// A shoot file's `[[sni_route]]` names another shoot as the one it counts for.
    #[error("config file {}{}: sni_route shoot {named:?} is not {shoot}; a shoot's file counts its routes for its own shoot (leave `shoot` out)", file.display(), at(*line))]
    ForeignShoot {
        /// The file.
        file: PathBuf,
        /// The line quoting the value.
        line: Option<usize>,
        /// The shoot the route names.
        named: String,
        /// The file's shoot (its stem).
        shoot: String,
    },
    /// A shoot file routes a server name another file already routes.
    #[error("config file {}{}: server name {name:?} is {holder}'s by the ownership rule (`config_dir::owners`): the claim is refused, the file's other routes apply", file.display(), at(*line))]
    TakenName {
        /// The file.
        file: PathBuf,
        /// The line quoting the name.
        line: Option<usize>,
        /// The name.
        name: String,
        /// Who holds it: `seed.toml`, a shoot file, or nobody (a contested name).
        holder: String,
    },
}

impl DirError {
    /// The line at fault, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            DirError::File { line, .. }
            | DirError::SeedRoutes { line, .. }
            | DirError::ForeignRoute { line, .. }
            | DirError::ForeignShoot { line, .. }
            | DirError::TakenName { line, .. } => *line,
            _ => None,
        }
    }
}

fn at(line: Option<usize>) -> String {
    line.map(|l| format!(", line {l}")).unwrap_or_default()
}

pub(crate) mod owners;

#[cfg(test)]
mod tests;
