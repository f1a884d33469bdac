//! Waiting for a lab to reach a state: poll a check until it holds, or fail the test naming
//! what never happened. A lab test never waits without a limit.

use std::time::{Duration, Instant};

/// How often [`wait_until`] checks.
pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `check` holds (polled every [`POLL`]), at most `limit`, else panics naming
/// `what`; the time it took.
pub fn wait_until(what: &str, limit: Duration, check: impl FnMut() -> bool) -> Duration {
    wait_until_every(what, limit, POLL, check)
}

/// [`wait_until`], polled every `every`: for a check that costs more than a look (a process
/// started, a request sent), so that waiting does not load the machine the test measures.
pub fn wait_until_every(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(every);
    }
    start.elapsed()
}
