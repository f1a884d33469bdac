//! Tap mode's switch: the table of learned MAC addresses (upstream's `mroute` with Ethernet
//! addresses) and where a frame goes.
//!
//! ```text
//!  0                6                12      14
//!  +----------------+----------------+-------+---------
//!  | destination    | source         | type  | payload ...
//!  +----------------+----------------+-------+---------
//! ```
//!
//! As OpenVPN 2.6 does it (`multi.c`, `mroute.c`), without VLAN tagging:
//!
//! * Every frame from a client teaches the table its source address. A source that is a
//!   group address (the least significant bit of the first byte set, broadcast included) or
//!   all zeroes is not learnable, and the frame is dropped. A source another client owns
//!   moves to the sender: learning overrides, as upstream's does (a client can take over
//!   another's MAC address; the move is logged at debug level). A client owning `max-routes-per-client`
//!   addresses learns no more, and a frame with a new source is dropped.
//! * From a client, without `client-to-client`: to the tap device (the seed's kernel)
//!   only. With it: a group destination goes to every other client *and* the tap device; a
//!   destination another client owns goes to that client only; anything else to the tap
//!   device.
//! * From the tap device: a group destination goes to every client; a learned destination to
//!   its owner; an unknown one is dropped (never flooded to the clients).
//! * A client's addresses are forgotten when it leaves. Nothing ages out otherwise
//!   (upstream learns tap addresses without `MULTI_ROUTE_AGEABLE`).

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

/// Bytes of an Ethernet header (destination, source, EtherType).
pub const ETH_HEADER_LEN: usize = 14;

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A group address (multicast, broadcast included): its first byte's lowest bit is set.
    pub fn is_group(self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Whether the table may learn this address as a client's (upstream's
    /// `mroute_learnable_address`): not a group address, not all zeroes.
    pub fn is_learnable(self) -> bool {
        !self.is_group() && self.0 != [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The destination and source of an Ethernet frame, or `None` for a frame shorter than its
/// header.
pub fn addresses(frame: &[u8]) -> Option<(MacAddr, MacAddr)> {
    let h = frame.get(..ETH_HEADER_LEN)?;
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&h[..6]);
    src.copy_from_slice(&h[6..12]);
    Some((MacAddr(dst), MacAddr(src)))
}

/// Where a frame from a client goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromClient<C> {
    /// To the tap device only.
    Tap,
    /// To this other client only (`client-to-client`).
    Client(C),
    /// To every other client and the tap device (a group destination, `client-to-client`).
    Flood,
    /// Nowhere.
    Drop(Dropped),
}

/// Where a frame from the tap device goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromTap<C> {
    /// To this client.
    Client(C),
    /// To every client.
    Flood,
    /// Nowhere.
    Drop(Dropped),
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// Shorter than an Ethernet header.
    #[error("frame shorter than an Ethernet header")]
    Short,
    /// From a client, with a group or all-zero source address.
    #[error("source {0} cannot be a client's address")]
    BadSource(MacAddr),
    /// From a client owning `max-routes-per-client` addresses, with a new source.
    #[error("source {0} not learned: the client owns max-routes-per-client addresses")]
    Quota(MacAddr),
    /// From the tap device, to an address no client owns.
    #[error("destination {0} unknown")]
    UnknownDestination(MacAddr),
}

/// One learned address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned<C> {
    /// The client owning it.
    pub owner: C,
    /// When it was learned (unix seconds; upstream's "Last Ref").
    pub since: u64,
}

/// The MAC address table; see the module docs.
#[derive(Debug, Clone)]
pub struct MacTable<C> {
    macs: HashMap<MacAddr, Learned<C>>,
    /// Addresses per owner.
    counts: HashMap<C, usize>,
    max_per_client: usize,
}

impl<C: Copy + Eq + Hash + fmt::Debug> MacTable<C> {
    /// An empty table where a client learns at most `max_per_client` addresses.
    pub fn new(max_per_client: usize) -> Self {
        MacTable {
            macs: HashMap::new(),
            counts: HashMap::new(),
            max_per_client,
        }
    }

