//! The status file in upstream's `status-version 2` CSV layout (gardener-vpn2 reference 1.8:
//! liveness, readiness and the exporter read it).
//!
//! Layout, as written by OpenVPN 2.6.14 (the fixtures in `vpn-server/fixtures/` were captured
//! from it in a lab namespace; field order and header text are reproduced exactly):
//!
//! ```text
//! TITLE,<version string>
//! TIME,<YYYY-MM-DD HH:MM:SS>,<unix seconds>
//! HEADER,CLIENT_LIST,Common Name,Real Address,Virtual Address,Virtual IPv6 Address,Bytes Received,Bytes Sent,Connected Since,Connected Since (time_t),Username,Client ID,Peer ID,Data Channel Cipher
//! CLIENT_LIST,<cn>,<real>,<v4 or empty>,<v6 or empty>,<rx>,<tx>,<since>,<since unix>,<user or UNDEF>,<client id>,<peer id>,<cipher>
//! HEADER,ROUTING_TABLE,Virtual Address,Common Name,Real Address,Last Ref,Last Ref (time_t)
//! ROUTING_TABLE,<addr, or net/len for iroutes; tap mode: MAC@VLAN; HA: pod IP or shoot-<j>>,<cn>,<real>,<last ref>,<last ref unix>
//! GLOBAL_STATS,Max bcast/mcast queue length,<n>
//! GLOBAL_STATS,dco_enabled,0
//! END
//! ```
//!
//! Text fields (title, CN, username, cipher) are written with every `,` and control character
//! replaced by `_`, so no field can end its line or add one: a status file the probes and the
//! exporter read always has exactly the rows the registry holds.
//!
//! In tap mode the routing table holds the learned MAC addresses instead, as upstream prints
//! them: lower-case hex with colons and the VLAN id (always 0: no VLAN tagging), e.g.
//! `ROUTING_TABLE,5a:1e:03:9f:00:21@0,vpn-shoot-client,10.0.0.2:40122,<learned>,<unix>`.
//!
//! In HA mode the routing table has one row per connection, as vpn2's tap server learns one
//! MAC address per client: a kube-apiserver's by the pod IP it connected from, a shoot
//! connection's by its index, e.g. `ROUTING_TABLE,shoot-0,vpn-shoot-client-0,...`.
//!
//! `Last Ref` follows traffic as upstream's does, with the resolution of the status interval
//! (`crate::registry::Registry::status`; `docs/metrics.md`, "Last Ref").
//!
//! Real addresses: an IPv4 peer is `a.b.c.d:port`, an IPv6 peer the bare address (2.6 prints
//! no port there); a v4-mapped peer on a dual-stack socket is printed as its bare IPv6 form.
//! Differences from upstream, on purpose: times are UTC (upstream uses the local zone, which
//! is UTC in the vpn2 containers), the TITLE names this program, and routing-table rows are in
//! a stable order (IPv4 before IPv6, longest prefix first) where upstream prints hash order.
//!
//! [`read`] reads such a file back the way vpn2's probes do.

pub mod read;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// The header line of the client list.
pub const CLIENT_LIST_HEADER: &str = "HEADER,CLIENT_LIST,Common Name,Real Address,Virtual Address,Virtual IPv6 Address,Bytes Received,Bytes Sent,Connected Since,Connected Since (time_t),Username,Client ID,Peer ID,Data Channel Cipher";

/// The header line of the routing table.
pub const ROUTING_TABLE_HEADER: &str =
    "HEADER,ROUTING_TABLE,Virtual Address,Common Name,Real Address,Last Ref,Last Ref (time_t)";

/// Upstream writes `UNDEF` for a client without a username.
pub const UNDEF: &str = "UNDEF";

/// One connected client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientStatus {
    /// Certificate CN.
    pub common_name: String,
    /// The client's TCP address.
    pub real_address: SocketAddr,
    /// Assigned IPv4 address.
    pub virtual_v4: Option<Ipv4Addr>,
    /// Assigned IPv6 address.
    pub virtual_v6: Option<Ipv6Addr>,
    /// Bytes received from the client (TCP payload).
    pub bytes_received: u64,
    /// Bytes sent to the client.
    pub bytes_sent: u64,
    /// When the tunnel came up (unix seconds).
    pub connected_since: u64,
    /// `auth-user-pass` username.
    pub username: Option<String>,
    /// Upstream's client id: a counter over all connections.
    pub client_id: u64,
    /// The data-channel peer id.
    pub peer_id: u32,
    /// The data-channel cipher (`AES-256-GCM`).
    pub cipher: String,
}

