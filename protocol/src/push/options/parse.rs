//! [`PushedOption::from_tokens`]: one match from the option's kind to its parser, the parsers
//! grouped by family (the interface, routes, keepalive, DNS, the data channel and session,
//! the rest). Each checks the argument count first, then the arguments in order, so the
//! first wrong one is the one reported.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;

use super::{
    AuthToken, CompLzo, Compress, DhcpOption, KeyDerivation, OptionError, OptionKind,
    ProtocolFlags, PushedOption, RedirectFlags, Route, RouteGatewayAddr, RouteIpv6, RouteVia,
    SocketFlags, Topology,
};
use crate::ids::PeerId;

/// No option we model takes more arguments than the tokenizer delivers.
const MAX_ARGS: usize = super::super::tokenize::MAX_PARMS;

impl PushedOption {
    /// Builds the typed option of `kind` from its tokens (`tokens[0]` is the name) and the
    /// option text (for errors).
    pub fn from_tokens(
        kind: OptionKind,
        tokens: &[String],
        text: &str,
    ) -> Result<PushedOption, OptionError> {
        let a = Args { kind, tokens, text };
        match kind {
            // The interface.
            OptionKind::Ifconfig => ifconfig(&a),
            OptionKind::IfconfigIpv6 => ifconfig_ipv6(&a),
            OptionKind::Topology => topology(&a),
            OptionKind::TunMtu => tun_mtu(&a),
            OptionKind::TunIpv6 => a.none().map(|()| PushedOption::TunIpv6),
            // Routes.
            OptionKind::Route => route(&a),
            OptionKind::RouteIpv6 => route_ipv6(&a),
            OptionKind::RouteGateway => route_gateway(&a),
            OptionKind::RouteMetric => a.one_num().map(PushedOption::RouteMetric),
            OptionKind::RedirectGateway => redirect_flags(&a).map(PushedOption::RedirectGateway),
            OptionKind::RedirectPrivate => redirect_flags(&a).map(PushedOption::RedirectPrivate),
            // Keepalive.
            OptionKind::Ping => a.one_num().map(PushedOption::Ping),
            OptionKind::PingRestart => a.one_num().map(PushedOption::PingRestart),
            OptionKind::PingExit => a.one_num().map(PushedOption::PingExit),
            // DNS.
            OptionKind::DhcpOption => dhcp_option(&a),
            OptionKind::Dns => dns(&a),
            OptionKind::BlockOutsideDns => a.none().map(|()| PushedOption::BlockOutsideDns),
            OptionKind::RegisterDns => a.none().map(|()| PushedOption::RegisterDns),
            // The data channel and the session.
            OptionKind::PeerId => peer_id(&a),
            OptionKind::Cipher => a.one_string().map(PushedOption::Cipher),
            OptionKind::KeyDerivation => key_derivation(&a),
            OptionKind::ProtocolFlags => protocol_flags(&a),
            OptionKind::CompLzo => comp_lzo(&a),
            OptionKind::Compress => compress(&a),
            OptionKind::AuthToken => a
                .one_string()
                .map(|token| PushedOption::AuthToken(AuthToken(token))),
            // The rest.
            OptionKind::SocketFlags => socket_flags(&a),
            OptionKind::Echo => Ok(PushedOption::Echo(a.rest())),
            OptionKind::Setenv => setenv(&a),
            OptionKind::PushContinuation => push_continuation(&a),
        }
    }
}

// The interface.

fn ifconfig(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(2, 2)?;
    Ok(PushedOption::Ifconfig {
        local: a.v4(1)?,
        remote_netmask: a.v4(2)?,
    })
}

fn ifconfig_ipv6(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 2)?;
    Ok(PushedOption::IfconfigIpv6 {
        local: a.v6net(1)?,
        remote: a.opt(2).map(|_| a.v6(2)).transpose()?,
    })
}

fn topology(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 1)?;
    Ok(PushedOption::Topology(match a.opt(1) {
        Some("net30") => Topology::Net30,
        Some("p2p") => Topology::P2p,
        Some("subnet") => Topology::Subnet,
        _ => return Err(a.bad_value(1)),
    }))
}

fn tun_mtu(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    let mtu = a.one_num()?;
    let mtu = u16::try_from(mtu).map_err(|_| a.bad_number(1))?;
    Ok(PushedOption::TunMtu(mtu))
}

// Routes.

