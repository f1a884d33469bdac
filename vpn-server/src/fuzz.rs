//! Entry points for the fuzz targets in `fuzz/` that need this crate (one line each there).
//! Each must never panic, whatever the input.
//!
//! Not part of the supported API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use crate::status::{self, read, ClientStatus, RouteStatus, StatusSnapshot};

/// Reads `data` as a status file as the probes and the exporter do; then writes a snapshot
/// built from `data` (names with any characters, any counters and times) and reads it back:
/// every row the writer was given comes back, with its values, and nothing else.
pub fn status_file(data: &[u8]) {
    if let Err(e) = read::parse(data) {
        let lines = data.split(|&b| b == b'\n').count();
        assert!((1..=lines).contains(&e.line), "line {} of {lines}", e.line);
        let _ = e.to_string();
    }

    let snapshot = snapshot_from(data);
    let text = status::render(&snapshot);
    let back = read::parse(text.as_bytes()).expect("the writer's file reads back");
    assert_eq!(back.clients.len(), snapshot.clients.len(), "{text}");
    assert_eq!(back.routes.len(), snapshot.routes.len(), "{text}");
    assert_eq!(
        back.updated_at,
        read::parse_datetime(&status::datetime(snapshot.now)),
        "{text}"
    );
    for (written, read) in snapshot.clients.iter().zip(&back.clients) {
        assert_eq!(read.common_name, one_field(&written.common_name));
        assert_eq!(
            read.username,
            one_field(written.username.as_deref().unwrap_or("UNDEF"))
        );
        assert_eq!(read.bytes_received, written.bytes_received);
        assert_eq!(read.bytes_sent, written.bytes_sent);
        assert_eq!(read.real_address.ip(), written.real_address.ip());
        if written.real_address.is_ipv4() {
            assert_eq!(read.real_address.port(), written.real_address.port());
        }
        assert_eq!(read.virtual_ipv6, written.virtual_v6.map(IpAddr::V6));
    }
}

/// What the reader gives back for a text field the writer was given.
fn one_field(text: &str) -> String {
    text.replace(|c: char| c == ',' || c.is_control(), "_")
}

/// A snapshot taken apart from `data`: eight bytes each for the numbers, then names up to the
/// next NUL byte; two clients, one on IPv4 and one on IPv6, and a route of each.
fn snapshot_from(data: &[u8]) -> StatusSnapshot {
    let mut bytes = Bytes(data);
    let now = bytes.u64();
    let mut clients = Vec::new();
    let mut routes = Vec::new();
    for (n, ip) in [
        IpAddr::V4(Ipv4Addr::from(bytes.u32())),
        IpAddr::V6(Ipv6Addr::from(
            u128::from(bytes.u64()) << 64 | u128::from(bytes.u64()),
        )),
    ]
    .into_iter()
    .enumerate()
    {
        let real_address = SocketAddr::new(ip, bytes.u16());
        let common_name = bytes.text();
        routes.push(RouteStatus {
            prefix: IpNet::new(ip, 8).unwrap_or_else(|_| IpNet::from(ip)),
            common_name: common_name.clone(),
            real_address,
            last_ref: bytes.u64(),
        });
        clients.push(ClientStatus {
            common_name,
            real_address,
            virtual_v4: Some(Ipv4Addr::from(bytes.u32())),
            virtual_v6: Some(Ipv6Addr::from(u128::from(bytes.u64()))),
            bytes_received: bytes.u64(),
            bytes_sent: bytes.u64(),
            connected_since: bytes.u64(),
            username: Some(bytes.text()).filter(|u| !u.is_empty()),
            client_id: n as u64,
            peer_id: bytes.u32(),
            cipher: bytes.text(),
        });
    }
    StatusSnapshot {
        title: bytes.text(),
        now,
        clients,
        routes,
        mac_routes: Vec::new(),
        shoot_routes: Vec::new(),
        max_bcast_queue: bytes.u64(),
    }
}

/// Reads numbers and NUL-ended texts off the front of the fuzzer's bytes (zeros once empty).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }

    fn text(&mut self) -> String {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(self.0.len());
        let text = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = self.0.get(end + 1..).unwrap_or_default();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_real_input() {
        status_file(b"");
        status_file(b"\0\0\0\0");
        status_file(include_bytes!(
            "../fixtures/openvpn-2.6.14-status-v2-tcp4.csv"
        ));
        status_file(b"\xff\xff\xff\xff\xff\xff\xff\xffa,b\nc\0user\r\nTIME,x\0AES\0");
    }
}
