//! The exporter's series from the fixtures in `vpn-server/fixtures/status/`, kumina's rules
//! for `openvpn_up`, the netstat series and Go's number format.

use super::*;
use crate::status::{self, read};

const PATH: &str = "/srv/status/openvpn.status";

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!("../../fixtures/status/", $name)).as_slice()
    };
}

const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 3382211
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 1542 311 4 12 6 912345 1002311 2231 0 77 0
Udp: InDatagrams NoPorts
Udp: 5 0
";

/// The sample lines (no `#` lines) of `samples` as the exporter writes them.
fn lines(samples: Vec<Sample>) -> Vec<String> {
    let mut out = Exposition::new();
    render(samples, &mut out);
    out.as_str()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

fn collected(bytes: &[u8]) -> (Result<(), kumina::StrictError>, Vec<Sample>) {
    let mut out = Vec::new();
    let result = kumina::collect(PATH, bytes, &mut out);
    (result, out)
}

#[test]
fn series_of_a_non_ha_file_exactly() {
    let (result, mut samples) = collected(fixture!("nonha-2.6-shoot.status"));
    assert_eq!(result, Ok(()));
    samples.push(Sample::new(
        Family::Up,
        vec![("status_path", PATH.into())],
        1.0,
    ));
    netstat::collect(SNMP, &mut samples);
    let client = "common_name=\"vpn-shoot-client\",connection_time=\"1773475331\",\
                  real_address=\"10.180.3.41:38422\",status_path=\"/srv/status/openvpn.status\",\
                  username=\"UNDEF\",virtual_address=\"\"";
    let route = |virt: &str| {
        format!(
            "openvpn_server_route_last_reference_time_seconds{{common_name=\"vpn-shoot-client\",\
             real_address=\"10.180.3.41:38422\",status_path=\"/srv/status/openvpn.status\",\
             virtual_address=\"{virt}\"}}"
        )
    };
    assert_eq!(
        lines(samples),
        [
            "openvpn_netstat_Tcp_OutSegs 1.002311e+06".to_owned(),
            "openvpn_netstat_Tcp_RetransSegs 2231".to_owned(),
            format!("openvpn_server_client_received_bytes_total{{{client}}} 4.8213377e+07"),
            format!("openvpn_server_client_sent_bytes_total{{{client}}} 1.90341226e+08"),
            "openvpn_server_connected_clients{status_path=\"/srv/status/openvpn.status\"} 1"
                .to_owned(),
            format!("{} 1.773475331e+09", route("242.0.0.0/16")),
            format!("{} 1.773480412e+09", route("243.0.0.0/13")),
            format!("{} 1.773480413e+09", route("244.0.0.0/11")),
            format!("{} 1.77348041e+09", route("fd8f:6d53:b97a:1::2")),
            "openvpn_status_update_time_seconds{status_path=\"/srv/status/openvpn.status\"} \
             1.773480413e+09"
                .to_owned(),
            "openvpn_up{status_path=\"/srv/status/openvpn.status\"} 1".to_owned(),
        ]
    );
}

#[test]
fn families_have_one_help_and_type_each() {
    let (_, mut samples) = collected(fixture!("ha-2.6.status"));
    netstat::collect(SNMP, &mut samples);
    let mut out = Exposition::new();
    render(samples, &mut out);
    let types: Vec<&str> = out
        .as_str()
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
        .collect();
    assert_eq!(
        types,
        [
            "# TYPE openvpn_netstat_Tcp_OutSegs untyped",
            "# TYPE openvpn_netstat_Tcp_RetransSegs untyped",
            "# TYPE openvpn_server_client_received_bytes_total counter",
            "# TYPE openvpn_server_client_sent_bytes_total counter",
            "# TYPE openvpn_server_connected_clients gauge",
            "# TYPE openvpn_server_route_last_reference_time_seconds gauge",
            "# TYPE openvpn_status_update_time_seconds gauge",
        ]
    );
    let helps = out
        .as_str()
        .lines()
        .filter(|l| l.starts_with("# HELP "))
        .count();
    assert_eq!(helps, types.len());
}

#[test]
fn ha_2_7_labels_keep_the_addresses_as_written() {
    let (result, samples) = collected(fixture!("ha-2.7.status"));
    assert_eq!(result, Ok(()));
    let received: Vec<String> = lines(samples)
        .into_iter()
        .filter(|l| l.starts_with("openvpn_server_client_received_bytes_total"))
        .collect();
    assert_eq!(received.len(), 3);
    assert!(received[0].contains("common_name=\"vpn-seed-client\""));
    assert!(received[0].contains("real_address=\"tcp4-server:10.1.22.9:49111\""));
    assert!(received[1].contains("real_address=\"tcp6-server:[2001:db8:77::31]:38001\""));
    assert!(received[2].contains("real_address=\"[2001:db8:77::32]:38002\""));
    assert!(received[2].ends_with(" 97001"), "{}", received[2]);
}

#[test]
fn clients_in_the_handshake_are_series_too() {
    let (result, samples) = collected(fixture!("nonha-2.6-handshake-only.status"));
    assert_eq!(result, Ok(()));
    let lines = lines(samples);
    assert!(lines.contains(
        &"openvpn_server_connected_clients{status_path=\"/srv/status/openvpn.status\"} 2".into()
    ));
    let undef = "openvpn_server_client_sent_bytes_total{common_name=\"UNDEF\",\
                 connection_time=\"1773480598\",real_address=\"10.180.3.41:40010\",\
                 status_path=\"/srv/status/openvpn.status\",username=\"UNDEF\",\
                 virtual_address=\"\"} 0";
    assert!(lines.contains(&undef.to_owned()), "{lines:#?}");
}

#[test]
fn empty_server_and_our_own_writer() {
    let (result, samples) = collected(fixture!("empty.status"));
    assert_eq!(result, Ok(()));
    assert_eq!(
        lines(samples),
        [
            "openvpn_server_connected_clients{status_path=\"/srv/status/openvpn.status\"} 0",
            "openvpn_status_update_time_seconds{status_path=\"/srv/status/openvpn.status\"} \
             1.773478815e+09",
        ]
    );
    // What our server writes passes kumina's rules, IPv4 and IPv6 peers alike.
    for real in ["100.64.0.7:41000", "[fd00::7]:41000"] {
        let real: std::net::SocketAddr = real.parse().unwrap();
        let snapshot = status::StatusSnapshot {
            title: status::default_title(),
            now: 1_800_000_000,
            clients: vec![status::ClientStatus {
                common_name: "vpn-shoot-client".into(),
                real_address: real,
                virtual_v4: Some("192.168.123.6".parse().unwrap()),
                virtual_v6: None,
                bytes_received: 5,
                bytes_sent: 6,
                connected_since: 1_799_999_000,
                username: None,
                client_id: 0,
                peer_id: 0,
                cipher: "AES-256-GCM".into(),
            }],
            routes: vec![status::RouteStatus {
                prefix: "100.96.0.0/11".parse().unwrap(),
                common_name: "vpn-shoot-client".into(),
                real_address: real,
                last_ref: 1_799_999_999,
            }],
            mac_routes: Vec::new(),
            shoot_routes: Vec::new(),
            max_bcast_queue: 0,
        };
        let (result, samples) = collected(status::render(&snapshot).as_bytes());
        assert_eq!(result, Ok(()));
        let lines = lines(samples);
        assert_eq!(lines.len(), 5, "{lines:#?}");
        let want = format!("real_address=\"{}\"", status::real_address(real));
        assert!(lines[0].contains(&want), "{}", lines[0]);
        assert!(lines[0].contains("virtual_address=\"192.168.123.6\""));
    }
}

/// Files vpn2's own reader takes but kumina's refuses: `openvpn_up` 0.
#[test]
fn kumina_strictness_gives_up_0() {
    let good = String::from_utf8(fixture!("nonha-2.6-shoot.status").to_vec()).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (format!("\n{good}"), "NotServerStatus"),
        (good.replacen("TITLE,", "TITLE ", 1), "NotServerStatus"),
        (good.replacen("[AEAD]", "[AEAD],x", 1), "Unsupported"),
        (good.replacen(",1773480413\n", "\n", 1), "Unsupported"),
        (
            good.replacen(",1773480413\n", ",1773480413,x\n", 1),
            "Unsupported",
        ),
        (good.replacen("END", "\nEND", 1), "Unsupported"),
        (good.replacen("END", "END,", 1), "Unsupported"),
        (
            good.replacen("GLOBAL_STATS,Max", "STATS,Max", 1),
            "Unsupported",
        ),
        (
            good.replacen("HEADER,CLIENT_LIST,", "HEADER,CLIENT_LISTS,", 1),
            "NoHeader",
        ),
        (
            good.replacen(",AES-256-GCM", ",AES-256-GCM,extra", 1),
            "ColumnCount",
        ),
        (good.replacen(",48213377,", ",48e,", 1), "Number"),
        (good.replacen(",1773480413\n", ",soon\n", 1), "Number"),
    ];
    for (text, variant) in cases {
        let (result, _) = collected(text.as_bytes());
        let e = result.expect_err(variant);
        assert!(format!("{e:?}").starts_with(variant), "{variant}: {e:?}");
    }
    // vpn2's reader takes a TITLE with commas, a two-field TIME, empty lines and extra
    // columns; kumina's does not.
    for text in [
        good.replacen("[AEAD]", "[AEAD],x", 1),
        good.replacen(",1773480413\n", "\n", 1),
        good.replacen("END", "\nEND", 1),
        good.replacen(",AES-256-GCM", ",AES-256-GCM,extra", 1),
    ] {
        assert!(read::parse(text.as_bytes()).is_ok());
        assert!(collected(text.as_bytes()).0.is_err());
    }
}

