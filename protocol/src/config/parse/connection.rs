//! The tunnel device, the socket to the peer and the keepalive timers: `dev`, `dev-type`,
//! `port`, `local`, `nobind`, `remote`, `tcp-nodelay`, `tun-mtu`, `txqueuelen`, `mssfix`,
//! `sndbuf`, `rcvbuf`, `disable-dco`, `persist-key`, `persist-tun`, `keepalive`, `ping`,
//! `ping-restart`.
//!
//! `keepalive` and `ping` / `ping-restart` keep their lines: the two forms conflict, which
//! is decided once all are read ([`super::finish`]).

use super::raw::Raw;
use super::{takes, Spec, NO_ARGS};
use crate::config::args::{bad, parse_proto, port, u32_arg, Args};
use crate::config::model::{DevType, Keepalive, MssFix};
use crate::config::ErrorReason;
use crate::key::Role;

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new("dev", takes(1, 1, "DEVICE"), dev),
    Spec::new("dev-type", takes(1, 1, "tun|tap"), dev_type),
    Spec::new("port", takes(1, 1, "PORT"), port_directive),
    Spec::new("local", takes(1, 1, "HOST"), local),
    Spec::new("nobind", NO_ARGS, nobind).client_only(),
    Spec::new("remote", takes(1, 3, "HOST [PORT [PROTO]]"), remote).client_only(),
    Spec::new("tcp-nodelay", NO_ARGS, tcp_nodelay),
    Spec::new("tun-mtu", takes(1, 1, "MTU"), tun_mtu),
    Spec::new("txqueuelen", takes(1, 1, "N"), txqueuelen),
    Spec::new("mssfix", takes(0, 2, "[N [mtu|fixed]]"), mssfix),
    Spec::new("sndbuf", takes(1, 1, "BYTES"), sndbuf),
    Spec::new("rcvbuf", takes(1, 1, "BYTES"), rcvbuf),
    Spec::new("disable-dco", NO_ARGS, disable_dco),
    Spec::new("persist-key", NO_ARGS, persist_key),
    Spec::new("persist-tun", NO_ARGS, persist_tun),
    Spec::new("keepalive", takes(2, 2, "INTERVAL TIMEOUT"), keepalive),
    Spec::new("ping", takes(1, 1, "SECONDS"), ping),
    Spec::new("ping-restart", takes(1, 1, "SECONDS"), ping_restart),
];

fn dev(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.dev = Some((a.s(0).to_owned(), a.line()));
    Ok(())
}

fn dev_type(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.dev_type = Some(match a.s(0) {
        "tun" => DevType::Tun,
        "tap" => DevType::Tap,
        v => return Err(bad(v, "tun or tap")),
    });
    Ok(())
}

fn port_directive(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.port = Some(port(a.s(0))?);
    Ok(())
}

fn local(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.local = Some(a.s(0).to_owned());
    Ok(())
}

fn nobind(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.client.nobind = true;
    Ok(())
}

/// `remote HOST [PORT [PROTO]]`: the port and family default to `port` and `proto`'s, filled
/// in once all are read.
fn remote(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let p = a.opt(1).map(port).transpose()?;
    let family = match a.opt(2) {
        Some(proto) => {
            let (family, role) = parse_proto(proto)?;
            if role == Some(Role::Server) {
                return Err(bad(
                    proto,
                    "a client protocol (tcp-client, tcp4-client, tcp6-client)",
                ));
            }
            Some(family)
        }
        None => None,
    };
    raw.client.remotes.push((a.s(0).to_owned(), p, family));
    Ok(())
}

fn tcp_nodelay(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.tcp_nodelay = true;
    Ok(())
}

fn tun_mtu(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.tun_mtu = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn txqueuelen(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.txqueuelen = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn mssfix(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let value = a.opt(0).map(u32_arg).transpose()?;
    let (mut mtu, mut fixed) = (false, false);
    match a.opt(1) {
        None => {}
        Some("mtu") => mtu = true,
        Some("fixed") => fixed = true,
        Some(v) => return Err(bad(v, "mtu or fixed")),
    }
    raw.common.mssfix = Some(MssFix { value, mtu, fixed });
    Ok(())
}

fn sndbuf(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.sndbuf = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn rcvbuf(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.rcvbuf = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn disable_dco(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.disable_dco = true;
    Ok(())
}

fn persist_key(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.persist_key = true;
    Ok(())
}

fn persist_tun(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.persist_tun = true;
    Ok(())
}

/// `keepalive N M`: upstream's rule, both above zero and M at least 2N.
fn keepalive(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let k = Keepalive {
        interval: u32_arg(a.s(0))?,
        timeout: u32_arg(a.s(1))?,
    };
    check_keepalive(k)?;
    raw.common.keepalive = Some((k, a.line()));
    Ok(())
}

/// Upstream's rule for `keepalive N M`: both above zero and M at least 2N.
pub(super) fn check_keepalive(k: Keepalive) -> Result<(), ErrorReason> {
    let Keepalive { interval, timeout } = k;
    if interval == 0 || timeout == 0 || timeout < interval.saturating_mul(2) {
        return Err(ErrorReason::KeepaliveRatio { interval, timeout });
    }
    Ok(())
}

fn ping(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.ping = Some((u32_arg(a.s(0))?, a.line()));
    Ok(())
}

fn ping_restart(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.common.ping_restart = Some((u32_arg(a.s(0))?, a.line()));
    Ok(())
}
