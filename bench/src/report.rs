//! The Markdown of `docs/performance.md`: machine facts, the command, and tables of
//! min/median/max per case with the ratio to upstream↔upstream measured in the same round;
//! the memory part's section ([`memory_section`]) and how it is put into an existing document
//! on its own ([`replace_section`]).

use std::fmt::Write as _;

use crate::memory::{self, LoadSample, MemoryResults, MemorySample, Setup};
use crate::stats::Spread;
use crate::{Case, Cipher, Impl, Options, Pair, ProxyKind, Results, Sample, Via, LOADS};

/// Facts about the machine the numbers come from.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `nproc`.
    pub cpus: usize,
    /// `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `uname -r`.
    pub kernel: String,
    /// First line of `openvpn --version`.
    pub openvpn: String,
    /// When the run finished (`date -u`).
    pub date: String,
}

impl Machine {
    /// Reads the facts of this machine.
    pub fn current() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let run = |prog: &str, args: &[&str]| {
            std::process::Command::new(prog)
                .args(args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_owned()
                })
                .unwrap_or_default()
        };
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            kernel: run("uname", &["-r"]),
            openvpn: run(&conformance::upstream::referee(), &["--version"]),
            date: run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        }
    }
}

/// Reads one measurement from a sample.
type Getter = Box<dyn Fn(&Sample) -> Option<f64>>;

/// One column of a table: a name and how to read it from a sample.
struct Metric {
    name: String,
    get: Getter,
    /// Digits after the point.
    digits: usize,
}

fn metric(
    name: impl Into<String>,
    digits: usize,
    get: impl Fn(&Sample) -> Option<f64> + 'static,
) -> Metric {
    Metric {
        name: name.into(),
        get: Box::new(get),
        digits,
    }
}

/// The document's title line.
pub const TITLE: &str = "# Performance: ours vs upstream OpenVPN 2.6 (TCP)";

