//! The part of a kubelet a pod replay needs: containers started, init containers run to their
//! end, probes run at their Kubernetes periods, with Kubernetes' defaults and threshold rules,
//! and a record of every result.
//!
//! A probe is run first `initial_delay` after the container started, then every `period`; a
//! run that takes longer than `timeout` fails. Readiness starts false and turns true after
//! `success_threshold` successes in a row, false again after `failure_threshold` failures in a
//! row; a liveness probe's `failure_threshold` failures in a row mean a restart (recorded, not
//! done: the test decides what a restart means for it).
//!
//! The prober runs on a scoped thread ([`std::thread::Scope`]) so the probe action may borrow
//! the container it probes. The actions are a pod spec's: [`exec_probe`] (a command in the
//! container), [`tcp_probe`] (a connection), [`http_probe`] (`httpGet`), each sent from where
//! the kubelet sends it.
//!
//! [`init`], [`start`] and [`assert_running`] are what a test needs of a kubelet's container
//! handling: they panic, naming the pod and container, when a container does not do its part.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Deref;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use lab::container::{Container, ContainerSpec, Pod};
use lab::image::Image;

use super::verdict::explain;
use crate::netns::Netns;

/// Kubernetes' default probe period.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// Kubernetes' default probe timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Kubernetes' default failure threshold.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// A probe's timing, as in a pod spec (the action is the caller's closure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds`.
    pub initial_delay: Duration,
    /// `periodSeconds`.
    pub period: Duration,
    /// `timeoutSeconds`.
    pub timeout: Duration,
    /// `successThreshold`.
    pub success_threshold: u32,
    /// `failureThreshold`.
    pub failure_threshold: u32,
}

impl Timing {
    /// Kubernetes' defaults with this initial delay.
    pub const fn after(initial_delay: Duration) -> Timing {
        Timing {
            initial_delay,
            period: DEFAULT_PERIOD,
            timeout: DEFAULT_TIMEOUT,
            success_threshold: 1,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
        }
    }
}

/// One probe run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// When it started, from the container's start.
    pub at: Duration,
    /// Whether it passed (exit 0, or a connection, within the timeout).
    pub passed: bool,
    /// What it printed, or why it failed.
    pub output: String,
}

/// A running prober; stops when dropped (at the end of its scope at the latest).
#[derive(Debug)]
pub struct Prober<'scope> {
    name: String,
    timing: Timing,
    runs: Arc<Mutex<Vec<Run>>>,
    stop: Arc<AtomicBool>,
    thread: Option<ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Prober<'scope> {
    /// Starts probing on a thread of `scope`: `probe(timeout)` is one run (`Ok(output)` passes,
    /// `Err(why)` fails); `started` is when the container started.
    pub fn start<'env, F>(
        scope: &'scope Scope<'scope, 'env>,
        name: &str,
        timing: Timing,
        started: Instant,
        probe: F,
    ) -> Prober<'scope>
    where
        F: Fn(Duration) -> Result<String, String> + Send + 'scope,
    {
        let runs = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let runs = Arc::clone(&runs);
            let stop = Arc::clone(&stop);
            scope.spawn(move || {
                let mut next = started + timing.initial_delay;
                while sleep_until(next, &stop) {
                    let at = next.duration_since(started);
                    let begun = Instant::now();
                    let result = probe(timing.timeout);
                    let took = begun.elapsed();
                    let (passed, output) = match result {
                        Ok(out) if took <= timing.timeout => (true, out),
                        Ok(out) => (false, format!("timed out after {took:?}: {out}")),
                        Err(why) => (false, why),
                    };
                    lock(&runs).push(Run { at, passed, output });
                    next += timing.period;
                }
            })
        };
        Prober {
            name: name.to_owned(),
            timing,
            runs,
            stop,
            thread: Some(thread),
        }
    }

    /// Every run so far.
    pub fn runs(&self) -> Vec<Run> {
        lock(&self.runs).clone()
    }

    /// When the container first became Ready by this (readiness) probe: the run that
    /// completed `success_threshold` successes in a row.
    pub fn ready_at(&self) -> Option<Duration> {
        streak_end(&self.runs(), true, self.timing.success_threshold)
    }

    /// When this (liveness) probe first asked for a restart: the run that completed
    /// `failure_threshold` failures in a row.
    pub fn restart_at(&self) -> Option<Duration> {
        streak_end(&self.runs(), false, self.timing.failure_threshold)
    }

    /// Whether the latest run passed (`None` before the first).
    pub fn last_passed(&self) -> Option<bool> {
        lock(&self.runs).last().map(|r| r.passed)
    }

    /// Waits until `pred` holds for the runs or `timeout` passes; the runs at that point.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&[Run]) -> bool) -> Vec<Run> {
        let deadline = Instant::now() + timeout;
        loop {
            let runs = self.runs();
            if pred(&runs) || Instant::now() >= deadline {
                return runs;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The runs as lines, for an assertion message.
    pub fn report(&self) -> String {
        let mut out = format!("{} probe runs:\n", self.name);
        for r in self.runs() {
            out.push_str(&format!(
                "  {:>6.1}s {} {}\n",
                r.at.as_secs_f64(),
                if r.passed { "pass" } else { "FAIL" },
                r.output.trim()
            ));
        }
        out
    }
}

impl Drop for Prober<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An exec probe: `argv` in the container `container` gives at each run (the one running now,
/// where the kubelet replaces a container); exit 0 passes, its stdout is the output.
pub fn exec_probe<'c, C>(
    container: impl Fn() -> C + Send + 'c,
    argv: &'static [&'static str],
) -> impl Fn(Duration) -> Result<String, String> + Send + 'c
where
    C: Deref<Target = Container> + 'c,
{
    move |timeout| match container().exec(argv, timeout) {
        Ok(out) if out.success() => Ok(out.stdout),
        Ok(out) => Err(format!("{:?}: {}{}", out.status, out.stdout, out.stderr)),
        Err(e) => Err(e.to_string()),
    }
}

