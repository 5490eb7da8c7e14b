//! Cluster coordination in Consul: worker-id leases with fencing, and
//! high-water marks in KV that only the lease holder can write.
//!
//! Key layout under `<prefix>/<cluster>/` (consul/README.md has the full table):
//! `workers/<dc>/<worker>` (the lock, holding [`OwnerInfo`]) and
//! `hwm/<dc>/<worker>` (decimal Unix ms).
//!
//! # Fencing
//! A [`WorkerLease`] keeps a local deadline: the send time of the last
//! successful renew + min(TTL, lock-delay) - margin. Consul keeps the lock
//! for at least the TTL after that renew and then applies lock-delay; if
//! the session is destroyed early (by an operator), lock-delay alone holds
//! new holders off, hence the min. So once this node stops issuing at its
//! deadline, a new holder can only start afterwards; and it starts above
//! the stored high-water mark anyway, which this node could only extend
//! while it still held the lock (every write is a txn that checks the
//! session and compare-and-sets the mark, so a delayed write can never
//! land out of order). The session is bound to no node check, so only its
//! TTL or an explicit destroy ends it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::cluster_layout::LayoutGuard;
use super::{StateStore, StoreError, WorkerKey};
use crate::consul::{
    Consistency, ConsulClient, ConsulError, KvWrite, SessionBehavior, SessionSpec, TxnOp,
    TxnOutcome,
};

/// Where a cluster's keys live: `<prefix>/<cluster>/...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterKeys {
    root: String,
}

impl ClusterKeys {
    /// Keys under `<prefix>/<cluster>/`. Both must be `[a-z0-9_-]+`
    /// (prefix may contain `/`), checked by config.
    pub fn new(prefix: &str, cluster: &str) -> Self {
        Self {
            root: format!("{}/{}", prefix.trim_matches('/'), cluster),
        }
    }

    /// The folder of one datacenter's worker locks (with trailing `/`).
    pub fn workers_dir(&self, datacenter: u64) -> String {
        format!("{}/workers/{datacenter}/", self.root)
    }

    /// The lock key of one worker id.
    pub fn worker(&self, key: WorkerKey) -> String {
        format!("{}/workers/{}/{}", self.root, key.datacenter, key.worker)
    }

    /// The record of a segment tag.
    pub fn segment(&self, tag: &str) -> String {
        format!("{}/segments/{tag}", self.root)
    }

    /// The counter of a strict key (`<namespace>/<key>`).
    pub fn strict(&self, key: &str) -> String {
        format!("{}/strict/{key}", self.root)
    }

    /// The tombstone of a deleted strict key (its last value).
    pub fn strict_tombstone(&self, key: &str) -> String {
        format!("{}/strict-deleted/{key}", self.root)
    }

    /// The settings (step) of a strict namespace.
    pub fn strict_namespace(&self, namespace: &str) -> String {
        format!("{}/strict-namespaces/{namespace}", self.root)
    }

    /// The folder of strict namespace settings (with trailing `/`).
    pub fn strict_namespaces_dir(&self) -> String {
        format!("{}/strict-namespaces/", self.root)
    }

    /// The folder of one zone's lease tokens (with trailing `/`).
    pub fn lease_dir(&self, zone: u64) -> String {
        format!("{}/lease/{zone}/", self.root)
    }

    /// The lock and counter of one lease token.
    pub fn lease(&self, zone: u64, token: u64) -> String {
        format!("{}/lease/{zone}/{token}", self.root)
    }

    /// The cluster's layout record.
    pub fn layout(&self) -> String {
        format!("{}/layout", self.root)
    }

    /// The folder of every high-water mark (with trailing `/`).
    pub fn hwm_dir(&self) -> String {
        format!("{}/hwm/", self.root)
    }

    /// The high-water mark key of one worker id.
    pub fn hwm(&self, key: WorkerKey) -> String {
        format!("{}/hwm/{}/{}", self.root, key.datacenter, key.worker)
    }
}

