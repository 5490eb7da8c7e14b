//! The snowflake generator: lock-free, clock-injected, bounded by a durable
//! high-water mark.
//!
//! # State
//! The whole mutable state is one `AtomicU64`, the last issued position
//! `time << sequence_bits | sequence`. Every issue is a compare-and-set from
//! the last position to a higher one, so positions, and the IDs composed from
//! them, strictly increase on this node no matter how many threads call in.
//! Nothing ever waits while holding anything: when a time unit's sequence is
//! used up the generator answers [`GenError::Exhausted`] with the time to
//! wait, and the caller waits on its own.
//!
//! # The rules an issue obeys
//! * **Logical clock.** An ID's time is `max(wall, last)`; it never goes back.
//! * **Rate cap.** While the logical clock equals the wall clock, at most
//!   `2^sequence_bits` IDs are issued per time unit.
//! * **Borrowing.** While the logical clock is ahead of the wall clock (after
//!   a restart above a stored high-water mark, or during a tolerated clock
//!   step back) a used-up unit moves the logical clock on by one unit instead
//!   of waiting for the wall clock, so the node keeps serving.
//! * **High-water mark.** No ID is issued with a time above `hwm`, a value
//!   the caller has durably stored before handing it over.
//! * **Step back.** The wall clock is compared with the highest wall time
//!   seen. A step back up to `max_backward` is tolerated (the logical clock
//!   carries on); a larger one refuses to issue until the wall clock is again
//!   within `max_backward` of where it was.
//! * **Closing** sets a flag bit in the state word with one atomic
//!   operation, so no issue can slip in between closing and reading the
//!   final position.

use super::kind::ErrorKind;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use thiserror::Error;

use super::layout::{Layout, LayoutError};

mod uuids;
use uuids::UuidPosition;
pub use uuids::UuidReservation;

/// Set in the state word once the generator is closed.
const CLOSED: u64 = 1 << 63;

/// Why the generator did not issue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GenError {
    /// This time unit's sequence is used up; try again after the given time.
    /// Not an error a client sees: the serving layer waits and retries.
    #[error("sequence exhausted for this time unit; retry in {retry_after_micros} us")]
    Exhausted {
        /// How long to wait before the next unit starts.
        retry_after_micros: u64,
    },
    /// The wall clock stepped back further than `clock.max_backward`.
    #[error("wall clock stepped back {back_ms} ms, more than clock.max_backward ({limit_ms} ms); this node stops issuing until its clock catches up, retry on another node")]
    ClockStepBack {
        /// How far behind the highest wall time seen the clock is.
        back_ms: u64,
        /// The configured tolerance.
        limit_ms: u64,
    },
    /// The wall clock passed the durably stored high-water mark: the store
    /// has not confirmed a new reservation in time.
    #[error("high-water mark not extended (clock is {ahead_ms} ms past it): the state store is not confirming writes; retry on another node")]
    HwmReached {
        /// How far the wall clock is past the mark.
        ahead_ms: u64,
    },
    /// The layout's time field has run out.
    #[error(
        "the layout's time bits are exhausted: no more snowflake IDs can be issued under it. Do not move layout.epoch forward (new IDs would repeat old ones); change to a layout whose IDs all lie above every ID issued so far (`idgen admin layout set` in a cluster refuses any other), or use segment or lease mode"
    )]
    TimeExhausted,
    /// The generator was closed (shutdown or fencing).
    #[error("this node has stopped issuing IDs (shutting down or fenced); retry on another node")]
    Closed,
}

impl GenError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TimeExhausted => ErrorKind::Exhausted,
            _ => ErrorKind::Unavailable,
        }
    }
}

/// Why a node may not start issuing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StartError {
    /// The wall clock is far behind the stored high-water mark: an earlier
    /// run issued IDs with times this clock has not reached yet.
    #[error("clock is {behind_ms} ms behind the stored high-water mark (limit clock.max_startup_skew = {limit_ms} ms); fix the clock (NTP) or wait {behind_ms} ms before starting")]
    ClockBehindHwm {
        /// How far behind.
        behind_ms: u64,
        /// The configured limit.
        limit_ms: u64,
    },
    /// The datacenter or worker id does not fit the layout, or time ran out.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