/// The whole document (the matrix's part; the memory part's section is [`memory_section`]).
pub fn markdown(results: &Results, opts: &Options, machine: &Machine, command: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{TITLE}\n");
    let _ = writeln!(
        md,
        "Written by the benchmark (`bench/`); do not edit by hand, rerun it.\n"
    );
    let _ = writeln!(md, "Command (as root):\n\n```\n{command}\n```\n");
    let _ = writeln!(
        md,
        "Profiles, what changed in the data path and what bounds each figure: \
         [performance-notes.md](performance-notes.md).\n"
    );
    let _ = writeln!(
        md,
        "Machine: {} CPUs ({}), kernel {}, {}. Finished {}.\n",
        machine.cpus, machine.cpu_model, machine.kernel, machine.openvpn, machine.date
    );
    let _ = writeln!(
        md,
        "Topology: seed and shoot network namespaces joined by a veth pair; the VPN server on \
         the seed, the client in the shoot (directly or through the CONNECT proxy on the seed); \
         iperf3 server and a TCP echo server in the shoot on its tunnel address; every load \
         starts on the seed. {} round(s) over the matrix, iperf3 runs of {} s, {} pings at \
         10 ms, {} one-byte request/response exchanges. Each cell is `median (min–max)` over \
         the rounds; `×up` is the median over rounds of ours/upstream↔upstream with the same \
         cipher and transport, measured in the same round. → is seed to shoot, ← is \
         `iperf3 -R`.\n",
        opts.rounds,
        opts.duration.as_secs(),
        opts.pings,
        opts.exchanges
    );

    let mut throughput = Vec::new();
    for (i, load) in LOADS.into_iter().enumerate() {
        throughput.push(metric(format!("Mbit/s {}", load.label()), 0, move |s| {
            s.transfers.get(i).map(|t| t.mbit_s)
        }));
    }
    let _ = writeln!(md, "## Throughput (iperf3)\n");
    table(&mut md, results, &throughput);

    let mut cpu = Vec::new();
    for (i, load) in LOADS
        .into_iter()
        .enumerate()
        .filter(|(_, l)| l.streams == 1)
    {
        cpu.push(metric(format!("server {}", load.label()), 1, move |s| {
            s.transfers.get(i).map(|t| t.server_cpu_s_per_gb)
        }));
        cpu.push(metric(format!("client {}", load.label()), 1, move |s| {
            s.transfers.get(i).map(|t| t.client_cpu_s_per_gb)
        }));
        cpu.push(metric(format!("both {}", load.label()), 1, move |s| {
            s.transfers
                .get(i)
                .map(|t| t.server_cpu_s_per_gb + t.client_cpu_s_per_gb)
        }));
        cpu.push(metric(format!("proxy {}", load.label()), 1, move |s| {
            s.transfers.get(i).and_then(|t| t.proxy_cpu_s_per_gb)
        }));
    }
    let _ = writeln!(
        md,
        "## CPU seconds per GB moved (user + system, /proc/PID/stat)\n"
    );
    table(&mut md, results, &cpu);

    router_vs_squid(&mut md, results);

    let latency = vec![
        metric("tunnel up ms", 0, |s| Some(s.up.as_secs_f64() * 1e3)),
        metric("ping RTT ms", 3, |s| Some(s.ping_ms)),
        metric("req/resp µs", 0, |s| Some(s.rr_us)),
    ];
    let _ = writeln!(md, "## Latency\n");
    let _ = writeln!(
        md,
        "Tunnel up: client process start to the first echo reply through the tunnel (pings every \
         2 ms from the seed). Ping RTT: median of the echo replies (10 ms apart). \
         Request/response: median of one-byte exchanges over one TCP connection with \
         `TCP_NODELAY`.\n"
    );
    table(&mut md, results, &latency);

    let memory = vec![
        metric("server idle", 1, |s| Some(s.idle_rss_kib.0 as f64 / 1024.0)),
        metric("client idle", 1, |s| Some(s.idle_rss_kib.1 as f64 / 1024.0)),
        metric("server load", 1, |s| {
            s.transfers
                .iter()
                .map(|t| t.server_rss_kib)
                .max()
                .map(|k| k as f64 / 1024.0)
        }),
        metric("client load", 1, |s| {
            s.transfers
                .iter()
                .map(|t| t.client_rss_kib)
                .max()
                .map(|k| k as f64 / 1024.0)
        }),
    ];
    let _ = writeln!(md, "## Resident memory (VmRSS, MiB)\n");
    let _ = writeln!(
        md,
        "Idle: 0.5 s after the tunnel came up, one client connected. Load: the highest value \
         sampled every 100 ms during the iperf3 runs.\n"
    );
    table(&mut md, results, &memory);

    let failures: Vec<String> = results
        .samples
        .iter()
        .flat_map(|(case, rounds)| {
            rounds.iter().enumerate().filter_map(move |(r, s)| {
                s.as_ref()
                    .err()
                    .map(|e| format!("- round {} {case}: {}", r + 1, first_line(e)))
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(md, "## Failed cases\n");
        for f in failures {
            let _ = writeln!(md, "{f}");
        }
        let _ = writeln!(md);
    }
    md
}

/// The opening of a part's own section: its heading, the command that wrote it (`--only
/// {part}`), the machine, and how busy the machine was (other work moves the figures).
pub(crate) fn write_section_head(
    md: &mut String,
    heading: &str,
    part: &str,
    machine: &Machine,
    command: &str,
) {
    let _ = writeln!(md, "{heading}\n");
    let _ = writeln!(
        md,
        "Written by the benchmark's {part} part (in a full run, or alone with `--only {part}`); \
         command (as root):\n\n```\n{command}\n```\n"
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let _ = writeln!(
        md,
        "Machine: {} CPUs ({}), kernel {}, {}. Finished {}, load average {load} (1, 5, 15 \
         min, the bench's own processes included).\n",
        machine.cpus, machine.cpu_model, machine.kernel, machine.openvpn, machine.date
    );
}

/// A "Failed rounds" list under a section, one line per round that ended in an error (nothing
/// when every round succeeded): `(name, rounds)` per setup.
pub(crate) fn write_failed_rounds<'a, T: 'a>(
    md: &mut String,
    setups: impl Iterator<Item = (&'a str, &'a [Result<T, String>])>,
) {
    let mut failures = setups
        .flat_map(|(name, rounds)| {
            rounds.iter().enumerate().filter_map(move |(r, s)| {
                s.as_ref()
                    .err()
                    .map(|e| format!("- round {} {name}: {}", r + 1, first_line(e)))
            })
        })
        .peekable();
    if failures.peek().is_none() {
        return;
    }
    let _ = writeln!(md, "### Failed rounds\n");
    for f in failures {
        let _ = writeln!(md, "{f}");
    }
    let _ = writeln!(md);
}

pub(crate) fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// One table: a row per case, a cell per metric, and for cases that are not
/// upstream↔upstream the same-round ratio after each cell.
fn table(md: &mut String, results: &Results, metrics: &[Metric]) {
    let _ = write!(md, "| case |");
    for m in metrics {
        let _ = write!(md, " {} | ×up |", m.name);
    }
    let _ = writeln!(md);
    let _ = write!(md, "|---|");
    for _ in metrics {
        let _ = write!(md, "---:|---:|");
    }
    let _ = writeln!(md);
    for (case, rounds) in &results.samples {
        let _ = write!(
            md,
            "| {} {} {} |",
            case.pair.name(),
            case.cipher.label(),
            case.via.name()
        );
        for m in metrics {
            let values: Vec<f64> = rounds
                .iter()
                .filter_map(|r| r.as_ref().ok().and_then(|s| (m.get)(s)))
                .collect();
            let cell = match Spread::of(&values) {
                Some(s) if s.n > 1 => format!(
                    "{:.d$} ({:.d$}–{:.d$})",
                    s.median,
                    s.min,
                    s.max,
                    d = m.digits
                ),
                Some(s) => format!("{:.d$}", s.median, d = m.digits),
                None => "–".into(),
            };
            let ratio = ratio(results, *case, m).map_or_else(|| "".into(), |r| format!("{r:.2}"));
            let _ = write!(md, " {cell} | {ratio} |");
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md);
}

/// Median over rounds of `case`/baseline for `m`, for rounds where both succeeded.
fn ratio(results: &Results, case: Case, m: &Metric) -> Option<f64> {
    if case.pair.server == Impl::Upstream && case.pair.client == Impl::Upstream {
        return None;
    }
    ratio_between(results, case, case.baseline(), &*m.get)
}

/// Median over rounds of `a`/`b` for `get`, for rounds where both succeeded.
fn ratio_between(
    results: &Results,
    a: Case,
    b: Case,
    get: &dyn Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let xs = results.of(a)?;
    let ys = results.of(b)?;
    let mut ratios: Vec<f64> = xs
        .iter()
        .zip(ys)
        .filter_map(|(x, y)| {
            let x = get(x.as_ref().ok()?)?;
            let y = get(y.as_ref().ok()?)?;
            (y > 0.0).then_some(x / y)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    Some(crate::stats::median(&mut ratios))
}

/// The router goal of issue 8: ours↔ours through our router against upstream↔upstream
/// through squid, per cipher and load, as medians over rounds of same-round ratios.
fn router_vs_squid(md: &mut String, results: &Results) {
    let mut rows = Vec::new();
    for cipher in Cipher::ALL {
        let ours = Case {
            pair: Pair::new(Impl::Ours, Impl::Ours),
            cipher,
            via: Via::Proxy(ProxyKind::Router),
        };
        let base = Case {
            pair: Pair::new(Impl::Upstream, Impl::Upstream),
            cipher,
            via: Via::Proxy(ProxyKind::Squid),
        };
        if results.of(ours).is_none() || results.of(base).is_none() {
            continue;
        }
        for (i, load) in LOADS.into_iter().enumerate() {
            let mbit = move |s: &Sample| s.transfers.get(i).map(|t| t.mbit_s);
            let proxy_cpu = move |s: &Sample| s.transfers.get(i).and_then(|t| t.proxy_cpu_s_per_gb);
            let cell = |case: Case, get: &dyn Fn(&Sample) -> Option<f64>| {
                let mut v: Vec<f64> = results
                    .of(case)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|r| r.as_ref().ok().and_then(get))
                    .collect();
                if v.is_empty() {
                    "–".to_owned()
                } else {
                    format!("{:.1}", crate::stats::median(&mut v))
                }
            };
            let fmt = |r: Option<f64>| r.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"));
            let cpu_ratio = ratio_between(results, ours, base, &proxy_cpu);
            let verdict = match cpu_ratio {
                Some(r) if r <= 0.5 => "yes",
                Some(_) => "no",
                None => "–",
            };
            rows.push(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cipher.label(),
                load.label(),
                cell(ours, &mbit),
                cell(base, &mbit),
                fmt(ratio_between(results, ours, base, &mbit)),
                cell(ours, &proxy_cpu),
                cell(base, &proxy_cpu),
                fmt(cpu_ratio),
                verdict
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "## Our router vs squid (issue 8)\n");
    let _ = writeln!(
        md,
        "Ours↔ours through our ingress router (`vpn-router`, routing by the \
         `Reversed-VPN` header) against upstream↔upstream through squid. Throughput and the \
         proxy process's CPU seconds per GB are medians over rounds; the ratios are medians of \
         router/squid taken within each round. Goal: router CPU/GB at most half of squid's.\n"
    );
    let _ = writeln!(
        md,
        "| cipher | load | Mbit/s ours via router | Mbit/s upstream via squid | ×squid | \
         router CPU s/GB | squid CPU s/GB | router ÷ squid | ≤ 0.5 |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let _ = writeln!(md, "{r}");
    }
    let _ = writeln!(md);
}

/// The heading of the memory part's section; `--only memory` replaces the section under it
/// (up to the next `## ` heading) in an existing document.
pub const MEMORY_HEADING: &str = "## Memory of vpn-server with the CONNECT sidecar (issue 18)";

/// The memory **request** of Gardener's Envoy sidecar (`envoy-proxy`, 100Mi) in the
/// vpn-seed-server pod: a constant of the pod spec (`/work/shared/reference/gardener-pods.md`
/// §2.6), not a measurement; Envoy is not installed here.
pub const ENVOY_REQUEST_MIB: f64 = 100.0;

/// The memory request of Gardener's `vpn-seed-server` container (OpenVPN), `7.5M` = 7.5·10^6
/// bytes (gardener-pods.md §2.1), for scale.
pub const OPENVPN_REQUEST_BYTES: f64 = 7.5e6;

/// The memory part's section (starting with [`MEMORY_HEADING`]), with its own command,
/// machine and date so it stands alone when rewritten by itself.
pub fn memory_section(
    results: &MemoryResults,
    opts: &Options,
    machine: &Machine,
    command: &str,
) -> String {
    let mut md = String::new();
    write_section_head(&mut md, MEMORY_HEADING, "memory", machine, command);
    write_memory_method(&mut md, opts);
    write_memory_rss_table(&mut md, results, opts);
    write_memory_per_tunnel(&mut md, results, opts);
    write_memory_throughput_table(&mut md, results, opts);
    write_failed_rounds(
        &mut md,
        results
            .samples
            .iter()
            .map(|(s, rounds)| (s.name(), rounds.as_slice())),
    );
    md
}

/// What the memory part ran and when it sampled `VmRSS`.
fn write_memory_method(md: &mut String, opts: &Options) {
    let ks = opts
        .tunnels
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        md,
        "The seed's server process with one client connected directly, AES-256-GCM, the same \
         namespaces as above: upstream `openvpn` (server and client); our `vpn-server` alone \
         (with our `vpn-client`); our `vpn-server --sidecar` (the CONNECT sidecar in the \
         process: TLS on {addr} of the seed with a client certificate required, allowed \
         network {allow} (the VPN pool, which holds the client's tunnel address), denied \
         {deny}, metrics listener bound; with our `vpn-client`). The load is K concurrent TCP \
         streams from the seed to an echo server in the shoot on the client's tunnel address \
         (port {port}), each writing 16 KiB chunks for {secs} s while reading the echo back, \
         at most {windows} ahead of what came back (64 MiB in flight for all together, so the \
         drain after the writing stays short), then held open and idle, then closed. The \
         streams are opened 16 at a time. Through the sidecar each stream is an mTLS `CONNECT` tunnel (the \
         kube-apiserver's client certificate, checked against the CA) that the sidecar dials \
         through the VPN tunnel; without it the same streams go straight into the tunnel. K = \
         {ks}, run one after the other in one process lifetime per round. \
         {rounds} round(s); each cell is `median (min–max)` over the rounds.\n",
        addr = memory::SIDECAR_ADDR,
        allow = memory::SIDECAR_ALLOW,
        deny = memory::SIDECAR_DENY,
        port = memory::ECHO_LOAD_PORT,
        secs = opts.duration.as_secs(),
        rounds = opts.rounds,
        windows = opts
            .tunnels
            .iter()
            .map(|&k| format!("{} with K = {k}", size(crate::tunnels::window(k))))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = writeln!(
        md,
        "Idle: `VmRSS` 0.5 s after the tunnel came up and a first stream (with the sidecar: \
         a first `CONNECT`) echoed 1 KiB and closed. Peak: the highest `VmRSS` sampled every \
         100 ms from the start of a load until every stream got all its bytes back; end: the \
         last sample before the streams stop writing; held: the K streams then held open and \
         idle for 0.5 s (what open tunnels cost at rest); after: 1 s after they closed and \
         the server closed its sockets (its open descriptors back to the idle count). MiB = \
         1024 KiB of `/proc`.\n"
    );
}

/// The `VmRSS` of each setup at idle and at each phase of each load, the sidecar's share,
/// and Gardener's memory requests for scale.
fn write_memory_rss_table(md: &mut String, results: &MemoryResults, opts: &Options) {
    let _ = writeln!(
        md,
        "### Resident memory of the server process (VmRSS, MiB)\n"
    );
    let _ = write!(md, "| server process, one client | idle |");
    for (i, k) in opts.tunnels.iter().enumerate() {
        // A load repeated (e.g. `--tunnels 64,64`) shows whether memory keeps growing.
        let again = if opts.tunnels[..i].contains(k) {
            " again"
        } else {
            ""
        };
        let _ = write!(
            md,
            " {k}{again}: peak | {k}{again}: end | {k}{again}: held | after {k}{again} |"
        );
    }
    let _ = writeln!(md);
    let _ = write!(md, "|---|---:|");
    for _ in &opts.tunnels {
        let _ = write!(md, "---:|---:|---:|---:|");
    }
    let _ = writeln!(md);
    let phases = |s: &MemorySample| rss_phases_mib(s, opts.tunnels.len());
    let columns = 1 + 4 * opts.tunnels.len();
    for setup in Setup::ALL {
        let Some(rounds) = results.of(setup) else {
            continue;
        };
        let _ = write!(md, "| {} |", setup_label(setup));
        for c in 0..columns {
            let values: Vec<f64> = rounds
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .filter_map(|s| phases(s).get(c).copied().flatten())
                .collect();
            let _ = write!(md, " {} |", spread_cell(&values, 1));
        }
        let _ = writeln!(md);
    }
    // The sidecar's share: with it minus without it, within each round.
    if let (Some(with), Some(alone)) = (results.of(Setup::OursSidecar), results.of(Setup::Ours)) {
        let _ = write!(
            md,
            "| the sidecar's share: `--sidecar` minus alone, same round |"
        );
        for c in 0..columns {
            let values: Vec<f64> = with
                .iter()
                .zip(alone)
                .filter_map(|(w, a)| {
                    let w = phases(w.as_ref().ok()?).get(c).copied().flatten()?;
                    let a = phases(a.as_ref().ok()?).get(c).copied().flatten()?;
                    Some(w - a)
                })
                .collect();
            let _ = write!(md, " {} |", spread_cell(&values, 1));
        }
        let _ = writeln!(md);
    }
    let empty = " |".repeat(columns - 1);
    let _ = writeln!(
        md,
        "| Envoy sidecar in Gardener's pod: its memory **request** (`100Mi`), not a \
         measurement | {ENVOY_REQUEST_MIB:.1} |{empty}"
    );
    let _ = writeln!(
        md,
        "| Gardener's `vpn-seed-server` (OpenVPN) container: its memory **request** (`7.5M`), \
         not a measurement | {:.1} |{empty}\n",
        OPENVPN_REQUEST_BYTES / 1024.0 / 1024.0
    );
}

/// The cost of one more tunnel, held idle and at the peak, between the smallest and the
/// largest load (nothing with one load size).
fn write_memory_per_tunnel(md: &mut String, results: &MemoryResults, opts: &Options) {
    let smallest = (0..opts.tunnels.len()).min_by_key(|&i| opts.tunnels[i]);
    let largest = (0..opts.tunnels.len()).max_by_key(|&i| (opts.tunnels[i], usize::MAX - i));
    if let (Some(i), Some(j)) = (smallest, largest) {
        let (small, large) = (opts.tunnels[i], opts.tunnels[j]);
        if large > small {
            let per = |get: &dyn Fn(&LoadSample) -> u64| {
                Setup::ALL
                    .into_iter()
                    .filter_map(|setup| {
                        let values: Vec<f64> = results
                            .of(setup)?
                            .iter()
                            .filter_map(|r| {
                                let s = r.as_ref().ok()?;
                                let a = get(s.loads.get(i)?);
                                let b = get(s.loads.get(j)?);
                                (a > 0 && b > 0)
                                    .then(|| (b as f64 - a as f64) / (large - small) as f64)
                            })
                            .collect();
                        Some(format!("{} {}", setup.name(), spread_cell(&values, 0)))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let _ = writeln!(
                md,
                "Per tunnel, KiB: ({large} − {small} tunnels) / {}, within each round. Held open \
                 and idle: {}. At the peak under load: {}.\n",
                large - small,
                per(&|l| l.held_kib),
                per(&|l| l.peak_kib),
            );
        }
    }
}

/// MB/s and the server's CPU seconds per GB under each load, each against our server alone.
fn write_memory_throughput_table(md: &mut String, results: &MemoryResults, opts: &Options) {
    let _ = writeln!(md, "### Under load: throughput and CPU\n");
    let _ = writeln!(
        md,
        "MB/s (10^6 bytes) each way: the bytes echoed back over the load's whole time (opening \
         the streams to the last byte back). CPU: user + system seconds of the server process \
         (`/proc/PID/stat`, all threads: the sidecar's TLS and relay too) per GB moved, both \
         directions counted (an echoed byte counts twice). `×ours` is the median over rounds \
         of the ratio to our server alone with the same streams, same round. The load \
         generator, the echo server, the client and the server share the machine's CPUs.\n"
    );
    let _ = writeln!(
        md,
        "| server process | streams | MB/s each way | ×ours | server CPU s/GB | ×ours |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for setup in Setup::ALL {
        let Some(rounds) = results.of(setup) else {
            continue;
        };
        for (i, &k) in opts.tunnels.iter().enumerate() {
            let mb_s = move |s: &MemorySample| s.loads.get(i).map(LoadSample::mb_s);
            let cpu = move |s: &MemorySample| s.loads.get(i).map(|l| l.cpu_s_per_gb);
            let cell = |get: &dyn Fn(&MemorySample) -> Option<f64>, digits| {
                let values: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| r.as_ref().ok().and_then(get))
                    .collect();
                spread_cell(&values, digits)
            };
            let vs_ours = |get: &dyn Fn(&MemorySample) -> Option<f64>| {
                if setup == Setup::Ours {
                    return String::new();
                }
                let Some(base) = results.of(Setup::Ours) else {
                    return String::new();
                };
                let mut ratios: Vec<f64> = rounds
                    .iter()
                    .zip(base)
                    .filter_map(|(x, y)| {
                        let x = get(x.as_ref().ok()?)?;
                        let y = get(y.as_ref().ok()?)?;
                        (y > 0.0).then_some(x / y)
                    })
                    .collect();
                if ratios.is_empty() {
                    return String::new();
                }
                format!("{:.2}", crate::stats::median(&mut ratios))
            };
            let _ = writeln!(
                md,
                "| {} | {k} | {} | {} | {} | {} |",
                setup_label(setup),
                cell(&mb_s, 0),
                vs_ours(&mb_s),
                cell(&cpu, 1),
                vs_ours(&cpu)
            );
        }
    }
    let _ = writeln!(md);
}

/// The memory table's columns of `sample` in MiB: idle, then peak, end, held (none when not
/// sampled) and after for each of `loads` loads.
fn rss_phases_mib(sample: &MemorySample, loads: usize) -> Vec<Option<f64>> {
    let mut v = vec![Some(sample.idle_kib as f64)];
    for i in 0..loads {
        let l = sample.loads.get(i);
        v.push(l.map(|l| l.peak_kib as f64));
        v.push(l.map(|l| l.end_kib as f64));
        v.push(l.map(|l| l.held_kib as f64).filter(|k| *k > 0.0));
        v.push(l.map(|l| l.after_kib as f64));
    }
    v.into_iter().map(|x| x.map(|k| k / 1024.0)).collect()
}

fn setup_label(setup: Setup) -> &'static str {
    match setup {
        Setup::Upstream => "upstream `openvpn`, streams through the tunnel",
        Setup::Ours => "ours, `vpn-server` alone, streams through the tunnel",
        Setup::OursSidecar => "ours, `vpn-server --sidecar`, streams through the sidecar",
    }
}

/// `median (min–max)`, the median alone for one value, `–` for none.
pub(crate) fn spread_cell(values: &[f64], digits: usize) -> String {
    match Spread::of(values) {
        Some(s) if s.n > 1 => format!(
            "{} ({}–{})",
            num(s.median, digits),
            num(s.min, digits),
            num(s.max, digits)
        ),
        Some(s) => num(s.median, digits),
        None => "–".into(),
    }
}

/// `x` with `digits` after the point, a negative value with a minus sign (U+2212, so a range
/// of negatives reads `(−0.4–−0.1)`), no sign on a value that rounds to zero.
fn num(x: f64, digits: usize) -> String {
    let text = format!("{x:.digits$}");
    match text.strip_prefix('-') {
        Some(abs) if abs.chars().all(|c| c == '0' || c == '.') => abs.to_owned(),
        Some(abs) => format!("\u{2212}{abs}"),
        None => text,
    }
}

/// Bytes as `N MiB` or `N KiB`.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The section of `doc` that starts with the line `heading`, up to the next `## ` heading
/// (or the end).
pub fn find_section<'d>(doc: &'d str, heading: &str) -> Option<&'d str> {
    let (start, end) = section_bounds(doc, heading)?;
    doc.get(start..end)
}

/// `doc` with the section under `heading` replaced by `section` (which starts with the
/// heading), or with `section` appended when there is none.
pub fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    match section_bounds(doc, heading) {
        Some((start, end)) => {
            let mut out = String::with_capacity(doc.len() + section.len());
            out.push_str(&doc[..start]);
            out.push_str(section);
            out.push_str(&doc[end..]);
            out
        }
        None => {
            let mut out = doc.trim_end().to_owned();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(section);
            out
        }
    }
}

/// Byte range of the section under `heading`: from its line to the next line starting with
/// `## ` (or the end).
fn section_bounds(doc: &str, heading: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    let mut start = None;
    for line in doc.split_inclusive('\n') {
        let text = line.trim_end_matches(['\n', '\r']);
        match start {
            None if text == heading => start = Some(offset),
            Some(s) if text.starts_with("## ") => return Some((s, offset)),
            _ => {}
        }
        offset += line.len();
    }
    start.map(|s| (s, doc.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_replaced_in_place_or_appended() {
        let doc = "# T\n\n## A\n\na\n\n## M\n\nold\n### sub\n\n## B\n\nb\n";
        let new = "## M\n\nnew\n\n";
        assert_eq!(
            replace_section(doc, "## M", new),
            "# T\n\n## A\n\na\n\n## M\n\nnew\n\n## B\n\nb\n"
        );
        assert_eq!(find_section(doc, "## M"), Some("## M\n\nold\n### sub\n\n"));
        assert_eq!(
            replace_section("# T\n\n## A\n\na\n", "## M", new),
            "# T\n\n## A\n\na\n\n## M\n\nnew\n\n"
        );
        assert_eq!(
            replace_section("# T\n\n## M\n\nold\n", "## M", new),
            "# T\n\n## M\n\nnew\n\n"
        );
        assert_eq!(find_section(doc, "## Z"), None);
    }
}
