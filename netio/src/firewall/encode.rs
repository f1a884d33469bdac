//! The nf_tables netlink messages (linux/netfilter/nf_tables.h, nfnetlink.h): a table's
//! replacement or removal as one [`Batch`] ([`replace`], [`removal`]), each rule's
//! expressions encoded as `nft` encodes them, on [`crate::netlink`]'s attribute encoder.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{Action, Chain, ChainType, FirewallError, Hook, Match, PortSet, Rule, Table};
use crate::netlink::wire::Request;

impl Hook {
    fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }
}

// The nf_tables netlink protocol (linux/netfilter/nf_tables.h, nfnetlink.h): message types,
// attribute numbers and values, named as the kernel names them.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
pub(super) const NFT_TABLE_F_OWNER: u32 = 2;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
// sets and their elements
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFT_SET_TIMEOUT: u32 = 0x10;
/// nft's `inet_service` data type (a port, network order).
const TYPE_INET_SERVICE: u32 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
// lookup
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
// meta
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_META_SREG: u16 = 3;
const NFT_META_MARK: u32 = 3;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_SKGID: u32 = 11;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
// cmp
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
// payload
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
// bitwise
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
// immediate
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
// ct
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_CT_SREG: u16 = 4;
const NFT_CT_STATE: u32 = 0;
const NFT_CT_MARK: u32 = 3;
/// `NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED)`.
const CT_STATE_ESTABLISHED_RELATED: u32 = 2 | 4;
/// `NF_CT_STATE_BIT(IP_CT_NEW)`.
const CT_STATE_NEW: u32 = 8;
// nat
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
const NFTA_NAT_FLAGS: u16 = 7;
const NFT_NAT_SNAT: u32 = 0;
const NFT_NAT_DNAT: u32 = 1;
const NF_NAT_RANGE_NETMAP: u32 = 1 << 6;
// socket
const NFTA_SOCKET_KEY: u16 = 1;
const NFTA_SOCKET_DREG: u16 = 2;
const NFT_SOCKET_WILDCARD: u32 = 2;
// reject
const NFTA_REJECT_TYPE: u16 = 1;
const NFT_REJECT_TCP_RST: u32 = 1;
// rt, byteorder, exthdr
const NFTA_RT_DREG: u16 = 1;
const NFTA_RT_KEY: u16 = 2;
const NFT_RT_TCPMSS: u32 = 3;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFTA_EXTHDR_TYPE: u16 = 2;
const NFTA_EXTHDR_OFFSET: u16 = 3;
const NFTA_EXTHDR_LEN: u16 = 4;
const NFTA_EXTHDR_OP: u16 = 6;
const NFTA_EXTHDR_SREG: u16 = 7;
const NFT_EXTHDR_OP_TCPOPT: u32 = 1;
/// TCP option kind of the maximum segment size.
const TCPOPT_MAXSEG: u8 = 2;
/// Interface names compare as `IFNAMSIZ` bytes, NUL-padded.
const IFNAMSIZ: usize = 16;
const IPPROTO_TCP: u8 = 6;

const REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const ACK: u16 = libc::NLM_F_ACK as u16;
const CREATE: u16 = libc::NLM_F_CREATE as u16;
const APPEND: u16 = libc::NLM_F_APPEND as u16;

/// The transaction that replaces our table by `table`: create it as it may already be (with
/// `flags`), delete it with everything in it, create it anew, then its chains and rules.
pub(super) fn replace(table: &Table, flags: u32) -> Result<Batch, FirewallError> {
    let mut batch = removal(&table.name, flags);
    batch.push("the table", new_table(&table.name, flags));
    for (index, set) in table.sets.iter().enumerate() {
        // Set ids only need to differ within the batch.
        let id = u32::try_from(index).unwrap_or(u32::MAX).wrapping_add(1);
        batch.push(format!("set {}", set.name), new_set(&table.name, set, id));
        batch.push(
            format!("the elements of set {}", set.name),
            new_elements(&table.name, set),
        );
    }
    for chain in &table.chains {
        batch.push(
            format!("chain {}", chain.name),
            new_chain(&table.name, chain),
        );
        for (index, rule) in chain.rules.iter().enumerate() {
            let exprs = encode_rule(rule).ok_or_else(|| FirewallError::MixedFamilies {
                chain: chain.name.clone(),
                index,
            })?;
            batch.push(
                format!("rule {index} of chain {}", chain.name),
                new_rule(&table.name, &chain.name, &exprs),
            );
        }
    }
    Ok(batch)
}

