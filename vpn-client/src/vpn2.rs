//! vpn2 environment mode: no config file, the vpn2 environment variables
//! ([`Vpn2ClientEnv`]) and vpn2's fixed file layout instead.
//!
//! The client config vpn2 would write for these variables (reference `gardener-vpn2.md` 1.3)
//! is built as typed lines by [`client_lines`] and read without text exactly as a config
//! file's directives are ([`crate::config::load_lines`]), so both modes share one mapping;
//! rendered, the same lines are the config upstream OpenVPN gets when it plays vpn2 in the
//! conformance tests ([`Vpn2Reader::Upstream`]). What vpn2 fixes:
//!
//! - `/SECRETS/vpn-client/{ca.crt,tls.crt,tls.key}` and `/SECRETS/tlsauth/vpn.tlsauth` with
//!   key direction 1 (`SECRETS` is `/srv/secrets` unless overridden);
//! - `auth SHA256`, `data-ciphers AES-256-GCM`, `connect-retry 1 5`, `remote-cert-tls server`,
//!   `txqueuelen 1000`, `tcp-nodelay`, `auth-nocache`, `dev tun0`;
//! - `proto` from `IP_FAMILIES`; `remote ENDPOINT` (port 1194);
//! - shoot client (`IS_SHOOT_CLIENT=true`): `http-proxy ENDPOINT OPENVPN_PORT` with the
//!   header `REVERSED_VPN_HEADER_KEY: REVERSED_VPN_HEADER`.
//!
//! What vpn2's Go half of the entrypoint and its hooks did around OpenVPN is done in-process
//! (the image has no shell and no `ip`): the seed pod network (`241.0.0.0/8` unless
//! `SEED_POD_NETWORK` is IPv6) is routed into the tunnel with the pushed routes instead of by
//! an `up` hook; the shoot side's rules ([`shoot_table`]: forwarding from the tunnel, the
//! NETMAP of the mapped shoot networks back to the real ones, masquerade out of the pod, MSS
//! clamping) are held in an owned nf_tables table for as long as the client runs;
//! `OPENVPN_AUTO_MTU` sets the tun MTU from the default route's link. [`setup`] is the init
//! container's `vpn-client setup`.
//!
//! Pushed routes are taken only inside the networks a vpn2 server pushes ([`pushed_networks`]:
//! the seed side and the transfer network); the rest of a push is taken as from a config file
//! without pull-filters.
//!
//! Left out on purpose: `verb 3` (the default log level, info, is the same) and `management`
//! (we have no management interface).
//!
//! HA (`IS_HA=true`, `docs/ha.md`): no tap, no bond, no address lease. A kube-apiserver pod's
//! `vpn-client-<i>` dials `vpn-seed-server-<i>` with `tun<i>`, routes the shoot networks
//! ([`ha_seed_routes`]) from its pod IP with metric `100 + i` while its tunnel is up, gives up a
//! silent server after 5 s, and holds vpn2's INPUT pair on its device ([`ha_seed_table`]; on
//! overlap also vpn2's NETMAP for the pod's `envoy-proxy`, group 31415, and the `241/8` pair); a
//! shoot pod's `vpn-shoot-s<i>` uses its pod's certificate (`vpn-client-<pod index>/`),
//! `tun<i>`, the shoot-side rules in a table of its own, and routes the seed side the same
//! way.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use netio::firewall::vpn2 as fw_vpn2;
use netio::firewall::{priority, Chain, Hook, Rule, Table};
use netio::sysctl::{self, SysctlError};
use protocol::config::env::Vpn2ClientEnv;
use protocol::config::netmap::{Netmap, NetmapError, MAPPED_SEED_POD_NETWORK};
use protocol::config::{render, CertUsage, ConnectRetry, CustomHeader, FileArg, Line};
use protocol::data::DataCipher;
use protocol::digest::Digest;
use protocol::key::{KeyDirection, Role};
use protocol::ncp::DataCiphers;
use protocol::push::{FilterAction, OptionKind, PullFilter, StrictPolicy};

use crate::config::{load_lines, LoadError, Loaded};
use crate::settings::HaRoutes;

/// vpn2's secrets directory.
pub const DEFAULT_SECRETS_DIR: &str = "/srv/secrets";
/// The name used for the rendered config in messages.
pub const VPN2_CONFIG_NAME: &str = "<vpn2 environment>";

