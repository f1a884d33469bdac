//! Containers for the lab: a process started as Kubernetes (kubelet + containerd + runc) would
//! start it, from an image's root filesystem, inside a lab network namespace.
//!
//! A [`Pod`] is one lab [`Netns`] (the pod's network namespace, shared by its containers), a
//! name (the hostname) and its volumes, kept in a temporary directory. [`Pod::start`] runs one
//! container of a [`ContainerSpec`] whose fields are the Kubernetes ones Gardener sets:
//! `command`/`args` combined with the image's ENTRYPOINT/CMD as Kubernetes does
//! ([`container_argv`]), `env` over the image's ENV ([`container_env`]), `volumeMounts`, and
//! the `securityContext`.
//!
//! What a started container gets, all set up in the forked child before `execve` (the test
//! process never changes its own namespaces):
//!
//! * the pod's network namespace; its own mount and UTS namespaces, hostname = pod name;
//! * a fresh writable copy of the image's root filesystem ([`crate::image::Rootfs`]) as `/`
//!   (`pivot_root`), with `/proc`, a tmpfs `/dev` (`null`, `zero`, `full`, `random`,
//!   `urandom`, `tty`, `fd`, `std*`, `shm`) and `/sys` (read-only unless privileged); unless
//!   privileged, `/proc/{bus,fs,irq,sys,sysrq-trigger}` read-only and runc's masked paths
//!   masked, so a non-privileged container cannot write sysctls, as in a cluster;
//! * its volume mounts, in order: [`VolumeSource::Files`] (secret, configMap, projected) laid
//!   out as the kubelet's atomic writer does (`..<timestamp>/` with the files at the given
//!   mode, `..data` → it, each key → `..data/<key>`) and always mounted read-only;
//!   [`VolumeSource::EmptyDir`] (mode 0777, shared by every container of the pod that
//!   mounts it); [`VolumeSource::HostPath`] (a host directory, file or device such as
//!   `/dev/net/tun`, bound at the path);
//! * exactly the environment of [`container_env`], nothing inherited from the test process;
//! * the user and group of `runAsUser`/`runAsGroup` or the image's numeric USER,
//!   supplementary groups cleared; `runAsNonRoot` refused for uid 0 as the kubelet does;
//! * capabilities as containerd computes them: [`DEFAULT_CAPABILITIES`] minus `drop` plus
//!   `add` (`ALL` in `drop` empties the set first), every capability when privileged; the
//!   bounding set cut to that set; a non-root user ends with none effective (Kubernetes sets
//!   no ambient capabilities); `no_new_privs` when `allowPrivilegeEscalation: false`;
//! * stdout and stderr each to a file the test reads ([`Container::stdout`],
//!   [`Container::stderr`]); stdin `/dev/null`.
//!
//! [`Container::exec`] runs another process in the container as an exec probe or `kubectl
//! exec` does: it joins the container's network, UTS and mount namespaces (so the same
//! root, volumes and `/proc`), with the container's environment, working directory, user,
//! groups and capabilities.
//!
//! Not modelled: PID, IPC and cgroup namespaces (processes see the host's PIDs), seccomp,
//! AppArmor, resource limits, the variables the kubelet and containerd add (`KUBERNETES_*`,
//! `HOSTNAME`), `/etc/hosts` and `/etc/resolv.conf` (bind a file with
//! [`VolumeSource::HostPath`] where a test needs them), restarts, and the host's `/dev` in
//! privileged containers.
//!
//! ```no_run
//! use std::time::Duration;
//! use lab::container::{ContainerSpec, Pod, SecurityContext, VolumeSource};
//! use lab::image::Image;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ns = lab::netns::Netns::new()?;
//! let pod = Pod::new(&ns, "vpn-seed-server-6d4f")?;
//! let tlsauth = vec![("vpn.tlsauth".to_owned(), b"...".to_vec())];
//! pod.add_volume("tlsauth", VolumeSource::Files { files: tlsauth, mode: 0o400 })?;
//! let status_dir = pod.add_volume("openvpn-status", VolumeSource::EmptyDir)?;
//! pod.add_volume("dev-net-tun", VolumeSource::HostPath("/dev/net/tun".into()))?;
//! let image = Image::built("vpn-server")?;
//!
//! let setup = pod.start(
//!     &image,
//!     &ContainerSpec::new("setup")
//!         .command(["/bin/vpn-server", "setup"])
//!         .security(SecurityContext::privileged()),
//! )?;
//! assert!(setup.wait(Duration::from_secs(10))?.success());
//!
//! let server = pod.start(
//!     &image,
//!     &ContainerSpec::new("vpn-seed-server") // no command: the image's ENTRYPOINT
//!         .env("OPENVPN_STATUS_PATH", "/srv/status/openvpn.status")
//!         .mount("dev-net-tun", "/dev/net/tun")
//!         .mount("tlsauth", "/srv/secrets/tlsauth")
//!         .mount("openvpn-status", "/srv/status")
//!         .security(SecurityContext {
//!             add: vec!["NET_ADMIN".into(), "NET_RAW".into()],
//!             allow_privilege_escalation: Some(false),
//!             ..SecurityContext::default()
//!         }),
//! )?;
//! let probe = server.exec(&["/bin/vpn-server", "readiness"], Duration::from_secs(1))?;
//! println!("ready: {}, {}; logs: {}", probe.success(), probe.stdout, server.stderr());
//! # let _ = status_dir;
//! # Ok(())
//! # }
//! ```
//!
//! Cleanup: dropping a [`Container`] sends SIGTERM, then SIGKILL after
//! [`crate::netns::STOP_GRACE`], kills by PID any process left in its mount namespace, and
//! removes its root filesystem copy; its mounts end with its mount namespace. Dropping the
//! [`Pod`] (after its containers, which hold it) removes the volumes and logs. Nothing is
//! mounted in the test's own mount namespace.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::{kill_process, Pid, Signal};
use rustix::thread::{CapabilitySet, CapabilitySets, LinkNameSpaceType, UnshareFlags};
use tempfile::TempDir;

use crate::image::{Image, ImageConfig, ImageError, Rootfs};
use crate::netns::Netns;
use crate::LabError;

/// The capabilities containerd gives a container by default (its `oci.DefaultCapabilities`;
/// Docker's list is the same).
pub const DEFAULT_CAPABILITIES: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::MKNOD)
    .union(CapabilitySet::NET_RAW)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SETFCAP)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::SYS_CHROOT)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::AUDIT_WRITE);

