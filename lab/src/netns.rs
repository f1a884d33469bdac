//! A private network namespace that cleans up after itself.
//!
//! [`Netns::new`] runs `ip netns add vpnt-<pid>-<n>` and brings `lo` up inside it. Programs
//! started through [`Netns::spawn`] run under `ip netns exec` (which `exec`s the program, so the
//! PID we hold is the program's own). [`Netns::run_in`] runs a closure on a fresh thread that
//! has entered the namespace with setns(2), so the test's own sockets live there too.
//!
//! On drop - including while a test unwinds from a panic - every spawned process gets SIGTERM,
//! then SIGKILL if it has not exited within [`STOP_GRACE`]; any process still inside the
//! namespace (e.g. a child of a spawned program) is killed by PID; then the namespace is deleted.
//! A test binary killed outright cannot run drops, so [`Netns::new`] also deletes namespaces of
//! this lab whose creating process no longer exists.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use crate::LabError;

/// Prefix of every namespace the lab creates.
pub const NAME_PREFIX: &str = "vpnt-";

/// How long a process gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace owned by a test; see the module docs.
#[derive(Debug)]
pub struct Netns {
    name: String,
    children: Mutex<HashMap<u32, Child>>,
}

impl Netns {
    /// Creates a namespace with a unique name and brings its loopback up.
    pub fn new() -> Result<Self, LabError> {
        Self::with_prefix(NAME_PREFIX)
    }

    /// Like [`Netns::new`], with `prefix` instead of [`NAME_PREFIX`] (`<prefix><pid>-<n>`),
    /// for a test whose namespaces must be told apart from the others'. Stale ones are swept
    /// by the next namespace made with the same prefix.
    pub fn with_prefix(prefix: &str) -> Result<Self, LabError> {
        sweep_stale(prefix);
        let name = format!(
            "{prefix}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        run_checked(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on, Drop deletes the namespace even if bringing lo up fails.
        let ns = Self {
            name,
            children: Mutex::new(HashMap::new()),
        };
        ns.run(["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (as for `ip netns exec NAME`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `Command` that runs `program` inside the namespace (`ip netns exec NAME program`).
    /// Add arguments, working directory and stdio, then hand it to [`Netns::spawn`] or run it
    /// to completion yourself.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Spawns `cmd` (normally from [`Netns::command`]) and tracks it; returns its PID. The
    /// process is stopped when the namespace is dropped, or earlier with [`Netns::stop`].
    pub fn spawn(&self, cmd: &mut Command) -> Result<u32, LabError> {
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            command: describe(cmd),
            source,
        })?;
        let pid = child.id();
        self.children().insert(pid, child);
        Ok(pid)
    }

    /// Runs a program inside the namespace to completion and returns its output; an
    /// unsuccessful exit status is an error carrying stderr.
    pub fn run<I, S>(&self, argv: I) -> Result<Output, LabError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(argv);
        run_checked(&mut cmd)
    }

    /// The first IPv4 address and its prefix length on device `dev` in this namespace (as
    /// `ip -4 -o addr show dev DEV` lists it); `None` when it has none.
    pub fn ipv4_on(&self, dev: &str) -> Result<Option<(std::net::Ipv4Addr, u8)>, LabError> {
        let out = self.run(["ip", "-4", "-o", "addr", "show", "dev", dev])?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|cidr| cidr.split_once('/'))
            .and_then(|(a, len)| Some((a.parse().ok()?, len.parse().ok()?))))
    }

    /// Runs `f` on a new thread that has entered this namespace with setns(2) and returns its
    /// result. Sockets the closure opens belong to the namespace. A panic in `f` is re-raised
    /// in the caller (so the test fails with the original message and this guard still drops).
    pub fn run_in<T, F>(&self, f: F) -> Result<T, LabError>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).map_err(|source| LabError::io(&path, source))?;
        std::thread::scope(|scope| {
            let handle = scope.spawn(move || {
                move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network)).map_err(
                    |err| LabError::EnterNamespace {
                        name: self.name.clone(),
                        source: err.into(),
                    },
                )?;
                drop(file);
                Ok(f())
            });
            match handle.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Returns the exit status of a tracked process if it has exited (it stays tracked).
    pub fn try_wait(&self, pid: u32) -> Option<ExitStatus> {
        self.children()
            .get_mut(&pid)
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// Stops one tracked process (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and forgets it.
    pub fn stop(&self, pid: u32) {
        let child = self.children().remove(&pid);
        if let Some(mut child) = child {
            stop_child(&mut child);
        }
    }

    /// Creates a veth pair joining two lab namespaces: `a_if` in `a`, `b_if` in `b`, both
    /// brought up. No address is assigned; the root namespace never sees either end.
    pub fn veth_pair(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<(), LabError> {
        // Created from inside `a`, with the peer end moved straight into `b`.
        a.run([
            "ip", "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name,
        ])?;
        a.run(["ip", "link", "set", a_if, "up"])?;
        b.run(["ip", "link", "set", b_if, "up"])?;
        Ok(())
    }

    fn children(&self) -> MutexGuard<'_, HashMap<u32, Child>> {
        // A panic while holding the lock must not stop the cleanup in Drop.
        self.children.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let children: Vec<Child> = self.children().drain().map(|(_, c)| c).collect();
        for mut child in children {
            stop_child(&mut child);
        }
        destroy(&self.name);
    }
}

/// Kills whatever still runs inside namespace `name` and deletes it.
fn destroy(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Some(pid) = pid.parse().ok().and_then(Pid::from_raw) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// Deletes `<prefix><pid>-<n>` namespaces whose creating process is gone (a test binary that
/// was killed before its guards could drop).
fn sweep_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some((pid, counter)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), counter.parse::<u32>()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            destroy(&name);
        }
    }
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`]; reaps it.
pub(crate) fn stop_child(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
        let _ = kill_process(pid, Signal::TERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `cmd` (stdin closed) to its end; its output if it exited 0, else the command, its
/// status and its stderr.
pub(crate) fn run_checked(cmd: &mut Command) -> Result<Output, LabError> {
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            command: describe(cmd),
            source,
        })?;
    if !output.status.success() {
        return Err(LabError::CommandFailed {
            command: describe(cmd),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(output)
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