/// Why the environment cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Vpn2Error {
    /// `ENDPOINT` is not set.
    #[error("ENDPOINT is not set")]
    NoEndpoint,
    /// `IS_HA=true` without the variable HA mode needs.
    #[error("IS_HA=true needs {0}")]
    HaNeeds(&'static str),
    /// `VPN_SERVER_INDEX` names a server that does not exist.
    #[error("VPN_SERVER_INDEX={index}: must be below {servers} ({why})")]
    HaIndex {
        /// The index given.
        index: u32,
        /// The server count it must stay below.
        servers: u32,
        /// Where that count comes from.
        why: &'static str,
    },
    /// A value that would break the config line it goes into.
    #[error("{variable}={value:?}: must not contain whitespace, quotes or backslashes")]
    Unquotable {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The rendered config could not be loaded (a missing secret file, ...).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The shoot networks do not fit into vpn2's mapped ranges.
    #[error("shoot networks")]
    Netmap(#[from] NetmapError),
}

/// Who reads [`client_lines`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vpn2Reader {
    /// Our client: vpn2's lines without `verb 3` (our default log level is the same),
    /// `management` (we have none) and the shoot client's `up` hook (the route comes with
    /// the pushed ones, [`load_env`]); a kube-apiserver's HA client gives up a silent server
    /// after [`HA_SEED_PING_RESTART`] s.
    Ours,
    /// Upstream OpenVPN playing vpn2 (the conformance tests): every line vpn2 writes.
    Upstream,
}

/// The client config vpn2 writes for `env` (reference gardener-vpn2.md 1.3, vpn2's
/// `client-config.template`), typed, with the secrets under `secrets` and what `reader`
/// takes of it. Our client reads the lines into its settings ([`load_env`]); rendered
/// ([`render_client_config`], [`protocol::config::render`]) they are the config upstream
/// OpenVPN gets. Values that could not be written into vpn2's config text are refused.
pub fn client_lines(
    env: &Vpn2ClientEnv,
    secrets: &Path,
    reader: Vpn2Reader,
) -> Result<Vec<Line>, Vpn2Error> {
    let endpoint = env.endpoint.as_deref().ok_or(Vpn2Error::NoEndpoint)?;
    let endpoint = word("ENDPOINT", endpoint)?;
    let dir = PathBuf::from(word("--vpn2-secrets-dir", &secrets.display().to_string())?);
    let role = ha_role(env)?;
    let upstream = reader == Vpn2Reader::Upstream;
    let mut lines = Vec::new();
    if upstream {
        lines.push(Line::Verb(3));
    }
    lines.extend([
        Line::AuthNocache,
        Line::Txqueuelen(1000),
        Line::TcpNodelay,
        Line::Pull,
        Line::DataCiphers(DataCiphers::of(DataCipher::Aes256Gcm, &[])),
        Line::TlsClient,
        Line::ConnectRetry(ConnectRetry { initial: 1, max: 5 }),
        Line::Auth(Digest::Sha256),
        Line::TlsAuth(
            FileArg::quoted(dir.join("tlsauth/vpn.tlsauth")),
            KeyDirection::Inverse,
        ),
        Line::RemoteCertTls(CertUsage::Server),
        Line::Proto(env.ip_families.client_family(), Role::Client),
    ]);
    let certs = match role {
        // A shoot pod's certificate is the one of its own index (`vpn-shoot-client-<j>`).
        Some(HaRole::Shoot { pod, .. }) => dir.join(format!("vpn-client-{pod}")),
        _ => dir.join("vpn-client"),
    };
    lines.extend([
        Line::Key(FileArg::plain(certs.join("tls.key"))),
        Line::Cert(FileArg::plain(certs.join("tls.crt"))),
        Line::Ca(FileArg::plain(certs.join("ca.crt"))),
    ]);
    if let (Some(HaRole::Seed { .. }), false) = (role, upstream) {
        // Inside the seed: a silent server is given up after 5 s (docs/ha.md §4), whatever
        // the server pushes for the shoot side.
        lines.push(Line::PingRestart(HA_SEED_PING_RESTART));
        lines.push(Line::PullFilter(PullFilter::new(
            FilterAction::Ignore,
            "ping-restart",
        )));
    }
    if env.is_shoot_client {
        lines.push(Line::HttpProxy {
            host: endpoint.clone(),
            port: env.openvpn_port,
        });
        lines.push(Line::CustomHeader(CustomHeader {
            name: word("REVERSED_VPN_HEADER_KEY", &env.reversed_vpn_header_key)?,
            content: Some(word("REVERSED_VPN_HEADER", &env.reversed_vpn_header)?),
        }));
        if upstream {
            let index = env.vpn_server_index.filter(|_| role.is_some()).unwrap_or(0);
            lines.push(Line::Management {
                host: "127.0.0.1".to_owned(),
                port: u16::try_from(VPN2_MANAGEMENT_PORT + index).unwrap_or(u16::MAX),
            });
        }
    }
    lines.push(Line::Dev(device(env)?));
    lines.push(Line::Remote(endpoint));
    if upstream && env.is_shoot_client && role.is_none() {
        lines.push(Line::ScriptSecurity(2));
        lines.push(Line::Up(format!(
            "/bin/sh -c '/sbin/ip route replace {} dev $1' -- ",
            seed_side_route(env)
        )));
    }
    Ok(lines)
}

/// vpn2's first management port (server *i*'s shoot client listens on `7505 + i`).
const VPN2_MANAGEMENT_PORT: u32 = 7505;

/// `value` of `variable` if it can stand as one word of vpn2's config text.
fn word(variable: &'static str, value: &str) -> Result<String, Vpn2Error> {
    if value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '#' | ';'))
    {
        return Err(Vpn2Error::Unquotable {
            variable,
            value: value.to_owned(),
        });
    }
    Ok(value.to_owned())
}

/// The seed side a shoot client routes into its tunnel for the replies: an IPv6 seed pod
/// network as it is, else vpn2's `241.0.0.0/8`.
fn seed_side_route(env: &Vpn2ClientEnv) -> IpNet {
    match env.seed_pod_network {
        Some(v6 @ IpNet::V6(_)) => v6.trunc(),
        _ => IpNet::V4(MAPPED_SEED_POD_NETWORK),
    }
}

/// The client config text of [`client_lines`] for our client.
pub fn render_client_config(env: &Vpn2ClientEnv, secrets: &Path) -> Result<String, Vpn2Error> {
    Ok(render(&client_lines(env, secrets, Vpn2Reader::Ours)?))
}

/// Settings for `env` with the secrets under `secrets` (see the module docs).
pub fn load_env(env: &Vpn2ClientEnv, secrets: &Path) -> Result<Loaded, Vpn2Error> {
    let lines = client_lines(env, secrets, Vpn2Reader::Ours)?;
    let mut loaded = load_lines(VPN2_CONFIG_NAME, &lines)?;
    let role = ha_role(env)?;
    loaded.settings.pull.strict = Some(
        StrictPolicy::new()
            .allow(OptionKind::ALL)
            .allow_networks(pushed_networks(env)?),
    );
    let dev = device(env)?;
    let tun = &mut loaded.settings.tun;
    tun.auto_mtu = env.auto_mtu;
    if env.is_shoot_client {
        tun.routes.push(seed_side_route(env));
        let netmap = Netmap::vpn2(
            &env.shoot_pod_networks,
            &env.shoot_service_networks,
            &env.shoot_node_networks,
        )?;
        let table = match role {
            // Each of a shoot pod's clients holds its own table for its own device.
            Some(_) => format!("{TABLE}-{dev}"),
            None => TABLE.to_owned(),
        };
        let mut rules = shoot_table(&table, &dev, &netmap);
        if let Some(HaRole::Shoot { server, .. }) = role {
            rules = rules.chain(return_mark_chain(&dev, HA_METRIC_BASE + server));
        }
        loaded.settings.firewall = Some(rules);
    }
    match role {
        None => {}
        Some(HaRole::Shoot { server, .. }) => {
            // Replies to the kube-apiservers (their pod IPs, or 241/8 where vpn2 maps them):
            // also the real seed pod network where it cannot be mistaken for the shoot's.
            if let Some(seed @ IpNet::V4(_)) = env.seed_pod_network {
                if !overlaps_shoot(env, seed) {
                    tun.routes.push(seed.trunc());
                }
            }
            // IPv4 kube-apiservers reach IPv6 shoot networks from the transfer network.
            if !matches!(env.seed_pod_network, Some(IpNet::V6(_))) {
                tun.routes.push(IpNet::V6(env.vpn_network.trunc()));
            }
            tun.ha = Some(HaRoutes {
                metric: HA_METRIC_BASE + server,
                source_from_socket: false,
                hold_down: HA_HOLD_DOWN,
                return_by_mark: Some(HA_METRIC_BASE + server),
                transfer_v6: None,
                standby_metric: None,
            });
        }
        Some(HaRole::Seed { server }) => {
            for net in ha_seed_routes(env)? {
                if !tun.routes.contains(&net) {
                    tun.routes.push(net);
                }
            }
            tun.ha = Some(HaRoutes {
                metric: HA_METRIC_BASE + server,
                source_from_socket: true,
                hold_down: HA_HOLD_DOWN,
                return_by_mark: None,
                transfer_v6: Some(env.vpn_network),
                standby_metric: Some(HA_STANDBY_METRIC_BASE + server),
            });
            let overlap = match overlapping_seed(env) {
                Some(seed) => Some((
                    seed,
                    Netmap::vpn2(
                        &env.shoot_pod_networks,
                        &env.shoot_service_networks,
                        &env.shoot_node_networks,
                    )?,
                )),
                None => None,
            };
            let overlap = overlap.as_ref().map(|(seed, netmap)| (*seed, netmap));
            loaded.settings.firewall =
                Some(ha_seed_table(&format!("{TABLE}-{dev}"), &dev, overlap));
            let shoot: Vec<IpNet> = env
                .shoot_service_networks
                .iter()
                .chain(&env.shoot_pod_networks)
                .chain(&env.shoot_node_networks)
                .copied()
                .collect();
            loaded.settings.guard = Some(ha_seed_guard(&tun.routes, &shoot));
        }
    }
    Ok(loaded)
}

