//! Envoy's access log as the sidecar writes it in Envoy mode: the line the bootstrap file's
//! `text_format_source` describes, on stdout, for the requests its filter selects.
//!
//! Gardener's file asks for
//!
//! ```text
//! [%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE%
//! %RESPONSE_FLAGS% %BYTES_RECEIVED% rx %BYTES_SENT% tx %DURATION%ms "%DOWNSTREAM_REMOTE_ADDRESS%"
//! "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"
//! ```
//!
//! (one line) for requests with status ≥ 500 or lasting at least 1000 ms, e.g.
//! `[2026-11-25T16:22:19.123Z] "CONNECT - HTTP/1.1" 503 UF 0 rx 0 tx 3ms "10.1.0.7:51234"
//! "4c8f…" "10.250.0.5:10250" "10.250.0.5:10250"`. Gardener's fluent-bit parser
//! (`envoy-proxy-parser`) takes the bracketed time as the record's time.
//!
//! The operators understood are the ones above plus `%REQ(name)%` for any request header;
//! a format with another operator is refused when the file is read. Absent values are Envoy's
//! `-`. For a CONNECT, `:PATH` is absent, `:AUTHORITY` is the request target, the bytes are
//! those relayed after the head (received from the client, sent to it), and the duration runs
//! from the accepted connection to the end of the tunnel, and the upstream host is the
//! address dialed (for a failed connect, the last one tried). A request without an
//! `X-Request-Id` gets a random one, as Envoy's connection manager adds it.
//!
//! Response flags (Envoy's short names): `UF` the upstream connect failed or timed out, `UO`
//! the connection limit or the DNS cache was full, `UH` no VPN client routes the destination
//! (in-process), `DF` the name did not resolve, `SI` the idle timeout ended the tunnel, `-`
//! otherwise (also for a refusal by the destination policy, which Envoy does not have).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// One stdout access logger of the bootstrap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// Which requests are written (none: all).
    pub filter: Option<LogFilter>,
    /// The line.
    pub format: LogFormat,
}

/// Envoy's access-log filters that Gardener uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFilter {
    /// `status_code_filter`.
    Status(Comparison),
    /// `duration_filter` (milliseconds).
    Duration(Comparison),
    /// `or_filter`.
    Or(Vec<LogFilter>),
    /// `and_filter`.
    And(Vec<LogFilter>),
}

/// `comparison: {op, value: {default_value}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comparison {
    /// The operator.
    pub op: Op,
    /// The value compared against.
    pub value: u64,
}

/// Envoy's comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `EQ`.
    Eq,
    /// `GE`.
    Ge,
    /// `LE`.
    Le,
}

impl Comparison {
    fn holds(self, x: u64) -> bool {
        match self.op {
            Op::Eq => x == self.value,
            Op::Ge => x >= self.value,
            Op::Le => x <= self.value,
        }
    }
}

impl LogFilter {
    /// Whether a request with `status` that took `duration` is logged.
    pub fn matches(&self, status: u16, duration: Duration) -> bool {
        match self {
            LogFilter::Status(c) => c.holds(u64::from(status)),
            LogFilter::Duration(c) => c.holds(millis(duration)),
            LogFilter::Or(fs) => fs.iter().any(|f| f.matches(status, duration)),
            LogFilter::And(fs) => fs.iter().all(|f| f.matches(status, duration)),
        }
    }
}

/// A parsed `text_format_source`: literal text and command operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    StartTime,
    Method,
    /// `REQ(X-ENVOY-ORIGINAL-PATH?:PATH)` or `REQ(:PATH)`: a CONNECT has no path.
    Path,
    Protocol,
    ResponseCode,
    ResponseFlags,
    BytesReceived,
    BytesSent,
    Duration,
    DownstreamRemoteAddress,
    RequestId,
    Authority,
    /// `REQ(name)` of another header (lower-case name).
    Header(String),
    UpstreamHost,
}

