//! The reliability layer through its public API: one test per window rule, the ACK arrays of
//! the real capture (reference 4.5), and a property test of two endpoints exchanging messages
//! over a lossy, duplicating, reordering channel on a virtual clock.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use protocol::ids::MessageId;
use protocol::reliable::{
    AckList, Message, PayloadLimits, PeerFamily, Received, Reliable, ReliableError, TlsMtu,
    WrapOverhead, CONTROL_SEND_ACK_MAX, DEFAULT_TLS_TIMEOUT, RELIABLE_ACK_SIZE,
    TLS_RELIABLE_N_REC_BUFFERS, TLS_RELIABLE_N_SEND_BUFFERS,
};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

const P_CONTROL_V1: u8 = protocol::opcode::P_CONTROL_V1;

fn ids(list: &AckList) -> Vec<u32> {
    list.as_slice().iter().map(|m| m.0).collect()
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn drain_transmit(rel: &mut Reliable, now: Instant) -> Vec<(u32, Vec<u32>)> {
    std::iter::from_fn(|| rel.poll_transmit(now))
        .map(|t| (t.message.id.0, ids(&t.acks)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Window rules.

#[test]
fn receive_window_edge_at_twelve() {
    let mut rel = Reliable::new(DEFAULT_TLS_TIMEOUT);
    let msg = |i: u32| (MessageId(i), P_CONTROL_V1, Bytes::from(vec![i as u8]));

    // expect = 0: id 12 breaks sequentiality, is dropped and not acknowledged.
    let (id, tag, p) = msg(TLS_RELIABLE_N_REC_BUFFERS as u32);
    assert_eq!(rel.handle_message(id, tag, p), Received::BeyondWindow);
    assert!(!rel.needs_ack_packet());

    // id 11, the last slot, is stored and acknowledged, but not deliverable yet.
    let (id, tag, p) = msg(11);
    assert_eq!(rel.handle_message(id, tag, p), Received::Stored);
    assert_eq!(rel.acks().pending(), [MessageId(11)]);
    assert!(rel.poll_deliver().is_none());

    for i in (0..11).rev() {
        let (id, tag, p) = msg(i);
        assert_eq!(rel.handle_message(id, tag, p), Received::Stored);
    }
    let delivered: Vec<u8> = std::iter::from_fn(|| rel.poll_deliver())
        .map(|m| m.payload[0])
        .collect();
    assert_eq!(delivered, (0..12).collect::<Vec<u8>>());
    assert_eq!(rel.recv().expect(), MessageId(12));

    // Old id: not stored, acknowledged again.
    let _ = rel.poll_ack();
    let (id, tag, p) = msg(5);
    assert_eq!(rel.handle_message(id, tag, p), Received::Duplicate);
    assert_eq!(rel.acks().pending(), [MessageId(5)]);
    // Already buffered: same.
    let (id, tag, p) = msg(13);
    assert_eq!(rel.handle_message(id, tag, p), Received::Stored);
    let (id, tag, p) = msg(13);
    assert_eq!(rel.handle_message(id, tag, p), Received::Duplicate);
    assert!(rel.poll_deliver().is_none());

    // Every buffer taken (12..=23 stored, none delivered): even a duplicate is ignored, no ACK.
    for i in 12..24 {
        let (id, tag, p) = msg(i);
        rel.handle_message(id, tag, p);
    }
    assert_eq!(rel.recv().buffered(), TLS_RELIABLE_N_REC_BUFFERS);
    let _ = rel.poll_ack();
    let (id, tag, p) = msg(14);
    assert_eq!(rel.handle_message(id, tag, p), Received::NoBuffer);
    assert!(!rel.needs_ack_packet());
}

#[test]
fn at_most_six_in_flight() {
    let t0 = Instant::now();
    let mut rel = Reliable::new(DEFAULT_TLS_TIMEOUT);
    for i in 0..TLS_RELIABLE_N_SEND_BUFFERS as u32 {
        assert_eq!(rel.queue(P_CONTROL_V1, Bytes::new(), t0), Ok(MessageId(i)));
    }
    assert_eq!(
        rel.queue(P_CONTROL_V1, Bytes::new(), t0),
        Err(ReliableError::SendWindowFull {
            next: MessageId(6),
            lowest_unacked: MessageId(0)
        })
    );
    // ACKs for everything but the lowest do not open the window: it is `next - lowest < 6`.
    rel.handle_acks(&[1, 2, 3, 4, 5].map(MessageId), t0);
    assert_eq!(rel.send().in_flight(), 1);
    assert_eq!(rel.send().window_available(), 0);
    assert!(rel.queue(P_CONTROL_V1, Bytes::new(), t0).is_err());
    rel.handle_acks(&[MessageId(0)], t0);
    assert!(rel.all_acked());
    assert_eq!(rel.send().window_available(), 6);

    // Segmenting stops at the window too; the rest of the stream waits.
    let limits = PayloadLimits {
        tls_mtu: TlsMtu::new(400).expect("mtu"),
        wrap: WrapOverhead::None,
        peer_family: PeerFamily::Ipv4,
    };
    let max = rel.max_payload(&limits);
    assert_eq!(max, 400 - (1 + 8 + 1 + 4 + 28));
    let mut stream = BytesMut::from(&vec![7u8; 10 * max][..]);
    assert_eq!(rel.queue_stream(P_CONTROL_V1, &mut stream, &limits, t0), 6);
    assert_eq!(stream.len(), 4 * max);
    assert_eq!(rel.send().next_id(), MessageId(12));
}

#[test]
fn retransmit_backoff_doubles_2_4_8() {
    let t0 = Instant::now();
    let mut rel = Reliable::new(DEFAULT_TLS_TIMEOUT);
    rel.queue(P_CONTROL_V1, Bytes::from_static(b"x"), t0)
        .expect("window");
    assert_eq!(rel.poll_timeout(), Some(t0));
    let mut sent_at = vec![];
    let mut now = t0;
    while sent_at.len() < 4 {
        if rel.poll_transmit(now).is_some() {
            sent_at.push(now - t0);
            assert!(rel.poll_transmit(now).is_none());
        }
        // Nothing is sent a moment before the deadline.
        let next = rel.poll_timeout().expect("unacked");
        assert!(rel.poll_transmit(next - secs(0.001)).is_none());
        now = next;
    }
    assert_eq!(sent_at, [secs(0.0), secs(2.0), secs(6.0), secs(14.0)]);

    // The initial timeout is configurable; burst makes it due now with the initial timeout.
    let mut rel = Reliable::new(secs(5.0));
    rel.queue(P_CONTROL_V1, Bytes::new(), t0).expect("window");
    rel.poll_transmit(t0).expect("due");
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(5.0)));
    rel.poll_transmit(t0 + secs(5.0)).expect("due");
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(15.0)));
    rel.burst(t0 + secs(6.0));
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(6.0)));
    rel.poll_transmit(t0 + secs(6.0)).expect("burst");
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(11.0)));
}

