//! The first exchange of an OpenVPN session, done with our `protocol` crate against a real
//! peer: a client hard reset goes out wrapped with tls-auth or tls-crypt, the server's hard
//! reset comes back, is unwrapped, authenticated and parsed, and is acknowledged with a
//! P_ACK_V1 (the step after which a real client would start TLS).
//!
//! Used by the upstream interop test and by the demo.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use protocol::digest::Digest;
use protocol::framing::{FrameDecoder, FrameEncoder};
use protocol::ids::{KeyId, MessageId, SessionId};
use protocol::key::{Key2, KeyDirection, Role};
use protocol::packet::{AckList, ControlOpcode, ControlPacket};
use protocol::wrap::{ControlWrap, TlsAuth, TlsCrypt};

use crate::LabError;

/// How the control channel is protected, as both peers are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// `tls-auth ta.key 1` on the client (the server uses `0`), with this `auth` digest.
    TlsAuth(Digest),
    /// `tls-crypt ta.key`.
    TlsCrypt,
}

impl Protection {
    /// The (client send, client receive) contexts.
    fn client_contexts(self, key: &Key2) -> (ControlWrap, ControlWrap) {
        match self {
            Protection::TlsAuth(digest) => (
                ControlWrap::Auth(TlsAuth::new(key, KeyDirection::Inverse, digest)),
                ControlWrap::Auth(TlsAuth::new(key, KeyDirection::Inverse, digest)),
            ),
            Protection::TlsCrypt => (
                ControlWrap::Crypt(TlsCrypt::new(key, Role::Client)),
                ControlWrap::Crypt(TlsCrypt::new(key, Role::Client)),
            ),
        }
    }
}

/// What crossed the wire.
#[derive(Debug, Clone)]
pub struct HardResetExchange {
    /// Our P_CONTROL_HARD_RESET_CLIENT_V2 as sent (wrapped, without the length prefix).
    pub sent: Vec<u8>,
    /// The peer's reply as received (wrapped, without the length prefix).
    pub reply_wire: Vec<u8>,
    /// The reply after unwrapping: a plaintext control packet.
    pub reply_plain: Vec<u8>,
    /// Our P_ACK_V1 for the reply, as sent.
    pub ack_sent: Vec<u8>,
}

impl HardResetExchange {
    /// The reply parsed as a control packet.
    pub fn reply(&self) -> Result<ControlPacket<'_>, protocol::packet::PacketError> {
        ControlPacket::parse(&self.reply_plain)
    }
}

/// Connects to `addr` from the calling thread (run it inside the peer's namespace with
/// `Netns::run_in`), sends a hard reset from `client_sid` protected with `protection` and the
/// static key `key`, reads one reply, unwraps it and acknowledges it.
pub fn hard_reset_exchange(
    addr: SocketAddr,
    key: &Key2,
    protection: Protection,
    client_sid: SessionId,
    now_unix: u32,
    timeout: Duration,
) -> Result<HardResetExchange, LabError> {
    let io = |what: &'static str| move |source| LabError::Socket { what, source };
    let (mut send, mut recv) = protection.client_contexts(key);
    let key_id = KeyId::default();

    let reset = ControlPacket::message(
        ControlOpcode::HardResetClientV2,
        key_id,
        client_sid,
        MessageId(0),
        &[],
    );
    let sent = wrap(&mut send, &reset, now_unix)?;

    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io("connect"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io("set_read_timeout"))?;
    send_frame(&mut stream, &sent)?;

    let reply_wire = read_frame(&mut stream)?;
    let mut plain = BytesMut::new();
    recv.unwrap(&reply_wire, 0, &mut plain)
        .map_err(|e| protocol_error(format!("unwrap of the reply {}", hex(&reply_wire)), e))?;
    let reply = ControlPacket::parse(&plain)
        .map_err(|e| protocol_error(format!("parse of the reply {}", hex(&plain)), e))?;

    let mut acks = AckList::new();
    if let Some(id) = reply.message_id {
        acks.push(id)
            .map_err(|e| protocol_error("ack list".into(), e))?;
    }
    let ack = ControlPacket::ack(key_id, client_sid, acks, reply.session_id);
    let ack_sent = wrap(&mut send, &ack, now_unix)?;
    send_frame(&mut stream, &ack_sent)?;

    Ok(HardResetExchange {
        sent,
        reply_wire,
        reply_plain: plain.to_vec(),
        ack_sent,
    })
}

fn wrap(ctx: &mut ControlWrap, packet: &ControlPacket<'_>, now: u32) -> Result<Vec<u8>, LabError> {
    let what = || format!("wrap of our {:?}", packet.opcode);
    let mut plain = BytesMut::new();
    packet
        .emit(&mut plain)
        .map_err(|e| protocol_error(what(), e))?;
    let mut wire = BytesMut::new();
    ctx.wrap(&plain, now, &mut wire)
        .map_err(|e| protocol_error(what(), e))?;
    Ok(wire.to_vec())
}

fn send_frame(stream: &mut TcpStream, packet: &[u8]) -> Result<(), LabError> {
    let mut framed = BytesMut::new();
    FrameEncoder::new()
        .encode(packet, &mut framed)
        .map_err(|e| protocol_error("framing".into(), e))?;
    stream
        .write_all(&framed)
        .map_err(|source| LabError::Socket {
            what: "send",
            source,
        })
}

fn read_frame(stream: &mut TcpStream) -> Result<Vec<u8>, LabError> {
    let decoder = FrameDecoder::new();
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 2048];
    loop {
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => return Ok(frame.to_vec()),
            Ok(None) => {}
            Err(e) => return Err(protocol_error("framing of the reply".into(), e)),
        }
        let n = stream.read(&mut chunk).map_err(|source| LabError::Socket {
            what: "receive",
            source,
        })?;
        if n == 0 {
            return Err(LabError::Socket {
                what: "receive",
                source: std::io::ErrorKind::UnexpectedEof.into(),
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn protocol_error(
    what: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> LabError {
    LabError::Protocol {
        what,
        source: Box::new(source),
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
