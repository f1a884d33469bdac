//! The strict CONNECT request an ingress proxy accepts (RFC 9110 section 9.3.6, RFC 9112), on
//! top of the generic head parser of [`crate::http`].
//!
//! ```text
//! CONNECT authority SP HTTP/1.x CRLF     method exactly "CONNECT" (else 405, Allow: CONNECT)
//!                                       authority-form only: host ":" port (else 400)
//! Host: ...                             exactly one for HTTP/1.1, at most one for 1.0
//! X-Gardener-Destination: ...           any other header lines
//! CRLF                                  the head ends here; later bytes are not looked at
//! ```
//!
//! Refused, with the status [`RequestError::status`] gives: a first byte that cannot begin a
//! request line (400 at once, not at the header timeout: a TLS handshake or a PROXY v2 header
//! sent to the wrong listener, named as such in the error), a request line longer than
//! [`MAX_REQUEST_LINE_LEN`] (414), a head over [`MAX_HEAD_LEN`] or with more than
//! [`MAX_HEADERS`] lines (431), whitespace between a field name and its colon, obsolete line
//! folding, bare CR or LF (400), a method other than `CONNECT` (405), a request-target not in
//! authority form (400), a `Content-Length` other than a single `0` or any
//! `Transfer-Encoding` (400: a CONNECT request has no content, and framing a body we would
//! not read is how request smuggling starts), a missing, repeated or invalid `Host` (400).
//!
//! [`parse_connect_request`] returns `Ok(None)` while the head is incomplete and within
//! bounds, so a caller can feed it a growing buffer; on success it reports exactly how many
//! bytes the head used.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{find_header, is_token_byte, parse_request_head, Header, HttpError, HttpVersion};
#[cfg(doc)]
use super::{MAX_HEADERS, MAX_HEAD_LEN};

/// Longest request line accepted, CRLF excluded. An authority is at most a 253-byte name, a
/// colon and five digits, so this leaves ample room while keeping a 414 distinct from a 431.
pub const MAX_REQUEST_LINE_LEN: usize = 2048;

/// The one method a CONNECT proxy serves (sent in `Allow` with a 405).
pub const CONNECT: &str = "CONNECT";

/// Host in an authority-form request-target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A registered name (letters, digits, `-`, `_`, `~` in dot-separated non-empty labels,
    /// perhaps with the final dot of an absolute name), as sent.
    Name(String),
    /// A dotted-quad IPv4 literal.
    Ipv4(Ipv4Addr),
    /// A bracketed IPv6 literal.
    Ipv6(Ipv6Addr),
}

/// An authority-form request-target: `host ":" port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// The host.
    pub host: Host,
    /// The port, 1 to 65535.
    pub port: u16,
}

impl Authority {
    /// Parses `host:port`, `a.b.c.d:port` or `[v6]:port`; no userinfo, no percent-encoding,
    /// no empty labels, no port 0 and no leading zeros in the port.
    pub fn parse(target: &str) -> Result<Self, RequestError> {
        let bad = RequestError::Target;
        let (host, port) = target.rsplit_once(':').ok_or(bad.clone())?;
        let port = parse_port(port).ok_or(bad.clone())?;
        let host = if let Some(inner) = host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(bad.clone())?;
            Host::Ipv6(inner.parse().map_err(|_| bad.clone())?)
        } else if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            // All digits and dots: must be a valid dotted quad (std rejects leading zeros).
            Host::Ipv4(host.parse().map_err(|_| bad.clone())?)
        } else {
            if !is_reg_name(host) {
                return Err(bad);
            }
            Host::Name(host.to_owned())
        };
        Ok(Self { host, port })
    }
}

impl std::fmt::Display for Authority {
    /// `host:port`, an IPv6 literal in brackets: the request-target as it was sent.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{name}:{}", self.port),
            Host::Ipv4(a) => write!(f, "{a}:{}", self.port),
            Host::Ipv6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// A CONNECT request head that passed every check of the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectHead {
    /// Version of the request line.
    pub version: HttpVersion,
    /// The request-target. Routing never uses it (the routing header does).
    pub authority: Authority,
    /// Header lines in order.
    pub headers: Vec<Header>,
}

impl ConnectHead {
    /// The values of every header named `name` (case-insensitive), in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |h| h.is(name))
            .map(|h| h.value.as_str())
    }
}

