//! tls-auth: an HMAC and a replay packet id on every control packet (`--tls-auth`).
//!
//! ```text
//! offset  size  field
//! 0       1     opcode|key_id            \ cleartext head, as in the plaintext packet
//! 1       8     own session id           /
//! 9       H     HMAC                       H = --auth digest size: SHA1 20, SHA256 32, SHA512 64
//! 9+H     4     replay packet id (u32)   \ PacketIdNet
//! 13+H    4     net_time (u32)           /
//! 17+H    ...   body of the plaintext packet (ack_count, acks, [remote sid], [msg id], payload)
//! ```
//!
//! The HMAC covers the packet as OpenVPN lays it out before its "swap" of the head to the
//! front: `HMAC(packet id || net_time || opcode|key_id || own session id || body)`.
//!
//! Keys come from the HMAC slots of the static key ([`Key2::split`]): a peer sends with the
//! first H bytes of its send key's HMAC slot and verifies with its receive key's. The two
//! peers use opposite key directions (server `0`, client `1`) or both none
//! ([`KeyDirection::Bidirectional`]).
//!
//! To check a captured stream, build the receiver from the same key file with the direction
//! opposite to the sender's and feed it the packets in order.

use bytes::BytesMut;

use super::{
    check_plain, PacketIdNet, PacketIdSend, WrapError, CONTROL_HEAD_LEN, PACKET_ID_LONG_LEN,
};
use crate::digest::{Digest, HmacKey};
use crate::key::{Key2, KeyDirection};
use crate::packet_id::ReplayWindow;

/// One peer's tls-auth context: send and receive HMAC keys, the send packet id and the
/// receive replay window.
#[derive(Debug, Clone)]
pub struct TlsAuth {
    send_key: HmacKey,
    recv_key: HmacKey,
    send_id: PacketIdSend,
    replay: ReplayWindow,
}

impl TlsAuth {
    /// A context for the static `key` used with `direction` (`tls-auth FILE N` /
    /// `key-direction N`) and the `--auth` `digest`. The replay window has OpenVPN's default
    /// size (64 packets, 15 seconds).
    pub fn new(key: &Key2, direction: KeyDirection, digest: Digest) -> TlsAuth {
        let (send, recv) = key.split(direction);
        let len = digest.output_len();
        TlsAuth {
            send_key: HmacKey::new(digest, &send.hmac[..len]),
            recv_key: HmacKey::new(digest, &recv.hmac[..len]),
            send_id: PacketIdSend::default(),
            replay: ReplayWindow::default(),
        }
    }

    /// Replaces the receive replay window (`--replay-window n t`).
    pub fn with_replay_window(mut self, window: ReplayWindow) -> TlsAuth {
        self.replay = window;
        self
    }

    /// The `--auth` digest.
    pub fn digest(&self) -> Digest {
        self.send_key.digest()
    }

    /// Bytes added to a plaintext packet: HMAC and packet id, `H + 8`.
    pub fn overhead(&self) -> usize {
        self.send_key.output_len() + PACKET_ID_LONG_LEN
    }

    /// The shortest acceptable wire packet: head, HMAC and packet id, `17 + H`.
    pub fn min_wire_len(&self) -> usize {
        CONTROL_HEAD_LEN + self.overhead()
    }

    /// Appends the wire form of the plaintext control packet `plain` to `out` and returns the
    /// replay id it carries. `now_unix` (wall-clock seconds) becomes `net_time` on the first
    /// call and is ignored afterwards (except to restart the id after it reaches `u32::MAX`).
    pub fn wrap(
        &mut self,
        plain: &[u8],
        now_unix: u32,
        out: &mut BytesMut,
    ) -> Result<PacketIdNet, WrapError> {
        check_plain(plain)?;
        let (head, body) = plain.split_at(CONTROL_HEAD_LEN);
        let pid = self.send_id.next(now_unix)?;
        let pid_bytes = pid.to_bytes();
        let h = self.send_key.output_len();

        out.reserve(plain.len() + self.overhead());
        let start = out.len();
        out.extend_from_slice(head);
        out.resize(start + CONTROL_HEAD_LEN + h, 0);
        out.extend_from_slice(&pid_bytes);
        out.extend_from_slice(body);
        let tag = &mut out[start + CONTROL_HEAD_LEN..start + CONTROL_HEAD_LEN + h];
        self.send_key.compute_into(&[&pid_bytes, head, body], tag);
        Ok(pid)
    }

    /// Verifies the HMAC of the wire packet `wire` in constant time, then its replay id
    /// (`now_secs`: the caller's monotonic seconds), and appends the plaintext control packet
    /// to `out`. On error nothing is appended and the packet must be dropped silently.
    pub fn unwrap(
        &mut self,
        wire: &[u8],
        now_secs: u64,
        out: &mut BytesMut,
    ) -> Result<PacketIdNet, WrapError> {
        let h = self.recv_key.output_len();
        let min = CONTROL_HEAD_LEN + h + PACKET_ID_LONG_LEN;
        if wire.len() < min {
            return Err(WrapError::Truncated {
                len: wire.len(),
                min,
            });
        }
        // From here on every index is within `min <= wire.len()`.
        let (head, rest) = wire.split_at(CONTROL_HEAD_LEN);
        let (tag, rest) = rest.split_at(h);
        let (pid_bytes, body) = rest.split_at(PACKET_ID_LONG_LEN);
        if !self.recv_key.verify(&[pid_bytes, head, body], tag) {
            return Err(WrapError::AuthenticationFailed);
        }
        let mut raw = [0u8; PACKET_ID_LONG_LEN];
        raw.copy_from_slice(pid_bytes);
        let pid = PacketIdNet::from_bytes(raw);
        self.replay
            .check_and_record(pid.id, pid.time, now_secs)
            .map_err(WrapError::Replay)?;
        out.reserve(head.len() + body.len());
        out.extend_from_slice(head);
        out.extend_from_slice(body);
        Ok(pid)
    }
}