#[test]
fn fast_retransmit_after_three_higher_acks() {
    let t0 = Instant::now();
    let mut rel = Reliable::new(DEFAULT_TLS_TIMEOUT);
    for _ in 0..5 {
        rel.queue(P_CONTROL_V1, Bytes::new(), t0).expect("window");
    }
    assert_eq!(drain_transmit(&mut rel, t0).len(), 5);

    let t1 = t0 + secs(0.5);
    rel.handle_acks(&[MessageId(1)], t1);
    rel.handle_acks(&[MessageId(2)], t1);
    assert!(rel.poll_transmit(t1).is_none());
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(2.0)));
    // The third higher id: 0 is resent before its timer; 4 has seen no higher ACK.
    rel.handle_acks(&[MessageId(3)], t1);
    assert_eq!(rel.poll_timeout(), Some(t1));
    assert_eq!(drain_transmit(&mut rel, t1), [(0, vec![])]);
    assert_eq!(rel.poll_timeout(), Some(t0 + secs(2.0)));

    // The count restarts with the resend; re-acks of acknowledged ids count (as upstream).
    let t2 = t1 + secs(0.5);
    rel.handle_acks(&[MessageId(3), MessageId(2)], t2);
    assert!(rel.poll_transmit(t2).is_none());
    rel.handle_acks(&[MessageId(1), MessageId(0), MessageId(99)], t2);
    // 0 is now acknowledged; 4 saw only 99 above it. Unknown ids are otherwise ignored.
    assert_eq!(rel.send().lowest_unacked(), Some(MessageId(4)));
    assert!(rel.poll_transmit(t2).is_none());
}

