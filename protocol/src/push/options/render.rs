//! `impl Display for PushedOption`: the text of an option as a server pushes it, the one place
//! where our server writes option text ([`super::super::PushItem`] and
//! [`crate::ncp::ProtocolOption`] render through it).
//!
//! It is the inverse of the parser (`parse`): every option the parser can return renders to
//! text the parser reads back as the same option (`protocol/tests/push_render_props.rs`).
//! Addresses and numbers are written in their canonical form and keywords as upstream writes
//! them, one space apart, so the options our server builds are byte for byte what upstream
//! sends (`protocol/tests/push_golden.rs`). A free-text argument (a cipher name, `echo` or
//! `setenv` text, a DHCP domain, ...) is written bare when the tokenizer reads it back
//! unchanged as one token, else in double quotes with `\` and `"` escaped.
//!
//! A few values render to text the parser refuses; it never returns them, and nothing builds
//! them to send: `protocol-flags` or `socket-flags` without a flag (the parser wants at least
//! one), a `route` with a non-contiguous netmask, a `dhcp-option` of another type named `DNS`,
//! `DNS6`, `DOMAIN` or `DOMAIN-SEARCH`, a flag in `unknown` that is a known one, more than
//! [`MAX_PARMS`](super::super::tokenize::MAX_PARMS) tokens. Text with a comma or a control
//! character cannot be pushed at all ([`super::super::build_push_reply`] refuses it).
//!
//! An `auth-token` renders with its token (it is the text sent): log an option's `Debug`, never
//! its `Display`.

use std::fmt::{self, Display, Formatter};

use super::super::tokenize::is_c_space;
use super::{
    CompLzo, Compress, DhcpOption, KeyDerivation, PushedOption, RedirectFlags, Route,
    RouteGatewayAddr, RouteIpv6, RouteVia, Topology,
};

impl Display for PushedOption {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind().name())?;
        match self {
            // The interface.
            PushedOption::Ifconfig {
                local,
                remote_netmask,
            } => write!(f, " {local} {remote_netmask}"),
            PushedOption::IfconfigIpv6 { local, remote } => {
                write!(f, " {local}")?;
                remote.map_or(Ok(()), |r| write!(f, " {r}"))
            }
            PushedOption::Topology(t) => word(f, topology(*t)),
            PushedOption::TunMtu(mtu) => write!(f, " {mtu}"),
            PushedOption::TunIpv6 => Ok(()),
            // Routes.
            PushedOption::Route(r) => route(f, r),
            PushedOption::RouteIpv6(r) => route_ipv6(f, r),
            PushedOption::RouteGateway(RouteGatewayAddr::Addr(a)) => write!(f, " {a}"),
            PushedOption::RouteGateway(RouteGatewayAddr::Dhcp) => word(f, "dhcp"),
            PushedOption::RedirectGateway(flags) | PushedOption::RedirectPrivate(flags) => {
                redirect_flags(f, flags)
            }
            // Numbers: route-metric and keepalive.
            PushedOption::RouteMetric(n)
            | PushedOption::Ping(n)
            | PushedOption::PingRestart(n)
            | PushedOption::PingExit(n) => write!(f, " {n}"),
            // DNS.
            PushedOption::DhcpOption(d) => dhcp_option(f, d),
            PushedOption::Dns(args) => tokens(f, args),
            PushedOption::BlockOutsideDns | PushedOption::RegisterDns => Ok(()),
            // The data channel and the session.
            PushedOption::PeerId(id) => write!(f, " {}", id.get()),
            PushedOption::Cipher(name) => token(f, name),
            PushedOption::KeyDerivation(KeyDerivation::TlsEkm) => word(f, "tls-ekm"),
            PushedOption::ProtocolFlags(flags) => {
                flag(f, flags.cc_exit, "cc-exit")?;
                flag(f, flags.tls_ekm, "tls-ekm")?;
                flag(f, flags.dyn_tls_crypt, "dyn-tls-crypt")?;
                tokens(f, &flags.unknown)
            }
            PushedOption::CompLzo(mode) => word(f, comp_lzo(*mode)),
            PushedOption::Compress(algo) => word(f, compress(*algo)),
            PushedOption::AuthToken(t) => token(f, &t.0),
            // The rest.
            PushedOption::SocketFlags(flags) => {
                flag(f, flags.tcp_nodelay, "TCP_NODELAY")?;
                tokens(f, &flags.unknown)
            }
            PushedOption::Echo(args) => tokens(f, args),
            PushedOption::Setenv { name, value } => {
                token(f, name)?;
                // The parser reads a missing value as empty.
                if value.is_empty() {
                    return Ok(());
                }
                token(f, value)
            }
            PushedOption::PushContinuation(n) => write!(f, " {n}"),
        }
    }
}

