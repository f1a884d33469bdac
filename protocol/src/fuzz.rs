//! Entry points for the fuzz targets in `fuzz/` (one line each there). Each must never
//! panic, whatever the input; where a parser accepts input, the entry point also checks the
//! invariant the fuzzer should hunt for (e.g. re-emitting gives the same bytes).
//!
//! Not part of the supported API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::BytesMut;
use ipnet::IpNet;

use crate::config::env::{Vpn2ClientEnv, Vpn2ServerEnv};
use crate::config::{CcdOptions, ClientOptions, ConfigError, ServerOptions};
use crate::data::{DataCipher, DataKey, DataKeyParams};
use crate::digest::Digest;
use crate::framing::FrameDecoder;
use crate::ids::PeerId;
use crate::key::{Key2, KeyDirection, Role, KEY2_LEN};
use crate::packet::ControlPacket;
use crate::push::guard::PING_RESTART_FLOOR;
use crate::push::options::{RouteVia, Topology};
use crate::push::{
    OptionKind, PathGuard, PullPolicy, PushCollector, PushOutcome, PushedOption, StrictPolicy,
};
use crate::wrap::{TlsAuth, TlsCrypt};

/// Decodes frames out of `data` until the decoder needs more bytes or reports an error; the
/// frames and the rest must add up to the input.
pub fn framing(data: &[u8]) {
    let decoder = FrameDecoder::new();
    let mut buf = BytesMut::from(data);
    let mut consumed = 0;
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        consumed += 2 + frame.len();
    }
    assert_eq!(
        consumed + buf.len(),
        data.len(),
        "framing lost or invented bytes"
    );
}

/// Parses `data` as a control packet; an accepted packet must re-emit to the same bytes.
pub fn control_packet(data: &[u8]) {
    let Ok(packet) = ControlPacket::parse(data) else {
        return;
    };
    let mut out = BytesMut::new();
    assert!(
        packet.emit(&mut out).is_ok(),
        "a parsed packet must be valid"
    );
    assert_eq!(&out[..], data, "parse/emit round trip changed the bytes");
}

/// The key every wrapping entry point uses: bytes 0, 1, 2, ... 255.
fn counting_key() -> Key2 {
    Key2::from_bytes(&std::array::from_fn::<u8, KEY2_LEN, _>(|i| i as u8))
}

/// Unwraps `data` with tls-auth for each digest; a packet that authenticates (only if the
/// fuzzer forged an HMAC) must come out as the wire packet minus the HMAC and packet id.
pub fn tls_auth_unwrap(data: &[u8]) {
    let key = counting_key();
    for digest in [Digest::Sha1, Digest::Sha256, Digest::Sha512] {
        let mut wrap = TlsAuth::new(&key, KeyDirection::Normal, digest);
        let mut out = BytesMut::new();
        if wrap.unwrap(data, 0, &mut out).is_ok() {
            assert_eq!(out.len() + digest.output_len() + 8, data.len());
        } else {
            assert!(out.is_empty(), "a refused packet must leave no output");
        }
    }
}

/// Unwraps `data` with tls-crypt in both roles.
pub fn tls_crypt_unwrap(data: &[u8]) {
    let key = counting_key();
    for role in [Role::Client, Role::Server] {
        let mut wrap = TlsCrypt::new(&key, role);
        let mut out = BytesMut::new();
        if wrap.unwrap(data, 0, &mut out).is_err() {
            assert!(out.is_empty(), "a refused packet must leave no output");
        }
    }
}

/// Data-channel contexts for every cipher (CBC with SHA256), client and server side of the
/// same fixed key block, P_DATA_V2 with peer id 7.
fn data_pairs() -> impl Iterator<Item = (DataKey, DataKey)> {
    let key = counting_key();
    DataCipher::ALL.into_iter().filter_map(move |cipher| {
        let mut params = DataKeyParams::new(cipher);
        params.auth = Digest::Sha256;
        params.peer_id = PeerId::new(7);
        let client = DataKey::from_key2(&params, &key, Role::Client).ok()?;
        let server = DataKey::from_key2(&params, &key, Role::Server).ok()?;
        Some((client, server))
    })
}

