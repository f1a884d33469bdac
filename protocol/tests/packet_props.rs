//! Property tests of the control packet layout and the early-negotiation TLVs.
//!
//! Packets are generated as values, serialised both by the library and by an independent
//! builder written here from the layout (reference 2.1), and parsed back.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use bytes::BytesMut;
use proptest::prelude::*;
use protocol::ids::{KeyId, MessageId, SessionId};
use protocol::packet::early_neg::{tlvs, EarlyNegotiation, Tlv, TlvError, TLV_HEADER_LEN};
use protocol::packet::{
    AckList, ControlOpcode, ControlPacket, PacketError, FIXED_HEADER_LEN, RELIABLE_ACK_SIZE,
};

/// A generated packet that owns its payload.
#[derive(Debug, Clone)]
struct Owned {
    opcode: ControlOpcode,
    key_id: KeyId,
    session_id: SessionId,
    acks: Vec<u32>,
    remote: SessionId,
    message_id: u32,
    payload: Vec<u8>,
}

impl Owned {
    fn packet(&self) -> ControlPacket<'_> {
        let ids: Vec<MessageId> = self.acks.iter().copied().map(MessageId).collect();
        let acks = AckList::from_slice(&ids).unwrap();
        let base = if self.opcode == ControlOpcode::AckV1 {
            ControlPacket::ack(self.key_id, self.session_id, acks, self.remote)
        } else {
            ControlPacket::message(
                self.opcode,
                self.key_id,
                self.session_id,
                MessageId(self.message_id),
                &self.payload,
            )
            .with_acks(acks, self.remote)
        };
        ControlPacket {
            payload: &self.payload,
            ..base
        }
    }

    /// The wire bytes, built straight from the layout without the library's emitter.
    fn reference_bytes(&self) -> Vec<u8> {
        let mut v = vec![(self.opcode.opcode() as u8) << 3 | self.key_id.get()];
        v.extend_from_slice(&self.session_id.0);
        v.push(self.acks.len() as u8);
        for id in &self.acks {
            v.extend_from_slice(&id.to_be_bytes());
        }
        if !self.acks.is_empty() {
            v.extend_from_slice(&self.remote.0);
        }
        if self.opcode != ControlOpcode::AckV1 {
            v.extend_from_slice(&self.message_id.to_be_bytes());
        }
        v.extend_from_slice(&self.payload);
        v
    }

    fn header_len(&self) -> usize {
        self.reference_bytes().len() - self.payload.len()
    }
}

fn session_id() -> impl Strategy<Value = SessionId> {
    any::<[u8; 8]>()
        .prop_filter("defined", |b| *b != [0; 8])
        .prop_map(SessionId)
}

