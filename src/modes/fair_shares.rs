//! Fair shares of the snowflake sequence when callers want more than a
//! time unit holds.
//!
//! A time unit holds `2^sequence_bits` positions (4,096 per millisecond by
//! default). While callers want less than that, each takes its positions
//! straight from the generator ([`super::snowflake`]'s fast path). Once a
//! call finds the unit used up, or finds others already waiting, it queues
//! here, and one pump serves the queue by deficit round robin:
//!
//! * each turn a caller gets at most [`FAIR_QUANTUM`] positions, then goes
//!   to the back of the queue;
//! * a turn the unit's end cuts short continues first in the next unit;
//! * a caller that arrives while others wait queues behind them, so a
//!   10-ID call among 1,000-ID ones is served within one round (64
//!   callers x 256 = four units) and large calls finish close together
//!   instead of some starving.
//!
//! The scheduler decides only who gets the next positions, never which
//! positions exist: every one still comes from the generator's one
//! compare-and-set ([`Snowflake::reserve`], bounded by the durable mark,
//! the logical clock, the step-back and layout rules), is appended to
//! exactly one caller's list in the order reserved, and that list is sent
//! once, or dropped with a caller that went away (never handed to another).
//! See docs/SNOWFLAKE.md, "At saturation: fair shares", and rule 26 in
//! docs/SAFETY-RULES-26-ON.md.
//!
//! The queue itself ([`Shares`]) is plain data driven with explicit times,
//! tested without a runtime; [`FairShares`] adds the pump: each pass runs
//! on the gate's ticker thread at the start of a unit ([`UnitJob`]), so a
//! unit is handed out on time even when every runtime worker is busy, and
//! the wait for the next unit happens outside every lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::gate::IssueGate;
use super::ticker::{UnitJob, Wake};
use crate::error::Error;
use crate::id::{Clock, GenError, Snowflake};

/// The most positions one caller gets per turn: small enough that a round
/// over 64 callers spans about four 1 ms units, large enough that a turn
/// costs little next to the IDs it hands out.
pub const FAIR_QUANTUM: u64 = 256;

/// The longest the pump waits for the next unit before it looks again:
/// a closed or fenced generator fails the waiting callers within this.
const RECHECK: Duration = Duration::from_millis(2);

/// One queued caller.
struct Entry<T> {
    ticket: u64,
    generator: Arc<Snowflake>,
    ids: Vec<u64>,
    want: usize,
    /// Positions left in this caller's current turn (0: a new turn).
    credit: u64,
    /// When it last got positions (or queued): `server.max_wait` counts
    /// from here.
    progress_at: Instant,
    reply: T,
}

/// How a pass over the queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassEnd {
    /// Every caller was served (or failed); nobody waits.
    Empty,
    /// The unit is used up: pass again after this long.
    Wait {
        /// Microseconds until the next unit starts.
        retry_after_micros: u64,
    },
}

/// A finished caller: its reply handle and its IDs, or why it failed.
pub type Finished<T> = (T, Result<Vec<u64>, GenError>);

/// The queue of callers waiting for positions, served by deficit round
/// robin (plain data: the caller supplies the times and the lock).
pub struct Shares<T> {
    queue: VecDeque<Entry<T>>,
    next_ticket: u64,
}

impl<T> Default for Shares<T> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            next_ticket: 0,
        }
    }
}

