//! Test packets for the offload tests: TCP over IPv4 or IPv6 built with valid checksums, and a
//! checker written apart from `checksum` (16-bit words, the slow obvious way), so the code
//! under test is not checked by itself.

/// A TCP segment's fields.
#[derive(Debug, Clone)]
pub struct Tcp {
    pub v6: bool,
    pub src4: [u8; 4],
    pub dst4: [u8; 4],
    pub src6: [u8; 16],
    pub dst6: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// TCP options (a multiple of 4 bytes).
    pub options: Vec<u8>,
    pub id: u16,
    pub ttl: u8,
    pub tos: u8,
    pub window: u16,
}

impl Default for Tcp {
    fn default() -> Tcp {
        let mut src6 = [0u8; 16];
        src6[..2].copy_from_slice(&[0xfd, 0x00]);
        src6[15] = 1;
        let mut dst6 = src6;
        dst6[15] = 2;
        Tcp {
            v6: false,
            src4: [10, 0, 0, 1],
            dst4: [10, 0, 0, 2],
            src6,
            dst6,
            sport: 40000,
            dport: 5201,
            seq: 1000,
            ack: 77,
            flags: 0x10,
            options: Vec::new(),
            id: 1,
            ttl: 64,
            tos: 0,
            window: 502,
        }
    }
}

/// RFC 1071 sum of 16-bit big-endian words, folded, not complemented.
pub fn sum16(parts: &[&[u8]]) -> u16 {
    let all: Vec<u8> = parts.concat();
    let mut sum: u64 = 0;
    for pair in all.chunks(2) {
        sum += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn pseudo(t: &Tcp, tcp_len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    if t.v6 {
        p.extend_from_slice(&t.src6);
        p.extend_from_slice(&t.dst6);
    } else {
        p.extend_from_slice(&t.src4);
        p.extend_from_slice(&t.dst4);
    }
    p.extend_from_slice(&[0, 6]);
    p.extend_from_slice(&(tcp_len as u32).to_be_bytes());
    p
}

/// A TCP packet with `payload`, valid IP (v4) and TCP checksums.
pub fn tcp_packet(t: &Tcp, payload: &[u8]) -> Vec<u8> {
    assert_eq!(t.options.len() % 4, 0);
    let tcp_len = 20 + t.options.len() + payload.len();
    let mut p = Vec::new();
    if t.v6 {
        p.extend_from_slice(&[0x60 | (t.tos >> 4), t.tos << 4, 0x12, 0x34]);
        p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        p.extend_from_slice(&[6, t.ttl]);
        p.extend_from_slice(&t.src6);
        p.extend_from_slice(&t.dst6);
    } else {
        p.extend_from_slice(&[0x45, t.tos]);
        p.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        p.extend_from_slice(&t.id.to_be_bytes());
        p.extend_from_slice(&[0x40, 0, t.ttl, 6, 0, 0]);
        p.extend_from_slice(&t.src4);
        p.extend_from_slice(&t.dst4);
        let c = !sum16(&[&p[..20]]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let th = p.len();
    p.extend_from_slice(&t.sport.to_be_bytes());
    p.extend_from_slice(&t.dport.to_be_bytes());
    p.extend_from_slice(&t.seq.to_be_bytes());
    p.extend_from_slice(&t.ack.to_be_bytes());
    p.push((((20 + t.options.len()) / 4) << 4) as u8);
    p.push(t.flags);
    p.extend_from_slice(&t.window.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0]);
    p.extend_from_slice(&t.options);
    p.extend_from_slice(payload);
    let c = !sum16(&[&pseudo(t, tcp_len), &p[th..]]);
    p[th + 16..th + 18].copy_from_slice(&c.to_be_bytes());
    p
}

/// Whether `p` is a TCP packet (IPv4 without options, or IPv6 without extension headers)
/// with consistent lengths and valid checksums.
pub fn tcp_valid(p: &[u8]) -> bool {
    let (th, t) = match p.first().map(|b| b >> 4) {
        Some(4) => {
            if p.len() < 40
                || usize::from(u16::from_be_bytes([p[2], p[3]])) != p.len()
                || sum16(&[&p[..20]]) != 0xffff
            {
                return false;
            }
            let mut t = Tcp::default();
            t.src4.copy_from_slice(&p[12..16]);
            t.dst4.copy_from_slice(&p[16..20]);
            (20, t)
        }
        Some(6) => {
            if p.len() < 60 || usize::from(u16::from_be_bytes([p[4], p[5]])) + 40 != p.len() {
                return false;
            }
            let mut t = Tcp {
                v6: true,
                ..Tcp::default()
            };
            t.src6.copy_from_slice(&p[8..24]);
            t.dst6.copy_from_slice(&p[24..40]);
            (40, t)
        }
        _ => return false,
    };
    sum16(&[&pseudo(&t, p.len() - th), &p[th..]]) == 0xffff
}
