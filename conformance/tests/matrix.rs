//! The conformance matrix (issue 6), a `harness = false` test: our server and client against
//! upstream OpenVPN 2.6 and each other, upstream against upstream as the control. See
//! [`conformance::matrix`] for the cases' model; this file picks the cases, runs them a few
//! at a time, prints one line per case as it finishes (pair, options, scenario, result; on
//! failure the tail of both logs), compares the routing tables of the push cases, and exits
//! non-zero on any failure.
//!
//! Every option appears at least once with every pair (not the full cross product):
//!
//! | options                                               | scenario                 |
//! |-------------------------------------------------------|--------------------------|
//! | AES-256-GCM, tls-auth SHA256, direct (vpn2's setting) | traffic                  |
//! | the same through tinyproxy                            | traffic                  |
//! | the same through the proxy on vpn2's IPv6-only transfer network | traffic (ping -6, TCP over IPv6) |
//! | AES-128-GCM, tls-auth SHA512, proxy                   | traffic                  |
//! | CHACHA20-POLY1305, tls-crypt, direct                  | traffic                  |
//! | AES-256-CBC + SHA256, no wrapping, proxy              | traffic                  |
//! | AES-256-CBC + SHA1, tls-auth SHA1, direct             | traffic                  |
//! | lists differ (server's first shared one wins), tls-crypt, proxy | traffic        |
//! | AES-256-GCM, tls-crypt, proxy; AES-256-CBC + SHA256, tls-auth: ours without the TLS exporter | traffic, PRF keys |
//! | nothing in common                                     | both refuse, with a line |
//! | AES-256-GCM, tls-auth SHA256                          | renegotiation every 5 s for 60 s under a transfer, by the server; by the client |
//! | AES-256-GCM, tls-auth SHA256                          | keepalive expiry on a blackholed path, reconnect |
//! | AES-256-GCM, tls-crypt                                | server restart, reconnect |
//! | AES-256-GCM, tls-auth SHA256                          | push/pull: same routes for both clients (redirect-gateway ignored by the filters; and accepted; misaligned routes and names in the wrong case applied by neither) |
//! | AES-256-GCM, tls-auth SHA256                          | a pushed route over the path to the server: upstream's tunnel stops, ours refuses it (P9) |
//!
//! `MATRIX_FILTER=text` runs only the cases whose line contains `text`; `MATRIX_JOBS=N`
//! sets how many run at once (default 3: most of a case is waiting); `MATRIX_VERBOSE=1`
//! prints the logs' tails of passing cases too.

#![allow(clippy::print_stdout, clippy::print_stderr)] // printing the matrix is the point

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use conformance::matrix::lab::{SERVER_ADDR, SERVER_TUN};
use conformance::matrix::{
    self, Case, Control, Env, Impl, Options, Outcome, Pair, Scenario, Side, Transport,
};
use conformance::pki_fixture::TestPki;

const OURS_BIN: &str = env!("CARGO_BIN_EXE_matrix-peer");

