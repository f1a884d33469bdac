//! `vpn-server exporter`: the `openvpn-exporter` container of Gardener's HA `vpn-seed-server`
//! pods (gardener-pods reference 2.2, 3.5 and 5; gardener-vpn2 1.7). vpn2 runs kumina's
//! `openvpn_exporter` v0.3.0 over the status file plus its own netstat series; this serves the
//! same series, computed at each scrape.
//!
//! # Inputs
//!
//! - `OPENVPN_STATUS_PATH` (required; the whole vpn2 environment is checked as the probes do,
//!   [`crate::probes`]). A comma-separated list names several files, each its own
//!   `status_path`, as kumina's exporter takes it.
//! - `/proc/net/snmp` of the process's network namespace ([`netstat`]).
//! - `--listen ADDR,...` (`VPN_SERVER_EXPORTER_LISTEN`), default `0.0.0.0:15000,[::]:15000`:
//!   Gardener's `metrics` port on every IPv4 and IPv6 address, as vpn2's `:15000`.
//!
//! # What it serves ([`netio::admin`])
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | the series below |
//! | `GET /` | a small HTML page linking `/metrics` |
//! | `GET /healthz`, `/readyz` | 200 while it serves (Gardener probes TCP 15000 only) |
//!
//! The series, their labels and meaning: `docs/metrics.md`, section "vpn2 exporter", the one
//! catalogue (`conformance/tests/metrics_catalogue.rs` checks it against what this renders).
//!
//! Which file rows become which series, and when `openvpn_up` is 0: [`kumina`]. The text is
//! what Go's client library writes: families sorted by name, samples by label values, labels
//! by name, numbers as Go's `strconv.FormatFloat(v, 'g', -1, 64)` (`1.795320809e+09`).
//!
//! The connected-clients series is `openvpn_server_connected_clients`: kumina's v0.3.0, the
//! version vpn2 pins, has that name (its module hash matches vpn2's `go.sum`); the doubled
//! `openvpn_openvpn_…` name belongs to releases before it. Gardener keeps neither.
//!
//! Differences from vpn2, on purpose: no `go_*` and `process_*` series (Go runtime figures
//! Gardener drops); `/healthz` and `/readyz` are served and other paths are 404 (vpn2 answers
//! every path but `/metrics` with its HTML page); SIGTERM and SIGINT end it cleanly.

pub mod kumina;
pub mod netstat;

use std::cmp::Ordering;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::status::read::MAX_STATUS_BYTES;
use netio::admin::{AdminBindError, AdminServer, AdminState, Exposition, Kind};
use netio::report::chain;
use netio::volume::read_file_bounded;
use protocol::config::env::{EnvError, Vpn2ServerEnv};
use tokio_util::sync::CancellationToken;

/// Where vpn2's exporter listens: `:15000`, Gardener's `metrics` port.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:15000,[::]:15000";

/// The page `GET /` answers.
pub const INDEX_HTML: &str = "<!DOCTYPE html>
<html>
<head><title>vpn-server exporter</title></head>
<body>
<h1>vpn-server exporter</h1>
<p>OpenVPN status-file series for Prometheus: <a href=\"/metrics\">/metrics</a></p>
</body>
</html>
";

/// The exporter's command-line flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ExporterArgs {
    /// `GET /metrics` listen addresses, comma-separated.
    #[arg(
        long,
        env = "VPN_SERVER_EXPORTER_LISTEN",
        value_delimiter = ',',
        default_value = DEFAULT_LISTEN
    )]
    pub listen: Vec<SocketAddr>,
}

/// What the exporter reads and where it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterConfig {
    /// The status files, each a `status_path` label value as written.
    pub status_paths: Vec<String>,
    /// The SNMP counters of the network namespace.
    pub snmp_path: PathBuf,
    /// Listen addresses.
    pub listen: Vec<SocketAddr>,
}

impl ExporterConfig {
    /// The status files from the vpn2 environment `vars` (checked as the probes check it),
    /// `/proc/net/snmp`, and `args`.
    pub fn from_vpn2_env<I, K, V>(vars: I, args: &ExporterArgs) -> Result<ExporterConfig, EnvError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env = Vpn2ServerEnv::parse(vars)?;
        let mut status_paths: Vec<String> = Vec::new();
        for path in env.status_path.to_string_lossy().split(',') {
            // A path named twice would give the same series twice.
            if !status_paths.iter().any(|p| p == path) {
                status_paths.push(path.to_owned());
            }
        }
        Ok(ExporterConfig {
            status_paths,
            snmp_path: PathBuf::from(netstat::SNMP_PATH),
            listen: args.listen.clone(),
        })
    }
}