/// The transaction that adds the elements of `set` in `table` again, each for the set's
/// timeout from now: the set emptied (`DELSETELEM` without elements flushes it), then filled.
pub(super) fn refresh(table: &str, set: &PortSet) -> Batch {
    let mut batch = Batch::default();
    batch.push(
        format!("the flush of set {}", set.name),
        message(NFT_MSG_DELSETELEM, 0)
            .attr(NFTA_SET_ELEM_LIST_TABLE, &cstr(table))
            .attr(NFTA_SET_ELEM_LIST_SET, &cstr(&set.name)),
    );
    batch.push(
        format!("the elements of set {}", set.name),
        new_elements(table, set),
    );
    batch
}

/// What the first message of a replacement or removal is called in a refusal.
pub(super) const EXISTING: &str = "the existing table";

/// Deletes table `name`, whether it exists or not: create it (no-op if it exists with these
/// `flags`), then delete it.
pub(super) fn removal(name: &str, flags: u32) -> Batch {
    let mut batch = Batch::default();
    batch.push(EXISTING, new_table(name, flags));
    batch.push("the existing table's removal", del_table(name));
    batch
}

/// The messages of one transaction, each with what it is for error messages.
#[derive(Default)]
pub(super) struct Batch {
    messages: Vec<(String, Request)>,
}

/// A batch as the datagram to send: `BATCH_BEGIN`, its messages, `BATCH_END`, numbered in
/// order.
pub(super) struct Framed {
    /// The datagram.
    pub(super) bytes: Vec<u8>,
    /// Each message's sequence number, with what it is (for a refusal).
    pub(super) pending: Vec<(u32, String)>,
    /// The sequence number of `BATCH_END`, the last one used.
    pub(super) last: u32,
}

impl Batch {
    fn push(&mut self, what: impl Into<String>, req: Request) {
        self.messages.push((what.into(), req));
    }

    /// The batch framed for sending, its first message (`BATCH_BEGIN`) numbered `first`.
    pub(super) fn frame(self, first: u32) -> Framed {
        let mut bytes = begin_end(NFNL_MSG_BATCH_BEGIN).finish(first);
        let mut seq = first;
        let mut pending = Vec::new();
        for (what, req) in self.messages {
            seq = seq.wrapping_add(1);
            bytes.extend_from_slice(&req.finish(seq));
            pending.push((seq, what));
        }
        seq = seq.wrapping_add(1);
        bytes.extend_from_slice(&begin_end(NFNL_MSG_BATCH_END).finish(seq));
        Framed {
            bytes,
            pending,
            last: seq,
        }
    }
}

/// `nfgenmsg`: family, version 0, resource id (big-endian).
fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let id = res_id.to_be_bytes();
    [family, 0, id[0], id[1]]
}

fn begin_end(kind: u16) -> Request {
    Request::new(kind, REQUEST).header(&nfgenmsg(0, NFNL_SUBSYS_NFTABLES))
}

fn message(kind: u16, flags: u16) -> Request {
    Request::new((NFNL_SUBSYS_NFTABLES << 8) | kind, REQUEST | ACK | flags)
        .header(&nfgenmsg(NFPROTO_INET, 0))
}

fn cstr(s: &str) -> Vec<u8> {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    b
}

fn new_table(name: &str, flags: u32) -> Request {
    message(NFT_MSG_NEWTABLE, CREATE)
        .attr(NFTA_TABLE_NAME, &cstr(name))
        .attr_be32(NFTA_TABLE_FLAGS, flags)
}

fn del_table(name: &str) -> Request {
    message(NFT_MSG_DELTABLE, 0).attr(NFTA_TABLE_NAME, &cstr(name))
}

fn new_chain(table: &str, chain: &Chain) -> Request {
    let kind = match chain.kind {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
    };
    message(NFT_MSG_NEWCHAIN, CREATE)
        .attr(NFTA_CHAIN_TABLE, &cstr(table))
        .attr(NFTA_CHAIN_NAME, &cstr(&chain.name))
        .nested(NFTA_CHAIN_HOOK, |r| {
            r.attr_be32(NFTA_HOOK_HOOKNUM, chain.hook.number())
                // A signed priority, two's complement on the wire.
                .attr_be32(NFTA_HOOK_PRIORITY, chain.priority as u32)
        })
        .attr_be32(NFTA_CHAIN_POLICY, NF_ACCEPT)
        .attr(NFTA_CHAIN_TYPE, &cstr(kind))
}