#[test]
fn samples_before_a_refused_line_stay_and_the_count_needs_the_end() {
    let text = "TITLE,x\nTIME,2026-01-01 00:00:00,1767225600\n\
                HEADER,CLIENT_LIST,Common Name,Bytes Received\n\
                CLIENT_LIST,a,1\nCLIENT_LIST,b,x\nCLIENT_LIST,c,3\n";
    let (result, samples) = collected(text.as_bytes());
    assert_eq!(
        result,
        Err(kumina::StrictError::Number {
            line: 5,
            column: "Bytes Received".into(),
            value: "x".into()
        })
    );
    let lines = lines(samples);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].starts_with("openvpn_server_client_received_bytes_total{common_name=\"a\","));
    assert!(lines[1].starts_with("openvpn_status_update_time_seconds"));
}

#[test]
fn columns_come_from_the_header() {
    // A header without Username / Bytes Sent: empty label, no sent series. Tabs (version 3).
    let text = "TITLE\tx\nHEADER\tCLIENT_LIST\tBytes Received\tCommon Name\tCommon Name\n\
                CLIENT_LIST\t7\tfirst\tsecond\nEND\n";
    let (result, samples) = collected(text.as_bytes());
    assert_eq!(result, Ok(()));
    assert_eq!(
        lines(samples),
        [
            "openvpn_server_client_received_bytes_total{common_name=\"second\",\
             connection_time=\"\",real_address=\"\",status_path=\"/srv/status/openvpn.status\",\
             username=\"\",virtual_address=\"\"} 7",
            "openvpn_server_connected_clients{status_path=\"/srv/status/openvpn.status\"} 1",
        ]
    );
}

