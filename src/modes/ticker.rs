//! Precise wake-ups at time-unit boundaries for calls that found the
//! sequence used up.
//!
//! Tokio's timer has millisecond resolution, so a call told "retry in
//! 300 us" would lose most of a millisecond's worth of IDs per wait. One
//! dedicated thread instead sleeps until just before the earliest requested
//! deadline, spins the last stretch (outside every lock), and then wakes one
//! waiter: the fair-share pump ([`super::fair_shares`]), which serves every
//! queued caller. It idles on a condition variable when nobody waits.
//!
//! The same thread keeps a [`CoarseClock`]: monotonic milliseconds updated
//! at least every [`COARSE_TICK`], so the issue path can compare the
//! fencing deadline with one atomic load instead of reading a clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::id::Clock;

/// Below this much remaining time the ticker thread spins instead of sleeping.
const SPIN_MICROS: u64 = 120;
/// Longest a ticker thread works on one deadline, whatever the clock does.
const MAX_TICK: Duration = Duration::from_millis(50);

/// How often the ticker thread advances the [`CoarseClock`] at least.
pub const COARSE_TICK: Duration = Duration::from_millis(5);

/// Monotonic milliseconds since the node started, advanced by the ticker
/// thread; may lag the real monotonic clock by up to [`COARSE_TICK`].
#[derive(Debug)]
pub struct CoarseClock {
    base: Instant,
    now_ms: AtomicU64,
}

impl CoarseClock {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            now_ms: AtomicU64::new(0),
        }
    }

    /// The coarse time now (never ahead of the real one).
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Acquire)
    }

    /// `at` in this clock's milliseconds, rounded down, minus one
    /// [`COARSE_TICK`] and a millisecond so that a lagging reading can
    /// never let a deadline slip: a deadline converted here passes no later
    /// than `at` itself.
    pub fn deadline_at(&self, at: Instant) -> u64 {
        let ms = at.saturating_duration_since(self.base).as_millis() as u64;
        ms.saturating_sub(COARSE_TICK.as_millis() as u64 + 1)
    }

    fn advance(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.now_ms.fetch_max(ms, Ordering::AcqRel);
    }
}

struct Shared {
    coarse: CoarseClock,
    next: Mutex<Option<u64>>,
    wake_thread: Condvar,
    wake_waiters: Notify,
    clock: Arc<dyn Clock>,
    stop: AtomicBool,
}

/// Wakes async callers at a given clock time with microsecond precision.
pub struct UnitTicker {
    shared: Arc<Shared>,
}

impl UnitTicker {
    /// Starts the ticker thread.
    pub fn new(clock: Arc<dyn Clock>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            coarse: CoarseClock::new(),
            next: Mutex::new(None),
            wake_thread: Condvar::new(),
            wake_waiters: Notify::new(),
            clock,
            stop: AtomicBool::new(false),
        });
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("idgen-ticker".into())
            .spawn(move || tick_loop(&worker))?;
        Ok(Self { shared })
    }

    /// The coarse monotonic clock this thread keeps.
    pub fn coarse(&self) -> &CoarseClock {
        &self.shared.coarse
    }

    /// Waits until the clock reads `deadline_micros`, or at most `limit`
    /// (measured on the monotonic clock, so a wall-clock step back cannot
    /// stretch it). May also return early (another caller's hand-off, or a
    /// wake-up left over from a moment with no waiters): the caller
    /// re-checks its condition afterwards.
    pub async fn wait_until(&self, deadline_micros: u64, limit: Duration) {
        let s = &self.shared;
        let now = s.clock.now_micros();
        if now >= deadline_micros || limit.is_zero() {
            return;
        }
        let notified = s.wake_waiters.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut next = s.next.lock().unwrap_or_else(PoisonError::into_inner);
            *next = Some(next.map_or(deadline_micros, |d| d.min(deadline_micros)));
        }
        s.wake_thread.notify_one();
        // A safety net in case the thread is starved: never oversleep by
        // more than a millisecond, and never past `limit`.
        let remaining = Duration::from_micros(deadline_micros - now) + Duration::from_millis(1);
        let _ = tokio::time::timeout(remaining.min(limit), notified).await;
    }
}

impl Drop for UnitTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _guard = self
            .shared
            .next
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.shared.wake_thread.notify_all();
    }
}

fn tick_loop(s: &Shared) {
    loop {
        let deadline = {
            let mut next = s.next.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                s.coarse.advance();
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(d) = next.take() {
                    break d;
                }
                next = s
                    .wake_thread
                    .wait_timeout(next, COARSE_TICK)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let started = Instant::now();
        loop {
            s.coarse.advance();
            let now = s.clock.now_micros();
            if now >= deadline || started.elapsed() > MAX_TICK {
                break;
            }
            let remaining = deadline - now;
            if remaining > SPIN_MICROS {
                let nap = Duration::from_micros(remaining - SPIN_MICROS)
                    .min(MAX_TICK.saturating_sub(started.elapsed()))
                    .min(COARSE_TICK);
                std::thread::sleep(nap);
            } else {
                std::hint::spin_loop();
            }
        }
        // Wake one waiter: the fair-share pump, which hands the new unit
        // out to every queued caller.
        s.wake_waiters.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SystemClock;

    #[tokio::test]
    async fn wakes_at_or_after_the_deadline() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ticker = UnitTicker::new(Arc::clone(&clock)).unwrap();
        let limit = Duration::from_secs(1);
        for _ in 0..20 {
            let deadline = clock.now_micros() + 700;
            // The contract: a wake may come early (a stale permit); the
            // caller re-checks. It takes at most a couple of rounds.
            let mut rounds = 0;
            while clock.now_micros() < deadline {
                ticker.wait_until(deadline, limit).await;
                rounds += 1;
                assert!(rounds <= 3, "woken early {rounds} times");
            }
        }
        // A deadline in the past returns at once.
        let started = std::time::Instant::now();
        ticker.wait_until(0, limit).await;
        assert!(started.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn the_coarse_clock_keeps_up_and_deadlines_never_slip() {
        let ticker = UnitTicker::new(Arc::new(SystemClock)).unwrap();
        let c = ticker.coarse();
        // Never ahead of the real monotonic clock.
        for _ in 0..20 {
            assert!(c.now_ms() <= c.base.elapsed().as_millis() as u64);
            std::thread::sleep(Duration::from_millis(3));
        }
        // A converted deadline lies before the instant itself, and the
        // coarse clock reaches it (bounded wait: the thread may be
        // descheduled on a busy machine, but it keeps advancing).
        let at = Instant::now() + Duration::from_millis(30);
        let d = c.deadline_at(at);
        assert!(d < at.duration_since(c.base).as_millis() as u64);
        let mut reached = false;
        for _ in 0..400 {
            if c.now_ms() >= d {
                reached = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(reached, "coarse clock stuck at {}", c.now_ms());
    }

    #[tokio::test]
    async fn a_clock_that_never_gets_there_is_bounded_by_the_limit() {
        let clock = Arc::new(crate::id::ManualClock::at_millis(1_000));
        let ticker = UnitTicker::new(clock.clone()).unwrap();
        let started = std::time::Instant::now();
        ticker
            .wait_until(5_000_000, Duration::from_millis(30))
            .await;
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(clock.now_micros() < 5_000_000);
    }
}
