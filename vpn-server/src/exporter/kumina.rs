//! A status file → samples, by the rules of kumina's `openvpn_exporter` v0.3.0 (the reader
//! vpn2's exporter runs; gardener-pods reference 3.5). Stricter than vpn2's own reader
//! ([`crate::status::read`]): a file that passes the probes can still give `openvpn_up 0`.
//!
//! The file must start with `TITLE,` (`status-version 2`) or `TITLE\t` (version 3, fields
//! split at tabs instead of commas). Then, line by line (`\r\n` read as `\n`):
//!
//! | line | rule |
//! |---|---|
//! | `END` | only alone on its line |
//! | `GLOBAL_STATS,…` | ignored |
//! | `HEADER,<kind>,<columns…>` | at least 3 fields; names the columns of the `<kind>` rows that follow |
//! | `TIME,<text>,<unix>` | exactly 3 fields; `<unix>` a number → `openvpn_status_update_time_seconds` |
//! | `TITLE,<text>` | exactly 2 fields: a version string with a comma is refused |
//! | `CLIENT_LIST,…` | counted in `openvpn_server_connected_clients`; needs its `HEADER` first and exactly as many columns; `Bytes Received` and `Bytes Sent` → the two client byte series |
//! | `ROUTING_TABLE,…` | the same rules; `Last Ref (time_t)` → `openvpn_server_route_last_reference_time_seconds` |
//! | anything else (an empty line too) | refused |
//!
//! Labels come from the columns `Common Name`, `Connected Since (time_t)` (as
//! `connection_time`), `Real Address`, `Virtual Address` and `Username`, as written (2.7's
//! `tcp6-server:[…]:port` included); a column the header lacks gives an empty label, a value
//! column it lacks no sample. A row whose label values all already occur among the rows taken
//! for that series (in any rows, in any order) is skipped, as kumina skips it.
//!
//! A refusal makes `openvpn_up` 0; the samples taken before the refused line stay, and
//! `openvpn_server_connected_clients` is only written if the end of the file is reached (a
//! line of 64 KiB or more stops the reading there: the count is written, `openvpn_up` is 0).
//!
//! Not reproduced: kumina's client status format (`OpenVPN STATISTICS`, for OpenVPN clients)
//! is refused; a second `TIME` line adds no second sample (Go's library would then fail the
//! whole scrape with HTTP 500).

use std::collections::HashMap;

use crate::exporter::{parse_go_float, Family, Sample};
use crate::status::read::MAX_LINE_LEN;

/// A rule of kumina's reader that a status file breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrictError {
    /// The file does not start with `TITLE,` or `TITLE\t`.
    #[error("the file does not start with TITLE, (status-version 2) or TITLE<tab> (3)")]
    NotServerStatus,
    /// A line of unknown kind or with the wrong number of fields.
    #[error("line {line}: unsupported line {first:?} with {fields} field(s)")]
    Unsupported {
        /// 1-based line number.
        line: usize,
        /// Its first field.
        first: String,
        /// Its number of fields.
        fields: usize,
    },
    /// A row before the `HEADER` of its kind.
    #[error("line {line}: {kind} row before its HEADER")]
    NoHeader {
        /// 1-based line number.
        line: usize,
        /// `CLIENT_LIST` or `ROUTING_TABLE`.
        kind: &'static str,
    },
    /// A row with another number of columns than its header.
    #[error("line {line}: {kind} row with {columns} column(s), its HEADER names {header}")]
    ColumnCount {
        /// 1-based line number.
        line: usize,
        /// `CLIENT_LIST` or `ROUTING_TABLE`.
        kind: &'static str,
        /// Columns of the row.
        columns: usize,
        /// Columns of the header.
        header: usize,
    },
    /// A number that does not parse.
    #[error("line {line}: {column} {value:?} is not a number")]
    Number {
        /// 1-based line number.
        line: usize,
        /// The column (`TIME` for the time line).
        column: String,
        /// Its text.
        value: String,
    },
    /// A line of 64 KiB or more.
    #[error("line {line} is too long ({len} bytes)")]
    TooLong {
        /// 1-based line number.
        line: usize,
        /// Its length.
        len: usize,
    },
}

/// The row kinds that give samples.
#[derive(Debug, Clone, Copy)]
struct RowKind {
    name: &'static str,
    /// Label names (sorted) and the columns they come from.
    labels: &'static [(&'static str, &'static str)],
    /// Value columns and their series.
    values: &'static [(&'static str, Family)],
}

const CLIENT_LIST: RowKind = RowKind {
    name: "CLIENT_LIST",
    labels: &[
        ("common_name", "Common Name"),
        ("connection_time", "Connected Since (time_t)"),
        ("real_address", "Real Address"),
        ("status_path", ""),
        ("username", "Username"),
        ("virtual_address", "Virtual Address"),
    ],
    values: &[
        ("Bytes Received", Family::ClientReceivedBytes),
        ("Bytes Sent", Family::ClientSentBytes),
    ],
};

