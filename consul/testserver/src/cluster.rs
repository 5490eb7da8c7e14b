//! The state every agent of one datacenter shares, and the only place
//! that locks it; and the federation that links datacenters (`?dc=`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{watch, Notify};

use crate::acl::{Access, AclTable, Policy};
use crate::config::Config;
use crate::counters::RequestCounters;
use crate::faults::FaultTable;
use crate::latency::Latency;
use crate::state::ClusterState;

/// The datacenters of one emulator process, as Consul's WAN federation
/// links them: each is its own [`Cluster`] (KV, sessions, catalog, raft
/// index), and a request with `?dc=NAME` is served by NAME's state. ACL
/// tokens are shared, as Consul replicates them from the primary.
#[derive(Debug)]
pub(crate) struct Federation {
    /// The datacenter every agent reports as `PrimaryDatacenter`.
    pub(crate) primary: String,
    /// Weak: a datacenter whose handles are all gone is unreachable, not
    /// kept alive by its peers.
    datacenters: Mutex<BTreeMap<String, Weak<Cluster>>>,
    acl: Mutex<AclTable>,
}

/// Why a `?dc=` request cannot reach its datacenter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteError {
    /// No datacenter of that name is linked (Consul's `ErrNoDCPath`).
    NoPath,
    /// It is linked, but no server answers: WAN-partitioned or shut down
    /// (Consul's `ErrDCNotAvailable`).
    Unreachable,
}

impl Federation {
    pub(crate) fn new(primary: &str, acl_master_token: Option<String>) -> Self {
        Federation {
            primary: primary.to_owned(),
            datacenters: Mutex::new(BTreeMap::new()),
            acl: Mutex::new(AclTable::new(acl_master_token)),
        }
    }

    /// Links `cluster` under its name; false if the name is taken.
    pub(crate) fn link(&self, cluster: &Arc<Cluster>) -> bool {
        let mut dcs = self
            .datacenters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if dcs
            .get(&cluster.datacenter)
            .is_some_and(|weak| weak.strong_count() > 0)
        {
            return false;
        }
        dcs.insert(cluster.datacenter.clone(), Arc::downgrade(cluster));
        true
    }

    /// Every linked datacenter's name, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        self.datacenters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// The running datacenter named `name`, partitioned or not.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.datacenters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .and_then(Weak::upgrade)
    }

    /// The datacenter a request from `from` for `?dc=dc` goes to, as
    /// Consul's `forwardDC` finds it (`agent/consul/rpc.go`).
    pub(crate) fn route(&self, from: &Arc<Cluster>, dc: &str) -> Result<Arc<Cluster>, RouteError> {
        if dc.is_empty() || dc == from.datacenter {
            return Ok(Arc::clone(from));
        }
        let target = self
            .datacenters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(dc)
            .cloned()
            .ok_or(RouteError::NoPath)?;
        let target = target.upgrade().ok_or(RouteError::Unreachable)?;
        if from.partitioned() || target.partitioned() || *target.shutdown.borrow() {
            return Err(RouteError::Unreachable);
        }
        Ok(target)
    }
}

/// Shared by every agent listener, handler and background task of one
/// datacenter.
///
/// The state sits behind a `std::sync::Mutex`: every critical section is
/// short and synchronous, and nothing awaits while holding it. Waiters
/// (blocking queries) watch `index` instead, which is published after each
/// write.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) config: Config,
    /// This datacenter's name (`Config.Datacenter` of its agents).
    pub(crate) datacenter: String,
    /// The datacenters this one is linked with, itself included.
    pub(crate) federation: Arc<Federation>,
    /// Cut off from every other datacenter (`Faults::wan_partition`).
    partitioned: AtomicBool,
    state: Mutex<ClusterState>,
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
    pub(crate) fn new(
        config: Config,
        datacenter: &str,
        federation: Arc<Federation>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let mut state = ClusterState::new(config.ttl_expiry_factor);
        state.set_check_reap_interval(config.check_reap_interval, std::time::Instant::now());
        let (index, _) = watch::channel(state.index);
        Cluster {
            latency: Latency::new(config.raft_write_delay, config.consistent_read_delay),
            config,
            datacenter: datacenter.to_owned(),
            federation,
            partitioned: AtomicBool::new(false),
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

    pub(crate) fn partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }

    pub(crate) fn set_partitioned(&self, on: bool) {
        self.partitioned.store(on, Ordering::SeqCst);
    }

    pub(crate) fn resolve_token(&self, token: Option<&str>) -> Option<Access> {
        self.federation
            .acl
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .resolve(token)
    }

    pub(crate) fn add_token(&self, secret: &str, policy: Policy) {
        self.federation
            .acl
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(secret, policy);
    }
}
