//! The HTTP/1.x subset a CONNECT proxy exchange needs, without I/O: encode the request the
//! OpenVPN client sends (reference section 13), parse the proxy's response head, and, for the
//! acceptor, parse a request head and encode a response head.
//!
//! A message head is a start line, header lines and an empty line, every line ending in CRLF:
//!
//! ```text
//! CONNECT host:port HTTP/1.1\r\n        request line   (or "HTTP/1.1 200 Connection established\r\n")
//! Name: value\r\n                       zero or more header lines
//! \r\n                                  end of head; what follows belongs to the tunnel
//! ```
//!
//! Parsing is strict and bounded: bare LF, obsolete line folding, control bytes, header names
//! outside the RFC 9110 token set, more than [`MAX_HEADERS`] headers or a head longer than
//! [`MAX_HEAD_LEN`] are errors. "Need more bytes" (`Ok(None)`) is distinct from "malformed"
//! (`Err`). Nothing here can panic on any input.

use base64::Engine as _;

pub mod connect;
pub mod route;

/// Longest message head (start line, headers, blank line) either side accepts, in bytes.
pub const MAX_HEAD_LEN: usize = 8192;

/// Most header lines either side accepts in one head.
pub const MAX_HEADERS: usize = 64;

/// Most `http-proxy-option CUSTOM-HEADER` lines upstream accepts (`MAX_CUSTOM_HTTP_HEADER`).
pub const MAX_CUSTOM_HTTP_HEADER: usize = 10;

/// HTTP version on the CONNECT request line (`http-proxy-option VERSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpVersion {
    /// `HTTP/1.0`: upstream's default.
    #[default]
    Http10,
    /// `HTTP/1.1`.
    Http11,
}

impl HttpVersion {
    /// The protocol token, e.g. `HTTP/1.0`.
    pub const fn as_str(self) -> &'static str {
        match self {
            HttpVersion::Http10 => "HTTP/1.0",
            HttpVersion::Http11 => "HTTP/1.1",
        }
    }

    fn parse(token: &[u8]) -> Option<Self> {
        match token {
            b"HTTP/1.0" => Some(HttpVersion::Http10),
            b"HTTP/1.1" => Some(HttpVersion::Http11),
            _ => None,
        }
    }
}

/// One `http-proxy-option CUSTOM-HEADER` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CustomHeader {
    /// `CUSTOM-HEADER name content`: sent as `name: content`.
    NameValue {
        /// Header name.
        name: String,
        /// Header value.
        value: String,
    },
    /// `CUSTOM-HEADER token` (one argument): the token is sent verbatim as the whole line.
    Line(String),
}

impl CustomHeader {
    /// Whether this line is a `Host` header (then the request carries no `Host:` of its own).
    pub fn is_host(&self) -> bool {
        match self {
            CustomHeader::NameValue { name, .. } => name.eq_ignore_ascii_case("host"),
            CustomHeader::Line(line) => line
                .as_bytes()
                .get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"host:")),
        }
    }
}

/// Credentials for `Proxy-Authorization: Basic`.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Everything that goes into the CONNECT request (reference section 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Server host as configured (`remote HOST`), sent verbatim: a name or an address literal.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// The rest of the request: version and headers.
    pub options: ConnectOptions,
}

/// What a CONNECT request carries besides its target: the `http-proxy-option`s. The default
/// is upstream's (HTTP/1.0, no extra headers).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectOptions {
    /// Request-line version (`http-proxy-option VERSION`); upstream defaults to HTTP/1.0.
    pub version: HttpVersion,
    /// Custom headers (`http-proxy-option CUSTOM-HEADER`), sent in this order before `Host`.
    pub custom_headers: Vec<CustomHeader>,
    /// `User-Agent` value, sent only when set (`http-proxy-option AGENT`).
    pub user_agent: Option<String>,
    /// Basic proxy authentication, sent only when set.
    pub basic_auth: Option<BasicAuth>,
}

