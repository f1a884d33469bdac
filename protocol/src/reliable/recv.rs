//! Receive side: the reorder buffer and in-order delivery.

use bytes::Bytes;

use crate::ids::MessageId;

use super::{is_after, Message, TLS_RELIABLE_N_REC_BUFFERS};

/// What became of a received message (and whether it must be acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// New and inside the window: stored for in-order delivery. Acknowledge it.
    Stored,
    /// Already delivered or already buffered: not stored again. Acknowledge it again (the
    /// peer evidently missed the earlier ACK).
    Duplicate,
    /// `id >= expect + TLS_RELIABLE_N_REC_BUFFERS`: it would break sequentiality. Dropped
    /// and not acknowledged, so the peer resends it later.
    BeyondWindow,
    /// Every receive buffer is taken (nothing delivered yet): ignored entirely, no ACK.
    NoBuffer,
}

impl Received {
    /// Whether the message's id must be acknowledged.
    pub fn must_ack(self) -> bool {
        matches!(self, Received::Stored | Received::Duplicate)
    }
}

/// The messages of one key generation received from the peer and not yet delivered
/// (`ks->rec_reliable`), in [`TLS_RELIABLE_N_REC_BUFFERS`] slots covering the ids
/// `expect .. expect + 12`, where `expect` is the next id to deliver. Delivery is strictly in
/// id order; later messages wait in their slots until the gap is filled.
///
/// All id comparisons are modulo 2^32: an id less than 2^31 behind `expect` is old.
#[derive(Debug, Clone, Default)]
pub struct ReliableRecv {
    expect: MessageId,
    /// Ring: slot `(head + (id - expect)) % 12` holds message `id`.
    slots: [Option<(u8, Bytes)>; TLS_RELIABLE_N_REC_BUFFERS],
    head: usize,
    stored: usize,
}

impl ReliableRecv {
    /// An empty receive side expecting id 0.
    pub fn new() -> ReliableRecv {
        ReliableRecv::default()
    }

    /// A receive side whose next expected id is `expect` (for exercising the id wrap).
    #[cfg(test)]
    pub(crate) fn starting_at(expect: MessageId) -> ReliableRecv {
        ReliableRecv {
            expect,
            ..ReliableRecv::default()
        }
    }

    /// The next id to deliver.
    pub fn expect(&self) -> MessageId {
        self.expect
    }

    /// Number of messages stored and not yet delivered.
    pub fn buffered(&self) -> usize {
        self.stored
    }

    /// Files a received message (`tag` is opaque here, e.g. the opcode). The caller queues an
    /// ACK when [`Received::must_ack`] says so.
    pub fn handle_message(&mut self, id: MessageId, tag: u8, payload: Bytes) -> Received {
        if self.stored >= TLS_RELIABLE_N_REC_BUFFERS {
            return Received::NoBuffer;
        }
        if is_after(self.expect, id) {
            return Received::Duplicate;
        }
        let offset = id.0.wrapping_sub(self.expect.0) as usize;
        if offset >= TLS_RELIABLE_N_REC_BUFFERS {
            return Received::BeyondWindow;
        }
        let slot = &mut self.slots[(self.head + offset) % TLS_RELIABLE_N_REC_BUFFERS];
        if slot.is_some() {
            return Received::Duplicate;
        }
        *slot = Some((tag, payload));
        self.stored += 1;
        Received::Stored
    }

    /// The next message in id order, if it has arrived.
    pub fn poll_deliver(&mut self) -> Option<Message> {
        let (tag, payload) = self.slots[self.head].take()?;
        let id = self.expect;
        self.stored -= 1;
        self.head = (self.head + 1) % TLS_RELIABLE_N_REC_BUFFERS;
        self.expect = MessageId(id.0.wrapping_add(1));
        Some(Message { id, tag, payload })
    }

    /// Whether [`poll_deliver`](Self::poll_deliver) would yield a message.
    pub fn can_deliver(&self) -> bool {
        self.slots[self.head].is_some()
    }
}
