//! The routing decision: which header (or TLS server name), which route, whether the client
//! may use it. Pure: the caller supplies the parsed head (or the ClientHello's name), the
//! listener's header names, the connection's addresses and one [`Policy`] snapshot, so every
//! request is decided by exactly one policy.

use std::collections::HashMap;
use std::net::IpAddr;

use protocol::http::connect::{ConnectHead, Status};
use protocol::http::route::{RouteError, RouteValue};

use crate::access::{admits, AlwaysAllowed, Client, Denial, Rule};
use crate::client_hello::{HelloError, ServerName};

/// The routing header names the router knows (canonical spelling; matching ignores case).
pub const ROUTING_HEADERS: [&str; 3] = [
    "X-Gardener-Destination",
    "Reversed-VPN",
    "X-Gardener-API-Route",
];

/// Routes and their rules; replaced as a whole on reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Routing value → target; exact match only.
    pub routes: HashMap<RouteValue, Target>,
    /// TLS server name → target, for `kind = "sni"` listeners; exact match only
    /// ([`Policy::decide_sni`]).
    pub sni_routes: HashMap<ServerName, Target>,
    /// Networks allowed to reach every target whatever its rules say (seed nodes and pods,
    /// shoot nodes, egress addresses, the operator's additional CIDRs).
    pub always_allowed: AlwaysAllowed,
}

/// Where a routing value leads, and who may go there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` to connect to.
    pub upstream: String,
    /// Ordered rules, first match wins ([`crate::access`]); none: any client.
    pub rules: Vec<Rule>,
    /// The shoot whose `vpn_router_shoot_*` series count this route's connections, for
    /// `[[sni_route]]`s (their `shoot`, or the shoot file they are in); `None` for CONNECT
    /// routes, whose shoot is their routing value's namespace, and for SNI routes of no shoot.
    pub shoot: Option<String>,
}

/// An accepted request: the route it matched and its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    /// The matched routing value.
    pub route: &'p RouteValue,
    /// Its target.
    pub target: &'p Target,
}

impl Policy {
    /// Decides `head` from `who` on a listener honouring `honoured` header names.
    ///
    /// The request must carry exactly one routing header line, under a name the listener
    /// honours; a routing header the listener does not honour, a second line (even with the
    /// same value), a malformed value or one without a route is refused, never routed
    /// elsewhere. Then the target's rules must admit `who` ([`admits`]).
    pub fn decide<'p>(
        &'p self,
        head: &ConnectHead,
        honoured: &[&str],
        who: Client,
    ) -> Result<Decision<'p>, Refusal> {
        let mut found = Vec::new();
        for header in &head.headers {
            let Some(known) = ROUTING_HEADERS.iter().find(|k| header.is(k)) else {
                continue;
            };
            if !honoured.contains(known) {
                return Err(Refusal::NotHonoured { name: known });
            }
            found.push(header.value.as_str());
        }
        let value = match found[..] {
            [] => return Err(Refusal::Missing),
            [one] => one,
            [..] => {
                let conflicting = found.iter().any(|v| *v != found[0]);
                return Err(Refusal::Repeated {
                    count: found.len(),
                    conflicting,
                });
            }
        };
        let route = RouteValue::parse(value).map_err(|source| Refusal::Malformed {
            value: value.to_owned(),
            source,
        })?;
        let Some((route, target)) = self.routes.get_key_value(&route) else {
            return Err(Refusal::Unknown { route });
        };
        admits(&target.rules, &self.always_allowed, who).map_err(|by| Refusal::Denied {
            route: route.clone(),
            client: who.address,
            peer: who.peer,
            by,
        })?;
        Ok(Decision { route, target })
    }

    /// Decides a ClientHello's `name` from `who`: an exact `[[sni_route]]` name (stored and
    /// compared in lower case), then its rules ([`admits`]).
    pub fn decide_sni(&self, name: &ServerName, who: Client) -> Result<&Target, SniRefusal> {
        let Some(target) = self.sni_routes.get(name) else {
            return Err(SniRefusal::Unknown);
        };
        admits(&target.rules, &self.always_allowed, who).map_err(SniRefusal::Denied)?;
        Ok(target)
    }
}

