//! The per-key crypto context of the data channel (`struct crypto_options` of one
//! `key_state`): cipher contexts keyed once, the send packet-id counter and the replay window.
//!
//! Layouts (reference 8.2, 8.3; `offset` = start of the plaintext in the caller's buffer):
//!
//! ```text
//! AEAD send:   [ .. free .. | header | packet_id | tag[16] | plaintext -> ciphertext ]
//!                                                            ^ offset
//! CBC send:    [ .. free .. | header | HMAC[H] | IV[16] | packet_id | plaintext | pad ]
//!                                                        \___ encrypted in place ___/
//!                                                                    ^ offset
//! ```

use bytes::{Buf, BufMut, BytesMut};
use openssl::cipher_ctx::CipherCtx;
use rand_core::{CryptoRng, RngCore};

use super::{
    ensure_headroom, key_id_mismatch, DataCipher, DataError, DataHeader, AEAD_IMPLICIT_IV_LEN,
    AEAD_TAG_LEN, CBC_BLOCK_LEN, PACKET_ID_LEN,
};
use crate::digest::{Digest, HmacKey};
use crate::ids::{KeyId, PeerId};
use crate::key::{Key, Key2, Role};
use crate::packet_id::{ReplayWindow, DEFAULT_SEQ_BACKTRACK, DEFAULT_TIME_BACKTRACK};

/// `PACKET_ID_MAX`: the last packet id a key may send; after it the key refuses to encrypt.
pub const PACKET_ID_MAX: u32 = u32::MAX;
/// `PACKET_ID_WRAP_TRIGGER`: once the send packet id reaches this, the key asks for a
/// renegotiation ([`DataKey::wants_renegotiation`]).
pub const PACKET_ID_WRAP_TRIGGER: u32 = 0xff00_0000;

/// When a key asks for a renegotiation and the last packet id it may send.
///
/// Upstream's values ([`PacketIdLimits::UPSTREAM`]) are the default and what every config
/// runs with; no directive changes them. Lower values exist for tests that must reach the
/// limits with a few thousand packets (issue 19's "packet id close to wrapping").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketIdLimits {
    /// Once the send packet id reaches this, the key asks for a renegotiation.
    pub wrap_trigger: u32,
    /// The last packet id the key sends; after it the key refuses to encrypt.
    pub max: u32,
}

impl PacketIdLimits {
    /// [`PACKET_ID_WRAP_TRIGGER`] and [`PACKET_ID_MAX`].
    pub const UPSTREAM: PacketIdLimits = PacketIdLimits {
        wrap_trigger: PACKET_ID_WRAP_TRIGGER,
        max: PACKET_ID_MAX,
    };
}

impl Default for PacketIdLimits {
    fn default() -> Self {
        PacketIdLimits::UPSTREAM
    }
}

/// Everything about a data key except the key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataKeyParams {
    /// The negotiated cipher.
    pub cipher: DataCipher,
    /// The `--auth` digest for CBC ciphers; ignored for AEAD ciphers.
    pub auth: Digest,
    /// The key id of the key generation (opcode low bits).
    pub key_id: KeyId,
    /// The pushed peer id: sent packets use P_DATA_V2 with it, or P_DATA_V1 when `None`.
    pub peer_id: Option<PeerId>,
    /// `--replay-window n`: packets.
    pub replay_window: u32,
    /// `--replay-window n t`: seconds.
    pub replay_time: u32,
    /// When the key asks for a renegotiation and stops sending (upstream's by default).
    pub packet_ids: PacketIdLimits,
}

impl DataKeyParams {
    /// Parameters with OpenVPN's defaults: `auth SHA1`, key id 0, no peer id (P_DATA_V1),
    /// `replay-window 64 15`.
    pub const fn new(cipher: DataCipher) -> DataKeyParams {
        DataKeyParams {
            cipher,
            auth: Digest::Sha1,
            key_id: KeyId::from_opcode_byte(0),
            peer_id: None,
            replay_window: DEFAULT_SEQ_BACKTRACK,
            replay_time: DEFAULT_TIME_BACKTRACK,
            packet_ids: PacketIdLimits::UPSTREAM,
        }
    }
}

/// The keyed cipher state of one direction.
// Two of these live per key for the key's lifetime; keeping the HMAC state inline saves a
// pointer chase per packet.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Aead {
        ctx: CipherCtx,
        implicit_iv: [u8; AEAD_IMPLICIT_IV_LEN],
    },
    Cbc {
        ctx: CipherCtx,
        hmac: HmacKey,
    },
}

