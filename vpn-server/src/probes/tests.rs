//! Every readiness and liveness rule, on the fixtures in `vpn-server/fixtures/status/`, and
//! the environment handling on temporary files.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::status::read::parse;

macro_rules! fixture {
    ($name:literal) => {
        parse(include_bytes!(concat!("../../fixtures/status/", $name))).unwrap()
    };
}

fn client(cn: &str) -> read::Client {
    read::Client {
        common_name: cn.into(),
        real_address: "10.0.0.1:1".parse().unwrap(),
        virtual_address: String::new(),
        virtual_ipv6: None,
        bytes_received: 0,
        bytes_sent: 0,
        connected_since: read::Timestamp { unix: 0, nanos: 0 },
        username: "UNDEF".into(),
        client_id: "0".into(),
        peer_id: "0".into(),
        cipher: "AES-256-GCM".into(),
    }
}

fn with_clients(cns: &[&str]) -> Status {
    Status {
        clients: cns.iter().map(|cn| client(cn)).collect(),
        ..Status::default()
    }
}

#[test]
fn non_ha_ready_without_clients_or_with_a_shoot_client() {
    assert_eq!(check_ready(&fixture!("empty.status"), false), Ok(()));
    assert_eq!(
        check_ready(&fixture!("nonha-2.6-shoot.status"), false),
        Ok(())
    );
    assert_eq!(
        check_ready(&fixture!("nonha-2.7-shoot.status"), false),
        Ok(())
    );
    // A shoot client beside one in the handshake.
    assert_eq!(
        check_ready(&fixture!("nonha-2.6-ipv6-handshake.status"), false),
        Ok(())
    );
    // Prefix, not equality: the HA names count too.
    assert_eq!(
        check_ready(&with_clients(&["vpn-shoot-client-1"]), false),
        Ok(())
    );
    assert_eq!(
        check_ready(&with_clients(&["x", "vpn-shoot-clientX"]), false),
        Ok(())
    );
}

#[test]
fn non_ha_not_ready_with_only_other_clients() {
    // Clients still in the handshake (CN UNDEF) alone are not ready.
    assert_eq!(
        check_ready(&fixture!("nonha-2.6-handshake-only.status"), false),
        Err(NotReady::NoShootClient { clients: 2 })
    );
    for cns in [
        &["vpn-seed-client"][..],
        &["shoot-client"],
        &["VPN-SHOOT-CLIENT"],
        &[" vpn-shoot-client"],
        &["vpn-shoot-clien"],
    ] {
        assert_eq!(
            check_ready(&with_clients(cns), false),
            Err(NotReady::NoShootClient { clients: 1 }),
            "{cns:?}"
        );
    }
    assert_eq!(
        NotReady::NoShootClient { clients: 2 }.to_string(),
        "not ready: 2 client(s) connected, none with a CN starting with vpn-shoot-client"
    );
}

#[test]
fn ha_needs_two_clients_with_a_seed_and_a_shoot_client() {
    assert_eq!(check_ready(&fixture!("ha-2.6.status"), true), Ok(()));
    assert_eq!(check_ready(&fixture!("ha-2.7.status"), true), Ok(()));
    assert_eq!(
        check_ready(
            &with_clients(&["vpn-seed-client", "vpn-shoot-client-0"]),
            true
        ),
        Ok(())
    );
    // No clients is not ready in HA.
    assert_eq!(
        check_ready(&fixture!("empty.status"), true),
        Err(NotReady::TooFewClients { clients: 0 })
    );
    // One client cannot be both.
    assert_eq!(
        check_ready(&with_clients(&["vpn-shoot-client-0"]), true),
        Err(NotReady::TooFewClients { clients: 1 })
    );
    assert_eq!(
        check_ready(&fixture!("ha-2.6-no-seed-client.status"), true),
        Err(NotReady::MissingSide {
            clients: 3,
            seed_client: false,
            shoot_client: true
        })
    );
    assert_eq!(
        check_ready(&with_clients(&["vpn-seed-client", "vpn-seed-client"]), true),
        Err(NotReady::MissingSide {
            clients: 2,
            seed_client: true,
            shoot_client: false
        })
    );
    let undef = check_ready(&with_clients(&["UNDEF", "UNDEF"]), true).unwrap_err();
    assert_eq!(
        undef.to_string(),
        "not ready (HA): 2 client(s) connected, none with a CN starting with vpn-seed-client \
         and none with a CN starting with vpn-shoot-client"
    );
    // The non-HA file with a shoot client only is not HA-ready.
    assert!(check_ready(&fixture!("nonha-2.7-shoot.status"), true).is_err());
}

fn unix(secs: u64, millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
}