/// A set's timeout in the kernel's unit: milliseconds, 64 bits, network order.
fn timeout_ms(set: &PortSet) -> [u8; 8] {
    u64::try_from(set.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .to_be_bytes()
}

fn new_set(table: &str, set: &PortSet, id: u32) -> Request {
    message(NFT_MSG_NEWSET, CREATE)
        .attr(NFTA_SET_TABLE, &cstr(table))
        .attr(NFTA_SET_NAME, &cstr(&set.name))
        .attr_be32(NFTA_SET_FLAGS, NFT_SET_TIMEOUT)
        .attr_be32(NFTA_SET_KEY_TYPE, TYPE_INET_SERVICE)
        .attr_be32(NFTA_SET_KEY_LEN, 2)
        .attr_be32(NFTA_SET_ID, id)
        .attr(NFTA_SET_TIMEOUT, &timeout_ms(set))
}

/// The set's ports as elements, each with the set's timeout.
fn new_elements(table: &str, set: &PortSet) -> Request {
    message(NFT_MSG_NEWSETELEM, CREATE)
        .attr(NFTA_SET_ELEM_LIST_TABLE, &cstr(table))
        .attr(NFTA_SET_ELEM_LIST_SET, &cstr(&set.name))
        .nested(NFTA_SET_ELEM_LIST_ELEMENTS, |mut r| {
            for port in &set.ports {
                r = r.nested(NFTA_LIST_ELEM, |r| {
                    r.nested(NFTA_SET_ELEM_KEY, |r| {
                        r.attr(NFTA_DATA_VALUE, &port.to_be_bytes())
                    })
                    .attr(NFTA_SET_ELEM_TIMEOUT, &timeout_ms(set))
                });
            }
            r
        })
}

fn new_rule(table: &str, chain: &str, exprs: &[Expr]) -> Request {
    message(NFT_MSG_NEWRULE, CREATE | APPEND)
        .attr(NFTA_RULE_TABLE, &cstr(table))
        .attr(NFTA_RULE_CHAIN, &cstr(chain))
        .nested(NFTA_RULE_EXPRESSIONS, |mut r| {
            for e in exprs {
                r = r.nested(NFTA_LIST_ELEM, |r| e.encode(r));
            }
            r
        })
}

/// One nf_tables expression, as `nft --debug=netlink` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Meta {
        key: u32,
    },
    Cmp {
        op: u32,
        data: Vec<u8>,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    Bitwise {
        len: u32,
        mask: Vec<u8>,
    },
    Ct {
        key: u32,
    },
    /// `ct KEY set` from register 1.
    CtSet {
        key: u32,
    },
    /// `meta KEY set` from register 1.
    MetaSet {
        key: u32,
    },
    Immediate {
        reg: u32,
        data: Vec<u8>,
    },
    Verdict {
        code: u32,
    },
    Nat {
        kind: u32,
        family: u8,
    },
    Masq,
    /// `socket KEY`: a value of the socket the packet belongs to (no socket: the rule ends).
    Socket {
        key: u32,
    },
    Reject {
        kind: u32,
    },
    /// Register 1 looked up in the table's set `set` (not found: the rule ends).
    Lookup {
        set: String,
    },
    Rt {
        key: u32,
    },
    Hton {
        len: u32,
        size: u32,
    },
    ExthdrWrite {
        kind: u8,
        offset: u32,
        len: u32,
    },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Payload { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Ct { .. } | Expr::CtSet { .. } => "ct",
            Expr::Immediate { .. } | Expr::Verdict { .. } => "immediate",
            Expr::Nat { .. } => "nat",
            Expr::Masq => "masq",
            Expr::Socket { .. } => "socket",
            Expr::Reject { .. } => "reject",
            Expr::Lookup { .. } => "lookup",
            Expr::Rt { .. } => "rt",
            Expr::Hton { .. } => "byteorder",
            Expr::ExthdrWrite { .. } => "exthdr",
        }
    }

    /// `{NFTA_EXPR_NAME, NFTA_EXPR_DATA {…}}`; every load goes to register 1, as nft's.
    fn encode(&self, r: Request) -> Request {
        let r = r.attr(NFTA_EXPR_NAME, &cstr(self.name()));
        if *self == Expr::Masq {
            return r;
        }
        r.nested(NFTA_EXPR_DATA, |r| match self {
            Expr::Meta { key } => r
                .attr_be32(NFTA_META_KEY, *key)
                .attr_be32(NFTA_META_DREG, NFT_REG_1),
            Expr::Cmp { op, data } => r
                .attr_be32(NFTA_CMP_SREG, NFT_REG_1)
                .attr_be32(NFTA_CMP_OP, *op)
                .nested(NFTA_CMP_DATA, |r| r.attr(NFTA_DATA_VALUE, data)),
            Expr::Payload { base, offset, len } => r
                .attr_be32(NFTA_PAYLOAD_DREG, NFT_REG_1)
                .attr_be32(NFTA_PAYLOAD_BASE, *base)
                .attr_be32(NFTA_PAYLOAD_OFFSET, *offset)
                .attr_be32(NFTA_PAYLOAD_LEN, *len),
            Expr::Bitwise { len, mask } => r
                .attr_be32(NFTA_BITWISE_SREG, NFT_REG_1)
                .attr_be32(NFTA_BITWISE_DREG, NFT_REG_1)
                .attr_be32(NFTA_BITWISE_LEN, *len)
                .nested(NFTA_BITWISE_MASK, |r| r.attr(NFTA_DATA_VALUE, mask))
                .nested(NFTA_BITWISE_XOR, |r| {
                    r.attr(NFTA_DATA_VALUE, &vec![0u8; mask.len()])
                }),
            Expr::Ct { key } => r
                .attr_be32(NFTA_CT_KEY, *key)
                .attr_be32(NFTA_CT_DREG, NFT_REG_1),
            Expr::Socket { key } => r
                .attr_be32(NFTA_SOCKET_KEY, *key)
                .attr_be32(NFTA_SOCKET_DREG, NFT_REG_1),
            Expr::CtSet { key } => r
                .attr_be32(NFTA_CT_KEY, *key)
                .attr_be32(NFTA_CT_SREG, NFT_REG_1),
            Expr::MetaSet { key } => r
                .attr_be32(NFTA_META_KEY, *key)
                .attr_be32(NFTA_META_SREG, NFT_REG_1),
            Expr::Immediate { reg, data } => r
                .attr_be32(NFTA_IMMEDIATE_DREG, *reg)
                .nested(NFTA_IMMEDIATE_DATA, |r| r.attr(NFTA_DATA_VALUE, data)),
            Expr::Verdict { code } => r
                .attr_be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT)
                .nested(NFTA_IMMEDIATE_DATA, |r| {
                    r.nested(NFTA_DATA_VERDICT, |r| r.attr_be32(NFTA_VERDICT_CODE, *code))
                }),
            Expr::Nat { kind, family } => r
                .attr_be32(NFTA_NAT_TYPE, *kind)
                .attr_be32(NFTA_NAT_FAMILY, u32::from(*family))
                .attr_be32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1)
                .attr_be32(NFTA_NAT_REG_ADDR_MAX, NFT_REG_2)
                .attr_be32(NFTA_NAT_FLAGS, NF_NAT_RANGE_NETMAP),
            Expr::Masq => r,
            Expr::Reject { kind } => r.attr_be32(NFTA_REJECT_TYPE, *kind),
            Expr::Lookup { set } => r
                .attr(NFTA_LOOKUP_SET, &cstr(set))
                .attr_be32(NFTA_LOOKUP_SREG, NFT_REG_1),
            Expr::Rt { key } => r
                .attr_be32(NFTA_RT_KEY, *key)
                .attr_be32(NFTA_RT_DREG, NFT_REG_1),
            Expr::Hton { len, size } => r
                .attr_be32(NFTA_BYTEORDER_SREG, NFT_REG_1)
                .attr_be32(NFTA_BYTEORDER_DREG, NFT_REG_1)
                .attr_be32(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON)
                .attr_be32(NFTA_BYTEORDER_LEN, *len)
                .attr_be32(NFTA_BYTEORDER_SIZE, *size),
            Expr::ExthdrWrite { kind, offset, len } => r
                .attr_be32(NFTA_EXTHDR_SREG, NFT_REG_1)
                .attr(NFTA_EXTHDR_TYPE, &[*kind])
                .attr_be32(NFTA_EXTHDR_OFFSET, *offset)
                .attr_be32(NFTA_EXTHDR_LEN, *len)
                .attr_be32(NFTA_EXTHDR_OP, NFT_EXTHDR_OP_TCPOPT),
        })
    }
}

