use std::os::unix::fs::symlink;

use super::*;
use crate::access::Rule;
use crate::client_hello::ServerName;
use protocol::http::route::RouteValue;

/// A directory written as the kubelet writes a ConfigMap volume: each version in
/// `..<n>/`, `..data` renamed over to point at it, a top-level link per file.
struct Volume {
    dir: tempfile::TempDir,
    version: usize,
    names: Vec<String>,
}

impl Volume {
    fn new() -> Volume {
        Volume {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
            names: Vec::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&mut self, files: &[(&str, &str)]) {
        let d = self.dir.path();
        self.version += 1;
        let version = format!("..2026_11_26_02_00_00.{}", self.version);
        std::fs::create_dir(d.join(&version)).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(&version).join(name), text).unwrap();
        }
        symlink(&version, d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join(DATA_LINK)).unwrap();
        let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
        for name in &names {
            if !self.names.contains(name) {
                symlink(Path::new(DATA_LINK).join(name), d.join(name)).unwrap();
            }
        }
        for old in &self.names {
            if !names.contains(old) {
                std::fs::remove_file(d.join(old)).unwrap();
            }
        }
        self.names = names;
        if self.version > 1 {
            let old = format!("..2026_11_26_02_00_00.{}", self.version - 1);
            std::fs::remove_dir_all(d.join(old)).unwrap();
        }
    }
}

const SEED: &str = "always_allowed = [\"10.250.0.0/16\"]\n\
    [[listener]]\naddress = \"127.0.0.1:1\"\nheaders = [\"X-Gardener-Destination\"]\n";

fn vpn(ns: &str) -> String {
    format!("outbound|1194||vpn-seed-server.{ns}.svc.cluster.local")
}

fn shoot(ns: &str, allow: &str) -> String {
    format!(
        "[[route]]\nvalue = \"{}\"\nupstream = \"{ns}:1194\"\nallow = [\"{allow}\"]\n",
        vpn(ns)
    )
}

fn allow_of(config: &RouterConfig, ns: &str) -> Option<Vec<Rule>> {
    let v = RouteValue::parse(&vpn(ns)).unwrap();
    config.policy.routes.get(&v).map(|t| t.rules.clone())
}

fn rule(cidr: &str) -> Vec<Rule> {
    vec![Rule::allow(vec![cidr.parse().unwrap()])]
}

#[test]
fn scan_reads_the_version_data_names_and_skips_the_rest() {
    let mut vol = Volume::new();
    vol.write(&[("seed.toml", "one"), ("shoot--p--a.toml", "a")]);
    let d = vol.path();
    std::fs::write(d.join("notes.txt"), "not config").unwrap();
    std::fs::write(d.join(".hidden.toml"), "skipped").unwrap();
    let got = scan(d).unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        ["seed.toml", "shoot--p--a.toml"]
    );
    assert_eq!(got["seed.toml"], b"one");
    vol.write(&[("seed.toml", "two")]);
    let got = scan(vol.path()).unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got["seed.toml"], b"two");

    // A plain directory: files read through their links, dangling links and
    // directories skipped.
    let plain = tempfile::tempdir().unwrap();
    let p = plain.path();
    std::fs::write(p.join("target.txt"), "linked").unwrap();
    symlink(p.join("target.txt"), p.join("shoot--p--b.toml")).unwrap();
    symlink(p.join("gone"), p.join("dangling.toml")).unwrap();
    std::fs::create_dir(p.join("dir.toml")).unwrap();
    std::fs::write(p.join("seed.toml~"), "backup").unwrap();
    let got = scan(p).unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), ["shoot--p--b.toml"]);
    assert_eq!(got["shoot--p--b.toml"], b"linked");
    assert!(scan(&p.join("missing")).is_err());
}

