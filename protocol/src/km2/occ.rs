//! The OCC options string: a comma-separated summary of local settings in every
//! key-method-2 message (reference 6.3).
//!
//! ```text
//! V4,dev-type tun,link-mtu 1543,tun-mtu 1500,proto TCPv4_CLIENT,keydir 1,auth SHA1,keysize 128,tls-auth,key-method 2,tls-client
//! ```
//!
//! Field order: `V4`, `dev-type`, `link-mtu`, `tun-mtu`, `proto`, `comp-lzo` (optional),
//! `keydir` (optional), `cipher` (optional), `auth`, `keysize`, `tls-auth` (optional),
//! `key-method 2`, `tls-client|tls-server`.
//! OpenVPN only warns when the peer's string differs from what it expects, unless it runs
//! `--opt-verify`; the receiver reads `cipher` from it for "poor man's NCP" and checks for
//! `comp-lzo`. [`OccSettings::options_string`] builds ours; [`OccOptions::parse`] reads the
//! peer's. One field we do not only warn about: a peer whose `dev-type` is `tun` while ours is
//! `tap`, or the other way round, carries packets of the other layer ([`check_dev_type`]; both
//! sessions refuse it, conformance/DEVIATIONS.md W4).
//!
//! `link-mtu` is computed as 2.6 does for the OCC string (`calc_options_string_link_mtu`,
//! including the arithmetic older versions got wrong, kept for compatibility):
//!
//! ```text
//! link-mtu = tun-mtu + 32 (tap only) + 1 (v1 compression framing)
//!          + 2 (TCP length) + 1 (opcode)
//!          + no --cipher (BF-CBC): 16 + 4 (packet id) + HMAC
//!          | AES-CBC:              4 (packet id) + 16 (block) + 16 (IV) + HMAC
//!          | AES-GCM:              4 (packet id) + 16 (tag) + 12 (IV) + 16 (block)
//!          | CHACHA20-POLY1305:    4 (packet id) + 16 (tag) + 12 (IV) + 1 (block)
//! ```

use std::fmt::{self, Write as _};

use crate::data::{Compression, DataCipher};
use crate::digest::Digest;
use crate::key::{KeyDirection, Role};

/// The OCC string version prefix.
pub const OCC_VERSION: &str = "V4";

/// `TAP_MTU_EXTRA_DEFAULT`: what a tap device adds to the link MTU.
pub const TAP_MTU_EXTRA_DEFAULT: u32 = 32;

/// The `dev-type` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DevType {
    /// `tun`: IP packets.
    #[default]
    Tun,
    /// `tap`: Ethernet frames.
    Tap,
    /// `null`: no device.
    Null,
}

impl DevType {
    /// The name as written in the OCC string.
    pub const fn name(self) -> &'static str {
        match self {
            DevType::Tun => "tun",
            DevType::Tap => "tap",
            DevType::Null => "null",
        }
    }

    /// The value of an OCC `dev-type` field, `None` for one OpenVPN does not write.
    pub fn from_name(name: &str) -> Option<DevType> {
        match name {
            "tun" => Some(DevType::Tun),
            "tap" => Some(DevType::Tap),
            "null" => Some(DevType::Null),
            _ => None,
        }
    }
}

impl fmt::Display for DevType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A peer whose OCC `dev-type` is `tun` while ours is `tap`, or the other way round: its
/// packets are of the other layer (IP packets against Ethernet frames), so no packet could
/// cross. Its `Display` is the reason a server sends with `AUTH_FAILED`, e.g.
/// `dev-type tap, this server is tun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("dev-type {peer}, this {} is {ours}", side(*role))]
pub struct DevTypeMismatch {
    /// The peer's `dev-type`.
    pub peer: DevType,
    /// Ours.
    pub ours: DevType,
    /// Our role.
    pub role: Role,
}

const fn side(role: Role) -> &'static str {
    match role {
        Role::Client => "client",
        Role::Server => "server",
    }
}