    /// Learns the source of `frame` from client `from` at `now_unix` and says where the frame
    /// goes (module docs).
    pub fn from_client(
        &mut self,
        from: C,
        frame: &[u8],
        client_to_client: bool,
        now_unix: u64,
    ) -> FromClient<C> {
        let Some((dst, src)) = addresses(frame) else {
            return FromClient::Drop(Dropped::Short);
        };
        if let Err(dropped) = self.learn(from, src, now_unix) {
            return FromClient::Drop(dropped);
        }
        if !client_to_client {
            return FromClient::Tap;
        }
        if dst.is_group() {
            return FromClient::Flood;
        }
        match self.macs.get(&dst) {
            Some(l) if l.owner != from => FromClient::Client(l.owner),
            _ => FromClient::Tap,
        }
    }

    /// Where `frame`, read from the tap device, goes (module docs).
    pub fn from_tap(&self, frame: &[u8]) -> FromTap<C> {
        let Some((dst, _)) = addresses(frame) else {
            return FromTap::Drop(Dropped::Short);
        };
        if dst.is_group() {
            return FromTap::Flood;
        }
        match self.macs.get(&dst) {
            Some(l) => FromTap::Client(l.owner),
            None => FromTap::Drop(Dropped::UnknownDestination(dst)),
        }
    }

    /// The owner of `mac`, if learned.
    pub fn owner(&self, mac: MacAddr) -> Option<C> {
        self.macs.get(&mac).map(|l| l.owner)
    }

    /// Forgets every address of `owner`.
    pub fn remove_owner(&mut self, owner: C) {
        if self.counts.remove(&owner).is_some() {
            self.macs.retain(|_, l| l.owner != owner);
        }
    }

