//! The firewall and NAT rules in a pod's network namespace, as the kernel lists them
//! (`nft -j`), and the rule sets vpn2 installs (reference gardener-pods.md §2.1 steps 3 and
//! 6, §2.4 step 1), to compare them with.
//!
//! [`list`] asks for the chains (`nft -j list chains`), then for each chain's rules (`nft -j
//! list chain F T C`): Debian's nftables 1.0.6 cannot print a table with `flags owner` (ours)
//! in JSON, and `nft -j list ruleset` then ends in the middle of that table's object.
//!
//! Each rule is read back into one line of text ([`rule_text`]), close to `nft`'s own syntax
//! but regular: every meta and ct key is named (`meta iifname tun0`), sets are braced
//! (`ct state {established,related}`), counters are left out. vpn2 writes iptables rules into
//! the built-in chains; we write nf_tables chains of our own ([DEVIATIONS] V1), so a rule is
//! compared by where it runs (hook, chain type, priority: [`ChainKey`]) and what it says, not
//! by the table or chain name that holds it.
//!
//! [DEVIATIONS]: ../../../DEVIATIONS.md

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::netns::Netns;
use crate::LabError;

/// Where a chain runs: its hook, type and priority (`filter input 0`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainKey {
    /// Chain type: `filter`, `nat`, `route`.
    pub kind: String,
    /// Hook: `prerouting`, `input`, `forward`, `output`, `postrouting` (`-` for a regular
    /// chain).
    pub hook: String,
    /// Priority.
    pub prio: i64,
}

impl ChainKey {
    /// The key for `kind hook prio`.
    pub fn new(kind: &str, hook: &str, prio: i64) -> ChainKey {
        ChainKey {
            kind: kind.to_owned(),
            hook: hook.to_owned(),
            prio,
        }
    }
}

impl fmt::Display for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.kind, self.hook, self.prio)
    }
}

/// A chain as listed: where it is and runs, and its rules in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedChain {
    /// `inet`, `ip`, `ip6`, ...
    pub family: String,
    /// The table holding it.
    pub table: String,
    /// Its name.
    pub name: String,
    /// Where it runs.
    pub key: ChainKey,
    /// Its rules ([`rule_text`]), in order.
    pub rules: Vec<String>,
}

/// Everything `nft -j list ruleset` printed in one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// `family name` of every table.
    pub tables: Vec<String>,
    /// Every chain with its rules.
    pub chains: Vec<ListedChain>,
}

impl Ruleset {
    /// Every rule with where it runs.
    pub fn rules(&self) -> impl Iterator<Item = (&ChainKey, &str)> {
        self.chains
            .iter()
            .flat_map(|c| c.rules.iter().map(move |r| (&c.key, r.as_str())))
    }
}

impl fmt::Display for Ruleset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tables.is_empty() {
            return f.write_str("(no tables)\n");
        }
        for c in &self.chains {
            writeln!(f, "{} {} / {} ({}):", c.family, c.table, c.name, c.key)?;
            for r in &c.rules {
                writeln!(f, "    {r}")?;
            }
        }
        Ok(())
    }
}