#[test]
fn alive_while_time_is_at_most_17_s_old() {
    // TIME,2026-03-14 09:26:53 = 1773480413.
    let s = fixture!("nonha-2.6-shoot.status");
    assert_eq!(check_alive(&s, unix(1_773_480_413, 0)), Ok(()));
    assert_eq!(check_alive(&s, unix(1_773_480_430, 0)), Ok(()));
    // In the future (a clock step) counts as fresh.
    assert_eq!(check_alive(&s, unix(1_773_480_000, 0)), Ok(()));
    let stale = check_alive(&s, unix(1_773_480_430, 1)).unwrap_err();
    assert_eq!(
        stale,
        Stale::TooOld {
            updated_at: read::Timestamp {
                unix: 1_773_480_413,
                nanos: 0
            },
            age_ms: 17_001
        }
    );
    assert_eq!(
        check_alive(&s, unix(1_773_480_455, 500))
            .unwrap_err()
            .to_string(),
        "OpenVPN status is stale: TIME 2026-03-14 09:26:53 is 42.5 s old, at most 17 s allowed"
    );
    // Clients in the handshake do not matter to liveness.
    let s = fixture!("nonha-2.6-handshake-only.status");
    assert_eq!(check_alive(&s, unix(1_773_480_600, 0)), Ok(()));
}

#[test]
fn a_file_without_time_is_stale() {
    let s = parse(b"TITLE,x\nEND\n").unwrap();
    assert_eq!(check_alive(&s, SystemTime::now()), Err(Stale::NoTime));
}

fn env(path: &Path, extra: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
    let mut vars = vec![("OPENVPN_STATUS_PATH".to_owned(), path.display().to_string())];
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    vars
}

const HA: &[(&str, &str)] = &[
    ("IS_HA", "true"),
    ("POD_NAME", "vpn-seed-server-1"),
    ("HA_VPN_CLIENTS", "2"),
];

#[test]
fn verbs_read_the_environment_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    std::fs::write(&path, include_bytes!("../../fixtures/status/ha-2.6.status")).unwrap();
    // Ready as HA, and as non-HA too (it has shoot clients).
    assert!(readiness(env(&path, HA)).is_ok());
    assert!(readiness(env(&path, &[])).is_ok());
    let written = unix(1_776_665_745, 0);
    assert!(liveness(env(&path, HA), written).is_ok());
    let late = liveness(env(&path, &[]), written + Duration::from_secs(60));
    assert!(
        matches!(late, Err(ProbeError::Stale(Stale::TooOld { .. }))),
        "{late:?}"
    );

    std::fs::write(
        &path,
        include_bytes!("../../fixtures/status/ha-2.6-no-seed-client.status"),
    )
    .unwrap();
    assert!(matches!(
        readiness(env(&path, HA)),
        Err(ProbeError::NotReady(NotReady::MissingSide { .. }))
    ));
    assert!(readiness(env(&path, &[])).is_ok());
}

#[test]
fn environment_missing_file_and_parse_errors() {
    let e = readiness(Vec::<(String, String)>::new()).unwrap_err();
    assert_eq!(
        netio::report::chain(&e),
        "invalid vpn2 environment: OPENVPN_STATUS_PATH is not set"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    // IS_HA without POD_NAME, as the server's start refuses it.
    let e = liveness(env(&path, &[("IS_HA", "true")]), SystemTime::now()).unwrap_err();
    assert!(
        matches!(e, ProbeError::Env(EnvError::HaNeeds { .. })),
        "{e:?}"
    );
    let e = liveness(env(&path, &[]), SystemTime::now()).unwrap_err();
    let line = netio::report::chain(&e);
    assert!(
        line.starts_with(&format!(
            "cannot read the OpenVPN status file {}: ",
            path.display()
        )),
        "{line}"
    );
    std::fs::write(
        &path,
        include_bytes!("../../fixtures/status/malformed-counter.status"),
    )
    .unwrap();
    let e = readiness(env(&path, &[])).unwrap_err();
    assert_eq!(
        netio::report::chain(&e),
        format!(
            "cannot parse the OpenVPN status file {}: line 4: Bytes Received \"-1\" is not an \
             unsigned 64-bit decimal number",
            path.display()
        )
    );
}

#[test]
fn a_status_file_over_the_bound_is_refused_unread_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openvpn.status");
    // A good file, then empty lines (which the reader skips) past the bound.
    let mut bytes = include_bytes!("../../fixtures/status/ha-2.6.status").to_vec();
    let size = usize::try_from(crate::status::read::MAX_STATUS_BYTES).unwrap() + 1;
    bytes.resize(size, b'\n');
    std::fs::write(&path, &bytes).unwrap();
    let e = readiness(env(&path, HA)).unwrap_err();
    assert_eq!(
        netio::report::chain(&e),
        format!(
            "cannot read the OpenVPN status file {}: 16777217 bytes, more than the 16777216 bytes a file may have",
            path.display()
        )
    );
    bytes.truncate(size - 1);
    std::fs::write(&path, &bytes).unwrap();
    assert!(readiness(env(&path, HA)).is_ok());
}
