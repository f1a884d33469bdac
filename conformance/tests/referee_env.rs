//! `OPENVPN_REFEREE` names the upstream `openvpn` every lab helper runs (the tool check, the
//! throwaway PKI's `--genkey`, an upstream server or client, the matrix's upstream peers):
//! pointed at a wrapper script that records its arguments and then runs Debian's `openvpn`,
//! every one of those invocations goes through the wrapper, and the server it started works.
//! Its own test binary: the variable is the process's.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use conformance::netns::Netns;
use conformance::pki_fixture::TestPki;
use conformance::require_lab;
use conformance::upstream::{
    referee, tcp_server_config, ControlWrap, UpstreamOpenvpn, REFEREE_ENV,
};

#[test]
fn every_upstream_openvpn_the_lab_starts_is_the_one_openvpn_referee_names() {
    std::env::remove_var(REFEREE_ENV);
    assert_eq!(referee(), "openvpn");
    require_lab(&["openvpn"]);
    let dir = tempfile::Builder::new()
        .prefix("vpnt-referee-")
        .tempdir()
        .expect("tempdir");
    let record = dir.path().join("invocations");
    let wrapper = dir.path().join("openvpn-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec openvpn \"$@\"\n",
            record.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::env::set_var(REFEREE_ENV, &wrapper);
    assert_eq!(referee(), wrapper.display().to_string());

    // The tool check, the PKI's static key, an upstream server.
    require_lab(&["openvpn"]);
    let pki = TestPki::generate().expect("pki");
    let ns = Netns::new().expect("namespace");
    let server = UpstreamOpenvpn::start(
        &ns,
        &tcp_server_config(&pki, 1194, ControlWrap::TlsAuth, &[]),
        3,
    )
    .expect("upstream server");
    server
        .wait_listening(Duration::from_secs(20))
        .expect("the wrapped server listens");
    let calls = std::fs::read_to_string(&record).expect("the wrapper ran");
    let lines: Vec<&str> = calls.lines().collect();
    assert!(lines.contains(&"--version"), "{calls}");
    assert!(lines.contains(&"--genkey secret ta.key"), "{calls}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("--config ") && l.contains(" --verb 3 --log ")),
        "{calls}"
    );
    drop(server);

    // A referee that is not there fails the tool check by its name.
    let missing = dir.path().join("no-such-openvpn");
    std::env::set_var(REFEREE_ENV, &missing);
    let err = conformance::check_lab(&["openvpn"]).expect_err("missing referee");
    assert!(err.to_string().contains("no-such-openvpn"), "{err}");
    std::env::remove_var(REFEREE_ENV);
}