/// What a worker lock's value says about its holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerInfo {
    /// Stable instance id of the node (survives restarts).
    pub instance: String,
    /// The node's gRPC address.
    pub address: String,
    /// When the node claimed the id, Unix ms.
    pub since_ms: u64,
}

/// Lease timing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    /// Session TTL (Consul: 10 s to 86400 s).
    pub ttl: Duration,
    /// Lock-delay applied to released keys after invalidation (at most 60 s).
    pub lock_delay: Duration,
    /// Safety margin subtracted from the deadline.
    pub margin: Duration,
}

impl LeaseSettings {
    /// Checks the settings: whole seconds (Consul's form), a TTL of at
    /// least 1 s, a lock-delay of at most 60 s, and a margin well inside
    /// both. Real Consul refuses TTLs under its `session_ttl_min` (10 s by
    /// default): config validation (`consul.session_ttl`) enforces that
    /// floor, lowered only by the test-only `[testing]` section. The 1 s
    /// here lets store tests run against a test server with a lowered
    /// `session_ttl_min`.
    pub fn check(&self) -> Result<(), String> {
        for (name, d) in [("ttl", self.ttl), ("lock_delay", self.lock_delay)] {
            if d.subsec_nanos() != 0 {
                return Err(format!("{name} must be whole seconds, got {d:?}"));
            }
        }
        if self.ttl < Duration::from_secs(1) || self.ttl > Duration::from_secs(86_400) {
            return Err(format!(
                "ttl must be 1s..86400s (10s or more for a real Consul), got {:?}",
                self.ttl
            ));
        }
        if self.lock_delay > Duration::from_secs(60) {
            return Err(format!(
                "lock_delay must be at most 60s, got {:?}",
                self.lock_delay
            ));
        }
        if self.margin * 2 >= self.lifetime_limit() {
            return Err(format!(
                "margin {:?} must be less than half of min(ttl, lock_delay) = {:?}",
                self.margin,
                self.lifetime_limit()
            ));
        }
        Ok(())
    }

    fn lifetime_limit(&self) -> Duration {
        self.ttl.min(self.lock_delay)
    }

    /// How long after a renew was sent the lease may be used.
    fn lifetime(&self) -> Duration {
        self.lifetime_limit().saturating_sub(self.margin)
    }
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(15),
            lock_delay: Duration::from_secs(15),
            margin: Duration::from_secs(2),
        }
    }
}

/// Why a worker id could not be claimed or kept.
#[derive(Debug, Error)]
pub enum LeaseError {
    /// The lease settings are unusable.
    #[error("bad worker lease settings: {0}")]
    Settings(String),
    /// The configured static worker id is held by another session, or
    /// inside its lock-delay.
    #[error("worker id {key} is held by another node (or inside its lock-delay); choose another node.worker_id, or use consul.worker = \"auto\"")]
    WorkerHeld {
        /// The id asked for.
        key: WorkerKey,
    },
    /// Every worker id of the datacenter is held by a live session.
    #[error("no free worker id in datacenter {datacenter}: all of 0..={max} are held; stop a node, or widen layout.worker_bits")]
    NoFreeWorker {
        /// Datacenter.
        datacenter: u64,
        /// Largest worker id of the layout.
        max: u64,
    },
    /// Every free worker id has a stored high-water mark too far ahead of
    /// this node's clock to start on.
    #[error("no usable worker id in datacenter {datacenter}: every free id ({poisoned:?}) has a stored high-water mark more than clock.max_startup_skew ahead of this node's clock; fix this node's clock (NTP), or wait until it passes the marks")]
    AllFreePoisoned {
        /// Datacenter.
        datacenter: u64,
        /// The free ids that were tried and given back.
        poisoned: Vec<u64>,
    },
    /// Consul failed.
    #[error(transparent)]
    Consul(#[from] ConsulError),
}

/// Which worker id to claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerChoice {
    /// The id this instance held before if it is free, else the lowest free
    /// one in `0..=max`.
    Auto {
        /// Largest worker id of the layout.
        max: u64,
    },
    /// Exactly this id, or fail.
    Static(u64),
}

