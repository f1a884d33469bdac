//! Coalescing packets before they are written into the device: consecutive segments of one
//! TCP flow go in as one super-packet, so the kernel runs its receive path (which a tun write
//! does inline, in the writer's time) once for many segments instead of once per segment.
//!
//! [`Coalescer::plan`] looks at a batch of whole IP packets, in the order they arrived, and
//! groups them into runs. A packet joins the open run of its flow (same addresses and ports)
//! only if the kernel's own GRO would have merged it (Linux `tcp_gro_receive`):
//!
//! * both are TCP over IPv4 without options and not fragmented, or over IPv6 without
//!   extension headers; flags only ACK (and PSH, which ends the run); a payload;
//! * the same ACK number, TCP header length and option bytes (timestamps included), the same
//!   TOS / traffic class and flow label, TTL / hop limit and IPv4 DF bit;
//! * its sequence number is where the run ends; every segment but the last carries the same
//!   payload length as the first, the last no more;
//! * at most [`MAX_SEGMENTS`] segments and 64 KiB of IP packet;
//! * its TCP checksum (and the first packet's, checked when the second joins) is valid: a
//!   merged packet leaves the checksum to the kernel, so a corrupt segment must not hide in
//!   it.
//!
//! Anything else is written alone. A TCP packet that cannot join closes its flow's run, and a
//! packet that may be TCP of a flow that cannot be told (an IPv4 fragment after the first,
//! IPv6 behind extension headers) closes every run, so the packets of one flow reach the
//! kernel in the order they came. Runs are written in the order of their first packet. A
//! merged run is written as its first packet (IP length, IPv4 header checksum, PSH and a
//! pseudo-header checksum patched in place) followed by the payloads of the others, with a
//! virtio header that tells the kernel the segment size and where the checksum goes: one
//! `writev`, no copy.
//!
//! Planning allocates nothing once the coalescer's vectors have grown to the batch size.

use std::io::IoSlice;

use bytes::BytesMut;

use super::checksum::{self, Sum};
use super::gso::{IPPROTO_TCP, TCP_ACK, TCP_CSUM, TCP_FLAGS, TCP_PSH};
use super::vnet::{
    VnetHdr, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// Most segments merged into one super-packet (bounds the buffers of one `writev`).
pub const MAX_SEGMENTS: usize = 64;

/// Most flows with a run open at once; the oldest is closed for a new one.
pub const MAX_OPEN_FLOWS: usize = 8;

/// Buffers one planned write needs at most (the packet parts; the virtio header comes first).
pub const MAX_WRITE_PARTS: usize = MAX_SEGMENTS;

/// The longest IP packet (IPv4 total length; IPv6 payload length for IPv6).
const MAX_IP_LEN: usize = u16::MAX as usize;

/// Marks the end of a run's member list.
const END: u32 = u32::MAX;

/// Plans the writes of a batch of packets; keep one per writer and reuse it.
#[derive(Debug, Default)]
pub struct Coalescer {
    runs: Vec<Run>,
    /// For each packet of the batch, the next packet of its run.
    next: Vec<u32>,
    /// Runs that may still grow (indices into `runs`), oldest first.
    open: Vec<u32>,
}

/// One write: a packet alone, or a run of segments of one flow.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u32,
    last: u32,
    count: u16,
    /// What `first` is (only meaningful for TCP candidates).
    seg: Seg,
    /// Payload bytes of all members.
    bytes: usize,
    /// Payload of the last member.
    last_len: usize,
    next_seq: u32,
    psh: bool,
    /// Whether the first packet's TCP checksum has been verified.
    checked: bool,
}

/// What a packet is, as far as merging goes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// TCP of a known flow.
    Tcp(Seg),
    /// Not TCP (UDP, ICMP, or nothing the kernel would take): leaves every run alone.
    Other,
    /// Perhaps TCP, of a flow that cannot be told (an IPv4 fragment after the first, IPv6
    /// behind extension headers): closes every open run, so that no flow's later segments
    /// overtake it.
    Unknown,
}

