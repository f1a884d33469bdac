//! Who routes a server name that several files of `--config-dir` claim: a function of the
//! files' content alone, so the same directory gives the same routes whatever the order the
//! files arrived in, their names and the time the router started.
//!
//! The rule, for a server name:
//!
//! 1. A name `seed.toml` routes is the seed's.
//! 2. Else a name that names a shoot belongs to that shoot's file: one of its labels is the
//!    shoot's namespace (`api.shoot--p--a.example.com`), or two neighbouring labels are
//!    `<shoot>.<project>` of namespace `shoot--<project>--<shoot>` (Gardener's shoot domains,
//!    `api.a.p.example.com`).
//! 3. Else a name only one shoot file claims is that file's.
//! 4. Else (several files claim a name that names none of them, or names several of them)
//!    the name is contested: none of them routes it until the claims are resolved.
//!
//! A claim the rule does not grant is refused alone: the claimant's other routes stay, and
//! the owner's file is never touched. CONNECT values follow rule 2 already at parse time:
//! a value names its namespace, and only that shoot's file may route it.

use std::collections::{BTreeMap, BTreeSet};

use crate::client_hello::ServerName;

/// Who routes a server name that shoot files claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// `seed.toml` routes it (rule 1).
    Seed,
    /// This shoot file (rules 2 and 3).
    File(String),
    /// Nobody: these files claim it and none of them wins (rule 4).
    Contested(Vec<String>),
}

/// The owner of every name `claims` (file name -> the names it routes) holds, `seed`
/// being the names `seed.toml` routes.
pub(crate) fn owners(
    claims: &BTreeMap<String, BTreeSet<ServerName>>,
    seed: impl Fn(&ServerName) -> bool,
) -> BTreeMap<ServerName, Owner> {
    let mut claimants: BTreeMap<&ServerName, Vec<&str>> = BTreeMap::new();
    for (file, names) in claims {
        for name in names {
            claimants.entry(name).or_default().push(file);
        }
    }
    claimants
        .into_iter()
        .map(|(name, files)| (name.clone(), owner(name, &files, seed(name))))
        .collect()
}

/// Rules 1 to 4 for one `name` claimed by shoot `files`.
fn owner(name: &ServerName, files: &[&str], seed: bool) -> Owner {
    if seed {
        return Owner::Seed;
    }
    let named: Vec<&str> = files
        .iter()
        .copied()
        .filter(|file| names_shoot(name, shoot_of(file)))
        .collect();
    match (named.as_slice(), files) {
        ([one], _) | ([], [one]) => Owner::File((*one).to_owned()),
        _ => Owner::Contested(files.iter().map(|f| (*f).to_owned()).collect()),
    }
}

/// The shoot (namespace) of a shoot file: its stem.
pub(crate) fn shoot_of(file: &str) -> &str {
    file.strip_suffix(".toml").unwrap_or(file)
}

/// Whether `name` names `shoot` (rule 2): a label is the namespace, or two neighbouring
/// labels are `<shoot>.<project>` of namespace `shoot--<project>--<shoot>`.
pub(crate) fn names_shoot(name: &ServerName, shoot: &str) -> bool {
    let labels: Vec<&str> = name.as_str().split('.').collect();
    labels.contains(&shoot)
        || labels
            .windows(2)
            .any(|w| shoot == format!("shoot--{}--{}", w[1], w[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sni(name: &str) -> ServerName {
        ServerName::parse(name.as_bytes()).unwrap()
    }

    fn claims(list: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<ServerName>> {
        list.iter()
            .map(|(file, names)| (file.to_string(), names.iter().map(|n| sni(n)).collect()))
            .collect()
    }

    #[test]
    fn a_name_names_its_shoot_by_namespace_or_gardener_domain() {
        assert!(names_shoot(
            &sni("api.shoot--p--a.example.com"),
            "shoot--p--a"
        ));
        assert!(names_shoot(&sni("api.a.p.example.com"), "shoot--p--a"));
        assert!(names_shoot(
            &sni("api.a.p.internal.example.com"),
            "shoot--p--a"
        ));
        assert!(!names_shoot(&sni("api.a.p.example.com"), "shoot--a--p"));
        assert!(!names_shoot(
            &sni("api.shoot--p--ab.example.com"),
            "shoot--p--a"
        ));
        assert!(!names_shoot(&sni("api.a.example.com"), "shoot--p--a"));
    }

    #[test]
    fn ownership_is_the_same_whatever_the_file_names_sort_like() {
        let seed = |n: &ServerName| n.as_str() == "seed.example.com";
        let rightful = ("shoot--p--a.toml", &["api.a.p.example.com"][..]);
        for thief in ["shoot--a--x.toml", "shoot--z--x.toml"] {
            let got = owners(
                &claims(&[
                    rightful,
                    (
                        thief,
                        &["api.a.p.example.com", "seed.example.com", "x.example.com"],
                    ),
                ]),
                seed,
            );
            assert_eq!(
                got[&sni("api.a.p.example.com")],
                Owner::File("shoot--p--a.toml".into())
            );
            assert_eq!(got[&sni("seed.example.com")], Owner::Seed);
            assert_eq!(got[&sni("x.example.com")], Owner::File(thief.into()));
        }
        // A name that names nobody, claimed twice: nobody routes it.
        let got = owners(
            &claims(&[
                ("shoot--p--a.toml", &["x.example.com"]),
                ("shoot--p--b.toml", &["x.example.com"]),
            ]),
            seed,
        );
        assert_eq!(
            got[&sni("x.example.com")],
            Owner::Contested(vec!["shoot--p--a.toml".into(), "shoot--p--b.toml".into()])
        );
    }
}
