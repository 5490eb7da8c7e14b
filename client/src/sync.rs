//! The synchronisation primitives the buffer uses, in one place so the
//! loom model (`client/loom`) can swap in loom's versions of the same names.

pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// A shared, atomically replaceable `Arc<T>`: loading takes no lock
/// (arc-swap's wait-free fast path).
#[derive(Debug)]
pub(crate) struct Current<T>(arc_swap::ArcSwap<T>);

impl<T> Current<T> {
    pub(crate) fn new(value: Arc<T>) -> Self {
        Self(arc_swap::ArcSwap::new(value))
    }

    #[inline]
    pub(crate) fn load(&self) -> arc_swap::Guard<Arc<T>> {
        self.0.load()
    }

    pub(crate) fn store(&self, value: Arc<T>) {
        self.0.store(value);
    }
}
