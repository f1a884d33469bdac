//! The server's directives: `server`, `server-ipv6`, `ifconfig-pool`, `push`,
//! `client-config-dir`, `duplicate-cn`, `client-to-client`, `max-clients`,
//! `max-routes-per-client`.
//!
//! `server` and `server-ipv6` make a config a server config (and imply `mode server` and
//! `tls-server`); the others are refused in a client config.

use std::path::PathBuf;

use ipnet::Ipv6Net;

use super::raw::Raw;
use super::{takes, Spec, NO_ARGS};
use crate::config::args::{bad, ipv4, ipv4_net, ipv6_net, netmask_bits, u32_arg, Args};
use crate::config::model::{
    IfconfigPool, ServerNetwork, SERVER_IPV6_MAX_NETBITS, SERVER_IPV6_MIN_NETBITS,
};
use crate::config::ErrorReason;
use crate::key::Role;

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new("server", takes(2, 3, "NETWORK NETMASK [nopool]"), server),
    Spec::new("server-ipv6", takes(1, 1, "NETWORK/BITS"), server_ipv6),
    Spec::new(
        "ifconfig-pool",
        takes(2, 3, "START END [NETMASK]"),
        ifconfig_pool,
    )
    .server_only(),
    Spec::new("push", takes(1, 1, "\"OPTION\""), push).server_only(),
    Spec::new("client-config-dir", takes(1, 1, "DIR"), client_config_dir).server_only(),
    Spec::new("duplicate-cn", NO_ARGS, duplicate_cn).server_only(),
    Spec::new("client-to-client", NO_ARGS, client_to_client).server_only(),
    Spec::new("max-clients", takes(1, 1, "N"), max_clients).server_only(),
    Spec::new(
        "max-routes-per-client",
        takes(1, 1, "N"),
        max_routes_per_client,
    )
    .server_only(),
];

/// `server NETWORK NETMASK [nopool]`: the netmask's range depends on the device type and is
/// checked once all are read.
fn server(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let network = ipv4_net(a.s(0), a.s(1))?;
    let nopool = match a.opt(2) {
        None => false,
        Some("nopool") => true,
        Some(v) => return Err(bad(v, "nopool")),
    };
    raw.roles.mark(Role::Server, a.name(), a.line())?;
    raw.server.server = Some((
        (ServerNetwork { network, nopool }, a.s(1).to_owned()),
        a.line(),
    ));
    Ok(())
}

/// `server-ipv6 NETWORK/BITS`: a network address, /64 to /124.
fn server_ipv6(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let net = ipv6_net(a.s(0))?;
    check_server_ipv6(net, a.s(0))?;
    raw.roles.mark(Role::Server, a.name(), a.line())?;
    raw.server.server_ipv6 = Some(net);
    Ok(())
}

/// `server-ipv6`'s network (`written` as in the config): a network address, /64 to /124.
pub(super) fn check_server_ipv6(net: Ipv6Net, written: &str) -> Result<(), ErrorReason> {
    if net.network() != net.addr() {
        return Err(ErrorReason::NotNetworkAddress {
            network: written.to_owned(),
        });
    }
    let bits = net.prefix_len();
    if !(SERVER_IPV6_MIN_NETBITS..=SERVER_IPV6_MAX_NETBITS).contains(&bits) {
        return Err(ErrorReason::PrefixOutOfRange {
            bits,
            min: SERVER_IPV6_MIN_NETBITS,
            max: SERVER_IPV6_MAX_NETBITS,
        });
    }
    Ok(())
}

/// `ifconfig-pool START END [NETMASK]`, START not after END.
fn ifconfig_pool(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let start = ipv4(a.s(0))?;
    let end = ipv4(a.s(1))?;
    if start > end {
        return Err(ErrorReason::PoolRange {
            start: a.s(0).to_owned(),
            end: a.s(1).to_owned(),
        });
    }
    let netmask = match a.opt(2) {
        Some(m) => {
            netmask_bits(m)?;
            Some(ipv4(m)?)
        }
        None => None,
    };
    raw.server.ifconfig_pool = Some((
        IfconfigPool {
            start,
            end,
            netmask,
        },
        a.line(),
    ));
    Ok(())
}

fn push(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.server.push.push(a.s(0).to_owned());
    Ok(())
}

fn client_config_dir(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.server.client_config_dir = Some(PathBuf::from(a.s(0)));
    Ok(())
}

fn duplicate_cn(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.server.duplicate_cn = true;
    Ok(())
}

fn client_to_client(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.server.client_to_client = true;
    Ok(())
}

fn max_clients(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let n = u32_arg(a.s(0))?;
    if n == 0 {
        return Err(bad(a.s(0), "a number > 0"));
    }
    raw.server.max_clients = Some(n);
    Ok(())
}

fn max_routes_per_client(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    // Upstream raises anything below 1 to 1.
    raw.server.max_routes_per_client = Some(u32_arg(a.s(0))?.max(1));
    Ok(())
}
