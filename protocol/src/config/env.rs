//! The vpn2 environment variables (reference 1.2), parsed from `(name, value)` pairs the
//! caller takes from the process environment: this crate never reads it.
//!
//! As in vpn2, a variable set to the empty string counts as unset (its default applies), and
//! CIDR lists are comma-separated. Each error names the variable.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::{IpNet, Ipv6Net};

use super::model::Family;

/// vpn2's default transfer network (Gardener's `DefaultVPNRangeV6`).
pub const DEFAULT_VPN_NETWORK: &str = "fd8f:6d53:b97a:1::/96";
/// The prefix length `VPN_NETWORK` must have.
pub const VPN_NETWORK_PREFIX_LEN: u8 = 96;
/// Default `SHOOT_SERVICE_NETWORKS` of the server.
pub const DEFAULT_SHOOT_SERVICE_NETWORKS: &str = "100.64.0.0/13";
/// Default `SHOOT_POD_NETWORKS` of the server.
pub const DEFAULT_SHOOT_POD_NETWORKS: &str = "100.96.0.0/11";
/// Default `OPENVPN_PORT` of the client.
pub const DEFAULT_OPENVPN_PORT: u16 = 8132;
/// Default `REVERSED_VPN_HEADER`.
pub const DEFAULT_REVERSED_VPN_HEADER: &str = "invalid-host";
/// Default `REVERSED_VPN_HEADER_KEY`.
pub const DEFAULT_REVERSED_VPN_HEADER_KEY: &str = "Reversed-VPN";
/// Default `POD_LABEL_SELECTOR`.
pub const DEFAULT_POD_LABEL_SELECTOR: &str = "app=kubernetes,role=apiserver";
/// Default `WAIT_TIME`.
pub const DEFAULT_WAIT_TIME: Duration = Duration::from_secs(2);
/// Default `LOCAL_NODE_IP` (unused by vpn2 today).
pub const DEFAULT_LOCAL_NODE_IP: &str = "255.255.255.255";
/// The number of HA servers whose index `POD_NAME` may carry (`-0` to `-2`).
pub const MAX_HA_SERVERS: u8 = 3;

/// An environment variable with a value we cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A value of the wrong form.
    #[error("{variable}={value:?}: expected {expected}")]
    Invalid {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A required variable is unset or empty.
    #[error("{variable} is not set")]
    Missing {
        /// The variable.
        variable: &'static str,
    },
    /// `VPN_NETWORK` is not an IPv6 /96.
    #[error("VPN_NETWORK={value:?}: must be an IPv6 network of exactly /{VPN_NETWORK_PREFIX_LEN}")]
    VpnNetwork {
        /// Its value.
        value: String,
    },
    /// `IS_HA` is not true, but `POD_NAME` is an HA server's (vpn2 refuses the mismatch).
    #[error("IS_HA is not true but POD_NAME={value:?} ends in -0, -1 or -2, as an HA server pod's name does")]
    HaPodName {
        /// `POD_NAME`.
        value: String,
    },
    /// `IS_HA` is true but a variable HA mode needs is missing or invalid.
    #[error("IS_HA is set to true but {variable} is not set or invalid")]
    HaNeeds {
        /// The variable.
        variable: &'static str,
    },
}

/// The environment of `vpn-server` (reference 1.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vpn2ServerEnv {
    /// `SHOOT_SERVICE_NETWORKS` (default `100.64.0.0/13`).
    pub shoot_service_networks: Vec<IpNet>,
    /// `SHOOT_POD_NETWORKS` (default `100.96.0.0/11`).
    pub shoot_pod_networks: Vec<IpNet>,
    /// `SHOOT_NODE_NETWORKS` (default none).
    pub shoot_node_networks: Vec<IpNet>,
    /// `VPN_NETWORK` (default [`DEFAULT_VPN_NETWORK`]); always an IPv6 /96.
    pub vpn_network: Ipv6Net,
    /// `SEED_POD_NETWORK`.
    pub seed_pod_network: Option<IpNet>,
    /// `POD_NAME`.
    pub pod_name: Option<String>,
    /// `OPENVPN_STATUS_PATH` (required).
    pub status_path: PathBuf,
    /// `IS_HA`.
    pub is_ha: bool,
    /// `HA_VPN_CLIENTS` (default 0; must be > 0 with `IS_HA`).
    pub ha_vpn_clients: u32,
    /// `LOCAL_NODE_IP` (unused by vpn2 today; kept for completeness).
    pub local_node_ip: String,
    /// `OPENVPN_AUTO_MTU`.
    pub auto_mtu: bool,
    /// HA: the server index from the `-0` / `-1` / `-2` suffix of `POD_NAME`.
    pub server_index: Option<u8>,
}

