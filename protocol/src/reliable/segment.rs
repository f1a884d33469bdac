//! How much TLS ciphertext one control packet may carry.
//!
//! ```text
//! max_payload = min(TLS_CHANNEL_BUF_SIZE, tls_mtu) - overhead
//! overhead    = 1 (opcode) + 8 (own sid) + ACK_SIZE(min(acks, CONTROL_SEND_ACK_MAX))
//!               + 4 (msg id) + wrap + ip_udp
//! ACK_SIZE(n) = 1 + 4n + (n > 0 ? 8 : 0)            (count, ids, remote sid)
//! wrap        = tls-auth: H + 8 (HMAC, replay id, time)   tls-crypt: 56   none: 0
//! ip_udp      = 28 (IPv4 peer) or 48 (IPv6 peer), counted even on TCP
//! ```
//!
//! Example (observed from OpenVPN 2.6): tls-mtu 1250, SHA1 tls-auth, IPv4 peer, 2 ACKs
//! riding along: `1250 - (1 + 8 + 17 + 4 + 28 + 28) = 1164` payload bytes.

use crate::ids::SessionId;

use super::{ReliableError, CONTROL_SEND_ACK_MAX};
use crate::packet::MESSAGE_ID_LEN;

/// `TLS_CHANNEL_BUF_SIZE`: upper bound of a control packet, whatever `tls-mtu` says.
pub const TLS_CHANNEL_BUF_SIZE: usize = 2048;
/// `TLS_MTU_DEFAULT`: the default `--tls-mtu`.
pub const TLS_MTU_DEFAULT: u16 = 1250;
/// `TLS_CHANNEL_MTU_MIN`: the smallest `--tls-mtu` accepted.
pub const TLS_CHANNEL_MTU_MIN: u16 = 154;
/// Largest `--tls-mtu` accepted (the control buffer size).
pub const TLS_CHANNEL_MTU_MAX: u16 = TLS_CHANNEL_BUF_SIZE as u16;
/// Payload floor: when the overhead leaves less than this, OpenVPN still sends 16 bytes.
pub const MIN_CONTROL_PAYLOAD: usize = 16;
/// IP + UDP header budget for an IPv4 peer (`datagram_overhead`).
pub const IPV4_UDP_OVERHEAD: usize = 28;
/// IP + UDP header budget for an IPv6 peer (`datagram_overhead`).
pub const IPV6_UDP_OVERHEAD: usize = 48;
/// tls-crypt budget (`tls_crypt_buf_overhead`): replay id and time, tag, one block.
pub const TLS_CRYPT_OVERHEAD: usize = 8 + 32 + 16;
/// tls-auth replay id and time after the HMAC (`packet_id_size(true)`).
pub const TLS_AUTH_PID_OVERHEAD: usize = 8;

/// `ACK_SIZE(n)`: bytes of an ACK array with `n` ids (count byte, ids, remote session id
/// when `n > 0`).
pub const fn ack_size(n: usize) -> usize {
    1 + 4 * n + if n > 0 { SessionId::LEN } else { 0 }
}

/// A validated `--tls-mtu` (154..=2048, default 1250).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TlsMtu(u16);

impl TlsMtu {
    /// The default, 1250.
    pub const DEFAULT: TlsMtu = TlsMtu(TLS_MTU_DEFAULT);

    /// Checks the bounds.
    pub fn new(tls_mtu: u16) -> Result<TlsMtu, ReliableError> {
        if (TLS_CHANNEL_MTU_MIN..=TLS_CHANNEL_MTU_MAX).contains(&tls_mtu) {
            Ok(TlsMtu(tls_mtu))
        } else {
            Err(ReliableError::TlsMtuOutOfRange { tls_mtu })
        }
    }

    /// The value.
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl Default for TlsMtu {
    fn default() -> Self {
        TlsMtu::DEFAULT
    }
}

/// The control-channel protection in use, for its per-packet overhead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrapOverhead {
    /// No tls-auth / tls-crypt.
    None,
    /// tls-auth with an HMAC of `hmac_len` bytes (SHA1 20, SHA256 32, SHA512 64).
    TlsAuth {
        /// Digest size of `--auth`.
        hmac_len: usize,
    },
    /// tls-crypt (v1 or v2).
    TlsCrypt,
}

