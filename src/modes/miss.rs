//! Re-reads for calls that named something this node does not know yet
//! (a format, a hide key) that another node may have just made: each such
//! call returns once a re-read that started after it came has ended, so
//! anything stored anywhere before the call is seen by it. Re-reads start
//! at most once per gap: a name nobody made, asked for by many callers,
//! costs one store read per gap, not one per call; a call inside the gap
//! waits (at most the gap) for the re-read at its end, which every call
//! waiting meanwhile shares.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// When the last miss re-read started, and the least time between two.
#[derive(Debug)]
pub struct MissReloads {
    gap: Duration,
    /// When a miss last started a re-read; held while that re-read runs.
    last: Mutex<Option<Instant>>,
    /// Re-reads started (tests).
    #[cfg(test)]
    started: std::sync::atomic::AtomicU32,
    /// Calls that waited for the gap to pass (tests).
    #[cfg(test)]
    waited: std::sync::atomic::AtomicU32,
}

impl MissReloads {
    /// Re-reads at most once per `gap`.
    pub fn new(gap: Duration) -> Self {
        Self {
            gap,
            last: Mutex::new(None),
            #[cfg(test)]
            started: std::sync::atomic::AtomicU32::new(0),
            #[cfg(test)]
            waited: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Returns once a re-read (`reload`, run here or by another caller)
    /// that started after this call came has ended.
    pub async fn reload_for<F, Fut>(&self, reload: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let came = Instant::now();
        let next = {
            let mut last = self.last.lock().await;
            match *last {
                // A re-read that started after this call came has ended
                // (its starter held the lock until then).
                Some(t) if t >= came => return,
                Some(t) if came < t + self.gap => t + self.gap,
                _ => return self.start(&mut last, reload).await,
            }
        };
        #[cfg(test)]
        self.waited
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep_until(next).await;
        let mut last = self.last.lock().await;
        if last.is_some_and(|t| t >= came) {
            return;
        }
        self.start(&mut last, reload).await;
    }

    /// Runs `reload` when no re-read started within the last gap (and
    /// returns once it ended); otherwise returns at once, never waiting
    /// for the gap. For a name this node knows and can say no to at once
    /// (a retired hide key): a re-read may still find it changed, but a
    /// caller is not held a second for it.
    pub async fn reload_if_due<F, Fut>(&self, reload: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut last = self.last.lock().await;
        if last.is_some_and(|t| Instant::now() < t + self.gap) {
            return;
        }
        self.start(&mut last, reload).await;
    }

    /// Runs `reload` now, its start recorded and the lock held until it
    /// ends.
    async fn start<F, Fut>(&self, last: &mut Option<Instant>, reload: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        *last = Some(Instant::now());
        #[cfg(test)]
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        reload().await;
    }

    /// Re-reads started so far.
    #[cfg(test)]
    pub fn started(&self) -> u32 {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls that waited for the gap so far.
    #[cfg(test)]
    pub fn waited(&self) -> u32 {
        self.waited.load(std::sync::atomic::Ordering::SeqCst)
    }
}
