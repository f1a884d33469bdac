//! The server name of a TLS ClientHello, read without terminating TLS: what the SNI
//! listener routes by. Pure: the caller feeds every byte read so far, and [`parse`] says
//! "need more", the name, or why the connection must be closed.
//!
//! ```text
//! record (TLSPlaintext, RFC 8446 5.1), one or more, each:
//!  0      1      2      3      4      5 ...
//! +------+------+------+------+------+-----------------------------+
//! | 0x16 | 0x03 | 0x0? |  length (BE) | fragment (1..=16384 bytes)  |
//! +------+------+------+------+------+-----------------------------+
//!  handshake  legacy_record_version
//!
//! the fragments, concatenated, hold one handshake message:
//! +------+--------------------+--------------------------------------------+
//! | 0x01 |  length (24 bit)   | ClientHello body                           |
//! +------+--------------------+--------------------------------------------+
//!
//! ClientHello body (RFC 8446 4.1.2; TLS 1.0 to 1.3 share it):
//!   legacy_version u16 | random [32] | session_id <0..32> (u8 length)
//!   | cipher_suites <2..2^16-2> (u16 length, even) | compression_methods <1..2^8-1> (u8)
//!   | extensions <0..2^16-1> (u16 length; the whole field may be absent)
//! extension: type u16 | data <0..2^16-1> (u16 length); no type twice (RFC 8446 4.2)
//! server_name (type 0, RFC 6066 3): list <1..2^16-1> (u16 length) of
//!   name_type u8 (0 = host_name) | HostName <1..2^16-1> (u16 length)
//! ```
//!
//! Strict where a client has no reason to differ: the first byte must be a handshake record
//! (else [`HelloError::NotTls`], which an HTTP request or a PROXY header is), every length
//! must fit exactly, the records must carry the ClientHello and nothing else, and the name
//! list must hold exactly one `host_name` (RFC 6066 forbids two of one type; no other type
//! exists). The name is an ASCII DNS name (letters, digits, hyphens; labels of 1 to 63
//! bytes, at most 253 in all, no trailing dot, as RFC 6066 requires); an internationalised
//! name arrives as its `xn--` A-labels, and UTF-8 is refused. It is compared in lower case
//! ([`ServerName`]).
//!
//! Bounded: the handshake message may be at most [`MAX_HELLO_LEN`] bytes (its length field
//! says so at once), spread over at most [`MAX_RECORDS`] records, so the caller never
//! buffers more than [`MAX_BUFFERED`] bytes before a decision.

use std::fmt;

/// Bound on the ClientHello handshake message (header included): 16 KiB, one full record.
/// Real ones are well under (a few hundred bytes; about 1.8 KiB with a post-quantum key
/// share).
pub const MAX_HELLO_LEN: usize = 16 * 1024;
/// Bound on the records the ClientHello may be split over.
pub const MAX_RECORDS: usize = 16;
/// The most a caller buffers before [`parse`] decides: every record header and the message.
pub const MAX_BUFFERED: usize = MAX_HELLO_LEN + MAX_RECORDS * RECORD_HEADER_LEN;

/// `ContentType.handshake`.
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
/// `HandshakeType.client_hello`.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// `ExtensionType.server_name`.
const EXTENSION_SERVER_NAME: u16 = 0;
/// `NameType.host_name`.
const NAME_TYPE_HOST_NAME: u8 = 0;
/// Type, version and length of a record.
const RECORD_HEADER_LEN: usize = 5;
/// A record's fragment is at most 2^14 bytes (RFC 8446 5.1).
const MAX_FRAGMENT_LEN: usize = 1 << 14;
/// Type and 24-bit length of a handshake message.
const HANDSHAKE_HEADER_LEN: usize = 4;

/// A ClientHello's server name, valid and in lower case; also the key of an SNI route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerName(String);

impl ServerName {
    /// Checks `name` (ASCII letters, digits and hyphens; labels of 1..=63 bytes, not starting
    /// or ending with a hyphen; at most 253 bytes; no trailing dot) and lower-cases it.
    pub fn parse(name: &[u8]) -> Result<Self, NameError> {
        if name.is_empty() || name.len() > 253 {
            return Err(NameError::Length { len: name.len() });
        }
        if !name.is_ascii() {
            return Err(NameError::NotAscii);
        }
        for label in name.split(|b| *b == b'.') {
            let ok = (1..=63).contains(&label.len())
                && label
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
                && label.first() != Some(&b'-')
                && label.last() != Some(&b'-');
            if !ok {
                return Err(NameError::Label);
            }
        }
        let text = String::from_utf8_lossy(name).to_ascii_lowercase();
        Ok(Self(text))
    }

