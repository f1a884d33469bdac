//! The accepting side of the seed's ingress: one inbound connection up to a parsed CONNECT
//! head, with the client address the allow-lists must judge.
//!
//! ```text
//! accept ─► [PROXY header]        per listener (ProxyMode) and peer (ProxyMode::expect_from):
//!              │                  none; required from trusted load-balancer CIDRs (others
//!              │                  refused before a byte is read); or, per source, required
//!              │                  from the trusted CIDRs and forbidden from everyone else.
//!              │                  A header must be complete by `proxy_header_timeout`
//!              ▼
//!           CONNECT head          strict (protocol::http::connect), complete by
//!              │                  `header_timeout` (counted from accept), at most
//!              ▼                  MAX_HEAD_LEN bytes buffered
//!           Accepted { head, client, early }
//! ```
//!
//! [`accept_proxy`] is the first stage alone, for a listener whose protocol after the PROXY
//! header is not a CONNECT head (the router's TLS SNI listener): the same rules, deadlines and
//! counting, and the bytes read after the header handed back unparsed.
//!
//! Memory is bounded: the buffer never grows past the PROXY bound plus one read, then past
//! [`MAX_HEAD_LEN`]. Nothing after the head is parsed; the caller gets those bytes in
//! [`Accepted::early`] and forwards them only after it has accepted the request. A refused
//! request is answered with [`refuse`], which discards whatever else the client sends.
//!
//! The client address is the PROXY header's source when a `PROXY` command carried an inet
//! address, else the TCP peer; an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is reported as
//! IPv4 so IPv4 CIDRs match it.
//!
//! A PROXY header must describe a TCP connection (`ProxyHeader::check_tcp_listener`): version 2
//! `PROXY` only with `STREAM` over `AF_INET`/`AF_INET6`, `LOCAL` with anything, version 1 as
//! parsed. Any other header, like a malformed or missing one, is a protocol error: the
//! connection is closed unanswered ([`IngressError::Proxy`], no status), the caller logs its
//! one line, and [`proxy_headers_refused`] counts it.
//!
//! On a per-source listener ([`ProxyMode::FromTrusted`]) a peer outside the trusted networks
//! is served with its own address, and its first bytes must not be a PROXY header's start
//! (`PROXY ` or the version 2 signature): one that is would have the router judge an address
//! of the sender's choosing, so it is a protocol error too ([`IngressError::ProxyForbidden`],
//! closed unanswered, counted). Nothing else of those bytes is looked at before the CONNECT
//! parser reads them.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ipnet::IpNet;
use protocol::http::connect::{parse_connect_request, ConnectHead, RequestError, Status};
use protocol::http::MAX_HEAD_LEN;
use protocol::proxy_protocol::{self, ProxyError, ProxyHeader, DEFAULT_V2_MAX_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Default bound on the PROXY header's arrival, from accept.
pub const DEFAULT_PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on the whole CONNECT head's arrival, from accept.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// After a refusal, at most this much more input is read and discarded ...
pub const LINGER_BYTES: usize = 64 * 1024;
/// ... for at most this long, so the client reads the answer instead of a reset.
pub const LINGER_TIME: Duration = Duration::from_secs(2);

/// PROXY headers refused in this process: see [`proxy_headers_refused`].
static PROXY_HEADERS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many connections this process closed for their PROXY header (missing, malformed, not a
/// TCP connection's, or sent by a peer that may not send one), on every listener that takes
/// PROXY headers, since it started.
pub fn proxy_headers_refused() -> u64 {
    PROXY_HEADERS_REFUSED.load(Ordering::Relaxed)
}

/// Whether a listener expects a PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// No header: the client is the TCP peer (a PROXY header would be refused as bad HTTP).
    #[default]
    Off,
    /// Every connection must come from one of these load-balancer networks and start with a
    /// PROXY header; a connection from anywhere else is closed unread.
    Required {
        /// The load balancers' networks.
        trusted: Vec<IpNet>,
    },
    /// PROXY protocol per source, on one port: a connection from these load-balancer networks
    /// must start with a PROXY header; one from anywhere else must not (it is served with its
    /// TCP peer as the client, and a header from it is a protocol error).
    FromTrusted {
        /// The load balancers' networks.
        trusted: Vec<IpNet>,
    },
}

/// What a connection must start with, by its listener's [`ProxyMode`] and its peer
/// ([`ProxyMode::expect_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyExpect {
    /// The listener takes no PROXY header: the request starts at once (a header would be bad
    /// HTTP).
    Nothing,
    /// A trusted load balancer: a PROXY header, then the request.
    Header,
    /// An untrusted peer on a per-source listener: the request, which must not start like a
    /// PROXY header.
    NoHeader,
    /// An untrusted peer on a listener that requires a header: closed unread.
    Refuse,
}

