//! Process signals: the first SIGTERM or SIGINT starts an orderly shutdown;
//! a second one exits at once.

use std::future::Future;

/// Installs the SIGTERM, SIGINT and SIGHUP handlers now (so a signal that arrives
/// while the node is still starting is not fatal) and returns a future that
/// completes on the first one; after that, a second signal exits the
/// process with status 130. Must be called inside the Tokio runtime.
#[cfg(unix)]
pub fn signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP's default action ends the process, and the reload watchers
    // subscribe only once the node serves: taken over here, before
    // "ready", so a reload asked for right after start is not a kill.
    let hup = signal(SignalKind::hangup())?;
    Ok(async move {
        let _hup = hup;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received; a second signal exits at once");
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: exiting without finishing shutdown");
            std::process::exit(130);
        });
    })
}

/// Completes on the first Ctrl-C.
#[cfg(not(unix))]
pub fn signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
