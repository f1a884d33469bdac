//! The control channel's reliability layer for one key generation (`reliable.c`).
//!
//! OpenVPN runs TLS over numbered control messages that the peer acknowledges individually.
//! Per key generation (key id) and direction, message ids start at 0 with the hard or soft
//! reset and grow by one per new message; retransmissions reuse the id.
//!
//! | part | what it does |
//! |---|---|
//! | [`ReliableSend`] | numbering, at most 6 messages in flight, retransmission with doubling timeout, fast retransmit |
//! | [`ReliableRecv`] | a 12-message reorder window, duplicates, in-order delivery |
//! | [`AckState`] | ids still to acknowledge, the MRU list of re-acks, ACK arrays for packets |
//! | [`PayloadLimits`], [`max_control_payload`] | how many ciphertext bytes fit in one control packet |
//! | [`Reliable`] | the three glued together, with the driving contract |
//!
//! This layer handles ids and payload bytes only; it neither parses nor writes packets. The
//! session layer maps packets to and from [`Reliable`] calls.

mod ack;
mod recv;
mod segment;
mod send;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::ids::MessageId;

pub use crate::packet::{AckList, CONTROL_SEND_ACK_MAX, RELIABLE_ACK_SIZE};
pub use ack::AckState;
pub use recv::{Received, ReliableRecv};
pub use segment::{
    ack_size, max_control_payload, PayloadLimits, PeerFamily, TlsMtu, WrapOverhead,
    IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD, MIN_CONTROL_PAYLOAD, TLS_AUTH_PID_OVERHEAD,
    TLS_CHANNEL_BUF_SIZE, TLS_CHANNEL_MTU_MAX, TLS_CHANNEL_MTU_MIN, TLS_CRYPT_OVERHEAD,
    TLS_MTU_DEFAULT,
};
pub use send::ReliableSend;

/// `TLS_RELIABLE_N_SEND_BUFFERS`: messages in flight per key generation.
pub const TLS_RELIABLE_N_SEND_BUFFERS: usize = 6;
/// `TLS_RELIABLE_N_REC_BUFFERS`: the receive window, in messages.
pub const TLS_RELIABLE_N_REC_BUFFERS: usize = 12;
/// `N_ACK_RETRANSMIT`: ACKs of higher ids after which an unacknowledged message is resent
/// before its timer.
pub const N_ACK_RETRANSMIT: u32 = 3;
/// Default `--tls-timeout`: the first retransmission timeout.
pub const DEFAULT_TLS_TIMEOUT: Duration = Duration::from_secs(2);
/// Where the doubling retransmission timeout stops growing. OpenVPN has no cap, but its
/// hand-window (60 s) ends a negotiation long before; the cap only keeps `Instant`
/// arithmetic from overflowing when nothing else stops the retries.
pub const RETRANSMIT_TIMEOUT_CAP: Duration = Duration::from_secs(3600);

/// Errors of the reliability layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReliableError {
    /// Six messages are in flight: wait for ACKs before queueing more.
    #[error("send window full: next id {}, lowest unacknowledged {}", next.0, lowest_unacked.0)]
    SendWindowFull {
        /// The id the message would have got.
        next: MessageId,
        /// The oldest id still waiting for its ACK.
        lowest_unacked: MessageId,
    },
    /// `--tls-mtu` outside 154..=2048.
    #[error("tls-mtu {tls_mtu} outside {TLS_CHANNEL_MTU_MIN}..={TLS_CHANNEL_MTU_MAX}")]
    TlsMtuOutOfRange {
        /// The rejected value.
        tls_mtu: u16,
    },
}

/// One control message: its id, the caller's tag (the opcode, say) and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message packet id.
    pub id: MessageId,
    /// Opaque to this layer; the session stores the opcode here.
    pub tag: u8,
    /// Payload bytes (TLS ciphertext, reset TLVs, or empty).
    pub payload: Bytes,
}

/// A packet to write now: one message plus the ACK array that rides along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The message (first send or retransmission).
    pub message: Message,
    /// Up to [`CONTROL_SEND_ACK_MAX`] ids to acknowledge in the same packet; may be empty.
    pub acks: AckList,
}

