//! vpn2's netstat series: `openvpn_netstat_Tcp_OutSegs` and `openvpn_netstat_Tcp_RetransSegs`
//! from `/proc/net/snmp` of the process's network namespace (the pod's), whose ratio
//! Gardener's dashboard shows as the tunnel's retransmission rate.
//!
//! The file holds pairs of lines, a header and its values, each starting with the protocol:
//!
//! ```text
//! Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
//! Tcp: 1 200 120000 -1 1542 311 4 12 6 912345 1002311 2231 0 77 0
//! ```
//!
//! vpn2 reads every pair (and `/proc/net/netstat` and `/proc/net/snmp6` the same way) as
//! `openvpn_netstat_<Protocol>_<Field>` but keeps only the two series above, untyped and
//! unlabelled; so does this. A pair whose protocols or field counts differ, or a header
//! without its value line, spoils the whole file: no netstat series then, as in vpn2.

use crate::exporter::{parse_go_float, Family, Sample};

/// The SNMP counters of the process's network namespace.
pub const SNMP_PATH: &str = "/proc/net/snmp";

/// The counters kept, as `(protocol, field)`.
pub const KEPT: [(&str, &str, Family); 2] = [
    ("Tcp", "OutSegs", Family::TcpOutSegs),
    ("Tcp", "RetransSegs", Family::TcpRetransSegs),
];

/// One counter of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// `Tcp`, `Udp`, … (the line's first word without its `:`).
    pub protocol: String,
    /// The field name from the header line.
    pub field: String,
    /// The value as written.
    pub value: String,
}

/// A malformed `/proc/net/snmp`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnmpError {
    /// A header line without its value line.
    #[error("no value line after the {protocol:?} header")]
    MissingValues {
        /// The header's first word.
        protocol: String,
    },
    /// A header and a value line of different protocols.
    #[error("header {header:?} followed by values of {values:?}")]
    Mismatch {
        /// The header's first word.
        header: String,
        /// The value line's first word.
        values: String,
    },
    /// A header and a value line with different numbers of fields.
    #[error("{protocol}: {header} names, {values} values")]
    FieldCount {
        /// The protocol.
        protocol: String,
        /// Words of the header line.
        header: usize,
        /// Words of the value line.
        values: usize,
    },
    /// A first word that is not `<Protocol>:`.
    #[error("line {first:?} does not start with a protocol and a colon")]
    NoProtocol {
        /// The first word.
        first: String,
    },
}

/// Every counter of an SNMP file (words separated by single spaces, as the kernel writes
/// them).
pub fn parse(text: &str) -> Result<Vec<Counter>, SnmpError> {
    let mut counters = Vec::new();
    let mut lines = text.lines();
    while let Some(header) = lines.next() {
        let names: Vec<&str> = header.split(' ').collect();
        let Some(values) = lines.next() else {
            return Err(SnmpError::MissingValues {
                protocol: names[0].to_owned(),
            });
        };
        let values: Vec<&str> = values.split(' ').collect();
        if names[0] != values[0] {
            return Err(SnmpError::Mismatch {
                header: names[0].to_owned(),
                values: values[0].to_owned(),
            });
        }
        let Some(protocol) = names[0].strip_suffix(':').filter(|p| !p.is_empty()) else {
            return Err(SnmpError::NoProtocol {
                first: names[0].to_owned(),
            });
        };
        if names.len() != values.len() {
            return Err(SnmpError::FieldCount {
                protocol: protocol.to_owned(),
                header: names.len(),
                values: values.len(),
            });
        }
        for (field, value) in names.iter().zip(&values).skip(1) {
            counters.push(Counter {
                protocol: protocol.to_owned(),
                field: (*field).to_owned(),
                value: (*value).to_owned(),
            });
        }
    }
    Ok(counters)
}

/// Appends the kept counters of the SNMP file `text` to `out`; nothing if the file is
/// malformed, a counter whose value is not a number is left out (both logged).
pub fn collect(text: &str, out: &mut Vec<Sample>) {
    let counters = match parse(text) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no netstat series: malformed {SNMP_PATH}");
            return;
        }
    };
    // A counter written twice: the later one counts (vpn2 keeps them in a map).
    let mut kept: [Option<f64>; KEPT.len()] = [None; KEPT.len()];
    for c in counters {
        let Some(i) = KEPT
            .iter()
            .position(|(p, f, _)| *p == c.protocol && *f == c.field)
        else {
            continue;
        };
        kept[i] = parse_go_float(&c.value);
        if kept[i].is_none() {
            tracing::warn!(series = KEPT[i].2.name(), value = %c.value, "not a number");
        }
    }
    for (&(_, _, family), value) in KEPT.iter().zip(kept) {
        if let Some(value) = value {
            out.push(Sample::new(family, Vec::new(), value));
        }
    }
}
