//! Link state, MTU, queue length, addresses and routes over rtnetlink, the way `ip link`,
//! `ip addr` and `ip route` would set them, without running `ip`.
//!
//! A netlink socket talks to the network namespace that was current for the thread that
//! *created* it. [`Netlink::open`] therefore creates its socket right there, on the calling
//! thread; there is no process-wide connection. To configure a namespace, enter it on a thread
//! (setns(2), e.g. the lab's `Netns::run_in`), open a runtime and a [`Netlink`] on that thread,
//! and use it there. The connection's driver task is spawned onto the current tokio runtime;
//! it may run on any worker, as the socket keeps the namespace it was created in.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use futures_util::TryStreamExt;
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{AddressMessageBuilder, Handle, IpVersion, LinkUnspec, RouteMessageBuilder};
use tokio::task::JoinHandle;

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
}

impl Route {
    /// `dst dev DEV`, no gateway, default metric.
    pub fn via_dev(dst: IpPrefix, dev: impl Into<String>) -> Self {
        Self {
            dst,
            dev: dev.into(),
            gateway: None,
            metric: None,
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

/// A netlink (`NETLINK_ROUTE`) connection bound to the namespace of the thread that opened it.
#[derive(Debug)]
pub struct Netlink {
    handle: Handle,
    driver: JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Netlink {
    /// Opens a netlink socket on the calling thread (so in its current network namespace) and
    /// spawns the connection driver onto the current tokio runtime. Panics outside a runtime,
    /// like `tokio::spawn`.
    pub fn open() -> Result<Self, NetlinkError> {
        let (connection, handle, _messages) =
            rtnetlink::new_connection().map_err(|source| NetlinkError::Open { source })?;
        let driver = tokio::spawn(connection);
        Ok(Self { handle, driver })
    }

    /// Index of link `name`.
    pub async fn link_index(&self, name: &str) -> Result<u32, NetlinkError> {
        Ok(self.link(name).await?.index)
    }

    /// State of link `name`.
    pub async fn link(&self, name: &str) -> Result<LinkInfo, NetlinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        let found = links.try_next().await.map_err(|source| {
            // ENODEV is the kernel's answer for an unknown name.
            if os_error(&source) == Some(19) {
                NetlinkError::NoSuchLink {
                    name: name.to_owned(),
                }
            } else {
                NetlinkError::Request {
                    what: "get link",
                    source,
                }
            }
        })?;
        let Some(msg) = found else {
            return Err(NetlinkError::NoSuchLink {
                name: name.to_owned(),
            });
        };
        Ok(link_info(&msg))
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, NetlinkError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "dump links",
                source,
            })?;
        Ok(msgs.iter().map(link_info).collect())
    }

    /// `ip link set NAME up`.
    pub async fn set_link_up(&self, name: &str) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link(
            LinkUnspec::new_with_index(index).up().build(),
            "set link up",
        )
        .await
    }