/// Why a parsed request is not routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No routing header.
    #[error("no routing header")]
    Missing,
    /// More than one routing header line.
    #[error("{count} routing header lines (conflicting: {conflicting})")]
    Repeated {
        /// How many.
        count: usize,
        /// Whether their values differ.
        conflicting: bool,
    },
    /// A routing header this listener does not honour.
    #[error("routing header {name} is not honoured on this listener")]
    NotHonoured {
        /// Its canonical name.
        name: &'static str,
    },
    /// The value is malformed.
    #[error("malformed routing value {value:?}")]
    Malformed {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: RouteError,
    },
    /// A valid value with no route.
    #[error("no route for {route}")]
    Unknown {
        /// The value.
        route: RouteValue,
    },
    /// The target's rules do not admit the connection.
    #[error("client {client} (peer {peer}) is not allowed to reach {route}: {by}")]
    Denied {
        /// The target.
        route: RouteValue,
        /// The client address (PROXY source, else the peer).
        client: IpAddr,
        /// The TCP peer.
        peer: IpAddr,
        /// Which rule denied, or none matched.
        by: Denial,
    },
}

impl Refusal {
    /// 403 for a denial, 400 for everything else.
    pub fn status(&self) -> Status {
        match self {
            Refusal::Denied { .. } => Status::FORBIDDEN,
            _ => Status::BAD_REQUEST,
        }
    }
}

/// Why an SNI connection was closed before its upstream: the `reason` of
/// `vpn_router_sni_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SniRefusal {
    /// The first bytes (after any PROXY header) are not a TLS handshake record.
    #[error("not TLS")]
    NotTls,
    /// A malformed ClientHello, or a server name that is no DNS host name.
    #[error("malformed ClientHello")]
    Malformed,
    /// A ClientHello over the size or record bound.
    #[error("ClientHello too large")]
    TooLarge,
    /// A ClientHello without a server name.
    #[error("no server name")]
    NoSni,
    /// A server name no `[[sni_route]]` lists.
    #[error("no route for the server name")]
    Unknown,
    /// The route's rules do not admit the connection.
    #[error("denied: {0}")]
    Denied(Denial),
    /// The ClientHello was not complete within the header deadline.
    #[error("no complete ClientHello in time")]
    Timeout,
    /// Connecting upstream failed or timed out.
    #[error("upstream connect failed")]
    Upstream,
    /// `max_connections` were open already (closed at accept, unread).
    #[error("connection limit reached")]
    OverLimit,
}

impl SniRefusal {
    /// Every `reason` label, in counter order.
    pub const LABELS: [&'static str; 9] = [
        "not_tls",
        "malformed",
        "too_large",
        "no_sni",
        "unknown",
        "denied",
        "timeout",
        "upstream",
        "over_limit",
    ];

