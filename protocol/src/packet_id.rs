//! Replay protection for packet ids (`packet_id.c`), shared by the data channel (short form:
//! 32-bit id, time 0) and tls-auth / tls-crypt (long form: id and `net_time`).
//!
//! Semantics of `--replay-window n t` (default 64 packets, 15 seconds):
//!
//! * id 0 is always rejected (the first id a sender uses is 1);
//! * a `net_time` older than the newest one seen is rejected; a newer one starts a new epoch
//!   and is accepted whatever its id;
//! * within an epoch an id above the highest seen is accepted and slides the window; an older
//!   id is accepted once if it is less than `n` behind and its slot has not expired;
//! * a slot expires when the newest packet at or behind it arrived more than `t` seconds ago
//!   (checked at most once per second, as upstream does), so very late packets are rejected
//!   even inside the window.
//!
//! The caller checks a packet only after it has been authenticated, and the clock is the
//! caller's monotonic seconds: this module never reads time itself.

/// Default `--replay-window` size in packets.
pub const DEFAULT_SEQ_BACKTRACK: u32 = 64;
/// Default `--replay-window` time in seconds.
pub const DEFAULT_TIME_BACKTRACK: u32 = 15;
/// Upper bound on the window size OpenVPN accepts (`MAX_SEQ_BACKTRACK`).
pub const MAX_SEQ_BACKTRACK: u32 = 65536;

/// Why a packet id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Id 0 is never valid.
    #[error("packet id 0 is never valid")]
    ZeroId,
    /// The packet's `net_time` is older than the newest epoch seen.
    #[error("packet time {time} is older than the current {current}")]
    TimeBackwards {
        /// The packet's time.
        time: u32,
        /// The newest time seen.
        current: u32,
    },
    /// The id is further behind the highest id than the window reaches.
    #[error("packet id {id} is {behind} behind the highest {highest}, beyond the window")]
    TooOld {
        /// The packet's id.
        id: u32,
        /// The highest id seen.
        highest: u32,
        /// How far behind it is.
        behind: u32,
    },
    /// The id was seen before, or its slot expired.
    #[error("packet id {id} was already seen or has expired")]
    Replayed {
        /// The packet's id.
        id: u32,
    },
}

/// Slot value: id not seen yet.
const UNSEEN: u64 = 0;
/// Slot value: expired; rejected like a seen id.
const EXPIRED: u64 = 1;

/// The receive side of a packet-id stream (`struct packet_id_rec`).
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    time_backtrack: u64,
    /// Newest epoch time seen (0 in short form).
    time: u32,
    /// Highest id seen in the current epoch; 0 before the first packet.
    highest: u32,
    /// `slots[(head + back) % len]` holds the state of id `highest - back`: `UNSEEN`,
    /// `EXPIRED`, or the arrival second plus 2 (so both markers stay distinct from times).
    slots: Box<[u64]>,
    head: usize,
    /// How many slots hold ids of this epoch (grows up to `slots.len()`).
    filled: usize,
    last_reap: Option<u64>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow::new(DEFAULT_SEQ_BACKTRACK, DEFAULT_TIME_BACKTRACK)
    }
}

impl ReplayWindow {
    /// A window of `seq_backtrack` packets (clamped to 1..=[`MAX_SEQ_BACKTRACK`]) whose slots
    /// expire after `time_backtrack` seconds.
    pub fn new(seq_backtrack: u32, time_backtrack: u32) -> ReplayWindow {
        let n = seq_backtrack.clamp(1, MAX_SEQ_BACKTRACK) as usize;
        ReplayWindow {
            time_backtrack: u64::from(time_backtrack),
            time: 0,
            highest: 0,
            slots: vec![UNSEEN; n].into_boxed_slice(),
            head: 0,
            filled: 0,
            last_reap: None,
        }
    }

    /// The highest id accepted in the current epoch (0 before the first).
    pub fn highest(&self) -> u32 {
        self.highest
    }

