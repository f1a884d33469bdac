use super::*;
use crate::tun::checksum;
use crate::tun::gso::{complete_checksum, Segments, TCP_FIN};
use crate::tun::testpkt::{tcp_packet, tcp_valid, Tcp};
use crate::tun::vnet::VIRTIO_NET_HDR_GSO_NONE;
use proptest::prelude::*;

const TS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7];

/// A flow's segment `n` (sequence numbers follow on at 1448 a segment, ids count up).
fn seg(t: &Tcp, n: u32) -> Tcp {
    Tcp {
        seq: t.seq.wrapping_add(n * 1448),
        id: t.id.wrapping_add(n as u16),
        ..t.clone()
    }
}

fn payload(seq: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize + i) as u8).collect()
}

fn pkt(t: &Tcp, len: usize) -> BytesMut {
    BytesMut::from(&tcp_packet(t, &payload(t.seq, len))[..])
}

fn flow(n: u16) -> Tcp {
    Tcp {
        sport: 40000 + n,
        options: TS.to_vec(),
        ..Tcp::default()
    }
}

/// What the kernel receives: per write, the virtio header and the bytes.
fn plan(packets: &mut [BytesMut]) -> Vec<(VnetHdr, Vec<u8>)> {
    let mut c = Coalescer::default();
    c.plan(packets);
    let mut out = Vec::new();
    for w in 0..c.writes() {
        let mut parts = [IoSlice::new(&[]); MAX_WRITE_PARTS];
        let (hdr, n) = c.write(w, packets, &mut parts);
        let bytes: Vec<u8> = parts[..n].iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(c.segments(w) == 1, hdr == VnetHdr::NONE);
        out.push((hdr, bytes));
    }
    out
}

/// A write cut up again as the kernel would (a plain packet is itself).
fn resegment(hdr: &VnetHdr, bytes: &[u8]) -> Vec<Vec<u8>> {
    if hdr.gso_type == VIRTIO_NET_HDR_GSO_NONE {
        return vec![bytes.to_vec()];
    }
    let s = Segments::new(hdr, bytes).expect("a valid super-packet");
    (0..s.len())
        .map(|i| {
            let mut b = BytesMut::new();
            s.append(i, &mut b);
            b.to_vec()
        })
        .collect()
}

fn counts(writes: &[(VnetHdr, Vec<u8>)]) -> Vec<usize> {
    writes.iter().map(|(h, b)| resegment(h, b).len()).collect()
}

#[test]
fn a_bulk_flow_becomes_one_super_packet_the_kernel_accepts() {
    let f = flow(0);
    let mut packets: Vec<BytesMut> = (0..10).map(|n| pkt(&seg(&f, n), 1448)).collect();
    let originals: Vec<Vec<u8>> = packets.iter().map(|p| p.to_vec()).collect();
    let writes = plan(&mut packets);
    assert_eq!(writes.len(), 1);
    let (hdr, bytes) = &writes[0];
    assert_eq!(
        *hdr,
        VnetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        }
    );
    assert_eq!(bytes.len(), 52 + 10 * 1448);
    assert_eq!(
        u16::from_be_bytes([bytes[2], bytes[3]]) as usize,
        bytes.len()
    );
    // Finishing the partial checksum gives a valid packet of the whole payload.
    let mut whole = bytes.clone();
    complete_checksum(&mut whole, 20, 16).expect("checksum position");
    assert!(tcp_valid(&whole));
    // And cut up again it is exactly what came in.
    assert_eq!(resegment(hdr, bytes), originals);
}

#[test]
fn ipv6_flows_merge_too() {
    let f = Tcp {
        v6: true,
        ..flow(0)
    };
    let mut packets: Vec<BytesMut> = (0..3).map(|n| pkt(&seg(&f, n), 1448)).collect();
    let originals: Vec<Vec<u8>> = packets.iter().map(|p| p.to_vec()).collect();
    let writes = plan(&mut packets);
    assert_eq!(writes.len(), 1);
    let (hdr, bytes) = &writes[0];
    assert_eq!(hdr.gso_type, VIRTIO_NET_HDR_GSO_TCPV6);
    assert_eq!((hdr.csum_start, hdr.hdr_len), (40, 72));
    assert_eq!(
        u16::from_be_bytes([bytes[4], bytes[5]]) as usize,
        bytes.len() - 40
    );
    assert_eq!(resegment(hdr, bytes), originals);
}

