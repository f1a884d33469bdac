//! `up` and `down` commands (`script-security 2`): the client's side.
//!
//! Splitting the command, upstream's arguments (`DEV TUN_MTU 0 IFCONFIG_LOCAL
//! IFCONFIG_NETMASK|IFCONFIG_REMOTE init`), the variables every role sets and running it are
//! [`netio::script`]'s. The client passes both addresses always (empty without a pushed
//! `ifconfig`), and adds `link_mtu` (`0`), `ifconfig_remote` (net30/p2p) instead of
//! `ifconfig_netmask` (`topology subnet`), and `ifconfig_ipv6_remote` when IPv6 was pushed.
//! The client's own environment is passed on too.
//!
//! `up` runs once, after the device got its first pushed configuration; the device is kept
//! across reconnects (as with upstream's `persist-tun`), so it does not run again. A failing
//! `up` stops the client (upstream treats it as fatal too). `down` runs after the device is
//! closed when the client stops, with the same arguments.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;
use netio::script::{upstream_args, IfconfigPeer, ScriptEnv};
pub use netio::script::{ParseError, Script, ScriptError, ScriptType};
use protocol::push::options::Topology;
use protocol::push::PushedOption;

/// `up` / `down`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scripts {
    /// `up CMD`.
    pub up: Option<Script>,
    /// `down CMD`.
    pub down: Option<Script>,
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
        let topology = Topology::of_push(accepted);
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
        upstream_args(&self.dev, self.tun_mtu, [local, second])
    }

    /// The variables set for the command.
    pub fn env(&self, kind: ScriptType) -> ScriptEnv {
        let mut env = ScriptEnv::new(kind, &self.dev, self.tun_mtu);
        env.set("link_mtu", "0");
        if let Some((local, second, topology)) = self.ifconfig {
            let peer = match topology {
                Topology::Subnet => IfconfigPeer::Netmask(second),
                Topology::Net30 | Topology::P2p => IfconfigPeer::Remote(second),
            };
            env.ifconfig(local, peer);
        }
        if let Some((net, remote)) = self.ifconfig_ipv6 {
            env.ifconfig_ipv6(net.addr(), net.prefix_len());
            if let Some(r) = remote {
                env.set("ifconfig_ipv6_remote", r.to_string());
            }
        }
        env
    }
}

/// Runs `command` for `kind` and waits for it; a non-zero exit is an error.
pub async fn run_script(
    kind: ScriptType,
    command: &Script,
    info: &TunInfo,
) -> Result<(), ScriptError> {
    command.run(&info.args(), &info.env(kind)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vpn2_up_hook_splits_and_gets_upstreams_arguments() {
        let cmd = Script::parse("/bin/sh -c '/sbin/ip route replace 241.0.0.0/8 dev $1' -- ")
            .expect("parse");
        assert_eq!(
            cmd.argv(),
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
        let env = env.vars();
        assert!(env.contains(&("ifconfig_netmask".into(), "255.255.255.0".into())));
        assert!(env.contains(&("script_type".into(), "up".into())));
    }

    #[tokio::test]
    async fn a_script_sees_its_arguments_and_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let cmd = Script::parse(&format!(
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
        let fail = Script::parse("/bin/false").expect("parse");
        assert!(matches!(
            run_script(ScriptType::Down, &fail, &info).await,
            Err(ScriptError::Failed { .. })
        ));
    }
}