/// Whether a peer with the options string `peer` may be carried by us (`ours`, in `role`):
/// refused only when both `dev-type`s are `tun` or `tap` and differ. A string without a
/// `dev-type` field, or with `null` or a value we do not know, passes, as before this check.
pub fn check_dev_type(ours: DevType, role: Role, peer: &OccOptions) -> Result<(), DevTypeMismatch> {
    let layered = |d: DevType| matches!(d, DevType::Tun | DevType::Tap);
    match peer.dev_type() {
        Some(theirs) if layered(theirs) && layered(ours) && theirs != ours => {
            Err(DevTypeMismatch {
                peer: theirs,
                ours,
                role,
            })
        }
        _ => Ok(()),
    }
}

/// The `proto` field. IPv6 transports are reported as their IPv4 names, as OpenVPN does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OccProto {
    /// `UDPv4`.
    Udp,
    /// `TCPv4_CLIENT`.
    TcpClient,
    /// `TCPv4_SERVER`.
    TcpServer,
}

impl OccProto {
    /// The name as written in the OCC string.
    pub const fn name(self) -> &'static str {
        match self {
            OccProto::Udp => "UDPv4",
            OccProto::TcpClient => "TCPv4_CLIENT",
            OccProto::TcpServer => "TCPv4_SERVER",
        }
    }

    /// The TCP proto of a role (the TLS client connects).
    pub const fn tcp(role: Role) -> OccProto {
        match role {
            Role::Client => OccProto::TcpClient,
            Role::Server => OccProto::TcpServer,
        }
    }
}

/// The local settings the OCC string summarises.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OccSettings {
    /// `dev-type`.
    pub dev_type: DevType,
    /// `tun-mtu` (default 1500).
    pub tun_mtu: u16,
    /// `proto`.
    pub proto: OccProto,
    /// The compression framing; anything but [`Compression::None`] writes `comp-lzo`, and
    /// the one-byte (v1) framings add 1 to `link-mtu`.
    pub compression: Compression,
    /// The tls-auth key direction, when one is configured (`keydir 0|1`).
    pub key_direction: Option<KeyDirection>,
    /// `--cipher`, if set; `None` is OpenVPN's internal `BF-CBC` default.
    pub cipher: Option<DataCipher>,
    /// Whether `cipher` is in `--data-ciphers`: only then is `cipher NAME` written.
    pub cipher_in_data_ciphers: bool,
    /// `--auth` (written as `[null-digest]` with an AEAD `cipher`).
    pub auth: Digest,
    /// Whether tls-auth protects the control channel (not written for tls-crypt).
    pub tls_auth: bool,
    /// `tls-client` or `tls-server`.
    pub role: Role,
}

impl OccSettings {
    /// The 2.6 defaults for `role` over TCP: `dev tun`, `tun-mtu 1500`, no compression, no
    /// key direction, no `--cipher`, `auth SHA1`, no tls-auth.
    pub fn new(role: Role) -> OccSettings {
        OccSettings {
            dev_type: DevType::Tun,
            tun_mtu: 1500,
            proto: OccProto::tcp(role),
            compression: Compression::None,
            key_direction: None,
            cipher: None,
            cipher_in_data_ciphers: false,
            auth: Digest::Sha1,
            tls_auth: false,
            role,
        }
    }

    /// These settings with tls-auth in `direction` (the usual `tls-auth ta.key 0|1`).
    pub fn with_tls_auth(mut self, direction: KeyDirection) -> OccSettings {
        self.tls_auth = true;
        self.key_direction = match direction {
            KeyDirection::Bidirectional => None,
            d => Some(d),
        };
        self
    }

    /// The OCC settings the peer is expected to have: the same with the role, proto and key
    /// direction mirrored (OpenVPN's "Expected Remote Options String").
    pub fn expected_peer(&self) -> OccSettings {
        let role = match self.role {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        };
        OccSettings {
            role,
            proto: match self.proto {
                OccProto::Udp => OccProto::Udp,
                _ => OccProto::tcp(role),
            },
            key_direction: self.key_direction.map(|d| match d {
                KeyDirection::Normal => KeyDirection::Inverse,
                KeyDirection::Inverse => KeyDirection::Normal,
                KeyDirection::Bidirectional => KeyDirection::Bidirectional,
            }),
            ..self.clone()
        }
    }

