//! The benchmark against upstream OpenVPN: `cargo run --release -p bench --bin bench`, as
//! root. See the `bench` library. Builds our `vpn-server` and `vpn-client` in release
//! mode first (through the `cargo` that runs it), prints a line per case as it finishes, and
//! writes the tables to `docs/performance.md` (or `--out`).
//!
//! A quick run: `--rounds 1 --duration 2 --pairs upstream-upstream,ours-ours --ciphers gcm
//! --via direct`.
//!
//! The memory part (issue 18: the server's memory with the CONNECT sidecar in the process,
//! idle and under K concurrent tunnels) runs after the matrix; `--only memory` runs it alone
//! (a few minutes) and rewrites only its section of the document, `--only matrix` runs the
//! matrix and keeps the memory section already in the document.
//!
//! The ingress part (issue 21: our `vpn-router` against squid with 1,000 shoots' routes: idle
//! tunnels, the rate of new tunnels, a reconnect storm) needs `squid`; `--only ingress --rounds
//! 1` runs it alone in about two minutes. The SNI part (the same figures for TLS SNI
//! passthrough: our router's `kind = "sni"` listener against HAProxy) needs `haproxy`;
//! `--only sni --rounds 1` runs it alone.
//!
//! The Kubernetes part (issue 31: `vpn-router --kubernetes` against the API stand-in with 500
//! shoots' objects: first sync, memory, change to policy) needs only `ip`; `--only kube`
//! runs it alone in under a minute.

#![allow(clippy::print_stdout)] // Printing progress and the tables is what this program is for.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bench::flood_report::{self, FLOOD_HEADING};
use bench::ingress_report::{self, INGRESS_HEADING, SNI_HEADING};
use bench::kube::KUBE_HEADING;
use bench::report::{self, MEMORY_HEADING};
use bench::{Case, Cipher, Options, Pair, ProxyKind, Via};
use clap::Parser;

/// Our VPN against upstream OpenVPN 2.6 in a namespace lab.
#[derive(Debug, Parser)]
#[command(about)]
struct Cli {
    /// Rounds over the whole matrix (latency differs more between two runs of the same case
    /// than between the two VPNs; five rounds give a median ratio that holds still).
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 5)]
    rounds: u32,
    /// Seconds per iperf3 run.
    #[arg(long, env = "BENCH_DURATION", default_value_t = 4)]
    duration: u64,
    /// Pairs (server-client): upstream-upstream, ours-ours, ours-upstream, upstream-ours.
    #[arg(
        long,
        env = "BENCH_PAIRS",
        value_delimiter = ',',
        default_value = "upstream-upstream,ours-ours,ours-upstream,upstream-ours"
    )]
    pairs: Vec<String>,
    /// Ciphers: gcm, cbc.
    #[arg(
        long,
        env = "BENCH_CIPHERS",
        value_delimiter = ',',
        default_value = "gcm,cbc"
    )]
    ciphers: Vec<String>,
    /// Transports: direct, tinyproxy (alias proxy), squid, router (our `vpn-router`).
    #[arg(
        long,
        env = "BENCH_VIA",
        value_delimiter = ',',
        default_value = "direct,tinyproxy,squid,router"
    )]
    via: Vec<String>,
    /// Echo requests for the RTT.
    #[arg(long, env = "BENCH_PINGS", default_value_t = 300)]
    pings: u32,
    /// One-byte request/response exchanges.
    #[arg(long, env = "BENCH_EXCHANGES", default_value_t = 3000)]
    exchanges: usize,
    /// Where to write the Markdown.
    #[arg(long, env = "BENCH_OUT", default_value = "docs/performance.md")]
    out: PathBuf,
    /// Do not build our binaries first; take them from beside this program.
    #[arg(long)]
    no_build: bool,
    /// Keep `/proc/PID/smaps` of both VPN processes at each idle sample in this directory
    /// (and of the server at each sample of the memory part).
    #[arg(long, env = "BENCH_SMAPS_DIR")]
    smaps_dir: Option<PathBuf>,
    /// Run one part only: `matrix` (keeps the other sections already in `--out`), `memory`,
    /// `flood`, `ingress`, `sni` or `kube` (each rewrites only its section of `--out`). All by
    /// default.
    #[arg(long, env = "BENCH_ONLY", value_enum)]
    only: Option<Part>,
    /// The memory part's loads: concurrent tunnels (streams) of each, in this order.
    #[arg(
        long,
        env = "BENCH_TUNNELS",
        value_delimiter = ',',
        default_value = "1,64",
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    tunnels: Vec<u16>,
}

/// The parts of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// The matrix of pairs × ciphers × transports.
    Matrix,
    /// The server's memory with and without the sidecar (issue 18).
    Memory,
    /// A client's tunnel under a flood of silent and bogus connections (issue 19).
    Flood,
    /// The seed ingress at seed scale: our router against squid (issue 21).
    Ingress,
    /// TLS SNI passthrough at seed scale: our router's SNI listener against HAProxy.
    Sni,
    /// `vpn-router --kubernetes` with 500 shoots' objects (issue 31).
    Kube,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Which parts run: the one `--only` names, or all.