#[test]
fn rows_whose_label_values_were_all_seen_are_skipped() {
    let text = "TITLE,x\nHEADER,ROUTING_TABLE,Virtual Address,Common Name,Real Address,Last Ref (time_t)\n\
                ROUTING_TABLE,v1,a,r1,1\n\
                ROUTING_TABLE,v2,b,r2,2\n\
                ROUTING_TABLE,v1,a,r1,3\n\
                ROUTING_TABLE,v2,a,r1,4\n\
                ROUTING_TABLE,v3,a,r1,5\n";
    let (result, samples) = collected(text.as_bytes());
    assert_eq!(result, Ok(()));
    let values: Vec<String> = lines(samples)
        .into_iter()
        .filter(|l| l.starts_with("openvpn_server_route"))
        .map(|l| l.rsplit(' ').next().unwrap().to_owned())
        .collect();
    // Rows 3 and 4 only repeat values seen (in any rows): kumina skips them. (Sorted by
    // labels: v1 and v3 belong to `a`.)
    assert_eq!(values, ["1", "5", "2"]);
}

#[test]
fn a_too_long_line_ends_the_reading_with_the_count() {
    let text = format!(
        "TITLE,x\nHEADER,CLIENT_LIST,Common Name\nCLIENT_LIST,a\nGLOBAL_STATS,{}\nCLIENT_LIST,b\n",
        "x".repeat(70_000)
    );
    let (result, samples) = collected(text.as_bytes());
    assert!(matches!(
        result,
        Err(kumina::StrictError::TooLong { line: 4, .. })
    ));
    assert_eq!(
        lines(samples),
        ["openvpn_server_connected_clients{status_path=\"/srv/status/openvpn.status\"} 1"]
    );
}