#[test]
fn shoots_change_alone_and_a_broken_file_keeps_its_last_good_routes() {
    let mut vol = Volume::new();
    vol.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &shoot("shoot--p--a", "192.0.2.0/24")),
        (
            "shoot--p--ab.toml",
            &shoot("shoot--p--ab", "198.51.100.0/24"),
        ),
    ]);
    let files = ConfigFiles::default();
    let (mut loader, config) = DirLoader::open(vol.path(), &files).unwrap();
    assert_eq!(config.policy.routes.len(), 2);
    assert_eq!(allow_of(&config, "shoot--p--a"), Some(rule("192.0.2.0/24")));
    assert!(
        loader.poll(&files, false).unwrap().is_none(),
        "nothing changed"
    );

    // a flips, ab breaks (a bad CIDR on line 4): a's change applies, ab keeps its routes.
    vol.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &shoot("shoot--p--a", "203.0.113.0/24")),
        ("shoot--p--ab.toml", &shoot("shoot--p--ab", "10.0.0.0/33")),
    ]);
    let change = loader.poll(&files, false).unwrap().unwrap();
    assert!(!change.seed_changed);
    let c = &change.config;
    assert_eq!(allow_of(c, "shoot--p--a"), Some(rule("203.0.113.0/24")));
    assert_eq!(allow_of(c, "shoot--p--ab"), Some(rule("198.51.100.0/24")));
    assert_eq!(files.state("shoot--p--ab.toml"), Some((false, 1)));
    assert_eq!(files.state("shoot--p--a.toml"), Some((true, 0)));
    let mut out = Exposition::new();
    files.metrics(&mut out);
    let text = out.into_string();
    assert!(text.contains("vpn_router_config_file_ok{file=\"shoot--p--ab.toml\"} 0\n"));
    assert!(text.contains("vpn_router_config_errors_total{file=\"shoot--p--ab.toml\"} 1\n"));
    assert!(text.contains("vpn_router_config_file_ok{file=\"seed.toml\"} 1\n"));

    // Fixed: taken. Then deleted: its routes go, and its series.
    vol.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &shoot("shoot--p--a", "203.0.113.0/24")),
        ("shoot--p--ab.toml", &shoot("shoot--p--ab", "10.0.0.0/8")),
    ]);
    let c = loader.poll(&files, false).unwrap().unwrap().config;
    assert_eq!(allow_of(&c, "shoot--p--ab"), Some(rule("10.0.0.0/8")));
    assert_eq!(files.state("shoot--p--ab.toml"), Some((true, 1)));
    vol.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &shoot("shoot--p--a", "203.0.113.0/24")),
    ]);
    let c = loader.poll(&files, false).unwrap().unwrap().config;
    assert_eq!(allow_of(&c, "shoot--p--ab"), None);
    assert_eq!(c.policy.routes.len(), 1);
    assert_eq!(files.state("shoot--p--ab.toml"), None);
}

#[test]
fn a_shoot_file_cannot_claim_another_shoots_route() {
    let mut vol = Volume::new();
    let a = shoot("shoot--p--a", "192.0.2.0/24");
    vol.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &a)]);
    let files = ConfigFiles::default();
    let (mut loader, _) = DirLoader::open(vol.path(), &files).unwrap();
    // ab's file claims a's value (a prefix of its own namespace) beside its own route.
    let hijack = format!(
        "{}\n[[route]]\nvalue = \"{}\"\nupstream = \"evil:1194\"\n",
        shoot("shoot--p--ab", "0.0.0.0/0"),
        vpn("shoot--p--a")
    );
    vol.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &a),
        ("shoot--p--ab.toml", &hijack),
    ]);
    let c = loader.poll(&files, false).unwrap().unwrap().config;
    let v = RouteValue::parse(&vpn("shoot--p--a")).unwrap();
    assert_eq!(c.policy.routes[&v].upstream, "shoot--p--a:1194");
    assert_eq!(
        allow_of(&c, "shoot--p--ab"),
        None,
        "the whole file is refused"
    );
    assert_eq!(files.state("shoot--p--ab.toml"), Some((false, 1)));
    let err = parse_shoot(
        Path::new("shoot--p--ab.toml"),
        "shoot--p--ab",
        hijack.as_bytes(),
    )
    .unwrap_err();
    assert_eq!(err.line(), Some(7), "{err}");
    assert!(
        err.to_string()
            .starts_with("config file shoot--p--ab.toml, line 7: route"),
        "{err}"
    );
    // The same value twice in one file.
    let twice = format!("{a}{a}");
    let err = parse_shoot(
        Path::new("shoot--p--a.toml"),
        "shoot--p--a",
        twice.as_bytes(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        DirError::File {
            line: Some(6),
            source: ConfigError::DuplicateRoute { .. },
            ..
        }
    ));
}

