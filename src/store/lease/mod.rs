//! Lease tokens and their durable counters (lease mode), on both backends.
//!
//! A node serves lease IDs from blocks of one token's sequence. A
//! [`LeaseTokenStore`] hands out those blocks: it holds a token (taking one
//! first if it has none, and another when the held one is used up) and
//! moves the token's counter forward by the block before it returns the
//! block. A write whose outcome is unknown returns an error and its block
//! is never used; the next reserve re-reads the counter. A wasted block is
//! safe, a block handed out twice is not.
//!
//! - Embedded: the single node owns its whole zone. It starts at the
//!   configured token and moves to the next one when a token is used up.
//!   Counters live in the redb table `lease` (`"<zone>/<token>"` -> the
//!   largest reserved sequence); one fsync'd transaction per block.
//! - Zones: each zone's setting (plain, or hidden with a key) is recorded
//!   once, the first time a node serves it (`lease_zones` table;
//!   `<prefix>/<cluster>/lease-zones/<zone>`), and a node stating another
//!   setting refuses to start ([`crate::id::lease::declare_zone`]).
//! - Consul: `<prefix>/<cluster>/lease/<zone>/<token>` is both the lock and
//!   the counter: its value is a [`LeaseTokenRecord`] (the holder and
//!   `reserved`). The node takes the token with a txn `check-index` (or
//!   `check-not-exists`) + `lock` under its worker session, so taking it
//!   and reading its counter are one atomic step (a token inside its
//!   lock-delay is refused by Consul and passed over for another), and it
//!   moves the counter with the same pair on the ModifyIndex it last saw. Sharing the worker
//!   id's session gives the token the same fencing: when the session is
//!   lost, the node stops issuing both kinds of IDs. A new holder continues
//!   above the stored counter, which already covers every block any
//!   earlier holder may have used.

mod consul;
mod embedded;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use redb::TableDefinition;

use super::StoreError;
use crate::id::lease::Block;

pub use consul::declare_consul_zone;
pub use consul::{ConsulLeaseTokens, LeaseTokenRecord};
pub use embedded::{declare_embedded_zone, EmbeddedLeaseTokens};

/// Where a node's lease blocks come from.
#[async_trait]
pub trait LeaseTokenStore: Send + Sync + 'static {
    /// A short name for logs (`embedded`, `consul`).
    fn backend(&self) -> &'static str;

    /// The zone of every token this source takes.
    fn zone(&self) -> u64;

    /// The token held now, if any.
    fn token(&self) -> Option<u64>;

    /// Reserves the next block of at most `size` sequences, durably, taking
    /// a token first if none is held or the held one is used up.
    async fn reserve(&self, size: u64) -> Result<Block, StoreError>;

    /// Gives the held token back (its counter stays with it). The embedded
    /// store has nothing to give back.
    async fn release(&self) -> Result<(), StoreError>;
}

pub(crate) const LEASE: TableDefinition<&str, u64> = TableDefinition::new("lease");
/// Each lease zone's recorded setting (plain or hidden), JSON
/// [`crate::id::lease::ZoneRecord`]; written once.
/// Keyed by the zone's number as text.
pub(crate) const LEASE_ZONES: TableDefinition<&str, &str> = TableDefinition::new("lease_zones");

fn counter_key(zone: u64, token: u64) -> String {
    format!("{zone}/{token}")
}
