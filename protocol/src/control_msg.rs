//! Text control messages carried inside TLS once key-method 2 is done (reference 10.1, 6.5).
//!
//! ```text
//! TLS plaintext, one record per message:
//! +------------------------------------------+------+
//! | ASCII text, e.g. "PUSH_REPLY,ping 10,..." | 0x00 |
//! +------------------------------------------+------+
//!   printable bytes only (>= 0x20, not 0x7f)   terminator
//! ```
//!
//! | text | meaning | direction |
//! |---|---|---|
//! | `PUSH_REQUEST` | ask for the configuration | C->S |
//! | `PUSH_REPLY[,opt,opt,...]` | configuration ([`crate::push`]) | S->C |
//! | `AUTH_FAILED[,reason]` | authentication failed (`TEMP[...]:`, `SESSION:` reasons) | S->C |
//! | `AUTH_PENDING[,timeout N]` | deferred authentication in progress | S->C |
//! | `INFO,text` / `INFO_PRE,text` | informational / pending-auth text | S->C |
//! | `CR_RESPONSE,base64` | challenge/response answer | C->S |
//! | `RESTART[,[flags]msg]` | reconnect; flags `P` keep password, `N` next remote | S->C |
//! | `HALT[,msg]` | stop, do not reconnect | S->C |
//! | `EXIT` | the peer is going away | both |
//!
//! Receivers dispatch by **prefix**, in upstream's order (`AUTH_FAILED`, `PUSH_`, `RESTART`,
//! `HALT`, `INFO_PRE`, `INFO`, `CR_RESPONSE`, `AUTH_PENDING`, `EXIT`): `EXITED` is an
//! [`ControlMessage::Exit`], `PUSH_REQUESTED` a [`ControlMessage::PushRequest`]. Anything else
//! is [`ControlMessage::Unknown`], kept as text (upstream logs and ignores it).
//!
//! Receiving ([`split_messages`]): upstream treats what one TLS read returns as a unit and
//! splits it at NUL bytes. A trailing piece without its NUL is **discarded**, trailing `\r`/`\n`
//! are stripped, and a message with any other control character (below 0x20, or 0x7f) is dropped
//! with a warning. Each problem comes out as a droppable [`ControlMsgError`] so the caller can
//! count or log it. Upstream also accepts bytes >= 0x80 (UTF-8); we do too, but a message that is
//! not valid UTF-8 is dropped ([`ControlMsgError::NotUtf8`]): ours, stricter.
//!
//! Sending ([`ControlMessage::encode`]): the text plus its NUL, which the caller writes as one
//! TLS record (never coalesced with another message), at most [`TLS_CHANNEL_BUF_SIZE`] bytes.

use std::fmt;

/// `TLS_CHANNEL_BUF_SIZE`: upstream reads TLS plaintext in chunks of this size, so one control
/// message including its NUL must not be longer.
pub use crate::reliable::TLS_CHANNEL_BUF_SIZE;

/// The message asking the server for its configuration.
pub const PUSH_REQUEST: &str = "PUSH_REQUEST";
/// The prefix of every configuration message.
pub const PUSH_REPLY: &str = "PUSH_REPLY";

/// A problem with a control message, received or to be sent. All are droppable: the message
/// is ignored, the session goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlMsgError {
    /// Bytes at the end of a read without a terminating NUL (upstream discards them).
    #[error("discarded {len} trailing control-channel bytes without NUL terminator")]
    Unterminated {
        /// How many bytes were discarded.
        len: usize,
    },
    /// A received message held a control character (other than trailing CR/LF).
    #[error("control message with invalid character 0x{byte:02x} at offset {offset} dropped")]
    InvalidCharacter {
        /// The offending byte.
        byte: u8,
        /// Its offset in the message.
        offset: usize,
        /// The whole message (without NUL), for the log.
        message: Vec<u8>,
    },
    /// A received message was not valid UTF-8 (upstream would accept it; we drop it).
    #[error("control message that is not UTF-8 dropped")]
    NotUtf8 {
        /// The whole message (without NUL), for the log.
        message: Vec<u8>,
    },
    /// A message to be sent holds a NUL or a control character.
    #[error("control message to send has invalid character 0x{byte:02x} at offset {offset}")]
    InvalidToSend {
        /// The offending byte.
        byte: u8,
        /// Its offset in the text.
        offset: usize,
    },
    /// A message to be sent is longer than upstream's read buffer.
    #[error("control message of {len} bytes (with NUL) exceeds {max}")]
    TooLong {
        /// Length including the NUL.
        len: usize,
        /// [`TLS_CHANNEL_BUF_SIZE`].
        max: usize,
    },
}

