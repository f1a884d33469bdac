//! `up` / `down` commands (with `script-security 2`), run as OpenVPN 2.6 runs them.
//!
//! The directive's command line is split into words with the config tokenizer (quotes and
//! backslashes as in the config file; no shell is involved), then upstream's arguments are
//! appended:
//!
//! ```text
//!  CMD... DEV TUN_MTU 0 IFCONFIG_LOCAL IFCONFIG_NETMASK init
//!         (link_mtu is always 0 in 2.6; the two addresses are left out without an IPv4 pool)
//! ```
//!
//! and the environment carries `script_type` (`up`/`down`), `script_context=init`, `dev`,
//! `dev_type=tun`, `tun_mtu`, `ifconfig_local`, `ifconfig_netmask`, `ifconfig_ipv6_local`,
//! `ifconfig_ipv6_netbits`, `verb`, `daemon=0`, and for `down` `signal`. Unlike upstream, the
//! server's own environment is passed on too (upstream starts scripts with its variables only).
//! A failing `up` stops the server from starting, as upstream; a failing `down` is logged.

use std::net::Ipv4Addr;
use std::process::Command;

use protocol::push::tokenize::tokenize;

use crate::settings::Settings;

/// A parsed `up` or `down` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// `up` or `down`.
    pub kind: &'static str,
    /// The program and its own arguments, before upstream's.
    pub argv: Vec<String>,
}

/// Why a script failed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The program could not be started.
    #[error("'{kind}' command '{program}' could not be started")]
    Spawn {
        /// `up` / `down`.
        kind: &'static str,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It ran and failed.
    #[error("'{kind}' command '{program}' failed: {status}")]
    Failed {
        /// `up` / `down`.
        kind: &'static str,
        /// The program.
        program: String,
        /// How it ended.
        status: std::process::ExitStatus,
    },
}

impl Script {
    /// Splits the directive's argument into words. `kind` is `up` or `down`.
    pub fn parse(kind: &'static str, line: &str) -> Result<Script, String> {
        let argv = tokenize(line).map_err(|e| format!("'{kind}' command: {e}"))?;
        if argv.is_empty() {
            return Err(format!("'{kind}' command is empty"));
        }
        Ok(Script { kind, argv })
    }

    /// The full argument list (without the program) and the environment for device `dev`.
    pub fn arguments(
        &self,
        settings: &Settings,
        dev: &str,
        verb: u8,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let mut args: Vec<String> = self.argv[1..].to_vec();
        args.push(dev.to_owned());
        args.push(settings.tun_mtu.to_string());
        args.push("0".to_owned());
        let mut env = vec![
            ("script_type".to_owned(), self.kind.to_owned()),
            ("script_context".to_owned(), "init".to_owned()),
            ("dev".to_owned(), dev.to_owned()),
            ("dev_type".to_owned(), "tun".to_owned()),
            ("tun_mtu".to_owned(), settings.tun_mtu.to_string()),
            ("verb".to_owned(), verb.to_string()),
            ("daemon".to_owned(), "0".to_owned()),
        ];
        if let Some(net) = settings.pool_v4 {
            let local = Ipv4Addr::from(u32::from(net.network()) + 1).to_string();
            let mask = net.netmask().to_string();
            args.push(local.clone());
            args.push(mask.clone());
            env.push(("ifconfig_local".to_owned(), local));
            env.push(("ifconfig_netmask".to_owned(), mask));
        }
        if let Some(net) = settings.pool_v6 {
            let local = std::net::Ipv6Addr::from(u128::from(net.network()) + 1);
            env.push(("ifconfig_ipv6_local".to_owned(), local.to_string()));
            env.push((
                "ifconfig_ipv6_netbits".to_owned(),
                net.prefix_len().to_string(),
            ));
        }
        args.push("init".to_owned());
        if self.kind == "down" {
            env.push(("signal".to_owned(), "sigterm".to_owned()));
        }
        (args, env)
    }

    /// Runs the command to completion (blocking).
    pub fn run(&self, settings: &Settings, dev: &str, verb: u8) -> Result<(), ScriptError> {
        let (args, env) = self.arguments(settings, dev, verb);
        let program = self.argv[0].clone();
        tracing::info!(kind = self.kind, program, ?args, "running script");
        let status = Command::new(&program)
            .args(&args)
            .envs(env)
            .status()
            .map_err(|source| ScriptError::Spawn {
                kind: self.kind,
                program: program.clone(),
                source,
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(ScriptError::Failed {
                kind: self.kind,
                program,
                status,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_the_config_tokenizer() {
        let s = Script::parse(
            "up",
            "/bin/vpn-server firewall --mode up --device tun0 --shoot-network=100.64.0.0/13",
        )
        .unwrap();
        assert_eq!(
            s.argv,
            [
                "/bin/vpn-server",
                "firewall",
                "--mode",
                "up",
                "--device",
                "tun0",
                "--shoot-network=100.64.0.0/13"
            ]
        );
        let q = Script::parse("down", "/bin/sh -c 'echo $1' --").unwrap();
        assert_eq!(q.argv, ["/bin/sh", "-c", "echo $1", "--"]);
        assert!(Script::parse("up", "").is_err());
    }
}
