//! The wall clock the sessions take as an argument.
//!
//! `protocol` never reads a clock: the drivers pass a monotonic [`Instant`](std::time::Instant)
//! to every call and, where tls-auth / tls-crypt packet ids need it (`poll_transmit`), the
//! wall-clock time in seconds from [`unix_now`].

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch; 0 on a clock set before 1970.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn unix_now_is_after_2020() {
        assert!(super::unix_now() > 1_577_836_800);
    }
}