/// The expressions of `rule` in nft's encoding; `None` if it mixes address families.
fn encode_rule(rule: &Rule) -> Option<Vec<Expr>> {
    let mut family: Option<u8> = None;
    let mut same_family = |f: u8| match family {
        None => {
            family = Some(f);
            true
        }
        Some(g) => g == f,
    };
    let mut out = Vec::new();
    for m in &rule.matches {
        match m {
            Match::InIface(name) => iface(&mut out, NFT_META_IIFNAME, name),
            Match::OutIface(name) => iface(&mut out, NFT_META_OIFNAME, name),
            Match::EstablishedOrRelated => ct_state(&mut out, CT_STATE_ESTABLISHED_RELATED),
            Match::New => ct_state(&mut out, CT_STATE_NEW),
            Match::SocketGid(gid) => {
                out.push(Expr::Meta {
                    key: NFT_META_SKGID,
                });
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: gid.to_ne_bytes().to_vec(),
                });
            }
            Match::Source(net) | Match::Destination(net) => {
                if !same_family(nfproto(net)) {
                    return None;
                }
                let source = matches!(m, Match::Source(_));
                address(&mut out, *net, source);
            }
            Match::Tcp => l4proto_tcp(&mut out),
            Match::TcpDport(port) => {
                tcp_dport(&mut out);
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: port.to_be_bytes().to_vec(),
                });
            }
            Match::TcpDportIn(set) => {
                tcp_dport(&mut out);
                out.push(Expr::Lookup { set: set.clone() });
            }
            Match::SocketFound => {
                // `socket wildcard != 2`: any socket (the key is 0 or 1); none ends the rule.
                out.push(Expr::Socket {
                    key: NFT_SOCKET_WILDCARD,
                });
                out.push(Expr::Cmp {
                    op: NFT_CMP_NEQ,
                    data: vec![2],
                });
            }
            Match::CtMark(mark) => {
                out.push(Expr::Ct { key: NFT_CT_MARK });
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: mark.to_ne_bytes().to_vec(),
                });
            }
            Match::TcpSyn => {
                l4proto_tcp(&mut out);
                // The flags byte: SYN (0x02) set and RST (0x04) clear.
                out.push(Expr::Payload {
                    base: NFT_PAYLOAD_TRANSPORT_HEADER,
                    offset: 13,
                    len: 1,
                });
                out.push(Expr::Bitwise {
                    len: 1,
                    mask: vec![0x06],
                });
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: vec![0x02],
                });
            }
        }
    }
    match rule.action {
        None => {}
        Some(Action::Accept) => out.push(Expr::Verdict { code: NF_ACCEPT }),
        Some(Action::Drop) => out.push(Expr::Verdict { code: NF_DROP }),
        Some(Action::RejectTcpReset) => out.push(Expr::Reject {
            kind: NFT_REJECT_TCP_RST,
        }),
        Some(Action::Dnat(net) | Action::Snat(net)) => {
            let f = nfproto(&net);
            if !same_family(f) {
                return None;
            }
            let kind = match rule.action {
                Some(Action::Dnat(_)) => NFT_NAT_DNAT,
                _ => NFT_NAT_SNAT,
            };
            out.push(Expr::Immediate {
                reg: NFT_REG_1,
                data: ip_bytes(net.network()),
            });
            out.push(Expr::Immediate {
                reg: NFT_REG_2,
                data: ip_bytes(net.broadcast()),
            });
            out.push(Expr::Nat { kind, family: f });
        }
        Some(Action::Masquerade) => out.push(Expr::Masq),
        Some(Action::SetCtMark(mark) | Action::SetMark(mark)) => {
            out.push(Expr::Immediate {
                reg: NFT_REG_1,
                data: mark.to_ne_bytes().to_vec(),
            });
            out.push(match rule.action {
                Some(Action::SetCtMark(_)) => Expr::CtSet { key: NFT_CT_MARK },
                _ => Expr::MetaSet { key: NFT_META_MARK },
            });
        }
        Some(Action::ClampMssToPmtu) => {
            out.push(Expr::Rt { key: NFT_RT_TCPMSS });
            out.push(Expr::Hton { len: 2, size: 2 });
            // The option's size field: 2 bytes after its kind and length bytes.
            out.push(Expr::ExthdrWrite {
                kind: TCPOPT_MAXSEG,
                offset: 2,
                len: 2,
            });
        }
    }
    Some(out)
}