impl ProxyMode {
    /// What a connection from `peer` must start with. `peer` is compared after
    /// [`canonical_ip`], so an IPv4-mapped peer on an IPv6 listener matches IPv4 networks.
    pub fn expect_from(&self, peer: IpAddr) -> ProxyExpect {
        let peer = canonical_ip(peer);
        let trusts = |nets: &[IpNet]| nets.iter().any(|net| net.contains(&peer));
        match self {
            ProxyMode::Off => ProxyExpect::Nothing,
            ProxyMode::Required { trusted } if trusts(trusted) => ProxyExpect::Header,
            ProxyMode::Required { .. } => ProxyExpect::Refuse,
            ProxyMode::FromTrusted { trusted } if trusts(trusted) => ProxyExpect::Header,
            ProxyMode::FromTrusted { .. } => ProxyExpect::NoHeader,
        }
    }
}

/// Deadlines of one accept, both counted from the start of [`accept_connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// The PROXY header must be complete by then.
    pub proxy_header: Duration,
    /// The CONNECT head must be complete by then.
    pub header: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            proxy_header: DEFAULT_PROXY_HEADER_TIMEOUT,
            header: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// A connection whose CONNECT head arrived and parsed.
#[derive(Debug)]
pub struct Accepted {
    /// The request.
    pub head: ConnectHead,
    /// The address to judge: the PROXY source or the TCP peer, IPv4-mapped normalised.
    pub client: IpAddr,
    /// The TCP peer as accepted.
    pub peer: SocketAddr,
    /// The PROXY header, when the connection had to carry one.
    pub proxy: Option<ProxyHeader>,
    /// Bytes the client sent after the head (the start of its tunnel payload), at most one
    /// read's worth.
    pub early: Vec<u8>,
}

/// Reads the optional PROXY header and the CONNECT head of one connection from `peer`.
///
/// On error the caller answers with [`IngressError::status`] (through [`refuse`]) when there
/// is one, else just closes.
pub async fn accept_connect<S>(
    stream: &mut S,
    peer: SocketAddr,
    mode: &ProxyMode,
    deadlines: Deadlines,
) -> Result<Accepted, IngressError>
where
    S: AsyncRead + Unpin,
{
    let start = Instant::now();
    let ProxyAccepted {
        client,
        proxy,
        mut buf,
        ..
    } = accept_proxy(stream, peer, mode, deadlines).await?;
    let (head, len) =
        tokio::time::timeout_at(start + deadlines.header, read_head(stream, &mut buf))
            .await
            .map_err(|_| IngressError::HeaderTimeout {
                after: deadlines.header,
            })??;
    let early = buf.split_off(len);
    Ok(Accepted {
        head,
        client,
        peer,
        proxy,
        early,
    })
}

/// A connection past its PROXY stage: the client address and what was read after the header.
#[derive(Debug)]
pub struct ProxyAccepted {
    /// The address to judge: the PROXY source or the TCP peer, IPv4-mapped normalised.
    pub client: IpAddr,
    /// The TCP peer as accepted.
    pub peer: SocketAddr,
    /// The PROXY header, when the connection had to carry one.
    pub proxy: Option<ProxyHeader>,
    /// Bytes read after the header (or from the start, without one): the start of the
    /// client's own protocol, not looked at beyond telling it from a PROXY header.
    pub buf: Vec<u8>,
}

