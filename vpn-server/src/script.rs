//! `up` / `down` commands (with `script-security 2`): the server's side.
//!
//! Splitting the command, upstream's arguments, the variables every role sets and running it
//! are [`netio::script`]'s:
//!
//! ```text
//!  CMD... DEV TUN_MTU 0 IFCONFIG_LOCAL IFCONFIG_NETMASK init
//!         (link_mtu is always 0 in 2.6; the two addresses are left out without an IPv4 pool)
//! ```
//!
//! The server's addresses are the first host of its pools, so the environment carries
//! `ifconfig_local` and `ifconfig_netmask` (never `ifconfig_remote`), `ifconfig_ipv6_local`
//! and `ifconfig_ipv6_netbits`, and besides the common variables `verb`, `daemon=0`, and for
//! `down` `signal`. Unlike upstream, the server's own environment is passed on too (upstream
//! starts scripts with its variables only). A failing `up` stops the server from starting, as
//! upstream; a failing `down` is logged.

use std::net::Ipv4Addr;

use netio::script::{upstream_args, IfconfigPeer, ParseError, ScriptEnv, ScriptType};

use crate::settings::Settings;

/// A parsed `up` or `down` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// `up` or `down`.
    pub kind: ScriptType,
    /// The program and its own arguments, before upstream's.
    pub command: netio::script::Script,
}

/// Why a script failed.
#[derive(Debug, thiserror::Error)]
#[error("'{kind}' command")]
pub struct ScriptError {
    /// `up` / `down`.
    pub kind: ScriptType,
    /// What went wrong.
    #[source]
    pub source: netio::script::ScriptError,
}

/// An `up` / `down` argument that is no command.
#[derive(Debug, thiserror::Error)]
pub enum ScriptParseError {
    /// Nothing but white space.
    #[error("'{kind}' command is empty")]
    Empty {
        /// `up` / `down`.
        kind: ScriptType,
    },
    /// Quoting or escaping that does not split into words.
    #[error("'{kind}' command")]
    Split {
        /// `up` / `down`.
        kind: ScriptType,
        /// Why.
        #[source]
        source: ParseError,
    },
}

impl Script {
    /// Splits the directive's argument into words.
    pub fn parse(kind: ScriptType, line: &str) -> Result<Script, ScriptParseError> {
        netio::script::Script::parse(line)
            .map(|command| Script { kind, command })
            .map_err(|source| match source {
                ParseError::Empty => ScriptParseError::Empty { kind },
                source => ScriptParseError::Split { kind, source },
            })
    }

    /// The argument list after the command's own words and the environment for device `dev`.
    pub fn arguments(&self, settings: &Settings, dev: &str, verb: u8) -> (Vec<String>, ScriptEnv) {
        let mut env = ScriptEnv::new(self.kind, dev, settings.tun_mtu);
        env.set("verb", verb.to_string()).set("daemon", "0");
        let mut ifconfig = Vec::new();
        if let Some(net) = settings.pool_v4 {
            let local = Ipv4Addr::from(u32::from(net.network()) + 1);
            let mask = net.netmask();
            ifconfig.push(local.to_string());
            ifconfig.push(mask.to_string());
            env.ifconfig(local, IfconfigPeer::Netmask(mask));
        }
        if let Some(net) = settings.pool_v6 {
            let local = std::net::Ipv6Addr::from(u128::from(net.network()) + 1);
            env.ifconfig_ipv6(local, net.prefix_len());
        }
        if self.kind == ScriptType::Down {
            env.set("signal", "sigterm");
        }
        let args = upstream_args(dev, settings.tun_mtu, ifconfig);
        (args, env)
    }

    /// Runs the command to completion.
    pub async fn run(&self, settings: &Settings, dev: &str, verb: u8) -> Result<(), ScriptError> {
        let (args, env) = self.arguments(settings, dev, verb);
        self.command
            .run(&args, &env)
            .await
            .map_err(|source| ScriptError {
                kind: self.kind,
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_directive() {
        let up = Script::parse(ScriptType::Up, "/bin/true").unwrap();
        assert_eq!(up.command.argv(), ["/bin/true"]);
        assert_eq!(
            Script::parse(ScriptType::Up, "").unwrap_err().to_string(),
            "'up' command is empty"
        );
        assert!(netio::report::chain(
            &Script::parse(ScriptType::Down, "/bin/sh -c 'x").unwrap_err()
        )
        .starts_with("'down' command: "));
    }
}