impl ControlMsgError {
    /// The dropped message's text with control characters (and quotes and backslashes)
    /// escaped, for a log line; `None` for the errors of sending or of unterminated bytes.
    pub fn escaped_message(&self) -> Option<String> {
        match self {
            ControlMsgError::InvalidCharacter { message, .. }
            | ControlMsgError::NotUtf8 { message } => {
                Some(String::from_utf8_lossy(message).escape_debug().to_string())
            }
            ControlMsgError::Unterminated { .. }
            | ControlMsgError::InvalidToSend { .. }
            | ControlMsgError::TooLong { .. } => None,
        }
    }
}

/// One text control message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ControlMessage {
    /// `PUSH_REQUEST`.
    PushRequest,
    /// `PUSH_REPLY` or `PUSH_REPLY,<options>`: `options` is the text after the first comma
    /// (empty for a bare `PUSH_REPLY`), parsed by [`crate::push`].
    PushReply {
        /// The comma-separated options.
        options: String,
    },
    /// `AUTH_FAILED[,reason]`.
    AuthFailed {
        /// The text after the comma, if any (e.g. `TEMP[backoff 5]:msg`, `SESSION:expired`).
        reason: Option<String>,
    },
    /// `AUTH_PENDING[,keyword,...]`.
    AuthPending {
        /// The value of a `timeout N` keyword, if present and numeric.
        timeout: Option<u32>,
    },
    /// `INFO[,text]`.
    Info(String),
    /// `INFO_PRE[,text]`.
    InfoPre(String),
    /// `CR_RESPONSE,base64`.
    CrResponse(String),
    /// `RESTART[,[flags]msg]`.
    Restart(ServerSignal),
    /// `HALT[,[flags]msg]`.
    Halt(ServerSignal),
    /// `EXIT`.
    Exit,
    /// Any other message, including `PUSH_` messages other than request and reply, and
    /// `PUSH_REPLY` followed by something other than a comma.
    Unknown(String),
}

/// The payload of `RESTART` and `HALT`: optional `[flags]` in front of a free-text message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ServerSignal {
    /// Flag `P`: keep the cached password.
    pub keep_password: bool,
    /// Flag `N`: advance to the next remote.
    pub next_remote: bool,
    /// The message text after the flags (empty if none).
    pub message: String,
}

/// What an `AUTH_FAILED` reason says, by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthFailedKind {
    /// No reason or a plain text reason: credentials refused.
    Plain,
    /// `TEMP[...]`: a temporary failure, retry (with the flags in the brackets).
    Temp,
    /// `SESSION:`: the auth-token expired; reconnect with full credentials.
    Session,
    /// `CRV1:`: a dynamic challenge.
    Challenge,
}