#[test]
fn mru_reacks_match_the_capture() {
    // Client view of reference 4.5 (server message ids 0..=5).
    let t0 = Instant::now();
    let mut client = Reliable::new(DEFAULT_TLS_TIMEOUT);
    client.queue(56, Bytes::new(), t0).expect("reset");
    assert_eq!(drain_transmit(&mut client, t0), [(0, vec![])]);

    // Server reset (msg 0) acknowledges ours; the ClientHello carries [0].
    client.handle_acks(&[MessageId(0)], t0);
    assert!(client.all_acked());
    client.handle_message(MessageId(0), 64, Bytes::new());
    client.poll_deliver().expect("reset");
    client
        .queue(P_CONTROL_V1, Bytes::from_static(b"hello"), t0)
        .expect("window");
    assert_eq!(drain_transmit(&mut client, t0), [(1, vec![0])]);
    assert!(client.poll_ack().is_none());

    // Server msg 1: nothing to send, so a P_ACK_V1 [1, 0].
    client.handle_acks(&[MessageId(1), MessageId(0)], t0);
    client.handle_message(MessageId(1), P_CONTROL_V1, Bytes::new());
    assert!(client.needs_ack_packet());
    assert_eq!(client.poll_ack().map(|a| ids(&a)), Some(vec![1, 0]));
    assert!(!client.needs_ack_packet());

    // Server msg 2, then the client flight in two messages: [2, 1, 0] on both.
    client.handle_message(MessageId(2), P_CONTROL_V1, Bytes::new());
    client
        .queue(P_CONTROL_V1, Bytes::new(), t0)
        .expect("window");
    client
        .queue(P_CONTROL_V1, Bytes::new(), t0)
        .expect("window");
    assert_eq!(
        drain_transmit(&mut client, t0),
        [(2, vec![2, 1, 0]), (3, vec![2, 1, 0])]
    );
    assert!(client.poll_ack().is_none());

    // Server msgs 3, 4, 5 each answered by a P_ACK_V1.
    let mut acks = vec![];
    for i in 3..=5 {
        client.handle_message(MessageId(i), P_CONTROL_V1, Bytes::new());
        acks.push(client.poll_ack().map(|a| ids(&a)).expect("ack due"));
    }
    assert_eq!(
        acks,
        [
            vec![3, 2, 1, 0],
            vec![4, 3, 2, 1, 0],
            vec![5, 4, 3, 2, 1, 0]
        ]
    );
    // Delivery happened in order throughout.
    let ids: Vec<u32> = std::iter::from_fn(|| client.poll_deliver())
        .map(|m| m.id.0)
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
}

#[test]
fn server_hello_flight_is_cut_at_1164_bytes() {
    // Server view of reference 4.5: client reset acknowledged in our reset, ClientHello
    // (msg 1) pending, so two ACKs will ride along: 1250 - 86 = 1164.
    let t0 = Instant::now();
    let limits = PayloadLimits {
        tls_mtu: TlsMtu::DEFAULT,
        wrap: WrapOverhead::TlsAuth { hmac_len: 20 },
        peer_family: PeerFamily::Ipv4,
    };
    let mut server = Reliable::new(DEFAULT_TLS_TIMEOUT);
    server.handle_message(MessageId(0), 56, Bytes::new());
    server.queue(64, Bytes::new(), t0).expect("reset");
    assert_eq!(drain_transmit(&mut server, t0), [(0, vec![0])]);
    server.handle_acks(&[MessageId(0)], t0);
    server.handle_message(MessageId(1), P_CONTROL_V1, Bytes::from(vec![0x16; 277]));
    assert_eq!(server.max_payload(&limits), 1164);

    let mut flight = BytesMut::from(&vec![0x16; 1164 + 141][..]);
    assert_eq!(
        server.queue_stream(P_CONTROL_V1, &mut flight, &limits, t0),
        2
    );
    assert!(flight.is_empty());
    let sent: Vec<(u32, usize, Vec<u32>)> = std::iter::from_fn(|| server.poll_transmit(t0))
        .map(|t| (t.message.id.0, t.message.payload.len(), ids(&t.acks)))
        .collect();
    assert_eq!(sent, [(1, 1164, vec![1, 0]), (2, 141, vec![1, 0])]);
}

