//! The threads Lua rules run on: off the async runtime, a few at a time,
//! each call under a wall-clock deadline.
//!
//! A rule's call can only be stopped between Lua instructions (the count
//! hook, [`crate::id::format::lua_sandbox`]); inside a library function it
//! runs until that returns. The sandbox bounds every library loop it knows
//! of, and this pool is the backstop for the rest, so that one bad rule
//! costs the node one thread, never its async workers:
//!
//! - A call is queued for one of `workers` threads and the async caller
//!   awaits the answer; no tokio worker runs Lua or waits on a rule's gate.
//! - A call still running `deadline` after it started is stopped by the
//!   hook with [`LuaError::Deadline`]. One still running twice the
//!   deadline after it started is stuck in C: its caller answers
//!   [`LuaError::Stuck`] (FAILED_PRECONDITION, naming the rule and the
//!   deadline), the thread is set aside (logged once at ERROR, counted in
//!   `idgen_lua_stuck_calls_total`) and replaced, as long as no more than
//!   `workers` threads are set aside at once; a thread set aside that
//!   comes back takes a free place or ends.
//! - While a rule has a call stuck, its calls fail at once
//!   ([`LuaError::Busy`]) instead of taking a thread to wait on the rule's
//!   gate; after [`QUARANTINE_AFTER`] stuck calls the rule is not run again
//!   ([`LuaError::Quarantined`]) until an update compiles it afresh.
//! - With every thread stuck, or the queue full, or a call queued longer
//!   than [`queue_wait`], calls fail at once with [`LuaError::NoWorker`]
//!   (UNAVAILABLE: another node can serve them) instead of queueing
//!   forever.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::id::format::{Deadline, Format, LuaError, LuaRule};
use crate::metrics as m;

/// Stuck calls after which a rule is not run again.
pub const QUARANTINE_AFTER: u32 = 3;
/// Calls waiting for a thread, at most, per worker.
const QUEUE_PER_WORKER: usize = 256;

/// How long a call may wait in the queue for a thread: ten deadlines, at
/// least a second.
pub fn queue_wait(deadline: Duration) -> Duration {
    (deadline * 10).max(Duration::from_secs(1))
}

/// How the pool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuaPoolSettings {
    /// Threads running rules (`formatted.lua_workers`).
    pub workers: usize,
    /// How long one `create_id` call may run (`formatted.lua_deadline`).
    pub deadline: Duration,
}

impl Default for LuaPoolSettings {
    /// 4 threads, 50 ms.
    fn default() -> Self {
        LuaPoolSettings {
            workers: 4,
            deadline: Duration::from_millis(50),
        }
    }
}

const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const ABANDONED: u8 = 3;

/// One job's progress, shared by its thread and its caller: where it is
/// (queued, running, done, abandoned by its caller) and when the call
/// running now started.
struct Ticket {
    state: AtomicU8,
    /// Nanoseconds after the pool's epoch; 0: between calls.
    call_started_ns: AtomicU64,
}

/// What a job does; it reports each call's start (`true`) and end.
type Work = Box<dyn FnOnce(&dyn Fn(bool)) + Send>;

struct Job {
    ticket: Arc<Ticket>,
    work: Work,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Threads taking jobs.
    live: usize,
    /// Threads set aside, still running a stuck call.
    aside: usize,
    closed: bool,
    spawned: u64,
}

struct Shared {
    settings: LuaPoolSettings,
    epoch: Instant,
    state: Mutex<State>,
    work: Condvar,
}

