//! One line for an error and its causes: what every binary prints before it exits and what
//! the drivers put into a log field.

use std::error::Error;
use std::fmt;

/// At most this many characters of a refused value or line are quoted in a log line or a
/// metrics label: enough to find it in its file, and a 4 MiB line cannot become 4 MiB of log.
pub const QUOTE_CHARS: usize = 80;

/// `text` to quote in a message: as `{:?}` prints it when it has at most [`QUOTE_CHARS`]
/// characters, else its first [`QUOTE_CHARS`] and `…` after the closing quote.
pub fn quote(text: &str) -> Quoted<'_> {
    Quoted(text)
}

/// A value quoted by at most [`QUOTE_CHARS`] characters ([`quote`]).
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTE_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}…", &self.0[..end]),
        }
    }
}

/// Each line of `text` cut to its first [`QUOTE_CHARS`] characters and `…`: for a message
/// that quotes lines of a file as they are (a parser's error with its source line).
pub fn cut_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4096));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match line.char_indices().nth(QUOTE_CHARS) {
            None => out.push_str(line),
            Some((end, _)) => {
                out.push_str(&line[..end]);
                out.push('…');
            }
        }
    }
    out
}

/// The error and its causes, `: `-separated on one line. A cause whose text the line already
/// holds (an error that prints its source itself) is left out, and line breaks become spaces.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::{chain, cut_lines, quote, QUOTE_CHARS};

    #[test]
    fn quotes_and_lines_are_cut_to_a_prefix() {
        assert_eq!(quote("a\"b").to_string(), "\"a\\\"b\"");
        let long = "é".repeat(QUOTE_CHARS + 1);
        let quoted = quote(&long).to_string();
        assert_eq!(quoted, format!("{:?}…", "é".repeat(QUOTE_CHARS)));
        let lines = cut_lines(&format!("short\n{long}\n"));
        assert_eq!(lines, format!("short\n{}…\n", "é".repeat(QUOTE_CHARS)));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open {path}")]
    struct Open {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("startup failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn causes_are_joined_once_on_one_line() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such\nfile");
        let e = Open {
            path: "/x",
            source: io(),
        };
        assert_eq!(chain(&e), "cannot open /x: no such file");
        // The cause is already in the message: not printed twice.
        assert_eq!(chain(&Repeats(io())), "startup failed: no such file");
    }
}