// Routes.

/// `route NETWORK NETMASK [GATEWAY [METRIC]]`: the netmask always (the parser reads a missing
/// one as 255.255.255.255), `default` for a gateway not given before a metric, as upstream.
fn route(f: &mut Formatter<'_>, r: &Route) -> fmt::Result {
    write!(f, " {} {}", r.network, r.netmask)?;
    match (r.gateway, r.metric) {
        (None, None) => Ok(()),
        (gateway, metric) => {
            match gateway {
                None => word(f, "default")?,
                Some(RouteVia::Addr(a)) => write!(f, " {a}")?,
                Some(RouteVia::VpnGateway) => word(f, "vpn_gateway")?,
                Some(RouteVia::NetGateway) => word(f, "net_gateway")?,
                Some(RouteVia::RemoteHost) => word(f, "remote_host")?,
            }
            metric.map_or(Ok(()), |m| write!(f, " {m}"))
        }
    }
}

/// `route-ipv6 NETWORK/BITS [GATEWAY [METRIC]]`, `default` for a gateway not given before a
/// metric.
fn route_ipv6(f: &mut Formatter<'_>, r: &RouteIpv6) -> fmt::Result {
    write!(f, " {}", r.network)?;
    match (r.gateway, r.metric) {
        (None, None) => Ok(()),
        (gateway, metric) => {
            match gateway {
                None => word(f, "default")?,
                Some(g) => write!(f, " {g}")?,
            }
            metric.map_or(Ok(()), |m| write!(f, " {m}"))
        }
    }
}

/// The flags that are set; IPv4 redirection is on unless `!ipv4`, so only its absence is
/// written.
fn redirect_flags(f: &mut Formatter<'_>, flags: &RedirectFlags) -> fmt::Result {
    flag(f, flags.local, "local")?;
    flag(f, flags.autolocal, "autolocal")?;
    flag(f, flags.def1, "def1")?;
    flag(f, flags.bypass_dhcp, "bypass-dhcp")?;
    flag(f, flags.bypass_dns, "bypass-dns")?;
    flag(f, flags.block_local, "block-local")?;
    flag(f, !flags.ipv4, "!ipv4")?;
    flag(f, flags.ipv6, "ipv6")
}

// DNS.

fn dhcp_option(f: &mut Formatter<'_>, d: &DhcpOption) -> fmt::Result {
    match d {
        DhcpOption::Dns(a) => write!(f, " DNS {a}"),
        DhcpOption::Dns6(a) => write!(f, " DNS6 {a}"),
        DhcpOption::Domain(name) => {
            word(f, "DOMAIN")?;
            token(f, name)
        }
        DhcpOption::DomainSearch(name) => {
            word(f, "DOMAIN-SEARCH")?;
            token(f, name)
        }
        DhcpOption::Other { kind, args } => {
            token(f, kind)?;
            tokens(f, args)
        }
    }
}

// Keywords.

const fn topology(t: Topology) -> &'static str {
    match t {
        Topology::Net30 => "net30",
        Topology::P2p => "p2p",
        Topology::Subnet => "subnet",
    }
}

const fn comp_lzo(mode: CompLzo) -> &'static str {
    match mode {
        CompLzo::Yes => "yes",
        CompLzo::No => "no",
        CompLzo::Adaptive => "adaptive",
    }
}

