//! The routing value shoot-side clients put in `X-Gardener-Destination`, `Reversed-VPN` or
//! `X-Gardener-API-Route`: Istio's cluster name for the seed Service they want to reach.
//!
//! ```text
//! outbound|1194||vpn-seed-server.<namespace>.svc.cluster.local
//! outbound|1194||vpn-seed-server-<0..4>.<namespace>.svc.cluster.local      (HA replicas)
//! outbound|443||kube-apiserver.<namespace>.svc.cluster.local
//! ^dir     ^port ^subset (always empty) ^FQDN
//!
//! <namespace>--kube-apiserver-socket      (the kube-apiserver behind Istio's TLS termination)
//! ```
//!
//! These are the shapes Gardener's ingress regular expression admits (reference section
//! 2.5), made stricter: the namespace must be one DNS label (RFC 1123: lowercase letters,
//! digits and `-`, not at either end, at most 63 bytes), the port must be the service's own,
//! and nothing is normalised: uppercase, a trailing dot, percent-encoding, extra `|` fields, a
//! non-empty subset, an empty label or an FQDN over [`MAX_FQDN_LEN`] bytes are refused.
//!
//! A parsed [`RouteValue`] prints back to exactly the string it was parsed from, so an exact
//! string is the key of the router's table and allow-lists: no prefix or substring matching
//! anywhere (`shoot--p--a` never matches `shoot--p--ab`).

use std::fmt;
use std::str::FromStr;

/// Longest FQDN accepted (RFC 1035 name length in text form, no trailing dot).
pub const MAX_FQDN_LEN: usize = 253;
/// Longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;
/// The traffic direction field Istio puts first.
pub const OUTBOUND: &str = "outbound";
/// The cluster-local suffix every target FQDN ends with.
pub const CLUSTER_SUFFIX: &str = ".svc.cluster.local";
/// The OpenVPN port of `vpn-seed-server`.
pub const VPN_SEED_SERVER_PORT: u16 = 1194;
/// The HTTPS port of `kube-apiserver`.
pub const KUBE_APISERVER_PORT: u16 = 443;
/// What follows the namespace in the socket shape.
pub const SOCKET_SUFFIX: &str = "--kube-apiserver-socket";
/// Highest HA replica index of `vpn-seed-server-N`.
pub const MAX_VPN_REPLICA: u8 = 4;

/// Which seed Service a routing value names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// `vpn-seed-server`, or with HA `vpn-seed-server-N` (`replica: Some(N)`).
    VpnSeedServer {
        /// The HA replica index, `0..=MAX_VPN_REPLICA`.
        replica: Option<u8>,
    },
    /// `kube-apiserver`.
    KubeApiserver,
    /// The kube-apiserver's socket behind Istio's TLS termination
    /// (`<namespace>--kube-apiserver-socket`; no port of its own, 443 is reported).
    KubeApiserverSocket,
}

impl Service {
    /// The only port a value for this service may carry.
    pub const fn port(self) -> u16 {
        match self {
            Service::VpnSeedServer { .. } => VPN_SEED_SERVER_PORT,
            Service::KubeApiserver | Service::KubeApiserverSocket => KUBE_APISERVER_PORT,
        }
    }

