//! vpn2's non-HA pods as the replays start them: upstream OpenVPN with the config vpn2
//! renders ([`super::vpn2_upstream`]), vpn2's rules, and our sidecar in the place of
//! Envoy's container (Envoy itself cannot run here).

use std::path::Path;

use super::landscape::INGRESS_LB;
use super::pods::{sidecar_spec, Binaries, Container, Mounts, SIDECAR_READY};
use super::vpn2_upstream::{
    ccd_vpn_shoot_client, client_config, install_seed_proxy_nat, install_shoot_rules, server_config,
};
use crate::netns::Netns;
use crate::upstream::{UpstreamOpenvpn, INITIALIZED_MARKER};
use crate::LabError;

/// How long upstream OpenVPN may take to serve.
const START: std::time::Duration = std::time::Duration::from_secs(45);

/// vpn2's seed pod in `ns` with upstream OpenVPN: the Go step's group-31415 NAT and files
/// (config, CCD), then `openvpn` with our `vpn-server firewall` as its hooks and its status
/// file at `status`, and our sidecar as Envoy's container, started one after the other as
/// the kubelet starts a pod's containers (without waiting for the first to serve); returns
/// once both serve: the server, the sidecar and the server's config. The sidecar ends its
/// connections at SIGTERM, as Envoy does (`SIDECAR_DRAIN_TIMEOUT_MS=0`: Envoy closes its
/// listeners and connections on shutdown unless told to drain first, which Gardener does not),
/// and keeps no restart guard (`SIDECAR_RESTART_GUARD_MS=0`: Envoy has none; unprivileged,
/// ours could not install one anyway).
pub fn start_seed_pod<'ns>(
    ns: &'ns Netns,
    mounts: &Mounts,
    bins: &Binaries,
    status: &Path,
) -> Result<(UpstreamOpenvpn<'ns>, Container<'ns>, String), LabError> {
    let logs = mounts.dir();
    install_seed_proxy_nat(ns, logs)?;
    let ccd = logs.join("client-config-dir");
    std::fs::create_dir_all(&ccd).map_err(|source| LabError::io(&ccd, source))?;
    let file = ccd.join("vpn-shoot-client");
    std::fs::write(&file, ccd_vpn_shoot_client()).map_err(|source| LabError::io(&file, source))?;
    let config = server_config(&mounts.seed_secrets(), &ccd, status, &bins.server);
    let server = UpstreamOpenvpn::start(ns, &config, 3)?;
    let mut spec = sidecar_spec(bins, mounts);
    spec.env
        .push(("SIDECAR_DRAIN_TIMEOUT_MS".into(), "0".into()));
    spec.env
        .push(("SIDECAR_RESTART_GUARD_MS".into(), "0".into()));
    let sidecar = spec.start(ns, logs)?;
    server.wait_for_log(INITIALIZED_MARKER, START)?;
    sidecar.wait_log(SIDECAR_READY, START)?;
    Ok((server, sidecar, config))
}

/// vpn2's vpn-shoot container in `ns`: its Go step's rules, then upstream OpenVPN with
/// vpn2's client config toward the ingress load balancer (started, not yet connected).
pub fn start_shoot_pod<'ns>(
    ns: &'ns Netns,
    mounts: &Mounts,
) -> Result<UpstreamOpenvpn<'ns>, LabError> {
    install_shoot_rules(ns)?;
    let config = client_config(&mounts.shoot_secrets(), &INGRESS_LB.to_string());
    UpstreamOpenvpn::start(ns, &config, 3)
}
