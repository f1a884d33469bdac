//! The HMAC digests OpenVPN's `--auth` selects, keyed once and reused.
//!
//! tls-auth, the CBC data channel and tls-crypt (always SHA-256) authenticate with an HMAC whose
//! digest is one of these. [`HmacKey`] holds the keyed state so each packet only clones it
//! (no key schedule, no allocation per packet).

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Sha256, Sha512};
use subtle::ConstantTimeEq;

/// The largest digest output of [`Digest`] (SHA-512).
pub const MAX_DIGEST_LEN: usize = 64;

/// An `--auth` digest algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Digest {
    /// `SHA1`, OpenVPN's default `--auth`.
    Sha1,
    /// `SHA256`.
    Sha256,
    /// `SHA512`.
    Sha512,
}

impl Digest {
    /// Output length in bytes (20, 32 or 64); also the number of HMAC key bytes OpenVPN takes
    /// from a 64-byte HMAC slot of a key block.
    pub const fn output_len(self) -> usize {
        match self {
            Digest::Sha1 => 20,
            Digest::Sha256 => 32,
            Digest::Sha512 => 64,
        }
    }

    /// The canonical OpenVPN name, as printed in the OCC string (`auth SHA1`).
    pub const fn name(self) -> &'static str {
        match self {
            Digest::Sha1 => "SHA1",
            Digest::Sha256 => "SHA256",
            Digest::Sha512 => "SHA512",
        }
    }

    /// Parses a config name case-insensitively (`sha256`, `SHA-256` is not accepted by
    /// OpenVPN either, so neither is it here).
    pub fn from_name(name: &str) -> Option<Digest> {
        [Digest::Sha1, Digest::Sha256, Digest::Sha512]
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }
}

/// A keyed HMAC state. Cloning it is cheap and does not redo the key schedule.
#[derive(Clone)]
pub enum HmacKey {
    /// HMAC-SHA1.
    Sha1(Hmac<Sha1>),
    /// HMAC-SHA256.
    Sha256(Hmac<Sha256>),
    /// HMAC-SHA512.
    Sha512(Hmac<Sha512>),
}

impl std::fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_tuple("HmacKey").field(&self.digest()).finish()
    }
}

impl HmacKey {
    /// Keys an HMAC with `key`. OpenVPN keys with exactly `digest.output_len()` bytes of the slot;
    /// callers pass that prefix.
    pub fn new(digest: Digest, key: &[u8]) -> HmacKey {
        // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
        match digest {
            Digest::Sha1 => HmacKey::Sha1(keyed(key)),
            Digest::Sha256 => HmacKey::Sha256(keyed(key)),
            Digest::Sha512 => HmacKey::Sha512(keyed(key)),
        }
    }

    /// The digest this key uses.
    pub fn digest(&self) -> Digest {
        match self {
            HmacKey::Sha1(_) => Digest::Sha1,
            HmacKey::Sha256(_) => Digest::Sha256,
            HmacKey::Sha512(_) => Digest::Sha512,
        }
    }

    /// Output length in bytes.
    pub fn output_len(&self) -> usize {
        self.digest().output_len()
    }

    /// HMAC over the concatenation of `parts`, written to `out[..self.output_len()]`.
    ///
    /// # Panics
    /// If `out` is shorter than [`HmacKey::output_len`]; callers size it from the digest.
    pub fn compute_into(&self, parts: &[&[u8]], out: &mut [u8]) {
        let n = self.output_len();
        match self {
            HmacKey::Sha1(m) => finish(m.clone(), parts, &mut out[..n]),
            HmacKey::Sha256(m) => finish(m.clone(), parts, &mut out[..n]),
            HmacKey::Sha512(m) => finish(m.clone(), parts, &mut out[..n]),
        }
    }

    /// Compares the HMAC over `parts` with `tag` in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut buf = [0u8; MAX_DIGEST_LEN];
        let n = self.output_len();
        self.compute_into(parts, &mut buf);
        tag.len() == n && bool::from(buf[..n].ct_eq(tag))
    }
}

fn keyed<M: Mac + hmac::digest::KeyInit>(key: &[u8]) -> M {
    <M as hmac::digest::KeyInit>::new_from_slice(key).unwrap_or_else(|_| {
        // Unreachable: HMAC takes keys of every length.
        unreachable!("HMAC accepts any key length")
    })
}

fn finish<M: Mac>(mut mac: M, parts: &[&[u8]], out: &mut [u8]) {
    for part in parts {
        mac.update(part);
    }
    out.copy_from_slice(&mac.finalize().into_bytes()[..out.len()]);
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 4231 test case 2 (key "Jefe"), SHA-256 and SHA-512; RFC 2202 test case 2 for SHA-1.
    #[test]
    fn rfc_vectors() {
        let data = b"what do ya want for nothing?";
        let cases = [
            (Digest::Sha1, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"),
            (
                Digest::Sha256,
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                Digest::Sha512,
                "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737",
            ),
        ];
        for (digest, want) in cases {
            let key = HmacKey::new(digest, b"Jefe");
            let mut out = [0u8; MAX_DIGEST_LEN];
            // Split input to prove `parts` are concatenated.
            key.compute_into(&[&data[..5], &data[5..]], &mut out);
            assert_eq!(hex::encode(&out[..digest.output_len()]), want);
            assert!(key.verify(&[data], &out[..digest.output_len()]));
            out[0] ^= 1;
            assert!(!key.verify(&[data], &out[..digest.output_len()]));
            assert!(!key.verify(&[data], &out[..digest.output_len() - 1]));
        }
    }

    #[test]
    fn names() {
        assert_eq!(Digest::from_name("sha256"), Some(Digest::Sha256));
        assert_eq!(Digest::from_name("SHA1"), Some(Digest::Sha1));
        assert_eq!(Digest::from_name("md5"), None);
    }
}