/// Where an auto claim looks for a free worker id.
#[derive(Clone, Copy)]
struct FreeIds<'a> {
    datacenter: u64,
    max_worker: u64,
    /// Ids found unusable in this claim (mark ahead of the clock).
    skip: &'a [u64],
}

/// Told the new local deadline after every successful renew (the issue
/// path keeps its own copy to check cheaply).
pub type DeadlineHook = Arc<dyn Fn(Instant) + Send + Sync>;

/// A held worker id: the Consul session, the lock and the local deadline.
pub struct WorkerLease {
    client: ConsulClient,
    keys: ClusterKeys,
    key: WorkerKey,
    session: String,
    owner: Vec<u8>,
    settings: LeaseSettings,
    /// (send time of the last successful renew, local deadline).
    renewed: Mutex<(Instant, Instant)>,
    hook: Mutex<Option<DeadlineHook>>,
}

impl std::fmt::Debug for WorkerLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerLease")
            .field("key", &self.key)
            .field("session", &self.session)
            .field("deadline", &self.deadline())
            .finish()
    }
}

impl WorkerLease {
    /// Creates a session and takes a worker id in `datacenter`: the one
    /// this `owner.instance` held before if it is free, else the lowest free
    /// one in `0..=max_worker`.
    pub async fn claim(
        client: ConsulClient,
        keys: ClusterKeys,
        datacenter: u64,
        max_worker: u64,
        owner: &OwnerInfo,
        settings: LeaseSettings,
    ) -> Result<Self, LeaseError> {
        let choice = WorkerChoice::Auto { max: max_worker };
        Self::claim_with(client, keys, datacenter, choice, owner, settings).await
    }

    /// Like [`WorkerLease::claim`], choosing the id by `choice`.
    pub async fn claim_with(
        client: ConsulClient,
        keys: ClusterKeys,
        datacenter: u64,
        choice: WorkerChoice,
        owner: &OwnerInfo,
        settings: LeaseSettings,
    ) -> Result<Self, LeaseError> {
        Self::claim_skipping(client, keys, datacenter, choice, owner, settings, &[]).await
    }

    /// Like [`WorkerLease::claim_with`]; with [`WorkerChoice::Auto`] the ids
    /// in `skip` are passed over (ids already found unusable: their stored
    /// mark is too far ahead of this clock), and when they were the only
    /// free ones the answer is [`LeaseError::AllFreePoisoned`].
    pub async fn claim_skipping(
        client: ConsulClient,
        keys: ClusterKeys,
        datacenter: u64,
        choice: WorkerChoice,
        owner: &OwnerInfo,
        settings: LeaseSettings,
        skip: &[u64],
    ) -> Result<Self, LeaseError> {
        settings.check().map_err(LeaseError::Settings)?;
        let sent = Instant::now();
        let session = client
            .session_create(&SessionSpec {
                name: format!("idgen {}", owner.instance),
                ttl: settings.ttl,
                behavior: SessionBehavior::Release,
                lock_delay: settings.lock_delay,
                // Bound to no node check: only the TTL or a destroy ends it.
                node_checks: Some(vec![]),
                service_checks: vec![],
            })
            .await?;
        let value = serde_json::to_vec(owner).unwrap_or_default();
        let taken = match choice {
            WorkerChoice::Auto { max } => {
                let free = FreeIds {
                    datacenter,
                    max_worker: max,
                    skip,
                };
                Self::take_free_id(&client, &keys, &free, owner, &session, &value).await
            }
            WorkerChoice::Static(worker) => {
                let key = WorkerKey { datacenter, worker };
                match client
                    .kv_put(&keys.worker(key), &value, KvWrite::Acquire(&session))
                    .await
                {
                    Ok(true) => Ok(worker),
                    Ok(false) => Err(LeaseError::WorkerHeld { key }),
                    Err(e) => Err(e.into()),
                }
            }
        };
        match taken {
            Ok(worker) => Ok(Self {
                key: WorkerKey { datacenter, worker },
                renewed: Mutex::new((sent, sent + settings.lifetime())),
                hook: Mutex::new(None),
                client,
                keys,
                session,
                owner: value,
                settings,
            }),
            Err(e) => {
                // Best effort: an orphaned session expires by itself.
                let _ = client.session_destroy(&session).await;
                Err(e)
            }
        }
    }

