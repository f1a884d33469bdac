//! What the `vpn-server` binary runs once its configuration is loaded: the OpenVPN server with
//! its `up` / `down` commands, the CONNECT sidecar in the same process if asked, and the admin
//! endpoint (`/metrics`, `/healthz`, `/readyz`), GEP-21's cloud API endpoint if asked. The
//! sidecar alone is `sidecar::run`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use netio::admin::{AdminBindError, AdminServer};
use netio::firewall::{priority, Chain, Firewall, FirewallError, Hook, Installed, Rule, Table};
use netio::report::chain;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cloud_api::{CloudApiConfig, CloudApiEndpoint};
use crate::config::Loaded;
use crate::script::ScriptError;
use crate::server::{ClientRoutes, Server, ServerError};
use sidecar::{RouteCheck, Sidecar, SidecarConfig, SidecarError};

/// Everything one `vpn-server` process serves.
#[derive(Debug)]
pub struct Launch {
    /// The server's configuration (file or vpn2 environment).
    pub loaded: Loaded,
    /// The CONNECT sidecar to run in this process (its metrics listeners also report the
    /// server's series).
    pub sidecar: Option<SidecarConfig>,
    /// Admin endpoint addresses for the server's series (may be empty).
    pub admin_listen: Vec<SocketAddr>,
    /// Firewall and NAT rules to hold while serving (vpn2 environment mode): applied once the
    /// tun device is up and before any route leads into it, removed when the process stops;
    /// after `kill -9` they stay until the next start replaces them (the device, gone with
    /// the process, can then carry nothing unmapped).
    pub firewall: Option<Table>,
    /// Rules that outlive the process (vpn2 environment mode: `crate::vpn2::seed_guard`),
    /// applied before the device exists and never removed.
    pub guard: Option<Table>,
    /// GEP-21's cloud API endpoint (`--cloud-api-listen`); the server then holds
    /// [`crate::cloud_api::endpoint_table`] for its device (`firewall`; without it, the seed
    /// table's INPUT and FORWARD guards).
    pub cloud_api: Option<CloudApiConfig>,
    /// TCP ports of this process's listeners that bind every address only because nothing
    /// else was asked for (the in-process sidecar's defaults in a config-file start): new
    /// connections to them from the tun device are dropped, in the table `vpn-seed-server`
    /// (chain `listener-guard`), so the tunnel's clients never reach them.
    pub tunnel_guarded_ports: Vec<u16>,
}

