//! Reading a status file the way vpn2's probes do (gardener-pods reference 3.4): what
//! `vpn-server readiness` and `vpn-server liveness` ([`crate::probes`]) decide on.
//!
//! Pure: [`parse`] takes the file's bytes; the probes read the file.
//!
//! What is accepted, line by line (lines end in `\n`, a `\r` before it is dropped, a last line
//! without `\n` counts; fields are split at every `,`):
//!
//! | first field | rule |
//! |---|---|
//! | (empty line), `END` | skipped (`END` only as the whole line) |
//! | `TITLE` | anything; the rest of the line is the title |
//! | `TIME` | field 2 is `YYYY-MM-DD HH:MM:SS` read as UTC ([`Timestamp`]); field 3 is not read |
//! | `HEADER` | ignored |
//! | `CLIENT_LIST` | at least 13 fields: CN (2), real address (3), virtual address (4, any text), virtual IPv6 (5, read if it is an address), bytes received and sent (6, 7: unsigned decimal), connected since (8, a time as in `TIME`), username (10), client id (11), peer id (12), cipher (13) |
//! | `ROUTING_TABLE` | at least 5 fields: virtual address (2, any text: a MAC in tap mode), CN (3), real address (4), last ref (5, a time) |
//! | `GLOBAL_STATS` | at least 2 fields |
//! | anything else | an error, as is a line of 64 KiB or more |
//!
//! A refusal quotes the field at fault by at most its first 80 characters
//! (`netio::report::quote`). The probes and the exporter read a file of at most
//! [`MAX_STATUS_BYTES`] (16 MiB, some 50,000 clients with their routes); a larger one is
//! refused unread, with its size.
//!
//! Real addresses ([`parse_real_address`]) come in OpenVPN 2.6's form (`1.2.3.4:5678`, or a
//! bare IPv6 address without port) or 2.7's (`[fd00::1]:5678`, also for IPv4 peers
//! `1.2.3.4:5678`), optionally after a protocol prefix such as `tcp6-server:` or `udp4:`.
//!
//! A time is read as Go's `time.Parse` reads the layout `2006-01-02 15:04:05`: four-digit year,
//! two-digit month, day, minute and second, a one- or two-digit hour, one or more spaces
//! between date and time, the day checked against the month, and an optional fraction of a
//! second after the seconds (`.123`). Where a CLIENT_LIST row has several faults, the first
//! one reported is that of the date, then the address, then the counters (vpn2's order).
//!
//! Not reproduced: vpn2 reads the file's bytes as they are; we read each line as UTF-8 with
//! invalid bytes replaced (only the text of names changes, never whether a line parses).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netio::report::quote;

/// The CN prefix of shoot-side clients (`vpn-shoot-client`, in HA `vpn-shoot-client-0`, …).
pub const SHOOT_CLIENT_PREFIX: &str = "vpn-shoot-client";
/// The CN prefix of the seed-side HA clients (the kube-apiserver's `vpn-client-N` sidecars).
pub const SEED_CLIENT_PREFIX: &str = "vpn-seed-client";

/// The longest line (without its `\n`) that is read: Go's line scanner holds a line and its
/// newline in a 64 KiB buffer.
pub const MAX_LINE_LEN: usize = 64 * 1024 - 1;

/// Characters of an unknown line type quoted in the error (then `…`).
const UNKNOWN_SHOWN: usize = 40;

/// Fields a `CLIENT_LIST` row needs.
pub const CLIENT_LIST_FIELDS: usize = 13;
/// Fields a `ROUTING_TABLE` row needs.
pub const ROUTING_TABLE_FIELDS: usize = 5;

/// What a status file says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// The text after `TITLE,` (the last TITLE line).
    pub title: Option<String>,
    /// When OpenVPN wrote the file (the last TIME line); `None` without one.
    pub updated_at: Option<Timestamp>,
    /// The CLIENT_LIST rows, in file order (clients still in the handshake included).
    pub clients: Vec<Client>,
    /// The ROUTING_TABLE rows, in file order.
    pub routes: Vec<Route>,
    /// GLOBAL_STATS: name and the rest of the line, in file order.
    pub global_stats: Vec<(String, String)>,
}

