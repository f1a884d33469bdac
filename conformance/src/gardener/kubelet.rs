//! The part of a kubelet a pod replay needs: probes run at their Kubernetes periods, with
//! Kubernetes' defaults and threshold rules, and a record of every result.
//!
//! A probe is run first `initial_delay` after the container started, then every `period`; a
//! run that takes longer than `timeout` fails. Readiness starts false and turns true after
//! `success_threshold` successes in a row, false again after `failure_threshold` failures in a
//! row; a liveness probe's `failure_threshold` failures in a row mean a restart (recorded, not
//! done: the test decides what a restart means for it).
//!
//! The prober runs on a scoped thread ([`std::thread::Scope`]) so the probe action may borrow
//! the container it probes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

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