/// The reliability state of one key generation (`key_state`): send side, receive side and
/// ACK bookkeeping. Sans-IO: it never reads a clock; every time-dependent call takes `now`.
///
/// Its methods come in four groups, after quinn-proto's `Connection`:
///
/// - A. Getters, taking `&self`: [`all_acked`](Self::all_acked),
///   [`needs_ack_packet`](Self::needs_ack_packet), [`max_payload`](Self::max_payload),
///   [`send`](Self::send), [`recv`](Self::recv), [`acks`](Self::acks).
/// - B. Input from the peer, named `handle_*`. For every authenticated control packet of this
///   key id, first [`handle_acks`](Self::handle_acks) with its ACK array (P_ACK_V1 included,
///   empty arrays too), then, if it carries a message id,
///   [`handle_message`](Self::handle_message).
/// - C. Commands: [`queue`](Self::queue) one message (the hard or soft reset is the first, id
///   0), [`queue_stream`](Self::queue_stream) to cut pending TLS ciphertext into messages as
///   far as the window allows, [`burst`](Self::burst) when a new session starts.
/// - D. Output, named `poll_*`.
///
/// After each call of (B) or (C), and whenever the instant last returned by
/// [`poll_timeout`](Self::poll_timeout) has passed, call the polling functions in this order:
///
/// 1. [`poll_deliver`](Self::poll_deliver) until `None`, feeding the payloads (in id order)
///    to TLS or to reset handling; queue what TLS writes in reply (C) now, so that the ACKs
///    ride on it instead of a P_ACK_V1;
/// 2. [`poll_transmit`](Self::poll_transmit) until `None`: each result is one control packet
///    (message plus up to 4 ACKs);
/// 3. [`poll_ack`](Self::poll_ack): `Some` means a dedicated P_ACK_V1 must go out now with
///    these ids (what step 2 did not carry);
/// 4. [`poll_timeout`](Self::poll_timeout): when to come back for retransmissions.
///
/// `now` must never go backwards from one call to the next. Calls at the same instant may
/// come in any order.
#[derive(Debug, Clone)]
pub struct Reliable {
    send: ReliableSend,
    recv: ReliableRecv,
    acks: AckState,
}

impl Reliable {
    /// Fresh state for a new key generation, with `tls_timeout` as the first retransmission
    /// timeout (`--tls-timeout`, [`DEFAULT_TLS_TIMEOUT`]).
    pub fn new(tls_timeout: Duration) -> Reliable {
        Reliable {
            send: ReliableSend::new(tls_timeout),
            recv: ReliableRecv::new(),
            acks: AckState::new(),
        }
    }

    // A. Getters.

    /// Whether every message queued so far has been acknowledged.
    pub fn all_acked(&self) -> bool {
        self.send.all_acked()
    }

    /// Whether ids wait to be acknowledged: a P_ACK_V1 is due unless a packet carrying a
    /// message takes them first.
    pub fn needs_ack_packet(&self) -> bool {
        self.acks.has_pending()
    }

    /// Largest payload for the next message, counting the ACKs expected to ride along.
    pub fn max_payload(&self, limits: &PayloadLimits) -> usize {
        limits.max_payload(self.acks.control_acks_estimate())
    }

    /// The send side.
    pub fn send(&self) -> &ReliableSend {
        &self.send
    }

    /// The receive side.
    pub fn recv(&self) -> &ReliableRecv {
        &self.recv
    }

    /// The ACK bookkeeping.
    pub fn acks(&self) -> &AckState {
        &self.acks
    }

    // B. Input.

    /// The ACK array of a received packet.
    pub fn handle_acks(&mut self, acks: &[MessageId], now: Instant) {
        self.send.handle_acks(acks, now);
    }

    /// A received message; its id is queued for acknowledgement when the rules say so.
    pub fn handle_message(&mut self, id: MessageId, tag: u8, payload: Bytes) -> Received {
        let received = self.recv.handle_message(id, tag, payload);
        if received.must_ack() {
            self.acks.acknowledge(id);
        }
        received
    }

    // C. Commands.

    /// Queues one message; see [`ReliableSend::queue`].
    pub fn queue(
        &mut self,
        tag: u8,
        payload: Bytes,
        now: Instant,
    ) -> Result<MessageId, ReliableError> {
        self.send.queue(tag, payload, now)
    }

