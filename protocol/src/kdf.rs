//! Data-channel key derivation: OpenVPN's TLS 1.0 PRF method and the TLS keying-material
//! exporter method, both producing the 256-byte [`Key2`] block.
//!
//! PRF method (the default when `tls-ekm` was not negotiated), all inputs from the
//! key-method-2 messages of one key generation:
//!
//! ```text
//! master[48] = PRF(client.pre_master[48],
//!                  "OpenVPN master secret" || client.random1[32] || server.random1[32])
//! key2[256]  = PRF(master[48],
//!                  "OpenVPN key expansion" || client.random2[32] || server.random2[32]
//!                  || client_sid[8] || server_sid[8])
//! ```
//!
//! where `PRF` is the TLS 1.0/1.1 PRF of RFC 2246 section 5 (P_MD5 over the first half of the
//! secret XOR P_SHA1 over the second half) and the labels are plain ASCII with no separator.
//!
//! Exporter method (`key-derivation tls-ekm`): `key2` is the TLS exporter output for
//! [`EXPORT_KEY_DATA_LABEL`], no context, [`EXPORT_KEY_DATA_LEN`] bytes; the exporter call
//! belongs to the TLS layer, [`key2_from_exporter`] only maps its output.
//!
//! In both cases `key[0]` carries client-to-server traffic and `key[1]` server-to-client; pick
//! a side's (send, receive) keys with [`Key2::split`]`(role.data_direction())`. Check the
//! result with [`check_key2`] once the cipher key length is known: OpenVPN refuses an
//! all-zero cipher key ("Bad dynamic key generated").

use hmac::{Mac, SimpleHmac};
use md5::Md5;
use sha1::Sha1;

use crate::ids::SessionId;
use crate::key::{Key, Key2, KEY2_LEN};

/// Size of the client's pre-master secret in the key-method-2 message.
pub const PRE_MASTER_LEN: usize = 48;
/// Size of each random (`random1`, `random2`) in the key-method-2 messages.
pub const RANDOM_LEN: usize = 32;
/// Size of the master secret the PRF method derives first.
pub const MASTER_SECRET_LEN: usize = 48;
/// `KEY_EXPANSION_ID` followed by " master secret": the label of the master-secret step.
pub const MASTER_SECRET_LABEL: &[u8] = b"OpenVPN master secret";
/// `KEY_EXPANSION_ID` followed by " key expansion": the label of the key-block step.
pub const KEY_EXPANSION_LABEL: &[u8] = b"OpenVPN key expansion";
/// `EXPORT_KEY_DATA_LABEL`: TLS exporter label for the data-channel key block.
pub const EXPORT_KEY_DATA_LABEL: &str = "EXPORTER-OpenVPN-datakeys";
/// Number of bytes requested from the TLS exporter (one [`Key2`] block).
pub const EXPORT_KEY_DATA_LEN: usize = KEY2_LEN;

/// A derived key block that OpenVPN would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KdfError {
    /// The cipher key of `key[key_index]` is all zero over its first `key_len` bytes
    /// ("TLS Error: Bad dynamic key generated").
    #[error("bad dynamic key generated: cipher key {key_index} ({key_len} bytes) is all zero")]
    BadDynamicKey {
        /// Which key of the block, 0 or 1.
        key_index: usize,
        /// The cipher key length that was checked.
        key_len: usize,
    },
}

/// The TLS 1.0/1.1 PRF (RFC 2246 section 5): fills `out` with
/// `P_MD5(S1, seed) XOR P_SHA1(S2, seed)`, where `seed` is the concatenation of `seed_parts`,
/// S1 is the first and S2 the last `ceil(len/2)` bytes of `secret` (they share the middle
/// byte when the length is odd). This is OpenSSL's "TLS1-PRF" with digest "MD5-SHA1".
pub fn tls1_prf(secret: &[u8], seed_parts: &[&[u8]], out: &mut [u8]) {
    let half = secret.len().div_ceil(2);
    let s1 = &secret[..half];
    let s2 = &secret[secret.len() - half..];
    out.fill(0);
    p_hash_xor::<Md5>(s1, seed_parts, out);
    p_hash_xor::<Sha1>(s2, seed_parts, out);
}

/// The PRF method's first step: the 48-byte master secret from the client's pre-master secret
/// and both sides' `random1`.
pub fn master_secret(
    pre_master: &[u8; PRE_MASTER_LEN],
    client_random1: &[u8; RANDOM_LEN],
    server_random1: &[u8; RANDOM_LEN],
) -> [u8; MASTER_SECRET_LEN] {
    let mut master = [0u8; MASTER_SECRET_LEN];
    tls1_prf(
        pre_master,
        &[MASTER_SECRET_LABEL, client_random1, server_random1],
        &mut master,
    );
    master
}

