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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::ArcSwap;

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
        })
    }

    /// Refuses as [`Error::Fenced`] while the node is fenced or past its
    /// lock deadline: two atomic loads, no clock read.
    #[inline]
    pub fn check(&self) -> Result<(), Error> {
        if self.is_fenced() {
            return Err(Error::Fenced);
        }
        self.check_deadline()
    }

    /// Refuses once the deadline has passed (also checked again within a
    /// snowflake batch after every wait: a batch may span the deadline).
    #[inline]
    pub fn check_deadline(&self) -> Result<(), Error> {
        if self.deadline.passed(self.ticker.coarse().now_ms()) {
            return Err(Error::Fenced);
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

    /// Fencing: marks the node fenced, closes the generator (a call that
    /// already passed the check fails on it) and runs the fence hooks.
    pub fn fence(&self) {
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
        self.fenced.store(false, Ordering::SeqCst);
    }
}
