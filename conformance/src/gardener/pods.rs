//! Our binaries started as Gardener's non-HA containers start the vpn2 images, as plain
//! processes in the landscape's namespaces: the environment exactly as gardener-pods.md
//! §2.1 (vpn-seed-server) and §2.4 (vpn-shoot) list it, the secrets laid out as they are
//! mounted ([`Mounts`], under a temporary directory passed with `VPN_SERVER_SECRETS_DIR` /
//! `VPN2_SECRETS_DIR` because the paths are not `/srv/secrets`), the init containers run
//! first.
//!
//! What differs from a pod, and why:
//!
//! * `ENDPOINT` is the ingress load balancer's address, not Gardener's DNS name with a
//!   trailing dot: the lab has no DNS.
//! * The CONNECT sidecar replaces Envoy's container: `vpn-server sidecar` under Envoy's
//!   identity (uid 65532, gid 31415, no capabilities), so the seed pod's group-31415 rules
//!   apply to it as they applied to Envoy ([`SidecarMode::Standalone`]); or in the server's
//!   process (`--sidecar`, [`SidecarMode::InProcess`]). Envoy's container has no environment;
//!   ours gets the shoot networks of the vpn-seed-server container (`SHOOT_*_NETWORKS`),
//!   which it needs to know what it may dial, but not `SEED_POD_NETWORK`: with it the sidecar
//!   refuses every shoot address inside the seed's pod network, i.e. the whole overlap.
//! * The server's admin endpoint (`--admin-listen`, not in vpn2) listens on
//!   [`SERVER_ADMIN_PORT`] so the checks can prove the shoot cannot reach it.
//!
//! The binaries come from the build directory this test runs from ([`Binaries::locate`]);
//! they must be built and current (`cargo build -p vpn-server -p vpn-client -p vpn-router`).

use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use lab::sidecar_client::Pki;
use tempfile::TempDir;

use super::landscape::{
    INGRESS_LB, SEED_POD, SEED_POD_NETWORK, SHOOT_NODE_NETWORKS, SHOOT_POD_NETWORKS,
    SHOOT_SERVICE_NETWORKS,
};
use crate::netns::Netns;
use crate::LabError;

/// The shoot's namespace in the seed (`shoot--<project>--<name>`).
pub const SHOOT_NAMESPACE: &str = "shoot--lab--checks";
/// `IP_FAMILIES` of the landscape's dual-stack shoot.
pub const IP_FAMILIES: &str = "IPv4,IPv6";
/// The ingress's unified HTTP-proxy port (`OPENVPN_PORT`).
pub const OPENVPN_PORT: u16 = 8443;
/// The routing header's name (`REVERSED_VPN_HEADER_KEY`).
pub const HEADER_KEY: &str = "X-Gardener-Destination";
/// The port of our server's admin endpoint in the seed pod.
pub const SERVER_ADMIN_PORT: u16 = 15010;
/// Envoy's user (distroless `nonroot`) and the group vpn2's NAT rules single out.
pub const SIDECAR_IDS: (u32, u32) = (65532, 31415);
/// How long a program may take to come up.
const START: Duration = Duration::from_secs(30);

/// The routing header's value (`REVERSED_VPN_HEADER`).
pub fn header_value() -> String {
    format!("outbound|1194||vpn-seed-server.{SHOOT_NAMESPACE}.svc.cluster.local")
}

/// Where our binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `vpn-server`.
    pub server: PathBuf,
    /// `vpn-client`.
    pub client: PathBuf,
    /// `vpn-router`.
    pub router: PathBuf,
}