/// One key generation of the data channel: encrypts outgoing and decrypts incoming packets in
/// place.
///
/// Built once per key id from the negotiated cipher and the two keys of the key block
/// ([`Key2::split`] with [`Role::data_direction`]); the OpenSSL contexts are keyed here, so a
/// packet only sets its IV or nonce.
pub struct DataKey {
    cipher: DataCipher,
    header: DataHeader,
    send: Engine,
    recv: Engine,
    /// Last packet id sent (0: none yet).
    last_sent_id: u32,
    limits: PacketIdLimits,
    replay: ReplayWindow,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("DataKey")
            .field("cipher", &self.cipher)
            .field("header", &self.header)
            .field("last_sent_id", &self.last_sent_id)
            .field("replay", &self.replay)
            .finish_non_exhaustive()
    }
}

impl DataKey {
    /// Keys the contexts from the `send` and `recv` keys of a key block.
    ///
    /// Errors: [`DataError::ZeroKey`] if a cipher key is all zeros, [`DataError::Crypto`] if
    /// OpenSSL cannot set up the cipher.
    pub fn new(params: &DataKeyParams, send: &Key, recv: &Key) -> Result<DataKey, DataError> {
        Ok(DataKey {
            cipher: params.cipher,
            header: DataHeader::new(params.key_id, params.peer_id),
            send: Engine::new(params, send, true)?,
            recv: Engine::new(params, recv, false)?,
            last_sent_id: 0,
            limits: params.packet_ids,
            replay: ReplayWindow::new(params.replay_window, params.replay_time),
        })
    }

    /// Keys the contexts for `role` from a derived key block (7.3): the client sends with
    /// `key[0]`, the server with `key[1]`.
    pub fn from_key2(
        params: &DataKeyParams,
        key2: &Key2,
        role: Role,
    ) -> Result<DataKey, DataError> {
        let (send, recv) = key2.split(role.data_direction());
        DataKey::new(params, send, recv)
    }

    /// The cipher.
    pub fn cipher(&self) -> DataCipher {
        self.cipher
    }

    /// The key id.
    pub fn key_id(&self) -> KeyId {
        self.header.key_id()
    }

    /// The header this key puts on sent packets.
    pub fn header(&self) -> DataHeader {
        self.header
    }

    /// The last packet id sent (0 before the first packet).
    pub fn last_sent_packet_id(&self) -> u32 {
        self.last_sent_id
    }

    /// Moves the send counter forward so the next packet carries `last_sent + 1`. Never moves
    /// it backwards (that would reuse nonces). For tests and for resuming a counter.
    pub fn skip_send_packet_ids(&mut self, last_sent: u32) {
        self.last_sent_id = self.last_sent_id.max(last_sent);
    }

    /// Whether the send packet id has reached the wrap trigger ([`PACKET_ID_WRAP_TRIGGER`]
    /// unless [`DataKeyParams::packet_ids`] lowered it): the session should start a soft reset
    /// (reference 12.2).
    pub fn wants_renegotiation(&self) -> bool {
        self.last_sent_id >= self.limits.wrap_trigger
    }

    /// Overhead this key adds in front of a plaintext: header, packet id and tag (AEAD) or
    /// header, HMAC, IV and packet id (CBC).
    pub fn headroom(&self) -> usize {
        self.header.len()
            + PACKET_ID_LEN
            + match &self.send {
                Engine::Aead { .. } => AEAD_TAG_LEN,
                Engine::Cbc { hmac, .. } => hmac.output_len() + CBC_BLOCK_LEN,
            }
    }