/// The networks a vpn2 server may push routes into: the seed side (the seed's pod network,
/// and `241.0.0.0/8` where vpn2 maps it), vpn2's transfer network (`VPN_NETWORK`), and for
/// a kube-apiserver's HA client the shoot networks its server lets through
/// ([`ha_seed_routes`]). In environment mode the client takes pushed routes inside these only
/// (strict mode with every option kind allowed); any other route is dropped and logged.
pub fn pushed_networks(env: &Vpn2ClientEnv) -> Result<Vec<IpNet>, Vpn2Error> {
    let mut out = vec![
        IpNet::V4(MAPPED_SEED_POD_NETWORK),
        IpNet::V6(env.vpn_network.trunc()),
    ];
    if let Some(seed) = env.seed_pod_network {
        out.push(seed.trunc());
    }
    if let Some(HaRole::Seed { .. }) = ha_role(env)? {
        out.extend(ha_seed_routes(env)?);
    }
    out.dedup();
    Ok(out)
}

/// The shoot networks a kube-apiserver's HA client routes into its tunnel, as the server lets
/// them through: the real ones, or vpn2's mapped ranges for the IPv4 ones where the seed's pod
/// network overlaps them (services, pods, nodes; duplicates removed).
pub fn ha_seed_routes(env: &Vpn2ClientEnv) -> Result<Vec<IpNet>, Vpn2Error> {
    let netmap = Netmap::vpn2(
        &env.shoot_pod_networks,
        &env.shoot_service_networks,
        &env.shoot_node_networks,
    )?;
    let overlap = overlapping_seed(env).is_some();
    let mut out: Vec<IpNet> = Vec::new();
    for net in env
        .shoot_service_networks
        .iter()
        .chain(&env.shoot_pod_networks)
        .chain(&env.shoot_node_networks)
    {
        let routed = match (overlap, net) {
            (true, IpNet::V4(real)) => netmap
                .entries()
                .iter()
                .find(|(r, _)| r == real)
                .map_or(*net, |(_, mapped)| IpNet::V4(*mapped)),
            _ => net.trunc(),
        };
        if !out.contains(&routed) {
            out.push(routed);
        }
    }
    Ok(out)
}

/// HA: the metric of server 0's routes; server *i*'s are `100 + i`, so the lowest index up
/// carries the traffic.
pub const HA_METRIC_BASE: u32 = 100;
/// HA, kube-apiserver side: the metric of server 0's routes while its tunnel is down
/// (`HaRoutes::standby_metric`); above every active one.
pub const HA_STANDBY_METRIC_BASE: u32 = 1000;
/// HA: how long a tunnel that came back must stay up before it takes its routes back
/// (`docs/ha.md` §4: a path going up and down does not drag traffic with it).
pub const HA_HOLD_DOWN: std::time::Duration = std::time::Duration::from_secs(10);
/// HA: a kube-apiserver's client gives up a silent server after this many seconds.
pub const HA_SEED_PING_RESTART: u32 = 5;

/// What an HA client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HaRole {
    /// `vpn-client-<server>` in a kube-apiserver pod.
    Seed { server: u32 },
    /// `vpn-shoot-s<server>` in shoot pod `pod` (the index of `POD_NAME`).
    Shoot { server: u32, pod: u32 },
}

/// The HA role `env` describes (`None` without `IS_HA`).
fn ha_role(env: &Vpn2ClientEnv) -> Result<Option<HaRole>, Vpn2Error> {
    if !env.is_ha {
        return Ok(None);
    }
    let server = env
        .vpn_server_index
        .ok_or(Vpn2Error::HaNeeds("VPN_SERVER_INDEX"))?;
    let (servers, why) = match env.ha_vpn_servers {
        0 => (HA_MAX_SERVERS, "vpn2's most HA servers"),
        n => (n.min(HA_MAX_SERVERS), "HA_VPN_SERVERS"),
    };
    if server >= servers {
        return Err(Vpn2Error::HaIndex {
            index: server,
            servers,
            why,
        });
    }
    if !env.is_shoot_client {
        return Ok(Some(HaRole::Seed { server }));
    }
    let pod = env
        .client_index
        .ok_or(Vpn2Error::HaNeeds("POD_NAME ending in the pod's index"))?;
    Ok(Some(HaRole::Shoot { server, pod }))
}

/// HA servers at most (vpn2's `POD_NAME` suffixes `-0` to `-2`).
pub(crate) const HA_MAX_SERVERS: u32 = 3;