impl ConnectOptions {
    /// The request for `host:port` with these options.
    pub fn request(&self, host: impl Into<String>, port: u16) -> ConnectRequest {
        ConnectRequest {
            host: host.into(),
            port,
            options: self.clone(),
        }
    }
}

impl ConnectRequest {
    /// A request for `host:port` with upstream's defaults (HTTP/1.0, no extra headers).
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        ConnectOptions::default().request(host, port)
    }

    /// Appends the request bytes to `out`.
    ///
    /// Fails if a field would break the message (CR, LF or another control byte in it, an
    /// empty host, a header name that is not a token, more than [`MAX_CUSTOM_HTTP_HEADER`]
    /// custom headers or a request longer than [`MAX_HEAD_LEN`]); `out` is unchanged then.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), HttpError> {
        if self.host.is_empty() || !self.host.bytes().all(is_target_byte) {
            return Err(HttpError::InvalidField { field: "host" });
        }
        if self.options.custom_headers.len() > MAX_CUSTOM_HTTP_HEADER {
            return Err(HttpError::TooManyCustomHeaders {
                count: self.options.custom_headers.len(),
                max: MAX_CUSTOM_HTTP_HEADER,
            });
        }
        let mut head = format!(
            "CONNECT {}:{} {}\r\n",
            self.host,
            self.port,
            self.options.version.as_str()
        );
        for header in &self.options.custom_headers {
            match header {
                CustomHeader::NameValue { name, value } => {
                    check_name(name.as_bytes(), "custom header name")?;
                    check_value(value.as_bytes(), "custom header value")?;
                    push_header(&mut head, name, value);
                }
                CustomHeader::Line(line) => {
                    if line.is_empty() {
                        return Err(HttpError::InvalidField {
                            field: "custom header line",
                        });
                    }
                    check_value(line.as_bytes(), "custom header line")?;
                    head.push_str(line);
                    head.push_str("\r\n");
                }
            }
        }
        if !self
            .options
            .custom_headers
            .iter()
            .any(CustomHeader::is_host)
        {
            push_header(&mut head, "Host", &self.host);
        }
        if let Some(agent) = &self.options.user_agent {
            check_value(agent.as_bytes(), "user agent")?;
            push_header(&mut head, "User-Agent", agent);
        }
        if let Some(auth) = &self.options.basic_auth {
            // The credentials travel base64-encoded, so only the colon rule matters for the user.
            if auth.user.contains(':') {
                return Err(HttpError::InvalidField {
                    field: "proxy user",
                });
            }
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", auth.user, auth.password));
            push_header(&mut head, "Proxy-Authorization", &format!("Basic {token}"));
        }
        head.push_str("\r\n");
        if head.len() > MAX_HEAD_LEN {
            return Err(HttpError::HeadTooLong { max: MAX_HEAD_LEN });
        }
        out.extend_from_slice(head.as_bytes());
        Ok(())
    }

    /// The request as bytes; see [`ConnectRequest::encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, HttpError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

fn push_header(head: &mut String, name: &str, value: &str) {
    head.push_str(name);
    head.push_str(": ");
    head.push_str(value);
    head.push_str("\r\n");
}

/// What a head parser returns: `Ok(None)` while the head is incomplete, else the head and the
/// number of bytes it took.
pub type HeadResult<T> = Result<Option<(T, usize)>, HttpError>;

/// One parsed header line. Names keep their case; compare with [`Header::is`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name (a token).
    pub name: String,
    /// Value with surrounding spaces and tabs removed.
    pub value: String,
}