/// The pool (see the module doc). Dropping it ends its threads once they
/// are idle.
pub struct LuaPool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LuaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaPool")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl LuaPool {
    /// Starts `settings.workers` threads (at least one).
    pub fn new(settings: LuaPoolSettings) -> LuaPool {
        let settings = LuaPoolSettings {
            workers: settings.workers.max(1),
            ..settings
        };
        let shared = Arc::new(Shared {
            settings,
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
        });
        for _ in 0..settings.workers {
            Shared::spawn(&shared);
        }
        LuaPool { shared }
    }

    /// The deadline of one call.
    pub fn deadline(&self) -> Duration {
        self.shared.settings.deadline
    }

    /// Renders `items` (counter value, instant to render at) with the Lua
    /// rule of `format` and the caller's `salt`, on a pool thread.
    pub async fn render(
        &self,
        format: Arc<Format>,
        items: Vec<(u64, i64)>,
        salt: Option<String>,
    ) -> Result<Vec<String>, LuaError> {
        let Some(rule) = format.lua_rule() else {
            return Ok(Vec::new());
        };
        let name = rule.name().to_owned();
        self.admit(rule)?;
        let deadline = self.shared.settings.deadline;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fmt = Arc::clone(&format);
        let work = move |calling: &dyn Fn(bool)| {
            let result = render_items(&fmt, &items, salt.as_deref(), deadline, calling);
            let _ = tx.send(result);
        };
        let ticket = self.shared.enqueue(&name, Box::new(work))?;
        // The watch runs on a task of its own: run in the caller, a caller
        // that left (its client gone) took with it the only code that sees
        // its call stuck, and that call's thread was never set aside nor
        // replaced, nor counted towards quarantine.
        let shared = Arc::clone(&self.shared);
        let watched = name.clone();
        let watch = tokio::spawn(async move {
            match format.lua_rule() {
                Some(rule) => shared.wait(&watched, rule, ticket, rx).await,
                None => Ok(Vec::new()),
            }
        });
        watch.await.unwrap_or_else(|e| {
            Err(LuaError::NoWorker {
                rule: name,
                why: format!("the call's watch ended without an answer: {e}"),
            })
        })
    }

    /// Refuses at once what would only tie a thread up: a quarantined
    /// rule, or one with a call still stuck.
    fn admit(&self, rule: &LuaRule) -> Result<(), LuaError> {
        let stuck = rule.stuck_calls();
        if stuck >= QUARANTINE_AFTER {
            return Err(LuaError::Quarantined {
                rule: rule.name().to_owned(),
                stuck,
            });
        }
        let deadline = self.shared.settings.deadline;
        if rule.running_for().is_some_and(|t| t > deadline) {
            return Err(LuaError::Busy {
                rule: rule.name().to_owned(),
                deadline_ms: deadline.as_millis() as u64,
            });
        }
        Ok(())
    }
}

impl Shared {
    /// Awaits the job's answer, watching its progress: a job queued too
    /// long is withdrawn, a call running past twice the deadline is stuck
    /// and its thread set aside.
    async fn wait(
        self: &Arc<Self>,
        name: &str,
        rule: &LuaRule,
        ticket: Arc<Ticket>,
        mut rx: tokio::sync::oneshot::Receiver<Result<Vec<String>, LuaError>>,
    ) -> Result<Vec<String>, LuaError> {
        let deadline = self.settings.deadline;
        let queued_at = Instant::now();
        loop {
            let now = Instant::now();
            let until = match ticket.state.load(Ordering::Acquire) {
                // Look again once a deadline passed: it may have started.
                QUEUED => (queued_at + queue_wait(deadline)).min(now + deadline),
                _ => match ticket.call_started_ns.load(Ordering::Acquire) {
                    // Between two calls of the batch: look again shortly.
                    0 => now + deadline,
                    ns => self.epoch + Duration::from_nanos(ns) + deadline * 2,
                },
            };
            let wait = until.saturating_duration_since(now);
            match tokio::time::timeout(wait, &mut rx).await {
                Ok(Ok(result)) => return result,
                Ok(Err(_)) => {
                    return Err(LuaError::NoWorker {
                        rule: name.to_owned(),
                        why: "the worker running the call ended without an answer".into(),
                    })
                }
                Err(_) => {}
            }
            if let Some(answer) = self.overdue(name, rule, &ticket, queued_at) {
                // The answer may have come in the meantime.
                return rx.try_recv().unwrap_or(answer);
            }
        }
    }