/// Parses a CONNECT request head from the start of `buf`.
///
/// `Ok(None)`: incomplete and within bounds, read more. `Ok(Some((head, len)))`: the head is
/// `buf[..len]`; whatever follows is the client's tunnel payload, never parsed here.
pub fn parse_connect_request(buf: &[u8]) -> Result<Option<(ConnectHead, usize)>, RequestError> {
    // What cannot begin a request line is refused at its first byte, not left to time out:
    // a TLS handshake, or a PROXY v2 header, sent to this listener by mistake.
    if let Some(&first) = buf.first().filter(|&&b| !is_token_byte(b)) {
        return Err(RequestError::NotHttp {
            first,
            looks_like: looks_like(buf),
        });
    }
    // The request line must end within its bound, whatever else has arrived.
    let window = &buf[..buf.len().min(MAX_REQUEST_LINE_LEN + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) if end > MAX_REQUEST_LINE_LEN => return Err(too_long_line()),
        None if buf.len() >= MAX_REQUEST_LINE_LEN + 2 => return Err(too_long_line()),
        _ => {}
    }
    // A bare CR or LF inside the head is refused now, not left to time out.
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |i| i + 4);
    if has_bare_line_break(&buf[..head_end]) {
        return Err(RequestError::Head(HttpError::BareLineBreak));
    }
    let Some((head, len)) = parse_request_head(buf)? else {
        return Ok(None);
    };
    if head.method != CONNECT {
        return Err(RequestError::Method {
            method: head.method,
        });
    }
    let authority = Authority::parse(&head.target)?;
    check_no_body(&head.headers)?;
    check_host(head.version, &head.headers)?;
    Ok(Some((
        ConnectHead {
            version: head.version,
            authority,
            headers: head.headers,
        },
        len,
    )))
}

/// What bytes that cannot begin a request probably are, for the log line.
fn looks_like(buf: &[u8]) -> &'static str {
    if buf.first() == Some(&0x16) {
        "a TLS handshake (a TLS client pointed at a CONNECT listener?)"
    } else if crate::proxy_protocol::V2_SIGNATURE.starts_with(&buf[..buf.len().min(12)]) {
        "a PROXY v2 header (this listener takes none, or one only from its trusted proxies)"
    } else {
        "not an HTTP request"
    }
}

/// An LF not preceded by CR, or a CR followed by anything but LF (a CR at the very end may
/// still be completed).
fn has_bare_line_break(head: &[u8]) -> bool {
    head.iter().enumerate().any(|(i, &b)| match b {
        b'\n' => i == 0 || head[i - 1] != b'\r',
        b'\r' => head.get(i + 1).is_some_and(|&next| next != b'\n'),
        _ => false,
    })
}

fn too_long_line() -> RequestError {
    RequestError::RequestLineTooLong {
        max: MAX_REQUEST_LINE_LEN,
    }
}

/// RFC 9110 section 9.3.6: a CONNECT request has no content. `Content-Length: 0` (once) says
/// so explicitly and is tolerated; anything else would frame a body.
fn check_no_body(headers: &[Header]) -> Result<(), RequestError> {
    if headers.iter().any(|h| h.is("transfer-encoding")) {
        return Err(RequestError::Body {
            header: "Transfer-Encoding",
        });
    }
    let mut lengths = headers.iter().filter(|h| h.is("content-length"));
    match (lengths.next(), lengths.next()) {
        (None, _) => Ok(()),
        (Some(h), None) if h.value == "0" => Ok(()),
        _ => Err(RequestError::Body {
            header: "Content-Length",
        }),
    }
}

/// RFC 9112 section 3.2: 400 for an HTTP/1.1 request without `Host`, for more than one
/// `Host` line, and for an invalid `Host` value.
fn check_host(version: HttpVersion, headers: &[Header]) -> Result<(), RequestError> {
    let count = headers.iter().filter(|h| h.is("host")).count();
    if count > 1 {
        return Err(RequestError::Host { reason: "repeated" });
    }
    if count == 0 && version == HttpVersion::Http11 {
        return Err(RequestError::Host { reason: "missing" });
    }
    if let Some(value) = find_header(headers, "host") {
        let ok = !value.is_empty()
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b));
        if !ok {
            return Err(RequestError::Host { reason: "invalid" });
        }
    }
    Ok(())
}

/// 1 to 5 decimal digits, no leading zero, 1..=65535.
fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A registered name restricted to unreserved characters in non-empty dot-separated labels,
/// at most 253 bytes besides an optional final dot (no percent-encoding, no sub-delimiters).
/// The final dot of an absolute name is taken: Gardener's `ENDPOINT` ends in one, and OpenVPN
/// sends it as configured in the request-target and `Host`.
fn is_reg_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_~".contains(&b))
        })
}

/// An HTTP status line: code and reason phrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Three-digit code.
    pub code: u16,
    /// Reason phrase.
    pub reason: &'static str,
}