    /// Every learned address, for the status file.
    pub fn entries(&self) -> impl Iterator<Item = (MacAddr, Learned<C>)> + '_ {
        self.macs.iter().map(|(m, l)| (*m, *l))
    }

    /// The number of learned addresses.
    pub fn len(&self) -> usize {
        self.macs.len()
    }

    /// Whether nothing is learned.
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty()
    }

    fn learn(&mut self, from: C, src: MacAddr, now_unix: u64) -> Result<(), Dropped> {
        if !src.is_learnable() {
            return Err(Dropped::BadSource(src));
        }
        let previous = match self.macs.get(&src) {
            Some(l) if l.owner == from => return Ok(()),
            Some(l) => Some(l.owner),
            None => None,
        };
        let count = self.counts.get(&from).copied().unwrap_or(0);
        if count >= self.max_per_client {
            return Err(Dropped::Quota(src));
        }
        if let Some(old) = previous {
            // Debug only: a client could otherwise flood the log by alternating sources.
            tracing::debug!(mac = %src, from = ?old, to = ?from, "MAC address moved to another client");
            if let Some(n) = self.counts.get_mut(&old) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&old);
                }
            }
        }
        *self.counts.entry(from).or_insert(0) += 1;
        self.macs.insert(
            src,
            Learned {
                owner: from,
                since: now_unix,
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
    const C: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
    const SEED: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const BCAST: [u8; 6] = [0xff; 6];
    const MCAST: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x06, 0, 1]);
        f
    }

    #[test]
    fn display_is_upstreams_lower_case_hex() {
        assert_eq!(
            MacAddr([0x0a, 0xbc, 0, 1, 0xff, 0x10]).to_string(),
            "0a:bc:00:01:ff:10"
        );
    }

    #[test]
    fn a_clients_source_is_learned_and_unicast_to_it() {
        let mut t = MacTable::new(8);
        assert_eq!(
            t.from_tap(&frame(A, SEED)),
            FromTap::Drop(Dropped::UnknownDestination(MacAddr(A)))
        );
        assert_eq!(
            t.from_client(1, &frame(SEED, A), true, 100),
            FromClient::Tap
        );
        assert_eq!(t.owner(MacAddr(A)), Some(1));
        assert_eq!(t.from_tap(&frame(A, SEED)), FromTap::Client(1));
        assert_eq!(
            t.entries().collect::<Vec<_>>(),
            vec![(
                MacAddr(A),
                Learned {
                    owner: 1,
                    since: 100
                }
            )]
        );
    }

    #[test]
    fn group_destinations_flood_but_never_back_to_the_sender() {
        let mut t = MacTable::new(8);
        // From a client: every other client and the tap device (the caller skips the
        // sender); from the tap device: every client.
        assert_eq!(
            t.from_client(1, &frame(BCAST, A), true, 0),
            FromClient::Flood
        );
        assert_eq!(
            t.from_client(2, &frame(MCAST, B), true, 0),
            FromClient::Flood
        );
        assert_eq!(t.from_tap(&frame(BCAST, SEED)), FromTap::Flood);
        assert_eq!(t.from_tap(&frame(MCAST, SEED)), FromTap::Flood);
        // A frame to the sender's own address is not sent back to it.
        assert_eq!(t.from_client(1, &frame(A, A), true, 0), FromClient::Tap);
    }

    #[test]
    fn client_to_client_decides_whether_frames_are_switched_between_clients() {
        let mut t = MacTable::new(8);
        t.from_client(1, &frame(BCAST, A), true, 0);
        t.from_client(2, &frame(BCAST, B), true, 0);
        assert_eq!(
            t.from_client(1, &frame(B, A), true, 0),
            FromClient::Client(2)
        );
        assert_eq!(
            t.from_client(2, &frame(A, B), true, 0),
            FromClient::Client(1)
        );
        // Unknown unicast goes to the tap device only, never flooded to clients.
        assert_eq!(t.from_client(1, &frame(C, A), true, 0), FromClient::Tap);
        // Without client-to-client everything goes to the kernel (it still learns).
        assert_eq!(t.from_client(1, &frame(B, A), false, 0), FromClient::Tap);
        assert_eq!(
            t.from_client(1, &frame(BCAST, A), false, 0),
            FromClient::Tap
        );
        assert_eq!(
            t.from_client(3, &frame(BCAST, C), false, 0),
            FromClient::Tap
        );
        assert_eq!(t.owner(MacAddr(C)), Some(3));
    }

    #[test]
    fn group_and_zero_sources_are_dropped_and_not_learned() {
        let mut t = MacTable::new(8);
        for src in [BCAST, MCAST, [0; 6]] {
            assert_eq!(
                t.from_client(1, &frame(SEED, src), true, 0),
                FromClient::Drop(Dropped::BadSource(MacAddr(src)))
            );
        }
        assert!(t.is_empty());
        assert_eq!(
            t.from_client(1, &[0u8; 13], true, 0),
            FromClient::Drop(Dropped::Short)
        );
        assert_eq!(t.from_tap(&[0u8; 13]), FromTap::Drop(Dropped::Short));
    }

    #[test]
    fn learning_moves_an_address_to_the_newest_sender_as_upstream() {
        let mut t = MacTable::new(8);
        t.from_client(1, &frame(SEED, A), true, 10);
        t.from_client(2, &frame(SEED, A), true, 20);
        assert_eq!(t.owner(MacAddr(A)), Some(2));
        assert_eq!(t.from_tap(&frame(A, SEED)), FromTap::Client(2));
        assert_eq!(t.len(), 1);
        // The old owner leaving does not take it from the new one.
        t.remove_owner(1);
        assert_eq!(t.owner(MacAddr(A)), Some(2));
        t.remove_owner(2);
        assert!(t.is_empty());
    }

    #[test]
    fn a_client_learns_at_most_its_quota() {
        let mut t = MacTable::new(2);
        assert_eq!(t.from_client(1, &frame(SEED, A), true, 0), FromClient::Tap);
        assert_eq!(t.from_client(1, &frame(SEED, B), true, 0), FromClient::Tap);
        assert_eq!(
            t.from_client(1, &frame(SEED, C), true, 0),
            FromClient::Drop(Dropped::Quota(MacAddr(C)))
        );
        // Known sources still pass; another client has its own quota.
        assert_eq!(t.from_client(1, &frame(SEED, A), true, 0), FromClient::Tap);
        assert_eq!(t.from_client(2, &frame(SEED, C), true, 0), FromClient::Tap);
        // A moved address frees its place in the old owner's quota.
        assert_eq!(t.from_client(2, &frame(SEED, A), true, 0), FromClient::Tap);
        assert_eq!(t.from_client(1, &frame(SEED, C), true, 0), FromClient::Tap);
        assert_eq!(t.owner(MacAddr(C)), Some(1));
    }

    #[test]
    fn leaving_forgets_only_the_leavers_addresses() {
        let mut t = MacTable::new(8);
        t.from_client(1, &frame(SEED, A), true, 0);
        t.from_client(1, &frame(SEED, C), true, 0);
        t.from_client(2, &frame(SEED, B), true, 0);
        t.remove_owner(1);
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.from_tap(&frame(A, SEED)),
            FromTap::Drop(Dropped::UnknownDestination(MacAddr(A)))
        );
        assert_eq!(t.from_tap(&frame(B, SEED)), FromTap::Client(2));
    }
}
