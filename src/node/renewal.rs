//! The thread that keeps a node's claims alive: high-water mark renewal
//! (both backends) and, in a cluster, the Consul session renewal and the
//! supervisor that fences and re-claims.
//!
//! It is a current-thread tokio runtime on its own named OS thread, so a
//! node whose request runtime is saturated (every worker thread busy or
//! blocked by calls) still renews its mark and its session on time. Consul
//! calls made here go through their own client (own connection pool), so
//! no connection they use is driven by the request runtime either.
//!
//! The node owns it and drops it last, after the final mark is stored and
//! the lock released: dropping stops the runtime, which cancels whatever
//! still runs on it.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Name of the renewal thread (visible in `top -H`, debuggers, panics).
pub const THREAD_NAME: &str = "idgen-renewal";

/// A dedicated runtime for renewals; see the module doc.
pub struct RenewalThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl RenewalThread {
    /// Starts the thread and its runtime.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(THREAD_NAME)
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                // Drives every task spawned through `handle` until stopped;
                // the runtime is dropped (its tasks cancelled) on return.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }

    /// The runtime's handle, for spawning long-running renewal tasks.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `f` on the renewal thread and waits for its result (from any
    /// runtime). Tasks `f` spawns stay on the renewal thread.
    pub async fn run<F>(&self, f: F) -> Result<F::Output, crate::Error>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        crate::cluster::membership::on_renewal_thread(&self.handle, f).await
    }
}

impl Drop for RenewalThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn runs_on_its_own_thread_while_the_caller_runtime_is_blocked() {
        let renewal = RenewalThread::start().unwrap();
        let name = renewal
            .run(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some(THREAD_NAME));
        // A ticking task on the renewal runtime keeps ticking while the
        // only worker thread of this runtime is blocked.
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t = std::sync::Arc::clone(&ticks);
        renewal.handle().spawn(async move {
            let mut i = tokio::time::interval(Duration::from_millis(10));
            loop {
                i.tick().await;
                t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let before = ticks.load(std::sync::atomic::Ordering::SeqCst);
        tokio::task::spawn(async { std::thread::sleep(Duration::from_secs(1)) })
            .await
            .unwrap();
        let after = ticks.load(std::sync::atomic::Ordering::SeqCst);
        // About 100 ticks are due; a few prove the thread ran meanwhile.
        assert!(after > before + 3, "{before} -> {after}");
    }
}