impl WrapOverhead {
    /// Bytes budgeted per packet.
    pub const fn overhead(self) -> usize {
        match self {
            WrapOverhead::None => 0,
            WrapOverhead::TlsAuth { hmac_len } => hmac_len + TLS_AUTH_PID_OVERHEAD,
            WrapOverhead::TlsCrypt => TLS_CRYPT_OVERHEAD,
        }
    }
}

/// Address family of the peer, for the IP/UDP header budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerFamily {
    /// IPv4 peer: 28 bytes.
    Ipv4,
    /// IPv6 peer: 48 bytes.
    Ipv6,
}

impl PeerFamily {
    /// Bytes budgeted per packet.
    pub const fn overhead(self) -> usize {
        match self {
            PeerFamily::Ipv4 => IPV4_UDP_OVERHEAD,
            PeerFamily::Ipv6 => IPV6_UDP_OVERHEAD,
        }
    }
}

/// The fixed inputs of the payload budget of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadLimits {
    /// `--tls-mtu`.
    pub tls_mtu: TlsMtu,
    /// tls-auth / tls-crypt / none.
    pub wrap: WrapOverhead,
    /// The peer's address family.
    pub peer_family: PeerFamily,
}

impl PayloadLimits {
    /// [`max_control_payload`] with these limits.
    pub fn max_payload(&self, acks: usize) -> usize {
        max_control_payload(self.tls_mtu, acks, self.wrap, self.peer_family)
    }
}

/// Largest payload of one P_CONTROL_V1 when `acks` ACK ids are expected to ride along
/// (clamped to [`CONTROL_SEND_ACK_MAX`]); never below [`MIN_CONTROL_PAYLOAD`].
pub fn max_control_payload(
    tls_mtu: TlsMtu,
    acks: usize,
    wrap: WrapOverhead,
    peer_family: PeerFamily,
) -> usize {
    let overhead = 1
        + SessionId::LEN
        + ack_size(acks.min(CONTROL_SEND_ACK_MAX))
        + MESSAGE_ID_LEN
        + wrap.overhead()
        + peer_family.overhead();
    usize::from(tls_mtu.get())
        .min(TLS_CHANNEL_BUF_SIZE)
        .saturating_sub(overhead)
        .max(MIN_CONTROL_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_server_hello_chunk_is_1164_bytes() {
        let limits = PayloadLimits {
            tls_mtu: TlsMtu::DEFAULT,
            wrap: WrapOverhead::TlsAuth { hmac_len: 20 },
            peer_family: PeerFamily::Ipv4,
        };
        assert_eq!(ack_size(2), 17);
        assert_eq!(limits.max_payload(2), 1164);
        // Total packet (without the IP/UDP budget) as captured: 1222 bytes.
        assert_eq!(1164 + 1 + 8 + ack_size(2) + 4 + 28, 1222);
    }

    #[test]
    fn budget_edges() {
        assert_eq!(ack_size(0), 1);
        assert_eq!(ack_size(4), 25);
        let v6_crypt = |mtu, acks| {
            max_control_payload(
                TlsMtu::new(mtu).expect("mtu"),
                acks,
                WrapOverhead::TlsCrypt,
                PeerFamily::Ipv6,
            )
        };
        // ACKs beyond four are not budgeted.
        assert_eq!(v6_crypt(2048, 8), v6_crypt(2048, 4));
        assert_eq!(v6_crypt(2048, 0), 2048 - (1 + 8 + 1 + 4 + 56 + 48));
        // The floor.
        let tiny = max_control_payload(
            TlsMtu::new(TLS_CHANNEL_MTU_MIN).expect("mtu"),
            4,
            WrapOverhead::TlsAuth { hmac_len: 64 },
            PeerFamily::Ipv6,
        );
        assert_eq!(tiny, MIN_CONTROL_PAYLOAD);
        assert_eq!(WrapOverhead::None.overhead(), 0);
        assert_eq!(
            TlsMtu::new(153),
            Err(ReliableError::TlsMtuOutOfRange { tls_mtu: 153 })
        );
        assert!(TlsMtu::new(2049).is_err());
        assert_eq!(TlsMtu::default().get(), 1250);
    }
}
