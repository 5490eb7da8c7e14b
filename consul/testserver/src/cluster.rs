//! The state every agent of one test cluster shares, and the only place
//! that locks it.

use std::sync::{Mutex, PoisonError};

use tokio::sync::{watch, Notify};

use crate::acl::{Access, AclTable, Policy};
use crate::config::Config;
use crate::counters::RequestCounters;
use crate::faults::FaultTable;
use crate::latency::Latency;
use crate::state::ClusterState;

/// Shared by every agent listener, handler and background task.
///
/// The state sits behind a `std::sync::Mutex`: every critical section is
/// short and synchronous, and nothing awaits while holding it. Waiters
/// (blocking queries) watch `index` instead, which is published after each
/// write.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) config: Config,
    state: Mutex<ClusterState>,
    acl: Mutex<AclTable>,
    index: watch::Sender<u64>,
    /// Wakes the timer task when a deadline may have moved.
    timer_wake: Notify,
    pub(crate) faults: FaultTable,
    pub(crate) counters: RequestCounters,
    /// Turns true (or closes) when the server shuts down.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The Raft write and consistent read latency model.
    pub(crate) latency: Latency,
}

impl Cluster {
    pub(crate) fn new(config: Config, shutdown: watch::Receiver<bool>) -> Self {
        let mut state = ClusterState::new(config.ttl_expiry_factor);
        state.set_check_reap_interval(config.check_reap_interval, std::time::Instant::now());
        let (index, _) = watch::channel(state.index);
        Cluster {
            latency: Latency::new(config.raft_write_delay, config.consistent_read_delay),
            acl: Mutex::new(AclTable::new(config.acl_master_token.clone())),
            config,
            state: Mutex::new(state),
            index,
            timer_wake: Notify::new(),
            faults: FaultTable::default(),
            counters: RequestCounters::default(),
            shutdown,
        }
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&ClusterState) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs a write, publishes the new index to blocking queries and wakes
    /// the timer task (a renew or check update moves deadlines without
    /// moving the index).
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut ClusterState) -> T) -> T {
        let out = self.write_quietly(f);
        self.timer_wake.notify_one();
        out
    }

    /// [`write`](Self::write) without waking the timer task; the timer task
    /// itself uses this, so its own writes do not wake it in a loop.
    pub(crate) fn write_quietly<T>(&self, f: impl FnOnce(&mut ClusterState) -> T) -> T {
        let (out, index) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let out = f(&mut state);
            (out, state.index)
        };
        self.index.send_if_modified(|published| {
            let changed = *published != index;
            *published = index;
            changed
        });
        out
    }

    pub(crate) fn subscribe_index(&self) -> watch::Receiver<u64> {
        self.index.subscribe()
    }

    pub(crate) fn wake_timers(&self) {
        self.timer_wake.notify_one();
    }

    pub(crate) async fn timers_woken(&self) {
        self.timer_wake.notified().await;
    }

    pub(crate) fn resolve_token(&self, token: Option<&str>) -> Option<Access> {
        self.acl
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .resolve(token)
    }

    pub(crate) fn add_token(&self, secret: &str, policy: Policy) {
        self.acl
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(secret, policy);
    }
}
