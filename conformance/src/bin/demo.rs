//! The demo: `cargo run --release -p conformance --bin demo`, as root.
//!
//! Builds four network namespaces (seed, ingress, shoot, shoot pod network), issues a PKI with
//! the `pki` crate, starts our ingress router (`vpn-router`'s code) as the seed's ingress, our `vpn-server` in the seed and
//! our `vpn-client` in the shoot (through the proxy, with the `Reversed-VPN` header), then
//! pings an address in the shoot's pod network from the seed and downloads a file from an
//! HTTP server there, through the tunnel, checking its SHA-256. Prints each step as it
//! finishes and a summary; tears everything down; exits non-zero if any step failed. See
//! [`conformance::demo`]. `RUST_LOG=info` shows the server's and client's logs.

#![allow(clippy::print_stdout)] // Printing the steps and the summary is what this program is for.

use std::process::ExitCode;

use conformance::demo::{self, StepLine};

fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    println!("vpn2-rs demo: seed -> ingress router <- shoot, traffic from the seed into the shoot pod network");
    println!();
    let summary = demo::run(&mut |step| println!("{}", StepLine(step)));
    println!();
    println!("{summary}");
    if summary.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
