//! Log set-up shared by every binary (`vpn-server`, `vpn-client`, `vpn-router`).
//!
//! **Filter.** A comma-separated list of `LEVEL` and `target=LEVEL` directives, e.g. `info` or
//! `info,vpn_server=debug`, parsed by tracing's [`Targets`]. Unlike `EnvFilter` it needs no
//! regex engine, which keeps about 0.3 MB of program text (and its resident pages) out of the
//! binary; span and field directives (`target[span]=level`) are not supported and are refused.
//!
//! **Format.** Where a log line goes in a Gardener landscape, fluent-bit parses it with the
//! parser registered for the container, and a line it cannot parse loses its time. Each
//! [`Format`] but [`Format::Full`] and [`Format::Json`] writes the time the way one of those
//! parsers reads it:
//!
//! | format | line | Gardener parser |
//! |---|---|---|
//! | `openvpn` | `2026-11-25 16:22:19  INFO target: message k=v` | `vpn-seed-server-parser` |
//! | `ctime` | `Wed Nov 25 16:22:19 2026  INFO target: message` | `vpn-shoot-parser` |
//! | `envoy` | `[2026-11-25T16:22:19.123Z]  INFO target: message` | `envoy-proxy-parser` |
//! | `json` | `{"timestamp":"2026-11-25T16:22:19.123456Z","level":"INFO",...}` | (any JSON parser) |
//! | `full` | tracing's own layout, colours on a terminal | (for people) |
//!
//! Times are UTC, as OpenVPN's are in Gardener's images. ANSI colours only ever appear in
//! `full` and only when stderr is a terminal; [`Format::default_for`] picks `full` for a
//! terminal and the container's format otherwise.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use time::format_description::well_known::Rfc3339;
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::OffsetDateTime;
use tracing::Subscriber;
use tracing_subscriber::filter::{ParseError, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, UtcTime};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer;

/// How each log line looks; see the module docs for the lines and the parsers that read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// tracing's own layout (RFC 3339 time), with colours on a terminal.
    Full,
    /// OpenVPN's `YYYY-MM-DD HH:MM:SS` time first (Gardener's `vpn-seed-server-parser`).
    Openvpn,
    /// C's `ctime` time first, `Wed Nov 25 16:22:19 2026` (Gardener's `vpn-shoot-parser`).
    Ctime,
    /// Envoy's access-log time in brackets first, `[2026-11-25T16:22:19.123Z]` (Gardener's
    /// `envoy-proxy-parser`).
    Envoy,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields`, the current `span`
    /// and the list of `spans`.
    Json,
}

impl Format {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [Format; 5] = [
        Format::Openvpn,
        Format::Ctime,
        Format::Envoy,
        Format::Json,
        Format::Full,
    ];

    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Full => "full",
            Format::Openvpn => "openvpn",
            Format::Ctime => "ctime",
            Format::Envoy => "envoy",
            Format::Json => "json",
        }
    }

    /// The format when none was asked for: [`Format::Full`] when stderr is a terminal (a
    /// person reads it), else `container`, the format the program's container is parsed with.
    pub fn default_for(container: Format) -> Format {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            Format::Full
        } else {
            container
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--log-format` value that names no [`Format`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {given:?} (one of: openvpn, ctime, envoy, json, full)")]
pub struct UnknownFormat {
    /// What was given.
    pub given: String,
}

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| UnknownFormat {
                given: s.to_owned(),
            })
    }
}

/// OpenVPN's time layout (`otime.c`), read by Gardener's `vpn-seed-server-parser` with
/// `%Y-%m-%d %H:%M:%S`.
const OPENVPN_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
/// C's `ctime` layout (day padded with a space), read by Gardener's `vpn-shoot-parser` with
/// `%a %b%t%d %H:%M:%S %Y`.
const CTIME_TIME: &[BorrowedFormatItem<'static>] = format_description!(
    "[weekday repr:short] [month repr:short] [day padding:space] [hour]:[minute]:[second] [year]"
);
/// Envoy's default `%START_TIME%`, UTC with milliseconds: `2026-11-25T16:22:19.123Z`.
const ENVOY_START_TIME: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// `at` as Envoy writes its default `%START_TIME%` (`2026-11-25T16:22:19.123Z`, UTC), which
/// Gardener's `envoy-proxy-parser` reads with `%Y-%m-%dT%H:%M:%S.%L%z` (in brackets).
pub fn envoy_start_time(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(ENVOY_START_TIME)
        .unwrap_or_default()
}

/// The [`Format::Envoy`] timestamp: [`envoy_start_time`] in brackets.
struct EnvoyTime;

impl FormatTime for EnvoyTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        write!(w, "[{}]", envoy_start_time(SystemTime::now()))
    }
}

/// Installs the global subscriber: lines in `format` on stderr, filtered by `filter`. Fails
/// when `filter` does not parse.
pub fn init(filter: &str, format: Format) -> Result<(), ParseError> {
    let ansi = format == Format::Full && std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::registry()
        .with(layer(format, ansi, std::io::stderr).with_filter(parse(filter)?))
        .init();
    Ok(())
}

/// The formatting layer for `format`, writing to `writer`, with ANSI colours if `ansi`.
pub fn layer<S, W>(format: Format, ansi: bool, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let plain = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        Format::Full => plain.with_timer(UtcTime::new(Rfc3339)).boxed(),
        Format::Openvpn => plain.with_timer(UtcTime::new(OPENVPN_TIME)).boxed(),
        Format::Ctime => plain.with_timer(UtcTime::new(CTIME_TIME)).boxed(),
        Format::Envoy => plain.with_timer(EnvoyTime).boxed(),
        Format::Json => plain
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_timer(UtcTime::new(Rfc3339))
            .boxed(),
    }
}

/// The default log filter for upstream's `verb N` (both binaries, when no log flag is given):
/// 0 errors only, 1 to 4 info (upstream's normal output), 5 and 6 debug (a line per packet
/// upstream), above that trace.
pub fn verb_filter(verb: u8) -> &'static str {
    match verb {
        0 => "error",
        1..=4 => "info",
        5..=6 => "debug",
        _ => "trace",
    }
}

/// Parses a `--log` filter: `LEVEL` and `target=LEVEL` directives separated by commas.
pub fn parse(filter: &str) -> Result<Targets, ParseError> {
    filter.parse()
}

#[cfg(test)]
mod tests;
