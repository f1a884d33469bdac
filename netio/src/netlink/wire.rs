//! The rtnetlink messages [`super::Netlink`] sends and reads, without I/O.
//!
//! Every field is in host byte order; every message and attribute starts on a 4-byte boundary.
//!
//! ```text
//! nlmsghdr, 16 bytes                         rtattr, 4 bytes + payload, padded to 4
//! 0        4        6        8       12  16  0        2        4
//! ┌────────┬────────┬────────┬───────┬───┐   ┌────────┬────────┬──────────┐
//! │len u32 │type u16│flags   │seq u32│pid│   │len u16 │type u16│ payload… │
//! └────────┴────────┴────────┴───────┴───┘   └────────┴────────┴──────────┘
//! then the family header, then rtattrs:
//!   ifinfomsg 16: family u8, pad u8, type u16, index i32, flags u32, change u32
//!   ifaddrmsg  8: family u8, prefixlen u8, flags u8, scope u8, index u32
//!   rtmsg     12: family u8, dst_len u8, src_len u8, tos u8, table u8, protocol u8,
//!                 scope u8, type u8, flags u32
//!   nlmsgerr:     error i32 (0 = acknowledgement, else -errno), the request's nlmsghdr
//! ```
//!
//! The kernel's answers are parsed strictly: a header or attribute whose length runs past
//! what was received is [`Malformed`], never a panic or a read beyond it.

use std::net::IpAddr;

/// Length of `nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// Length of `ifinfomsg`.
pub const IFINFOMSG_LEN: usize = 16;
/// Length of `ifaddrmsg`.
pub const IFADDRMSG_LEN: usize = 8;
/// Length of `rtmsg`.
pub const RTMSG_LEN: usize = 12;
/// Length of `rtattr`'s own header.
const RTA_HDRLEN: usize = 4;
/// The bits of `rta_type` that are flags (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `NLA_F_NESTED`: the attribute holds attributes.
const NLA_F_NESTED: u16 = 0x8000;

/// `RT_TABLE_MAIN`.
pub const RT_TABLE_MAIN: u8 = 254;