/// The device: `tun0` without HA, `tun<VPN_SERVER_INDEX>` with.
fn device(env: &Vpn2ClientEnv) -> Result<String, Vpn2Error> {
    Ok(match ha_role(env)? {
        None => DEVICE.to_owned(),
        Some(HaRole::Seed { server } | HaRole::Shoot { server, .. }) => format!("tun{server}"),
    })
}

/// The seed's pod network if it overlaps one of the shoot's networks (vpn2 then maps).
fn overlapping_seed(env: &Vpn2ClientEnv) -> Option<IpNet> {
    env.seed_pod_network
        .filter(|seed| overlaps_shoot(env, *seed))
        .map(|seed| seed.trunc())
}

/// Whether `net` overlaps one of the shoot's networks.
fn overlaps_shoot(env: &Vpn2ClientEnv, net: IpNet) -> bool {
    env.shoot_service_networks
        .iter()
        .chain(&env.shoot_pod_networks)
        .chain(&env.shoot_node_networks)
        .any(|s| s.contains(&net.network()) || net.contains(&s.network()))
}

/// A shoot pod's return path for HA client device `device` (`docs/ha.md` §3): a connection
/// coming in from the device gets connection mark `mark` (every packet, so the mark follows
/// a flow the kube-apiserver moved to the other server), and every packet of a connection
/// with that mark gets packet mark `mark`, which the client's routing rule sends back
/// through the device while its tunnel is up.
pub fn return_mark_chain(device: &str, mark: u32) -> Chain {
    Chain::filter(
        format!("return-{device}"),
        Hook::Prerouting,
        priority::MANGLE,
    )
    .rule(Rule::new().iifname(device).set_ct_mark(mark))
    .rule(Rule::new().ct_mark(mark).set_mark(mark))
}

/// The kube-apiserver pod's rules for HA client device `device` (vpn2's INPUT pair on `bond+`,
/// here on the device): from the tunnel only what belongs to connections the pod opened.
///
/// With `overlap` (the seed's pod network and the shoot networks' netmap, given when they
/// overlap: Gardener then runs `envoy-proxy` in group 31415 in this pod and points the
/// kube-apiserver's egress selector at it, gardener#12204), vpn2's rules for that proxy as
/// the non-HA seed server has them (`netio::firewall::vpn2`): the seed's pod network seen as
/// `241/8` through the device both ways, the proxy group's connections to the real IPv4 shoot
/// networks sent to their mapped ranges (which the client routes into the device), and that
/// group's new TCP connections to what is left in the seed's pod network, loopback and
/// link-local refused. Each client's table has them; the same NAT twice is one NAT (the
/// first chain binds the connection), and either client alone keeps them in place.
pub fn ha_seed_table(name: &str, device: &str, overlap: Option<(IpNet, &Netmap)>) -> Table {
    let mut table = Table::new(name)
        .chain(Chain::filter("input", Hook::Input, priority::FILTER).replies_only_from(device));
    let Some((seed, netmap)) = overlap else {
        return table;
    };
    for chain in fw_vpn2::seed_pod_mapping(device, seed)
        .into_iter()
        .flatten()
    {
        table = table.chain(chain);
    }
    if let Some(output) = fw_vpn2::proxy_netmap(netmap) {
        table = table.chain(output);
    }
    table.chain(fw_vpn2::proxy_guard(Some(seed)))
}

/// The kube-apiserver pod's table that outlives its HA clients (both apply the same one):
/// packets to the networks the clients route into their tunnels (`routed`), and the proxy
/// group's packets to the real IPv4 shoot networks (`shoot`; they overlap the pod's own
/// network where vpn2 maps them), leave by a `tun` device or not at all
/// ([`Chain::tunnel_only`]). While both tunnels are down (their routes withdrawn), or both
/// client processes restart (their devices gone), the kube-apiserver's packets to the shoot
/// would otherwise follow the pod's default route into the seed's network.
pub fn ha_seed_guard(routed: &[IpNet], shoot: &[IpNet]) -> Table {
    let shoot_v4: Vec<IpNet> = shoot
        .iter()
        .filter(|n| n.addr().is_ipv4())
        .map(IpNet::trunc)
        .collect();
    Table::new(GUARD_TABLE).chain(Chain::tunnel_only("tun*", routed, &shoot_v4))
}

/// The kube-apiserver pod's table of [`ha_seed_guard`].
pub const GUARD_TABLE: &str = "vpn-seed-client-guard";

/// The tun device vpn2's shoot client uses.
pub const DEVICE: &str = "tun0";
/// The pod's own interface, out of which forwarded traffic is masqueraded.
pub const POD_INTERFACE: &str = "eth0";
/// Our nf_tables table on the shoot side.
pub const TABLE: &str = "vpn-shoot";

/// vpn2's shoot-side rules (reference gardener-pods.md §2.4) for VPN device `device`:
/// forward what comes out of the tunnel; map each mapped IPv4 shoot network back to the real
/// one on the way in and the real one to the mapped one on the way back into the tunnel; the
/// pod's address as the source of everything leaving through its interface (so the shoot's
/// network policies see the vpn-shoot pod); TCP SYNs' MSS clamped to the path MTU, both ways.
pub fn shoot_table(name: &str, device: &str, netmap: &Netmap) -> Table {
    let entries = netmap.entries();
    Table::new(name)
        .chain(
            Chain::filter("forward", Hook::Forward, priority::FILTER)
                .rule(Rule::new().iifname(device).accept()),
        )
        .chain(
            Chain::nat("prerouting", Hook::Prerouting, priority::DSTNAT).rules(entries.iter().map(
                |(real, mapped)| {
                    Rule::new()
                        .iifname(device)
                        .daddr(IpNet::V4(*mapped))
                        .dnat_prefix(IpNet::V4(*real))
                },
            )),
        )
        .chain(
            Chain::nat("postrouting", Hook::Postrouting, priority::SRCNAT)
                .rules(entries.iter().map(|(real, mapped)| {
                    Rule::new()
                        .oifname(device)
                        .saddr(IpNet::V4(*real))
                        .snat_prefix(IpNet::V4(*mapped))
                }))
                .rule(Rule::new().oifname(POD_INTERFACE).masquerade()),
        )
        .chain(
            Chain::filter("clamp-mss", Hook::Postrouting, priority::MANGLE)
                .rule(Rule::new().tcp_syn().clamp_mss_to_pmtu()),
        )
}

