//! Sessions over time: renegotiation (forced, by `reneg-sec`, both initiators) with data
//! flowing across every key switch, `reneg-sec MAX [MIN]` drawn per session as upstream 2.6
//! does, keepalive pings and `ping-restart`.

#![allow(clippy::unwrap_used)]

mod common;
mod session_util;

use std::time::Duration;

use protocol::session::{CloseReason, Event, Keepalive};
use session_util::{Pair, Setup};

fn renegotiated(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::KeyRenegotiated { .. }))
        .count()
}

fn close_reason(events: &[Event]) -> Option<&CloseReason> {
    events.iter().find_map(|e| match e {
        Event::Closed(r) => Some(r),
        _ => None,
    })
}

/// Sends one packet each way with a recognisable payload.
fn traffic(pair: &mut Pair, sent: &mut (u32, u32)) {
    let up = format!("up {}", sent.0);
    pair.send_data(true, up.as_bytes()).unwrap();
    sent.0 += 1;
    let down = format!("down {}", sent.1);
    pair.send_data(false, down.as_bytes()).unwrap();
    sent.1 += 1;
}

fn assert_all_delivered(pair: &Pair, sent: (u32, u32)) {
    assert!(pair.client_errors.is_empty(), "{:?}", pair.client_errors);
    assert!(pair.server_errors.is_empty(), "{:?}", pair.server_errors);
    let up: Vec<String> = (0..sent.0).map(|i| format!("up {i}")).collect();
    let down: Vec<String> = (0..sent.1).map(|i| format!("down {i}")).collect();
    let got_up: Vec<String> = pair
        .server_tun
        .iter()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect();
    let got_down: Vec<String> = pair
        .client_tun
        .iter()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect();
    assert_eq!(got_up, up);
    assert_eq!(got_down, down);
}

#[test]
fn twenty_renegotiations_with_data_flowing() {
    let mut pair = Setup::new(11).build();
    pair.connect();
    let mut sent = (0, 0);
    for round in 0..20 {
        let (now, t) = (pair.now(), round % 2 == 0);
        if t {
            pair.client.renegotiate(now);
        } else {
            pair.server.renegotiate(now);
        }
        // Data goes out between every single exchange of the soft reset and the new TLS
        // handshake, so packets cross the key switch in both directions.
        let mut steps = 0;
        while renegotiated(&pair.client_events) <= round
            || renegotiated(&pair.server_events) <= round
        {
            traffic(&mut pair, &mut sent);
            if !pair.pump_once() {
                pair.step(pair.elapsed + Duration::from_secs(60));
            }
            steps += 1;
            assert!(steps < 1000, "renegotiation {round} stuck");
        }
        for _ in 0..5 {
            traffic(&mut pair, &mut sent);
            pair.pump_once();
        }
        pair.pump();
        pair.elapsed += Duration::from_secs(1);
    }
    pair.pump();
    assert_eq!(renegotiated(&pair.client_events), 20);
    assert_eq!(renegotiated(&pair.server_events), 20);
    assert!(!pair.client_closed() && !pair.server_closed());
    assert_all_delivered(&pair, sent);
    // Key ids went 1..=7 and wrapped to 1 (never 0 again).
    let ids: Vec<u8> = pair
        .client_events
        .iter()
        .filter_map(|e| match e {
            Event::KeyRenegotiated { key_id } => Some(key_id.get()),
            _ => None,
        })
        .collect();
    let expected: Vec<u8> = (0..20).map(|i| (i % 7) as u8 + 1).collect();
    assert_eq!(ids, expected);
}

#[test]
fn reneg_sec_and_keepalive_over_time() {
    let mut setup = Setup::new(12);
    setup.server.keepalive = Some(Keepalive {
        ping: 2,
        ping_restart: 10,
    });
    setup.server.session.reneg_sec = Some(Duration::from_secs(20));
    setup.client.session.reneg_sec = None;
    let mut pair = setup.build();
    pair.connect();
    let mut sent = (0, 0);
    for _ in 0..100 {
        traffic(&mut pair, &mut sent);
        pair.advance(Duration::from_secs(1));
    }
    assert!(!pair.client_closed(), "{:?}", pair.client_events);
    assert!(!pair.server_closed(), "{:?}", pair.server_events);
    // reneg-sec 20 minus up to 10% jitter: at least 4 server-initiated renegotiations.
    assert!(renegotiated(&pair.client_events) >= 4);
    assert_eq!(
        renegotiated(&pair.client_events),
        renegotiated(&pair.server_events)
    );
    assert_all_delivered(&pair, sent);

    // Idle: only pings keep the sessions alive.
    pair.advance(Duration::from_secs(60));
    assert!(!pair.client_closed() && !pair.server_closed());
    assert_all_delivered(&pair, sent);
}

