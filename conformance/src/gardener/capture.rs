//! Packets seen on an interface of a lab namespace: Debian's `tcpdump` writes them to a pcap
//! file while a check runs, [`Capture::finish`] stops it and reads the IP, TCP, UDP and ICMP
//! headers back ([`Packet`]), with the TCP MSS option.
//!
//! Only what the checks look at is decoded: Ethernet (veth, tap) and raw IP (tun) link types,
//! IPv4 and IPv6 without extension headers, the TCP flags and MSS option, ports, and the IP
//! packet an IPv6 packet with next header 4 or 41 carries (`ip6tnl`'s encapsulation,
//! [`Packet::inner`]). Anything else is kept as "other" with its addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::netns::Netns;
use crate::LabError;

/// How long tcpdump may take to open the interface.
const START: Duration = Duration::from_secs(10);
/// How long packets in flight get before the capture stops.
const SETTLE: Duration = Duration::from_millis(300);

/// A running capture; stopped (and its file deleted) when dropped.
#[derive(Debug)]
pub struct Capture<'ns> {
    ns: &'ns Netns,
    pid: Option<u32>,
    /// Holds the file until the capture is dropped.
    _dir: TempDir,
    file: PathBuf,
    what: String,
}

/// TCP flag bits.
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// The transport part of a [`Packet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP: ports, flags, the MSS option if present.
    Tcp {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
        /// Flag bits ([`flags`]).
        flags: u8,
        /// The MSS option.
        mss: Option<u16>,
    },
    /// UDP: ports.
    Udp {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
    },
    /// ICMP or ICMPv6: type and code.
    Icmp {
        /// Type.
        kind: u8,
        /// Code.
        code: u8,
    },
    /// Another protocol (its number).
    Other(u8),
}

/// One captured IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// What it carries ([`Transport::Other`] 4 or 41 for an encapsulated packet).
    pub transport: Transport,
    /// The IP packet an IPv6 packet with next header 4 (IPv4) or 41 (IPv6) carries: its
    /// addresses and transport.
    pub inner: Option<Inner>,
}

/// The packet inside an encapsulating one ([`Packet::inner`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inner {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// What it carries.
    pub transport: Transport,
}

impl Packet {
    /// The MSS option of a TCP packet with SYN set (`None` otherwise or without the option).
    pub fn syn_mss(&self) -> Option<u16> {
        match self.transport {
            Transport::Tcp { flags: f, mss, .. } if f & flags::SYN != 0 => mss,
            _ => None,
        }
    }

    /// Whether this is a TCP packet with exactly the flags `want` among SYN, ACK, RST, FIN.
    pub fn is_tcp(&self, want: u8) -> bool {
        let mask = flags::SYN | flags::ACK | flags::RST | flags::FIN;
        matches!(self.transport, Transport::Tcp { flags: f, .. } if f & mask == want)
    }

    /// The destination port of a TCP or UDP packet.
    pub fn dst_port(&self) -> Option<u16> {
        match self.transport {
            Transport::Tcp { dst, .. } | Transport::Udp { dst, .. } => Some(dst),
            _ => None,
        }
    }
}

impl std::fmt::Display for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(i) = self.inner {
            let inner = Packet {
                src: i.src,
                dst: i.dst,
                transport: i.transport,
                inner: None,
            };
            return write!(f, "{} > {} carrying {inner}", self.src, self.dst);
        }
        match self.transport {
            Transport::Tcp {
                src,
                dst,
                flags: fl,
                mss,
            } => {
                let names: String = [
                    (flags::SYN, 'S'),
                    (flags::ACK, '.'),
                    (flags::RST, 'R'),
                    (flags::FIN, 'F'),
                ]
                .iter()
                .filter(|(b, _)| fl & b != 0)
                .map(|(_, c)| *c)
                .collect();
                write!(f, "tcp {}:{src} > {}:{dst} [{names}]", self.src, self.dst)?;
                if let Some(m) = mss {
                    write!(f, " mss {m}")?;
                }
                Ok(())
            }
            Transport::Udp { src, dst } => {
                write!(f, "udp {}:{src} > {}:{dst}", self.src, self.dst)
            }
            Transport::Icmp { kind, code } => {
                write!(
                    f,
                    "icmp {} > {} type {kind} code {code}",
                    self.src, self.dst
                )
            }
            Transport::Other(p) => write!(f, "proto {p} {} > {}", self.src, self.dst),
        }
    }
}