    /// The answer for a job past its time, if it is (and it is then
    /// abandoned): withdrawn from the queue, or stuck.
    fn overdue(
        self: &Arc<Self>,
        name: &str,
        rule: &LuaRule,
        ticket: &Ticket,
        queued_at: Instant,
    ) -> Option<Result<Vec<String>, LuaError>> {
        let deadline = self.settings.deadline;
        let abandon = |from: u8| {
            ticket
                .state
                .compare_exchange(from, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        };
        match ticket.state.load(Ordering::Acquire) {
            QUEUED if queued_at.elapsed() >= queue_wait(deadline) && abandon(QUEUED) => {
                Some(Err(LuaError::NoWorker {
                    rule: name.to_owned(),
                    why: format!(
                        "every worker stayed busy for {} ms",
                        queue_wait(deadline).as_millis()
                    ),
                }))
            }
            RUNNING => {
                let ns = ticket.call_started_ns.load(Ordering::Acquire);
                let started = self.epoch + Duration::from_nanos(ns);
                if ns == 0 || started.elapsed() < deadline * 2 || !abandon(RUNNING) {
                    return None;
                }
                let stuck = rule.record_stuck();
                self.set_aside(name, stuck);
                Some(Err(LuaError::Stuck {
                    rule: name.to_owned(),
                    deadline_ms: deadline.as_millis() as u64,
                }))
            }
            _ => None,
        }
    }
}

/// Renders each item under its own deadline, telling the pool when each
/// call starts and ends.
fn render_items(
    format: &Format,
    items: &[(u64, i64)],
    salt: Option<&str>,
    deadline: Duration,
    calling: &dyn Fn(bool),
) -> Result<Vec<String>, LuaError> {
    let Some(rule) = format.lua_rule() else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::with_capacity(items.len());
    for (value, at) in items {
        calling(true);
        let id = rule.create_id_until(*value, *at, salt, Some(Deadline::after(deadline)));
        calling(false);
        if let Err(LuaError::Deadline { .. }) = &id {
            metrics::counter!(m::LUA_DEADLINE_EXCEEDED, "format" => rule.name().to_owned())
                .increment(1);
        }
        ids.push(id?);
    }
    Ok(ids)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `work`, refusing when no thread takes jobs or the queue is
    /// full.
    fn enqueue(&self, name: &str, work: Work) -> Result<Arc<Ticket>, LuaError> {
        let ticket = Arc::new(Ticket {
            state: AtomicU8::new(QUEUED),
            call_started_ns: AtomicU64::new(0),
        });
        let mut state = self.lock();
        let refuse = |why: String| LuaError::NoWorker {
            rule: name.to_owned(),
            why,
        };
        if state.live == 0 {
            return Err(refuse(format!(
                "all {} Lua workers are stuck in rules past their deadline; restart the node to get them back",
                state.aside
            )));
        }
        if state.queue.len() >= self.settings.workers * QUEUE_PER_WORKER {
            return Err(refuse(format!(
                "{} calls already wait for a Lua worker",
                state.queue.len()
            )));
        }
        state.queue.push_back(Job {
            ticket: Arc::clone(&ticket),
            work,
        });
        drop(state);
        self.work.notify_one();
        Ok(ticket)
    }

    /// Starts one more thread taking jobs.
    fn spawn(shared: &Arc<Shared>) {
        let mut state = shared.lock();
        state.spawned += 1;
        let n = state.spawned;
        let me = Arc::clone(shared);
        let started = std::thread::Builder::new()
            .name(format!("idgen-lua-{n}"))
            .spawn(move || me.serve());
        match started {
            Ok(_) => state.live += 1,
            Err(e) => tracing::error!(error = %e, "cannot start a Lua worker thread"),
        }
    }

    /// A thread's loop: takes jobs until the pool closes, or until a job
    /// of its was abandoned as stuck and no place is free for it.
    fn serve(self: Arc<Self>) {
        loop {
            let job = {
                let mut state = self.lock();
                loop {
                    if state.closed {
                        state.live -= 1;
                        return;
                    }
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    state = self
                        .work
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            let ticket = Arc::clone(&job.ticket);
            if ticket
                .state
                .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue; // withdrawn by its caller
            }
            let calling = |on: bool| {
                let ns = if on {
                    u64::try_from(self.epoch.elapsed().as_nanos())
                        .unwrap_or(u64::MAX)
                        .max(1)
                } else {
                    0
                };
                ticket.call_started_ns.store(ns, Ordering::Release);
            };
            (job.work)(&calling);
            if ticket
                .state
                .compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
                && !self.come_back()
            {
                return;
            }
        }
    }

    /// A thread set aside returned: it takes a free place (one no
    /// replacement took) or ends. Returns whether it goes on.
    fn come_back(&self) -> bool {
        let mut state = self.lock();
        state.aside -= 1;
        metrics::gauge!(m::LUA_WORKERS_ASIDE).set(state.aside as f64);
        let goes_on = !state.closed && state.live < self.settings.workers;
        if goes_on {
            state.live += 1;
        }
        tracing::warn!(
            goes_on,
            "a Lua worker set aside as stuck came back from its rule"
        );
        goes_on
    }

    /// A thread's call is stuck: it no longer counts as taking jobs, and is
    /// replaced while at most `workers` are set aside.
    fn set_aside(self: &Arc<Self>, rule: &str, stuck: u32) {
        let mut state = self.lock();
        state.live -= 1;
        state.aside += 1;
        let aside = state.aside;
        let replace = !state.closed && aside <= self.settings.workers;
        drop(state);
        metrics::counter!(m::LUA_STUCK_CALLS, "format" => rule.to_owned()).increment(1);
        metrics::gauge!(m::LUA_WORKERS_ASIDE).set(aside as f64);
        tracing::error!(
            format = rule,
            deadline_ms = self.settings.deadline.as_millis() as u64,
            stuck_calls_of_rule = stuck,
            threads_aside = aside,
            replaced = replace,
            "a Lua rule's call is stuck past its deadline inside a library function; its thread is set aside{}",
            if stuck >= QUARANTINE_AFTER { " and the rule is quarantined until it is updated" } else { "" }
        );
        if replace {
            Shared::spawn(self);
        }
    }
}

impl Drop for LuaPool {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::format::{FormatDef, LuaLimits, Reset};

    fn stalling(name: &str, ms: u64) -> Arc<Format> {
        crate::id::format::lua_sandbox::allow_test_stall();
        let mut def = FormatDef::template(name, "", "UTC", Reset::Never);
        def.template = None;
        def.reset = None;
        def.lua = Some(format!(
            "function min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt)\n  if salt == 'stall' then __test_stall({ms}) end\n  return string.format('%04d', counter)\nend\n"
        ));
        Arc::new(Format::compile(def, 0, LuaLimits::default()).unwrap())
    }

    /// Waits (bounded by count) until no call of `format`'s rule runs.
    async fn until_idle(format: &Format) {
        let rule = format.lua_rule().unwrap();
        for _ in 0..1_000 {
            if rule.running_for().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the stalled call never returned");
    }

    /// A caller that leaves while its call is stuck (its client gone)
    /// leaves the watch running: the stuck call is counted and its thread
    /// set aside and replaced, so another rule is served. Before, the
    /// watch went with the caller: the only thread stayed stuck, nothing
    /// was counted, and the other rule waited for a worker and failed.
    #[tokio::test]
    async fn a_stuck_call_whose_caller_left_is_still_set_aside() {
        let pool = LuaPool::new(LuaPoolSettings {
            workers: 1,
            deadline: Duration::from_millis(20),
        });
        let format = stalling("left", 1500);
        let call = tokio::spawn({
            let (shared, format) = (Arc::clone(&pool.shared), Arc::clone(&format));
            async move {
                // The same render as LuaPool::render, through a handle that
                // does not close the pool when dropped.
                let pool = std::mem::ManuallyDrop::new(LuaPool { shared });
                pool.render(format, vec![(1, 0)], Some("stall".into()))
                    .await
            }
        });
        let rule = format.lua_rule().unwrap();
        for _ in 0..1_000 {
            if rule.running_for().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            rule.running_for().is_some(),
            "the stalling call never started"
        );
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        let other = stalling("served", 0);
        let ok = pool.render(other, vec![(5, 0)], None).await;
        assert_eq!(ok.unwrap(), ["0005"]);
        assert_eq!(rule.stuck_calls(), 1, "the stuck call was counted");
        until_idle(&format).await;
    }

    /// Each stuck call answers Stuck and costs a thread only until it
    /// returns; the rule serves again after it, and after three stuck
    /// calls it is quarantined: refused at once, without a thread.
    #[tokio::test]
    async fn a_rule_stuck_three_times_is_quarantined() {
        let pool = LuaPool::new(LuaPoolSettings {
            workers: 1,
            deadline: Duration::from_millis(20),
        });
        let format = stalling("stalls", 200);
        let stall = || pool.render(Arc::clone(&format), vec![(1, 0)], Some("stall".into()));
        for n in 1..=QUARANTINE_AFTER {
            let err = stall().await.unwrap_err();
            assert!(
                matches!(err, LuaError::Stuck { ref rule, deadline_ms: 20 } if rule == "stalls"),
                "{err:?}"
            );
            until_idle(&format).await;
            let rule = format.lua_rule().unwrap();
            assert_eq!(rule.stuck_calls(), n);
            if n < QUARANTINE_AFTER {
                let ok = pool.render(Arc::clone(&format), vec![(7, 0)], None).await;
                assert_eq!(ok.unwrap(), ["0007"]);
            }
        }
        let err = pool
            .render(Arc::clone(&format), vec![(8, 0)], None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, LuaError::Quarantined { stuck: 3, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("update the format"), "{err}");
        // Another rule still runs: the threads came back or were replaced,
        // never more than `workers` taking jobs.
        let other = stalling("other", 200);
        let ok = pool.render(other, vec![(1, 0), (2, 0)], None).await;
        assert_eq!(ok.unwrap(), ["0001", "0002"]);
        let state = pool.shared.lock();
        assert_eq!((state.live, state.aside), (1, 0));
    }
}
