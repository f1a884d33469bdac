//! The handshake, data and renegotiation when the control channel loses, duplicates and
//! reorders 10% of its packets each (data packets travel in order, as on TCP).

#![allow(clippy::unwrap_used)]

mod common;
mod session_util;

use std::time::Duration;

use protocol::data::DataCipher;
use protocol::session::{Event, SessionError};
use session_util::{Lossy, Pair, Setup};

const LOSSY: Lossy = Lossy {
    loss: 10,
    duplicate: 10,
    reorder: 10,
};

fn renegotiated(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::KeyRenegotiated { .. }))
        .count()
}

/// Control-packet drops (replayed duplicates, stale key ids) are expected; anything about
/// data is not.
fn data_errors(errors: &[SessionError]) -> Vec<&SessionError> {
    errors
        .iter()
        .filter(|e| !matches!(e, SessionError::Link(_) | SessionError::UnknownKeyId { .. }))
        .collect()
}

fn check(pair: &Pair, sent: u32) {
    assert!(
        data_errors(&pair.client_errors).is_empty(),
        "{:?}",
        pair.client_errors
    );
    assert!(
        data_errors(&pair.server_errors).is_empty(),
        "{:?}",
        pair.server_errors
    );
    let up: Vec<Vec<u8>> = pair.server_tun.iter().map(|b| b.to_vec()).collect();
    let down: Vec<Vec<u8>> = pair.client_tun.iter().map(|b| b.to_vec()).collect();
    let expect: Vec<Vec<u8>> = (0..sent).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(up, expect);
    assert_eq!(down, expect);
}

#[test]
fn lossy_control_channel() {
    let (mut duplicates_dropped, mut retransmit_waits) = (0, 0);
    for (i, cipher) in DataCipher::ALL.into_iter().cycle().take(12).enumerate() {
        let mut pair = Setup::new(1000 + i as u64).cipher(cipher).build();
        pair.lossy = Some(LOSSY);
        pair.connect();
        if pair.elapsed > Duration::ZERO {
            retransmit_waits += 1;
        }
        let mut sent = 0u32;
        for _ in 0..10 {
            pair.send_data(true, &sent.to_be_bytes()).unwrap();
            pair.send_data(false, &sent.to_be_bytes()).unwrap();
            sent += 1;
            pair.pump_once();
        }
        for round in 0..3 {
            let now = pair.now();
            if round % 2 == 0 {
                pair.client.renegotiate(now);
            } else {
                pair.server.renegotiate(now);
            }
            let mut steps = 0;
            while renegotiated(&pair.client_events) <= round
                || renegotiated(&pair.server_events) <= round
            {
                pair.send_data(true, &sent.to_be_bytes()).unwrap();
                pair.send_data(false, &sent.to_be_bytes()).unwrap();
                sent += 1;
                pair.pump();
                pair.step(pair.elapsed + Duration::from_secs(60));
                steps += 1;
                assert!(
                    steps < 2000 && !pair.client_closed() && !pair.server_closed(),
                    "seed {i} round {round}: {:?} {:?}",
                    pair.client_events,
                    pair.server_events
                );
            }
            // Let the last ACKs through so both sides send with the new key.
            pair.advance(Duration::from_secs(30));
        }
        pair.pump();
        check(&pair, sent);
        duplicates_dropped += pair.client_errors.len() + pair.server_errors.len();
    }
    // The channel really misbehaved: replayed duplicates were dropped, and some handshakes
    // needed retransmission timeouts.
    assert!(duplicates_dropped > 10, "{duplicates_dropped}");
    assert!(retransmit_waits > 3, "{retransmit_waits}");
}
