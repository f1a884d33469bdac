//! Link state, MTU, queue length, addresses and routes over rtnetlink, the way `ip link`,
//! `ip addr` and `ip route` would set them, without running `ip`.
//!
//! A netlink socket talks to the network namespace that was current for the thread that
//! *created* it. [`Netlink::open`] therefore creates its socket right there, on the calling
//! thread; there is no process-wide connection. To configure a namespace, enter it on a thread
//! (setns(2), e.g. the lab's `Netns::run_in`), open a runtime and a [`Netlink`] on that thread,
//! and use it there. The socket is registered with the current tokio runtime and may be used
//! from any of its workers, as it keeps the namespace it was created in.
//!
//! The messages are built and read here ([`wire`]), as upstream OpenVPN does with its own
//! netlink code, rather than by a general rtnetlink library: these few requests are all the
//! binaries send, and a general library's message model was about a fifth of `vpn-server`'s
//! program text, which is resident memory (see "Idle memory" in `docs/performance-notes.md`).

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(crate) mod wire;
pub use wire::Malformed;
use wire::{Request, RtMsg};

/// An IPv4 or IPv6 prefix: an address and a prefix length (`10.8.0.0/24`, `fd00::1/64`).
///
/// The address keeps its host bits (an interface address is a prefix too); use
/// [`IpPrefix::network`] for the masked form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    /// `addr/len`; fails if `len` exceeds 32 (IPv4) or 128 (IPv6).
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PrefixError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if len > max {
            return Err(PrefixError::LengthTooLong { len, max });
        }
        Ok(Self { addr, len })
    }

    /// A host prefix (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, len }
    }

    /// The address as given.
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }

    /// The same prefix with the host bits cleared.
    pub fn network(&self) -> Self {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Self {
            addr,
            len: self.len,
        }
    }

    /// Whether `addr` lies inside this prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        Self {
            addr,
            len: self.len,
        }
        .network()
            == self.network()
            && addr.is_ipv4() == self.addr.is_ipv4()
    }
}

impl From<ipnet::IpNet> for IpPrefix {
    /// The same prefix (an `IpNet`'s length is always valid for its family).
    fn from(net: ipnet::IpNet) -> Self {
        Self {
            addr: net.addr(),
            len: net.prefix_len(),
        }
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for IpPrefix {
    type Err = PrefixError;

    /// `ADDR/LEN`, or a bare address as a host prefix.
    fn from_str(s: &str) -> Result<Self, PrefixError> {
        let bad = || PrefixError::Syntax { text: s.to_owned() };
        match s.split_once('/') {
            Some((addr, len)) => {
                let addr = addr.parse().map_err(|_| bad())?;
                let len = len.parse().map_err(|_| bad())?;
                Self::new(addr, len)
            }
            None => Ok(Self::host(s.parse().map_err(|_| bad())?)),
        }
    }
}

/// A route to install: `dst` through device `dev`, optionally via `gateway`, with an optional
/// metric, in the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix (host bits are cleared before sending).
    pub dst: IpPrefix,
    /// Output device name.
    pub dev: String,
    /// Next hop; `None` for a directly connected (scope link) route.
    pub gateway: Option<IpAddr>,
    /// Route metric (`RTA_PRIORITY`); `None` leaves the kernel default.
    pub metric: Option<u32>,
    /// Preferred source address (`RTA_PREFSRC`, `ip route ... src A`); `None` lets the kernel
    /// choose.
    pub source: Option<IpAddr>,
    /// Routing table (`ip route ... table T`); `None` is the main table.
    pub table: Option<u32>,
}

/// A policy routing rule: packets carrying firewall mark `fwmark` look up `table` first
/// (`ip rule add fwmark M lookup T priority P`); a table without a matching route falls
/// through to the next rule (the main table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwmarkRule {
    /// IPv4 or IPv6 rules.
    pub family: Family,
    /// The mark.
    pub fwmark: u32,
    /// The table looked up.
    pub table: u32,
    /// The rule's priority (lower first; the main table's rule is 32766).
    pub priority: u32,
}

