//! OpenVPN static key files ("OpenVPN Static key V1"), the key of `--tls-auth` and
//! `--tls-crypt`, as written by `openvpn --genkey secret FILE`:
//!
//! ```text
//! #
//! # 2048 bit OpenVPN static key
//! #
//! -----BEGIN OpenVPN Static key V1-----
//! e2d0855e4b659d9f0a5b9d2c62942536        16 lines of 32 lowercase hex digits:
//! ...                                     the 256 bytes of a [`Key2`] in file order
//! -----END OpenVPN Static key V1-----
//! ```
//!
//! Parsing follows OpenVPN 2.6 (`read_key_file`):
//!
//! * everything before the first line that starts with the header is ignored (comments, or
//!   whatever precedes the key in an inline `<tls-auth>` block); the rest of the header line too;
//! * after it, hex digits are taken in pairs (upper or lower case, whitespace may even split a
//!   pair), ASCII whitespace is skipped and any other character is an error;
//! * a line starting with `-` ends the key data; it must be the footer line;
//! * reading stops after 256 bytes; text after that up to the footer line is ignored.
//!
//! OpenVPN accepts a 128-byte (one key) file in general, but 2.6 needs both keys for
//! tls-auth and tls-crypt, so fewer than 256 bytes is an error here.

use std::fmt::Write as _;

use rand_core::{CryptoRng, RngCore};

use crate::key::{Key2, KEY2_LEN};

/// The header line (`static_key_head`).
pub const STATIC_KEY_HEAD: &str = "-----BEGIN OpenVPN Static key V1-----";
/// The footer line (`static_key_foot`).
pub const STATIC_KEY_FOOT: &str = "-----END OpenVPN Static key V1-----";
/// Hex digits per data line in files written by `openvpn --genkey secret` (16 bytes).
pub const HEX_DIGITS_PER_LINE: usize = 32;

/// Why a static key text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StaticKeyError {
    /// No line starts with [`STATIC_KEY_HEAD`].
    #[error("static key header `{STATIC_KEY_HEAD}` not found")]
    MissingHeader,
    /// A character that is neither a hex digit nor whitespace inside the key data.
    #[error("invalid character {character:?} in static key data at line {line}, column {column}")]
    BadCharacter {
        /// The offending character.
        character: char,
        /// 1-based line number in the whole text.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
    },
    /// The key data ended in the middle of a byte (an odd number of hex digits).
    #[error("static key data has an odd number of hex digits ({found} whole bytes before it)")]
    OddHexDigits {
        /// Whole bytes read before the dangling digit.
        found: usize,
    },
    /// The key data ended before 256 bytes.
    #[error("static key too short: {found} of {KEY2_LEN} bytes found")]
    TooShort {
        /// Bytes read.
        found: usize,
    },
    /// 256 bytes were read but no line starting with [`STATIC_KEY_FOOT`] follows.
    #[error("static key footer `{STATIC_KEY_FOOT}` not found")]
    MissingFooter,
}

/// Parses a static key text: a file's contents or an inline block (leading text is ignored).
pub fn parse(text: &str) -> Result<Key2, StaticKeyError> {
    let mut lines = text.split('\n').enumerate();
    if !lines
        .by_ref()
        .any(|(_, line)| line.starts_with(STATIC_KEY_HEAD))
    {
        return Err(StaticKeyError::MissingHeader);
    }

    let mut bytes = [0u8; KEY2_LEN];
    let mut found = 0usize;
    // The high nibble of a byte whose second digit has not been seen yet.
    let mut pending: Option<u8> = None;

    for (index, line) in lines {
        if line.starts_with('-') {
            if found < KEY2_LEN {
                return Err(short(found, pending));
            }
            if line.starts_with(STATIC_KEY_FOOT) {
                return Ok(Key2::from_bytes(&bytes));
            }
            return Err(StaticKeyError::MissingFooter);
        }
        if found == KEY2_LEN {
            // Complete: everything up to the footer line is ignored, as upstream does.
            continue;
        }
        for (col, character) in line.chars().enumerate() {
            if let Some(nibble) = character.to_digit(16) {
                // `to_digit(16)` is below 16, so the cast is lossless.
                let nibble = nibble as u8;
                match pending.take() {
                    None => pending = Some(nibble),
                    Some(high) => {
                        bytes[found] = high << 4 | nibble;
                        found += 1;
                        if found == KEY2_LEN {
                            break;
                        }
                    }
                }
            } else if !is_c_space(character) {
                return Err(StaticKeyError::BadCharacter {
                    character,
                    line: index + 1,
                    column: col + 1,
                });
            }
        }
    }
    if found < KEY2_LEN {
        return Err(short(found, pending));
    }
    Err(StaticKeyError::MissingFooter)
}

