//! Test-local tls-auth (SHA1) wrap and parse, written from the reference (sections 2.1, 2.2,
//! 3.3). Replace with the `protocol` crate's tls-auth wrap/parse once it is merged: this is the
//! only place in the conformance tests that knows the tls-auth layout.

use hmac::{Hmac, Mac};
use sha1::Sha1;

const SHA1_LEN: usize = 20;
/// key[0].hmac: what direction 0 (server) sends with.
const KEY0_HMAC: std::ops::Range<usize> = 64..64 + SHA1_LEN;
/// key[1].hmac: what direction 1 (client) sends with.
const KEY1_HMAC: std::ops::Range<usize> = 192..192 + SHA1_LEN;

/// A parsed, authenticated control packet.
#[derive(Debug)]
pub struct Control {
    pub own_sid: [u8; 8],
    pub replay_pid: u32,
    pub acks: Vec<u32>,
    pub remote_sid: Option<[u8; 8]>,
    pub msg_id: Option<u32>,
    pub payload: Vec<u8>,
}

/// Parses the hex body of an OpenVPN static key file into its 256 bytes.
pub fn parse_static_key(text: &str) -> Result<[u8; 256], String> {
    let body = text
        .split("-----BEGIN OpenVPN Static key V1-----")
        .nth(1)
        .and_then(|rest| rest.split("-----END OpenVPN Static key V1-----").next())
        .ok_or("no static key block")?;
    let hex: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = hex::decode(hex).map_err(|e| e.to_string())?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("static key has {} bytes", b.len()))
}

fn hmac_sha1(key: &[u8], parts: &[&[u8]]) -> [u8; SHA1_LEN] {
    let mut mac = Hmac::<Sha1>::new_from_slice(key).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// P_CONTROL_HARD_RESET_CLIENT_V2, key_id 0, message id 0, no ACKs, empty payload,
/// wrapped with tls-auth as direction 1 (client).
pub fn hard_reset_client_v2(key: &[u8; 256], sid: [u8; 8], pid: u32, time: u32) -> Vec<u8> {
    let header = [&[0x38u8][..], &sid].concat();
    let replay = [pid.to_be_bytes(), time.to_be_bytes()].concat();
    let body = [&[0u8][..], &0u32.to_be_bytes()].concat(); // ack_count 0, msg id 0
    let mac = hmac_sha1(&key[KEY1_HMAC], &[&replay, &header, &body]);
    [&header[..], &mac, &replay, &body].concat()
}

/// Which key direction sent a packet (tls-auth `key-direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// Direction 0, normally the server: HMAC with key[0].
    Dir0,
    /// Direction 1, normally the client: HMAC with key[1].
    Dir1,
}

/// Verifies a tls-auth packet sent by direction 0 (server) and parses its body.
pub fn parse_from_server(key: &[u8; 256], packet: &[u8]) -> Result<Control, String> {
    parse(key, packet, Sender::Dir0)
}

/// Verifies a tls-auth (SHA1) packet sent by `sender` and parses its body.
pub fn parse(key: &[u8; 256], packet: &[u8], sender: Sender) -> Result<Control, String> {
    let hmac_key = match sender {
        Sender::Dir0 => &key[KEY0_HMAC],
        Sender::Dir1 => &key[KEY1_HMAC],
    };
    let min = 1 + 8 + SHA1_LEN + 8 + 1;
    if packet.len() < min {
        return Err(format!("{} bytes, need at least {min}", packet.len()));
    }
    let (header, rest) = packet.split_at(9);
    let (mac, rest) = rest.split_at(SHA1_LEN);
    let (replay, body) = rest.split_at(8);
    let expected = hmac_sha1(hmac_key, &[replay, header, body]);
    if mac != expected {
        return Err(format!(
            "tls-auth HMAC does not verify with {sender:?} keys"
        ));
    }
    let own_sid: [u8; 8] = header[1..9].try_into().expect("8 bytes");
    let replay_pid = u32::from_be_bytes(replay[..4].try_into().expect("4 bytes"));
    let (&ack_count, mut rest) = body.split_first().ok_or("no ack count")?;
    let mut acks = Vec::new();
    for _ in 0..ack_count {
        let (id, tail) = rest.split_at_checked(4).ok_or("truncated ack list")?;
        acks.push(u32::from_be_bytes(id.try_into().expect("4 bytes")));
        rest = tail;
    }
    let remote_sid = if ack_count > 0 {
        let (sid, tail) = rest.split_at_checked(8).ok_or("truncated remote sid")?;
        rest = tail;
        Some(sid.try_into().expect("8 bytes"))
    } else {
        None
    };
    let msg_id = if header[0] >> 3 == 5 {
        None // P_ACK_V1 has no message id
    } else {
        let (id, tail) = rest.split_at_checked(4).ok_or("truncated message id")?;
        rest = tail;
        Some(u32::from_be_bytes(id.try_into().expect("4 bytes")))
    };
    Ok(Control {
        own_sid,
        replay_pid,
        acks,
        remote_sid,
        msg_id,
        payload: rest.to_vec(),
    })
}
