//! `up` and `down` commands (`script-security 2`), run as upstream runs them.
//!
//! The command text is split into words as upstream splits a config line (whitespace,
//! `"double"` and `'single'` quotes, backslash escapes; no shell), then the tunnel's
//! parameters are appended as arguments:
//!
//! ```text
//! CMD... DEV TUN_MTU 0 IFCONFIG_LOCAL IFCONFIG_NETMASK|IFCONFIG_REMOTE init
//! ```
//!
//! (`0` stands where upstream before 2.6 passed the link MTU.) The environment is the
//! client's own plus upstream's variables: `script_type` (`up`/`down`), `script_context`
//! (`init`), `dev`, `dev_type`, `tun_mtu`, `link_mtu`, `ifconfig_local`, `ifconfig_netmask`
//! (`topology subnet`) or `ifconfig_remote` (net30/p2p), and `ifconfig_ipv6_local`,
//! `ifconfig_ipv6_netbits`, `ifconfig_ipv6_remote` when IPv6 was pushed.
//!
//! `up` runs once, after the device got its first pushed configuration; the device is kept
//! across reconnects (as with upstream's `persist-tun`), so it does not run again. A failing
//! `up` stops the client (upstream treats it as fatal too). `down` runs after the device is
//! closed when the client stops, with the same arguments.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;
use protocol::push::options::Topology;
use protocol::push::tokenize::{tokenize, TokenizeError};
use protocol::push::PushedOption;

/// `up` / `down`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scripts {
    /// `up CMD`.
    pub up: Option<ScriptCommand>,
    /// `down CMD`.
    pub down: Option<ScriptCommand>,
}

/// A command line split into words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCommand {
    /// The program and its leading arguments, as written.
    pub argv: Vec<String>,
}

impl ScriptCommand {
    /// Splits `text` as upstream splits a command line.
    pub fn parse(text: &str) -> Result<ScriptCommand, ScriptError> {
        let argv = tokenize(text).map_err(ScriptError::Split)?;
        if argv.is_empty() {
            return Err(ScriptError::Empty);
        }
        Ok(ScriptCommand { argv })
    }
}

/// Which hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptType {
    /// After the device is configured.
    Up,
    /// After the device is closed.
    Down,
}

impl ScriptType {
    /// The `script_type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptType::Up => "up",
            ScriptType::Down => "down",
        }
    }
}

/// The device parameters handed to the hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunInfo {
    /// The interface name.
    pub dev: String,
    /// The MTU in force.
    pub tun_mtu: u16,
    /// The pushed `ifconfig LOCAL NETMASK|REMOTE`, with the topology that says which.
    pub ifconfig: Option<(Ipv4Addr, Ipv4Addr, Topology)>,
    /// The pushed `ifconfig-ipv6`.
    pub ifconfig_ipv6: Option<(Ipv6Net, Option<Ipv6Addr>)>,
}

