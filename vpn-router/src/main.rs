//! `vpn-router`: the seed's ingress router (see the `vpn_router` library).
//!
//! `vpn-router --config FILE` routes HTTP CONNECT requests by header to the seed's VPN servers
//! and kube-apiservers; SIGHUP reloads the routes and allow-lists, SIGTERM or SIGINT ends it.
//! A binary of its own, not a subcommand of `vpn-server`: it runs in the ingress deployment,
//! not beside each VPN server, and leaving it (and its TOML parser) out of `vpn-server` keeps
//! that binary's text, and so every VPN server's resident memory, smaller.

use std::process::ExitCode;

use clap::Parser;

netio::libm_pow!();

/// The seed's ingress router: CONNECT routing by header, allow-lists, PROXY protocol.
#[derive(Debug, Parser)]
#[command(name = "vpn-router", version, about)]
struct Cli {
    #[command(flatten)]
    args: vpn_router::RouterArgs,
}

fn main() -> ExitCode {
    vpn_router::main(Cli::parse().args)
}
