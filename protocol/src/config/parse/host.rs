//! What the binary does on the host around the tunnel: `route`, `route-ipv6`,
//! `script-security`, `up`, `down`, `status`, `status-version`, `verb`.

use std::path::PathBuf;

use super::raw::Raw;
use super::{takes, Spec};
use crate::config::args::{bad, ipv4, ipv4_net, ipv6, ipv6_net, small, u32_arg, Args};
use crate::config::model::{Route, RouteGateway, RouteIpv6, Status, DEFAULT_STATUS_INTERVAL};
use crate::config::ErrorReason;

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new(
        "route",
        takes(1, 4, "NETWORK [NETMASK [GATEWAY [METRIC]]]"),
        route,
    ),
    Spec::new(
        "route-ipv6",
        takes(1, 3, "NETWORK/BITS [GATEWAY [METRIC]]"),
        route_ipv6,
    ),
    Spec::new("script-security", takes(1, 1, "0|1|2|3"), script_security),
    Spec::new("up", takes(1, 1, "COMMAND"), up),
    Spec::new("down", takes(1, 1, "COMMAND"), down),
    Spec::new("status", takes(1, 2, "FILE [SECONDS]"), status),
    Spec::new("status-version", takes(1, 1, "1|2|3"), status_version),
    Spec::new("verb", takes(1, 1, "0..11"), verb),
];

/// `route NETWORK [NETMASK [GATEWAY [METRIC]]]`: the netmask defaults to a host route, the
/// gateway may be a keyword.
fn route(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let network = ipv4_net(a.s(0), a.opt(1).unwrap_or("255.255.255.255"))?;
    let gateway = match a.opt(2) {
        None | Some("default") => None,
        Some("vpn_gateway") => Some(RouteGateway::VpnGateway),
        Some("net_gateway") => Some(RouteGateway::NetGateway),
        Some("remote_host") => Some(RouteGateway::RemoteHost),
        Some(v) => Some(RouteGateway::Addr(ipv4(v)?)),
    };
    let metric = a.opt(3).map(u32_arg).transpose()?;
    raw.common.routes.push(Route {
        network,
        gateway,
        metric,
    });
    Ok(())
}

fn route_ipv6(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let network = ipv6_net(a.s(0))?;
    let gateway = match a.opt(1) {
        None | Some("default") => None,
        Some(v) => Some(ipv6(v)?),
    };
    let metric = a.opt(2).map(u32_arg).transpose()?;
    raw.common.routes_ipv6.push(RouteIpv6 {
        network,
        gateway,
        metric,
    });
    Ok(())
}

fn script_security(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.script_security = Some(small(a.s(0), 3, "0, 1, 2 or 3")?);
    Ok(())
}

fn up(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.up = Some(a.s(0).to_owned());
    Ok(())
}

fn down(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.down = Some(a.s(0).to_owned());
    Ok(())
}

fn status(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.status = Some(Status {
        path: PathBuf::from(a.s(0)),
        interval: a
            .opt(1)
            .map(u32_arg)
            .transpose()?
            .unwrap_or(DEFAULT_STATUS_INTERVAL),
    });
    Ok(())
}

fn status_version(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let v = small(a.s(0), 3, "1, 2 or 3")?;
    if v == 0 {
        return Err(bad(a.s(0), "1, 2 or 3"));
    }
    raw.common.status_version = Some(v);
    Ok(())
}

fn verb(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.verb = Some(small(a.s(0), 11, "0 to 11")?);
    Ok(())
}