/// `ct state` with any bit of `bits` set.
fn ct_state(out: &mut Vec<Expr>, bits: u32) {
    out.push(Expr::Ct { key: NFT_CT_STATE });
    out.push(Expr::Bitwise {
        len: 4,
        mask: bits.to_ne_bytes().to_vec(),
    });
    out.push(Expr::Cmp {
        op: NFT_CMP_NEQ,
        data: vec![0; 4],
    });
}

/// `meta l4proto tcp`, then the destination port (bytes 2 and 3 of the TCP header, network
/// order) loaded into register 1.
fn tcp_dport(out: &mut Vec<Expr>) {
    l4proto_tcp(out);
    out.push(Expr::Payload {
        base: NFT_PAYLOAD_TRANSPORT_HEADER,
        offset: 2,
        len: 2,
    });
}

fn l4proto_tcp(out: &mut Vec<Expr>) {
    out.push(Expr::Meta {
        key: NFT_META_L4PROTO,
    });
    out.push(Expr::Cmp {
        op: NFT_CMP_EQ,
        data: vec![IPPROTO_TCP],
    });
}

/// `iifname NAME` / `oifname NAME`; a name ending in `*` (`tun*`, iptables' `tun+`) matches
/// every interface whose name starts with the rest: nft compares only those bytes.
fn iface(out: &mut Vec<Expr>, key: u32, name: &str) {
    let data = match name.strip_suffix('*') {
        Some(prefix) => prefix.as_bytes()[..prefix.len().min(IFNAMSIZ - 1)].to_vec(),
        None => {
            let mut data = vec![0u8; IFNAMSIZ];
            let n = name.len().min(IFNAMSIZ - 1);
            data[..n].copy_from_slice(&name.as_bytes()[..n]);
            data
        }
    };
    out.push(Expr::Meta { key });
    out.push(Expr::Cmp {
        op: NFT_CMP_EQ,
        data,
    });
}