    fn parse(label: &str) -> Option<Self> {
        if label == "kube-apiserver" {
            return Some(Service::KubeApiserver);
        }
        let rest = label.strip_prefix("vpn-seed-server")?;
        if rest.is_empty() {
            return Some(Service::VpnSeedServer { replica: None });
        }
        let digit = rest.strip_prefix('-')?;
        match digit.as_bytes() {
            [d @ b'0'..=b'9'] if d - b'0' <= MAX_VPN_REPLICA => Some(Service::VpnSeedServer {
                replica: Some(d - b'0'),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Service::VpnSeedServer { replica: None } => f.write_str("vpn-seed-server"),
            Service::VpnSeedServer { replica: Some(n) } => write!(f, "vpn-seed-server-{n}"),
            Service::KubeApiserver => f.write_str("kube-apiserver"),
            Service::KubeApiserverSocket => f.write_str("kube-apiserver-socket"),
        }
    }
}

/// A valid routing value: a service in a namespace (the port follows from the service).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteValue {
    service: Service,
    namespace: String,
}

impl RouteValue {
    /// Parses `value` strictly; see the module docs.
    pub fn parse(value: &str) -> Result<Self, RouteError> {
        if value.contains('%') {
            return Err(RouteError::PercentEncoded);
        }
        if value.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(RouteError::Uppercase);
        }
        if let Some(namespace) = value.strip_suffix(SOCKET_SUFFIX) {
            check_label(namespace)?;
            return Ok(Self {
                service: Service::KubeApiserverSocket,
                namespace: namespace.to_owned(),
            });
        }
        let fields: Vec<&str> = value.split('|').collect();
        let [direction, port, subset, fqdn] = fields[..] else {
            return Err(RouteError::FieldCount {
                found: fields.len(),
            });
        };
        if direction != OUTBOUND {
            return Err(RouteError::Direction);
        }
        if !subset.is_empty() {
            return Err(RouteError::Subset);
        }
        let port = parse_port(port).ok_or(RouteError::Port)?;
        if fqdn.len() > MAX_FQDN_LEN {
            return Err(RouteError::FqdnTooLong {
                len: fqdn.len(),
                max: MAX_FQDN_LEN,
            });
        }
        if fqdn.ends_with('.') {
            return Err(RouteError::TrailingDot);
        }
        for label in fqdn.split('.') {
            check_label(label)?;
        }
        let Some(name) = fqdn.strip_suffix(CLUSTER_SUFFIX) else {
            return Err(RouteError::NotClusterLocal);
        };
        let Some((service, namespace)) = name.split_once('.') else {
            return Err(RouteError::Shape);
        };
        if namespace.contains('.') {
            return Err(RouteError::Shape);
        }
        let service = Service::parse(service).ok_or(RouteError::UnknownService)?;
        if port != service.port() {
            return Err(RouteError::WrongPort {
                port,
                expected: service.port(),
            });
        }
        Ok(Self {
            service,
            namespace: namespace.to_owned(),
        })
    }

    /// A value for `service` in `namespace` (which must be one valid DNS label).
    pub fn new(service: Service, namespace: &str) -> Result<Self, RouteError> {
        Self::parse(&match service {
            Service::KubeApiserverSocket => format!("{namespace}{SOCKET_SUFFIX}"),
            _ => format!(
                "{OUTBOUND}|{}||{service}.{namespace}{CLUSTER_SUFFIX}",
                service.port()
            ),
        })
    }

    /// The service.
    pub fn service(&self) -> Service {
        self.service
    }

    /// The namespace (the shoot's technical id, e.g. `shoot--project--name`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The port (the service's).
    pub fn port(&self) -> u16 {
        self.service.port()
    }

    /// The Service's cluster-local name (`kube-apiserver.<namespace>.svc.cluster.local`); the
    /// socket shape names the kube-apiserver Service too.
    pub fn fqdn(&self) -> String {
        let service = match self.service {
            Service::KubeApiserverSocket => Service::KubeApiserver,
            other => other,
        };
        format!("{service}.{}{CLUSTER_SUFFIX}", self.namespace)
    }
}

impl fmt::Display for RouteValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.service {
            Service::KubeApiserverSocket => write!(f, "{}{SOCKET_SUFFIX}", self.namespace),
            _ => write!(f, "{OUTBOUND}|{}||{}", self.port(), self.fqdn()),
        }
    }
}

impl FromStr for RouteValue {
    type Err = RouteError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Checks that `namespace` could be a routing value's namespace (an RFC 1123 label in lower
/// case, as Kubernetes namespaces are): what names a shoot everywhere the router counts one.
pub fn check_namespace(namespace: &str) -> Result<(), RouteError> {
    if namespace.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(RouteError::Uppercase);
    }
    check_label(namespace)
}