impl ControlMessage {
    /// Parses one message (without its NUL) by upstream's prefix rules. Never fails.
    pub fn parse(text: &str) -> ControlMessage {
        if text.starts_with("AUTH_FAILED") {
            let reason = after_comma(text, "AUTH_FAILED".len()).map(str::to_owned);
            ControlMessage::AuthFailed { reason }
        } else if text.starts_with("PUSH_") {
            if text.starts_with(PUSH_REQUEST) {
                ControlMessage::PushRequest
            } else if let Some(rest) = text.strip_prefix(PUSH_REPLY) {
                match rest.strip_prefix(',') {
                    Some(options) => ControlMessage::PushReply {
                        options: options.to_owned(),
                    },
                    None if rest.is_empty() => ControlMessage::PushReply {
                        options: String::new(),
                    },
                    None => ControlMessage::Unknown(text.to_owned()),
                }
            } else {
                ControlMessage::Unknown(text.to_owned())
            }
        } else if text.starts_with("RESTART") {
            ControlMessage::Restart(ServerSignal::parse(after_comma(text, "RESTART".len())))
        } else if text.starts_with("HALT") {
            ControlMessage::Halt(ServerSignal::parse(after_comma(text, "HALT".len())))
        } else if text.starts_with("INFO_PRE") {
            ControlMessage::InfoPre(after_comma(text, "INFO_PRE".len()).unwrap_or("").to_owned())
        } else if text.starts_with("INFO") {
            ControlMessage::Info(after_comma(text, "INFO".len()).unwrap_or("").to_owned())
        } else if text.starts_with("CR_RESPONSE") {
            ControlMessage::CrResponse(
                after_comma(text, "CR_RESPONSE".len())
                    .unwrap_or("")
                    .to_owned(),
            )
        } else if text.starts_with("AUTH_PENDING") {
            let timeout = after_comma(text, "AUTH_PENDING".len()).and_then(|kw| {
                kw.split(',').find_map(|k| {
                    k.strip_prefix("timeout ")
                        .and_then(|n| n.trim().parse().ok())
                })
            });
            ControlMessage::AuthPending { timeout }
        } else if text.starts_with("EXIT") {
            ControlMessage::Exit
        } else {
            ControlMessage::Unknown(text.to_owned())
        }
    }

    /// The message as text, without NUL (what [`ControlMessage::parse`] reads back).
    pub fn to_text(&self) -> String {
        self.to_string()
    }

    /// Appends the message and its NUL terminator to `out`: the plaintext of one TLS record.
    /// Refuses NUL and control characters in the text and messages longer than
    /// [`TLS_CHANNEL_BUF_SIZE`] (with NUL); `out` is unchanged on error.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ControlMsgError> {
        encode_text(&self.to_text(), out)
    }

    /// For `AUTH_FAILED`, what kind of failure its reason announces.
    pub fn auth_failed_kind(&self) -> Option<AuthFailedKind> {
        let ControlMessage::AuthFailed { reason } = self else {
            return None;
        };
        let r = reason.as_deref().unwrap_or("");
        Some(if r.starts_with("TEMP") {
            AuthFailedKind::Temp
        } else if r.starts_with("SESSION:") {
            AuthFailedKind::Session
        } else if r.starts_with("CRV1:") {
            AuthFailedKind::Challenge
        } else {
            AuthFailedKind::Plain
        })
    }
}

impl fmt::Display for ControlMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn opt(f: &mut fmt::Formatter<'_>, head: &str, rest: &str) -> fmt::Result {
            if rest.is_empty() {
                f.write_str(head)
            } else {
                write!(f, "{head},{rest}")
            }
        }
        match self {
            ControlMessage::PushRequest => f.write_str(PUSH_REQUEST),
            ControlMessage::PushReply { options } => opt(f, PUSH_REPLY, options),
            ControlMessage::AuthFailed { reason } => {
                opt(f, "AUTH_FAILED", reason.as_deref().unwrap_or(""))
            }
            ControlMessage::AuthPending { timeout: None } => f.write_str("AUTH_PENDING"),
            ControlMessage::AuthPending { timeout: Some(t) } => {
                write!(f, "AUTH_PENDING,timeout {t}")
            }
            ControlMessage::Info(t) => opt(f, "INFO", t),
            ControlMessage::InfoPre(t) => opt(f, "INFO_PRE", t),
            ControlMessage::CrResponse(t) => opt(f, "CR_RESPONSE", t),
            ControlMessage::Restart(s) => opt(f, "RESTART", &s.to_text()),
            ControlMessage::Halt(s) => opt(f, "HALT", &s.to_text()),
            ControlMessage::Exit => f.write_str("EXIT"),
            ControlMessage::Unknown(t) => f.write_str(t),
        }
    }
}

