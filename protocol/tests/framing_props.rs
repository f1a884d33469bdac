//! Property tests of the TCP stream framing: however a stream of frames is cut into reads,
//! the decoder returns exactly the packets that were encoded; bad lengths are errors.

#![allow(clippy::unwrap_used)] // tests may unwrap (the workspace lint targets library code)

use bytes::BytesMut;
use proptest::prelude::*;
use protocol::framing::{FrameDecoder, FrameEncoder, FrameError, DEFAULT_STREAM_MAXLEN};

fn packet(max: u16) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..=usize::from(max))
}

/// Feeds `stream` to a decoder in chunks of the given sizes (cycled), collecting packets.
fn decode_in_chunks(
    dec: &FrameDecoder,
    stream: &[u8],
    chunks: &[usize],
) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = stream;
    let mut sizes = chunks.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap()).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(p) = dec.decode(&mut buf)? {
            out.push(p.to_vec());
        }
    }
    assert!(buf.is_empty(), "whole stream consumed");
    Ok(out)
}

proptest! {
    #[test]
    fn chunked_stream_decodes_to_same_packets(
        packets in prop::collection::vec(packet(DEFAULT_STREAM_MAXLEN), 0..12),
        chunks in prop::collection::vec(1usize..200, 1..20),
    ) {
        let enc = FrameEncoder::new();
        let mut stream = BytesMut::new();
        for p in &packets {
            enc.encode(p, &mut stream).unwrap();
        }
        prop_assert_eq!(
            stream.len(),
            packets.iter().map(|p| p.len() + 2).sum::<usize>()
        );
        let decoded = decode_in_chunks(&FrameDecoder::new(), &stream, &chunks).unwrap();
        prop_assert_eq!(decoded, packets);
    }

    #[test]
    fn small_limits_round_trip(
        max in 1u16..64,
        seed in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..64), 0..8),
        chunks in prop::collection::vec(1usize..9, 1..6),
    ) {
        let packets: Vec<Vec<u8>> = seed
            .into_iter()
            .map(|mut p| { p.truncate(usize::from(max)); p })
            .collect();
        let enc = FrameEncoder::with_max_len(max);
        let mut stream = BytesMut::new();
        for p in &packets {
            enc.encode(p, &mut stream).unwrap();
        }
        let decoded = decode_in_chunks(&FrameDecoder::with_max_len(max), &stream, &chunks).unwrap();
        prop_assert_eq!(decoded, packets);
    }

    #[test]
    fn bad_length_after_good_frames_is_an_error(
        packets in prop::collection::vec(packet(64), 0..4),
        bad_len in prop_oneof![Just(0u16), (DEFAULT_STREAM_MAXLEN + 1)..=u16::MAX],
        tail in prop::collection::vec(any::<u8>(), 0..8),
        chunks in prop::collection::vec(1usize..16, 1..6),
    ) {
        let dec = FrameDecoder::new();
        let mut stream = BytesMut::new();
        for p in &packets {
            FrameEncoder::new().encode(p, &mut stream).unwrap();
        }
        stream.extend_from_slice(&bad_len.to_be_bytes());
        stream.extend_from_slice(&tail);

        // Feed chunk by chunk: the good packets come out, then the error, never a bad packet.
        let mut buf = BytesMut::new();
        let mut good = Vec::new();
        let mut rest = &stream[..];
        let mut sizes = chunks.iter().cycle();
        let err = 'feed: loop {
            prop_assert!(!rest.is_empty(), "ran out of input before the error");
            let n = (*sizes.next().unwrap()).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            loop {
                match dec.decode(&mut buf) {
                    Ok(Some(p)) => good.push(p.to_vec()),
                    Ok(None) => break,
                    Err(e) => break 'feed e,
                }
            }
        };
        check_err(err, bad_len, &good, &packets)?;
    }

    #[test]
    fn encoder_refuses_what_decoder_would_refuse(len in 0usize..70_000, max in any::<u16>()) {
        let enc = FrameEncoder::with_max_len(max);
        let mut out = BytesMut::new();
        let res = enc.encode(&vec![0u8; len], &mut out);
        if len == 0 {
            prop_assert_eq!(res, Err(FrameError::Empty { max }));
        } else if len > usize::from(max) {
            prop_assert_eq!(res, Err(FrameError::TooLong { len, max }));
        } else {
            prop_assert!(res.is_ok());
            let got = FrameDecoder::with_max_len(max).decode(&mut out).unwrap().unwrap();
            prop_assert_eq!(got.len(), len);
        }
        if res.is_err() {
            prop_assert!(out.is_empty());
        }
    }
}

fn check_err(
    err: FrameError,
    bad_len: u16,
    good: &[Vec<u8>],
    packets: &[Vec<u8>],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(good, packets);
    let expected = if bad_len == 0 {
        FrameError::Empty {
            max: DEFAULT_STREAM_MAXLEN,
        }
    } else {
        FrameError::TooLong {
            len: usize::from(bad_len),
            max: DEFAULT_STREAM_MAXLEN,
        }
    };
    prop_assert_eq!(err, expected);
    Ok(())
}