/// `route NETWORK [NETMASK [GATEWAY [METRIC]]]`: the netmask must be contiguous; `default`
/// stands for a parameter not given.
fn route(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 4)?;
    let network = a.v4(1)?;
    let netmask = match a.route_parm(2) {
        Some(_) => a.v4(2)?,
        None => Ipv4Addr::BROADCAST,
    };
    let m = u32::from(netmask);
    if m.leading_ones() + m.trailing_zeros() != 32 {
        return Err(a.bad_address(2));
    }
    let gateway = match a.route_parm(3) {
        None => None,
        Some("vpn_gateway") => Some(RouteVia::VpnGateway),
        Some("net_gateway") => Some(RouteVia::NetGateway),
        Some("remote_host") => Some(RouteVia::RemoteHost),
        Some(_) => Some(RouteVia::Addr(a.v4(3)?)),
    };
    let metric = a.route_parm(4).map(|_| a.num(4)).transpose()?;
    Ok(PushedOption::Route(Route {
        network,
        netmask,
        gateway,
        metric,
    }))
}

fn route_ipv6(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 3)?;
    Ok(PushedOption::RouteIpv6(RouteIpv6 {
        network: a.v6net(1)?,
        gateway: a.route_parm(2).map(|_| a.v6(2)).transpose()?,
        metric: a.route_parm(3).map(|_| a.num(3)).transpose()?,
    }))
}

fn route_gateway(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 1)?;
    let gateway = if a.opt(1) == Some("dhcp") {
        RouteGatewayAddr::Dhcp
    } else {
        RouteGatewayAddr::Addr(a.v4(1)?)
    };
    Ok(PushedOption::RouteGateway(gateway))
}

/// The flags of `redirect-gateway` / `redirect-private`, any number of them.
fn redirect_flags(a: &Args<'_>) -> Result<RedirectFlags, OptionError> {
    let mut flags = RedirectFlags::default();
    for i in 1..a.tokens.len() {
        match a.opt(i) {
            Some("local") => flags.local = true,
            Some("autolocal") => flags.autolocal = true,
            Some("def1") => flags.def1 = true,
            Some("bypass-dhcp") => flags.bypass_dhcp = true,
            Some("bypass-dns") => flags.bypass_dns = true,
            Some("block-local") => flags.block_local = true,
            Some("ipv4") => flags.ipv4 = true,
            Some("!ipv4") => flags.ipv4 = false,
            Some("ipv6") => flags.ipv6 = true,
            Some("!ipv6") => flags.ipv6 = false,
            _ => return Err(a.bad_value(i)),
        }
    }
    Ok(flags)
}

// DNS.

/// `dhcp-option TYPE [VALUE...]`: the types we act on are checked, the others kept as text.
fn dhcp_option(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, MAX_ARGS)?;
    let dhcp = match a.opt(1) {
        Some("DNS") => {
            a.count(2, 2)?;
            let v = a.opt(2).unwrap_or("");
            DhcpOption::Dns(v.parse().map_err(|_| a.bad_address(2))?)
        }
        Some("DNS6") => {
            a.count(2, 2)?;
            DhcpOption::Dns6(a.v6(2)?)
        }
        Some("DOMAIN") => {
            a.count(2, 2)?;
            DhcpOption::Domain(a.string(2))
        }
        Some("DOMAIN-SEARCH") => {
            a.count(2, 2)?;
            DhcpOption::DomainSearch(a.string(2))
        }
        _ => DhcpOption::Other {
            kind: a.string(1),
            args: a.tokens.iter().skip(2).cloned().collect(),
        },
    };
    Ok(PushedOption::DhcpOption(dhcp))
}

fn dns(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, MAX_ARGS)?;
    Ok(PushedOption::Dns(a.rest()))
}

// The data channel and the session.

fn peer_id(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    let id = a.one_num()?;
    let id = PeerId::new(id).ok_or_else(|| a.bad_number(1))?;
    Ok(PushedOption::PeerId(id))
}

fn key_derivation(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 1)?;
    match a.opt(1) {
        Some("tls-ekm") => Ok(PushedOption::KeyDerivation(KeyDerivation::TlsEkm)),
        _ => Err(a.bad_value(1)),
    }
}

/// `protocol-flags FLAG...`: flags we do not know are kept, not refused.
fn protocol_flags(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, MAX_ARGS)?;
    let mut flags = ProtocolFlags::default();
    for t in a.tokens.iter().skip(1) {
        match t.as_str() {
            "cc-exit" => flags.cc_exit = true,
            "tls-ekm" => flags.tls_ekm = true,
            "dyn-tls-crypt" => flags.dyn_tls_crypt = true,
            other => flags.unknown.push(other.to_owned()),
        }
    }
    Ok(PushedOption::ProtocolFlags(flags))
}

fn comp_lzo(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(0, 1)?;
    Ok(PushedOption::CompLzo(match a.opt(1) {
        None | Some("adaptive") => CompLzo::Adaptive,
        Some("yes") => CompLzo::Yes,
        Some("no") => CompLzo::No,
        Some(_) => return Err(a.bad_value(1)),
    }))
}

