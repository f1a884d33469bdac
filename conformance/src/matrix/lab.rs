//! The matrix's network: three lab namespaces in a line, the middle one routing (and running
//! the CONNECT proxy), so a path can be cut silently there.
//!
//! ```text
//!   SHOOT  c0 10.200.1.2/24 ──── i1 10.200.1.1/24  INGRESS  i2 10.200.2.1/24 ──── s0 10.200.2.2/24  SEED
//!   client, default via .1.1       forwarding; CONNECT proxy on 10.200.1.1:3128     server on :1194,
//!                                  blackhole routes cut the path                    default via .2.1
//! ```
//!
//! A blackhole route in INGRESS drops forwarded packets without an ICMP error, which is what
//! a dead middlebox looks like to both peers: no RST, no unreachable, only silence.

use std::net::Ipv4Addr;

use crate::netns::Netns;
use crate::LabError;

/// The server's transport address (SEED).
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 2, 2);
/// The client's transport address (SHOOT).
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 1, 2);
/// The proxy's address (INGRESS, on the shoot side).
pub const PROXY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 1, 1);
/// The proxy's port.
pub const PROXY_PORT: u16 = 3128;
/// The server's port.
pub const SERVER_PORT: u16 = 1194;
/// The server's tunnel address (`server 192.168.123.0 255.255.255.0`).
pub const SERVER_TUN: Ipv4Addr = Ipv4Addr::new(192, 168, 123, 1);

/// The three namespaces of one case.
#[derive(Debug)]
pub struct Lab {
    /// The client's namespace.
    pub shoot: Netns,
    /// The router and proxy between them.
    pub ingress: Netns,
    /// The server's namespace.
    pub seed: Netns,
}

impl Lab {
    /// Creates the namespaces, links and routes of the module docs.
    pub fn new() -> Result<Self, LabError> {
        let lab = Self {
            shoot: Netns::new()?,
            ingress: Netns::new()?,
            seed: Netns::new()?,
        };
        Netns::veth_pair(&lab.shoot, "c0", &lab.ingress, "i1")?;
        Netns::veth_pair(&lab.ingress, "i2", &lab.seed, "s0")?;
        lab.shoot
            .run(["ip", "addr", "add", "10.200.1.2/24", "dev", "c0"])?;
        lab.shoot
            .run(["ip", "route", "add", "default", "via", "10.200.1.1"])?;
        lab.ingress
            .run(["ip", "addr", "add", "10.200.1.1/24", "dev", "i1"])?;
        lab.ingress
            .run(["ip", "addr", "add", "10.200.2.1/24", "dev", "i2"])?;
        lab.ingress
            .run(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
        lab.seed
            .run(["ip", "addr", "add", "10.200.2.2/24", "dev", "s0"])?;
        lab.seed
            .run(["ip", "route", "add", "default", "via", "10.200.2.1"])?;
        Ok(lab)
    }

    /// Cuts (`true`) or restores (`false`) the path between SHOOT and SEED in INGRESS, in both
    /// directions, silently.
    pub fn blackhole(&self, on: bool) -> Result<(), LabError> {
        let verb = if on { "add" } else { "del" };
        for host in [SERVER_ADDR, CLIENT_ADDR] {
            self.ingress
                .run(["ip", "route", verb, "blackhole", &format!("{host}/32")])?;
        }
        Ok(())
    }
}
