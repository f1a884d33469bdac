//! Strict pull mode: ours, stricter than upstream by design.
//!
//! Upstream's `pull-filter` compares byte prefixes of the raw option text, so a server can
//! slip past a filter by writing the same option differently: `ignore "route "` does not
//! match `route\t10.0.0.0` (tab; dropped by the control-channel character check anyway),
//! `"route" 10.0.0.0` or `'route' 10.0.0.0` (quotes), or `route  10.0.0.0` when the filter
//! expects one space; OpenVPN's manual warns about this. A [`StrictPolicy`] instead decides on
//! the **typed** option, after the line was tokenised and parsed exactly as it would take
//! effect, so no spelling of the pushed text changes its decision:
//!
//! * only option kinds on an explicit allow-list pass ([`StrictPolicy::allow`]); there is no
//!   default list, and `redirect-gateway`, `redirect-private`, `dhcp-option`, `dns`,
//!   `block-outside-dns` pass only if listed;
//! * a `route` / `route-ipv6` passes only if its destination network lies inside one of the
//!   configured allowed networks (containment, not overlap: `10.0.0.0/8` is refused when only
//!   `10.1.0.0/16` is allowed);
//! * `push-continuation` is framing, not configuration, and is never subject to the list.
//!
//! Case: option names are case-sensitive as upstream (`ROUTE` is an unknown option, dropped
//! before strict mode sees it), so a change of case can never turn text into a route.
//!
//! Strict mode runs after upstream's pull-filters, permission mask and the push guard
//! ([`super::PullPolicy`]); an option must pass all of them.
//!
//! The push guard ([`super::guard`]) holds in every mode: misaligned routes, routes that
//! amount to a default route and keepalive switched off are refused before strict mode; routes over the path to the server are
//! refused after it, by the client's driver ([`super::guard::PathGuard`]).
//!
//! Not covered: `ifconfig`/`ifconfig-ipv6` with a wide netmask or prefix also make the kernel
//! add a connected route for that subnet. The push guard refuses one that contains the
//! server's or the proxy's address; any other subnet passes. Allow those kinds only from
//! servers whose address pool you trust, or check the prefix yourself.

use std::collections::BTreeSet;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::options::{OptionKind, PushedOption};

/// The allow-list of a strict pull client.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StrictPolicy {
    kinds: BTreeSet<OptionKind>,
    networks: Vec<IpNet>,
}

/// Why strict mode refused an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StrictRefusal {
    /// The option's kind is not on the allow-list.
    #[error("option kind {kind} is not allowed in strict mode")]
    KindNotAllowed {
        /// The kind.
        kind: OptionKind,
    },
    /// A route whose destination is not inside any allowed network.
    #[error("route to {network} is outside the allowed networks")]
    RouteOutsideAllowedNetworks {
        /// The route's destination.
        network: IpNet,
    },
}

impl StrictPolicy {
    /// The kinds a tunnel needs to come up with a server-assigned address, keepalive and
    /// negotiated cipher, and nothing that changes routing or DNS: `ifconfig`, `ifconfig-ipv6`,
    /// `route-gateway`, `topology`, `ping`, `ping-restart`, `peer-id`, `cipher`, `tun-mtu`,
    /// `key-derivation`, `protocol-flags`, `tun-ipv6`. A starting point for
    /// [`StrictPolicy::allow`]; routes must still be allowed explicitly.
    pub const TUNNEL_BASICS: [OptionKind; 12] = [
        OptionKind::Ifconfig,
        OptionKind::IfconfigIpv6,
        OptionKind::RouteGateway,
        OptionKind::Topology,
        OptionKind::Ping,
        OptionKind::PingRestart,
        OptionKind::PeerId,
        OptionKind::Cipher,
        OptionKind::TunMtu,
        OptionKind::KeyDerivation,
        OptionKind::ProtocolFlags,
        OptionKind::TunIpv6,
    ];

    /// A policy that allows nothing.
    pub fn new() -> StrictPolicy {
        StrictPolicy::default()
    }

    /// Adds option kinds to the allow-list.
    pub fn allow(mut self, kinds: impl IntoIterator<Item = OptionKind>) -> StrictPolicy {
        self.kinds.extend(kinds);
        self
    }

    /// Adds networks inside which pushed routes are allowed (IPv4 for `route`, IPv6 for
    /// `route-ipv6`). Routes still need their kind on the allow-list.
    pub fn allow_networks(mut self, networks: impl IntoIterator<Item = IpNet>) -> StrictPolicy {
        self.networks.extend(networks);
        self
    }

    /// The allowed kinds.
    pub fn kinds(&self) -> impl Iterator<Item = OptionKind> + '_ {
        self.kinds.iter().copied()
    }

    /// The allowed route networks.
    pub fn networks(&self) -> &[IpNet] {
        &self.networks
    }

    /// Decides on one typed option.
    pub fn check(&self, option: &PushedOption) -> Result<(), StrictRefusal> {
        let kind = option.kind();
        if kind == OptionKind::PushContinuation {
            return Ok(());
        }
        if !self.kinds.contains(&kind) {
            return Err(StrictRefusal::KindNotAllowed { kind });
        }
        match option {
            PushedOption::Route(r) => self.check_v4(r.net()),
            PushedOption::RouteIpv6(r) => self.check_v6(r.network),
            _ => Ok(()),
        }
    }

    fn check_v4(&self, net: Ipv4Net) -> Result<(), StrictRefusal> {
        let inside = self.networks.iter().any(|allowed| match allowed {
            IpNet::V4(a) => a.contains(&net),
            IpNet::V6(_) => false,
        });
        if inside {
            Ok(())
        } else {
            Err(StrictRefusal::RouteOutsideAllowedNetworks {
                network: IpNet::V4(net),
            })
        }
    }

    fn check_v6(&self, net: Ipv6Net) -> Result<(), StrictRefusal> {
        let inside = self.networks.iter().any(|allowed| match allowed {
            IpNet::V6(a) => a.contains(&net),
            IpNet::V4(_) => false,
        });
        if inside {
            Ok(())
        } else {
            Err(StrictRefusal::RouteOutsideAllowedNetworks {
                network: IpNet::V6(net),
            })
        }
    }
}