// ---------------------------------------------------------------------------------------------
// Two endpoints over a simulated channel.

/// What one simulated packet carries: a control message and/or an ACK array, as on the wire
/// (a P_CONTROL_V1-like packet or a P_ACK_V1).
#[derive(Debug, Clone)]
struct Packet {
    message: Option<Message>,
    acks: AckList,
}

const TAG_MESSAGE: u8 = 1;
const TAG_STREAM: u8 = 2;

struct Endpoint {
    rel: Reliable,
    /// Discrete messages still to queue (tag 1).
    outbox: VecDeque<Bytes>,
    /// Byte stream still to cut and queue (tag 2).
    stream: BytesMut,
    limits: PayloadLimits,
    /// What arrived, in delivery order.
    got_ids: Vec<u32>,
    got_messages: Vec<Bytes>,
    got_stream: Vec<u8>,
}

impl Endpoint {
    /// Queue what the window allows, then poll as the driving contract says. Returns the
    /// packets to put on the wire.
    fn drive(&mut self, now: Instant) -> Vec<Packet> {
        while let Some(m) = self.rel.poll_deliver() {
            self.got_ids.push(m.id.0);
            match m.tag {
                TAG_MESSAGE => self.got_messages.push(m.payload),
                TAG_STREAM => self.got_stream.extend_from_slice(&m.payload),
                other => panic!("unexpected tag {other}"),
            }
        }
        while let Some(front) = self.outbox.front() {
            match self.rel.queue(TAG_MESSAGE, front.clone(), now) {
                Ok(_) => {
                    self.outbox.pop_front();
                }
                Err(ReliableError::SendWindowFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        if self.outbox.is_empty() {
            self.rel
                .queue_stream(TAG_STREAM, &mut self.stream, &self.limits, now);
        }
        assert!(self.rel.send().in_flight() <= TLS_RELIABLE_N_SEND_BUFFERS);

        let mut out = vec![];
        while let Some(t) = self.rel.poll_transmit(now) {
            assert!(t.acks.len() <= CONTROL_SEND_ACK_MAX);
            if t.message.tag == TAG_STREAM {
                assert!(!t.message.payload.is_empty());
                assert!(t.message.payload.len() <= self.limits.max_payload(0));
            }
            out.push(Packet {
                message: Some(t.message),
                acks: t.acks,
            });
        }
        if let Some(acks) = self.rel.poll_ack() {
            assert!(!acks.is_empty() && acks.len() <= RELIABLE_ACK_SIZE);
            out.push(Packet {
                message: None,
                acks,
            });
        }
        out
    }

    fn receive(&mut self, packet: Packet, now: Instant) {
        self.rel.handle_acks(packet.acks.as_slice(), now);
        if let Some(m) = packet.message {
            self.rel.handle_message(m.id, m.tag, m.payload);
        }
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    /// Per mille.
    loss: u32,
    duplicate: u32,
    latency_ms: u64,
    jitter_ms: u64,
    tls_mtu: u16,
    sides: [(Vec<Vec<u8>>, Vec<u8>); 2],
}

fn side() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>)> {
    (
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1500), 0..25),
        prop::collection::vec(any::<u8>(), 0..12_000),
    )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        any::<u64>(),
        0u32..350,
        0u32..300,
        1u64..400,
        0u64..3000,
        154u16..=2048,
        side(),
        side(),
    )
        .prop_map(
            |(seed, loss, duplicate, latency_ms, jitter_ms, tls_mtu, a, b)| Scenario {
                seed,
                loss,
                duplicate,
                latency_ms,
                jitter_ms,
                tls_mtu,
                sides: [a, b],
            },
        )
}

/// Bound on simulation events; far above what any generated run needs.
const MAX_STEPS: usize = 200_000;

