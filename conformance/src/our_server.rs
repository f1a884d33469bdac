//! Our vpn-server as a library, on a thread of its own inside a lab namespace.
//!
//! For tests that look at the server's counters or at how it stops: the server runs on a
//! current-thread runtime in a scoped thread that entered the namespace, and is cancelled when
//! the handle is stopped or dropped (also when the test panics).

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use vpn_client::CancellationToken;
use vpn_server::{Server, ServerError, ServerMetrics, Settings};

use crate::netns::Netns;
use crate::LabError;

/// How long the server may take to bind and set up its tun device.
const READY: Duration = Duration::from_secs(30);

/// Our server running in a namespace; cancelled on drop.
#[derive(Debug)]
pub struct ServerThread<'scope> {
    stats: Arc<ServerMetrics>,
    token: CancellationToken,
    thread: Option<ScopedJoinHandle<'scope, Result<Result<(), ServerError>, LabError>>>,
}

/// How a stopped server ended.
#[derive(Debug)]
pub struct Stopped {
    /// What `Server::run` returned.
    pub result: Result<(), ServerError>,
    /// From the cancellation to the thread's end.
    pub took: Duration,
}

impl<'scope> ServerThread<'scope> {
    /// Binds our server with `settings` in `ns` and runs it until stopped.
    pub fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        ns: &'env Netns,
        settings: Settings,
    ) -> Result<Self, LabError> {
        let token = CancellationToken::new();
        let run_token = token.clone();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = scope.spawn(move || {
            ns.run_in(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| LabError::Socket {
                        what: "tokio runtime for our vpn-server",
                        source,
                    })?;
                Ok(rt.block_on(async move {
                    let server = Server::bind(settings).await?;
                    // The receiver is gone only when `spawn` gave up waiting.
                    let _ = ready_tx.send(server.metrics());
                    server.run(run_token).await
                }))
            })?
        });
        match ready_rx.recv_timeout(READY) {
            Ok(stats) => Ok(Self {
                stats,
                token,
                thread: Some(thread),
            }),
            Err(_) => {
                token.cancel();
                match thread.join() {
                    Ok(Ok(Err(source))) => Err(LabError::Ours {
                        what: "vpn-server",
                        source: Box::new(source),
                    }),
                    Ok(Err(lab)) => Err(lab),
                    Ok(Ok(Ok(()))) => Err(LabError::Timeout {
                        what: "our vpn-server to bind".into(),
                        waited: READY,
                        log: String::new(),
                    }),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
    }

    /// The server's counters.
    pub fn stats(&self) -> &ServerMetrics {
        &self.stats
    }

    /// Cancels the server and waits for it to end. A panic of the server thread is re-raised.
    pub fn stop(mut self) -> Stopped {
        let start = Instant::now();
        self.token.cancel();
        let thread = self.thread.take().expect("joined only here");
        let result = match thread.join() {
            Ok(Ok(result)) => result,
            Ok(Err(lab)) => panic!("our vpn-server's thread: {lab}"),
            Err(panic) => std::panic::resume_unwind(panic),
        };
        Stopped {
            result,
            took: start.elapsed(),
        }
    }
}

impl Drop for ServerThread<'_> {
    fn drop(&mut self) {
        self.token.cancel();
    }
}
