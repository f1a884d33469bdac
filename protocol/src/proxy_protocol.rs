//! The PROXY protocol (versions 1 and 2), as sent by load balancers in front of a TCP
//! listener to pass on the original client's address. A pure, incremental, bounded codec.
//!
//! Version 1 is one text line, at most [`V1_MAX_LEN`] bytes including the CRLF:
//!
//! ```text
//! "PROXY" SP ( "TCP4" | "TCP6" ) SP src-addr SP dst-addr SP src-port SP dst-port CRLF
//! "PROXY" SP "UNKNOWN" [ SP anything-but-CRLF ] CRLF
//! ```
//!
//! Exactly one space between fields; decimal ports `0..=65535` and IPv4 octets without
//! leading zeros; both addresses of the family the protocol names.
//!
//! Version 2 is binary, all integers big-endian:
//!
//! ```text
//!  0                   12      13      14      16
//! +-------------------+-------+-------+-------+---------------------------+---------+
//! | signature (12)    |ver|cmd|fam|prt| len   | address block             | TLVs    |
//! | \r\n\r\n\0\r\nQUIT\n| 2 | 0/1 |       | (u16) | 0 / 12 / 36 / 216 bytes   |         |
//! +-------------------+-------+-------+-------+---------------------------+---------+
//!                                              <------------- len bytes ------------>
//! address block:  AF_INET  src(4) dst(4) sport(2) dport(2)
//!                 AF_INET6 src(16) dst(16) sport(2) dport(2)
//!                 AF_UNIX  src(108) dst(108)
//! TLV:            type(1) length(2) value(length)
//! ```
//!
//! The whole version 2 header is bounded by a limit the caller chooses (default
//! [`DEFAULT_V2_MAX_LEN`]); the protocol itself allows up to [`V2_MAX_LEN`].
//!
//! [`parse`] looks at a byte prefix of the stream: `Ok(None)` means "need more bytes",
//! `Ok(Some((header, consumed)))` a complete header of `consumed` bytes, `Err` a malformed one
//! (the connection should be closed). Nothing past the header is ever read.
//!
//! The codec takes every family and transport the protocol defines. A TCP listener must then
//! also check that the header can describe the connection it accepted
//! ([`ProxyHeader::check_tcp_listener`]): a version 2 `PROXY` header is only valid there with
//! `STREAM` over `AF_INET` or `AF_INET6`; `LOCAL` (whose address block the receiver ignores)
//! and version 1 (`TCP4`, `TCP6`, `UNKNOWN`) always are.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use bytes::BufMut;

/// The longest version 1 header, CRLF included.
pub const V1_MAX_LEN: usize = 107;
/// What every version 1 header starts with.
pub const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// The 12 bytes every version 2 header starts with.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The fixed part of a version 2 header: signature, version/command, family/transport, length.
pub const V2_FIXED_LEN: usize = 16;
/// The longest version 2 header the protocol allows.
pub const V2_MAX_LEN: usize = V2_FIXED_LEN + u16::MAX as usize;
/// The bound [`parse`] puts on a version 2 header.
pub const DEFAULT_V2_MAX_LEN: usize = 4096;
/// Length of one `AF_UNIX` address in a version 2 address block.
pub const UNIX_ADDR_LEN: usize = 108;
/// Address block length for `AF_INET`.
pub const PP2_ADDR_LEN_INET: usize = 12;
/// Address block length for `AF_INET6`.
pub const PP2_ADDR_LEN_INET6: usize = 36;
/// Address block length for `AF_UNIX`.
pub const PP2_ADDR_LEN_UNIX: usize = 2 * UNIX_ADDR_LEN;

/// TLV type: application-layer protocol (ALPN).
pub const PP2_TYPE_ALPN: u8 = 0x01;
/// TLV type: the host name the client asked for (SNI).
pub const PP2_TYPE_AUTHORITY: u8 = 0x02;
/// TLV type: CRC32c of the header (not verified by this module).
pub const PP2_TYPE_CRC32C: u8 = 0x03;
/// TLV type: padding, to be ignored.
pub const PP2_TYPE_NOOP: u8 = 0x04;
/// TLV type: an opaque connection id.
pub const PP2_TYPE_UNIQUE_ID: u8 = 0x05;
/// TLV type: TLS information (with sub-TLVs).
pub const PP2_TYPE_SSL: u8 = 0x20;
/// TLV type: network namespace name.
pub const PP2_TYPE_NETNS: u8 = 0x30;