impl Route {
    /// `dst dev DEV`, no gateway, default metric.
    pub fn via_dev(dst: IpPrefix, dev: impl Into<String>) -> Self {
        Self {
            dst,
            dev: dev.into(),
            gateway: None,
            metric: None,
            source: None,
            table: None,
        }
    }
}

/// A route as the kernel reports it (see [`Netlink::routes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// Destination prefix (`0.0.0.0/0` or `::/0` for a default route).
    pub dst: IpPrefix,
    /// Output device index.
    pub oif: Option<u32>,
    /// Output device name, when the index names a link of this namespace.
    pub dev: Option<String>,
    /// Next hop.
    pub gateway: Option<IpAddr>,
    /// Metric (`RTA_PRIORITY`).
    pub metric: Option<u32>,
    /// Preferred source address (`RTA_PREFSRC`).
    pub source: Option<IpAddr>,
    /// Routing table id.
    pub table: u32,
}

/// State of one link (see [`Netlink::link`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// MTU.
    pub mtu: Option<u32>,
    /// Transmit queue length.
    pub txqueuelen: Option<u32>,
}

/// Address family filter for [`Netlink::routes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

/// A netlink (`NETLINK_ROUTE`) socket bound to the namespace of the thread that opened it.
///
/// One request at a time: each method sends its message and reads the kernel's answer
/// (matched by sequence number) before the next request goes out.
#[derive(Debug)]
pub struct Netlink {
    socket: AsyncFd<OwnedFd>,
    seq: AtomicU32,
    /// Held from a request's send to its last answer, so answers are not interleaved.
    busy: tokio::sync::Mutex<()>,
}

/// Receive buffer: larger than the kernel's dump messages (at most 32 KiB each).
const RECV_BUF: usize = 64 * 1024;

const REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const ACK: u16 = libc::NLM_F_ACK as u16;
const DUMP: u16 = libc::NLM_F_DUMP as u16;
const CREATE_EXCL: u16 = (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
const IFF_UP: u32 = libc::IFF_UP as u32;
/// ENODEV: the kernel's answer for a link name it does not know.
const ENODEV: i32 = 19;

impl Netlink {
    /// Opens a netlink socket on the calling thread (so in its current network namespace) and
    /// registers it with the current tokio runtime. Panics outside a runtime, like
    /// `tokio::spawn`.
    pub fn open() -> Result<Self, NetlinkError> {
        let open = || -> io::Result<Self> {
            let fd = rustix::net::socket_with(
                AddressFamily::NETLINK,
                SocketType::RAW,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
                // NETLINK_ROUTE is protocol 0.
                None,
            )?;
            rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))?;
            Ok(Self {
                socket: crate::reactor::register_fd(fd)?,
                seq: AtomicU32::new(0),
                busy: tokio::sync::Mutex::new(()),
            })
        };
        open().map_err(|source| NetlinkError::Open { source })
    }

    /// The MTU of the link the IPv4 default route (else the IPv6 one) leaves through; `None`
    /// without a default route.
    pub async fn default_route_mtu(&self) -> Result<Option<u32>, NetlinkError> {
        for family in [Family::V4, Family::V6] {
            let default = self
                .routes(family)
                .await?
                .into_iter()
                .filter(|r| r.dst.prefix_len() == 0 && r.table == u32::from(wire::RT_TABLE_MAIN))
                .find_map(|r| r.dev);
            if let Some(dev) = default {
                return Ok(self.link(&dev).await?.mtu);
            }
        }
        Ok(None)
    }

    /// Index of link `name`.
    pub async fn link_index(&self, name: &str) -> Result<u32, NetlinkError> {
        Ok(self.link(name).await?.index)
    }

    /// State of link `name`.
    pub async fn link(&self, name: &str) -> Result<LinkInfo, NetlinkError> {
        let mut ifname = name.as_bytes().to_vec();
        ifname.push(0);
        let req = Request::new(libc::RTM_GETLINK, REQUEST | ACK)
            .header(&wire::ifinfomsg(0, 0, 0))
            .attr(libc::IFLA_IFNAME, &ifname);
        let no_such_link = || NetlinkError::NoSuchLink {
            name: name.to_owned(),
        };
        let answers = match self.exchange("get link", req).await {
            Err(e) if e.raw_os_error() == Some(ENODEV) => return Err(no_such_link()),
            other => other?,
        };
        let (_, payload) = answers.first().ok_or_else(no_such_link)?;
        link_info(payload).map_err(|source| NetlinkError::Malformed {
            what: "get link",
            source,
        })
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, NetlinkError> {
        let req = Request::new(libc::RTM_GETLINK, REQUEST | DUMP).header(&wire::ifinfomsg(0, 0, 0));
        let answers = self.exchange("dump links", req).await?;
        answers
            .iter()
            .filter(|(kind, _)| *kind == libc::RTM_NEWLINK)
            .map(|(_, payload)| link_info(payload))
            .collect::<Result<_, _>>()
            .map_err(|source| NetlinkError::Malformed {
                what: "dump links",
                source,
            })
    }

    /// `ip link set NAME up`.
    pub async fn set_link_up(&self, name: &str) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link("set link up", wire::ifinfomsg(index, IFF_UP, IFF_UP), None)
            .await
    }

    /// `ip link set NAME down`.
    pub async fn set_link_down(&self, name: &str) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link("set link down", wire::ifinfomsg(index, 0, IFF_UP), None)
            .await
    }

    /// `ip link set NAME mtu MTU`.
    pub async fn set_mtu(&self, name: &str, mtu: u32) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let header = wire::ifinfomsg(index, 0, 0);
        self.set_link("set mtu", header, Some((libc::IFLA_MTU, mtu)))
            .await
    }

    /// `ip link set NAME txqueuelen LEN`.
    pub async fn set_txqueuelen(&self, name: &str, len: u32) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let header = wire::ifinfomsg(index, 0, 0);
        self.set_link("set txqueuelen", header, Some((libc::IFLA_TXQLEN, len)))
            .await
    }

    /// `ip addr add ADDR/LEN dev NAME`.
    pub async fn add_address(&self, name: &str, addr: IpPrefix) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let req = address_request(libc::RTM_NEWADDR, REQUEST | ACK | CREATE_EXCL, index, addr);
        self.exchange("add address", req).await?;
        Ok(())
    }

    /// `ip addr add ADDR/LEN dev NAME nodad`: an IPv6 address usable at once (no duplicate
    /// address detection, so never tentative); for IPv4 the same as [`Netlink::add_address`].
    pub async fn add_address_nodad(&self, name: &str, addr: IpPrefix) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let req = address_request(libc::RTM_NEWADDR, REQUEST | ACK | CREATE_EXCL, index, addr)
            .attr_u32(IFA_FLAGS, IFA_F_NODAD);
        self.exchange("add address", req).await?;
        Ok(())
    }

    /// `ip addr del ADDR/LEN dev NAME`.
    pub async fn del_address(&self, name: &str, addr: IpPrefix) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let req = address_request(libc::RTM_DELADDR, REQUEST | ACK, index, addr);
        self.exchange("delete address", req).await?;
        Ok(())
    }

    /// Addresses on link `name`, as prefixes.
    pub async fn addresses(&self, name: &str) -> Result<Vec<IpPrefix>, NetlinkError> {
        let index = self.link_index(name).await?;
        let req = Request::new(libc::RTM_GETADDR, REQUEST | DUMP).header(&wire::ifaddrmsg(
            libc::AF_UNSPEC as u8,
            0,
            index,
        ));
        let answers = self.exchange("dump addresses", req).await?;
        let mut out = Vec::new();
        for (kind, payload) in &answers {
            if *kind != libc::RTM_NEWADDR {
                continue;
            }
            let prefix = address_of(payload, index).map_err(|source| NetlinkError::Malformed {
                what: "dump addresses",
                source,
            })?;
            out.extend(prefix);
        }
        Ok(out)
    }

    /// `ip route add DST dev DEV [via GW] [metric M] [src A]` (protocol boot, main table).
    pub async fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let req = self
            .route_request(route, libc::RTM_NEWROUTE, CREATE_EXCL)
            .await?;
        self.exchange("add route", req).await?;
        Ok(())
    }

    /// `ip route del DST dev DEV [via GW] [metric M]`.
    pub async fn del_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let req = self.route_request(route, libc::RTM_DELROUTE, 0).await?;
        self.exchange("delete route", req).await?;
        Ok(())
    }

    /// `ip rule add fwmark M lookup T priority P`.
    pub async fn add_rule(&self, rule: &FwmarkRule) -> Result<(), NetlinkError> {
        self.exchange("add rule", rule_request(rule, RTM_NEWRULE, CREATE_EXCL))
            .await?;
        Ok(())
    }

    /// `ip rule del fwmark M lookup T priority P`.
    pub async fn del_rule(&self, rule: &FwmarkRule) -> Result<(), NetlinkError> {
        self.exchange("delete rule", rule_request(rule, RTM_DELRULE, 0))
            .await?;
        Ok(())
    }

    /// Unicast routes of the main table for `family` (what `ip route` / `ip -6 route` show).
    pub async fn routes(&self, family: Family) -> Result<Vec<RouteEntry>, NetlinkError> {
        let names: Vec<(u32, String)> = self
            .links()
            .await?
            .into_iter()
            .map(|l| (l.index, l.name))
            .collect();
        let family = match family {
            Family::V4 => libc::AF_INET as u8,
            Family::V6 => libc::AF_INET6 as u8,
        };
        let query = RtMsg {
            family,
            dst_len: 0,
            table: 0,
            protocol: 0,
            scope: 0,
            kind: 0,
        };
        let req = Request::new(libc::RTM_GETROUTE, REQUEST | DUMP).header(&query.bytes());
        let answers = self.exchange("dump routes", req).await?;
        let mut out = Vec::new();
        for (kind, payload) in &answers {
            if *kind != libc::RTM_NEWROUTE {
                continue;
            }
            let entry = route_entry(payload, &names).map_err(|source| NetlinkError::Malformed {
                what: "dump routes",
                source,
            })?;
            out.extend(entry.filter(|e| e.table == u32::from(wire::RT_TABLE_MAIN)));
        }
        Ok(out)
    }

    /// The message for `route`: as `ip route add` builds it, or for a delete (scope
    /// "nowhere" and protocol unspecified match any route with that destination, device,
    /// gateway and metric, as `ip route del` does).
    async fn route_request(
        &self,
        route: &Route,
        kind: u16,
        create: u16,
    ) -> Result<Request, NetlinkError> {
        if route
            .gateway
            .is_some_and(|gw| gw.is_ipv4() != route.dst.addr().is_ipv4())
        {
            return Err(NetlinkError::InvalidRoute {
                route: Box::new(route.clone()),
                reason: "gateway and destination differ in address family",
            });
        }
        let index = self.link_index(&route.dev).await?;
        let dst = route.dst.network();
        let delete = kind == libc::RTM_DELROUTE;
        let header = RtMsg {
            family: family_of(dst.addr()),
            dst_len: dst.prefix_len(),
            // Tables beyond 255 are named by RTA_TABLE alone.
            table: match route.table {
                None => wire::RT_TABLE_MAIN,
                Some(t) => u8::try_from(t).unwrap_or(0),
            },
            protocol: if delete { 0 } else { libc::RTPROT_BOOT },
            scope: match (delete, route.gateway) {
                (true, _) => libc::RT_SCOPE_NOWHERE,
                (false, Some(_)) => libc::RT_SCOPE_UNIVERSE,
                // As `ip route add DST dev DEV`: a directly connected route has link scope.
                (false, None) => libc::RT_SCOPE_LINK,
            },
            kind: libc::RTN_UNICAST,
        };
        let mut req = Request::new(kind, REQUEST | ACK | create)
            .header(&header.bytes())
            .attr_ip(libc::RTA_DST, dst.addr())
            .attr_u32(libc::RTA_OIF, index);
        if let Some(gw) = route.gateway {
            req = req.attr_ip(libc::RTA_GATEWAY, gw);
        }
        if let Some(metric) = route.metric {
            req = req.attr_u32(libc::RTA_PRIORITY, metric);
        }
        if let Some(src) = route.source {
            req = req.attr_ip(libc::RTA_PREFSRC, src);
        }
        if let Some(table) = route.table {
            req = req.attr_u32(libc::RTA_TABLE, table);
        }
        Ok(req)
    }

    async fn set_link(
        &self,
        what: &'static str,
        header: [u8; wire::IFINFOMSG_LEN],
        attr: Option<(u16, u32)>,
    ) -> Result<(), NetlinkError> {
        let mut req = Request::new(libc::RTM_SETLINK, REQUEST | ACK).header(&header);
        if let Some((kind, value)) = attr {
            req = req.attr_u32(kind, value);
        }
        self.exchange(what, req).await?;
        Ok(())
    }

    /// Sends `req` and collects the data messages of its answer (type, payload) until the
    /// acknowledgement or the end of the dump. A negative acknowledgement is the kernel's
    /// errno in [`NetlinkError::Request`].
    async fn exchange(
        &self,
        what: &'static str,
        req: Request,
    ) -> Result<Vec<(u16, Vec<u8>)>, NetlinkError> {
        let _busy = self.busy.lock().await;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let bytes = req.finish(seq);
        let io_err = |source| NetlinkError::Request { what, source };
        let malformed = |source| NetlinkError::Malformed { what, source };
        self.socket
            .async_io(Interest::WRITABLE, |fd| {
                rustix::net::sendto(
                    fd,
                    &bytes,
                    SendFlags::empty(),
                    &SocketAddrNetlink::new(0, 0),
                )
                .map_err(io::Error::from)
            })
            .await
            .map_err(io_err)?;
        let mut buf = vec![0u8; RECV_BUF];
        let mut data = Vec::new();
        loop {
            let n = self
                .socket
                .async_io(Interest::READABLE, |fd| {
                    rustix::net::recv(fd, &mut buf[..], RecvFlags::TRUNC)
                        .map(|(_, full)| full)
                        .map_err(io::Error::from)
                })
                .await
                .map_err(io_err)?;
            let datagram = buf
                .get(..n)
                .ok_or(Malformed("datagram larger than the receive buffer"))
                .map_err(malformed)?;
            for msg in wire::messages(datagram).map_err(malformed)? {
                if msg.seq != seq {
                    continue;
                }
                match i32::from(msg.kind) {
                    libc::NLMSG_NOOP => {}
                    libc::NLMSG_DONE => return Ok(data),
                    libc::NLMSG_ERROR => {
                        return match wire::error_code(msg.payload).map_err(malformed)? {
                            0 => Ok(data),
                            code => Err(io_err(io::Error::from_raw_os_error(-code))),
                        };
                    }
                    // A dump ends with NLMSG_DONE, any other request with its acknowledgement.
                    _ => data.push((msg.kind, msg.payload.to_vec())),
                }
            }
        }
    }
}

