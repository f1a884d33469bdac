//! `up` / `down` commands (`script-security 2`): the part both roles run the same way.
//!
//! The directive's text is split into words as upstream splits a config line (whitespace,
//! `"double"` and `'single'` quotes, backslash escapes; no shell is involved), then upstream's
//! arguments are appended:
//!
//! ```text
//! CMD... DEV TUN_MTU 0 IFCONFIG_LOCAL IFCONFIG_NETMASK|IFCONFIG_REMOTE init
//!                    ^ link_mtu, always 0 since 2.6
//! ```
//!
//! How the two addresses appear when there are none is the caller's choice (see
//! [`upstream_args`]). The environment always holds `script_type` (`up`/`down`),
//! `script_context=init`, `dev`, `dev_type=tun` and `tun_mtu` ([`ScriptEnv::new`]), plus
//! `ifconfig_local` with `ifconfig_netmask` or `ifconfig_remote`, and `ifconfig_ipv6_local`
//! with `ifconfig_ipv6_netbits`, when the device has such addresses. Each role adds its own
//! variables with [`ScriptEnv::set`] and decides when a hook runs and what a failure means.
//! The process's own environment is passed on as well.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use protocol::push::tokenize::{tokenize, TokenizeError};

/// Which hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptType {
    /// After the device is configured.
    Up,
    /// After the device is closed.
    Down,
}

impl ScriptType {
    /// The `script_type` value, which is also the directive's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptType::Up => "up",
            ScriptType::Down => "down",
        }
    }
}

impl fmt::Display for ScriptType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command line from an `up` / `down` directive, split into words; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    argv: Vec<String>,
}

impl Script {
    /// Splits `text` as upstream splits a command line.
    pub fn parse(text: &str) -> Result<Script, ParseError> {
        let argv = tokenize(text).map_err(ParseError::Split)?;
        if argv.is_empty() {
            return Err(ParseError::Empty);
        }
        Ok(Script { argv })
    }

    /// The program and its leading arguments, as written.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The program (the first word).
    pub fn program(&self) -> &str {
        // `parse` never returns an empty command.
        self.argv.first().map(String::as_str).unwrap_or_default()
    }

    /// Runs the command with `args` after its own words and `env` added to this process's
    /// environment, and waits for it; a non-zero exit is an error.
    pub async fn run(&self, args: &[String], env: &ScriptEnv) -> Result<(), ScriptError> {
        let program = self.program();
        let leading = self.argv.get(1..).unwrap_or_default();
        tracing::info!(script = env.kind().as_str(), argv = ?self.argv, ?args, "running script");
        let status = tokio::process::Command::new(program)
            .args(leading)
            .args(args)
            .envs(env.vars().iter().map(|(k, v)| (k, v)))
            .status()
            .await
            .map_err(|source| ScriptError::Spawn {
                program: program.to_owned(),
                source,
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(ScriptError::Failed {
                program: program.to_owned(),
                status,
            })
        }
    }
}

/// Upstream's arguments after the command's own: `DEV TUN_MTU 0`, then `ifconfig` (the local
/// address and the netmask or remote, as the role renders them), then `init`.
pub fn upstream_args(
    dev: &str,
    tun_mtu: u16,
    ifconfig: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut args = vec![dev.to_owned(), tun_mtu.to_string(), "0".to_owned()];
    args.extend(ifconfig);
    args.push("init".to_owned());
    args
}

/// What the second IPv4 `ifconfig` address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfconfigPeer {
    /// `topology subnet`: the netmask (`ifconfig_netmask`).
    Netmask(Ipv4Addr),
    /// net30 / p2p: the remote end (`ifconfig_remote`).
    Remote(Ipv4Addr),
}

/// The variables set for a hook, in the order they were added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptEnv {
    kind: ScriptType,
    vars: Vec<(String, String)>,
}

impl ScriptEnv {
    /// `script_type`, `script_context=init`, `dev`, `dev_type=tun` and `tun_mtu`.
    pub fn new(kind: ScriptType, dev: &str, tun_mtu: u16) -> ScriptEnv {
        let mut env = ScriptEnv {
            kind,
            vars: Vec::new(),
        };
        env.set("script_type", kind.as_str())
            .set("script_context", "init")
            .set("dev", dev)
            .set("dev_type", "tun")
            .set("tun_mtu", tun_mtu.to_string());
        env
    }

