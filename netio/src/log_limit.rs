//! The log limiter of every path a flood can drive: at most one line per interval for an
//! event that may repeat thousands of times a second (a bogus first packet, an eviction, a
//! failed accept, a spoofed packet), with the number of events left out since the previous
//! line. The events themselves are counted in the metrics either way.

use std::time::{Duration, Instant};

/// At most one log line per interval for one kind of event, with the number of events left
/// unlogged since the previous line.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

/// The interval of our limiters: a line a second per kind of event.
pub const LOG_EVERY: Duration = Duration::from_secs(1);

impl LogLimiter {
    /// At most one line per `every`.
    pub const fn new(every: Duration) -> LogLimiter {
        LogLimiter {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// An event at `now`: `Some(n)` to write its line, saying `n` events since the last line
    /// were not logged; `None` to stay silent (this one is then counted in the next `n`).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_limiter_writes_one_line_per_interval_with_the_count_left_out() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = LogLimiter::new(Duration::from_secs(1));
        assert_eq!(l.allow(at(0)), Some(0));
        assert_eq!(l.allow(at(10)), None);
        assert_eq!(l.allow(at(999)), None);
        assert_eq!(l.allow(at(1000)), Some(2));
        assert_eq!(l.allow(at(1500)), None);
        assert_eq!(l.allow(at(5000)), Some(1));
        assert_eq!(l.allow(at(5001)), None);
        // Time never goes backwards here, but a stale `now` only stays silent.
        assert_eq!(l.allow(at(4000)), None);
    }
}