/// Decrypts `data` as a received data packet with every cipher (it must be refused: nobody
/// can forge a tag here), then sends `data` as a payload and checks it comes back intact.
pub fn data_decrypt(data: &[u8]) {
    for (mut client, mut server) in data_pairs() {
        let mut buf = BytesMut::from(data);
        assert!(
            server.decrypt(&mut buf, 0).is_err(),
            "{:?}: forged packet accepted",
            server.cipher()
        );

        let headroom = client.headroom();
        let mut buf = BytesMut::with_capacity(headroom + data.len() + 32);
        buf.resize(headroom, 0);
        buf.extend_from_slice(data);
        let mut rng = CountingRng(0);
        if client.encrypt(&mut buf, headroom, &mut rng).is_ok() {
            let decrypted = server.decrypt(&mut buf, 0);
            assert!(
                decrypted.is_ok(),
                "{:?}: round trip failed",
                server.cipher()
            );
            assert_eq!(
                &buf[..],
                data,
                "{:?}: round trip changed the payload",
                server.cipher()
            );
        }
    }
}

/// Parses `data` as the key-method-2 message of each role; an accepted message must re-emit to
/// the bytes it was parsed from.
pub fn key_method_2(data: &[u8]) {
    if let Ok((msg, used)) = crate::km2::ClientKeyMethod2::parse(data) {
        let mut out = BytesMut::new();
        assert!(
            msg.emit(&mut out).is_ok(),
            "a parsed client km2 must be valid"
        );
        assert_eq!(
            &out[..],
            &km2_canonical(&data[..used])[..],
            "client km2 round trip changed the bytes"
        );
    }
    if let Ok((msg, used)) = crate::km2::ServerKeyMethod2::parse(data) {
        let mut out = BytesMut::new();
        assert!(
            msg.emit(&mut out).is_ok(),
            "a parsed server km2 must be valid"
        );
        assert_eq!(
            &out[..],
            &km2_canonical(&data[..used])[..],
            "server km2 round trip changed the bytes"
        );
    }
}

/// `bytes` as `emit` writes them back: the flag nibble of the key-method byte is accepted
/// and ignored on receive (as upstream does) and always written as 0.
fn km2_canonical(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    if let Some(method) = v.get_mut(crate::km2::LITERAL_LEN) {
        *method &= crate::km2::KEY_METHOD_MASK;
    }
    v
}

/// Splits `data` as TLS plaintext into control messages and runs every `PUSH_REPLY` through a
/// pull policy with filters and strict mode; nothing may panic, and strict mode must never
/// let a route outside its network through.
pub fn control_messages(data: &[u8]) {
    use crate::control_msg::{split_messages, ControlMessage};
    use crate::push::{
        FilterAction, OptionKind, PullFilter, PullPolicy, PushedOption, StrictPolicy,
    };
    let allowed: ipnet::IpNet = "10.0.0.0/8".parse().unwrap_or_default();
    let policy = PullPolicy {
        filters: vec![
            PullFilter::new(FilterAction::Ignore, "route-gateway"),
            PullFilter::new(FilterAction::Accept, "route"),
            PullFilter::new(FilterAction::Reject, "redirect"),
        ],
        route_nopull: false,
        strict: Some(
            StrictPolicy::new()
                .allow(
                    StrictPolicy::TUNNEL_BASICS
                        .into_iter()
                        .chain([OptionKind::Route]),
                )
                .allow_networks([allowed]),
        ),
    };
    for message in split_messages(data).flatten() {
        if let ControlMessage::PushReply { options } = message {
            let Ok(part) = policy.process(&options) else {
                continue;
            };
            for option in &part.outcome.accepted {
                if let PushedOption::Route(route) = option {
                    let net = ipnet::IpNet::V4(route.net());
                    assert!(allowed.contains(&net), "strict mode let {route:?} through");
                }
            }
        }
    }
}

/// A deterministic byte source for CBC IVs (fuzzing must be reproducible).
struct CountingRng(u8);