/// Writes `key` exactly as `openvpn --genkey secret FILE` does (636 bytes, ending in a newline).
pub fn write(key: &Key2) -> String {
    let bytes = key.to_bytes();
    let mut out = String::with_capacity(640);
    out.push_str("#\n# 2048 bit OpenVPN static key\n#\n");
    out.push_str(STATIC_KEY_HEAD);
    out.push('\n');
    for line in bytes.chunks(HEX_DIGITS_PER_LINE / 2) {
        for b in line {
            // Writing to a String cannot fail.
            let _ = write!(out, "{b:02x}");
        }
        out.push('\n');
    }
    out.push_str(STATIC_KEY_FOOT);
    out.push('\n');
    out
}

/// Draws a fresh random static key (what `openvpn --genkey secret` does before writing it).
pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Key2 {
    let mut bytes = [0u8; KEY2_LEN];
    rng.fill_bytes(&mut bytes);
    Key2::from_bytes(&bytes)
}

fn short(found: usize, pending: Option<u8>) -> StaticKeyError {
    match pending {
        Some(_) => StaticKeyError::OddHexDigits { found },
        None => StaticKeyError::TooShort { found },
    }
}

/// C `isspace` in the "C" locale: ASCII whitespace including vertical tab.
fn is_c_space(c: char) -> bool {
    c.is_ascii_whitespace() || c == '\x0b'
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    fn counting() -> Key2 {
        Key2::from_bytes(&std::array::from_fn(|i| i as u8))
    }

    #[test]
    fn round_trip() {
        let key = counting();
        let text = write(&key);
        assert_eq!(text.len(), 636);
        assert_eq!(text.lines().count(), 21);
        assert!(text.contains("\n000102030405060708090a0b0c0d0e0f\n"));
        assert_eq!(parse(&text), Ok(key));
    }

    #[test]
    fn generate_is_seeded() {
        let mut a = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let mut b = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let k = generate(&mut a);
        assert_eq!(k, generate(&mut b));
        assert_ne!(k, generate(&mut b));
    }

    #[test]
    fn leading_junk_odd_layout_and_upper_case() {
        let hex = hex::encode_upper(counting().to_bytes());
        // One long line, a pair split by whitespace, CRLF line ends, text after the header.
        let text = format!(
            "<tls-auth>\r\nkey-direction 1\n{STATIC_KEY_HEAD} trailing\r\n  {} {}\t\r\n{}\r\n{STATIC_KEY_FOOT}\r\n</tls-auth>\n",
            &hex[..1],
            &hex[1..300],
            &hex[300..]
        );
        assert_eq!(parse(&text), Ok(counting()));
    }

    #[test]
    fn text_after_256_bytes_is_ignored() {
        let hex = hex::encode(counting().to_bytes());
        let text = format!("{STATIC_KEY_HEAD}\n{hex}zz??\nmore junk\n{STATIC_KEY_FOOT}\n");
        assert_eq!(parse(&text), Ok(counting()));
    }

    #[test]
    fn errors() {
        let hex = hex::encode(counting().to_bytes());
        assert_eq!(parse("no key here"), Err(StaticKeyError::MissingHeader));
        // The header must start its line.
        assert_eq!(
            parse(&format!(" {STATIC_KEY_HEAD}\n{hex}\n{STATIC_KEY_FOOT}")),
            Err(StaticKeyError::MissingHeader)
        );
        assert_eq!(
            parse(&format!("#\n{STATIC_KEY_HEAD}\n0011\n22x3\n")),
            Err(StaticKeyError::BadCharacter {
                character: 'x',
                line: 4,
                column: 3
            })
        );
        assert_eq!(
            parse(&format!(
                "{STATIC_KEY_HEAD}\n{}\n{STATIC_KEY_FOOT}\n",
                &hex[..255]
            )),
            Err(StaticKeyError::OddHexDigits { found: 127 })
        );
        assert_eq!(
            parse(&format!(
                "{STATIC_KEY_HEAD}\n{}\n{STATIC_KEY_FOOT}\n",
                &hex[..256]
            )),
            Err(StaticKeyError::TooShort { found: 128 })
        );
        assert_eq!(
            parse(&format!("{STATIC_KEY_HEAD}\n{}", &hex[..20])),
            Err(StaticKeyError::TooShort { found: 10 })
        );
        assert_eq!(
            parse(&format!("{STATIC_KEY_HEAD}\n{hex}\n")),
            Err(StaticKeyError::MissingFooter)
        );
        assert_eq!(
            parse(&format!(
                "{STATIC_KEY_HEAD}\n{hex}\n-----END something else-----\n"
            )),
            Err(StaticKeyError::MissingFooter)
        );
        // A '-' inside a data line is a bad character, not a footer.
        assert!(matches!(
            parse(&format!("{STATIC_KEY_HEAD}\n00-\n")),
            Err(StaticKeyError::BadCharacter { character: '-', .. })
        ));
    }
}