impl<'ns> Capture<'ns> {
    /// Starts `tcpdump -i iface` in `ns` with the pcap `filter` (may be empty); returns once
    /// it captures.
    pub fn start(ns: &'ns Netns, iface: &str, filter: &str) -> Result<Capture<'ns>, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("vpnt-capture-")
            .tempdir()
            .map_err(|source| LabError::io(std::env::temp_dir(), source))?;
        let file = dir.path().join("capture.pcap");
        let stderr_path = dir.path().join("tcpdump.stderr");
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|source| LabError::io(&stderr_path, source))?;
        let mut cmd = ns.command("tcpdump");
        // Every packet handed over and written at once (-U, --immediate-mode); -Z root: keep
        // writing into our private directory.
        cmd.args([
            "-i",
            iface,
            "-n",
            "-U",
            "--immediate-mode",
            "-s",
            "256",
            "-Z",
            "root",
            "-w",
        ])
        .arg(&file);
        if !filter.is_empty() {
            cmd.arg(filter);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let pid = ns.spawn(&mut cmd)?;
        let what = format!("tcpdump -i {iface} {filter:?} in {}", ns.name());
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            if text.contains("listening on") {
                break;
            }
            if let Some(status) = ns.try_wait(pid) {
                return Err(LabError::Exited {
                    what,
                    status,
                    log: text,
                });
            }
            if started.elapsed() > START {
                ns.stop(pid);
                return Err(LabError::Timeout {
                    what,
                    waited: START,
                    log: text,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Capture {
            ns,
            pid: Some(pid),
            _dir: dir,
            file,
            what,
        })
    }

    /// Waits a moment for packets in flight, stops tcpdump and returns what it saw.
    pub fn finish(mut self) -> Result<Vec<Packet>, LabError> {
        std::thread::sleep(SETTLE);
        if let Some(pid) = self.pid.take() {
            self.ns.stop(pid);
        }
        let bytes = std::fs::read(&self.file).map_err(|source| LabError::io(&self.file, source))?;
        parse_pcap(&bytes).ok_or_else(|| LabError::Io {
            path: self.file.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a pcap file written by {}", self.what),
            ),
        })
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            self.ns.stop(pid);
        }
    }
}

/// pcap link types tcpdump writes for our interfaces.
const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// The IP packets of a pcap file (`None` if it is not one); frames of other link layers or
/// protocols are skipped.
pub fn parse_pcap(bytes: &[u8]) -> Option<Vec<Packet>> {
    let magic = bytes.get(..4)?;
    let le = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => return None,
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        let w: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        })
    };
    let link = u32_at(bytes, 20)?;
    let mut at = 24;
    let mut out = Vec::new();
    while at + 16 <= bytes.len() {
        let caplen = usize::try_from(u32_at(bytes, at + 8)?).ok()?;
        let frame = bytes.get(at + 16..at + 16 + caplen)?;
        at += 16 + caplen;
        let ip = match link {
            LINKTYPE_ETHERNET => match frame.get(12..14) {
                Some([0x08, 0x00]) | Some([0x86, 0xdd]) => &frame[14..],
                _ => continue,
            },
            LINKTYPE_RAW => frame,
            LINKTYPE_LINUX_SLL => frame.get(16..)?,
            LINKTYPE_LINUX_SLL2 => frame.get(20..)?,
            _ => continue,
        };
        if let Some(p) = parse_ip(ip) {
            out.push(p);
        }
    }
    Some(out)
}

/// An IPv4 or IPv6 header and what follows it; an IPv6 packet's payload with next header 4
/// or 41 is decoded as well ([`Packet::inner`]).
fn parse_ip(ip: &[u8]) -> Option<Packet> {
    let mut p = parse_one(ip)?;
    if ip.first()? >> 4 == 6 && matches!(p.transport, Transport::Other(4 | 41)) {
        p.inner = parse_one(ip.get(40..)?).map(|i| Inner {
            src: i.src,
            dst: i.dst,
            transport: i.transport,
        });
    }
    Some(p)
}

/// One IPv4 or IPv6 header and the transport header after it.
fn parse_one(ip: &[u8]) -> Option<Packet> {
    let (src, dst, proto, payload) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                *ip.get(9)?,
                ip.get(ihl..)?,
            )
        }
        6 => {
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                *ip.get(6)?,
                ip.get(40..)?,
            )
        }
        _ => return None,
    };
    let port = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes(
            payload.get(at..at + 2)?.try_into().ok()?,
        ))
    };
    let transport = match proto {
        6 => Transport::Tcp {
            src: port(0)?,
            dst: port(2)?,
            flags: *payload.get(13)?,
            mss: tcp_mss(payload),
        },
        17 => Transport::Udp {
            src: port(0)?,
            dst: port(2)?,
        },
        1 | 58 => Transport::Icmp {
            kind: *payload.first()?,
            code: *payload.get(1)?,
        },
        other => Transport::Other(other),
    };
    Some(Packet {
        src,
        dst,
        transport,
        inner: None,
    })
}