/// The PRF method's second step: the 256-byte key block from the master secret, both sides'
/// `random2` and the control-channel session ids of the TLS client and the TLS server.
pub fn key_expansion(
    master: &[u8; MASTER_SECRET_LEN],
    client_random2: &[u8; RANDOM_LEN],
    server_random2: &[u8; RANDOM_LEN],
    client_sid: SessionId,
    server_sid: SessionId,
) -> Key2 {
    let mut block = [0u8; KEY2_LEN];
    tls1_prf(
        master,
        &[
            KEY_EXPANSION_LABEL,
            client_random2,
            server_random2,
            &client_sid.0,
            &server_sid.0,
        ],
        &mut block,
    );
    Key2::from_bytes(&block)
}

/// The exporter method: the 256 bytes exported for [`EXPORT_KEY_DATA_LABEL`] are the key
/// block as they are.
pub fn key2_from_exporter(ekm: &[u8; EXPORT_KEY_DATA_LEN]) -> Key2 {
    Key2::from_bytes(ekm)
}

/// Refuses a key block whose cipher key, in either direction, is all zero over the first
/// `cipher_key_len` bytes (clamped to the 64-byte slot), as OpenVPN's `check_key` does after
/// deriving data-channel keys.
pub fn check_key2(key2: &Key2, cipher_key_len: usize) -> Result<(), KdfError> {
    for (key_index, key) in key2.keys.iter().enumerate() {
        check_key(key, cipher_key_len).map_err(|()| KdfError::BadDynamicKey {
            key_index,
            key_len: cipher_key_len.min(key.cipher.len()),
        })?;
    }
    Ok(())
}

fn check_key(key: &Key, cipher_key_len: usize) -> Result<(), ()> {
    let len = cipher_key_len.min(key.cipher.len());
    if key.cipher[..len].iter().all(|&b| b == 0) {
        Err(())
    } else {
        Ok(())
    }
}

/// XORs `P_hash(secret, seed)` into `out`:
/// `HMAC(secret, A1 || seed) || HMAC(secret, A2 || seed) || ...` with `A0 = seed` and
/// `Ai = HMAC(secret, A(i-1))`.
fn p_hash_xor<D>(secret: &[u8], seed_parts: &[&[u8]], out: &mut [u8])
where
    D: hmac::digest::Digest + hmac::digest::core_api::BlockSizeUser,
{
    // `SimpleHmac` accepts keys of any length, so `new_from_slice` cannot fail; an empty
    // HMAC key is still valid (RFC 2104 pads it).
    let keyed = || {
        <SimpleHmac<D> as Mac>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
    };

    // A1 = HMAC(secret, seed)
    let mut mac = keyed();
    for part in seed_parts {
        mac.update(part);
    }
    let mut a = mac.finalize().into_bytes();

    for chunk in out.chunks_mut(a.len()) {
        let mut mac = keyed();
        mac.update(&a);
        for part in seed_parts {
            mac.update(part);
        }
        let block = mac.finalize().into_bytes();
        chunk
            .iter_mut()
            .zip(block.iter())
            .for_each(|(o, b)| *o ^= b);

        let mut mac = keyed();
        mac.update(&a);
        a = mac.finalize().into_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_cipher_key_is_refused() {
        let mut bytes = [1u8; KEY2_LEN];
        bytes[128..128 + 32].fill(0);
        let k = key2_from_exporter(&bytes);
        assert_eq!(
            check_key2(&k, 32),
            Err(KdfError::BadDynamicKey {
                key_index: 1,
                key_len: 32
            })
        );
        // Only the used prefix counts.
        bytes[128..128 + 40].fill(0);
        bytes[128 + 40] = 7;
        assert!(check_key2(&key2_from_exporter(&bytes), 40).is_err());
        assert!(check_key2(&key2_from_exporter(&bytes), 41).is_ok());
        assert!(check_key2(&key2_from_exporter(&[1; KEY2_LEN]), 32).is_ok());
    }

    #[test]
    fn prf_output_length_is_free() {
        let mut long = [0u8; 100];
        let mut short = [0u8; 37];
        tls1_prf(b"secret", &[b"seed"], &mut long);
        tls1_prf(b"secret", &[b"se", b"ed"], &mut short);
        assert_eq!(long[..37], short);
    }
}