impl TunInfo {
    /// The parameters of a device named `dev` with `tun_mtu` after the push `accepted`.
    pub fn from_push(dev: &str, tun_mtu: u16, accepted: &[PushedOption]) -> TunInfo {
        let topology = accepted
            .iter()
            .find_map(|o| match o {
                PushedOption::Topology(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(Topology::Net30);
        let mut info = TunInfo {
            dev: dev.to_owned(),
            tun_mtu,
            ifconfig: None,
            ifconfig_ipv6: None,
        };
        for option in accepted {
            match option {
                PushedOption::Ifconfig {
                    local,
                    remote_netmask,
                } => info.ifconfig = Some((*local, *remote_netmask, topology)),
                PushedOption::IfconfigIpv6 { local, remote } => {
                    info.ifconfig_ipv6 = Some((*local, *remote))
                }
                _ => {}
            }
        }
        info
    }

    /// The arguments appended to the command.
    pub fn args(&self) -> Vec<String> {
        let (local, second) = match self.ifconfig {
            Some((l, r, _)) => (l.to_string(), r.to_string()),
            None => (String::new(), String::new()),
        };
        vec![
            self.dev.clone(),
            self.tun_mtu.to_string(),
            "0".to_owned(),
            local,
            second,
            "init".to_owned(),
        ]
    }

    /// The variables set for the command.
    pub fn env(&self, kind: ScriptType) -> Vec<(String, String)> {
        let mut env = vec![
            ("script_type", kind.as_str().to_owned()),
            ("script_context", "init".to_owned()),
            ("dev", self.dev.clone()),
            ("dev_type", "tun".to_owned()),
            ("tun_mtu", self.tun_mtu.to_string()),
            ("link_mtu", "0".to_owned()),
        ];
        if let Some((local, second, topology)) = self.ifconfig {
            env.push(("ifconfig_local", local.to_string()));
            match topology {
                Topology::Subnet => env.push(("ifconfig_netmask", second.to_string())),
                Topology::Net30 | Topology::P2p => {
                    env.push(("ifconfig_remote", second.to_string()))
                }
            }
        }
        if let Some((net, remote)) = self.ifconfig_ipv6 {
            env.push(("ifconfig_ipv6_local", net.addr().to_string()));
            env.push(("ifconfig_ipv6_netbits", net.prefix_len().to_string()));
            if let Some(r) = remote {
                env.push(("ifconfig_ipv6_remote", r.to_string()));
            }
        }
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }
}

/// Runs `command` for `kind` and waits for it; a non-zero exit is an error.
pub async fn run_script(
    kind: ScriptType,
    command: &ScriptCommand,
    info: &TunInfo,
) -> Result<(), ScriptError> {
    let Some((program, leading)) = command.argv.split_first() else {
        return Err(ScriptError::Empty);
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(leading).args(info.args()).envs(info.env(kind));
    tracing::info!(script = kind.as_str(), argv = ?command.argv, args = ?info.args(), "running script");
    let status = cmd.status().await.map_err(|source| ScriptError::Spawn {
        program: program.clone(),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(ScriptError::Failed {
            program: program.clone(),
            status,
        })
    }
}

/// A hook that could not run or failed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The command text could not be split into words.
    #[error("cannot split the command line")]
    Split(#[source] TokenizeError),
    /// The command text is empty.
    #[error("empty command")]
    Empty,
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
    fn vpn2_up_hook_splits_and_gets_upstreams_arguments() {
        let cmd =
            ScriptCommand::parse("/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' -- ")
                .expect("parse");
        assert_eq!(
            cmd.argv,
            [
                "/bin/sh",
                "-c",
                "/sbin/ip route replace 241.0.0.0/8 dev $1",
                "--"
            ]
        );
        let info = TunInfo {
            dev: "tun0".into(),
            tun_mtu: 1500,
            ifconfig: Some((
                Ipv4Addr::new(192, 168, 123, 2),
                Ipv4Addr::new(255, 255, 255, 0),
                Topology::Subnet,
            )),
            ifconfig_ipv6: None,
        };
        assert_eq!(
            info.args(),
            [
                "tun0",
                "1500",
                "0",
                "192.168.123.2",
                "255.255.255.0",
                "init"
            ]
        );
        let env = info.env(ScriptType::Up);
        assert!(env.contains(&("ifconfig_netmask".into(), "255.255.255.0".into())));
        assert!(env.contains(&("script_type".into(), "up".into())));
    }

    #[tokio::test]
    async fn a_script_sees_its_arguments_and_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let cmd = ScriptCommand::parse(&format!(
            "/bin/sh -c 'echo \"$1 $2 $4 $5 $6 $script_type $dev $ifconfig_local\" > {}' --",
            out.display()
        ))
        .expect("parse");
        let info = TunInfo {
            dev: "tun7".into(),
            tun_mtu: 1400,
            ifconfig: Some((
                Ipv4Addr::new(10, 0, 0, 2),
                Ipv4Addr::new(255, 255, 255, 0),
                Topology::Subnet,
            )),
            ifconfig_ipv6: None,
        };
        run_script(ScriptType::Up, &cmd, &info).await.expect("run");
        assert_eq!(
            std::fs::read_to_string(&out).expect("out"),
            "tun7 1400 10.0.0.2 255.255.255.0 init up tun7 10.0.0.2\n"
        );
        let fail = ScriptCommand::parse("/bin/false").expect("parse");
        assert!(matches!(
            run_script(ScriptType::Down, &fail, &info).await,
            Err(ScriptError::Failed { .. })
        ));
    }
}
