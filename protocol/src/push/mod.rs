//! Push/pull: the server's `PUSH_REPLY` and what a client does with it (reference 10.3, 10.4,
//! 11, 9.4, 12.1).
//!
//! ```text
//! PUSH_REPLY,route-gateway 192.168.123.1,topology subnet,ping 10,...,push-continuation 2
//! '--------' '--------------------------' '-------------' '-----'     '-----------------'
//!  command    option (may contain spaces, never a comma)               more parts follow
//! ```
//!
//! Server side: the server lists what it pushes as [`PushItem`]s (typed [`PushedOption`]s,
//! whose `Display` writes the option text, and the configuration's `push` lines as written);
//! [`build_push_reply`] renders an ordered list of options into one or more
//! `PUSH_REPLY` messages with upstream's continuation rules: a message is at most
//! [`PUSH_BUNDLE_SIZE`] bytes; a new one is started when adding the next option would reach
//! [`PUSH_REPLY_SAFE_CAP`] bytes; all but the last end with `,push-continuation 2`, and when
//! more than one message was needed the last ends with `,push-continuation 1`.
//!
//! Client side: [`PushCollector`] takes the options text of each `PUSH_REPLY` part (from
//! [`crate::control_msg::ControlMessage::PushReply`]) and runs it through a [`PullPolicy`]:
//! upstream's `pull-filter` and permission mask, then the typed model ([`PushedOption`]), then
//! our push guard ([`guard`]: in every mode, no route wider than pushed, none that amounts to a
//! default route, none over the path to the server, keepalive never switched off), then optionally our strict mode
//! ([`StrictPolicy`]); see [`filter`] for the exact order. Nothing
//! takes effect until the last part arrived: the collector hands out one [`PushOutcome`], the
//! accepted typed options plus what was dropped and why ([`outcome`], the types every step
//! writes into), or a [`PushError`] when a `reject` filter matched anywhere.
//!
//! Differences to upstream, all deliberate (for `conformance/DEVIATIONS.md`):
//!
//! * strict mode ([`strict`]) is ours: an allow-list of option kinds and of route networks,
//!   decided on the tokenised, typed option so whitespace, quoting or case in the pushed text
//!   cannot bypass it (upstream's prefix filters can be bypassed that way);
//! * options are parsed more strictly (literal addresses only, digits-only numbers, contiguous
//!   netmasks, at most 16 tokens) and a malformed or unknown option is dropped and reported,
//!   never half-applied;
//! * an option of 256 bytes or more is dropped whole instead of being cut into pieces;
//! * a push may have at most [`MAX_PUSH_REPLY_PARTS`] parts;
//! * the push guard ([`guard`]) refuses misaligned routes, routes that amount to a default
//!   route (IPv4 wider than a /8, IPv6 wider than a /16 outside `fc00::/7`), routes over the
//!   path to the server,
//!   `ping 0` / `ping-restart 0`, and raises a `ping-restart` below 2 s or below twice the
//!   pushed `ping`.

pub mod filter;
pub mod guard;
pub mod item;
pub mod options;
pub mod outcome;
pub mod strict;
pub mod tokenize;

pub use self::filter::{FilterAction, PartOutcome, PullFilter, PullPolicy, PushError};
pub use self::guard::{PathGuard, PING_RESTART_FLOOR};
pub use self::item::PushItem;
pub use self::options::{OptionClass, OptionError, OptionKind, PushedOption};
pub use self::outcome::{AdjustedOption, DropReason, DroppedOption, GuardRefusal, PushOutcome};
pub use self::strict::{StrictPolicy, StrictRefusal};

use crate::control_msg::PUSH_REPLY;

/// `PUSH_BUNDLE_SIZE`: the largest `PUSH_REPLY` message upstream builds.
pub const PUSH_BUNDLE_SIZE: usize = 1024;

/// Room upstream keeps free at the end of a message for `push-continuation` and a trailing
/// per-client option (the `extra` of `send_push_reply`).
pub const PUSH_REPLY_EXTRA: usize = 84;

/// A new `PUSH_REPLY` message is started when the current length plus the next option's
/// length would reach this: `PUSH_BUNDLE_SIZE - 84` = 940.
pub const PUSH_REPLY_SAFE_CAP: usize = PUSH_BUNDLE_SIZE - PUSH_REPLY_EXTRA;

/// The option appended to every message but the last.
pub const PUSH_CONTINUATION_MORE: &str = "push-continuation 2";

/// The option appended to the last message when there are several.
pub const PUSH_CONTINUATION_LAST: &str = "push-continuation 1";

/// The most `PUSH_REPLY` parts a [`PushCollector`] accepts for one push (ours; upstream has
/// no limit).
pub const MAX_PUSH_REPLY_PARTS: usize = 64;