impl StartError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ClockBehindHwm { .. } => ErrorKind::Unavailable,
            Self::Layout(e) => e.kind(),
        }
    }
}

/// Where a generator starts, worked out from the stored high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPlan {
    /// The first time unit the generator may use: above everything an
    /// earlier run could have issued.
    pub floor_units: u64,
}

impl StartPlan {
    /// Applies the start-up rule: begin at `max(now, stored + 1)`, and refuse
    /// when `now` is behind `stored` by more than `max_skew_ms`.
    ///
    /// `stored_hwm_ms` is the Unix time (ms) of the highest time unit an
    /// earlier run may have used, or `None` on a fresh store.
    pub fn new(
        layout: &Layout,
        now_ms: u64,
        stored_hwm_ms: Option<u64>,
        max_skew_ms: u64,
    ) -> Result<Self, StartError> {
        let now_units = layout.units_at(now_ms);
        let Some(hwm_ms) = stored_hwm_ms else {
            if now_units > layout.max_time() {
                return Err(LayoutError::TimeExhausted {
                    bits: layout.spec().time_bits,
                    end_ms: layout.end_ms(),
                }
                .into());
            }
            return Ok(Self {
                floor_units: now_units,
            });
        };
        if hwm_ms > now_ms.saturating_add(max_skew_ms) {
            return Err(StartError::ClockBehindHwm {
                behind_ms: hwm_ms - now_ms,
                limit_ms: max_skew_ms,
            });
        }
        let floor_units = now_units.max(layout.units_at(hwm_ms) + 1);
        if floor_units > layout.max_time() {
            return Err(LayoutError::TimeExhausted {
                bits: layout.spec().time_bits,
                end_ms: layout.end_ms(),
            }
            .into());
        }
        Ok(Self { floor_units })
    }
}

/// A run of consecutive positions reserved by one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    first: u64,
    count: u64,
}

impl Reservation {
    /// How many IDs it holds.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Always false: the generator never reserves zero IDs.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Clock step-back counters, read by the serving layer for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepBackStats {
    /// Step backs within `max_backward` (kept issuing).
    pub tolerated: u64,
    /// Step backs beyond `max_backward` (stopped issuing).
    pub refused: u64,
    /// Size of the most recent step back, in ms.
    pub last_back_ms: u64,
}

/// How far behind the highest wall reading a reading may be and still count
/// as a race between threads rather than a clock step back.
pub const RACE_SLACK_MS: u64 = 10;

/// The wall clock as one call sees it.
#[derive(Debug, Clone, Copy)]
struct Wall {
    /// The highest wall unit seen (including this reading).
    high: u64,
    /// This reading is a real step back (beyond the race slack).
    stepped_back: bool,
}

const STEP_NONE: u8 = 0;
const STEP_TOLERATED: u8 = 1;
const STEP_REFUSED: u8 = 2;

/// The snowflake generator of one worker. Share it behind an `Arc`.
///
/// ```
/// use idgen::id::{GenError, Preset, Snowflake, StartPlan, DEFAULT_EPOCH_MS};
///
/// let now_ms = DEFAULT_EPOCH_MS + 1_000;
/// let layout = Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(now_ms).unwrap();
/// // Fresh store: start now; the caller has durably stored a mark 3 s ahead.
/// let plan = StartPlan::new(&layout, now_ms, None, 10_000).unwrap();
/// let g = Snowflake::new(layout, 0, 1, 1_000, plan, now_ms + 3_000).unwrap();
/// let a = g.next_id(now_ms * 1000).unwrap();
/// let b = g.next_id(now_ms * 1000).unwrap();
/// assert!(b > a);
/// // 4,096 IDs per millisecond at most; then the caller waits outside.
/// let r = g.reserve(now_ms * 1000, 10_000).unwrap();
/// assert_eq!(r.len(), 4094);
/// assert!(matches!(g.next_id(now_ms * 1000), Err(GenError::Exhausted { .. })));
/// ```
#[derive(Debug)]
pub struct Snowflake {
    layout: Layout,
    node_bits: u64,
    seq_bits: u32,
    seq_mask: u64,
    max_backward_units: u64,
    race_slack_units: u64,
    epoch_micros: u64,
    unit_micros: u64,
    /// Last issued position `time << seq_bits | seq`, plus the CLOSED bit.
    last: AtomicU64,
    /// Highest time unit durably reserved (inclusive).
    hwm: AtomicU64,
    /// Highest wall-clock time unit seen.
    wall_high: AtomicU64,
    /// Which step-back episode is in progress, so each is counted once.
    step_state: AtomicU8,
    tolerated: AtomicU64,
    refused: AtomicU64,
    last_back_ms: AtomicU64,
    /// The last UUIDv7 position (`id::uuid`): same clock, mark and close.
    uuid: Mutex<UuidPosition>,
}

