//! Entry points for the fuzz targets in `fuzz/` (one line each there). Each must never
//! panic, whatever the input; where a parser accepts input, the entry point also checks the
//! invariant the fuzzer should hunt for (e.g. re-emitting gives the same bytes).
//!
//! Not part of the supported API.

use bytes::BytesMut;

use crate::framing::FrameDecoder;
use crate::packet::ControlPacket;

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
        }
    }
}
