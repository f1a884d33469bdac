//! A CONNECT listener's connections (`kind = "connect"`, the default): steps 1 to 4 of the
//! [crate docs](crate) up to the open tunnel ([`open`]: the PROXY header and the CONNECT
//! head, the routing decision, the upstream connect, the 200), and the 503 of a connection
//! over `max_connections` ([`over_limit`]). `crate::serve` relays what [`open`] returns.

use std::net::SocketAddr;
use std::time::Duration;

use netio::ingress::{accept_connect, refuse, Accepted, Deadlines};
use netio::listen::PendingGuard;
use netio::report::chain;
use protocol::http::connect::Status;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::field::display;
use tracing::{debug, info, Span};

use crate::access::Client;
use crate::config::ListenerConfig;
use crate::conn::{connect_upstream, read_unless_evicted, refused_head, Open, Shared};
use crate::policy::Refusal;
use crate::shoots::{Flow, ShootRefusal};

/// A CONNECT listener's head, route and upstream connect: the open tunnel, or `None`
/// once the connection was refused (answered, counted and logged) or ended.
pub(crate) async fn open<'s>(
    mut stream: TcpStream,
    peer: SocketAddr,
    listener: &ListenerConfig,
    shared: &'s Shared,
    pending: PendingGuard,
) -> Option<Open<'s>> {
    let _ = stream.set_nodelay(true);
    let deadlines: Deadlines = shared.config.deadlines;
    let read = read_unless_evicted(&mut stream, pending, shared, "a request", async |s| {
        accept_connect(s, peer, &listener.proxy, deadlines).await
    })
    .await?;
    let accepted = match read {
        Ok(a) => a,
        Err(e) => {
            refused_head(shared, &e);
            let status = e.status();
            if let Some(status) = status {
                shared.counters.responded(status);
            }
            refuse(&mut stream, status).await;
            return None;
        }
    };
    let Accepted {
        head,
        client,
        early,
        ..
    } = accepted;
    Span::current().record("client", display(client));
    // One snapshot decides this request, whatever a reload does meanwhile.
    let policy = shared.snapshot();
    let who = Client::new(client, peer.ip());
    let decision = match policy.decide(&head, &listener.headers, who) {
        Ok(d) => d,
        Err(refusal) => {
            let status = refusal.status();
            info!(status = status.code, "refused: {}", chain(&refusal));
            shared.counters.responded(status);
            let shoot = match &refusal {
                Refusal::Denied { route, .. } => Some((route, ShootRefusal::Denied)),
                Refusal::Unknown { route } => Some((route, ShootRefusal::NoRoute)),
                _ => None,
            };
            if let Some((route, why)) = shoot {
                if let Some(counters) = shared.counters.shoots.get(route.namespace()) {
                    counters.refused(Flow::of(route, &head), why);
                }
            }
            refuse(&mut stream, Some(status)).await;
            return None;
        }
    };
    Span::current().record("route", display(decision.route));
    let upstream_name = decision.target.upstream.clone();
    let flow = Flow::of(decision.route, &head);
    let shoot = shared.counters.shoots.get(decision.route.namespace());
    drop(policy);
    let mut upstream = match connect_upstream(shared, &upstream_name).await {
        Ok(s) => s,
        Err((why, what)) => {
            let status = match why {
                ShootRefusal::ConnectTimeout => Status::GATEWAY_TIMEOUT,
                _ => Status::SERVICE_UNAVAILABLE,
            };
            info!(upstream = %upstream_name, status = status.code, "upstream {what}");
            shared.counters.responded(status);
            if let Some(shoot) = &shoot {
                shoot.refused(flow, why);
            }
            refuse(&mut stream, Some(status)).await;
            return None;
        }
    };
    let mut ok = Vec::new();
    Status::ESTABLISHED.encode(&mut ok);
    if stream.write_all(&ok).await.is_err() || upstream.write_all(&early).await.is_err() {
        return None;
    }
    shared.counters.responded(Status::ESTABLISHED);
    debug!(upstream = %upstream_name, "tunnel open");
    Some(Open {
        client: stream,
        upstream,
        early: early.len() as u64,
        active: shared.counters.tunnel_opened(),
        shoot: shoot.map(|s| s.tunnel_opened(flow)),
    })
}

/// Answers a connection over the limit with 503 and closes it, without reading it.
pub(crate) async fn over_limit(mut stream: TcpStream) {
    let mut out = Vec::new();
    Status::SERVICE_UNAVAILABLE.encode(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
}
