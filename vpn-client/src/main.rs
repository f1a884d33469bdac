//! `vpn-client`: the shoot side. An OpenVPN-compatible client that dials out through an HTTP
//! CONNECT proxy, applies pull-filtered pushes, sets up tun and routes and reconnects; plus the
//! GEP-30 apiserver-proxy.
//!
//! Not built yet: see the `vpn-server` / `vpn-client` issue.

fn main() {
    eprintln!("vpn-client: not implemented yet");
    std::process::exit(2);
}