/// The PROXY stage alone, for listeners whose protocol after it is not a CONNECT head (the
/// router's TLS SNI listener): the same per-listener and per-peer rules as
/// [`accept_connect`], the header complete within `deadlines.proxy_header`, and on a
/// per-source listener an untrusted peer's first bytes told from a PROXY header's within
/// `deadlines.header` (both counted from the call).
pub async fn accept_proxy<S>(
    stream: &mut S,
    peer: SocketAddr,
    mode: &ProxyMode,
    deadlines: Deadlines,
) -> Result<ProxyAccepted, IngressError>
where
    S: AsyncRead + Unpin,
{
    let start = Instant::now();
    let peer_ip = canonical_ip(peer.ip());
    let mut buf = Vec::with_capacity(1024);
    let mut proxy = None;
    let mut client = peer_ip;
    match mode.expect_from(peer_ip) {
        ProxyExpect::Nothing => {}
        ProxyExpect::Refuse => return Err(IngressError::Untrusted { peer }),
        ProxyExpect::Header => {
            let header = tokio::time::timeout_at(
                start + deadlines.proxy_header,
                read_proxy_header(stream, &mut buf),
            )
            .await
            .map_err(|_| IngressError::ProxyTimeout {
                after: deadlines.proxy_header,
            })??;
            if let Some(source) = header.source() {
                client = canonical_ip(source.ip());
            }
            proxy = Some(header);
        }
        ProxyExpect::NoHeader => {
            tokio::time::timeout_at(
                start + deadlines.header,
                refuse_proxy_header(stream, &mut buf, peer),
            )
            .await
            .map_err(|_| IngressError::HeaderTimeout {
                after: deadlines.header,
            })??;
        }
    }
    Ok(ProxyAccepted {
        client,
        peer,
        proxy,
        buf,
    })
}

/// Without a `status`, closes at once. With one, answers it, half-closes, then reads and
/// discards what the client still sends (at most [`LINGER_BYTES`] for [`LINGER_TIME`]) so the
/// answer is not lost to a reset. Nothing read here is looked at. Best effort: errors are
/// ignored.
pub async fn refuse<S>(stream: &mut S, status: Option<Status>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(status) = status else {
        // Nothing to deliver: close at once, unread.
        let _ = stream.shutdown().await;
        return;
    };
    let mut out = Vec::new();
    status.encode(&mut out);
    if stream.write_all(&out).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut scratch = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// `::ffff:a.b.c.d` as `a.b.c.d`; every other address unchanged.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// A network of a configuration (an allow-list, a rule, trusted proxies) in the form that
/// matches [`canonical_ip`]: `::ffff:a.b.c.d/n` with `n >= 96` is `a.b.c.d/(n - 96)`, host
/// bits cleared; every other network unchanged.
///
/// Addresses are compared after [`canonical_ip`], so an IPv4-mapped network as written could
/// never contain one: a `deny` from `::ffff:203.0.113.66/128` would load and never fire. A
/// network shorter than `/96` that spans the mapped range (`::/0`) still holds real IPv6
/// addresses and stays as it is. Every list of networks a program compares client or peer
/// addresses with goes through this at load, so all of them read a mapped network alike.
pub fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => {
                ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, |n| IpNet::V4(n.trunc()))
            }
            None => net,
        },
        _ => net,
    }
}

async fn read_proxy_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<ProxyHeader, IngressError> {
    let refused = |e: ProxyError| {
        PROXY_HEADERS_REFUSED.fetch_add(1, Ordering::Relaxed);
        IngressError::Proxy(e)
    };
    loop {
        if let Some((header, used)) = proxy_protocol::parse(buf).map_err(refused)? {
            header.check_tcp_listener().map_err(refused)?;
            buf.drain(..used);
            return Ok(header);
        }
        read_some(stream, buf, DEFAULT_V2_MAX_LEN).await?;
    }
}

/// Reads until the first bytes tell whether they start a PROXY header (an error, counted) or
/// not (`buf` keeps them for the CONNECT parser).
async fn refuse_proxy_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    peer: SocketAddr,
) -> Result<(), IngressError> {
    loop {
        match starts_like_proxy(buf) {
            Some(false) => return Ok(()),
            Some(true) => {
                PROXY_HEADERS_REFUSED.fetch_add(1, Ordering::Relaxed);
                return Err(IngressError::ProxyForbidden { peer });
            }
            None => read_some(stream, buf, MAX_HEAD_LEN).await?,
        }
    }
}

