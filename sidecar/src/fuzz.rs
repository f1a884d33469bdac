//! Entry points for the fuzz targets in `fuzz/` that need this crate (one line each there).
//! Each must never panic, whatever the input, and checks the invariant the fuzzer hunts for.
//!
//! Not part of the supported API.

use crate::envoy::{bootstrap, tunnel, yaml};

/// Reads `data` as an Envoy bootstrap file the way `envoy -c FILE` does (the apiserver-proxy's
/// reader when the file has its `tcp_proxy` listener, else the CONNECT sidecar's): a refusal
/// names a line the text has; an accepted file reads the same again.
pub fn envoy_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = yaml::line_count(text);
    let doc = match yaml::load(text) {
        Ok(doc) => doc,
        Err(e) => return in_text(&e, lines),
    };
    let root = yaml::Node::root(&doc, text);
    if tunnel::recognised(&root) {
        match tunnel::from_root(&root) {
            Ok(b) => {
                let again = tunnel::parse(text).expect("an accepted file reads again");
                assert_eq!(format!("{b:?}"), format!("{again:?}"));
            }
            Err(e) => in_text(&e, lines),
        }
    } else {
        match bootstrap::from_root(&root) {
            Ok(b) => {
                let again = bootstrap::parse(text).expect("an accepted file reads again");
                assert_eq!(format!("{b:?}"), format!("{again:?}"));
            }
            Err(e) => in_text(&e, lines),
        }
    }
}

/// The refusal names a line of the text (1 to `lines`) and shows it in its message.
fn in_text(e: &yaml::YamlError, lines: usize) {
    assert!(
        (1..=lines).contains(&e.line),
        "line {} of {lines}: {e}",
        e.line
    );
    assert!(
        e.to_string().starts_with(&format!("line {}: ", e.line)),
        "{e}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gardeners_files_and_broken_ones_hold_the_invariant() {
        envoy_yaml(include_bytes!("../fixtures/gardener-envoy.yaml"));
        envoy_yaml(include_bytes!("../fixtures/gardener-apiserver-proxy.yaml"));
        envoy_yaml(b"");
        envoy_yaml(b"a: [\n");
        envoy_yaml(b"---\na: 1\n---\nb: 2\n");
        envoy_yaml(b"static_resources:\n  listeners: 3\n");
        // Found by the fuzz target: lines that end in a lone CR are lines to YAML.
        envoy_yaml(b"a: 1\rb: 2\rc:\r  - d\r  e: [\r");
        envoy_yaml(include_bytes!("../fixtures/fuzz-envoy-yaml-cr-lines.yaml"));
        // Found by the fuzz target: a `?` key with nothing after it but comments, which the
        // scanner marks one line past the end of the text.
        envoy_yaml(include_bytes!(
            "../fixtures/fuzz-envoy-yaml-key-past-end.yaml"
        ));
    }
}