/// Which version of the protocol a header used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The text form.
    V1,
    /// The binary form.
    V2,
}

/// What the sender asks the receiver to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Version 2 only: the connection was made by the proxy itself (e.g. a health check);
    /// use the real peer address and ignore the address block.
    Local,
    /// The connection is relayed on behalf of the client in the address block.
    Proxy,
}

/// The transport protocol of the relayed connection (version 2 low nibble of byte 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Unknown or unspecified (v1 `UNKNOWN`).
    Unspec,
    /// `SOCK_STREAM` (TCP; v1 `TCP4`/`TCP6`).
    Stream,
    /// `SOCK_DGRAM` (UDP).
    Dgram,
}

/// The address information a header carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addresses {
    /// No addresses: v1 `UNKNOWN` or v2 `AF_UNSPEC`.
    Unspecified {
        /// Version 1 only: the bytes after `UNKNOWN` up to the CRLF (empty, or starting with
        /// a space), kept so the header re-encodes to the same bytes. Receivers ignore them.
        /// Always empty for version 2.
        v1_trailer: Vec<u8>,
    },
    /// `TCP4` / `AF_INET`.
    Ipv4 {
        /// The original client.
        source: SocketAddrV4,
        /// The address the client connected to.
        destination: SocketAddrV4,
    },
    /// `TCP6` / `AF_INET6` (flow info and scope id are always 0).
    Ipv6 {
        /// The original client.
        source: SocketAddrV6,
        /// The address the client connected to.
        destination: SocketAddrV6,
    },
    /// Version 2 `AF_UNIX`: two NUL-padded socket paths.
    Unix {
        /// The original client's path.
        source: [u8; UNIX_ADDR_LEN],
        /// The path the client connected to.
        destination: [u8; UNIX_ADDR_LEN],
    },
}

impl Addresses {
    /// The version 2 family nibble (`AF_UNSPEC` 0, `AF_INET` 1, `AF_INET6` 2, `AF_UNIX` 3).
    pub fn v2_family(&self) -> u8 {
        match self {
            Self::Unspecified { .. } => 0,
            Self::Ipv4 { .. } => 1,
            Self::Ipv6 { .. } => 2,
            Self::Unix { .. } => 3,
        }
    }
}

/// One version 2 type-length-value extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlv {
    /// The type byte (`PP2_TYPE_*`).
    pub kind: u8,
    /// The value, at most 65535 bytes.
    pub value: Vec<u8>,
}

/// A parsed PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// Which form it came in (and is encoded in).
    pub version: Version,
    /// Always [`Command::Proxy`] for version 1.
    pub command: Command,
    /// The relayed connection's transport.
    pub transport: Transport,
    /// The address block as sent (kept even for [`Command::Local`], for re-encoding).
    pub addresses: Addresses,
    /// Version 2 extensions, in order (always empty for version 1).
    pub tlvs: Vec<Tlv>,
}