    async fn take_free_id(
        client: &ConsulClient,
        keys: &ClusterKeys,
        free: &FreeIds<'_>,
        owner: &OwnerInfo,
        session: &str,
        value: &[u8],
    ) -> Result<u64, LeaseError> {
        let FreeIds {
            datacenter,
            max_worker,
            skip,
        } = *free;
        let dir = keys.workers_dir(datacenter);
        let entries = client.kv_list(&dir, Consistency::Consistent).await?;
        let mut held = std::collections::HashSet::new();
        let mut previous = None;
        for e in &entries {
            let Some(id) = e.key.strip_prefix(&dir).and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            if e.session.is_some() {
                held.insert(id);
            } else if serde_json::from_slice::<OwnerInfo>(&e.value)
                .map(|o| o.instance == owner.instance)
                .unwrap_or(false)
            {
                previous = Some(id);
            }
        }
        let candidates = previous
            .into_iter()
            .chain((0..=max_worker).filter(|id| !held.contains(id) && Some(*id) != previous));
        for worker in candidates.filter(|id| *id <= max_worker && !skip.contains(id)) {
            let key = keys.worker(WorkerKey { datacenter, worker });
            // `false`: held by another session or inside its lock-delay.
            if client
                .kv_put(&key, value, KvWrite::Acquire(session))
                .await?
            {
                return Ok(worker);
            }
        }
        if !skip.is_empty() {
            return Err(LeaseError::AllFreePoisoned {
                datacenter,
                poisoned: skip.to_vec(),
            });
        }
        Err(LeaseError::NoFreeWorker {
            datacenter,
            max: max_worker,
        })
    }

    /// The claimed worker id.
    pub fn key(&self) -> WorkerKey {
        self.key
    }

    /// The Consul session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    fn renewed(&self) -> std::sync::MutexGuard<'_, (Instant, Instant)> {
        self.renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn hook(&self) -> Option<DeadlineHook> {
        self.hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Tells `hook` the deadline now and after every successful renew.
    pub fn on_renew(&self, hook: DeadlineHook) {
        hook(self.deadline());
        *self
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hook);
    }

    /// Past this instant the node must not issue with this id.
    pub fn deadline(&self) -> Instant {
        self.renewed().1
    }

    /// Send time of the last successful renew (or of the session create).
    pub fn last_renewed(&self) -> Instant {
        self.renewed().0
    }

    /// How often to renew: a third of min(TTL, lock-delay), which is a
    /// third of the TTL with the defaults and always well inside the
    /// lease's lifetime (the margin is less than half of that min).
    pub fn renew_interval(&self) -> Duration {
        self.settings.lifetime_limit() / 3
    }

    /// Renews the session. `Ok(true)`: the deadline moved to send time +
    /// min(TTL, lock-delay) - margin. `Ok(false)`: the session is gone and
    /// the lock with it; stop issuing at once.
    pub async fn renew(&self) -> Result<bool, ConsulError> {
        let sent = Instant::now();
        match self.client.session_renew(&self.session).await? {
            None => Ok(false),
            Some(_) => {
                let deadline = {
                    let mut r = self.renewed();
                    r.0 = r.0.max(sent);
                    r.1 = r.1.max(sent + self.settings.lifetime());
                    r.1
                };
                if let Some(hook) = self.hook() {
                    hook(deadline);
                }
                Ok(true)
            }
        }
    }

