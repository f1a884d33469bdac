//! The ACK list of a control packet: up to [`RELIABLE_ACK_SIZE`] message ids.
//!
//! ```text
//! +-----------+------------------+-----+------------------+
//! | ack_count | ack_id[0] (u32)  | ... | ack_id[n-1]      |
//! +-----------+------------------+-----+------------------+
//! ```
//!
//! ACKs are individual, not cumulative. OpenVPN sends the newest first, then re-sends older
//! ones to fill free slots, so the order is kept as received.

use std::fmt;

use crate::ids::MessageId;

/// `RELIABLE_ACK_SIZE`: the most ACKs one control packet may carry. A packet announcing
/// more is rejected.
pub const RELIABLE_ACK_SIZE: usize = 8;

/// `CONTROL_SEND_ACK_MAX`: the most ACKs OpenVPN piggybacks on a packet that is not a
/// P_ACK_V1 (a P_ACK_V1 carries up to [`RELIABLE_ACK_SIZE`]). Sending policy, not checked
/// by the parser.
pub const CONTROL_SEND_ACK_MAX: usize = 4;

/// An ordered list of at most [`RELIABLE_ACK_SIZE`] acknowledged message ids. `Copy`, no
/// allocation.
#[derive(Clone, Copy, Default)]
pub struct AckList {
    ids: [MessageId; RELIABLE_ACK_SIZE],
    len: u8,
}

/// The ACK list is already full ([`RELIABLE_ACK_SIZE`] entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ACK list full ({RELIABLE_ACK_SIZE} ids)")]
pub struct AckListFull;

impl AckList {
    /// An empty list.
    pub const fn new() -> Self {
        AckList {
            ids: [MessageId(0); RELIABLE_ACK_SIZE],
            len: 0,
        }
    }

    /// A list holding `ids` in order; `None` if there are more than [`RELIABLE_ACK_SIZE`].
    pub fn from_slice(ids: &[MessageId]) -> Option<Self> {
        let mut list = AckList::new();
        for &id in ids {
            list.push(id).ok()?;
        }
        Some(list)
    }

    /// Appends an id; fails if the list is full.
    pub fn push(&mut self, id: MessageId) -> Result<(), AckListFull> {
        let slot = self.ids.get_mut(usize::from(self.len)).ok_or(AckListFull)?;
        *slot = id;
        self.len += 1;
        Ok(())
    }

    /// The ids, in wire order.
    pub fn as_slice(&self) -> &[MessageId] {
        // `len` never exceeds the array length (only `push` raises it, after a bounds check).
        self.ids.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// Iterates over the ids in wire order.
    pub fn iter(&self) -> std::slice::Iter<'_, MessageId> {
        self.as_slice().iter()
    }

    /// Number of ids.
    pub const fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are no ids.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether no further id fits.
    pub const fn is_full(&self) -> bool {
        self.len as usize == RELIABLE_ACK_SIZE
    }

    /// Whether `id` is in the list.
    pub fn contains(&self, id: MessageId) -> bool {
        self.as_slice().contains(&id)
    }

    /// Moves `id` to the front, dropping it from where it was or, when absent and the list is
    /// full, dropping the last (oldest) entry.
    pub(crate) fn move_to_front(&mut self, id: MessageId) {
        let len = self.len();
        let end = match self.as_slice().iter().position(|&x| x == id) {
            Some(pos) => pos,
            None if len < RELIABLE_ACK_SIZE => {
                self.len += 1;
                len
            }
            None => len - 1,
        };
        self.ids.copy_within(0..end, 1);
        self.ids[0] = id;
    }

    /// Removes the first `n` ids.
    pub(crate) fn drop_front(&mut self, n: usize) {
        let len = self.len();
        let n = n.min(len);
        self.ids.copy_within(n..len, 0);
        self.ids[len - n..len].fill(MessageId(0));
        self.len -= n as u8;
    }
}

impl PartialEq for AckList {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for AckList {}

impl std::hash::Hash for AckList {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl fmt::Debug for AckList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|id| id.0)).finish()
    }
}

impl<'a> IntoIterator for &'a AckList {
    type Item = &'a MessageId;
    type IntoIter = std::slice::Iter<'a, MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl TryFrom<&[MessageId]> for AckList {
    type Error = AckListFull;

    fn try_from(ids: &[MessageId]) -> Result<Self, AckListFull> {
        AckList::from_slice(ids).ok_or(AckListFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_until_full() {
        let mut list = AckList::new();
        assert!(list.is_empty());
        for i in 0..8 {
            list.push(MessageId(i)).unwrap();
        }
        assert!(list.is_full());
        assert_eq!(list.push(MessageId(8)), Err(AckListFull));
        assert_eq!(list.len(), 8);
        assert!(list.contains(MessageId(7)));
        assert_eq!(format!("{list:?}"), "[0, 1, 2, 3, 4, 5, 6, 7]");
    }

    #[test]
    fn equality_ignores_unused_slots() {
        let a = AckList::from_slice(&[MessageId(3)]).unwrap();
        let mut b = AckList::from_slice(&[MessageId(3), MessageId(9)]).unwrap();
        assert_ne!(a, b);
        b.len = 1;
        assert_eq!(a, b);
        assert!(AckList::from_slice(&[MessageId(0); 9]).is_none());
    }
}
