//! Exact byte vectors for the control packet layout (reference 2.1, 2.4). Each vector is
//! written out by hand from the layout: opcode byte (opcode << 3 | key id), own sid,
//! ack count, ack ids, remote sid, message id, payload.

use super::*;

const CLIENT_SID: SessionId = SessionId([1, 2, 3, 4, 5, 6, 7, 8]);
const SERVER_SID: SessionId = SessionId([0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8]);
const K0: KeyId = KeyId::from_opcode_byte(0);

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s.replace(' ', "")).unwrap()
}

fn emit(p: &ControlPacket<'_>) -> Vec<u8> {
    let mut out = BytesMut::new();
    p.emit(&mut out).unwrap();
    assert_eq!(out.len(), p.emitted_len());
    out.to_vec()
}

fn acks(ids: &[u32]) -> AckList {
    let ids: Vec<MessageId> = ids.iter().copied().map(MessageId).collect();
    AckList::from_slice(&ids).unwrap()
}

#[test]
fn client_hard_reset_v2() {
    let bytes = unhex("38 0102030405060708 00 00000000");
    let p = ControlPacket::parse(&bytes).unwrap();
    let expected = ControlPacket::message(
        ControlOpcode::HardResetClientV2,
        K0,
        CLIENT_SID,
        MessageId(0),
        &[],
    );
    assert_eq!(p, expected);
    assert!(p.acks.is_empty());
    assert_eq!(p.remote_session_id, None);
    assert_eq!(p.header_len(), 14);
    assert_eq!(emit(&expected), bytes);
}

#[test]
fn server_hard_reset_v2_acking_client() {
    let bytes = unhex("40 a1a2a3a4a5a6a7a8 01 00000000 0102030405060708 00000000");
    let p = ControlPacket::parse(&bytes).unwrap();
    let expected = ControlPacket::message(
        ControlOpcode::HardResetServerV2,
        K0,
        SERVER_SID,
        MessageId(0),
        &[],
    )
    .with_acks(acks(&[0]), CLIENT_SID);
    assert_eq!(p, expected);
    assert_eq!(p.remote_session_id, Some(CLIENT_SID));
    assert_eq!(emit(&expected), bytes);
}

#[test]
fn ack_v1_with_three_acks() {
    let bytes = unhex("28 0102030405060708 03 00000002 00000001 00000000 a1a2a3a4a5a6a7a8");
    let p = ControlPacket::parse(&bytes).unwrap();
    let expected = ControlPacket::ack(K0, CLIENT_SID, acks(&[2, 1, 0]), SERVER_SID);
    assert_eq!(p, expected);
    assert_eq!(p.message_id, None);
    assert!(p.payload.is_empty());
    assert_eq!(emit(&expected), bytes);
}

#[test]
fn control_v1_with_acks_and_payload_key_id_1() {
    // P_CONTROL_V1 (4 << 3 | 1 = 0x21), ACKs [3 2 1 0], message id 5, TLS bytes 16 03 01.
    let bytes = unhex(
        "21 a1a2a3a4a5a6a7a8 04 00000003 00000002 00000001 00000000 0102030405060708 \
         00000005 160301",
    );
    let p = ControlPacket::parse(&bytes).unwrap();
    assert_eq!(p.opcode, ControlOpcode::ControlV1);
    assert_eq!(p.key_id.get(), 1);
    assert_eq!(p.acks, acks(&[3, 2, 1, 0]));
    assert_eq!(p.message_id, Some(MessageId(5)));
    assert_eq!(p.payload, &[0x16, 0x03, 0x01]);
    // The payload is borrowed from the input, not copied.
    assert!(std::ptr::eq(
        p.payload.as_ptr(),
        bytes[bytes.len() - 3..].as_ptr()
    ));
    assert_eq!(emit(&p), bytes);
}

#[test]
fn soft_reset_and_ack_of_eight() {
    // P_CONTROL_SOFT_RESET_V1 with key id 1 = 0x19.
    let bytes = unhex("19 0102030405060708 00 00000000");
    let p = ControlPacket::parse(&bytes).unwrap();
    assert_eq!(p.opcode, ControlOpcode::SoftResetV1);
    assert_eq!(p.key_id.get(), 1);

    let eight = ControlPacket::ack(K0, CLIENT_SID, acks(&[7, 6, 5, 4, 3, 2, 1, 0]), SERVER_SID);
    let bytes = emit(&eight);
    assert_eq!(bytes.len(), 10 + 32 + 8);
    assert_eq!(bytes[9], 8);
    assert_eq!(ControlPacket::parse(&bytes), Ok(eight));
}

#[test]
fn ack_v1_trailing_bytes_kept_as_payload() {
    let bytes = unhex("28 0102030405060708 01 00000000 a1a2a3a4a5a6a7a8 ff");
    let p = ControlPacket::parse(&bytes).unwrap();
    assert_eq!(p.payload, &[0xff]);
    assert_eq!(emit(&p), bytes);
}