/// An option list the server cannot push.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushBuildError {
    /// Options are separated by commas, so an option cannot contain one.
    #[error("push option #{index} contains a comma: {option:?}")]
    OptionContainsComma {
        /// Position in the list.
        index: usize,
        /// The option.
        option: String,
    },
    /// An option with a control character (the client would drop the whole message).
    #[error("push option #{index} contains control character 0x{byte:02x}")]
    InvalidCharacter {
        /// Position in the list.
        index: usize,
        /// The byte.
        byte: u8,
    },
    /// An option too long to fit a message ("--push option is too long").
    #[error("push option #{index} is too long ({len} bytes)")]
    OptionTooLong {
        /// Position in the list.
        index: usize,
        /// Its length.
        len: usize,
    },
}

/// Builds the `PUSH_REPLY` message texts (without NUL) for `options`, in order, each option
/// written by its `Display` ([`PushItem`], or plain text). An empty list gives a bare
/// `PUSH_REPLY`. Each message is sent as its own control message.
pub fn build_push_reply<S: std::fmt::Display>(
    options: &[S],
) -> Result<Vec<String>, PushBuildError> {
    let options: Vec<String> = options.iter().map(ToString::to_string).collect();
    for (index, option) in options.iter().enumerate() {
        if option.contains(',') {
            return Err(PushBuildError::OptionContainsComma {
                index,
                option: option.to_owned(),
            });
        }
        if let Some(&byte) = option.as_bytes().iter().find(|&&b| b < 0x20 || b == 0x7f) {
            return Err(PushBuildError::InvalidCharacter { index, byte });
        }
        if PUSH_REPLY.len() + option.len() >= PUSH_REPLY_SAFE_CAP {
            return Err(PushBuildError::OptionTooLong {
                index,
                len: option.len(),
            });
        }
    }

    let mut messages = Vec::new();
    let mut current = String::with_capacity(PUSH_BUNDLE_SIZE);
    current.push_str(PUSH_REPLY);
    for option in &options {
        if current.len() + option.len() >= PUSH_REPLY_SAFE_CAP {
            current.push(',');
            current.push_str(PUSH_CONTINUATION_MORE);
            messages.push(std::mem::replace(&mut current, PUSH_REPLY.to_owned()));
        }
        current.push(',');
        current.push_str(option);
    }
    if !messages.is_empty() {
        current.push(',');
        current.push_str(PUSH_CONTINUATION_LAST);
    }
    messages.push(current);
    Ok(messages)
}

/// Splits the options text of a `PUSH_REPLY` at commas, as upstream's `buf_parse` loop does:
/// empty pieces in the middle are kept (a filter may still match them), a final empty piece
/// (trailing comma, or empty text) is not.
pub fn split_options(options: &str) -> impl Iterator<Item = &str> {
    let mut pieces = options.split(',').peekable();
    std::iter::from_fn(move || {
        let piece = pieces.next()?;
        if piece.is_empty() && pieces.peek().is_none() {
            return None;
        }
        Some(piece)
    })
}

/// Collects the parts of one push on the client and releases the options only when the last
/// part arrived.
///
/// Feed it the options text of each `PUSH_REPLY` in order ([`PushCollector::push_part`]). A
/// part ends the push when its last surviving `push-continuation` is not 2 (upstream: absent,
/// or 1). After a completed push, or an error, the collector is empty and ready for the next.
#[derive(Debug, Clone, Default)]
pub struct PushCollector {
    pending: PushOutcome,
    parts: usize,
}

impl PushCollector {
    /// An empty collector.
    pub fn new() -> PushCollector {
        PushCollector::default()
    }

    /// Whether parts of an unfinished push are held.
    pub fn in_progress(&self) -> bool {
        self.parts > 0
    }

    /// Processes one part. `Ok(None)`: more parts are expected. `Ok(Some(outcome))`: the push
    /// is complete; apply `outcome.accepted`. `Err`: refuse the whole push (nothing of it may
    /// be applied) and restart the session.
    pub fn push_part(
        &mut self,
        policy: &PullPolicy,
        options: &str,
    ) -> Result<Option<PushOutcome>, PushError> {
        self.parts += 1;
        if self.parts > MAX_PUSH_REPLY_PARTS {
            *self = PushCollector::default();
            return Err(PushError::TooManyParts {
                max: MAX_PUSH_REPLY_PARTS,
            });
        }
        let part = match policy.process(options) {
            Ok(part) => part,
            Err(e) => {
                *self = PushCollector::default();
                return Err(e);
            }
        };
        self.pending.extend(part.outcome);
        if part.continuation == 2 {
            return Ok(None);
        }
        self.parts = 0;
        let mut outcome = std::mem::take(&mut self.pending);
        guard::finish(&mut outcome);
        Ok(Some(outcome))
    }
}