impl Header {
    /// Case-insensitive name comparison.
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// First header named `name` (case-insensitive) in `headers`.
pub fn find_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.is(name))
        .map(|h| h.value.as_str())
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Version of the status line.
    pub version: HttpVersion,
    /// Three-digit status code.
    pub status: u16,
    /// Reason phrase (may be empty).
    pub reason: String,
    /// Header lines in order.
    pub headers: Vec<Header>,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method token, e.g. `CONNECT`.
    pub method: String,
    /// Request target, e.g. `10.0.0.1:1194`.
    pub target: String,
    /// Version of the request line.
    pub version: HttpVersion,
    /// Header lines in order.
    pub headers: Vec<Header>,
}

impl RequestHead {
    /// The target of a CONNECT as host and port (`host:port` or `[v6]:port`).
    pub fn authority(&self) -> Result<(&str, u16), HttpError> {
        let bad = HttpError::InvalidField {
            field: "request target",
        };
        let (host, port) = self.target.rsplit_once(':').ok_or(bad.clone())?;
        let port = port.parse::<u16>().map_err(|_| bad.clone())?;
        let host = match host.strip_prefix('[') {
            Some(rest) => rest.strip_suffix(']').ok_or(bad.clone())?,
            None => host,
        };
        if host.is_empty() {
            return Err(bad);
        }
        Ok((host, port))
    }
}

/// Parses a response head from the start of `buf`.
///
/// `Ok(None)`: the blank line has not arrived yet and `buf` is still under [`MAX_HEAD_LEN`].
/// `Ok(Some((head, len)))`: the head took `buf[..len]`; the rest is tunnel payload.
pub fn parse_response_head(buf: &[u8]) -> HeadResult<ResponseHead> {
    let Some((start, headers, len)) = split_head(buf)? else {
        return Ok(None);
    };
    // status-line = HTTP-version SP 3DIGIT SP [reason-phrase]
    let mut parts = start.splitn(3, |&b| b == b' ');
    let version = parts.next().and_then(HttpVersion::parse);
    let code = parts.next().unwrap_or_default();
    let reason = parts.next().unwrap_or_default();
    let Some(version) = version else {
        return Err(HttpError::BadStartLine);
    };
    if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
        return Err(HttpError::BadStartLine);
    }
    let status = code
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    if !reason.iter().copied().all(is_value_byte) {
        return Err(HttpError::BadStartLine);
    }
    Ok(Some((
        ResponseHead {
            version,
            status,
            reason: ascii_string(reason),
            headers,
        },
        len,
    )))
}

/// Parses a request head from the start of `buf`; see [`parse_response_head`] for the result.
pub fn parse_request_head(buf: &[u8]) -> HeadResult<RequestHead> {
    let Some((start, headers, len)) = split_head(buf)? else {
        return Ok(None);
    };
    // request-line = method SP request-target SP HTTP-version
    let parts: Vec<&[u8]> = start.split(|&b| b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(HttpError::BadStartLine);
    };
    let Some(version) = HttpVersion::parse(version) else {
        return Err(HttpError::BadStartLine);
    };
    if method.is_empty() || !method.iter().copied().all(is_token_byte) {
        return Err(HttpError::BadStartLine);
    }
    if target.is_empty() || !target.iter().copied().all(is_target_byte) {
        return Err(HttpError::BadStartLine);
    }
    Ok(Some((
        RequestHead {
            method: ascii_string(method),
            target: ascii_string(target),
            version,
            headers,
        },
        len,
    )))
}

/// Appends a response head with no headers: `HTTP/1.1 <status> <reason>\r\n\r\n`.
pub fn encode_response(status: u16, reason: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(format!("HTTP/1.1 {status:03} {reason}\r\n\r\n").as_bytes());
}