#[test]
fn every_opcode_byte() {
    for op in ControlOpcode::ALL {
        for kid in 0..8u8 {
            let byte = op.opcode().byte(KeyId::new(kid).unwrap());
            assert_eq!(
                ControlOpcode::split_byte(byte),
                Ok((op, KeyId::new(kid).unwrap()))
            );
        }
        assert_eq!(ControlOpcode::try_from(op.opcode()), Ok(op));
        assert_eq!(Opcode::from(op), op.opcode());
    }
    assert!(ControlOpcode::HardResetClientV3.is_hard_reset());
    assert!(!ControlOpcode::SoftResetV1.is_hard_reset());
    assert!(!ControlOpcode::AckV1.has_message_id());
}

#[test]
fn malformed_packets() {
    let cases: &[(&str, Malformed)] = &[
        ("00", Malformed::UnknownOpcode { opcode: 0 }),
        (
            "60 0102030405060708 00 00000000",
            Malformed::UnknownOpcode { opcode: 12 },
        ),
        ("ff", Malformed::UnknownOpcode { opcode: 31 }),
        (
            "30 0102030405060708 00 00000000",
            Malformed::DataOpcode {
                opcode: Opcode::DataV1,
            },
        ),
        (
            "48 000000",
            Malformed::DataOpcode {
                opcode: Opcode::DataV2,
            },
        ),
        (
            "38 0000000000000000 00 00000000",
            Malformed::UndefinedSessionId,
        ),
        (
            "20 0102030405060708 09",
            Malformed::TooManyAcks { count: 9 },
        ),
        (
            "20 0102030405060708 ff",
            Malformed::TooManyAcks { count: 255 },
        ),
        ("28 0102030405060708 00", Malformed::EmptyAck),
        ("28 0102030405060708 00 00000000", Malformed::EmptyAck),
    ];
    for (hex, err) in cases {
        let bytes = unhex(hex);
        let got = ControlPacket::parse(&bytes);
        assert_eq!(got, Err(PacketError::Malformed(*err)), "{hex}");
        assert!(!got.unwrap_err().is_truncated());
    }
    assert_eq!(
        Malformed::TooManyAcks { count: 9 }.to_string(),
        "control packet carries 9 ACKs, more than 8"
    );
}

#[test]
fn truncated_packets() {
    let truncated = |needed, had| Err(PacketError::Truncated { needed, had });
    assert_eq!(ControlPacket::parse(&[]), truncated(10, 0));
    assert_eq!(ControlPacket::parse(&unhex("38 01")), truncated(10, 2));
    assert_eq!(
        ControlPacket::parse(&unhex("38 0102030405060708")),
        truncated(10, 9)
    );
    assert_eq!(
        ControlPacket::parse(&unhex("38 0102030405060708 00 000000")),
        truncated(14, 13)
    );
    // Two ACKs announced: 10 + 8 + 8 + 4 = 30 bytes of header.
    assert_eq!(
        ControlPacket::parse(&unhex("20 0102030405060708 02 00000001 00000000 a1a2")),
        truncated(30, 20)
    );
    // P_ACK_V1 with one ACK: 10 + 4 + 8 = 22 bytes, no message id.
    assert_eq!(
        ControlPacket::parse(&unhex("28 0102030405060708 01 00000000 a1a2a3a4a5a6a7")),
        truncated(22, 21)
    );
    let err = ControlPacket::parse(&[0x38]).unwrap_err();
    assert!(err.is_truncated());
    assert_eq!(
        err.to_string(),
        "control packet truncated: header needs 10 bytes, have 1"
    );
}

#[test]
fn emitter_enforces_invariants() {
    let base = ControlPacket::message(ControlOpcode::ControlV1, K0, CLIENT_SID, MessageId(1), b"x");
    let cases = [
        (
            ControlPacket {
                acks: acks(&[0]),
                ..base
            },
            Malformed::MissingRemoteSessionId { ack_count: 1 },
        ),
        (
            ControlPacket {
                remote_session_id: Some(SERVER_SID),
                ..base
            },
            Malformed::UnexpectedRemoteSessionId,
        ),
        (
            ControlPacket {
                message_id: None,
                ..base
            },
            Malformed::MissingMessageId {
                opcode: ControlOpcode::ControlV1,
            },
        ),
        (
            ControlPacket {
                opcode: ControlOpcode::AckV1,
                ..base.with_acks(acks(&[0]), SERVER_SID)
            },
            Malformed::UnexpectedMessageId,
        ),
        (
            ControlPacket::ack(K0, CLIENT_SID, AckList::new(), SERVER_SID),
            Malformed::UnexpectedRemoteSessionId,
        ),
        (
            ControlPacket {
                remote_session_id: None,
                ..ControlPacket::ack(K0, CLIENT_SID, AckList::new(), SERVER_SID)
            },
            Malformed::EmptyAck,
        ),
        (
            ControlPacket {
                session_id: SessionId::default(),
                ..base
            },
            Malformed::UndefinedSessionId,
        ),
    ];
    for (p, err) in cases {
        let mut out = BytesMut::new();
        assert_eq!(p.emit(&mut out), Err(err), "{p:?}");
        assert!(out.is_empty(), "nothing written on error");
    }
    // `with_acks` with an empty list drops the remote sid, keeping the packet valid.
    let p = base.with_acks(AckList::new(), SERVER_SID);
    assert_eq!(p.remote_session_id, None);
    assert!(p.validate().is_ok());
}