impl<T> Shares<T> {
    /// Queues a caller that holds `ids` (reserved from `generator`
    /// already) and wants `want` in all; returns its ticket.
    pub fn push(
        &mut self,
        generator: Arc<Snowflake>,
        ids: Vec<u64>,
        want: usize,
        reply: T,
        at: Instant,
    ) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.queue.push_back(Entry {
            ticket,
            generator,
            ids,
            want,
            credit: 0,
            progress_at: at,
            reply,
        });
        ticket
    }

    /// How many callers wait.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// When the caller with `ticket` last got positions; `None` once it
    /// left the queue (served, failed or removed).
    pub fn progress_at(&self, ticket: u64) -> Option<Instant> {
        self.queue
            .iter()
            .find(|e| e.ticket == ticket)
            .map(|e| e.progress_at)
    }

    /// Takes the caller with `ticket` out of the queue (it gave up); the
    /// positions it held are dropped with it, never handed to another.
    pub fn remove(&mut self, ticket: u64) -> bool {
        match self.queue.iter().position(|e| e.ticket == ticket) {
            Some(i) => {
                self.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// Empties the queue, returning every caller's reply handle (their
    /// positions are dropped).
    pub fn drain(&mut self) -> Vec<T> {
        self.queue.drain(..).map(|e| e.reply).collect()
    }

    /// Serves the queue at wall time `now_micros` until the unit is used
    /// up or nobody waits. Callers `gone` reports are dropped unserved;
    /// finished ones are appended to `done`.
    pub fn pass(
        &mut self,
        now_micros: u64,
        at: Instant,
        gone: impl Fn(&T) -> bool,
        done: &mut Vec<Finished<T>>,
    ) -> PassEnd {
        loop {
            let Some(front) = self.queue.front_mut() else {
                return PassEnd::Empty;
            };
            if gone(&front.reply) {
                self.queue.pop_front();
                continue;
            }
            if front.credit == 0 {
                front.credit = FAIR_QUANTUM;
            }
            let left = (front.want - front.ids.len()) as u64;
            match front.generator.reserve(now_micros, front.credit.min(left)) {
                Ok(r) => {
                    front.generator.extend_ids(r, &mut front.ids);
                    front.credit -= r.len();
                    front.progress_at = at;
                    if front.ids.len() >= front.want {
                        if let Some(e) = self.queue.pop_front() {
                            done.push((e.reply, Ok(e.ids)));
                        }
                    } else if front.credit == 0 {
                        // Turn over: to the back of the round.
                        if let Some(e) = self.queue.pop_front() {
                            self.queue.push_back(e);
                        }
                    }
                    // Otherwise the unit ran out mid-turn: the next
                    // reserve says how long to wait, and the turn goes on
                    // first in the next unit.
                }
                Err(GenError::Exhausted { retry_after_micros }) => {
                    return PassEnd::Wait { retry_after_micros };
                }
                Err(e) => {
                    if let Some(entry) = self.queue.pop_front() {
                        done.push((entry.reply, Err(e)));
                    }
                }
            }
        }
    }
}

/// Where a queued caller's IDs (or its refusal) arrive.
type Reply = oneshot::Sender<Result<Vec<u64>, Error>>;

struct State {
    shares: Shares<Reply>,
    /// Whether the ticker thread runs passes (it stops when the queue
    /// empties).
    pumping: bool,
}

struct Inner {
    state: Mutex<State>,
    /// The queue's length, for the fast path's lock-free look.
    waiting: AtomicUsize,
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fair-share queue of one snowflake engine and its pump; see the
/// module doc.
pub struct FairShares {
    inner: Arc<Inner>,
}

impl FairShares {
    /// A queue serving from `gate`'s generators, reading `clock`; its
    /// passes run on the gate's ticker thread.
    pub fn new(gate: Arc<IssueGate>, clock: Arc<dyn Clock>) -> Self {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                shares: Shares::default(),
                pumping: false,
            }),
            waiting: AtomicUsize::new(0),
            gate,
            clock,
        });
        let job: Weak<dyn UnitJob> = Arc::downgrade(&inner) as Weak<dyn UnitJob>;
        inner.gate.ticker().add_job(job);
        Self { inner }
    }

    /// Whether nobody waits: then a caller may take positions straight
    /// from the generator (one atomic load).
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.inner.waiting.load(Ordering::Acquire) == 0
    }

    /// Queues a caller holding `ids` from `generator` until it has `want`,
    /// and waits for its shares. Fails with [`Error::WaitTimeout`] after
    /// `max_wait` without progress; dropping the future gives up the place
    /// (the positions it held are lost, never reused).
    pub async fn wait_for(
        &self,
        generator: Arc<Snowflake>,
        ids: Vec<u64>,
        want: usize,
        max_wait: Duration,
    ) -> Result<Vec<u64>, Error> {
        let inner = &self.inner;
        let (tx, mut rx) = oneshot::channel();
        let (ticket, spawn) = {
            let mut st = inner.lock();
            let ticket = st.shares.push(generator, ids, want, tx, Instant::now());
            inner.waiting.store(st.shares.len(), Ordering::Release);
            let spawn = !st.pumping;
            st.pumping = true;
            (ticket, spawn)
        };
        if spawn {
            inner.gate.ticker().run_jobs_now();
        }
        let mut place = Place {
            inner,
            ticket,
            left: false,
        };
        let mut limit = max_wait;
        loop {
            match tokio::time::timeout(limit, &mut rx).await {
                Ok(Ok(result)) => {
                    place.left = true;
                    return result;
                }
                // The reply was dropped unsent: the node stops.
                Ok(Err(_)) => return Err(inner.gate.refusal(GenError::Closed)),
                Err(_) => {}
            }
            let mut st = inner.lock();
            match st.shares.progress_at(ticket) {
                // Served meanwhile: the reply is on its way.
                None => limit = max_wait,
                Some(at) => {
                    let stalled = at.elapsed();
                    if stalled >= max_wait {
                        st.shares.remove(ticket);
                        inner.waiting.store(st.shares.len(), Ordering::Release);
                        place.left = true;
                        return Err(Error::WaitTimeout {
                            waited_ms: stalled.as_millis() as u64,
                        });
                    }
                    limit = max_wait - stalled;
                }
            }
        }
    }
}

