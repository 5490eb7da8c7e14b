//! Durable coordination state, one folder per mode.
//!
//! The generator only trusts a high-water mark once a [`HwmStore`] has
//! said it is durable; every other mode gets its values the same way, from
//! a write its store acknowledged. Each mode's folder (`hwm/`, `segment/`,
//! `lease/`, `strict/`, `format/`) holds its trait in `mod.rs`, the redb
//! impl in `embedded.rs` (the state file, [`embedded`]: one node) and the
//! Consul KV impl in `consul.rs` (KV paths in [`kv_paths`], written through the
//! compare-and-set loop in [`cas`] only while this node holds its worker
//! lock).

pub mod cas;
pub mod cluster_index;
pub mod cluster_layout;
pub(crate) mod counts;
pub mod datacenter_claim;
pub mod embedded;
pub mod fault_hook;
pub mod format;
pub mod hide_keys;
pub mod hwm;
pub mod kv_paths;
pub mod lease;
pub mod regression;
pub mod reopen;
pub mod segment;
pub mod skip_ahead;
pub mod snapshot;
pub mod state_file;
pub mod strict;

use crate::id::{ErrorKind, LimitReached};
use std::fmt;

use thiserror::Error;

pub use embedded::EmbeddedStore;
pub use hwm::{HwmKeeper, HwmStore};
pub use segment::{ConsulSegmentStore, CreateTag, SegmentStore};

/// Identifies one snowflake worker in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerKey {
    /// Datacenter id.
    pub datacenter: u64,
    /// Worker id within the datacenter.
    pub worker: u64,
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.datacenter, self.worker)
    }
}

