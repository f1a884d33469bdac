//! vpn2's address-translation chains, shared by the two programs that install them: the seed
//! server's table (`vpn-server`, non-HA: its tunnel device and Envoy's group in the seed-server
//! pod) and a kube-apiserver pod's HA clients (`vpn-client`, when the seed's pod network
//! overlaps a shoot network: Gardener then puts `envoy-proxy` into the kube-apiserver pod,
//! gardener#12204). Reference gardener-pods.md §2.1, §2.3.
//!
//! * [`seed_pod_mapping`]: the seed's IPv4 pod network seen as `241.0.0.0/8` through a tunnel
//!   device, both ways (vpn2's `PREROUTING -i D -d 241/8 NETMAP` and `POSTROUTING -o D -s
//!   <seed pods> NETMAP`).
//! * [`proxy_netmap`]: the proxy group's ([`VPN2_PROXY_GID`]) connections to the real IPv4
//!   shoot networks sent to their mapped ranges in `242–244/8` (vpn2's `nat OUTPUT -m owner
//!   --gid-owner 31415 ... NETMAP`).
//! * [`proxy_guard`]: beyond vpn2, what is left after that mapping in the seed's pod network,
//!   loopback and link-local (cloud metadata) is the seed's own: the proxy group's new TCP
//!   connections there are refused with a reset, so the proxy (ours or Envoy) cannot be
//!   turned against the seed while shoot addresses that overlap the seed's still reach the
//!   shoot.

use ipnet::IpNet;
use protocol::config::netmap::{Netmap, MAPPED_SEED_POD_NETWORK};

use super::{priority, Chain, Hook, Rule, VPN2_PROXY_GID};

/// The networks the proxy group may never reach after the mapping, besides the seed's pod
/// network: loopback and link-local, both families.
pub const PROXY_GUARDED: [&str; 4] = ["127.0.0.0/8", "169.254.0.0/16", "::1/128", "fe80::/10"];

/// The seed's pod network `seed_pod` mapped to `241.0.0.0/8` on `device` (a name, or a prefix
/// with `*`): `prerouting` (in from the device, `241/8` → `seed_pod`) and `postrouting` (out
/// of the device, `seed_pod` → `241/8`). None for an IPv6 network (vpn2 maps IPv4 only).
pub fn seed_pod_mapping(device: &str, seed_pod: IpNet) -> Option<[Chain; 2]> {
    if !seed_pod.addr().is_ipv4() {
        return None;
    }
    let mapped = IpNet::V4(MAPPED_SEED_POD_NETWORK);
    Some([
        Chain::nat("prerouting", Hook::Prerouting, priority::DSTNAT).rule(
            Rule::new()
                .iifname(device)
                .daddr(mapped)
                .dnat_prefix(seed_pod),
        ),
        Chain::nat("postrouting", Hook::Postrouting, priority::SRCNAT).rule(
            Rule::new()
                .oifname(device)
                .saddr(seed_pod)
                .snat_prefix(mapped),
        ),
    ])
}

/// `output` (nat): each real IPv4 shoot network of `netmap` mapped into its range for the
/// proxy group's connections. None without networks.
pub fn proxy_netmap(netmap: &Netmap) -> Option<Chain> {
    if netmap.entries().is_empty() {
        return None;
    }
    Some(
        Chain::nat("output", Hook::Output, priority::DSTNAT).rules(netmap.entries().iter().map(
            |(real, mapped)| {
                Rule::new()
                    .skgid(VPN2_PROXY_GID)
                    .daddr(IpNet::V4(*real))
                    .dnat_prefix(IpNet::V4(*mapped))
            },
        )),
    )
}

/// `proxy-guard` (filter, output, after the NAT of [`proxy_netmap`]): the proxy group's new
/// TCP connections to `seed_pod` and to [`PROXY_GUARDED`] refused with a reset. Only new
/// connections: the proxy's answers to the kube-apiserver, which lives in the seed pod
/// network (or on loopback), pass.
pub fn proxy_guard(seed_pod: Option<IpNet>) -> Chain {
    let guarded = seed_pod.into_iter().chain(
        PROXY_GUARDED
            .iter()
            .map(|n| n.parse().expect("constant network")),
    );
    Chain::filter("proxy-guard", Hook::Output, priority::FILTER).rules(guarded.map(|net| {
        Rule::new()
            .skgid(VPN2_PROXY_GID)
            .new_connection()
            .tcp()
            .daddr(net)
            .reject_with_tcp_reset()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_seed_pod_pair_maps_ipv4_only_both_ways_on_the_device() {
        let [pre, post] = seed_pod_mapping("tun1", net("10.0.0.0/8")).expect("IPv4");
        assert_eq!(
            pre,
            Chain::nat("prerouting", Hook::Prerouting, priority::DSTNAT).rule(
                Rule::new()
                    .iifname("tun1")
                    .daddr(net("241.0.0.0/8"))
                    .dnat_prefix(net("10.0.0.0/8"))
            )
        );
        assert_eq!(
            post,
            Chain::nat("postrouting", Hook::Postrouting, priority::SRCNAT).rule(
                Rule::new()
                    .oifname("tun1")
                    .saddr(net("10.0.0.0/8"))
                    .snat_prefix(net("241.0.0.0/8"))
            )
        );
        assert!(seed_pod_mapping("tun1", net("fd00:1::/64")).is_none());
    }

    #[test]
    fn the_proxy_groups_mapping_and_guard() {
        let netmap = Netmap::vpn2(
            &[net("10.96.0.0/11")],
            &[net("10.64.0.0/13")],
            &[net("10.250.0.0/16"), net("fd00:250::/64")],
        )
        .unwrap();
        let out = proxy_netmap(&netmap).expect("networks");
        let text = format!("{out:?}");
        for (real, mapped) in [
            ("10.96.0.0/11", "244.0.0.0/11"),
            ("10.64.0.0/13", "243.0.0.0/13"),
            ("10.250.0.0/16", "242.0.0.0/16"),
        ] {
            let rule = Rule::new()
                .skgid(VPN2_PROXY_GID)
                .daddr(net(real))
                .dnat_prefix(net(mapped));
            assert!(text.contains(&format!("{rule:?}")), "{real}: {text}");
        }
        assert!(!text.contains("fd00:250"), "IPv6 is never mapped: {text}");
        assert!(proxy_netmap(&Netmap::none()).is_none());
        let guard = proxy_guard(Some(net("10.0.0.0/8")));
        let refused = |n: &str| {
            Rule::new()
                .skgid(VPN2_PROXY_GID)
                .new_connection()
                .tcp()
                .daddr(net(n))
                .reject_with_tcp_reset()
        };
        assert_eq!(
            guard,
            Chain::filter("proxy-guard", Hook::Output, priority::FILTER).rules(
                [
                    "10.0.0.0/8",
                    "127.0.0.0/8",
                    "169.254.0.0/16",
                    "::1/128",
                    "fe80::/10"
                ]
                .map(refused)
            )
        );
        assert_eq!(
            proxy_guard(None),
            Chain::filter("proxy-guard", Hook::Output, priority::FILTER)
                .rules(PROXY_GUARDED.map(refused))
        );
    }
}
