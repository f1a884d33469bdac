//! How the Gardener replays report: a check's value or a panic naming what crossed or did
//! not, with the tail of every container's log; the traffic checks every replay runs; the
//! rules every replay expects. Shared by `tests/gardener_checks.rs` (our binaries and the
//! rolling-upgrade pairs) and `tests/gardener_nonha.rs` (the images).

use std::error::Error;
use std::path::Path;

use super::checks::{self, addresses, seed_probes, CheckError, Egress, Family, ECHO_BYTES};
use super::landscape::{Landscape, SEED_POD_NETWORK, VPN_SHOOT};
use super::rules::{self, forward_guard, proxy_guard, seed_guard, seed_start, vpn2_seed, Expected};

/// Log files a failure message shows the end of: `*.log`, `*.stdout`, `*.stderr`.
const LOG_EXTENSIONS: [&str; 3] = ["log", "stdout", "stderr"];
/// Lines of each log a failure message shows.
const TAIL: usize = 60;

/// An error with its causes, and the last lines of every log file in `logs`.
pub fn explain(e: &dyn Error, logs: &[&Path]) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        msg.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let mut names: Vec<_> = logs
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(dir)
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_else(|_| Vec::new())
        })
        .filter(|p| {
            p.extension()
                .is_some_and(|e| LOG_EXTENSIONS.iter().any(|x| e == *x))
        })
        .collect();
    names.sort();
    for path in names {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.is_empty() {
            continue;
        }
        let tail: Vec<&str> = text.lines().rev().take(TAIL).collect();
        msg.push_str(&format!("\n--- {} (last lines) ---\n", path.display()));
        for line in tail.iter().rev() {
            msg.push_str(line);
            msg.push('\n');
        }
    }
    msg
}

/// A check's value, or a panic naming what crossed or not, with the logs.
pub fn check<T: std::fmt::Debug>(name: &str, logs: &[&Path], r: Result<T, CheckError>) -> T {
    match r {
        Ok(v) => {
            eprintln!("ok   {name}: {v:?}");
            v
        }
        Err(e) => panic!("FAIL {name}: {}", explain(&e, logs)),
    }
}

/// A lab step that must work.
pub fn step<T, E: Error>(what: &str, logs: &[&Path], r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", explain(&e, logs)))
}

/// Every traffic check of [`checks`], both families where there are two: the kubelet and a
/// webhook reached from the kube-apiserver with the vpn-shoot pod's address as source and
/// every byte echoed, the gardenlet's tunnel check, the overlap, the MSS clamp, and silence
/// for every probe from the shoot toward the seed pod's tunnel addresses and `ports` (the
/// seed pod's listening ports).
pub fn traffic_checks(l: &Landscape, egress: &Egress, logs: &[&Path], ports: &[u16]) {
    for family in Family::BOTH {
        let c = check(
            &format!("kubelet {family:?}"),
            logs,
            checks::kubelet(l, egress, family),
        );
        assert_eq!(c.echoed, ECHO_BYTES);
        assert_eq!(c.source.ip(), family.pick(VPN_SHOOT));
        let c = check(
            &format!("webhook {family:?}"),
            logs,
            checks::webhook(l, egress, family),
        );
        assert_eq!(c.source.ip(), family.pick(VPN_SHOOT));
    }
    check(
        "gardenlet tunnel check",
        logs,
        checks::tunnel_check(l, egress),
    );
    let o = check("overlap", logs, checks::overlap(l, egress));
    assert_eq!(o.seed_pods.len(), 2);
    for family in Family::BOTH {
        check(
            &format!("MSS clamped {family:?}"),
            logs,
            checks::mss_clamped(l, egress, family),
        );
    }
    let tun = step("seed tun0 addresses", logs, addresses(&l.seed_pod, "tun0"));
    assert!(!tun.is_empty(), "the seed pod's tun0 has no address");
    let probes = seed_probes(&tun, ports);
    let s = check(
        "shoot cannot reach the seed",
        logs,
        checks::shoot_cannot_reach_seed(l, &probes),
    );
    assert_eq!(s.dropped.len(), probes.len());
}

/// The seed pod's and the vpn-shoot pod's rules are exactly `seed` and `shoot`.
pub fn rules_are(l: &Landscape, logs: &[&Path], when: &str, seed: &[Expected], shoot: &[Expected]) {
    check(
        &format!("seed pod rules {when}"),
        logs,
        checks::rules(&l.seed_pod, "seed", seed).map(|_| ()),
    );
    check(
        &format!("vpn-shoot pod rules {when}"),
        logs,
        checks::rules(&l.vpn_shoot, "vpn-shoot", shoot).map(|_| ()),
    );
}

/// Our seed pod's expected rules: vpn2's, plus the forwarding and proxy guards, plus the
/// tunnel-only rules ([`our_seed_rules_after_exit`]).
pub fn our_seed_rules() -> Vec<Expected> {
    let mut r = vpn2_seed(SEED_POD_NETWORK, &rules::LANDSCAPE_NETMAP);
    r.push(forward_guard());
    r.push(proxy_guard(SEED_POD_NETWORK));
    r.extend(our_seed_rules_after_exit());
    r
}

/// Our seed pod's rules at its first start: [`our_seed_rules`] and the start table its init
/// container left (`vpn-server setup`, DEVIATIONS V9), which the server's first SIGTERM
/// removes.
pub fn our_seed_rules_at_first_start() -> Vec<Expected> {
    let mut r = our_seed_rules();
    r.push(seed_start());
    r
}

/// What stays of our seed pod's rules when the server has ended: the tunnel-only rules
/// (DEVIATIONS V8), which nothing removes.
pub fn our_seed_rules_after_exit() -> Vec<Expected> {
    vec![seed_guard()]
}

/// What stays of our seed pod's rules after `kill -9` of the server: all of them (DEVIATIONS
/// V1: the mappings outlive a crash until the next start replaces them).
pub fn our_seed_rules_after_kill() -> Vec<Expected> {
    our_seed_rules()
}