#[test]
fn exporter_reads_its_files_at_each_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("openvpn.status");
    let snmp = dir.path().join("snmp");
    std::fs::write(&snmp, SNMP).unwrap();
    let exporter = Exporter::new(ExporterConfig {
        status_paths: vec![status.display().to_string()],
        snmp_path: snmp.clone(),
        listen: Vec::new(),
    });
    let scrape = || {
        let mut out = Exposition::new();
        exporter.metrics(&mut out);
        out.into_string()
    };
    // Not written yet: up 0, nothing else from the file.
    let up = format!("openvpn_up{{status_path=\"{}\"}}", status.display());
    let text = scrape();
    assert!(text.contains(&format!("{up} 0\n")), "{text}");
    assert!(!text.contains("openvpn_server_connected_clients"));
    assert!(text.contains("openvpn_netstat_Tcp_RetransSegs 2231\n"));
    std::fs::write(&status, fixture!("ha-2.6.status")).unwrap();
    let text = scrape();
    assert!(text.contains(&format!("{up} 1\n")), "{text}");
    assert!(text.contains("openvpn_server_connected_clients{"));
    // Malformed now: up 0 again.
    std::fs::write(&status, "TITLE,x\nBOGUS\n").unwrap();
    assert!(scrape().contains(&format!("{up} 0\n")));
    // Over the bound (a good file, then empty lines): up 0, not read.
    let mut big = fixture!("ha-2.6.status").to_vec();
    big.resize(usize::try_from(MAX_STATUS_BYTES).unwrap() + 1, b'\n');
    std::fs::write(&status, &big).unwrap();
    let text = scrape();
    assert!(text.contains(&format!("{up} 0\n")), "{text}");
    assert!(!text.contains("openvpn_server_connected_clients"), "{text}");
    // A malformed snmp file: no netstat series, the rest unchanged.
    std::fs::write(&snmp, "Tcp: A B\nTcp: 1\n").unwrap();
    let text = scrape();
    assert!(!text.contains("openvpn_netstat"), "{text}");
    assert!(text.contains(&format!("{up} 0\n")));
}

#[test]
fn config_from_the_vpn2_environment() {
    let args = ExporterArgs {
        listen: vec!["127.0.0.1:1".parse().unwrap()],
    };
    let config = ExporterConfig::from_vpn2_env(
        [(
            "OPENVPN_STATUS_PATH",
            "/a/openvpn.status,/b/s,/a/openvpn.status",
        )],
        &args,
    )
    .unwrap();
    assert_eq!(config.status_paths, ["/a/openvpn.status", "/b/s"]);
    assert_eq!(config.snmp_path, PathBuf::from("/proc/net/snmp"));
    assert_eq!(config.listen, args.listen);
    let e = ExporterConfig::from_vpn2_env(Vec::<(String, String)>::new(), &args).unwrap_err();
    assert_eq!(e.to_string(), "OPENVPN_STATUS_PATH is not set");
}