impl ProxyHeader {
    /// A version 1 `TCP4`/`TCP6` header, or version 2 `PROXY` over `STREAM`, for a client
    /// `source` that connected to `destination`. `None` if the two families differ.
    pub fn tcp(version: Version, source: SocketAddr, destination: SocketAddr) -> Option<Self> {
        let addresses = match (source, destination) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => Addresses::Ipv4 {
                source: s,
                destination: d,
            },
            (SocketAddr::V6(s), SocketAddr::V6(d)) => Addresses::Ipv6 {
                source: SocketAddrV6::new(*s.ip(), s.port(), 0, 0),
                destination: SocketAddrV6::new(*d.ip(), d.port(), 0, 0),
            },
            _ => return None,
        };
        Some(Self {
            version,
            command: Command::Proxy,
            transport: Transport::Stream,
            addresses,
            tlvs: Vec::new(),
        })
    }

    /// A version 2 `LOCAL` header with no addresses and no TLVs (what health checks send).
    pub fn local() -> Self {
        Self {
            version: Version::V2,
            command: Command::Local,
            transport: Transport::Unspec,
            addresses: Addresses::Unspecified {
                v1_trailer: Vec::new(),
            },
            tlvs: Vec::new(),
        }
    }

    /// Whether this header can describe a connection accepted on a TCP listener: version 1
    /// (`TCP4`, `TCP6`, `UNKNOWN`), version 2 `LOCAL` (the address block is ignored), or
    /// version 2 `PROXY` with `STREAM` over `AF_INET` / `AF_INET6`. A `PROXY` header declaring
    /// a datagram or unspecified transport, or an `AF_UNIX` or `AF_UNSPEC` family, is
    /// [`ProxyError::V2NotTcp`]: a load balancer in front of a TCP listener cannot have relayed
    /// such a connection, so the header is forged or the sender misconfigured.
    pub fn check_tcp_listener(&self) -> Result<(), ProxyError> {
        if self.version == Version::V1 || self.command == Command::Local {
            return Ok(());
        }
        match (&self.addresses, self.transport) {
            (Addresses::Ipv4 { .. } | Addresses::Ipv6 { .. }, Transport::Stream) => Ok(()),
            (addresses, transport) => Err(ProxyError::V2NotTcp {
                family: addresses.v2_family(),
                transport,
            }),
        }
    }

    /// The original client's address, or `None` when the receiver must use the real peer
    /// address (`LOCAL`, `UNKNOWN`, `AF_UNSPEC`, `AF_UNIX`).
    pub fn source(&self) -> Option<SocketAddr> {
        self.inet().map(|(s, _)| s)
    }

    /// The address the client connected to; `None` in the same cases as [`Self::source`].
    pub fn destination(&self) -> Option<SocketAddr> {
        self.inet().map(|(_, d)| d)
    }

    fn inet(&self) -> Option<(SocketAddr, SocketAddr)> {
        if self.command == Command::Local {
            return None;
        }
        match &self.addresses {
            Addresses::Ipv4 {
                source,
                destination,
            } => Some(((*source).into(), (*destination).into())),
            Addresses::Ipv6 {
                source,
                destination,
            } => Some(((*source).into(), (*destination).into())),
            _ => None,
        }
    }

    /// Appends the header in its [`Self::version`]'s form to `out`. On error nothing is written.
    pub fn encode(&self, out: &mut impl BufMut) -> Result<(), ProxyError> {
        let bytes = match self.version {
            Version::V1 => self.encode_v1()?,
            Version::V2 => self.encode_v2()?,
        };
        out.put_slice(&bytes);
        Ok(())
    }

    /// The header's bytes (see [`Self::encode`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, ProxyError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    fn encode_v1(&self) -> Result<Vec<u8>, ProxyError> {
        if self.command != Command::Proxy || !self.tlvs.is_empty() {
            return Err(ProxyError::NotEncodableAsV1);
        }
        let mut line = V1_PREFIX.to_vec();
        match (&self.addresses, self.transport) {
            (Addresses::Unspecified { v1_trailer }, Transport::Unspec) => {
                if !valid_unknown_trailer(v1_trailer) {
                    return Err(ProxyError::V1Trailer);
                }
                line.extend_from_slice(b"UNKNOWN");
                line.extend_from_slice(v1_trailer);
            }
            (
                Addresses::Ipv4 {
                    source,
                    destination,
                },
                Transport::Stream,
            ) => line.extend_from_slice(
                format!(
                    "TCP4 {} {} {} {}",
                    source.ip(),
                    destination.ip(),
                    source.port(),
                    destination.port()
                )
                .as_bytes(),
            ),
            (
                Addresses::Ipv6 {
                    source,
                    destination,
                },
                Transport::Stream,
            ) => line.extend_from_slice(
                format!(
                    "TCP6 {} {} {} {}",
                    source.ip(),
                    destination.ip(),
                    source.port(),
                    destination.port()
                )
                .as_bytes(),
            ),
            _ => return Err(ProxyError::NotEncodableAsV1),
        }
        line.extend_from_slice(b"\r\n");
        if line.len() > V1_MAX_LEN {
            return Err(ProxyError::V1NoCrlf);
        }
        Ok(line)
    }

    fn encode_v2(&self) -> Result<Vec<u8>, ProxyError> {
        let mut out = V2_SIGNATURE.to_vec();
        let command = match self.command {
            Command::Local => 0,
            Command::Proxy => 1,
        };
        let transport = match self.transport {
            Transport::Unspec => 0,
            Transport::Stream => 1,
            Transport::Dgram => 2,
        };
        out.push(0x20 | command);
        out.push(self.addresses.v2_family() << 4 | transport);
        out.extend_from_slice(&[0, 0]);
        match &self.addresses {
            Addresses::Unspecified { v1_trailer } => {
                if !v1_trailer.is_empty() {
                    return Err(ProxyError::V1Trailer);
                }
            }
            Addresses::Ipv4 {
                source,
                destination,
            } => {
                out.extend_from_slice(&source.ip().octets());
                out.extend_from_slice(&destination.ip().octets());
                out.extend_from_slice(&source.port().to_be_bytes());
                out.extend_from_slice(&destination.port().to_be_bytes());
            }
            Addresses::Ipv6 {
                source,
                destination,
            } => {
                out.extend_from_slice(&source.ip().octets());
                out.extend_from_slice(&destination.ip().octets());
                out.extend_from_slice(&source.port().to_be_bytes());
                out.extend_from_slice(&destination.port().to_be_bytes());
            }
            Addresses::Unix {
                source,
                destination,
            } => {
                out.extend_from_slice(source);
                out.extend_from_slice(destination);
            }
        }
        for tlv in &self.tlvs {
            let len = u16::try_from(tlv.value.len()).map_err(|_| ProxyError::V2TooLong {
                len: tlv.value.len(),
                limit: u16::MAX.into(),
            })?;
            out.push(tlv.kind);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&tlv.value);
        }
        let body = out.len() - V2_FIXED_LEN;
        let len = u16::try_from(body).map_err(|_| ProxyError::V2TooLong {
            len: out.len(),
            limit: V2_MAX_LEN,
        })?;
        out[14..16].copy_from_slice(&len.to_be_bytes());
        Ok(out)
    }
}