/// Whether `data` starts with `PROXY ` or the version 2 signature; `None` while it is still a
/// proper prefix of one of them (empty included).
fn starts_like_proxy(data: &[u8]) -> Option<bool> {
    let mut undecided = false;
    for signature in [
        &proxy_protocol::V1_PREFIX[..],
        &proxy_protocol::V2_SIGNATURE[..],
    ] {
        let n = data.len().min(signature.len());
        if data[..n] != signature[..n] {
            continue;
        }
        if n == signature.len() {
            return Some(true);
        }
        undecided = true;
    }
    if undecided {
        None
    } else {
        Some(false)
    }
}

async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<(ConnectHead, usize), IngressError> {
    loop {
        if let Some(found) = parse_connect_request(buf).map_err(IngressError::Request)? {
            return Ok(found);
        }
        read_some(stream, buf, MAX_HEAD_LEN).await?;
    }
}

/// One read that keeps `buf` at most `cap` bytes long.
async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), IngressError> {
    let room = cap.saturating_sub(buf.len());
    if room == 0 {
        // The parsers refuse a full buffer themselves; this is the backstop.
        return Err(IngressError::Request(RequestError::Head(
            protocol::http::HttpError::HeadTooLong { max: cap },
        )));
    }
    let mut scratch = [0u8; 4096];
    let want = room.min(scratch.len());
    let n = stream
        .read(&mut scratch[..want])
        .await
        .map_err(|source| IngressError::Io { source })?;
    if n == 0 {
        return Err(IngressError::Closed {
            received: buf.len(),
        });
    }
    buf.extend_from_slice(&scratch[..n]);
    Ok(())
}

