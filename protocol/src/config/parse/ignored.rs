//! Directives a main config may name without effect, and those it may not name at all
//! because they belong in a client-config-dir file.
//!
//! Accepted without effect, each a [`Warning`](crate::config::Warning) for the binary to
//! log: `explicit-exit-notify` (nothing to notify over TCP), and what we do not implement
//! but a config may harmlessly hold (`management`, `user`, `daemon`, ...), whatever their
//! arguments. The per-client directives (`iroute`, `ifconfig-push`, ...) are
//! [`ErrorReason::OnlyInClientConfigDir`] here, also whatever their arguments.

use super::raw::Raw;
use super::{takes, Spec, ANY_ARGS};
use crate::config::args::Args;
use crate::config::{ErrorReason, WarningKind};

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new(
        "explicit-exit-notify",
        takes(0, 1, "[N]"),
        no_effect_over_tcp,
    ),
    // Not implemented, harmless.
    Spec::new("management", ANY_ARGS, not_implemented),
    Spec::new("user", ANY_ARGS, not_implemented),
    Spec::new("group", ANY_ARGS, not_implemented),
    Spec::new("resolv-retry", ANY_ARGS, not_implemented),
    Spec::new("mute", ANY_ARGS, not_implemented),
    Spec::new("mute-replay-warnings", ANY_ARGS, not_implemented),
    Spec::new("remap-usr1", ANY_ARGS, not_implemented),
    Spec::new("ifconfig-pool-persist", ANY_ARGS, not_implemented),
    Spec::new("stale-routes-check", ANY_ARGS, not_implemented),
    Spec::new("daemon", ANY_ARGS, not_implemented),
    Spec::new("writepid", ANY_ARGS, not_implemented),
    Spec::new("tun-ipv6", ANY_ARGS, not_implemented),
    // A client-config-dir file's.
    Spec::new("iroute", ANY_ARGS, only_in_client_config_dir),
    Spec::new("iroute-ipv6", ANY_ARGS, only_in_client_config_dir),
    Spec::new("ifconfig-push", ANY_ARGS, only_in_client_config_dir),
    Spec::new("ifconfig-ipv6-push", ANY_ARGS, only_in_client_config_dir),
    Spec::new("push-reset", ANY_ARGS, only_in_client_config_dir),
    Spec::new("push-remove", ANY_ARGS, only_in_client_config_dir),
    Spec::new("disable", ANY_ARGS, only_in_client_config_dir),
];

fn no_effect_over_tcp(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.warn(a.line(), a.name(), WarningKind::NoEffectOverTcp);
    Ok(())
}

fn not_implemented(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.warn(a.line(), a.name(), WarningKind::NotImplemented);
    Ok(())
}

fn only_in_client_config_dir(_: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    Err(ErrorReason::OnlyInClientConfigDir)
}