/// Which field of a version 1 line was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Field {
    /// The source address.
    SourceAddress,
    /// The destination address.
    DestinationAddress,
    /// The source port.
    SourcePort,
    /// The destination port.
    DestinationPort,
}

/// Why bytes are not a valid PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The stream starts with neither `PROXY ` nor the version 2 signature.
    #[error("not a PROXY protocol header")]
    NoSignature,
    /// No CRLF within the first [`V1_MAX_LEN`] bytes (or an encoded line would be longer).
    #[error("PROXY v1: no CRLF within {V1_MAX_LEN} bytes")]
    V1NoCrlf,
    /// The protocol field is not `TCP4`, `TCP6` or `UNKNOWN`.
    #[error("PROXY v1: unknown protocol field")]
    V1Protocol,
    /// A `TCP4`/`TCP6` line does not have exactly six single-space-separated, non-empty fields.
    #[error(
        "PROXY v1: expected 6 single-space-separated fields, found {found} (empty ones included)"
    )]
    V1Fields {
        /// How many fields splitting on single spaces gave.
        found: usize,
        /// Whether one of them was empty (a double, leading or trailing space).
        empty: bool,
    },
    /// An address is malformed (or of the other family, or has leading zeros).
    #[error("PROXY v1: bad {field:?}")]
    V1Address {
        /// Which address.
        field: V1Field,
    },
    /// A port is not a decimal `0..=65535` without leading zeros.
    #[error("PROXY v1: bad {field:?}")]
    V1Port {
        /// Which port.
        field: V1Field,
    },
    /// `UNKNOWN` is followed by something other than CRLF or a space; or (encoding) a trailer
    /// is invalid or set on a version 2 header.
    #[error("PROXY v1: bad text after UNKNOWN")]
    V1Trailer,
    /// The version nibble is not 2.
    #[error("PROXY v2: version nibble {version}, expected 2")]
    V2Version {
        /// The high nibble of byte 12.
        version: u8,
    },
    /// The command nibble is neither LOCAL (0) nor PROXY (1).
    #[error("PROXY v2: unknown command {command}")]
    V2Command {
        /// The low nibble of byte 12.
        command: u8,
    },
    /// The address family nibble is not UNSPEC, INET, INET6 or UNIX.
    #[error("PROXY v2: unknown address family {family}")]
    V2Family {
        /// The high nibble of byte 13.
        family: u8,
    },
    /// The transport nibble is not UNSPEC, STREAM or DGRAM.
    #[error("PROXY v2: unknown transport {transport}")]
    V2Transport {
        /// The low nibble of byte 13.
        transport: u8,
    },
    /// The whole header would be longer than the limit.
    #[error("PROXY v2: header of {len} bytes exceeds the limit of {limit}")]
    V2TooLong {
        /// The header length (16 + the length field).
        len: usize,
        /// The limit in force.
        limit: usize,
    },
    /// The length field is shorter than the family's address block.
    #[error("PROXY v2: length {len} is shorter than the {needed}-byte address block")]
    V2AddressTruncated {
        /// The length field.
        len: usize,
        /// The family's address block length.
        needed: usize,
    },
    /// A TLV's header or value runs past the end of the header.
    #[error("PROXY v2: TLV at offset {offset} needs {needed} bytes, {available} left")]
    V2TlvOverrun {
        /// Offset of the TLV from the start of the header.
        offset: usize,
        /// Bytes the TLV needs (3 for its own header, or 3 + its length).
        needed: usize,
        /// Bytes left in the header from `offset`.
        available: usize,
    },
    /// A version 2 `PROXY` header a TCP listener cannot have received: a transport other than
    /// `STREAM`, or a family other than `AF_INET` / `AF_INET6`
    /// ([`ProxyHeader::check_tcp_listener`]).
    #[error("PROXY v2: PROXY command with family {family} and transport {transport:?} on a TCP listener (only STREAM over INET/INET6)")]
    V2NotTcp {
        /// The family nibble (`AF_UNSPEC` 0, `AF_INET` 1, `AF_INET6` 2, `AF_UNIX` 3).
        family: u8,
        /// The transport.
        transport: Transport,
    },
    /// The header cannot be expressed in version 1 (LOCAL, TLVs, AF_UNIX, DGRAM, or a
    /// transport/address mismatch).
    #[error("header cannot be encoded as PROXY v1")]
    NotEncodableAsV1,
}

