//! What a pull client does with the options of one `PUSH_REPLY` part, in upstream's order
//! (reference 11), before anything takes effect:
//!
//! 1. split at commas ([`super::split_options`]), skip leading whitespace;
//! 2. `pull-filter`s, in config order: the first whose TEXT is a byte prefix of the option
//!    text decides: `accept` keeps it (later filters are not consulted), `ignore` drops it,
//!    `reject` aborts the whole push ([`PushError::Rejected`]); no match keeps it. The match is
//!    on the raw text (quotes in the pushed text are not interpreted), case-sensitive;
//! 3. tokenise like a config line; empty and comment-only pieces vanish;
//! 4. the permission mask: options of a class a pull client never accepts, and with
//!    `route-nopull` also the route and DHCP/DNS classes, are dropped;
//! 5. argument checks into a typed [`PushedOption`]; malformed ones are dropped with their
//!    [`OptionError`], unknown names are dropped and reported with their text;
//! 6. the push guard ([`super::guard::check`]): misaligned routes and keepalive switched off
//!    are refused, a `ping-restart` below the floor is raised, in every mode (the
//!    [`super::PushCollector`] then applies [`super::guard::finish`] to the complete push:
//!    `ping-restart` at least twice the pushed `ping`);
//! 7. our strict mode, if configured ([`StrictPolicy`]).
//!
//! The guard's last rule, no route over the path to the server, needs the addresses the
//! client dialed and is applied by the client's driver to the complete push
//! ([`super::guard::PathGuard`]).
//!
//! Where upstream only logs (ignored, unknown, not permitted, malformed), we drop the option
//! and say why in [`PushOutcome::dropped`].
//!
//! One difference: upstream reads each option into a 256-byte buffer (`OPTION_PARM_SIZE`) and
//! silently cuts a longer one into pieces that are then read as separate options. We drop an
//! option of 256 bytes or more as a whole ([`DropReason::TooLong`]), after the pull-filters
//! (which see the same prefix either way).

use super::guard::{self, Verdict};
use super::options::{KnownName, OptionError, PushedOption};
use super::outcome::{AdjustedOption, DropReason, DroppedOption, PushOutcome};
use super::strict::StrictPolicy;
use super::tokenize::{self, OPTION_PARM_SIZE};

/// What a `pull-filter` does when its text matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterAction {
    /// `accept`: keep the option.
    Accept,
    /// `ignore`: drop the option.
    Ignore,
    /// `reject`: abort the push and restart the session.
    Reject,
}

/// One `pull-filter accept|ignore|reject TEXT` directive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PullFilter {
    /// What to do on a match.
    pub action: FilterAction,
    /// The prefix to compare, as one config token (quotes already removed).
    pub text: String,
}

impl PullFilter {
    /// A filter.
    pub fn new(action: FilterAction, text: impl Into<String>) -> PullFilter {
        PullFilter {
            action,
            text: text.into(),
        }
    }

    /// Whether this filter's text is a byte prefix of `option` (upstream's `strncmp` over
    /// the filter's length).
    pub fn matches(&self, option: &str) -> bool {
        option.as_bytes().starts_with(self.text.as_bytes())
    }
}

/// The first filter matching `option` (already without leading whitespace): its index and
/// action. `None` keeps the option.
pub fn match_filters(filters: &[PullFilter], option: &str) -> Option<(usize, FilterAction)> {
    filters
        .iter()
        .enumerate()
        .find(|(_, f)| f.matches(option))
        .map(|(i, f)| (i, f.action))
}

/// Everything that decides which pushed options a client applies.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PullPolicy {
    /// `pull-filter` directives, in config order.
    pub filters: Vec<PullFilter>,
    /// `route-nopull`: refuse routes and DHCP/DNS options.
    pub route_nopull: bool,
    /// Our strict mode, applied last.
    pub strict: Option<StrictPolicy>,
}

/// The push as a whole must be refused; nothing of it may take effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// A `reject` pull-filter matched ("Offending option received from server"): the session
    /// restarts.
    #[error("pushed option {option:?} rejected by pull-filter #{filter}")]
    Rejected {
        /// The option text, after the leading whitespace.
        option: String,
        /// Which filter (index into [`PullPolicy::filters`]).
        filter: usize,
    },
    /// The server sent more continuation parts than we accept.
    #[error("more than {max} PUSH_REPLY parts")]
    TooManyParts {
        /// [`super::MAX_PUSH_REPLY_PARTS`].
        max: usize,
    },
}

