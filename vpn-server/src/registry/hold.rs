//! Packets from the tun device held for a client that is reconnecting (DESIGN decision 10,
//! "hold, don't fail"): a packet to a destination whose route is away for now (its client
//! left less than `bound` ago, or is admitted but its tunnel not yet up) waits here and goes
//! to the client when its tunnel is up again ([`TunHold::release`]); `bound` after it came,
//! it is answered with ICMP unreachable like a packet no client routes
//! ([`TunHold::expire`]). A kernel's SYN retransmits (1, 3, 7 s) are too coarse to find the
//! tunnel back promptly: the held SYN itself arrives within milliseconds of the return.
//!
//! Bounded per prefix and in all, in packets and in bytes ([`HoldLimits`]); a packet beyond
//! is not held (the caller answers it as unroutable) and counted. Pure: no I/O, no clock.
//!
//! Each held packet keeps where it came from (`O`: nothing for the tun device; in HA mode the
//! kube-apiserver connection, which gets the ICMP answer at the bound and whose flow the
//! released packet is switched as). The HA server holds for its shoot networks while it has no
//! shoot connection ([`crate::registry::Registry::hold_ha`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipnet::IpNet;

/// How much [`TunHold`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldLimits {
    /// Packets held for one prefix.
    pub prefix_packets: usize,
    /// Bytes held for one prefix.
    pub prefix_bytes: usize,
    /// Packets held in all.
    pub packets: usize,
    /// Bytes held in all.
    pub bytes: usize,
}

impl Default for HoldLimits {
    /// 256 packets / 1 MiB per prefix, 4096 packets / 8 MiB in all: SYNs of every request
    /// a kube-apiserver starts in a reconnect gap, with room to spare.
    fn default() -> Self {
        HoldLimits {
            prefix_packets: 256,
            prefix_bytes: 1 << 20,
            packets: 4096,
            bytes: 8 << 20,
        }
    }
}

/// What happened to held packets so far (the `vpn_server_held_*` series).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldCounts {
    /// Packets held now.
    pub packets: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Packets that were held.
    pub held: u64,
    /// Held packets handed to a client whose tunnel came (back) up.
    pub released: u64,
    /// Held packets answered as unroutable at the bound.
    pub expired: u64,
    /// Packets not held because a limit was reached (answered as unroutable at once).
    pub over_limit: u64,
}

#[derive(Debug)]
struct Held<O> {
    dst: IpAddr,
    prefix: IpNet,
    at: Instant,
    from: O,
    packet: BytesMut,
}

/// The held packets and the prefixes recently routed; see the module docs. `O` says where a
/// packet came from.
#[derive(Debug)]
pub struct TunHold<O = ()> {
    bound: Duration,
    limits: HoldLimits,
    /// Prefixes whose client left, each with when it stops being held for.
    recent: Vec<(IpNet, Instant)>,
    /// Oldest first (so also in the order they expire).
    queue: VecDeque<Held<O>>,
    per_prefix: HashMap<IpNet, (usize, usize)>,
    counts: HoldCounts,
}

impl<O> TunHold<O> {
    /// Holding for `bound` within `limits`; a zero bound holds nothing.
    pub fn new(bound: Duration, limits: HoldLimits) -> TunHold<O> {
        TunHold {
            bound,
            limits,
            recent: Vec::new(),
            queue: VecDeque::new(),
            per_prefix: HashMap::new(),
            counts: HoldCounts::default(),
        }
    }

    /// The bound.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The counts so far.
    pub fn counts(&self) -> HoldCounts {
        self.counts
    }

    /// The routes of a client that left at `now`: packets to them are held for `bound`.
    pub fn routes_left(&mut self, prefixes: impl IntoIterator<Item = IpNet>, now: Instant) {
        if self.bound.is_zero() {
            return;
        }
        let until = now + self.bound;
        self.recent.retain(|(_, u)| *u > now);
        for p in prefixes {
            match self.recent.iter_mut().find(|(q, _)| *q == p) {
                Some(entry) => entry.1 = until,
                None => self.recent.push((p, until)),
            }
        }
    }

    /// The longest prefix that left less than `bound` before `now` and covers `dst`.
    pub fn recently_routed(&self, dst: IpAddr, now: Instant) -> Option<IpNet> {
        self.recent
            .iter()
            .filter(|(p, until)| *until > now && p.contains(&dst))
            .map(|(p, _)| *p)
            .max_by_key(IpNet::prefix_len)
    }

    /// Holds `packet` (to `dst`, under `prefix`, come from `from`) from `now`; gives it back
    /// when a limit (or a zero bound) does not let it.
    pub fn hold(
        &mut self,
        prefix: IpNet,
        dst: IpAddr,
        from: O,
        packet: BytesMut,
        now: Instant,
    ) -> Result<(), BytesMut> {
        let len = packet.len();
        let l = self.limits;
        let (p_packets, p_bytes) = self.per_prefix.get(&prefix).copied().unwrap_or((0, 0));
        if self.bound.is_zero()
            || p_packets >= l.prefix_packets
            || p_bytes + len > l.prefix_bytes
            || self.counts.packets >= l.packets
            || self.counts.bytes + len > l.bytes
        {
            if !self.bound.is_zero() {
                self.counts.over_limit += 1;
            }
            return Err(packet);
        }
        self.per_prefix
            .insert(prefix, (p_packets + 1, p_bytes + len));
        self.counts.packets += 1;
        self.counts.bytes += len;
        self.counts.held += 1;
        self.queue.push_back(Held {
            dst,
            prefix,
            at: now,
            from,
            packet,
        });
        Ok(())
    }

