//! The Markdown of `docs/performance.md`: machine facts, the command, and tables of
//! min/median/max per case with the ratio to upstream↔upstream measured in the same round.

use std::fmt::Write as _;

use super::stats::Spread;
use super::{Case, Cipher, Impl, Options, Pair, ProxyKind, Results, Sample, Via, LOADS};

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
            openvpn: run("openvpn", &["--version"]),
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

/// The whole document.
pub fn markdown(results: &Results, opts: &Options, machine: &Machine, command: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Performance: ours vs upstream OpenVPN 2.6 (TCP)\n");
    let _ = writeln!(
        md,
        "Written by the benchmark (`conformance/src/bench`); do not edit by hand, rerun it.\n"
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

fn first_line(s: &str) -> &str {
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
    Some(super::stats::median(&mut ratios))
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
                    format!("{:.1}", super::stats::median(&mut v))
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