/// Reads the namespace's whole rule set: the tables (`nft list tables`), every chain (`nft
/// -j list chains`) with its rules (`nft -j list chain`).
pub fn list(ns: &Netns) -> Result<Ruleset, LabError> {
    let nft = |args: &[&str]| -> Result<String, LabError> {
        let out = ns.run(std::iter::once("nft").chain(args.iter().copied()))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let bad = |what: String, why: String| LabError::Io {
        path: format!("{what} in {}", ns.name()).into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    let tables: Vec<String> = nft(&["list", "tables"])?
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(str::to_owned)
        .collect();
    let chains = parse(&nft(&["-j", "list", "chains"])?)
        .map_err(|why| bad("nft -j list chains".into(), why))?;
    let mut set = Ruleset {
        tables,
        chains: Vec::new(),
    };
    for c in chains.chains {
        let args = ["-j", "list", "chain", &c.family, &c.table, &c.name];
        let listed = parse(&nft(&args)?).map_err(|why| bad(args.join(" "), why))?;
        set.chains.extend(listed.chains);
    }
    Ok(set)
}

/// Parses `nft -j list …` output (tables, chains and rules, in any combination).
pub fn parse(json: &str) -> Result<Ruleset, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    let mut set = Ruleset::default();
    let s = |o: &Value, k: &str| o.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    for item in items {
        if let Some(t) = item.get("table") {
            set.tables
                .push(format!("{} {}", s(t, "family"), s(t, "name")));
        } else if let Some(c) = item.get("chain") {
            set.chains.push(ListedChain {
                family: s(c, "family"),
                table: s(c, "table"),
                name: s(c, "name"),
                key: ChainKey {
                    kind: c
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("-")
                        .to_owned(),
                    hook: c
                        .get("hook")
                        .and_then(Value::as_str)
                        .unwrap_or("-")
                        .to_owned(),
                    prio: c.get("prio").and_then(Value::as_i64).unwrap_or(0),
                },
                rules: Vec::new(),
            });
        } else if let Some(r) = item.get("rule") {
            let (family, table, chain) = (s(r, "family"), s(r, "table"), s(r, "chain"));
            let text = rule_text(r.get("expr").unwrap_or(&Value::Null));
            let holder = set
                .chains
                .iter_mut()
                .find(|c| c.family == family && c.table == table && c.name == chain)
                .ok_or_else(|| format!("rule in unlisted chain {family} {table} {chain}"))?;
            holder.rules.push(text);
        }
    }
    Ok(set)
}

/// One rule's expressions as one line (see the module docs).
pub fn rule_text(expr: &Value) -> String {
    let Some(list) = expr.as_array() else {
        return compact(expr);
    };
    list.iter()
        .filter_map(statement)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A statement: a match or an action; `None` for a counter.
fn statement(s: &Value) -> Option<String> {
    let Some((name, body)) = single(s) else {
        return Some(compact(s));
    };
    Some(match name {
        "counter" => return None,
        "match" => {
            let left = value(body.get("left").unwrap_or(&Value::Null));
            let right = value(body.get("right").unwrap_or(&Value::Null));
            match body.get("op").and_then(Value::as_str).unwrap_or("==") {
                "==" | "in" => format!("{left} {right}"),
                op => format!("{left} {op} {right}"),
            }
        }
        "accept" | "drop" | "masquerade" | "return" | "continue" if body.is_null() => {
            name.to_owned()
        }
        "reject" => match body.get("type").and_then(Value::as_str) {
            Some(t) => format!("reject with {t}"),
            None => "reject".to_owned(),
        },
        "dnat" | "snat" => {
            let addr = value(body.get("addr").unwrap_or(&Value::Null));
            // An `ip` or `ip6` table's NAT names no family: its address's.
            let family = match body.get("family").and_then(Value::as_str) {
                Some(f) => f,
                None if addr.contains(':') => "ip6",
                None => "ip",
            };
            let prefix = body
                .get("type_flags")
                .map(|f| compact(f).contains("prefix"))
                .unwrap_or(false);
            let mut t = format!("{name} {family}");
            if prefix {
                t.push_str(" prefix");
            }
            t.push_str(&format!(" to {addr}"));
            if let Some(port) = body.get("port") {
                t.push_str(&format!(":{}", value(port)));
            }
            t
        }
        "mangle" => format!(
            "{} set {}",
            value(body.get("key").unwrap_or(&Value::Null)),
            value(body.get("value").unwrap_or(&Value::Null))
        ),
        _ => compact(s),
    })
}

/// An expression's value.
fn value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(value).collect::<Vec<_>>().join(",")
        ),
        Value::Object(_) => {
            let Some((name, body)) = single(v) else {
                return compact(v);
            };
            let field = |k: &str| body.get(k).map(value).unwrap_or_default();
            match name {
                "meta" | "ct" | "rt" => format!("{name} {}", field("key")),
                "payload" => format!("{} {}", field("protocol"), field("field")),
                "prefix" => format!("{}/{}", field("addr"), field("len")),
                "tcp option" => format!("tcp option {} {}", field("name"), field("field")),
                "set" => value(body),
                "range" => match body.as_array().map(Vec::as_slice) {
                    Some([a, b]) => format!("{}-{}", value(a), value(b)),
                    _ => compact(v),
                },
                "&" | "|" | "^" | "<<" | ">>" => match body.as_array().map(Vec::as_slice) {
                    Some([a, b]) => format!("({} {name} {})", value(a), value(b)),
                    _ => compact(v),
                },
                _ => compact(v),
            }
        }
        other => compact(other),
    }
}