    /// Renews every [`renew_interval`](Self::renew_interval) until the lease
    /// is lost or `stop` completes; a renew is always tried while at least
    /// half of the remaining lifetime is left (also right after a slow
    /// claim).
    /// Returns `true` if stopped while still held, `false` once the deadline
    /// passed or Consul dropped the session (the caller fences at once).
    pub async fn keep_alive(&self, stop: impl std::future::Future<Output = ()>) -> bool {
        tokio::pin!(stop);
        let mut pause = self.renew_interval();
        loop {
            let now = Instant::now();
            let left = self.deadline().saturating_duration_since(now);
            let next = now + pause.min(left / 2);
            tokio::select! {
                _ = &mut stop => return true,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            if Instant::now() >= self.deadline() {
                tracing::error!(worker = %self.key, "worker lease deadline passed without a successful renew");
                return false;
            }
            // A renew that hangs (a partition) must not carry us past the
            // deadline: race it, and the stop signal, against the deadline.
            let renewed = tokio::select! {
                _ = &mut stop => return true,
                r = tokio::time::timeout_at(self.deadline().into(), self.renew()) => r,
            };
            let Ok(renewed) = renewed else {
                tracing::error!(worker = %self.key, "worker lease deadline passed while renewing");
                return false;
            };
            match renewed {
                Ok(true) => pause = self.renew_interval(),
                Ok(false) => {
                    tracing::error!(worker = %self.key, "Consul dropped the session: worker id lost");
                    return false;
                }
                Err(e) => {
                    // Try again soon, well before the deadline.
                    pause = (self.renew_interval() / 5).max(Duration::from_millis(100));
                    tracing::warn!(worker = %self.key, error = %e, "session renew failed; retrying before the deadline");
                }
            }
        }
    }

    /// Hands a lost lease back: release the lock, and only once that
    /// worked, destroy the session (destroying first would put the id
    /// under lock-delay).
    pub async fn hand_back(&self) -> Result<(), ConsulError> {
        let key = self.keys.worker(self.key);
        self.client
            .kv_put(&key, &self.owner, KvWrite::Release(&self.session))
            .await?;
        self.client.session_destroy(&self.session).await
    }

    /// Clean give-up: release the lock (keeping the owner info, so this
    /// instance gets the same id back), then destroy the session, so a
    /// restart can take the id at once without lock-delay.
    pub async fn release(&self) -> Result<(), ConsulError> {
        let key = self.keys.worker(self.key);
        let released = self
            .client
            .kv_put(&key, &self.owner, KvWrite::Release(&self.session))
            .await;
        let destroyed = self.client.session_destroy(&self.session).await;
        released?;
        destroyed
    }
}

/// High-water marks in Consul KV, written only while the worker lock is
/// held by `session` (a txn with `check-session`).
pub struct ConsulHwmStore {
    client: ConsulClient,
    keys: ClusterKeys,
    session: String,
    /// The ModifyIndex each mark had when last read or written (0: absent);
    /// forgotten whenever an outcome is unknown, so the next write re-reads.
    known: Mutex<HashMap<WorkerKey, u64>>,
    /// The cluster layout this node checked at start: every write checks
    /// the record is unchanged, and no mark is read below its floor.
    layout: Option<LayoutGuard>,
}

impl ConsulHwmStore {
    /// A store writing through `lease`'s session.
    pub fn new(client: ConsulClient, keys: ClusterKeys, lease: &WorkerLease) -> Self {
        Self {
            client,
            keys,
            session: lease.session().to_owned(),
            known: Mutex::new(HashMap::new()),
            layout: None,
        }
    }

    /// Ties every mark write to the layout record as `guard` saw it: once
    /// the record changes (an operator changed the cluster's layout) the
    /// next write fails and the node fences itself. Marks read below the
    /// layout's floor are raised to it, so a node on a new layout starts
    /// above every ID of the old one.
    pub fn with_layout(mut self, guard: LayoutGuard) -> Self {
        self.layout = Some(guard);
        self
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<WorkerKey, u64>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the mark and remembers (and returns) its ModifyIndex.
    async fn read(&self, key: WorkerKey) -> Result<(Option<u64>, u64), StoreError> {
        let (entry, _) = self
            .client
            .kv_get(&self.keys.hwm(key), Consistency::Consistent)
            .await
            .map_err(store_err)?;
        let Some(entry) = entry else {
            self.known().insert(key, 0);
            return Ok((None, 0));
        };
        let text = String::from_utf8_lossy(&entry.value);
        let value = text.trim().parse().map_err(|_| {
            StoreError::Backend(format!(
                "{} holds {text:?}, not a decimal high-water mark; fix or delete it by hand",
                entry.key
            ))
        })?;
        self.known().insert(key, entry.modify_index);
        Ok((Some(value), entry.modify_index))
    }
}

fn store_err(e: ConsulError) -> StoreError {
    StoreError::Backend(e.to_string())
}

#[async_trait]
impl StateStore for ConsulHwmStore {
    fn backend(&self) -> &'static str {
        "consul"
    }