/// Serves `/metrics` for `config` until `shutdown`.
pub async fn run(
    config: ExporterConfig,
    shutdown: CancellationToken,
) -> Result<(), AdminBindError> {
    let admin = AdminServer::bind(&config.listen)?.with_index(INDEX_HTML);
    tracing::info!(
        listen = ?admin.local_addrs(),
        status_paths = ?config.status_paths,
        "exporter serving /metrics"
    );
    let exporter: Arc<dyn AdminState> = Arc::new(Exporter::new(config));
    admin.serve(vec![exporter], shutdown).await;
    Ok(())
}

/// The exporter as a part of the admin endpoint: reads its files at each scrape.
#[derive(Debug)]
pub struct Exporter {
    status_paths: Vec<String>,
    snmp_path: PathBuf,
}

impl Exporter {
    /// An exporter of `config`'s files.
    pub fn new(config: ExporterConfig) -> Exporter {
        Exporter {
            status_paths: config.status_paths,
            snmp_path: config.snmp_path,
        }
    }

    /// Reads every file now: the samples, unsorted.
    pub fn collect(&self) -> Vec<Sample> {
        let mut out = Vec::new();
        for path in &self.status_paths {
            let up = match read_file_bounded(path.as_ref(), MAX_STATUS_BYTES) {
                Ok(bytes) => {
                    kumina::collect(path, &bytes, &mut out).map_err(|source| ScrapeError::Strict {
                        path: path.clone(),
                        source,
                    })
                }
                Err(source) => Err(ScrapeError::Read {
                    path: path.clone(),
                    source,
                }),
            };
            if let Err(e) = &up {
                tracing::warn!(error = %chain(e), "status file not read: openvpn_up 0");
            }
            out.push(Sample::new(
                Family::Up,
                vec![("status_path", path.clone())],
                if up.is_ok() { 1.0 } else { 0.0 },
            ));
        }
        match std::fs::read_to_string(&self.snmp_path) {
            Ok(text) => netstat::collect(&text, &mut out),
            Err(e) => tracing::warn!(
                path = %self.snmp_path.display(),
                error = %e,
                "no netstat series"
            ),
        }
        out
    }
}

impl AdminState for Exporter {
    fn metrics(&self, out: &mut Exposition) {
        render(self.collect(), out);
    }
}

/// Why a status file gave `openvpn_up 0` (logged).
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The file cannot be read (not written yet, or gone).
    #[error("cannot read the OpenVPN status file {path}")]
    Read {
        /// `status_path`.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file breaks a rule of kumina's reader.
    #[error("OpenVPN status file {path} refused")]
    Strict {
        /// `status_path`.
        path: String,
        /// The rule.
        #[source]
        source: kumina::StrictError,
    },
}

/// The series the exporter writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `openvpn_up`.
    Up,
    /// `openvpn_status_update_time_seconds`.
    StatusUpdateTime,
    /// `openvpn_server_connected_clients`.
    ConnectedClients,
    /// `openvpn_server_client_received_bytes_total`.
    ClientReceivedBytes,
    /// `openvpn_server_client_sent_bytes_total`.
    ClientSentBytes,
    /// `openvpn_server_route_last_reference_time_seconds`.
    RouteLastReference,
    /// `openvpn_netstat_Tcp_OutSegs`.
    TcpOutSegs,
    /// `openvpn_netstat_Tcp_RetransSegs`.
    TcpRetransSegs,
}

impl Family {
    /// The series name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Up => "openvpn_up",
            Family::StatusUpdateTime => "openvpn_status_update_time_seconds",
            Family::ConnectedClients => "openvpn_server_connected_clients",
            Family::ClientReceivedBytes => "openvpn_server_client_received_bytes_total",
            Family::ClientSentBytes => "openvpn_server_client_sent_bytes_total",
            Family::RouteLastReference => "openvpn_server_route_last_reference_time_seconds",
            Family::TcpOutSegs => "openvpn_netstat_Tcp_OutSegs",
            Family::TcpRetransSegs => "openvpn_netstat_Tcp_RetransSegs",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Family::ClientReceivedBytes | Family::ClientSentBytes => Kind::Counter,
            Family::TcpOutSegs | Family::TcpRetransSegs => Kind::Untyped,
            _ => Kind::Gauge,
        }
    }

    fn help(self) -> &'static str {
        match self {
            Family::Up => "1 if the status file was read, 0 if it is missing or malformed.",
            Family::StatusUpdateTime => {
                "When OpenVPN last wrote the status file (its TIME), in Unix seconds."
            }
            Family::ConnectedClients => "CLIENT_LIST rows of the status file.",
            Family::ClientReceivedBytes => "Bytes received from a client on its connection.",
            Family::ClientSentBytes => "Bytes sent to a client on its connection.",
            Family::RouteLastReference => "When a route was last used, in Unix seconds.",
            Family::TcpOutSegs => "TCP segments sent (Tcp OutSegs of /proc/net/snmp).",
            Family::TcpRetransSegs => {
                "TCP segments retransmitted (Tcp RetransSegs of /proc/net/snmp)."
            }
        }
    }
}