fn nfproto(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => NFPROTO_IPV4,
        IpNet::V6(_) => NFPROTO_IPV6,
    }
}

fn ip_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// `meta nfproto ipv4|ipv6`, then the address compared under its prefix as nft does: a
/// byte-aligned prefix loads just its bytes, another the whole address and masks it.
fn address(out: &mut Vec<Expr>, net: IpNet, source: bool) {
    let (offset, width) = match (net, source) {
        (IpNet::V4(_), true) => (12, 4),
        (IpNet::V4(_), false) => (16, 4),
        (IpNet::V6(_), true) => (8, 16),
        (IpNet::V6(_), false) => (24, 16),
    };
    out.push(Expr::Meta {
        key: NFT_META_NFPROTO,
    });
    out.push(Expr::Cmp {
        op: NFT_CMP_EQ,
        data: vec![nfproto(&net)],
    });
    let bits = u32::from(net.prefix_len());
    if bits == 0 {
        return;
    }
    let addr = ip_bytes(net.network());
    let len = if bits % 8 == 0 { bits / 8 } else { width };
    out.push(Expr::Payload {
        base: NFT_PAYLOAD_NETWORK_HEADER,
        offset,
        len,
    });
    if bits % 8 != 0 {
        out.push(Expr::Bitwise {
            len,
            mask: ip_bytes(net.netmask()),
        });
    }
    out.push(Expr::Cmp {
        op: NFT_CMP_EQ,
        data: addr[..len as usize].to_vec(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::VPN2_PROXY_GID;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_load_as_nft_loads_them() {
        // /8: one byte, no mask (nft: "payload load 1b @ network header + 16").
        let e = encode_rule(&Rule::new().daddr(net("241.0.0.0/8")).accept()).unwrap();
        assert_eq!(
            e[2],
            Expr::Payload {
                base: NFT_PAYLOAD_NETWORK_HEADER,
                offset: 16,
                len: 1
            }
        );
        assert_eq!(
            e[3],
            Expr::Cmp {
                op: NFT_CMP_EQ,
                data: vec![241]
            }
        );
        // /11: the whole address, masked.
        let e = encode_rule(&Rule::new().saddr(net("100.96.0.0/11"))).unwrap();
        assert_eq!(
            e[2..],
            [
                Expr::Payload {
                    base: NFT_PAYLOAD_NETWORK_HEADER,
                    offset: 12,
                    len: 4
                },
                Expr::Bitwise {
                    len: 4,
                    mask: vec![255, 224, 0, 0]
                },
                Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: vec![100, 96, 0, 0]
                }
            ]
        );
        // Host bits of the configured network do not leak into the comparison.
        let e = encode_rule(&Rule::new().daddr(net("10.1.2.3/16"))).unwrap();
        assert_eq!(
            e[3],
            Expr::Cmp {
                op: NFT_CMP_EQ,
                data: vec![10, 1]
            }
        );
    }

    #[test]
    fn netmap_targets_are_the_network_and_its_last_address() {
        let e = encode_rule(
            &Rule::new()
                .skgid(VPN2_PROXY_GID)
                .daddr(net("100.96.0.0/11"))
                .dnat_prefix(net("244.0.0.0/11")),
        )
        .unwrap();
        let n = e.len();
        assert_eq!(
            e[n - 3..],
            [
                Expr::Immediate {
                    reg: NFT_REG_1,
                    data: vec![244, 0, 0, 0]
                },
                Expr::Immediate {
                    reg: NFT_REG_2,
                    data: vec![244, 31, 255, 255]
                },
                Expr::Nat {
                    kind: NFT_NAT_DNAT,
                    family: NFPROTO_IPV4
                }
            ]
        );
    }

    #[test]
    fn mixed_families_are_refused() {
        assert!(encode_rule(
            &Rule::new()
                .daddr(net("10.0.0.0/8"))
                .snat_prefix(net("fd00::/64"))
        )
        .is_none());
        assert!(
            encode_rule(&Rule::new().saddr(net("fd00::/64")).daddr(net("10.0.0.0/8"))).is_none()
        );
    }

    #[test]
    fn a_port_set_match_loads_the_destination_port_and_looks_it_up() {
        let e = encode_rule(&Rule::new().tcp_dport_in("serving").drop()).unwrap();
        assert_eq!(
            e[2..],
            [
                Expr::Payload {
                    base: NFT_PAYLOAD_TRANSPORT_HEADER,
                    offset: 2,
                    len: 2
                },
                Expr::Lookup {
                    set: "serving".into()
                },
                Expr::Verdict { code: NF_DROP }
            ]
        );
    }

    #[test]
    fn a_table_creates_its_sets_and_their_elements_before_its_chains() {
        let set = PortSet::new("serving", std::time::Duration::from_secs(2), &[9443, 9443]);
        assert_eq!(set.ports, [9443]);
        let table = Table::new("t").set(set.clone()).chain(
            Chain::filter("input", Hook::Input, 0).rule(Rule::new().tcp_dport_in("serving").drop()),
        );
        let what: Vec<String> = replace(&table, 0)
            .unwrap()
            .messages
            .into_iter()
            .map(|(w, _)| w)
            .collect();
        assert_eq!(
            what,
            [
                EXISTING,
                "the existing table's removal",
                "the table",
                "set serving",
                "the elements of set serving",
                "chain input",
                "rule 0 of chain input"
            ]
        );
        // A refresh empties the set and fills it in one transaction.
        let what: Vec<String> = refresh("t", &set)
            .messages
            .into_iter()
            .map(|(w, _)| w)
            .collect();
        assert_eq!(
            what,
            ["the flush of set serving", "the elements of set serving"]
        );
        assert_eq!(timeout_ms(&set), 2000u64.to_be_bytes());
    }

    #[test]
    fn interface_names_are_nul_padded_to_ifnamsiz() {
        let e = encode_rule(&Rule::new().iifname("tun0").drop()).unwrap();
        let mut want = b"tun0".to_vec();
        want.resize(16, 0);
        assert_eq!(
            e,
            [
                Expr::Meta {
                    key: NFT_META_IIFNAME
                },
                Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: want
                },
                Expr::Verdict { code: NF_DROP }
            ]
        );
    }
}
