use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use regex::Regex;
use time::OffsetDateTime;
use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;

use super::{layer, parse, Format};

/// The parsers Gardener registers for the VPN containers' logs (fluent-bit's `Regex`, with
/// the named groups fluent-bit reads: `time`, then the rest as `log`).
const VPN_SEED_SERVER_PARSER: &str = r"^(?<time>\d{4}-\d{2}-\d{2}\s+[^\s]+)\s+(?<log>.*)$";
const VPN_SHOOT_PARSER: &str = r"^(?<time>[^0-9]*\d{1,2}\s+[^\s]+\s+\d{4})\s+(?<log>.*)";
const ENVOY_PROXY_PARSER: &str =
    r"^\[(?<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+\S+?)]\s+(?<log>.*)$";

/// A writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8(buf.clone()).unwrap()
    }
}

impl io::Write for Captured {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for Captured {
    type Writer = Captured;
    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

/// Logs one line inside a span in `format` and returns what was written, with the UTC time
/// just before and just after.
fn one_line(format: Format, ansi: bool) -> (String, OffsetDateTime, OffsetDateTime) {
    let out = Captured::default();
    let subscriber = tracing_subscriber::registry().with(layer(format, ansi, out.clone()));
    let before = OffsetDateTime::now_utc();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!(
            "client",
            peer = "198.51.100.2:40000",
            cn = "vpn-shoot-client"
        );
        let _entered = span.enter();
        tracing::warn!(routes = 3, "peer connected");
    });
    let after = OffsetDateTime::now_utc();
    let text = out.text();
    assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
    (text.trim_end_matches('\n').to_owned(), before, after)
}

/// The named groups `time` and `log` of `parser` on `line`; fails if it does not match.
fn parsed(parser: &str, line: &str) -> (String, String) {
    let re = Regex::new(parser).unwrap();
    let caps = re
        .captures(line)
        .unwrap_or_else(|| panic!("{parser} does not match {line:?}"));
    (caps["time"].to_owned(), caps["log"].to_owned())
}

const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `t` rendered by hand in the layout of strptime's `%Y-%m-%d %H:%M:%S`.
fn strptime_ymd_hms(t: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Whether `time` is `t0` or `t1` (the second may turn while logging) rendered by `render`.
fn is_one_of(
    time: &str,
    t0: OffsetDateTime,
    t1: OffsetDateTime,
    render: fn(OffsetDateTime) -> String,
) {
    let (a, b) = (render(t0), render(t1));
    assert!(
        time == a || time == b,
        "time {time:?}, expected {a:?} or {b:?}"
    );
}

#[test]
fn openvpn_lines_parse_with_the_vpn_seed_server_parser() {
    let (line, t0, t1) = one_line(Format::Openvpn, false);
    let (time, log) = parsed(VPN_SEED_SERVER_PARSER, &line);
    is_one_of(&time, t0, t1, strptime_ymd_hms);
    assert!(log.starts_with("WARN client{"), "{log:?}");
    assert!(log.contains("cn=\"vpn-shoot-client\""), "{log:?}");
    assert!(log.ends_with("peer connected routes=3"), "{log:?}");
}

#[test]
fn ctime_lines_parse_with_the_vpn_shoot_parser() {
    let (line, t0, t1) = one_line(Format::Ctime, false);
    let (time, log) = parsed(VPN_SHOOT_PARSER, &line);
    // strptime's `%a %b%t%d %H:%M:%S %Y`: `%t` is any white space, the day is space-padded.
    is_one_of(&time, t0, t1, |t| {
        format!(
            "{} {} {:>2} {:02}:{:02}:{:02} {}",
            WEEKDAYS[usize::from(t.weekday().number_days_from_monday())],
            MONTHS[usize::from(u8::from(t.month())) - 1],
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.year()
        )
    });
    assert!(log.starts_with("WARN client{"), "{log:?}");
}

#[test]
fn envoy_lines_parse_with_the_envoy_proxy_parser() {
    let (line, t0, t1) = one_line(Format::Envoy, false);
    let (time, log) = parsed(ENVOY_PROXY_PARSER, &line);
    // `%Y-%m-%dT%H:%M:%S.%L%z`: milliseconds, then the zone as `Z`.
    let (secs, frac) = time.split_once('.').unwrap();
    is_one_of(&secs.replace('T', " "), t0, t1, strptime_ymd_hms);
    assert_eq!(frac.len(), 4, "{frac:?}");
    assert!(frac.ends_with('Z') && frac[..3].bytes().all(|b| b.is_ascii_digit()));
    assert!(log.starts_with("WARN client{"), "{log:?}");
}

#[test]
fn json_lines_are_one_object_with_the_span_and_fields() {
    let (line, _, _) = one_line(Format::Json, false);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["fields"]["message"], "peer connected");
    assert_eq!(v["fields"]["routes"], 3);
    assert_eq!(v["span"]["cn"], "vpn-shoot-client");
    assert_eq!(v["spans"][0]["peer"], "198.51.100.2:40000");
    let ts = v["timestamp"].as_str().unwrap();
    assert!(OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).is_ok());
}

#[test]
fn no_escape_codes_without_ansi_and_some_with() {
    for format in Format::ALL {
        let (line, _, _) = one_line(format, false);
        assert!(!line.contains('\u{1b}'), "{format}: {line:?}");
    }
    let (line, _, _) = one_line(Format::Full, true);
    assert!(line.contains('\u{1b}'), "{line:?}");
}

#[test]
fn formats_round_trip_through_their_names() {
    for format in Format::ALL {
        assert_eq!(format.name().parse::<Format>(), Ok(format));
    }
    let err = "OpenVPN".parse::<Format>().unwrap_err();
    assert!(err.to_string().contains("one of: openvpn"), "{err}");
}

#[test]
fn the_filters_users_write_still_parse() {
    let t = parse("info").unwrap();
    assert!(t.would_enable("vpn_server::server", &Level::INFO));
    assert!(!t.would_enable("vpn_server::server", &Level::DEBUG));
    assert!(t.would_enable("netio", &Level::WARN));

    let t = parse("info,vpn_server=debug").unwrap();
    assert!(t.would_enable("vpn_server::server", &Level::DEBUG));
    assert!(!t.would_enable("vpn_server::server", &Level::TRACE));
    assert!(!t.would_enable("netio", &Level::DEBUG));
    assert!(t.would_enable("netio", &Level::INFO));

    // Only a target: nothing else is logged.
    let t = parse("vpn_server=trace").unwrap();
    assert!(t.would_enable("vpn_server::router", &Level::TRACE));
    assert!(!t.would_enable("netio", &Level::ERROR));
}

#[test]
fn a_malformed_filter_is_refused() {
    assert!(parse("info,vpn_server=loud").is_err());
    assert!(parse("vpn_server[conn{peer=1}]=debug").is_err());
}
