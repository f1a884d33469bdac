//! Firewall and NAT rules in the kernel's nf_tables, over netlink: the rules vpn2 installs
//! with iptables (reference `gardener-pods.md` §2.1, §2.4, §3.3), in one table of our own.
//!
//! A [`Table`] is the whole rule set of one program: its chains (each hooked into the
//! kernel's netfilter at a priority) and their rules. [`Firewall::apply`] replaces the table
//! in one transaction (create, delete, create again with everything in it), so applying twice
//! is applying once and another program's rules (kube-proxy's, iptables') are never touched;
//! [`Firewall::remove`] deletes it. An *owned* table (`NFT_TABLE_F_OWNER`) is bound to the
//! netlink socket that made it: the kernel deletes it when the process ends, also by `kill
//! -9`, so a restart never finds stale rules.
//!
//! Only the rule shapes vpn2 needs exist ([`Rule`]): interface, conntrack state, socket group,
//! socket presence, address prefix and port-set matches; accept, drop, prefix NAT in both directions (`NETMAP`),
//! masquerade and TCP MSS clamping to the path MTU. A table may hold sets of ports whose
//! elements expire ([`PortSet`]), refreshed by [`Firewall::refresh`] (what
//! [`RestartGuard`] does while its process lives). Each is encoded as `nft` would encode it, so
//! `nft list table` prints our rules in its own syntax (what the tests compare).
//!
//! No Rust crate covers these expressions with a permissive licence (`rt` and `exthdr`, needed
//! for the MSS clamp, and NAT's netmap flag are missing from the maintained ones; `rustables`
//! is GPL-3), so the messages are built here on [`crate::netlink`]'s attribute encoder.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the rule model ([`Table`], [`Chain`], [`Rule`]) and [`Firewall`]: apply, remove; [`Installed`], a program's table held while it serves |
//! | `encode.rs` | the nf_tables netlink messages: a table's replacement or removal as one batch, each rule's expressions |
//! | `socket.rs` | the netfilter netlink socket: one batch sent, every acknowledgement awaited |
//! | `restart.rs` | [`RestartGuard`]: SYNs to a listener's port dropped, not refused, while its process restarts |
//! | `vpn2.rs` | vpn2's address-translation chains (the seed pods' `241/8` pair, the proxy group's NETMAP and guard), shared by the seed server and the kube-apiserver's HA clients |
//!
//! ```text
//!  batch: BATCH_BEGIN | NEWTABLE t | DELTABLE t | NEWTABLE t [owner] | NEWSET … NEWSETELEM … | NEWCHAIN … | NEWRULE … | BATCH_END
//!  refresh: BATCH_BEGIN | DELSETELEM t s (all) | NEWSETELEM t s … | BATCH_END
//!  rule:  NFTA_RULE_EXPRESSIONS = [ {name "meta", data {dreg, key}}, {name "cmp", …}, … ]
//! ```

use std::io;
use std::time::Duration;

use ipnet::IpNet;

use crate::netlink::Malformed;
use crate::report::chain;

mod encode;
mod restart;
mod socket;
pub mod vpn2;

use encode::{refresh, removal, replace, EXISTING, NFT_TABLE_F_OWNER};
pub use restart::RestartGuard;
use socket::Socket;

/// The group id vpn2's NAT rules single out (Gardener runs the Envoy sidecar with it).
pub const VPN2_PROXY_GID: u32 = 31415;

/// Netfilter hook priorities as `nft` names them.
pub mod priority {
    /// `dstnat`.
    pub const DSTNAT: i32 = -100;
    /// `mangle`.
    pub const MANGLE: i32 = -150;
    /// `filter`.
    pub const FILTER: i32 = 0;
    /// `srcnat`.
    pub const SRCNAT: i32 = 100;
}

/// Where in the kernel's packet path a chain runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Before routing (`NF_INET_PRE_ROUTING`).
    Prerouting,
    /// Packets for this host (`NF_INET_LOCAL_IN`).
    Input,
    /// Packets routed through (`NF_INET_FORWARD`).
    Forward,
    /// Packets this host sends (`NF_INET_LOCAL_OUT`).
    Output,
    /// After routing (`NF_INET_POST_ROUTING`).
    Postrouting,
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    /// `filter`: accept, drop, mangle.
    Filter,
    /// `nat`: address translation (only the first packet of a connection passes it).
    Nat,
}

/// One program's rules: an `inet` table (IPv4 and IPv6) of base chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    name: String,
    sets: Vec<PortSet>,
    chains: Vec<Chain>,
}

/// A named set of ports (`type inet_service; flags timeout`) whose elements expire: each
/// element added lives for the set's timeout unless [`Firewall::refresh`] adds it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSet {
    name: String,
    timeout: Duration,
    ports: Vec<u16>,
}

