//! The session's timers: one enum, one table, the earliest deadline wins (after quinn-proto's
//! `connection/timer.rs`). Control retransmissions are not here: each key state's
//! [`Reliable`](crate::reliable::Reliable) keeps its own.

use std::time::Instant;

/// One session timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// `hand-window` of the key negotiation in progress.
    HandWindow,
    /// Client: repeat `PUSH_REQUEST`; also the hand-window limit on getting a reply.
    PushRequest,
    /// `ping N`: nothing sent for N seconds, send a ping.
    KeepaliveSend,
    /// `ping-restart M`: nothing received for M seconds, end the session.
    KeepaliveRecv,
    /// `reneg-sec`: start a soft reset.
    Renegotiate,
    /// `tran-window`: drop the lame-duck key.
    LameDuck,
    /// Server: close after `AUTH_FAILED` had a moment to leave.
    Linger,
}

impl Timer {
    const ALL: [Timer; 7] = [
        Timer::HandWindow,
        Timer::PushRequest,
        Timer::KeepaliveSend,
        Timer::KeepaliveRecv,
        Timer::Renegotiate,
        Timer::LameDuck,
        Timer::Linger,
    ];

    const fn index(self) -> usize {
        self as usize
    }
}

/// Deadlines of the [`Timer`]s; `None` is stopped.
#[derive(Debug, Clone, Default)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer.index()] = Some(at);
    }

    pub(crate) fn stop(&mut self, timer: Timer) {
        self.deadlines[timer.index()] = None;
    }

    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer.index()]
    }

    /// Stops and returns the first timer (in [`Timer`] order) that has expired at `now`.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Option<Timer> {
        let timer = Timer::ALL
            .into_iter()
            .find(|t| self.get(*t).is_some_and(|at| at <= now))?;
        self.stop(timer);
        Some(timer)
    }

    /// The earliest deadline.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }
}