    /// `link-mtu` as 2.6 computes it for the OCC string (module docs).
    pub fn link_mtu(&self) -> u32 {
        let mut mtu = u32::from(self.tun_mtu);
        if self.dev_type == DevType::Tap {
            mtu += TAP_MTU_EXTRA_DEFAULT;
        }
        if matches!(
            self.compression,
            Compression::LzoStub | Compression::StubSwap
        ) {
            mtu += 1;
        }
        if self.proto != OccProto::Udp {
            mtu += 2;
        }
        mtu += 1; // opcode
        const PACKET_ID: u32 = 4;
        let hmac = self.auth.output_len() as u32;
        mtu += match self.cipher {
            // BF-CBC: 8-byte block and IV added by hand, the cipher then treated as none.
            None => 16 + PACKET_ID + hmac,
            Some(DataCipher::Aes128Cbc | DataCipher::Aes256Cbc) => PACKET_ID + 16 + 16 + hmac,
            Some(DataCipher::Aes128Gcm | DataCipher::Aes256Gcm) => PACKET_ID + 16 + 12 + 16,
            Some(DataCipher::ChaCha20Poly1305) => PACKET_ID + 16 + 12 + 1,
        };
        mtu
    }

    /// `keysize`: 128 for the BF-CBC default, else the cipher's key bits.
    pub fn keysize(&self) -> usize {
        self.cipher.map_or(128, |c| c.key_len() * 8)
    }

    /// The OCC options string (without NUL).
    pub fn options_string(&self) -> String {
        let mut s = String::with_capacity(160);
        // Writing into a String cannot fail.
        let _ = self.write(&mut s);
        s
    }

    fn write(&self, s: &mut String) -> fmt::Result {
        write!(
            s,
            "{OCC_VERSION},dev-type {},link-mtu {},tun-mtu {},proto {}",
            self.dev_type.name(),
            self.link_mtu(),
            self.tun_mtu,
            self.proto.name()
        )?;
        if self.compression != Compression::None {
            s.push_str(",comp-lzo");
        }
        match self.key_direction {
            Some(KeyDirection::Normal) => s.push_str(",keydir 0"),
            Some(KeyDirection::Inverse) => s.push_str(",keydir 1"),
            Some(KeyDirection::Bidirectional) | None => {}
        }
        if let (Some(c), true) = (self.cipher, self.cipher_in_data_ciphers) {
            write!(s, ",cipher {c}")?;
        }
        match self.cipher {
            Some(c) if c.is_aead() => s.push_str(",auth [null-digest]"),
            _ => write!(s, ",auth {}", self.auth.name())?,
        }
        write!(s, ",keysize {}", self.keysize())?;
        if self.tls_auth {
            s.push_str(",tls-auth");
        }
        s.push_str(",key-method 2");
        s.push_str(match self.role {
            Role::Client => ",tls-client",
            Role::Server => ",tls-server",
        });
        Ok(())
    }
}

/// A received OCC options string split into its fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OccOptions {
    /// The fields in order: `(name, value)`, value `None` for bare flags (`tls-auth`); the
    /// value is everything after the first space.
    pub fields: Vec<(String, Option<String>)>,
}

impl OccOptions {
    /// Splits `s` at commas, each field at its first space. Never fails; an empty string
    /// gives no fields.
    pub fn parse(s: &str) -> OccOptions {
        let fields = s
            .split(',')
            .filter(|f| !f.is_empty())
            .map(|f| match f.split_once(' ') {
                Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                None => (f.to_owned(), None),
            })
            .collect();
        OccOptions { fields }
    }