#[test]
fn errors_name_the_file_and_line() {
    let path = Path::new("dir/shoot--p--a.toml");
    let ns = "shoot--p--a";
    for (text, line) in [
        ("[[route]]\nvalue = \"x\"\nupstream = 7\n".to_owned(), 3),
        (format!("{}unknown = 1\n", shoot(ns, "10.0.0.0/8")), 5),
        (format!("\n\n{}", shoot(ns, "10.0.0.0/33")), 6),
        ("listener = []\n".to_owned(), 1),
    ] {
        let err = parse_shoot(path, ns, text.as_bytes()).unwrap_err();
        assert_eq!(err.line(), Some(line), "{text}: {err}");
        assert!(
            chain(&err).starts_with(&format!("config file dir/shoot--p--a.toml, line {line}")),
            "{}",
            chain(&err)
        );
        assert_eq!(
            chain(&err).matches("shoot--p--a.toml").count(),
            1,
            "{}",
            chain(&err)
        );
    }
    assert!(matches!(
        parse_shoot(path, ns, b"\xff"),
        Err(DirError::NotUtf8 { .. })
    ));
}

#[test]
fn the_seed_file_keeps_its_last_good_version_and_takes_no_routes() {
    let mut vol = Volume::new();
    let a = shoot("shoot--p--a", "192.0.2.0/24");
    assert!(matches!(
        DirLoader::open(&vol.path().join("missing"), &ConfigFiles::default()),
        Err(DirError::Scan { .. })
    ));
    vol.write(&[("shoot--p--a.toml", &a)]);
    assert!(matches!(
        DirLoader::open(vol.path(), &ConfigFiles::default()),
        Err(DirError::NoSeed { .. })
    ));
    let with_route = format!("{SEED}{a}");
    vol.write(&[("seed.toml", &with_route), ("shoot--p--a.toml", &a)]);
    let err = DirLoader::open(vol.path(), &ConfigFiles::default()).unwrap_err();
    assert!(
        matches!(err, DirError::SeedRoutes { line: Some(5), .. }),
        "{err}"
    );

    let files = ConfigFiles::default();
    let seed2 = format!("{SEED}[watch]\npoll_ms = 50\n");
    vol.write(&[("seed.toml", &seed2), ("shoot--p--a.toml", &a)]);
    let (mut loader, config) = DirLoader::open(vol.path(), &files).unwrap();
    assert_eq!(config.poll_interval, std::time::Duration::from_millis(50));
    // Broken: the old settings stay, shoots still update.
    let b = shoot("shoot--p--b", "10.0.0.0/8");
    vol.write(&[
        ("seed.toml", "always_allowed = 7\n"),
        ("shoot--p--a.toml", &a),
        ("shoot--p--b.toml", &b),
    ]);
    let change = loader.poll(&files, false).unwrap().unwrap();
    assert!(!change.seed_changed);
    assert_eq!(change.config.policy.routes.len(), 2);
    assert_eq!(change.config.poll_interval.as_millis(), 50);
    assert_eq!(change.config.policy.always_allowed.proxy.len(), 1);
    assert_eq!(files.state("seed.toml"), Some((false, 1)));
    // Deleted: still the old settings.
    vol.write(&[("shoot--p--a.toml", &a)]);
    let change = loader.poll(&files, false).unwrap().unwrap();
    assert_eq!(change.config.policy.always_allowed.proxy.len(), 1);
    assert_eq!(change.config.policy.routes.len(), 1);
    // Back, changed: taken.
    vol.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &a)]);
    let change = loader.poll(&files, false).unwrap().unwrap();
    assert!(change.seed_changed);
    assert_eq!(
        change.config.poll_interval,
        crate::config::DEFAULT_POLL_INTERVAL
    );
    assert_eq!(files.state("seed.toml"), Some((true, 2)));
    assert_eq!(loader.seed().policy.routes.len(), 0);
}

#[test]
fn the_example_directory_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/router.d");
    let files = ConfigFiles::default();
    let (_, config) = DirLoader::open(&dir, &files).unwrap();
    assert_eq!(config.listeners.len(), 2);
    assert_eq!(config.policy.routes.len(), 3);
    assert_eq!(config.policy.sni_routes.len(), 2);
    assert_eq!(files.state("shoot--dev--a.toml"), Some((true, 0)));
}