impl PortSet {
    /// A set named `name` holding `ports`, each for `timeout` from its addition (at least
    /// 1 ms; the kernel counts in milliseconds).
    pub fn new(name: impl Into<String>, timeout: Duration, ports: &[u16]) -> PortSet {
        let mut ports = ports.to_vec();
        ports.sort_unstable();
        ports.dedup();
        PortSet {
            name: name.into(),
            timeout: timeout.max(Duration::from_millis(1)),
            ports,
        }
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A base chain: hook, priority, policy accept, rules in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    name: String,
    kind: ChainType,
    hook: Hook,
    priority: i32,
    rules: Vec<Rule>,
}

/// One rule: matches (all must hold), then what to do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    matches: Vec<Match>,
    action: Option<Action>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Match {
    InIface(String),
    OutIface(String),
    EstablishedOrRelated,
    New,
    SocketGid(u32),
    Source(IpNet),
    Destination(IpNet),
    Tcp,
    TcpSyn,
    TcpDport(u16),
    CtMark(u32),
    SocketFound,
    TcpDportIn(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Accept,
    Drop,
    RejectTcpReset,
    Dnat(IpNet),
    Snat(IpNet),
    Masquerade,
    ClampMssToPmtu,
    SetCtMark(u32),
    SetMark(u32),
}

impl Table {
    /// An empty table named `name` (at most 255 bytes, no NUL).
    pub fn new(name: impl Into<String>) -> Table {
        Table {
            name: name.into(),
            sets: Vec::new(),
            chains: Vec::new(),
        }
    }

    /// Adds `set` (created before the chains, so their rules can name it).
    pub fn set(mut self, set: PortSet) -> Table {
        self.sets.push(set);
        self
    }

    /// Adds `chain`.
    pub fn chain(mut self, chain: Chain) -> Table {
        self.chains.push(chain);
        self
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Chain {
    /// A filter chain at `hook` with `priority`.
    pub fn filter(name: impl Into<String>, hook: Hook, priority: i32) -> Chain {
        Chain::new(name.into(), ChainType::Filter, hook, priority)
    }

    /// A NAT chain at `hook` with `priority`.
    pub fn nat(name: impl Into<String>, hook: Hook, priority: i32) -> Chain {
        Chain::new(name.into(), ChainType::Nat, hook, priority)
    }

    fn new(name: String, kind: ChainType, hook: Hook, priority: i32) -> Chain {
        Chain {
            name,
            kind,
            hook,
            priority,
            rules: Vec::new(),
        }
    }

    /// Appends `rule`.
    pub fn rule(mut self, rule: Rule) -> Chain {
        self.rules.push(rule);
        self
    }

    /// Appends every rule of `rules`.
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Chain {
        self.rules.extend(rules);
        self
    }

    /// Appends the pair that lets in from `device` only what belongs to connections opened
    /// from this side: established or related packets accepted, every other one dropped
    /// (vpn2's INPUT and FORWARD pair on its tunnel device).
    pub fn replies_only_from(self, device: &str) -> Chain {
        self.rule(
            Rule::new()
                .iifname(device)
                .established_or_related()
                .accept(),
        )
        .rule(Rule::new().iifname(device).drop())
    }

    /// A chain that keeps the tunnel's networks in the tunnel (`tunnel-only`, filter, at
    /// postrouting, where the outgoing interface is final): a packet to one of `nets`, or from
    /// the proxy group ([`VPN2_PROXY_GID`]) to one of `proxy_nets`, that would leave by an
    /// interface other than `devices` (a name, or a prefix with `*`) is dropped. It is what
    /// stops such packets following the pod's default route into the seed's network while
    /// the tunnel's routes are gone (a server or client process restarting, both HA tunnels
    /// down). A dropped SYN is retried by the sender's kernel, so a connection started in
    /// that moment completes once the tunnel is back. `proxy_nets` are the shoot networks
    /// that overlap the pod's own (only the proxy group means the shoot by them, and only in
    /// the connections it opens: its answers to the seed's pods in those ranges, a listener's
    /// SYN-ACK included, pass).
    pub fn tunnel_only(devices: &str, nets: &[IpNet], proxy_nets: &[IpNet]) -> Chain {
        Chain::filter("tunnel-only", Hook::Postrouting, priority::FILTER)
            .rule(Rule::new().oifname(devices).accept())
            .rules(nets.iter().map(|net| Rule::new().daddr(*net).drop()))
            .rules(proxy_nets.iter().map(|net| {
                Rule::new()
                    .skgid(VPN2_PROXY_GID)
                    .new_connection()
                    .daddr(*net)
                    .drop()
            }))
    }
}

impl Rule {
    /// A rule that matches every packet (until matches are added).
    pub fn new() -> Rule {
        Rule::default()
    }

    /// `iifname NAME`; `NAME*` matches every interface whose name starts with `NAME`.
    pub fn iifname(self, name: &str) -> Rule {
        self.with(Match::InIface(name.to_owned()))
    }

    /// `oifname NAME`; `NAME*` matches every interface whose name starts with `NAME`.
    pub fn oifname(self, name: &str) -> Rule {
        self.with(Match::OutIface(name.to_owned()))
    }

    /// `ct state established,related`.
    pub fn established_or_related(self) -> Rule {
        self.with(Match::EstablishedOrRelated)
    }

    /// `ct state new`: the first packet of a connection (not a reply on an accepted one).
    pub fn new_connection(self) -> Rule {
        self.with(Match::New)
    }

    /// `meta skgid GID`: packets of sockets owned by this group.
    pub fn skgid(self, gid: u32) -> Rule {
        self.with(Match::SocketGid(gid))
    }

    /// `ip saddr NET` / `ip6 saddr NET` (the packet's family follows the network's).
    pub fn saddr(self, net: IpNet) -> Rule {
        self.with(Match::Source(net.trunc()))
    }

    /// `ip daddr NET` / `ip6 daddr NET`.
    pub fn daddr(self, net: IpNet) -> Rule {
        self.with(Match::Destination(net.trunc()))
    }

    /// `meta l4proto tcp`.
    pub fn tcp(self) -> Rule {
        self.with(Match::Tcp)
    }

    /// `tcp flags & (syn|rst) == syn`: the first packet of each direction of a handshake.
    pub fn tcp_syn(self) -> Rule {
        self.with(Match::TcpSyn)
    }

    /// `tcp dport PORT`.
    pub fn tcp_dport(self, port: u16) -> Rule {
        self.with(Match::TcpDport(port))
    }

    /// `socket wildcard != 2`: the packet belongs to a socket of this host, a listener
    /// included (hooks prerouting, input and output only).
    pub fn socket_found(self) -> Rule {
        self.with(Match::SocketFound)
    }

    /// `tcp dport @SET`: the destination port is an element of the table's set `set` (a
    /// [`PortSet`]; an expired element matches no more).
    pub fn tcp_dport_in(self, set: &str) -> Rule {
        self.with(Match::TcpDportIn(set.to_owned()))
    }

    /// `ct mark MARK`: the connection's mark is `mark`.
    pub fn ct_mark(self, mark: u32) -> Rule {
        self.with(Match::CtMark(mark))
    }

    /// `ct mark set MARK`: marks the packet's connection (no verdict: the chain goes on).
    pub fn set_ct_mark(self, mark: u32) -> Rule {
        self.then(Action::SetCtMark(mark))
    }

    /// `meta mark set MARK`: marks the packet (routing rules can select on it, `ip rule
    /// fwmark`); no verdict.
    pub fn set_mark(self, mark: u32) -> Rule {
        self.then(Action::SetMark(mark))
    }

    /// `accept`.
    pub fn accept(self) -> Rule {
        self.then(Action::Accept)
    }

    /// `drop`.
    pub fn drop(self) -> Rule {
        self.then(Action::Drop)
    }

    /// `reject with tcp reset` (with [`Rule::tcp`]): the sender's connect fails at once, where
    /// a dropped SYN of a local socket would be retried for minutes.
    pub fn reject_with_tcp_reset(self) -> Rule {
        self.then(Action::RejectTcpReset)
    }

    /// `dnat ip prefix to NET`: the destination's network bits become `NET`'s, its host bits
    /// stay (iptables' `NETMAP` in PREROUTING / OUTPUT).
    pub fn dnat_prefix(self, net: IpNet) -> Rule {
        self.then(Action::Dnat(net.trunc()))
    }

    /// `snat ip prefix to NET`: the same for the source (`NETMAP` in POSTROUTING).
    pub fn snat_prefix(self, net: IpNet) -> Rule {
        self.then(Action::Snat(net.trunc()))
    }

    /// `masquerade`: the source becomes the outgoing interface's address.
    pub fn masquerade(self) -> Rule {
        self.then(Action::Masquerade)
    }

    /// `tcp option maxseg size set rt mtu` (with [`Rule::tcp_syn`]: iptables' `TCPMSS
    /// --clamp-mss-to-pmtu`).
    pub fn clamp_mss_to_pmtu(self) -> Rule {
        self.then(Action::ClampMssToPmtu)
    }

    fn with(mut self, m: Match) -> Rule {
        self.matches.push(m);
        self
    }

    fn then(mut self, a: Action) -> Rule {
        self.action = Some(a);
        self
    }
}

/// Why the rules could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    /// The netfilter netlink socket could not be opened.
    #[error("cannot open a netfilter netlink socket")]
    Open(#[source] io::Error),
    /// The kernel refused the transaction (`what` is the message it refused).
    #[error("the kernel refused {what}")]
    Refused {
        /// The message: e.g. `rule 2 of chain input`.
        what: String,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// Sending or receiving failed.
    #[error("netfilter netlink I/O failed")]
    Io(#[source] io::Error),
    /// The kernel's answer did not parse.
    #[error("malformed answer from the kernel")]
    Malformed(#[from] Malformed),
    /// A rule mixes address families (an IPv4 match with an IPv6 NAT target, ...).
    #[error("rule {index} of chain {chain} mixes IPv4 and IPv6")]
    MixedFamilies {
        /// The chain.
        chain: String,
        /// The rule's position (from 0).
        index: usize,
    },
}

/// A netfilter netlink socket in the calling thread's network namespace.
#[derive(Debug)]
pub struct Firewall {
    socket: Socket,
}

impl Firewall {
    /// Opens the socket (blocking, in the calling thread's network namespace). Keep it for as
    /// long as an owned table must live.
    pub fn open() -> Result<Firewall, FirewallError> {
        Ok(Firewall {
            socket: Socket::open().map_err(FirewallError::Open)?,
        })
    }

    /// Replaces our table `table.name()` by `table`, in one transaction. With `owned`, the
    /// kernel deletes the table when this socket closes (the process ends).
    pub fn apply(&mut self, table: &Table, owned: bool) -> Result<(), FirewallError> {
        let flags = if owned { NFT_TABLE_F_OWNER } else { 0 };
        match self.socket.send(replace(table, flags)?) {
            // The table exists with the other ownership, which a table cannot change: remove
            // it first (a table owned by another live process stays refused: EPERM).
            Err(FirewallError::Refused { what, ref source })
                if what == EXISTING && source.raw_os_error() == Some(libc::EOPNOTSUPP) =>
            {
                self.socket
                    .send(removal(&table.name, flags ^ NFT_TABLE_F_OWNER))?;
                self.socket.send(replace(table, flags)?)
            }
            other => other,
        }
    }

    /// Adds the elements of `set` again in table `table`, in one transaction that first
    /// empties the set (an element that expired meanwhile cannot be deleted, a set can always
    /// be emptied): each one lives for the set's timeout from now. No packet sees the set
    /// empty.
    pub fn refresh(&mut self, table: &str, set: &PortSet) -> Result<(), FirewallError> {
        self.socket.send(refresh(table, set))
    }

    /// Deletes our table `name` (and everything in it); nothing to delete is no error.
    pub fn remove(&mut self, name: &str) -> Result<(), FirewallError> {
        match self.socket.send(removal(name, 0)) {
            Err(FirewallError::Refused { what, ref source })
                if what == EXISTING && source.raw_os_error() == Some(libc::EOPNOTSUPP) =>
            {
                self.socket.send(removal(name, NFT_TABLE_F_OWNER))
            }
            other => other,
        }
    }
}

/// A program's table, applied (owned, or lasting past a crash) and held while it serves: what
/// `vpn-server` and `vpn-client` install before their sessions and remove after them.
#[derive(Debug)]
pub struct Installed {
    firewall: Firewall,
    name: String,
}

impl Installed {
    /// Opens a socket and applies `table` owned by it (blocking, in the calling thread's
    /// network namespace), so the kernel deletes the table if the process ends without
    /// [`Installed::remove`], also by `kill -9`.
    pub fn apply(table: &Table) -> Result<Installed, FirewallError> {
        Self::apply_owned(table, true)
    }

    /// [`Installed::apply`] without the ownership: if the process dies without
    /// [`Installed::remove`] (`kill -9`), the table stays until the next start replaces it
    /// (atomically, [`Firewall::apply`]). For mappings that no packet routed into the
    /// process's device may miss while that device exists: the kernel removes a dead
    /// process's owned table and its tun device in no set order, and a flow whose first
    /// packet passes in between keeps no mapping in conntrack for its life.
    pub fn apply_lasting(table: &Table) -> Result<Installed, FirewallError> {
        Self::apply_owned(table, false)
    }

    fn apply_owned(table: &Table, owned: bool) -> Result<Installed, FirewallError> {
        let mut firewall = Firewall::open()?;
        firewall.apply(table, owned)?;
        tracing::info!(table = table.name(), owned, "firewall rules installed");
        Ok(Installed {
            firewall,
            name: table.name.clone(),
        })
    }

    /// Deletes the table. A failure is logged, not returned: the process is stopping, and the
    /// kernel deletes an owned table anyway once the socket closes (here).
    pub fn remove(mut self) {
        match self.firewall.remove(&self.name) {
            Ok(()) => tracing::info!(table = %self.name, "firewall rules removed"),
            Err(e) => tracing::warn!(error = %chain(&e), "cannot remove the firewall rules"),
        }
    }
}