    pub(crate) fn index(self) -> usize {
        match self {
            SniRefusal::NotTls => 0,
            SniRefusal::Malformed => 1,
            SniRefusal::TooLarge => 2,
            SniRefusal::NoSni => 3,
            SniRefusal::Unknown => 4,
            SniRefusal::Denied(_) => 5,
            SniRefusal::Timeout => 6,
            SniRefusal::Upstream => 7,
            SniRefusal::OverLimit => 8,
        }
    }

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        Self::LABELS[self.index()]
    }

    /// The refusal of a ClientHello the parser refused.
    pub(crate) fn of(e: &HelloError) -> Self {
        match e {
            HelloError::NotTls => SniRefusal::NotTls,
            HelloError::Malformed { .. } | HelloError::Name(_) => SniRefusal::Malformed,
            HelloError::TooLarge { .. } => SniRefusal::TooLarge,
            HelloError::NoServerName => SniRefusal::NoSni,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Action, Source};
    use ipnet::IpNet;
    use protocol::http::connect::parse_connect_request;

    fn head(headers: &str) -> ConnectHead {
        let raw = format!("CONNECT a:1 HTTP/1.0\r\n{headers}\r\n");
        parse_connect_request(raw.as_bytes()).unwrap().unwrap().0
    }

    fn vpn(ns: &str) -> String {
        format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local")
    }

    fn policy() -> Policy {
        let mut routes = HashMap::new();
        for (ns, allow) in [
            (
                "shoot--p--a",
                vec![Rule::allow(vec!["192.0.2.0/24".parse().unwrap()])],
            ),
            ("shoot--p--ab", vec![]),
            ("shoot--p--a-b", vec![]),
            (
                "shoot--p--deny",
                vec![
                    Rule {
                        action: Action::Deny,
                        from: vec!["192.0.2.9/32".parse().unwrap()],
                        source: Source::Proxy,
                    },
                    Rule {
                        action: Action::Allow,
                        from: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
                        source: Source::Proxy,
                    },
                ],
            ),
        ] {
            routes.insert(
                RouteValue::parse(&vpn(ns)).unwrap(),
                Target {
                    upstream: format!("{ns}:1194"),
                    rules: allow,
                    shoot: None,
                },
            );
        }
        routes.insert(
            RouteValue::parse("shoot--p--a--kube-apiserver-socket").unwrap(),
            Target {
                upstream: "kube-apiserver-socket:443".into(),
                rules: vec![],
                shoot: None,
            },
        );
        let always: Vec<IpNet> = vec!["10.250.0.0/16".parse().unwrap()];
        Policy {
            routes,
            sni_routes: HashMap::new(),
            always_allowed: AlwaysAllowed {
                proxy: always,
                peer: vec![],
            },
        }
    }

    #[test]
    fn the_socket_shape_routes_to_its_own_upstream() {
        let p = policy();
        let c = Client::direct("192.0.2.9".parse().unwrap());
        let h = |v: &str| head(&format!("X-Gardener-Destination: {v}\r\n"));
        let routed = p.decide(&h("shoot--p--a--kube-apiserver-socket"), H, c);
        assert_eq!(routed.unwrap().target.upstream, "kube-apiserver-socket:443");
        assert!(matches!(
            p.decide(&h("shoot--p--ab--kube-apiserver-socket"), H, c),
            Err(Refusal::Unknown { .. })
        ));
    }

    const H: &[&str] = &["X-Gardener-Destination", "Reversed-VPN"];

    #[test]
    fn allow_lists_apply_to_their_exact_target_only() {
        let p = policy();
        let outsider = Client::direct("198.51.100.1".parse().unwrap());
        let insider = Client::direct("192.0.2.9".parse().unwrap());
        let seed = Client::direct("10.250.3.4".parse().unwrap());
        let h = |ns: &str| head(&format!("X-Gardener-Destination: {}\r\n", vpn(ns)));
        assert!(matches!(
            p.decide(&h("shoot--p--a"), H, outsider),
            Err(Refusal::Denied { .. })
        ));
        assert!(p.decide(&h("shoot--p--a"), H, insider).is_ok());
        assert!(p.decide(&h("shoot--p--a"), H, seed).is_ok());
        assert!(p.decide(&h("shoot--p--ab"), H, outsider).is_ok());
        assert!(p.decide(&h("shoot--p--a-b"), H, outsider).is_ok());
        // The deny rule before the allow-all, and the always-allowed before both.
        assert_eq!(
            p.decide(&h("shoot--p--deny"), H, insider),
            Err(Refusal::Denied {
                route: RouteValue::parse(&vpn("shoot--p--deny")).unwrap(),
                client: "192.0.2.9".parse().unwrap(),
                peer: "192.0.2.9".parse().unwrap(),
                by: Denial::Rule(0),
            })
        );
        assert!(p.decide(&h("shoot--p--deny"), H, outsider).is_ok());
        let mapped = Client::direct("::ffff:192.0.2.9".parse().unwrap());
        assert!(p.decide(&h("shoot--p--deny"), H, mapped).is_err());
        assert!(p.decide(&h("shoot--p--a"), H, mapped).is_ok());
        assert_eq!(
            p.decide(&h("shoot--p--a"), H, outsider)
                .unwrap_err()
                .status(),
            Status::FORBIDDEN
        );
    }

    #[test]
    fn header_refusals() {
        let p = policy();
        let c = Client::direct("192.0.2.9".parse().unwrap());
        let v = vpn("shoot--p--a");
        for (headers, want) in [
            (String::new(), Refusal::Missing),
            (
                format!("Reversed-VPN: {v}\r\nX-Gardener-Destination: {v}\r\n"),
                Refusal::Repeated {
                    count: 2,
                    conflicting: false,
                },
            ),
            (
                format!(
                    "Reversed-VPN: {v}\r\nreversed-vpn: {}\r\n",
                    vpn("shoot--p--ab")
                ),
                Refusal::Repeated {
                    count: 2,
                    conflicting: true,
                },
            ),
            (
                format!("X-Gardener-API-Route: {v}\r\n"),
                Refusal::NotHonoured {
                    name: "X-Gardener-API-Route",
                },
            ),
            (
                format!("Reversed-VPN: {}\r\n", vpn("shoot--p--zz")),
                Refusal::Unknown {
                    route: RouteValue::parse(&vpn("shoot--p--zz")).unwrap(),
                },
            ),
        ] {
            assert_eq!(p.decide(&head(&headers), H, c), Err(want), "{headers}");
        }
        assert!(matches!(
            p.decide(&head(&format!("Reversed-VPN: {v}.\r\n")), H, c),
            Err(Refusal::Malformed { .. })
        ));
    }

    /// A config with one SNI listener and `routes`.
    fn sni_config(routes: &str) -> Result<crate::RouterConfig, crate::ConfigError> {
        crate::RouterConfig::parse(&format!(
            "always_allowed = [\"10.250.0.0/16\"]\n\
             [[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n{routes}"
        ))
    }

    fn name(s: &str) -> ServerName {
        ServerName::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn routes_by_exact_name_in_any_case_then_by_rules() {
        let c = sni_config(
            "[[sni_route]]\nserver_names = [\"API.a.example\", \"api.a.internal\"]\n\
             upstream = \"10.0.0.1:443\"\n\
             [[sni_route.rule]]\naction = \"deny\"\nfrom = [\"192.0.2.9\"]\n\
             [[sni_route.rule]]\naction = \"allow\"\nfrom = [\"192.0.2.0/24\"]\n\
             [[sni_route]]\nserver_names = [\"api.ab.example\"]\nupstream = \"x:443\"\n",
        )
        .unwrap();
        assert_eq!(c.listeners[0].kind, crate::ListenerKind::Sni);
        assert!(c.listeners[0].headers.is_empty());
        let p = &c.policy;
        let at = |s: &str| Client::direct(s.parse().unwrap());
        let ok = |n: &str, who| p.decide_sni(&name(n), who).map(|t| t.upstream.clone());
        assert_eq!(
            ok("api.a.example", at("192.0.2.1")),
            Ok("10.0.0.1:443".into())
        );
        assert_eq!(
            ok("Api.A.Internal", at("192.0.2.1")),
            Ok("10.0.0.1:443".into())
        );
        assert_eq!(
            ok("api.a.example", at("192.0.2.9")),
            Err(SniRefusal::Denied(Denial::Rule(0)))
        );
        assert_eq!(
            ok("api.a.example", at("198.51.100.1")),
            Err(SniRefusal::Denied(Denial::NoMatch))
        );
        // Always-allowed first.
        assert!(ok("api.a.example", at("10.250.1.1")).is_ok());
        // No rules: anyone; no prefix or suffix matching.
        assert!(ok("api.ab.example", at("198.51.100.1")).is_ok());
        for unknown in [
            "a.example",
            "pi.a.example",
            "x.api.a.example",
            "api.a.exampl",
        ] {
            assert_eq!(
                ok(unknown, at("192.0.2.1")),
                Err(SniRefusal::Unknown),
                "{unknown}"
            );
        }
    }
}
