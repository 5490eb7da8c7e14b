//! The one check every snowflake, lease and formatted call passes before
//! it is served: whether this node still holds its worker id.
//!
//! An [`IssueGate`] holds what the worker lock decides on the issue path:
//! the generator of the worker id held now (and so the node number
//! formatted mode renders), the fenced flag, and the lock's local
//! deadline on the ticker's coarse clock. The [`Issuer`](super::Issuer)
//! owns it and checks it once per request, after the request itself was
//! checked, for the three modes whose IDs depend on the worker id
//! (segment and strict write every range through a compare-and-set in
//! the store, so a stale node cannot repeat theirs).
//!
//! The cluster supervisor holds the same `Arc<IssueGate>`: it
//! [`fence`](IssueGate::fence)s it the moment the lock may be lost (the
//! generator is closed, and the hooks the engines registered drop their
//! lease and token blocks), moves the [`deadline`](IssueGate::set_deadline)
//! on after every renew, and [`install`](IssueGate::install)s the generator
//! of a re-claimed id, which lifts the fence. A node past its deadline is
//! refused even if the supervisor that would fence it runs late.
//!
//! A fence may carry a reason ([`set_fence_reason`](IssueGate::set_fence_reason)):
//! when an operator changed the cluster layout, refusals say so and are
//! FAILED_PRECONDITION (another node on the old layout is fenced too, so
//! retrying elsewhere does not help) instead of the UNAVAILABLE of a lost
//! lock. The reason changes only the text and code of a refusal: the
//! fenced flag alone decides whether the node issues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::ticker::UnitTicker;
use crate::error::Error;
use crate::id::{Clock, Deadline, Snowflake};

/// What an engine drops when the node is fenced.
type FenceHook = Box<dyn Fn() + Send + Sync>;

/// Whether this node may issue IDs that depend on its worker id; see the
/// module doc.
pub struct IssueGate {
    generator: ArcSwap<Snowflake>,
    fenced: AtomicBool,
    /// The worker lock's deadline on the ticker's coarse clock (cluster
    /// mode; unbounded on the embedded store).
    deadline: Deadline,
    /// Keeps the coarse clock the deadline is compared with; snowflake
    /// mode also waits on it for the next time unit.
    ticker: Arc<UnitTicker>,
    on_fence: Mutex<Vec<FenceHook>>,
    /// Why the node is fenced, when it is not a plain lock loss.
    reason: ArcSwapOption<String>,
}

impl IssueGate {
    /// An open gate over `generator`; starts the ticker thread reading
    /// `clock`.
    pub fn new(generator: Arc<Snowflake>, clock: Arc<dyn Clock>) -> std::io::Result<Self> {
        Ok(Self {
            generator: ArcSwap::new(generator),
            fenced: AtomicBool::new(false),
            deadline: Deadline::unbounded(),
            ticker: Arc::new(UnitTicker::new(clock)?),
            on_fence: Mutex::new(Vec::new()),
            reason: ArcSwapOption::empty(),
        })
    }

    /// Refuses as [`Error::Fenced`] while the node is fenced or past its
    /// lock deadline: two atomic loads, no clock read.
    #[inline]
    pub fn check(&self) -> Result<(), Error> {
        if self.is_fenced() {
            return Err(self.fenced_error());
        }
        self.check_deadline()
    }

    /// The refusal of a fenced node: [`Error::LayoutChanged`] naming the
    /// change when a reason was set, [`Error::Fenced`] (a lost lock)
    /// otherwise.
    pub fn fenced_error(&self) -> Error {
        match self.reason.load_full() {
            Some(reason) => Error::LayoutChanged(reason.as_str().to_owned()),
            None => Error::Fenced,
        }
    }

    /// Why the node is fenced, when it is not a plain lock loss.
    pub fn fence_reason(&self) -> Option<Arc<String>> {
        self.reason.load_full()
    }

    /// Names why the node is fenced (it stays fenced: only
    /// [`install`](Self::install) lifts the fence, and clears this).
    pub fn set_fence_reason(&self, reason: String) {
        self.reason.store(Some(Arc::new(reason)));
    }

    /// Maps a generator refusal to the call's error, naming the fence
    /// (and its reason) when the generator was closed by one.
    pub fn refusal(&self, e: crate::id::GenError) -> Error {
        if e == crate::id::GenError::Closed && self.is_fenced() {
            self.fenced_error()
        } else {
            e.into()
        }
    }

