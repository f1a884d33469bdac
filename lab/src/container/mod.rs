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

mod child;
mod identity;
mod spec;

use child::*;
use identity::*;
pub use identity::{all_capabilities, capability, ProcStatus, DEFAULT_CAPABILITIES};
pub use spec::{
    container_argv, container_env, ContainerSpec, SecurityContext, VolumeMount, VolumeSource,
};

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
mod tests;