/// Why a connection did not yield a CONNECT head.
#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    /// The listener requires PROXY and the peer is not a trusted load balancer.
    #[error("PROXY header required and peer {peer} is not a trusted load balancer")]
    Untrusted {
        /// The peer.
        peer: SocketAddr,
    },
    /// The PROXY header is malformed (or missing: no signature).
    #[error("bad PROXY header")]
    Proxy(#[source] ProxyError),
    /// A peer outside the trusted networks of a per-source listener sent a PROXY header.
    #[error("PROXY header from {peer}, which is not a trusted load balancer")]
    ProxyForbidden {
        /// The peer.
        peer: SocketAddr,
    },
    /// The PROXY header did not arrive in time.
    #[error("no PROXY header within {after:?}")]
    ProxyTimeout {
        /// The bound.
        after: Duration,
    },
    /// The CONNECT head did not arrive in time.
    #[error("no complete request head within {after:?}")]
    HeaderTimeout {
        /// The bound.
        after: Duration,
    },
    /// The request is refused.
    #[error("refused request")]
    Request(#[source] RequestError),
    /// The client closed first.
    #[error("client closed after {received} bytes, before the end of its request")]
    Closed {
        /// Bytes buffered.
        received: usize,
    },
    /// Reading failed.
    #[error("reading the request failed")]
    Io {
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl IngressError {
    /// The HTTP answer, or `None` when the connection is just closed (PROXY layer failures,
    /// untrusted peers, a client that left).
    pub fn status(&self) -> Option<Status> {
        match self {
            Self::Request(e) => Some(e.status()),
            Self::HeaderTimeout { .. } => Some(Status::REQUEST_TIMEOUT),
            Self::Untrusted { .. }
            | Self::Proxy(_)
            | Self::ProxyForbidden { .. }
            | Self::ProxyTimeout { .. }
            | Self::Closed { .. }
            | Self::Io { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const PEER: &str = "10.0.0.9:40000";

    async fn run(input: &[u8], mode: &ProxyMode) -> Result<Accepted, IngressError> {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(input).await.unwrap();
        drop(client);
        accept_connect(
            &mut server,
            PEER.parse().unwrap(),
            mode,
            Deadlines::default(),
        )
        .await
    }

    fn required() -> ProxyMode {
        ProxyMode::Required {
            trusted: vec!["10.0.0.0/24".parse().unwrap()],
        }
    }

    #[tokio::test]
    async fn proxy_source_becomes_the_client_and_early_bytes_are_kept() {
        let raw =
            b"PROXY TCP6 ::ffff:192.0.2.7 fd00::1 5000 8443\r\nCONNECT a:1 HTTP/1.0\r\n\r\nEARLY";
        let got = run(raw, &required()).await.unwrap();
        assert_eq!(got.client, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
        assert_eq!(got.early, b"EARLY");
    }

    #[tokio::test]
    async fn untrusted_peer_missing_header_and_second_header() {
        let mode = ProxyMode::Required {
            trusted: vec!["10.9.0.0/24".parse().unwrap()],
        };
        let raw = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nCONNECT a:1 HTTP/1.0\r\n\r\n";
        assert!(matches!(
            run(raw, &mode).await,
            Err(IngressError::Untrusted { .. })
        ));
        assert!(matches!(
            run(b"CONNECT a:1 HTTP/1.0\r\n\r\n", &required()).await,
            Err(IngressError::Proxy(ProxyError::NoSignature))
        ));
        let twice = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nPROXY TCP4 9.9.9.9 5.6.7.8 1 2\r\nCONNECT a:1 HTTP/1.0\r\n\r\n";
        let err = run(twice, &required()).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::BAD_REQUEST));
    }

    /// A version 2 header: signature, `ver_cmd`, `fam`, the body's length, the body.
    fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut out = proxy_protocol::V2_SIGNATURE.to_vec();
        out.extend_from_slice(&[ver_cmd, fam]);
        out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[tokio::test]
    async fn only_stream_over_inet_or_local_passes_a_tcp_listener() {
        // 192.0.2.7:5000 -> 198.51.100.1:8443
        let inet = [192, 0, 2, 7, 198, 51, 100, 1, 0x13, 0x88, 0x20, 0xfb];
        let connect = b"CONNECT a:1 HTTP/1.0\r\n\r\n";
        let with = |header: Vec<u8>| [header, connect.to_vec()].concat();

        let got = run(&with(v2(0x21, 0x11, &inet)), &required())
            .await
            .unwrap();
        assert_eq!(got.client, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
        // LOCAL: the block is ignored whatever it says (here UDP over IPv4); the peer is the
        // client.
        let got = run(&with(v2(0x20, 0x12, &inet)), &required())
            .await
            .unwrap();
        assert_eq!(got.client, PEER.parse::<SocketAddr>().unwrap().ip());

        for (fam, body) in [
            (0x12, inet.to_vec()),   // UDP over IPv4
            (0x22, vec![0; 36]),     // UDP over IPv6
            (0x31, vec![b'/'; 216]), // AF_UNIX stream
            (0x32, vec![b'/'; 216]), // AF_UNIX datagram
            (0x00, vec![]),          // PROXY with AF_UNSPEC
            (0x10, inet.to_vec()),   // IPv4 with an unspecified transport
        ] {
            let before = proxy_headers_refused();
            let err = run(&with(v2(0x21, fam, &body)), &required())
                .await
                .unwrap_err();
            assert!(
                matches!(err, IngressError::Proxy(ProxyError::V2NotTcp { .. })),
                "{fam:#04x}: {err:?}"
            );
            assert_eq!(err.status(), None, "closed unanswered");
            assert!(proxy_headers_refused() > before, "counted");
        }
    }

    fn from_trusted() -> ProxyMode {
        ProxyMode::FromTrusted {
            trusted: vec!["10.0.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()],
        }
    }

    async fn run_from(
        input: &[u8],
        peer: &str,
        mode: &ProxyMode,
    ) -> Result<Accepted, IngressError> {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(input).await.unwrap();
        drop(client);
        accept_connect(
            &mut server,
            peer.parse().unwrap(),
            mode,
            Deadlines::default(),
        )
        .await
    }

    #[test]
    fn what_each_mode_expects_of_each_peer() {
        let required = required();
        let from_trusted = from_trusted();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (peer, off, req, per_source) in [
            (
                "10.0.0.9",
                ProxyExpect::Nothing,
                ProxyExpect::Header,
                ProxyExpect::Header,
            ),
            (
                "10.0.0.0",
                ProxyExpect::Nothing,
                ProxyExpect::Header,
                ProxyExpect::Header,
            ),
            (
                "10.0.0.255",
                ProxyExpect::Nothing,
                ProxyExpect::Header,
                ProxyExpect::Header,
            ),
            (
                "10.0.1.0",
                ProxyExpect::Nothing,
                ProxyExpect::Refuse,
                ProxyExpect::NoHeader,
            ),
            (
                "9.255.255.255",
                ProxyExpect::Nothing,
                ProxyExpect::Refuse,
                ProxyExpect::NoHeader,
            ),
            // An IPv4-mapped peer is judged by its IPv4 address.
            (
                "::ffff:10.0.0.9",
                ProxyExpect::Nothing,
                ProxyExpect::Header,
                ProxyExpect::Header,
            ),
            (
                "::ffff:10.0.1.9",
                ProxyExpect::Nothing,
                ProxyExpect::Refuse,
                ProxyExpect::NoHeader,
            ),
            (
                "fd00::7",
                ProxyExpect::Nothing,
                ProxyExpect::Refuse,
                ProxyExpect::Header,
            ),
            (
                "fd00:0:0:1::7",
                ProxyExpect::Nothing,
                ProxyExpect::Refuse,
                ProxyExpect::NoHeader,
            ),
        ] {
            assert_eq!(ProxyMode::Off.expect_from(ip(peer)), off, "{peer} off");
            assert_eq!(required.expect_from(ip(peer)), req, "{peer} required");
            assert_eq!(
                from_trusted.expect_from(ip(peer)),
                per_source,
                "{peer} from-trusted"
            );
        }
    }

    #[test]
    fn proxy_signature_prefixes() {
        let v2 = proxy_protocol::V2_SIGNATURE;
        for (bytes, want) in [
            (&b""[..], None),
            (b"P", None),
            (b"PROXY", None),
            (b"PROXY ", Some(true)),
            (b"PROXY TCP4", Some(true)),
            (b"PROXYZ", Some(false)),
            (b"POST / HTTP/1.1", Some(false)),
            (b"CONNECT a:1", Some(false)),
            (b"\r", None),
            (&v2[..11], None),
            (&v2[..], Some(true)),
            (b"\r\n\r\n\0\r\nQUIT\r", Some(false)),
            (b"\r\nX", Some(false)),
            (b"x", Some(false)),
        ] {
            assert_eq!(starts_like_proxy(bytes), want, "{bytes:?}");
        }
    }

    #[tokio::test]
    async fn per_source_honours_the_balancer_and_refuses_spoofing() {
        let mode = from_trusted();
        let connect = b"CONNECT a:1 HTTP/1.0\r\n\r\nEARLY";
        let v1 = b"PROXY TCP4 192.0.2.7 198.51.100.1 5000 8443\r\n".to_vec();
        let inet = [192, 0, 2, 7, 198, 51, 100, 1, 0x13, 0x88, 0x20, 0xfb];
        let v2h = v2(0x21, 0x11, &inet);
        let with = |h: &[u8]| [h, &connect[..]].concat();

        // The balancer: its header names the client, v1 and v2, IPv4 and IPv6 peers.
        for peer in ["10.0.0.9:1", "[fd00::9]:1", "[::ffff:10.0.0.9]:1"] {
            for header in [&v1, &v2h] {
                let got = run_from(&with(header), peer, &mode).await.unwrap();
                assert_eq!(
                    got.client,
                    IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
                    "{peer}"
                );
                assert!(got.proxy.is_some());
                assert_eq!(got.early, b"EARLY");
            }
            // Without one: closed, counted.
            let before = proxy_headers_refused();
            let err = run_from(connect, peer, &mode).await.unwrap_err();
            assert!(
                matches!(err, IngressError::Proxy(ProxyError::NoSignature)),
                "{err:?}"
            );
            assert_eq!(err.status(), None);
            assert!(proxy_headers_refused() > before);
        }

        // Anyone else: served with its own address ...
        for peer in ["10.0.1.9:1", "[fd00:0:0:1::9]:1", "[::ffff:10.0.1.9]:1"] {
            let got = run_from(connect, peer, &mode).await.unwrap();
            let want = canonical_ip(peer.parse::<SocketAddr>().unwrap().ip());
            assert_eq!(got.client, want, "{peer}");
            assert!(got.proxy.is_none());
            assert_eq!(got.early, b"EARLY");
            // ... and a header from it is a protocol error: closed unanswered, counted.
            for header in [&v1, &v2h, &b"PROXY UNKNOWN\r\n".to_vec()] {
                let before = proxy_headers_refused();
                let err = run_from(&with(header), peer, &mode).await.unwrap_err();
                assert!(
                    matches!(err, IngressError::ProxyForbidden { .. }),
                    "{err:?}"
                );
                assert_eq!(err.status(), None, "closed unanswered");
                assert!(proxy_headers_refused() > before, "counted");
            }
            // A request that merely starts like one is judged as HTTP.
            let err = run_from(b"PROXYZ a:1 HTTP/1.0\r\n\r\n", peer, &mode)
                .await
                .unwrap_err();
            assert!(matches!(err, IngressError::Request(_)), "{err:?}");
        }
        // A partial signature and then the end: the client left, nothing is judged.
        let err = run_from(b"PROX", "10.0.1.9:1", &mode).await.unwrap_err();
        assert!(
            matches!(err, IngressError::Closed { received: 4 }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn required_refuses_untrusted_and_off_treats_a_header_as_http() {
        let v1 = b"PROXY TCP4 192.0.2.7 198.51.100.1 5000 8443\r\nCONNECT a:1 HTTP/1.0\r\n\r\n";
        let err = run_from(v1, "10.0.1.9:1", &required()).await.unwrap_err();
        assert!(matches!(err, IngressError::Untrusted { .. }), "{err:?}");
        let err = run_from(v1, "10.0.0.9:1", &ProxyMode::Off)
            .await
            .unwrap_err();
        assert!(matches!(err, IngressError::Request(_)), "{err:?}");
        let got = run_from(
            b"CONNECT a:1 HTTP/1.0\r\n\r\n",
            "10.0.0.9:1",
            &ProxyMode::Off,
        )
        .await
        .unwrap();
        assert_eq!(got.client, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)));
    }

    /// Each deadline counts from accept: bytes that arrive late, but before it, are read.
    #[tokio::test(start_paused = true)]
    async fn bytes_that_arrive_late_but_within_the_deadlines_are_accepted() {
        let proxy: &'static [u8] = b"PROXY TCP4 192.0.2.7 198.51.100.1 5000 8443\r\n";
        let head: &'static [u8] = b"CONNECT a:1 HTTP/1.0\r\n\r\n";
        for (mode, peer, first, rest) in [
            (required(), PEER, proxy, head),
            (from_trusted(), PEER, proxy, head),
            (from_trusted(), "10.0.1.9:1", &head[..4], &head[4..]),
            (ProxyMode::Off, PEER, &head[..4], &head[4..]),
        ] {
            let (mut client, mut server) = tokio::io::duplex(1024);
            let writer = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                client.write_all(first).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
                client.write_all(rest).await.unwrap();
                client
            });
            let got = accept_connect(
                &mut server,
                peer.parse().unwrap(),
                &mode,
                Deadlines::default(),
            )
            .await;
            assert!(got.is_ok(), "{mode:?} from {peer}: {got:?}");
            drop(writer.await.unwrap());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_untrusted_peer_that_stays_undecided_times_out() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"PROX").await.unwrap();
        let err = accept_connect(
            &mut server,
            "10.0.1.9:1".parse().unwrap(),
            &from_trusted(),
            Deadlines::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, IngressError::HeaderTimeout { .. }), "{err:?}");
        drop(client);
    }

    #[tokio::test]
    async fn mapped_peer_is_ipv4() {
        assert_eq!(
            canonical_ip(IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped())),
            IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(
            canonical_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_head_times_out() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"CONNECT a:1 HTTP/1.0\r\n").await.unwrap();
        let err = accept_connect(
            &mut server,
            PEER.parse().unwrap(),
            &ProxyMode::Off,
            Deadlines::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, IngressError::HeaderTimeout { .. }));
        assert_eq!(err.status(), Some(Status::REQUEST_TIMEOUT));
        drop(client);
    }

    #[test]
    fn mapped_networks_read_as_the_ipv4_networks_they_carry() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        for (written, canonical) in [
            ("::ffff:203.0.113.66/128", "203.0.113.66/32"),
            ("::ffff:203.0.113.66/120", "203.0.113.0/24"),
            ("::ffff:0:0/96", "0.0.0.0/0"),
            ("::/0", "::/0"),
            ("::ffff:0:0/95", "::fffe:0:0/95"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("10.0.0.0/8", "10.0.0.0/8"),
        ] {
            assert_eq!(
                canonical_net(net(written).trunc()),
                net(canonical),
                "{written}"
            );
        }
        // What it makes contains what canonical_ip makes of the mapped address.
        let mapped: IpAddr = "::ffff:203.0.113.66".parse().unwrap();
        assert!(canonical_net(net("::ffff:203.0.113.66/128")).contains(&canonical_ip(mapped)));
    }
}
