//! The arguments of one directive, and the value parsers the main config's directive
//! families and the client-config-dir file share. Every parser returns the
//! [`ErrorReason`] its directive reports at its line.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::str::FromStr;

use ipnet::{Ipv4Net, Ipv6Net};

use super::lex::Directive;
use super::model::Family;
use super::{ErrorReason, Source};
use crate::key::{KeyDirection, Role};

/// The arguments of one directive.
pub(super) struct Args<'a>(pub(super) &'a Directive);

impl Args<'_> {
    /// Checks the argument count.
    pub(super) fn count(
        &self,
        min: usize,
        max: usize,
        expected: &'static str,
    ) -> Result<(), ErrorReason> {
        let n = self.0.args.len();
        if n < min {
            return Err(ErrorReason::MissingArgument { expected });
        }
        if n > max {
            return Err(ErrorReason::TooManyArguments { max });
        }
        Ok(())
    }

    /// Argument `i` (after [`Args::count`] made sure it exists; else empty).
    pub(super) fn s(&self, i: usize) -> &str {
        self.0.args.get(i).map_or("", String::as_str)
    }

    /// Argument `i`, if given.
    pub(super) fn opt(&self, i: usize) -> Option<&str> {
        self.0.args.get(i).map(String::as_str)
    }

    /// The directive's name.
    pub(super) fn name(&self) -> &str {
        &self.0.name
    }

    /// The directive's line.
    pub(super) fn line(&self) -> usize {
        self.0.line
    }
}

pub(super) fn bad(value: &str, expected: &'static str) -> ErrorReason {
    ErrorReason::BadArgument {
        value: value.to_owned(),
        expected,
    }
}

pub(super) fn path_source(s: &str) -> Source {
    Source::Path(PathBuf::from(s))
}

/// `tcp-server`, `tcp4-client`, `tcp6`, ...: the socket's family and, with a `-server` or
/// `-client` suffix, the role it implies. UDP is refused here, with its own reason.
pub(super) fn parse_proto(s: &str) -> Result<(Family, Option<Role>), ErrorReason> {
    let (base, role) = if let Some(b) = s.strip_suffix("-server") {
        (b, Some(Role::Server))
    } else if let Some(b) = s.strip_suffix("-client") {
        (b, Some(Role::Client))
    } else {
        (s, None)
    };
    let family = match base {
        "tcp" => Family::Any,
        "tcp4" => Family::V4,
        "tcp6" => Family::V6,
        "udp" | "udp4" | "udp6" => {
            return Err(ErrorReason::TcpOnly {
                proto: s.to_owned(),
            })
        }
        _ => return Err(bad(s, "tcp-server, tcp-client, tcp4-*, tcp6-* or tcp")),
    };
    Ok((family, role))
}

pub(super) fn key_direction(s: &str) -> Result<KeyDirection, ErrorReason> {
    KeyDirection::from_arg(s).ok_or_else(|| bad(s, "0 or 1"))
}

pub(super) fn u32_arg(s: &str) -> Result<u32, ErrorReason> {
    s.parse().map_err(|_| bad(s, "a non-negative number"))
}

pub(super) fn u64_arg(s: &str) -> Result<u64, ErrorReason> {
    s.parse().map_err(|_| bad(s, "a non-negative number"))
}

/// A small number up to `max` (`verb`, `script-security`).
pub(super) fn small(s: &str, max: u8, expected: &'static str) -> Result<u8, ErrorReason> {
    match s.parse::<u8>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(bad(s, expected)),
    }
}

pub(super) fn port(s: &str) -> Result<u16, ErrorReason> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(s, "a port 1-65535")),
    }
}

pub(super) fn ipv4(s: &str) -> Result<Ipv4Addr, ErrorReason> {
    Ipv4Addr::from_str(s).map_err(|_| bad(s, "an IPv4 address"))
}

pub(super) fn ipv6(s: &str) -> Result<Ipv6Addr, ErrorReason> {
    Ipv6Addr::from_str(s).map_err(|_| bad(s, "an IPv6 address"))
}

/// `ADDR/BITS` (the address may have host bits set).
pub(super) fn ipv6_net(s: &str) -> Result<Ipv6Net, ErrorReason> {
    Ipv6Net::from_str(s).map_err(|_| bad(s, "an IPv6 network ADDR/BITS"))
}

/// The prefix length of a dotted netmask.
pub(super) fn netmask_bits(s: &str) -> Result<u8, ErrorReason> {
    let mask = ipv4(s).map_err(|_| bad(s, "a dotted netmask"))?;
    let m = u32::from(mask);
    if m.leading_ones() + m.trailing_zeros() != 32 {
        return Err(ErrorReason::BadNetmask { mask: s.to_owned() });
    }
    // At most 32, so it fits.
    Ok(u8::try_from(m.leading_ones()).unwrap_or(32))
}

/// `NETWORK NETMASK` as a network; host bits are an error.
pub(super) fn ipv4_net(net: &str, mask: &str) -> Result<Ipv4Net, ErrorReason> {
    let addr = ipv4(net)?;
    let bits = netmask_bits(mask)?;
    let n = Ipv4Net::new(addr, bits).map_err(|_| ErrorReason::BadNetmask {
        mask: mask.to_owned(),
    })?;
    if n.network() != addr {
        return Err(ErrorReason::NotNetworkAddress {
            network: format!("{net} {mask}"),
        });
    }
    Ok(n)
}