/// `RTM_NEWADDR` / `RTM_DELADDR` for `addr` on link `index`: the address as `IFA_LOCAL` and
/// `IFA_ADDRESS`, and for IPv4 shorter than /31 the broadcast address, as `ip addr add` sets
/// it.
fn address_request(kind: u16, flags: u16, index: u32, addr: IpPrefix) -> Request {
    let ip = addr.addr();
    let mut req = Request::new(kind, flags)
        .header(&wire::ifaddrmsg(family_of(ip), addr.prefix_len(), index))
        .attr_ip(libc::IFA_ADDRESS, ip)
        .attr_ip(libc::IFA_LOCAL, ip);
    if let IpAddr::V4(v4) = ip {
        if addr.prefix_len() < 31 {
            let host_bits = u32::MAX >> addr.prefix_len();
            let broadcast = Ipv4Addr::from(u32::from(v4) | host_bits);
            req = req.attr_ip(libc::IFA_BROADCAST, broadcast.into());
        }
    }
    req
}

fn family_of(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn link_info(payload: &[u8]) -> Result<LinkInfo, Malformed> {
    let header = payload
        .get(..wire::IFINFOMSG_LEN)
        .ok_or(Malformed("link message shorter than ifinfomsg"))?;
    let word = |at: usize| {
        u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let mut info = LinkInfo {
        index: word(4),
        name: String::new(),
        up: word(8) & IFF_UP != 0,
        mtu: None,
        txqueuelen: None,
    };
    for (kind, value) in wire::attributes(payload, wire::IFINFOMSG_LEN)? {
        match kind {
            libc::IFLA_IFNAME => info.name = wire::str_attr(value)?,
            libc::IFLA_MTU => info.mtu = Some(wire::u32_attr(value)?),
            libc::IFLA_TXQLEN => info.txqueuelen = Some(wire::u32_attr(value)?),
            _ => {}
        }
    }
    Ok(info)
}

/// The address of one `RTM_NEWADDR` message if it belongs to link `index`: `IFA_LOCAL` (the
/// interface's own address on point-to-point links) before `IFA_ADDRESS`.
fn address_of(payload: &[u8], index: u32) -> Result<Option<IpPrefix>, Malformed> {
    let header = payload
        .get(..wire::IFADDRMSG_LEN)
        .ok_or(Malformed("address message shorter than ifaddrmsg"))?;
    let (family, prefix_len) = (header[0], header[1]);
    if u32::from_ne_bytes([header[4], header[5], header[6], header[7]]) != index {
        return Ok(None);
    }
    let (mut local, mut address) = (None, None);
    for (kind, value) in wire::attributes(payload, wire::IFADDRMSG_LEN)? {
        match kind {
            libc::IFA_LOCAL => local = Some(wire::ip_attr(family, value)?),
            libc::IFA_ADDRESS => address = Some(wire::ip_attr(family, value)?),
            _ => {}
        }
    }
    Ok(local
        .or(address)
        .and_then(|ip| IpPrefix::new(ip, prefix_len).ok()))
}

/// `IFA_FLAGS` and its `IFA_F_NODAD` bit (`linux/if_addr.h`).
const IFA_FLAGS: u16 = 8;
const IFA_F_NODAD: u32 = 0x02;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
/// `struct fib_rule_hdr`: family, dst_len, src_len, tos, table, res1, res2, action, flags.
const FIB_RULE_HDR_LEN: usize = 12;
const FR_ACT_TO_TBL: u8 = 1;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;

/// The `RTM_NEWRULE` / `RTM_DELRULE` message for `rule`.
fn rule_request(rule: &FwmarkRule, kind: u16, create: u16) -> Request {
    let mut header = [0u8; FIB_RULE_HDR_LEN];
    header[0] = match rule.family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    };
    // The table in the header only when it fits; FRA_TABLE always.
    header[4] = u8::try_from(rule.table).unwrap_or(0);
    header[7] = FR_ACT_TO_TBL;
    Request::new(kind, REQUEST | ACK | create)
        .header(&header)
        .attr_u32(FRA_FWMARK, rule.fwmark)
        .attr_u32(FRA_TABLE, rule.table)
        .attr_u32(FRA_PRIORITY, rule.priority)
}

/// One `RTM_NEWROUTE` message as a [`RouteEntry`], if it is a unicast IPv4/IPv6 route.
fn route_entry(payload: &[u8], names: &[(u32, String)]) -> Result<Option<RouteEntry>, Malformed> {
    let header = RtMsg::parse(payload)?;
    let any: IpAddr = match i32::from(header.family) {
        libc::AF_INET => Ipv4Addr::UNSPECIFIED.into(),
        libc::AF_INET6 => Ipv6Addr::UNSPECIFIED.into(),
        _ => return Ok(None),
    };
    if header.kind != libc::RTN_UNICAST {
        return Ok(None);
    }
    let mut dst = any;
    let mut entry = RouteEntry {
        dst: IpPrefix::host(any),
        oif: None,
        dev: None,
        gateway: None,
        metric: None,
        source: None,
        table: u32::from(header.table),
    };
    for (kind, value) in wire::attributes(payload, wire::RTMSG_LEN)? {
        match kind {
            libc::RTA_DST => dst = wire::ip_attr(header.family, value)?,
            libc::RTA_GATEWAY => entry.gateway = Some(wire::ip_attr(header.family, value)?),
            libc::RTA_OIF => entry.oif = Some(wire::u32_attr(value)?),
            libc::RTA_PRIORITY => entry.metric = Some(wire::u32_attr(value)?),
            libc::RTA_PREFSRC => entry.source = Some(wire::ip_attr(header.family, value)?),
            libc::RTA_TABLE => entry.table = wire::u32_attr(value)?,
            _ => {}
        }
    }
    entry.dst = IpPrefix::new(dst, header.dst_len)
        .map_err(|_| Malformed("route prefix length longer than its address"))?;
    entry.dev = entry.oif.and_then(|i| {
        names
            .iter()
            .find(|(index, _)| *index == i)
            .map(|(_, n)| n.clone())
    });
    Ok(Some(entry))
}

/// A text that is not an `ADDR/LEN` prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// Not `ADDR` or `ADDR/LEN`.
    #[error("not an IP prefix: {text:?}")]
    Syntax {
        /// The text.
        text: String,
    },
    /// Prefix length larger than the address.
    #[error("prefix length {len} exceeds {max}")]
    LengthTooLong {
        /// Given length.
        len: u8,
        /// 32 or 128.
        max: u8,
    },
}

