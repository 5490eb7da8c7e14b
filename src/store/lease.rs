//! Lease tokens and their durable counters (lease mode), on both backends.
//!
//! A node serves lease IDs from blocks of one token's sequence. A
//! [`TokenStore`] hands out those blocks: it holds a token (taking one
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
//! - Consul: `<prefix>/<cluster>/lease/<zone>/<token>` is both the lock and
//!   the counter: its value is a [`TokenRecord`] (the holder and
//!   `reserved`). The node takes the token with a txn `check-index` (or
//!   `check-not-exists`) + `lock` under its worker session, so taking it
//!   and reading its counter are one atomic step (a token inside its
//!   lock-delay is refused by Consul and passed over for another), and it
//!   moves the counter with the same pair on the ModifyIndex it last saw. Sharing the worker
//!   id's session gives the token the same fencing: when the session is
//!   lost, the node stops issuing both kinds of IDs. A new holder continues
//!   above the stored counter, which already covers every block any
//!   earlier holder may have used.

use std::sync::Mutex;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::consul::{ClusterKeys, OwnerInfo};
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, TxnOp, TxnOutcome};
use crate::id::lease::{
    check_token, check_zone, Block, LeaseError, TokenCounter, MAX_SEQUENCE, MAX_TOKEN,
};

/// Where a node's lease blocks come from.
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
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

fn counter_key(zone: u64, token: u64) -> String {
    format!("{zone}/{token}")
}

/// Lease tokens of a single node, in the state file. The node uses only
/// its own range of tokens (see [`crate::id::lease::node_token_range`]),
/// so embedded nodes with distinct worker ids never share one.
#[derive(Clone)]
pub struct EmbeddedTokens {
    store: EmbeddedStore,
    zone: u64,
    /// The node's own tokens, `first..=last`.
    range: (u64, u64),
    /// The token blocks come from now (starts at the configured one).
    current: std::sync::Arc<Mutex<u64>>,
}

impl EmbeddedTokens {
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

#[async_trait]
impl TokenStore for EmbeddedTokens {
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

/// The value of a token's key in Consul: who holds (or last held) it, and
/// its counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// The holder (or the last one).
    #[serde(flatten)]
    pub owner: OwnerInfo,
    /// The largest sequence any holder may have handed out.
    pub reserved: u64,
}

impl TokenRecord {
    fn decode(entry: &KvEntry) -> Result<Self, StoreError> {
        serde_json::from_slice(&entry.value).map_err(|e| {
            StoreError::Backend(format!(
                "{} is unreadable ({e}); restore it from a backup (its counter keeps lease IDs unique)",
                entry.key
            ))
        })
    }

