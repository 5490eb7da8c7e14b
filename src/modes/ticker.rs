//! Precise wake-ups at time-unit boundaries for calls that found the
//! sequence used up.
//!
//! Tokio's timer has millisecond resolution, so a call told "retry in
//! 300 us" would lose most of a millisecond's worth of IDs per wait. One
//! dedicated thread instead sleeps until just before the earliest requested
//! time, spins the last stretch (outside every lock), and then runs its
//! jobs itself: the fair-share pass ([`super::fair_shares`]), which hands
//! the new unit out to every queued caller. A job run here does not wait
//! for a runtime worker, so a unit is used even while the workers are all
//! busy. The thread idles on a condition variable when nobody waits.
//!
//! The same thread keeps a [`CoarseClock`]: monotonic milliseconds updated
//! at least every [`COARSE_TICK`], so the issue path can compare the
//! fencing deadline with one atomic load instead of reading a clock.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

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

/// Work the ticker thread does itself at a unit boundary: the fair-share
/// pass ([`super::fair_shares`]). Running it here rather than waking an
/// async task means a new unit is handed out on time even while every
/// runtime worker is busy (a task woken from outside the runtime can wait
/// behind dozens of others); the replies it sends wake their callers as
/// usual.
pub trait UnitJob: Send + Sync {
    /// Does the work due now; returns when to run next, or `None` when
    /// there is nothing left to do (until [`UnitTicker::run_jobs_now`]).
    fn run(&self) -> Option<Wake>;
}

/// When the ticker thread should run its jobs next.
#[derive(Debug, Clone, Copy)]
pub struct Wake {
    /// The clock time ([`Clock::now_micros`]) to run at.
    pub at_micros: u64,
    /// Run after this long at the latest, whatever the clock reads (on the
    /// monotonic clock, so a wall-clock step back cannot stretch it).
    pub limit: Duration,
}

/// A pending run: at the clock time, or at the instant, whichever comes
/// first.
#[derive(Debug, Clone, Copy)]
struct Due {
    at_micros: u64,
    by: Instant,
}

impl Due {
    fn of(wake: Wake) -> Self {
        Self {
            at_micros: wake.at_micros,
            by: Instant::now() + wake.limit.min(MAX_TICK),
        }
    }

    /// The earlier of two requests, on both clocks.
    fn merge(self, other: Option<Due>) -> Self {
        match other {
            None => self,
            Some(o) => Self {
                at_micros: self.at_micros.min(o.at_micros),
                by: self.by.min(o.by),
            },
        }
    }
}

struct Shared {
    coarse: CoarseClock,
    next: Mutex<Option<Due>>,
    wake_thread: Condvar,
    jobs: Mutex<Vec<Weak<dyn UnitJob>>>,
    clock: Arc<dyn Clock>,
    stop: AtomicBool,
}

impl Shared {
    /// Asks the thread to run the jobs at `due` (or earlier, if already
    /// asked for earlier).
    fn request(&self, due: Due) {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        *next = Some(due.merge(*next));
        drop(next);
        self.wake_thread.notify_one();
    }
}