/// Parses a header at the start of `data` with the default version 2 bound
/// ([`DEFAULT_V2_MAX_LEN`]). See the module docs for the result.
pub fn parse(data: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    parse_with_limit(data, DEFAULT_V2_MAX_LEN)
}

/// Parses a header at the start of `data`, refusing version 2 headers longer than
/// `v2_max_len` bytes in total (values above [`V2_MAX_LEN`] mean no extra bound).
pub fn parse_with_limit(
    data: &[u8],
    v2_max_len: usize,
) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    let v1_n = data.len().min(V1_PREFIX.len());
    let v2_n = data.len().min(V2_SIGNATURE.len());
    if data[..v1_n] == V1_PREFIX[..v1_n] && !data.is_empty() {
        if v1_n < V1_PREFIX.len() {
            return Ok(None);
        }
        parse_v1(data)
    } else if data[..v2_n] == V2_SIGNATURE[..v2_n] {
        if v2_n < V2_SIGNATURE.len() {
            return Ok(None);
        }
        parse_v2(data, v2_max_len)
    } else {
        Err(ProxyError::NoSignature)
    }
}

fn parse_v1(data: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    let window = &data[..data.len().min(V1_MAX_LEN)];
    let Some(cr) = window.windows(2).position(|w| w == b"\r\n") else {
        return if data.len() >= V1_MAX_LEN {
            Err(ProxyError::V1NoCrlf)
        } else {
            Ok(None)
        };
    };
    let consumed = cr + 2;
    let body = &data[V1_PREFIX.len()..cr];
    if let Some(trailer) = body.strip_prefix(b"UNKNOWN") {
        if !valid_unknown_trailer(trailer) {
            return Err(ProxyError::V1Trailer);
        }
        let header = ProxyHeader {
            version: Version::V1,
            command: Command::Proxy,
            transport: Transport::Unspec,
            addresses: Addresses::Unspecified {
                v1_trailer: trailer.to_vec(),
            },
            tlvs: Vec::new(),
        };
        return Ok(Some((header, consumed)));
    }
    let fields: Vec<&[u8]> = body.split(|&b| b == b' ').collect();
    let (proto, rest) = fields.split_first().ok_or(ProxyError::V1Protocol)?;
    let v6 = match *proto {
        b"TCP4" => false,
        b"TCP6" => true,
        _ => return Err(ProxyError::V1Protocol),
    };
    let empty = fields.iter().any(|f| f.is_empty());
    let [src, dst, sport, dport] = rest else {
        return Err(ProxyError::V1Fields {
            found: fields.len() + 1,
            empty,
        });
    };
    if empty {
        return Err(ProxyError::V1Fields {
            found: fields.len() + 1,
            empty,
        });
    }
    let sport = parse_port(sport).ok_or(ProxyError::V1Port {
        field: V1Field::SourcePort,
    })?;
    let dport = parse_port(dport).ok_or(ProxyError::V1Port {
        field: V1Field::DestinationPort,
    })?;
    let src_err = ProxyError::V1Address {
        field: V1Field::SourceAddress,
    };
    let dst_err = ProxyError::V1Address {
        field: V1Field::DestinationAddress,
    };
    let addresses = if v6 {
        let s = parse_ipv6(src).ok_or(src_err)?;
        let d = parse_ipv6(dst).ok_or(dst_err)?;
        Addresses::Ipv6 {
            source: SocketAddrV6::new(s, sport, 0, 0),
            destination: SocketAddrV6::new(d, dport, 0, 0),
        }
    } else {
        let s = parse_ipv4(src).ok_or(src_err)?;
        let d = parse_ipv4(dst).ok_or(dst_err)?;
        Addresses::Ipv4 {
            source: SocketAddrV4::new(s, sport),
            destination: SocketAddrV4::new(d, dport),
        }
    };
    let header = ProxyHeader {
        version: Version::V1,
        command: Command::Proxy,
        transport: Transport::Stream,
        addresses,
        tlvs: Vec::new(),
    };
    Ok(Some((header, consumed)))
}