#[test]
fn interleaved_flows_merge_apart() {
    let flows: Vec<Tcp> = (0..4).map(flow).collect();
    let mut packets = Vec::new();
    for n in 0..5 {
        for f in &flows {
            packets.push(pkt(&seg(f, n), 1448));
        }
    }
    let writes = plan(&mut packets);
    assert_eq!(counts(&writes), vec![5, 5, 5, 5]);
    for (i, (_, bytes)) in writes.iter().enumerate() {
        assert_eq!(u16::from_be_bytes([bytes[20], bytes[21]]), 40000 + i as u16);
    }
}

#[test]
fn a_packet_that_cannot_join_closes_its_flows_run() {
    let f = flow(0);
    let pure_ack = Tcp {
        seq: f.seq.wrapping_add(2 * 1448),
        ..f.clone()
    };
    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        pkt(&seg(&f, 1), 1448),
        pkt(&pure_ack, 0),
        pkt(&seg(&f, 2), 1448),
        pkt(&seg(&f, 3), 1448),
    ];
    let writes = plan(&mut packets);
    // The second run must not take segment 2 ahead of the pure ACK.
    assert_eq!(counts(&writes), vec![2, 1, 2]);
}

#[test]
fn runs_break_where_the_kernel_would() {
    let f = flow(0);
    let cases: Vec<(&str, Tcp, usize)> = vec![
        (
            "sequence gap",
            Tcp {
                seq: f.seq.wrapping_add(3 * 1448),
                ..f.clone()
            },
            1448,
        ),
        (
            "other ACK number",
            Tcp {
                ack: f.ack + 1,
                ..seg(&f, 1)
            },
            1448,
        ),
        (
            "other timestamp",
            Tcp {
                options: vec![1, 1, 8, 10, 0, 0, 0, 10, 0, 0, 0, 7],
                ..seg(&f, 1)
            },
            1448,
        ),
        (
            "other TTL",
            Tcp {
                ttl: 63,
                ..seg(&f, 1)
            },
            1448,
        ),
        (
            "other TOS",
            Tcp {
                tos: 4,
                ..seg(&f, 1)
            },
            1448,
        ),
        ("longer than the first", seg(&f, 1), 1449),
        (
            "FIN",
            Tcp {
                flags: TCP_ACK | TCP_FIN,
                ..seg(&f, 1)
            },
            1448,
        ),
        (
            "no ACK",
            Tcp {
                flags: TCP_PSH,
                ..seg(&f, 1)
            },
            1448,
        ),
    ];
    for (what, second, len) in cases {
        let mut packets = vec![pkt(&seg(&f, 0), 1448), pkt(&second, len)];
        assert_eq!(counts(&plan(&mut packets)), vec![1, 1], "{what}");
    }
}

#[test]
fn psh_and_a_short_segment_end_a_run() {
    let f = flow(0);
    let psh = Tcp {
        flags: TCP_ACK | TCP_PSH,
        ..seg(&f, 1)
    };
    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        pkt(&psh, 1448),
        pkt(&seg(&f, 2), 1448),
    ];
    let writes = plan(&mut packets);
    assert_eq!(counts(&writes), vec![2, 1]);
    // PSH is carried by the merged packet.
    assert_eq!(writes[0].1[20 + 13], TCP_ACK | TCP_PSH);

    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        pkt(&seg(&f, 1), 100),
        pkt(
            &Tcp {
                seq: f.seq.wrapping_add(1448 + 100),
                ..f.clone()
            },
            1448,
        ),
    ];
    assert_eq!(counts(&plan(&mut packets)), vec![2, 1]);
}