const fn compress(algo: Compress) -> &'static str {
    match algo {
        Compress::Stub => "stub",
        Compress::StubV2 => "stub-v2",
        Compress::Lzo => "lzo",
        Compress::Lz4 => "lz4",
        Compress::Lz4V2 => "lz4-v2",
    }
}

// Tokens.

/// A keyword argument, after a space.
fn word(f: &mut Formatter<'_>, word: &str) -> fmt::Result {
    write!(f, " {word}")
}

/// A keyword flag, written only when set.
fn flag(f: &mut Formatter<'_>, on: bool, name: &str) -> fmt::Result {
    if on {
        word(f, name)?;
    }
    Ok(())
}

/// Free-text arguments, each after a space.
fn tokens(f: &mut Formatter<'_>, args: &[String]) -> fmt::Result {
    args.iter().try_for_each(|a| token(f, a))
}

/// One free-text argument after a space: bare when the tokenizer reads it back unchanged as
/// one token (not empty, no whitespace, quote or backslash, not starting a comment), else as
/// `"..."` with `\` and `"` escaped (inside double quotes only those two need it).
fn token(f: &mut Formatter<'_>, text: &str) -> fmt::Result {
    let bare = !text.is_empty()
        && !text.starts_with(['#', ';'])
        && !text
            .bytes()
            .any(|b| is_c_space(b) || matches!(b, b'"' | b'\'' | b'\\'));
    if bare {
        return word(f, text);
    }
    f.write_str(" \"")?;
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            f.write_str("\\")?;
        }
        write!(f, "{c}")?;
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::Ipv4Addr;

    use super::super::{ProtocolFlags, SocketFlags};
    use super::*;

    #[test]
    fn what_our_server_pushes_reads_as_upstream_writes_it() {
        let cases = [
            (
                PushedOption::RouteGateway(RouteGatewayAddr::Addr(Ipv4Addr::new(10, 8, 0, 1))),
                "route-gateway 10.8.0.1",
            ),
            (PushedOption::Topology(Topology::Subnet), "topology subnet"),
            (PushedOption::TunIpv6, "tun-ipv6"),
            (
                PushedOption::SocketFlags(SocketFlags {
                    tcp_nodelay: true,
                    unknown: vec![],
                }),
                "socket-flags TCP_NODELAY",
            ),
            (
                PushedOption::IfconfigIpv6 {
                    local: "fd00::1000/96".parse().unwrap(),
                    remote: Some("fd00::1".parse().unwrap()),
                },
                "ifconfig-ipv6 fd00::1000/96 fd00::1",
            ),
            (
                PushedOption::ProtocolFlags(ProtocolFlags {
                    cc_exit: true,
                    tls_ekm: false,
                    dyn_tls_crypt: true,
                    unknown: vec![],
                }),
                "protocol-flags cc-exit dyn-tls-crypt",
            ),
        ];
        for (option, text) in cases {
            assert_eq!(option.to_string(), text);
        }
    }

    #[test]
    fn routes_write_default_for_a_missing_gateway() {
        let route = |gateway, metric| {
            PushedOption::Route(Route {
                network: Ipv4Addr::new(10, 0, 0, 0),
                netmask: Ipv4Addr::new(255, 0, 0, 0),
                gateway,
                metric,
            })
            .to_string()
        };
        assert_eq!(route(None, None), "route 10.0.0.0 255.0.0.0");
        assert_eq!(route(None, Some(5)), "route 10.0.0.0 255.0.0.0 default 5");
        assert_eq!(
            route(Some(RouteVia::NetGateway), None),
            "route 10.0.0.0 255.0.0.0 net_gateway"
        );
    }

    #[test]
    fn free_text_is_quoted_only_when_needed() {
        let echo = |args: &[&str]| {
            PushedOption::Echo(args.iter().map(|&a| a.to_owned()).collect()).to_string()
        };
        assert_eq!(echo(&["a", "b#c"]), "echo a b#c");
        assert_eq!(
            echo(&["a b", "", "#x", r#"q"\"#, "it's"]),
            r##"echo "a b" "" "#x" "q\"\\" "it's""##
        );
    }
}