/// One CLIENT_LIST row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Certificate CN; `UNDEF` while the handshake is under way.
    pub common_name: String,
    /// The peer's address; port 0 where the file prints none (2.6, IPv6 peers).
    pub real_address: SocketAddr,
    /// The virtual IPv4 address as written (empty in HA and during the handshake).
    pub virtual_address: String,
    /// The virtual IPv6 address, if the field holds an address.
    pub virtual_ipv6: Option<IpAddr>,
    /// Bytes received from the client.
    pub bytes_received: u64,
    /// Bytes sent to the client.
    pub bytes_sent: u64,
    /// When the client connected.
    pub connected_since: Timestamp,
    /// Username (`UNDEF` without one).
    pub username: String,
    /// Client id, as written.
    pub client_id: String,
    /// Peer id, as written.
    pub peer_id: String,
    /// Data-channel cipher, as written.
    pub cipher: String,
}

/// One ROUTING_TABLE row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The routed address or network as written (a MAC address `xx:…@0` in tap mode).
    pub virtual_address: String,
    /// Owner CN.
    pub common_name: String,
    /// Owner's peer address.
    pub real_address: SocketAddr,
    /// When the route was last used.
    pub last_ref: Timestamp,
}

/// A point in time from the file, read as UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Seconds since the Unix epoch (negative before 1970).
    pub unix: i64,
    /// Nanoseconds past `unix` (only from a written fraction of a second).
    pub nanos: u32,
}

impl Timestamp {
    /// Nanoseconds since the Unix epoch.
    pub fn unix_nanos(self) -> i128 {
        i128::from(self.unix) * 1_000_000_000 + i128::from(self.nanos)
    }
}

/// `YYYY-MM-DD HH:MM:SS` (the fraction left out), as the file writes it.
impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Parsed from four year digits, so always inside the calendar's range.
        let at = time::OffsetDateTime::from_unix_timestamp(self.unix)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        f.write_str(&super::format_datetime(at))
    }
}

/// A line the reader refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {fault}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub fault: Fault,
}

/// The most bytes of a status file the probes and the exporter read: far more than any
/// server of ours writes (a client's two lines take about 250 bytes), and a bound on what a
/// file written by someone else can cost.
pub const MAX_STATUS_BYTES: u64 = 16 << 20;

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// The first field is none of the known ones.
    #[error("unknown line type {}", quote(first))]
    UnknownType {
        /// The first field.
        first: String,
    },
    /// A row with fewer fields than it needs.
    #[error("{kind} has {fields} fields, needs at least {needs}")]
    TooFewFields {
        /// `TIME`, `CLIENT_LIST`, `ROUTING_TABLE` or `GLOBAL_STATS`.
        kind: &'static str,
        /// Fields found.
        fields: usize,
        /// Fields needed.
        needs: usize,
    },
    /// A time that is not `YYYY-MM-DD HH:MM:SS`.
    #[error("{field} {} is not a YYYY-MM-DD HH:MM:SS time", quote(value))]
    Time {
        /// Which field.
        field: &'static str,
        /// Its text.
        value: String,
    },
    /// A peer address in neither 2.6's nor 2.7's form.
    #[error(
        "real address {} is neither ip:port, a bare IP address nor [ipv6]:port",
        quote(value)
    )]
    RealAddress {
        /// Its text.
        value: String,
    },
    /// A byte counter that is not an unsigned decimal number.
    #[error("{field} {} is not an unsigned 64-bit decimal number", quote(value))]
    Counter {
        /// Which field.
        field: &'static str,
        /// Its text.
        value: String,
    },
    /// A line of 64 KiB or more.
    #[error("line of {len} bytes (at most {MAX_LINE_LEN} are read)")]
    TooLong {
        /// Its length without the newline.
        len: usize,
    },
}

/// Reads a whole status file.
pub fn parse(bytes: &[u8]) -> Result<Status, ParseError> {
    let mut status = Status::default();
    for (index, raw) in lines(bytes).enumerate() {
        let line = index + 1;
        parse_line(raw, &mut status).map_err(|fault| ParseError { line, fault })?;
    }
    Ok(status)
}

/// The lines as Go's `bufio.ScanLines` cuts them, at `\n` (a last line without `\n` counts if
/// it is not empty), each still with the `\r` it may end in.
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let empty = bytes.is_empty();
    body.split(|&b| b == b'\n').filter(move |_| !empty)
}

