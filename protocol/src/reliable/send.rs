//! Send side: numbering, the in-flight window, retransmission timers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::ids::MessageId;

use super::{
    is_after, Message, ReliableError, N_ACK_RETRANSMIT, RETRANSMIT_TIMEOUT_CAP,
    TLS_RELIABLE_N_SEND_BUFFERS,
};

/// The messages of one key generation that this side sent and the peer has not acknowledged
/// yet (`ks->send_reliable`).
///
/// Messages get consecutive ids from 0. At most [`TLS_RELIABLE_N_SEND_BUFFERS`] ids are in
/// flight: a new one may be queued only while `next_id - lowest_unacked < 6`, so one lost
/// message stalls the window until it is acknowledged.
///
/// Each message is first due when queued. When [`poll_transmit`](Self::poll_transmit) yields
/// it, its next try is `now + timeout` and its timeout doubles (`tls-timeout`, default 2 s:
/// sent at t, resent at t+2, t+6, t+14, ...). It is due early ("fast retransmit") once ACKs
/// naming [`N_ACK_RETRANSMIT`] higher ids have arrived since it was last sent.
#[derive(Debug, Clone)]
pub struct ReliableSend {
    initial_timeout: Duration,
    next_id: MessageId,
    /// In id order (wrap-aware), which is queueing order.
    entries: VecDeque<SendEntry>,
}

#[derive(Debug, Clone)]
struct SendEntry {
    id: MessageId,
    tag: u8,
    payload: Bytes,
    next_try: Instant,
    timeout: Duration,
    /// ACKed ids above this one seen since it was last sent (`n_acks`).
    n_acks: u32,
}

impl ReliableSend {
    /// An empty send side whose messages first time out after `tls_timeout`.
    pub fn new(tls_timeout: Duration) -> ReliableSend {
        ReliableSend {
            initial_timeout: tls_timeout,
            next_id: MessageId(0),
            entries: VecDeque::with_capacity(TLS_RELIABLE_N_SEND_BUFFERS),
        }
    }

    /// A send side whose next id is `next` (for exercising the id wrap).
    #[cfg(test)]
    pub(crate) fn starting_at(next: MessageId, tls_timeout: Duration) -> ReliableSend {
        ReliableSend {
            next_id: next,
            ..ReliableSend::new(tls_timeout)
        }
    }

    /// The id the next queued message gets.
    pub fn next_id(&self) -> MessageId {
        self.next_id
    }

    /// The lowest id still waiting for its ACK.
    pub fn lowest_unacked(&self) -> Option<MessageId> {
        self.entries.front().map(|e| e.id)
    }

    /// Number of messages waiting for their ACK.
    pub fn in_flight(&self) -> usize {
        self.entries.len()
    }

    /// How many more messages may be queued now (`reliable_get_num_output_sequenced_available`).
    pub fn window_available(&self) -> usize {
        let used = match self.lowest_unacked() {
            Some(low) => self.next_id.0.wrapping_sub(low.0) as usize,
            None => 0,
        };
        TLS_RELIABLE_N_SEND_BUFFERS.saturating_sub(used)
    }

    /// Whether every queued message has been acknowledged.
    pub fn all_acked(&self) -> bool {
        self.entries.is_empty()
    }

    /// Queues one message; it is due at once. `tag` is opaque here (the session stores the
    /// opcode in it). Fails when the window is full.
    pub fn queue(
        &mut self,
        tag: u8,
        payload: Bytes,
        now: Instant,
    ) -> Result<MessageId, ReliableError> {
        if self.window_available() == 0 {
            return Err(ReliableError::SendWindowFull {
                next: self.next_id,
                lowest_unacked: self.lowest_unacked().unwrap_or(self.next_id),
            });
        }
        let id = self.next_id;
        self.next_id = MessageId(id.0.wrapping_add(1));
        self.entries.push_back(SendEntry {
            id,
            tag,
            payload,
            next_try: now,
            timeout: self.initial_timeout,
            n_acks: 0,
        });
        Ok(id)
    }

    /// Cuts the front of `stream` into messages of at most `max_payload` bytes (at least 1)
    /// and queues as many as the window allows; the rest stays in `stream`. Returns the
    /// number of messages queued.
    pub fn queue_segments(
        &mut self,
        tag: u8,
        stream: &mut BytesMut,
        max_payload: usize,
        now: Instant,
    ) -> usize {
        let max_payload = max_payload.max(1);
        let mut queued = 0;
        while !stream.is_empty() && self.window_available() > 0 {
            let chunk = stream.split_to(max_payload.min(stream.len())).freeze();
            if self.queue(tag, chunk, now).is_err() {
                break;
            }
            queued += 1;
        }
        queued
    }

    /// Processes the ACK array of a received packet: acknowledged messages are dropped (ids
    /// unknown or already acknowledged are ignored), and every id counts towards the fast
    /// retransmit of the lower messages still unacknowledged.
    pub fn handle_acks(&mut self, acks: &[MessageId], now: Instant) {
        for &acked in acks {
            self.entries.retain_mut(|e| {
                if e.id == acked {
                    return false;
                }
                if is_after(acked, e.id) {
                    e.n_acks = e.n_acks.saturating_add(1);
                    if e.n_acks >= N_ACK_RETRANSMIT {
                        e.next_try = e.next_try.min(now);
                    }
                }
                true
            });
        }
    }

    /// The lowest-id message due at `now` (its timer expired, fast retransmit, or never sent);
    /// re-arms its timer with the doubled timeout. Call until `None`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Message> {
        let entry = self.entries.iter_mut().find(|e| e.next_try <= now)?;
        entry.next_try = now + entry.timeout;
        entry.timeout = entry
            .timeout
            .saturating_mul(2)
            .min(RETRANSMIT_TIMEOUT_CAP.max(self.initial_timeout));
        entry.n_acks = 0;
        Some(Message {
            id: entry.id,
            tag: entry.tag,
            payload: entry.payload.clone(),
        })
    }

    /// The earliest instant a message is due, if any is unacknowledged. May be `<= now` (then
    /// call [`poll_transmit`](Self::poll_transmit) right away).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.next_try).min()
    }

    /// Makes every unacknowledged message due at `now` and resets its timeout to the initial
    /// one (`reliable_schedule_now`; used when a new session starts).
    pub fn burst(&mut self, now: Instant) {
        for e in &mut self.entries {
            e.next_try = now;
            e.timeout = self.initial_timeout;
        }
    }
}
