//! Splitting one option line into tokens the way OpenVPN reads a config-file line
//! (`parse_line` in upstream's `options.c`).
//!
//! * Tokens are separated by whitespace (C `isspace`: space, `\t`, `\n`, `\v`, `\f`, `\r`).
//! * `"..."` is one token that may contain whitespace; inside it a backslash escapes the next
//!   character. The token ends at the closing quote, even if a non-space character follows
//!   (`"a"b` is two tokens, `a` and `b`); `""` is an empty token.
//! * `'...'` is one token taken literally (no escapes).
//! * Outside single quotes a backslash escapes the next character, which must be `\`, `"` or
//!   whitespace; any other escaped character makes the whole line invalid. At the start of a
//!   token, backslash + whitespace produces nothing and `\"` starts an unquoted token with a
//!   literal `"`.
//! * A `#` or `;` where a token would start begins a comment: the rest of the line is ignored.
//! * An unterminated quote, a trailing lone backslash, a token longer than [`OPTION_PARM_SIZE`]
//!   bytes are errors.
//!
//! Upstream silently ignores tokens past the 16th ([`MAX_PARMS`]); we refuse such lines
//! ([`TokenizeError::TooManyTokens`]) so nothing pushed is half-read.

/// `OPTION_PARM_SIZE`: upstream's buffer for one token and for one pushed option (with NUL).
pub const OPTION_PARM_SIZE: usize = 256;

/// `MAX_PARMS`: the most tokens upstream reads from one line.
pub const MAX_PARMS: usize = 16;

/// Why a line could not be tokenised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    /// A backslash escaped something other than `\`, `"` or whitespace.
    #[error("bad backslash usage: escaped {escaped:?}")]
    BadBackslash {
        /// The escaped character.
        escaped: char,
    },
    /// The line ended inside `"..."`.
    #[error("no closing double quote")]
    UnclosedDoubleQuote,
    /// The line ended inside `'...'`.
    #[error("no closing single quote")]
    UnclosedSingleQuote,
    /// The line ended with a lone backslash.
    #[error("line ends with a backslash")]
    TrailingBackslash,
    /// One token was longer than [`OPTION_PARM_SIZE`] bytes.
    #[error("parameter too long ({OPTION_PARM_SIZE} bytes max)")]
    TokenTooLong,
    /// More than [`MAX_PARMS`] tokens.
    #[error("more than {MAX_PARMS} parameters")]
    TooManyTokens,
}

/// C `isspace` in the "C" locale.
pub const fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The text after the leading whitespace upstream skips before pull-filter matching.
pub fn skip_leading_space(text: &str) -> &str {
    let n = text.bytes().take_while(|&b| is_c_space(b)).count();
    // Only ASCII bytes were skipped, so `n` is a char boundary.
    text.get(n..).unwrap_or("")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Initial,
    Unquoted,
    DoubleQuoted,
    SingleQuoted,
}

