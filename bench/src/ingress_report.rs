//! The ingress part's section of `docs/performance.md` ([`ingress_section`]), written in a full
//! run or alone with `--only ingress`.

use std::fmt::Write as _;

use crate::ingress::{
    IngressResults, IngressSample, Proxy, CPU_RATE, FDS_PER_TUNNEL, IDLE_TUNNELS, OPEN_CONCURRENCY,
    P99_GOAL, RATES, SHOOTS, STEP, STORM, TUNNEL_TIMEOUT,
};
use crate::report::{spread_cell, write_failed_rounds, write_section_head, Machine};
use crate::stats::median;
use crate::Options;

/// The heading of the ingress part's section; `--only ingress` replaces the section under it.
pub const INGRESS_HEADING: &str =
    "## The seed ingress at seed scale: vpn-router vs squid for CONNECT (issue 21)";

/// The ingress part's section (starting with [`INGRESS_HEADING`]).
pub fn ingress_section(
    results: &IngressResults,
    opts: &Options,
    machine: &Machine,
    command: &str,
) -> String {
    let mut md = String::new();
    write_section_head(&mut md, INGRESS_HEADING, "ingress", machine, command);
    let _ = writeln!(
        md,
        "Two namespaces joined by a veth pair: the load generator in the shoot, the proxy and \
         {SHOOTS} upstream echo listeners (one per shoot) on the seed, each on one tokio \
         worker thread of the bench process. Equivalent routing: our router holds {SHOOTS} \
         exact routes (`X-Gardener-Destination` values, each to its shoot's upstream); squid \
         allows CONNECT to a `dstdomain` list of {SHOOTS} names, resolved from its \
         `hosts_file` to the same upstreams (`workers 1`, no cache, no access log). A tunnel \
         is ready when the proxy answered 200 and a byte sent through it came back from the \
         upstream; the **time to the first byte** runs from the TCP connect's start until then. \
         Per proxy, started afresh each round: **idle**, {idle} ready tunnels held at \
         once (opened {OPEN_CONCURRENCY} at a time){limited}, the proxy's VmRSS before (routes loaded, \
         no tunnel) and while they are held, and its descriptors; **rate**, new tunnels at \
         each rate of {RATES:?} a second for {step} s each (each closed with a reset once \
         ready), the p99 time to the first byte (a failed tunnel, or one slower than {timeout} \
         s, counts as {timeout} s), until a rate's p99 reaches {goal} ms or a tunnel fails, \
         and the proxy's CPU time (user + system, `/proc/PID/stat`) per tunnel at {CPU_RATE}/s; \
         **storm**, {STORM} tunnels started at the same moment, the time until all are ready. \
         The load generator shares the 2 CPUs with the proxy, so the rates are those of this \
         whole machine. {rounds} round(s); each cell is `median (min–max)` over the rounds.\n",
        idle = results.idle,
        limited = if results.idle < IDLE_TUNNELS {
            format!(
                " (the issue asks for {IDLE_TUNNELS}; this run's open-file limit of {} per \
                 process, which the container does not let even root raise, fits {} at \
                 {FDS_PER_TUNNEL} descriptors a tunnel both in the proxy (two sockets: our \
                 router lends its splice pipes only while bytes move) and in the bench process \
                 (the load generator's socket and the upstream's))",
                results.nofile, results.idle
            )
        } else {
            String::new()
        },
        step = STEP.as_secs(),
        timeout = TUNNEL_TIMEOUT.as_secs(),
        goal = P99_GOAL.as_millis(),
        rounds = opts.rounds,
    );
    write_tables(&mut md, results, &Proxy::ALL);
    md
}

/// The SNI part's section (starting with [`SNI_HEADING`]): the same figures as the ingress
/// part's, for our router's SNI listener against HAProxy.
pub fn sni_section(
    results: &IngressResults,
    opts: &Options,
    machine: &Machine,
    command: &str,
) -> String {
    let mut md = String::new();
    write_section_head(&mut md, SNI_HEADING, "sni", machine, command);
    let _ = writeln!(
        md,
        "The ingress part's lab, load and figures (above), for TLS SNI passthrough (the Istio \
         gateway's port 443 → 9443). Neither proxy terminates TLS, so a tunnel starts with one \
         ClientHello (TLS 1.3 shape, about 250 bytes, server name `api.s<i>.shoots.bench.example`) \
         and no handshake follows: a tunnel is ready when the whole ClientHello came back from \
         shoot *i*'s echo upstream; the time to the first byte runs from the TCP connect's start \
         until then. Equivalent routing: our router holds {SHOOTS} `[[sni_route]]` tables on a \
         `kind = \"sni\"` listener; HAProxy (TCP mode, `nbthread 2`, no logs) waits for the \
         hello (`tcp-request inspect-delay 10s`, accepted once `req.ssl_hello_type 1`) and picks \
         one of {SHOOTS} backends with `use_backend %[req.ssl_sni,lower,map(FILE)]`. Idle: {idle} \
         tunnels{limited}; rates {RATES:?} a second for {step} s each; storm of {STORM}. \
         {rounds} round(s); each cell is `median (min–max)` over the rounds.\n",
        idle = results.idle,
        limited = if results.idle < IDLE_TUNNELS {
            format!(
                " (the issue asks for {IDLE_TUNNELS}; the open-file limit of {} fits {} at \
                 {FDS_PER_TUNNEL} descriptors a tunnel in our router)",
                results.nofile, results.idle
            )
        } else {
            String::new()
        },
        step = STEP.as_secs(),
        rounds = opts.rounds,
    );
    write_tables(&mut md, results, &Proxy::SNI);
    md
}

