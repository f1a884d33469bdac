//! Our vpn-client as a library, on a thread of its own inside a lab namespace.
//!
//! The client runs on a two-worker runtime (as the binary does) in a scoped thread that
//! entered the namespace, so the test's own thread may block, run commands and wait. It is
//! cancelled when the handle is stopped or dropped (also when the test panics).

use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use vpn_client::{CancellationToken, RunError, Settings, Stopped};

use crate::netns::Netns;
use crate::LabError;

/// How long the client may take to stop once cancelled.
const STOP: Duration = Duration::from_secs(10);

/// How often [`ClientThread::wait_until`] looks.
const POLL: Duration = Duration::from_millis(50);

/// What the client's thread ends with: `None` if it did not stop within [`STOP`].
type Ended = Option<Result<Stopped, RunError>>;

/// Our client running in a namespace; cancelled on drop.
#[derive(Debug)]
pub struct ClientThread<'scope> {
    token: CancellationToken,
    thread: Option<ScopedJoinHandle<'scope, Result<Ended, LabError>>>,
}

impl<'scope> ClientThread<'scope> {
    /// Starts our client with `settings` in `ns`.
    pub fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        ns: &'env Netns,
        settings: Settings,
    ) -> Self {
        Self::spawn_logged(scope, ns, settings, None)
    }

    /// [`ClientThread::spawn`], the client's log going to `log` (its thread and its runtime's
    /// workers take it as their default subscriber) instead of the process's subscriber.
    pub fn spawn_logged<'env>(
        scope: &'scope Scope<'scope, 'env>,
        ns: &'env Netns,
        settings: Settings,
        log: Option<tracing::Dispatch>,
    ) -> Self {
        let token = CancellationToken::new();
        let run_token = token.clone();
        let thread = scope.spawn(move || {
            let _default = log.clone().map(|d| tracing::dispatcher::set_default(&d));
            ns.run_in(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .on_thread_start(move || {
                        if let Some(d) = &log {
                            // The worker's default for its whole life.
                            std::mem::forget(tracing::dispatcher::set_default(d));
                        }
                    })
                    .build()
                    .map_err(|source| LabError::Socket {
                        what: "tokio runtime for our vpn-client",
                        source,
                    })?;
                Ok(rt.block_on(async move {
                    let mut client = tokio::spawn(vpn_client::run(settings, run_token.clone()));
                    tokio::select! {
                        ended = &mut client => return Some(joined(ended)),
                        () = run_token.cancelled() => {}
                    }
                    let ended = tokio::time::timeout(STOP, client).await.ok()?;
                    Some(joined(ended))
                }))
            })?
        });
        Self {
            token,
            thread: Some(thread),
        }
    }

    /// Whether the client has ended without being stopped.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| t.is_finished())
    }

    /// Polls `ready` until it holds, for at most `timeout`; fails as soon as the client ends
    /// on its own (`stop` then tells how). `what` names what is awaited, for the error.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), LabError> {
        let deadline = Instant::now() + timeout;
        while !ready() {
            if self.is_finished() {
                return Err(LabError::OurClientEnded { what: what.into() });
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: what.into(),
                    waited: timeout,
                    log: String::new(),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// Cancels the client and waits for it to end: what `vpn_client::run` returned. A panic
    /// of the client is re-raised.
    pub fn stop(mut self) -> Result<Stopped, LabError> {
        self.token.cancel();
        let thread = self.thread.take().expect("joined only here");
        match thread.join() {
            Ok(Ok(Some(result))) => result.map_err(|source| LabError::Ours {
                what: "vpn-client",
                source: Box::new(source),
            }),
            Ok(Ok(None)) => Err(LabError::Timeout {
                what: "our vpn-client to stop".into(),
                waited: STOP,
                log: String::new(),
            }),
            Ok(Err(lab)) => Err(lab),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for ClientThread<'_> {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// The client task's result; its panic is re-raised.
fn joined(
    ended: Result<Result<Stopped, RunError>, tokio::task::JoinError>,
) -> Result<Stopped, RunError> {
    match ended {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("our vpn-client's task: {e}"),
    }
}