fn parse_line(raw: &[u8], status: &mut Status) -> Result<(), Fault> {
    // The `\r` counts towards the scanner's buffer, then is dropped.
    if raw.len() > MAX_LINE_LEN {
        return Err(Fault::TooLong { len: raw.len() });
    }
    let text = String::from_utf8_lossy(raw.strip_suffix(b"\r").unwrap_or(raw));
    if text.is_empty() || text == "END" {
        return Ok(());
    }
    let fields: Vec<&str> = text.split(',').collect();
    match fields[0] {
        "TITLE" => status.title = Some(fields[1..].join(",")),
        "TIME" => {
            let [_, time, ..] = fields[..] else {
                return Err(too_few("TIME", &fields, 2));
            };
            status.updated_at = Some(timestamp("TIME", time)?);
        }
        "CLIENT_LIST" => status.clients.push(client(&fields)?),
        "ROUTING_TABLE" => status.routes.push(route(&fields)?),
        "GLOBAL_STATS" => {
            let [_, name, ref rest @ ..] = fields[..] else {
                return Err(too_few("GLOBAL_STATS", &fields, 2));
            };
            status.global_stats.push((name.to_owned(), rest.join(",")));
        }
        "HEADER" => {}
        first => {
            // Quoted in the probe's output and the log: a bounded prefix, not a 64 KiB line.
            let mut shown: String = first.chars().take(UNKNOWN_SHOWN).collect();
            if shown.len() < first.len() {
                shown.push('…');
            }
            return Err(Fault::UnknownType { first: shown });
        }
    }
    Ok(())
}

fn client(fields: &[&str]) -> Result<Client, Fault> {
    let [_, cn, real, virt, virt6, rx, tx, since, _since_unix, user, id, peer, cipher, ..] =
        fields[..]
    else {
        return Err(too_few("CLIENT_LIST", fields, CLIENT_LIST_FIELDS));
    };
    let connected_since = timestamp("Connected Since", since)?;
    let real_address = real_address(real)?;
    Ok(Client {
        common_name: cn.to_owned(),
        real_address,
        virtual_address: virt.to_owned(),
        virtual_ipv6: virt6.parse().ok(),
        bytes_received: counter("Bytes Received", rx)?,
        bytes_sent: counter("Bytes Sent", tx)?,
        connected_since,
        username: user.to_owned(),
        client_id: id.to_owned(),
        peer_id: peer.to_owned(),
        cipher: cipher.to_owned(),
    })
}

fn route(fields: &[&str]) -> Result<Route, Fault> {
    let [_, virt, cn, real, last_ref, ..] = fields[..] else {
        return Err(too_few("ROUTING_TABLE", fields, ROUTING_TABLE_FIELDS));
    };
    let last_ref = timestamp("Last Ref", last_ref)?;
    let real_address = real_address(real)?;
    Ok(Route {
        virtual_address: virt.to_owned(),
        common_name: cn.to_owned(),
        real_address,
        last_ref,
    })
}

fn too_few(kind: &'static str, fields: &[&str], needs: usize) -> Fault {
    Fault::TooFewFields {
        kind,
        fields: fields.len(),
        needs,
    }
}

fn timestamp(field: &'static str, value: &str) -> Result<Timestamp, Fault> {
    parse_datetime(value).ok_or_else(|| Fault::Time {
        field,
        value: value.to_owned(),
    })
}

/// The `Real Address` field of a client or a route ([`parse_real_address`]).
fn real_address(value: &str) -> Result<SocketAddr, Fault> {
    parse_real_address(value).ok_or_else(|| Fault::RealAddress {
        value: value.to_owned(),
    })
}

/// Go's `strconv.ParseUint(s, 10, 64)`: ASCII digits only (no sign), at most `u64::MAX`.
fn counter(field: &'static str, value: &str) -> Result<u64, Fault> {
    let parsed = if value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse().ok()
    } else {
        None
    };
    parsed.ok_or_else(|| Fault::Counter {
        field,
        value: value.to_owned(),
    })
}

