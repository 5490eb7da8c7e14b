//! The double buffer segment and lease modes serve from (Meituan Leaf's):
//! one span of reserved IDs being handed out, the next one fetched in the
//! background before the first runs out.
//!
//! Pure bookkeeping: no lock, no clock, no I/O. The caller holds it under
//! its own lock, passes the time in, and does the fetching; the buffer
//! says when a fetch is due and makes sure only one is in flight. Every ID
//! leaves through [`DoubleBuffer::take`] or [`DoubleBuffer::take_one`],
//! each of which moves the cursor past what it hands out, so no ID is
//! handed out twice; spans dropped by [`DoubleBuffer::clear`] are gaps.

use std::time::{Duration, Instant};

use super::segment::Range;

/// A reserved span of IDs that a buffer can serve.
pub trait Span {
    /// The IDs it holds, in order.
    fn ids(&self) -> Range;
}

impl Span for Range {
    fn ids(&self) -> Range {
        *self
    }
}

/// When a buffer asks for its next span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// Fetch the next span once this much of the current one is used, in
    /// per mille (segment mode: 100, Leaf's 10%; lease mode: 500).
    pub at_per_mille: u64,
    /// After a failed fetch, the next one waits this long.
    pub retry: Duration,
}

struct Cursor<S> {
    span: S,
    next: u64,
    last: u64,
    len: u64,
    /// When it started serving (Unix ms), for the caller's dynamic sizing.
    since_ms: u64,
}

impl<S: Span> Cursor<S> {
    fn new(span: S, now_ms: u64) -> Self {
        let ids = span.ids();
        Self {
            span,
            next: ids.first,
            last: ids.last,
            len: ids.len(),
            since_ms: now_ms,
        }
    }

    fn left(&self) -> u64 {
        (self.last + 1).saturating_sub(self.next)
    }

    fn prefetch_due(&self, at_per_mille: u64) -> bool {
        let used = u128::from(self.len - self.left());
        used * 1000 >= u128::from(self.len) * u128::from(at_per_mille) || self.left() == 0
    }
}

/// The current span with a cursor, the next span, and whether a fetch is
/// in flight or pausing after a failure.
pub struct DoubleBuffer<S> {
    current: Option<Cursor<S>>,
    next: Option<S>,
    fetching: bool,
    /// No fetch before this, after a failure (monotonic: a wall-clock step
    /// must not stretch the pause).
    retry_after: Option<Instant>,
    /// How long the last span that ran out lasted.
    last_lasted: Option<Duration>,
    policy: Prefetch,
}

impl<S: Span> DoubleBuffer<S> {
    /// An empty buffer: the first [`claim_fetch`](Self::claim_fetch) is due.
    pub fn new(policy: Prefetch) -> Self {
        Self {
            current: None,
            next: None,
            fetching: false,
            retry_after: None,
            last_lasted: None,
            policy,
        }
    }

    /// Moves up to `want - out.len()` IDs into `out`, switching to the next
    /// span when the current one is used up. `now_ms` is read only at a
    /// switch (the common path reads no clock).
    pub fn take(&mut self, want: usize, out: &mut Vec<u64>, now_ms: &mut dyn FnMut() -> u64) {
        while out.len() < want {
            let cur = match &mut self.current {
                Some(c) if c.left() > 0 => c,
                _ => {
                    if !self.promote(now_ms) {
                        break;
                    }
                    continue;
                }
            };
            let n = cur.left().min((want - out.len()) as u64);
            out.extend(cur.next..cur.next + n);
            cur.next += n;
        }
    }

    /// One ID from the current span, if it has one (no switch, no
    /// allocation, no clock read).
    pub fn take_one(&mut self) -> Option<u64> {
        match &mut self.current {
            Some(c) if c.left() > 0 => {
                c.next += 1;
                Some(c.next - 1)
            }
            _ => None,
        }
    }

    /// Makes the next span current when the current one is used up (or
    /// absent); returns whether it did.
    pub fn promote(&mut self, now_ms: &mut dyn FnMut() -> u64) -> bool {
        if self.current.as_ref().is_some_and(|c| c.left() > 0) {
            return false;
        }
        let Some(next) = self.next.take() else {
            return false;
        };
        let now_ms = now_ms();
        if let Some(old) = &self.current {
            self.last_lasted = Some(Duration::from_millis(now_ms.saturating_sub(old.since_ms)));
        }
        self.current = Some(Cursor::new(next, now_ms));
        true
    }

    /// Marks a fetch started and returns true if one is due: the current
    /// span is used enough (or there is none), no next span is held, none
    /// is in flight, and no failure pause is running at `now()`.
    /// `now` is called only during a pause (the common path reads no
    /// clock).
    pub fn claim_fetch(&mut self, now: impl FnOnce() -> Instant) -> bool {
        let at = self.policy.at_per_mille;
        let due = self.current.as_ref().is_none_or(|c| c.prefetch_due(at))
            && self.next.is_none()
            && !self.fetching
            && self.retry_after.is_none_or(|t| now() >= t);
        if due {
            self.fetching = true;
        }
        due
    }

    /// The claimed fetch brought `span`: it is served after the current one.
    pub fn fetched(&mut self, span: S) {
        self.fetching = false;
        self.retry_after = None;
        self.next = Some(span);
    }