/// What a TCP packet is, as far as merging goes.
#[derive(Debug, Clone, Copy, Default)]
struct Seg {
    v6: bool,
    /// IP header length: 20 to 60 for IPv4, 40 for IPv6.
    iph: usize,
    /// IP and TCP header length.
    hdr: usize,
    payload: usize,
    seq: u32,
    flags: u8,
    /// Whether it can take part in a run at all (else it is only known to be TCP, so its
    /// flow can be closed).
    candidate: bool,
}

impl Coalescer {
    /// A coalescer with room for `batch` packets.
    pub fn with_capacity(batch: usize) -> Coalescer {
        Coalescer {
            runs: Vec::with_capacity(batch),
            next: Vec::with_capacity(batch),
            open: Vec::with_capacity(MAX_OPEN_FLOWS),
        }
    }

    /// Plans the writes of `packets` (whole IP packets, in arrival order) and patches the
    /// headers of the first packet of every merged run. Then [`Coalescer::writes`] and
    /// [`Coalescer::write`] give them out.
    pub fn plan(&mut self, packets: &mut [BytesMut]) {
        self.runs.clear();
        self.open.clear();
        self.next.clear();
        self.next.resize(packets.len(), END);
        for i in 0..packets.len() {
            self.add(packets, i);
        }
        for run in &self.runs {
            if run.count > 1 {
                finish(run, &mut packets[run.first as usize]);
            }
        }
    }

    /// How many writes the last plan made.
    pub fn writes(&self) -> usize {
        self.runs.len()
    }

    /// How many packets write `w` carries.
    pub fn segments(&self, w: usize) -> usize {
        self.runs.get(w).map_or(0, |r| usize::from(r.count))
    }

    /// Write `w` of the last plan: its virtio header, and its packet parts in `parts`; returns
    /// how many parts it filled. `packets` must be the batch the plan was made for.
    pub fn write<'p>(
        &self,
        w: usize,
        packets: &'p [BytesMut],
        parts: &mut [IoSlice<'p>; MAX_WRITE_PARTS],
    ) -> (VnetHdr, usize) {
        let Some(run) = self.runs.get(w) else {
            return (VnetHdr::NONE, 0);
        };
        parts[0] = IoSlice::new(&packets[run.first as usize]);
        if run.count == 1 {
            return (VnetHdr::NONE, 1);
        }
        let mut n = 1;
        let mut i = self.next[run.first as usize];
        while i != END && n < MAX_WRITE_PARTS {
            parts[n] = IoSlice::new(&packets[i as usize][run.seg.hdr..]);
            n += 1;
            i = self.next[i as usize];
        }
        let hdr = VnetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: if run.seg.v6 {
                VIRTIO_NET_HDR_GSO_TCPV6
            } else {
                VIRTIO_NET_HDR_GSO_TCPV4
            },
            hdr_len: run.seg.hdr as u16,
            gso_size: run.seg.payload as u16,
            csum_start: run.seg.iph as u16,
            csum_offset: TCP_CSUM as u16,
        };
        (hdr, n)
    }

    fn add(&mut self, packets: &[BytesMut], i: usize) {
        let pkt = &packets[i][..];
        let seg = match parse(pkt) {
            Kind::Tcp(seg) => seg,
            kind => {
                if matches!(kind, Kind::Unknown) {
                    self.open.clear();
                }
                self.push(i, Seg::default(), false);
                return;
            }
        };
        let open = self.open.iter().position(|&r| {
            let run = &self.runs[r as usize];
            same_flow(&packets[run.first as usize], &run.seg, pkt, &seg)
        });
        if !seg.candidate {
            if let Some(pos) = open {
                self.open.remove(pos);
            }
            self.push(i, seg, false);
            return;
        }
        if let Some(pos) = open {
            let r = self.open[pos] as usize;
            let first = &packets[self.runs[r].first as usize][..];
            if can_join(&self.runs[r], first, &seg, pkt) {
                let run = &mut self.runs[r];
                if !run.checked {
                    if !tcp_checksum_ok(first, &run.seg) {
                        // The first stays alone; this packet starts a new run.
                        self.open.remove(pos);
                        self.push(i, seg, true);
                        return;
                    }
                    run.checked = true;
                }
                if !tcp_checksum_ok(pkt, &seg) {
                    self.open.remove(pos);
                    self.push(i, seg, false);
                    return;
                }
                self.next[run.last as usize] = i as u32;
                run.last = i as u32;
                run.count += 1;
                run.bytes += seg.payload;
                run.last_len = seg.payload;
                run.next_seq = seg.seq.wrapping_add(seg.payload as u32);
                run.psh = seg.flags & TCP_PSH != 0;
                let full = run.psh
                    || usize::from(run.count) == MAX_SEGMENTS
                    || seg.payload < run.seg.payload
                    || ip_len(run) + run.seg.payload > MAX_IP_LEN;
                if full {
                    self.open.remove(pos);
                }
                return;
            }
            self.open.remove(pos);
        }
        let can_grow = seg.flags & TCP_PSH == 0;
        self.push(i, seg, can_grow);
    }

    /// Starts a run with packet `i`; `open`: it may take more packets.
    fn push(&mut self, i: usize, seg: Seg, open: bool) {
        let r = self.runs.len() as u32;
        self.runs.push(Run {
            first: i as u32,
            last: i as u32,
            count: 1,
            seg,
            bytes: seg.payload,
            last_len: seg.payload,
            next_seq: seg.seq.wrapping_add(seg.payload as u32),
            psh: seg.flags & TCP_PSH != 0,
            checked: false,
        });
        if open {
            if self.open.len() == MAX_OPEN_FLOWS {
                self.open.remove(0);
            }
            self.open.push(r);
        }
    }
}

