//! Whole TCP connections between a real OpenVPN 2.6.14 server and client, captured once
//! (`tests/golden/README.md` says how) and never recomputed.
//!
//! For each case (tls-auth SHA1, tls-auth SHA256, tls-crypt) and each direction, every control
//! packet must unwrap with the receiver's keys, parse as a control packet whose fields fit the
//! session (session ids, remote session ids, message ids in order per key id), re-emit to the
//! same plaintext, and be refused when any single bit of it is flipped. Key id 0 is protected
//! with `ta.key`; the renegotiation on key id 1 with the dynamic tls-crypt keys both peers
//! derived (taken from their verb-9 logs in `keys.txt`).

#![allow(clippy::unwrap_used)] // Integration tests are not `cfg(test)`.

use std::collections::BTreeMap;

use bytes::BytesMut;
use protocol::digest::Digest;
use protocol::ids::{KeyId, SessionId};
use protocol::key::{Key, Key2, KeyDirection, Role, KEY_SLOT_LEN};
use protocol::opcode::Opcode;
use protocol::packet::{ControlOpcode, ControlPacket};
use protocol::static_key;
use protocol::wrap::{ControlWrap, TlsAuth, TlsCrypt};

struct Case {
    name: &'static str,
    ta_key: &'static str,
    c2s: &'static str,
    s2c: &'static str,
    keys: &'static str,
    /// `None` for tls-crypt, else the tls-auth digest.
    auth: Option<Digest>,
}

macro_rules! case {
    ($dir:literal, $auth:expr) => {
        Case {
            name: $dir,
            ta_key: include_str!(concat!("golden/", $dir, "/ta.key")),
            c2s: include_str!(concat!("golden/", $dir, "/c2s.hex")),
            s2c: include_str!(concat!("golden/", $dir, "/s2c.hex")),
            keys: include_str!(concat!("golden/", $dir, "/keys.txt")),
            auth: $auth,
        }
    };
}

fn cases() -> [Case; 3] {
    [
        case!("tls-auth-sha1", Some(Digest::Sha1)),
        case!("tls-auth-sha256", Some(Digest::Sha256)),
        case!("tls-crypt", None),
    ]
}

fn packets(hex_lines: &str) -> Vec<Vec<u8>> {
    hex_lines
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| hex::decode(l.trim()).unwrap())
        .collect()
}

/// The 32 bytes of the last `server: ... <label>: <8 hex groups>` line of `keys.txt`.
fn logged_key(keys: &str, label: &str) -> [u8; 32] {
    let line = keys
        .lines()
        .rev()
        .find(|l| l.starts_with("server:") && l.contains(label))
        .unwrap_or_else(|| panic!("no '{label}' in keys.txt"));
    let hex: String = line
        .rsplit(": ")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    hex::decode(hex).unwrap().try_into().unwrap()
}

/// The dynamic tls-crypt key block as the server sees it: `key[0]` what it sends with,
/// `key[1]` what it receives with (tls-crypt slicing, server = direction 0).
fn dynamic_tls_crypt_key(keys: &str) -> Key2 {
    let slot = |label: &str| {
        let mut s = [0u8; KEY_SLOT_LEN];
        s[..32].copy_from_slice(&logged_key(keys, label));
        s
    };
    Key2 {
        keys: [
            Key {
                cipher: slot("Outgoing dynamic tls-crypt: CIPHER KEY"),
                hmac: slot("Outgoing dynamic tls-crypt: HMAC KEY"),
            },
            Key {
                cipher: slot("Incoming dynamic tls-crypt: CIPHER KEY"),
                hmac: slot("Incoming dynamic tls-crypt: HMAC KEY"),
            },
        ],
    }
}

/// The receiving side's unwrap context for key id 0.
fn static_receiver(case: &Case, receiver: Role) -> ControlWrap {
    let key = static_key::parse(case.ta_key).unwrap();
    match case.auth {
        // tls-auth as configured in the captures: server `0`, client `1`.
        Some(digest) => {
            let dir = match receiver {
                Role::Server => KeyDirection::Normal,
                Role::Client => KeyDirection::Inverse,
            };
            ControlWrap::Auth(TlsAuth::new(&key, dir, digest))
        }
        None => ControlWrap::Crypt(TlsCrypt::new(&key, receiver)),
    }
}