/// Splits `line` into tokens. An empty or comment-only line gives no tokens.
pub fn tokenize(line: &str) -> Result<Vec<String>, TokenizeError> {
    let mut tokens = Vec::new();
    let mut token: Vec<u8> = Vec::new();
    let mut state = State::Initial;
    let mut backslash = false;

    // A NUL sentinel ends the line, as in upstream's C string walk.
    for b in line.bytes().chain(std::iter::once(0u8)) {
        let space = b == 0 || is_c_space(b);
        if !backslash && b == b'\\' && state != State::SingleQuoted {
            backslash = true;
            continue;
        }
        let mut out: Option<u8> = None;
        let mut done = false;
        match state {
            State::Initial => {
                if !space {
                    if b == b'#' || b == b';' {
                        break;
                    }
                    if !backslash && b == b'"' {
                        state = State::DoubleQuoted;
                    } else if !backslash && b == b'\'' {
                        state = State::SingleQuoted;
                    } else {
                        out = Some(b);
                        state = State::Unquoted;
                    }
                }
            }
            State::Unquoted => {
                if !backslash && space {
                    done = true;
                } else {
                    out = Some(b);
                }
            }
            State::DoubleQuoted => {
                if !backslash && b == b'"' {
                    done = true;
                } else {
                    out = Some(b);
                }
            }
            State::SingleQuoted => {
                if b == b'\'' {
                    done = true;
                } else {
                    out = Some(b);
                }
            }
        }
        if done {
            tokens.push(String::from_utf8_lossy(&token).into_owned());
            token.clear();
            state = State::Initial;
            if tokens.len() > MAX_PARMS {
                return Err(TokenizeError::TooManyTokens);
            }
        }
        // The NUL sentinel is never stored (upstream's `out` of 0 means "nothing").
        let out = out.filter(|&o| o != 0);
        if let Some(o) = out {
            if backslash && !(o == b'\\' || o == b'"' || is_c_space(o)) {
                return Err(TokenizeError::BadBackslash {
                    escaped: char::from(o),
                });
            }
            if token.len() >= OPTION_PARM_SIZE {
                return Err(TokenizeError::TokenTooLong);
            }
            token.push(o);
        }
        backslash = false;
    }

    match state {
        State::Initial if tokens.len() > MAX_PARMS => Err(TokenizeError::TooManyTokens),
        State::Initial => Ok(tokens),
        State::DoubleQuoted => Err(TokenizeError::UnclosedDoubleQuote),
        State::SingleQuoted => Err(TokenizeError::UnclosedSingleQuote),
        State::Unquoted => Err(TokenizeError::TrailingBackslash),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(line: &str) -> Vec<String> {
        tokenize(line).unwrap()
    }

    #[test]
    fn plain_and_whitespace() {
        assert_eq!(
            t("route 10.0.0.0 255.0.0.0"),
            ["route", "10.0.0.0", "255.0.0.0"]
        );
        assert_eq!(t("  \t route\t\t10.0.0.0 \x0b"), ["route", "10.0.0.0"]);
        assert!(t("").is_empty());
        assert!(t("   ").is_empty());
    }

    #[test]
    fn quotes() {
        assert_eq!(t(r#""route" '10.0.0.0'"#), ["route", "10.0.0.0"]);
        assert_eq!(t(r#"echo "a b" 'c d'"#), ["echo", "a b", "c d"]);
        assert_eq!(t(r#""a"b"#), ["a", "b"]);
        assert_eq!(t(r#""""#), [""]);
        assert_eq!(t(r#"x "a \"q\" \\ \ z""#), ["x", r#"a "q" \  z"#]);
        assert_eq!(t(r#"'a\b'"#), [r"a\b"]);
        assert_eq!(t(r#"'a"b'"#), [r#"a"b"#]);
    }

    #[test]
    fn backslashes() {
        assert_eq!(t(r"a\ b"), ["a b"]);
        assert_eq!(t(r#"\"x"#), [r#""x"#]);
        assert_eq!(t(r"\ x"), ["x"]);
        assert_eq!(
            tokenize(r"a\b"),
            Err(TokenizeError::BadBackslash { escaped: 'b' })
        );
        assert_eq!(tokenize(r"abc\"), Err(TokenizeError::TrailingBackslash));
    }

    #[test]
    fn comments() {
        assert!(t("# route 10.0.0.0").is_empty());
        assert!(t("  ;x").is_empty());
        assert_eq!(t("route 10.0.0.0 #x y"), ["route", "10.0.0.0"]);
        assert_eq!(t("a#b"), ["a#b"]);
    }

    #[test]
    fn errors() {
        assert_eq!(tokenize(r#"a "b"#), Err(TokenizeError::UnclosedDoubleQuote));
        assert_eq!(tokenize("a 'b"), Err(TokenizeError::UnclosedSingleQuote));
        assert_eq!(
            tokenize(&"x".repeat(OPTION_PARM_SIZE + 1)),
            Err(TokenizeError::TokenTooLong)
        );
        assert_eq!(t(&"x".repeat(OPTION_PARM_SIZE)).len(), 1);
        let many = vec!["a"; MAX_PARMS].join(" ");
        assert_eq!(t(&many).len(), MAX_PARMS);
        assert_eq!(
            tokenize(&format!("{many} b")),
            Err(TokenizeError::TooManyTokens)
        );
    }

    #[test]
    fn leading_space_skip() {
        assert_eq!(skip_leading_space(" \t\r\n\x0b\x0croute"), "route");
        assert_eq!(skip_leading_space("route "), "route ");
    }
}