impl Binaries {
    /// The binaries beside this test's build (`target/<profile>/`, the parent of the test
    /// executable's `deps/`), or in `$VPN2RS_BIN_DIR`. Each must exist and be newer than
    /// every source file of the crates it is built from.
    pub fn locate() -> Result<Binaries, LabError> {
        let dir = match std::env::var_os("VPN2RS_BIN_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let exe = std::env::current_exe()
                    .map_err(|source| LabError::io("current executable", source))?;
                exe.parent()
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
                    .ok_or_else(|| LabError::io(&exe, std::io::ErrorKind::NotFound.into()))?
            }
        };
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let common = ["protocol", "pki", "netio"];
        let check = |name: &str, crates: &[&str]| -> Result<PathBuf, LabError> {
            let bin = dir.join(name);
            let built = std::fs::metadata(&bin)
                .and_then(|m| m.modified())
                .map_err(|source| LabError::MissingTool {
                    tool: format!(
                        "{} (build it: cargo build -p vpn-server -p vpn-client -p vpn-router)",
                        bin.display()
                    ),
                    source,
                })?;
            let sources = crates.iter().copied().chain(common);
            if let Some((newer, _)) = sources
                .filter_map(|c| newest(&workspace.join(c)))
                .filter(|(_, t)| *t > built)
                .max_by_key(|(_, t)| *t)
            {
                return Err(LabError::MissingTool {
                    tool: format!(
                        "{} is older than {} (rebuild: cargo build -p vpn-server -p vpn-client -p vpn-router)",
                        bin.display(),
                        newer.display()
                    ),
                    source: std::io::ErrorKind::Other.into(),
                });
            }
            Ok(bin)
        };
        Ok(Binaries {
            server: check("vpn-server", &["vpn-server", "sidecar"])?,
            client: check("vpn-client", &["vpn-client", "sidecar"])?,
            router: check("vpn-router", &["vpn-router"])?,
        })
    }
}

/// The newest `.rs` or `Cargo.toml` under `dir` and its time.
fn newest(dir: &Path) -> Option<(PathBuf, SystemTime)> {
    let mut best: Option<(PathBuf, SystemTime)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.ends_with(".rs") || name == "Cargo.toml") {
                continue;
            }
            if let Ok(t) = meta.modified() {
                if best.as_ref().is_none_or(|(_, b)| t > *b) {
                    best = Some((path, t));
                }
            }
        }
    }
    best
}

/// The secrets of both pods laid out as Gardener mounts them, and the seed pod's status
/// directory, under one temporary directory (deleted on drop):
///
/// ```text
///  seed/vpn-server/{ca.crt,tls.crt,tls.key}  0644  (volume `certs`: bundle, vpn-seed-server)
///  seed/tlsauth/vpn.tlsauth                  0400  (vpn-seed-server-tlsauth)
///  seed/status/                                    (emptyDir `openvpn-status`)
///  shoot/vpn-client/{ca.crt,tls.crt,tls.key} 0400  (vpn-shoot-ca, vpn-shoot-client)
///  shoot/tlsauth/vpn.tlsauth                 0400  (vpn-shoot-tlsauth)
/// ```
#[derive(Debug)]
pub struct Mounts {
    dir: TempDir,
    /// The certificates: `server` is `vpn-seed-server`, `vpn_client` is `vpn-shoot-client`,
    /// `client` is the kube-apiserver's `kube-apiserver-http-proxy-client`.
    pub pki: Pki,
}

