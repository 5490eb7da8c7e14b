//! The one Consul compare-and-set loop every counter write goes through
//! (segment takes, strict calls, format counter reservations).
//!
//! Each attempt plans its write from a read ([`CasWrite::plan`]: the txn
//! ops, with a `cas` on the ModifyIndex the read returned); the loop then
//! checks the cluster's Consul index ([`ClusterPaths::before_write`]: not
//! below the highest this node saw, no regression record), appends the
//! record's `check-not-exists` and this node's mark check
//! ([`ClusterPaths::mark_check`]), and sends the txn. Why a counter never repeats a value or goes back:
//!
//! - **Committed**: the write is durable and was made on the index the
//!   plan read, so no other write came in between; the values reach the
//!   caller only now, and what was written is remembered
//!   ([`WrittenValues`](super::regression::WrittenValues)) so a later read
//!   below it is a rolled-back store, never a counter to issue from.
//! - **Rolled back**: nothing was written. A refusal that retrying cannot
//!   help ([`CasWrite::refused`]: a lost lock, an ACL denial) ends the
//!   call. A failed mark check means this node's own mark moved (its
//!   keeper wrote, or a snapshot restore put it back): the mark is read
//!   again (a mark below what this node wrote is
//!   [`StoreError::Regressed`]) and the write is planned again at once.
//!   Otherwise another node won the race: the next attempt plans from a
//!   fresh read after a jittered pause, never from the old one.
//! - **Unknown outcome** (timeout, dropped connection, 5xx): the call fails
//!   at once and what it planned is never used; if the write landed after
//!   all, the next call reads it and starts above it (a gap, never a
//!   repeat).
//!
//! After [`CasPolicy::attempts`] lost races the call fails with
//! [`CasWrite::contended`]'s error ([`StoreError::Contended`]).

use std::time::Duration;

use async_trait::async_trait;

use super::kv_paths::ClusterPaths;
use super::regression::Level;
use super::StoreError;
use crate::consul::{ConsulClient, ConsulError, KvEntry, TxnError, TxnOp, TxnOutcome};

/// How many times a write that keeps losing races is tried, and the
/// longest pause between two attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasPolicy {
    /// Attempts in all (lost races; a mark re-read does not count as a
    /// pause but does use an attempt).
    pub attempts: u32,
    /// The cap of the jittered pause after a lost race.
    pub max_pause: Duration,
}

impl CasPolicy {
    /// A random pause after losing attempt `attempt` (0-based): full
    /// jitter over a cap that doubles from 5 ms, at most `max_pause`.
    pub fn pause(&self, attempt: u32) -> Duration {
        let cap = (5u64 << attempt.min(5)).min(self.max_pause.as_millis() as u64);
        Duration::from_millis(fastrand::u64(0..=cap))
    }
}

/// One attempt's write, planned from a read.
#[derive(Debug)]
pub struct Attempt<T> {
    /// The txn ops (checks and the `cas`); the loop appends the mark check.
    pub ops: Vec<TxnOp>,
    /// The counter key the write moves.
    pub key: String,
    /// The level written there, remembered once the write commits.
    pub level: Level,
    /// What the caller gets once the write is durable.
    pub value: T,
    /// Whether the plan read the store (then the cluster's index is
    /// checked before the write, [`ClusterPaths::before_write`]); `false`
    /// for a plan on this node's own cached write.
    pub read: bool,
}

/// One counter write, as the loop needs it.
#[async_trait]
pub trait CasWrite: Send + Sync {
    /// What a committed write hands to the caller (a range, values...).
    type Output: Send;

    /// Reads what the write depends on and plans it. Called once per
    /// attempt: after a lost race it must read again (or use a read made
    /// after the race), never reuse the last plan.
    async fn plan(&self) -> Result<Attempt<Self::Output>, StoreError>;

    /// A rolled-back txn that retrying cannot help, as the error to
    /// return; `None` to go on (the default).
    fn refused(&self, ops: &[TxnOp], errors: &[TxnError]) -> Option<StoreError> {
        let _ = (ops, errors);
        None
    }

    /// The txn rolled back and will be planned again: drop what the plan
    /// cached. `mark_moved`: only this node's mark check failed.
    fn lost(&self, mark_moved: bool) {
        let _ = mark_moved;
    }

    /// The write committed, with the txn's results (new ModifyIndexes).
    fn committed(&self, attempt: &Attempt<Self::Output>, results: &[KvEntry]) {
        let _ = (attempt, results);
    }

    /// The error for a write whose outcome is unknown.
    fn unknown(&self, e: ConsulError) -> StoreError;

    /// The error after `attempts` lost races in a row.
    fn contended(&self, attempts: u32) -> StoreError;
}

/// Runs `write` until it commits, is refused, fails, or loses
/// `policy.attempts` races (see the module doc for why this never repeats
/// a value).
pub async fn compare_and_set<W: CasWrite>(
    client: &ConsulClient,
    keys: &ClusterPaths,
    policy: CasPolicy,
    write: &W,
) -> Result<W::Output, StoreError> {
    for attempt in 0..policy.attempts {
        let mut planned = write.plan().await?;
        // After the plan's reads: the cluster's index and record.
        let guards = keys
            .before_write(client, &planned.key, planned.read)
            .await?;
        planned.ops.extend(guards);
        match client.txn(&planned.ops).await {
            Ok(TxnOutcome::Committed(results)) => {
                keys.written().wrote(&planned.key, planned.level);
                keys.index().committed(&results);
                write.committed(&planned, &results);
                return Ok(planned.value);
            }
            Ok(TxnOutcome::RolledBack(errors)) => {
                if keys.record_failed(&planned.ops, &errors) {
                    write.lost(false);
                    return Err(keys.refused_by_record(&planned.key).await);
                }
                if let Some(refusal) = write.refused(&planned.ops, &errors) {
                    return Err(refusal);
                }
                let mark_moved = keys.mark_failed(&planned.ops, &errors);
                write.lost(mark_moved);
                if mark_moved {
                    // This node's mark moved: its keeper, or a restore.
                    keys.recheck_mark(client).await?;
                    continue;
                }
                if attempt + 1 < policy.attempts {
                    tokio::time::sleep(policy.pause(attempt)).await;
                }
            }
            Err(e) => return Err(write.unknown(e)),
        }
    }
    Err(write.contended(policy.attempts))
}
