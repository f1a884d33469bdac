//! What one push came to, after every check: the options accepted, those dropped with the
//! reason (whichever step dropped them), and the values the push guard changed. The steps
//! that produce it ([`super::filter`], [`super::guard`], [`super::strict`]) all write into
//! these types; none of them is needed to read it.

use std::net::IpAddr;

use ipnet::IpNet;

use super::options::{OptionClass, OptionError, OptionKind, PushedOption};
use super::strict::StrictRefusal;

/// The options of one push (one part, or all parts together), after every check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushOutcome {
    /// Options to apply, in the order they were pushed.
    pub accepted: Vec<PushedOption>,
    /// The text of each accepted option (after the leading whitespace), in the same order as
    /// `accepted`; empty for an outcome assembled without
    /// [`PullPolicy::process`](super::PullPolicy::process).
    pub accepted_texts: Vec<String>,
    /// Options not applied, in the order they were pushed, with the reason.
    pub dropped: Vec<DroppedOption>,
    /// Accepted options whose value the push guard changed (also in `accepted`, with the value
    /// in force).
    pub adjusted: Vec<AdjustedOption>,
}

impl PushOutcome {
    /// The options the push guard refused, with their text and reason.
    pub fn refused_by_guard(&self) -> impl Iterator<Item = (&str, &GuardRefusal)> {
        self.dropped.iter().filter_map(|d| match &d.reason {
            DropReason::Guard(refusal) => Some((d.text.as_str(), refusal)),
            _ => None,
        })
    }

    /// Appends `other` (the next part of the same push).
    pub fn extend(&mut self, other: PushOutcome) {
        self.accepted.extend(other.accepted);
        self.accepted_texts.extend(other.accepted_texts);
        self.dropped.extend(other.dropped);
        self.adjusted.extend(other.adjusted);
    }
}

/// A pushed option that was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedOption {
    /// The option text, after the leading whitespace.
    pub text: String,
    /// Why it was dropped.
    pub reason: DropReason,
}

/// Why a pushed option was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// An `ignore` pull-filter matched (index into
    /// [`PullPolicy::filters`](super::PullPolicy::filters)).
    IgnoredByFilter {
        /// Which filter.
        filter: usize,
    },
    /// The option name is not one we know.
    Unknown,
    /// A pull client does not accept options of this class (or `route-nopull` removed it).
    NotPermitted {
        /// The option's class.
        class: OptionClass,
    },
    /// A known option with bad arguments.
    Malformed(OptionError),
    /// The option text is [`OPTION_PARM_SIZE`](super::tokenize::OPTION_PARM_SIZE) bytes or
    /// longer.
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Refused by the push guard ([`super::guard`], every mode).
    Guard(GuardRefusal),
    /// Refused by strict mode.
    Strict(StrictRefusal),
}

/// Why the guard refused a pushed option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GuardRefusal {
    /// A route whose network has bits outside its prefix: installed, it would be the wider,
    /// masked route.
    #[error("{network} has bits outside its /{} prefix: the route would be wider than pushed", network.prefix_len())]
    Misaligned {
        /// The network as pushed, host bits included.
        network: IpNet,
    },
    /// A route so wide it amounts to a default route: IPv4 wider than a /8, IPv6 wider than a
    /// /16 outside `fc00::/7` ([`super::guard`]).
    #[error("{network} is wider than any network a tunnel carries: it amounts to a default route, and this client never redirects its gateway")]
    DefaultRoute {
        /// The route's destination.
        network: IpNet,
    },
    /// `ping 0` or `ping-restart 0`.
    #[error("{option} 0 would switch the client's keepalive off")]
    KeepaliveOff {
        /// [`OptionKind::Ping`] or [`OptionKind::PingRestart`].
        option: OptionKind,
    },
    /// A route (or an interface subnet) into the tunnel that contains an address the client
    /// dials.
    #[error("{network} contains {path}, on the path to the server: the tunnel would carry itself")]
    CapturesPath {
        /// The route's destination, or the interface's subnet.
        network: IpNet,
        /// The address of the server or the proxy it contains.
        path: IpAddr,
    },
}

/// A pushed value the guard changed before it took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdjustedOption {
    /// The option text, after the leading whitespace.
    pub text: String,
    /// Which option.
    pub option: OptionKind,
    /// The value pushed.
    pub pushed: u32,
    /// The value in force instead.
    pub applied: u32,
}