impl Mounts {
    /// Issues the certificates and a tls-auth key and writes them.
    pub fn generate() -> Result<Mounts, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-gardener-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        let pki = Pki::generate();
        let tls_auth =
            protocol::static_key::write(&protocol::static_key::generate(&mut rand_core::OsRng));
        let pem = |what: &str, r: Result<Vec<u8>, pki::PemError>| {
            r.map_err(|e| LabError::Material {
                what: what.into(),
                source: Box::new(e),
            })
        };
        let bundle = pem("ca-vpn bundle", pki.bundle.to_pem())?;
        let files: [(&str, Vec<u8>, u32); 8] = [
            ("seed/vpn-server/ca.crt", bundle.clone(), 0o644),
            (
                "seed/vpn-server/tls.crt",
                pem("vpn-seed-server", pki.server.chain_pem())?,
                0o644,
            ),
            (
                "seed/vpn-server/tls.key",
                pem("vpn-seed-server key", pki.server.key_pem())?,
                0o644,
            ),
            (
                "seed/tlsauth/vpn.tlsauth",
                tls_auth.clone().into_bytes(),
                0o400,
            ),
            ("shoot/vpn-client/ca.crt", bundle, 0o400),
            (
                "shoot/vpn-client/tls.crt",
                pem("vpn-shoot-client", pki.vpn_client.chain_pem())?,
                0o400,
            ),
            (
                "shoot/vpn-client/tls.key",
                pem("vpn-shoot-client key", pki.vpn_client.key_pem())?,
                0o400,
            ),
            ("shoot/tlsauth/vpn.tlsauth", tls_auth.into_bytes(), 0o400),
        ];
        for (rel, bytes, mode) in files {
            let path = dir.path().join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| LabError::io(parent, source))?;
            }
            std::fs::write(&path, bytes).map_err(|source| LabError::io(&path, source))?;
            chmod(&path, mode)?;
        }
        let status = dir.path().join("seed/status");
        std::fs::create_dir_all(&status).map_err(|source| LabError::io(&status, source))?;
        // Directories traversable by the sidecar's non-root user, as mounts are.
        for d in [
            "",
            "seed",
            "seed/vpn-server",
            "seed/tlsauth",
            "seed/status",
            "shoot",
        ] {
            chmod(&dir.path().join(d), 0o755)?;
        }
        Ok(Mounts { dir, pki })
    }

    /// The seed pod's `/srv/secrets`.
    pub fn seed_secrets(&self) -> PathBuf {
        self.dir.path().join("seed")
    }

    /// The seed pod's `OPENVPN_STATUS_PATH` (`/srv/status/openvpn.status`).
    pub fn status_path(&self) -> PathBuf {
        self.dir.path().join("seed/status/openvpn.status")
    }

    /// The vpn-shoot pod's `/srv/secrets`.
    pub fn shoot_secrets(&self) -> PathBuf {
        self.dir.path().join("shoot")
    }

    /// A directory for other files of the replay (configs, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn chmod(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|source| LabError::io(path, source))
}

/// The `vpn-seed-server` container's environment (gardener-pods.md §2.1), with the status
/// file at `status`.
pub fn seed_server_env(status: &Path) -> Vec<(String, String)> {
    [
        ("IP_FAMILIES", IP_FAMILIES.to_owned()),
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS.to_owned()),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS.to_owned()),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS.to_owned()),
        ("SEED_POD_NETWORK", SEED_POD_NETWORK.to_owned()),
        // status.hostIP: the seed node (the seed router stands in for it).
        ("LOCAL_NODE_IP", "100.96.0.1".to_owned()),
        ("OPENVPN_STATUS_PATH", status.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The `vpn-shoot-init` container's environment (gardener-pods.md §2.4).
pub fn vpn_shoot_init_env() -> Vec<(String, String)> {
    [
        ("IP_FAMILIES", IP_FAMILIES),
        ("IS_SHOOT_CLIENT", "true"),
        ("POD_NAME", "vpn-shoot-6d9c5b7f4-x2k8q"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The `vpn-shoot` container's environment (gardener-pods.md §2.4).
pub fn vpn_shoot_env() -> Vec<(String, String)> {
    [
        ("IP_FAMILIES", IP_FAMILIES.to_owned()),
        ("ENDPOINT", INGRESS_LB.to_string()),
        ("OPENVPN_PORT", OPENVPN_PORT.to_string()),
        ("REVERSED_VPN_HEADER", header_value()),
        ("REVERSED_VPN_HEADER_KEY", HEADER_KEY.to_owned()),
        ("IS_SHOOT_CLIENT", "true".to_owned()),
        ("SEED_POD_NETWORK", SEED_POD_NETWORK.to_owned()),
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS.to_owned()),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS.to_owned()),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The ingress router's config: Gardener's header on 8443, the one route to the seed pod's
/// 1194 (the Service's address stands in for its name).
pub fn router_config() -> String {
    format!(
        "[[listener]]\naddress = \"0.0.0.0:{OPENVPN_PORT}\"\nheaders = [\"{HEADER_KEY}\"]\n\n\
         [[route]]\nvalue = \"{}\"\nupstream = \"{SEED_POD}:1194\"\n",
        header_value()
    )
}

/// How a container is started: program, arguments, environment (nothing else is
/// inherited), and optionally the user and group it runs as.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its name (and its log file's).
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// `(uid, gid)` to run as (with `setpriv`, no supplementary groups); root otherwise.
    pub ids: Option<(u32, u32)>,
}

impl Spec {
    /// A container running `program args…` with `env`, as root.
    pub fn new(name: &str, program: &Path, args: &[&str], env: Vec<(String, String)>) -> Spec {
        Spec {
            name: name.to_owned(),
            program: program.to_path_buf(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env,
            ids: None,
        }
    }

    /// Starts it in `ns`, appending its output to `<logs>/<name>.log`.
    pub fn start<'ns>(&self, ns: &'ns Netns, logs: &Path) -> Result<Container<'ns>, LabError> {
        let log = logs.join(format!("{}.log", self.name));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| LabError::io(&log, source))?;
        let err = out
            .try_clone()
            .map_err(|source| LabError::io(&log, source))?;
        let offset = out.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = match self.ids {
            None => ns.command(&self.program.display().to_string()),
            Some((uid, gid)) => {
                let mut c = ns.command("setpriv");
                c.args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
                    .args(["--clear-groups", "--inh-caps=-all", "--"])
                    .arg(&self.program);
                c
            }
        };
        cmd.args(&self.args)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let pid = ns.spawn(&mut cmd)?;
        Ok(Container {
            ns,
            spec: self.clone(),
            pid,
            log,
            offset,
        })
    }

    /// Runs it to completion in `ns` (an init container); its output on failure.
    pub fn run(&self, ns: &Netns, logs: &Path) -> Result<(), LabError> {
        let c = self.start(ns, logs)?;
        let status = c.wait_exit(START)?;
        if status.success() {
            Ok(())
        } else {
            Err(LabError::Exited {
                what: self.name.clone(),
                status,
                log: c.log(),
            })
        }
    }
}

/// A running container (a process in a namespace); the namespace stops it when dropped.
#[derive(Debug)]
pub struct Container<'ns> {
    ns: &'ns Netns,
    spec: Spec,
    pid: u32,
    log: PathBuf,
    offset: u64,
}