fn cases() -> Vec<Case> {
    use Control::{None as NoWrap, TlsAuth, TlsCrypt};
    use Transport::{Direct, Proxy, Tinyproxy};
    let gcm = |control| Options::cipher("AES-256-GCM", "SHA256", control, Direct);
    // Long cases first, so they overlap with the many short ones.
    let mut per_pair: Vec<(Options, Scenario)> = vec![
        (
            gcm(TlsAuth),
            Scenario::Renegotiate {
                initiator: Side::Server,
            },
        ),
        (
            gcm(TlsAuth),
            Scenario::Renegotiate {
                initiator: Side::Client,
            },
        ),
        (gcm(TlsAuth), Scenario::KeepaliveExpiry),
        (gcm(TlsCrypt), Scenario::ServerRestart),
    ];
    let traffic = |expect| Scenario::Traffic { expect };
    per_pair.extend([
        (gcm(TlsAuth), traffic("AES-256-GCM")),
        (
            Options::cipher("AES-256-GCM", "SHA256", TlsAuth, Tinyproxy),
            traffic("AES-256-GCM"),
        ),
        // vpn2 as deployed: IPv6-only transfer network, through the proxy with the header.
        (
            Options::cipher("AES-256-GCM", "SHA256", TlsAuth, Proxy).ipv6_only(),
            traffic("AES-256-GCM"),
        ),
        (
            Options::cipher("AES-128-GCM", "SHA512", TlsAuth, Proxy),
            traffic("AES-128-GCM"),
        ),
        (
            Options::cipher("CHACHA20-POLY1305", "SHA256", TlsCrypt, Direct),
            traffic("CHACHA20-POLY1305"),
        ),
        (
            Options::cipher("AES-256-CBC", "SHA256", NoWrap, Proxy),
            traffic("AES-256-CBC"),
        ),
        (
            Options::cipher("AES-256-CBC", "SHA1", TlsAuth, Direct),
            traffic("AES-256-CBC"),
        ),
        (
            Options {
                server_ciphers: "AES-128-GCM:CHACHA20-POLY1305:AES-256-GCM",
                client_ciphers: "CHACHA20-POLY1305:AES-128-GCM",
                auth: "SHA256",
                control: TlsCrypt,
                transport: Proxy,
                ipv6_only: false,
                ekm: true,
            },
            traffic("AES-128-GCM"),
        ),
        // Upstream 2.6 always offers the TLS exporter; with ours not offering it, both sides
        // must fall back to the TLS 1.0 PRF (the control still runs with the exporter).
        (
            Options::cipher("AES-256-GCM", "SHA256", TlsCrypt, Proxy).prf(),
            traffic("AES-256-GCM"),
        ),
        (
            Options::cipher("AES-256-CBC", "SHA256", TlsAuth, Direct).prf(),
            traffic("AES-256-CBC"),
        ),
        (
            Options {
                server_ciphers: "AES-256-GCM:AES-128-GCM",
                client_ciphers: "CHACHA20-POLY1305",
                auth: "SHA256",
                control: TlsAuth,
                transport: Direct,
                ipv6_only: false,
                ekm: true,
            },
            Scenario::NoCommonCipher,
        ),
    ]);
    let mut cases = Vec::new();
    for (options, scenario) in per_pair {
        for pair in Pair::ALL {
            cases.push(Case {
                pair,
                options: options.clone(),
                scenario,
            });
        }
    }
    // Push/pull: each server with each client; the two clients' routes are compared.
    for scenario in [
        Scenario::Push { redirect: false },
        Scenario::Push { redirect: true },
        Scenario::PushOverPath,
    ] {
        for pair in Pair::ALL {
            cases.push(Case {
                pair,
                options: gcm(TlsAuth),
                scenario,
            });
        }
    }
    cases
}

