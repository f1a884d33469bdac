//! What decides a config's role, and the transport: `mode`, `tls-server`, `tls-client`,
//! `pull`, `client`, `proto`, `topology`.
//!
//! A directive that implies a role marks the config with it ([`Roles::mark`]); marks of both
//! roles in one config are a conflict. The mark comes after the arguments were checked, so a
//! bad argument is reported before a conflict.
//!
//! [`Roles::mark`]: super::raw::Roles::mark

use super::raw::Raw;
use super::{takes, Spec, NO_ARGS};
use crate::config::args::{parse_proto, Args};
use crate::config::ErrorReason;
use crate::key::Role;

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new("mode", takes(1, 1, "server"), mode),
    Spec::new("tls-server", NO_ARGS, tls_server),
    Spec::new("tls-client", NO_ARGS, tls_client),
    Spec::new("pull", NO_ARGS, pull),
    Spec::new("client", NO_ARGS, client),
    Spec::new(
        "proto",
        takes(1, 1, "tcp-server|tcp-client|tcp4-*|tcp6-*"),
        proto,
    ),
    Spec::new("topology", takes(1, 1, "subnet"), topology),
];

/// `mode server` (`mode p2p` is refused).
fn mode(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    if a.s(0) != "server" {
        return Err(ErrorReason::UnsupportedMode {
            mode: a.s(0).to_owned(),
        });
    }
    raw.roles.mark(Role::Server, a.name(), a.line())?;
    raw.roles.mode_server = Some(a.line());
    Ok(())
}

fn tls_server(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.roles.mark(Role::Server, a.name(), a.line())?;
    raw.roles.tls_server = Some(a.line());
    Ok(())
}

fn tls_client(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.roles.mark(Role::Client, a.name(), a.line())?;
    raw.roles.tls_client = Some(a.line());
    Ok(())
}

fn pull(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.roles.mark(Role::Client, a.name(), a.line())?;
    raw.roles.pull = Some(a.line());
    Ok(())
}

/// `client`: short for `tls-client` and `pull`.
fn client(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.roles.mark(Role::Client, a.name(), a.line())?;
    raw.roles.tls_client = Some(a.line());
    raw.roles.pull = Some(a.line());
    Ok(())
}

/// `proto tcp-server` / `tcp-client` mark the role; plain `tcp*` only sets the family.
fn proto(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let (family, role) = parse_proto(a.s(0))?;
    if let Some(role) = role {
        raw.roles.mark(role, a.name(), a.line())?;
    }
    raw.common.proto = Some(((family, role), a.line()));
    Ok(())
}

/// `topology subnet`, the only one we support (net30 and p2p are refused).
fn topology(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    if a.s(0) != "subnet" {
        return Err(ErrorReason::UnsupportedTopology {
            topology: a.s(0).to_owned(),
        });
    }
    raw.server.topology_subnet = true;
    Ok(())
}