/// RFC 1123 label, lowercase only (uppercase was refused before).
fn check_label(label: &str) -> Result<(), RouteError> {
    if label.is_empty() {
        return Err(RouteError::EmptyLabel);
    }
    let ok = label.len() <= MAX_LABEL_LEN
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(RouteError::BadLabel)
    }
}

/// Why a routing value is refused (the router answers 400 to each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A `%` anywhere (no percent-decoding is done, so none is accepted).
    #[error("percent-encoding in routing value")]
    PercentEncoded,
    /// An uppercase letter (values are compared exactly, so case is not folded).
    #[error("uppercase in routing value")]
    Uppercase,
    /// Not exactly four `|`-separated fields.
    #[error("routing value has {found} |-separated fields, expected 4")]
    FieldCount {
        /// How many there were.
        found: usize,
    },
    /// The first field is not `outbound`.
    #[error("routing value direction is not {OUTBOUND:?}")]
    Direction,
    /// The subset field is not empty.
    #[error("routing value has a non-empty subset")]
    Subset,
    /// The port is not 1..=65535 in plain decimal.
    #[error("routing value port is not a port number")]
    Port,
    /// The FQDN is too long.
    #[error("routing value FQDN is {len} bytes, at most {max}")]
    FqdnTooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The FQDN ends with a dot.
    #[error("routing value FQDN ends with a dot")]
    TrailingDot,
    /// Two dots in a row, or a leading dot.
    #[error("routing value FQDN has an empty label")]
    EmptyLabel,
    /// A label is too long or has a byte outside lowercase letters, digits and `-`.
    #[error("routing value FQDN has an invalid label")]
    BadLabel,
    /// The FQDN does not end in `.svc.cluster.local`.
    #[error("routing value FQDN is not {CLUSTER_SUFFIX}")]
    NotClusterLocal,
    /// Not `service.namespace` before the suffix.
    #[error("routing value FQDN is not <service>.<namespace>{CLUSTER_SUFFIX}")]
    Shape,
    /// The service is neither `vpn-seed-server[-0..4]` nor `kube-apiserver`.
    #[error("routing value names an unknown service")]
    UnknownService,
    /// The port is not the service's.
    #[error("routing value port {port}, the service's is {expected}")]
    WrongPort {
        /// The port given.
        port: u16,
        /// The service's port.
        expected: u16,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_three_shapes_and_prints_them_back() {
        for (value, service) in [
            (
                "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local",
                Service::VpnSeedServer { replica: None },
            ),
            (
                "outbound|1194||vpn-seed-server-4.shoot--p--a.svc.cluster.local",
                Service::VpnSeedServer { replica: Some(4) },
            ),
            (
                "outbound|443||kube-apiserver.shoot--p--a.svc.cluster.local",
                Service::KubeApiserver,
            ),
            (
                "shoot--p--a--kube-apiserver-socket",
                Service::KubeApiserverSocket,
            ),
        ] {
            let parsed = RouteValue::parse(value).unwrap();
            assert_eq!(parsed.service(), service);
            assert_eq!(parsed.namespace(), "shoot--p--a");
            assert_eq!(parsed.to_string(), value);
            assert_eq!(RouteValue::new(service, "shoot--p--a").unwrap(), parsed);
        }
    }

    #[test]
    fn refuses_every_malformed_shape() {
        let long_ns = "a".repeat(240);
        let long = format!("outbound|443||kube-apiserver.{long_ns}.svc.cluster.local");
        let long_socket = format!("{}{SOCKET_SUFFIX}", "a".repeat(MAX_LABEL_LEN + 1));
        let cases: Vec<(&str, RouteError)> = vec![
            (
                "outbound|443||vpn-seed-server.shoot--p--a.svc.cluster.local",
                RouteError::WrongPort {
                    port: 443,
                    expected: 1194,
                },
            ),
            (
                "outbound|1194||kube-apiserver.shoot--p--a.svc.cluster.local",
                RouteError::WrongPort {
                    port: 1194,
                    expected: 443,
                },
            ),
            (
                "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local|x",
                RouteError::FieldCount { found: 5 },
            ),
            (
                "outbound|1194|v1|vpn-seed-server.shoot--p--a.svc.cluster.local",
                RouteError::Subset,
            ),
            (
                "outbound|1194||Vpn-seed-server.shoot--p--a.svc.cluster.local",
                RouteError::Uppercase,
            ),
            (
                "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local.",
                RouteError::TrailingDot,
            ),
            (
                "outbound|1194||vpn-seed-server.shoot%2d-p--a.svc.cluster.local",
                RouteError::PercentEncoded,
            ),
            (
                "outbound|1194||vpn-seed-server..svc.cluster.local",
                RouteError::EmptyLabel,
            ),
            (
                "outbound|1194||vpn-seed-server-5.shoot--p--a.svc.cluster.local",
                RouteError::UnknownService,
            ),
            (
                "outbound|1194||vpn-seed-server.a.b.svc.cluster.local",
                RouteError::Shape,
            ),
            (
                "outbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.example",
                RouteError::NotClusterLocal,
            ),
            (
                "outbound|1194||vpn-seed-server",
                RouteError::NotClusterLocal,
            ),
            (
                "inbound|1194||vpn-seed-server.shoot--p--a.svc.cluster.local",
                RouteError::Direction,
            ),
            (
                "outbound|01194||vpn-seed-server.shoot--p--a.svc.cluster.local",
                RouteError::Port,
            ),
            (
                "outbound|1194||vpn-seed-server.-a.svc.cluster.local",
                RouteError::BadLabel,
            ),
            (
                "outbound|1194||vpn-seed-server.a_b.svc.cluster.local",
                RouteError::BadLabel,
            ),
            ("--kube-apiserver-socket", RouteError::EmptyLabel),
            ("a.b--kube-apiserver-socket", RouteError::BadLabel),
            ("shoot---kube-apiserver-socket", RouteError::BadLabel),
            ("x|y--kube-apiserver-socket", RouteError::BadLabel),
            (long_socket.as_str(), RouteError::BadLabel),
            (
                "shoot--p--a--kube-apiserver-socket.svc",
                RouteError::FieldCount { found: 1 },
            ),
            (
                long.as_str(),
                RouteError::FqdnTooLong {
                    len: long.len() - "outbound|443||".len(),
                    max: MAX_FQDN_LEN,
                },
            ),
        ];
        for (value, want) in cases {
            assert_eq!(RouteValue::parse(value), Err(want), "{value}");
        }
    }

    proptest::proptest! {
        /// Every value built from a valid service and namespace parses back to itself, and
        /// any one-byte change either is refused or gives a value that prints as the changed
        /// string: nothing is normalised, so exact-string keys cannot alias.
        #[test]
        fn values_round_trip_and_mutations_never_alias(
            ns in "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
            which in 0u8..7,
            pos in proptest::prelude::any::<proptest::sample::Index>(),
            byte in proptest::prelude::any::<u8>(),
        ) {
            let service = match which {
                0..=4 => Service::VpnSeedServer { replica: Some(which) },
                5 => Service::VpnSeedServer { replica: None },
                _ => Service::KubeApiserver,
            };
            let value = RouteValue::new(service, &ns).unwrap();
            let text = value.to_string();
            proptest::prop_assert_eq!(RouteValue::parse(&text).unwrap(), value.clone());
            let mut bytes = text.clone().into_bytes();
            let i = pos.index(bytes.len());
            bytes[i] = byte;
            if let Ok(mutated) = std::str::from_utf8(&bytes) {
                if let Ok(parsed) = RouteValue::parse(mutated) {
                    proptest::prop_assert_eq!(parsed.to_string(), mutated);
                }
            }
        }
    }
}
