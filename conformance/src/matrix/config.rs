//! The config text of a case, the same for both implementations of a side.

use std::fmt;
use std::path::Path;

use super::lab::{PROXY_ADDR, PROXY_PORT, SERVER_ADDR, SERVER_PORT};
use crate::pki_fixture::TestPki;

/// The value of the `Reversed-VPN` header the clients send through the proxy (vpn2's shape).
pub const REVERSED_VPN_HEADER: &str = "outbound|1194||vpn-seed-server";

/// vpn2's default IPv6 transfer network (`VPN_NETWORK` unset).
pub const TRANSFER_NET_V6: &str = "fd8f:6d53:b97a:1::/96";
/// The server's tunnel address on it.
pub const SERVER_TUN_V6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd8f, 0x6d53, 0xb97a, 1, 0, 0, 0, 1);

/// Control-channel protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// No wrapping.
    None,
    /// `tls-auth ta.key 0` on the server, `1` on the client (vpn2's key directions), with
    /// `auth` as the HMAC digest.
    TlsAuth,
    /// `tls-crypt ta.key`.
    TlsCrypt,
}

/// How the client reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `remote SERVER 1194`.
    Direct,
    /// `http-proxy PROXY 3128` with `CUSTOM-HEADER Reversed-VPN ...`, our recording proxy
    /// ([`super::proxy`]): the case asserts the header arrived.
    Proxy,
    /// The same through Debian's tinyproxy (a real proxy; it does not log headers).
    Tinyproxy,
}

/// The options of a case that go into both configs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Options {
    /// The server's `data-ciphers`.
    pub server_ciphers: &'static str,
    /// The client's `data-ciphers`.
    pub client_ciphers: &'static str,
    /// `auth` on both sides (data-channel HMAC for CBC, the tls-auth digest).
    pub auth: &'static str,
    /// Control-channel protection.
    pub control: Control,
    /// Direct or through the proxy.
    pub transport: Transport,
    /// vpn2's transfer network: `server-ipv6` only, no IPv4 pool (the tunnel carries IPv6).
    pub ipv6_only: bool,
    /// Whether our sides offer the TLS exporter for data keys (upstream 2.6 always does);
    /// without it the session falls back to the TLS 1.0 PRF.
    pub ekm: bool,
}

impl Options {
    /// The same cipher list on both sides.
    pub fn cipher(
        cipher: &'static str,
        auth: &'static str,
        control: Control,
        transport: Transport,
    ) -> Self {
        Self {
            server_ciphers: cipher,
            client_ciphers: cipher,
            auth,
            control,
            transport,
            ipv6_only: false,
            ekm: true,
        }
    }

    /// The same options on vpn2's IPv6-only transfer network.
    pub fn ipv6_only(self) -> Self {
        Self {
            ipv6_only: true,
            ..self
        }
    }

    /// The same options with the exporter off on our sides.
    pub fn prf(self) -> Self {
        Self { ekm: false, ..self }
    }
}

impl fmt::Display for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.server_ciphers == self.client_ciphers {
            write!(f, "{}", self.server_ciphers)?;
        } else {
            write!(f, "s:{} c:{}", self.server_ciphers, self.client_ciphers)?;
        }
        if self.server_ciphers.contains("CBC") {
            write!(f, "+{}", self.auth)?;
        }
        match self.control {
            Control::None => f.write_str(" no-wrap")?,
            Control::TlsAuth => write!(f, " tls-auth/{}", self.auth)?,
            Control::TlsCrypt => f.write_str(" tls-crypt")?,
        }
        match self.transport {
            Transport::Direct => f.write_str(" direct")?,
            Transport::Proxy => f.write_str(" proxy")?,
            Transport::Tinyproxy => f.write_str(" tinyproxy")?,
        }
        if self.ipv6_only {
            f.write_str(" ipv6-transfer-net")?;
        }
        if !self.ekm {
            f.write_str(" ours-without-ekm")?;
        }
        Ok(())
    }
}

/// The server's config: `options` and `extra` lines (e.g. `reneg-sec 5`, `push "..."`).
pub fn server(pki: &TestPki, options: &Options, extra: &[String]) -> String {
    let mut lines = vec![
        "proto tcp-server".to_owned(),
        format!("local {SERVER_ADDR}"),
        format!("port {SERVER_PORT}"),
        "dev tun".to_owned(),
        "topology subnet".to_owned(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.server_cert().display()),
        format!("key {}", pki.server_key().display()),
        "dh none".to_owned(),
        format!("data-ciphers {}", options.server_ciphers),
        format!("auth {}", options.auth),
    ];
    if options.ipv6_only {
        // As vpn2 renders it: no IPv4 pool at all.
        lines.push("mode server".to_owned());
        lines.push("tls-server".to_owned());
        lines.push(format!("server-ipv6 {TRANSFER_NET_V6}"));
    } else {
        lines.push("server 192.168.123.0 255.255.255.0".to_owned());
    }
    lines.extend(wrap(pki.ta_key().as_path(), options.control, "0"));
    lines.extend(extra.iter().cloned());
    lines.join("\n") + "\n"
}

/// The client's config: `options` and `extra` lines.
pub fn client(pki: &TestPki, options: &Options, extra: &[String]) -> String {
    let mut lines = vec![
        "client".to_owned(),
        "proto tcp-client".to_owned(),
        format!("remote {SERVER_ADDR} {SERVER_PORT}"),
        "dev tun".to_owned(),
        "nobind".to_owned(),
        "connect-retry 1 2".to_owned(),
        format!("ca {}", pki.ca_cert().display()),
        format!("cert {}", pki.client_cert().display()),
        format!("key {}", pki.client_key().display()),
        "remote-cert-tls server".to_owned(),
        format!("data-ciphers {}", options.client_ciphers),
        format!("auth {}", options.auth),
    ];
    lines.extend(wrap(pki.ta_key().as_path(), options.control, "1"));
    if options.transport != Transport::Direct {
        lines.push(format!("http-proxy {PROXY_ADDR} {PROXY_PORT}"));
        lines.push(format!(
            "http-proxy-option CUSTOM-HEADER Reversed-VPN {REVERSED_VPN_HEADER}"
        ));
    }
    lines.extend(extra.iter().cloned());
    lines.join("\n") + "\n"
}

fn wrap(ta_key: &Path, control: Control, direction: &str) -> Option<String> {
    match control {
        Control::None => None,
        Control::TlsAuth => Some(format!("tls-auth {} {direction}", ta_key.display())),
        Control::TlsCrypt => Some(format!("tls-crypt {}", ta_key.display())),
    }
}