impl ServerSignal {
    /// Parses the text after `RESTART,` / `HALT,` (`None` when there is no comma or nothing
    /// after it). Flags are the letters between a leading `[` and the next `]`; upstream
    /// scans to the end of the text when the `]` is missing, so then the message is empty.
    fn parse(text: Option<&str>) -> ServerSignal {
        let text = text.unwrap_or("");
        let Some(inner) = text.strip_prefix('[') else {
            return ServerSignal {
                message: text.to_owned(),
                ..ServerSignal::default()
            };
        };
        let (flags, message) = inner.split_once(']').unwrap_or((inner, ""));
        ServerSignal {
            keep_password: flags.contains('P'),
            next_remote: flags.contains('N'),
            message: message.to_owned(),
        }
    }

    /// The text after the comma: `[flags]message`, or just the message without flags.
    fn to_text(&self) -> String {
        let mut flags = String::new();
        if self.keep_password {
            flags.push('P');
        }
        if self.next_remote {
            flags.push('N');
        }
        if flags.is_empty() {
            self.message.clone()
        } else {
            format!("[{flags}]{}", self.message)
        }
    }
}

/// The text after `head_len` bytes if it starts with a comma and is not empty (upstream's
/// `buf_advance` + `buf_read_u8 == ','` + `BLEN` check).
fn after_comma(text: &str, head_len: usize) -> Option<&str> {
    text.get(head_len..)
        .and_then(|r| r.strip_prefix(','))
        .filter(|r| !r.is_empty())
}

/// Appends `text` and a NUL to `out`, checking what [`ControlMessage::encode`] checks.
pub fn encode_text(text: &str, out: &mut Vec<u8>) -> Result<(), ControlMsgError> {
    if let Some((offset, &byte)) = text
        .as_bytes()
        .iter()
        .enumerate()
        .find(|(_, &b)| !is_print(b))
    {
        return Err(ControlMsgError::InvalidToSend { byte, offset });
    }
    let len = text.len() + 1;
    if len > TLS_CHANNEL_BUF_SIZE {
        return Err(ControlMsgError::TooLong {
            len,
            max: TLS_CHANNEL_BUF_SIZE,
        });
    }
    out.reserve(len);
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    Ok(())
}

/// Upstream's `CC_PRINT`: not a control character (bytes >= 0x80 count as printable).
const fn is_print(b: u8) -> bool {
    b >= 0x20 && b != 0x7f
}

/// Splits the plaintext of one TLS read into control messages at NUL bytes.
///
/// Yields a message per NUL-terminated piece, in order; an empty piece (a lone NUL, or only
/// CR/LF) yields nothing. Problems come out as `Err` items and do not stop the iteration:
/// a piece with control characters ([`ControlMsgError::InvalidCharacter`]), one that is not
/// UTF-8 ([`ControlMsgError::NotUtf8`]), and the trailing bytes after the last NUL
/// ([`ControlMsgError::Unterminated`], always the last item).
pub fn split_messages(plaintext: &[u8]) -> SplitMessages<'_> {
    SplitMessages { rest: plaintext }
}

/// Iterator returned by [`split_messages`].
#[derive(Debug, Clone)]
pub struct SplitMessages<'a> {
    rest: &'a [u8],
}