/// A peer address as OpenVPN 2.6 or 2.7 prints it; port 0 where none is printed.
///
/// | form | example |
/// |---|---|
/// | IPv4 with port (2.6, 2.7) | `100.64.0.7:41000` |
/// | bare IP address, no port (2.6 IPv6 peers; an IPv4 one is read too) | `fd00::7`, `::ffff:100.64.0.7` |
/// | bracketed IPv6 with port (2.7) | `[fd00::7]:41000` |
///
/// Each may follow a protocol prefix `udp` or `tcp`, then optionally `4` or `6`, then
/// optionally `-client` or `-server`, then `:` (2.7: `tcp6-server:[fd00::7]:41000`,
/// `tcp4-server:100.64.0.7:41000`). Zones (`%eth0`), a bracketed IPv4 address and brackets
/// without a port are refused.
pub fn parse_real_address(text: &str) -> Option<SocketAddr> {
    let rest = strip_protocol(text);
    if let Some(bracketed) = rest.strip_prefix('[') {
        let (ip, port) = bracketed.split_once("]:")?;
        return Some(SocketAddr::new(
            IpAddr::V6(ip.parse::<Ipv6Addr>().ok()?),
            port_number(port)?,
        ));
    }
    if let Some((ip, port)) = rest.rsplit_once(':') {
        if let (Ok(ip), Some(port)) = (ip.parse::<Ipv4Addr>(), port_number(port)) {
            return Some(SocketAddr::new(IpAddr::V4(ip), port));
        }
    }
    Some(SocketAddr::new(rest.parse::<IpAddr>().ok()?, 0))
}

/// `text` without a leading `udp:` / `tcp6-server:`-style protocol prefix.
fn strip_protocol(text: &str) -> &str {
    let Some(rest) = text
        .strip_prefix("udp")
        .or_else(|| text.strip_prefix("tcp"))
    else {
        return text;
    };
    let rest = rest
        .strip_prefix('4')
        .or_else(|| rest.strip_prefix('6'))
        .unwrap_or(rest);
    let rest = rest
        .strip_prefix("-client")
        .or_else(|| rest.strip_prefix("-server"))
        .unwrap_or(rest);
    // Without the `:` it is no prefix, and the address cannot parse either (`t`, `u`).
    rest.strip_prefix(':').unwrap_or(text)
}

/// A decimal port (leading zeros allowed, no sign).
fn port_number(text: &str) -> Option<u16> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse().ok()
    } else {
        None
    }
}

/// `YYYY-MM-DD HH:MM:SS` as Go's `time.Parse(time.DateTime, …)` reads it, in UTC (see the
/// module docs for the exact rules).
pub fn parse_datetime(text: &str) -> Option<Timestamp> {
    let b = text.as_bytes();
    let mut at = 0;
    let year = digits(b, &mut at, 4, 4)?;
    literal(b, &mut at, b'-')?;
    let month = digits(b, &mut at, 2, 2)?;
    literal(b, &mut at, b'-')?;
    let day = digits(b, &mut at, 2, 2)?;
    // One layout space matches a run of spaces.
    literal(b, &mut at, b' ')?;
    while b.get(at) == Some(&b' ') {
        at += 1;
    }
    let hour = digits(b, &mut at, 1, 2)?;
    literal(b, &mut at, b':')?;
    let minute = digits(b, &mut at, 2, 2)?;
    literal(b, &mut at, b':')?;
    let second = digits(b, &mut at, 2, 2)?;
    let mut nanos = 0;
    if b.get(at) == Some(&b'.') && b.get(at + 1).is_some_and(u8::is_ascii_digit) {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        // Nine digits count; more are read and dropped.
        let fraction = &b[start..at];
        for i in 0..9 {
            nanos = nanos * 10 + fraction.get(i).map_or(0, |d| u32::from(d - b'0'));
        }
    }
    if at != b.len() {
        return None;
    }
    // The calendar checks the ranges (month, day of that month, hour, minute, second).
    let month = time::Month::try_from(u8::try_from(month).ok()?).ok()?;
    let date =
        time::Date::from_calendar_date(i32::try_from(year).ok()?, month, u8::try_from(day).ok()?)
            .ok()?;
    let clock = time::Time::from_hms(
        u8::try_from(hour).ok()?,
        u8::try_from(minute).ok()?,
        u8::try_from(second).ok()?,
    )
    .ok()?;
    let unix = time::PrimitiveDateTime::new(date, clock)
        .assume_utc()
        .unix_timestamp();
    Some(Timestamp { unix, nanos })
}

/// Between `min` and `max` ASCII digits at `*at` (as many as there are, up to `max`).
fn digits(b: &[u8], at: &mut usize, min: usize, max: usize) -> Option<u32> {
    let start = *at;
    let mut value = 0u32;
    while *at - start < max {
        let Some(d) = b.get(*at).filter(|d| d.is_ascii_digit()) else {
            break;
        };
        value = value * 10 + u32::from(d - b'0');
        *at += 1;
    }
    (*at - start >= min).then_some(value)
}

fn literal(b: &[u8], at: &mut usize, want: u8) -> Option<()> {
    (b.get(*at) == Some(&want)).then(|| *at += 1)
}

#[cfg(test)]
mod tests;
