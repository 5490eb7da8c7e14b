//! The worker lock: a worker id claimed in Consul with a session lock,
//! renewed, and given up; the local deadline that fences the node.
//!
//! Key layout under `<prefix>/<cluster>/` (consul/README.md has the full table):
//! `workers/<dc>/<worker>` (the lock, holding [`OwnerInfo`]) and
//! `hwm/<dc>/<worker>` (decimal Unix ms).
//!
//! # Fencing
//! A [`WorkerLock`] keeps a local deadline: the send time of the last
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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::consul::{
    Consistency, ConsulClient, ConsulError, KvWrite, SessionBehavior, SessionSpec,
};
use crate::store::kv_paths::{ClusterPaths, OwnerInfo};
use crate::store::WorkerKey;

/// Lock timing.
#[derive(Debug, Clone, Copy)]
pub struct WorkerLockSettings {
    /// Session TTL (Consul: 10 s to 86400 s).
    pub ttl: Duration,
    /// Lock-delay applied to released keys after invalidation (at most 60 s).
    pub lock_delay: Duration,
    /// Safety margin subtracted from the deadline.
    pub margin: Duration,
}

impl WorkerLockSettings {
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

    /// How long after a renew was sent the lock may be used.
    fn lifetime(&self) -> Duration {
        self.lifetime_limit().saturating_sub(self.margin)
    }
}

impl Default for WorkerLockSettings {
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
pub enum WorkerLockError {
    /// The lock settings are unusable.
    #[error("bad worker lock settings: {0}")]
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
pub struct WorkerLock {
    client: ConsulClient,
    keys: ClusterPaths,
    key: WorkerKey,
    session: String,
    owner: Vec<u8>,
    settings: WorkerLockSettings,
    /// (send time of the last successful renew, local deadline).
    renewed: Mutex<(Instant, Instant)>,
    hook: Mutex<Option<DeadlineHook>>,
}

impl std::fmt::Debug for WorkerLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerLock")
            .field("key", &self.key)
            .field("session", &self.session)
            .field("deadline", &self.deadline())
            .finish()
    }
}

impl WorkerLock {
    /// Creates a session and takes a worker id in `datacenter`: the one
    /// this `owner.instance` held before if it is free, else the lowest free
    /// one in `0..=max_worker`.
    pub async fn claim(
        client: ConsulClient,
        keys: ClusterPaths,
        datacenter: u64,
        max_worker: u64,
        owner: &OwnerInfo,
        settings: WorkerLockSettings,
    ) -> Result<Self, WorkerLockError> {
        let choice = WorkerChoice::Auto { max: max_worker };
        Self::claim_with(client, keys, datacenter, choice, owner, settings).await
    }

    /// Like [`WorkerLock::claim`], choosing the id by `choice`.
    pub async fn claim_with(
        client: ConsulClient,
        keys: ClusterPaths,
        datacenter: u64,
        choice: WorkerChoice,
        owner: &OwnerInfo,
        settings: WorkerLockSettings,
    ) -> Result<Self, WorkerLockError> {
        Self::claim_skipping(client, keys, datacenter, choice, owner, settings, &[]).await
    }

    /// Like [`WorkerLock::claim_with`]; with [`WorkerChoice::Auto`] the ids
    /// in `skip` are passed over (ids already found unusable: their stored
    /// mark is too far ahead of this clock), and when they were the only
    /// free ones the answer is [`WorkerLockError::AllFreePoisoned`].
    pub async fn claim_skipping(
        client: ConsulClient,
        keys: ClusterPaths,
        datacenter: u64,
        choice: WorkerChoice,
        owner: &OwnerInfo,
        settings: WorkerLockSettings,
        skip: &[u64],
    ) -> Result<Self, WorkerLockError> {
        settings.check().map_err(WorkerLockError::Settings)?;
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
                    Ok(false) => Err(WorkerLockError::WorkerHeld { key }),
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
        keys: &ClusterPaths,
        free: &FreeIds<'_>,
        owner: &OwnerInfo,
        session: &str,
        value: &[u8],
    ) -> Result<u64, WorkerLockError> {
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
            return Err(WorkerLockError::AllFreePoisoned {
                datacenter,
                poisoned: skip.to_vec(),
            });
        }
        Err(WorkerLockError::NoFreeWorker {
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
    /// lock's lifetime (the margin is less than half of that min).
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

    /// Renews every [`renew_interval`](Self::renew_interval) until the lock
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
                tracing::error!(worker = %self.key, "worker lock deadline passed without a successful renew");
                return false;
            }
            // A renew that hangs (a partition) must not carry us past the
            // deadline: race it, and the stop signal, against the deadline.
            let renewed = tokio::select! {
                _ = &mut stop => return true,
                r = tokio::time::timeout_at(self.deadline().into(), self.renew()) => r,
            };
            let Ok(renewed) = renewed else {
                tracing::error!(worker = %self.key, "worker lock deadline passed while renewing");
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

    /// Hands a lost lock back: release the lock, and only once that
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(WorkerLockSettings::default().check().is_ok());
        let d = WorkerLockSettings::default();
        let bad = [
            WorkerLockSettings {
                ttl: Duration::from_millis(10_500),
                ..d
            },
            WorkerLockSettings {
                lock_delay: Duration::from_secs(61),
                ..d
            },
            WorkerLockSettings {
                margin: Duration::from_secs(8),
                ..d
            },
            WorkerLockSettings {
                lock_delay: Duration::ZERO,
                ..d
            },
        ];
        for s in bad {
            assert!(s.check().is_err(), "{s:?}");
        }
        // The lock is usable for min(ttl, lock_delay) - margin.
        let s = WorkerLockSettings {
            ttl: Duration::from_secs(30),
            lock_delay: Duration::from_secs(10),
            margin: Duration::from_secs(2),
        };
        assert_eq!(s.lifetime(), Duration::from_secs(8));
    }
}
