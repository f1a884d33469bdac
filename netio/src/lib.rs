//! The tokio I/O shared by `vpn-server` and `vpn-client`: tun device, netlink address and route
//! setup, the framed TCP transport, the HTTP CONNECT dialer and acceptor, the PROXY protocol
//! acceptor, the admin HTTP endpoints and shutdown.
//!
//! Not built yet: see the `vpn-server` / `vpn-client` issue.
