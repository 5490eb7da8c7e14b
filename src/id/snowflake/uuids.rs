//! UUIDv7 positions on the snowflake generator's clock.
//!
//! A UUID's `(unix_ts_ms, counter)` is a position of its own, but it obeys
//! the generator's rules with the generator's state: the same wall-clock
//! high and step-back episode, the same high-water mark, the same close.
//! One claim and one mark serve both kinds; there is no second clock.
//!
//! The position is two numbers (a 48-bit millisecond and a 26-bit counter)
//! that do not fit one atomic word beside a close flag, so it sits behind a
//! mutex; a reservation holds it for a few comparisons, and a batch takes
//! one reservation.

use std::sync::atomic::Ordering;

use super::{GenError, Snowflake};
use crate::id::uuid::COUNTER_BITS;

const COUNTER_MAX: u64 = (1 << COUNTER_BITS) - 1;
/// The largest `unix_ts_ms` a UUID holds.
const TS_MAX: u64 = (1 << 48) - 1;

/// The last UUID position issued.
#[derive(Debug)]
pub(super) struct UuidPosition {
    /// Unix ms of the last UUID.
    ms: u64,
    /// Its counter.
    counter: u64,
    /// Set by [`Snowflake::close`]; nothing is issued after.
    closed: bool,
}

impl UuidPosition {
    /// The position just below `floor_ms`: the first UUID lands in
    /// `floor_ms` (its counter at a random offset).
    pub(super) fn below(floor_ms: u64) -> Self {
        Self {
            ms: floor_ms.saturating_sub(1),
            counter: COUNTER_MAX,
            closed: false,
        }
    }
}

/// Consecutive counters of one millisecond, reserved by one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UuidReservation {
    /// `unix_ts_ms` of every UUID in it.
    pub unix_ms: u64,
    /// The first counter.
    pub first_counter: u64,
    /// How many (at least 1).
    pub count: u64,
}

impl UuidReservation {
    /// The counters, in increasing order.
    pub fn counters(&self) -> std::ops::Range<u64> {
        self.first_counter..self.first_counter + self.count
    }
}

impl Snowflake {
    /// Reserves up to `want` (at least 1) UUID counters of one millisecond
    /// at wall time `now_micros`. `offset` is where a new millisecond's
    /// counter starts: the caller draws it at random; only its value modulo
    /// [`COUNTER_START_LIMIT`](crate::id::uuid::COUNTER_START_LIMIT) is used. May return fewer than asked (the end
    /// of a millisecond); the caller asks again for the rest.
    ///
    /// The millisecond is the logical one: never behind the last UUID's,
    /// never above the high-water mark, carried on through a tolerated
    /// step back and refused through a larger one, exactly like a
    /// snowflake time unit (see the module's rules).
    pub fn reserve_uuids(
        &self,
        now_micros: u64,
        want: u64,
        offset: u64,
    ) -> Result<UuidReservation, GenError> {
        self.reserve_uuid_counters(now_micros, want, offset, COUNTER_BITS)
    }

    /// [`Snowflake::reserve_uuids`] with counters below `2^counter_bits`
    /// (at most [`COUNTER_BITS`]): a hidden UUID's key version takes the
    /// top of the counter field ([`crate::id::hide::UuidHider`]). Each
    /// millisecond starts below `2^(counter_bits - 1)`; a millisecond
    /// whose counters ran out moves on to the next, never wraps. A node
    /// serves one width for its life (the width follows the layout's
    /// hiding, which is fixed), and a narrower maximum only moves the
    /// position on sooner, so positions never repeat whatever the width.
    pub fn reserve_uuid_counters(
        &self,
        now_micros: u64,
        want: u64,
        offset: u64,
        counter_bits: u32,
    ) -> Result<UuidReservation, GenError> {
        let counter_bits = counter_bits.clamp(2, COUNTER_BITS);
        let counter_max: u64 = (1 << counter_bits) - 1;
        let want = want.max(1);
        let offset = offset % (1 << (counter_bits - 1));
        let now = self.units_at_micros(now_micros);
        let wall = self.check_wall(now)?;
        if now > self.layout.max_time() {
            return Err(GenError::TimeExhausted);
        }
        let hwm = self.hwm.load(Ordering::Acquire);
        // The last millisecond the durable mark covers, and the last one
        // the time field can hold.
        let mark_end_ms = self.layout.unix_ms_of(hwm.saturating_add(1)) - 1;
        let field_end_ms = (self.layout.end_ms() - 1).min(TS_MAX);
        let now_ms = (now_micros / 1000).max(self.layout.unix_ms_of(now));
        let wall_ms = now_ms.max(self.layout.unix_ms_of(wall.high));
        let mut last = self.uuid.lock().map_err(|_| GenError::Closed)?;
        if last.closed || self.is_closed() {
            return Err(GenError::Closed);
        }
        let (ms, first_counter) = if last.ms < now_ms {
            (now_ms, offset)
        } else if last.counter < counter_max {
            (last.ms, last.counter + 1)
        } else {
            (last.ms + 1, offset)
        };
        // Borrow milliseconds ahead of the wall clock only where snowflake
        // borrows units: while the logical clock leads every wall reading,
        // or through a tolerated step back.
        let ceiling = if last.ms > wall_ms || wall.stepped_back {
            mark_end_ms
        } else {
            wall_ms.min(mark_end_ms)
        }
        .min(field_end_ms);
        if ms > ceiling {
            return Err(self.refusal(now, wall.high, now_micros, hwm, self.layout.units_at(ms)));
        }
        let count = want.min(counter_max - first_counter + 1);
        last.ms = ms;
        last.counter = first_counter + count - 1;
        Ok(UuidReservation {
            unix_ms: ms,
            first_counter,
            count,
        })
    }