    /// Refuses once the deadline has passed (also checked again within a
    /// snowflake batch after every wait: a batch may span the deadline).
    #[inline]
    pub fn check_deadline(&self) -> Result<(), Error> {
        if self.deadline.passed(self.ticker.coarse().now_ms()) {
            return Err(self.fenced_error());
        }
        Ok(())
    }

    /// Whether the node is fenced (lost its worker id, not yet re-claimed).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// The generator of the worker id held now.
    pub fn generator(&self) -> Arc<Snowflake> {
        self.generator.load_full()
    }

    /// The generator held now, borrowed for one call's issue without
    /// touching its reference count (shared by every thread: the unary
    /// path's hottest cache line otherwise).
    #[inline]
    pub fn current(&self) -> arc_swap::Guard<Arc<Snowflake>> {
        self.generator.load()
    }

    /// This node's number (datacenter and worker id) as formatted mode
    /// renders it.
    pub fn node_number(&self) -> u64 {
        self.generator.load().node_number()
    }

    /// The ticker whose coarse clock the deadline is kept on.
    pub fn ticker(&self) -> &Arc<UnitTicker> {
        &self.ticker
    }

    /// Calls `hook` whenever the node is fenced (an engine dropping the
    /// blocks it holds under the lost worker id).
    pub fn on_fence(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.on_fence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(hook));
    }

    /// Fencing: marks the node fenced (with no reason yet), closes the
    /// generator (a call that already passed the check fails on it) and
    /// runs the fence hooks.
    pub fn fence(&self) {
        // A new fence is a plain lock loss until the supervisor names it.
        self.reason.store(None);
        self.fenced.store(true, Ordering::SeqCst);
        self.generator.load().close();
        for hook in self
            .on_fence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            hook();
        }
    }

    /// Closes the generator without fencing (the state file is gone:
    /// calls fail with the state file's error, checked before the gate).
    pub fn close(&self) {
        self.generator.load().close();
    }

    /// Sets the worker lock's deadline: past `at`, calls are refused as
    /// fenced until a later deadline is set.
    pub fn set_deadline(&self, at: Instant) {
        self.deadline.set(self.ticker.coarse().deadline_at(at));
    }

    /// Puts a new generator (above every earlier ID) in place of a closed
    /// one and lifts the fence.
    pub fn install(&self, generator: Arc<Snowflake>) {
        self.generator.store(generator);
        self.reason.store(None);
        self.fenced.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::id::{Preset, StartPlan, SystemClock, DEFAULT_EPOCH_MS};

    fn generator() -> Arc<Snowflake> {
        let now_ms = SystemClock.now_millis();
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(now_ms)
            .unwrap();
        let plan = StartPlan::new(&layout, now_ms, None, 0).unwrap();
        Arc::new(Snowflake::new(layout, 0, 1, 1000, plan, now_ms + 600_000).unwrap())
    }

    fn gate() -> IssueGate {
        IssueGate::new(generator(), Arc::new(SystemClock)).unwrap()
    }

    #[test]
    fn a_fence_reason_changes_the_refusal_not_the_fence() {
        let g = gate();
        // A reason on an open gate refuses nothing.
        g.set_fence_reason("layout changed".into());
        assert!(g.check().is_ok());
        g.fence();
        let plain = g.check().unwrap_err();
        assert!(matches!(plain, Error::Fenced), "{plain:?}");
        assert_eq!(plain.kind(), ErrorKind::Unavailable);
        g.set_fence_reason("the cluster layout changed from A to B".into());
        let named = g.check().unwrap_err();
        assert_eq!(named.kind(), ErrorKind::Precondition);
        assert!(named.to_string().contains("changed from A to B"), "{named}");
        // Still fenced: the generator is closed whatever the reason says.
        assert!(g.is_fenced());
        assert!(g.generator().next_id(SystemClock.now_micros()).is_err());
        // A re-claim lifts the fence and forgets the reason.
        g.install(generator());
        assert!(g.check().is_ok());
        assert!(g.fence_reason().is_none());
        g.fence();
        assert!(matches!(g.check(), Err(Error::Fenced)));
    }
}
