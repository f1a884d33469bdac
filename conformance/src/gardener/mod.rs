//! Gardener's non-HA VPN pods replayed in lab namespaces: the landscape (one namespace per
//! pod, Gardener-like addresses), a kubelet's probes, and what the replay must show
//! ([`checks`]). The pods are our binaries started as Gardener starts the vpn2 images
//! ([`pods`]), or upstream OpenVPN configured as vpn2 configures it for one side
//! ([`vpn2_upstream`], the rolling-upgrade pairs); `tests/gardener_checks.rs` runs the checks
//! against both; the images themselves are started by `tests/gardener_nonha.rs` ([`verdict`]:
//! what both report). [`vpn2_pods`] starts vpn2's pods (upstream OpenVPN, our sidecar for
//! Envoy); [`switch`] holds what `tests/switch_nonha.rs` adds to replay the in-place switch
//! (surge pods, the Service's endpoints, the kube-apiserver's load). [`ha`] and [`ha_pods`] are
//! the HA layout's namespaces and containers, its networks disjoint from the seed's or
//! overlapping them (`tests/gardener_ha_overlap.rs`, which runs [`checks::cross_from`] from
//! each kube-apiserver pod). [`load`] is the kube-apiserver's request load of the hold replays
//! (`tests/hold_replay.rs`, `tests/hold_replay_ha.rs`) and its figures. [`vpn2_ha_pods`] is
//! vpn2's HA pods modelled on a kernel without bonding and `ip6tnl` (`tests/vpn2_ha_model.rs`).

pub mod capture;
pub mod checks;
pub mod far_end;
pub mod ha;
pub mod ha_pods;
pub mod kubelet;
pub mod landscape;
pub mod load;
pub mod pods;
pub mod rules;
pub mod switch;
pub mod verdict;
pub mod vpn2_ha_pods;
pub mod vpn2_pods;
pub mod vpn2_upstream;
