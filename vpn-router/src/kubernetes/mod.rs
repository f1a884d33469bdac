//! `vpn-router --config FILE --kubernetes`: the routes and allow-lists from the objects
//! Gardener and the ACL extension already create in the seed, watched through the
//! Kubernetes API; the listeners, timeouts, limits, trusted load balancers and the
//! router-wide always-allowed networks stay in the config file (Gardener has no setting the
//! router could read for trusted load-balancer ranges, reference section 3.3).
//!
//! Each replica watches and configures itself: no shared state, no leader election, no
//! files in between. The same objects give every replica the same routes (the translation
//! is a function of the objects, and of each shoot's last good translation while its
//! objects cannot be translated). The policy it builds is the one the config files build
//! ([`crate::Policy`]), swapped in the same way: a change applies to new connections and
//! never touches an open tunnel.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`objects`] | the kinds read, structs of the fields used, the store of current objects |
//! | [`translate`] | objects → routes, SNI routes and rules; pure, with the rules of each kind |
//! | `state` | [`KubeState`]: the `vpn_router_kube_*` series, `/readyz` after the first build |
//! | `watch` | the watchers (resume, relist on `410 Gone`, backoff) and the debounced rebuild |

pub mod objects;
mod state;
pub mod translate;
mod watch;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use state::KubeState;
pub use translate::Settings;
pub use watch::{merged, DEBOUNCE};

use crate::Router;

/// The Gateway labels of Gardener's default ingress gateway (`istio-ingress`), which the
/// router's pods carry in its place.
pub const DEFAULT_GATEWAY_LABELS: &str =
    "app=istio-ingressgateway,istio=ingressgateway,istio-role=seed";

/// How to reach the API server and what the router is.
#[derive(Debug, Clone)]
pub struct Options {
    /// A kubeconfig file; `None`: in the cluster, the pod's service account (else
    /// `KUBECONFIG` or `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// The router's namespace, labels and the operator's always-allowed networks.
    pub settings: Settings,
}

/// A client from `kubeconfig`, or inferred (in-cluster first).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| KubeError::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.to_owned(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(KubeError::Infer)?,
    };
    Client::try_from(config).map_err(KubeError::Client)
}

/// Serves `router` until `shutdown`, its policy built from the Kubernetes objects (over the
/// config file's) and rebuilt when they change. SIGHUP is logged and ignored: there is no
/// file of routes to read again.
pub async fn serve(
    mut router: Router,
    options: Options,
    shutdown: CancellationToken,
) -> Result<(), KubeError> {
    let client = client(options.kubeconfig.as_deref()).await?;
    let state = Arc::new(KubeState::default());
    router.add_admin_part(Arc::clone(&state) as _);
    let reloader = router.reloader();
    watch::spawn(
        client,
        options.settings,
        router.file_policy(),
        move |policy| reloader.install(policy),
        state,
        &shutdown,
    );
    let hup = netio::signals::on_sighup(shutdown.clone(), || {
        info!("SIGHUP ignored: with --kubernetes the routes follow the objects");
        std::future::ready(())
    })
    .map_err(KubeError::Signal)?;
    tokio::spawn(hup);
    router.run(shutdown).await;
    Ok(())
}

/// Why the Kubernetes source cannot start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig file is refused.
    #[error("kubeconfig {}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster nor kubeconfig credentials were found.
    #[error("no kubernetes credentials")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client cannot be built.
    #[error("kubernetes client")]
    Client(#[source] kube::Error),
    /// The SIGHUP handler cannot be installed.
    #[error("cannot install the SIGHUP handler")]
    Signal(#[source] io::Error),
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    const CONFIGMAP: &str = include_str!("../../../deploy/vpn-router/configmap.yaml");
    const RBAC: &str = include_str!("../../../deploy/vpn-router/rbac.yaml");
    const DEPLOYMENT: &str = include_str!("../../../deploy/vpn-router/deployment.yaml");

    #[test]
    fn the_deployed_config_file_parses_and_holds_no_routes() {
        let text: Vec<&str> = CONFIGMAP
            .lines()
            .skip_while(|l| !l.contains("router.toml: |"))
            .skip(1)
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect();
        let config = crate::RouterConfig::parse(&text.join("\n")).unwrap();
        assert_eq!(config.listeners.len(), 3);
        assert!(config.policy.routes.is_empty());
        assert!(config.policy.sni_routes.is_empty());
        assert!(config.metrics_listen.is_some(), "the probes need /readyz");
    }

    #[test]
    fn the_deployed_rbac_reads_exactly_the_kinds_watched_and_writes_nothing() {
        let mut resources = BTreeSet::new();
        for line in RBAC.lines().map(str::trim) {
            if let Some(list) = line.strip_prefix("resources: ") {
                resources.extend(
                    list.trim_matches(['[', ']'])
                        .split(", ")
                        .map(|r| r.trim_matches('"').to_owned()),
                );
            }
            if let Some(verbs) = line.strip_prefix("verbs: ") {
                assert_eq!(verbs, r#"["list", "watch"]"#);
            }
        }
        let kinds: BTreeSet<String> = super::objects::Kind::ALL
            .iter()
            .map(|k| format!("{}s", k.label().to_lowercase()))
            .collect();
        assert_eq!(resources, kinds);
    }

    #[test]
    fn the_deployed_pods_carry_the_default_gateway_labels() {
        for pair in super::DEFAULT_GATEWAY_LABELS.split(',') {
            let (k, v) = pair.split_once('=').unwrap();
            assert!(
                DEPLOYMENT.contains(&format!("        {k}: {v}\n")),
                "pod label {k}: {v}"
            );
        }
        assert!(DEPLOYMENT.contains(&format!("value: {}\n", super::DEFAULT_GATEWAY_LABELS)));
    }
}