/// One route of the internal routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteStatus {
    /// The prefix (host routes print as a bare address).
    pub prefix: IpNet,
    /// Owner CN.
    pub common_name: String,
    /// Owner TCP address.
    pub real_address: SocketAddr,
    /// Last use (unix seconds).
    pub last_ref: u64,
}

/// One learned MAC address (tap mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacRouteStatus {
    /// The address.
    pub mac: crate::switch::MacAddr,
    /// Owner CN.
    pub common_name: String,
    /// Owner TCP address.
    pub real_address: SocketAddr,
    /// When it was learned (unix seconds).
    pub last_ref: u64,
}

/// One HA shoot connection (HA mode): it owns an index of the switch, no address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShootRouteStatus {
    /// Its index (`vpn-shoot-client-<j>`), printed as `shoot-<j>`.
    pub index: u8,
    /// Owner CN.
    pub common_name: String,
    /// Owner TCP address.
    pub real_address: SocketAddr,
    /// Last use (unix seconds).
    pub last_ref: u64,
}

/// Everything one status file shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSnapshot {
    /// The TITLE text.
    pub title: String,
    /// Now (unix seconds).
    pub now: u64,
    /// Connected clients.
    pub clients: Vec<ClientStatus>,
    /// The routing table.
    pub routes: Vec<RouteStatus>,
    /// The learned MAC addresses (tap mode), printed in the routing table.
    pub mac_routes: Vec<MacRouteStatus>,
    /// The shoot connections (HA mode), printed in the routing table after the routes.
    pub shoot_routes: Vec<ShootRouteStatus>,
    /// `Max bcast/mcast queue length`.
    pub max_bcast_queue: u64,
}

/// The default TITLE text.
pub fn default_title() -> String {
    concat!(
        "OpenVPN 2.6 compatible vpn-server ",
        env!("CARGO_PKG_VERSION"),
        " [SSL (OpenSSL)]"
    )
    .to_owned()
}

/// Renders `snapshot` as a `status-version 2` file.
pub fn render(snapshot: &StatusSnapshot) -> String {
    let mut out = String::with_capacity(512 + 200 * snapshot.clients.len());
    let _ = writeln!(out, "TITLE,{}", field(&snapshot.title));
    let _ = writeln!(out, "TIME,{},{}", datetime(snapshot.now), snapshot.now);
    out.push_str(CLIENT_LIST_HEADER);
    out.push('\n');
    for c in &snapshot.clients {
        let _ = writeln!(
            out,
            "CLIENT_LIST,{},{},{},{},{},{},{},{},{},{},{},{}",
            field(&c.common_name),
            real_address(c.real_address),
            c.virtual_v4.map(|a| a.to_string()).unwrap_or_default(),
            c.virtual_v6.map(|a| a.to_string()).unwrap_or_default(),
            c.bytes_received,
            c.bytes_sent,
            datetime(c.connected_since),
            c.connected_since,
            field(c.username.as_deref().unwrap_or(UNDEF)),
            c.client_id,
            c.peer_id,
            field(&c.cipher),
        );
    }
    out.push_str(ROUTING_TABLE_HEADER);
    out.push('\n');
    let mut macs: Vec<&MacRouteStatus> = snapshot.mac_routes.iter().collect();
    macs.sort_by_key(|r| r.mac);
    for r in macs {
        let _ = writeln!(
            out,
            "ROUTING_TABLE,{}@0,{},{},{},{}",
            r.mac,
            field(&r.common_name),
            real_address(r.real_address),
            datetime(r.last_ref),
            r.last_ref,
        );
    }
    let mut routes: Vec<&RouteStatus> = snapshot.routes.iter().collect();
    routes.sort_by_key(|r| {
        (
            matches!(r.prefix, IpNet::V6(_)),
            std::cmp::Reverse(r.prefix.prefix_len()),
            r.prefix,
        )
    });
    for r in routes {
        let _ = writeln!(
            out,
            "ROUTING_TABLE,{},{},{},{},{}",
            prefix(r.prefix),
            field(&r.common_name),
            real_address(r.real_address),
            datetime(r.last_ref),
            r.last_ref,
        );
    }
    let mut shoots: Vec<&ShootRouteStatus> = snapshot.shoot_routes.iter().collect();
    shoots.sort_by_key(|r| (r.index, r.real_address));
    for r in shoots {
        let _ = writeln!(
            out,
            "ROUTING_TABLE,shoot-{},{},{},{},{}",
            r.index,
            field(&r.common_name),
            real_address(r.real_address),
            datetime(r.last_ref),
            r.last_ref,
        );
    }
    let _ = writeln!(
        out,
        "GLOBAL_STATS,Max bcast/mcast queue length,{}",
        snapshot.max_bcast_queue
    );
    out.push_str("GLOBAL_STATS,dco_enabled,0\nEND\n");
    out
}