    /// `ifconfig_local` and `ifconfig_netmask` or `ifconfig_remote`.
    pub fn ifconfig(&mut self, local: Ipv4Addr, peer: IfconfigPeer) -> &mut ScriptEnv {
        self.set("ifconfig_local", local.to_string());
        match peer {
            IfconfigPeer::Netmask(mask) => self.set("ifconfig_netmask", mask.to_string()),
            IfconfigPeer::Remote(remote) => self.set("ifconfig_remote", remote.to_string()),
        }
    }

    /// `ifconfig_ipv6_local` and `ifconfig_ipv6_netbits`.
    pub fn ifconfig_ipv6(&mut self, local: Ipv6Addr, netbits: u8) -> &mut ScriptEnv {
        self.set("ifconfig_ipv6_local", local.to_string())
            .set("ifconfig_ipv6_netbits", netbits.to_string())
    }

    /// Adds a variable of the role's own.
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> &mut ScriptEnv {
        self.vars.push((name.to_owned(), value.into()));
        self
    }

    /// The hook these variables are for.
    pub fn kind(&self) -> ScriptType {
        self.kind
    }

    /// The variables.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }
}

/// A command line that cannot be a hook.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The command text could not be split into words.
    #[error("cannot split the command line")]
    Split(#[source] TokenizeError),
    /// The command text is empty.
    #[error("empty command")]
    Empty,
}

/// A hook that could not run or failed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The program could not be started.
    #[error("cannot run '{program}'")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The program exited unsuccessfully.
    #[error("'{program}' failed: {status}")]
    Failed {
        /// The program.
        program: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_the_config_tokenizer() {
        let s = Script::parse(
            "/bin/vpn-server firewall --mode up --device tun0 --shoot-network=100.64.0.0/13",
        )
        .unwrap();
        assert_eq!(
            s.argv(),
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
        let q = Script::parse("/bin/sh -c 'echo $1' --").unwrap();
        assert_eq!(q.argv(), ["/bin/sh", "-c", "echo $1", "--"]);
        assert!(matches!(Script::parse(""), Err(ParseError::Empty)));
        assert!(matches!(
            Script::parse("/bin/sh -c 'echo"),
            Err(ParseError::Split(_))
        ));
    }

    #[test]
    fn upstream_arguments_and_common_variables() {
        assert_eq!(
            upstream_args("tun0", 1500, ["10.0.0.1".into(), "255.255.255.0".into()]),
            ["tun0", "1500", "0", "10.0.0.1", "255.255.255.0", "init"]
        );
        assert_eq!(
            upstream_args("tun0", 1400, []),
            ["tun0", "1400", "0", "init"]
        );
        let mut env = ScriptEnv::new(ScriptType::Down, "tun0", 1500);
        env.ifconfig(
            Ipv4Addr::new(10, 0, 0, 1),
            IfconfigPeer::Remote(Ipv4Addr::new(10, 0, 0, 2)),
        )
        .ifconfig_ipv6("fd00::1".parse().unwrap(), 64)
        .set("verb", "3");
        assert_eq!(env.kind(), ScriptType::Down);
        let expected: Vec<(String, String)> = [
            ("script_type", "down"),
            ("script_context", "init"),
            ("dev", "tun0"),
            ("dev_type", "tun"),
            ("tun_mtu", "1500"),
            ("ifconfig_local", "10.0.0.1"),
            ("ifconfig_remote", "10.0.0.2"),
            ("ifconfig_ipv6_local", "fd00::1"),
            ("ifconfig_ipv6_netbits", "64"),
            ("verb", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env.vars(), expected);
    }

    #[tokio::test]
    async fn a_script_sees_its_arguments_and_environment_and_failures_are_typed() {
        let check = Script::parse(
            r#"/bin/sh -c 'test "$*" = "tun7 1400 0 init" && test "$script_type $dev" = "up tun7"' --"#,
        )
        .unwrap();
        let env = ScriptEnv::new(ScriptType::Up, "tun7", 1400);
        let args = upstream_args("tun7", 1400, []);
        check.run(&args, &env).await.expect("run");
        let wrong = upstream_args("tun8", 1400, []);
        assert!(matches!(
            check.run(&wrong, &env).await,
            Err(ScriptError::Failed { .. })
        ));
        let missing = Script::parse("/nonexistent/hook").unwrap();
        assert!(matches!(
            missing.run(&args, &env).await,
            Err(ScriptError::Spawn { program, .. }) if program == "/nonexistent/hook"
        ));
    }
}