/// The only key of an object and its value.
fn single(v: &Value) -> Option<(&str, &Value)> {
    let o = v.as_object()?;
    if o.len() != 1 {
        return None;
    }
    o.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Rules expected at one place ([`ChainKey`]), in one chain or spread over several of that
/// key. With `ordered`, the rules that share a listed chain must keep this order there (a
/// drop after the accept it follows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Where they run.
    pub key: ChainKey,
    /// Whether their order matters.
    pub ordered: bool,
    /// The rules ([`rule_text`]).
    pub rules: Vec<String>,
}

impl Expected {
    /// Rules at `kind hook prio`.
    pub fn at(kind: &str, hook: &str, prio: i64, ordered: bool, rules: &[&str]) -> Expected {
        Expected {
            key: ChainKey::new(kind, hook, prio),
            ordered,
            rules: rules.iter().map(|r| (*r).to_owned()).collect(),
        }
    }
}

/// How a listed rule set differs from the expected one; empty when they agree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleDiff {
    /// Expected rules not in the kernel.
    pub missing: Vec<(ChainKey, String)>,
    /// Rules in the kernel more than once (how often).
    pub duplicated: Vec<(ChainKey, String, usize)>,
    /// Rules in the kernel nobody expected.
    pub unexpected: Vec<(ChainKey, String)>,
    /// Ordered rules listed in another order (the chain and its rules).
    pub misordered: Vec<(ChainKey, Vec<String>)>,
}

impl RuleDiff {
    /// Whether the kernel holds exactly the expected rules.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.misordered.is_empty()
    }
}

impl fmt::Display for RuleDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, r) in &self.missing {
            writeln!(f, "missing    [{k}] {r}")?;
        }
        for (k, r, n) in &self.duplicated {
            writeln!(f, "{n} copies   [{k}] {r}")?;
        }
        for (k, r) in &self.unexpected {
            writeln!(f, "unexpected [{k}] {r}")?;
        }
        for (k, rules) in &self.misordered {
            writeln!(f, "misordered [{k}] {rules:?}")?;
        }
        Ok(())
    }
}

/// Compares `listed` with `expected` (see [`RuleDiff`]).
pub fn compare(listed: &Ruleset, expected: &[Expected]) -> RuleDiff {
    let mut want: BTreeMap<(ChainKey, String), usize> = BTreeMap::new();
    for e in expected {
        for r in &e.rules {
            *want.entry((e.key.clone(), r.clone())).or_default() += 1;
        }
    }
    let mut have: BTreeMap<(ChainKey, String), usize> = BTreeMap::new();
    for (k, r) in listed.rules() {
        *have.entry((k.clone(), r.to_owned())).or_default() += 1;
    }
    let mut diff = RuleDiff::default();
    for ((k, r), n) in &have {
        match want.get(&(k.clone(), r.clone())) {
            None => diff.unexpected.push((k.clone(), r.clone())),
            Some(w) if n > w => diff.duplicated.push((k.clone(), r.clone(), *n)),
            Some(_) => {}
        }
    }
    for (k, r) in want.keys() {
        if !have.contains_key(&(k.clone(), r.clone())) {
            diff.missing.push((k.clone(), r.clone()));
        }
    }
    for e in expected.iter().filter(|e| e.ordered) {
        for c in listed.chains.iter().filter(|c| c.key == e.key) {
            let order: Vec<usize> = c
                .rules
                .iter()
                .filter_map(|r| e.rules.iter().position(|x| x == r))
                .collect();
            if order.windows(2).any(|w| w[0] > w[1]) {
                diff.misordered.push((c.key.clone(), c.rules.clone()));
            }
        }
    }
    diff
}

/// vpn2's packing of the landscape's IPv4 shoot networks into the reserved ranges (the
/// example of gardener-pods.md §2.1 step 3, which uses the same networks): pods into 244/8,
/// services into 243/8, nodes into 242/8, prefix lengths kept.
pub const LANDSCAPE_NETMAP: [(&str, &str); 3] = [
    ("100.96.0.0/11", "244.0.0.0/11"),
    ("100.64.0.0/13", "243.0.0.0/13"),
    ("10.250.0.0/16", "242.0.0.0/16"),
];