/// The shoot side's kernel settings (vpn2's `vpn-client setup` for the shoot: reference
/// gardener-pods.md §2.4): no martian logging or reverse-path filtering (path switches),
/// vpn2's TCP buffers, port range and TIME-WAIT handling, forwarding on, and conntrack's TCP
/// timeouts for NAT-heavy churn.
pub const SHOOT_SYSCTLS: &[(&str, &str)] = &[
    ("net.ipv4.conf.all.log_martians", "0"),
    ("net.ipv4.conf.default.log_martians", "0"),
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
    ("net.ipv4.tcp_wmem", "65536\t12582912\t16777216"),
    ("net.ipv4.tcp_rmem", "65536\t12582912\t16777216"),
    ("net.ipv4.ip_local_port_range", "1024 65535"),
    ("net.ipv4.tcp_tw_reuse", "1"),
    ("net.ipv4.tcp_fin_timeout", "30"),
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv6.conf.all.forwarding", "1"),
];

/// Conntrack's TCP timeouts the shoot side sets (seconds); they exist only once the kernel's
/// connection tracking is loaded (kube-proxy loads it on every node).
pub const SHOOT_CONNTRACK_SYSCTLS: &[(&str, &str)] = &[
    ("net.netfilter.nf_conntrack_tcp_timeout_established", "600"),
    ("net.netfilter.nf_conntrack_tcp_timeout_syn_sent", "30"),
    ("net.netfilter.nf_conntrack_tcp_timeout_syn_recv", "30"),
    ("net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "30"),
    ("net.netfilter.nf_conntrack_tcp_timeout_time_wait", "30"),
    ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", "30"),
    (
        "net.netfilter.nf_conntrack_tcp_timeout_unacknowledged",
        "60",
    ),
    ("net.netfilter.nf_conntrack_tcp_timeout_max_retrans", "120"),
];

/// `vpn-client setup` (the shoot's init container, privileged): [`SHOOT_SYSCTLS`], then
/// [`SHOOT_CONNTRACK_SYSCTLS`] where connection tracking is loaded (each one missing is
/// logged; vpn2 failed there).
pub fn setup() -> Result<(), SysctlError> {
    sysctl::write_all(SHOOT_SYSCTLS)?;
    for (name, value) in SHOOT_CONNTRACK_SYSCTLS {
        if !sysctl::path(name).exists() {
            tracing::warn!(name, "connection tracking not loaded: not set");
            continue;
        }
        sysctl::write(name, value)?;
    }
    tracing::info!(
        count = SHOOT_SYSCTLS.len() + SHOOT_CONNTRACK_SYSCTLS.len(),
        "kernel settings of the shoot side applied"
    );
    Ok(())
}

/// vpn2's kernel settings of a kube-apiserver pod with HA clients (its `vpn-client-init`;
/// reference gardener-pods.md §2.3): no martian logging or reverse-path filtering (the shoot's
/// replies may come back through either tunnel), vpn2's TCP buffers, IPv6 on. vpn2 then built
/// `tap0`, `tap1`, `bond0` with a leased address; our clients need none of it.
pub const SEED_HA_SYSCTLS: &[(&str, &str)] = &[
    ("net.ipv4.conf.all.log_martians", "0"),
    ("net.ipv4.conf.default.log_martians", "0"),
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
    ("net.ipv4.tcp_wmem", "65536\t12582912\t16777216"),
    ("net.ipv4.tcp_rmem", "65536\t12582912\t16777216"),
    ("net.ipv6.conf.all.disable_ipv6", "0"),
];

/// `vpn-client setup` in a kube-apiserver pod (HA): [`SEED_HA_SYSCTLS`]; no devices and no
/// address lease (each client opens its own `tun<i>` and routes from the pod IP).
pub fn setup_seed() -> Result<(), SysctlError> {
    sysctl::write_all(SEED_HA_SYSCTLS)?;
    tracing::info!(
        count = SEED_HA_SYSCTLS.len(),
        "kernel settings of the kube-apiserver pod applied; no tap, bond or ip6tnl devices and \
         no address lease are needed (each vpn-client-<i> opens tun<i> and routes from the pod IP)"
    );
    Ok(())
}

/// Whether the process environment `vars` asks for vpn2 environment mode: `ENDPOINT` or
/// `IS_SHOOT_CLIENT` set to something non-empty.
pub fn requested<I, K, V>(vars: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    vars.into_iter().any(|(k, v)| {
        matches!(k.as_ref(), "ENDPOINT" | "IS_SHOOT_CLIENT") && !v.as_ref().is_empty()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_text;
    use crate::config::tests::secrets;
    use crate::TunSettings;
    use netio::http::CustomHeader;
    use protocol::config::{ClientOptions, Family};

    fn env(vars: &[(&str, &str)]) -> Vpn2ClientEnv {
        Vpn2ClientEnv::parse(vars.iter().copied()).expect("env")
    }

    #[test]
    fn the_shoot_client_environment_gives_vpn2s_settings() {
        let dir = secrets();
        let e = env(&[
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.demo.proj.example.com"),
            ("OPENVPN_PORT", "8443"),
            ("SHOOT_POD_NETWORKS", "100.96.0.0/11"),
            ("SHOOT_SERVICE_NETWORKS", "100.64.0.0/13"),
            ("REVERSED_VPN_HEADER_KEY", "X-Gardener-Destination"),
            (
                "REVERSED_VPN_HEADER",
                "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local",
            ),
        ]);
        let from_env = load_env(&e, dir.path()).expect("env mode").settings;
        // The same settings as the rendered template fixture.
        let fixture = crate::config::tests::VPN2_CLIENT_SHOOT
            .replace("/srv/secrets", &dir.path().display().to_string());
        let from_file = load_text("f", &fixture).expect("fixture").settings;
        assert_eq!(from_env.remotes, from_file.remotes);
        assert_eq!(from_env.http_proxy, from_file.http_proxy);
        // vpn2's `up` hook routed the seed's pods with `/bin/sh` and `/sbin/ip`; here the
        // route comes with the pushed ones (the image has neither program).
        assert!(from_file.scripts.up.is_some() && from_env.scripts.up.is_none());
        assert_eq!(
            from_env.tun,
            TunSettings {
                routes: vec!["241.0.0.0/8".parse().unwrap()],
                ..from_file.tun.clone()
            }
        );
        // And the shoot side's rules, with the default networks mapped.
        let table = format!("{:?}", from_env.firewall.expect("firewall"));
        for part in ["244.0.0.0/11", "243.0.0.0/13", "\"eth0\"", "ClampMssToPmtu"] {
            assert!(table.contains(part), "{part} missing: {table}");
        }
        assert_eq!(from_env.family, Family::V4);
        assert_eq!(from_env.auth, from_file.auth);
        assert_eq!(from_env.data_ciphers, from_file.data_ciphers);
        assert_eq!(
            (from_env.connect_retry, from_env.connect_retry_max),
            (from_file.connect_retry, from_file.connect_retry_max)
        );
        assert_eq!(
            format!("{:?}", from_env.protection),
            format!("{:?}", from_file.protection)
        );
    }

    #[test]
    fn defaults_dual_stack_and_the_seed_side() {
        let dir = secrets();
        let e = env(&[
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.example.com"),
            ("IP_FAMILIES", "IPv6,IPv4"),
            ("SEED_POD_NETWORK", "fd00:10::/64"),
        ]);
        let s = load_env(&e, dir.path()).expect("env").settings;
        let proxy = s.http_proxy.expect("proxy");
        assert_eq!(proxy.port, 8132);
        assert_eq!(
            proxy.options.custom_headers,
            [CustomHeader::NameValue {
                name: "Reversed-VPN".into(),
                value: "invalid-host".into()
            }]
        );
        assert_eq!(s.family, Family::Any);
        assert_eq!(s.tun.routes, ["fd00:10::/64".parse::<IpNet>().unwrap()]);

        let seed = env(&[("ENDPOINT", "vpn-seed-server-0")]);
        let s = load_env(&seed, dir.path()).expect("seed side").settings;
        assert!(s.http_proxy.is_none() && s.scripts.up.is_none());
        assert!(s.tun.routes.is_empty() && s.firewall.is_none());
        assert_eq!(s.remotes, [crate::Remote::new("vpn-seed-server-0", 1194)]);
    }

    #[test]
    fn only_routes_inside_vpn2s_networks_are_taken() {
        use protocol::push::{DropReason, PushCollector, StrictRefusal};
        let dir = secrets();
        let e = env(&[
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.example.com"),
            ("SEED_POD_NETWORK", "10.96.0.0/16"),
        ]);
        let pull = load_env(&e, dir.path()).expect("env").settings.pull;
        let out = PushCollector::new()
            .push_part(
                &pull,
                "route 241.1.0.0 255.255.0.0,route 10.96.0.0 255.255.0.0,\
                 route-ipv6 fd8f:6d53:b97a:1::/96,route 10.97.0.0 255.255.0.0,\
                 route 192.168.0.0 255.255.0.0,route-ipv6 fd00:10::/64,\
                 route-ipv6 2001:db8::/32,topology subnet,ping 10,ping-restart 30,tun-mtu 1400",
            )
            .expect("push")
            .expect("complete");
        assert_eq!(
            out.accepted_texts,
            [
                "route 241.1.0.0 255.255.0.0",
                "route 10.96.0.0 255.255.0.0",
                "route-ipv6 fd8f:6d53:b97a:1::/96",
                "topology subnet",
                "ping 10",
                "ping-restart 30",
                "tun-mtu 1400"
            ]
        );
        let outside: Vec<&str> = out
            .dropped
            .iter()
            .filter(|d| {
                matches!(
                    d.reason,
                    DropReason::Strict(StrictRefusal::RouteOutsideAllowedNetworks { .. })
                )
            })
            .map(|d| d.text.as_str())
            .collect();
        assert_eq!(
            outside,
            [
                "route 10.97.0.0 255.255.0.0",
                "route 192.168.0.0 255.255.0.0",
                "route-ipv6 fd00:10::/64",
                "route-ipv6 2001:db8::/32"
            ]
        );
        // A kube-apiserver's HA client also takes the shoot networks its server lets through.
        let ha = env(&[
            ("ENDPOINT", "vpn-seed-server-0"),
            ("IS_HA", "true"),
            ("VPN_SERVER_INDEX", "0"),
            ("SHOOT_POD_NETWORKS", "100.96.0.0/11"),
        ]);
        let nets = pushed_networks(&ha).expect("ha");
        assert!(nets.contains(&"100.96.0.0/11".parse().unwrap()), "{nets:?}");
    }

    #[test]
    fn ha_clients_have_their_own_device_and_route_only_while_up() {
        let dir = secrets();
        let ha = [
            ("IS_HA", "true"),
            ("HA_VPN_CLIENTS", "2"),
            ("HA_VPN_SERVERS", "2"),
            ("SHOOT_SERVICE_NETWORKS", "100.64.0.0/13"),
            ("SHOOT_POD_NETWORKS", "100.96.0.0/11"),
            ("SHOOT_NODE_NETWORKS", "10.250.0.0/16"),
            ("SEED_POD_NETWORK", "10.1.0.0/16"),
        ];
        // vpn-client-1 of a kube-apiserver pod.
        let mut vars = ha.to_vec();
        vars.extend([("ENDPOINT", "vpn-seed-server-1"), ("VPN_SERVER_INDEX", "1")]);
        let s = load_env(&env(&vars), dir.path()).expect("seed HA").settings;
        assert_eq!(s.tun.name, "tun1");
        let nets: Vec<IpNet> = ["100.64.0.0/13", "100.96.0.0/11", "10.250.0.0/16"]
            .map(|n| n.parse().expect("net"))
            .to_vec();
        assert_eq!(s.tun.routes, nets);
        assert_eq!(
            s.tun.ha,
            Some(HaRoutes {
                metric: 101,
                source_from_socket: true,
                hold_down: HA_HOLD_DOWN,
                return_by_mark: None,
                transfer_v6: Some("fd8f:6d53:b97a:1::/96".parse().expect("net")),
                standby_metric: Some(1001),
            })
        );
        let table = format!("{:?}", s.firewall.expect("INPUT rules"));
        assert!(
            table.contains("\"tun1\"") && table.contains("vpn-shoot-tun1"),
            "{table}"
        );
        let text = render_client_config(&env(&vars), dir.path()).expect("text");
        assert!(
            text.contains("ping-restart 5\npull-filter ignore \"ping-restart\""),
            "{text}"
        );
        // On overlap the IPv4 shoot networks are routed as vpn2 maps them.
        vars.push(("SEED_POD_NETWORK", "100.96.0.0/11"));
        let routes = ha_seed_routes(&env(&vars)).expect("routes");
        assert!(
            routes.iter().all(|n| n.to_string().starts_with("24")),
            "{routes:?}"
        );
        // vpn-shoot-s0 of shoot pod 1: its own certificate directory, device and table.
        let mut vars = ha.to_vec();
        vars.extend([
            ("ENDPOINT", "api.example.com"),
            ("IS_SHOOT_CLIENT", "true"),
            ("VPN_SERVER_INDEX", "0"),
            ("POD_NAME", "vpn-shoot-1"),
        ]);
        let text = render_client_config(&env(&vars), dir.path()).expect("shoot HA");
        for line in [
            "dev tun0",
            "/vpn-client-1/tls.crt",
            "http-proxy api.example.com",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("ping-restart"), "{text}");
        let no_pod = vars[..vars.len() - 1].to_vec();
        assert!(matches!(
            render_client_config(&env(&no_pod), dir.path()),
            Err(Vpn2Error::HaNeeds(_))
        ));
    }

    #[test]
    fn on_overlap_the_kube_apiserver_pod_maps_its_proxys_connections_as_vpn2() {
        use netio::firewall::VPN2_PROXY_GID;
        let dir = secrets();
        let net = |s: &str| s.parse::<IpNet>().expect("net");
        let vars = |seed: &'static str| {
            env(&[
                ("IS_HA", "true"),
                ("HA_VPN_CLIENTS", "2"),
                ("HA_VPN_SERVERS", "2"),
                ("ENDPOINT", "vpn-seed-server-1"),
                ("VPN_SERVER_INDEX", "1"),
                ("SHOOT_SERVICE_NETWORKS", "10.64.0.0/13"),
                ("SHOOT_POD_NETWORKS", "10.96.0.0/11"),
                ("SHOOT_NODE_NETWORKS", "10.250.0.0/16,fd00:250::/64"),
                ("SEED_POD_NETWORK", seed),
            ])
        };
        // Disjoint: vpn2's INPUT pair only (no envoy-proxy in the pod).
        let s = load_env(&vars("172.16.0.0/16"), dir.path())
            .expect("disjoint")
            .settings;
        assert_eq!(
            s.firewall,
            Some(Table::new("vpn-shoot-tun1").chain(
                Chain::filter("input", Hook::Input, priority::FILTER).replies_only_from("tun1")
            ))
        );
        // Overlapping: the 241/8 pair on the device, the proxy group's NETMAP to the ranges
        // the client routes, and its refusal of what is left of the seed's own.
        let s = load_env(&vars("10.0.0.0/8"), dir.path())
            .expect("overlap")
            .settings;
        let table = s.firewall.expect("table");
        let text = format!("{table:?}");
        let rules = [
            Rule::new()
                .iifname("tun1")
                .daddr(net("241.0.0.0/8"))
                .dnat_prefix(net("10.0.0.0/8")),
            Rule::new()
                .oifname("tun1")
                .saddr(net("10.0.0.0/8"))
                .snat_prefix(net("241.0.0.0/8")),
            Rule::new()
                .skgid(VPN2_PROXY_GID)
                .daddr(net("10.96.0.0/11"))
                .dnat_prefix(net("244.0.0.0/11")),
            Rule::new()
                .skgid(VPN2_PROXY_GID)
                .daddr(net("10.64.0.0/13"))
                .dnat_prefix(net("243.0.0.0/13")),
            Rule::new()
                .skgid(VPN2_PROXY_GID)
                .daddr(net("10.250.0.0/16"))
                .dnat_prefix(net("242.0.0.0/16")),
            Rule::new()
                .skgid(VPN2_PROXY_GID)
                .new_connection()
                .tcp()
                .daddr(net("10.0.0.0/8"))
                .reject_with_tcp_reset(),
        ];
        for rule in rules {
            assert!(text.contains(&format!("{rule:?}")), "{rule:?} in {text}");
        }
        assert!(
            !text.contains("fd00:250"),
            "IPv6 is routed as it is: {text}"
        );
        // Every mapped range is one the client routes into its device.
        for mapped in ["244.0.0.0/11", "243.0.0.0/13", "242.0.0.0/16"] {
            assert!(
                s.tun.routes.contains(&net(mapped)),
                "{mapped}: {:?}",
                s.tun.routes
            );
        }
        // And the whole table is the seed server's shape (input, the pair, output, guard).
        let chains = [
            "\"input\"",
            "\"prerouting\"",
            "\"postrouting\"",
            "\"output\"",
            "\"proxy-guard\"",
        ];
        let at: Vec<usize> = chains.iter().map(|c| text.find(c).expect(c)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn missing_endpoint_ha_and_missing_secrets_are_errors() {
        let dir = secrets();
        let e = env(&[("IS_SHOOT_CLIENT", "true")]);
        assert!(matches!(
            load_env(&e, dir.path()),
            Err(Vpn2Error::NoEndpoint)
        ));
        let e = env(&[
            ("ENDPOINT", "x"),
            ("IS_HA", "true"),
            ("HA_VPN_CLIENTS", "2"),
            ("HA_VPN_SERVERS", "2"),
        ]);
        assert!(matches!(
            load_env(&e, dir.path()),
            Err(Vpn2Error::HaNeeds("VPN_SERVER_INDEX"))
        ));
        // An index naming no server: beyond HA_VPN_SERVERS when set, else beyond vpn2's 3.
        for (servers, index, below) in [(Some("2"), "2", 2), (None, "3", 3), (Some("2"), "7", 2)] {
            let mut vars = vec![
                ("ENDPOINT", "x"),
                ("IS_HA", "true"),
                ("VPN_SERVER_INDEX", index),
            ];
            if let Some(n) = servers {
                vars.extend([("HA_VPN_CLIENTS", "2"), ("HA_VPN_SERVERS", n)]);
            }
            let err = load_env(&env(&vars), dir.path()).expect_err(index);
            assert!(
                matches!(err, Vpn2Error::HaIndex { servers, .. } if servers == below),
                "{err}"
            );
            assert!(
                err.to_string().starts_with(&format!(
                    "VPN_SERVER_INDEX={index}: must be below {below} ("
                )),
                "{err}"
            );
        }
        let e = env(&[("ENDPOINT", "x")]);
        let err = load_env(&e, Path::new("/nonexistent-secrets")).expect_err("no secrets");
        assert!(
            err.to_string().contains("/nonexistent-secrets/vpn-client/"),
            "{err}"
        );
        assert!(requested([("ENDPOINT", "x")]));
        assert!(!requested([("ENDPOINT", ""), ("PATH", "/bin")]));
    }

    /// The client config text vpn2 environment mode rendered and parsed before its lines
    /// were typed, kept verbatim as the referee of [`client_lines`].
    fn rendered_before(env: &Vpn2ClientEnv, secrets: &Path) -> Result<String, Vpn2Error> {
        let endpoint = env.endpoint.as_deref().ok_or(Vpn2Error::NoEndpoint)?;
        let endpoint = word("ENDPOINT", endpoint)?;
        let dir = secrets.display().to_string();
        let dir = word("--vpn2-secrets-dir", &dir)?;
        let mut lines = vec![
            "auth-nocache".to_owned(),
            "txqueuelen 1000".to_owned(),
            "tcp-nodelay".to_owned(),
            "pull".to_owned(),
            "data-ciphers AES-256-GCM".to_owned(),
            "tls-client".to_owned(),
            "connect-retry 1 5".to_owned(),
            "auth SHA256".to_owned(),
            format!("tls-auth {dir}/tlsauth/vpn.tlsauth 1"),
            "remote-cert-tls server".to_owned(),
            format!("proto {}", env.ip_families.client_proto()),
        ];
        let certs = match ha_role(env)? {
            Some(HaRole::Shoot { pod, .. }) => format!("vpn-client-{pod}"),
            _ => "vpn-client".to_owned(),
        };
        lines.push(format!("key {dir}/{certs}/tls.key"));
        lines.push(format!("cert {dir}/{certs}/tls.crt"));
        lines.push(format!("ca {dir}/{certs}/ca.crt"));
        if let Some(HaRole::Seed { .. }) = ha_role(env)? {
            lines.push(format!("ping-restart {HA_SEED_PING_RESTART}"));
            lines.push("pull-filter ignore \"ping-restart\"".to_owned());
        }
        if env.is_shoot_client {
            lines.push(format!("http-proxy {endpoint} {}", env.openvpn_port));
            lines.push(format!(
                "http-proxy-option CUSTOM-HEADER {} {}",
                word("REVERSED_VPN_HEADER_KEY", &env.reversed_vpn_header_key)?,
                word("REVERSED_VPN_HEADER", &env.reversed_vpn_header)?,
            ));
        }
        lines.push(format!("dev {}", device(env)?));
        lines.push(format!("remote {endpoint}"));
        let mut text = lines.join("\n");
        text.push('\n');
        Ok(text)
    }

    #[test]
    fn client_lines_read_as_the_rendered_text_parsed() {
        let shoot = [
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.demo.proj.example.com"),
            ("OPENVPN_PORT", "8443"),
            ("REVERSED_VPN_HEADER_KEY", "X-Gardener-Destination"),
            (
                "REVERSED_VPN_HEADER",
                "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local",
            ),
            ("SHOOT_POD_NETWORKS", "100.96.0.0/11"),
            ("SEED_POD_NETWORK", "10.1.0.0/16"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = shoot.to_vec();
            v.extend_from_slice(extra);
            v
        };
        let ha = [
            ("IS_HA", "true"),
            ("HA_VPN_CLIENTS", "2"),
            ("HA_VPN_SERVERS", "2"),
        ];
        let envs: Vec<Vec<(&str, &str)>> = vec![
            // vpn-shoot, IPv4, dual-stack, IPv6 only, the defaults of the header.
            shoot.to_vec(),
            with(&[("IP_FAMILIES", "IPv4,IPv6")]),
            with(&[
                ("IP_FAMILIES", "IPv6"),
                ("SEED_POD_NETWORK", "fd00:10::/64"),
            ]),
            vec![("IS_SHOOT_CLIENT", "true"), ("ENDPOINT", "203.0.113.10")],
            with(&[("OPENVPN_AUTO_MTU", "true"), ("BONDING_MODE", "balance-rr")]),
            // The seed side without HA, and a kube-apiserver's HA clients.
            vec![("ENDPOINT", "vpn-seed-server-0")],
            [
                ha.as_slice(),
                &[("ENDPOINT", "vpn-seed-server-0"), ("VPN_SERVER_INDEX", "0")],
            ]
            .concat(),
            [
                ha.as_slice(),
                &[("ENDPOINT", "vpn-seed-server-1"), ("VPN_SERVER_INDEX", "1")],
            ]
            .concat(),
            // A shoot pod's HA clients.
            [
                shoot.as_slice(),
                &ha,
                &[("VPN_SERVER_INDEX", "1"), ("POD_NAME", "vpn-shoot-1")],
            ]
            .concat(),
            // Refused: no endpoint, an index naming no server, no pod index, unquotable.
            vec![("IS_SHOOT_CLIENT", "true")],
            [
                ha.as_slice(),
                &[("ENDPOINT", "x"), ("VPN_SERVER_INDEX", "2")],
            ]
            .concat(),
            [shoot.as_slice(), &ha, &[("VPN_SERVER_INDEX", "0")]].concat(),
            with(&[("REVERSED_VPN_HEADER", "a b")]),
            with(&[("REVERSED_VPN_HEADER_KEY", "X;Y")]),
            vec![("ENDPOINT", "host#1")],
        ];
        let dir = Path::new("/srv/secrets");
        for vars in envs {
            let e = env(&vars);
            let typed = client_lines(&e, dir, Vpn2Reader::Ours)
                .map(|lines| ClientOptions::from_lines(VPN2_CONFIG_NAME, &lines).expect("typed"));
            let parsed = rendered_before(&e, dir)
                .map(|text| ClientOptions::parse(VPN2_CONFIG_NAME, &text).expect("text"));
            match (typed, parsed) {
                (Ok(typed), Ok(parsed)) => assert_eq!(typed, parsed, "{vars:?}"),
                (Err(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{vars:?}"),
                (a, b) => panic!("{vars:?}: {a:?} / {b:?}"),
            }
        }
        // A secrets directory that cannot be written as one word is refused both ways.
        let e = env(&shoot);
        let odd = Path::new("/srv/odd secrets");
        assert!(matches!(
            client_lines(&e, odd, Vpn2Reader::Ours),
            Err(Vpn2Error::Unquotable { .. })
        ));
        assert!(rendered_before(&e, odd).is_err());
    }
}