/// Rounds up to the 4-byte alignment of netlink messages and attributes.
pub const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// An answer from the kernel that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink answer: {0}")]
pub struct Malformed(pub &'static str);

/// A request under construction: the header, a family header, then attributes.
#[derive(Debug, Clone)]
pub struct Request {
    buf: Vec<u8>,
}

impl Request {
    /// A message of type `kind` (`RTM_*`) with `flags` (`NLM_F_*`); length and sequence
    /// number are filled in by [`Request::finish`].
    pub fn new(kind: u16, flags: u16) -> Request {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        Request { buf }
    }

    /// Appends a family header (`ifinfomsg`, `ifaddrmsg`, `rtmsg`).
    pub fn header(mut self, bytes: &[u8]) -> Request {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    /// Appends one attribute.
    pub fn attr(mut self, kind: u16, payload: &[u8]) -> Request {
        // Attributes here are at most a name or an IPv6 address long.
        let len = u16::try_from(RTA_HDRLEN + payload.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    /// Appends a nested attribute (`NLA_F_NESTED` set) holding what `inner` appends.
    pub fn nested(mut self, kind: u16, inner: impl FnOnce(Request) -> Request) -> Request {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        let mut this = inner(self);
        let len = u16::try_from(this.buf.len() - start).unwrap_or(u16::MAX);
        this.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        this
    }

    /// Appends a big-endian `u32` attribute (nf_tables' integers).
    pub fn attr_be32(self, kind: u16, value: u32) -> Request {
        self.attr(kind, &value.to_be_bytes())
    }

    /// Appends a `u32` attribute.
    pub fn attr_u32(self, kind: u16, value: u32) -> Request {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// Appends an address attribute: 4 or 16 bytes.
    pub fn attr_ip(self, kind: u16, addr: IpAddr) -> Request {
        match addr {
            IpAddr::V4(a) => self.attr(kind, &a.octets()),
            IpAddr::V6(a) => self.attr(kind, &a.octets()),
        }
    }

    /// The finished message with sequence number `seq`.
    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }

    fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }
}

/// `ifinfomsg`.
pub fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut b = [0u8; IFINFOMSG_LEN];
    // family AF_UNSPEC, pad, type 0.
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `ifaddrmsg` (flags 0, scope universe).
pub fn ifaddrmsg(family: u8, prefix_len: u8, index: u32) -> [u8; IFADDRMSG_LEN] {
    let mut b = [0u8; IFADDRMSG_LEN];
    b[0] = family;
    b[1] = prefix_len;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// The fields of `rtmsg` a request sets (source length, TOS and flags are 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtMsg {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// Destination prefix length.
    pub dst_len: u8,
    /// `RT_TABLE_*`.
    pub table: u8,
    /// `RTPROT_*`.
    pub protocol: u8,
    /// `RT_SCOPE_*`.
    pub scope: u8,
    /// `RTN_*`.
    pub kind: u8,
}

impl RtMsg {
    /// The 12 bytes.
    pub fn bytes(&self) -> [u8; RTMSG_LEN] {
        let mut b = [0u8; RTMSG_LEN];
        b[0] = self.family;
        b[1] = self.dst_len;
        b[4] = self.table;
        b[5] = self.protocol;
        b[6] = self.scope;
        b[7] = self.kind;
        b
    }

    /// Reads the header of a route message.
    pub fn parse(payload: &[u8]) -> Result<RtMsg, Malformed> {
        let b = payload
            .get(..RTMSG_LEN)
            .ok_or(Malformed("route message shorter than rtmsg"))?;
        Ok(RtMsg {
            family: b[0],
            dst_len: b[1],
            table: b[4],
            protocol: b[5],
            scope: b[6],
            kind: b[7],
        })
    }
}

/// One message of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// What follows the header, up to the message's length.
    pub payload: &'a [u8],
}

/// Splits one received datagram into its messages.
pub fn messages(mut buf: &[u8]) -> Result<Vec<Message<'_>>, Malformed> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let hdr = buf
            .get(..NLMSG_HDRLEN)
            .ok_or(Malformed("truncated message header"))?;
        let len = usize::try_from(ne_u32(&hdr[0..4])).unwrap_or(usize::MAX);
        if len < NLMSG_HDRLEN {
            return Err(Malformed("message length below its header's"));
        }
        let msg = buf
            .get(..len)
            .ok_or(Malformed("message length past the end of the datagram"))?;
        out.push(Message {
            kind: ne_u16(&hdr[4..6]),
            seq: ne_u32(&hdr[8..12]),
            payload: &msg[NLMSG_HDRLEN..],
        });
        buf = buf.get(align(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// The attributes after a family header of `header_len` bytes, type flags masked off.
pub fn attributes(payload: &[u8], header_len: usize) -> Result<Vec<(u16, &[u8])>, Malformed> {
    let mut rest = payload
        .get(align(header_len)..)
        .ok_or(Malformed("message shorter than its family header"))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let hdr = rest
            .get(..RTA_HDRLEN)
            .ok_or(Malformed("truncated attribute header"))?;
        let len = usize::from(ne_u16(&hdr[0..2]));
        if len < RTA_HDRLEN {
            return Err(Malformed("attribute length below its header's"));
        }
        let attr = rest
            .get(..len)
            .ok_or(Malformed("attribute length past the end of its message"))?;
        out.push((ne_u16(&hdr[2..4]) & NLA_TYPE_MASK, &attr[RTA_HDRLEN..]));
        rest = rest.get(align(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// The error code of an `NLMSG_ERROR` payload: 0 for an acknowledgement, else a negative
/// errno.
pub fn error_code(payload: &[u8]) -> Result<i32, Malformed> {
    let b = payload
        .get(..4)
        .ok_or(Malformed("truncated error message"))?;
    Ok(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// A `u32` attribute's value.
pub fn u32_attr(payload: &[u8]) -> Result<u32, Malformed> {
    match payload {
        [a, b, c, d] => Ok(u32::from_ne_bytes([*a, *b, *c, *d])),
        _ => Err(Malformed("u32 attribute of the wrong length")),
    }
}

/// An address attribute's value for `family` (`AF_INET` 4 bytes, `AF_INET6` 16).
pub fn ip_attr(family: u8, payload: &[u8]) -> Result<IpAddr, Malformed> {
    let wrong = Malformed("address attribute of the wrong length for its family");
    match i32::from(family) {
        libc::AF_INET => <[u8; 4]>::try_from(payload)
            .map(IpAddr::from)
            .map_err(|_| wrong),
        libc::AF_INET6 => <[u8; 16]>::try_from(payload)
            .map(IpAddr::from)
            .map_err(|_| wrong),
        _ => Err(Malformed("address of an unknown family")),
    }
}

/// A string attribute's value (up to its terminating NUL).
pub fn str_attr(payload: &[u8]) -> Result<String, Malformed> {
    let end = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    std::str::from_utf8(&payload[..end])
        .map(str::to_owned)
        .map_err(|_| Malformed("name attribute not UTF-8"))
}

fn ne_u16(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}

fn ne_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod nested_tests {
    use super::*;

    #[test]
    fn a_nested_attribute_measures_what_it_holds() {
        let msg = Request::new(1, 0)
            .nested(4, |r| r.attr_be32(1, 0x0102_0304).attr(2, b"ab"))
            .finish(7);
        // Header, then the nest: length 4 + 8 + 8 = 20, type 4 | NLA_F_NESTED.
        assert_eq!(&msg[16..18], &20u16.to_ne_bytes());
        assert_eq!(&msg[18..20], &(4u16 | 0x8000).to_ne_bytes());
        assert_eq!(&msg[24..28], &[1, 2, 3, 4]);
        assert_eq!(&msg[30..32], &2u16.to_ne_bytes());
        assert_eq!(msg.len(), 36);
        let attrs = attributes(&msg[NLMSG_HDRLEN..], 0).expect("parses");
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs[0].0, 4);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    /// `ip route add 10.0.0.0/8 dev 5 via 192.0.2.1 metric 7` as this module builds it for
    /// sequence 9, laid out by hand from the layout above (x86-64: little endian).
    #[test]
    fn a_route_request_has_the_exact_bytes() {
        let msg = Request::new(libc::RTM_NEWROUTE, 0x0605)
            .header(
                &RtMsg {
                    family: 2,
                    dst_len: 8,
                    table: RT_TABLE_MAIN,
                    protocol: 3,
                    scope: 0,
                    kind: 1,
                }
                .bytes(),
            )
            .attr_ip(libc::RTA_DST, "10.0.0.0".parse().unwrap())
            .attr_u32(libc::RTA_OIF, 5)
            .attr_ip(libc::RTA_GATEWAY, "192.0.2.1".parse().unwrap())
            .attr_u32(libc::RTA_PRIORITY, 7)
            .finish(9);
        #[rustfmt::skip]
        let want: [u8; 60] = [
            60, 0, 0, 0,   24, 0,   0x05, 0x06,   9, 0, 0, 0,   0, 0, 0, 0, // nlmsghdr
            2, 8, 0, 0,   254, 3, 0, 1,   0, 0, 0, 0,                        // rtmsg
            8, 0, 1, 0,   10, 0, 0, 0,                                        // RTA_DST
            8, 0, 4, 0,   5, 0, 0, 0,                                         // RTA_OIF
            8, 0, 5, 0,   192, 0, 2, 1,                                       // RTA_GATEWAY
            8, 0, 6, 0,   7, 0, 0, 0,                                         // RTA_PRIORITY
        ];
        if cfg!(target_endian = "little") {
            assert_eq!(msg, want);
        }
        assert_eq!(msg.len(), 60);
    }

    #[test]
    fn a_name_attribute_is_padded_to_four_bytes() {
        let msg = Request::new(libc::RTM_GETLINK, 1)
            .header(&ifinfomsg(0, 0, 0))
            .attr(libc::IFLA_IFNAME, b"tun0\0")
            .finish(1);
        // 16 + 16 + (4 + 5 → 12).
        assert_eq!(msg.len(), 44);
        assert_eq!(&msg[32..41], &[9, 0, 3, 0, b't', b'u', b'n', b'0', 0]);
        assert_eq!(&msg[41..], &[0, 0, 0]);
    }

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(
            &u32::try_from(NLMSG_HDRLEN + payload.len())
                .unwrap()
                .to_ne_bytes(),
        );
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align(m.len()), 0);
        m
    }

    #[test]
    fn a_dump_with_two_messages_and_done_splits_and_its_attributes_parse() {
        let addr = |ip: [u8; 4]| {
            let mut p = ifaddrmsg(2, 24, 3).to_vec();
            p.extend_from_slice(&[8, 0, 1, 0]);
            p.extend_from_slice(&ip);
            // A flagged type (NLA_F_NESTED) reads as its plain type.
            p.extend_from_slice(&[8, 0, 2, 0x80]);
            p.extend_from_slice(&ip);
            p
        };
        let mut datagram = message(libc::RTM_NEWADDR, 7, &addr([10, 0, 0, 1]));
        datagram.extend(message(libc::RTM_NEWADDR, 7, &addr([10, 0, 1, 1])));
        datagram.extend(message(libc::NLMSG_DONE as u16, 7, &0i32.to_ne_bytes()));
        let msgs = messages(&datagram).unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2].kind, libc::NLMSG_DONE as u16);
        let attrs = attributes(msgs[1].payload, IFADDRMSG_LEN).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].0, libc::IFA_ADDRESS);
        assert_eq!(attrs[1].0, libc::IFA_LOCAL);
        assert_eq!(
            ip_attr(2, attrs[1].1).unwrap(),
            "10.0.1.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_error_message_carries_the_negative_errno() {
        let datagram = message(libc::NLMSG_ERROR as u16, 4, &(-17i32).to_ne_bytes());
        let msgs = messages(&datagram).unwrap();
        assert_eq!(error_code(msgs[0].payload).unwrap(), -17);
    }

    #[test]
    fn truncation_and_overlong_lengths_are_errors() {
        let ok = message(libc::RTM_NEWLINK, 1, &[0u8; 16]);
        assert!(messages(&ok[..10]).is_err(), "truncated header");
        assert!(
            messages(&ok[..ok.len() - 1]).is_err(),
            "length past the end"
        );
        let mut short = ok.clone();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(messages(&short).is_err(), "length below the header");
        // An attribute claiming 200 bytes in a 24-byte payload.
        let mut payload = ifaddrmsg(2, 24, 3).to_vec();
        payload.extend_from_slice(&[200, 0, 1, 0, 10, 0, 0, 1]);
        assert!(attributes(&payload, IFADDRMSG_LEN).is_err());
        assert!(
            attributes(&payload[..4], IFADDRMSG_LEN).is_err(),
            "no family header"
        );
        assert!(u32_attr(&[1, 2, 3]).is_err());
        assert!(ip_attr(2, &[1, 2, 3, 4, 5]).is_err());
        assert!(ip_attr(10, &[1, 2, 3, 4]).is_err());
    }

    proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(msgs) = messages(&bytes) {
                for m in msgs {
                    let _ = error_code(m.payload);
                    let _ = RtMsg::parse(m.payload);
                    for header in [IFINFOMSG_LEN, IFADDRMSG_LEN, RTMSG_LEN] {
                        if let Ok(attrs) = attributes(m.payload, header) {
                            for (_, value) in attrs {
                                let _ = u32_attr(value);
                                let _ = ip_attr(2, value);
                                let _ = ip_attr(10, value);
                                let _ = str_attr(value);
                            }
                        }
                    }
                }
            }
        }
    }
}