    /// Takes the held packets whose destination `routes_to` accepts (a client's tunnel came
    /// up), oldest first, each with where it came from.
    pub fn release(&mut self, mut routes_to: impl FnMut(IpAddr) -> bool) -> Vec<(O, BytesMut)> {
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for h in self.queue.drain(..) {
            if routes_to(h.dst) {
                out.push((h.from, h.packet));
            } else {
                kept.push_back(h);
            }
        }
        self.queue = kept;
        self.recount();
        self.counts.released += out.len() as u64;
        out
    }

    /// Takes the packets held `bound` or longer at `now`, oldest first, each with where it
    /// came from (to answer them as unroutable).
    pub fn expire(&mut self, now: Instant) -> Vec<(O, BytesMut)> {
        let mut out = Vec::new();
        while let Some(h) = self.queue.front() {
            if h.at + self.bound > now {
                break;
            }
            if let Some(h) = self.queue.pop_front() {
                out.push((h.from, h.packet));
            }
        }
        if !out.is_empty() {
            self.recount();
            self.counts.expired += out.len() as u64;
        }
        out
    }

    /// When the oldest held packet expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.queue.front().map(|h| h.at + self.bound)
    }

    fn recount(&mut self) {
        self.per_prefix.clear();
        self.counts.packets = 0;
        self.counts.bytes = 0;
        for h in &self.queue {
            let e = self.per_prefix.entry(h.prefix).or_insert((0, 0));
            e.0 += 1;
            e.1 += h.packet.len();
            self.counts.packets += 1;
            self.counts.bytes += h.packet.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn packet(n: usize) -> BytesMut {
        BytesMut::from(&vec![0u8; n][..])
    }

    #[test]
    fn a_prefix_is_held_for_the_bound_after_its_client_left() {
        let t0 = Instant::now();
        let mut h = TunHold::<()>::new(Duration::from_secs(2), HoldLimits::default());
        let dst: IpAddr = "100.96.0.10".parse().unwrap();
        assert_eq!(h.recently_routed(dst, t0), None);
        h.routes_left([net("100.96.0.0/16"), net("100.96.0.0/24")], t0);
        assert_eq!(h.recently_routed(dst, t0), Some(net("100.96.0.0/24")));
        assert_eq!(
            h.recently_routed(dst, t0 + Duration::from_secs(2)),
            None,
            "not after the bound"
        );
    }

    #[test]
    fn held_packets_go_to_the_returning_client_or_expire_at_the_bound() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(2);
        let mut h = TunHold::new(bound, HoldLimits::default());
        let a: IpAddr = "100.96.0.10".parse().unwrap();
        let b: IpAddr = "10.0.0.1".parse().unwrap();
        h.hold(net("100.96.0.0/24"), a, 7, packet(60), t0).unwrap();
        h.hold(
            net("10.0.0.0/8"),
            b,
            8,
            packet(40),
            t0 + Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(h.counts().packets, 2);
        assert_eq!(h.counts().bytes, 100);
        assert_eq!(h.next_expiry(), Some(t0 + bound));
        let back = h.release(|d| d == a);
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].0, back[0].1.len()), (7, 60));
        assert!(h.expire(t0 + bound).is_empty(), "b came later");
        let expired = h.expire(t0 + Duration::from_secs(3));
        assert_eq!(expired.len(), 1);
        assert_eq!((expired[0].0, expired[0].1.len()), (8, 40));
        let c = h.counts();
        assert_eq!(
            (c.packets, c.bytes, c.held, c.released, c.expired),
            (0, 0, 2, 1, 1)
        );
    }

    #[test]
    fn limits_per_prefix_and_in_all_refuse_and_count() {
        let t0 = Instant::now();
        let limits = HoldLimits {
            prefix_packets: 2,
            prefix_bytes: 1000,
            packets: 3,
            bytes: 150,
        };
        let mut h = TunHold::<()>::new(Duration::from_secs(2), limits);
        let p = net("100.96.0.0/24");
        let q = net("100.97.0.0/24");
        let a: IpAddr = "100.96.0.10".parse().unwrap();
        let b: IpAddr = "100.97.0.10".parse().unwrap();
        h.hold(p, a, (), packet(50), t0).unwrap();
        h.hold(p, a, (), packet(50), t0).unwrap();
        assert!(h.hold(p, a, (), packet(10), t0).is_err(), "per prefix");
        assert!(h.hold(q, b, (), packet(60), t0).is_err(), "bytes in all");
        h.hold(q, b, (), packet(50), t0).unwrap();
        assert!(h.hold(q, b, (), packet(1), t0).is_err(), "packets in all");
        assert_eq!(h.counts().over_limit, 3);
        assert!(
            TunHold::new(Duration::ZERO, limits)
                .hold(p, a, (), packet(1), t0)
                .is_err(),
            "a zero bound holds nothing"
        );
    }
}