/// A TCP probe from the node (`node`, a namespace standing in for it) to the pod's `addr`: a
/// connection passes.
pub fn tcp_probe(
    node: &Netns,
    addr: SocketAddr,
) -> impl Fn(Duration) -> Result<String, String> + Send + '_ {
    move |timeout| {
        node.run_in(|| TcpStream::connect_timeout(&addr, timeout))
            .map_err(|e| e.to_string())?
            .map(|_| "connected".to_owned())
            .map_err(|e| e.to_string())
    }
}

/// An HTTP probe (`httpGet` of `path`) from the node (`node`) to the pod's `addr`: a status
/// of 200-399 passes; the output is the status and the body.
pub fn http_probe<'a>(
    node: &'a Netns,
    addr: SocketAddr,
    path: &'a str,
) -> impl Fn(Duration) -> Result<String, String> + Send + 'a {
    move |timeout| match http_get(node, addr, path, timeout)? {
        (code @ 200..=399, body) => Ok(format!("{code} {body}")),
        (code, body) => Err(format!("{code} {body}")),
    }
}

/// Runs an init container of `pod` to its end, at most `limit`: it must exit 0 and say what it
/// did on stderr, where our programs log (Gardener's blackbox probe reads an init container's
/// last log line); that log. A failure shows the end of every log in `logs`.
pub fn init(
    pod: &Pod,
    image: &Image,
    spec: &ContainerSpec,
    limit: Duration,
    logs: &[&Path],
) -> String {
    let c = start(pod, image, spec, logs);
    let status = c
        .wait(limit)
        .unwrap_or_else(|e| panic!("{}/{}: {}", pod.name(), spec.name, explain(&e, logs)));
    let log = c.stderr();
    assert!(
        status.success(),
        "{}/{} exited {status}: {}{log}",
        pod.name(),
        spec.name,
        c.stdout()
    );
    assert!(
        !log.trim().is_empty(),
        "{}/{} logged nothing",
        pod.name(),
        spec.name
    );
    log
}

/// Starts a container of `pod`; a failure shows the end of every log in `logs`.
pub fn start(pod: &Pod, image: &Image, spec: &ContainerSpec, logs: &[&Path]) -> Container {
    pod.start(image, spec)
        .unwrap_or_else(|e| panic!("{}/{}: {}", pod.name(), spec.name, explain(&e, logs)))
}

/// Panics, with its output, if `c` has exited.
pub fn assert_running(c: &Container) {
    assert!(
        c.try_wait().is_none(),
        "{}/{} exited: {:?}\n{}{}",
        c.pod().name(),
        c.name(),
        c.try_wait(),
        c.stdout(),
        c.stderr()
    );
}

/// `GET path` from `ns` to `addr`: the status code and the body.
fn http_get(
    ns: &Netns,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    ns.run_in(|| {
        let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| e.to_string())?;
        let code = text
            .get(9..12)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not HTTP: {text:?}"))?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        Ok((code, body.trim().to_owned()))
    })
    .map_err(|e| e.to_string())?
}

/// Sleeps until `when` in short steps; false if `stop` was set meanwhile.
fn sleep_until(when: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= when {
            return true;
        }
        std::thread::sleep((when - now).min(Duration::from_millis(50)));
    }
}

/// The time of the run that first completes `n` runs in a row with `passed`.
fn streak_end(runs: &[Run], passed: bool, n: u32) -> Option<Duration> {
    let mut streak = 0;
    for r in runs {
        streak = if r.passed == passed { streak + 1 } else { 0 };
        if streak >= n.max(1) {
            return Some(r.at);
        }
    }
    None
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(at: u64, passed: bool) -> Run {
        Run {
            at: Duration::from_secs(at),
            passed,
            output: String::new(),
        }
    }

    #[test]
    fn streaks_follow_kubernetes_thresholds() {
        let runs = [
            run(5, true),
            run(15, false),
            run(25, false),
            run(35, true),
            run(45, false),
            run(55, false),
            run(65, false),
        ];
        assert_eq!(streak_end(&runs, true, 1), Some(Duration::from_secs(5)));
        assert_eq!(streak_end(&runs, false, 3), Some(Duration::from_secs(65)));
        assert_eq!(streak_end(&runs[..6], false, 3), None);
    }

    #[test]
    fn a_prober_runs_at_its_period_and_stops_with_its_scope() {
        let started = Instant::now();
        let timing = Timing {
            initial_delay: Duration::from_millis(100),
            period: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
            success_threshold: 1,
            failure_threshold: 2,
        };
        let calls = AtomicBool::new(false);
        std::thread::scope(|s| {
            let p = Prober::start(s, "t", timing, started, |_| {
                // Passes once, then fails (slow the second time: a timeout).
                if calls.swap(true, Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(80));
                    Ok("slow".into())
                } else {
                    Ok("fine".into())
                }
            });
            let runs = p.wait_until(Duration::from_secs(5), |r| r.len() >= 3);
            assert!(
                runs[0].passed && !runs[1].passed && !runs[2].passed,
                "{runs:?}"
            );
            assert!(runs[1].output.starts_with("timed out"), "{runs:?}");
            assert_eq!(runs[0].at, Duration::from_millis(100));
            assert_eq!(runs[2].at, Duration::from_millis(300));
            assert_eq!(p.ready_at(), Some(Duration::from_millis(100)));
            assert_eq!(p.restart_at(), Some(Duration::from_millis(300)));
        });
    }
}