/// vpn2's seed-pod rules on `tun0` (gardener-pods.md §2.1): the Go start's `nat OUTPUT`
/// mapping of the proxy group's (31415) connections to the IPv4 shoot networks (`netmap`,
/// real → mapped), and the `firewall --mode up` hook's INPUT pair (replies only from the
/// tunnel, v4 and v6) and the seed pod network's 241/8 mapping both ways.
pub fn vpn2_seed(seed_pod: &str, netmap: &[(&str, &str)]) -> Vec<Expected> {
    vec![
        Expected::at(
            "filter",
            "input",
            0,
            true,
            &[
                "meta iifname tun0 ct state {established,related} accept",
                "meta iifname tun0 drop",
            ],
        ),
        Expected::at(
            "nat",
            "prerouting",
            -100,
            false,
            &[&format!(
                "meta iifname tun0 ip daddr 241.0.0.0/8 dnat ip prefix to {seed_pod}"
            )],
        ),
        Expected::at(
            "nat",
            "postrouting",
            100,
            false,
            &[&format!(
                "meta oifname tun0 ip saddr {seed_pod} snat ip prefix to 241.0.0.0/8"
            )],
        ),
        Expected {
            key: ChainKey::new("nat", "output", -100),
            ordered: false,
            rules: netmap
                .iter()
                .map(|(real, mapped)| {
                    format!("meta skgid 31415 ip daddr {real} dnat ip prefix to {mapped}")
                })
                .collect(),
        },
    ]
}

/// Our addition in the seed pod ([DEVIATIONS] V6): the INPUT pair on `tun0` also guards
/// what the pod forwards, so the shoot reaches no other seed address through it.
///
/// [DEVIATIONS]: ../../../DEVIATIONS.md
pub fn forward_guard() -> Expected {
    Expected::at(
        "filter",
        "forward",
        0,
        true,
        &[
            "meta iifname tun0 ct state {established,related} accept",
            "meta iifname tun0 drop",
        ],
    )
}

/// Our addition in the seed pod ([DEVIATIONS] V3): the proxy group's new TCP connections to
/// the seed pod network, loopback and link-local refused with a reset, after the mapping.
///
/// [DEVIATIONS]: ../../../DEVIATIONS.md
pub fn proxy_guard(seed_pod: &str) -> Expected {
    let guard = |dst: &str| {
        format!("meta skgid 31415 ct state new meta l4proto tcp {dst} reject with tcp reset")
    };
    Expected {
        key: ChainKey::new("filter", "output", 0),
        ordered: false,
        rules: [
            format!("ip daddr {seed_pod}"),
            "ip daddr 127.0.0.0/8".to_owned(),
            "ip daddr 169.254.0.0/16".to_owned(),
            "ip6 daddr ::1".to_owned(),
            "ip6 daddr fe80::/10".to_owned(),
        ]
        .iter()
        .map(|d| guard(d))
        .collect(),
    }
}

/// Our seed pod's start table (`vpn-server setup`, DEVIATIONS V9): a SYN to the sidecar's
/// port 9443 that no socket takes is dropped, not refused, until the server's first SIGTERM
/// removes the table. (Debian's nft 1.0.6 prints the socket match as JSON.)
pub fn seed_start() -> Expected {
    Expected::at(
        "filter",
        "input",
        0,
        true,
        &[
            r#"tcp dport 9443 (tcp flags & {syn,rst}) syn {"socket":{"key":"wildcard"}} != 2 accept"#,
            "tcp dport 9443 (tcp flags & {syn,rst}) syn drop",
        ],
    )
}

/// Our seed pod's tunnel-only rules ([DEVIATIONS] V8, table `vpn-seed-server-guard`), which
/// outlive the server: what leaves by anything but `tun0` toward the mapped ranges or the
/// landscape's IPv6 shoot networks, or from the proxy group in a connection it opens toward
/// its real IPv4 shoot networks, is dropped.
///
/// [DEVIATIONS]: ../../../DEVIATIONS.md
pub fn seed_guard() -> Expected {
    let mut rules = vec!["meta oifname tun0 accept".to_owned()];
    rules.extend(
        [
            "ip daddr 242.0.0.0/8",
            "ip6 daddr fd00:250::/48",
            "ip daddr 243.0.0.0/8",
            "ip6 daddr fd00:64::/112",
            "ip daddr 244.0.0.0/8",
            "ip6 daddr fd00:96::/48",
        ]
        .iter()
        .map(|d| format!("{d} drop")),
    );
    rules.extend(
        ["100.64.0.0/13", "100.96.0.0/11", "10.250.0.0/16"]
            .iter()
            .map(|d| format!("meta skgid 31415 ct state new ip daddr {d} drop")),
    );
    Expected {
        key: ChainKey::new("filter", "postrouting", 0),
        ordered: true,
        rules,
    }
}