/// Why a container could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// The image could not be opened or unpacked.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A lab step (a file, a command) failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// The spec cannot be run as given (no command, an unknown capability or volume, a
    /// non-numeric image user, a mount path through a symbolic link).
    #[error("container {container}: {what}")]
    Spec {
        /// The container.
        container: String,
        /// What is wrong.
        what: String,
    },
    /// `runAsNonRoot` with uid 0: the kubelet refuses to start such a container.
    #[error("container {container} has runAsNonRoot and would run as root (uid 0)")]
    RunAsNonRoot {
        /// The container.
        container: String,
    },
    /// The process could not be started: a setup step in the child or `execve` failed.
    #[error("container {container}: cannot start {argv:?}: {step}")]
    Start {
        /// The container.
        container: String,
        /// What was being run.
        argv: Vec<String>,
        /// The setup step that failed, as the child reported it (empty: `execve` itself).
        step: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The container's main process is gone (exec needs its namespaces).
    #[error("container {container} is not running")]
    NotRunning {
        /// The container.
        container: String,
    },
    /// Something awaited did not happen in time.
    #[error("container {container}: timed out after {waited:?} waiting for {what}; stdout:\n{stdout}\nstderr:\n{stderr}")]
    Timeout {
        /// The container.
        container: String,
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// Its stdout so far.
        stdout: String,
        /// Its stderr so far.
        stderr: String,
    },
    /// The container exited while something was awaited.
    #[error("container {container} exited with {status} while waiting for {what}; stdout:\n{stdout}\nstderr:\n{stderr}")]
    Exited {
        /// The container.
        container: String,
        /// What was awaited.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stdout.
        stdout: String,
        /// Its stderr.
        stderr: String,
    },
}

/// Where a pod volume's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A `secret`, `configMap` or `projected` volume: `(key, content)` files, each with
    /// `mode` (the volume's `defaultMode`, e.g. `0o400` or `0o644`), owned by root, laid out
    /// as the kubelet's atomic writer does; mounted read-only.
    Files {
        /// Keys (file names; `a/b` makes a directory `a`) and contents.
        files: Vec<(String, Vec<u8>)>,
        /// The files' mode.
        mode: u32,
    },
    /// An `emptyDir`: an empty directory, mode 0777, shared by the containers that mount it.
    EmptyDir,
    /// A `hostPath`: this host directory, file or device (`/dev/net/tun`), bound as is.
    HostPath(PathBuf),
}

/// A `volumeMounts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// The pod volume's name.
    pub name: String,
    /// Where it appears in the container (absolute).
    pub mount_path: String,
    /// `readOnly` (secret, configMap and projected volumes are read-only regardless).
    pub read_only: bool,
}

/// The `securityContext` fields this runner honours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecurityContext {
    /// `privileged`: every capability, read-write `/sys` and `/proc/sys`.
    pub privileged: bool,
    /// `capabilities.add` (`NET_ADMIN`, with or without `CAP_`; `ALL`).
    pub add: Vec<String>,
    /// `capabilities.drop` (`ALL` empties the default set).
    pub drop: Vec<String>,
    /// `runAsUser`; else the image's USER; else root.
    pub run_as_user: Option<u32>,
    /// `runAsGroup`; else the image's USER's group; else 0.
    pub run_as_group: Option<u32>,
    /// `runAsNonRoot`.
    pub run_as_non_root: bool,
    /// `allowPrivilegeEscalation`; `Some(false)` sets `no_new_privs`.
    pub allow_privilege_escalation: Option<bool>,
}

impl SecurityContext {
    /// `privileged: true`.
    pub fn privileged() -> Self {
        Self {
            privileged: true,
            ..Self::default()
        }
    }
}

/// A container of a pod spec, in Kubernetes' terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// `name` (also names its log files).
    pub name: String,
    /// `command` (replaces the image's ENTRYPOINT; empty: none).
    pub command: Vec<String>,
    /// `args` (replace the image's CMD; empty: none).
    pub args: Vec<String>,
    /// `env`, in order.
    pub env: Vec<(String, String)>,
    /// `volumeMounts`, mounted in this order.
    pub volume_mounts: Vec<VolumeMount>,
    /// `securityContext`.
    pub security_context: SecurityContext,
}

impl ContainerSpec {
    /// A spec named `name` with nothing else set: the image's entrypoint, as root with the
    /// default capabilities.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Sets `command`.
    pub fn command<I: IntoIterator<Item = S>, S: Into<String>>(mut self, command: I) -> Self {
        self.command = command.into_iter().map(Into::into).collect();
        self
    }

    /// Sets `args`.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Adds one `env` entry.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Adds a read-write volume mount (read-only anyway for file volumes).
    pub fn mount(mut self, volume: &str, path: &str) -> Self {
        self.volume_mounts.push(VolumeMount {
            name: volume.to_owned(),
            mount_path: path.to_owned(),
            read_only: false,
        });
        self
    }

    /// Adds a read-only volume mount.
    pub fn mount_read_only(mut self, volume: &str, path: &str) -> Self {
        self.volume_mounts.push(VolumeMount {
            name: volume.to_owned(),
            mount_path: path.to_owned(),
            read_only: true,
        });
        self
    }

    /// Sets `securityContext`.
    pub fn security(mut self, security_context: SecurityContext) -> Self {
        self.security_context = security_context;
        self
    }
}

/// The process a container runs, as Kubernetes combines the pod spec with the image:
/// `command` replaces ENTRYPOINT and, given alone, drops CMD too; `args` replace CMD.
pub fn container_argv(image: &ImageConfig, command: &[String], args: &[String]) -> Vec<String> {
    let (head, tail) = match (command.is_empty(), args.is_empty()) {
        (false, _) => (command, args),
        (true, false) => (image.entrypoint.as_slice(), args),
        (true, true) => (image.entrypoint.as_slice(), image.cmd.as_slice()),
    };
    head.iter().chain(tail).cloned().collect()
}