    /// Encrypts the plaintext `buf[offset..]` into a wire packet, in place: headers go into
    /// the free space `buf[..offset]`, CBC padding is appended, and `buf` is advanced so it
    /// holds exactly the wire packet (without the TCP length prefix). Returns the packet id
    /// used.
    ///
    /// With `offset >= `[`DATA_HEADROOM`](super::DATA_HEADROOM) and
    /// [`DATA_TAILROOM`](super::DATA_TAILROOM) bytes of spare capacity nothing is allocated;
    /// otherwise the plaintext is copied into a new buffer first. `rng` supplies the CBC IV
    /// (AEAD ignores it); drivers should pass a userspace CSPRNG seeded from the OS (e.g.
    /// `rand_chacha::ChaCha20Rng::from_entropy`) rather than `OsRng`, which costs a system call
    /// per packet.
    ///
    /// Errors: [`DataError::PacketIdExhausted`] after packet id [`PACKET_ID_MAX`] (or the
    /// lowered [`PacketIdLimits::max`]) was used (the packet is dropped), [`DataError::Crypto`]
    /// on an internal OpenSSL failure.
    pub fn encrypt<R: RngCore + CryptoRng>(
        &mut self,
        buf: &mut BytesMut,
        offset: usize,
        rng: &mut R,
    ) -> Result<u32, DataError> {
        if self.last_sent_id >= self.limits.max {
            return Err(DataError::PacketIdExhausted);
        }
        let offset = ensure_headroom(buf, offset, self.headroom());
        let packet_id = self.last_sent_id + 1;
        let pid = packet_id.to_be_bytes();
        let header = self.header.bytes();
        let hlen = self.header.len();
        let start = match &mut self.send {
            Engine::Aead { ctx, implicit_iv } => {
                let start = offset - AEAD_TAG_LEN - PACKET_ID_LEN - hlen;
                buf[start..start + hlen].copy_from_slice(&header[..hlen]);
                buf[start + hlen..start + hlen + PACKET_ID_LEN].copy_from_slice(&pid);
                ctx.encrypt_init(None, None, Some(&nonce(pid, implicit_iv)))?;
                let (a, n) = aad(&header, hlen, &pid);
                ctx.cipher_update(&a[..n], None)?;
                let len = buf.len() - offset;
                ctx.cipher_update_inplace(&mut buf[offset..], len)?;
                ctx.cipher_final(&mut [])?;
                ctx.tag(&mut buf[offset - AEAD_TAG_LEN..offset])?;
                start
            }
            Engine::Cbc { ctx, hmac } => {
                let plain = offset - PACKET_ID_LEN;
                buf[plain..offset].copy_from_slice(&pid);
                let pad = CBC_BLOCK_LEN - (buf.len() - plain) % CBC_BLOCK_LEN;
                // `pad` is 1..=16.
                buf.put_bytes(pad as u8, pad);
                let iv_at = plain - CBC_BLOCK_LEN;
                let mut iv = [0u8; CBC_BLOCK_LEN];
                rng.fill_bytes(&mut iv);
                buf[iv_at..plain].copy_from_slice(&iv);
                ctx.encrypt_init(None, None, Some(&iv))?;
                cbc_update_inplace(ctx, &mut buf[plain..])?;
                let mac_len = hmac.output_len();
                let mac_at = iv_at - mac_len;
                let (head, covered) = buf.split_at_mut(iv_at);
                hmac.compute_into(&[covered], &mut head[mac_at..]);
                let start = mac_at - hlen;
                buf[start..mac_at].copy_from_slice(&header[..hlen]);
                start
            }
        };
        self.last_sent_id = packet_id;
        buf.advance(start);
        Ok(packet_id)
    }

    /// Authenticates and decrypts a whole wire packet in place, then checks its packet id
    /// against the replay window (with `now_secs`, the caller's monotonic seconds). On
    /// success `buf` holds the plaintext (compression framing still on) and the packet id is
    /// returned. On error the contents of `buf` are unspecified; drop it.
    ///
    /// CBC: the HMAC over IV and ciphertext is verified (constant time) before anything is
    /// decrypted. AEAD: the ciphertext is decrypted in place and the tag verified before the
    /// plaintext is released.
    pub fn decrypt(&mut self, buf: &mut BytesMut, now_secs: u64) -> Result<u32, DataError> {
        let header = DataHeader::parse(buf)?;
        if header.key_id() != self.header.key_id() {
            return Err(key_id_mismatch(header.key_id(), self.header.key_id()));
        }
        let hlen = header.len();
        let key_id = header.key_id().get();
        let auth_failed = DataError::AuthFailed { key_id };
        let (packet_id, plain) = match &mut self.recv {
            Engine::Aead { ctx, implicit_iv } => {
                let ct_at = hlen + PACKET_ID_LEN + AEAD_TAG_LEN;
                if buf.len() < ct_at {
                    return Err(DataError::BadLength {
                        len: buf.len(),
                        min: ct_at,
                    });
                }
                let mut pid = [0u8; PACKET_ID_LEN];
                pid.copy_from_slice(&buf[hlen..hlen + PACKET_ID_LEN]);
                ctx.decrypt_init(None, None, Some(&nonce(pid, implicit_iv)))?;
                let (a, n) = aad(&header.bytes(), hlen, &pid);
                ctx.cipher_update(&a[..n], None)?;
                ctx.set_tag(&buf[ct_at - AEAD_TAG_LEN..ct_at])?;
                let len = buf.len() - ct_at;
                ctx.cipher_update_inplace(&mut buf[ct_at..], len)?;
                if ctx.cipher_final(&mut []).is_err() {
                    return Err(auth_failed);
                }
                (u32::from_be_bytes(pid), ct_at)
            }
            Engine::Cbc { ctx, hmac } => {
                let mac_len = hmac.output_len();
                let iv_at = hlen + mac_len;
                let ct_at = iv_at + CBC_BLOCK_LEN;
                let min = ct_at + CBC_BLOCK_LEN;
                if buf.len() < min || (buf.len() - ct_at) % CBC_BLOCK_LEN != 0 {
                    return Err(DataError::BadLength {
                        len: buf.len(),
                        min,
                    });
                }
                if !hmac.verify(&[&buf[iv_at..]], &buf[hlen..iv_at]) {
                    return Err(auth_failed);
                }
                let mut iv = [0u8; CBC_BLOCK_LEN];
                iv.copy_from_slice(&buf[iv_at..ct_at]);
                ctx.decrypt_init(None, None, Some(&iv))?;
                cbc_update_inplace(ctx, &mut buf[ct_at..])?;
                let pad = usize::from(buf[buf.len() - 1]);
                let plain_len = (buf.len() - ct_at).wrapping_sub(pad);
                if pad == 0
                    || pad > CBC_BLOCK_LEN
                    || plain_len < PACKET_ID_LEN
                    || buf[buf.len() - pad..]
                        .iter()
                        .any(|&b| usize::from(b) != pad)
                {
                    return Err(DataError::BadPadding);
                }
                buf.truncate(buf.len() - pad);
                let mut pid = [0u8; PACKET_ID_LEN];
                pid.copy_from_slice(&buf[ct_at..ct_at + PACKET_ID_LEN]);
                (u32::from_be_bytes(pid), ct_at + PACKET_ID_LEN)
            }
        };
        self.replay.check_and_record(packet_id, 0, now_secs)?;
        buf.advance(plain);
        Ok(packet_id)
    }
}