fn control_packet() -> impl Strategy<Value = Owned> {
    (
        prop::sample::select(ControlOpcode::ALL.to_vec()),
        0u8..8,
        session_id(),
        prop::collection::vec(any::<u32>(), 0..=RELIABLE_ACK_SIZE),
        any::<[u8; 8]>().prop_map(SessionId),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(
            |(opcode, kid, session_id, mut acks, remote, message_id, mut payload)| {
                if opcode == ControlOpcode::AckV1 {
                    if acks.is_empty() {
                        acks.push(message_id);
                    }
                    payload.clear();
                }
                Owned {
                    opcode,
                    key_id: KeyId::new(kid).unwrap(),
                    session_id,
                    acks,
                    remote,
                    message_id,
                    payload,
                }
            },
        )
}

fn emit(p: &ControlPacket<'_>) -> Vec<u8> {
    let mut out = BytesMut::new();
    p.emit(&mut out).unwrap();
    out.to_vec()
}

proptest! {
    #[test]
    fn emit_matches_layout_and_round_trips(x in control_packet()) {
        let p = x.packet();
        let bytes = emit(&p);
        prop_assert_eq!(&bytes, &x.reference_bytes());
        prop_assert_eq!(p.emitted_len(), bytes.len());
        prop_assert_eq!(p.header_len(), x.header_len());
        let parsed = ControlPacket::parse(&bytes).unwrap();
        prop_assert_eq!(parsed, p);
        prop_assert_eq!(emit(&parsed), bytes);
    }

    #[test]
    fn strict_prefixes_are_truncated_or_shorter_payloads(x in control_packet()) {
        let bytes = x.reference_bytes();
        let header = x.header_len();
        let full = ControlPacket::parse(&bytes).unwrap();
        for len in 0..bytes.len() {
            match ControlPacket::parse(&bytes[..len]) {
                Err(PacketError::Truncated { needed, had }) => {
                    prop_assert!(len < header, "{} >= header {}", len, header);
                    prop_assert_eq!(had, len);
                    prop_assert!(needed > len && needed <= header);
                    prop_assert!(needed >= FIXED_HEADER_LEN);
                }
                Ok(p) => {
                    prop_assert!(len >= header);
                    prop_assert_eq!(p, ControlPacket { payload: &x.payload[..len - header], ..full });
                }
                Err(e) => prop_assert!(false, "prefix {} of a valid packet: {:?}", len, e),
            }
        }
    }

    #[test]
    fn parser_never_panics_and_accepted_bytes_re_emit_exactly(
        bytes in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        if let Ok(p) = ControlPacket::parse(&bytes) {
            prop_assert_eq!(emit(&p), bytes);
        }
    }

    #[test]
    fn parser_on_plausible_headers(
        op in 0u8..=255,
        sid in any::<[u8; 8]>(),
        count in 0u8..12,
        rest in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        // Random bytes rarely get past the first checks; these do.
        let mut bytes = vec![op];
        bytes.extend_from_slice(&sid);
        bytes.push(count);
        bytes.extend_from_slice(&rest);
        match ControlPacket::parse(&bytes) {
            Ok(p) => {
                prop_assert!(usize::from(count) <= RELIABLE_ACK_SIZE);
                prop_assert_eq!(emit(&p), bytes);
            }
            Err(PacketError::Truncated { needed, had }) => {
                prop_assert_eq!(had, bytes.len());
                prop_assert!(needed > had);
            }
            Err(PacketError::Malformed(_)) => {}
        }
    }

    #[test]
    fn tlv_lists_round_trip(
        list in prop::collection::vec(
            (any::<u16>(), prop::collection::vec(any::<u8>(), 0..20)),
            0..6,
        ),
    ) {
        let mut bytes = BytesMut::new();
        for (t, v) in &list {
            Tlv { tlv_type: *t, value: v }.emit(&mut bytes).unwrap();
        }
        let parsed: Vec<Tlv<'_>> = tlvs(&bytes).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(parsed.len(), list.len());
        for (tlv, (t, v)) in parsed.iter().zip(&list) {
            prop_assert_eq!(tlv.tlv_type, *t);
            prop_assert_eq!(tlv.value, &v[..]);
        }
        // Every strict prefix that cuts a TLV is an error; cuts between TLVs are fine.
        let boundaries: Vec<usize> = list
            .iter()
            .scan(0, |acc, (_, v)| { *acc += TLV_HEADER_LEN + v.len(); Some(*acc) })
            .collect();
        for len in 0..bytes.len() {
            let res: Result<Vec<_>, TlvError> = tlvs(&bytes[..len]).collect();
            prop_assert_eq!(res.is_ok(), len == 0 || boundaries.contains(&len));
        }
    }

    #[test]
    fn early_negotiation_round_trips(flags in prop::option::of(any::<u16>())) {
        let neg = EarlyNegotiation { flags };
        let mut bytes = BytesMut::new();
        neg.emit(&mut bytes);
        prop_assert_eq!(bytes.len(), neg.emitted_len());
        prop_assert_eq!(EarlyNegotiation::parse(&bytes), Ok(neg));
    }

    #[test]
    fn early_negotiation_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        let _ = EarlyNegotiation::parse(&bytes);
        let _ = tlvs(&bytes).count();
    }
}
