//! The hide key rings a node issues and decodes with ([`HideKeyRings`]),
//! kept fresh, and the admin operations on them (create, rotate, retire),
//! audited.
//!
//! Rings are loaded from the store and unwrapped with the master key, then
//! published as one immutable map (an atomic pointer swap): a reader sees
//! the whole old map or the whole new one, never a ring half rotated.
//! Every publish that changes a version or a state bumps a
//! [`tokio::sync::watch`] counter, so issuers rebuild their hiders once per
//! change, never per call. Nodes learn rotations: on the embedded store
//! after the admin call itself (this process is the only writer); on
//! Consul through a blocking query on the `hide-keys/` folder
//! ([`HideKeyRings::watch`]), like the format catalog's watch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::metrics as m;
use crate::store::hide_keys::{HideKeyInfo, HideKeyRing, HideKeyState, HideKeyStore, VersionLimit};
use crate::store::StoreError;

/// How long one blocking query for changed key records waits.
pub const WATCH_WAIT: Duration = Duration::from_secs(60);
/// The least time between two queries (after a change, a quiet wake-up or
/// a failure): never a busy loop.
pub const WATCH_GAP: Duration = Duration::from_millis(500);

/// The least time between two re-reads started by calls that named a key
/// this node does not have, or has only retired
/// ([`HideKeyRings::refresh_on_miss`]): a missing key asked for by many
/// callers costs one store read per gap, and each such call waits at most
/// this long for a re-read that started after it came.
pub const MISS_REFRESH_GAP: Duration = Duration::from_secs(1);

/// The tracing target of every audit event (key changes here; decodes of
/// hidden IDs too).
pub const AUDIT_TARGET: &str = "idgen::audit";

type RingMap = HashMap<String, Arc<HideKeyRing>>;

/// Each key id's (version, state) pairs, as last published.
type Shape = Vec<(String, Vec<(u8, HideKeyState)>)>;

/// The current hide key rings by key id: cheap to clone, one atomic load
/// per [`current`](Self::current).
#[derive(Clone)]
pub struct HideKeyRings {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn HideKeyStore>,
    rings: ArcSwap<RingMap>,
    /// What was last published: key id -> (version, state) pairs.
    shape: std::sync::Mutex<Shape>,
    changed: watch::Sender<u64>,
    /// One refresh at a time, so an older read never overwrites a newer.
    refreshing: tokio::sync::Mutex<()>,
    /// The re-reads of calls for a missing or retired key.
    misses: super::miss::MissReloads,
}

impl std::fmt::Debug for HideKeyRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.inner.rings.load().keys().cloned().collect();
        f.debug_struct("HideKeyRings")
            .field("key_ids", &ids)
            .finish()
    }
}

impl HideKeyRings {
    /// Rings over `store`, empty until [`refresh`](Self::refresh).
    pub fn new(store: Arc<dyn HideKeyStore>) -> Self {
        let (changed, _) = watch::channel(0);
        Self {
            inner: Arc::new(Inner {
                store,
                rings: ArcSwap::from_pointee(RingMap::new()),
                shape: std::sync::Mutex::default(),
                changed,
                refreshing: tokio::sync::Mutex::new(()),
                misses: super::miss::MissReloads::new(MISS_REFRESH_GAP),
            }),
        }
    }

    /// Rings over `store`, loaded once: a master key whose fingerprint is
    /// not the one stored with the keys, or a stored key that does not
    /// open with it, is an error here, at start.
    pub async fn load(store: Arc<dyn HideKeyStore>) -> Result<Self, StoreError> {
        store.check_master().await?;
        let rings = Self::new(store);
        rings.refresh().await?;
        Ok(rings)
    }

    /// The current ring of `key_id`, if it exists and could be unwrapped.
    pub fn current(&self, key_id: &str) -> Option<Arc<HideKeyRing>> {
        self.inner.rings.load().get(key_id).cloned()
    }

    /// Whether this node holds the master key (without it no key opens,
    /// and re-reading the store cannot help).
    pub fn has_master(&self) -> bool {
        self.inner.store.has_master()
    }

    /// Whether `key_id` has an active version here (it can hide IDs).
    pub fn issues(&self, key_id: &str) -> bool {
        self.current(key_id).is_some_and(|r| r.active.is_some())
    }

