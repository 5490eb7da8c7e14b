//! The one way segment and lease mode hand out a batch: from memory when
//! the double buffer ([`crate::id::buffer`]) holds enough, otherwise by
//! fetching (when this call claimed the fetch) or waiting, at most
//! `server.max_wait`, for the fetch another call started.

use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::{JoinError, JoinHandle};

use crate::error::Error;

/// A mode engine serving from a double buffer it refills from its store.
pub trait Refill: Sync {
    /// Moves IDs from memory into `out` (up to `want` in all); `Ok(true)`:
    /// a fetch is due and this call claimed it.
    fn take_local(&self, want: usize, out: &mut Vec<u64>) -> Result<bool, Error>;
    /// Starts the claimed fetch on a task of its own and returns its
    /// handle; the fetch wakes [`filled`](Self::filled) either way. On its
    /// own task the fetch lands (its span goes into the buffer, or its
    /// failure clears the claim) even when the call that claimed it is
    /// dropped: a client that cancels, or runs out of its deadline, while
    /// its call waits on the store. Run inside the call, a dropped fetch
    /// left the claim set and no fetch ever started again (rule 46).
    fn spawn_fetch(&self) -> JoinHandle<Result<(), Error>>;
    /// Notified whenever a fetch lands (or the buffer is dropped).
    fn filled(&self) -> &Notify;
    /// The answer to a call whose own fetch failed with `e`.
    fn fetch_failed(&self, e: Error) -> Error;
    /// Checked while another call's fetch is awaited: `Err` ends the wait.
    fn check_waiting(&self) -> Result<(), Error>;
    /// The answer once `max_wait` passed with no IDs.
    fn timed_out(&self, max_wait: Duration) -> Error;
    /// Set once the store said no more IDs will ever come (a segment tag
    /// reached its largest ID): the refusal to give when nothing is left.
    fn ended(&self) -> Option<Error> {
        None
    }
}

/// The answer of a call that reached the end of its ID space (`end`):
/// the IDs it already took, which are the last ones and reserved (rule
/// 37), or `end` when it took none. Never drops what it took.
fn at_end(out: Vec<u64>, end: Error) -> Result<Vec<u64>, Error> {
    if out.is_empty() {
        Err(end)
    } else {
        Ok(out)
    }
}

/// The answer of a fetch run on its own task: its own, or, when the task
/// ended without one (it panicked, or the runtime is shutting down), a
/// store error saying so.
fn landed(joined: Result<Result<(), Error>, JoinError>) -> Result<(), Error> {
    joined.unwrap_or_else(|e| {
        Err(Error::Store(crate::store::StoreError::Backend(format!(
            "the fetch ended without an answer: {e}"
        ))))
    })
}

/// `count` IDs from `refill`. Waits on the store only when both spans are
/// empty, and then at most `max_wait`, looking again every `retry` (the
/// pause after a failed fetch); IDs taken before a failure are dropped,
/// never reused. At the end of the ID space ([`Refill::ended`]) the call
/// returns the IDs it took, fewer than `count`, without waiting; the next
/// call gets the end's refusal.
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
        if let Some(end) = refill.ended() {
            return at_end(out, end);
        }
        if start_fetch {
            // Both spans are empty and this call is the fetcher.
            if let Err(e) = landed(refill.spawn_fetch().await) {
                if let Some(end) = refill.ended() {
                    return at_end(out, end);
                }
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

/// Yields to the runtime until `cond` holds: a bounded number of polls,
/// no clock (for tests that wait for a spawned task to reach a point).
#[cfg(test)]
pub(crate) async fn yield_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{what}: not reached in 10,000 polls");
}
