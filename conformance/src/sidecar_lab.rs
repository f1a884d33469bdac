//! The CONNECT sidecar in process for the sidecar tests: [`start_sidecar`] runs the
//! `sidecar` crate's CONNECT sidecar on a runtime inside a lab namespace (see [`ns_runtime`]) and
//! [`config`] builds its configuration from the test [`Pki`]. The test's side (certificates,
//! the mTLS CONNECT client, the recorder, the metrics scrape) is `lab::sidecar_client`,
//! re-exported here. Test-only: failures panic with a message.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use sidecar::{RouteCheck, Sidecar, SidecarConfig, SidecarMetrics};
use vpn_client::CancellationToken;

pub use lab::sidecar_client::*;

/// A sidecar running on its own runtime inside a namespace; stopped on drop.
#[derive(Debug)]
pub struct RunningSidecar {
    /// The bound TLS addresses, in the order configured.
    pub addrs: Vec<SocketAddr>,
    /// The bound metrics addresses.
    pub metrics_addrs: Vec<SocketAddr>,
    /// The live counters.
    pub metrics: Arc<SidecarMetrics>,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for RunningSidecar {
    fn drop(&mut self) {
        self.token.cancel();
        if let (Some(rt), Some(task)) = (self.rt.take(), self.task.take()) {
            let _ = rt.block_on(async { tokio::time::timeout(WAIT, task).await });
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl RunningSidecar {
    /// Cancels its token, as SIGTERM does; it drains (`SidecarConfig::drain_timeout`).
    pub fn signal(&self) {
        self.token.cancel();
    }

    /// Keeps both worker threads of its runtime ([`ns_runtime`]'s two) busy for `d`, as a
    /// loaded host does; returns once both are.
    pub fn stall(&self, d: Duration) {
        let Some(rt) = &self.rt else { return };
        let (tx, rx) = mpsc::channel();
        for _ in 0..2 {
            let tx = tx.clone();
            rt.spawn(async move {
                let _ = tx.send(());
                std::thread::sleep(d);
            });
        }
        for _ in 0..2 {
            rx.recv_timeout(WAIT).expect("both worker threads busy");
        }
    }

    /// Whether it has stopped serving (its run ended).
    pub fn ended(&self) -> bool {
        self.task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
    }
}

/// Binds `config` on `rt` (see [`ns_runtime`]) and serves until dropped.
pub fn start_sidecar(
    rt: tokio::runtime::Runtime,
    config: SidecarConfig,
    routes: Option<Arc<dyn RouteCheck>>,
) -> RunningSidecar {
    let token = CancellationToken::new();
    let (tx, rx) = mpsc::channel();
    let run_token = token.clone();
    let task = rt.spawn(async move {
        let sidecar = Sidecar::bind(config, routes).await.expect("bind sidecar");
        tx.send((
            sidecar.local_addrs(),
            sidecar.metrics_addrs(),
            sidecar.metrics(),
        ))
        .expect("report");
        sidecar.run(run_token).await;
    });
    let (addrs, metrics_addrs, metrics) = rx.recv_timeout(WAIT).expect("sidecar bound");
    RunningSidecar {
        addrs,
        metrics_addrs,
        metrics,
        token,
        task: Some(task),
        rt: Some(rt),
    }
}

/// A sidecar configuration for tests: the fixture's server certificate and bundle, listening
/// on `listen` with metrics on `metrics`, allowing `shoot` and denying `seed`.
pub fn config(
    pki: &Pki,
    listen: Vec<SocketAddr>,
    metrics: Vec<SocketAddr>,
    shoot: Vec<ipnet::IpNet>,
    seed: Vec<ipnet::IpNet>,
) -> SidecarConfig {
    let policy = sidecar::DestinationPolicy::new(shoot, seed);
    let mut c = SidecarConfig::new(pki.server.clone(), pki.bundle.clone(), policy);
    c.listen = listen;
    c.metrics_listen = metrics;
    c
}