/// IPv6 next-header values of extension headers a TCP header may sit behind (RFC 8200 4,
/// RFC 7045): hop-by-hop, routing, fragment, ESP, AH, destination options, mobility, HIP,
/// shim6, experiments.
const IPV6_EXTENSION_HEADERS: [u8; 11] = [0, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254];

/// What `pkt` is for merging.
fn parse(pkt: &[u8]) -> Kind {
    let Some(&first) = pkt.first() else {
        return Kind::Other;
    };
    let (v6, iph, plain_ip) = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            if ihl < 20 || pkt.len() < ihl || pkt[9] != IPPROTO_TCP {
                return Kind::Other;
            }
            let frag = u16::from_be_bytes([pkt[6], pkt[7]]);
            if frag & 0x1fff != 0 {
                return Kind::Unknown;
            }
            let plain = ihl == 20
                && usize::from(u16::from_be_bytes([pkt[2], pkt[3]])) == pkt.len()
                && frag & 0x2000 == 0
                && Sum::default().add(&pkt[..20]).fold() == 0xffff;
            (false, ihl, plain)
        }
        6 => {
            if pkt.len() < 40 {
                return Kind::Other;
            }
            if pkt[6] != IPPROTO_TCP {
                return if IPV6_EXTENSION_HEADERS.contains(&pkt[6]) {
                    Kind::Unknown
                } else {
                    Kind::Other
                };
            }
            let plain = usize::from(u16::from_be_bytes([pkt[4], pkt[5]])) + 40 == pkt.len();
            (true, 40, plain)
        }
        _ => return Kind::Other,
    };
    let Some(tcp) = pkt.get(iph..iph + 20) else {
        return Kind::Other;
    };
    let hdr = iph + usize::from(tcp[12] >> 4) * 4;
    if hdr < iph + 20 || hdr > pkt.len() {
        return Kind::Other;
    }
    let flags = tcp[TCP_FLAGS];
    let payload = pkt.len() - hdr;
    Kind::Tcp(Seg {
        v6,
        iph,
        hdr,
        payload,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags,
        candidate: plain_ip
            && payload > 0
            && flags & TCP_ACK != 0
            && flags & !(TCP_ACK | TCP_PSH) == 0,
    })
}