/// Runs [`UnitJob`]s at given clock times with microsecond precision, on
/// one dedicated thread.
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
            jobs: Mutex::new(Vec::new()),
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

    /// Adds a job; the thread drops it once it is gone (held weakly, so
    /// the job's owner decides its lifetime).
    pub fn add_job(&self, job: Weak<dyn UnitJob>) {
        self.shared
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(job);
    }

    /// Runs every job as soon as the thread gets to it.
    pub fn run_jobs_now(&self) {
        self.shared.request(Due {
            at_micros: 0,
            by: Instant::now(),
        });
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

/// The ticker thread: idles on the condition variable (advancing the
/// coarse clock) until a run is due, sleeps until just before it, spins
/// the last stretch, runs the jobs and takes the earliest next run they
/// ask for.
fn tick_loop(s: &Shared) {
    loop {
        let due = {
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
        // `Due::of` bounds `by` by MAX_TICK, whatever the clock does.
        let until = due.by;
        loop {
            s.coarse.advance();
            let now = s.clock.now_micros();
            let left = until.saturating_duration_since(Instant::now());
            if now >= due.at_micros || left.is_zero() {
                break;
            }
            let remaining = Duration::from_micros(due.at_micros - now).min(left);
            if remaining > Duration::from_micros(SPIN_MICROS) {
                let nap = (remaining - Duration::from_micros(SPIN_MICROS)).min(COARSE_TICK);
                std::thread::sleep(nap);
            } else {
                std::hint::spin_loop();
            }
        }
        s.coarse.advance();
        if let Some(next) = run_jobs(s) {
            let mut pending = s.next.lock().unwrap_or_else(PoisonError::into_inner);
            *pending = Some(next.merge(*pending));
        }
    }
}

/// Runs every live job once; returns the earliest next run asked for.
///
/// A job that panics is dropped (its callers then time out) rather than
/// taking the thread down: the thread also keeps the coarse clock that
/// the fencing deadline is checked on, which must never stop.
fn run_jobs(s: &Shared) -> Option<Due> {
    let jobs: Vec<Arc<dyn UnitJob>> = {
        let mut jobs = s.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.retain(|j| j.strong_count() > 0);
        jobs.iter().filter_map(Weak::upgrade).collect()
    };
    let mut next: Option<Due> = None;
    for job in &jobs {
        match std::panic::catch_unwind(AssertUnwindSafe(|| job.run())) {
            Ok(Some(wake)) => next = Some(Due::of(wake).merge(next)),
            Ok(None) => {}
            Err(_) => {
                tracing::error!(
                    "a unit job (the fair-share pump) panicked and was dropped: snowflake calls that wait for the next millisecond will time out; restart the node"
                );
                let mut all = s.jobs.lock().unwrap_or_else(PoisonError::into_inner);
                all.retain(|j| !std::ptr::addr_eq(j.as_ptr(), Arc::as_ptr(job)));
            }
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SystemClock;
    use std::sync::mpsc;

    /// A job that reports the clock and instant of every run and asks for
    /// the next run from a script of (offset from now in us, limit).
    struct Probe {
        clock: Arc<dyn Clock>,
        runs: Mutex<mpsc::Sender<(u64, Instant)>>,
        script: Mutex<Vec<(u64, Duration)>>,
    }

    impl UnitJob for Probe {
        fn run(&self) -> Option<Wake> {
            let now = self.clock.now_micros();
            let _ = self.runs.lock().unwrap().send((now, Instant::now()));
            let (offset, limit) = self.script.lock().unwrap().pop()?;
            Some(Wake {
                at_micros: now + offset,
                limit,
            })
        }
    }

    fn probe(
        clock: Arc<dyn Clock>,
        script: Vec<(u64, Duration)>,
    ) -> (Arc<Probe>, mpsc::Receiver<(u64, Instant)>) {
        let (tx, rx) = mpsc::channel();
        let job = Arc::new(Probe {
            clock,
            runs: Mutex::new(tx),
            script: Mutex::new(script),
        });
        (job, rx)
    }

    fn add(ticker: &UnitTicker, job: &Arc<Probe>) {
        let weak: Weak<dyn UnitJob> = Arc::downgrade(job) as Weak<dyn UnitJob>;
        ticker.add_job(weak);
    }

    #[test]
    fn runs_a_job_now_then_never_before_the_time_it_asks_for() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ticker = UnitTicker::new(Arc::clone(&clock)).unwrap();
        let (job, runs) = probe(Arc::clone(&clock), vec![(700, Duration::from_secs(1)); 20]);
        add(&ticker, &job);
        ticker.run_jobs_now();
        let wait = Duration::from_secs(10);
        let (mut at, _) = runs.recv_timeout(wait).expect("the first run");
        for _ in 0..20 {
            let (now, _) = runs.recv_timeout(wait).expect("a run it asked for");
            assert!(now >= at + 700, "ran at {now}, asked for {}", at + 700);
            at = now;
        }
        // The script is over: the job asks for nothing and is not run again
        // until asked.
        assert!(runs.recv_timeout(Duration::from_millis(50)).is_err());
        ticker.run_jobs_now();
        assert!(runs.recv_timeout(wait).is_ok());
    }

    #[test]
    fn a_clock_that_never_gets_there_is_bounded_by_the_limit() {
        let clock = Arc::new(crate::id::ManualClock::at_millis(1_000));
        let ticker = UnitTicker::new(clock.clone()).unwrap();
        let (job, runs) = probe(clock.clone(), vec![(4_000_000, Duration::from_millis(30))]);
        add(&ticker, &job);
        ticker.run_jobs_now();
        let wait = Duration::from_secs(10);
        let (_, first) = runs.recv_timeout(wait).expect("the first run");
        let (now, second) = runs.recv_timeout(wait).expect("the run at the limit");
        assert!(second.duration_since(first) >= Duration::from_millis(30));
        assert_eq!(now, 1_000_000, "the manual clock did not move");
    }

    /// A job that panics on every run.
    struct Panics(Mutex<mpsc::Sender<()>>);

    impl UnitJob for Panics {
        fn run(&self) -> Option<Wake> {
            let _ = self.0.lock().unwrap().send(());
            panic!("a bug in a job");
        }
    }

    #[test]
    fn a_panicking_job_is_dropped_and_the_thread_lives_on() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ticker = UnitTicker::new(Arc::clone(&clock)).unwrap();
        let (tx, panics) = mpsc::channel();
        let bad = Arc::new(Panics(Mutex::new(tx)));
        let weak: Weak<dyn UnitJob> = Arc::downgrade(&bad) as Weak<dyn UnitJob>;
        ticker.add_job(weak);
        let (good, runs) = probe(Arc::clone(&clock), Vec::new());
        add(&ticker, &good);
        let wait = Duration::from_secs(10);
        ticker.run_jobs_now();
        panics.recv_timeout(wait).expect("the bad job ran");
        runs.recv_timeout(wait).expect("the good job ran beside it");
        // Asked again: only the good job runs; the thread is alive.
        ticker.run_jobs_now();
        runs.recv_timeout(wait).expect("the good job ran again");
        assert!(panics.try_recv().is_err(), "the panicking job was dropped");
        // The coarse clock (the fencing deadline's) still advances.
        let at = ticker.coarse().now_ms();
        let mut moved = false;
        for _ in 0..400 {
            std::thread::sleep(Duration::from_millis(5));
            if ticker.coarse().now_ms() > at {
                moved = true;
                break;
            }
        }
        assert!(moved, "the coarse clock stopped");
    }

    #[test]
    fn a_dropped_job_is_not_run() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ticker = UnitTicker::new(Arc::clone(&clock)).unwrap();
        let (job, runs) = probe(Arc::clone(&clock), Vec::new());
        add(&ticker, &job);
        drop(job);
        ticker.run_jobs_now();
        // The sender went with the job: no run can report.
        assert!(matches!(
            runs.recv_timeout(Duration::from_secs(1)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
        // A new job on the same ticker still runs.
        let (job, runs) = probe(Arc::clone(&clock), Vec::new());
        add(&ticker, &job);
        ticker.run_jobs_now();
        assert!(runs.recv_timeout(Duration::from_secs(10)).is_ok());
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
}