fn run(s: &Scenario) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let mut rng = ChaCha20Rng::seed_from_u64(s.seed);
    let limits = PayloadLimits {
        tls_mtu: TlsMtu::new(s.tls_mtu).expect("generated in range"),
        wrap: WrapOverhead::TlsAuth { hmac_len: 20 },
        peer_family: PeerFamily::Ipv4,
    };
    let mut ends: Vec<Endpoint> = s
        .sides
        .iter()
        .map(|(messages, stream)| Endpoint {
            rel: Reliable::new(DEFAULT_TLS_TIMEOUT),
            outbox: messages.iter().cloned().map(Bytes::from).collect(),
            stream: BytesMut::from(&stream[..]),
            limits,
            got_ids: vec![],
            got_messages: vec![],
            got_stream: vec![],
        })
        .collect();

    // In flight: (arrival, sequence) -> (destination, packet). Jitter reorders.
    let mut wire: BTreeMap<(Instant, u64), (usize, Packet)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut send = |wire: &mut BTreeMap<(Instant, u64), (usize, Packet)>,
                    rng: &mut ChaCha20Rng,
                    to: usize,
                    packet: Packet,
                    now: Instant| {
        let copies = if rng.next_u32() % 1000 < s.duplicate {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if rng.next_u32() % 1000 < s.loss {
                continue;
            }
            let jitter = if s.jitter_ms == 0 {
                0
            } else {
                u64::from(rng.next_u32()) % s.jitter_ms
            };
            let at = now + Duration::from_millis(s.latency_ms + jitter);
            seq += 1;
            wire.insert((at, seq), (to, packet.clone()));
        }
    };

    let done = |ends: &[Endpoint]| {
        (0..2).all(|i| {
            let peer = &s.sides[1 - i];
            let e = &ends[i];
            e.got_messages.len() == peer.0.len()
                && e.got_stream.len() == peer.1.len()
                && ends[1 - i].rel.all_acked()
        })
    };

    let mut now = t0;
    let mut finished = false;
    for _ in 0..MAX_STEPS {
        // Arrivals due now, each followed by a drive of its receiver.
        while let Some(entry) = wire.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (to, packet) = entry.remove();
            ends[to].receive(packet, now);
            for p in ends[to].drive(now) {
                send(&mut wire, &mut rng, 1 - to, p, now);
            }
        }
        // Timers.
        for (i, end) in ends.iter_mut().enumerate() {
            for p in end.drive(now) {
                send(&mut wire, &mut rng, 1 - i, p, now);
            }
        }
        if done(&ends) {
            finished = true;
            break;
        }
        let next = [
            wire.keys().next().map(|k| k.0),
            ends[0].rel.poll_timeout(),
            ends[1].rel.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else {
            return Err(TestCaseError::fail("stalled: nothing in flight, no timer"));
        };
        // Time never goes backwards.
        now = now.max(next);
    }
    prop_assert!(finished, "did not finish within {MAX_STEPS} steps");

    for (i, e) in ends.iter().enumerate() {
        let (messages, stream) = &s.sides[1 - i];
        // Exactly once, in order: consecutive ids, the messages then the stream bytes.
        let expected_ids: Vec<u32> = (0..e.got_ids.len() as u32).collect();
        prop_assert_eq!(&e.got_ids, &expected_ids);
        prop_assert_eq!(e.got_messages.len(), messages.len());
        for (got, want) in e.got_messages.iter().zip(messages) {
            prop_assert_eq!(&got[..], &want[..]);
        }
        prop_assert_eq!(&e.got_stream, stream);
        prop_assert!(e.rel.recv().buffered() == 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn lossy_channel_delivers_everything_once_in_order(s in scenario()) {
        run(&s)?;
    }
}

#[test]
fn heavy_loss_fixed_seeds_terminate() {
    for seed in 0..8 {
        let s = Scenario {
            seed,
            loss: 349,
            duplicate: 299,
            latency_ms: 50,
            jitter_ms: 2999,
            tls_mtu: 154,
            sides: [
                (vec![vec![1; 700]; 20], vec![2; 5000]),
                (vec![vec![3; 10]; 3], vec![4; 9000]),
            ],
        };
        run(&s).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}
