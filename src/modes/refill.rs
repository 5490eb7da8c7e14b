//! The one way segment and lease mode hand out a batch: from memory when
//! the double buffer ([`crate::id::buffer`]) holds enough, otherwise by
//! fetching (when this call claimed the fetch) or waiting, at most
//! `server.max_wait`, for the fetch another call started.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::Error;

/// A mode engine serving from a double buffer it refills from its store.
pub trait Refill: Sync {
    /// Moves IDs from memory into `out` (up to `want` in all); `Ok(true)`:
    /// a fetch is due and this call claimed it.
    fn take_local(&self, want: usize, out: &mut Vec<u64>) -> Result<bool, Error>;
    /// Runs the claimed fetch; wakes [`filled`](Self::filled) either way.
    fn fetch(&self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Notified whenever a fetch lands (or the buffer is dropped).
    fn filled(&self) -> &Notify;
    /// The answer to a call whose own fetch failed with `e`.
    fn fetch_failed(&self, e: Error) -> Error;
    /// Checked while another call's fetch is awaited: `Err` ends the wait.
    fn check_waiting(&self) -> Result<(), Error>;
    /// The answer once `max_wait` passed with no IDs.
    fn timed_out(&self, max_wait: Duration) -> Error;
}

/// `count` IDs from `refill`. Waits on the store only when both spans are
/// empty, and then at most `max_wait`, looking again every `retry` (the
/// pause after a failed fetch); IDs taken before a failure are dropped,
/// never reused.
pub async fn take<R: Refill>(
    refill: &R,
    count: usize,
    max_wait: Duration,
    retry: Duration,
    on_ready: impl Fn(),
) -> Result<Vec<u64>, Error> {
    let mut out = Vec::with_capacity(count);
    // Set once the call has to wait. The first pass is the common case:
    // served from memory, no clock read, no waiter registered.
    let mut deadline = None;
    loop {
        // Once waiting, registered before looking, so a fill in between is
        // not missed.
        let filled = refill.filled().notified();
        tokio::pin!(filled);
        if deadline.is_some() {
            filled.as_mut().enable();
        }
        let start_fetch = refill.take_local(count, &mut out)?;
        if out.len() == count {
            if start_fetch {
                on_ready();
            }
            return Ok(out);
        }
        if start_fetch {
            // Both spans are empty and this call is the fetcher.
            if let Err(e) = refill.fetch().await {
                return Err(refill.fetch_failed(e));
            }
            continue;
        }
        refill.check_waiting()?;
        // Another call is fetching, or a failed fetch is pausing.
        let now = tokio::time::Instant::now();
        let Some(deadline) = deadline else {
            deadline = Some(now + max_wait);
            continue;
        };
        if now >= deadline {
            return Err(refill.timed_out(max_wait));
        }
        let _ = tokio::time::timeout_at(deadline.min(now + retry), filled).await;
    }
}