    /// The name in lower case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a server name is not a DNS host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty or longer than 253 bytes.
    #[error("server name of {len} bytes (1..=253)")]
    Length {
        /// Its length.
        len: usize,
    },
    /// Not ASCII (an internationalised name must be sent as `xn--` A-labels).
    #[error("server name is not ASCII")]
    NotAscii,
    /// A label empty (a trailing dot too), over 63 bytes, with a character other than a
    /// letter, digit or hyphen, or starting or ending with a hyphen.
    #[error("server name has an invalid label")]
    Label,
}

/// A complete ClientHello with its server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The one `host_name` of its `server_name` extension.
    pub server_name: ServerName,
    /// Bytes of the records that carried it (the caller forwards everything it read).
    pub len: usize,
}

/// Why the bytes are no ClientHello the router can route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The first bytes are not a TLS handshake record (an HTTP request, a PROXY header,
    /// SSL 2, garbage).
    #[error("not a TLS handshake record")]
    NotTls,
    /// Structurally invalid.
    #[error("malformed ClientHello: {what}")]
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// Longer than [`MAX_HELLO_LEN`] or spread over more than [`MAX_RECORDS`] records.
    #[error("ClientHello too large ({len} bytes or {records} records)")]
    TooLarge {
        /// The handshake message's length (as announced), or the bytes so far.
        len: usize,
        /// Records so far.
        records: usize,
    },
    /// A valid ClientHello without a `server_name` extension.
    #[error("ClientHello without a server name")]
    NoServerName,
    /// The name is not a DNS host name.
    #[error("ClientHello server name")]
    Name(#[source] NameError),
}

impl HelloError {
    fn malformed(what: &'static str) -> Self {
        HelloError::Malformed { what }
    }
}

/// Parses the start of a connection: `Ok(None)` while the ClientHello is incomplete (and
/// nothing seen so far is wrong), the hello once complete, or why the connection must be
/// closed. Decides as early as the bytes allow (the first byte tells TLS from anything else).
pub fn parse(buf: &[u8]) -> Result<Option<ClientHello>, HelloError> {
    let mut message = Vec::new();
    let mut at = 0;
    let mut records = 0;
    loop {
        // The next record's header, as far as it is here.
        let header = &buf[at..buf.len().min(at + RECORD_HEADER_LEN)];
        if let Some(&kind) = header.first() {
            if kind != CONTENT_TYPE_HANDSHAKE {
                return Err(if records == 0 {
                    HelloError::NotTls
                } else {
                    HelloError::malformed("a record other than handshake inside the ClientHello")
                });
            }
        }
        if let Some(&major) = header.get(1) {
            if major != 3 {
                return Err(if records == 0 {
                    HelloError::NotTls
                } else {
                    HelloError::malformed("record version")
                });
            }
        }
        let [_, _, _, hi, lo] = *header else {
            return Ok(None);
        };
        let fragment_len = usize::from(u16::from_be_bytes([hi, lo]));
        if fragment_len == 0 || fragment_len > MAX_FRAGMENT_LEN {
            return Err(HelloError::malformed("record length"));
        }
        records += 1;
        if records > MAX_RECORDS {
            return Err(HelloError::TooLarge {
                len: message.len(),
                records,
            });
        }
        let start = at + RECORD_HEADER_LEN;
        let end = start + fragment_len;
        let fragment = &buf[start..buf.len().min(end)];
        message.extend_from_slice(fragment);
        // The message header tells its length (and type) as soon as it is here.
        if let [kind, a, b, c, ..] = message[..] {
            if kind != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::malformed(
                    "first handshake message is not a ClientHello",
                ));
            }
            let body_len = u32::from_be_bytes([0, a, b, c]) as usize;
            let total = HANDSHAKE_HEADER_LEN + body_len;
            if total > MAX_HELLO_LEN {
                return Err(HelloError::TooLarge {
                    len: total,
                    records,
                });
            }
            if message.len() > total {
                return Err(HelloError::malformed(
                    "bytes after the ClientHello in its record",
                ));
            }
            if message.len() == total && buf.len() >= end {
                let server_name = client_hello_server_name(&message[HANDSHAKE_HEADER_LEN..])?;
                return Ok(Some(ClientHello {
                    server_name,
                    len: end,
                }));
            }
        }
        if buf.len() < end {
            return Ok(None);
        }
        at = end;
    }
}