    fn encode(&self) -> Vec<u8> {
        // Strings and integers: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The token this node holds, as last written.
#[derive(Debug, Clone)]
struct HeldToken {
    token: u64,
    record: TokenRecord,
    index: u64,
    /// A write's outcome was unknown: re-read before the next one.
    stale: bool,
}

/// A zone's token records by token: the free ones with their record and
/// ModifyIndex, `None` for tokens held, used up or unreadable.
type TokenRecords = std::collections::BTreeMap<u64, Option<(TokenRecord, u64)>>;

/// Lease tokens in Consul KV, held under one session. The same machinery
/// holds formatted mode's tokens ([`ConsulTokens::for_format_space`]): a
/// folder of its own per token space, the counter left at 0 (formats keep
/// their counters per token in their own records).
pub struct ConsulTokens {
    client: ConsulClient,
    zone: u64,
    /// The folder of the space's token keys (with trailing `/`).
    dir: String,
    /// The largest token of the space.
    max: u64,
    session: String,
    owner: OwnerInfo,
    held: Mutex<Option<HeldToken>>,
    /// One reserve (or release) at a time.
    busy: tokio::sync::Mutex<()>,
    /// The cluster's keys, for what this node wrote to its tokens.
    keys: ClusterKeys,
}

fn consul_err(e: ConsulError) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn txn_errors(errors: &[crate::consul::TxnError]) -> String {
    errors
        .iter()
        .map(|e| e.what.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

impl ConsulTokens {
    /// Tokens of `zone`, locked with `session` (the worker id's session).
    pub fn new(
        client: ConsulClient,
        keys: ClusterKeys,
        zone: u64,
        session: String,
        owner: OwnerInfo,
    ) -> Result<Self, StoreError> {
        check_zone(zone)?;
        Ok(Self {
            client,
            zone,
            dir: keys.lease_dir(zone),
            max: MAX_TOKEN,
            session,
            owner,
            held: Mutex::new(None),
            busy: tokio::sync::Mutex::new(()),
            keys,
        })
    }

    /// Formatted mode's tokens of `space` (named as
    /// [`crate::id::format::TokenSpace::name`], tokens `0..=max`), locked
    /// with `session`: under `<prefix>/<cluster>/format-tokens/<space>/`,
    /// apart from lease mode's zones.
    pub fn for_format_space(
        client: ConsulClient,
        keys: &ClusterKeys,
        space: &str,
        max: u64,
        session: String,
        owner: OwnerInfo,
    ) -> Self {
        Self {
            client,
            zone: 0,
            dir: keys.format_token_dir(space),
            max,
            session,
            owner,
            held: Mutex::new(None),
            busy: tokio::sync::Mutex::new(()),
            keys: keys.clone(),
        }
    }

    /// The lock key of `token`.
    pub fn key(&self, token: u64) -> String {
        format!("{}{token}", self.dir)
    }

    /// The session tokens are locked with.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The held token, taking a free one first if none is held (formatted
    /// mode: nothing is reserved on the token itself).
    pub async fn hold(&self) -> Result<u64, StoreError> {
        let _one_at_a_time = self.busy.lock().await;
        if let Some(h) = self.held().as_ref() {
            return Ok(h.token);
        }
        let h = self.take_token().await?;
        let token = h.token;
        *self.held() = Some(h);
        Ok(token)
    }

    /// Forgets `token` (a write found its lock gone): the next
    /// [`ConsulTokens::hold`] takes a token again.
    pub fn forget(&self, token: u64) {
        let mut held = self.held();
        if held.as_ref().is_some_and(|h| h.token == token) {
            *held = None;
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<HeldToken>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a free token that is not used up: the one this instance held
    /// before, else the lowest free existing one, else the lowest unused
    /// number.
    ///
    /// A token whose holder's session was invalidated while holding it (a
    /// crash, an expired TTL, an operator's destroy) is inside its
    /// lock-delay, and Consul refuses the txn `lock` (409, `failed to lock
    /// key ... due to lock delay`), as it does for any token another node
    /// took meanwhile. Either way the next candidate is tried at once: the
    /// node does not wait for its old token, since Consul does not say how
    /// long the delay has left and any free token is as good (each carries
    /// its own counter). The passed-over token keeps its counter and is
    /// taken again later by whoever finds it free.
    /// Every token record of the zone (see [`TokenRecords`]), and the free
    /// token this instance held before, if any.
    async fn token_records(&self) -> Result<(TokenRecords, Option<u64>), StoreError> {
        let dir = self.dir.clone();
        let floors = self.keys.written().floors(&dir);
        let entries = self
            .client
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(consul_err)?;
        let mut existing = std::collections::BTreeMap::new();
        let mut previous = None;
        for e in &entries {
            let Some(token) = e
                .key
                .strip_prefix(&dir)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|t| *t <= self.max)
            else {
                continue;
            };
            let Ok(record) = TokenRecord::decode(e) else {
                // Unreadable: never take it (its counter is unknown).
                tracing::error!(key = %e.key, "lease token record unreadable; skipping it");
                existing.insert(token, None);
                continue;
            };
            // A token this node wrote, now below its write: rolled back.
            self.keys.written().check(
                "lease",
                &e.key,
                floors.get(&e.key).copied(),
                (0, record.reserved),
            )?;
            // Still locked by this session (its last write failed, or an
            // operator's skip-ahead moved it): ours to take again.
            let own = e.session.as_deref() == Some(self.session.as_str());
            let free = (e.session.is_none() || own)
                && !(TokenCounter {
                    reserved: record.reserved,
                })
                .exhausted();
            let mine = own || record.owner.instance == self.owner.instance;
            if free && mine && (own || previous.is_none()) {
                previous = Some(token);
            }
            existing.insert(token, free.then_some((record, e.modify_index)));
        }
        Ok((existing, previous))
    }

    async fn take_token(&self) -> Result<HeldToken, StoreError> {
        let (existing, previous) = self.token_records().await?;
        let free_existing = existing
            .iter()
            .filter_map(|(t, r)| r.as_ref().map(|_| *t))
            .filter(|t| Some(*t) != previous);
        let unused = (0..=self.max).filter(|t| !existing.contains_key(t));
        for token in previous.into_iter().chain(free_existing).chain(unused) {
            let key = self.key(token);
            let (reserved, check) = match existing.get(&token) {
                Some(Some((record, index))) => (
                    record.reserved,
                    TxnOp::CheckIndex {
                        key: key.clone(),
                        index: *index,
                    },
                ),
                _ => (0, TxnOp::CheckNotExists { key: key.clone() }),
            };
            let record = TokenRecord {
                owner: self.owner.clone(),
                reserved,
            };
            let ops = [
                check,
                TxnOp::Lock {
                    key: key.clone(),
                    value: record.encode(),
                    session: self.session.clone(),
                },
            ];
            match self.client.txn(&ops).await.map_err(consul_err)? {
                TxnOutcome::Committed(results) => {
                    // The check's own result comes first, the write's last.
                    let index = results
                        .iter()
                        .rfind(|e| e.key == key)
                        .map(|e| e.modify_index)
                        .unwrap_or(0);
                    self.keys.written().wrote(&key, (0, reserved));
                    tracing::info!(zone = self.zone, token, reserved, keys = %self.dir, "lease token taken");
                    return Ok(HeldToken {
                        token,
                        record,
                        index,
                        stale: false,
                    });
                }
                // The session is gone (the node is about to be fenced):
                // no other candidate can be taken with it either.
                TxnOutcome::RolledBack(errors)
                    if errors.iter().any(|e| e.what.contains("invalid session")) =>
                {
                    return Err(StoreError::LockLost(format!(
                        "cannot take a token: this node's session is gone ({})",
                        txn_errors(&errors)
                    )))
                }
                // Taken or changed by another node meanwhile: next one.
                TxnOutcome::RolledBack(_) => continue,
            }
        }
        Err(LeaseError::NoFreeToken { zone: self.zone }.into())
    }

    /// Re-reads the held token; [`StoreError::LockLost`] (and forgets it)
    /// if this session no longer holds it.
    async fn refresh(&self, token: u64) -> Result<HeldToken, StoreError> {
        let key = self.key(token);
        let floor = self.keys.written().written(&key);
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(consul_err)?;
        match entry {
            Some(entry) if entry.session.as_deref() == Some(self.session.as_str()) => {
                let record = TokenRecord::decode(&entry)?;
                self.keys
                    .written()
                    .check("lease", &key, floor, (0, record.reserved))?;
                let held = HeldToken {
                    token,
                    record,
                    index: entry.modify_index,
                    stale: false,
                };
                *self.held() = Some(held.clone());
                Ok(held)
            }
            _ => {
                *self.held() = None;
                Err(StoreError::LockLost(format!(
                    "lease token {}/{token} is no longer held by this node's session",
                    self.zone
                )))
            }
        }
    }

    /// Writes `record` for the held token if its index is still `index`.
    async fn write(
        &self,
        held: &HeldToken,
        record: TokenRecord,
        unlock: bool,
    ) -> Result<u64, StoreError> {
        let key = self.key(held.token);
        let record_reserved = record.reserved;
        let write = if unlock {
            TxnOp::Unlock {
                key: key.clone(),
                value: record.encode(),
                session: self.session.clone(),
            }
        } else {
            TxnOp::Lock {
                key: key.clone(),
                value: record.encode(),
                session: self.session.clone(),
            }
        };
        let mut ops = vec![
            TxnOp::CheckIndex {
                key: key.clone(),
                index: held.index,
            },
            write,
        ];
        ops.extend(self.keys.mark_check());
        let mut outcome = self.client.txn(&ops).await;
        // This node's mark moved under the check (its keeper): re-read it
        // (a restore is refused there) and try once more.
        if let Ok(TxnOutcome::RolledBack(errors)) = &outcome {
            if self.keys.mark_failed(&ops, errors) {
                self.keys.recheck_mark(&self.client).await?;
                ops.pop();
                ops.extend(self.keys.mark_check());
                outcome = self.client.txn(&ops).await;
            }
        }
        match outcome {
            // The check's own result comes first, the write's last.
            Ok(TxnOutcome::Committed(results)) => {
                self.keys.written().wrote(&key, (0, record_reserved));
                Ok(results
                    .iter()
                    .rfind(|e| e.key == key)
                    .map(|e| e.modify_index)
                    .unwrap_or(0))
            }
            Ok(TxnOutcome::RolledBack(errors)) => Err(StoreError::LockLost(format!(
                "lease token {}/{} changed under this node or is no longer held by its session ({})",
                self.zone,
                held.token,
                txn_errors(&errors)
            ))),
            Err(e) => Err(consul_err(e)),
        }
    }
}

#[async_trait]
impl TokenStore for ConsulTokens {
    fn backend(&self) -> &'static str {
        "consul"
    }

    fn zone(&self) -> u64 {
        self.zone
    }

    fn token(&self) -> Option<u64> {
        self.held().as_ref().map(|h| h.token)
    }

    async fn reserve(&self, size: u64) -> Result<Block, StoreError> {
        let _one_at_a_time = self.busy.lock().await;
        loop {
            let current = self.held().clone();
            let held = match current {
                Some(h) if h.stale => self.refresh(h.token).await?,
                Some(h) => h,
                None => {
                    let h = self.take_token().await?;
                    *self.held() = Some(h.clone());
                    h
                }
            };
            let counter = TokenCounter {
                reserved: held.record.reserved,
            };
            let (block, next) = match counter.next_block(self.zone, held.token, size) {
                Ok(b) => b,
                Err(LeaseError::TokenExhausted { .. }) => {
                    tracing::warn!(
                        zone = self.zone,
                        token = held.token,
                        "lease token used up; giving it back and taking another"
                    );
                    let record = held.record.clone();
                    self.write(&held, record, true).await?;
                    *self.held() = None;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let record = TokenRecord {
                owner: held.record.owner.clone(),
                reserved: next.reserved,
            };
            return match self.write(&held, record.clone(), false).await {
                Ok(index) => {
                    *self.held() = Some(HeldToken {
                        token: held.token,
                        record,
                        index,
                        stale: false,
                    });
                    Ok(block)
                }
                Err(e @ StoreError::LockLost(_)) => {
                    // The token is not ours any more (session gone, or an
                    // operator took it): stop using it.
                    *self.held() = None;
                    Err(e)
                }
                Err(e) => {
                    // Maybe applied: never use the block, and re-read the
                    // token before the next write.
                    *self.held() = Some(HeldToken {
                        stale: true,
                        ..held
                    });
                    Err(e)
                }
            };
        }
    }

    async fn release(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.busy.lock().await;
        let Some(held) = self.held().clone() else {
            return Ok(());
        };
        // Re-read: after an unknown outcome our copy may be stale, and the
        // release must keep the newest counter.
        let current = match self.refresh(held.token).await {
            Ok(h) => h,
            Err(StoreError::LockLost(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let record = current.record.clone();
        self.write(&current, record, true).await?;
        *self.held() = None;
        tracing::info!(zone = self.zone, token = held.token, "lease token released");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn store() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = EmbeddedStore::create(&dir.path().join("s.redb"), "layout").unwrap();
        (dir, s)
    }

    #[tokio::test]
    async fn embedded_blocks_are_disjoint_and_durable() {
        let (dir, s) = store();
        let tokens = EmbeddedTokens::new(s, 3, 7, (0, 63)).unwrap();
        let mut seen = HashSet::new();
        for _ in 0..20 {
            let b = tokens.reserve(100).await.unwrap();
            assert_eq!((b.zone, b.token), (3, 7));
            for id in b.ids().first..=b.ids().last {
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(tokens.counter(7).unwrap().reserved, 2000);
        drop(tokens);
        let s = EmbeddedStore::open(&dir.path().join("s.redb"), "layout", false).unwrap();
        let tokens = EmbeddedTokens::new(s, 3, 7, (0, 63)).unwrap();
        let b = tokens.reserve(100).await.unwrap();
        assert_eq!(b.first, 2001, "a reopened store continues above");
    }

    #[tokio::test]
    async fn embedded_moves_to_the_next_token_when_one_is_used_up() {
        let (_dir, s) = store();
        let tokens = EmbeddedTokens::new(s, 0, MAX_TOKEN - 1, (MAX_TOKEN - 63, MAX_TOKEN)).unwrap();
        tokens
            .advance_counter(MAX_TOKEN - 1, crate::id::lease::MAX_SEQUENCE - 5)
            .unwrap();
        let b = tokens.reserve(100).await.unwrap();
        assert_eq!((b.token, b.len()), (MAX_TOKEN - 1, 5));
        let b = tokens.reserve(100).await.unwrap();
        assert_eq!((b.token, b.first), (MAX_TOKEN, 1));
        assert_eq!(tokens.token(), Some(MAX_TOKEN));
        tokens
            .advance_counter(MAX_TOKEN, crate::id::lease::MAX_SEQUENCE)
            .unwrap();
        let e = tokens.reserve(100).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Lease(LeaseError::RangeExhausted {
                    zone: 0,
                    last: MAX_TOKEN,
                    ..
                })
            ),
            "{e:?}"
        );
        // Counters never move back.
        tokens.advance_counter(MAX_TOKEN, 1).unwrap();
        assert!(tokens.counter(MAX_TOKEN).unwrap().exhausted());
    }

    #[tokio::test]
    async fn embedded_never_leaves_its_own_range() {
        let (_dir, s) = store();
        // The range of datacenter 0, worker 0 under 5 + 5 bits: 0 to 63.
        let tokens = EmbeddedTokens::new(s, 0, 63, (0, 63)).unwrap();
        tokens
            .advance_counter(63, crate::id::lease::MAX_SEQUENCE)
            .unwrap();
        let e = tokens.reserve(10).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Lease(LeaseError::RangeExhausted {
                    first: 0,
                    last: 63,
                    ..
                })
            ),
            "token 64 belongs to the next worker: {e:?}"
        );
        assert_eq!(tokens.token(), Some(63));
        assert_eq!(tokens.counter(64).unwrap().reserved, 0, "never touched");
    }
}