/// Whether `pkt` (parsed as `seg`) has the addresses and ports of `first` (parsed as
/// `first_seg`).
fn same_flow(first: &[u8], first_seg: &Seg, pkt: &[u8], seg: &Seg) -> bool {
    let addrs = if seg.v6 { 8..40 } else { 12..20 };
    first_seg.v6 == seg.v6
        && first.get(addrs.clone()) == pkt.get(addrs)
        && first.get(first_seg.iph..first_seg.iph + 4) == pkt.get(seg.iph..seg.iph + 4)
}

/// Whether `pkt` may follow the run that starts with `first` (same flow already known).
fn can_join(run: &Run, first: &[u8], seg: &Seg, pkt: &[u8]) -> bool {
    let f = &run.seg;
    let ip_same = if seg.v6 {
        first[..4] == pkt[..4] && first[7] == pkt[7]
    } else {
        first[1] == pkt[1] && first[8] == pkt[8] && first[6] & 0xe0 == pkt[6] & 0xe0
    };
    ip_same
        && seg.hdr == f.hdr
        // ACK number, then the options.
        && first[f.iph + 8..f.iph + 12] == pkt[seg.iph + 8..seg.iph + 12]
        && first[f.iph + 20..f.hdr] == pkt[seg.iph + 20..seg.hdr]
        && seg.seq == run.next_seq
        && !run.psh
        && run.last_len == f.payload
        && seg.payload <= f.payload
        && usize::from(run.count) < MAX_SEGMENTS
        && ip_len(run) + seg.payload <= MAX_IP_LEN
}

/// The length field the merged run would carry so far: the IPv4 total length, or the IPv6
/// payload length.
fn ip_len(run: &Run) -> usize {
    let headers = if run.seg.v6 {
        run.seg.hdr - 40
    } else {
        run.seg.hdr
    };
    headers + run.bytes
}

fn tcp_checksum_ok(pkt: &[u8], seg: &Seg) -> bool {
    let (src, dst) = addresses(pkt, seg.v6);
    let tcp = &pkt[seg.iph..];
    checksum::pseudo_header(src, dst, IPPROTO_TCP, tcp.len() as u32)
        .add(tcp)
        .fold()
        == 0xffff
}

fn addresses(pkt: &[u8], v6: bool) -> (&[u8], &[u8]) {
    if v6 {
        (&pkt[8..24], &pkt[24..40])
    } else {
        (&pkt[12..16], &pkt[16..20])
    }
}

/// Patches the first packet of a merged run into the header of the super-packet: IP length,
/// IPv4 header checksum, PSH from the last segment, and the pseudo-header sum in the TCP
/// checksum field (the kernel adds the segment's sum: `CHECKSUM_PARTIAL`).
fn finish(run: &Run, first: &mut BytesMut) {
    let seg = &run.seg;
    let tcp_len = seg.hdr - seg.iph + run.bytes;
    if seg.v6 {
        first[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    } else {
        first[2..4].copy_from_slice(&((seg.iph + tcp_len) as u16).to_be_bytes());
        first[10..12].copy_from_slice(&[0, 0]);
        let c = checksum::ipv4_header(&first[..20]);
        first[10..12].copy_from_slice(&c.to_be_bytes());
    }
    if run.psh {
        first[seg.iph + TCP_FLAGS] |= TCP_PSH;
    }
    let (src, dst) = addresses(first, seg.v6);
    let partial = checksum::pseudo_header(src, dst, IPPROTO_TCP, tcp_len as u32).fold();
    first[seg.iph + TCP_CSUM..seg.iph + TCP_CSUM + 2].copy_from_slice(&partial.to_be_bytes());
}

#[cfg(test)]
mod tests;