/// Checks one direction of one capture; returns (control packets checked, bits flipped).
fn check_direction(case: &Case, receiver: Role, stream: &str) -> (usize, usize) {
    let mut key0 = static_receiver(case, receiver);
    let mut renegotiated =
        ControlWrap::Crypt(TlsCrypt::new(&dynamic_tls_crypt_key(case.keys), receiver));
    let (sender_reset, receiver_reset) = match receiver {
        Role::Server => (
            ControlOpcode::HardResetClientV2,
            ControlOpcode::HardResetServerV2,
        ),
        Role::Client => (
            ControlOpcode::HardResetServerV2,
            ControlOpcode::HardResetClientV2,
        ),
    };
    let mut own_sid: Option<SessionId> = None;
    let mut peer_sid: Option<SessionId> = None;
    let mut next_message: BTreeMap<KeyId, u32> = BTreeMap::new();
    let (mut checked, mut flipped) = (0, 0);

    for (n, wire) in packets(stream).iter().enumerate() {
        let (opcode, key_id) = Opcode::split_byte(wire[0]).unwrap();
        if opcode.is_data() {
            continue;
        }
        let ctx = if key_id.get() == 0 {
            &mut key0
        } else {
            &mut renegotiated
        };
        let what = format!("{} {:?} packet {n}", case.name, receiver);

        // Any single flipped bit must be refused (and leave no output, no replay state).
        let mut bad = wire.clone();
        for bit in 0..wire.len() * 8 {
            bad[bit / 8] ^= 1 << (bit % 8);
            let mut out = BytesMut::new();
            assert!(
                ctx.unwrap(&bad, 0, &mut out).is_err(),
                "{what}: bit {bit} flipped was accepted"
            );
            assert!(out.is_empty());
            bad[bit / 8] ^= 1 << (bit % 8);
            flipped += 1;
        }

        let mut plain = BytesMut::new();
        ctx.unwrap(wire, 0, &mut plain)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(plain.len() + ctx.overhead(), wire.len(), "{what}");
        let packet = ControlPacket::parse(&plain).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut again = BytesMut::new();
        packet.emit(&mut again).unwrap();
        assert_eq!(again, plain, "{what}: re-emitted differently");

        assert_eq!(packet.key_id, key_id, "{what}");
        assert_ne!(
            packet.opcode, receiver_reset,
            "{what}: reset in the wrong direction"
        );
        // The sender keeps one session id for the whole connection, renegotiation included.
        assert_eq!(
            *own_sid.get_or_insert(packet.session_id),
            packet.session_id,
            "{what}"
        );
        if let Some(remote) = packet.remote_session_id {
            assert_eq!(*peer_sid.get_or_insert(remote), remote, "{what}");
        }
        // Every message id of a key generation is new and in order (TCP loses nothing).
        if let Some(id) = packet.message_id {
            let expected = next_message.entry(key_id).or_insert(0);
            assert_eq!(id.0, *expected, "{what}: message id out of order");
            *expected += 1;
            if id.0 == 0 {
                let reset = if key_id.get() == 0 {
                    sender_reset
                } else {
                    ControlOpcode::SoftResetV1
                };
                assert_eq!(packet.opcode, reset, "{what}");
            }
        }
        checked += 1;
    }
    assert!(
        next_message.len() >= 2,
        "{}: expected key ids 0 and 1 in the capture",
        case.name
    );
    (checked, flipped)
}

#[test]
fn real_streams_unwrap_parse_and_refuse_every_bit_flip() {
    for case in cases() {
        let (c, fc) = check_direction(&case, Role::Server, case.c2s);
        let (s, fs) = check_direction(&case, Role::Client, case.s2c);
        assert!(c >= 12 && s >= 10, "{}: too few control packets", case.name);
        eprintln!(
            "{}: {c} + {s} control packets, {} bit flips refused",
            case.name,
            fc + fs
        );
    }
}

#[test]
fn a_packet_from_the_other_case_is_refused() {
    let [sha1, sha256, crypt] = cases();
    let first = |c: &Case| packets(c.c2s).remove(0);
    for (receiver_case, foreign) in [
        (&sha1, first(&sha256)),
        (&sha256, first(&crypt)),
        (&crypt, first(&sha1)),
    ] {
        let mut rx = static_receiver(receiver_case, Role::Server);
        let mut out = BytesMut::new();
        assert!(
            rx.unwrap(&foreign, 0, &mut out).is_err(),
            "{}",
            receiver_case.name
        );
    }
}