    /// Re-reads the rings for a call that found its key missing or
    /// retired here: created or rotated through another node moments ago,
    /// it is served from that first call instead of after this node's
    /// watch. Such re-reads start at most once per [`MISS_REFRESH_GAP`];
    /// a call inside the gap waits, at most the rest of it, for one that
    /// starts after it came, and every call waiting in one gap shares it.
    pub async fn refresh_on_miss(&self) {
        self.inner
            .misses
            .reload_for(|| async {
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "hide keys not re-read for a call naming a missing key");
                }
            })
            .await;
    }

    /// Re-reads for a call that found its key retired here: one when
    /// none started within [`MISS_REFRESH_GAP`], else none, and never a
    /// wait for the gap. The node knows the key and its refusal; the
    /// re-read only catches a rotation through another node sooner than
    /// the watch (on the embedded store this process is the only writer,
    /// so it never finds one). Waiting the gap, as for a missing key,
    /// held every refused call for about a second (issue 33).
    pub async fn refresh_if_due(&self) {
        self.inner
            .misses
            .reload_if_due(|| async {
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "hide keys not re-read for a call naming a retired key");
                }
            })
            .await;
    }

    /// Whether `key_id` is loaded here with no active version (retired).
    pub fn is_retired(&self, key_id: &str) -> bool {
        self.current(key_id).is_some_and(|r| r.active.is_none())
    }

    /// Re-reads [`refresh_on_miss`](Self::refresh_on_miss) and
    /// [`refresh_if_due`](Self::refresh_if_due) started.
    #[cfg(test)]
    pub(crate) fn miss_refreshes(&self) -> u32 {
        self.inner.misses.started()
    }

    /// Calls that waited for the re-read gap.
    #[cfg(test)]
    pub(crate) fn miss_waits(&self) -> u32 {
        self.inner.misses.waited()
    }

    /// A receiver whose value moves on every change of a ring (a new
    /// version, a state change, a new key id).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// The store the rings are read from.
    pub fn store(&self) -> &Arc<dyn HideKeyStore> {
        &self.inner.store
    }

    /// Reads every key from the store, unwraps it and publishes the new
    /// map at once (bumping [`subscribe`](Self::subscribe) if anything
    /// changed). Without a master key nothing is unwrapped: the map stays
    /// empty and hidden namespaces refuse to issue.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let _one = self.inner.refreshing.lock().await;
        let rings = match self.inner.store.rings().await {
            Ok(r) => r,
            Err(StoreError::HideKey(crate::store::hide_keys::HideKeyError::NoMasterKey)) => {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let shape: Shape = rings
            .iter()
            .map(|r| (r.key_id.clone(), r.states.clone()))
            .collect();
        let (mut active, mut retired) = (0u32, 0u32);
        for r in &rings {
            if r.ring.active.is_some() {
                active += 1;
            } else {
                retired += 1;
            }
        }
        metrics::gauge!(m::HIDE_KEYS, "state" => "active").set(f64::from(active));
        metrics::gauge!(m::HIDE_KEYS, "state" => "retired").set(f64::from(retired));
        let map: RingMap = rings
            .into_iter()
            .map(|r| (r.key_id, Arc::new(r.ring)))
            .collect();
        let mut last = self
            .inner
            .shape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.inner.rings.store(Arc::new(map));
        if *last != shape {
            *last = shape;
            self.inner.changed.send_modify(|n| *n += 1);
        }
        Ok(())
    }

    /// Creates `key_id` (version 0 active), audited as done by `who`.
    pub async fn create(&self, key_id: &str, who: &str) -> Result<HideKeyInfo, StoreError> {
        let info = self.inner.store.create(key_id).await?;
        self.changed_by("create", who, &info).await;
        Ok(info)
    }

    /// Rotates `key_id` (a new active version), audited as done by `who`.
    pub async fn rotate(&self, key_id: &str, who: &str) -> Result<HideKeyInfo, StoreError> {
        self.rotate_within(key_id, who, None).await
    }

    /// [`rotate`](Self::rotate), refused when the new version is above
    /// `limit` (the narrowest field of the namespaces using the key).
    pub async fn rotate_within(
        &self,
        key_id: &str,
        who: &str,
        limit: Option<VersionLimit>,
    ) -> Result<HideKeyInfo, StoreError> {
        let info = self.inner.store.rotate_within(key_id, limit).await?;
        metrics::counter!(m::HIDE_KEY_ROTATIONS, "key_id" => key_id.to_owned()).increment(1);
        self.changed_by("rotate", who, &info).await;
        Ok(info)
    }

    /// Retires `key_id`'s active version, audited as done by `who`.
    pub async fn retire(&self, key_id: &str, who: &str) -> Result<HideKeyInfo, StoreError> {
        let info = self.inner.store.retire(key_id).await?;
        self.changed_by("retire", who, &info).await;
        Ok(info)
    }

    /// Every key id and its versions (never material).
    pub async fn list(&self) -> Result<Vec<HideKeyInfo>, StoreError> {
        self.inner.store.list().await
    }

    /// Audits a change and publishes it on this node at once.
    async fn changed_by(&self, action: &'static str, who: &str, info: &HideKeyInfo) {
        let version = info.versions.last().map(|v| v.version);
        tracing::info!(
            target: "idgen::audit",
            action,
            who,
            key_id = %info.key_id,
            version,
            active = info.active(),
            "hide key {action}"
        );
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, key_id = %info.key_id, "hide key changed but the rings were not reloaded; the watch tries again");
        }
    }

    /// Re-reads the rings whenever the store says the records may have
    /// changed (Consul: a blocking query on `hide-keys/`; the embedded
    /// store: every [`WATCH_WAIT`]), at most once per [`WATCH_GAP`]. Runs
    /// until aborted.
    pub async fn watch(self) {
        let mut index = 0;
        loop {
            let asked = tokio::time::Instant::now();
            match self.inner.store.wait_change(index, WATCH_WAIT).await {
                Ok(next) => {
                    // Consul's index went back (a snapshot restore): start over.
                    index = if next < index { 0 } else { next };
                    if let Err(e) = self.refresh().await {
                        tracing::warn!(error = %e, "hide keys not reloaded; trying again");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "hide key records not read; trying again");
                    index = 0;
                }
            }
            tokio::time::sleep_until(asked + WATCH_GAP).await;
        }
    }
}