/// vpn2's vpn-shoot rules on `tun0` (gardener-pods.md §2.4 step 1, a dual-stack shoot):
/// forwarding from the tunnel; each mapped IPv4 network back to the real one on the way in
/// and the real one to the mapped one on the way back into the tunnel (`netmap`, real →
/// mapped); the pod's address as the source of what leaves through `eth0`; TCP SYNs' MSS
/// clamped to the path MTU (iptables' mangle table: a filter chain at priority -150).
pub fn vpn2_shoot(netmap: &[(&str, &str)]) -> Vec<Expected> {
    let prerouting = netmap
        .iter()
        .map(|(real, mapped)| {
            format!("meta iifname tun0 ip daddr {mapped} dnat ip prefix to {real}")
        })
        .collect();
    let mut postrouting: Vec<String> = netmap
        .iter()
        .map(|(real, mapped)| {
            format!("meta oifname tun0 ip saddr {real} snat ip prefix to {mapped}")
        })
        .collect();
    postrouting.push("meta oifname eth0 masquerade".to_owned());
    vec![
        Expected::at("filter", "forward", 0, false, &["meta iifname tun0 accept"]),
        Expected {
            key: ChainKey::new("nat", "prerouting", -100),
            ordered: false,
            rules: prerouting,
        },
        Expected {
            key: ChainKey::new("nat", "postrouting", 100),
            ordered: false,
            rules: postrouting,
        },
        Expected::at(
            "filter",
            "postrouting",
            -150,
            false,
            &["(tcp flags & {syn,rst}) syn tcp option maxseg size set rt mtu"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `nft -j list ruleset` printed (nftables 1.0.6) for a table holding vpn2's seed
    /// rules with a counter added, trimmed to what the parser reads.
    const LISTED: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
 {"table": {"family": "inet", "name": "t", "handle": 1}},
 {"chain": {"family": "inet", "table": "t", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
 {"chain": {"family": "inet", "table": "t", "name": "clamp", "handle": 6, "type": "filter", "hook": "postrouting", "prio": -150, "policy": "accept"}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 7, "expr": [
   {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "tun0"}},
   {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}},
   {"counter": {"packets": 3, "bytes": 180}},
   {"accept": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 8, "expr": [
   {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "tun0"}},
   {"drop": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "clamp", "handle": 9, "expr": [
   {"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["syn", "rst"]]}, "right": "syn"}},
   {"mangle": {"key": {"tcp option": {"name": "maxseg", "field": "size"}}, "value": {"rt": {"key": "mtu"}}}}]}}
]}"#;

    #[test]
    fn rules_read_back_as_lines_and_compare_by_place() {
        let set = parse(LISTED).unwrap();
        assert_eq!(set.tables, ["inet t"]);
        let rules: Vec<String> = set.rules().map(|(k, r)| format!("[{k}] {r}")).collect();
        assert_eq!(
            rules,
            [
                "[filter input 0] meta iifname tun0 ct state {established,related} accept",
                "[filter input 0] meta iifname tun0 drop",
                "[filter postrouting -150] (tcp flags & {syn,rst}) syn tcp option maxseg size set rt mtu",
            ]
        );
        let input = &vpn2_seed("100.96.0.0/11", &[])[..1];
        let clamp = &vpn2_shoot(&[])[3..];
        let both = [input, clamp].concat();
        assert!(compare(&set, &both).is_empty(), "{}", compare(&set, &both));

        // A missing rule, a surplus one, a duplicate and a reversed pair are all named.
        let diff = compare(&set, input);
        assert_eq!(diff.unexpected.len(), 1, "{diff}");
        let mut doubled = set.clone();
        doubled.chains[0]
            .rules
            .push("meta iifname tun0 drop".into());
        let diff = compare(&doubled, &both);
        assert_eq!(diff.duplicated.len(), 1, "{diff}");
        let mut reversed = set.clone();
        reversed.chains[0].rules.reverse();
        let diff = compare(&reversed, &both);
        assert_eq!(diff.misordered.len(), 1, "{diff}");
        let diff = compare(&Ruleset::default(), &both);
        assert_eq!(diff.missing.len(), 3, "{diff}");
    }
}