    /// The value of the first field named `name`, `None` if absent or a bare flag.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Whether a field named `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.fields.iter().any(|(k, _)| k == name)
    }

    /// The `cipher` field ("poor man's NCP"), with `[null-cipher]` read as `none` like
    /// OpenVPN.
    pub fn cipher(&self) -> Option<&str> {
        match self.value("cipher")? {
            "[null-cipher]" => Some("none"),
            c => Some(c),
        }
    }

    /// Whether the peer has a compression context (`comp-lzo` field).
    pub fn comp_lzo(&self) -> bool {
        self.has("comp-lzo")
    }

    /// The `dev-type` field, `None` if absent or a value OpenVPN does not write.
    pub fn dev_type(&self) -> Option<DevType> {
        self.value("dev-type").and_then(DevType::from_name)
    }
}

impl fmt::Display for OccOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            f.write_str(k)?;
            if let Some(v) = v {
                write!(f, " {v}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream 2.6's strings, as a tap and a tun client send them (vpn2's HA and non-HA
    /// clients: `auth SHA256`, tls-auth direction 1, `data-ciphers AES-256-GCM`).
    const TAP_CLIENT: &str = "V4,dev-type tap,link-mtu 1587,tun-mtu 1500,proto TCPv4_CLIENT,\
                              keydir 1,auth SHA256,keysize 128,tls-auth,key-method 2,tls-client";
    const TUN_CLIENT: &str = "V4,dev-type tun,link-mtu 1555,tun-mtu 1500,proto TCPv4_CLIENT,\
                              keydir 1,auth SHA256,keysize 128,tls-auth,key-method 2,tls-client";

    #[test]
    fn a_tap_peer_of_a_tun_server_is_refused_and_the_reason_names_both() {
        let peer = OccOptions::parse(TAP_CLIENT);
        assert_eq!(peer.dev_type(), Some(DevType::Tap));
        let refused = check_dev_type(DevType::Tun, Role::Server, &peer).unwrap_err();
        assert_eq!(refused.to_string(), "dev-type tap, this server is tun");
        let tun = OccOptions::parse(TUN_CLIENT);
        let refused = check_dev_type(DevType::Tap, Role::Server, &tun).unwrap_err();
        assert_eq!(refused.to_string(), "dev-type tun, this server is tap");
        let refused = check_dev_type(DevType::Tun, Role::Client, &peer).unwrap_err();
        assert_eq!(refused.to_string(), "dev-type tap, this client is tun");
    }

    #[test]
    fn the_same_dev_type_passes() {
        assert_eq!(
            check_dev_type(DevType::Tun, Role::Server, &OccOptions::parse(TUN_CLIENT)),
            Ok(())
        );
        assert_eq!(
            check_dev_type(DevType::Tap, Role::Server, &OccOptions::parse(TAP_CLIENT)),
            Ok(())
        );
        // Ours, built by the same module, against the expected peer's of each type.
        for dev_type in [DevType::Tun, DevType::Tap] {
            let mut ours = OccSettings::new(Role::Server);
            ours.dev_type = dev_type;
            let peer = OccOptions::parse(&ours.expected_peer().options_string());
            assert_eq!(check_dev_type(dev_type, Role::Server, &peer), Ok(()));
        }
    }

    #[test]
    fn without_a_known_dev_type_the_peer_passes_as_before() {
        for s in [
            "",
            "V4,link-mtu 1579,tun-mtu 1500,proto TCPv4_CLIENT,key-method 2,tls-client",
            "V4,dev-type null,link-mtu 1579",
            "V4,dev-type ethernet,link-mtu 1579",
            "V4,dev-type,link-mtu 1579",
        ] {
            let peer = OccOptions::parse(s);
            for ours in [DevType::Tun, DevType::Tap] {
                assert_eq!(check_dev_type(ours, Role::Server, &peer), Ok(()), "{s:?}");
                assert_eq!(check_dev_type(ours, Role::Client, &peer), Ok(()), "{s:?}");
            }
        }
        // Nor does a device-less side of ours refuse anyone.
        let peer = OccOptions::parse(TAP_CLIENT);
        assert_eq!(check_dev_type(DevType::Null, Role::Server, &peer), Ok(()));
    }
}
