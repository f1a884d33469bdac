//! Entry points for the fuzz targets in `fuzz/` that need this crate (one line each there).
//! Each must never panic, whatever the input, and checks the invariant the fuzzer hunts for.
//!
//! Not part of the supported API.

use std::path::Path;

use crate::config::RouterConfig;
use crate::config_dir::{ConfigFiles, DirLoader, Files, SEED_FILE};
use netio::volume::Snapshot;

/// The directory the files are said to be in (messages only: nothing is read).
const DIR: &str = "/fuzz/config-dir";
/// At most this many shoot files from one input.
const MAX_SHOOTS: usize = 8;

/// Reads `data` as a `--config-dir` directory ([`files_from`]) and loads it three ways: all
/// files at once, and `seed.toml` first with the shoot files arriving one per poll in name
/// order and in reverse name order. The routes in force (CONNECT and SNI) and which files
/// are wholly in force must be the same all three ways (ownership is a function of the
/// content, not of the order of arrival), and a refused file's error names a line the file
/// has.
pub fn config_dir(data: &[u8]) {
    let files = files_from(data);
    let dir = Path::new(DIR);
    let seed_lines = files.get(SEED_FILE).map_or(0, |t| lines(t));
    let all = ConfigFiles::default();
    let at_once = match DirLoader::open_snapshot(dir, snapshot(files.clone()), &all) {
        Ok((_, config)) => config,
        Err(e) => {
            if let Some(line) = e.line() {
                assert!(
                    (1..=seed_lines).contains(&line),
                    "line {line} of {seed_lines}: {e}"
                );
            }
            let shown = e.to_string();
            assert!(shown.contains(SEED_FILE), "{shown}");
            return;
        }
    };
    let shoots: Vec<&String> = files.keys().filter(|n| *n != SEED_FILE).collect();
    for order in [shoots.clone(), shoots.iter().rev().copied().collect()] {
        let state = ConfigFiles::default();
        let seed_only = files
            .iter()
            .filter(|(n, _)| *n == SEED_FILE)
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let (mut loader, mut config) = DirLoader::open_snapshot(dir, snapshot(seed_only), &state)
            .expect("the seed loaded at once");
        let mut present = Files::new();
        present.insert(SEED_FILE.to_owned(), files[SEED_FILE].clone());
        for name in order {
            present.insert(name.clone(), files[name].clone());
            if let Some(change) = loader.poll_snapshot(snapshot(present.clone()), &state) {
                config = change.config;
            }
        }
        same_routes(&at_once, &config);
        for name in files.keys() {
            assert_eq!(
                all.state(name).map(|s| s.0),
                state.state(name).map(|s| s.0),
                "{name} in force one way and not the other"
            );
        }
    }
    for (name, text) in &files {
        if let Some(line) = crate::config_dir::refused_at(dir, name, text) {
            let n = lines(text);
            if let Some(line) = line {
                assert!((1..=n).contains(&line), "{name}: line {line} of {n}");
            }
            assert_eq!(
                all.state(name).map(|s| s.0),
                Some(false),
                "{name} refused yet in force"
            );
        }
    }
}

/// The files of a directory from `data`: parts split at NUL bytes, the first `seed.toml`'s
/// bytes, each other `NAME\nTEXT` (names a directory scan would skip are skipped, as is a
/// name given twice; at most [`MAX_SHOOTS`]).
pub fn files_from(data: &[u8]) -> Files {
    let mut parts = data.split(|&b| b == 0);
    let mut files = Files::new();
    files.insert(
        SEED_FILE.to_owned(),
        parts.next().unwrap_or_default().to_vec(),
    );
    for part in parts {
        let (name, text) = match part.iter().position(|&b| b == b'\n') {
            Some(at) => (&part[..at], &part[at + 1..]),
            None => (part, &[][..]),
        };
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let wanted = name.ends_with(".toml")
            && !name.starts_with('.')
            && !name.contains('/')
            && name != SEED_FILE;
        if wanted && !files.contains_key(name) && files.len() <= MAX_SHOOTS {
            files.insert(name.to_owned(), text.to_vec());
        }
    }
    files
}

fn snapshot(files: Files) -> Snapshot {
    Snapshot {
        files,
        too_large: Default::default(),
        version: None,
    }
}

fn lines(text: &[u8]) -> usize {
    text.split(|&b| b == b'\n').count()
}

fn same_routes(a: &RouterConfig, b: &RouterConfig) {
    assert_eq!(
        a.policy.routes, b.policy.routes,
        "CONNECT routes differ by arrival order"
    );
    assert_eq!(
        a.policy.sni_routes, b.policy.sni_routes,
        "SNI routes differ by arrival order"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "[[listener]]\naddress = \"127.0.0.1:1\"\nkind = \"sni\"\n";

    fn sni(name: &str, upstream: &str) -> String {
        format!("[[sni_route]]\nserver_names = [\"{name}\"]\nupstream = \"{upstream}\"\n")
    }

    #[test]
    fn files_come_from_nul_separated_parts() {
        let data = b"seed\0shoot--p--a.toml\nA\0.hidden.toml\nB\0x.conf\nC\0shoot--p--a.toml\nD";
        let files = files_from(data);
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(names, ["seed.toml", "shoot--p--a.toml"]);
        assert_eq!(files["shoot--p--a.toml"], b"A");
        assert_eq!(files[SEED_FILE], b"seed");
    }

    #[test]
    fn conflicting_claims_load_the_same_in_every_order() {
        let data = format!(
            "{SEED}\0shoot--p--a.toml\n{}\0shoot--a--x.toml\n{}{}\0shoot--z--y.toml\n{}",
            sni("api.a.p.example.com", "a:443"),
            sni("api.a.p.example.com", "x:443"),
            sni("x.example.com", "x:443"),
            sni("x.example.com", "y:443"),
        );
        config_dir(data.as_bytes());
        let (_, config) = DirLoader::open_snapshot(
            Path::new(DIR),
            snapshot(files_from(data.as_bytes())),
            &ConfigFiles::default(),
        )
        .unwrap();
        let name = |n: &str| crate::client_hello::ServerName::parse(n.as_bytes()).unwrap();
        let sni = &config.policy.sni_routes;
        assert_eq!(sni[&name("api.a.p.example.com")].upstream, "a:443");
        assert!(!sni.contains_key(&name("x.example.com")), "{sni:?}");
        config_dir(b"not toml\0a.toml\n[[route]]\nvalue = 1\n");
        config_dir(format!("{SEED}\0a.toml\n[[route]]\nvalue = 1\n").as_bytes());
    }
}
