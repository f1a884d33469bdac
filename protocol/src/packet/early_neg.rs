//! Early-negotiation TLVs in the payload of a hard reset (OpenVPN 2.6).
//!
//! ```text
//! +-------------+-------------+=====================+
//! | type (u16)  | length (u16)| value (length bytes)| ... repeated to the end
//! +-------------+-------------+=====================+
//! ```
//!
//! A 2.6 peer reads the payload of the first hard reset it receives (message id 0) as such a
//! list. Unknown types are skipped; a TLV that does not fit (fewer than 4 bytes left, or a
//! length beyond the end) is a fatal handshake error. The only defined type is
//! [`TLV_TYPE_EARLY_NEG_FLAGS`], whose value is a `u16` of flags; the only flag,
//! [`EARLY_NEG_FLAG_RESEND_WKC`], asks a tls-crypt-v2 client to send its wrapped key again
//! in a P_CONTROL_WKC_V1. Flags from several flag TLVs accumulate. An empty payload (no
//! TLVs) is what every peer sends outside UDP tls-crypt-v2.

use bytes::{BufMut, BytesMut};

/// Length of a TLV header (type and length).
pub const TLV_HEADER_LEN: usize = 4;

/// `TLV_TYPE_EARLY_NEG_FLAGS`: the TLV carrying the early-negotiation flags.
pub const TLV_TYPE_EARLY_NEG_FLAGS: u16 = 0x0001;

/// The required value length of a [`TLV_TYPE_EARLY_NEG_FLAGS`] TLV (one `u16`).
pub const EARLY_NEG_FLAGS_LEN: usize = 2;

/// `EARLY_NEG_FLAG_RESEND_WKC`: the peer must resend its tls-crypt-v2 wrapped client key.
pub const EARLY_NEG_FLAG_RESEND_WKC: u16 = 0x0001;

/// One TLV, its value borrowed from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tlv<'a> {
    /// The type.
    pub tlv_type: u16,
    /// The value (at most `u16::MAX` bytes to be emittable).
    pub value: &'a [u8],
}

/// A malformed TLV list, or a TLV that cannot be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TlvError {
    /// The list ends inside a TLV header or value (fatal for the handshake in OpenVPN).
    #[error(
        "early-negotiation TLV at offset {offset} truncated: needs {needed} bytes, have {had}"
    )]
    Truncated {
        /// Offset of the TLV in the payload.
        offset: usize,
        /// Bytes the TLV needs from `offset` (header, or header and value).
        needed: usize,
        /// Bytes left from `offset`.
        had: usize,
    },
    /// A flags TLV whose length is not [`EARLY_NEG_FLAGS_LEN`].
    #[error("early-negotiation flags TLV has length {len}, must be {EARLY_NEG_FLAGS_LEN}")]
    BadFlagsLength {
        /// The announced length.
        len: u16,
    },
    /// A value longer than a `u16` length can express (emit only).
    #[error("TLV value of {len} bytes is longer than {} bytes", u16::MAX)]
    ValueTooLong {
        /// The value length.
        len: usize,
    },
}

/// Iterates over the TLVs of a payload; yields an error (and then stops) at a truncated TLV.
#[derive(Debug, Clone)]
pub struct TlvIter<'a> {
    rest: &'a [u8],
    offset: usize,
}

/// The TLVs of `payload`, in order.
pub fn tlvs(payload: &[u8]) -> TlvIter<'_> {
    TlvIter {
        rest: payload,
        offset: 0,
    }
}

impl<'a> Iterator for TlvIter<'a> {
    type Item = Result<Tlv<'a>, TlvError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let had = self.rest.len();
        let truncated = |needed| TlvError::Truncated {
            offset: self.offset,
            needed,
            had,
        };
        let parsed = match self.rest.split_first_chunk::<TLV_HEADER_LEN>() {
            None => Err(truncated(TLV_HEADER_LEN)),
            Some((&[t0, t1, l0, l1], rest)) => {
                let len = usize::from(u16::from_be_bytes([l0, l1]));
                match (rest.get(..len), rest.get(len..)) {
                    (Some(value), Some(after)) => Ok((
                        Tlv {
                            tlv_type: u16::from_be_bytes([t0, t1]),
                            value,
                        },
                        after,
                    )),
                    _ => Err(truncated(TLV_HEADER_LEN + len)),
                }
            }
        };
        match parsed {
            Ok((tlv, after)) => {
                self.offset += TLV_HEADER_LEN + tlv.value.len();
                self.rest = after;
                Some(Ok(tlv))
            }
            Err(e) => {
                // Stop after the error: nothing after a broken length can be trusted.
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

impl Tlv<'_> {
    /// Length of the emitted TLV.
    pub fn emitted_len(&self) -> usize {
        TLV_HEADER_LEN + self.value.len()
    }

    /// Appends the TLV to `dst`; writes nothing if the value is too long.
    pub fn emit(&self, dst: &mut BytesMut) -> Result<(), TlvError> {
        let len = u16::try_from(self.value.len()).map_err(|_| TlvError::ValueTooLong {
            len: self.value.len(),
        })?;
        dst.reserve(self.emitted_len());
        dst.put_u16(self.tlv_type);
        dst.put_u16(len);
        dst.put_slice(self.value);
        Ok(())
    }
}

/// What a hard-reset payload negotiates, as OpenVPN 2.6 reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EarlyNegotiation {
    /// The early-negotiation flags (union of all flags TLVs); `None` if there was no flags
    /// TLV. Unknown bits are kept.
    pub flags: Option<u16>,
}

impl EarlyNegotiation {
    /// Reads a hard-reset payload: accumulates flags TLVs, skips unknown types, fails on a
    /// truncated TLV or a flags TLV of the wrong length.
    pub fn parse(payload: &[u8]) -> Result<EarlyNegotiation, TlvError> {
        let mut neg = EarlyNegotiation::default();
        for tlv in tlvs(payload) {
            let tlv = tlv?;
            if tlv.tlv_type != TLV_TYPE_EARLY_NEG_FLAGS {
                continue;
            }
            let Ok(&[hi, lo]) = <&[u8; EARLY_NEG_FLAGS_LEN]>::try_from(tlv.value) else {
                return Err(TlvError::BadFlagsLength {
                    // `tlvs` never yields a value longer than u16::MAX.
                    len: u16::try_from(tlv.value.len()).unwrap_or(u16::MAX),
                });
            };
            neg.flags = Some(neg.flags.unwrap_or(0) | u16::from_be_bytes([hi, lo]));
        }
        Ok(neg)
    }