/// A netlink operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket")]
    Open {
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No link has this name in the socket's namespace.
    #[error("no network interface named {name:?}")]
    NoSuchLink {
        /// The name.
        name: String,
    },
    /// The route cannot be expressed as a netlink message (e.g. mixed address families).
    #[error("invalid route {route:?}: {reason}")]
    InvalidRoute {
        /// The route (boxed: the error stays small).
        route: Box<Route>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The kernel refused a request (its errno), or the socket failed.
    #[error("netlink {what} failed")]
    Request {
        /// The operation.
        what: &'static str,
        /// The kernel's errno, or the socket error.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer did not parse.
    #[error("netlink {what} failed")]
    Malformed {
        /// The operation.
        what: &'static str,
        /// What was wrong with it.
        #[source]
        source: Malformed,
    },
}

impl NetlinkError {
    /// The errno the kernel answered with, if this is a kernel refusal (e.g. 17 = `EEXIST`
    /// for a route or address that already exists).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            NetlinkError::Request { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the kernel refused because the address or route is already there (`EEXIST`).
    pub fn already_exists(&self) -> bool {
        self.raw_os_error() == Some(libc::EEXIST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let p: IpPrefix = "192.168.123.7/24".parse().unwrap();
        assert_eq!(p.network().to_string(), "192.168.123.0/24");
        assert!(p.contains("192.168.123.200".parse().unwrap()));
        assert!(!p.contains("192.168.124.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        let v6: IpPrefix = "fd8f:6d53:b97a:1::5/64".parse().unwrap();
        assert_eq!(v6.network().to_string(), "fd8f:6d53:b97a:1::/64");
        assert_eq!(
            "0.0.0.0/0"
                .parse::<IpPrefix>()
                .unwrap()
                .network()
                .prefix_len(),
            0
        );
        assert_eq!("10.0.0.1".parse::<IpPrefix>().unwrap().prefix_len(), 32);
        assert!("10.0.0.1/33".parse::<IpPrefix>().is_err());
        assert!("10.0.0.1/x".parse::<IpPrefix>().is_err());
    }
}