/// `text` as one field of a row: `,` (the separator) and control characters (`\n` would start
/// a row of its own) become `_`.
fn field(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c == ',' || c.is_control();
    if text.contains(unsafe_char) {
        Cow::Owned(text.replace(unsafe_char, "_"))
    } else {
        Cow::Borrowed(text)
    }
}

fn prefix(net: IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.to_string()
    }
}

/// A peer address as upstream 2.6 prints it in the status file.
pub fn real_address(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => ip.to_string(),
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) for unix seconds: OpenVPN's layout (`otime.c`). A time past
/// the year 9999 (no real clock) prints as the last second of 9999.
pub fn datetime(unix: u64) -> String {
    let at = i64::try_from(unix)
        .ok()
        .and_then(|unix| time::OffsetDateTime::from_unix_timestamp(unix).ok())
        .unwrap_or(time::PrimitiveDateTime::MAX.assume_utc());
    format_datetime(at)
}

/// `at` in OpenVPN's `YYYY-MM-DD HH:MM:SS` layout.
fn format_datetime(at: time::OffsetDateTime) -> String {
    const LAYOUT: &[time::format_description::BorrowedFormatItem<'static>] =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    at.format(LAYOUT).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP4: &str = include_str!("../fixtures/openvpn-2.6.14-status-v2-tcp4.csv");
    const TCP6: &str = include_str!("../fixtures/openvpn-2.6.14-status-v2-tcp6.csv");

    #[test]
    fn tap_mode_routes_are_mac_addresses_with_their_vlan() {
        let snap = StatusSnapshot {
            title: "t".into(),
            now: 0,
            clients: Vec::new(),
            routes: Vec::new(),
            mac_routes: vec![MacRouteStatus {
                mac: crate::switch::MacAddr([0x5a, 0x1e, 0x03, 0x9f, 0x00, 0x21]),
                common_name: "vpn-shoot-client".into(),
                real_address: "10.0.0.2:40122".parse().unwrap(),
                last_ref: 1_795_320_809,
            }],
            shoot_routes: Vec::new(),
            max_bcast_queue: 0,
        };
        let text = render(&snap);
        assert!(
            text.contains(
                "\nROUTING_TABLE,5a:1e:03:9f:00:21@0,vpn-shoot-client,10.0.0.2:40122,\
                 2026-11-22 04:13:29,1795320809\n"
            ),
            "{text}"
        );
        let back = read::parse(text.as_bytes()).unwrap();
        assert_eq!(back.routes.len(), 1);
    }

    #[test]
    fn ha_shoot_connections_are_rows_by_index() {
        let snap = StatusSnapshot {
            title: "t".into(),
            now: 0,
            clients: Vec::new(),
            routes: Vec::new(),
            mac_routes: Vec::new(),
            shoot_routes: vec![ShootRouteStatus {
                index: 1,
                common_name: "vpn-shoot-client-1".into(),
                real_address: "10.0.0.2:40122".parse().unwrap(),
                last_ref: 1_795_320_809,
            }],
            max_bcast_queue: 0,
        };
        let text = render(&snap);
        assert!(
            text.contains(
                "\nROUTING_TABLE,shoot-1,vpn-shoot-client-1,10.0.0.2:40122,\
                 2026-11-22 04:13:29,1795320809\nGLOBAL_STATS,"
            ),
            "{text}"
        );
        let back = read::parse(text.as_bytes()).unwrap();
        assert_eq!(back.routes.len(), 1);
        assert_eq!(back.routes[0].last_ref.unix, 1_795_320_809);
    }

    #[test]
    fn dates() {
        assert_eq!(datetime(0), "1970-01-01 00:00:00");
        // Both from the captured fixture (the lab machine runs in UTC).
        assert_eq!(datetime(1_795_320_809), "2026-11-22 04:13:29");
        assert_eq!(datetime(1_795_320_798), "2026-11-22 04:13:18");
        assert_eq!(datetime(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(datetime(4_102_444_799), "2099-12-31 23:59:59");
    }

    fn snapshot(
        real: SocketAddr,
        title: &str,
        now: u64,
        rx: u64,
        tx: u64,
        since: u64,
        id: u64,
    ) -> StatusSnapshot {
        let route = |p: &str| RouteStatus {
            prefix: p.parse().unwrap(),
            common_name: "shoot-client".into(),
            real_address: real,
            last_ref: since,
        };
        StatusSnapshot {
            title: title.into(),
            now,
            clients: vec![ClientStatus {
                common_name: "shoot-client".into(),
                real_address: real,
                virtual_v4: Some("192.168.123.2".parse().unwrap()),
                virtual_v6: Some("fd8f:6d53:b97a:1::1000".parse().unwrap()),
                bytes_received: rx,
                bytes_sent: tx,
                connected_since: since,
                username: None,
                client_id: id,
                peer_id: 0,
                cipher: "AES-256-GCM".into(),
            }],
            routes: vec![
                route("fd8f:6d53:b97a:1::1000/128"),
                route("10.99.0.0/16"),
                route("192.168.123.2/32"),
                route("fd00:99::/64"),
            ],
            mac_routes: Vec::new(),
            shoot_routes: Vec::new(),
            max_bcast_queue: 1,
        }
    }

    /// Lines of a status file with the routing rows sorted (upstream prints hash order).
    fn normalized(text: &str) -> Vec<String> {
        let mut head: Vec<String> = Vec::new();
        let mut routes: Vec<String> = Vec::new();
        for line in text.lines() {
            if line.starts_with("ROUTING_TABLE,") {
                routes.push(line.to_owned());
            } else {
                if line.starts_with("HEADER,ROUTING_TABLE") {
                    head.push(line.to_owned());
                    continue;
                }
                if line.starts_with("GLOBAL_STATS") && !routes.is_empty() {
                    routes.sort();
                    head.append(&mut routes);
                }
                head.push(line.to_owned());
            }
        }
        head
    }

    #[test]
    fn matches_upstream_tcp4_fixture() {
        let title = TCP4.lines().next().unwrap().trim_start_matches("TITLE,");
        let real: SocketAddr = "127.0.0.1:59364".parse().unwrap();
        let ours = render(&snapshot(
            real,
            title,
            1_795_320_809,
            2438,
            2449,
            1_795_320_798,
            0,
        ));
        assert_eq!(normalized(&ours), normalized(TCP4));
    }

    #[test]
    fn matches_upstream_tcp6_fixture() {
        let title = TCP6.lines().next().unwrap().trim_start_matches("TITLE,");
        let real: SocketAddr = "[::1]:40000".parse().unwrap();
        let ours = render(&snapshot(
            real,
            title,
            1_795_320_818,
            2367,
            2373,
            1_795_320_817,
            5,
        ));
        assert_eq!(normalized(&ours), normalized(TCP6));
    }

    #[test]
    fn empty_server() {
        let s = StatusSnapshot {
            title: default_title(),
            now: 60,
            clients: vec![],
            routes: vec![],
            mac_routes: Vec::new(),
            shoot_routes: Vec::new(),
            max_bcast_queue: 0,
        };
        let text = render(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "TIME,1970-01-01 00:01:00,60");
        assert_eq!(lines[2], CLIENT_LIST_HEADER);
        assert_eq!(lines[3], ROUTING_TABLE_HEADER);
        assert_eq!(
            &lines[4..],
            [
                "GLOBAL_STATS,Max bcast/mcast queue length,0",
                "GLOBAL_STATS,dco_enabled,0",
                "END"
            ]
        );
        assert!(lines[0].starts_with("TITLE,OpenVPN "));
    }

    /// A username or CN with a newline or comma (text a client chose) stays one field of its
    /// own row: the file read back has the registry's rows and the writer's time, nothing more.
    #[test]
    fn text_fields_cannot_add_rows_or_fields() {
        let real: SocketAddr = "192.0.2.1:4242".parse().unwrap();
        let mut s = snapshot(real, "title,\r\nEND", 1_000_000, 1, 2, 999_000, 1);
        let injected = "x\nTIME,2000-01-01 00:00:00,946684800\nCLIENT_LIST,vpn-shoot-client,\
                        1.2.3.4:5,,,0,0,2000-01-01 00:00:00,946684800,UNDEF,9,9,none";
        s.clients[0].username = Some(injected.into());
        s.clients[0].common_name = "a,b\rc".into();
        s.clients[0].cipher = "AES\n".into();
        s.routes[0].common_name = "r\n,".into();

        let text = render(&s);
        let back = read::parse(text.as_bytes()).expect("our own file reads back");
        assert_eq!(back.clients.len(), 1, "{text}");
        assert_eq!(back.routes.len(), s.routes.len(), "{text}");
        assert_eq!(back.updated_at, read::parse_datetime(&datetime(1_000_000)));
        assert_eq!(back.title.as_deref(), Some("title___END"));
        let client = &back.clients[0];
        assert_eq!(client.common_name, "a_b_c");
        assert_eq!(client.username, injected.replace(['\n', ','], "_"));
        assert_eq!(client.cipher, "AES_");
        assert!(back.routes.iter().any(|r| r.common_name == "r__"));
    }
}
