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

/// A ClientHello record for shoot `i` (TLS 1.3 shape, as a browser or `kubectl` sends one
/// without the padding): `server_name`, `supported_groups`, `signature_algorithms`,
/// `supported_versions` and an X25519 `key_share`. Random and key are fixed bytes: nothing
/// on the path looks at them.
pub fn client_hello(i: usize) -> Vec<u8> {
    let name = server_name(i);
    let mut ext = Vec::new();
    let mut push_ext = |kind: u16, data: &[u8]| {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&u16_len(data.len()));
        ext.extend_from_slice(data);
    };
    let mut sni = u16_len(name.len() + 3).to_vec();
    sni.push(0);
    sni.extend_from_slice(&u16_len(name.len()));
    sni.extend_from_slice(name.as_bytes());
    push_ext(0x0000, &sni);
    push_ext(0x000a, &[0, 4, 0x00, 0x1d, 0x00, 0x17]);
    push_ext(0x000d, &[0, 6, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01]);
    push_ext(0x002b, &[2, 0x03, 0x04]);
    let mut key_share = vec![0, 36, 0x00, 0x1d, 0, 32];
    key_share.extend_from_slice(&[0x5a; 32]);
    push_ext(0x0033, &key_share);

    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]);
    body.push(32);
    body.extend_from_slice(&[0x17; 32]);
    body.extend_from_slice(&[0, 6, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&u16_len(ext.len()));
    body.extend_from_slice(&ext);

    let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    let mut message = vec![1, len[1], len[2], len[3]];
    message.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&u16_len(message.len()));
    record.extend_from_slice(&message);
    record
}

fn u16_len(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
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