/// Why the process could not serve.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The server could not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The sidecar could not start.
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    /// The admin endpoint could not be bound.
    #[error(transparent)]
    Admin(#[from] AdminBindError),
    /// The `up` command failed (the server does not start, as upstream).
    #[error(transparent)]
    Up(ScriptError),
    /// The firewall rules were refused.
    #[error("firewall rules")]
    Firewall(#[from] FirewallError),
    /// The cloud API endpoint could not bind.
    #[error("cannot listen on {0} (--cloud-api-listen)")]
    CloudApi(SocketAddr, #[source] std::io::Error),
}

/// Binds everything in `launch`, runs `up`, serves until `shutdown`, drains, runs `down`.
pub async fn run(launch: Launch, shutdown: CancellationToken) -> Result<(), LaunchError> {
    run_with(launch, shutdown.clone(), shutdown).await
}

/// [`run`] with the stop in two parts: `signal` starts the in-process sidecar's drain; the
/// server (its tunnel, the cloud API endpoint, the admin endpoint) stops once `tunnel` is
/// cancelled and the sidecar has stopped, since what the sidecar still serves while it drains
/// goes through the tunnel (a CONNECT held for its route, a relay).
pub async fn run_with(
    launch: Launch,
    signal: CancellationToken,
    tunnel: CancellationToken,
) -> Result<(), LaunchError> {
    let Launch {
        loaded,
        sidecar,
        admin_listen,
        firewall,
        guard,
        cloud_api,
        tunnel_guarded_ports,
    } = launch;
    if let Some(guard) = &guard {
        Firewall::open()?.apply(guard, false)?;
        info!(
            table = guard.name(),
            "tunnel-only rules in place (they outlive this process)"
        );
    }
    let Loaded {
        settings,
        up,
        down,
        verb,
        ..
    } = loaded;
    let script_settings = settings.clone();
    // The rules are in force before the first route leads into the device: a connection
    // whose first packet went into it unmapped would stay unmapped (conntrack) for its life,
    // and its answers would not find the way back. HA mode has no device: scripts get an
    // empty name and no firewall table needs one.
    let with_cloud_api = cloud_api.is_some();
    let (server, rules) = Server::bind_with(settings, |dev| {
        let firewall = if with_cloud_api {
            Some(crate::cloud_api::endpoint_table(firewall, dev))
        } else {
            firewall
        };
        with_listener_guard(firewall, dev, &tunnel_guarded_ports)
            .as_ref()
            .map(Installed::apply_lasting)
            .transpose()
    })
    .await?;
    let dev = server.tun_name().unwrap_or_default().to_owned();
    let admin = AdminServer::bind(&admin_listen)?;
    let server_part = server.admin_state();
    let sidecar_stopped = CancellationToken::new();
    let sidecar = match sidecar {
        Some(config) => {
            let bound = Sidecar::bind(config, Some(Arc::new(server.client_routes())))
                .await?
                .also_report(Arc::clone(&server_part));
            let stopped = sidecar_stopped.clone();
            Some(tokio::spawn(async move {
                bound.run(signal).await;
                stopped.cancel();
            }))
        }
        None => {
            sidecar_stopped.cancel();
            None
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            tunnel.cancelled().await;
            sidecar_stopped.cancelled().await;
            shutdown.cancel();
        }
    });
    let mut parts = vec![server_part];
    let cloud_api = match cloud_api {
        Some(config) => {
            let endpoint = CloudApiEndpoint::bind(config, server.client_routes())
                .map_err(|(addr, e)| LaunchError::CloudApi(addr, e))?;
            parts.push(endpoint.metrics());
            Some(tokio::spawn(endpoint.run(shutdown.clone())))
        }
        None => None,
    };
    let admin = tokio::spawn(admin.serve(parts, shutdown.clone()));
    if let Some(up) = up {
        up.run(&script_settings, &dev, verb)
            .await
            .map_err(LaunchError::Up)?;
    }
    info!("Initialization Sequence Completed");
    server.run(shutdown).await?;
    if let Some(task) = sidecar {
        let _ = task.await;
    }
    if let Some(task) = cloud_api {
        let _ = task.await;
    }
    let _ = admin.await;
    if let Some(rules) = rules {
        rules.remove();
    }
    if let Some(down) = down {
        if let Err(e) = down.run(&script_settings, &dev, verb).await {
            warn!("{}", chain(&e));
        }
    }
    Ok(())
}

/// `firewall` (or a table `vpn-seed-server` of its own) with the chain that drops new
/// connections from the tun device `dev` to `ports`; no device (HA) or no ports: unchanged.
pub fn with_listener_guard(firewall: Option<Table>, dev: &str, ports: &[u16]) -> Option<Table> {
    if dev.is_empty() || ports.is_empty() {
        return firewall;
    }
    let guard = Chain::filter("listener-guard", Hook::Input, priority::FILTER).rules(
        ports.iter().map(|&port| {
            Rule::new()
                .iifname(dev)
                .new_connection()
                .tcp_dport(port)
                .drop()
        }),
    );
    Some(
        firewall
            .unwrap_or_else(|| Table::new(crate::vpn2::TABLE))
            .chain(guard),
    )
}

/// The in-process sidecar asks the server before dialing: a CONNECT to a destination no
/// connected client's address or iroute covers waits until a tunnel comes up with one (up
/// to its hold bound).
impl RouteCheck for ClientRoutes {
    fn has_route(&self, addr: IpAddr) -> bool {
        self.covers(addr)
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        ClientRoutes::changes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_guard_needs_a_device_and_ports_and_keeps_the_table_it_joins() {
        assert!(with_listener_guard(None, "", &[9443]).is_none());
        assert!(with_listener_guard(None, "tun0", &[]).is_none());
        let alone = format!("{:?}", with_listener_guard(None, "tun0", &[9443, 15000]));
        assert!(
            alone.contains("listener-guard") && alone.contains("TcpDport(15000)"),
            "{alone}"
        );
        let seed = crate::vpn2::seed_table("tun0", None, None);
        let joined = format!("{:?}", with_listener_guard(Some(seed), "tun0", &[9443]));
        assert!(
            joined.contains("\"forward\"") && joined.contains("listener-guard"),
            "{joined}"
        );
    }
}