/// An operator of the format this sidecar does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported access-log operator %{0}%")]
pub struct FormatError(pub String);

impl LogFormat {
    /// Parses Envoy's format string (`%%` is a literal `%`; a `%` without its closing `%` is
    /// literal text, as Envoy treats it).
    pub fn parse(format: &str) -> Result<LogFormat, FormatError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = format;
        while let Some(start) = rest.find('%') {
            text.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            if let Some(tail) = after.strip_prefix('%') {
                text.push('%');
                rest = tail;
                continue;
            }
            let Some(end) = after.find('%') else {
                text.push('%');
                rest = after;
                continue;
            };
            let op = &after[..end];
            let piece = operator(op).ok_or_else(|| FormatError(op.to_owned()))?;
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(piece);
            rest = &after[end + 1..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(LogFormat { pieces })
    }

    /// The line for `entry` (with the format's own trailing newline, if any).
    pub fn render(&self, entry: &Entry<'_>) -> String {
        let mut out = String::with_capacity(192);
        let dash = |out: &mut String, v: Option<&str>| match v {
            Some(v) if !v.is_empty() => out.push_str(v),
            _ => out.push('-'),
        };
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::StartTime => out.push_str(&rfc3339_millis(entry.start)),
                Piece::Method => dash(&mut out, entry.method),
                Piece::Path => out.push('-'),
                Piece::Protocol => dash(&mut out, entry.protocol),
                Piece::ResponseCode => {
                    let _ = write!(out, "{}", entry.status);
                }
                Piece::ResponseFlags => out.push_str(entry.flags),
                Piece::BytesReceived => {
                    let _ = write!(out, "{}", entry.bytes_received);
                }
                Piece::BytesSent => {
                    let _ = write!(out, "{}", entry.bytes_sent);
                }
                Piece::Duration => {
                    let _ = write!(out, "{}", millis(entry.duration));
                }
                Piece::DownstreamRemoteAddress => {
                    let _ = write!(out, "{}", entry.downstream);
                }
                Piece::RequestId => dash(&mut out, entry.request_id),
                Piece::Authority => dash(&mut out, entry.authority),
                Piece::Header(name) => dash(&mut out, (entry.header)(name)),
                Piece::UpstreamHost => match entry.upstream {
                    Some(a) => {
                        let _ = write!(out, "{a}");
                    }
                    None => out.push('-'),
                },
            }
        }
        out
    }
}

fn operator(op: &str) -> Option<Piece> {
    Some(match op {
        "START_TIME" => Piece::StartTime,
        "PROTOCOL" => Piece::Protocol,
        "RESPONSE_CODE" => Piece::ResponseCode,
        "RESPONSE_FLAGS" => Piece::ResponseFlags,
        "BYTES_RECEIVED" => Piece::BytesReceived,
        "BYTES_SENT" => Piece::BytesSent,
        "DURATION" => Piece::Duration,
        "DOWNSTREAM_REMOTE_ADDRESS" => Piece::DownstreamRemoteAddress,
        "UPSTREAM_HOST" => Piece::UpstreamHost,
        _ => {
            let header = op.strip_prefix("REQ(")?.strip_suffix(')')?;
            match header.to_ascii_lowercase().as_str() {
                ":method" => Piece::Method,
                ":path" | "x-envoy-original-path?:path" => Piece::Path,
                ":authority" | "host" => Piece::Authority,
                "x-request-id" => Piece::RequestId,
                h if !h.is_empty()
                    && h.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
                {
                    Piece::Header(h.to_owned())
                }
                _ => return None,
            }
        }
    })
}