impl Status {
    /// 200, the tunnel is open.
    pub const ESTABLISHED: Status = Status::new(200, "Connection established");
    /// 400.
    pub const BAD_REQUEST: Status = Status::new(400, "Bad Request");
    /// 403: the client address is not on the target's allow-list.
    pub const FORBIDDEN: Status = Status::new(403, "Forbidden");
    /// 405: not a CONNECT.
    pub const METHOD_NOT_ALLOWED: Status = Status::new(405, "Method Not Allowed");
    /// 408: the head did not arrive within the header deadline.
    pub const REQUEST_TIMEOUT: Status = Status::new(408, "Request Timeout");
    /// 414: request line too long.
    pub const URI_TOO_LONG: Status = Status::new(414, "URI Too Long");
    /// 431: header section too large.
    pub const HEADERS_TOO_LARGE: Status = Status::new(431, "Request Header Fields Too Large");
    /// 502: the upstream failed.
    pub const BAD_GATEWAY: Status = Status::new(502, "Bad Gateway");
    /// 503: the upstream cannot be reached (Envoy's answer to a connect failure).
    pub const SERVICE_UNAVAILABLE: Status = Status::new(503, "Service Unavailable");
    /// 504: connecting upstream took too long.
    pub const GATEWAY_TIMEOUT: Status = Status::new(504, "Gateway Timeout");

    const fn new(code: u16, reason: &'static str) -> Self {
        Self { code, reason }
    }

    /// Appends the response head: for 200 only the status line; for every refusal also
    /// `Content-Length: 0` and `Connection: close`, and `Allow: CONNECT` with a 405.
    pub fn encode(self, out: &mut Vec<u8>) {
        let mut head = format!("HTTP/1.1 {:03} {}\r\n", self.code, self.reason);
        if self.code != 200 {
            if self.code == 405 {
                head.push_str("Allow: CONNECT\r\n");
            }
            head.push_str("Content-Length: 0\r\nConnection: close\r\n");
        }
        head.push_str("\r\n");
        out.extend_from_slice(head.as_bytes());
    }
}

/// Why a CONNECT request is refused; [`RequestError::status`] is the answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The head is malformed or too large.
    #[error(transparent)]
    Head(#[from] HttpError),
    /// No CRLF within [`MAX_REQUEST_LINE_LEN`] bytes.
    #[error("request line longer than {max} bytes")]
    RequestLineTooLong {
        /// The bound.
        max: usize,
    },
    /// The method is not `CONNECT` (methods are case-sensitive).
    #[error("method {method:?} is not CONNECT")]
    Method {
        /// The method token.
        method: String,
    },
    /// The first byte cannot begin a request line (it is no token character).
    #[error("no HTTP request: first byte {first:#04x}, {looks_like}")]
    NotHttp {
        /// The byte.
        first: u8,
        /// What the bytes probably are.
        looks_like: &'static str,
    },
    /// The request-target is not in authority form.
    #[error("request-target is not host:port")]
    Target,
    /// The request would carry content.
    #[error("CONNECT request with {header}")]
    Body {
        /// The header that frames the content.
        header: &'static str,
    },
    /// The `Host` header is missing, repeated or invalid.
    #[error("Host header {reason}")]
    Host {
        /// What is wrong.
        reason: &'static str,
    },
}