/// What went wrong in a store: the store's own failures (missing or
/// mismatched state file, backend, contention, lost lock, a rolled-back
/// counter), and each mode's refusals, which the store raises too (a tag
/// that does not exist, a deleted format, a limit reached), carried by one
/// wrapper per mode ([`Self::Segment`], [`Self::Strict`], [`Self::Lease`],
/// [`Self::Format`]) around that mode's pure error in `crate::id`.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The state file does not exist and may not be created implicitly.
    #[error("state file {path} does not exist. It holds this node's snowflake high-water mark and its segment, lease and strict counters; without it the node could hand out IDs it handed out before, so it will not start. To recover, restore the node's mirror if store.mirror_path was set (`idgen state restore <mirror-file> --config <file>`: exact, no margin), else the latest backup: `idgen state restore <backup-file> --config <file> --skip-ahead <margin> --strict-skip-ahead <margin> --format-skip-ahead <margin>`, with margins covering what the node issued after the backup, which the backup cannot know (run it without them first: it prints what the backup knows). Do not run `idgen init` to get past this error: it creates an empty file, which restarts segment, lease and strict counters and repeats their IDs; it is only for a node that has never issued any")]
    Missing {
        /// The path that was looked for.
        path: String,
    },
    /// `idgen init` found a state file already there.
    #[error("state file {path} already exists; refusing to overwrite it (it holds the high-water marks that keep IDs unique)")]
    AlreadyExists {
        /// The path.
        path: String,
    },
    /// The state file was created for another layout.
    #[error("this node's layout differs from the layout its state file {path} was initialised for: {}. Two layouts over one state can repeat IDs, so the node refuses to start. Set [layout] back to the recorded one ({stored}); the embedded store has no in-place layout change", layout_fields(.stored, .configured))]
    LayoutMismatch {
        /// The path.
        path: String,
        /// Layout recorded at init.
        stored: String,
        /// Layout in the config.
        configured: String,
    },
    /// The state file was deleted or replaced while the node was running:
    /// the node stopped issuing for good and never recreates it.
    #[error("state file {path} was {what} while this node was running; it stopped issuing IDs in every mode and will not recreate the file. First save what this node still holds with `idgen state backup <file> --addr <this node's gRPC address>` (a rescue snapshot), stop it, then restore with `idgen state restore <file> --config <file> --skip-ahead <margin>` and start it again; do not run `idgen init` (it restarts segment, lease and strict counters). Meanwhile call another node")]
    StateFileLost {
        /// The path.
        path: String,
        /// What happened to it (`deleted`, `replaced by ...`).
        what: String,
    },
    /// The backend failed (disk, database, network).
    #[error("state store error: {0}")]
    Backend(String),
    /// A segment tag or range request is invalid, or the tag is used up.
    #[error(transparent)]
    Segment(#[from] crate::id::segment::SegmentError),
    /// Too many nodes raced for the same record; nothing was taken.
    #[error("{0}")]
    Contended(String),
    /// The store definitely refused the write because this node no longer
    /// holds the worker id (or the mark changed under it): stop issuing.
    #[error("state store refused the write: {0}")]
    LockLost(String),
    /// A strict key, step or request is invalid, or the key is used up.
    #[error(transparent)]
    Strict(#[from] crate::id::strict::StrictError),
    /// A lease token's sequence is used up, or no token is free.
    #[error(transparent)]
    Lease(#[from] crate::id::lease::LeaseError),
    /// A formatted-mode request or counter refused (bad parameters, a
    /// counter used up in its period, a Lua rule failing...).
    #[error(transparent)]
    Format(#[from] crate::id::format::FormatError),
    /// A hide key operation refused (bad key id, unknown or existing key,
    /// no or wrong master key).
    #[error(transparent)]
    HideKey(#[from] hide_keys::HideKeyError),
    /// A Consul read found a counter below what this node wrote to it: the
    /// store was rolled back (a snapshot restore). Issuing from it could
    /// repeat IDs, so the node refuses until the key is above its write.
    #[error("Consul key {key} holds {stored}, below {wrote} that this node wrote to it itself: the Consul state was rolled back (a snapshot restore?), and issuing from it could repeat {kind} IDs, so this node refuses it. Move every counter forward once with `idgen admin skip-ahead --margin <N>` (N above the number of IDs issued since the snapshot; see docs/BACKUP.md#restoring-a-consul-snapshot); this node resumes by itself once the key is above {wrote}. Meanwhile call another node")]
    Regressed {
        /// The counter's mode (`segment`, `strict`, `lease`, `format`, `hwm`).
        kind: &'static str,
        /// The Consul key.
        key: String,
        /// What the store holds.
        stored: String,
        /// What this node wrote.
        wrote: String,
    },
    /// The Consul index of the cluster's keys is below the highest this
    /// node saw there (or had saved before a restart): the Consul state
    /// was rolled back, and counters other nodes moved since the snapshot
    /// read as they were before.
    #[error("the Consul index of {dir} is {index}, below {seen} that this node already saw there: the Consul state was rolled back (a snapshot restore, or Consul rebuilt empty?), and any counter may now read below what was issued since, so every node refuses segment, strict, lease and formatted IDs (this node wrote the cluster record {dir}regression). Run `idgen admin skip-ahead --margin <N>` once (N above the number of IDs issued since the snapshot; see docs/BACKUP.md#restoring-a-consul-snapshot); nodes resume once it has run. Meanwhile snowflake IDs are still served")]
    IndexWentBack {
        /// `<prefix>/<cluster>/`.
        dir: String,
        /// The index read now.
        index: u64,
        /// The highest index this node had seen.
        seen: u64,
    },
    /// The cluster record of a regression exists: some node read a
    /// counter below its own write, so every node refuses its Consul
    /// counter modes until a skip-ahead deletes the record.
    #[error("Consul key {key} not used: the cluster record {record} says the node holding worker {node} read {found} below what it wrote there itself (the Consul state was rolled back, a snapshot restore?), so every node refuses segment, strict, lease and formatted IDs: issuing could repeat IDs handed out since the snapshot. Run `idgen admin skip-ahead --margin <N>` once (N above the number of IDs issued since the snapshot; see docs/BACKUP.md#restoring-a-consul-snapshot); it deletes the record and nodes resume within one hwm.renew_interval")]
    ClusterRegressed {
        /// The key this call would have read.
        key: String,
        /// The record's Consul key.
        record: String,
        /// The node that detected the regression.
        node: String,
        /// The key it found rolled back.
        found: String,
    },
}

/// A Consul failure as a store failure (beside [`StoreError`], so every
/// Consul-backed store file maps it the same way without importing a
/// sibling).
pub(crate) fn store_err(e: crate::consul::ConsulError) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A redb failure as a store failure (the embedded store and its backups).
pub(super) fn backend_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl StoreError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Segment(e) => e.kind(),
            Self::Lease(e) => e.kind(),
            Self::Strict(e) => e.kind(),
            Self::Format(e) => e.kind(),
            Self::HideKey(e) => e.kind(),
            // Start-up and backend failures: another node can serve.
            Self::Missing { .. }
            | Self::AlreadyExists { .. }
            | Self::LayoutMismatch { .. }
            | Self::StateFileLost { .. }
            | Self::Backend(_)
            | Self::Contended(_)
            | Self::LockLost(_)
            | Self::Regressed { .. }
            | Self::IndexWentBack { .. }
            | Self::ClusterRegressed { .. } => ErrorKind::Unavailable,
        }
    }
}

/// The refusal for `what` past `limit`, counted in
/// `idgen_limit_refusals_total{limit=setting}`; the caller wraps it in its
/// mode's error (`SegmentError::LimitReached`, `StrictError::LimitReached`).
pub(crate) fn limit_reached(what: String, limit: u64, setting: &'static str) -> LimitReached {
    metrics::counter!(crate::metrics::LIMIT_REFUSALS, "limit" => setting).increment(1);
    LimitReached {
        what,
        limit,
        setting,
    }
}

/// The parts of two layout descriptions (`Layout`'s display form, `time
/// 41x1ms / datacenter 5 / ...`) that differ, as "file has X, this node has
/// Y"; the whole descriptions if they do not line up.
fn layout_fields(stored: &str, configured: &str) -> String {
    let a: Vec<&str> = stored.split(" / ").collect();
    let b: Vec<&str> = configured.split(" / ").collect();
    if a.len() != b.len() {
        // Only `layout.hide` adds a part (" / hide ..."): name it.
        let hide = |v: &[&str]| {
            v.iter()
                .find_map(|s| s.strip_prefix("hide "))
                .unwrap_or("off")
                .to_owned()
        };
        let (x, y) = (hide(&a), hide(&b));
        if x != y {
            return format!(
                "layout.hide: the file has {x}, this node has {y} (the file has [{stored}], this node has [{configured}])"
            );
        }
        return format!("the file has [{stored}], this node has [{configured}]");
    }
    a.iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .map(
            |(x, y)| match (x.strip_prefix("hide "), y.strip_prefix("hide ")) {
                (Some(x), Some(y)) => format!("layout.hide: the file has {x}, this node has {y}"),
                _ => format!("the file has {x}, this node has {y}"),
            },
        )
        .collect::<Vec<_>>()
        .join("; ")
}

/// A client of a test Consul at `addr` that never retries, for the stores'
/// unit tests.
#[cfg(test)]
pub(crate) fn test_consul_client(addr: std::net::SocketAddr) -> crate::consul::ConsulClient {
    crate::consul::ConsulClient::new(crate::consul::ConsulConfig {
        address: format!("http://{addr}"),
        retries: 0,
        ..crate::consul::ConsulConfig::default()
    })
    .expect("a client of the test Consul")
}