impl Vpn2ServerEnv {
    /// Parses the server's variables from `(name, value)` pairs (later pairs win).
    pub fn parse<I, K, V>(vars: I) -> Result<Vpn2ServerEnv, EnvError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env = Env::new(vars);
        let is_ha = env.bool("IS_HA")?;
        let pod_name = env.string("POD_NAME");
        let ha_vpn_clients = env.u32("HA_VPN_CLIENTS")?.unwrap_or(0);
        // vpn2 reads HA from the name: one digit 0-2 after the last `-`, as a StatefulSet's
        // pods are named; a Deployment's pod name never ends so.
        let name_index = pod_name
            .as_deref()
            .and_then(|name| name.rsplit_once('-'))
            .and_then(|(_, n)| match n.as_bytes() {
                [d @ b'0'..=b'9'] => Some(d - b'0'),
                _ => None,
            })
            .filter(|n| *n < MAX_HA_SERVERS);
        let server_index = match (is_ha, name_index) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(EnvError::HaPodName {
                    value: pod_name.clone().unwrap_or_default(),
                })
            }
            (true, None) => {
                return Err(EnvError::HaNeeds {
                    variable: "POD_NAME",
                })
            }
            (true, Some(_)) if ha_vpn_clients == 0 => {
                return Err(EnvError::HaNeeds {
                    variable: "HA_VPN_CLIENTS",
                })
            }
            (true, index) => index,
        };
        Ok(Vpn2ServerEnv {
            shoot_service_networks: env
                .cidrs("SHOOT_SERVICE_NETWORKS")?
                .unwrap_or_else(|| default_cidrs(DEFAULT_SHOOT_SERVICE_NETWORKS)),
            shoot_pod_networks: env
                .cidrs("SHOOT_POD_NETWORKS")?
                .unwrap_or_else(|| default_cidrs(DEFAULT_SHOOT_POD_NETWORKS)),
            shoot_node_networks: env.cidrs("SHOOT_NODE_NETWORKS")?.unwrap_or_default(),
            vpn_network: env.vpn_network()?,
            seed_pod_network: env.cidr("SEED_POD_NETWORK")?,
            pod_name,
            status_path: env.string("OPENVPN_STATUS_PATH").map(PathBuf::from).ok_or(
                EnvError::Missing {
                    variable: "OPENVPN_STATUS_PATH",
                },
            )?,
            is_ha,
            ha_vpn_clients,
            local_node_ip: env
                .string("LOCAL_NODE_IP")
                .unwrap_or_else(|| DEFAULT_LOCAL_NODE_IP.to_owned()),
            auto_mtu: env.bool("OPENVPN_AUTO_MTU")?,
            server_index,
        })
    }

    /// Every shoot network (services, pods, nodes), in that order.
    pub fn shoot_networks(&self) -> Vec<IpNet> {
        let mut all = self.shoot_service_networks.clone();
        all.extend(&self.shoot_pod_networks);
        all.extend(&self.shoot_node_networks);
        all
    }

    /// The network of `server-ipv6`: the whole /96 without HA; with HA the server's /112
    /// `…::1NN:0/112`, NN the index as two hex digits (reference 1.4).
    pub fn server_ipv6_network(&self) -> Ipv6Net {
        match self.server_index {
            None => self.vpn_network,
            Some(i) => {
                let base = u128::from(self.vpn_network.network());
                let addr = base | ((0x100 + u128::from(i)) << 16);
                Ipv6Net::new(Ipv6Addr::from(addr), 112).unwrap_or(self.vpn_network)
            }
        }
    }

    /// The device: `tun0` without HA, `tap0` with HA.
    pub fn device(&self) -> &'static str {
        if self.is_ha {
            "tap0"
        } else {
            "tun0"
        }
    }
}

/// An IPv4 kube-apiserver's address in the IPv6 transfer network (`VPN_NETWORK`) in HA mode
/// (`docs/ha.md` §5): the network's upper 96 bits and the pod IP as the low 32.
pub fn ha_transfer_address(transfer: Ipv6Net, pod_ip: std::net::Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from((u128::from(transfer.network()) & !0xffff_ffff) | u128::from(u32::from(pod_ip)))
}

