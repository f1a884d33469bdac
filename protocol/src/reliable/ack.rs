//! ACK bookkeeping: the ids still to acknowledge and the most-recently-acknowledged list used
//! to fill free ACK slots with re-acks (`struct reliable_ack`, `ks->rec_ack`, `ks->lru_acks`).

use crate::ids::MessageId;
use crate::packet::{AckList, CONTROL_SEND_ACK_MAX, RELIABLE_ACK_SIZE};

/// What this side still has to acknowledge, and what it acknowledged last.
///
/// Every received message that is stored or recognised as a duplicate is
/// [`acknowledge`](Self::acknowledge)d: its id joins the pending list (at most
/// [`RELIABLE_ACK_SIZE`], duplicates ignored; when full the id is dropped and the peer's
/// retransmission will bring it back). Writing a packet [`take`](Self::take)s an ACK array:
///
/// 1. the first `min(pending, max)` pending ids (oldest first) leave the pending list and move
///    to the front of the MRU list, keeping their order;
/// 2. the packet carries the first `min(max, mru)` ids of the MRU list.
///
/// So a packet acknowledges what is new and fills its free slots with the ids acknowledged
/// most recently before: one id per message gives the newest-first arrays of the real
/// capture, `[2, 1, 0]`, `[5, 4, 3, 2, 1, 0]`. `max` is [`CONTROL_SEND_ACK_MAX`] on a packet
/// that carries a message and [`RELIABLE_ACK_SIZE`] on a P_ACK_V1.
#[derive(Debug, Clone, Default)]
pub struct AckState {
    pending: AckList,
    mru: AckList,
}

impl AckState {
    /// No pending ids, empty MRU list.
    pub fn new() -> AckState {
        AckState::default()
    }

    /// Queues `id` for acknowledgement. `false` if it could not be queued (already pending
    /// counts as success; a full pending list does not).
    pub fn acknowledge(&mut self, id: MessageId) -> bool {
        self.pending.contains(id) || self.pending.push(id).is_ok()
    }

    /// Whether ids are waiting to be acknowledged: if no packet carrying a message goes out
    /// now, a dedicated P_ACK_V1 is due.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The ids waiting to be acknowledged, oldest first.
    pub fn pending(&self) -> &[MessageId] {
        self.pending.as_slice()
    }

    /// The most-recently-acknowledged ids, newest first.
    pub fn recent(&self) -> &[MessageId] {
        self.mru.as_slice()
    }

    /// How many ids the next packet carrying a message would hold, as OpenVPN estimates it for
    /// the payload budget: `min(pending + mru, CONTROL_SEND_ACK_MAX)`.
    pub fn control_acks_estimate(&self) -> usize {
        (self.pending.len() + self.mru.len()).min(CONTROL_SEND_ACK_MAX)
    }

    /// Builds the ACK array for one packet with room for `max` ids (clamped to
    /// [`RELIABLE_ACK_SIZE`]), moving the pending ids it carries to the MRU list.
    pub fn take(&mut self, max: usize) -> AckList {
        let max = max.min(RELIABLE_ACK_SIZE);
        let n = self.pending.len().min(max);
        for &id in self.pending.as_slice()[..n].iter().rev() {
            self.mru.move_to_front(id);
        }
        self.pending.drop_front(n);
        let total = self.mru.len().min(max);
        // `total` is at most RELIABLE_ACK_SIZE, so the slice always fits.
        AckList::from_slice(&self.mru.as_slice()[..total]).unwrap_or_default()
    }

    /// [`take`](Self::take) for a packet that carries a message
    /// ([`CONTROL_SEND_ACK_MAX`] ids).
    pub fn take_for_control(&mut self) -> AckList {
        self.take(CONTROL_SEND_ACK_MAX)
    }

    /// [`take`](Self::take) for a dedicated P_ACK_V1 ([`RELIABLE_ACK_SIZE`] ids); `None` when
    /// nothing is pending, since a P_ACK_V1 is only sent to acknowledge something new.
    pub fn take_for_ack_packet(&mut self) -> Option<AckList> {
        self.has_pending().then(|| self.take(RELIABLE_ACK_SIZE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &AckList) -> Vec<u32> {
        list.as_slice().iter().map(|m| m.0).collect()
    }

    #[test]
    fn one_id_per_packet_gives_newest_first() {
        let mut acks = AckState::new();
        for i in 0..6 {
            acks.acknowledge(MessageId(i));
            let list = acks.take_for_ack_packet().expect("pending");
            assert_eq!(ids(&list), (0..=i).rev().collect::<Vec<_>>());
        }
        // Piggy-backed arrays are capped at 4.
        assert_eq!(ids(&acks.take_for_control()), [5, 4, 3, 2]);
        assert!(acks.take_for_ack_packet().is_none());
    }

    #[test]
    fn several_pending_keep_arrival_order_then_reacks() {
        let mut acks = AckState::new();
        acks.acknowledge(MessageId(0));
        assert_eq!(ids(&acks.take_for_control()), [0]);
        acks.acknowledge(MessageId(2));
        acks.acknowledge(MessageId(1));
        acks.acknowledge(MessageId(2));
        assert_eq!(acks.pending(), [MessageId(2), MessageId(1)]);
        assert_eq!(acks.control_acks_estimate(), 3);
        assert_eq!(ids(&acks.take_for_control()), [2, 1, 0]);
        // A re-ack of an old id moves it to the front without growing the list.
        acks.acknowledge(MessageId(0));
        assert_eq!(ids(&acks.take_for_control()), [0, 2, 1]);
    }

    #[test]
    fn mru_keeps_eight_and_pending_caps_at_eight() {
        let mut acks = AckState::new();
        for i in 0..8 {
            assert!(acks.acknowledge(MessageId(i)));
        }
        assert!(!acks.acknowledge(MessageId(8)));
        assert!(acks.acknowledge(MessageId(3)));
        // More pending than fit: the first four go, the rest wait.
        assert_eq!(ids(&acks.take_for_control()), [0, 1, 2, 3]);
        assert_eq!(ids(&acks.take_for_control()), [4, 5, 6, 7]);
        assert!(!acks.has_pending());
        assert_eq!(acks.recent().len(), 8);
        acks.acknowledge(MessageId(9));
        assert_eq!(
            ids(&acks.take_for_ack_packet().expect("pending")),
            [9, 4, 5, 6, 7, 0, 1, 2]
        );
    }
}