impl Iterator for SplitMessages<'_> {
    type Item = Result<ControlMessage, ControlMsgError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let Some(nul) = self.rest.iter().position(|&b| b == 0) else {
                let len = self.rest.len();
                self.rest = &[];
                return Some(Err(ControlMsgError::Unterminated { len }));
            };
            let (piece, tail) = self.rest.split_at(nul);
            self.rest = tail.get(1..).unwrap_or(&[]);
            let mut end = piece.len();
            while end > 0 && matches!(piece[end - 1], b'\r' | b'\n') {
                end -= 1;
            }
            let piece = &piece[..end];
            if piece.is_empty() {
                continue;
            }
            if let Some((offset, &byte)) = piece.iter().enumerate().find(|(_, &b)| !is_print(b)) {
                return Some(Err(ControlMsgError::InvalidCharacter {
                    byte,
                    offset,
                    message: piece.to_vec(),
                }));
            }
            return Some(match std::str::from_utf8(piece) {
                Ok(text) => Ok(ControlMessage::parse(text)),
                Err(_) => Err(ControlMsgError::NotUtf8 {
                    message: piece.to_vec(),
                }),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn split(bytes: &[u8]) -> Vec<Result<ControlMessage, ControlMsgError>> {
        split_messages(bytes).collect()
    }

    #[test]
    fn a_dropped_message_is_logged_escaped() {
        let got = split(b"PUSH_REPLY,echo \x1b]0;x\x07,route 10.0.0.0\x00");
        let [Err(e)] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!(
            e.escaped_message().as_deref(),
            Some("PUSH_REPLY,echo \\u{1b}]0;x\\u{7},route 10.0.0.0")
        );
        assert_eq!(
            e.to_string(),
            "control message with invalid character 0x1b at offset 16 dropped"
        );
        let got = split(b"INFO,\xff\x00");
        let [Err(e)] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!(e.escaped_message().as_deref(), Some("INFO,\u{fffd}"));
        assert_eq!(
            ControlMsgError::Unterminated { len: 3 }.escaped_message(),
            None
        );
    }

    #[test]
    fn prefix_dispatch_as_upstream() {
        use ControlMessage as M;
        assert_eq!(M::parse("PUSH_REQUEST"), M::PushRequest);
        assert_eq!(M::parse("PUSH_REQUESTED"), M::PushRequest);
        assert_eq!(
            M::parse("PUSH_REPLY"),
            M::PushReply {
                options: String::new()
            }
        );
        assert_eq!(
            M::parse("PUSH_REPLY,ping 10,ping-restart 60"),
            M::PushReply {
                options: "ping 10,ping-restart 60".into()
            }
        );
        assert_eq!(M::parse("PUSH_REPLYX"), M::Unknown("PUSH_REPLYX".into()));
        assert_eq!(
            M::parse("PUSH_UPDATE,x"),
            M::Unknown("PUSH_UPDATE,x".into())
        );
        assert_eq!(M::parse("AUTH_FAILED"), M::AuthFailed { reason: None });
        assert_eq!(M::parse("AUTH_FAILED,"), M::AuthFailed { reason: None });
        let temp = M::parse("AUTH_FAILED,TEMP[backoff 5,advance no]:try later");
        assert_eq!(
            temp,
            M::AuthFailed {
                reason: Some("TEMP[backoff 5,advance no]:try later".into())
            }
        );
        assert_eq!(temp.auth_failed_kind(), Some(AuthFailedKind::Temp));
        assert_eq!(
            M::parse("AUTH_FAILED,SESSION:token expired").auth_failed_kind(),
            Some(AuthFailedKind::Session)
        );
        assert_eq!(
            M::parse("AUTH_FAILED").auth_failed_kind(),
            Some(AuthFailedKind::Plain)
        );
        assert_eq!(
            M::parse("AUTH_PENDING,timeout 30"),
            M::AuthPending { timeout: Some(30) }
        );
        assert_eq!(M::parse("AUTH_PENDING"), M::AuthPending { timeout: None });
        assert_eq!(
            M::parse("INFO_PRE,WEB_AUTH::x"),
            M::InfoPre("WEB_AUTH::x".into())
        );
        assert_eq!(M::parse("INFO,hello"), M::Info("hello".into()));
        assert_eq!(M::parse("INFOx"), M::Info(String::new()));
        assert_eq!(M::parse("CR_RESPONSE,YWJj"), M::CrResponse("YWJj".into()));
        assert_eq!(M::parse("EXIT"), M::Exit);
        assert_eq!(M::parse("EXITED"), M::Exit);
        assert_eq!(M::parse("HELLO"), M::Unknown("HELLO".into()));
    }

    #[test]
    fn restart_and_halt_flags() {
        use ControlMessage as M;
        assert_eq!(M::parse("RESTART"), M::Restart(ServerSignal::default()));
        assert_eq!(
            M::parse("RESTART,[PN]server going down"),
            M::Restart(ServerSignal {
                keep_password: true,
                next_remote: true,
                message: "server going down".into()
            })
        );
        assert_eq!(
            M::parse("RESTART,[N]"),
            M::Restart(ServerSignal {
                next_remote: true,
                ..ServerSignal::default()
            })
        );
        assert_eq!(
            M::parse("HALT,bye"),
            M::Halt(ServerSignal {
                message: "bye".into(),
                ..ServerSignal::default()
            })
        );
        // Unterminated flags: upstream scans to the end; no message left.
        assert_eq!(
            M::parse("RESTART,[P"),
            M::Restart(ServerSignal {
                keep_password: true,
                ..ServerSignal::default()
            })
        );
    }

    #[test]
    fn text_round_trip() {
        for t in [
            "PUSH_REQUEST",
            "PUSH_REPLY",
            "PUSH_REPLY,route 10.0.0.0 255.0.0.0,ping 10",
            "AUTH_FAILED",
            "AUTH_FAILED,SESSION:x",
            "AUTH_PENDING,timeout 60",
            "INFO,x",
            "INFO_PRE,y",
            "CR_RESPONSE,z",
            "RESTART",
            "RESTART,[P]m",
            "HALT,[PN]",
            "EXIT",
            "SOMETHING,else",
        ] {
            assert_eq!(ControlMessage::parse(t).to_text(), t, "{t}");
        }
    }

    #[test]
    fn encode_appends_nul_and_checks() {
        let mut out = Vec::new();
        ControlMessage::PushRequest.encode(&mut out).unwrap();
        ControlMessage::Exit.encode(&mut out).unwrap();
        assert_eq!(out, b"PUSH_REQUEST\0EXIT\0");
        let bad = ControlMessage::Info("a\tb".into());
        assert_eq!(
            bad.encode(&mut out),
            Err(ControlMsgError::InvalidToSend {
                byte: b'\t',
                offset: 6
            })
        );
        let long = ControlMessage::Info("x".repeat(TLS_CHANNEL_BUF_SIZE));
        assert!(matches!(
            long.encode(&mut out),
            Err(ControlMsgError::TooLong { .. })
        ));
        assert_eq!(out, b"PUSH_REQUEST\0EXIT\0");
        // Exactly 2047 bytes of text plus NUL fits.
        let max = format!("INFO,{}", "x".repeat(TLS_CHANNEL_BUF_SIZE - 6));
        encode_text(&max, &mut out).unwrap();
    }

    #[test]
    fn split_at_nul_discarding_trailing_piece() {
        let got = split(b"PUSH_REQUEST\0PUSH_REPLY,ping 10\0PUSH_REP");
        assert_eq!(
            got,
            vec![
                Ok(ControlMessage::PushRequest),
                Ok(ControlMessage::PushReply {
                    options: "ping 10".into()
                }),
                Err(ControlMsgError::Unterminated { len: 8 }),
            ]
        );
        assert_eq!(split(b""), vec![]);
        assert_eq!(
            split(b"EXIT"),
            vec![Err(ControlMsgError::Unterminated { len: 4 })]
        );
    }

    #[test]
    fn split_strips_crlf_and_drops_control_characters() {
        let got = split(b"EXIT\r\n\0\0\r\0INFO,a\tb\0INFO,\xff\0INFO,\xc3\xa9\0");
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], Ok(ControlMessage::Exit));
        assert_eq!(
            got[1],
            Err(ControlMsgError::InvalidCharacter {
                byte: b'\t',
                offset: 6,
                message: b"INFO,a\tb".to_vec()
            })
        );
        assert!(matches!(got[2], Err(ControlMsgError::NotUtf8 { .. })));
        assert_eq!(got[3], Ok(ControlMessage::Info("\u{e9}".into())));
        // A CR in the middle is not stripped.
        assert!(matches!(
            split(b"EX\rIT\0")[0],
            Err(ControlMsgError::InvalidCharacter { byte: b'\r', .. })
        ));
    }
}