/// What vpn2's `OPENVPN_AUTO_MTU` makes of the MTU of the default route's link: 130 bytes
/// less (an IPv6 and a TCP header and OpenVPN's framing), never below 1280 (reference
/// gardener-vpn2.md 1.11).
pub fn vpn2_auto_mtu(link_mtu: u32) -> u16 {
    let mtu = link_mtu
        .saturating_sub(VPN2_AUTO_MTU_OVERHEAD)
        .max(VPN2_AUTO_MTU_MIN);
    u16::try_from(mtu).unwrap_or(u16::MAX)
}

/// The bytes `OPENVPN_AUTO_MTU` takes off the link's MTU.
pub const VPN2_AUTO_MTU_OVERHEAD: u32 = 130;
/// The least MTU `OPENVPN_AUTO_MTU` sets (IPv6's minimum).
pub const VPN2_AUTO_MTU_MIN: u32 = 1280;

/// One entry of `IP_FAMILIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

/// `IP_FAMILIES`: the primary family and, for dual-stack, the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpFamilies {
    /// The first entry.
    pub primary: IpFamily,
    /// The second entry, if dual-stack.
    pub secondary: Option<IpFamily>,
}

impl IpFamilies {
    /// The client `proto` vpn2 writes: `tcp-client` for dual-stack, else `tcp4-client` or
    /// `tcp6-client`.
    pub fn client_proto(&self) -> &'static str {
        match self.client_family() {
            Family::Any => "tcp-client",
            Family::V4 => "tcp4-client",
            Family::V6 => "tcp6-client",
        }
    }

    /// The socket family of [`IpFamilies::client_proto`]: either for dual-stack, else the
    /// one family.
    pub fn client_family(&self) -> Family {
        match (self.primary, self.secondary) {
            (_, Some(_)) => Family::Any,
            (IpFamily::V4, None) => Family::V4,
            (IpFamily::V6, None) => Family::V6,
        }
    }
}

/// `BONDING_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BondingMode {
    /// `active-backup` (default).
    #[default]
    ActiveBackup,
    /// `balance-rr`.
    BalanceRr,
}

/// The environment of `vpn-client` (reference 1.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vpn2ClientEnv {
    /// `IP_FAMILIES` (default `IPv4`).
    pub ip_families: IpFamilies,
    /// `ENDPOINT`: the proxy host (shoot client) or `vpn-seed-server-N` (seed client).
    pub endpoint: Option<String>,
    /// `OPENVPN_PORT` (default 8132; Gardener sets 8443): the proxy port.
    pub openvpn_port: u16,
    /// `VPN_NETWORK` (default [`DEFAULT_VPN_NETWORK`]); always an IPv6 /96.
    pub vpn_network: Ipv6Net,
    /// `SEED_POD_NETWORK`.
    pub seed_pod_network: Option<IpNet>,
    /// `SHOOT_SERVICE_NETWORKS` (default none on the client).
    pub shoot_service_networks: Vec<IpNet>,
    /// `SHOOT_POD_NETWORKS` (default none on the client).
    pub shoot_pod_networks: Vec<IpNet>,
    /// `SHOOT_NODE_NETWORKS`.
    pub shoot_node_networks: Vec<IpNet>,
    /// `IS_SHOOT_CLIENT`.
    pub is_shoot_client: bool,
    /// `POD_NAME`.
    pub pod_name: Option<String>,
    /// The trailing number of `POD_NAME` (after its last `-`), if any: the HA client index.
    pub client_index: Option<u32>,
    /// `NAMESPACE`.
    pub namespace: Option<String>,
    /// `VPN_SERVER_INDEX`.
    pub vpn_server_index: Option<u32>,
    /// `IS_HA`.
    pub is_ha: bool,
    /// `REVERSED_VPN_HEADER` (default `invalid-host`).
    pub reversed_vpn_header: String,
    /// `REVERSED_VPN_HEADER_KEY` (default `Reversed-VPN`).
    pub reversed_vpn_header_key: String,
    /// `HA_VPN_CLIENTS`.
    pub ha_vpn_clients: u32,
    /// `HA_VPN_SERVERS`.
    pub ha_vpn_servers: u32,
    /// `POD_LABEL_SELECTOR`.
    pub pod_label_selector: String,
    /// `WAIT_TIME` (a Go duration such as `2s`, `500ms`, `1m30s`).
    pub wait_time: Duration,
    /// `BONDING_MODE`.
    pub bonding_mode: BondingMode,
    /// `OPENVPN_AUTO_MTU`.
    pub auto_mtu: bool,
}

