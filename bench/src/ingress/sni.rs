//! The SNI part (issue 21, TLS SNI passthrough): our `vpn-router`'s `kind = "sni"` listener
//! against Debian's HAProxy in TCP mode, with equivalent routing for [`SHOOTS`] shoots,
//! measured exactly as the ingress part measures CONNECT ([`super`]: idle tunnels, the rate
//! of new tunnels, a reconnect storm).
//!
//! ```text
//!  SHOOT (load generator)                           SEED
//!   ClientHello for shoot i, echoed ──────► [vpn-router sni | haproxy] :8443 ──► echo :20000+i
//! ```
//!
//! Neither proxy terminates TLS, so the load generator sends one ClientHello (TLS 1.3 shape,
//! [`client_hello`]: server name `api.s<i>.shoots.bench.example`, an X25519 key share) and no
//! handshake follows: the upstream is the ingress part's echo listener, and a tunnel is
//! *ready* when the whole ClientHello came back through it. The router holds [`SHOOTS`]
//! `[[sni_route]]` tables, each naming its shoot (so its tunnels count in per-shoot series,
//! as HAProxy counts per backend); HAProxy waits for the hello (`tcp-request inspect-delay`, accepted
//! once `req.ssl_hello_type 1`) and picks one of [`SHOOTS`] backends by
//! `req.ssl_sni,lower,map(...)`.

use std::path::Path;

use conformance::netns::Netns;
use conformance::LabError;

use super::{spawn_logged, upstream_port, INGRESS_PORT, SHOOTS};
use crate::lab::SEED_ADDR;
use crate::BenchError;

/// Shoot `i`'s API server name.
pub fn server_name(i: usize) -> String {
    format!("api.s{}.shoots.bench.example", i % SHOOTS)
}

/// A ClientHello record for shoot `i` ([`conformance::tls_hello::client_hello`] naming
/// [`server_name`]`(i)`).
pub fn client_hello(i: usize) -> Vec<u8> {
    conformance::tls_hello::client_hello(&server_name(i))
}

/// Our router with one `kind = "sni"` listener and [`SHOOTS`] SNI routes.
pub(super) fn start_router(ns: &Netns, dir: &Path, ours: &Path) -> Result<u32, BenchError> {
    let mut text = format!(
        "max_connections = 30000\nmax_pending = 4096\n\n[[listener]]\n\
         address = \"{SEED_ADDR}:{INGRESS_PORT}\"\nkind = \"sni\"\n"
    );
    for i in 0..SHOOTS {
        text.push_str(&format!(
            "\n[[sni_route]]\nserver_names = [\"{}\"]\nupstream = \"{SEED_ADDR}:{}\"\n\
             shoot = \"shoot--bench--s{i}\"\n",
            server_name(i),
            upstream_port(i)
        ));
    }
    let conf = dir.join("router.toml");
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let bin = ours.join("vpn-router");
    let mut cmd = ns.command(&bin.to_string_lossy());
    cmd.arg("--config").arg(&conf).args(["--log", "warn"]);
    spawn_logged(ns, cmd, &dir.join("router.log"), "vpn-router")
}

/// HAProxy in TCP mode: the ClientHello inspected, the backend of its server name picked
/// from a map of [`SHOOTS`] names; two threads (our router's runtime has one worker per CPU,
/// two here); no logs.
pub(super) fn start_haproxy(ns: &Netns, dir: &Path) -> Result<u32, BenchError> {
    let map = dir.join("sni.map");
    let mut map_text = String::new();
    let mut backends = String::new();
    for i in 0..SHOOTS {
        map_text.push_str(&format!("{} s{i}\n", server_name(i)));
        backends.push_str(&format!(
            "backend s{i}\n    server s{i} {SEED_ADDR}:{}\n",
            upstream_port(i)
        ));
    }
    std::fs::write(&map, map_text).map_err(|source| LabError::io(&map, source))?;
    let text = format!(
        "global\n    maxconn 9000\n    nbthread 2\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 300s\n    \
         timeout server 300s\n\n\
         frontend sni\n    bind {SEED_ADDR}:{INGRESS_PORT}\n    \
         tcp-request inspect-delay 10s\n    \
         tcp-request content accept if {{ req.ssl_hello_type 1 }}\n    \
         tcp-request content reject\n    \
         use_backend %[req.ssl_sni,lower,map({map})]\n\n{backends}",
        map = map.display(),
    );
    let conf = dir.join("haproxy.cfg");
    std::fs::write(&conf, text).map_err(|source| LabError::io(&conf, source))?;
    let mut cmd = ns.command("/usr/sbin/haproxy");
    cmd.arg("-db").arg("-f").arg(&conf);
    spawn_logged(ns, cmd, &dir.join("haproxy.out"), "haproxy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_hello_parses_with_its_shoots_name() {
        let hello = client_hello(1007);
        let got = vpn_router::client_hello::parse(&hello).unwrap().unwrap();
        assert_eq!(got.server_name.as_str(), "api.s7.shoots.bench.example");
        assert_eq!(got.len, hello.len());
    }
}
