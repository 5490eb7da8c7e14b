//! Lease tokens of a single node in the embedded state file: table
//! `lease`, `"<zone>/<token>"` -> the largest reserved sequence.

use async_trait::async_trait;
use redb::ReadableTable;

use super::{counter_key, LeaseTokenStore, LEASE, LEASE_ZONES};
use std::sync::Mutex;

use crate::id::lease::{
    check_token, check_zone, declare_zone, Block, LeaseError, TokenCounter, ZoneRecord,
    MAX_SEQUENCE,
};
use crate::store::embedded::{backend_err, blocking, EmbeddedStore};
use crate::store::StoreError;

/// Lease tokens of a single node, in the state file. The node uses only
/// its own range of tokens (see [`crate::id::lease::node_token_range`]),
/// so embedded nodes with distinct worker ids never share one.
#[derive(Clone)]
pub struct EmbeddedLeaseTokens {
    store: EmbeddedStore,
    zone: u64,
    /// The node's own tokens, `first..=last`.
    range: (u64, u64),
    /// The token blocks come from now (starts at the configured one).
    current: std::sync::Arc<Mutex<u64>>,
}

impl EmbeddedLeaseTokens {
    /// Tokens `range.0..=range.1` of `zone`, starting at `first_token`
    /// (inside the range).
    pub fn new(
        store: EmbeddedStore,
        zone: u64,
        first_token: u64,
        range: (u64, u64),
    ) -> Result<Self, StoreError> {
        check_zone(zone)?;
        check_token(first_token)?;
        check_token(range.1)?;
        if !(range.0..=range.1).contains(&first_token) {
            return Err(StoreError::Backend(format!(
                "lease token {first_token} is outside this node's range {} to {}",
                range.0, range.1
            )));
        }
        Ok(Self {
            store,
            zone,
            range,
            current: std::sync::Arc::new(Mutex::new(first_token)),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, u64> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads a token's counter (for tools and tests).
    pub fn counter(&self, token: u64) -> Result<TokenCounter, StoreError> {
        let txn = self.store.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(LEASE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(TokenCounter::default()),
            Err(e) => return Err(backend_err(e)),
        };
        let reserved = table
            .get(counter_key(self.zone, token).as_str())
            .map_err(backend_err)?
            .map(|v| v.value())
            .unwrap_or(0);
        Ok(TokenCounter { reserved })
    }

    /// Sets a token's counter; only ever moves it forward. For tests that
    /// need a token near the end of its sequence.
    pub fn advance_counter(&self, token: u64, reserved: u64) -> Result<(), StoreError> {
        let txn = self.store.begin_write()?;
        {
            let mut table = txn.open_table(LEASE).map_err(backend_err)?;
            let key = counter_key(self.zone, token);
            let old = table
                .get(key.as_str())
                .map_err(backend_err)?
                .map(|v| v.value())
                .unwrap_or(0);
            table
                .insert(key.as_str(), old.max(reserved))
                .map_err(backend_err)?;
        }
        self.store.commit(txn)
    }

    fn reserve_blocking(&self, size: u64) -> Result<Block, StoreError> {
        let start = *self.current();
        // A token the restored backup did not hold starts above the floor.
        let floor = self.store.floor().min(MAX_SEQUENCE);
        let txn = self.store.begin_write()?;
        let (block, token) = {
            let mut table = txn.open_table(LEASE).map_err(backend_err)?;
            let mut token = start;
            loop {
                let key = counter_key(self.zone, token);
                let reserved = table
                    .get(key.as_str())
                    .map_err(backend_err)?
                    .map(|v| v.value())
                    .unwrap_or(floor);
                match (TokenCounter { reserved }).next_block(self.zone, token, size) {
                    Ok((block, next)) => {
                        table
                            .insert(key.as_str(), next.reserved)
                            .map_err(backend_err)?;
                        break (block, token);
                    }
                    Err(LeaseError::TokenExhausted { .. }) if token < self.range.1 => {
                        tracing::warn!(
                            zone = self.zone,
                            token,
                            "lease token used up; moving to the next one of this node's range"
                        );
                        token += 1;
                    }
                    Err(LeaseError::TokenExhausted { .. }) => {
                        return Err(LeaseError::RangeExhausted {
                            zone: self.zone,
                            first: self.range.0,
                            last: self.range.1,
                        }
                        .into())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        // Durable before the block is handed to anyone.
        self.store.commit(txn)?;
        *self.current() = token;
        Ok(block)
    }
}

/// Records `wanted` as `zone`'s setting if the zone has none, or checks it
/// against the one recorded (see [`declare_zone`]), in one write
/// transaction: the record, the zone's counters and the write are one
/// step. Returns the setting the zone serves with.
pub fn declare_embedded_zone(
    store: &EmbeddedStore,
    zone: u64,
    wanted: &ZoneRecord,
) -> Result<ZoneRecord, StoreError> {
    check_zone(zone)?;
    let txn = store.begin_write()?;
    let write = {
        let zones = txn.open_table(LEASE_ZONES).map_err(backend_err)?;
        let stored = match zones.get(zone.to_string().as_str()).map_err(backend_err)? {
            Some(v) => Some(serde_json::from_str::<ZoneRecord>(v.value()).map_err(|e| {
                StoreError::Backend(format!("lease zone {zone}'s record does not read: {e}"))
            })?),
            None => None,
        };
        let counters = txn.open_table(LEASE).map_err(backend_err)?;
        let prefix = format!("{zone}/");
        let used = counters
            .range(prefix.as_str()..)
            .map_err(backend_err)?
            .next()
            .transpose()
            .map_err(backend_err)?
            .is_some_and(|(k, _)| k.value().starts_with(&prefix));
        declare_zone(zone, stored.as_ref(), used, wanted)?
    };
    match write {
        None => Ok(wanted.clone()),
        Some(record) => {
            let text = serde_json::to_string(&record)
                .map_err(|e| StoreError::Backend(format!("lease zone record: {e}")))?;
            txn.open_table(LEASE_ZONES)
                .map_err(backend_err)?
                .insert(zone.to_string().as_str(), text.as_str())
                .map_err(backend_err)?;
            store.commit(txn)?;
            tracing::info!(zone, setting = %record.describe(), "lease zone recorded");
            Ok(record)
        }
    }
}

#[async_trait]
impl LeaseTokenStore for EmbeddedLeaseTokens {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn zone(&self) -> u64 {
        self.zone
    }

    fn token(&self) -> Option<u64> {
        Some(*self.current())
    }

    async fn reserve(&self, size: u64) -> Result<Block, StoreError> {
        let this = self.clone();
        blocking(move || this.reserve_blocking(size)).await
    }

    async fn release(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