impl Vpn2ClientEnv {
    /// Parses the client's variables from `(name, value)` pairs (later pairs win).
    pub fn parse<I, K, V>(vars: I) -> Result<Vpn2ClientEnv, EnvError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env = Env::new(vars);
        let pod_name = env.string("POD_NAME");
        let client_index = pod_name
            .as_deref()
            .and_then(|n| n.rsplit('-').next())
            .and_then(|n| n.parse().ok());
        let is_ha = env.bool("IS_HA")?;
        let ha_vpn_clients = env.u32("HA_VPN_CLIENTS")?.unwrap_or(0);
        let ha_vpn_servers = env.u32("HA_VPN_SERVERS")?.unwrap_or(0);
        if (ha_vpn_clients == 0) != (ha_vpn_servers == 0) {
            let variable = if ha_vpn_clients == 0 {
                "HA_VPN_CLIENTS"
            } else {
                "HA_VPN_SERVERS"
            };
            return Err(EnvError::Missing { variable });
        }
        Ok(Vpn2ClientEnv {
            ip_families: env.ip_families()?,
            endpoint: env.string("ENDPOINT"),
            openvpn_port: match env.string("OPENVPN_PORT") {
                None => DEFAULT_OPENVPN_PORT,
                Some(v) => v.parse().ok().filter(|p| *p > 0).ok_or(EnvError::Invalid {
                    variable: "OPENVPN_PORT",
                    value: v,
                    expected: "a port 1-65535",
                })?,
            },
            vpn_network: env.vpn_network()?,
            seed_pod_network: env.cidr("SEED_POD_NETWORK")?,
            shoot_service_networks: env.cidrs("SHOOT_SERVICE_NETWORKS")?.unwrap_or_default(),
            shoot_pod_networks: env.cidrs("SHOOT_POD_NETWORKS")?.unwrap_or_default(),
            shoot_node_networks: env.cidrs("SHOOT_NODE_NETWORKS")?.unwrap_or_default(),
            is_shoot_client: env.bool("IS_SHOOT_CLIENT")?,
            pod_name,
            client_index,
            namespace: env.string("NAMESPACE"),
            vpn_server_index: env.u32("VPN_SERVER_INDEX")?,
            is_ha,
            reversed_vpn_header: env
                .string("REVERSED_VPN_HEADER")
                .unwrap_or_else(|| DEFAULT_REVERSED_VPN_HEADER.to_owned()),
            reversed_vpn_header_key: env
                .string("REVERSED_VPN_HEADER_KEY")
                .unwrap_or_else(|| DEFAULT_REVERSED_VPN_HEADER_KEY.to_owned()),
            ha_vpn_clients,
            ha_vpn_servers,
            pod_label_selector: env
                .string("POD_LABEL_SELECTOR")
                .unwrap_or_else(|| DEFAULT_POD_LABEL_SELECTOR.to_owned()),
            wait_time: match env.string("WAIT_TIME") {
                None => DEFAULT_WAIT_TIME,
                Some(v) => go_duration(&v).ok_or(EnvError::Invalid {
                    variable: "WAIT_TIME",
                    value: v,
                    expected: "a duration such as 2s or 500ms",
                })?,
            },
            bonding_mode: match env.string("BONDING_MODE").as_deref() {
                None | Some("active-backup") => BondingMode::ActiveBackup,
                Some("balance-rr") => BondingMode::BalanceRr,
                Some(v) => {
                    return Err(EnvError::Invalid {
                        variable: "BONDING_MODE",
                        value: v.to_owned(),
                        expected: "active-backup or balance-rr",
                    })
                }
            },
            auto_mtu: env.bool("OPENVPN_AUTO_MTU")?,
        })
    }
}

/// The variables, empty values dropped.
struct Env(HashMap<String, String>);

