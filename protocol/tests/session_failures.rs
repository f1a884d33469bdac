//! How sessions end: `AUTH_FAILED` when the server application rejects the client, a refused
//! peer certificate, the client's pull-filter (`reject` ends the session, `ignore` keeps
//! an option out of the accepted ones), and a server of the other `dev-type` (the client ends
//! the session before `PUSH_REQUEST`).

#![allow(clippy::unwrap_used)]

mod common;
mod session_util;

use std::sync::Arc;
use std::time::Duration;

use openssl::x509::X509Ref;
use protocol::km2::occ::DevType;
use protocol::push::{DropReason, FilterAction, PullFilter, PushError, PushedOption};
use protocol::session::{CloseReason, Event};
use protocol::tls::{PeerCertError, PeerVerifier, TlsError};
use session_util::Setup;

fn close_reason(events: &[Event]) -> Option<&CloseReason> {
    events.iter().find_map(|e| match e {
        Event::Closed(r) => Some(r),
        _ => None,
    })
}

#[test]
fn server_app_rejects_client_with_auth_failed() {
    let mut setup = Setup::new(21);
    setup.decision = Err(Some("unknown device".to_owned()));
    let mut pair = setup.build();
    assert!(
        pair.run_until(Duration::from_secs(30), |p| p.client_closed()
            && p.server_closed())
    );
    match close_reason(&pair.client_events) {
        Some(CloseReason::AuthFailed { reason }) => {
            assert_eq!(reason.as_deref(), Some("unknown device"));
        }
        other => panic!("client: {other:?}"),
    }
    assert!(matches!(
        close_reason(&pair.server_events),
        Some(CloseReason::AuthFailed { reason: Some(r) }) if r == "unknown device"
    ));
    assert!(!pair.connected());
    // No data key was ever made.
    assert!(pair.send_data(true, b"x").is_err());
}

#[test]
fn no_shared_cipher_is_auth_failed() {
    let mut setup = Setup::new(22);
    setup.client.session.data_ciphers = protocol::ncp::DataCiphers::parse("AES-128-GCM").unwrap();
    setup.server.session.data_ciphers = protocol::ncp::DataCiphers::parse("AES-256-GCM").unwrap();
    let mut pair = setup.build();
    assert!(pair.run_until(Duration::from_secs(30), |p| p.client_closed()));
    assert!(matches!(
        close_reason(&pair.client_events),
        Some(CloseReason::AuthFailed { reason: Some(r) }) if r.contains("cipher")
    ));
}

/// Refuses every certificate (as a failing `verify-x509-name` would).
#[derive(Debug)]
struct RefuseAll;

impl PeerVerifier for RefuseAll {
    fn verify_peer(&self, _leaf: &X509Ref) -> Result<(), PeerCertError> {
        Err(PeerCertError::NameMismatch {
            expected: "other-server".to_owned(),
            actual: "server".to_owned(),
        })
    }
}

#[test]
fn refused_server_certificate_ends_both_sides() {
    let mut pair = Setup::new(23).client_verifier(Arc::new(RefuseAll)).build();
    assert!(
        pair.run_until(Duration::from_secs(120), |p| p.client_closed()
            && p.server_closed())
    );
    match close_reason(&pair.client_events) {
        Some(CloseReason::Tls {
            source: TlsError::PeerRejected(PeerCertError::NameMismatch { expected, .. }),
            ..
        }) => assert_eq!(expected, "other-server"),
        other => panic!("client: {other:?}"),
    }
    // The server saw the alert (or, had it been lost, would time out the hand-window).
    assert!(matches!(
        close_reason(&pair.server_events),
        Some(CloseReason::Tls { .. } | CloseReason::HandWindowExpired { .. })
    ));
    assert!(!pair
        .server_events
        .iter()
        .any(|e| matches!(e, Event::ClientIdentified(_))));
}

