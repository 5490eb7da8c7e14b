//! Strict mode serving: every call is one durable compare-and-set (Consul)
//! or one group-committed transaction (embedded) on the key's counter, so
//! every value returned is greater than every value returned before it by
//! any node. Nothing is served from memory.
//!
//! A namespace's step is read from the store (set by the admin API; the
//! config's `strict.default_step` otherwise) and cached for
//! [`STEP_CACHE`]; a step change reaches every node within that time.
//! Steps only space the values out, so a node using an old step for a few
//! seconds still returns strictly increasing values.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::id::strict::{Namespace, StrictKey, Values};
use crate::metrics as m;
use crate::store::strict::{StrictLimits, StrictStore};
use crate::store::StoreError;

/// How long a namespace's step is cached.
pub const STEP_CACHE: Duration = Duration::from_secs(10);

/// Cached steps beyond which an insert first drops the expired ones.
const STEP_CACHE_SWEEP_AT: usize = 64;

/// Serves strict mode.
pub struct StrictEngine {
    store: Arc<dyn StrictStore>,
    default_step: u64,
    limits: StrictLimits,
    steps: RwLock<HashMap<Namespace, (u64, Instant)>>,
    issued: metrics::Counter,
}

impl StrictEngine {
    /// Strict mode over `store`; namespaces without a stored step use
    /// `default_step`.
    pub fn new(store: Arc<dyn StrictStore>, default_step: u64) -> Self {
        Self::with_limits(store, default_step, StrictLimits::NONE)
    }

    /// Like [`new`](Self::new); `limits` are the ones `store` enforces,
    /// reported by the admin API.
    pub fn with_limits(
        store: Arc<dyn StrictStore>,
        default_step: u64,
        limits: StrictLimits,
    ) -> Self {
        Self {
            limits,
            store,
            default_step,
            steps: RwLock::new(HashMap::new()),
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => crate::id::Mode::Strict.as_str()),
        }
    }

    /// The store (for the admin API).
    pub fn store(&self) -> &Arc<dyn StrictStore> {
        &self.store
    }

    /// The limits on creating keys.
    pub fn limits(&self) -> StrictLimits {
        self.limits
    }

    /// The step used for `ns` by default.
    pub fn default_step(&self) -> u64 {
        self.default_step
    }

    /// Forgets a cached step (after the admin API changed it here).
    pub fn forget_step(&self, ns: &Namespace) {
        self.steps
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(ns);
    }

    async fn step(&self, ns: Namespace) -> Result<u64, Error> {
        if let Some((step, at)) = self
            .steps
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&ns)
        {
            if at.elapsed() < STEP_CACHE {
                return Ok(*step);
            }
        }
        let step = self
            .store
            .namespace_step(&ns)
            .await?
            .unwrap_or(self.default_step);
        let mut steps = self
            .steps
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Expired entries go when new ones come, so the cache holds only
        // the namespaces used in the last STEP_CACHE, never every one seen.
        if steps.len() >= STEP_CACHE_SWEEP_AT {
            steps.retain(|_, (_, at)| at.elapsed() < STEP_CACHE);
        }
        steps.insert(ns, (step, Instant::now()));
        Ok(step)
    }

    /// Reserves `count` values of `key`, durably, before returning them.
    pub async fn take(&self, key: &str, count: u64) -> Result<Values, Error> {
        let key = StrictKey::parse(key).map_err(StoreError::from)?;
        let step = self.step(key.namespace()).await?;
        let values = self
            .store
            .advance(&key, step, count)
            .await
            .map_err(|e| match e {
                StoreError::Backend(_) | StoreError::Contended(_) => Error::StrictUnavailable {
                    key: key.to_string(),
                    reason: e.to_string(),
                },
                other => other.into(),
            })?;
        self.issued.increment(values.count());
        Ok(values)
    }
}