impl Snowflake {
    /// A generator for node (`datacenter`, `worker`) that issues from
    /// `plan.floor_units` on and may use time units up to `hwm_ms` (Unix ms,
    /// already durably stored by the caller).
    pub fn new(
        layout: Layout,
        datacenter: u64,
        worker: u64,
        max_backward_ms: u64,
        plan: StartPlan,
        hwm_ms: u64,
    ) -> Result<Self, StartError> {
        layout.check_node(datacenter, worker)?;
        let seq_bits = u32::from(layout.sequence_bits());
        // The position just below the floor, so the first issue lands on
        // (floor, 0).
        let last = (plan.floor_units << seq_bits).saturating_sub(1);
        let race_slack_units = (RACE_SLACK_MS / layout.time_unit_ms()).max(1);
        Ok(Self {
            layout,
            node_bits: layout.node_bits(datacenter, worker),
            seq_bits,
            seq_mask: layout.max_sequence(),
            race_slack_units,
            max_backward_units: max_backward_ms
                .div_ceil(layout.time_unit_ms())
                .max(race_slack_units + 1),
            epoch_micros: layout.spec().epoch_ms * 1000,
            unit_micros: layout.time_unit_ms() * 1000,
            last: AtomicU64::new(last),
            uuid: Mutex::new(UuidPosition::below(layout.unix_ms_of(plan.floor_units))),
            hwm: AtomicU64::new(layout.units_at(hwm_ms)),
            wall_high: AtomicU64::new(0),
            step_state: AtomicU8::new(STEP_NONE),
            tolerated: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            last_back_ms: AtomicU64::new(0),
        })
    }

    /// This node's number in the cluster: datacenter and worker id as the
    /// layout composes them (`datacenter << worker_bits | worker`). Unique
    /// among live nodes, as the worker id is.
    pub fn node_number(&self) -> u64 {
        self.node_bits >> self.seq_bits
    }

    /// The layout IDs are composed under.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Raises the high-water mark to `hwm_ms` (Unix ms). Call only after the
    /// value is durably stored. Never lowers it.
    pub fn raise_hwm(&self, hwm_ms: u64) {
        self.hwm
            .fetch_max(self.layout.units_at(hwm_ms), Ordering::AcqRel);
    }

    /// The current high-water mark, as Unix ms of its time unit.
    pub fn hwm_ms(&self) -> u64 {
        self.layout.unix_ms_of(self.hwm.load(Ordering::Acquire))
    }

    /// The logical clock: the time unit of the last issued ID, as Unix ms.
    pub fn logical_ms(&self) -> u64 {
        let last = self.last.load(Ordering::Acquire) & !CLOSED;
        self.layout.unix_ms_of(last >> self.seq_bits)
    }

    /// Whether [`Snowflake::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.last.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Step-back counters so far.
    pub fn step_back_stats(&self) -> StepBackStats {
        StepBackStats {
            tolerated: self.tolerated.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            last_back_ms: self.last_back_ms.load(Ordering::Relaxed),
        }
    }

    /// Stops issuing for good and returns the Unix ms of the highest time
    /// unit ever issued (the floor minus one if nothing was): the final
    /// high-water mark that is safe to store once nothing else can issue.
    ///
    /// UUIDs count too: the result covers the last UUID's millisecond.
    pub fn close(&self) -> u64 {
        let last = self.last.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        let snowflake_ms = self.layout.unix_ms_of(last >> self.seq_bits);
        snowflake_ms.max(self.close_uuids())
    }