/// What one request came to, as the access log sees it.
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    /// When the connection was accepted.
    pub start: SystemTime,
    /// The request method (`None` before a request line was read).
    pub method: Option<&'a str>,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub protocol: Option<&'a str>,
    /// The status answered.
    pub status: u16,
    /// Envoy's response flags, `-` for none.
    pub flags: &'a str,
    /// Bytes from the client after the head.
    pub bytes_received: u64,
    /// Bytes to the client after the head.
    pub bytes_sent: u64,
    /// From the accepted connection to the end.
    pub duration: Duration,
    /// The client.
    pub downstream: SocketAddr,
    /// `X-Request-Id`, given or generated.
    pub request_id: Option<&'a str>,
    /// The request target.
    pub authority: Option<&'a str>,
    /// The address dialed.
    pub upstream: Option<SocketAddr>,
    /// Another request header by lower-case name.
    pub header: &'a dyn Fn(&str) -> Option<&'a str>,
}

impl std::fmt::Debug for Entry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("start", &self.start)
            .field("status", &self.status)
            .field("flags", &self.flags)
            .field("duration", &self.duration)
            .field("downstream", &self.downstream)
            .field("authority", &self.authority)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// Writes `entry` to stdout with every logger whose filter selects it; each line in one
/// write.
pub fn write(logs: &[AccessLog], entry: &Entry<'_>) {
    for log in logs {
        let selected = log
            .filter
            .as_ref()
            .is_none_or(|f| f.matches(entry.status, entry.duration));
        if selected {
            let line = log.format.render(entry);
            let _ = std::io::stdout().lock().write_all(line.as_bytes());
        }
    }
}