impl RequestError {
    /// The response this refusal gets.
    pub fn status(&self) -> Status {
        match self {
            Self::Head(HttpError::HeadTooLong { .. } | HttpError::TooManyHeaders { .. }) => {
                Status::HEADERS_TOO_LARGE
            }
            Self::RequestLineTooLong { .. } => Status::URI_TOO_LONG,
            Self::Method { .. } => Status::METHOD_NOT_ALLOWED,
            _ => Status::BAD_REQUEST,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_HEADERS, MAX_HEAD_LEN};
    use super::*;

    fn parse(raw: &[u8]) -> Result<Option<(ConnectHead, usize)>, RequestError> {
        parse_connect_request(raw)
    }

    #[test]
    fn an_authority_prints_as_it_was_sent() {
        for target in ["kubelet.example:10250", "10.250.0.5:10250", "[fd00::5]:443"] {
            assert_eq!(Authority::parse(target).unwrap().to_string(), target);
        }
    }

    #[test]
    fn an_absolute_name_keeps_its_final_dot_and_one_dot_only() {
        // What OpenVPN sends for Gardener's `ENDPOINT` (the internal domain, with its dot).
        let raw = b"CONNECT api.p.s.internal.example.com.:1194 HTTP/1.0\r\nHost: api.p.s.internal.example.com.\r\n\r\n";
        let (head, _) = parse(raw).unwrap().unwrap();
        assert_eq!(
            head.authority.host,
            Host::Name("api.p.s.internal.example.com.".into())
        );
        assert_eq!(
            head.authority.to_string(),
            "api.p.s.internal.example.com.:1194"
        );
        for bad in ["a..:1", ".:1", "a..b:1", ".a:1"] {
            assert_eq!(Authority::parse(bad), Err(RequestError::Target), "{bad}");
        }
    }

    fn status_of(raw: &[u8]) -> u16 {
        match parse(raw) {
            Err(e) => e.status().code,
            Ok(Some(_)) => 200,
            Ok(None) => 0,
        }
    }

    #[test]
    fn accepts_openvpn_request_and_reports_head_length() {
        let raw = b"CONNECT 10.0.0.1:1194 HTTP/1.0\r\nReversed-VPN: outbound|1194||x\r\nHost: 10.0.0.1\r\n\r\nTUNNEL";
        let (head, len) = parse(raw).unwrap().unwrap();
        assert_eq!(&raw[len..], b"TUNNEL");
        assert_eq!(head.authority.host, Host::Ipv4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(head.authority.port, 1194);
        assert_eq!(
            head.header_values("reversed-vpn").collect::<Vec<_>>(),
            ["outbound|1194||x"]
        );
    }

    #[test]
    fn strictness_statuses() {
        let cases: [(&[u8], u16); 18] = [
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nX-A : b\r\n\r\n", 400),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
            (b"connect a:1 HTTP/1.1\r\nHost: a\r\n\r\n", 405),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", 400),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 200),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 400),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"CONNECT /path HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT http://a:1/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT u@a:1 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT a:01 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT a%41:1 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT a:1 HTTP/1.1\r\n\r\n", 400),
            (b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT a:1 HTTP/1.0\r\n\r\n", 200),
            (b"CONNECT a:1 HTTP/1.0\nHost: a\n", 400),
            (b"CONNECT [fd00::1]:443 HTTP/1.1\r\nHost: [fd00::1]:443\r\n\r\n", 200),
        ];
        for (raw, want) in cases {
            assert_eq!(status_of(raw), want, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn second_proxy_header_is_bad_http() {
        let mut v2 = crate::proxy_protocol::V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        assert_eq!(status_of(&v2), 400);
        assert_eq!(
            status_of(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nCONNECT a:1 HTTP/1.0\r\n\r\n"),
            400
        );
    }

    #[test]
    fn what_cannot_begin_a_request_is_refused_at_its_first_byte() {
        let tls = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
        let v2 = &crate::proxy_protocol::V2_SIGNATURE[..3];
        for (raw, looks) in [
            (&tls[..1], "a TLS handshake"),
            (&tls[..], "a TLS handshake"),
            (v2, "a PROXY v2 header"),
            (b"\r\nCONNECT a:1 HTTP/1.0\r\n\r\n", "not an HTTP request"),
            (b" CONNECT", "not an HTTP request"),
            (&[0xc3, 0xa4][..], "not an HTTP request"),
        ] {
            let err = parse(raw).expect_err("refused at once");
            assert_eq!(err.status(), Status::BAD_REQUEST, "{raw:?}");
            assert!(
                matches!(err, RequestError::NotHttp { first, .. } if first == raw[0]),
                "{raw:?}: {err:?}"
            );
            assert!(err.to_string().contains(looks), "{raw:?}: {err}");
        }
    }

    #[test]
    fn bounds() {
        let mut line = b"CONNECT ".to_vec();
        line.resize(MAX_REQUEST_LINE_LEN + 2, b'a');
        assert_eq!(status_of(&line), 414);
        let mut head = b"CONNECT a:1 HTTP/1.0\r\n".to_vec();
        while head.len() < MAX_HEAD_LEN {
            head.extend_from_slice(b"X-Pad: 0123456789012345678901234567890123456789\r\n");
        }
        assert_eq!(status_of(&head), 431);
        let mut many = b"CONNECT a:1 HTTP/1.0\r\n".to_vec();
        for _ in 0..=MAX_HEADERS {
            many.extend_from_slice(b"A: b\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(status_of(&many), 431);
    }

    #[test]
    fn incomplete_needs_more() {
        let raw = b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..raw.len() {
            assert_eq!(parse(&raw[..cut]), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn refusal_encoding() {
        let mut out = Vec::new();
        Status::METHOD_NOT_ALLOWED.encode(&mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 405 Method Not Allowed\r\nAllow: CONNECT\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        out.clear();
        Status::ESTABLISHED.encode(&mut out);
        assert_eq!(out, b"HTTP/1.1 200 Connection established\r\n\r\n");
    }
}