    /// Applies the clock and high-water mark rules at `now_micros` without
    /// issuing, so a monitor notices a step back or a stale mark even while
    /// no calls come in.
    pub fn check(&self, now_micros: u64) -> Result<(), GenError> {
        let now = self.units_at_micros(now_micros);
        self.check_wall(now)?;
        if self.is_closed() {
            return Err(GenError::Closed);
        }
        let hwm = self.hwm.load(Ordering::Acquire);
        if now > hwm {
            return Err(GenError::HwmReached {
                ahead_ms: self.layout.unix_ms_of(now) - self.layout.unix_ms_of(hwm),
            });
        }
        if now > self.layout.max_time() {
            return Err(GenError::TimeExhausted);
        }
        Ok(())
    }

    /// Turns a reserved position into an ID.
    #[inline]
    fn id_at(&self, pos: u64) -> u64 {
        self.layout
            .compose(pos >> self.seq_bits, self.node_bits, pos & self.seq_mask)
    }

    /// Appends the IDs of a reservation to `out`, in increasing order.
    pub fn extend_ids(&self, r: Reservation, out: &mut Vec<u64>) {
        out.extend((r.first..r.first + r.count).map(|p| self.id_at(p)));
    }

    /// Issues one ID at wall time `now_micros`.
    pub fn next_id(&self, now_micros: u64) -> Result<u64, GenError> {
        let r = self.reserve(now_micros, 1)?;
        Ok(self.id_at(r.first))
    }