#[test]
fn a_corrupt_segment_is_never_merged() {
    let f = flow(0);
    let corrupt = |mut p: BytesMut| {
        let last = p.len() - 1;
        p[last] ^= 1;
        p
    };
    // The second is corrupt: the first alone, the second alone, the rest merged.
    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        corrupt(pkt(&seg(&f, 1), 1448)),
        pkt(&seg(&f, 2), 1448),
        pkt(&seg(&f, 3), 1448),
    ];
    let writes = plan(&mut packets);
    assert_eq!(counts(&writes), vec![1, 1, 2]);
    // Written as they came, so the kernel sees (and drops) the corrupt one.
    assert!(!tcp_valid(&writes[1].1));

    // The first is corrupt: it goes alone, the others merge.
    let mut packets = vec![
        corrupt(pkt(&seg(&f, 0), 1448)),
        pkt(&seg(&f, 1), 1448),
        pkt(&seg(&f, 2), 1448),
    ];
    assert_eq!(counts(&plan(&mut packets)), vec![1, 2]);

    // A corrupt IPv4 header: not merged either.
    let mut bad_ip = pkt(&seg(&f, 1), 1448);
    bad_ip[8] ^= 0x10;
    let mut packets = vec![pkt(&seg(&f, 0), 1448), bad_ip];
    assert_eq!(counts(&plan(&mut packets)), vec![1, 1]);
}

#[test]
fn other_packets_pass_alone_and_leave_tcp_runs_alone() {
    let f = flow(0);
    let mut udp = pkt(&seg(&f, 1), 8);
    udp[9] = 17;
    let mut fragment = pkt(&seg(&f, 1), 1448);
    fragment[6] |= 0x20; // more fragments
    let mut options = pkt(&seg(&f, 1), 1448);
    options[0] = 0x46;
    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        udp,
        pkt(&seg(&f, 1), 1448),
        BytesMut::from(&[0x45u8, 0, 0][..]),
        BytesMut::new(),
        pkt(&seg(&f, 2), 1448),
    ];
    assert_eq!(counts(&plan(&mut packets)), vec![3, 1, 1, 1]);
    for odd in [fragment, options] {
        let mut packets = vec![pkt(&seg(&f, 0), 1448), odd];
        assert_eq!(counts(&plan(&mut packets)), vec![1, 1]);
    }
}

#[test]
fn a_packet_of_the_flow_with_ip_options_closes_its_run() {
    let f = flow(0);
    // A bare ACK at segment 1's sequence number, with a 4-byte IPv4 option (NOP NOP NOP EOL)
    // and its header checksum.
    let plain = pkt(&seg(&f, 1), 0);
    let mut with_options = plain[..20].to_vec();
    with_options[0] = 0x46;
    with_options.extend_from_slice(&[1, 1, 1, 0]);
    with_options.extend_from_slice(&plain[20..]);
    let total = with_options.len() as u16;
    with_options[2..4].copy_from_slice(&total.to_be_bytes());
    with_options[10..12].copy_from_slice(&[0, 0]);
    let c = checksum::ipv4_header(&with_options[..24]);
    with_options[10..12].copy_from_slice(&c.to_be_bytes());
    let mut packets = vec![
        pkt(&seg(&f, 0), 1448),
        BytesMut::from(&with_options[..]),
        pkt(&seg(&f, 1), 1448),
    ];
    // Its ports are after the options: it is of the flow, so segment 1 may not join
    // segment 0 ahead of it.
    assert_eq!(counts(&plan(&mut packets)), vec![1, 1, 1]);
}

#[test]
fn a_packet_whose_flow_cannot_be_told_closes_every_run() {
    let (a, b) = (flow(0), flow(1));
    let mut fragment = pkt(&seg(&a, 1), 1448);
    fragment[6..8].copy_from_slice(&[0x00, 0x10]); // offset 128 bytes: no TCP header
    let mut ipv6_hop_by_hop = pkt(
        &Tcp {
            v6: true,
            ..seg(&a, 1)
        },
        1448,
    );
    ipv6_hop_by_hop[6] = 0;
    for odd in [fragment, ipv6_hop_by_hop] {
        let mut packets = vec![
            pkt(&seg(&a, 0), 1448),
            pkt(&seg(&b, 0), 1448),
            odd,
            pkt(&seg(&a, 1), 1448),
            pkt(&seg(&b, 1), 1448),
            pkt(&seg(&a, 2), 1448),
            pkt(&seg(&b, 2), 1448),
        ];
        // Neither run may take segment 1 ahead of it; merging resumes after it.
        assert_eq!(counts(&plan(&mut packets)), vec![1, 1, 1, 2, 2]);
    }
}