#[test]
fn snmp_pairs() {
    let counters = netstat::parse(SNMP).unwrap();
    assert_eq!(counters.len(), 3 + 15 + 2);
    assert!(counters.contains(&netstat::Counter {
        protocol: "Tcp".into(),
        field: "MaxConn".into(),
        value: "-1".into()
    }));
    use netstat::SnmpError;
    assert_eq!(
        netstat::parse("Tcp: A\n"),
        Err(SnmpError::MissingValues {
            protocol: "Tcp:".into()
        })
    );
    assert_eq!(
        netstat::parse("Tcp: A\nUdp: 1\n"),
        Err(SnmpError::Mismatch {
            header: "Tcp:".into(),
            values: "Udp:".into()
        })
    );
    assert_eq!(
        netstat::parse("Tcp: A B\nTcp: 1\n"),
        Err(SnmpError::FieldCount {
            protocol: "Tcp".into(),
            header: 3,
            values: 2
        })
    );
    assert!(matches!(
        netstat::parse("\n\n"),
        Err(SnmpError::NoProtocol { .. })
    ));
    // A value that is not a number is left out; the other stays.
    let mut out = Vec::new();
    netstat::collect("Tcp: OutSegs RetransSegs\nTcp: 10 x\n", &mut out);
    assert_eq!(lines(out), ["openvpn_netstat_Tcp_OutSegs 10"]);
}

/// The names Gardener's `openvpn-server-exporter` scrape job keeps.
#[test]
fn gardener_keeps_these_names() {
    let kept = [
        "openvpn_server_client_received_bytes_total",
        "openvpn_server_client_sent_bytes_total",
        "openvpn_server_route_last_reference_time_seconds",
        "openvpn_status_update_time_seconds",
        "openvpn_up",
        "openvpn_netstat_Tcp_OutSegs",
        "openvpn_netstat_Tcp_RetransSegs",
    ];
    let (_, mut samples) = collected(fixture!("ha-2.6.status"));
    samples.push(Sample::new(
        Family::Up,
        vec![("status_path", PATH.into())],
        1.0,
    ));
    netstat::collect(SNMP, &mut samples);
    let lines = lines(samples);
    for name in kept {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "{name}"
        );
    }
}

#[test]
fn numbers_as_go_writes_them() {
    let cases = [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (-1.0, "-1"),
        (13.0, "13"),
        (123_456.0, "123456"),
        (1_234_567.0, "1.234567e+06"),
        (1_000_000.0, "1e+06"),
        (1_795_320_809.0, "1.795320809e+09"),
        (u64::MAX as f64, "1.8446744073709552e+19"),
        (1e21, "1e+21"),
        (1e100, "1e+100"),
        (0.5, "0.5"),
        (-2.25, "-2.25"),
        (0.0001, "0.0001"),
        (0.001234, "0.001234"),
        (0.00001, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (123.456, "123.456"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
    ];
    for (v, want) in cases {
        assert_eq!(GoFloat(v).to_string(), want, "{v}");
    }
}

#[test]
fn numbers_as_go_reads_them() {
    assert_eq!(parse_go_float("1773480413"), Some(1_773_480_413.0));
    assert_eq!(parse_go_float("-1"), Some(-1.0));
    assert_eq!(parse_go_float("+1.5e3"), Some(1500.0));
    assert_eq!(parse_go_float(".5"), Some(0.5));
    assert_eq!(parse_go_float("Inf"), Some(f64::INFINITY));
    assert_eq!(parse_go_float("-infinity"), Some(f64::NEG_INFINITY));
    assert!(parse_go_float("NaN").is_some_and(f64::is_nan));
    for bad in [
        "", " 1", "1 ", "1e", "x", "+nan", "1e400", "-1e400", "1,5", "0x10",
    ] {
        assert_eq!(parse_go_float(bad), None, "{bad:?}");
    }
}
