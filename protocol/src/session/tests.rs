use std::time::Instant;

use bytes::BytesMut;

use super::link::{ControlLink, LinkError};
use crate::digest::Digest;
use crate::framing::FrameDecoder;
use crate::ids::{KeyId, MessageId, SessionId};
use crate::key::{Key2, KeyDirection, Role, KEY2_LEN};
use crate::packet::{AckList, ControlOpcode};
use crate::reliable::{Message, Transmit};
use crate::wrap::{ControlWrap, TlsAuth};

const CLIENT_SID: SessionId = SessionId([1, 1, 1, 1, 1, 1, 1, 1]);
const SERVER_SID: SessionId = SessionId([2, 2, 2, 2, 2, 2, 2, 2]);

fn links(now: Instant) -> (ControlLink, ControlLink) {
    let key = Key2::from_bytes(&std::array::from_fn::<u8, KEY2_LEN, _>(|i| i as u8));
    let auth = |dir| ControlWrap::Auth(TlsAuth::new(&key, dir, Digest::Sha256));
    (
        ControlLink::new(Role::Client, CLIENT_SID, auth(KeyDirection::Inverse), now),
        ControlLink::new(Role::Server, SERVER_SID, auth(KeyDirection::Normal), now),
    )
}

fn transmit(opcode: ControlOpcode, id: u32, acks: &[u32], payload: &'static [u8]) -> Transmit {
    let ids: Vec<MessageId> = acks.iter().map(|&a| MessageId(a)).collect();
    Transmit {
        message: Message {
            id: MessageId(id),
            tag: opcode.opcode() as u8,
            payload: bytes::Bytes::from_static(payload),
        },
        acks: AckList::from_slice(&ids).unwrap(),
    }
}

/// The packets framed into `out`, without their length prefixes.
fn unframe(mut out: BytesMut) -> Vec<BytesMut> {
    let decoder = FrameDecoder::new();
    std::iter::from_fn(|| decoder.decode(&mut out).unwrap()).collect()
}

#[test]
fn reset_exchange_through_links() {
    let now = Instant::now();
    let (mut client, mut server) = links(now);
    let k0 = KeyId::default();
    let mut out = BytesMut::new();
    client
        .send_message(
            k0,
            &transmit(ControlOpcode::HardResetClientV2, 0, &[], b""),
            1000,
            &mut out,
        )
        .unwrap();
    let frames = unframe(out);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].len(), 1 + 8 + 32 + 8 + 1 + 4);
    let got = server.receive(now, &frames[0]).unwrap();
    assert_eq!(got.opcode, ControlOpcode::HardResetClientV2);
    assert_eq!(got.peer_session_id, CLIENT_SID);
    assert_eq!(got.message_id, Some(MessageId(0)));

    let mut out = BytesMut::new();
    server
        .send_message(
            k0,
            &transmit(ControlOpcode::HardResetServerV2, 0, &[0], b""),
            1000,
            &mut out,
        )
        .unwrap();
    server
        .send_ack(
            k0,
            AckList::from_slice(&[MessageId(0)]).unwrap(),
            1000,
            &mut out,
        )
        .unwrap();
    let frames = unframe(out);
    assert_eq!(
        frames.len(),
        2,
        "coalesced packets come out framed one by one"
    );
    let reply = client.receive(now, &frames[0]).unwrap();
    assert_eq!(reply.opcode, ControlOpcode::HardResetServerV2);
    assert_eq!(reply.acks.as_slice(), &[MessageId(0)]);
    assert_eq!(client.peer_session_id(), Some(SERVER_SID));
    let ack = client.receive(now, &frames[1]).unwrap();
    assert_eq!(ack.opcode, ControlOpcode::AckV1);
    assert_eq!(ack.message_id, None);
}

#[test]
fn refusals() {
    let now = Instant::now();
    let (mut client, mut server) = links(now);
    let k0 = KeyId::default();

    // A client must not accept a client reset (a reflected packet).
    let (mut other_client, _) = links(now);
    let mut out = BytesMut::new();
    other_client
        .send_message(
            k0,
            &transmit(ControlOpcode::HardResetClientV2, 0, &[], b""),
            1,
            &mut out,
        )
        .unwrap();
    let frame = unframe(out).remove(0);
    // `other_client` sends with the client's direction; our client receives with the
    // server's key, so the HMAC already fails: refused before the opcode is even looked at.
    assert!(matches!(
        client.receive(now, &frame),
        Err(LinkError::Unwrap(_))
    ));

    // ACKs naming a remote session other than ours.
    let mut out = BytesMut::new();
    server
        .send_message(
            k0,
            &transmit(ControlOpcode::HardResetServerV2, 0, &[0], b""),
            1,
            &mut out,
        )
        .unwrap();
    let frame = unframe(out).remove(0);
    assert!(matches!(
        client.receive(now, &frame),
        Err(LinkError::WrongRemoteSession { got: Some(_), .. })
    ));

    // Once the peer's session id is known, another one is refused.
    let (mut c2, mut s2) = links(now);
    let mut out = BytesMut::new();
    c2.send_message(
        k0,
        &transmit(ControlOpcode::HardResetClientV2, 0, &[], b""),
        1,
        &mut out,
    )
    .unwrap();
    s2.receive(now, &unframe(out).remove(0)).unwrap();
    let key = Key2::from_bytes(&std::array::from_fn::<u8, KEY2_LEN, _>(|i| i as u8));
    let mut intruder = ControlLink::new(
        Role::Client,
        SessionId([9; 8]),
        ControlWrap::Auth(TlsAuth::new(&key, KeyDirection::Inverse, Digest::Sha256)),
        now,
    );
    let mut out = BytesMut::new();
    // A later `net_time`, so the replay check passes and the session check is what refuses.
    intruder
        .send_message(
            k0,
            &transmit(ControlOpcode::ControlV1, 1, &[], b"x"),
            2,
            &mut out,
        )
        .unwrap();
    let got = s2.receive(now, &unframe(out).remove(0));
    assert!(
        matches!(got, Err(LinkError::WrongPeerSession { .. })),
        "{got:?}"
    );
}