/// Empty, or a space followed by anything without a CRLF in it.
fn valid_unknown_trailer(trailer: &[u8]) -> bool {
    trailer.is_empty()
        || (trailer[0] == b' '
            && !trailer.windows(2).any(|w| w == b"\r\n")
            && V1_PREFIX.len() + b"UNKNOWN".len() + trailer.len() + 2 <= V1_MAX_LEN)
}

/// Decimal digits only, no leading zero unless the number is 0, at most `max`.
fn parse_decimal(field: &[u8], max_digits: usize, max: u32) -> Option<u32> {
    if field.is_empty() || field.len() > max_digits || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if field.len() > 1 && field[0] == b'0' {
        return None;
    }
    let value = field
        .iter()
        .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'));
    (value <= max).then_some(value)
}

fn parse_port(field: &[u8]) -> Option<u16> {
    parse_decimal(field, 5, u16::MAX.into()).and_then(|v| u16::try_from(v).ok())
}

fn parse_ipv4(field: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = field.split(|&b| b == b'.');
    for octet in &mut octets {
        *octet = u8::try_from(parse_decimal(parts.next()?, 3, 255)?).ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

fn parse_ipv6(field: &[u8]) -> Option<Ipv6Addr> {
    // Only hex digits, colons and (for an embedded IPv4 tail) dots; the std parser does the rest.
    if !field
        .iter()
        .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
    {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn parse_v2(data: &[u8], v2_max_len: usize) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    let Some(fixed) = data.get(..V2_FIXED_LEN) else {
        // Check what we already have of bytes 12 and 13 so junk fails fast.
        if let Some(&b) = data.get(12) {
            check_ver_cmd(b)?;
        }
        if let Some(&b) = data.get(13) {
            check_fam(b)?;
        }
        return Ok(None);
    };
    let command = check_ver_cmd(fixed[12])?;
    let (family, transport) = check_fam(fixed[13])?;
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let total = V2_FIXED_LEN + len;
    let limit = v2_max_len.min(V2_MAX_LEN);
    if total > limit {
        return Err(ProxyError::V2TooLong { len: total, limit });
    }
    let needed = match family {
        1 => PP2_ADDR_LEN_INET,
        2 => PP2_ADDR_LEN_INET6,
        3 => PP2_ADDR_LEN_UNIX,
        _ => 0,
    };
    if len < needed {
        return Err(ProxyError::V2AddressTruncated { len, needed });
    }
    let Some(body) = data.get(V2_FIXED_LEN..total) else {
        return Ok(None);
    };
    let (addr, mut tlv_bytes) = body.split_at(needed);
    let addresses = match family {
        1 => {
            let ip = |o: usize| Ipv4Addr::new(addr[o], addr[o + 1], addr[o + 2], addr[o + 3]);
            Addresses::Ipv4 {
                source: SocketAddrV4::new(ip(0), be16(addr, 8)),
                destination: SocketAddrV4::new(ip(4), be16(addr, 10)),
            }
        }
        2 => {
            let ip = |o: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&addr[o..o + 16]);
                Ipv6Addr::from(octets)
            };
            Addresses::Ipv6 {
                source: SocketAddrV6::new(ip(0), be16(addr, 32), 0, 0),
                destination: SocketAddrV6::new(ip(16), be16(addr, 34), 0, 0),
            }
        }
        3 => {
            let mut source = [0u8; UNIX_ADDR_LEN];
            let mut destination = [0u8; UNIX_ADDR_LEN];
            source.copy_from_slice(&addr[..UNIX_ADDR_LEN]);
            destination.copy_from_slice(&addr[UNIX_ADDR_LEN..]);
            Addresses::Unix {
                source,
                destination,
            }
        }
        _ => Addresses::Unspecified {
            v1_trailer: Vec::new(),
        },
    };
    let mut tlvs = Vec::new();
    let mut offset = V2_FIXED_LEN + needed;
    while !tlv_bytes.is_empty() {
        let available = tlv_bytes.len();
        if available < 3 {
            return Err(ProxyError::V2TlvOverrun {
                offset,
                needed: 3,
                available,
            });
        }
        let value_len = usize::from(be16(tlv_bytes, 1));
        let Some(value) = tlv_bytes.get(3..3 + value_len) else {
            return Err(ProxyError::V2TlvOverrun {
                offset,
                needed: 3 + value_len,
                available,
            });
        };
        tlvs.push(Tlv {
            kind: tlv_bytes[0],
            value: value.to_vec(),
        });
        tlv_bytes = &tlv_bytes[3 + value_len..];
        offset += 3 + value_len;
    }
    let header = ProxyHeader {
        version: Version::V2,
        command,
        transport,
        addresses,
        tlvs,
    };
    Ok(Some((header, total)))
}

fn be16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn check_ver_cmd(byte: u8) -> Result<Command, ProxyError> {
    let version = byte >> 4;
    if version != 2 {
        return Err(ProxyError::V2Version { version });
    }
    match byte & 0x0f {
        0 => Ok(Command::Local),
        1 => Ok(Command::Proxy),
        command => Err(ProxyError::V2Command { command }),
    }
}

fn check_fam(byte: u8) -> Result<(u8, Transport), ProxyError> {
    let family = byte >> 4;
    if family > 3 {
        return Err(ProxyError::V2Family { family });
    }
    let transport = match byte & 0x0f {
        0 => Transport::Unspec,
        1 => Transport::Stream,
        2 => Transport::Dgram,
        transport => return Err(ProxyError::V2Transport { transport }),
    };
    Ok((family, transport))
}