impl Env {
    fn new<I, K, V>(vars: I) -> Env
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut map = HashMap::new();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if v.is_empty() {
                map.remove(k);
            } else {
                map.insert(k.to_owned(), v.to_owned());
            }
        }
        Env(map)
    }

    fn string(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    /// Go's `strconv.ParseBool`; unset is false.
    fn bool(&self, name: &'static str) -> Result<bool, EnvError> {
        match self.0.get(name).map(String::as_str) {
            None => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(EnvError::Invalid {
                variable: name,
                value: v.to_owned(),
                expected: "true or false",
            }),
        }
    }

    fn u32(&self, name: &'static str) -> Result<Option<u32>, EnvError> {
        self.0
            .get(name)
            .map(|v| {
                v.parse().map_err(|_| EnvError::Invalid {
                    variable: name,
                    value: v.clone(),
                    expected: "a non-negative number",
                })
            })
            .transpose()
    }

    fn cidr(&self, name: &'static str) -> Result<Option<IpNet>, EnvError> {
        self.0.get(name).map(|v| parse_cidr(name, v)).transpose()
    }

    fn cidrs(&self, name: &'static str) -> Result<Option<Vec<IpNet>>, EnvError> {
        self.0
            .get(name)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| parse_cidr(name, s))
                    .collect()
            })
            .transpose()
    }

    fn vpn_network(&self) -> Result<Ipv6Net, EnvError> {
        let Some(v) = self.0.get("VPN_NETWORK") else {
            return Ok(default_vpn_network());
        };
        match IpNet::from_str(v.trim()) {
            Ok(IpNet::V6(n)) if n.prefix_len() == VPN_NETWORK_PREFIX_LEN => Ok(n.trunc()),
            Ok(_) => Err(EnvError::VpnNetwork { value: v.clone() }),
            Err(_) => Err(EnvError::Invalid {
                variable: "VPN_NETWORK",
                value: v.clone(),
                expected: "an IPv6 CIDR",
            }),
        }
    }

    fn ip_families(&self) -> Result<IpFamilies, EnvError> {
        let Some(v) = self.0.get("IP_FAMILIES") else {
            return Ok(IpFamilies {
                primary: IpFamily::V4,
                secondary: None,
            });
        };
        let invalid = || EnvError::Invalid {
            variable: "IP_FAMILIES",
            value: v.clone(),
            expected: "IPv4, IPv6, IPv4,IPv6 or IPv6,IPv4",
        };
        let family = |s: &str| match s.trim() {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        };
        let mut parts = v.split(',');
        let primary = parts.next().and_then(family).ok_or_else(invalid)?;
        let secondary = match parts.next() {
            None => None,
            Some(s) => Some(family(s).filter(|f| *f != primary).ok_or_else(invalid)?),
        };
        if parts.next().is_some() {
            return Err(invalid());
        }
        Ok(IpFamilies { primary, secondary })
    }
}

fn parse_cidr(name: &'static str, v: &str) -> Result<IpNet, EnvError> {
    IpNet::from_str(v.trim()).map_err(|_| EnvError::Invalid {
        variable: name,
        value: v.to_owned(),
        expected: "a CIDR such as 10.0.0.0/8 or fd00::/64",
    })
}

fn default_cidrs(list: &str) -> Vec<IpNet> {
    list.split(',')
        .filter_map(|s| IpNet::from_str(s).ok())
        .collect()
}

fn default_vpn_network() -> Ipv6Net {
    // fd8f:6d53:b97a:1::/96, written out so no parse can fail.
    let addr = Ipv6Addr::new(0xfd8f, 0x6d53, 0xb97a, 1, 0, 0, 0, 0);
    Ipv6Net::new(addr, VPN_NETWORK_PREFIX_LEN).unwrap_or_default()
}

/// A Go `time.ParseDuration` value made of `h`, `m`, `s`, `ms`, `us`, `ns` parts with
/// non-negative integer or decimal numbers (`1m30s`, `1.5s`, `500ms`); `0` alone is zero.
fn go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn auto_mtu_is_the_link_mtu_less_130_never_below_1280() {
        assert_eq!(super::vpn2_auto_mtu(8930), 8800);
        assert_eq!(super::vpn2_auto_mtu(1500), 1370);
        assert_eq!(super::vpn2_auto_mtu(1400), 1280);
        assert_eq!(super::vpn2_auto_mtu(0), 1280);
        assert_eq!(super::vpn2_auto_mtu(u32::MAX), u16::MAX);
    }
}