impl Engine {
    fn new(params: &DataKeyParams, key: &Key, encrypt: bool) -> Result<Engine, DataError> {
        let cipher = params.cipher;
        let cipher_key = &key.cipher[..cipher.key_len()];
        if cipher_key.iter().all(|&b| b == 0) {
            return Err(DataError::ZeroKey);
        }
        let mut ctx = CipherCtx::new()?;
        if encrypt {
            ctx.encrypt_init(Some(cipher.openssl()), Some(cipher_key), None)?;
        } else {
            ctx.decrypt_init(Some(cipher.openssl()), Some(cipher_key), None)?;
        }
        if cipher.is_aead() {
            let mut implicit_iv = [0u8; AEAD_IMPLICIT_IV_LEN];
            implicit_iv.copy_from_slice(&key.hmac[..AEAD_IMPLICIT_IV_LEN]);
            Ok(Engine::Aead { ctx, implicit_iv })
        } else {
            // Padding is added and checked by hand so the ciphertext can be processed in place.
            ctx.set_padding(false);
            let hmac = HmacKey::new(params.auth, &key.hmac[..params.auth.output_len()]);
            Ok(Engine::Cbc { ctx, hmac })
        }
    }
}

/// The AEAD nonce: packet id || implicit IV.
fn nonce(pid: [u8; PACKET_ID_LEN], implicit_iv: &[u8; AEAD_IMPLICIT_IV_LEN]) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..PACKET_ID_LEN].copy_from_slice(&pid);
    n[PACKET_ID_LEN..].copy_from_slice(implicit_iv);
    n
}

/// The AEAD additional data: header || packet id for P_DATA_V2, packet id only for P_DATA_V1.
/// Returns the bytes and their length (8 or 4).
fn aad(header: &[u8; 4], hlen: usize, pid: &[u8; PACKET_ID_LEN]) -> ([u8; 8], usize) {
    let mut a = [0u8; 8];
    if hlen == DataHeader::V2_LEN {
        a[..4].copy_from_slice(header);
        a[4..].copy_from_slice(pid);
        (a, 8)
    } else {
        a[..4].copy_from_slice(pid);
        (a, 4)
    }
}

/// CBC over `data` (whole blocks) in place. OpenSSL's in-place update wants one spare block
/// behind its input, so all blocks but the last go in place and the last through a stack
/// buffer; no tailroom needed.
fn cbc_update_inplace(ctx: &mut CipherCtx, data: &mut [u8]) -> Result<(), DataError> {
    let split = data.len() - CBC_BLOCK_LEN;
    if split > 0 {
        ctx.cipher_update_inplace(data, split)?;
    }
    let mut last = [0u8; CBC_BLOCK_LEN];
    last.copy_from_slice(&data[split..]);
    let mut out = [0u8; 2 * CBC_BLOCK_LEN];
    ctx.cipher_update(&last, Some(&mut out))?;
    data[split..].copy_from_slice(&out[..CBC_BLOCK_LEN]);
    Ok(())
}
