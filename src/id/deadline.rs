//! A fencing deadline as one atomic number, checked on the issue path.
//!
//! The serving layer keeps the number in its own units (milliseconds of a
//! coarse monotonic clock) and passes "now" in the same units; nothing here
//! reads a clock. Checking costs one atomic load and a compare.

use std::sync::atomic::{AtomicU64, Ordering};

/// Past this point the holder of a lease must not issue.
#[derive(Debug)]
pub struct Deadline {
    at: AtomicU64,
}

impl Default for Deadline {
    fn default() -> Self {
        Self::unbounded()
    }
}

impl Deadline {
    /// No deadline (the embedded backend: nothing can be taken away).
    pub const fn unbounded() -> Self {
        Self {
            at: AtomicU64::new(u64::MAX),
        }
    }

    /// Moves the deadline to `at` (forward or back).
    pub fn set(&self, at: u64) {
        self.at.store(at, Ordering::Release);
    }

    /// The deadline now (`u64::MAX`: none).
    pub fn get(&self) -> u64 {
        self.at.load(Ordering::Acquire)
    }

    /// Whether `now` (same units) is at or past the deadline.
    #[inline]
    pub fn passed(&self, now: u64) -> bool {
        now >= self.at.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_at_the_deadline_and_not_before() {
        let d = Deadline::unbounded();
        assert!(!d.passed(u64::MAX - 1));
        d.set(1_000);
        assert!(!d.passed(999));
        assert!(d.passed(1_000));
        assert!(d.passed(5_000));
        d.set(10_000);
        assert!(!d.passed(5_000));
        assert_eq!(d.get(), 10_000);
    }
}