#[test]
fn runs_stop_at_64_segments_and_64_kib() {
    let f = flow(0);
    // 100-byte payloads: sequence numbers follow on at 100.
    let mut packets: Vec<BytesMut> = (0..70)
        .map(|n| {
            let t = Tcp {
                seq: f.seq + 100 * n,
                ..f.clone()
            };
            pkt(&t, 100)
        })
        .collect();
    assert_eq!(counts(&plan(&mut packets)), vec![64, 6]);

    let mut packets: Vec<BytesMut> = (0..50).map(|n| pkt(&seg(&f, n), 1448)).collect();
    let writes = plan(&mut packets);
    // (65535 - 52) / 1448 = 45 segments fit one IPv4 packet.
    assert_eq!(counts(&writes), vec![45, 5]);
    assert!(writes.iter().all(|(_, b)| b.len() <= 65535));
}

#[test]
fn the_oldest_flow_is_closed_when_too_many_are_open() {
    let flows: Vec<Tcp> = (0..(MAX_OPEN_FLOWS as u16 + 1)).map(flow).collect();
    let mut packets = Vec::new();
    for n in 0..2 {
        for f in &flows {
            packets.push(pkt(&seg(f, n), 1448));
        }
    }
    let writes = plan(&mut packets);
    // Flow 0 was closed for flow 8, so its second segment goes alone; flow 1 was closed for
    // flow 0's second, and so on round the table.
    assert_eq!(writes.len(), 18);
    assert!(counts(&writes).iter().all(|&c| c == 1));
}

/// What the kernel ends up with for one flow: sequence number, payload and the FIN/PSH flags of
/// each segment, in order.
type FlowView = Vec<(u32, Vec<u8>, u8)>;

fn by_flow(packets: &[Vec<u8>]) -> std::collections::BTreeMap<u16, FlowView> {
    let mut flows = std::collections::BTreeMap::<u16, FlowView>::new();
    for p in packets {
        let sport = u16::from_be_bytes([p[20], p[21]]);
        let hdr = 20 + usize::from(p[32] >> 4) * 4;
        let seq = u32::from_be_bytes([p[24], p[25], p[26], p[27]]);
        flows
            .entry(sport)
            .or_default()
            .push((seq, p[hdr..].to_vec(), p[33] & (TCP_FIN | TCP_PSH)));
    }
    flows
}

proptest! {
    /// Random batches of a few flows with gaps, PSH, short segments, pure ACKs and corrupt
    /// packets: every packet reaches the kernel once, each flow in its order, and every merged
    /// write cuts up into valid segments carrying exactly the bytes that came in.
    #[test]
    fn every_flow_arrives_whole_and_in_order(
        steps in proptest::collection::vec((0u16..3, 0u8..12), 1..120),
    ) {
        let flows: Vec<Tcp> = (0..3).map(flow).collect();
        let mut next_seq: Vec<u32> = flows.iter().map(|f| f.seq).collect();
        let mut packets = Vec::new();
        for (f, what) in steps {
            let t = &flows[usize::from(f)];
            let seq = next_seq[usize::from(f)];
            let (len, flags, gap) = match what {
                0 => (700, TCP_ACK, 0),
                1 => (1448, TCP_ACK | TCP_PSH, 0),
                2 => (0, TCP_ACK, 0),
                3 => (1448, TCP_ACK, 1448),
                _ => (1448, TCP_ACK, 0),
            };
            let seq = seq.wrapping_add(gap);
            let mut p = pkt(&Tcp { seq, flags, ..t.clone() }, len);
            if what == 11 {
                let last = p.len() - 1;
                p[last] ^= 0x55;
            }
            next_seq[usize::from(f)] = seq.wrapping_add(len as u32);
            packets.push(p);
        }
        let want = by_flow(&packets.iter().map(|p| p.to_vec()).collect::<Vec<_>>());
        let writes = plan(&mut packets);
        let mut arrived = Vec::new();
        for (hdr, bytes) in &writes {
            let segs = resegment(hdr, bytes);
            if segs.len() > 1 {
                for s in &segs {
                    prop_assert!(tcp_valid(s));
                }
            }
            arrived.extend(segs);
        }
        prop_assert_eq!(arrived.len(), packets.len());
        prop_assert_eq!(by_flow(&arrived), want);
    }
}