/// Splits a head into its start line, parsed headers and total length.
#[allow(clippy::type_complexity)]
fn split_head(buf: &[u8]) -> Result<Option<(&[u8], Vec<Header>, usize)>, HttpError> {
    let Some(end) = find_head_end(buf) else {
        if buf.len() >= MAX_HEAD_LEN {
            return Err(HttpError::HeadTooLong { max: MAX_HEAD_LEN });
        }
        return Ok(None);
    };
    let len = end + 4;
    if len > MAX_HEAD_LEN {
        return Err(HttpError::HeadTooLong { max: MAX_HEAD_LEN });
    }
    // `end` is the index of the final "\r\n\r\n"; the lines are buf[..end] split on CRLF.
    let text = &buf[..end];
    let mut lines = split_crlf(text);
    let start = lines.next().unwrap_or_default();
    if start.contains(&b'\n') || start.contains(&b'\r') {
        return Err(HttpError::BareLineBreak);
    }
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(HttpError::TooManyHeaders { max: MAX_HEADERS });
        }
        headers.push(parse_header_line(line)?);
    }
    Ok(Some((start, headers, len)))
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

fn split_crlf(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let cur = rest?;
        match cur.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                rest = cur.get(i + 2..);
                cur.get(..i)
            }
            None => {
                rest = None;
                Some(cur)
            }
        }
    })
}

fn parse_header_line(line: &[u8]) -> Result<Header, HttpError> {
    if line.contains(&b'\r') || line.contains(&b'\n') {
        return Err(HttpError::BareLineBreak);
    }
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(HttpError::BadHeader {
            reason: "obsolete line folding",
        });
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(HttpError::BadHeader { reason: "no colon" });
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // RFC 9112 section 5.1: whitespace between the name and the colon must be rejected (400),
    // never stripped: a downstream parser might read a different name.
    if name.last().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(HttpError::BadHeader {
            reason: "whitespace before colon",
        });
    }
    if name.is_empty() || !name.iter().copied().all(is_token_byte) {
        return Err(HttpError::BadHeader {
            reason: "name is not a token",
        });
    }
    if !value.iter().copied().all(is_value_byte) {
        return Err(HttpError::BadHeader {
            reason: "control byte in value",
        });
    }
    let value = value.trim_ascii();
    Ok(Header {
        name: ascii_string(name),
        value: ascii_string(value),
    })
}

/// tchar of RFC 9110 section 5.6.2.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII, space and tab (field values, reason phrases).
fn is_value_byte(b: u8) -> bool {
    b == b'\t' || (0x20..0x7f).contains(&b)
}

/// Visible ASCII without space (request targets and hosts).
fn is_target_byte(b: u8) -> bool {
    (0x21..0x7f).contains(&b)
}

fn check_name(name: &[u8], field: &'static str) -> Result<(), HttpError> {
    if name.is_empty() || !name.iter().copied().all(is_token_byte) {
        return Err(HttpError::InvalidField { field });
    }
    Ok(())
}

fn check_value(value: &[u8], field: &'static str) -> Result<(), HttpError> {
    if !value.iter().copied().all(is_value_byte) {
        return Err(HttpError::InvalidField { field });
    }
    Ok(())
}

