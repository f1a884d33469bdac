//! What the forked child does before `execve`: the mount-namespace steps of a new
//! container, or joining a running one, then the working directory and the identity.

use super::*;

/// What the forked child does before `execve`: start a container, or join one.
#[derive(Debug)]
pub(super) enum ChildPlan {
    Start(StartPlan),
    Exec(ExecPlan),
}

#[derive(Debug)]
pub(super) struct StartPlan {
    pub(super) netns: OwnedFd,
    pub(super) hostname: Vec<u8>,
    pub(super) root: CString,
    pub(super) steps: Vec<Step>,
    pub(super) tail: Tail,
}

#[derive(Debug)]
pub(super) struct ExecPlan {
    pub(super) namespaces: [(OwnedFd, LinkNameSpaceType); 3],
    pub(super) tail: Tail,
}

/// The common end of both plans: working directory, then identity.
#[derive(Debug)]
pub(super) struct Tail {
    pub(super) workdir: CString,
    pub(super) identity: Identity,
    /// The stderr log: where a failing step is named.
    pub(super) report: OwnedFd,
}

/// One mount-namespace setup step, with every path prepared in the parent.
#[derive(Debug)]
pub(super) enum Step {
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
    pub(super) fn run(&self) -> rustix::io::Result<()> {
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
    pub(super) fn describe(&self) -> (&'static [u8], &CStr) {
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
    pub(super) fn run(&self) -> std::io::Result<()> {
        match self {
            ChildPlan::Start(plan) => plan.run(),
            ChildPlan::Exec(plan) => plan.run(),
        }
    }
}

impl StartPlan {
    #[allow(unsafe_code)]
    pub(super) fn run(&self) -> std::io::Result<()> {
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
    pub(super) fn run(&self) -> std::io::Result<()> {
        for (fd, kind) in &self.namespaces {
            let ns = rustix::thread::move_into_link_name_space(fd.as_fd(), Some(*kind));
            check(&self.tail.report, b"setns into the container", None, ns)?;
        }
        self.tail.run()
    }
}

impl Tail {
    pub(super) fn run(&self) -> std::io::Result<()> {
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
pub(super) fn check(
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
pub(super) fn spawn_in(cmd: &mut Command, plan: ChildPlan) -> std::io::Result<std::process::Child> {
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
pub(super) fn command(
    argv: &[String],
    env: &[(String, String)],
    stdout: File,
    stderr: File,
) -> Command {
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
pub(super) fn setup_steps(
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
pub(super) fn write_atomic_layout(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    mode: u32,
) -> Result<(), LabError> {
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
pub(super) fn relative_path(path: &str) -> Option<PathBuf> {
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
pub(super) fn cstring(bytes: &[u8]) -> CString {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).unwrap_or_default()
}

pub(super) fn set_mode(path: &Path, mode: u32) -> Result<(), LabError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| LabError::io(path, e))
}
