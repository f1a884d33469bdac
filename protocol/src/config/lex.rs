//! Splitting config text into directives: one per line, comments and blank lines dropped,
//! inline `<tag>` ... `</tag>` blocks gathered into the directive they stand for.
//!
//! ```text
//! # comment            ; comment           (dropped; also after a directive, see the tokeniser)
//! --proto tcp-server                       (a leading `--` is allowed, command-line style)
//! push "route 10.0.0.0 255.0.0.0"          (quoting: push::tokenize, upstream's parse_line)
//! <ca>                                     (opens an inline block; nothing else on the line)
//! -----BEGIN CERTIFICATE-----              (content lines, kept byte for byte, each with its
//! ...                                       line end)
//! </ca>                                    (closes it: the first line that is `</ca>` after
//!                                           trimming whitespace)
//! ```
//!
//! Line numbers start at 1; an inline block's directive carries the line of its `<tag>`.

use super::{ConfigError, ErrorReason};
use crate::push::tokenize::tokenize;

/// The inline blocks we accept, by tag: the directives that read a file.
pub const INLINE_TAGS: [&str; 5] = ["ca", "cert", "key", "tls-auth", "tls-crypt"];

/// One directive of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// 1-based line of the directive (of the `<tag>` line for an inline block).
    pub line: usize,
    /// The directive name, without a leading `--`.
    pub name: String,
    /// The arguments after the name (quotes removed). Empty for an inline block.
    pub args: Vec<String>,
    /// The content of an inline `<name>` block, exactly as written between the tag lines.
    pub inline: Option<String>,
}

/// Splits `text` into directives. `file` is only used to name the file in errors.
pub fn lex(file: &str, text: &str) -> Result<Vec<Directive>, ConfigError> {
    let mut out = Vec::new();
    // `split('\n')` keeps a `\r` at the end of CRLF lines; the tokeniser treats it as space and
    // inline content keeps it, so a CRLF block reads back as written.
    let mut lines = text.split('\n').enumerate().map(|(i, l)| (i + 1, l));
    while let Some((line, raw)) = lines.next() {
        let err = |directive: Option<String>, reason| ConfigError {
            file: file.to_owned(),
            line: Some(line),
            directive,
            reason,
        };
        let tokens = match tokenize(raw) {
            Ok(t) => t,
            Err(e) => return Err(err(first_word(raw), ErrorReason::Tokenize(e))),
        };
        let Some(first) = tokens.first() else {
            continue;
        };
        if let Some(tag) = first.strip_prefix("</").and_then(|t| t.strip_suffix('>')) {
            let tag = tag.to_owned();
            return Err(err(
                Some(tag.clone()),
                ErrorReason::UnexpectedInlineEnd { tag },
            ));
        }
        if let Some(tag) = first.strip_prefix('<').and_then(|t| t.strip_suffix('>')) {
            if !INLINE_TAGS.contains(&tag) {
                let tag = tag.to_owned();
                return Err(err(
                    Some(tag.clone()),
                    ErrorReason::UnknownInlineTag { tag },
                ));
            }
            if tokens.len() > 1 {
                let tag = tag.to_owned();
                return Err(err(
                    Some(tag.clone()),
                    ErrorReason::InlineTrailingText { tag },
                ));
            }
            let close = format!("</{tag}>");
            let mut content = String::new();
            let mut closed = false;
            for (_, body) in lines.by_ref() {
                if body.trim_matches(|c: char| c.is_ascii_whitespace()) == close {
                    closed = true;
                    break;
                }
                content.push_str(body);
                content.push('\n');
            }
            if !closed {
                let tag = tag.to_owned();
                return Err(err(
                    Some(tag.clone()),
                    ErrorReason::UnterminatedInline { tag },
                ));
            }
            out.push(Directive {
                line,
                name: tag.to_owned(),
                args: Vec::new(),
                inline: Some(content),
            });
            continue;
        }
        let mut tokens = tokens.into_iter();
        let Some(mut name) = tokens.next() else {
            continue;
        };
        // Upstream strips `--` from a config-file directive of three or more characters.
        if name.len() >= 3 && name.starts_with("--") {
            name.drain(..2);
        }
        out.push(Directive {
            line,
            name,
            args: tokens.collect(),
            inline: None,
        });
    }
    Ok(out)
}

/// The first whitespace-separated word of a line that did not tokenise, to name it in the
/// error (best effort: it may still carry quotes).
fn first_word(raw: &str) -> Option<String> {
    let word = raw.split_ascii_whitespace().next()?;
    let word = word.strip_prefix("--").unwrap_or(word);
    Some(word.chars().take(64).collect())
}
