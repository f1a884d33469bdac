//! The flood part's section of `docs/performance.md` ([`flood_section`]), written in a full run
//! or alone with `--only flood`.

use std::fmt::Write as _;

use crate::flood::{
    FloodResults, FloodSample, Target, FLOODED_LIMIT, FLOOD_BOGUS, FLOOD_IDLE, FLOOD_RATE,
    TINYPROXY_MAX_CLIENTS,
};
use crate::report::{spread_cell, write_failed_rounds, write_section_head, Machine};
use crate::Options;

/// The heading of the flood part's section; `--only flood` replaces the section under it.
pub const FLOOD_HEADING: &str =
    "## A client's tunnel under a flood of silent and bogus connections (issue 19)";

/// The flood part's section (starting with [`FLOOD_HEADING`]), with its own command, machine
/// and date so it stands alone when rewritten by itself.
pub fn flood_section(
    results: &FloodResults,
    opts: &Options,
    machine: &Machine,
    command: &str,
) -> String {
    let mut md = String::new();
    write_section_head(&mut md, FLOOD_HEADING, "flood", machine, command);
    let _ = writeln!(
        md,
        "The same namespaces as above, AES-256-GCM, tls-auth, both servers at their defaults \
         (`max-clients` 1024; ours also: at most 1024 connections not yet authenticated, the \
         oldest evicted first, 5 s for the first packet). Each setup runs twice per round, \
         every process started afresh each time: **unloaded**, the time from the client's \
         start (2 s after the server's) to the first echo reply through its tunnel (pings \
         every 2 ms from the seed, as above); **flooded**, the same while a flood from the \
         shoot holds {FLOOD_IDLE} silent and {FLOOD_BOGUS} bogus connections \
         against the server, or against the proxy in front of it (started first; the client \
         starts once every flood connection has connected once, and one second later). A \
         connection the other side closes is opened again at once, all together at most \
         {FLOOD_RATE} connects a second. Silent: connects, sends nothing (through a proxy, \
         every second one first sends a valid CONNECT with the routing header, so the server \
         behind it holds a silent connection too). Bogus: sends one frame, in turn a hard \
         reset with a random tls-auth HMAC, a well-framed packet of random bytes, a length no \
         packet has (0 or 65520); through a proxy every second one sends a head of random \
         bytes instead of a CONNECT, the others a valid CONNECT and then the bad-HMAC reset. \
         Both clients retry after 1 s (`connect-retry 1 5`, vpn2's). A client not up within \
         {limit} s counts as locked out. In front of upstream: tinyproxy with `MaxClients \
         {TINYPROXY_MAX_CLIENTS}` and its 600 s idle timeout (squid is not installed here; \
         Gardener's Istio gateway is not in the lab). {rounds} round(s); each cell is `median \
         (min–max)` over the rounds.\n",
        limit = FLOODED_LIMIT.as_secs(),
        rounds = opts.rounds,
    );
    let _ = writeln!(
        md,
        "| server (its own client) | unloaded, ms | flooded, ms | flooded ÷ unloaded, same \
         round | up under the flood | silent flood connections open at the client's start | \
         bogus connections: closed after, ms | flood connects / s while the client came up | \
         server VmRSS under the flood, MiB |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for target in Target::ALL {
        let Some(rounds) = results.of(target) else {
            continue;
        };
        let ok: Vec<&FloodSample> = rounds.iter().filter_map(|r| r.as_ref().ok()).collect();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let unloaded: Vec<f64> = ok.iter().map(|s| ms(s.unloaded)).collect();
        let flooded: Vec<f64> = ok.iter().filter_map(|s| s.flooded.map(ms)).collect();
        let up = ok.iter().filter(|s| s.flooded.is_some()).count();
        let ratios: Vec<f64> = ok
            .iter()
            .filter_map(|s| Some(ms(s.flooded?) / ms(s.unloaded).max(1e-9)))
            .collect();
        let ratio = match (up, ok.len()) {
            (0, _) => "–".to_owned(),
            (u, n) if u == n => spread_cell(&ratios, 2),
            _ => format!("{} (the rounds it came up)", spread_cell(&ratios, 2)),
        };
        let flooded_cell = if up == ok.len() {
            spread_cell(&flooded, 0)
        } else if up == 0 {
            format!("> {} s", FLOODED_LIMIT.as_secs())
        } else {
            format!(
                "{} (> {} s in the others)",
                spread_cell(&flooded, 0),
                FLOODED_LIMIT.as_secs()
            )
        };
        let idle: Vec<f64> = ok.iter().map(|s| s.at_start.idle_open as f64).collect();
        let close: Vec<f64> = ok.iter().filter_map(|s| s.at_end.bogus_close_ms).collect();
        let rate: Vec<f64> = ok
            .iter()
            .map(|s| {
                (s.at_end.connects.saturating_sub(s.at_start.connects)) as f64
                    / s.window.as_secs_f64().max(1e-9)
            })
            .collect();
        let rss: Vec<f64> = ok
            .iter()
            .map(|s| s.server_rss_kib as f64 / 1024.0)
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} of {} | {} | {} | {} | {} |",
            label(target),
            spread_cell(&unloaded, 0),
            flooded_cell,
            ratio,
            up,
            ok.len(),
            spread_cell(&idle, 0),
            spread_cell(&close, 1),
            spread_cell(&rate, 0),
            spread_cell(&rss, 1),
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Bogus connections closed after: the median time from a bogus connection's last byte \
         to the other side's close, over the whole flooded run (through a proxy: the proxy's \
         close, after the server's). Flood connects per second: every connect the flood made \
         between the client's start and its tunnel coming up (or the limit), over that time; a \
         server that closes bogus and silent connections early makes the flood reconnect \
         more. Server VmRSS: the server process's resident memory when the client started.\n"
    );
    write_failed_rounds(
        &mut md,
        results
            .samples
            .iter()
            .map(|(t, rounds)| (t.name(), rounds.as_slice())),
    );
    md
}

fn label(target: Target) -> &'static str {
    match target {
        Target::Ours => "ours (`vpn-server`, `vpn-client`), direct",
        Target::Upstream => "upstream `openvpn`, direct",
        Target::OursRouter => "ours through our `vpn-router`",
        Target::UpstreamTinyproxy => "upstream through tinyproxy",
    }
}