/// One sample: its family, its labels in name order, its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series.
    pub family: Family,
    /// Label names (sorted) and values.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// A sample; `labels` must be sorted by name.
    pub fn new(family: Family, labels: Vec<(&'static str, String)>, value: f64) -> Sample {
        debug_assert!(labels.windows(2).all(|w| w[0].0 < w[1].0));
        Sample {
            family,
            labels,
            value,
        }
    }

    /// Go's order: by series name, then label values in label-name order.
    fn order(&self, other: &Sample) -> Ordering {
        self.family
            .name()
            .cmp(other.family.name())
            .then_with(|| self.label_values().cmp(other.label_values()))
    }

    fn label_values(&self) -> impl Iterator<Item = &str> {
        self.labels.iter().map(|(_, v)| v.as_str())
    }
}

/// Writes `samples` as Go's client library does: families sorted by name, each with its
/// `# HELP` and `# TYPE` once, samples sorted by label values.
pub fn render(mut samples: Vec<Sample>, out: &mut Exposition) {
    samples.sort_by(Sample::order);
    let mut current = None;
    for s in &samples {
        if current != Some(s.family) {
            out.family(s.family.name(), s.family.kind(), s.family.help());
            current = Some(s.family);
        }
        let labels: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        out.sample(s.family.name(), &labels, GoFloat(s.value));
    }
}

/// A number as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, which the Prometheus
/// text of Go's client library uses: the shortest digits that read back the same, in
/// exponent form (`1.795320809e+09`) when the exponent is below -4 or at least 6; `+Inf`,
/// `-Inf`, `NaN`.
#[derive(Debug, Clone, Copy)]
pub struct GoFloat(pub f64);

impl fmt::Display for GoFloat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            return f.write_str("NaN");
        }
        if v.is_infinite() {
            return f.write_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        }
        if v == 0.0 {
            return f.write_str("0");
        }
        if v < 0.0 {
            f.write_str("-")?;
        }
        // Rust's `{:e}` also writes the shortest round-trip digits: `d.ddde<exp>`.
        let sci = format!("{:e}", v.abs());
        let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let digits: Vec<u8> = mantissa.bytes().filter(|b| *b != b'.').collect();
        let digit = |i: i32| {
            usize::try_from(i)
                .ok()
                .and_then(|i| digits.get(i))
                .map_or('0', |d| char::from(*d))
        };
        if !(-4..6).contains(&exp) {
            write!(f, "{}", digit(0))?;
            if digits.len() > 1 {
                write!(f, ".{}", String::from_utf8_lossy(&digits[1..]))?;
            }
            let sign = if exp < 0 { '-' } else { '+' };
            return write!(f, "e{sign}{:02}", exp.abs());
        }
        // Plain: the digits with the point after `exp + 1` of them.
        let point = exp + 1;
        if point <= 0 {
            f.write_str("0")?;
        }
        for i in 0..point {
            write!(f, "{}", digit(i))?;
        }
        let last = digits.len() as i32;
        if last > point {
            f.write_str(".")?;
            for i in point..last {
                write!(f, "{}", digit(i))?;
            }
        }
        Ok(())
    }
}

/// A number as Go's `strconv.ParseFloat(s, 64)` reads it, as kumina's exporter and vpn2's
/// netstat collector do: decimal with optional sign, point and exponent, `inf`, `infinity`
/// and `nan` in any case; a finite number too large for `f64` is refused (Go's range
/// error). Go also reads hexadecimal (`0x1p4`) and `_`-separated digits, which no status
/// file holds; they are refused here.
pub fn parse_go_float(text: &str) -> Option<f64> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let special = ["inf", "infinity"]
        .iter()
        .any(|s| unsigned.eq_ignore_ascii_case(s));
    // Go reads a NaN only without a sign.
    if unsigned.eq_ignore_ascii_case("nan") {
        return (unsigned.len() == text.len()).then_some(f64::NAN);
    }
    let value: f64 = text.parse().ok()?;
    (value.is_finite() || special).then_some(value)
}

#[cfg(test)]
mod tests;
