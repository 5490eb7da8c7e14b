//! Durable strict counters (strict mode), on both backends.
//!
//! A strict key has one stored number: the last value any node handed out
//! (0 before the first call). [`StrictStore::advance`] turns it into the
//! next values with [`crate::id::strict::advance`] and stores the new last
//! value; the values reach the caller only once that write is durable.
//!
//! # Why a value is never handed out twice
//!
//! Every call reads the counter and writes a larger one in one atomic step
//! (one redb write transaction, or a Consul compare-and-set on the
//! ModifyIndex it read with a quorum-confirmed `?consistent` read), and
//! hands out only values in `(read, written]`. Two calls that succeed on
//! the same key are therefore ordered by the store, and the later one read
//! at least the value the earlier one wrote: the ranges never overlap, and
//! a call that starts after another returned gets larger values. A
//! restart changes nothing, because nothing is kept in memory: the next
//! call reads the stored counter again.
//!
//! A write whose outcome is unknown (a timeout, a dropped connection, a
//! 5xx from Consul, a failed redb commit) fails the call at once and its
//! values are never used. If the write did land after all, the next call
//! reads it and starts above it: a gap, never a repeat. For the same
//! reason a lost compare-and-set race is retried with a fresh read, never
//! with the old one.
//!
//! # Group commit (embedded)
//!
//! An fsync per call would cap a node at a few hundred calls a second, so
//! one committer thread ([`EmbeddedStrictStore`]) takes every request that
//! is waiting, applies them all in one write transaction (requests on the
//! same key in arrival order, each seeing the one before), commits once
//! (redb's default durability: fsync) and only then answers every caller.
//! A request that is invalid or exhausts its key fails alone; a failed
//! commit fails the whole batch, none of whose values were durable.
//!
//! # Consul
//!
//! `<prefix>/<cluster>/strict/<namespace>/<key>` holds the counter as a
//! decimal string, `strict-namespaces/<namespace>` a namespace's step. A
//! node runs one call per key at a time (racing itself would only make it
//! lose compare-and-sets against its own writes); lost races against other
//! nodes are retried with jittered backoff, [`MAX_STRICT_ATTEMPTS`] times
//! in all, and then reported as [`StoreError::Contended`].
//!
//! # Limits and deletes
//!
//! A call on a key that is not live creates it; only then are
//! `strict.max_keys_per_namespace` and `strict.max_namespaces` checked
//! (embedded: against live counts kept in the same transaction, see
//! `store::counts`; Consul: by listing, so concurrent creators on several
//! nodes may overshoot by a few). The admin API deletes a key by moving
//! its last value to a tombstone (`strict_tombstones` table,
//! `strict-deleted/<namespace>/<key>` in Consul) in the same atomic step;
//! a key created again starts from its tombstone, so its values never
//! repeat. Tombstones stay and do not count against the limits.
//!
//! Deleting or lowering a stored counter or tombstone by hand (or by
//! restoring an old backup) makes values repeat; an unreadable one is an
//! error naming the key, never a reset to 0.

mod combine;
mod consul;
mod embedded;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use redb::TableDefinition;

use super::StoreError;
use crate::id::strict::{Namespace, StrictKey, Values};

pub use combine::{MAX_STRICT_ATTEMPTS, MAX_STRICT_BACKOFF};
pub use consul::ConsulStrictStore;
pub use embedded::EmbeddedStrictStore;

/// Strict counters and namespace steps.
#[async_trait]
pub trait StrictStore: Send + Sync + 'static {
    /// Reserves the next `count` values of `key` with `step`, durably
    /// (fsync / quorum) before returning.
    async fn advance(&self, key: &StrictKey, step: u64, count: u64) -> Result<Values, StoreError>;

    /// The key's stored value (0 if never used), strongest consistency.
    async fn current(&self, key: &StrictKey) -> Result<u64, StoreError>;

    /// A namespace's configured step, if one was set.
    async fn namespace_step(&self, ns: &Namespace) -> Result<Option<u64>, StoreError>;

    /// Sets a namespace's step (checked with [`check_step`](crate::id::strict::check_step)).
    async fn set_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError>;

    /// Every namespace with a configured step, sorted by name.
    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError>;

    /// Every namespace with at least one live key, sorted by name: with
    /// [`StrictStore::namespaces`], every namespace in use (most never get
    /// a stored step and count with the default one).
    async fn key_namespaces(&self) -> Result<Vec<Namespace>, StoreError>;

    /// The live keys of `ns` and their last values, sorted by key.
    async fn list_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError>;

    /// The deleted keys of `ns` (tombstones) and the last value each
    /// handed out, which its next use continues above; sorted by key.
    async fn list_tombstones(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError>;

    /// Deletes a live key, leaving a tombstone with its last value
    /// (returned), so the key used again continues above it and frees a
    /// slot of `strict.max_keys_per_namespace`.
    /// [`StrictError::KeyNotFound`](crate::id::strict::StrictError::KeyNotFound) if it is not live.
    async fn delete_key(&self, key: &StrictKey) -> Result<u64, StoreError>;
}

/// Limits on what strict calls may create (config `[strict]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrictLimits {
    /// Most live keys in one namespace (`strict.max_keys_per_namespace`).
    pub max_keys_per_namespace: u64,
    /// Most namespaces with live keys (`strict.max_namespaces`).
    pub max_namespaces: u64,
}

impl StrictLimits {
    /// No limits (tests, tools).
    pub const NONE: Self = Self {
        max_keys_per_namespace: u64::MAX,
        max_namespaces: u64::MAX,
    };

    /// The refusal to create `key`, if `keys_in_ns` live keys of its
    /// namespace and `namespaces` live namespaces exist already.
    fn check(&self, key: &StrictKey, keys_in_ns: u64, namespaces: u64) -> Result<(), StoreError> {
        if keys_in_ns >= self.max_keys_per_namespace {
            return Err(StoreError::Strict(
                crate::store::limit_reached(
                    format!(
                    "strict key {:?} cannot be created (namespace {:?} has {keys_in_ns} live keys)",
                    key.as_str(),
                    key.namespace_str()
                ),
                    self.max_keys_per_namespace,
                    "strict.max_keys_per_namespace",
                )
                .into(),
            ));
        }
        if keys_in_ns == 0 && namespaces >= self.max_namespaces {
            return Err(StoreError::Strict(
                crate::store::limit_reached(
                format!(
                    "strict key {:?} cannot be created (it would start namespace {:?}; {namespaces} namespaces have live keys)",
                    key.as_str(),
                    key.namespace_str()
                ),
                self.max_namespaces,
                "strict.max_namespaces",
            ).into()));
        }
        Ok(())
    }
}

/// Strict counters: `"<namespace>/<key>"` -> the last value handed out.
/// Only live keys: a deleted key moves to [`STRICT_TOMBSTONES`].
pub(crate) const STRICT: TableDefinition<&str, u64> = TableDefinition::new("strict");
/// Deleted strict keys: `"<namespace>/<key>"` -> the last value handed
/// out before the delete. A key used again continues above it.
pub(crate) const STRICT_TOMBSTONES: TableDefinition<&str, u64> =
    TableDefinition::new("strict_tombstones");
/// Namespace steps: `"<namespace>"` -> step.
pub(crate) const STRICT_NAMESPACES: TableDefinition<&str, u64> =
    TableDefinition::new("strict_namespaces");