/// A measurement, not a check: what reading a directory of 1,000 shoots costs (`cargo test
/// -p vpn-router --release --lib -- --ignored poll_cost --nocapture`).
#[test]
#[ignore = "measurement"]
fn poll_cost_with_a_thousand_shoots() {
    let mut vol = Volume::new();
    let mut files: Vec<(String, String)> = vec![("seed.toml".into(), SEED.into())];
    for i in 0..1000 {
        let ns = format!("shoot--p--s{i}");
        let text = format!(
            "{}[[route]]\nvalue = \"outbound|443||kube-apiserver.{ns}.svc.cluster.local\"\n\
             upstream = \"kube-apiserver.{ns}.svc.cluster.local:443\"\n",
            shoot(&ns, "192.0.2.0/24")
        );
        files.push((format!("{ns}.toml"), text));
    }
    let write = |vol: &mut Volume, files: &[(String, String)]| {
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        vol.write(&borrowed);
    };
    write(&mut vol, &files);
    let reg = ConfigFiles::default();
    let t = std::time::Instant::now();
    let (mut loader, config) = DirLoader::open(vol.path(), &reg).unwrap();
    let open = t.elapsed();
    assert_eq!(config.policy.routes.len(), 2000);
    let t = std::time::Instant::now();
    for _ in 0..20 {
        assert!(loader.poll(&reg, false).unwrap().is_none());
    }
    let unchanged = t.elapsed() / 20;
    let t = std::time::Instant::now();
    assert!(loader.poll(&reg, true).unwrap().is_none());
    let forced = t.elapsed();
    // One shoot loses its kube-apiserver route.
    files[1].1 = shoot("shoot--p--s0", "198.51.100.0/24");
    write(&mut vol, &files);
    let t = std::time::Instant::now();
    let change = loader.poll(&reg, false).unwrap().unwrap();
    let changed = t.elapsed();
    assert_eq!(change.config.policy.routes.len(), 1999);
    eprintln!(
        "1000 shoot files, 2000 routes: first read {open:.2?}, an unchanged poll {unchanged:.2?} \
         (every file read and compared: {forced:.2?}), a poll with one file changed (policy \
         rebuilt) {changed:.2?}"
    );
}

#[test]
fn a_volume_is_read_again_when_data_moves_or_on_sighup() {
    let mut vol = Volume::new();
    let a = shoot("shoot--p--a", "192.0.2.0/24");
    vol.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &a)]);
    let files = ConfigFiles::default();
    let (mut loader, _) = DirLoader::open(vol.path(), &files).unwrap();
    // Changed in place (not what the kubelet does): the poll skips it, SIGHUP reads it.
    let data = std::fs::read_link(vol.path().join(DATA_LINK)).unwrap();
    let b = shoot("shoot--p--a", "10.0.0.0/8");
    std::fs::write(vol.path().join(&data).join("shoot--p--a.toml"), &b).unwrap();
    assert!(loader.poll(&files, false).unwrap().is_none());
    let c = loader.poll(&files, true).unwrap().unwrap().config;
    assert_eq!(allow_of(&c, "shoot--p--a"), Some(rule("10.0.0.0/8")));
    // A plain directory is read at every poll.
    let plain = tempfile::tempdir().unwrap();
    std::fs::write(plain.path().join("seed.toml"), SEED).unwrap();
    let (mut loader, _) = DirLoader::open(plain.path(), &files).unwrap();
    std::fs::write(plain.path().join("shoot--p--a.toml"), &a).unwrap();
    let c = loader.poll(&files, false).unwrap().unwrap().config;
    assert_eq!(allow_of(&c, "shoot--p--a"), Some(rule("192.0.2.0/24")));
}

fn sni(name: &str) -> ServerName {
    ServerName::parse(name.as_bytes()).unwrap()
}

