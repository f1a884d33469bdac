//! tls-crypt (v1): every control packet encrypted and authenticated with a static key
//! (`--tls-crypt`), SIV style: the HMAC-SHA256 tag over header and plaintext is also the IV of
//! AES-256-CTR.
//!
//! ```text
//! offset  size  field
//! 0       1     opcode|key_id            \
//! 1       8     own session id            | header (17 bytes, cleartext)
//! 9       4     replay packet id (u32)    |  (TLS_CRYPT_OFF_PID = 9)
//! 13      4     net_time (u32)           /
//! 17      32    tag = HMAC-SHA256(Ka, header || P)           (TLS_CRYPT_OFF_TAG = 17)
//! 49      ...   AES-256-CTR(Ke, IV = tag[0..16), P)          (TLS_CRYPT_OFF_CT = 49)
//! ```
//!
//! `P` is the body of the plaintext packet (everything after the session id). CTR mode treats
//! the whole 16-byte IV as one big-endian 128-bit counter (OpenSSL's `AES-256-CTR`).
//!
//! Keys: there is no key-direction option; the server uses the static key in direction `0`,
//! the client in direction `1` ([`Role::tls_crypt_direction`]). A side sends with
//! `Ke = cipher[0..32)`, `Ka = hmac[0..32)` of its send key and receives with its receive key.
//! Any [`Key2`] works, so the same type serves dynamic tls-crypt (12.4) once its key is derived.

use aes::cipher::{InnerIvInit, KeyInit, StreamCipher};
use bytes::BytesMut;

use super::{
    check_plain, PacketIdNet, PacketIdSend, WrapError, CONTROL_HEAD_LEN, PACKET_ID_LONG_LEN,
};
use crate::digest::{Digest, HmacKey};
use crate::key::{Key, Key2, Role};
use crate::packet_id::ReplayWindow;

/// Offset of the replay packet id (`TLS_CRYPT_OFF_PID`).
pub const TLS_CRYPT_OFF_PID: usize = CONTROL_HEAD_LEN;
/// Offset of the tag (`TLS_CRYPT_OFF_TAG`); also the header length.
pub const TLS_CRYPT_OFF_TAG: usize = TLS_CRYPT_OFF_PID + PACKET_ID_LONG_LEN;
/// Size of the HMAC-SHA256 tag (`TLS_CRYPT_TAG_SIZE`).
pub const TLS_CRYPT_TAG_SIZE: usize = 32;
/// Offset of the ciphertext (`TLS_CRYPT_OFF_CT`).
pub const TLS_CRYPT_OFF_CT: usize = TLS_CRYPT_OFF_TAG + TLS_CRYPT_TAG_SIZE;
/// AES-256 key bytes taken from a cipher slot.
const CIPHER_KEY_LEN: usize = 32;
/// HMAC-SHA256 key bytes taken from an HMAC slot.
const HMAC_KEY_LEN: usize = 32;
/// Bytes of the CTR initial counter block taken from the tag.
const IV_LEN: usize = 16;

type Aes256Ctr = ctr::Ctr128BE<aes::Aes256>;

/// One direction's keys, scheduled once.
#[derive(Clone)]
struct DirKeys {
    /// Boxed: two AES-256 key schedules would make [`ControlWrap`](super::ControlWrap) large.
    cipher: Box<aes::Aes256>,
    hmac: HmacKey,
}

impl DirKeys {
    fn new(key: &Key) -> DirKeys {
        let mut ke = [0u8; CIPHER_KEY_LEN];
        ke.copy_from_slice(&key.cipher[..CIPHER_KEY_LEN]);
        DirKeys {
            cipher: Box::new(aes::Aes256::new(&ke.into())),
            hmac: HmacKey::new(Digest::Sha256, &key.hmac[..HMAC_KEY_LEN]),
        }
    }

    /// Applies AES-256-CTR with the first 16 bytes of `tag` as the initial counter block.
    fn apply_ctr(&self, tag: &[u8; TLS_CRYPT_TAG_SIZE], data: &mut [u8]) {
        let mut iv = [0u8; IV_LEN];
        iv.copy_from_slice(&tag[..IV_LEN]);
        let core = ctr::CtrCore::inner_iv_init((*self.cipher).clone(), &iv.into());
        let mut ctr = Aes256Ctr::from_core(core);
        ctr.apply_keystream(data);
    }
}

/// One peer's tls-crypt (v1) context: send and receive keys, the send packet id and the
/// receive replay window.
#[derive(Clone)]
pub struct TlsCrypt {
    send: DirKeys,
    recv: DirKeys,
    send_id: PacketIdSend,
    replay: ReplayWindow,
}

