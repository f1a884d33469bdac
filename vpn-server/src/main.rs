//! `vpn-server`: the seed side. An OpenVPN-compatible TCP server per control plane, the CONNECT
//! sidecar that replaces Envoy, and the ingress router.
//!
//! Not built yet: see the `vpn-server` / `vpn-client` issue.

fn main() {
    eprintln!("vpn-server: not implemented yet");
    std::process::exit(2);
}