/// Only called on bytes already checked to be ASCII.
fn ascii_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// A malformed or oversized HTTP head, or a request that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The head is longer than the bound.
    #[error("HTTP head longer than {max} bytes")]
    HeadTooLong {
        /// The bound ([`MAX_HEAD_LEN`]).
        max: usize,
    },
    /// More header lines than the bound.
    #[error("more than {max} HTTP header lines")]
    TooManyHeaders {
        /// The bound ([`MAX_HEADERS`]).
        max: usize,
    },
    /// The request or status line does not have the expected shape.
    #[error("malformed HTTP start line")]
    BadStartLine,
    /// A CR or LF that is not part of a CRLF line end.
    #[error("bare CR or LF in HTTP head")]
    BareLineBreak,
    /// A header line is malformed.
    #[error("malformed HTTP header line: {reason}")]
    BadHeader {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configured field cannot be sent (control bytes, empty, not a token).
    #[error("invalid {field} for the CONNECT request")]
    InvalidField {
        /// Which field.
        field: &'static str,
    },
    /// More custom headers than upstream allows.
    #[error("{count} custom headers configured, at most {max} allowed")]
    TooManyCustomHeaders {
        /// How many were configured.
        count: usize,
        /// The bound ([`MAX_CUSTOM_HTTP_HEADER`]).
        max: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference section 13: observed with `http-proxy 127.0.0.1 8080`, `VERSION 1.1`,
    /// `AGENT TestAgent/1.0`, `CUSTOM-HEADER X-Custom-Header hello-world`,
    /// `CUSTOM-HEADER "X-Single: one token"`, server `127.0.0.1 11940`.
    const SECTION_13_REQUEST: &[u8] = b"CONNECT 127.0.0.1:11940 HTTP/1.1\r\n\
X-Custom-Header: hello-world\r\n\
X-Single: one token\r\n\
Host: 127.0.0.1\r\n\
User-Agent: TestAgent/1.0\r\n\
\r\n";

    fn section_13() -> ConnectRequest {
        let mut req = ConnectRequest::new("127.0.0.1", 11940);
        req.options = ConnectOptions {
            version: HttpVersion::Http11,
            custom_headers: vec![
                CustomHeader::NameValue {
                    name: "X-Custom-Header".into(),
                    value: "hello-world".into(),
                },
                CustomHeader::Line("X-Single: one token".into()),
            ],
            user_agent: Some("TestAgent/1.0".into()),
            basic_auth: None,
        };
        req
    }

    #[test]
    fn request_matches_section_13_byte_for_byte() {
        assert_eq!(section_13().to_bytes().unwrap(), SECTION_13_REQUEST);
    }

    #[test]
    fn default_request_is_http_10_with_host_only() {
        let req = ConnectRequest::new("vpn.example", 1194);
        assert_eq!(
            req.to_bytes().unwrap(),
            b"CONNECT vpn.example:1194 HTTP/1.0\r\nHost: vpn.example\r\n\r\n"
        );
    }

    #[test]
    fn gardener_header_and_basic_auth() {
        let req = ConnectOptions {
            custom_headers: vec![CustomHeader::NameValue {
                name: "Reversed-VPN".into(),
                value: "outbound|1194||vpn-seed-server".into(),
            }],
            // "Aladdin:open sesame" is RFC 7617's example; its base64 is given there.
            basic_auth: Some(BasicAuth {
                user: "Aladdin".into(),
                password: "open sesame".into(),
            }),
            ..ConnectOptions::default()
        }
        .request("vpn-seed-server", 1194);
        assert_eq!(
            req.to_bytes().unwrap(),
            b"CONNECT vpn-seed-server:1194 HTTP/1.0\r\n\
Reversed-VPN: outbound|1194||vpn-seed-server\r\n\
Host: vpn-seed-server\r\n\
Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==\r\n\r\n"
        );
    }

    #[test]
    fn custom_host_replaces_the_generated_one() {
        for host in [
            CustomHeader::NameValue {
                name: "host".into(),
                value: "front.example".into(),
            },
            CustomHeader::Line("HOST: front.example".into()),
        ] {
            let req = ConnectOptions {
                custom_headers: vec![host],
                ..ConnectOptions::default()
            }
            .request("10.0.0.1", 443);
            let bytes = req.to_bytes().unwrap();
            let text = std::str::from_utf8(&bytes).unwrap();
            assert_eq!(text.to_ascii_lowercase().matches("host:").count(), 1);
            assert!(!text.contains("10.0.0.1\r\n"));
        }
    }

    #[test]
    fn header_injection_is_refused() {
        let mut req = ConnectRequest::new("a\r\nb", 1);
        assert_eq!(
            req.to_bytes(),
            Err(HttpError::InvalidField { field: "host" })
        );
        req.host = "ok".into();
        req.options.custom_headers = vec![CustomHeader::NameValue {
            name: "X".into(),
            value: "v\r\nInjected: 1".into(),
        }];
        assert!(req.to_bytes().is_err());
        req.options.custom_headers = vec![CustomHeader::NameValue {
            name: "Bad Name".into(),
            value: "v".into(),
        }];
        assert!(req.to_bytes().is_err());
        req.options.custom_headers = vec![CustomHeader::Line("a".into()); 11];
        assert!(matches!(
            req.to_bytes(),
            Err(HttpError::TooManyCustomHeaders { count: 11, max: 10 })
        ));
    }

    #[test]
    fn parses_200_and_keeps_trailing_bytes() {
        let buf =
            b"HTTP/1.1 200 Connection established\r\nProxy-agent: tinyproxy/1.11.1\r\n\r\n\x00\x2a";
        let (head, len) = parse_response_head(buf).unwrap().unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.version, HttpVersion::Http11);
        assert_eq!(head.reason, "Connection established");
        assert_eq!(
            find_header(&head.headers, "PROXY-AGENT"),
            Some("tinyproxy/1.11.1")
        );
        assert_eq!(&buf[len..], b"\x00\x2a");
    }

    #[test]
    fn parses_error_status_with_empty_reason() {
        let (head, _) = parse_response_head(b"HTTP/1.0 403 \r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((head.status, head.reason.as_str()), (403, ""));
        let (head, _) = parse_response_head(b"HTTP/1.0 407\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.status, 407);
    }

    #[test]
    fn incomplete_heads_need_more_bytes() {
        let full = b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse_response_head(&full[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn malformed_responses_are_errors() {
        for bad in [
            &b"HTTP/2 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\nA: b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA: \x01\r\n\r\n",
            b"http/1.1 200 OK\r\n\r\n",
        ] {
            assert!(
                parse_response_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn size_bounds() {
        let mut endless = b"HTTP/1.1 200 OK\r\n".to_vec();
        endless.resize(MAX_HEAD_LEN, b'a');
        assert_eq!(
            parse_response_head(&endless),
            Err(HttpError::HeadTooLong { max: MAX_HEAD_LEN })
        );
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for _ in 0..=MAX_HEADERS {
            many.extend_from_slice(b"A: b\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_response_head(&many),
            Err(HttpError::TooManyHeaders { max: MAX_HEADERS })
        );
    }

    #[test]
    fn parses_the_section_13_request() {
        let (head, len) = parse_request_head(SECTION_13_REQUEST).unwrap().unwrap();
        assert_eq!(len, SECTION_13_REQUEST.len());
        assert_eq!(head.method, "CONNECT");
        assert_eq!(head.authority().unwrap(), ("127.0.0.1", 11940));
        assert_eq!(head.version, HttpVersion::Http11);
        assert_eq!(find_header(&head.headers, "x-single"), Some("one token"));
        assert_eq!(head.headers.len(), 4);
    }

    #[test]
    fn request_authority_forms() {
        let parse = |t: &str| {
            let raw = format!("CONNECT {t} HTTP/1.0\r\n\r\n");
            let (head, _) = parse_request_head(raw.as_bytes()).unwrap().unwrap();
            head.authority().map(|(h, p)| (h.to_owned(), p))
        };
        assert_eq!(parse("[fd00::1]:1194").unwrap(), ("fd00::1".into(), 1194));
        assert!(parse("host").is_err());
        assert!(parse("host:99999").is_err());
        assert!(parse(":1").is_err());
    }

    #[test]
    fn malformed_requests_are_errors() {
        for bad in [
            &b"CONNECT a:1\r\n\r\n"[..],
            b"CONNECT  a:1 HTTP/1.1\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1 x\r\n\r\n",
            b"CON(NECT a:1 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_request_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_encoding() {
        let mut out = Vec::new();
        encode_response(200, "Connection established", &mut out);
        assert_eq!(out, b"HTTP/1.1 200 Connection established\r\n\r\n");
    }
}