fn main() -> ExitCode {
    conformance::require_lab(&["openvpn", "openssl", "ping"]);
    let started = Instant::now();
    let filter = std::env::var("MATRIX_FILTER").unwrap_or_default();
    let jobs: usize = std::env::var("MATRIX_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(3);
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.to_string().contains(&filter))
        .collect();
    let pki = TestPki::generate().expect("pki");
    let env = Env {
        pki: &pki,
        ours_bin: Path::new(OURS_BIN),
        verbose: std::env::var_os("MATRIX_VERBOSE").is_some(),
    };
    println!(
        "conformance matrix: {} cases, {jobs} at a time (upstream: {})",
        cases.len(),
        upstream_version()
    );
    let queue = Mutex::new(cases.iter().enumerate().collect::<VecDeque<_>>());
    let results: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let next = queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                let Some((i, case)) = next else { break };
                let outcome = matrix::run(&env, case);
                print_outcome(case, &outcome);
                results
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((i, outcome));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|(i, _)| *i);

    // Controls: a failure of upstream against upstream means the lab, not us.
    let broken: Vec<String> = results
        .iter()
        .filter(|(i, o)| cases[*i].pair.is_control() && o.result.is_err())
        .map(|(i, _)| cases[*i].key())
        .collect();
    let mut failed = 0;
    println!();
    for (i, o) in &results {
        if o.result.is_err() {
            failed += 1;
            let why = if broken.contains(&cases[*i].key()) && !cases[*i].pair.is_control() {
                " (lab broken: the control failed too)"
            } else {
                ""
            };
            println!("FAILED {}{why}", cases[*i]);
        }
    }
    failed += compare_push_routes(&cases, &results);
    failed += compare_push_replies(&cases, &results);
    println!(
        "\nconformance matrix: {} cases, {} failed, {:.0?} total",
        results.len(),
        failed,
        started.elapsed()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_outcome(case: &Case, o: &Outcome) {
    let mut text = match &o.result {
        Ok(summary) => format!("ok   {case} [{:.0?}] {summary}", o.elapsed),
        Err(why) => format!("FAIL {case} [{:.0?}] {why}", o.elapsed),
    };
    if let Some((server, client)) = &o.tails {
        let indent = |s: &str| {
            s.lines()
                .map(|l| format!("    | {l}\n"))
                .collect::<String>()
        };
        text.push_str(&format!(
            "\n  server log ({}):\n{}  client log ({}):\n{}",
            case.pair.server.name(),
            indent(server),
            case.pair.client.name(),
            indent(client)
        ));
    }
    println!("{text}");
}

/// For each server implementation and push case, the routes the upstream client and ours
/// installed from the same push under the same pull-filters must be the same, apart from the
/// differences DEVIATIONS.md lists (P6: routes through the tun device carry no gateway; P7:
/// `redirect-gateway` is never applied). Returns the number of mismatches.
fn compare_push_routes(cases: &[Case], results: &[(usize, Outcome)]) -> usize {
    let mut groups: BTreeMap<(String, &str), BTreeMap<&str, &Vec<String>>> = BTreeMap::new();
    for (i, o) in results {
        let case = &cases[*i];
        if matches!(case.scenario, Scenario::Push { .. }) && o.result.is_ok() {
            groups
                .entry((case.scenario.to_string(), case.pair.server.name()))
                .or_default()
                .insert(case.pair.client.name(), &o.routes);
        }
    }
    let mut mismatches = 0;
    for ((scenario, server), clients) in groups {
        let (Some(up), Some(ours)) = (
            clients.get(Impl::Upstream.name()),
            clients.get(Impl::Ours.name()),
        ) else {
            continue;
        };
        let expected: Vec<String> = up.iter().filter_map(|r| as_ours(r)).collect();
        if &expected == *ours {
            println!(
                "ok   {scenario} with {server} server: our client's routes = upstream's but for P6/P7: {ours:?}"
            );
        } else {
            mismatches += 1;
            println!(
                "FAIL {scenario} with {server} server: routes differ beyond P6/P7\n    upstream client: {up:?}\n    our client:      {ours:?}"
            );
        }
    }
    mismatches
}

/// Our server's `PUSH_REPLY` to an upstream client must be the text upstream's server sends
/// for the same options (the control case), byte for byte. Cases where ours runs without the
/// exporter are skipped (their reply lacks `tls-ekm` on purpose). Returns the mismatches.
fn compare_push_replies(cases: &[Case], results: &[(usize, Outcome)]) -> usize {
    let reply = |pair: Pair, key: &str| {
        results.iter().find_map(|(i, o)| {
            (cases[*i].pair == pair && cases[*i].key() == key)
                .then_some(o.push_reply.as_ref())
                .flatten()
        })
    };
    let ours_to_upstream = Pair {
        server: Impl::Ours,
        client: Impl::Upstream,
    };
    let (mut same, mut mismatches) = (0, 0);
    for case in cases
        .iter()
        .filter(|c| c.pair == ours_to_upstream && c.options.ekm)
    {
        let key = case.key();
        let (Some(ours), Some(upstream)) =
            (reply(ours_to_upstream, &key), reply(Pair::CONTROL, &key))
        else {
            continue;
        };
        if ours == upstream {
            same += 1;
        } else {
            mismatches += 1;
            println!("FAIL PUSH_REPLY differs for {key}\n    upstream server: {upstream}\n    our server:      {ours}");
        }
    }
    println!(
        "{} PUSH_REPLY of our server = upstream's, byte for byte, in {same} cases",
        if mismatches == 0 { "ok  " } else { "FAIL" }
    );
    mismatches
}

/// An upstream client's route as ours installs it: `via` the tunnel's gateway dropped (P6),
/// the routes of `redirect-gateway` and the one via `net_gateway` gone (P7).
fn as_ours(route: &str) -> Option<String> {
    let dst = route.split_whitespace().next().unwrap_or_default();
    let gateway = format!(" via {SERVER_TUN} dev tun0");
    if ["0.0.0.0/1", "128.0.0.0/1", "10.253.0.0/16"].contains(&dst) {
        return None;
    }
    // redirect-gateway's host route to the server through the old default gateway.
    if dst == SERVER_ADDR.to_string() {
        return None;
    }
    Some(route.replace(&gateway, " dev tun0"))
}

fn upstream_version() -> String {
    std::process::Command::new(conformance::upstream::referee())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "?".into())
}