    /// Whether the peer asks for the tls-crypt-v2 wrapped client key again
    /// ([`EARLY_NEG_FLAG_RESEND_WKC`]).
    pub fn resend_wkc(&self) -> bool {
        self.flags
            .is_some_and(|f| f & EARLY_NEG_FLAG_RESEND_WKC != 0)
    }

    /// Length of the emitted payload (0 without flags).
    pub fn emitted_len(&self) -> usize {
        if self.flags.is_some() {
            TLV_HEADER_LEN + EARLY_NEG_FLAGS_LEN
        } else {
            0
        }
    }

    /// Appends the payload: one flags TLV if `flags` is set, else nothing.
    pub fn emit(&self, dst: &mut BytesMut) {
        if let Some(flags) = self.flags {
            dst.reserve(self.emitted_len());
            dst.put_u16(TLV_TYPE_EARLY_NEG_FLAGS);
            // EARLY_NEG_FLAGS_LEN is 2.
            dst.put_u16(EARLY_NEG_FLAGS_LEN as u16);
            dst.put_u16(flags);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resend_wkc_flags_tlv() {
        // As a 2.6 UDP server writes it after a tls-crypt-v2 client reset.
        let payload = [0x00, 0x01, 0x00, 0x02, 0x00, 0x01];
        let neg = EarlyNegotiation::parse(&payload).unwrap();
        assert_eq!(neg.flags, Some(EARLY_NEG_FLAG_RESEND_WKC));
        assert!(neg.resend_wkc());
        let mut out = BytesMut::new();
        neg.emit(&mut out);
        assert_eq!(out[..], payload);
        assert_eq!(neg.emitted_len(), 6);
    }

    #[test]
    fn empty_payload_negotiates_nothing() {
        let neg = EarlyNegotiation::parse(&[]).unwrap();
        assert_eq!(neg, EarlyNegotiation::default());
        assert!(!neg.resend_wkc());
        let mut out = BytesMut::new();
        neg.emit(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn unknown_types_skipped_flags_accumulate() {
        let payload = [
            0x00, 0x07, 0x00, 0x03, 0xaa, 0xbb, 0xcc, // unknown type 7, 3 bytes
            0x00, 0x01, 0x00, 0x02, 0x80, 0x00, // flags 0x8000
            0x12, 0x34, 0x00, 0x00, // unknown, empty
            0x00, 0x01, 0x00, 0x02, 0x00, 0x01, // flags 0x0001
        ];
        let all: Vec<_> = tlvs(&payload).collect::<Result<_, _>>().unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(
            all[0],
            Tlv {
                tlv_type: 7,
                value: &[0xaa, 0xbb, 0xcc]
            }
        );
        assert_eq!(all[2].value, &[] as &[u8]);
        let neg = EarlyNegotiation::parse(&payload).unwrap();
        assert_eq!(neg.flags, Some(0x8001));
        assert!(neg.resend_wkc());

        let mut out = BytesMut::new();
        for tlv in &all {
            tlv.emit(&mut out).unwrap();
        }
        assert_eq!(out[..], payload);
    }

    #[test]
    fn truncation_and_bad_length() {
        assert_eq!(
            EarlyNegotiation::parse(&[0x00, 0x01, 0x00]),
            Err(TlvError::Truncated {
                offset: 0,
                needed: 4,
                had: 3
            })
        );
        assert_eq!(
            EarlyNegotiation::parse(&[0x00, 0x09, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00]),
            Err(TlvError::Truncated {
                offset: 4,
                needed: 6,
                had: 5
            })
        );
        assert_eq!(
            EarlyNegotiation::parse(&[0x00, 0x01, 0x00, 0x01, 0x01]),
            Err(TlvError::BadFlagsLength { len: 1 })
        );
        let mut it = tlvs(&[0x00]);
        assert!(matches!(it.next(), Some(Err(TlvError::Truncated { .. }))));
        assert_eq!(it.next(), None, "iteration stops after an error");

        let big = vec![0u8; 65536];
        let mut out = BytesMut::new();
        assert_eq!(
            Tlv {
                tlv_type: 2,
                value: &big
            }
            .emit(&mut out),
            Err(TlvError::ValueTooLong { len: 65536 })
        );
        assert!(out.is_empty());
    }
}