/// A bounds-checked reader over a byte slice; every read fails with a `Malformed` naming
/// the field when the bytes run out.
struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.data.len() < n {
            return Err(HelloError::malformed(what));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A field with a one-byte length.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = usize::from(self.u8(what)?);
        self.take(n, what)
    }

    /// A field with a two-byte length.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = usize::from(self.u16(what)?);
        self.take(n, what)
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// The server name of a complete ClientHello body.
fn client_hello_server_name(body: &[u8]) -> Result<ServerName, HelloError> {
    let mut r = Reader { data: body };
    r.take(2, "legacy_version")?;
    r.take(32, "random")?;
    if r.vec8("session_id")?.len() > 32 {
        return Err(HelloError::malformed("session_id longer than 32 bytes"));
    }
    let suites = r.vec16("cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::malformed("cipher_suites"));
    }
    if r.vec8("compression_methods")?.is_empty() {
        return Err(HelloError::malformed("compression_methods"));
    }
    if r.is_empty() {
        // No extensions at all (TLS 1.2 and older allow it).
        return Err(HelloError::NoServerName);
    }
    let mut extensions = Reader {
        data: r.vec16("extensions")?,
    };
    if !r.is_empty() {
        return Err(HelloError::malformed("bytes after the extensions"));
    }
    let mut seen = Vec::new();
    let mut name = None;
    while !extensions.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vec16("extension data")?;
        if seen.contains(&kind) {
            return Err(HelloError::malformed("an extension twice"));
        }
        seen.push(kind);
        if kind == EXTENSION_SERVER_NAME {
            name = Some(host_name(data)?);
        }
    }
    name.ok_or(HelloError::NoServerName)
}