    /// Reserves up to `want` (at least 1) consecutive IDs at wall time
    /// `now_micros`. May return fewer than asked when the time unit runs
    /// out; the caller asks again for the rest.
    pub fn reserve(&self, now_micros: u64, want: u64) -> Result<Reservation, GenError> {
        let want = want.max(1);
        let now = self.units_at_micros(now_micros);
        let wall = self.check_wall(now)?;
        let max_time = self.layout.max_time();
        if now > max_time {
            return Err(GenError::TimeExhausted);
        }
        let hwm = self.hwm.load(Ordering::Acquire);
        let mut last = self.last.load(Ordering::Acquire);
        loop {
            if last & CLOSED != 0 {
                return Err(GenError::Closed);
            }
            let last_t = last >> self.seq_bits;
            let start = (last + 1).max(now << self.seq_bits);
            let start_t = start >> self.seq_bits;
            // Borrow future units only while the logical clock leads every
            // wall reading (after a restart above a stored mark) or during
            // a real step back; otherwise at most the newest wall unit.
            let ceiling = if last_t > wall.high || wall.stepped_back {
                hwm
            } else {
                wall.high.min(hwm)
            }
            .min(max_time);
            if start_t > ceiling {
                return Err(self.refusal(now, wall.high, now_micros, hwm, start_t));
            }
            let room = ((ceiling + 1) << self.seq_bits) - start;
            let count = want.min(room);
            match self.last.compare_exchange_weak(
                last,
                start + count - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Reservation {
                        first: start,
                        count,
                    })
                }
                Err(actual) => last = actual,
            }
        }
    }

    /// Explains why nothing could be issued at wall unit `now`.
    fn refusal(&self, now: u64, high: u64, now_micros: u64, hwm: u64, start_t: u64) -> GenError {
        if start_t > self.layout.max_time() {
            return GenError::TimeExhausted;
        }
        if now > hwm {
            let ahead_ms = self
                .layout
                .unix_ms_of(now)
                .saturating_sub(self.layout.unix_ms_of(hwm));
            return GenError::HwmReached { ahead_ms };
        }
        // Wait for the next wall-clock unit; by then either the unit is new
        // or the high-water mark has moved.
        let next_unit_micros = self.layout.unix_ms_of(high.max(now) + 1) * 1000;
        GenError::Exhausted {
            retry_after_micros: next_unit_micros.saturating_sub(now_micros).max(1),
        }
    }

    /// Tracks the highest wall time seen and applies the step-back rule.
    ///
    /// A reading a little behind the highest one is usually not a step
    /// back at all: another thread read the clock later and got in first.
    /// Readings within [`RACE_SLACK_MS`] of the highest are treated as that
    /// race: not counted, and no borrowing.
    #[inline]
    fn check_wall(&self, now: u64) -> Result<Wall, GenError> {
        let high = self.wall_high.load(Ordering::Relaxed);
        if now >= high {
            if now > high {
                self.wall_high.fetch_max(now, Ordering::Relaxed);
            }
            if self.step_state.load(Ordering::Relaxed) != STEP_NONE {
                self.step_state.store(STEP_NONE, Ordering::Relaxed);
            }
            return Ok(Wall {
                high: now,
                stepped_back: false,
            });
        }
        let back = high - now;
        if back <= self.race_slack_units {
            return Ok(Wall {
                high,
                stepped_back: false,
            });
        }
        let back_ms = back * self.layout.time_unit_ms();
        if back > self.max_backward_units {
            self.enter_step(STEP_REFUSED, back_ms, &self.refused);
            return Err(GenError::ClockStepBack {
                back_ms,
                limit_ms: self.max_backward_units * self.layout.time_unit_ms(),
            });
        }
        self.enter_step(STEP_TOLERATED, back_ms, &self.tolerated);
        Ok(Wall {
            high,
            stepped_back: true,
        })
    }

    /// Time units since the epoch at `micros` (one division).
    #[inline]
    fn units_at_micros(&self, micros: u64) -> u64 {
        micros.saturating_sub(self.epoch_micros) / self.unit_micros
    }

    /// Counts a step-back episode once, when it starts or gets worse; an
    /// episode that eases from refused to tolerated is not counted again.
    fn enter_step(&self, state: u8, back_ms: u64, counter: &AtomicU64) {
        if self.step_state.load(Ordering::Relaxed) >= state {
            return;
        }
        if self.step_state.fetch_max(state, Ordering::Relaxed) < state {
            counter.fetch_add(1, Ordering::Relaxed);
            self.last_back_ms.store(back_ms, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;
    use crate::id::clock::{Clock, ManualClock};
    use crate::id::layout::{LayoutSpec, Preset, DEFAULT_EPOCH_MS};

    const T0: u64 = 1_790_000_000_000;

    fn twitter() -> Layout {
        Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(T0).unwrap()
    }

    /// A generator starting fresh at `T0` with a 3 s reservation.
    fn fresh(layout: Layout) -> Snowflake {
        let plan = StartPlan::new(&layout, T0, None, 10_000).unwrap();
        Snowflake::new(layout, 1, 2, 1000, plan, T0 + 3000).unwrap()
    }

    fn us(ms: u64) -> u64 {
        ms * 1000
    }

    #[test]
    fn ids_strictly_increase_and_carry_the_node() {
        let g = fresh(twitter());
        let mut prev = 0;
        for i in 0..10_000u64 {
            let id = g.next_id(us(T0 + i / 1000)).unwrap();
            assert!(id > prev, "id {id} after {prev}");
            prev = id;
            let p = g.layout().decompose(id).unwrap();
            assert_eq!((p.datacenter, p.worker), (1, 2));
        }
    }

    #[test]
    fn sequence_exhaustion_asks_to_wait_for_the_next_unit() {
        let g = fresh(twitter());
        let clock = ManualClock::at_millis(T0);
        let now = clock.now_micros() + 250; // a quarter into the millisecond
        let r = g.reserve(now, 10_000).unwrap();
        assert_eq!(r.len(), 4096, "one unit holds 2^12 IDs");
        match g.reserve(now, 1) {
            Err(GenError::Exhausted { retry_after_micros }) => assert_eq!(retry_after_micros, 750),
            other => panic!("expected Exhausted, got {other:?}"),
        }
        clock.advance_millis(1);
        let r = g.reserve(clock.now_micros(), 5000).unwrap();
        assert_eq!(r.len(), 4096);
    }

    #[test]
    fn batches_are_consecutive_and_unique() {
        let g = fresh(twitter());
        let mut out = Vec::new();
        let mut now = T0;
        while out.len() < 50_000 {
            match g.reserve(us(now), 3000) {
                Ok(r) => g.extend_ids(r, &mut out),
                Err(GenError::Exhausted { .. }) => now += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(out.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn small_step_back_keeps_issuing_above_everything_issued() {
        let g = fresh(twitter());
        let clock = ManualClock::at_millis(T0 + 500);
        let before = g.next_id(clock.now_micros()).unwrap();
        clock.step_back_millis(400);
        let mut prev = before;
        // Far more than one unit's worth: the logical clock borrows ahead.
        for _ in 0..20_000 {
            let id = g.next_id(clock.now_micros()).unwrap();
            assert!(id > prev);
            prev = id;
        }
        let t = g.layout().decompose(prev).unwrap().unix_ms;
        assert!(t > T0 + 500, "logical clock moved on from the old time");
        let stats = g.step_back_stats();
        assert_eq!(
            (stats.tolerated, stats.refused, stats.last_back_ms),
            (1, 0, 400)
        );
    }

    #[test]
    fn check_sees_faults_without_issuing() {
        let g = fresh(twitter());
        assert_eq!(g.check(us(T0 + 10)), Ok(()));
        assert!(matches!(
            g.check(us(T0 - 5000)),
            Err(GenError::ClockStepBack { .. })
        ));
        assert!(matches!(
            g.check(us(T0 + 3001)),
            Err(GenError::HwmReached { .. })
        ));
        g.close();
        assert_eq!(g.check(us(T0 + 3000)), Err(GenError::Closed));
    }

    #[test]
    fn stale_readings_from_racing_threads_neither_borrow_nor_count() {
        let g = fresh(twitter());
        // Another thread read T0+5 and used up that unit's sequence.
        assert_eq!(g.reserve(us(T0 + 5), 10_000).unwrap().len(), 4096);
        // This thread read the clock a little earlier: no borrowing of
        // T0+6, so the 2^12-per-unit cap holds.
        assert!(matches!(
            g.reserve(us(T0 + 4), 1),
            Err(GenError::Exhausted { .. })
        ));
        assert!(matches!(
            g.reserve(us(T0 - 5), 1),
            Err(GenError::Exhausted { .. })
        ));
        assert_eq!(g.step_back_stats(), StepBackStats::default());
        // A fresh unit is served normally.
        assert_eq!(g.reserve(us(T0 + 6), 10_000).unwrap().len(), 4096);
    }

    #[test]
    fn large_step_back_stops_until_the_clock_catches_up() {
        let g = fresh(twitter());
        let clock = ManualClock::at_millis(T0 + 2000);
        let before = g.next_id(clock.now_micros()).unwrap();
        clock.step_back_millis(1500);
        for _ in 0..3 {
            match g.next_id(clock.now_micros()) {
                Err(GenError::ClockStepBack { back_ms, limit_ms }) => {
                    assert_eq!((back_ms, limit_ms), (1500, 1000));
                }
                other => panic!("expected ClockStepBack, got {other:?}"),
            }
        }
        assert_eq!(g.step_back_stats().refused, 1, "one episode, counted once");
        clock.advance_millis(600); // now 900 ms behind: within tolerance again
        let after = g.next_id(clock.now_micros()).unwrap();
        assert_eq!(g.step_back_stats().tolerated, 0, "still the same episode");
        assert!(after > before);
        clock.advance_millis(1000);
        let later = g.next_id(clock.now_micros()).unwrap();
        assert!(later > after);
    }

    #[test]
    fn never_issues_past_the_high_water_mark() {
        let g = fresh(twitter());
        // The wall clock runs past the mark without it being raised.
        let err = g.next_id(us(T0 + 3001)).unwrap_err();
        assert!(
            matches!(err, GenError::HwmReached { ahead_ms: 1 }),
            "{err:?}"
        );
        // Up to and including the mark's unit is fine.
        let id = g.next_id(us(T0 + 3000)).unwrap();
        assert_eq!(g.layout().decompose(id).unwrap().unix_ms, T0 + 3000);
        g.raise_hwm(T0 + 6000);
        assert!(g.next_id(us(T0 + 3001)).is_ok());
        // Lowering is ignored.
        g.raise_hwm(T0);
        assert_eq!(g.hwm_ms(), T0 + 6000);
    }

    #[test]
    fn borrowing_stops_at_the_high_water_mark() {
        let layout = twitter();
        // Restarted 3 s below a stored mark: the logical clock leads.
        let plan = StartPlan::new(&layout, T0, Some(T0 + 3000), 10_000).unwrap();
        assert_eq!(layout.unix_ms_of(plan.floor_units), T0 + 3001);
        let g = Snowflake::new(layout, 0, 0, 1000, plan, T0 + 3005).unwrap();
        let mut n = 0u64;
        let mut last = 0;
        loop {
            match g.reserve(us(T0), 100_000) {
                Ok(r) => {
                    n += r.len();
                    let mut v = Vec::new();
                    g.extend_ids(r, &mut v);
                    last = *v.last().unwrap();
                }
                Err(GenError::Exhausted { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(n, 5 * 4096, "units 3001..=3005 borrowed, no further");
        assert_eq!(layout.decompose(last).unwrap().unix_ms, T0 + 3005);
    }

    #[test]
    fn restart_starts_above_the_stored_mark() {
        let layout = twitter();
        let first = fresh(layout);
        let old = first.next_id(us(T0 + 10)).unwrap();
        let stored = first.hwm_ms();
        // The restarted node's clock is 2 s behind the old one: allowed.
        let plan = StartPlan::new(&layout, T0 - 2000, Some(stored), 10_000).unwrap();
        let g = Snowflake::new(layout, 1, 2, 1000, plan, stored + 3000).unwrap();
        let new = g.next_id(us(T0 - 2000)).unwrap();
        assert!(new > old);
        assert!(layout.decompose(new).unwrap().unix_ms > stored);
    }

    #[test]
    fn refuses_to_start_beyond_the_startup_skew() {
        let layout = twitter();
        let err = StartPlan::new(&layout, T0, Some(T0 + 60_000), 10_000).unwrap_err();
        assert_eq!(
            err,
            StartError::ClockBehindHwm {
                behind_ms: 60_000,
                limit_ms: 10_000
            }
        );
        assert!(err.to_string().contains("60000 ms behind"));
        assert!(StartPlan::new(&layout, T0, Some(T0 + 10_000), 10_000).is_ok());
    }

    #[test]
    fn close_returns_the_highest_issued_unit_and_stops() {
        let g = fresh(twitter());
        g.next_id(us(T0 + 42)).unwrap();
        assert_eq!(g.close(), T0 + 42);
        assert!(g.is_closed());
        assert_eq!(g.next_id(us(T0 + 43)), Err(GenError::Closed));
        // Nothing issued: the floor minus one unit, still above the old mark.
        let g = fresh(twitter());
        assert_eq!(g.close(), T0 - 1);
    }

    #[test]
    fn time_exhaustion_is_an_error_not_a_wrap() {
        let spec = LayoutSpec {
            epoch_ms: T0 - (1 << 30) + 5,
            time_unit_ms: 1,
            time_bits: 30,
            datacenter_bits: 0,
            worker_bits: 0,
            sequence_bits: 2,
        };
        let layout = spec.validate(T0).unwrap();
        let plan = StartPlan::new(&layout, T0, None, 10_000).unwrap();
        let g = Snowflake::new(layout, 0, 0, 1000, plan, T0 + 100).unwrap();
        assert!(g.next_id(us(T0 + 4)).is_ok());
        assert_eq!(g.next_id(us(T0 + 5)), Err(GenError::TimeExhausted));
    }

    #[test]
    fn node_ids_out_of_range_are_refused() {
        let layout = twitter();
        let plan = StartPlan::new(&layout, T0, None, 10_000).unwrap();
        let err = Snowflake::new(layout, 0, 32, 1000, plan, T0).unwrap_err();
        assert!(matches!(
            err,
            StartError::Layout(LayoutError::WorkerOutOfRange { .. })
        ));
    }

    #[test]
    fn threads_sharing_one_worker_never_collide() {
        let g = Arc::new(fresh(twitter()));
        let clock = Arc::new(ManualClock::at_millis(T0));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let g = Arc::clone(&g);
                let clock = Arc::clone(&clock);
                std::thread::spawn(move || {
                    let mut ids = Vec::new();
                    while ids.len() < 20_000 {
                        match g.reserve(clock.now_micros(), 1 + i * 7) {
                            Ok(r) => g.extend_ids(r, &mut ids),
                            // Whoever runs out moves time on (well within
                            // the 3 s reservation for 80,000 IDs).
                            Err(GenError::Exhausted { .. }) => clock.advance_millis(1),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    ids
                })
            })
            .collect();
        let mut seen = HashSet::new();
        let mut total = 0;
        for h in handles {
            let ids = h.join().unwrap();
            total += ids.len();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "per-thread order");
            for id in ids {
                assert!(seen.insert(id), "duplicate id {id}");
            }
        }
        assert!(total >= 80_000);
        assert_eq!(seen.len(), total);
    }
}