impl<'ns> Container<'ns> {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The user and group it runs as (real ids, from `/proc`), while it runs.
    pub fn ids(&self) -> Option<(u32, u32)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let first = |key: &str| -> Option<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        Some((first("Uid:")?, first("Gid:")?))
    }

    /// What this run of it has logged.
    pub fn log(&self) -> String {
        let all = std::fs::read(&self.log).unwrap_or_default();
        let start = usize::try_from(self.offset).unwrap_or(0).min(all.len());
        String::from_utf8_lossy(&all[start..]).into_owned()
    }

    /// Waits until this run's log contains `needle`; fails if it exits first.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> Result<(), LabError> {
        let started = Instant::now();
        loop {
            if self.log().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.ns.try_wait(self.pid) {
                return Err(LabError::Exited {
                    what: format!("{} (waiting for {needle:?})", self.spec.name),
                    status,
                    log: self.log(),
                });
            }
            if started.elapsed() > timeout {
                return Err(LabError::Timeout {
                    what: format!("{needle:?} in the log of {}", self.spec.name),
                    waited: timeout,
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits for it to exit, at most `timeout`.
    pub fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus, LabError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.ns.try_wait(self.pid) {
                return Ok(status);
            }
            if started.elapsed() > timeout {
                return Err(LabError::Timeout {
                    what: format!("{} to exit", self.spec.name),
                    waited: timeout,
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Sends `signal` (`"TERM"`, `"KILL"`) and waits for the exit.
    pub fn signal(&self, signal: &str) -> Result<ExitStatus, LabError> {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid.to_string()])
            .status()
            .map_err(|source| LabError::Spawn {
                command: "kill".into(),
                source,
            })?;
        if !ok.success() {
            if let Some(status) = self.ns.try_wait(self.pid) {
                return Ok(status);
            }
        }
        self.wait_exit(START)
    }

    /// Starts the same container again (after it exited) in the same namespace.
    pub fn restart(&mut self, logs: &Path) -> Result<(), LabError> {
        self.ns.stop(self.pid);
        let next = self.spec.start(self.ns, logs)?;
        *self = next;
        Ok(())
    }
}

/// Where the sidecar runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidecarMode {
    /// `vpn-server sidecar`, its own process under Envoy's uid and gid 31415.
    Standalone,
    /// `vpn-server --sidecar`, inside the server's process.
    InProcess,
}

/// The `vpn-seed-server` container: our server in vpn2 environment mode.
pub fn seed_server_spec(bins: &Binaries, mounts: &Mounts, sidecar: SidecarMode) -> Spec {
    let mut env = seed_server_env(&mounts.status_path());
    env.push((
        "VPN_SERVER_SECRETS_DIR".into(),
        mounts.seed_secrets().display().to_string(),
    ));
    env.push((
        "VPN_SERVER_ADMIN_LISTEN".into(),
        format!("0.0.0.0:{SERVER_ADMIN_PORT},[::]:{SERVER_ADMIN_PORT}"),
    ));
    if sidecar == SidecarMode::InProcess {
        env.push(("VPN_SERVER_SIDECAR".into(), "true".into()));
    }
    Spec::new("vpn-seed-server", &bins.server, &[], env)
}

/// The sidecar's container in [`SidecarMode::Standalone`] (see the module docs).
pub fn sidecar_spec(bins: &Binaries, mounts: &Mounts) -> Spec {
    let env = [
        ("SHOOT_SERVICE_NETWORKS", SHOOT_SERVICE_NETWORKS.to_owned()),
        ("SHOOT_POD_NETWORKS", SHOOT_POD_NETWORKS.to_owned()),
        ("SHOOT_NODE_NETWORKS", SHOOT_NODE_NETWORKS.to_owned()),
        (
            "VPN_SERVER_SECRETS_DIR",
            mounts.seed_secrets().display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Spec {
        ids: Some(SIDECAR_IDS),
        ..Spec::new("sidecar", &bins.server, &["sidecar"], env)
    }
}

/// The `vpn-shoot` container: our client in vpn2 environment mode.
pub fn vpn_shoot_spec(bins: &Binaries, mounts: &Mounts) -> Spec {
    let mut env = vpn_shoot_env();
    env.push((
        "VPN2_SECRETS_DIR".into(),
        mounts.shoot_secrets().display().to_string(),
    ));
    Spec::new("vpn-shoot", &bins.client, &[], env)
}

/// The pods' init containers: `vpn-server setup` in the seed pod, `vpn-client setup`
/// (`vpn-shoot-init`) in the vpn-shoot pod.
pub fn run_init_containers(
    bins: &Binaries,
    seed_pod: &Netns,
    vpn_shoot: &Netns,
    logs: &Path,
) -> Result<(), LabError> {
    Spec::new("setup", &bins.server, &["setup"], Vec::new()).run(seed_pod, logs)?;
    Spec::new(
        "vpn-shoot-init",
        &bins.client,
        &["setup"],
        vpn_shoot_init_env(),
    )
    .run(vpn_shoot, logs)
}

/// Starts the ingress (our router) in `ingress` and waits until it listens.
pub fn start_ingress<'ns>(
    bins: &Binaries,
    ingress: &'ns Netns,
    logs: &Path,
) -> Result<Container<'ns>, LabError> {
    start_router(bins, ingress, logs, "router.toml", &router_config(), START)
}

/// Starts our router (container `ingress`) in `ns` with the configuration `config`, written
/// to `logs/<file>`, and waits up to `up` until it listens.
pub fn start_router<'ns>(
    bins: &Binaries,
    ns: &'ns Netns,
    logs: &Path,
    file: &str,
    config: &str,
    up: Duration,
) -> Result<Container<'ns>, LabError> {
    let path = logs.join(file);
    std::fs::write(&path, config).map_err(|source| LabError::io(&path, source))?;
    let c = Spec::new(
        "ingress",
        &bins.router,
        &["--config", &path.display().to_string()],
        Vec::new(),
    )
    .start(ns, logs)?;
    c.wait_log("router listening", up)?;
    Ok(c)
}

/// What the server logs once it serves.
pub const SERVER_READY: &str = "Initialization Sequence Completed";
/// What the sidecar logs per bound listener.
pub const SIDECAR_READY: &str = "CONNECT sidecar listening";

/// Starts a container and waits for `ready` in its log.
pub fn start_until<'ns>(
    spec: &Spec,
    ns: &'ns Netns,
    logs: &Path,
    ready: &str,
) -> Result<Container<'ns>, LabError> {
    let c = spec.start(ns, logs)?;
    c.wait_log(ready, START)?;
    Ok(c)
}
