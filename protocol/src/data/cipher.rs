//! Data-channel cipher names (`--cipher`, `--data-ciphers`, reference 9.1).

use std::fmt;

use openssl::cipher::{Cipher, CipherRef};

/// A data-channel cipher OpenVPN 2.6 can negotiate, with its canonical OpenVPN name.
///
/// The CBC ciphers are paired with an `--auth` [`Digest`](crate::digest::Digest) for their
/// HMAC; the AEAD ciphers ignore `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataCipher {
    /// `AES-256-GCM`, the first of the default `--data-ciphers`.
    Aes256Gcm,
    /// `AES-128-GCM`.
    Aes128Gcm,
    /// `CHACHA20-POLY1305`.
    ChaCha20Poly1305,
    /// `AES-256-CBC` with HMAC.
    Aes256Cbc,
    /// `AES-128-CBC` with HMAC.
    Aes128Cbc,
}

impl DataCipher {
    /// Every supported cipher, AEAD first in the default `--data-ciphers` order.
    pub const ALL: [DataCipher; 5] = [
        DataCipher::Aes256Gcm,
        DataCipher::Aes128Gcm,
        DataCipher::ChaCha20Poly1305,
        DataCipher::Aes256Cbc,
        DataCipher::Aes128Cbc,
    ];

    /// The canonical name, as OpenVPN prints it in `IV_CIPHERS` and pushes (`cipher NAME`).
    pub const fn name(self) -> &'static str {
        match self {
            DataCipher::Aes256Gcm => "AES-256-GCM",
            DataCipher::Aes128Gcm => "AES-128-GCM",
            DataCipher::ChaCha20Poly1305 => "CHACHA20-POLY1305",
            DataCipher::Aes256Cbc => "AES-256-CBC",
            DataCipher::Aes128Cbc => "AES-128-CBC",
        }
    }

    /// Parses a name case-insensitively (`aes-256-gcm`, `ChaCha20-Poly1305`).
    pub fn from_name(name: &str) -> Option<DataCipher> {
        DataCipher::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// Cipher key length in bytes: the prefix of a key block's cipher slot it uses.
    pub const fn key_len(self) -> usize {
        match self {
            DataCipher::Aes128Gcm | DataCipher::Aes128Cbc => 16,
            DataCipher::Aes256Gcm | DataCipher::ChaCha20Poly1305 | DataCipher::Aes256Cbc => 32,
        }
    }

    /// Whether this is an AEAD cipher (tag in the packet, `--auth` ignored).
    pub const fn is_aead(self) -> bool {
        matches!(
            self,
            DataCipher::Aes256Gcm | DataCipher::Aes128Gcm | DataCipher::ChaCha20Poly1305
        )
    }

    /// The OpenSSL cipher.
    pub(crate) fn openssl(self) -> &'static CipherRef {
        match self {
            DataCipher::Aes256Gcm => Cipher::aes_256_gcm(),
            DataCipher::Aes128Gcm => Cipher::aes_128_gcm(),
            DataCipher::ChaCha20Poly1305 => Cipher::chacha20_poly1305(),
            DataCipher::Aes256Cbc => Cipher::aes_256_cbc(),
            DataCipher::Aes128Cbc => Cipher::aes_128_cbc(),
        }
    }
}

impl fmt::Display for DataCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in DataCipher::ALL {
            assert_eq!(DataCipher::from_name(c.name()), Some(c));
            assert_eq!(DataCipher::from_name(&c.name().to_lowercase()), Some(c));
            assert_eq!(c.to_string(), c.name());
            assert_eq!(c.openssl().key_length(), c.key_len());
        }
        assert_eq!(
            DataCipher::from_name("chacha20-POLY1305"),
            Some(DataCipher::ChaCha20Poly1305)
        );
        assert_eq!(DataCipher::from_name("BF-CBC"), None);
        assert_eq!(DataCipher::from_name("AES-256"), None);
        assert!(DataCipher::Aes128Gcm.is_aead());
        assert!(!DataCipher::Aes128Cbc.is_aead());
    }
}