    async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError> {
        let stored = self.read(key).await?.0;
        let floor = self
            .layout
            .as_ref()
            .filter(|g| g.floor_ms > 0)
            .map(|g| g.floor_ms - 1);
        Ok(stored.max(floor))
    }

    async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
        let known = self.known().get(&key).copied();
        let index = match known {
            Some(i) => i,
            None => self.read(key).await?.1,
        };
        let hwm_key = self.keys.hwm(key);
        let mut ops = Vec::with_capacity(3);
        if let Some(g) = &self.layout {
            ops.push(TxnOp::CheckIndex {
                key: g.key.clone(),
                index: g.index,
            });
        }
        ops.extend([
            TxnOp::CheckSession {
                key: self.keys.worker(key),
                session: self.session.clone(),
            },
            TxnOp::Cas {
                key: hwm_key.clone(),
                value: hwm_ms.to_string().into_bytes(),
                index,
            },
        ]);
        let outcome = self.client.txn(&ops).await.map_err(|e| {
            // Applied or not, we cannot tell: re-read before the next write.
            self.known().remove(&key);
            store_err(e)
        })?;
        match outcome {
            TxnOutcome::Committed(results) => {
                match results.iter().find(|e| e.key == hwm_key) {
                    Some(e) => self.known().insert(key, e.modify_index),
                    None => self.known().remove(&key),
                };
                Ok(())
            }
            TxnOutcome::RolledBack(errors) => {
                self.known().remove(&key);
                if let Some(g) = self
                    .layout
                    .as_ref()
                    .filter(|_| errors.iter().any(|e| e.op_index == 0))
                {
                    return Err(StoreError::LockLost(format!(
                        "high-water mark not written: the cluster layout record {} changed since this node checked it (generation {}); an operator changed the layout, so this node stops issuing for good: restart it with the cluster's new [layout] (see `idgen admin layout get`)",
                        g.key, g.generation
                    )));
                }
                Err(StoreError::LockLost(format!(
                    "high-water mark not written: this node no longer holds worker {key}, or the mark changed under it ({})",
                    errors
                        .iter()
                        .map(|e| e.what.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(LeaseSettings::default().check().is_ok());
        let d = LeaseSettings::default();
        let bad = [
            LeaseSettings {
                ttl: Duration::from_millis(10_500),
                ..d
            },
            LeaseSettings {
                lock_delay: Duration::from_secs(61),
                ..d
            },
            LeaseSettings {
                margin: Duration::from_secs(8),
                ..d
            },
            LeaseSettings {
                lock_delay: Duration::ZERO,
                ..d
            },
        ];
        for s in bad {
            assert!(s.check().is_err(), "{s:?}");
        }
        // The lease is usable for min(ttl, lock_delay) - margin.
        let s = LeaseSettings {
            ttl: Duration::from_secs(30),
            lock_delay: Duration::from_secs(10),
            margin: Duration::from_secs(2),
        };
        assert_eq!(s.lifetime(), Duration::from_secs(8));
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let k = ClusterKeys::new("idgen/", "prod");
        let w = WorkerKey {
            datacenter: 2,
            worker: 7,
        };
        assert_eq!(k.worker(w), "idgen/prod/workers/2/7");
        assert_eq!(k.hwm(w), "idgen/prod/hwm/2/7");
        assert_eq!(k.workers_dir(2), "idgen/prod/workers/2/");
    }
}
