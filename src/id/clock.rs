//! The clock the generator reads, injected so tests can drive time by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in microseconds since the Unix epoch.
///
/// The generator never assumes this is monotonic: stepping back is exactly
/// what it must survive.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since 1970-01-01T00:00:00Z.
    fn now_micros(&self) -> u64;

    /// Milliseconds since 1970-01-01T00:00:00Z.
    fn now_millis(&self) -> u64 {
        self.now_micros() / 1000
    }
}

/// The operating system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // A clock set before 1970 reads as 0, which every later check treats
        // as "far behind", never as a valid time.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    micros: AtomicU64,
}

impl ManualClock {
    /// A clock reading `unix_ms` milliseconds.
    pub fn at_millis(unix_ms: u64) -> Self {
        Self {
            micros: AtomicU64::new(unix_ms * 1000),
        }
    }

    /// Sets the time, forwards or backwards.
    pub fn set_micros(&self, micros: u64) {
        self.micros.store(micros, Ordering::SeqCst);
    }

    /// Sets the time in milliseconds, forwards or backwards.
    pub fn set_millis(&self, ms: u64) {
        self.set_micros(ms * 1000);
    }

    /// Moves the clock forwards by `ms`.
    pub fn advance_millis(&self, ms: u64) {
        self.micros.fetch_add(ms * 1000, Ordering::SeqCst);
    }

    /// Moves the clock backwards by `ms`.
    pub fn step_back_millis(&self, ms: u64) {
        self.micros.fetch_sub(ms * 1000, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}

/// A clock shifted by a fixed offset from another clock; lets an operator or
/// a test run a node "with its clock set back" without touching the OS.
#[derive(Debug)]
pub struct OffsetClock<C> {
    inner: C,
    offset_micros: i64,
}

impl<C: Clock> OffsetClock<C> {
    /// `inner` shifted by `offset_micros` (negative = behind).
    pub fn new(inner: C, offset_micros: i64) -> Self {
        Self {
            inner,
            offset_micros,
        }
    }
}

impl<C: Clock> Clock for OffsetClock<C> {
    fn now_micros(&self) -> u64 {
        self.inner
            .now_micros()
            .saturating_add_signed(self.offset_micros)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_ways() {
        let c = ManualClock::at_millis(1000);
        c.advance_millis(5);
        assert_eq!(c.now_millis(), 1005);
        c.step_back_millis(10);
        assert_eq!(c.now_millis(), 995);
    }

    #[test]
    fn offset_clock_shifts_and_saturates() {
        let c = OffsetClock::new(ManualClock::at_millis(10), -20_000);
        assert_eq!(c.now_micros(), 0);
        let c = OffsetClock::new(ManualClock::at_millis(10), 5_000);
        assert_eq!(c.now_millis(), 15);
    }

    #[test]
    fn system_clock_is_after_2024() {
        assert!(SystemClock.now_millis() > 1_704_067_200_000);
    }
}
