//! The pod spec fields a container is started from, in Kubernetes' terms, and how
//! Kubernetes combines them with the image.

use super::*;

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