#[test]
fn a_shoot_file_routes_its_sni_names_and_cannot_take_another_files() {
    let files = ConfigFiles::default();
    let mut v = Volume::new();
    let a = format!(
        "{}[[sni_route]]\nserver_names = [\"api.a.p.example\"]\nupstream = \"10.0.0.1:443\"\n",
        shoot("shoot--p--a", "10.0.0.0/8")
    );
    // shoot--p--b claims shoot--p--a's name (Gardener's `api.<shoot>.<project>.` domain
    // names shoot--p--a) beside one of its own: that claim alone is refused.
    let b_bad =
        "[[sni_route]]\nserver_names = [\"api.b.p.example\"]\nupstream = \"10.0.0.2:443\"\n\
         [[sni_route]]\nserver_names = [\"api.a.p.example\"]\nupstream = \"10.6.6.6:443\"\n";
    v.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &a),
        ("shoot--p--b.toml", b_bad),
    ]);
    let (mut loader, config) = DirLoader::open(v.path(), &files).unwrap();
    let upstream =
        |c: &RouterConfig, n: &str| c.policy.sni_routes.get(&sni(n)).map(|t| t.upstream.clone());
    assert_eq!(
        upstream(&config, "api.a.p.example").as_deref(),
        Some("10.0.0.1:443")
    );
    assert_eq!(
        upstream(&config, "api.b.p.example").as_deref(),
        Some("10.0.0.2:443")
    );
    assert_eq!(files.state("shoot--p--b.toml"), Some((false, 1)));
    // Its good version routes its own name; shoot--p--a keeps its.
    let b_good =
        "[[sni_route]]\nserver_names = [\"api.b.p.example\"]\nupstream = \"10.0.0.2:443\"\n";
    v.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &a),
        ("shoot--p--b.toml", b_good),
    ]);
    let config = loader.poll(&files, false).unwrap().expect("changed").config;
    assert_eq!(
        upstream(&config, "api.a.p.example").as_deref(),
        Some("10.0.0.1:443")
    );
    assert_eq!(
        upstream(&config, "api.b.p.example").as_deref(),
        Some("10.0.0.2:443")
    );
    assert_eq!(files.state("shoot--p--b.toml"), Some((true, 1)));
    // Each file's SNI routes count for its shoot.
    let shoot_of = |c: &RouterConfig, n: &str| {
        c.policy
            .sni_routes
            .get(&sni(n))
            .and_then(|t| t.shoot.clone())
    };
    assert_eq!(
        shoot_of(&config, "api.a.p.example").as_deref(),
        Some("shoot--p--a")
    );
    assert_eq!(
        shoot_of(&config, "api.b.p.example").as_deref(),
        Some("shoot--p--b")
    );
    // A file naming another shoot for its route is refused at that line; it keeps its last
    // good routes.
    let b_foreign = format!("{b_good}shoot = \"shoot--p--a\"\n");
    v.write(&[
        ("seed.toml", SEED),
        ("shoot--p--a.toml", &a),
        ("shoot--p--b.toml", &b_foreign),
    ]);
    if let Some(change) = loader.poll(&files, false).unwrap() {
        let c = &change.config;
        assert_eq!(
            shoot_of(c, "api.b.p.example").as_deref(),
            Some("shoot--p--b")
        );
        assert_eq!(
            upstream(c, "api.b.p.example").as_deref(),
            Some("10.0.0.2:443")
        );
    }
    assert_eq!(files.state("shoot--p--b.toml"), Some((false, 2)));
    let err = parse_shoot(
        Path::new("shoot--p--b.toml"),
        "shoot--p--b",
        b_foreign.as_bytes(),
    )
    .unwrap_err();
    assert!(
        matches!(err, DirError::ForeignShoot { line: Some(4), .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("config file shoot--p--b.toml, line 4: sni_route shoot"),
        "{err}"
    );
    // shoot--p--a's file gone: its name is free, and its CONNECT and SNI routes are gone.
    v.write(&[("seed.toml", SEED), ("shoot--p--b.toml", b_good)]);
    let config = loader.poll(&files, false).unwrap().expect("changed").config;
    assert_eq!(upstream(&config, "api.a.p.example"), None);
    assert_eq!(allow_of(&config, "shoot--p--a"), None);
}

#[test]
fn sni_ownership_depends_on_the_files_alone() {
    let a = format!(
        "{}[[sni_route]]\nserver_names = [\"api.a.p.example\"]\nupstream = \"10.0.0.1:443\"\n",
        shoot("shoot--p--a", "10.0.0.0/8")
    );
    let thief = "[[sni_route]]\nserver_names = [\"api.a.p.example\", \"api.x.a.example\"]\n\
                 upstream = \"10.6.6.6:443\"\n";
    let routes = |c: &RouterConfig| {
        let mut r: Vec<(String, String)> = c
            .policy
            .sni_routes
            .iter()
            .map(|(n, t)| (n.to_string(), t.upstream.clone()))
            .collect();
        r.sort();
        (r, allow_of(c, "shoot--p--a"))
    };
    let want = (
        vec![
            ("api.a.p.example".to_owned(), "10.0.0.1:443".to_owned()),
            ("api.x.a.example".to_owned(), "10.6.6.6:443".to_owned()),
        ],
        Some(rule("10.0.0.0/8")),
    );
    // The thief's file sorting before and after the rightful one; both in the first read,
    // and each arriving after the other.
    for thief_file in ["shoot--a--x.toml", "shoot--z--x.toml"] {
        let all = [
            ("seed.toml", SEED),
            ("shoot--p--a.toml", a.as_str()),
            (thief_file, thief),
        ];
        for first in [1, 2] {
            let files = ConfigFiles::default();
            let mut v = Volume::new();
            v.write(&[all[0], all[first]]);
            let (mut loader, _) = DirLoader::open(v.path(), &files).unwrap();
            v.write(&all);
            let late = loader.poll(&files, false).unwrap().expect("changed").config;
            assert_eq!(routes(&late), want, "{thief_file} after {first}");
            let (_, fresh) = DirLoader::open(v.path(), &ConfigFiles::default()).unwrap();
            assert_eq!(routes(&fresh), want, "{thief_file} at start");
            assert_eq!(files.state("shoot--p--a.toml"), Some((true, 0)));
            assert_eq!(files.state(thief_file).map(|s| s.0), Some(false));
        }
    }
}

#[test]
fn a_file_over_the_bound_is_refused_unread_and_keeps_its_last_good_routes() {
    let files = ConfigFiles::default();
    let mut v = Volume::new();
    let a = shoot("shoot--p--a", "192.0.2.0/24");
    v.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &a)]);
    let (mut loader, _) = DirLoader::open(v.path(), &files).unwrap();
    // The shoot's file grows past the bound (a comment padding it): refused with its size,
    // the last good routes stay.
    let big = format!(
        "{a}#{}\n",
        "x".repeat(usize::try_from(MAX_FILE_BYTES).unwrap())
    );
    v.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &big)]);
    let c = loader.poll(&files, false).unwrap().expect("changed").config;
    assert_eq!(allow_of(&c, "shoot--p--a"), Some(rule("192.0.2.0/24")));
    assert_eq!(files.state("shoot--p--a.toml"), Some((false, 1)));
    // Read again unchanged: not refused again.
    assert!(loader.poll(&files, true).unwrap().is_none());
    assert_eq!(files.state("shoot--p--a.toml"), Some((false, 1)));
    // Back under the bound: taken.
    v.write(&[("seed.toml", SEED), ("shoot--p--a.toml", &a)]);
    loader.poll(&files, false).unwrap().expect("changed");
    assert_eq!(files.state("shoot--p--a.toml"), Some((true, 1)));
    // A seed file over the bound: the router does not start, the error names file and size.
    let big_seed = format!(
        "{SEED}#{}\n",
        "x".repeat(usize::try_from(MAX_FILE_BYTES).unwrap())
    );
    v.write(&[("seed.toml", &big_seed)]);
    let err = DirLoader::open(v.path(), &ConfigFiles::default()).unwrap_err();
    let line = chain(&err);
    assert!(matches!(err, DirError::TooLarge { .. }), "{line}");
    assert!(
        line.contains("seed.toml") && line.contains(" bytes, more than "),
        "{line}"
    );
}

#[test]
fn a_refused_shoot_file_is_quoted_by_a_prefix() {
    let long = "x".repeat(500 << 10);
    for text in [
        format!("[[route]]\nvalue = {long}\n"),
        format!("[[route]]\nvalue = \"outbound|1194||vpn-seed-server.{long}.svc\"\nupstream = \"a:1\"\n"),
        format!("[[route]]\nvalue = \"{}\"\nupstream = \"{long}\"\n", vpn("shoot--p--a")),
        format!("[[sni_route]]\nserver_names = [\"{long}\"]\nupstream = \"a:1\"\n"),
    ] {
        let err = parse_shoot(Path::new("shoot--p--a.toml"), "shoot--p--a", text.as_bytes())
            .unwrap_err();
        let line = chain(&err);
        assert!(line.len() < 1024, "{} bytes: {}", line.len(), &line[..1024]);
    }
}
