//! Shutdown on SIGTERM / SIGINT: the signal becomes a cancelled [`CancellationToken`], which
//! every long-running part of the binaries watches.

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
}