/// A caller's place in the queue: a caller that goes away (its call
/// cancelled) leaves it, and the positions it held go with it.
struct Place<'a> {
    inner: &'a Inner,
    ticket: u64,
    left: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.left {
            let mut st = self.inner.lock();
            st.shares.remove(self.ticket);
            self.inner.waiting.store(st.shares.len(), Ordering::Release);
        }
    }
}

/// One pass of the pump, run by the gate's ticker thread at each unit's
/// start: checks the lock deadline first, then hands out the unit's
/// positions; replies are sent outside the lock. Asks to run again when
/// the next unit starts (or after [`RECHECK`]) while anybody waits.
impl UnitJob for Inner {
    fn run(&self) -> Option<Wake> {
        let mut done: Vec<Finished<Reply>> = Vec::new();
        let deadline = self.gate.check_deadline();
        let now = self.clock.now_micros();
        let (end, refused) = {
            let mut st = self.lock();
            if !st.pumping {
                return None;
            }
            let (end, refused) = match deadline {
                Ok(()) => (
                    st.shares
                        .pass(now, Instant::now(), Reply::is_closed, &mut done),
                    Vec::new(),
                ),
                Err(_) => (PassEnd::Empty, st.shares.drain()),
            };
            self.waiting.store(st.shares.len(), Ordering::Release);
            if end == PassEnd::Empty {
                st.pumping = false;
            }
            (end, refused)
        };
        for reply in refused {
            let _ = reply.send(Err(self.gate.fenced_error()));
        }
        for (reply, result) in done {
            let _ = reply.send(result.map_err(|e| self.gate.refusal(e)));
        }
        match end {
            PassEnd::Empty => None,
            PassEnd::Wait { retry_after_micros } => Some(Wake {
                at_micros: now.saturating_add(retry_after_micros),
                limit: RECHECK,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{Preset, StartPlan, SystemClock, DEFAULT_EPOCH_MS};
    use std::collections::HashSet;

    /// A generator starting at `base_ms` with its mark an hour ahead.
    fn generator(base_ms: u64) -> Arc<Snowflake> {
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(base_ms)
            .unwrap();
        let plan = StartPlan::new(&layout, base_ms, None, 0).unwrap();
        Arc::new(Snowflake::new(layout, 0, 1, 1000, plan, base_ms + 3_600_000).unwrap())
    }

    /// Checks a finished caller's IDs: as many as it wanted, strictly
    /// increasing, none seen before, none above the unit served.
    fn check(ids: &[u64], want: usize, seen: &mut HashSet<u64>, g: &Snowflake, unit_ms: u64) {
        assert_eq!(ids.len(), want);
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
        let ceiling = g.layout().max_id_at(unit_ms);
        for &id in ids {
            assert!(
                id <= ceiling,
                "{id} is above the unit served ({unit_ms} ms)"
            );
            assert!(seen.insert(id), "{id} handed out twice");
        }
    }

    #[test]
    fn shares_never_repeat_and_keep_each_callers_ids_increasing() {
        let base = SystemClock.now_millis();
        let g = generator(base);
        let mut rng = fastrand::Rng::with_seed(22);
        let mut shares: Shares<usize> = Shares::default();
        let mut wants = Vec::new();
        let (mut seen, mut done, mut finished) = (HashSet::new(), Vec::new(), 0);
        let at = Instant::now();
        for unit in 0..600u64 {
            // Mixed sizes arrive during the first 150 units, some holding
            // a fast-path prefix already.
            for _ in 0..if unit < 150 { rng.usize(0..5) } else { 0 } {
                let want = [1, 10, 256, 300, 1000, 5000][rng.usize(0..6)];
                let prefix = match g.reserve((base + unit) * 1000, rng.u64(0..want as u64)) {
                    Ok(r) if want > 1 => {
                        let mut v = Vec::new();
                        g.extend_ids(r, &mut v);
                        v
                    }
                    _ => Vec::new(),
                };
                let prefix = prefix.into_iter().take(want - 1).collect();
                wants.push(want);
                shares.push(Arc::clone(&g), prefix, want, wants.len() - 1, at);
            }
            let end = shares.pass((base + unit) * 1000, at, |_| false, &mut done);
            for (i, result) in done.drain(..) {
                check(&result.unwrap(), wants[i], &mut seen, &g, base + unit);
                finished += 1;
            }
            if unit >= 150 && end == PassEnd::Empty {
                break;
            }
        }
        assert!(shares.is_empty(), "{} callers never finished", shares.len());
        assert_eq!(finished, wants.len());
        assert!(wants.len() > 200, "the test must queue many callers");
    }

    /// Closed loop: 63 callers of 1,000 and one of 10, each asking again as
    /// soon as it is served. Returns the latencies, in units, of the large
    /// calls and of the small one.
    fn closed_loop(units: u64) -> (Vec<u64>, Vec<u64>) {
        let base = SystemClock.now_millis();
        let g = generator(base);
        let mut shares: Shares<usize> = Shares::default();
        let at = Instant::now();
        let want = |i: usize| if i == 63 { 10 } else { 1000 };
        let mut since = vec![0u64; 64];
        for i in 0..64 {
            shares.push(Arc::clone(&g), Vec::new(), want(i), i, at);
        }
        let (mut large, mut small, mut seen, mut done) =
            (Vec::new(), Vec::new(), HashSet::new(), Vec::new());
        for unit in 0..units {
            let end = shares.pass((base + unit) * 1000, at, |_| false, &mut done);
            assert_ne!(end, PassEnd::Empty, "the loop keeps the queue busy");
            for (i, result) in done.drain(..) {
                check(&result.unwrap(), want(i), &mut seen, &g, base + unit);
                let latency = unit + 1 - since[i];
                if i == 63 {
                    small.push(latency)
                } else {
                    large.push(latency)
                }
                since[i] = unit + 1;
                shares.push(Arc::clone(&g), Vec::new(), want(i), i, at);
            }
        }
        // Every unit was used in full: the cap, not the scheduler, bounds
        // the rate.
        assert_eq!(seen.len() as u64, {
            let served: u64 = large.len() as u64 * 1000 + small.len() as u64 * 10;
            served
        });
        assert!(seen.len() as u64 >= (units - 1) * 4096 - 64 * 1000);
        (large, small)
    }

    fn quantile(v: &mut [u64], q: f64) -> u64 {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    #[test]
    fn a_small_caller_among_large_ones_is_served_within_one_round() {
        let (mut large, small) = closed_loop(400);
        // One round is 64 turns of at most 256 positions: four units.
        let worst_small = *small.iter().max().unwrap();
        assert!(
            worst_small <= 5,
            "a 10-ID call waited {worst_small} units among 1,000-ID calls"
        );
        // Large calls finish close together: Little's law puts them near
        // 63,010 / 4,096 = 15.4 units, and none starves.
        let (p50, p99) = (quantile(&mut large, 0.5), quantile(&mut large, 0.99));
        assert!(p99 <= 3 * p50, "p99 {p99} units vs p50 {p50}");
        assert!((12..=18).contains(&p50), "p50 {p50} units");
        assert!(large.len() > 63 * 20);
    }

    #[test]
    fn a_cancelled_caller_loses_its_share_and_no_value_reaches_two_callers() {
        let base = SystemClock.now_millis();
        let g = generator(base);
        let mut shares: Shares<usize> = Shares::default();
        let at = Instant::now();
        for i in 0..40 {
            shares.push(Arc::clone(&g), Vec::new(), 1000, i, at);
        }
        let gone: std::cell::RefCell<HashSet<usize>> = Default::default();
        let (mut seen, mut done, mut served) = (HashSet::new(), Vec::new(), HashSet::new());
        for unit in 0..100u64 {
            // After two units every caller holds part of its share; then
            // odd callers go away (their calls cancelled), one removed
            // from the queue, one only noticed by the pass.
            if unit == 2 {
                for i in (1..40).step_by(2) {
                    gone.borrow_mut().insert(i);
                }
                assert!(shares.remove(ticket_of(&shares, 1)));
                assert!(shares.progress_at(ticket_of(&shares, 3)).is_some());
            }
            let is_gone = |i: &usize| gone.borrow().contains(i);
            let end = shares.pass((base + unit) * 1000, at, is_gone, &mut done);
            for (i, result) in done.drain(..) {
                assert!(
                    !gone.borrow().contains(&i),
                    "caller {i} went away yet was served"
                );
                check(&result.unwrap(), 1000, &mut seen, &g, base + unit);
                served.insert(i);
            }
            if end == PassEnd::Empty {
                break;
            }
        }
        assert!(shares.is_empty());
        assert_eq!(served, (0..40).step_by(2).collect::<HashSet<_>>());
        // The remaining twenty got exactly their 20,000 IDs; what the
        // others held went with them.
        assert_eq!(seen.len(), 20_000);
    }

    fn ticket_of(shares: &Shares<usize>, reply: usize) -> u64 {
        shares
            .queue
            .iter()
            .find(|e| e.reply == reply)
            .map(|e| e.ticket)
            .unwrap()
    }

    #[test]
    fn a_refusing_generator_fails_every_waiting_caller() {
        let base = SystemClock.now_millis();
        let g = generator(base);
        let mut shares: Shares<usize> = Shares::default();
        let at = Instant::now();
        for i in 0..10 {
            shares.push(Arc::clone(&g), Vec::new(), 5000, i, at);
        }
        let mut done = Vec::new();
        let end = shares.pass(base * 1000, at, |_| false, &mut done);
        assert!(matches!(end, PassEnd::Wait { .. }));
        assert!(done.is_empty());
        g.close();
        let end = shares.pass((base + 1) * 1000, at, |_| false, &mut done);
        assert_eq!(end, PassEnd::Empty);
        assert_eq!(done.len(), 10);
        assert!(done.iter().all(|(_, r)| r == &Err(GenError::Closed)));
    }
}