fn compress(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(0, 1)?;
    Ok(PushedOption::Compress(match a.opt(1) {
        None | Some("stub") => Compress::Stub,
        Some("stub-v2") => Compress::StubV2,
        Some("lzo") => Compress::Lzo,
        Some("lz4") => Compress::Lz4,
        Some("lz4-v2") => Compress::Lz4V2,
        Some(_) => return Err(a.bad_value(1)),
    }))
}

// The rest.

/// `socket-flags FLAG...`: flags we do not know are kept, not refused.
fn socket_flags(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, MAX_ARGS)?;
    let mut flags = SocketFlags::default();
    for t in a.tokens.iter().skip(1) {
        match t.as_str() {
            "TCP_NODELAY" => flags.tcp_nodelay = true,
            other => flags.unknown.push(other.to_owned()),
        }
    }
    Ok(PushedOption::SocketFlags(flags))
}

fn setenv(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    a.count(1, 2)?;
    Ok(PushedOption::Setenv {
        name: a.string(1),
        value: a.opt(2).unwrap_or("").to_owned(),
    })
}

fn push_continuation(a: &Args<'_>) -> Result<PushedOption, OptionError> {
    let n = a.one_num()?;
    let n = u8::try_from(n).map_err(|_| a.bad_number(1))?;
    Ok(PushedOption::PushContinuation(n))
}

/// Argument access with errors that name the option.
struct Args<'a> {
    kind: OptionKind,
    tokens: &'a [String],
    text: &'a str,
}

impl Args<'_> {
    fn opt(&self, i: usize) -> Option<&str> {
        self.tokens.get(i).map(String::as_str)
    }

    fn string(&self, i: usize) -> String {
        self.opt(i).unwrap_or("").to_owned()
    }

    /// The arguments, all of them.
    fn rest(&self) -> Vec<String> {
        self.tokens.iter().skip(1).cloned().collect()
    }

    /// Upstream's `is_route_parm_defined`: absent or the word `default` means "not given".
    fn route_parm(&self, i: usize) -> Option<&str> {
        self.opt(i).filter(|&p| p != "default")
    }

    fn count(&self, min: usize, max: usize) -> Result<(), OptionError> {
        let n = self.tokens.len().saturating_sub(1);
        if n < min {
            Err(OptionError::MissingArgument {
                text: self.text.to_owned(),
                option: self.kind,
            })
        } else if n > max {
            Err(OptionError::ExtraArgument {
                text: self.text.to_owned(),
                option: self.kind,
            })
        } else {
            Ok(())
        }
    }

    /// An option without arguments.
    fn none(&self) -> Result<(), OptionError> {
        self.count(0, 0)
    }

    /// The one argument, a number.
    fn one_num(&self) -> Result<u32, OptionError> {
        self.count(1, 1)?;
        self.num(1)
    }

    /// The one argument, as text.
    fn one_string(&self) -> Result<String, OptionError> {
        self.count(1, 1)?;
        Ok(self.string(1))
    }

    fn v4(&self, i: usize) -> Result<Ipv4Addr, OptionError> {
        self.opt(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.bad_address(i))
    }

    fn v6(&self, i: usize) -> Result<Ipv6Addr, OptionError> {
        self.opt(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.bad_address(i))
    }

    /// `ADDR[/BITS]`, BITS defaulting to 128.
    fn v6net(&self, i: usize) -> Result<Ipv6Net, OptionError> {
        let v = self.opt(i).unwrap_or("");
        let (addr, bits) = v.split_once('/').unwrap_or((v, "128"));
        let addr: Ipv6Addr = addr.parse().map_err(|_| self.bad_address(i))?;
        let bits = parse_decimal(bits).ok_or_else(|| self.bad_address(i))?;
        let bits = u8::try_from(bits).map_err(|_| self.bad_address(i))?;
        Ipv6Net::new(addr, bits).map_err(|_| self.bad_address(i))
    }

    fn num(&self, i: usize) -> Result<u32, OptionError> {
        self.opt(i)
            .and_then(parse_decimal)
            .ok_or_else(|| self.bad_number(i))
    }

    fn bad_address(&self, i: usize) -> OptionError {
        OptionError::BadAddress {
            text: self.text.to_owned(),
            option: self.kind,
            value: self.string(i),
        }
    }

    fn bad_number(&self, i: usize) -> OptionError {
        OptionError::BadNumber {
            text: self.text.to_owned(),
            option: self.kind,
            value: self.string(i),
        }
    }

    fn bad_value(&self, i: usize) -> OptionError {
        OptionError::BadValue {
            text: self.text.to_owned(),
            option: self.kind,
            value: self.string(i),
        }
    }
}

/// A non-negative decimal number of digits only (no sign, no spaces, no trailing junk).
fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
