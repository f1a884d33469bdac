//! The per-client file of `client-config-dir` (reference 10.6): the server reads
//! `DIR/<common name>` (or `DIR/DEFAULT`) after authentication. Parsed by the same lexer as
//! the main config; only the per-client directives are allowed, a server directive is
//! [`ErrorReason::NotInClientConfigDir`], anything else [`ErrorReason::UnknownDirective`].

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::args::{bad, ipv4, ipv4_net, ipv6, ipv6_net, Args};
use super::lex::lex;
use super::{ConfigError, ErrorReason};

/// `ifconfig-push LOCAL REMOTE-NETMASK [ALIAS]`: values from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfconfigPush {
    /// The client's address.
    pub local: Ipv4Addr,
    /// The netmask (`topology subnet`) or the peer address.
    pub remote_netmask: Ipv4Addr,
}

/// `ifconfig-ipv6-push ADDR/BITS [REMOTE]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfconfigIpv6Push {
    /// The client's address with the prefix length.
    pub local: Ipv6Net,
    /// The server side, if given.
    pub remote: Option<Ipv6Addr>,
}

/// One client-config-dir file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CcdOptions {
    /// `iroute NETWORK [NETMASK]` (netmask default /32).
    pub iroutes: Vec<Ipv4Net>,
    /// `iroute-ipv6 NETWORK/BITS`.
    pub iroutes_ipv6: Vec<Ipv6Net>,
    /// `ifconfig-push`.
    pub ifconfig_push: Option<IfconfigPush>,
    /// `ifconfig-ipv6-push`.
    pub ifconfig_ipv6_push: Option<IfconfigIpv6Push>,
    /// `push-reset`: drop the pushes inherited from the main config.
    pub push_reset: bool,
    /// `push-remove PREFIX`: drop inherited pushes starting with PREFIX.
    pub push_remove: Vec<String>,
    /// `push "OPTION"`, added after the inherited ones.
    pub push: Vec<String>,
    /// `disable`: refuse this client.
    pub disable: bool,
}

impl CcdOptions {
    /// Parses a client-config-dir file. `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<CcdOptions, ConfigError> {
        let mut out = CcdOptions::default();
        for d in lex(file, text)? {
            out.apply(&d).map_err(|reason| ConfigError {
                file: file.to_owned(),
                line: Some(d.line),
                directive: Some(d.name.clone()),
                reason,
            })?;
        }
        Ok(out)
    }

    fn apply(&mut self, d: &super::Directive) -> Result<(), ErrorReason> {
        let a = Args(d);
        if d.inline.is_some() {
            return Err(ErrorReason::NotInClientConfigDir);
        }
        match d.name.as_str() {
            "iroute" => {
                a.count(1, 2, "NETWORK [NETMASK]")?;
                self.iroutes
                    .push(ipv4_net(a.s(0), a.opt(1).unwrap_or("255.255.255.255"))?);
            }
            "iroute-ipv6" => {
                a.count(1, 1, "NETWORK/BITS")?;
                let net = ipv6_net(a.s(0))?;
                if net.network() != net.addr() {
                    return Err(ErrorReason::NotNetworkAddress {
                        network: a.s(0).to_owned(),
                    });
                }
                self.iroutes_ipv6.push(net);
            }
            "ifconfig-push" => {
                a.count(2, 3, "LOCAL REMOTE-NETMASK [ALIAS]")?;
                self.ifconfig_push = Some(IfconfigPush {
                    local: ipv4(a.s(0))?,
                    remote_netmask: ipv4(a.s(1))?,
                });
            }
            "ifconfig-ipv6-push" => {
                a.count(1, 2, "ADDR/BITS [REMOTE]")?;
                let local = ipv6_net(a.s(0))?;
                self.ifconfig_ipv6_push = Some(IfconfigIpv6Push {
                    local,
                    remote: a.opt(1).map(ipv6).transpose()?,
                });
            }
            "push" => {
                a.count(1, 1, "\"OPTION\"")?;
                self.push.push(a.s(0).to_owned());
            }
            "push-reset" => {
                a.count(0, 0, "")?;
                self.push_reset = true;
            }
            "push-remove" => {
                a.count(1, 1, "PREFIX")?;
                if a.s(0).is_empty() {
                    return Err(bad(a.s(0), "a non-empty option prefix"));
                }
                self.push_remove.push(a.s(0).to_owned());
            }
            "disable" => {
                a.count(0, 0, "")?;
                self.disable = true;
            }
            name if MAIN_CONFIG_ONLY.contains(&name) => {
                return Err(ErrorReason::NotInClientConfigDir)
            }
            _ => return Err(ErrorReason::UnknownDirective),
        }
        Ok(())
    }
}

/// Directives of a main config, refused in a client-config-dir file with a clear reason.
const MAIN_CONFIG_ONLY: [&str; 40] = [
    "mode",
    "tls-server",
    "tls-client",
    "client",
    "pull",
    "proto",
    "port",
    "local",
    "remote",
    "dev",
    "dev-type",
    "topology",
    "server",
    "server-ipv6",
    "client-config-dir",
    "duplicate-cn",
    "client-to-client",
    "keepalive",
    "ping",
    "ping-restart",
    "tcp-nodelay",
    "txqueuelen",
    "tun-mtu",
    "data-ciphers",
    "cipher",
    "auth",
    "tls-auth",
    "tls-crypt",
    "ca",
    "cert",
    "key",
    "dh",
    "max-clients",
    "max-routes-per-client",
    "status",
    "verb",
    "route",
    "route-ipv6",
    "ifconfig-pool",
    "script-security",
];
