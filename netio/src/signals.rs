//! Shutdown on SIGTERM / SIGINT: the signal becomes a cancelled [`CancellationToken`], which
//! every long-running part of the binaries watches. SIGHUP runs an action of the caller's
//! ([`on_sighup`]: the router reloads its policy, or says why it does not).

use std::future::Future;
use std::io;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Installs the SIGTERM and SIGINT handlers now (so a signal that arrives during start-up is
/// not lost) and returns the future that cancels `token` when either arrives, or ends when
/// `token` is cancelled otherwise. Spawn it. Must run inside a tokio runtime.
pub fn cancel_on_signals(token: CancellationToken) -> io::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
            () = token.cancelled() => return,
        }
        token.cancel();
    })
}

/// Installs the SIGHUP handler now and returns the future that runs `action` on each SIGHUP
/// (one at a time, each to its end before the next signal is taken) until `shutdown` is
/// cancelled. Spawn it. Must run inside a tokio runtime.
pub fn on_sighup<F, Fut>(
    shutdown: CancellationToken,
    mut action: F,
) -> io::Result<impl Future<Output = ()>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    action().await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_future_ends_when_the_token_is_cancelled_elsewhere() {
        let token = CancellationToken::new();
        let watch = tokio::spawn(cancel_on_signals(token.clone()).expect("handlers"));
        token.cancel();
        watch.await.expect("ended");
    }

    #[tokio::test]
    async fn the_sighup_future_ends_when_the_token_is_cancelled() {
        let token = CancellationToken::new();
        let watch = tokio::spawn(on_sighup(token.clone(), || async {}).expect("handler"));
        token.cancel();
        watch.await.expect("ended");
    }
}
