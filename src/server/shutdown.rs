//! Graceful shutdown: on SIGTERM or SIGINT the server turns not ready, keeps serving while
//! endpoints drop it (`--shutdown-delay-ms`), stops accepting, and gives in-flight reviews
//! `--drain-timeout-ms` to be answered.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tracing::info;

use super::AppState;

/// Resolves once shutdown was requested and the delay after it has passed: readiness goes
/// first, so that endpoints drop this pod, and the server keeps serving meanwhile.
pub(super) async fn requested_then_delay(
    stop: &mut watch::Receiver<bool>,
    state: &AppState,
    delay: Duration,
) {
    stopped(stop).await;
    state.ready.store(false, Ordering::Relaxed);
    info!(delay = ?delay, "shutdown requested: not ready, still serving");
    tokio::time::sleep(delay).await;
}

/// Resolves once shutdown is requested (or the handle that requests it is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves on SIGTERM or SIGINT.
///
/// The handlers are installed when this is called, not when the future is first polled:
/// until then a SIGTERM would kill the process outright, skipping the drain. Call it before
/// [`start`]. Must be called inside a Tokio runtime.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => info!("SIGINT received"),
            _ = term.recv() => info!("SIGTERM received"),
        }
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        info!("Ctrl-C received");
    })
}