#[derive(Debug, Clone, Copy)]
struct Parts {
    matrix: bool,
    memory: bool,
    flood: bool,
    ingress: bool,
    sni: bool,
    kube: bool,
}

impl Parts {
    fn of(only: Option<Part>) -> Parts {
        let runs = |part: Part| only.is_none_or(|only| only == part);
        Parts {
            matrix: runs(Part::Matrix),
            memory: runs(Part::Memory),
            flood: runs(Part::Flood),
            ingress: runs(Part::Ingress),
            sni: runs(Part::Sni),
            kube: runs(Part::Kube),
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let cases = matrix_cases(&cli)?;
    let parts = Parts::of(cli.only);
    conformance::check_lab(&required_tools(parts, &cases))
        .context("the bench needs root, /dev/net/tun and its tools")?;
    let ours = our_binaries(cli.no_build, parts)?;
    let opts = Options {
        cases,
        rounds: cli.rounds,
        duration: Duration::from_secs(cli.duration.max(1)),
        ours,
        pings: cli.pings,
        exchanges: cli.exchanges,
        smaps_dir: cli.smaps_dir,
        tunnels: cli.tunnels.iter().map(|&k| usize::from(k)).collect(),
        stop: stop_on_signals()?,
    };
    let command = format!(
        "cargo run --release -p bench --bin bench -- {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let command = command.trim_end();
    // The document as it is, for the section a part that does not run keeps.
    let old = std::fs::read_to_string(&cli.out).unwrap_or_default();
    // The document: the matrix's part anew, or the one already there; then each other part's
    // section replaced when it ran, or kept from the old document.
    let md = if parts.matrix {
        matrix_document(&opts, command)?
    } else if old.is_empty() {
        format!("{}\n\n", report::TITLE)
    } else {
        old.clone()
    };
    let sections = vec![
        (
            MEMORY_HEADING,
            parts
                .memory
                .then(|| memory_part(&opts, command))
                .transpose()?,
        ),
        (
            FLOOD_HEADING,
            parts
                .flood
                .then(|| flood_part(&opts, command))
                .transpose()?,
        ),
        (
            INGRESS_HEADING,
            parts
                .ingress
                .then(|| ingress_part(&opts, command))
                .transpose()?,
        ),
        (
            SNI_HEADING,
            parts.sni.then(|| sni_part(&opts, command)).transpose()?,
        ),
        (
            KUBE_HEADING,
            parts.kube.then(|| kube_part(&opts, command)).transpose()?,
        ),
    ];
    let md = merge_sections(md, &old, sections, parts.matrix);
    if let Some(dir) = cli.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&cli.out, &md).with_context(|| format!("writing {}", cli.out.display()))?;
    println!();
    println!("{md}");
    println!("written to {}", cli.out.display());
    Ok(())
}

/// The matrix's cases from `--ciphers`, `--via` and `--pairs`, in the order they run within a
/// round.
fn matrix_cases(cli: &Cli) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for cipher in &cli.ciphers {
        let Some(cipher) = Cipher::parse(cipher) else {
            bail!("unknown cipher {cipher:?}");
        };
        for via in &cli.via {
            let Some(via) = Via::parse(via) else {
                bail!("unknown transport {via:?}");
            };
            for pair in &cli.pairs {
                let Some(pair) = Pair::parse(pair) else {
                    bail!("unknown pair {pair:?}");
                };
                cases.push(Case { pair, cipher, via });
            }
        }
    }
    Ok(cases)
}

/// The programs the parts that run need; of the proxies, only those some case goes through.
fn required_tools(parts: Parts, cases: &[Case]) -> Vec<&'static str> {
    let mut tools = vec!["openvpn", "ping", "ip"];
    if parts.flood {
        tools.extend(["tinyproxy", "ss"]);
    }
    if parts.ingress {
        tools.extend(["squid", "sysctl"]);
    }
    if parts.sni {
        tools.extend(["haproxy", "sysctl"]);
    }
    if parts.matrix {
        tools.extend(["iperf3", "ss"]);
        for (kind, tool) in [
            (ProxyKind::Tinyproxy, "tinyproxy"),
            (ProxyKind::Squid, "squid"),
        ] {
            if cases.iter().any(|c| c.via == Via::Proxy(kind)) {
                tools.push(tool);
            }
        }
    }
    tools
}

/// The directory of our `vpn-server`, `vpn-client` and `vpn-router` (beside this program),
/// built first unless `no_build`; with `no_build`, only the router when only router parts run.
fn our_binaries(no_build: bool, parts: Parts) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("own path")?;
    let ours = exe.parent().context("own directory")?.to_path_buf();
    if !no_build {
        build_ours()?;
    }
    let router_only = !(parts.matrix || parts.memory || parts.flood);
    for bin in ["vpn-server", "vpn-client", "vpn-router"] {
        let needed = bin == "vpn-router" || !router_only;
        if needed && !ours.join(bin).exists() {
            bail!(
                "{} missing (build it, or drop --no-build)",
                ours.join(bin).display()
            );
        }
    }
    Ok(ours)
}

