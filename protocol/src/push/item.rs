//! [`PushItem`]: one option of the list a server pushes, typed or as the configuration wrote it.

use std::fmt;

use super::PushedOption;

/// One option of a server's push, in `PUSH_REPLY` order; its `Display` is the text sent.
///
/// What the server makes itself (what the `server` helper adds, keepalive, the client's
/// addresses, the protocol options) is a [`PushItem::Typed`] option, written by
/// [`PushedOption`]'s `Display`: the one place option text is made, the inverse of the
/// client's parser.
///
/// The `push "..."` lines of the configuration and of client-config-dir files are
/// [`PushItem::Verbatim`]: kept as written and sent as written, as upstream does. They are
/// not parsed into [`PushedOption`]s when the configuration is loaded, because:
///
/// * upstream takes them as free text: any option a client may pull, many of which we do not
///   model (`inactive`, `route-delay`, `explicit-exit-notify`, ...), spelled with host names,
///   `default` placeholders, quotes and spacing the client's tokenizer reads. Our typed model
///   is the client's, stricter than upstream (literal addresses only, digits-only numbers,
///   contiguous netmasks): parsing with it would refuse configurations upstream runs, and we
///   would need a verbatim variant for the rest anyway;
/// * a parsed line rendered again is not always the same bytes (`route 10.0.0.0` comes back as
///   `route 10.0.0.0 255.255.255.255`; quotes and spacing are normalised), so to send what
///   upstream sends the text would have to be kept beside the parsed option;
/// * the text is checked where it matters: by [`build_push_reply`](super::build_push_reply)
///   for what cannot be sent at all (a comma, a control character, too long), and by the client
///   that pulls it, as with upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushItem {
    /// An option the server builds.
    Typed(PushedOption),
    /// A `push "..."` line of the configuration, sent as written.
    Verbatim(String),
}

impl fmt::Display for PushItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushItem::Typed(option) => option.fmt(f),
            PushItem::Verbatim(text) => f.write_str(text),
        }
    }
}

impl From<PushedOption> for PushItem {
    fn from(option: PushedOption) -> PushItem {
        PushItem::Typed(option)
    }
}

/// Whether the item is pushed as exactly this text.
impl PartialEq<str> for PushItem {
    fn eq(&self, text: &str) -> bool {
        match self {
            PushItem::Typed(option) => option.to_string() == text,
            PushItem::Verbatim(line) => line == text,
        }
    }
}

/// Whether the item is pushed as exactly this text.
impl PartialEq<&str> for PushItem {
    fn eq(&self, text: &&str) -> bool {
        self == *text
    }
}