/// The heading of the SNI part's section; `--only sni` replaces the section under it.
pub const SNI_HEADING: &str =
    "## The seed ingress at seed scale: vpn-router vs HAProxy for TLS SNI passthrough (issue 21)";

/// The figures table, the ratio line (ours ÷ theirs within a round) and the p99 table of
/// `proxies` (ours first).
fn write_tables(md: &mut String, results: &IngressResults, proxies: &[Proxy; 2]) {
    let _ = writeln!(
        md,
        "| proxy | VmRSS, {SHOOTS} routes, MiB | idle tunnels held (of {idle}) | VmRSS \
         with them, MiB | KiB per idle tunnel | descriptors | highest rate with p99 < {goal} ms, /s | CPU µs per tunnel at \
         {CPU_RATE}/s | storm: all {STORM} ready after, ms | storm: median, ms |",
        goal = P99_GOAL.as_millis(),
        idle = results.idle,
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for proxy in *proxies {
        let ok: Vec<&IngressSample> = results
            .of(proxy)
            .unwrap_or(&[])
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .collect();
        let col = |f: &dyn Fn(&IngressSample) -> Option<f64>| -> Vec<f64> {
            ok.iter().filter_map(|s| f(s)).collect()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            proxy.name(),
            spread_cell(&col(&|s| Some(s.base_rss_kib as f64 / 1024.0)), 1),
            spread_cell(&col(&|s| Some(s.held as f64)), 0),
            spread_cell(&col(&|s| Some(s.held_rss_kib as f64 / 1024.0)), 1),
            spread_cell(&col(&|s| Some(s.kib_per_tunnel())), 1),
            spread_cell(&col(&|s| Some(s.held_fds as f64)), 0),
            spread_cell(&col(&|s| s.highest_rate().map(f64::from)), 0),
            spread_cell(&col(&|s| s.cpu_us_per_tunnel()), 0),
            spread_cell(&col(&|s| Some(s.storm_all_ms)), 0),
            spread_cell(&col(&|s| Some(s.storm_p50_ms)), 1),
        );
    }
    // Ratios within each round.
    let [ours, theirs] = *proxies;
    let pairs: Vec<(&IngressSample, &IngressSample)> = results
        .of(ours)
        .unwrap_or(&[])
        .iter()
        .zip(results.of(theirs).unwrap_or(&[]))
        .filter_map(|(r, s)| Some((r.as_ref().ok()?, s.as_ref().ok()?)))
        .collect();
    if !pairs.is_empty() {
        let mut mem: Vec<f64> = pairs
            .iter()
            .map(|(r, s)| r.kib_per_tunnel() / s.kib_per_tunnel())
            .collect();
        let mut cpu: Vec<f64> = pairs
            .iter()
            .filter_map(|(r, s)| Some(r.cpu_us_per_tunnel()? / s.cpu_us_per_tunnel()?))
            .collect();
        let _ = writeln!(
            md,
            "\n{} ÷ {}, median of the ratios within a round: memory per idle tunnel \
             **{:.2}**, CPU per new tunnel **{}**.",
            ours.name(),
            theirs.name(),
            median(&mut mem),
            if cpu.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.2}", median(&mut cpu))
            }
        );
    }
    let _ = writeln!(
        md,
        "\nThe p99 time to the first byte at each rate, ms (blank: not reached; the sweep stops \
         after the first rate over the goal):\n"
    );
    let _ = write!(md, "| proxy |");
    for rate in RATES {
        let _ = write!(md, " {rate}/s |");
    }
    let _ = write!(md, "\n|---|");
    for _ in RATES {
        let _ = write!(md, "---:|");
    }
    md.push('\n');
    for proxy in *proxies {
        let _ = write!(md, "| {} |", proxy.name());
        for rate in RATES {
            let values: Vec<f64> = results
                .of(proxy)
                .unwrap_or(&[])
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .filter_map(|s| s.rates.iter().find(|x| x.rate == rate))
                .map(|x| x.p99_ms)
                .collect();
            let cell = if values.is_empty() {
                String::new()
            } else {
                spread_cell(&values, 2)
            };
            let _ = write!(md, " {cell} |");
        }
        md.push('\n');
    }
    md.push('\n');
    write_failed_rounds(
        md,
        proxies
            .iter()
            .filter_map(|p| Some((p.name(), results.of(*p)?))),
    );
}