    /// Checks `(id, time)` of an authenticated packet that arrived at `now` (caller's monotonic
    /// seconds) and records it when accepted. Short-form ids pass `time = 0`.
    pub fn check_and_record(&mut self, id: u32, time: u32, now: u64) -> Result<(), ReplayError> {
        self.test(id, time, now)?;
        self.record(id, time, now);
        Ok(())
    }

    /// Checks without recording.
    pub fn test(&mut self, id: u32, time: u32, now: u64) -> Result<(), ReplayError> {
        if id == 0 {
            return Err(ReplayError::ZeroId);
        }
        if time < self.time {
            return Err(ReplayError::TimeBackwards {
                time,
                current: self.time,
            });
        }
        if time > self.time || id > self.highest {
            return Ok(());
        }
        self.reap(now);
        let behind = self.highest - id;
        if behind as usize >= self.filled {
            return Err(ReplayError::TooOld {
                id,
                highest: self.highest,
                behind,
            });
        }
        match self.slots[self.index(behind as usize)] {
            UNSEEN => Ok(()),
            _ => Err(ReplayError::Replayed { id }),
        }
    }

    fn record(&mut self, id: u32, time: u32, now: u64) {
        let stamp = now.saturating_add(2);
        if time > self.time {
            self.time = time;
            self.reset(id, stamp);
            return;
        }
        if id > self.highest {
            let ahead = (id - self.highest) as usize;
            if ahead >= self.slots.len() {
                self.reset(id, stamp);
                return;
            }
            // Slide: the ids skipped over become unseen slots.
            for _ in 0..ahead {
                self.head = (self.head + self.slots.len() - 1) % self.slots.len();
                self.slots[self.head] = UNSEEN;
            }
            self.slots[self.head] = stamp;
            self.filled = (self.filled + ahead).min(self.slots.len());
            self.highest = id;
        } else {
            let i = self.index((self.highest - id) as usize);
            self.slots[i] = stamp;
        }
    }

    fn reset(&mut self, id: u32, stamp: u64) {
        self.slots.fill(UNSEEN);
        self.head = 0;
        self.slots[0] = stamp;
        self.filled = 1;
        self.highest = id;
    }

    fn index(&self, behind: usize) -> usize {
        (self.head + behind) % self.slots.len()
    }