    /// Closes the UUID side and returns the last UUID's millisecond.
    pub(super) fn close_uuids(&self) -> u64 {
        let mut last = match self.uuid.lock() {
            Ok(guard) => guard,
            // A panic while holding it cannot leave a position behind the
            // one issued (it is written after the checks, in one step).
            Err(poisoned) => poisoned.into_inner(),
        };
        last.closed = true;
        last.ms
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use crate::id::uuid::UuidLayout;
    use crate::id::{GenError, Preset, Snowflake, StartPlan, DEFAULT_EPOCH_MS};

    const T0: u64 = DEFAULT_EPOCH_MS + 10_000_000;

    fn generator(now_ms: u64, stored: Option<u64>) -> Snowflake {
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(now_ms)
            .expect("layout");
        let plan = StartPlan::new(&layout, now_ms, stored, 60_000).expect("plan");
        Snowflake::new(layout, 1, 2, 1_000, plan, now_ms + 3_000).expect("generator")
    }

    /// (ms, counter) of every UUID of `n` single reservations.
    fn positions(g: &Snowflake, now_ms: u64, n: u64) -> Vec<(u64, u64)> {
        (0..n)
            .map(|i| {
                let r = g
                    .reserve_uuids(now_ms * 1000, 1, i * 7919)
                    .expect("reserves");
                (r.unix_ms, r.first_counter)
            })
            .collect()
    }

    #[test]
    fn positions_strictly_increase_within_and_across_milliseconds() {
        let g = generator(T0, None);
        let mut all = positions(&g, T0, 1000);
        all.extend(positions(&g, T0 + 1, 1000));
        assert!(all.windows(2).all(|w| w[0] < w[1]), "not increasing");
        assert_eq!(all[0].0, T0);
        assert_eq!(all[1000].0, T0 + 1);
        assert!(
            all[1000].1 < crate::id::uuid::COUNTER_START_LIMIT,
            "offset in the lower half"
        );
    }

    #[test]
    fn a_full_millisecond_moves_on_to_the_next_one_and_never_wraps() {
        let g = generator(T0, None);
        let offset = crate::id::uuid::COUNTER_START_LIMIT - 1;
        let first = g.reserve_uuids(T0 * 1000, u64::MAX, offset).expect("first");
        assert_eq!(first.first_counter + first.count - 1, super::COUNTER_MAX);
        // The wall clock has not moved: the next millisecond is borrowed
        // only because the logical clock is ahead of it (restart rule); a
        // node on a fresh store waits instead.
        match g.reserve_uuids(T0 * 1000, 1, 5) {
            Err(GenError::Exhausted { .. }) => {}
            other => panic!("expected to wait for the next millisecond, got {other:?}"),
        }
        let next = g.reserve_uuids((T0 + 1) * 1000, 1, 5).expect("next ms");
        assert_eq!((next.unix_ms, next.first_counter), (T0 + 1, 5));
    }

    #[test]
    fn a_clock_stepped_back_keeps_uuids_increasing() {
        let g = generator(T0, None);
        let before = positions(&g, T0 + 500, 10);
        // 400 ms back: tolerated (max_backward 1 s); the logical ms carries on.
        let after = positions(&g, T0 + 100, 10);
        assert!(after[0] > before[9]);
        assert!(after.windows(2).all(|w| w[0] < w[1]));
        // Beyond max_backward: refused.
        assert!(matches!(
            g.reserve_uuids((T0 - 2_000) * 1000, 1, 0),
            Err(GenError::ClockStepBack { .. })
        ));
    }

    #[test]
    fn nothing_above_the_mark_and_nothing_after_close() {
        let g = generator(T0, None);
        let r = g
            .reserve_uuids((T0 + 2_000) * 1000, 1, 0)
            .expect("below mark");
        assert!(matches!(
            g.reserve_uuids((T0 + 3_001) * 1000, 1, 0),
            Err(GenError::HwmReached { .. })
        ));
        assert_eq!(g.close(), r.unix_ms, "the final mark covers the last UUID");
        assert_eq!(
            g.reserve_uuids((T0 + 3_000) * 1000, 1, 0),
            Err(GenError::Closed)
        );
    }

    #[test]
    fn a_restart_on_the_final_mark_issues_only_greater_uuids() {
        // The wall clock is behind the last run's UUIDs (they were borrowed
        // ahead); the new run starts above the stored mark all the same.
        let g = generator(T0, None);
        let _ = g.reserve_uuids((T0 + 2_500) * 1000, 1, 0).expect("issue");
        let last = positions(&g, T0 + 2_500, 1)[0];
        let mark = g.close();
        let g2 = generator(T0 + 100, Some(mark));
        let first = positions(&g2, T0 + 100, 1)[0];
        assert!(first > last, "{first:?} <= {last:?}");
    }

    #[test]
    fn threads_racing_never_share_a_position_and_uuids_are_unique() {
        let g = Arc::new(generator(T0, None));
        let layout = UuidLayout::of(g.layout()).expect("fits");
        let node = layout.node(1, 2);
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..5_000u64 {
                        let now = (T0 + i / 1000) * 1000;
                        let r = g.reserve_uuids(now, 3, t * 31 + i).expect("reserve");
                        out.extend(r.counters().map(|c| layout.compose(r.unix_ms, c, node, 0)));
                    }
                    out
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for h in handles {
            let ids = h.join().expect("thread");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "per-thread order");
            for id in ids {
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(seen.len(), 4 * 5_000 * 3);
    }
}
