//! Process signals: the first SIGTERM or SIGINT starts an orderly shutdown;
//! a second one exits at once.

/// Completes on the first SIGTERM or SIGINT, and arms a watcher that exits
/// the process with status 130 on the next one.
pub async fn signal() {
    wait_one().await;
    tracing::info!("shutdown signal received; a second signal exits at once");
    tokio::spawn(async {
        wait_one().await;
        tracing::warn!("second signal: exiting without finishing shutdown");
        std::process::exit(130);
    });
}

#[cfg(unix)]
async fn wait_one() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process can still be stopped by
        // SIGKILL; never return (returning would shut down at once).
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(not(unix))]
async fn wait_one() {
    let _ = tokio::signal::ctrl_c().await;
}