/// The result of one `PUSH_REPLY` part.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartOutcome {
    /// Its options.
    pub outcome: PushOutcome,
    /// The value of the last `push-continuation` option that survived the filters (0 when
    /// there was none): 2 means more parts follow.
    pub continuation: u8,
}

impl PullPolicy {
    /// Processes the options text of one `PUSH_REPLY` part (what follows `PUSH_REPLY,`).
    pub fn process(&self, options: &str) -> Result<PartOutcome, PushError> {
        let mut part = PartOutcome::default();
        for raw in super::split_options(options) {
            let line = tokenize::skip_leading_space(raw);
            let drop = |reason| DroppedOption {
                text: line.to_owned(),
                reason,
            };
            match match_filters(&self.filters, line) {
                Some((filter, FilterAction::Reject)) => {
                    return Err(PushError::Rejected {
                        option: line.to_owned(),
                        filter,
                    })
                }
                Some((filter, FilterAction::Ignore)) => {
                    part.outcome
                        .dropped
                        .push(drop(DropReason::IgnoredByFilter { filter }));
                    continue;
                }
                Some((_, FilterAction::Accept)) | None => {}
            }
            if line.len() >= OPTION_PARM_SIZE {
                part.outcome
                    .dropped
                    .push(drop(DropReason::TooLong { len: line.len() }));
                continue;
            }
            match self.decide(line) {
                Decision::Nothing => {}
                Decision::Continuation(n) => part.continuation = n,
                Decision::Accept(opt) => {
                    part.outcome.accepted.push(opt);
                    part.outcome.accepted_texts.push(line.to_owned());
                }
                Decision::Adjust(opt, (pushed, applied)) => {
                    part.outcome.adjusted.push(AdjustedOption {
                        text: line.to_owned(),
                        option: opt.kind(),
                        pushed,
                        applied,
                    });
                    part.outcome.accepted.push(opt);
                    part.outcome.accepted_texts.push(line.to_owned());
                }
                Decision::Drop(reason) => part.outcome.dropped.push(drop(reason)),
            }
        }
        Ok(part)
    }

    /// Steps 3 to 7 for one option line that passed the pull-filters.
    fn decide(&self, line: &str) -> Decision {
        let tokens = match tokenize::tokenize(line) {
            Ok(t) => t,
            Err(source) => {
                return Decision::Drop(DropReason::Malformed(OptionError::Tokenize {
                    text: line.to_owned(),
                    source,
                }))
            }
        };
        let Some(name) = tokens.first() else {
            return Decision::Nothing;
        };
        let Some(known) = KnownName::lookup(name) else {
            return Decision::Drop(DropReason::Unknown);
        };
        let class = known.class();
        if !class.pullable(self.route_nopull) {
            return Decision::Drop(DropReason::NotPermitted { class });
        }
        let KnownName::Kind(kind) = known else {
            // Never-pulled names are never pullable; handled above.
            return Decision::Drop(DropReason::NotPermitted { class });
        };
        let opt = match PushedOption::from_tokens(kind, &tokens, line) {
            Ok(opt) => opt,
            Err(e) => return Decision::Drop(DropReason::Malformed(e)),
        };
        if let PushedOption::PushContinuation(n) = opt {
            return Decision::Continuation(n);
        }
        let (opt, pushed) = match guard::check(opt) {
            Verdict::Keep(opt) => (opt, None),
            Verdict::Adjust {
                option,
                pushed,
                applied,
            } => (option, Some((pushed, applied))),
            Verdict::Refuse(refusal) => return Decision::Drop(DropReason::Guard(refusal)),
        };
        if let Some(strict) = &self.strict {
            if let Err(refusal) = strict.check(&opt) {
                return Decision::Drop(DropReason::Strict(refusal));
            }
        }
        match pushed {
            Some(pushed) => Decision::Adjust(opt, pushed),
            None => Decision::Accept(opt),
        }
    }
}

enum Decision {
    Nothing,
    Continuation(u8),
    Accept(PushedOption),
    /// Accepted with a value the guard changed: the values pushed and in force.
    Adjust(PushedOption, (u32, u32)),
    Drop(DropReason),
}