/// When the first renegotiation of each of `sessions` pairs started together completes, on
/// the virtual clock: `server` / `client` give each side's `reneg-sec` (`MAX`, `MIN`), `None`
/// off.
fn first_renegotiations(
    sessions: u64,
    server: Option<(u64, Option<u64>)>,
    client: Option<(u64, Option<u64>)>,
) -> Vec<Duration> {
    let secs = Duration::from_secs;
    (0..sessions)
        .map(|i| {
            let mut setup = Setup::new(4000 + i);
            setup.server.session.reneg_sec = server.map(|(max, _)| secs(max));
            setup.server.session.reneg_sec_min = server.and_then(|(_, min)| min.map(secs));
            setup.client.session.reneg_sec = client.map(|(max, _)| secs(max));
            setup.client.session.reneg_sec_min = client.and_then(|(_, min)| min.map(secs));
            let mut pair = setup.build();
            pair.connect();
            assert!(
                pair.run_until(secs(120), |p| renegotiated(&p.client_events) >= 1
                    && renegotiated(&p.server_events) >= 1)
            );
            pair.elapsed
        })
        .collect()
}

fn spread(times: &[Duration]) -> (Duration, Duration) {
    (*times.iter().min().unwrap(), *times.iter().max().unwrap())
}

#[test]
fn reneg_sec_is_drawn_per_session_between_min_and_max() {
    let secs = Duration::from_secs;
    // A server without MIN: MAX less up to a tenth, spread over the sessions.
    let server = first_renegotiations(24, Some((30, None)), None);
    let (low, high) = spread(&server);
    assert!(low >= secs(27) && high <= secs(30), "{server:?}");
    assert!(high - low >= secs(2), "not spread: {server:?}");

    // `reneg-sec 30 10` on the server: above 10 s, at most 30 s, spread over the range.
    let server = first_renegotiations(24, Some((30, Some(10))), None);
    let (low, high) = spread(&server);
    assert!(low > secs(10) && high <= secs(30), "{server:?}");
    assert!(low < secs(16) && high > secs(24), "not spread: {server:?}");

    // The same on the client, the server renegotiating never.
    let client = first_renegotiations(24, None, Some((30, Some(10))));
    let (low, high) = spread(&client);
    assert!(low > secs(10) && high <= secs(30), "{client:?}");
    assert!(low < secs(16) && high > secs(24), "not spread: {client:?}");

    // A client without MIN renegotiates at MAX, as upstream's.
    let client = first_renegotiations(8, None, Some((30, None)));
    assert!(client.iter().all(|t| *t == secs(30)), "{client:?}");
}

#[test]
fn ping_restart_after_silence() {
    let mut setup = Setup::new(13);
    setup.server.keepalive = Some(Keepalive {
        ping: 2,
        ping_restart: 10,
    });
    let mut pair = setup.build();
    pair.connect();
    pair.advance(Duration::from_secs(30));
    assert!(!pair.client_closed());
    // The server's packets stop arriving.
    pair.blackhole_s2c = true;
    let cut = pair.elapsed;
    assert!(pair.run_until(Duration::from_secs(200), |p| p.client_closed()));
    let silence = pair.elapsed - cut;
    match close_reason(&pair.client_events) {
        Some(CloseReason::PingRestart(d)) => {
            assert!(*d >= Duration::from_secs(10), "{d:?}");
            assert!(silence <= Duration::from_secs(11), "{silence:?}");
        }
        other => panic!("unexpected close {other:?}"),
    }
    // The server's own limit is twice the pushed one (keepalive 2 10 -> ping-restart 20):
    // the client stops pinging once closed.
    assert!(pair.run_until(Duration::from_secs(300), |p| p.server_closed()));
    assert!(matches!(
        close_reason(&pair.server_events),
        Some(CloseReason::PingRestart(d)) if *d >= Duration::from_secs(20)
    ));
}