impl rand_core::RngCore for CountingRng {
    fn next_u32(&mut self) -> u32 {
        rand_core::impls::next_u32_via_fill(self)
    }
    fn next_u64(&mut self) -> u64 {
        rand_core::impls::next_u64_via_fill(self)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for b in dest {
            self.0 = self.0.wrapping_add(1);
            *b = self.0;
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

// Only for fuzzing: the IVs are predictable on purpose.
impl rand_core::CryptoRng for CountingRng {}

/// Parses `data` as a PROXY protocol header with the largest v2 bound; an accepted header
/// must encode again and that encoding must parse back to the same header and length.
pub fn proxy_protocol(data: &[u8]) {
    use crate::proxy_protocol::{parse_with_limit, V2_MAX_LEN};
    let Ok(Some((header, consumed))) = parse_with_limit(data, V2_MAX_LEN) else {
        return;
    };
    assert!(consumed <= data.len(), "consumed more than was given");
    let Ok(bytes) = header.to_bytes() else {
        panic!("a parsed header must encode");
    };
    assert_eq!(
        parse_with_limit(&bytes, V2_MAX_LEN),
        Ok(Some((header, bytes.len()))),
        "encode/parse round trip changed the header"
    );
}

/// Parses `data` as a strict CONNECT request and each of its header values as a routing
/// value. An accepted head must lie within `data`, re-parse from exactly its own bytes, and
/// parsing must not depend on what follows the head; an accepted routing value must print
/// back to the same string.
pub fn http_request(data: &[u8]) {
    use crate::http::connect::parse_connect_request;
    use crate::http::route::RouteValue;
    let Ok(Some((head, len))) = parse_connect_request(data) else {
        return;
    };
    assert!(len <= data.len(), "head longer than the input");
    assert_eq!(
        parse_connect_request(&data[..len]),
        Ok(Some((head.clone(), len))),
        "the head parsed differently without the bytes after it"
    );
    for header in &head.headers {
        if let Ok(route) = RouteValue::parse(&header.value) {
            assert_eq!(
                route.to_string(),
                header.value,
                "routing value not canonical"
            );
        }
    }
}

/// The addresses the push fuzz target's client dialed (server and proxy).
const FUZZ_PATH: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
];

/// Runs `data` as the options of pushes (one `PUSH_REPLY` part per NUL-separated piece)
/// through a client's policy, without filters and in strict mode, and the path guard for
/// [`FUZZ_PATH`]; whatever a complete push accepts must keep the guard's promises (no route
/// wider than pushed, none amounting to a default route, none over the path, keepalive never
/// off or below its floor).
pub fn pushed_options(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let strict = StrictPolicy::new()
        .allow(OptionKind::ALL.iter().copied())
        .allow_networks(["10.0.0.0/8", "fd00::/8"].map(|n| n.parse().expect("a network")));
    let policies = [
        PullPolicy::default(),
        PullPolicy {
            strict: Some(strict),
            ..PullPolicy::default()
        },
    ];
    let guard = PathGuard::new(FUZZ_PATH);
    for policy in &policies {
        let mut collector = PushCollector::new();
        for part in text.split('\0') {
            if let Ok(Some(mut outcome)) = collector.push_part(policy, part) {
                guard.apply(&mut outcome);
                assert_guarded(&outcome);
            }
        }
    }
}

/// The push guard's promises, checked on the options a complete push accepted.
fn assert_guarded(outcome: &PushOutcome) {
    assert_eq!(outcome.accepted.len(), outcome.accepted_texts.len());
    let ping = outcome.accepted.iter().rev().find_map(|o| match o {
        PushedOption::Ping(n) => Some(*n),
        _ => None,
    });
    let topology = Topology::of_push(&outcome.accepted);
    for option in &outcome.accepted {
        match option {
            PushedOption::Route(r) => {
                let net = r.net();
                assert_eq!(net.trunc().addr(), r.network, "wider than pushed: {r:?}");
                assert!(
                    net.prefix_len() >= crate::push::guard::WIDEST_IPV4_ROUTE,
                    "a default route: {r:?}"
                );
                let via_tunnel =
                    !matches!(r.gateway, Some(RouteVia::NetGateway | RouteVia::RemoteHost));
                assert!(
                    !via_tunnel || !FUZZ_PATH.iter().any(|a| IpNet::V4(net).contains(a)),
                    "route over the path: {r:?}"
                );
            }
            PushedOption::RouteIpv6(r) => {
                assert_eq!(r.network.trunc(), r.network, "wider than pushed: {r:?}");
                assert!(
                    r.network.prefix_len() >= crate::push::guard::WIDEST_IPV6_ROUTE
                        || crate::push::guard::UNIQUE_LOCAL.contains(&r.network),
                    "a default route: {r:?}"
                );
                assert!(
                    !FUZZ_PATH.iter().any(|a| IpNet::V6(r.network).contains(a)),
                    "route over the path: {r:?}"
                );
            }
            PushedOption::Ping(n) => assert_ne!(*n, 0, "ping switched off"),
            PushedOption::PingRestart(n) => {
                assert!(*n >= PING_RESTART_FLOOR, "ping-restart {n} below the floor");
                assert!(
                    *n >= ping.unwrap_or(0).saturating_mul(2),
                    "ping-restart {n} under 2 × ping"
                );
            }
            other => assert_eq!(
                PathGuard::new(FUZZ_PATH).captured(other, topology),
                None,
                "interface over the path: {other:?}"
            ),
        }
    }
}

/// Parses `data` as a config file in every role, as a client-config-dir file, and (one
/// `NAME=VALUE` per line) as vpn2's environment of each side: never a panic, and a refusal
/// names a line the text has.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let lines = text.split('\n').count();
    let check = |e: &ConfigError| {
        let _ = e.to_string();
        if let Some(line) = e.line {
            assert!((1..=lines).contains(&line), "line {line} of {lines}: {e}");
        }
    };
    if let Err(e) = crate::config::parse("fuzz.conf", &text) {
        check(&e);
    }
    if let Err(e) = ServerOptions::parse("fuzz.conf", &text) {
        check(&e);
    }
    if let Err(e) = ClientOptions::parse("fuzz.conf", &text) {
        check(&e);
    }
    if let Err(e) = CcdOptions::parse("fuzz-ccd", &text) {
        check(&e);
    }
    let vars = text.lines().map(|l| l.split_once('=').unwrap_or((l, "")));
    let _ = Vpn2ServerEnv::parse(vars.clone()).map_err(|e| e.to_string());
    let _ = Vpn2ClientEnv::parse(vars).map_err(|e| e.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_entry_point_sees_routes() {
        control_messages(
            b"PUSH_REPLY,route 10.1.0.0 255.255.0.0,route 192.168.0.0 255.255.0.0,ping 10\0",
        );
    }

    #[test]
    fn entry_points_accept_odd_input() {
        let inputs: [&[u8]; 5] = [
            b"",
            &[0x00],
            &[0x00, 0x00, 0x38],
            &[0x00, 0x01, 0x38, 0x00],
            &[0x38, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0],
        ];
        for input in inputs {
            framing(input);
            control_packet(input);
            tls_auth_unwrap(input);
            tls_crypt_unwrap(input);
            data_decrypt(input);
            key_method_2(input);
            control_messages(input);
            proxy_protocol(input);
            http_request(input);
            pushed_options(input);
            config(input);
        }
    }

    #[test]
    fn push_and_config_entry_points_take_real_text() {
        pushed_options(
            b"route 10.252.9.9 255.0.0.0,route 10.0.0.0 255.0.0.0,route-ipv6 fd00::1/64,\
              ping 0,ping-restart 1,ping 5,push-continuation 2\0route 192.0.2.0 255.255.255.0",
        );
        config(b"client\ndev tun\nproto tcp\nremote 192.0.2.1 1194\n<ca>\nnot a pem\n");
        config(b"SERVICE_NETWORK=100.64.0.0/13\nIS_HA=maybe\n");
    }

    /// The checks the fuzzer hunts with can fail: a misaligned route or `ping-restart` under
    /// its floor in an accepted push is caught.
    #[test]
    #[should_panic(expected = "wider than pushed")]
    fn a_misaligned_accepted_route_is_caught() {
        let route = PushedOption::Route(crate::push::options::Route {
            network: Ipv4Addr::new(10, 252, 9, 9),
            netmask: Ipv4Addr::new(255, 0, 0, 0),
            gateway: None,
            metric: None,
        });
        let outcome = PushOutcome {
            accepted: vec![route],
            accepted_texts: vec!["route 10.252.9.9 255.0.0.0".into()],
            ..PushOutcome::default()
        };
        assert_guarded(&outcome);
    }
}