    /// `ip link set NAME down`.
    pub async fn set_link_down(&self, name: &str) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link(
            LinkUnspec::new_with_index(index).down().build(),
            "set link down",
        )
        .await
    }

    /// `ip link set NAME mtu MTU`.
    pub async fn set_mtu(&self, name: &str, mtu: u32) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link(
            LinkUnspec::new_with_index(index).mtu(mtu).build(),
            "set mtu",
        )
        .await
    }

    /// `ip link set NAME txqueuelen LEN`.
    pub async fn set_txqueuelen(&self, name: &str, len: u32) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.set_link(
            LinkUnspec::new_with_index(index).txqueuelen(len).build(),
            "set txqueuelen",
        )
        .await
    }

    /// `ip addr add ADDR/LEN dev NAME`.
    pub async fn add_address(&self, name: &str, addr: IpPrefix) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        self.handle
            .address()
            .add(index, addr.addr(), addr.prefix_len())
            .execute()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "add address",
                source,
            })
    }

    /// `ip addr del ADDR/LEN dev NAME`.
    pub async fn del_address(&self, name: &str, addr: IpPrefix) -> Result<(), NetlinkError> {
        let index = self.link_index(name).await?;
        let msg: AddressMessage = match addr.addr() {
            IpAddr::V4(a) => AddressMessageBuilder::<Ipv4Addr>::new()
                .index(index)
                .address(a, addr.prefix_len())
                .build(),
            IpAddr::V6(a) => AddressMessageBuilder::<Ipv6Addr>::new()
                .index(index)
                .address(a, addr.prefix_len())
                .build(),
        };
        self.handle
            .address()
            .del(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "delete address",
                source,
            })
    }

    /// Addresses on link `name`, as prefixes.
    pub async fn addresses(&self, name: &str) -> Result<Vec<IpPrefix>, NetlinkError> {
        use rtnetlink::packet_route::address::AddressAttribute;
        let index = self.link_index(name).await?;
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "dump addresses",
                source,
            })?;
        let mut out = Vec::new();
        for msg in msgs.iter().filter(|m| m.header.index == index) {
            // IFA_LOCAL is the interface's own address on point-to-point links; prefer it.
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address) {
                if let Ok(prefix) = IpPrefix::new(ip, msg.header.prefix_len) {
                    out.push(prefix);
                }
            }
        }
        Ok(out)
    }

    /// `ip route add DST dev DEV [via GW] [metric M]` (protocol boot, main table).
    pub async fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let msg = self.route_message(route).await?;
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "add route",
                source,
            })
    }

    /// `ip route del DST dev DEV [via GW] [metric M]`.
    pub async fn del_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let mut msg = self.route_message(route).await?;
        // As `ip route del`: any scope, any protocol.
        msg.header.scope = RouteScope::NoWhere;
        msg.header.protocol = RouteProtocol::Unspec;
        self.handle
            .route()
            .del(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "delete route",
                source,
            })
    }

    /// Unicast routes of the main table for `family` (what `ip route` / `ip -6 route` show).
    pub async fn routes(&self, family: Family) -> Result<Vec<RouteEntry>, NetlinkError> {
        let names: Vec<(u32, String)> = self
            .links()
            .await?
            .into_iter()
            .map(|l| (l.index, l.name))
            .collect();
        let version = match family {
            Family::V4 => IpVersion::V4,
            Family::V6 => IpVersion::V6,
        };
        let query = match version {
            IpVersion::V4 => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpVersion::V6 => RouteMessageBuilder::<Ipv6Addr>::new().build(),
        };
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|source| NetlinkError::Request {
                what: "dump routes",
                source,
            })?;
        let mut out = Vec::new();
        for msg in &msgs {
            if msg.header.kind != RouteType::Unicast {
                continue;
            }
            if let Some(entry) = route_entry(msg, &names) {
                if entry.table
                    == u32::from(rtnetlink::packet_route::route::RouteHeader::RT_TABLE_MAIN)
                {
                    out.push(entry);
                }
            }
        }
        Ok(out)
    }

    async fn route_message(&self, route: &Route) -> Result<RouteMessage, NetlinkError> {
        let index = self.link_index(&route.dev).await?;
        let dst = route.dst.network();
        let invalid = |reason| NetlinkError::InvalidRoute {
            route: route.clone(),
            reason,
        };
        if route
            .gateway
            .is_some_and(|gw| gw.is_ipv4() != dst.addr().is_ipv4())
        {
            return Err(invalid("gateway and destination differ in address family"));
        }
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .map_err(|_| invalid("destination prefix"))?
            .output_interface(index)
            .protocol(RouteProtocol::Boot);
        builder = match route.gateway {
            Some(gw) => builder.gateway(gw).map_err(|_| invalid("gateway"))?,
            // As `ip route add DST dev DEV`: a directly connected route has link scope.
            None => builder.scope(RouteScope::Link),
        };
        if let Some(metric) = route.metric {
            builder = builder.priority(metric);
        }
        Ok(builder.build())
    }

    async fn set_link(&self, msg: LinkMessage, what: &'static str) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::Request { what, source })
    }
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        up: msg.header.flags.contains(LinkFlags::Up),
        mtu: None,
        txqueuelen: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => info.name.clone_from(name),
            LinkAttribute::Mtu(mtu) => info.mtu = Some(*mtu),
            LinkAttribute::TxQueueLen(len) => info.txqueuelen = Some(*len),
            _ => {}
        }
    }
    info
}

fn route_entry(msg: &RouteMessage, names: &[(u32, String)]) -> Option<RouteEntry> {
    let family_any: IpAddr = match msg.header.address_family {
        AddressFamily::Inet => Ipv4Addr::UNSPECIFIED.into(),
        AddressFamily::Inet6 => Ipv6Addr::UNSPECIFIED.into(),
        _ => return None,
    };
    let mut dst = family_any;
    let mut entry = RouteEntry {
        dst: IpPrefix::host(family_any),
        oif: None,
        dev: None,
        gateway: None,
        metric: None,
        table: u32::from(msg.header.table),
    };
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = route_addr(a)?,
            RouteAttribute::Gateway(a) => entry.gateway = route_addr(a),
            RouteAttribute::Oif(i) => entry.oif = Some(*i),
            RouteAttribute::Priority(p) => entry.metric = Some(*p),
            RouteAttribute::Table(t) => entry.table = *t,
            _ => {}
        }
    }
    entry.dst = IpPrefix::new(dst, msg.header.destination_prefix_length).ok()?;
    entry.dev = entry.oif.and_then(|i| {
        names
            .iter()
            .find(|(index, _)| *index == i)
            .map(|(_, n)| n.clone())
    });
    Some(entry)
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn os_error(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => Some(-msg.raw_code()).filter(|c| *c > 0),
        _ => None,
    }
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
        /// The route.
        route: Route,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The kernel refused a request, or the connection failed.
    #[error("netlink {what} failed")]
    Request {
        /// The operation.
        what: &'static str,
        /// The kernel's or the library's error.
        #[source]
        source: rtnetlink::Error,
    },
}

impl NetlinkError {
    /// The errno the kernel answered with, if this is a kernel refusal (e.g. 17 = `EEXIST`
    /// for a route or address that already exists).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            NetlinkError::Request { source, .. } => os_error(source),
            _ => None,
        }
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