/// The one `host_name` of a `server_name` extension's data.
fn host_name(data: &[u8]) -> Result<ServerName, HelloError> {
    let mut r = Reader { data };
    let mut list = Reader {
        data: r.vec16("server_name_list")?,
    };
    if !r.is_empty() {
        return Err(HelloError::malformed("bytes after server_name_list"));
    }
    let mut found = None;
    while !list.is_empty() {
        let kind = list.u8("name_type")?;
        let name = list.vec16("host_name")?;
        if kind != NAME_TYPE_HOST_NAME {
            return Err(HelloError::malformed(
                "server name of a type other than host_name",
            ));
        }
        if found.is_some() {
            return Err(HelloError::malformed("more than one host_name"));
        }
        found = Some(ServerName::parse(name).map_err(HelloError::Name)?);
    }
    found.ok_or(HelloError::malformed("empty server_name_list"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello body: TLS 1.2 legacy version, zero random, a 32-byte session id, two
    /// suites, null compression, then `extensions` (`None`: no extensions field at all).
    fn body(extensions: Option<Vec<u8>>) -> Vec<u8> {
        let mut out = vec![3, 3];
        out.extend_from_slice(&[0; 32]);
        out.push(32);
        out.extend_from_slice(&[7; 32]);
        out.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        out.extend_from_slice(&[1, 0]);
        if let Some(ext) = extensions {
            out.extend_from_slice(&u16::try_from(ext.len()).unwrap().to_be_bytes());
            out.extend_from_slice(&ext);
        }
        out
    }

    fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    /// A `server_name` extension with these (name_type, name) entries.
    fn sni(names: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in names {
            list.push(*kind);
            list.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
            list.extend_from_slice(name);
        }
        let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        extension(EXTENSION_SERVER_NAME, &data)
    }

    /// The handshake message (type 1, 24-bit length) of `body`.
    fn message(body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let mut out = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
        out.extend_from_slice(body);
        out
    }

    /// `message` in records of at most `size` bytes of fragment each.
    fn records(message: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in message.chunks(size) {
            out.extend_from_slice(&[CONTENT_TYPE_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    fn hello_with(extensions: Vec<u8>) -> Vec<u8> {
        records(&message(&body(Some(extensions))), MAX_FRAGMENT_LEN)
    }

    fn name(s: &str) -> ServerName {
        ServerName::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn the_name_among_other_extensions() {
        let ext = [
            extension(0x000a, &[0, 2, 0, 0x1d]),
            sni(&[(0, b"api.shoot--p--a.example.com")]),
            extension(0x002b, &[2, 3, 4]),
        ]
        .concat();
        let wire = hello_with(ext);
        let got = parse(&wire).unwrap().unwrap();
        assert_eq!(got.server_name, name("api.shoot--p--a.example.com"));
        assert_eq!(got.len, wire.len());
        // Bytes after the hello (early data) are left to the caller.
        let mut more = wire.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(parse(&more).unwrap().unwrap().len, wire.len());
    }

    #[test]
    fn every_prefix_needs_more_then_every_split_gives_the_name() {
        let msg = message(&body(Some(sni(&[(0, b"a.example")]))));
        // Fragments of 7 bytes and up: within MAX_RECORDS records.
        for size in [7, 13, 40, 64, msg.len()] {
            let wire = records(&msg, size);
            for cut in 0..wire.len() {
                assert_eq!(
                    parse(&wire[..cut]),
                    Ok(None),
                    "records of {size}, cut at {cut}"
                );
            }
            assert_eq!(
                parse(&wire).unwrap().map(|h| h.server_name),
                Some(name("a.example")),
                "records of {size}"
            );
        }
    }

    #[test]
    fn no_server_name() {
        assert_eq!(
            parse(&records(&message(&body(None)), 100)),
            Err(HelloError::NoServerName)
        );
        assert_eq!(
            parse(&hello_with(Vec::new())),
            Err(HelloError::NoServerName)
        );
        assert_eq!(
            parse(&hello_with(extension(0x002b, &[2, 3, 4]))),
            Err(HelloError::NoServerName)
        );
    }

    #[test]
    fn several_names_or_other_types_are_malformed() {
        for names in [
            &[(0u8, &b"a.example"[..]), (0, b"b.example")][..],
            &[(0, b"a.example"), (0, b"a.example")],
            &[(1, b"a.example")],
            &[(0, b"a.example"), (1, b"x")],
            &[],
        ] {
            assert!(
                matches!(
                    parse(&hello_with(sni(names))),
                    Err(HelloError::Malformed { .. })
                ),
                "{names:?}"
            );
        }
        let twice = [sni(&[(0, b"a.example")]), sni(&[(0, b"b.example")])].concat();
        assert!(matches!(
            parse(&hello_with(twice)),
            Err(HelloError::Malformed { .. })
        ));
    }

    #[test]
    fn names_case_and_idn() {
        let got = |n: &[u8]| parse(&hello_with(sni(&[(0, n)]))).map(|h| h.unwrap().server_name);
        assert_eq!(
            got(b"API.Shoot--P--A.Example.COM"),
            Ok(name("api.shoot--p--a.example.com"))
        );
        // An internationalised name arrives as A-labels: plain LDH.
        assert_eq!(
            got(b"xn--bcher-kva.example"),
            Ok(name("xn--bcher-kva.example"))
        );
        for bad in [
            "bücher.example".as_bytes(),
            b"a.example.",
            b".a.example",
            b"a..example",
            b"-a.example",
            b"a-.example",
            b"a_b.example",
            b"a b.example",
            b"a.example\0",
            b"",
        ] {
            assert!(
                matches!(
                    got(bad),
                    Err(HelloError::Name(_)) | Err(HelloError::Malformed { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_label = format!("{}.example", "a".repeat(64));
        assert!(got(long_label.as_bytes()).is_err());
        let long_name = ["a".repeat(63).as_str(); 4].join(".");
        assert_eq!(long_name.len(), 255);
        assert_eq!(
            got(long_name.as_bytes()),
            Err(HelloError::Name(NameError::Length { len: 255 }))
        );
        assert!(got(&long_name.as_bytes()[2..]).is_ok());
    }

    #[test]
    fn not_tls_is_told_from_the_first_bytes() {
        for start in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"G",
            b"CONNECT a:1 HTTP/1.1\r\n",
            b"PROXY TCP4 ",
            b"\x80\x2e\x01\x03\x01",
            b"\x16\x02",
            b"\x17\x03\x03\x00\x10",
        ] {
            assert_eq!(parse(start), Err(HelloError::NotTls), "{start:?}");
        }
        assert_eq!(parse(b""), Ok(None));
        assert_eq!(parse(b"\x16"), Ok(None));
        assert_eq!(parse(b"\x16\x03"), Ok(None));
    }

    #[test]
    fn garbage_and_bad_lengths_are_malformed() {
        let good = message(&body(Some(sni(&[(0, b"a.example")]))));
        let malformed = |wire: &[u8]| matches!(parse(wire), Err(HelloError::Malformed { .. }));
        // A record of length 0, or over 2^14.
        assert!(malformed(b"\x16\x03\x01\x00\x00"));
        assert!(malformed(b"\x16\x03\x01\x40\x01"));
        // Another handshake type first.
        assert!(malformed(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"));
        // Another record type after the first handshake record.
        let mut split = records(&good, 10);
        split[15] = 23;
        assert!(malformed(&split));
        // The handshake length shorter than what the record carries.
        let mut short = good.clone();
        short[3] -= 1;
        assert!(malformed(&records(&short, MAX_FRAGMENT_LEN)));
        // Body fields that overrun or leave bytes behind.
        let body_ok = body(Some(sni(&[(0, b"a.example")])));
        for (what, body) in [
            ("truncated random", body_ok[..20].to_vec()),
            ("session id over 32", {
                let mut b = body_ok.clone();
                b[34] = 33;
                b
            }),
            ("odd suites", {
                let mut b = body_ok.clone();
                b[68] = 3;
                b
            }),
            ("trailing byte", [body_ok.clone(), vec![0]].concat()),
            ("extensions overrun", {
                let mut b = body_ok.clone();
                let at = 2 + 32 + 33 + 6 + 2;
                b[at + 1] += 1;
                b
            }),
        ] {
            assert!(malformed(&records(&message(&body), 100)), "{what}");
        }
        // Random bytes behind a valid record header are refused, never a panic.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            let mut wire = vec![22, 3, 1, 0, 60, 1, 0, 0, 56];
            for _ in 0..56 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                wire.push(seed as u8);
            }
            assert!(parse(&wire).is_err() || parse(&wire) == Ok(None));
        }
    }

    #[test]
    fn oversize_is_refused_from_the_length_fields() {
        // Announced longer than the bound: refused at once, before the bytes come.
        let header = [22, 3, 1, 0x40, 0x00, 1, 0x00, 0x40, 0x00];
        assert!(matches!(parse(&header), Err(HelloError::TooLarge { .. })));
        // Within the bound, but over too many records.
        let msg = message(&body(Some(sni(&[(0, b"a.example")]))));
        let wire = records(&msg, 4);
        assert!(msg.len() / 4 > MAX_RECORDS);
        assert!(matches!(parse(&wire), Err(HelloError::TooLarge { .. })));
        // The largest allowed hello parses, over two records.
        let pad = extension(0x0015, &vec![0; MAX_HELLO_LEN - 200]);
        let big_body = body(Some([pad, sni(&[(0, b"a.example")])].concat()));
        let mut big = message(&big_body);
        let fill = MAX_HELLO_LEN - big.len();
        let pad = extension(0x0015, &vec![0; MAX_HELLO_LEN - 200 + fill]);
        big = message(&body(Some([pad, sni(&[(0, b"a.example")])].concat())));
        assert_eq!(big.len(), MAX_HELLO_LEN);
        let wire = records(&big, MAX_FRAGMENT_LEN);
        assert!(wire.len() <= MAX_BUFFERED);
        assert_eq!(
            parse(&wire).unwrap().unwrap().server_name,
            name("a.example")
        );
        let over = message(&body(Some(
            [
                extension(0x0015, &vec![0; MAX_HELLO_LEN]),
                sni(&[(0, b"a.example")]),
            ]
            .concat(),
        )));
        assert!(matches!(
            parse(&records(&over, MAX_FRAGMENT_LEN)),
            Err(HelloError::TooLarge { .. })
        ));
    }
}