    /// The claimed fetch failed at `now`: the next waits for the pause.
    pub fn fetch_failed(&mut self, now: Instant) {
        self.fetching = false;
        self.retry_after = Some(now + self.policy.retry);
    }

    /// Drops both spans (their unused IDs become a gap, never reused).
    pub fn clear(&mut self) {
        self.current = None;
        self.next = None;
    }

    /// Drops both spans and forgets any fetch in flight or pause: a fetch
    /// that lands later must be thrown away by the caller.
    pub fn reset(&mut self) {
        self.clear();
        self.fetching = false;
        self.retry_after = None;
    }

    /// The span being served, if any.
    pub fn current(&self) -> Option<&S> {
        self.current.as_ref().map(|c| &c.span)
    }

    /// IDs left in memory (current and next span).
    pub fn buffered(&self) -> u64 {
        self.current.as_ref().map_or(0, Cursor::left)
            + self.next.as_ref().map_or(0, |s| s.ids().len())
    }

    /// How long the last used-up span lasted, once.
    pub fn take_lasted(&mut self) -> Option<Duration> {
        self.last_lasted.take()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const POLICY: Prefetch = Prefetch {
        at_per_mille: 500,
        retry: Duration::from_millis(500),
    };

    fn r(first: u64, last: u64) -> Range {
        Range { first, last }
    }

    #[test]
    fn an_empty_buffer_claims_one_fetch_and_only_one() {
        let now = Instant::now();
        let mut b = DoubleBuffer::<Range>::new(POLICY);
        assert!(b.claim_fetch(|| now));
        assert!(
            !b.claim_fetch(|| now),
            "a second fetch while one is in flight"
        );
        b.fetched(r(1, 10));
        assert!(!b.claim_fetch(|| now), "a next span is held");
        let mut out = Vec::new();
        b.take(3, &mut out, &mut || 0);
        assert_eq!(out, vec![1, 2, 3]);
        assert!(!b.claim_fetch(|| now), "30% used: not due at 50%");
        b.take(5, &mut out, &mut || 0);
        assert!(b.claim_fetch(|| now), "50% used: due");
    }

    #[test]
    fn spans_are_served_in_order_across_a_switch_and_nothing_twice() {
        let mut b = DoubleBuffer::<Range>::new(POLICY);
        let now = Instant::now();
        let mut seen = HashSet::new();
        let mut last = 0;
        let mut first = 1;
        for round in 0..50u64 {
            if b.claim_fetch(|| now) {
                b.fetched(r(first, first + round % 7));
                first += round % 7 + 1 + round % 3; // gaps between spans are allowed
            }
            let mut out = Vec::new();
            b.take((round % 5 + 1) as usize, &mut out, &mut || round);
            if let Some(id) = b.take_one() {
                out.push(id);
            }
            for id in out {
                assert!(id > last, "{id} after {last}");
                assert!(seen.insert(id), "{id} twice");
                last = id;
            }
        }
        assert!(seen.len() > 100);
    }

    #[test]
    fn a_failed_fetch_pauses_on_the_given_clock() {
        let t0 = Instant::now();
        let mut b = DoubleBuffer::<Range>::new(POLICY);
        assert!(b.claim_fetch(|| t0));
        b.fetch_failed(t0);
        assert!(!b.claim_fetch(|| t0 + Duration::from_millis(499)));
        assert!(b.claim_fetch(|| t0 + Duration::from_millis(500)));
    }

    #[test]
    fn the_time_a_span_lasted_is_measured_at_the_switch() {
        let now = Instant::now();
        let mut b = DoubleBuffer::<Range>::new(POLICY);
        b.fetched(r(1, 2));
        let mut out = Vec::new();
        b.take(2, &mut out, &mut || 1_000);
        assert!(b.claim_fetch(|| now));
        b.fetched(r(3, 4));
        assert_eq!(b.take_lasted(), None, "the first span has not run out");
        b.take(3, &mut out, &mut || 1_750);
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(b.take_lasted(), Some(Duration::from_millis(750)));
        assert_eq!(b.take_lasted(), None);
    }

    #[test]
    fn clear_drops_both_spans_and_reset_forgets_the_fetch_in_flight() {
        let now = Instant::now();
        let mut b = DoubleBuffer::<Range>::new(POLICY);
        assert!(b.claim_fetch(|| now));
        b.fetched(r(1, 100));
        assert_eq!(b.take_one(), None, "take_one never switches spans");
        assert!(b.promote(&mut || 0));
        assert_eq!(b.take_one(), Some(1));
        assert_eq!(b.buffered(), 99);
        b.clear();
        assert_eq!((b.take_one(), b.buffered()), (None, 0));
        assert!(b.claim_fetch(|| now));
        assert!(!b.claim_fetch(|| now));
        b.reset();
        assert!(b.claim_fetch(|| now), "reset forgets the fetch in flight");
    }

    #[test]
    fn the_prefetch_point_holds_for_huge_spans() {
        let now = Instant::now();
        let mut b = DoubleBuffer::<Range>::new(Prefetch {
            at_per_mille: 100,
            ..POLICY
        });
        assert!(b.claim_fetch(|| now));
        b.fetched(r(1, u64::MAX - 1));
        let mut out = Vec::new();
        b.take(1, &mut out, &mut || 0);
        assert!(!b.claim_fetch(|| now), "one ID of 2^64 is far from 10%");
    }
}