/// A container's environment as containerd builds it: the image's ENV, then the spec's
/// `env`, a later entry replacing an earlier one of the same name in place.
pub fn container_env(image: &ImageConfig, env: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in image.env.iter().chain(env) {
        match out.iter_mut().find(|(name, _)| name == k) {
            Some(slot) => slot.1.clone_from(v),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// A pod: a lab network namespace, a hostname and volumes; see the module docs.
#[derive(Debug, Clone)]
pub struct Pod {
    inner: Arc<PodInner>,
}

#[derive(Debug)]
struct PodInner {
    name: String,
    netns: OwnedFd,
    dir: TempDir,
    volumes: Mutex<BTreeMap<String, HostVolume>>,
}

#[derive(Debug, Clone)]
struct HostVolume {
    path: PathBuf,
    always_read_only: bool,
}

impl Pod {
    /// A pod named `name` (its hostname) in `netns`. The namespace must outlive the pod's
    /// containers: dropping it kills whatever runs inside.
    pub fn new(netns: &Netns, name: &str) -> Result<Self, ContainerError> {
        let path = format!("/run/netns/{}", netns.name());
        let netns = File::open(&path).map_err(|e| LabError::io(&path, e))?;
        let dir = tempfile::Builder::new()
            .prefix("vpnt-pod-")
            .tempdir()
            .map_err(|e| LabError::io(std::env::temp_dir(), e))?;
        for sub in ["volumes", "logs"] {
            let p = dir.path().join(sub);
            std::fs::create_dir(&p).map_err(|e| LabError::io(&p, e))?;
        }
        Ok(Self {
            inner: Arc::new(PodInner {
                name: name.to_owned(),
                netns: netns.into(),
                dir,
                volumes: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where the containers' stdout and stderr files are (`<container>.stdout`,
    /// `<container>.stderr`; an exec's `<container>.exec-<n>.std{out,err}`).
    pub fn logs_dir(&self) -> PathBuf {
        self.inner.dir.path().join("logs")
    }

    /// Adds volume `name` and returns its directory (or file) on the host, where a test can
    /// read what the containers wrote (an emptyDir) or change what they read.
    pub fn add_volume(&self, name: &str, source: VolumeSource) -> Result<PathBuf, ContainerError> {
        let spec_error = |what: String| ContainerError::Spec {
            container: format!("(pod {})", self.inner.name),
            what,
        };
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(spec_error(format!("bad volume name {name:?}")));
        }
        if self.volumes().contains_key(name) {
            return Err(spec_error(format!("volume {name} exists")));
        }
        let dir = self.inner.dir.path().join("volumes").join(name);
        let volume = match source {
            VolumeSource::Files { files, mode } => {
                write_atomic_layout(&dir, &files, mode).map_err(ContainerError::Lab)?;
                HostVolume {
                    path: dir,
                    always_read_only: true,
                }
            }
            VolumeSource::EmptyDir => {
                std::fs::create_dir(&dir).map_err(|e| LabError::io(&dir, e))?;
                set_mode(&dir, 0o777)?;
                HostVolume {
                    path: dir,
                    always_read_only: false,
                }
            }
            VolumeSource::HostPath(path) => {
                std::fs::metadata(&path).map_err(|e| LabError::io(&path, e))?;
                HostVolume {
                    path,
                    always_read_only: false,
                }
            }
        };
        let path = volume.path.clone();
        self.volumes().insert(name.to_owned(), volume);
        Ok(path)
    }

    /// Starts a container of `spec` from `image`; see the module docs for what it gets.
    pub fn start(&self, image: &Image, spec: &ContainerSpec) -> Result<Container, ContainerError> {
        let name = spec.name.clone();
        let spec_error = |what: String| ContainerError::Spec {
            container: name.clone(),
            what,
        };
        if name.is_empty() || name.contains('/') {
            return Err(spec_error(format!("bad container name {name:?}")));
        }
        let config = image.config();
        let argv = container_argv(config, &spec.command, &spec.args);
        if argv.is_empty() {
            return Err(spec_error(
                "no command: the spec has none and the image no ENTRYPOINT or CMD".to_owned(),
            ));
        }
        let env = container_env(config, &spec.env);
        let identity = Identity::resolve(config, &spec.security_context, &name)?;
        let workdir = config.working_dir.clone().unwrap_or_else(|| "/".to_owned());
        let rootfs = image.rootfs()?;
        let mounts = self.resolve_mounts(&name, &spec.volume_mounts, rootfs.path())?;
        let steps = setup_steps(
            rootfs.path(),
            &mounts,
            spec.security_context.privileged,
            &spec_error,
        )?;
        let logs = self.inner.dir.path().join("logs");
        let stdout_path = logs.join(format!("{name}.stdout"));
        let stderr_path = logs.join(format!("{name}.stderr"));
        let stdout = File::create(&stdout_path).map_err(|e| LabError::io(&stdout_path, e))?;
        let stderr = File::create(&stderr_path).map_err(|e| LabError::io(&stderr_path, e))?;
        let child = ChildPlan::Start(StartPlan {
            netns: self
                .inner
                .netns
                .try_clone()
                .map_err(|e| LabError::io("netns", e))?,
            hostname: self.inner.name.clone().into_bytes(),
            root: cstring(rootfs.path().as_os_str().as_bytes()),
            steps,
            tail: Tail {
                workdir: cstring(workdir.as_bytes()),
                identity: identity.clone(),
                report: stderr
                    .try_clone()
                    .map_err(|e| LabError::io(&stderr_path, e))?
                    .into(),
            },
        });
        let mut cmd = command(&argv, &env, stdout, stderr);
        let process = spawn_in(&mut cmd, child).map_err(|source| ContainerError::Start {
            container: name.clone(),
            argv: argv.clone(),
            step: last_line(&stderr_path),
            source,
        })?;
        let pid = process.id();
        // Held open until the drop's sweep: the namespace (and so its inode number, which the
        // sweep compares) cannot be freed and reused by another container meanwhile. Fails
        // only if the process has already exited.
        let mnt_ns = File::open(format!("/proc/{pid}/ns/mnt")).ok();
        Ok(Container {
            name,
            pod: self.clone(),
            pid,
            process: Mutex::new(process),
            mnt_ns,
            env,
            workdir,
            identity,
            stdout_path,
            stderr_path,
            execs: AtomicU32::new(0),
            rootfs,
        })
    }

    fn volumes(&self) -> MutexGuard<'_, BTreeMap<String, HostVolume>> {
        self.inner
            .volumes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Each mount's host source, its target below `root`, and whether it is read-only; the
    /// target must not pass through a symbolic link of the image (it could lead out of it).
    fn resolve_mounts(
        &self,
        container: &str,
        mounts: &[VolumeMount],
        root: &Path,
    ) -> Result<Vec<ResolvedMount>, ContainerError> {
        let volumes = self.volumes();
        let spec_error = |what: String| ContainerError::Spec {
            container: container.to_owned(),
            what,
        };
        mounts
            .iter()
            .map(|m| {
                let volume = volumes
                    .get(&m.name)
                    .ok_or_else(|| spec_error(format!("no volume named {}", m.name)))?;
                let rel = relative_path(&m.mount_path)
                    .ok_or_else(|| spec_error(format!("bad mount path {:?}", m.mount_path)))?;
                let mut at = root.to_path_buf();
                for part in rel.components() {
                    at.push(part);
                    if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
                        return Err(spec_error(format!(
                            "mount path {} passes through a symbolic link",
                            m.mount_path
                        )));
                    }
                }
                Ok(ResolvedMount {
                    source: volume.path.clone(),
                    rel,
                    is_dir: volume.path.is_dir(),
                    read_only: m.read_only || volume.always_read_only,
                })
            })
            .collect()
    }
}

#[derive(Debug)]
struct ResolvedMount {
    source: PathBuf,
    rel: PathBuf,
    is_dir: bool,
    read_only: bool,
}

/// A running (or exited) container; see the module docs. Dropping it stops it.
#[derive(Debug)]
pub struct Container {
    name: String,
    pod: Pod,
    pid: u32,
    process: Mutex<std::process::Child>,
    mnt_ns: Option<File>,
    env: Vec<(String, String)>,
    workdir: String,
    identity: Identity,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    execs: AtomicU32,
    // Dropped after the processes are gone (fields drop after `Drop::drop`).
    rootfs: Rootfs,
}

/// What an exec'd process did.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// Its exit status; `None` if it was killed at the timeout.
    pub status: Option<ExitStatus>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl ExecOutput {
    /// Whether it exited 0 in time (what a kubelet exec probe counts as success).
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl Container {
    /// The container's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PID of its main process (in the host's PID namespace).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pod it belongs to.
    pub fn pod(&self) -> &Pod {
        &self.pod
    }

    /// Its environment, exactly as its processes get it.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Its root filesystem copy on the host (what it wrote to its own files is there).
    pub fn rootfs(&self) -> &Path {
        self.rootfs.path()
    }

    /// `path` as the container sees it (its mounts included), reached from the host through
    /// `/proc/PID/root` while the main process runs.
    pub fn path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(path.trim_start_matches('/'))
    }

    /// The file its stdout goes to.
    pub fn stdout_path(&self) -> &Path {
        &self.stdout_path
    }

    /// The file its stderr goes to.
    pub fn stderr_path(&self) -> &Path {
        &self.stderr_path
    }

    /// What it wrote to stdout so far.
    pub fn stdout(&self) -> String {
        read_lossy(&self.stdout_path)
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    /// Its exit status, if its main process has exited.
    pub fn try_wait(&self) -> Option<ExitStatus> {
        self.process().try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for its main process to exit (an init container, a verb).
    pub fn wait(&self, timeout: Duration) -> Result<ExitStatus, ContainerError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.timeout("its exit", timeout));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` until `needle` appears in its stdout or stderr; fails early if it
    /// exits first.
    pub fn wait_for_output(&self, needle: &str, timeout: Duration) -> Result<(), ContainerError> {
        let deadline = Instant::now() + timeout;
        let what = format!("{needle:?} in its output");
        loop {
            if self.stdout().contains(needle) || self.stderr().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.try_wait() {
                return Err(ContainerError::Exited {
                    container: self.name.clone(),
                    what,
                    status,
                    stdout: self.stdout(),
                    stderr: self.stderr(),
                });
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(&what, timeout));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to its main process (by PID; nothing if it has been reaped).
    pub fn signal(&self, signal: Signal) {
        // Only while it is not reaped: a reaped PID may belong to another process by now.
        let mut process = self.process();
        if let Ok(None) = process.try_wait() {
            if let Some(pid) = pid_of(self.pid) {
                let _ = kill_process(pid, signal);
            }
        }
    }

    /// SIGTERM to its main process (what the kubelet sends first).
    pub fn terminate(&self) {
        self.signal(Signal::TERM);
    }

    /// SIGKILL to its main process.
    pub fn kill(&self) {
        self.signal(Signal::KILL);
    }

    /// Starts `argv` inside the container (see the module docs) and returns at once; the
    /// process is killed when the handle drops.
    pub fn exec_spawn(&self, argv: &[&str]) -> Result<ExecProcess, ContainerError> {
        if argv.is_empty() {
            return Err(ContainerError::Spec {
                container: self.name.clone(),
                what: "exec of an empty command".to_owned(),
            });
        }
        if self.try_wait().is_some() {
            return Err(self.not_running());
        }
        let open = |ns: &str| -> Result<OwnedFd, ContainerError> {
            let path = format!("/proc/{}/ns/{ns}", self.pid);
            File::open(&path)
                .map(OwnedFd::from)
                .map_err(|_| self.not_running())
        };
        let (net, uts, mnt) = (open("net")?, open("uts")?, open("mnt")?);
        let n = self.execs.fetch_add(1, Ordering::Relaxed);
        let logs = self.pod.inner.dir.path().join("logs");
        let stdout_path = logs.join(format!("{}.exec-{n}.stdout", self.name));
        let stderr_path = logs.join(format!("{}.exec-{n}.stderr", self.name));
        let stdout = File::create(&stdout_path).map_err(|e| LabError::io(&stdout_path, e))?;
        let stderr = File::create(&stderr_path).map_err(|e| LabError::io(&stderr_path, e))?;
        let plan = ChildPlan::Exec(ExecPlan {
            namespaces: [
                (net, LinkNameSpaceType::Network),
                (uts, LinkNameSpaceType::HostNameAndNISDomainName),
                (mnt, LinkNameSpaceType::Mount),
            ],
            tail: Tail {
                workdir: cstring(self.workdir.as_bytes()),
                identity: self.identity.clone(),
                report: stderr
                    .try_clone()
                    .map_err(|e| LabError::io(&stderr_path, e))?
                    .into(),
            },
        });
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        let mut cmd = command(&argv, &self.env, stdout, stderr);
        let child = spawn_in(&mut cmd, plan).map_err(|source| ContainerError::Start {
            container: self.name.clone(),
            argv: argv.clone(),
            step: last_line(&stderr_path),
            source,
        })?;
        Ok(ExecProcess {
            child,
            stdout_path,
            stderr_path,
        })
    }

    /// Runs `argv` inside the container (see the module docs) to its end or until `timeout`,
    /// when it is killed (an exec probe's `timeoutSeconds`).
    pub fn exec(&self, argv: &[&str], timeout: Duration) -> Result<ExecOutput, ContainerError> {
        let mut process = self.exec_spawn(argv)?;
        Ok(process.wait(timeout))
    }

    fn process(&self) -> MutexGuard<'_, std::process::Child> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_running(&self) -> ContainerError {
        ContainerError::NotRunning {
            container: self.name.clone(),
        }
    }

    fn timeout(&self, what: &str, waited: Duration) -> ContainerError {
        ContainerError::Timeout {
            container: self.name.clone(),
            what: what.to_owned(),
            waited,
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let mut process = self.process();
        crate::netns::stop_child(&mut process);
        drop(process);
        if let Some(ns) = self.mnt_ns.take() {
            kill_mount_namespace(&ns);
        }
    }
}

/// A process started with [`Container::exec_spawn`]; killed (by PID) on drop.
#[derive(Debug)]
pub struct ExecProcess {
    child: std::process::Child,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
}

impl ExecProcess {
    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for it to exit; kills it then.
    pub fn wait(&mut self, timeout: Duration) -> ExecOutput {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        ExecOutput {
            status,
            stdout: read_lossy(&self.stdout_path),
            stderr: read_lossy(&self.stderr_path),
        }
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A few fields of `/proc/PID/status`: what a test checks of a container's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// Real, effective, saved and filesystem uid.
    pub uid: [u32; 4],
    /// Real, effective, saved and filesystem gid.
    pub gid: [u32; 4],
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// `CapEff`.
    pub effective: CapabilitySet,
    /// `CapPrm`.
    pub permitted: CapabilitySet,
    /// `CapInh`.
    pub inheritable: CapabilitySet,
    /// `CapBnd`.
    pub bounding: CapabilitySet,
    /// `CapAmb`.
    pub ambient: CapabilitySet,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
}

impl ProcStatus {
    /// Reads `/proc/PID/status`.
    pub fn read(pid: u32) -> Result<Self, LabError> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).map_err(|e| LabError::io(&path, e))?;
        let bad = |what: &str| {
            LabError::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
            )
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .ok_or_else(|| bad(name))
        };
        let ids = |name: &str| -> Result<[u32; 4], LabError> {
            let v: Vec<u32> = field(name)?
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad(name))?;
            v.try_into().map_err(|_| bad(name))
        };
        let caps = |name: &str| -> Result<CapabilitySet, LabError> {
            u64::from_str_radix(field(name)?, 16)
                .map(CapabilitySet::from_bits_retain)
                .map_err(|_| bad(name))
        };
        Ok(Self {
            uid: ids("Uid")?,
            gid: ids("Gid")?,
            groups: field("Groups")?
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad("Groups"))?,
            effective: caps("CapEff")?,
            permitted: caps("CapPrm")?,
            inheritable: caps("CapInh")?,
            bounding: caps("CapBnd")?,
            ambient: caps("CapAmb")?,
            no_new_privs: field("NoNewPrivs")? == "1",
        })
    }
}

/// Every capability a container can get here: those this kernel knows that the lab process
/// itself holds (a runtime cannot give more; a sandboxed "root" may lack some). What a
/// privileged container gets.
pub fn all_capabilities() -> CapabilitySet {
    let held = rustix::thread::capabilities(None)
        .map(|sets| sets.permitted)
        .unwrap_or(CapabilitySet::empty());
    kernel_capabilities() & held
}

/// Every capability this kernel knows (0 ..= `/proc/sys/kernel/cap_last_cap`).
fn kernel_capabilities() -> CapabilitySet {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63);
    CapabilitySet::from_bits_retain(if last == 63 {
        u64::MAX
    } else {
        (1u64 << (last + 1)) - 1
    })
}

/// A capability by its Kubernetes name (`NET_ADMIN`, `CAP_NET_ADMIN`, any case).
pub fn capability(name: &str) -> Option<CapabilitySet> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CapabilitySet::from_name(bare)
}

/// Who a container's processes run as.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    uid: u32,
    gid: u32,
    capabilities: CapabilitySet,
    /// Each capability to remove from the bounding set, one bit per entry.
    bounding_drops: Vec<CapabilitySet>,
    no_new_privs: bool,
}

impl Identity {
    fn resolve(
        image: &ImageConfig,
        sc: &SecurityContext,
        container: &str,
    ) -> Result<Self, ContainerError> {
        let spec_error = |what: String| ContainerError::Spec {
            container: container.to_owned(),
            what,
        };
        let (image_uid, image_gid) = match image.user.as_deref() {
            None => (None, None),
            Some(user) => {
                let (u, g) = match user.split_once(':') {
                    Some((u, g)) => (u, Some(g)),
                    None => (user, None),
                };
                let number = |s: &str| {
                    s.parse::<u32>().map_err(|_| {
                        spec_error(format!(
                            "the image's USER {user:?} is not numeric (the image has no /etc/passwd)"
                        ))
                    })
                };
                (Some(number(u)?), g.map(number).transpose()?)
            }
        };
        let uid = sc.run_as_user.or(image_uid).unwrap_or(0);
        let gid = sc.run_as_group.or(image_gid).unwrap_or(0);
        if sc.run_as_non_root && uid == 0 {
            return Err(ContainerError::RunAsNonRoot {
                container: container.to_owned(),
            });
        }
        let all = all_capabilities();
        let parse = |names: &[String]| -> Result<(bool, CapabilitySet), ContainerError> {
            let mut set = CapabilitySet::empty();
            let mut has_all = false;
            for name in names {
                if name.eq_ignore_ascii_case("ALL") {
                    has_all = true;
                } else {
                    set |= capability(name)
                        .ok_or_else(|| spec_error(format!("unknown capability {name:?}")))?;
                }
            }
            Ok((has_all, set))
        };
        let (drop_all, drop) = parse(&sc.drop)?;
        let (add_all, add) = parse(&sc.add)?;
        let capabilities = if sc.privileged || add_all {
            all
        } else if drop_all {
            add & all
        } else {
            ((DEFAULT_CAPABILITIES - drop) | add) & all
        };
        let bounding_drops = kernel_capabilities()
            .difference(capabilities)
            .iter()
            .filter(|c| c.bits().count_ones() == 1)
            .collect();
        Ok(Self {
            uid,
            gid,
            capabilities,
            bounding_drops,
            no_new_privs: !sc.privileged && sc.allow_privilege_escalation == Some(false),
        })
    }
}

/// What the forked child does before `execve`: start a container, or join one.
#[derive(Debug)]
enum ChildPlan {
    Start(StartPlan),
    Exec(ExecPlan),
}

#[derive(Debug)]
struct StartPlan {
    netns: OwnedFd,
    hostname: Vec<u8>,
    root: CString,
    steps: Vec<Step>,
    tail: Tail,
}

#[derive(Debug)]
struct ExecPlan {
    namespaces: [(OwnedFd, LinkNameSpaceType); 3],
    tail: Tail,
}

/// The common end of both plans: working directory, then identity.
#[derive(Debug)]
struct Tail {
    workdir: CString,
    identity: Identity,
    /// The stderr log: where a failing step is named.
    report: OwnedFd,
}

/// One mount-namespace setup step, with every path prepared in the parent.
#[derive(Debug)]
enum Step {
    /// `mkdir`; an existing directory is fine.
    Mkdir(CString),
    /// Creates an empty file (a bind mount target) unless something is there.
    Touch(CString),
    /// A bind mount.
    Bind {
        source: CString,
        target: CString,
        recursive: bool,
    },
    /// Makes a bind mount read-only.
    ReadOnly(CString),
    /// A new filesystem mount.
    Mount {
        fstype: CString,
        target: CString,
        flags: MountFlags,
        data: CString,
    },
    /// A symbolic link.
    Symlink { target: CString, link: CString },
}

impl Step {
    fn run(&self) -> rustix::io::Result<()> {
        match self {
            Step::Mkdir(path) => match rustix::fs::mkdir(path.as_c_str(), Mode::from(0o755)) {
                Err(rustix::io::Errno::EXIST) => Ok(()),
                other => other,
            },
            Step::Touch(path) => {
                let flags = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
                rustix::fs::open(path.as_c_str(), flags, Mode::from(0o644)).map(drop)
            }
            Step::Bind {
                source,
                target,
                recursive: true,
            } => rustix::mount::mount_bind_recursive(source.as_c_str(), target.as_c_str()),
            Step::Bind { source, target, .. } => {
                rustix::mount::mount_bind(source.as_c_str(), target.as_c_str())
            }
            Step::ReadOnly(target) => rustix::mount::mount_remount(
                target.as_c_str(),
                MountFlags::BIND | MountFlags::RDONLY,
                c"",
            ),
            Step::Mount {
                fstype,
                target,
                flags,
                data,
            } => rustix::mount::mount(
                fstype.as_c_str(),
                target.as_c_str(),
                fstype.as_c_str(),
                *flags,
                Some(data.as_c_str()),
            ),
            Step::Symlink { target, link } => {
                rustix::fs::symlink(target.as_c_str(), link.as_c_str())
            }
        }
    }

    /// For the error report: the step's kind and its last path.
    fn describe(&self) -> (&'static [u8], &CStr) {
        match self {
            Step::Mkdir(p) => (b"mkdir ", p),
            Step::Touch(p) => (b"create ", p),
            Step::Bind { target, .. } => (b"bind mount on ", target),
            Step::ReadOnly(p) => (b"remount read-only ", p),
            Step::Mount { target, .. } => (b"mount on ", target),
            Step::Symlink { link, .. } => (b"symlink ", link),
        }
    }
}

impl ChildPlan {
    /// Runs in the forked child. Only system calls through rustix (no allocation, no locks):
    /// the parent may have had other threads when it forked.
    fn run(&self) -> std::io::Result<()> {
        match self {
            ChildPlan::Start(plan) => plan.run(),
            ChildPlan::Exec(plan) => plan.run(),
        }
    }
}

impl StartPlan {
    #[allow(unsafe_code)]
    fn run(&self) -> std::io::Result<()> {
        let report = &self.tail.report;
        let ns = rustix::thread::move_into_link_name_space(
            self.netns.as_fd(),
            Some(LinkNameSpaceType::Network),
        );
        check(report, b"setns network", None, ns)?;
        // SAFETY: the forked child has a single thread, and neither flag unshares the file
        // descriptor table (the hazard `unshare_unsafe` warns of).
        let unshared =
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS | UnshareFlags::NEWUTS) };
        check(report, b"unshare mount and UTS namespaces", None, unshared)?;
        let host = rustix::system::sethostname(&self.hostname);
        check(report, b"sethostname", None, host)?;
        // No mount of ours may propagate back to the test's mount namespace.
        let private = rustix::mount::mount_change(
            c"/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        );
        check(report, b"make / private", None, private)?;
        for step in &self.steps {
            let (what, path) = step.describe();
            check(report, what, Some(path), step.run())?;
        }
        let root = self.root.as_c_str();
        check(report, b"chdir ", Some(root), rustix::process::chdir(root))?;
        let pivot = rustix::process::pivot_root(c".", c".");
        check(report, b"pivot_root ", Some(root), pivot)?;
        let detach = rustix::mount::unmount(c".", UnmountFlags::DETACH);
        check(report, b"detach the old root", None, detach)?;
        check(report, b"chdir /", None, rustix::process::chdir(c"/"))?;
        self.tail.run()
    }
}

impl ExecPlan {
    fn run(&self) -> std::io::Result<()> {
        for (fd, kind) in &self.namespaces {
            let ns = rustix::thread::move_into_link_name_space(fd.as_fd(), Some(*kind));
            check(&self.tail.report, b"setns into the container", None, ns)?;
        }
        self.tail.run()
    }
}

impl Tail {
    fn run(&self) -> std::io::Result<()> {
        let report = &self.report;
        let workdir = self.workdir.as_c_str();
        let cd = rustix::process::chdir(workdir);
        check(
            report,
            b"chdir to the working directory ",
            Some(workdir),
            cd,
        )?;
        rustix::process::umask(Mode::from(0o022));
        let id = &self.identity;
        for cap in &id.bounding_drops {
            // EINVAL: a capability this kernel does not have; nothing to drop.
            match rustix::thread::remove_capability_from_bounding_set(*cap) {
                Err(rustix::io::Errno::INVAL) => {}
                other => check(report, b"drop from the bounding set", None, other)?,
            }
        }
        let ambient = rustix::thread::clear_ambient_capability_set();
        check(report, b"clear ambient capabilities", None, ambient)?;
        let groups = rustix::thread::set_thread_groups(&[]);
        check(report, b"setgroups", None, groups)?;
        let gid = rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(id.gid));
        check(report, b"setgid", None, gid)?;
        // For a non-root uid the kernel clears the permitted and effective sets here.
        let uid = rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(id.uid));
        check(report, b"setuid", None, uid)?;
        if id.uid == 0 {
            let sets = CapabilitySets {
                effective: id.capabilities,
                permitted: id.capabilities,
                inheritable: CapabilitySet::empty(),
            };
            let caps = rustix::thread::set_capabilities(None, sets);
            check(report, b"capset", None, caps)?;
        }
        if id.no_new_privs {
            let nnp = rustix::thread::set_no_new_privs(true);
            check(report, b"no_new_privs", None, nnp)?;
        }
        Ok(())
    }
}

/// Passes `result` on; on an error first writes `what` and `path` as one line to `report`
/// (the stderr log), which the parent reads back for [`ContainerError::Start`].
fn check(
    report: &OwnedFd,
    what: &[u8],
    path: Option<&CStr>,
    result: rustix::io::Result<()>,
) -> std::io::Result<()> {
    let Err(errno) = result else {
        return Ok(());
    };
    let _ = rustix::io::write(report, b"\nlab container setup failed: ");
    let _ = rustix::io::write(report, what);
    if let Some(path) = path {
        let _ = rustix::io::write(report, path.to_bytes());
    }
    let _ = rustix::io::write(report, b"\n");
    Err(errno.into())
}

/// Spawns `cmd` with `plan` run in the forked child before `execve`.
#[allow(unsafe_code)]
fn spawn_in(cmd: &mut Command, plan: ChildPlan) -> std::io::Result<std::process::Child> {
    // SAFETY: `pre_exec` runs the closure in the forked child, where only async-signal-safe
    // work is allowed. `ChildPlan::run` does only raw system calls through rustix on data
    // prepared here (C strings, file descriptors, capability sets): no allocation, no lock,
    // no access to state another thread of the parent could have held at fork time.
    unsafe {
        cmd.pre_exec(move || plan.run());
    }
    cmd.spawn()
}

/// The command for `argv` with exactly `env`; stdin `/dev/null`; in its own process group
/// (signals to the test's terminal group do not reach it).
fn command(argv: &[String], env: &[(String, String)], stdout: File, stderr: File) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    cmd
}

/// The child's steps: the root a mount point, `/proc`, `/dev`, `/sys`, the volumes, and for
/// a non-privileged container the read-only and masked paths.
fn setup_steps(
    root: &Path,
    mounts: &[ResolvedMount],
    privileged: bool,
    spec_error: &impl Fn(String) -> ContainerError,
) -> Result<Vec<Step>, ContainerError> {
    let at = |rel: &str| cstring(root.join(rel).as_os_str().as_bytes());
    let host = |p: &str| cstring(p.as_bytes());
    let mount = |fstype: &str, rel: &str, flags: MountFlags, data: &str| Step::Mount {
        fstype: host(fstype),
        target: at(rel),
        flags,
        data: host(data),
    };
    let hardened = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    let mut steps = vec![
        Step::Bind {
            source: at(""),
            target: at(""),
            recursive: true,
        },
        Step::Mkdir(at("proc")),
        mount("proc", "proc", hardened, ""),
        Step::Mkdir(at("dev")),
        mount(
            "tmpfs",
            "dev",
            MountFlags::NOSUID | MountFlags::STRICTATIME,
            "mode=755,size=65536k",
        ),
    ];
    for dev in ["null", "zero", "full", "random", "urandom", "tty"] {
        steps.push(Step::Touch(at(&format!("dev/{dev}"))));
        steps.push(Step::Bind {
            source: host(&format!("/dev/{dev}")),
            target: at(&format!("dev/{dev}")),
            recursive: false,
        });
    }
    for (target, link) in [
        ("/proc/self/fd", "dev/fd"),
        ("/proc/self/fd/0", "dev/stdin"),
        ("/proc/self/fd/1", "dev/stdout"),
        ("/proc/self/fd/2", "dev/stderr"),
    ] {
        steps.push(Step::Symlink {
            target: host(target),
            link: at(link),
        });
    }
    steps.push(Step::Mkdir(at("dev/shm")));
    steps.push(mount("tmpfs", "dev/shm", hardened, "mode=1777,size=65536k"));
    steps.push(Step::Mkdir(at("sys")));
    let sys_flags = if privileged {
        hardened
    } else {
        hardened | MountFlags::RDONLY
    };
    steps.push(mount("sysfs", "sys", sys_flags, ""));
    for m in mounts {
        let mut dir = root.to_path_buf();
        let parts: Vec<Component<'_>> = m.rel.components().collect();
        let Some((_, parents)) = parts.split_last() else {
            return Err(spec_error("a volume mounted on /".to_owned()));
        };
        for part in parents {
            dir.push(part);
            steps.push(Step::Mkdir(cstring(dir.as_os_str().as_bytes())));
        }
        let target = cstring(root.join(&m.rel).as_os_str().as_bytes());
        steps.push(if m.is_dir {
            Step::Mkdir(target.clone())
        } else {
            Step::Touch(target.clone())
        });
        steps.push(Step::Bind {
            source: cstring(m.source.as_os_str().as_bytes()),
            target: target.clone(),
            recursive: true,
        });
        if m.read_only {
            steps.push(Step::ReadOnly(target));
        }
    }
    if !privileged {
        // runc's default readonlyPaths and maskedPaths, where this kernel has them.
        for p in ["bus", "fs", "irq", "sys", "sysrq-trigger"] {
            if Path::new("/proc").join(p).exists() {
                let target = at(&format!("proc/{p}"));
                steps.push(Step::Bind {
                    source: target.clone(),
                    target: target.clone(),
                    recursive: true,
                });
                steps.push(Step::ReadOnly(target));
            }
        }
        for p in [
            "proc/kcore",
            "proc/keys",
            "proc/latency_stats",
            "proc/timer_list",
            "proc/timer_stats",
            "proc/sched_debug",
        ] {
            if Path::new("/").join(p).is_file() {
                steps.push(Step::Bind {
                    source: host("/dev/null"),
                    target: at(p),
                    recursive: false,
                });
            }
        }
        for p in ["proc/acpi", "proc/scsi", "sys/firmware"] {
            if Path::new("/").join(p).is_dir() {
                steps.push(mount("tmpfs", p, MountFlags::RDONLY, ""));
            }
        }
    }
    Ok(steps)
}

/// Writes `files` into a new directory `dir` as the kubelet's atomic writer lays out a
/// secret, configMap or projected volume: the data in `..<timestamp>/`, `..data` pointing to
/// it, and each top-level name pointing into `..data`.
fn write_atomic_layout(dir: &Path, files: &[(String, Vec<u8>)], mode: u32) -> Result<(), LabError> {
    std::fs::create_dir(dir).map_err(|e| LabError::io(dir, e))?;
    // A tmpfs root, as the kubelet mounts for these volumes.
    set_mode(dir, 0o1777)?;
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let data_dir_name = format!("..{}_{:09}", stamp.as_secs(), stamp.subsec_nanos());
    let data_dir = dir.join(&data_dir_name);
    std::fs::create_dir(&data_dir).map_err(|e| LabError::io(&data_dir, e))?;
    set_mode(&data_dir, 0o755)?;
    let mut top = Vec::new();
    for (key, content) in files {
        let Some(rel) = relative_path(key) else {
            return Err(LabError::io(
                dir.join(key),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad key"),
            ));
        };
        let path = data_dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| LabError::io(parent, e))?;
        }
        std::fs::write(&path, content).map_err(|e| LabError::io(&path, e))?;
        set_mode(&path, mode)?;
        if let Some(Component::Normal(first)) = rel.components().next() {
            if !top.contains(&first.to_owned()) {
                top.push(first.to_owned());
            }
        }
    }
    let data_link = dir.join("..data");
    std::os::unix::fs::symlink(&data_dir_name, &data_link)
        .map_err(|e| LabError::io(&data_link, e))?;
    for name in top {
        let link = dir.join(&name);
        std::os::unix::fs::symlink(Path::new("..data").join(&name), &link)
            .map_err(|e| LabError::io(&link, e))?;
    }
    Ok(())
}

/// `path` (absolute or not) as a relative path of normal components only; `None` if it
/// has `..`, is empty, or is `/`.
fn relative_path(path: &str) -> Option<PathBuf> {
    let mut rel = PathBuf::new();
    for part in Path::new(path).components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => rel.push(p),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!rel.as_os_str().is_empty()).then_some(rel)
}

/// A C string of `bytes`; paths and names here never hold a NUL (one would be cut there).
fn cstring(bytes: &[u8]) -> CString {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).unwrap_or_default()
}

fn set_mode(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| LabError::io(path, e))
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last line the child wrote to its stderr log (its failed setup step), if any.
fn last_line(path: &Path) -> String {
    read_lossy(path)
        .lines()
        .rev()
        .find(|l| l.starts_with("lab container setup failed: "))
        .map(|l| {
            l.trim_start_matches("lab container setup failed: ")
                .to_owned()
        })
        .unwrap_or_default()
}

fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// SIGKILLs, by PID, every process whose mount namespace is `ns` (children the container's
/// processes left behind); a few rounds, as a dying process may still fork.
fn kill_mount_namespace(ns: &File) {
    use std::os::unix::fs::MetadataExt;
    let Ok(ns) = ns.metadata().map(|m| (m.dev(), m.ino())) else {
        return;
    };
    for _ in 0..5 {
        let mut found = false;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let theirs = std::fs::metadata(format!("/proc/{pid}/ns/mnt"));
            if theirs.is_ok_and(|m| (m.dev(), m.ino()) == ns) {
                if let Some(pid) = pid_of(pid) {
                    let _ = kill_process(pid, Signal::KILL);
                    found = true;
                }
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `status` is death by `signal`.
pub fn killed_by(status: ExitStatus, signal: Signal) -> bool {
    status.signal() == Some(signal.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn image(entrypoint: &[&str], cmd: &[&str], user: Option<&str>) -> ImageConfig {
        ImageConfig {
            entrypoint: strings(entrypoint),
            cmd: strings(cmd),
            env: vec![("PATH".to_owned(), "/usr/local/bin:/bin".to_owned())],
            user: user.map(str::to_owned),
            ..ImageConfig::default()
        }
    }

    #[test]
    fn command_and_args_combine_with_the_image_as_kubernetes_does() {
        let img = image(&["/bin/vpn-server"], &["--default"], None);
        // Neither: ENTRYPOINT + CMD (vpn-seed-server, vpn-shoot).
        assert_eq!(
            container_argv(&img, &[], &[]),
            strings(&["/bin/vpn-server", "--default"])
        );
        // command alone: ENTRYPOINT and CMD both ignored (setup, envoy).
        assert_eq!(
            container_argv(&img, &strings(&["/bin/vpn-server", "setup"]), &[]),
            strings(&["/bin/vpn-server", "setup"])
        );
        // args alone: ENTRYPOINT + args.
        assert_eq!(
            container_argv(&img, &[], &strings(&["exporter"])),
            strings(&["/bin/vpn-server", "exporter"])
        );
        assert_eq!(
            container_argv(&img, &strings(&["envoy"]), &strings(&["-c", "x"])),
            strings(&["envoy", "-c", "x"])
        );
        assert!(container_argv(&image(&[], &[], None), &[], &[]).is_empty());
    }

    #[test]
    fn the_spec_env_overrides_the_image_env_in_place() {
        let img = image(&[], &[], None);
        let env = container_env(
            &img,
            &[
                ("A".to_owned(), "1".to_owned()),
                ("PATH".to_owned(), "/bin".to_owned()),
                ("A".to_owned(), "2".to_owned()),
            ],
        );
        assert_eq!(
            env,
            vec![
                ("PATH".to_owned(), "/bin".to_owned()),
                ("A".to_owned(), "2".to_owned())
            ]
        );
    }

    #[test]
    fn capabilities_follow_containerd() {
        let img = image(&[], &[], None);
        let root_net_admin = SecurityContext {
            add: strings(&["NET_ADMIN", "cap_net_raw"]),
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        };
        let id = Identity::resolve(&img, &root_net_admin, "c").expect("valid");
        assert_eq!(
            id.capabilities,
            DEFAULT_CAPABILITIES | CapabilitySet::NET_ADMIN
        );
        assert_eq!((id.uid, id.gid, id.no_new_privs), (0, 0, true));
        assert_eq!(DEFAULT_CAPABILITIES.bits().count_ones(), 14);

        let envoy = SecurityContext {
            drop: strings(&["all"]),
            run_as_group: Some(31415),
            run_as_non_root: true,
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        };
        let id = Identity::resolve(&image(&[], &[], Some("65532:65532")), &envoy, "envoy")
            .expect("valid");
        assert_eq!((id.uid, id.gid), (65532, 31415));
        assert!(id.capabilities.is_empty());
        assert_eq!(
            id.bounding_drops.len() as u32,
            kernel_capabilities().bits().count_ones()
        );
        // The same spec on an image without USER is refused, as the kubelet refuses it.
        assert!(matches!(
            Identity::resolve(&img, &envoy, "envoy"),
            Err(ContainerError::RunAsNonRoot { .. })
        ));

        let drop_one = SecurityContext {
            drop: strings(&["NET_RAW"]),
            ..SecurityContext::default()
        };
        let id = Identity::resolve(&img, &drop_one, "c").expect("valid");
        assert_eq!(
            id.capabilities,
            DEFAULT_CAPABILITIES - CapabilitySet::NET_RAW
        );

        let id = Identity::resolve(&img, &SecurityContext::privileged(), "c").expect("valid");
        assert_eq!(id.capabilities, all_capabilities());
        assert_eq!(
            id.bounding_drops.len() as u32,
            (kernel_capabilities() - all_capabilities())
                .bits()
                .count_ones()
        );

        let unknown = SecurityContext {
            add: strings(&["NET_WIZARD"]),
            ..SecurityContext::default()
        };
        assert!(Identity::resolve(&img, &unknown, "c").is_err());
        let named = image(&[], &[], Some("nonroot"));
        assert!(Identity::resolve(&named, &SecurityContext::default(), "c").is_err());
    }

    #[test]
    fn mount_paths_are_plain_relative_paths() {
        assert_eq!(
            relative_path("/srv/secrets/tlsauth"),
            Some(PathBuf::from("srv/secrets/tlsauth"))
        );
        assert_eq!(relative_path("/"), None);
        assert_eq!(relative_path("/srv/../etc"), None);
    }

    #[test]
    fn file_volumes_are_laid_out_as_the_kubelet_does() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("v");
        let files = vec![
            ("ca.crt".to_owned(), b"ca".to_vec()),
            ("sub/x".to_owned(), b"x".to_vec()),
        ];
        write_atomic_layout(&dir, &files, 0o400).expect("written");
        let data = std::fs::read_link(dir.join("..data")).expect("..data");
        assert!(data.to_string_lossy().starts_with(".."));
        assert_eq!(
            std::fs::read_link(dir.join("ca.crt")).expect("link"),
            Path::new("..data/ca.crt")
        );
        let meta = std::fs::metadata(dir.join("ca.crt")).expect("target");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o400);
        assert_eq!(std::fs::read(dir.join("sub/x")).expect("nested"), b"x");
    }
}