impl std::fmt::Debug for TlsCrypt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsCrypt")
            .field("send_id", &self.send_id)
            .field("replay", &self.replay)
            .finish_non_exhaustive()
    }
}

impl TlsCrypt {
    /// Bytes added to a plaintext packet: packet id and tag (40).
    pub const OVERHEAD: usize = PACKET_ID_LONG_LEN + TLS_CRYPT_TAG_SIZE;
    /// The shortest acceptable wire packet: header and tag (49).
    pub const MIN_WIRE_LEN: usize = TLS_CRYPT_OFF_CT;

    /// A context for the static `key` (`--tls-crypt FILE`) on the given side.
    pub fn new(key: &Key2, role: Role) -> TlsCrypt {
        let (send, recv) = key.split(role.tls_crypt_direction());
        TlsCrypt {
            send: DirKeys::new(send),
            recv: DirKeys::new(recv),
            send_id: PacketIdSend::default(),
            replay: ReplayWindow::default(),
        }
    }

    /// Replaces the receive replay window (`--replay-window n t`).
    pub fn with_replay_window(mut self, window: ReplayWindow) -> TlsCrypt {
        self.replay = window;
        self
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
        let mut tag = [0u8; TLS_CRYPT_TAG_SIZE];
        self.send
            .hmac
            .compute_into(&[head, &pid_bytes, body], &mut tag);

        out.reserve(plain.len() + Self::OVERHEAD);
        let start = out.len();
        out.extend_from_slice(head);
        out.extend_from_slice(&pid_bytes);
        out.extend_from_slice(&tag);
        out.extend_from_slice(body);
        self.send
            .apply_ctr(&tag, &mut out[start + TLS_CRYPT_OFF_CT..]);
        Ok(pid)
    }

    /// Decrypts the wire packet `wire`, verifies its tag in constant time, then its replay id
    /// (`now_secs`: the caller's monotonic seconds), and appends the plaintext control packet
    /// to `out`. On error nothing is appended and the packet must be dropped silently.
    pub fn unwrap(
        &mut self,
        wire: &[u8],
        now_secs: u64,
        out: &mut BytesMut,
    ) -> Result<PacketIdNet, WrapError> {
        if wire.len() < Self::MIN_WIRE_LEN {
            return Err(WrapError::Truncated {
                len: wire.len(),
                min: Self::MIN_WIRE_LEN,
            });
        }
        // From here on every index is within `MIN_WIRE_LEN <= wire.len()`.
        let (header, rest) = wire.split_at(TLS_CRYPT_OFF_TAG);
        let (tag_bytes, ciphertext) = rest.split_at(TLS_CRYPT_TAG_SIZE);
        let mut tag = [0u8; TLS_CRYPT_TAG_SIZE];
        tag.copy_from_slice(tag_bytes);

        let start = out.len();
        out.reserve(CONTROL_HEAD_LEN + ciphertext.len());
        out.extend_from_slice(&header[..CONTROL_HEAD_LEN]);
        out.extend_from_slice(ciphertext);
        let body_start = start + CONTROL_HEAD_LEN;
        self.recv.apply_ctr(&tag, &mut out[body_start..]);
        if !self.recv.hmac.verify(&[header, &out[body_start..]], &tag) {
            out.truncate(start);
            return Err(WrapError::AuthenticationFailed);
        }

        let mut raw = [0u8; PACKET_ID_LONG_LEN];
        raw.copy_from_slice(&header[TLS_CRYPT_OFF_PID..TLS_CRYPT_OFF_TAG]);
        let pid = PacketIdNet::from_bytes(raw);
        if let Err(e) = self.replay.check_and_record(pid.id, pid.time, now_secs) {
            out.truncate(start);
            return Err(WrapError::Replay(e));
        }
        Ok(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Key2, KEY2_LEN};

    /// The debug form names the state a reader needs and never the key.
    #[test]
    fn debug_shows_ids_and_no_key() {
        let key = Key2::from_bytes(&[0xab; KEY2_LEN]);
        let text = format!("{:?}", TlsCrypt::new(&key, Role::Client));
        assert!(text.starts_with("TlsCrypt {"), "{text}");
        assert!(
            text.contains("send_id") && text.contains("replay"),
            "{text}"
        );
        assert!(
            !text.contains("171") && !text.to_lowercase().contains("ab, ab"),
            "{text}"
        );
    }
}
