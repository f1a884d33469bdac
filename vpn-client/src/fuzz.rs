//! Entry points for the fuzz targets in `fuzz/` that need this crate (one line each there).
//! Each must never panic, whatever the input, and checks the invariant the fuzzer hunts for.
//!
//! Not part of the supported API.

use std::path::Path;

use crate::cloud_api::file::{self, FileError, MAX_DEVICE_LEN};
use crate::config::LoadError;

/// The path the connection file is said to have (messages and the device name only).
const PATH: &str = "/etc/cloud-api/seed-a.conf";

/// Reads `data` as a cloud-api connection file: a refusal names the file, and a line the
/// text has when it names one; an accepted file has an allow-list, a device name Linux
/// takes, a proxy port, and pulls no routes.
pub fn connection_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.split('\n').count();
    match file::parse(Path::new(PATH), text) {
        Ok(spec) => {
            assert!(!spec.allow.entries().is_empty());
            assert!(
                !spec.device.is_empty() && spec.device.len() <= MAX_DEVICE_LEN,
                "{}",
                spec.device
            );
            assert!(spec.proxy_port > 0);
            assert!(spec.settings.pull.route_nopull);
            assert_eq!(spec.name, "seed-a");
        }
        Err(FileError::Config(LoadError::Read { path, .. })) => {
            // A file the text names (a certificate, a key) that cannot be read, as the parser
            // read its path (quotes and escapes resolved, so not always verbatim in the text).
            assert!(!path.as_os_str().is_empty());
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(shown.starts_with(PATH), "{shown}");
            if let FileError::Directive { line, .. } = e {
                assert!((1..=lines).contains(&line), "line {line} of {lines}");
            }
            if let Some(rest) = shown.strip_prefix(&format!("{PATH}:")) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(line) = digits.parse::<usize>() {
                    assert!(
                        (1..=lines).contains(&line),
                        "line {line} of {lines}: {shown}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_broken_files_hold_the_invariant() {
        connection_file(
            b"cloud-api-allow 10.20.0.0/22:443 api.example:443\ncloud-api-port 3128\n\
            client\nproto tcp-client\nremote 10.1.0.2 1194\ndev tun\n\
            <ca>\nx\n</ca>\n",
        );
        connection_file(b"cloud-api-allow nope\n");
        connection_file(b"cloud-api-port 1\ncloud-api-port 2\n");
        connection_file(b"cloud-api-allow a:1\nbogus 1\n");
        connection_file(b"");
        // Found by the fuzz target: an unreadable certificate is named by its own path.
        connection_file(
            b"cloud-api-allow a:1\nclient\ndev tun\nremote 10.1.0.2 1194\nca /nonexistent/ca.crt\n",
        );
        // ... also when the parser unescaped the path (found by the fuzz target).
        connection_file(include_bytes!(
            "../fixtures/fuzz-cloud-api-escaped-path.conf"
        ));
    }
}