/// Runs the matrix; the new document with its tables.
fn matrix_document(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: {} cases × {} rounds, iperf3 {} s per load",
        opts.cases.len(),
        opts.rounds,
        opts.duration.as_secs()
    );
    let results = bench::run(opts, &mut |line| println!("{line}"))?;
    Ok(report::markdown(
        &results,
        opts,
        &report::Machine::current(),
        command,
    ))
}

/// Runs the memory part; its section.
fn memory_part(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: memory part, {} setups × {} rounds, loads of {:?} tunnels for {} s",
        bench::memory::Setup::ALL.len(),
        opts.rounds,
        opts.tunnels,
        opts.duration.as_secs()
    );
    let results = bench::memory::run(opts, &mut |line| println!("{line}"))?;
    Ok(report::memory_section(
        &results,
        opts,
        &report::Machine::current(),
        command,
    ))
}

/// Runs the flood part; its section.
fn flood_part(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: flood part, {} setups × {} rounds, {} silent and {} bogus connections",
        bench::flood::Target::ALL.len(),
        opts.rounds,
        bench::flood::FLOOD_IDLE,
        bench::flood::FLOOD_BOGUS,
    );
    let results = bench::flood::run(opts, &mut |line| println!("{line}"))?;
    Ok(flood_report::flood_section(
        &results,
        opts,
        &report::Machine::current(),
        command,
    ))
}

/// Runs the ingress part; its section.
fn ingress_part(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: ingress part, vpn-router and squid × {} rounds, {} shoots, {} idle tunnels",
        opts.rounds,
        bench::ingress::SHOOTS,
        bench::ingress::IDLE_TUNNELS,
    );
    let results = bench::ingress::run(opts, &mut |line| println!("{line}"))?;
    Ok(ingress_report::ingress_section(
        &results,
        opts,
        &report::Machine::current(),
        command,
    ))
}

/// Runs the SNI part; its section.
fn sni_part(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: SNI part, vpn-router (sni) and haproxy × {} rounds, {} shoots",
        opts.rounds,
        bench::ingress::SHOOTS,
    );
    let results =
        bench::ingress::run_proxies(opts, &bench::ingress::Proxy::SNI, "sni", &mut |line| {
            println!("{line}")
        })?;
    Ok(ingress_report::sni_section(
        &results,
        opts,
        &report::Machine::current(),
        command,
    ))
}

/// Runs the Kubernetes part; its section.
fn kube_part(opts: &Options, command: &str) -> anyhow::Result<String> {
    println!(
        "bench: kubernetes part, vpn-router --kubernetes with {} shoots' objects, {} changes",
        bench::kube::SHOOTS,
        bench::kube::CHANGES,
    );
    let sample = bench::kube::run(&opts.ours, &mut |line| println!("{line}"))?;
    Ok(bench::kube::section(
        &sample,
        &report::Machine::current(),
        command,
    ))
}

/// `md` with the section of each part that ran replaced by its new one; when the matrix
/// wrote a new document, each other part keeps its section from `old`.
fn merge_sections(
    mut md: String,
    old: &str,
    sections: Vec<(&str, Option<String>)>,
    matrix: bool,
) -> String {
    for (heading, section) in sections {
        match section {
            Some(section) => md = report::replace_section(&md, heading, &section),
            // The matrix wrote a new document: keep this part's section from the old one.
            None if matrix => {
                if let Some(kept) = report::find_section(old, heading) {
                    md = report::replace_section(&md, heading, kept);
                }
            }
            None => {}
        }
    }
    md
}

/// A flag set on the first SIGINT or SIGTERM, so the bench ends after the current case and
/// tears its lab down (namespaces, processes) instead of dying with it in place. A second
/// signal ends the bench at once.
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("signal runtime")?;
    let (mut int, mut term) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .context("installing signal handlers")?;
    std::thread::spawn(move || {
        rt.block_on(async {
            for _ in 0..2 {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                if flag.swap(true, Ordering::Relaxed) {
                    eprintln!("bench: second signal, exiting without cleaning up");
                    std::process::exit(130);
                }
                eprintln!("bench: stopping after the current case (signal again to exit now)");
            }
        })
    });
    Ok(stop)
}

/// `cargo build --release -p vpn-server -p vpn-client -p vpn-router` with the cargo that runs
/// us (the three binaries the bench starts).
fn build_ours() -> anyhow::Result<()> {
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(());
    };
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "vpn-server",
            "-p",
            "vpn-client",
            "-p",
            "vpn-router",
        ])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build of vpn-server, vpn-client and vpn-router failed");
    }
    Ok(())
}
