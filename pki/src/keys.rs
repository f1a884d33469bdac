//! Private key generation: ECDSA P-256 by default, RSA 2048 or 3072 on request.

use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;

/// The kind of key to generate for a CA or a leaf certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeySpec {
    /// ECDSA on NIST P-256 (prime256v1), signed with SHA-256. The default.
    #[default]
    EcdsaP256,
    /// RSA with a 2048-bit modulus.
    Rsa2048,
    /// RSA with a 3072-bit modulus.
    Rsa3072,
}

/// Errors from key generation.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// An RSA size other than 2048 or 3072 was asked for.
    #[error("unsupported RSA key size {bits} (use 2048 or 3072)")]
    UnsupportedRsaBits {
        /// The size asked for.
        bits: u32,
    },
    /// OpenSSL failed to generate the key.
    #[error("key generation failed")]
    Generate(#[source] ErrorStack),
}

impl KeySpec {
    /// The RSA spec for `bits`, which must be 2048 or 3072.
    pub fn rsa(bits: u32) -> Result<KeySpec, KeyError> {
        match bits {
            2048 => Ok(KeySpec::Rsa2048),
            3072 => Ok(KeySpec::Rsa3072),
            _ => Err(KeyError::UnsupportedRsaBits { bits }),
        }
    }

    /// Generates a fresh private key of this kind from OpenSSL's CSPRNG.
    pub fn generate(self) -> Result<PKey<Private>, KeyError> {
        let key = match self {
            KeySpec::EcdsaP256 => EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)
                .and_then(|group| EcKey::generate(&group))
                .and_then(PKey::from_ec_key),
            KeySpec::Rsa2048 => Rsa::generate(2048).and_then(PKey::from_rsa),
            KeySpec::Rsa3072 => Rsa::generate(3072).and_then(PKey::from_rsa),
        };
        key.map_err(KeyError::Generate)
    }
}

impl std::fmt::Display for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySpec::EcdsaP256 => "ECDSA P-256",
            KeySpec::Rsa2048 => "RSA 2048",
            KeySpec::Rsa3072 => "RSA 3072",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::pkey::Id;

    #[test]
    fn generates_each_kind() {
        let ec = KeySpec::EcdsaP256.generate().unwrap();
        assert_eq!(ec.id(), Id::EC);
        assert_eq!(ec.bits(), 256);
        let rsa = KeySpec::rsa(2048).unwrap().generate().unwrap();
        assert_eq!(rsa.id(), Id::RSA);
        assert_eq!(rsa.bits(), 2048);
    }

    #[test]
    fn refuses_odd_rsa_sizes() {
        assert!(matches!(
            KeySpec::rsa(1024),
            Err(KeyError::UnsupportedRsaBits { bits: 1024 })
        ));
        assert!(KeySpec::rsa(3072).is_ok());
    }
}
