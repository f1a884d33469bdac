//! The README's first command: the demo's core ([`conformance::demo::run`]) builds the lab,
//! brings the tunnel up through the ingress router, pings the shoot pod network from the seed and
//! downloads a file from it with a matching checksum, then tears everything down.

use conformance::demo::{self, Outcome, PingMethod, FILE_LEN, PING_COUNT, STEPS};
use conformance::require_lab;

#[test]
fn demo_pings_and_downloads_through_the_tunnel_and_cleans_up() {
    require_lab(&["curl", "python3"]);
    let mut seen = Vec::new();
    let summary = demo::run(&mut |step| seen.push(step.name));
    eprintln!("{summary}");
    assert!(summary.success(), "{summary}");
    assert_eq!(seen, STEPS, "every step reported once, in order");
    assert!(summary
        .steps
        .iter()
        .all(|s| matches!(s.outcome, Outcome::Ok(_))));

    let pool = summary.pool_address.expect("pool address");
    assert_eq!(pool.octets()[..3], [192, 168, 123], "{pool}");
    assert!(pool.octets()[3] >= 2, "{pool}");
    assert_eq!(summary.cipher.as_deref(), Some("AES-256-GCM"));
    assert!(
        summary
            .proxy_connect
            .as_deref()
            .is_some_and(|c| c.starts_with("CONNECT 10.250.0.1:1194 routed by Reversed-VPN")),
        "the client went through the router: {:?}",
        summary.proxy_connect
    );

    let ping = summary.ping.as_ref().expect("ping ran");
    assert_eq!(ping.sent, PING_COUNT);
    assert_eq!(ping.received, PING_COUNT, "every echo answered");
    assert_eq!(ping.rtts.len(), PING_COUNT as usize);
    if ping.method == PingMethod::TcpConnect {
        eprintln!("note: `ping` is not installed; the demo timed TCP connects instead");
    }

    let download = summary.download.as_ref().expect("download ran");
    assert_eq!(download.bytes, FILE_LEN as u64);
    assert_eq!(
        download.received_sha256, download.served_sha256,
        "checksum of the download through the tunnel"
    );

    // Teardown: none of the demo's namespaces is left.
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let list = String::from_utf8_lossy(&list.stdout);
    for (role, name) in &summary.namespaces {
        assert!(
            !list.split_whitespace().any(|w| w == name),
            "{role} namespace {name} left behind"
        );
    }
    assert!(
        summary.total < std::time::Duration::from_secs(30),
        "{summary}"
    );
}

/// Issue 5's end-to-end check: our server and client through the ingress router (the client
/// sends the `Reversed-VPN` header; the function name predates the router), ping and a 64 MiB TCP transfer with a checksum from the
/// seed namespace to an address in the shoot pod network.
#[test]
fn sixty_four_mib_from_the_pod_network_to_the_seed_through_tinyproxy() {
    require_lab(&["curl", "python3"]);
    const LEN: usize = 64 << 20;
    let summary = demo::run_with_file(LEN, &mut |_| {});
    assert!(summary.success(), "{summary}");
    let ping = summary.ping.as_ref().expect("ping ran");
    assert_eq!(ping.received, PING_COUNT, "{summary}");
    let download = summary.download.as_ref().expect("download ran");
    assert_eq!(download.bytes, LEN as u64, "{summary}");
    assert_eq!(
        download.received_sha256, download.served_sha256,
        "{summary}"
    );
    eprintln!(
        "64 MiB through the tunnel at {:.1} MiB/s",
        download.mib_per_sec()
    );
}
