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

    /// Runs `reload` now, the lock held until it ends, and then records
    /// when it started. Recorded before it ended, a re-read whose caller
    /// was dropped half-way (its client gone) still counted as done: a
    /// call queued behind it returned as if a re-read after it came had
    /// ended, and said "unknown" of a name stored moments before.
    async fn start<F, Fut>(&self, last: &mut Option<Instant>, reload: F)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let started = Instant::now();
        #[cfg(test)]
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        reload().await;
        *last = Some(started);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;
    use crate::modes::refill::yield_until;

    /// A re-read that waits for `go` and counts its end in `ended`.
    fn held(
        go: &Arc<Notify>,
        entered: &Arc<AtomicU32>,
        ended: &Arc<AtomicU32>,
    ) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (go, entered, ended) = (Arc::clone(go), Arc::clone(entered), Arc::clone(ended));
        move || {
            Box::pin(async move {
                entered.fetch_add(1, Ordering::SeqCst);
                go.notified().await;
                ended.fetch_add(1, Ordering::SeqCst);
            })
        }
    }

    #[tokio::test]
    async fn a_re_read_dropped_half_way_does_not_answer_the_calls_queued_behind_it() {
        // No gap: every call that finds no re-read after it came starts one.
        let m = Arc::new(MissReloads::new(Duration::ZERO));
        let (entered, ended) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (go_d, go_a) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        // D re-reads (held); A and B come meanwhile and queue on the lock,
        // A first.
        let d = tokio::spawn({
            let (m, r) = (Arc::clone(&m), held(&go_d, &entered, &ended));
            async move { m.reload_if_due(r).await }
        });
        yield_until("D's re-read", || entered.load(Ordering::SeqCst) == 1).await;
        let a = tokio::spawn({
            let (m, r) = (Arc::clone(&m), held(&go_a, &entered, &ended));
            async move { m.reload_if_due(r).await }
        });
        tokio::task::yield_now().await;
        let came = Instant::now();
        // B's own re-read, if it runs one, ends at once.
        let b = tokio::spawn({
            let m = Arc::clone(&m);
            async move { m.reload_for(|| async {}).await }
        });
        tokio::task::yield_now().await;
        // D ends; A starts its re-read; A's caller goes half-way.
        go_d.notify_waiters();
        yield_until("A's re-read", || entered.load(Ordering::SeqCst) == 2).await;
        a.abort();
        assert!(a.await.unwrap_err().is_cancelled());
        d.await.unwrap();
        b.await.unwrap();
        // B returned once a re-read that started after it came had ended:
        // A's never ended, so B ran its own (before: B returned on A's).
        let last = *m.last.lock().await;
        assert!(
            last.is_some_and(|t| t >= came),
            "B returned on a re-read that never ended"
        );
        assert_eq!(m.started(), 3, "D's, A's (dropped) and B's own");
    }
}
