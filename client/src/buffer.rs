//! The lock-free buffer behind prefetching, generic over what it holds
//! (`u64` IDs from `GenIds`, UUIDs from `GenUuids`): the claim logic below
//! never looks at an item, so one source file (and one loom model) serves
//! both.
//!
//! Items come in immutable blocks (one `GenIds` or `GenUuids` answer each). The block being
//! served is `current`; blocks fetched ahead wait in `queue`. Taking an ID
//! is one atomic `fetch_add` on the current block's own cursor: the index
//! it returns belongs to that caller alone, because a cursor only ever
//! grows and a block is never refilled or reused. That is the whole
//! uniqueness argument, and it is why there is no ABA problem: a caller
//! that loaded a block just before it was replaced still claims from that
//! block's cursor, and the block stays alive (reference counted) until the
//! last such caller is done with it.
//!
//! `current` is replaced only under the queue's lock, and only when it is
//! exhausted (its cursor reached its length: every index was claimed by
//! exactly one caller) or expired (snowflake IDs past their age; the rest
//! of the block is then a documented gap). So no ID is lost except by
//! expiry or by dropping the buffer.
//!
//! This file is also compiled by the `idgen-client-loom` crate against
//! loom's atomics, which checks every interleaving of claims, refills and
//! replacements (see `client/loom`).

use std::collections::VecDeque;

use crate::sync::{Arc, AtomicBool, AtomicUsize, Current, Mutex, Ordering};

/// One batch of items (IDs or UUIDs), served front to back. `T: Copy`:
/// a claim copies its item out, so the block is never changed.
#[derive(Debug)]
pub(crate) struct Block<T> {
    ids: Vec<T>,
    /// The next index to hand out; grows past `ids.len()` when callers
    /// find the block exhausted.
    cursor: AtomicUsize,
    /// Set once a caller crossed the low-water mark and asked for a refill.
    refill_asked: AtomicBool,
    /// Set when the IDs got too old to hand out (snowflake age limit).
    expired: AtomicBool,
}

impl<T> Block<T> {
    /// A block serving `ids` in order.
    pub(crate) fn new(ids: Vec<T>) -> Self {
        Self {
            ids,
            cursor: AtomicUsize::new(0),
            refill_asked: AtomicBool::new(false),
            expired: AtomicBool::new(false),
        }
    }

    /// Marks the block too old: callers stop taking IDs from it.
    pub(crate) fn expire(&self) {
        self.expired.store(true, Ordering::Relaxed);
    }

    /// How many IDs were never claimed (an upper bound while callers are
    /// still claiming).
    pub(crate) fn unclaimed(&self) -> usize {
        self.ids
            .len()
            .saturating_sub(self.cursor.load(Ordering::Relaxed))
    }

    /// Whether every ID was claimed or the block expired.
    fn spent(&self) -> bool {
        self.expired.load(Ordering::Relaxed)
            || self.cursor.load(Ordering::Relaxed) >= self.ids.len()
    }
}

/// What one claim got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimed<T> {
    /// The ID (or UUID), this caller's alone.
    pub id: T,
    /// This claim crossed the low-water mark first: start a refill.
    pub refill: bool,
}

/// Blocks of IDs: the one being served and the ones fetched ahead.
#[derive(Debug)]
pub(crate) struct IdBuffer<T> {
    current: Current<Block<T>>,
    queue: Mutex<VecDeque<Arc<Block<T>>>>,
    /// `queue.len()`, readable without the lock.
    queued: AtomicUsize,
    /// Ask for a refill when fewer than this many IDs remain.
    low_water: AtomicUsize,
}

/// What [`IdBuffer::advance`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Advanced {
    /// The current block has IDs to claim (it was replaced, or another
    /// caller replaced it first).
    pub ready: bool,
    /// IDs thrown away because their block expired.
    pub discarded: usize,
}

impl<T: Copy> IdBuffer<T> {
    /// An empty buffer.
    pub(crate) fn new(low_water: usize) -> Self {
        Self {
            current: Current::new(Arc::new(Block::new(Vec::new()))),
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            low_water: AtomicUsize::new(low_water),
        }
    }

    /// The hot path: an ID from the current block, or `None` when it is
    /// exhausted or expired. No lock, no waiting: one load of the current
    /// block and one `fetch_add`.
    #[inline]
    pub(crate) fn try_claim(&self) -> Option<Claimed<T>> {
        let block = self.current.load();
        if block.expired.load(Ordering::Relaxed) {
            return None;
        }
        // The single-claim rule: the index comes from one atomic
        // read-modify-write, so no two callers can get the same one.
        let i = block.cursor.fetch_add(1, Ordering::Relaxed);
        let id = *block.ids.get(i)?;
        let remaining = block.ids.len() - i - 1;
        let refill = remaining < self.low_water.load(Ordering::Relaxed)
            && self.queued.load(Ordering::Relaxed) == 0
            && !block.refill_asked.swap(true, Ordering::Relaxed);
        Some(Claimed { id, refill })
    }

    /// Queues a freshly fetched block behind the others.
    pub(crate) fn push(&self, block: Arc<Block<T>>) {
        let mut queue = lock(&self.queue);
        queue.push_back(block);
        self.queued.store(queue.len(), Ordering::Relaxed);
    }

    /// Replaces a spent current block with the next queued one that is not
    /// expired. Callers still claiming from the old block are unaffected.
    pub(crate) fn advance(&self) -> Advanced {
        let mut queue = lock(&self.queue);
        let mut discarded = 0;
        let current = self.current.load();
        if !current.spent() {
            return Advanced {
                ready: true,
                discarded,
            };
        }
        if current.expired.load(Ordering::Relaxed) {
            discarded += current.unclaimed();
        }
        drop(current);
        let ready = loop {
            match queue.pop_front() {
                Some(next) if next.expired.load(Ordering::Relaxed) => {
                    discarded += next.unclaimed();
                }
                Some(next) => {
                    self.current.store(next);
                    break true;
                }
                None => break false,
            }
        };
        self.queued.store(queue.len(), Ordering::Relaxed);
        if !ready && discarded > 0 {
            // Leave an empty block in place so the expired one is not
            // counted again.
            self.current.store(Arc::new(Block::new(Vec::new())));
        }
        Advanced { ready, discarded }
    }

    /// IDs held and not yet claimed (current and queued blocks).
    pub(crate) fn depth(&self) -> usize {
        let queue = lock(&self.queue);
        let current = self.current.load();
        let live = |b: &Block<T>| {
            if b.expired.load(Ordering::Relaxed) {
                0
            } else {
                b.unclaimed()
            }
        };
        live(&current) + queue.iter().map(|b| live(b)).sum::<usize>()
    }

    /// Whether fetched blocks wait behind the current one.
    #[inline]
    pub(crate) fn has_queued(&self) -> bool {
        self.queued.load(Ordering::Relaxed) > 0
    }

    /// Sets the low-water mark.
    pub(crate) fn set_low_water(&self, low_water: usize) {
        self.low_water.store(low_water, Ordering::Relaxed);
    }
}

/// The queue's lock; a panic while holding it cannot leave the queue
/// half-changed (every change is one call), so a poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