/// A random `X-Request-Id` in the form Envoy generates (a version-4 UUID).
pub fn request_id() -> String {
    let mut b = [0u8; 16];
    if openssl::rand::rand_bytes(&mut b).is_err() {
        return "-".into();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{byte:02x}");
    }
    s
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `2026-11-25T16:22:19.123Z`: Envoy's default `START_TIME`, UTC with milliseconds.
pub fn rfc3339_millis(t: SystemTime) -> String {
    netio::logging::envoy_start_time(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    /// Gardener's `inline_string`, as the YAML reader hands it over.
    const GARDENER_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% \
        %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% \
        %BYTES_RECEIVED% rx %BYTES_SENT% tx %DURATION%ms \"%DOWNSTREAM_REMOTE_ADDRESS%\" \
        \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

    #[test]
    fn dates() {
        let at = |secs: u64, ms: u64| {
            rfc3339_millis(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        // `date -u -d @1795623739` = Wed Nov 25 16:22:19 UTC 2026.
        assert_eq!(at(1_795_623_739, 123), "2026-11-25T16:22:19.123Z");
        // 2000-02-29 (a leap day of a year divisible by 400): `date -u -d @951782400`.
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        // 2100-03-01, after the leap day 2100 does not have: `date -u -d @4107542400`.
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn gardeners_line() {
        let format = LogFormat::parse(GARDENER_FORMAT).unwrap();
        let header = |_: &str| None;
        let entry = Entry {
            start: UNIX_EPOCH + Duration::from_millis(1_795_623_739_123),
            method: Some("CONNECT"),
            protocol: Some("HTTP/1.1"),
            status: 503,
            flags: "UF",
            bytes_received: 0,
            bytes_sent: 0,
            duration: Duration::from_micros(3_900),
            downstream: "10.1.0.7:51234".parse().unwrap(),
            request_id: Some("4c8f0e2a-1b7d-4e3a-9c61-2f5d8b7a9e10"),
            authority: Some("10.250.0.5:10250"),
            upstream: Some("10.250.0.5:10250".parse().unwrap()),
            header: &header,
        };
        assert_eq!(
            format.render(&entry),
            "[2026-11-25T16:22:19.123Z] \"CONNECT - HTTP/1.1\" 503 UF 0 rx 0 tx 3ms \
             \"10.1.0.7:51234\" \"4c8f0e2a-1b7d-4e3a-9c61-2f5d8b7a9e10\" \"10.250.0.5:10250\" \
             \"10.250.0.5:10250\"\n"
        );
        let before_head = Entry {
            method: None,
            protocol: None,
            status: 408,
            flags: "-",
            request_id: None,
            authority: None,
            upstream: None,
            downstream: "[fd00::7]:4000".parse().unwrap(),
            ..entry
        };
        assert_eq!(
            format.render(&before_head),
            "[2026-11-25T16:22:19.123Z] \"- - -\" 408 - 0 rx 0 tx 3ms \"[fd00::7]:4000\" \
             \"-\" \"-\" \"-\"\n"
        );
    }

    #[test]
    fn gardeners_fluent_bit_parser_takes_the_line() {
        // `envoy-proxy-parser` of Gardener's seed logging (time format `%Y-%m-%dT%H:%M:%S.%L%z`).
        let parser = regex::Regex::new(
            r"^\[(?<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+\S+?)]\s+(?<log>.*)$",
        )
        .unwrap();
        let format = LogFormat::parse(GARDENER_FORMAT).unwrap();
        let header = |_: &str| None;
        let entry = Entry {
            start: UNIX_EPOCH + Duration::from_millis(1_795_623_739_007),
            method: Some("CONNECT"),
            protocol: Some("HTTP/1.0"),
            status: 200,
            flags: "-",
            bytes_received: 512,
            bytes_sent: 70_000,
            duration: Duration::from_millis(61_000),
            downstream: "[fd00::5]:40000".parse().unwrap(),
            request_id: Some("x"),
            authority: Some("webhook.example.com:443"),
            upstream: Some("[2001:db8::7]:443".parse().unwrap()),
            header: &header,
        };
        let line = format.render(&entry);
        let line = line.strip_suffix('\n').unwrap();
        let fields = parser.captures(line).unwrap();
        assert_eq!(&fields["time"], "2026-11-25T16:22:19.007Z");
        assert_eq!(
            &fields["log"],
            "\"CONNECT - HTTP/1.0\" 200 - 512 rx 70000 tx 61000ms \"[fd00::5]:40000\" \"x\" \
             \"webhook.example.com:443\" \"[2001:db8::7]:443\""
        );
    }

    #[test]
    fn operators_and_literals() {
        let f = LogFormat::parse("100%% %REQ(User-Agent)% %RESPONSE_CODE% 5%").unwrap();
        let header = |name: &str| (name == "user-agent").then_some("kube-apiserver");
        let entry = Entry {
            start: UNIX_EPOCH,
            method: None,
            protocol: None,
            status: 200,
            flags: "-",
            bytes_received: 0,
            bytes_sent: 0,
            duration: Duration::ZERO,
            downstream: "127.0.0.1:1".parse().unwrap(),
            request_id: None,
            authority: None,
            upstream: None,
            header: &header,
        };
        assert_eq!(f.render(&entry), "100% kube-apiserver 200 5%");
        assert_eq!(
            LogFormat::parse("%UPSTREAM_CLUSTER%").unwrap_err(),
            FormatError("UPSTREAM_CLUSTER".into())
        );
        assert!(LogFormat::parse("%START_TIME(%s)%").is_err());
        assert!(LogFormat::parse("%x %").is_err());
        assert!(LogFormat::parse("%REQ(A?B):10%").is_err());
    }

    #[test]
    fn gardeners_filter() {
        let f = LogFilter::Or(vec![
            LogFilter::Status(Comparison {
                op: Op::Ge,
                value: 500,
            }),
            LogFilter::Duration(Comparison {
                op: Op::Ge,
                value: 1000,
            }),
        ]);
        let ms = Duration::from_millis;
        assert!(!f.matches(200, ms(999)));
        assert!(!f.matches(403, ms(10)));
        assert!(f.matches(200, ms(1000)));
        assert!(f.matches(503, ms(1)));
        assert!(f.matches(504, ms(20_000)));
    }

    #[test]
    fn request_ids_are_uuid_v4() {
        let id = request_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, request_id());
    }
}
