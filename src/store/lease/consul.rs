//! Lease tokens in Consul KV: `<prefix>/<cluster>/lease/<zone>/<token>` is
//! both the lock (held under the worker session) and the counter.

use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::LeaseTokenStore;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, KvWrite, TxnOp, TxnOutcome};
use crate::id::lease::{
    check_zone, declare_zone, Block, LeaseError, TokenCounter, ZoneRecord, MAX_TOKEN,
};
use crate::store::kv_paths::{ClusterPaths, OwnerInfo};
use crate::store::StoreError;

/// The value of a token's key in Consul: who holds (or last held) it, and
/// its counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTokenRecord {
    /// The holder (or the last one).
    #[serde(flatten)]
    pub owner: OwnerInfo,
    /// The largest sequence any holder may have handed out.
    pub reserved: u64,
}

impl LeaseTokenRecord {
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
    record: LeaseTokenRecord,
    index: u64,
    /// A write's outcome was unknown: re-read before the next one.
    stale: bool,
}

/// A zone's token records by token: the free ones with their record and
/// ModifyIndex, `None` for tokens held, used up or unreadable.
type TokenRecords = std::collections::BTreeMap<u64, Option<(LeaseTokenRecord, u64)>>;

/// Lease tokens in Consul KV, held under one session. The same machinery
/// holds formatted mode's tokens ([`ConsulLeaseTokens::for_format_space`]): a
/// folder of its own per token space, the counter left at 0 (formats keep
/// their counters per token in their own records).
pub struct ConsulLeaseTokens {
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
    keys: ClusterPaths,
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

/// Records `wanted` as `zone`'s setting under
/// `<prefix>/<cluster>/lease-zones/<zone>` if the zone has none (a `cas=0`
/// create: of two nodes declaring at once one writes, the other re-reads
/// and compares), or checks it against the recorded one (see
/// [`declare_zone`]). Returns the setting the zone serves with.
pub async fn declare_consul_zone(
    client: &ConsulClient,
    keys: &ClusterPaths,
    zone: u64,
    wanted: &ZoneRecord,
) -> Result<ZoneRecord, StoreError> {
    check_zone(zone)?;
    let key = keys.lease_zone(zone);
    for _ in 0..5 {
        let (entry, _) = client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(consul_err)?;
        let stored = match entry {
            Some(e) => Some(serde_json::from_slice::<ZoneRecord>(&e.value).map_err(|err| {
                StoreError::Backend(format!(
                    "{key} is unreadable ({err}); it records whether lease zone {zone} is hidden: restore it from a backup"
                ))
            })?),
            None => None,
        };
        let used = stored.is_none()
            && !client
                .kv_list(&keys.lease_dir(zone), Consistency::Consistent)
                .await
                .map_err(consul_err)?
                .is_empty();
        let Some(record) = declare_zone(zone, stored.as_ref(), used, wanted)? else {
            return Ok(wanted.clone());
        };
        // Strings and integers: serialising cannot fail.
        let value = serde_json::to_vec(&record).unwrap_or_default();
        if client
            .kv_put(&key, &value, KvWrite::Cas(0))
            .await
            .map_err(consul_err)?
        {
            tracing::info!(zone, setting = %record.describe(), "lease zone recorded");
            return Ok(record);
        }
    }
    Err(StoreError::Backend(format!(
        "{key} kept changing while this node declared lease zone {zone}; start it again"
    )))
}

impl ConsulLeaseTokens {
    /// Only tokens `0..=max` of the zone (a hidden zone's, see
    /// [`crate::id::lease::ZoneHide::max_token`]).
    pub fn with_max_token(mut self, max: u64) -> Self {
        self.max = max.min(MAX_TOKEN);
        self
    }

    /// Tokens of `zone`, locked with `session` (the worker id's session).
    pub fn new(
        client: ConsulClient,
        keys: ClusterPaths,
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
        keys: &ClusterPaths,
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
    /// [`ConsulLeaseTokens::hold`] takes a token again.
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
            let Ok(record) = LeaseTokenRecord::decode(e) else {
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
            let record = LeaseTokenRecord {
                owner: self.owner.clone(),
                reserved,
            };
            let mut ops = vec![
                check,
                TxnOp::Lock {
                    key: key.clone(),
                    value: record.encode(),
                    session: self.session.clone(),
                },
            ];
            // Planned from the listing: the cluster's index after it.
            ops.extend(self.keys.before_write(&self.client, &key, true).await?);
            match self.client.txn(&ops).await.map_err(consul_err)? {
                TxnOutcome::RolledBack(errors) if self.keys.record_failed(&ops, &errors) => {
                    return Err(self.keys.refused_by_record(&key).await);
                }
                TxnOutcome::Committed(results) => {
                    self.keys.index().committed(&results);
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
                let record = LeaseTokenRecord::decode(&entry)?;
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
        record: LeaseTokenRecord,
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
        // This node's own token at the index it wrote: no read to check.
        ops.extend(self.keys.before_write(&self.client, &key, false).await?);
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
            Ok(TxnOutcome::RolledBack(errors)) if self.keys.record_failed(&ops, &errors) => {
                Err(self.keys.refused_by_record(&key).await)
            }
            Ok(TxnOutcome::Committed(results)) => {
                self.keys.index().committed(&results);
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
impl LeaseTokenStore for ConsulLeaseTokens {
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
            let record = LeaseTokenRecord {
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
