//! Entry points for the fuzz targets in `fuzz/` (one line each there). Each must never
//! panic, whatever the input; where a parser accepts input, the entry point also checks the
//! invariant the fuzzer should hunt for (e.g. re-emitting gives the same bytes).
//!
//! Not part of the supported API.

use bytes::BytesMut;

use crate::digest::Digest;
use crate::framing::FrameDecoder;
use crate::key::{Key2, KeyDirection, Role, KEY2_LEN};
use crate::packet::ControlPacket;
use crate::wrap::{TlsAuth, TlsCrypt};

/// Decodes frames out of `data` until the decoder needs more bytes or reports an error; the
/// frames and the rest must add up to the input.
pub fn framing(data: &[u8]) {
    let decoder = FrameDecoder::new();
    let mut buf = BytesMut::from(data);
    let mut consumed = 0;
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        consumed += 2 + frame.len();
    }
    assert_eq!(
        consumed + buf.len(),
        data.len(),
        "framing lost or invented bytes"
    );
}

/// Parses `data` as a control packet; an accepted packet must re-emit to the same bytes.
pub fn control_packet(data: &[u8]) {
    let Ok(packet) = ControlPacket::parse(data) else {
        return;
    };
    let mut out = BytesMut::new();
    assert!(
        packet.emit(&mut out).is_ok(),
        "a parsed packet must be valid"
    );
    assert_eq!(&out[..], data, "parse/emit round trip changed the bytes");
}

/// The key every wrapping entry point uses: bytes 0, 1, 2, ... 255.
fn counting_key() -> Key2 {
    Key2::from_bytes(&std::array::from_fn::<u8, KEY2_LEN, _>(|i| i as u8))
}

/// Unwraps `data` with tls-auth for each digest; a packet that authenticates (only if the
/// fuzzer forged an HMAC) must come out as the wire packet minus the HMAC and packet id.
pub fn tls_auth_unwrap(data: &[u8]) {
    let key = counting_key();
    for digest in [Digest::Sha1, Digest::Sha256, Digest::Sha512] {
        let mut wrap = TlsAuth::new(&key, KeyDirection::Normal, digest);
        let mut out = BytesMut::new();
        if wrap.unwrap(data, 0, &mut out).is_ok() {
            assert_eq!(out.len() + digest.output_len() + 8, data.len());
        } else {
            assert!(out.is_empty(), "a refused packet must leave no output");
        }
    }
}

/// Unwraps `data` with tls-crypt in both roles.
pub fn tls_crypt_unwrap(data: &[u8]) {
    let key = counting_key();
    for role in [Role::Client, Role::Server] {
        let mut wrap = TlsCrypt::new(&key, role);
        let mut out = BytesMut::new();
        if wrap.unwrap(data, 0, &mut out).is_err() {
            assert!(out.is_empty(), "a refused packet must leave no output");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_accept_odd_input() {
        let inputs: [&[u8]; 5] = [
            b"",
            &[0x00],
            &[0x00, 0x00, 0x38],
            &[0x00, 0x01, 0x38, 0x00],
            &[0x38, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0],
        ];
        for input in inputs {
            framing(input);
            control_packet(input);
            tls_auth_unwrap(input);
            tls_crypt_unwrap(input);
        }
    }
}