#[test]
fn a_client_ends_the_session_with_a_server_of_the_other_dev_type() {
    for (client, server) in [(DevType::Tun, DevType::Tap), (DevType::Tap, DevType::Tun)] {
        let mut setup = Setup::new(26);
        setup.client.session.dev_type = client;
        setup.server.session.dev_type = server;
        let mut pair = setup.build();
        assert!(pair.run_until(Duration::from_secs(30), |p| p.client_closed()));
        match close_reason(&pair.client_events) {
            Some(CloseReason::DevTypeMismatch(m)) => {
                assert_eq!((m.peer, m.ours), (server, client));
                assert_eq!(
                    m.to_string(),
                    format!("dev-type {server}, this client is {client}")
                );
            }
            other => panic!("client {client} against server {server}: {other:?}"),
        }
        // No data key: nothing could be sent or installed.
        assert!(!pair
            .client_events
            .iter()
            .any(|e| matches!(e, Event::Connected(_))));
        assert!(pair.send_data(true, b"x").is_err());
    }
    // The same type on both sides connects (tap here; tun is every other test).
    let mut setup = Setup::new(27);
    setup.client.session.dev_type = DevType::Tap;
    setup.server.session.dev_type = DevType::Tap;
    setup.build().connect();
}

#[test]
fn pull_filter_reject_ends_the_session() {
    let mut setup = Setup::new(24);
    setup.client.pull.filters = vec![PullFilter::new(FilterAction::Reject, "route-gateway")];
    let mut pair = setup.build();
    assert!(pair.run_until(Duration::from_secs(30), |p| p.client_closed()));
    match close_reason(&pair.client_events) {
        Some(CloseReason::PushRejected(PushError::Rejected { option, filter })) => {
            assert_eq!(option, "route-gateway 10.8.0.1");
            assert_eq!(*filter, 0);
        }
        other => panic!("client: {other:?}"),
    }
    assert!(!pair
        .client_events
        .iter()
        .any(|e| matches!(e, Event::Connected(_))));
}

#[test]
fn pull_filter_ignore_keeps_option_out() {
    let mut setup = Setup::new(25);
    setup.client.pull.filters = vec![
        PullFilter::new(FilterAction::Accept, "route-gateway"),
        PullFilter::new(FilterAction::Ignore, "topology"),
    ];
    let mut pair = setup.build();
    pair.connect();
    let connected = pair
        .client_events
        .iter()
        .find_map(|e| match e {
            Event::Connected(c) => Some(c),
            _ => None,
        })
        .unwrap();
    assert!(!connected
        .push
        .accepted
        .iter()
        .any(|o| matches!(o, PushedOption::Topology(_))));
    assert!(connected
        .push
        .accepted
        .iter()
        .any(|o| matches!(o, PushedOption::RouteGateway(_))));
    assert!(connected
        .push
        .dropped
        .iter()
        .any(|d| d.text == "topology subnet"
            && d.reason == DropReason::IgnoredByFilter { filter: 1 }));
    pair.send_data(true, b"still works").unwrap();
    pair.pump();
    assert_eq!(&pair.server_tun[0][..], b"still works");
}

#[test]
fn peer_info_lines_with_control_bytes_reach_the_server_only_as_ignored_lines() {
    let mut setup = Setup::new(29);
    // The version goes into `IV_VER` unchecked: ESC, BEL and a line feed that starts a line of
    // its own.
    setup.client.version = "2.6\u{1b}[2J\u{7}\nIV_FAKE=\u{1b}]0;x\u{7}".to_owned();
    let mut pair = setup.build();
    pair.connect();
    let identity = pair
        .server_events
        .iter()
        .find_map(|e| match e {
            Event::ClientIdentified(id) => Some(id.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(identity.peer_info.version, None);
    assert!(identity
        .peer_info
        .extra
        .iter()
        .all(|(k, v)| k != "IV_FAKE" && !v.chars().any(char::is_control)));
    assert_eq!(identity.peer_info_ignored.len(), 2, "{identity:?}");
    for line in &identity.peer_info_ignored {
        let shown = line.to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }
    // The session goes on.
    assert!(pair.connected());
}