    /// Expires, from the newest backwards, every slot at or behind the first seen one that is
    /// older than the time backtrack (`packet_id_reap`). Runs at most once per second.
    fn reap(&mut self, now: u64) {
        if self.time_backtrack == 0 || self.last_reap.is_some_and(|t| now < t + 1) {
            return;
        }
        self.last_reap = Some(now);
        let mut expire = false;
        for back in 0..self.filled {
            let i = self.index(back);
            let slot = self.slots[i];
            if slot == EXPIRED {
                break;
            }
            if !expire && slot != UNSEEN && slot - 2 + self.time_backtrack < now {
                expire = true;
            }
            if expire {
                self.slots[i] = EXPIRED;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_order() {
        let mut w = ReplayWindow::default();
        assert_eq!(w.check_and_record(0, 0, 0), Err(ReplayError::ZeroId));
        assert_eq!(w.check_and_record(1, 0, 0), Ok(()));
        assert_eq!(
            w.check_and_record(1, 0, 0),
            Err(ReplayError::Replayed { id: 1 })
        );
        assert_eq!(w.check_and_record(5, 0, 0), Ok(()));
        // 2..4 were skipped: each is accepted exactly once.
        for id in [3, 2, 4] {
            assert_eq!(w.check_and_record(id, 0, 0), Ok(()));
            assert!(w.check_and_record(id, 0, 0).is_err());
        }
        assert_eq!(w.highest(), 5);
    }

    #[test]
    fn ids_skipped_before_the_first_packet_are_unseen() {
        // Upstream slides the window from id 0, so ids below the first one received are
        // still acceptable once (short form).
        let mut w = ReplayWindow::default();
        w.check_and_record(10, 0, 0).unwrap();
        for id in [7, 9, 1] {
            assert_eq!(w.check_and_record(id, 0, 0), Ok(()));
        }
        assert!(w.check_and_record(9, 0, 0).is_err());
    }

    #[test]
    fn window_edge() {
        let mut w = ReplayWindow::new(64, 15);
        for id in 1..=100 {
            if id != 37 && id != 36 {
                w.check_and_record(id, 0, 0).unwrap();
            }
        }
        // 100 - 37 = 63 behind: the last slot inside a 64 window.
        assert_eq!(w.check_and_record(37, 0, 0), Ok(()));
        assert!(matches!(
            w.check_and_record(36, 0, 0),
            Err(ReplayError::TooOld { behind: 64, .. })
        ));
    }

    #[test]
    fn jump_beyond_window_resets() {
        let mut w = ReplayWindow::new(8, 15);
        w.check_and_record(1, 0, 0).unwrap();
        w.check_and_record(100, 0, 0).unwrap();
        assert!(matches!(
            w.check_and_record(99, 0, 0),
            Err(ReplayError::TooOld { .. })
        ));
        w.check_and_record(101, 0, 0).unwrap();
        assert_eq!(
            w.check_and_record(99, 0, 0),
            Err(ReplayError::TooOld {
                id: 99,
                highest: 101,
                behind: 2
            })
        );
    }

    #[test]
    fn long_form_time() {
        let mut w = ReplayWindow::default();
        w.check_and_record(5, 1000, 0).unwrap();
        assert!(matches!(
            w.check_and_record(6, 999, 0),
            Err(ReplayError::TimeBackwards { .. })
        ));
        // A newer time starts a new epoch even with a low id.
        w.check_and_record(1, 1001, 0).unwrap();
        assert!(w.check_and_record(1, 1001, 0).is_err());
        w.check_and_record(2, 1001, 0).unwrap();
    }

    #[test]
    fn late_packets_expire() {
        let mut w = ReplayWindow::new(64, 15);
        w.check_and_record(1, 0, 100).unwrap();
        w.check_and_record(3, 0, 100).unwrap();
        // Id 2 is inside the window; 20 s later the slot has expired.
        assert_eq!(
            w.check_and_record(2, 0, 120),
            Err(ReplayError::Replayed { id: 2 })
        );
        // New ids are still accepted.
        w.check_and_record(4, 0, 120).unwrap();
    }

    #[test]
    fn a_jump_of_exactly_the_window_size_resets() {
        let mut w = ReplayWindow::new(8, 15);
        w.check_and_record(1, 0, 0).unwrap();
        w.check_and_record(9, 0, 0).unwrap();
        // Ids 2..8 were never seen, but the window restarted at 9 (upstream's reset when the
        // jump is the window's size or more): they are too old, not unseen.
        assert!(matches!(
            w.test(2, 0, 0),
            Err(ReplayError::TooOld { behind: 7, .. })
        ));
    }

    #[test]
    fn a_slot_expires_strictly_after_the_backtrack_and_is_reaped_each_second() {
        let mut w = ReplayWindow::new(64, 1);
        w.check_and_record(1, 0, 0).unwrap();
        w.check_and_record(3, 0, 0).unwrap();
        // Received at 0 with a 1 s backtrack: still good at 1 (expiry is `+ backtrack < now`)...
        assert_eq!(w.test(2, 0, 1), Ok(()));
        // ...expired at 2, which is one second after the last reap, so the reap runs.
        assert_eq!(w.test(2, 0, 2), Err(ReplayError::Replayed { id: 2 }));
        // Much later, the reap still runs whenever a second has passed.
        w.check_and_record(5, 0, 10).unwrap();
        w.check_and_record(7, 0, 10).unwrap();
        assert_eq!(w.test(6, 0, 11), Ok(()));
        assert_eq!(w.test(6, 0, 12), Err(ReplayError::Replayed { id: 6 }));
    }

    #[test]
    fn without_a_time_backtrack_nothing_expires() {
        let mut w = ReplayWindow::new(64, 0);
        w.check_and_record(1, 0, 0).unwrap();
        w.check_and_record(3, 0, 0).unwrap();
        assert_eq!(w.check_and_record(2, 0, 1_000), Ok(()));
    }
}