/// The MSS option (kind 2, length 4) of a TCP header.
fn tcp_mss(tcp: &[u8]) -> Option<u16> {
    let len = usize::from(tcp.get(12)? >> 4) * 4;
    let mut options = tcp.get(20..len)?;
    while let Some(&kind) = options.first() {
        match kind {
            0 => return None,
            1 => options = &options[1..],
            _ => {
                let l = usize::from(*options.get(1)?);
                if l < 2 {
                    return None;
                }
                if kind == 2 && l == 4 {
                    return Some(u16::from_be_bytes(options.get(2..4)?.try_into().ok()?));
                }
                options = options.get(l..)?;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian pcap file of raw-IP frames.
    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&65535u32.to_le_bytes());
        b.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
        for f in frames {
            b.extend_from_slice(&[0; 8]);
            let n = u32::try_from(f.len()).unwrap();
            b.extend_from_slice(&n.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
            b.extend_from_slice(f);
        }
        b
    }

    /// An IPv4 TCP SYN with NOP, NOP, MSS 1360 (header length 28).
    fn syn_v4() -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 48, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&[241, 96, 0, 10]);
        ip.extend_from_slice(&[10, 250, 0, 5]);
        let mut tcp = vec![0x9c, 0x40, 0x28, 0x0a, 0, 0, 0, 1, 0, 0, 0, 0];
        tcp.extend_from_slice(&[0x70, flags::SYN, 0xff, 0xff, 0, 0, 0, 0]);
        tcp.extend_from_slice(&[1, 1, 2, 4, 0x05, 0x50]);
        tcp.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&tcp);
        ip
    }

    #[test]
    fn a_syn_and_its_mss_are_read_from_a_raw_ip_capture() {
        let mut rst = syn_v4();
        rst[20 + 13] = flags::RST | flags::ACK;
        let packets = parse_pcap(&pcap(&[syn_v4(), rst])).unwrap();
        assert_eq!(packets.len(), 2);
        assert_eq!(packets[0].syn_mss(), Some(1360));
        assert!(packets[0].is_tcp(flags::SYN));
        assert_eq!(packets[0].dst_port(), Some(10250));
        assert_eq!(packets[0].src, "241.96.0.10".parse::<IpAddr>().unwrap());
        assert!(packets[1].is_tcp(flags::RST | flags::ACK));
        assert_eq!(packets[1].syn_mss(), None);
        assert_eq!(
            packets[0].to_string(),
            "tcp 241.96.0.10:40000 > 10.250.0.5:10250 [S] mss 1360"
        );
    }

    #[test]
    fn an_ipv4_packet_in_ipv6_is_read_as_ip6tnl_carries_it() {
        let mut outer = vec![0x60, 0, 0, 0, 0, 48, 4, 64];
        outer.extend_from_slice(
            &"fd8f:6d53:b97a:1::a:1"
                .parse::<Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        outer.extend_from_slice(
            &"fd8f:6d53:b97a:1::b:0"
                .parse::<Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        outer.extend_from_slice(&syn_v4());
        let packets = parse_pcap(&pcap(&[outer])).unwrap();
        assert_eq!(packets[0].transport, Transport::Other(4));
        let inner = packets[0].inner.expect("the inner packet");
        assert_eq!(inner.dst, "10.250.0.5".parse::<IpAddr>().unwrap());
        assert!(matches!(inner.transport, Transport::Tcp { dst: 10250, .. }));
        assert_eq!(
            packets[0].to_string(),
            "fd8f:6d53:b97a:1::a:1 > fd8f:6d53:b97a:1::b:0 carrying tcp 241.96.0.10:40000 > \
             10.250.0.5:10250 [S] mss 1360"
        );
        assert_eq!(parse_pcap(&pcap(&[syn_v4()])).unwrap()[0].inner, None);
    }

    #[test]
    fn garbage_is_no_pcap() {
        assert_eq!(parse_pcap(b"not a capture"), None);
        assert_eq!(parse_pcap(&pcap(&[])).map(|p| p.len()), Some(0));
    }
}