const ROUTING_TABLE: RowKind = RowKind {
    name: "ROUTING_TABLE",
    labels: &[
        ("common_name", "Common Name"),
        ("real_address", "Real Address"),
        ("status_path", ""),
        ("virtual_address", "Virtual Address"),
    ],
    values: &[("Last Ref (time_t)", Family::RouteLastReference)],
};

/// Appends the samples of the status file `bytes` read from `status_path` to `out`;
/// `Err` means `openvpn_up` 0 (the samples already appended stay).
pub fn collect(status_path: &str, bytes: &[u8], out: &mut Vec<Sample>) -> Result<(), StrictError> {
    let separator = if bytes.starts_with(b"TITLE,") {
        ','
    } else if bytes.starts_with(b"TITLE\t") {
        '\t'
    } else {
        return Err(StrictError::NotServerStatus);
    };
    let mut reader = Reader {
        status_path,
        headers: HashMap::new(),
        taken: HashMap::new(),
        time_taken: false,
        clients: 0,
    };
    let mut too_long = None;
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    for (index, raw) in body.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        if raw.len() > MAX_LINE_LEN {
            too_long = Some(StrictError::TooLong {
                line,
                len: raw.len(),
            });
            break;
        }
        let text = String::from_utf8_lossy(raw.strip_suffix(b"\r").unwrap_or(raw));
        let fields: Vec<&str> = text.split(separator).collect();
        reader.line(line, &fields, out)?;
    }
    out.push(Sample::new(
        Family::ConnectedClients,
        vec![("status_path", status_path.to_owned())],
        reader.clients as f64,
    ));
    too_long.map_or(Ok(()), Err)
}

/// What one file's reading keeps between lines.
struct Reader<'a> {
    status_path: &'a str,
    /// Column names by row kind, from the last `HEADER` of each.
    headers: HashMap<String, Vec<String>>,
    /// Every label value taken so far, per series (kumina's duplicate check).
    taken: HashMap<Family, Vec<String>>,
    time_taken: bool,
    clients: u64,
}

impl Reader<'_> {
    fn line(
        &mut self,
        line: usize,
        fields: &[&str],
        out: &mut Vec<Sample>,
    ) -> Result<(), StrictError> {
        match (fields[0], fields.len()) {
            ("END", 1) | ("GLOBAL_STATS", _) | ("TITLE", 2) => Ok(()),
            ("HEADER", n) if n > 2 => {
                let columns = fields[2..].iter().map(|c| (*c).to_owned()).collect();
                self.headers.insert(fields[1].to_owned(), columns);
                Ok(())
            }
            ("TIME", 3) => {
                let value = number(line, "TIME", fields[2])?;
                if !self.time_taken {
                    self.time_taken = true;
                    let labels = vec![("status_path", self.status_path.to_owned())];
                    out.push(Sample::new(Family::StatusUpdateTime, labels, value));
                }
                Ok(())
            }
            ("CLIENT_LIST", _) => {
                self.clients += 1;
                self.row(line, CLIENT_LIST, fields, out)
            }
            ("ROUTING_TABLE", _) => self.row(line, ROUTING_TABLE, fields, out),
            (first, fields) => Err(StrictError::Unsupported {
                line,
                first: first.to_owned(),
                fields,
            }),
        }
    }

    fn row(
        &mut self,
        line: usize,
        kind: RowKind,
        fields: &[&str],
        out: &mut Vec<Sample>,
    ) -> Result<(), StrictError> {
        let Some(columns) = self.headers.get(kind.name) else {
            return Err(StrictError::NoHeader {
                line,
                kind: kind.name,
            });
        };
        if fields.len() != columns.len() + 1 {
            return Err(StrictError::ColumnCount {
                line,
                kind: kind.name,
                columns: fields.len() - 1,
                header: columns.len(),
            });
        }
        // A column named twice: the later one counts.
        let column = |name: &str| {
            columns
                .iter()
                .rposition(|c| c == name)
                .map(|i| fields[i + 1])
        };
        let labels: Vec<(&'static str, String)> = kind
            .labels
            .iter()
            .map(|&(label, col)| {
                let value = match label {
                    "status_path" => self.status_path,
                    _ => column(col).unwrap_or_default(),
                };
                (label, value.to_owned())
            })
            .collect();
        for &(col, family) in kind.values {
            let Some(text) = column(col) else {
                continue;
            };
            let taken = self.taken.entry(family).or_default();
            if labels.iter().all(|(_, v)| taken.contains(v)) && labels.len() <= taken.len() {
                tracing::debug!(
                    series = family.name(),
                    ?labels,
                    "row with the labels of earlier rows skipped"
                );
                continue;
            }
            let value = number(line, col, text)?;
            taken.extend(labels.iter().map(|(_, v)| v.clone()));
            out.push(Sample::new(family, labels.clone(), value));
        }
        Ok(())
    }
}

fn number(line: usize, column: &str, text: &str) -> Result<f64, StrictError> {
    parse_go_float(text).ok_or_else(|| StrictError::Number {
        line,
        column: column.to_owned(),
        value: text.to_owned(),
    })
}
