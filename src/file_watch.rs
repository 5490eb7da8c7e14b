//! Reloading files while the node runs: TLS certificates and keys of the
//! node's own ports ([`crate::server::tls`]) and of its Consul client
//! ([`crate::consul::tls`]) are read again when they change on disk or on
//! SIGHUP.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// How often [`on_change_or_sighup`] looks at the files' modification
/// times.
pub const POLL: Duration = Duration::from_secs(1);

/// Calls `reload` with the reason ("files changed" or "SIGHUP") whenever
/// the modification time of one of `paths` changes (checked every
/// [`POLL`]; a file that disappears or comes back counts) or the process
/// gets SIGHUP. The signal is listened for from the first poll of the
/// returned future. Runs until aborted.
pub async fn on_change_or_sighup(paths: Vec<PathBuf>, mut reload: impl FnMut(&'static str)) {
    let mtimes = || -> Vec<Option<SystemTime>> {
        paths
            .iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    };
    let mut seen = mtimes();
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(POLL);
    loop {
        let why = tokio::select! {
            _ = tick.tick() => {
                let now = mtimes();
                if now == seen {
                    continue;
                }
                seen = now;
                "files changed"
            }
            Some(()) = async { hup.as_mut()?.recv().await } => "SIGHUP",
        };
        reload(why);
    }
}
