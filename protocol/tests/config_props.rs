//! Property tests: the config lexer and parsers never panic, and every error's line is a line
//! of the file.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use protocol::config::{lex, parse, CcdOptions};

/// Text built from config-ish pieces, so inline blocks, quotes and directives show up often.
fn config_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<ca>".to_owned()),
        Just("</ca>".to_owned()),
        Just("<tls-auth>".to_owned()),
        Just("</tls-auth>".to_owned()),
        Just("<dh>".to_owned()),
        Just("client".to_owned()),
        Just("mode server".to_owned()),
        Just("proto tcp-server".to_owned()),
        Just("server 10.8.0.0 255.255.255.0".to_owned()),
        Just("push \"route 10.0.0.0 255.0.0.0\"".to_owned()),
        Just("remote a 1194".to_owned()),
        Just("iroute 10.0.0.0 255.0.0.0".to_owned()),
        Just("# comment".to_owned()),
        Just("--dev tun".to_owned()),
        "[ -~]{0,40}",
        "\\PC{0,20}",
    ];
    prop::collection::vec(piece, 0..30).prop_map(|lines| lines.join("\n"))
}

fn line_count(text: &str) -> usize {
    text.split('\n').count()
}

proptest! {
    #[test]
    fn lexer_never_panics_on_arbitrary_text(text in "\\PC{0,400}") {
        if let Err(e) = lex("f", &text) {
            let line = e.line.unwrap();
            prop_assert!(line >= 1 && line <= line_count(&text));
        }
    }

    #[test]
    fn parsers_never_panic_and_lines_are_in_the_file(text in config_text()) {
        let lines = line_count(&text);
        if let Ok(directives) = lex("f", &text) {
            for d in directives {
                prop_assert!(d.line >= 1 && d.line <= lines);
            }
        }
        if let Err(e) = parse("f", &text) {
            if let Some(line) = e.line {
                prop_assert!(line >= 1 && line <= lines, "{e}");
            }
            prop_assert!(!e.to_string().is_empty());
        }
        if let Err(e) = CcdOptions::parse("f", &text) {
            let line = e.line.unwrap();
            prop_assert!(line >= 1 && line <= lines, "{e}");
        }
    }

    #[test]
    fn inline_content_round_trips(body in prop::collection::vec("[ -~]{0,30}", 0..8)) {
        // Any body without its own closing tag comes back byte for byte.
        prop_assume!(body.iter().all(|l| l.trim() != "</ca>"));
        let mut text = String::from("<ca>\n");
        for l in &body {
            text.push_str(l);
            text.push('\n');
        }
        text.push_str("</ca>\n");
        let d = lex("f", &text).unwrap();
        prop_assert_eq!(d.len(), 1);
        let expected: String = body.iter().map(|l| format!("{l}\n")).collect();
        prop_assert_eq!(d[0].inline.as_deref(), Some(expected.as_str()));
    }
}