    /// Cuts the front of `stream` (pending TLS ciphertext) into messages of at most
    /// [`max_payload`](Self::max_payload) bytes and queues as many as the window allows; the
    /// rest stays in `stream` for a later call. Returns the number of messages queued.
    pub fn queue_stream(
        &mut self,
        tag: u8,
        stream: &mut BytesMut,
        limits: &PayloadLimits,
        now: Instant,
    ) -> usize {
        let max = self.max_payload(limits);
        self.send.queue_segments(tag, stream, max, now)
    }

    /// Makes every unacknowledged message due now, with the initial timeout.
    pub fn burst(&mut self, now: Instant) {
        self.send.burst(now);
    }

    // D. Output.

    /// The next message received in order.
    pub fn poll_deliver(&mut self) -> Option<Message> {
        self.recv.poll_deliver()
    }

    /// The next control packet to send at `now`, with the ACKs that ride along.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let message = self.send.poll_transmit(now)?;
        Some(Transmit {
            message,
            acks: self.acks.take_for_control(),
        })
    }

    /// The ids for a dedicated P_ACK_V1, if any are pending (up to [`RELIABLE_ACK_SIZE`],
    /// filled with re-acks).
    pub fn poll_ack(&mut self) -> Option<AckList> {
        self.acks.take_for_ack_packet()
    }

    /// When [`poll_transmit`](Self::poll_transmit) will next have something to send, if any
    /// message is unacknowledged; may already have passed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.send.poll_timeout()
    }
}

/// Whether `a` comes after `b` in the wrapping id space (`0 < a - b < 2^31`).
fn is_after(a: MessageId, b: MessageId) -> bool {
    let d = a.0.wrapping_sub(b.0);
    d != 0 && d < 0x8000_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_order() {
        assert!(is_after(MessageId(1), MessageId(0)));
        assert!(!is_after(MessageId(0), MessageId(0)));
        assert!(is_after(MessageId(2), MessageId(u32::MAX)));
        assert!(!is_after(MessageId(u32::MAX), MessageId(2)));
    }

    #[test]
    fn windows_wrap_around_u32() {
        let now = Instant::now();
        let mut recv = ReliableRecv::starting_at(MessageId(u32::MAX - 1));
        let id = |d: u32| MessageId((u32::MAX - 1).wrapping_add(d));
        // 11 ahead (wrapped past zero) is the last slot; 12 ahead is beyond.
        assert_eq!(
            recv.handle_message(id(11), 4, Bytes::new()),
            Received::Stored
        );
        assert_eq!(
            recv.handle_message(id(12), 4, Bytes::new()),
            Received::BeyondWindow
        );
        // Just behind is old.
        assert_eq!(
            recv.handle_message(MessageId(u32::MAX - 2), 4, Bytes::new()),
            Received::Duplicate
        );
        for d in 0..11 {
            assert_eq!(
                recv.handle_message(id(d), 4, Bytes::new()),
                Received::Stored
            );
        }
        let delivered: Vec<MessageId> =
            std::iter::from_fn(|| recv.poll_deliver().map(|m| m.id)).collect();
        assert_eq!(delivered, (0..12).map(id).collect::<Vec<_>>());
        assert_eq!(recv.expect(), MessageId(10));

        let mut send = ReliableSend::starting_at(MessageId(u32::MAX - 2), DEFAULT_TLS_TIMEOUT);
        for _ in 0..TLS_RELIABLE_N_SEND_BUFFERS {
            send.queue(4, Bytes::new(), now).expect("window");
        }
        assert_eq!(send.next_id(), MessageId(3));
        assert!(send.queue(4, Bytes::new(), now).is_err());
        assert_eq!(std::iter::from_fn(|| send.poll_transmit(now)).count(), 6);
        // ACKs of wrapped ids count as higher: fast retransmit of the three below zero.
        let t1 = now + Duration::from_secs(1);
        send.handle_acks(&[MessageId(0), MessageId(1), MessageId(2)], t1);
        let resent: Vec<MessageId> =
            std::iter::from_fn(|| send.poll_transmit(t1).map(|m| m.id)).collect();
        assert_eq!(
            resent,
            [
                MessageId(u32::MAX - 2),
                MessageId(u32::MAX - 1),
                MessageId(u32::MAX)
            ]
        );
        assert_eq!(send.window_available(), 0);
        send.handle_acks(&[MessageId(u32::MAX - 2)], now);
        assert_eq!(send.lowest_unacked(), Some(MessageId(u32::MAX - 1)));
        assert_eq!(send.window_available(), 1);
    }
}
