//! The opening three-way handshake of key id 0 as upstream expects it (reference 0 and 4.5):
//! the server says nothing until the client's HARD_RESET_CLIENT_V2 arrives, and then answers
//! with one HARD_RESET_SERVER_V2 that acknowledges it.
//!
//! Why this matters: a server reset that leaves the client's own unacknowledged makes a 2.6
//! client re-send its reset at once (it bursts its send window on the peer's first packet).
//! When the server's separate P_ACK_V1 is already in the client's TCP buffer, upstream 2.6.14
//! can process that ACK before writing the re-send out; the ACK frees the reliable buffer the
//! queued packet points into, the next message (the ClientHello, message id 1) is written
//! there, and the 66-byte packet that goes out carries message id 1 under an HMAC computed
//! over message id 0, so our link refused it (`conformance/tests/session_upstream.rs`,
//! `upstream_client_forces_renegotiation_every_5s` on a loaded machine). Answering with the
//! ACK inside the reset, as upstream's server does, leaves the client nothing to re-send.

#![allow(clippy::unwrap_used)]

mod common;
mod session_util;

use std::time::Duration;

use bytes::BytesMut;
use protocol::framing::FrameDecoder;
use protocol::ids::{KeyId, MessageId};
use protocol::key::KeyDirection;
use protocol::packet::{ControlOpcode, ControlPacket};
use protocol::session::ControlProtection;
use protocol::wrap::{ControlWrap, TlsAuth};
use session_util::Setup;

/// The frames (without length prefix) of one `poll_transmit` output.
fn frames(mut out: BytesMut) -> Vec<BytesMut> {
    let decoder = FrameDecoder::new();
    let mut frames = Vec::new();
    while let Some(frame) = decoder.decode(&mut out).unwrap() {
        frames.push(frame);
    }
    assert!(out.is_empty());
    frames
}

#[test]
fn server_answers_the_client_reset_with_its_own_carrying_the_ack() {
    let setup = Setup::new(41);
    // The client's tls-auth context, to read what the server sends.
    let ControlProtection::TlsAuth { key, digest, .. } = setup.client.session.protection.clone()
    else {
        panic!("the session tests use tls-auth");
    };
    let (key, digest) = (&key, &digest);
    let mut client_view = ControlWrap::Auth(TlsAuth::new(key, KeyDirection::Inverse, *digest));
    let mut pair = setup.build();

    // Before the client speaks, the server sends nothing, not even after the first
    // retransmission timeout (tls-timeout 2 s) would have passed.
    let (now, unix) = (pair.now(), pair.unix());
    assert!(pair.server.poll_transmit(now, unix).is_none());
    pair.elapsed = Duration::from_secs(3);
    let (now, unix) = (pair.now(), pair.unix());
    pair.server.handle_timeout(now);
    assert!(pair.server.poll_transmit(now, unix).is_none());

    // The client's hard reset reaches the server.
    let reset = frames(pair.client.poll_transmit(now, unix).unwrap());
    assert_eq!(reset.len(), 1);
    let client_sid = {
        let mut plain = BytesMut::new();
        let mut server_view = ControlWrap::Auth(TlsAuth::new(key, KeyDirection::Normal, *digest));
        server_view.unwrap(&reset[0], 0, &mut plain).unwrap();
        let packet = ControlPacket::parse(&plain).unwrap();
        assert_eq!(packet.opcode, ControlOpcode::HardResetClientV2);
        packet.session_id
    };
    let answer = pair
        .server
        .handle_packet(now, reset.into_iter().next().unwrap());
    assert!(answer.unwrap().is_none());

    // The answer: exactly one packet, the server's reset, message 0, acknowledging the
    // client's message 0 for the client's session id; no separate P_ACK_V1.
    let out = frames(pair.server.poll_transmit(now, unix).unwrap());
    assert_eq!(out.len(), 1, "one packet answers the client's reset");
    let mut plain = BytesMut::new();
    client_view.unwrap(&out[0], 0, &mut plain).unwrap();
    let packet = ControlPacket::parse(&plain).unwrap();
    assert_eq!(packet.opcode, ControlOpcode::HardResetServerV2);
    assert_eq!(packet.key_id, KeyId::default());
    assert_eq!(packet.message_id, Some(MessageId(0)));
    assert_eq!(packet.acks.as_slice(), &[MessageId(0)]);
    assert_eq!(packet.remote_session_id, Some(client_sid));
    assert!(pair.server.poll_transmit(now, unix).is_none());

    // The rest of the handshake runs as usual from there.
    pair.s2c.extend(out);
    pair.connect();
    assert!(pair.client_errors.is_empty(), "{:?}", pair.client_errors);
    assert!(pair.server_errors.is_empty(), "{:?}", pair.server_errors);
}

#[test]
fn a_repeated_client_reset_is_acknowledged_without_a_second_server_reset() {
    let mut pair = Setup::new(42).build();
    let (now, unix) = (pair.now(), pair.unix());
    let first = frames(pair.client.poll_transmit(now, unix).unwrap());
    // The client retransmits its reset after tls-timeout, and both copies arrive before the
    // server answers.
    pair.elapsed = Duration::from_secs(3);
    let (now, unix) = (pair.now(), pair.unix());
    pair.client.handle_timeout(now);
    let again = frames(pair.client.poll_transmit(now, unix).unwrap());
    assert_eq!((first.len(), again.len()), (1, 1));
    for frame in first.into_iter().chain(again) {
        pair.server.handle_packet(now, frame).unwrap();
    }
    let out = frames(pair.server.poll_transmit(now, unix).unwrap());
    let opcodes: Vec<u8> = out.iter().map(|f| f[0] >> 3).collect();
    // Our reset (with the ACK), then at most a P_ACK_V1 re-acknowledging the duplicate.
    assert_eq!(
        opcodes.first(),
        Some(&(ControlOpcode::HardResetServerV2.opcode() as u8))
    );
    assert!(opcodes[1..]
        .iter()
        .all(|&o| o == ControlOpcode::AckV1.opcode() as u8));
    pair.s2c.extend(out);
    pair.connect();
    assert!(pair.client_errors.is_empty(), "{:?}", pair.client_errors);
    assert!(pair.server_errors.is_empty(), "{:?}", pair.server_errors);
}
