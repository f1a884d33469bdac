//! Gardener's non-HA VPN pods replayed in lab namespaces: the landscape (one namespace per
//! pod, Gardener-like addresses) and a kubelet's probes. The pods themselves are started from
//! the images by `tests/gardener_nonha.rs`.

pub mod capture;
pub mod checks;
pub mod far_end;
pub mod kubelet;
pub mod landscape;
pub mod rules;
