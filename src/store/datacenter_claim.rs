//! The datacenter claim: `node.datacenter_id` registered once for the
//! whole federation of Consul datacenters, in the primary's KV.
//!
//! Worker ids are claimed per datacenter id, in the local Consul
//! datacenter's KV. Consul KV is not shared between Consul datacenters, so
//! two of them given the same `node.datacenter_id` would each hand out
//! worker ids of one number space and issue the same IDs. So every node
//! first makes sure its datacenter id belongs to its own Consul datacenter:
//! `<prefix>/<cluster>/datacenters/<id>` in the primary datacenter
//! (`consul.primary_datacenter`; by default the node's own datacenter),
//! created once with a create-only write and read back `?consistent`. A
//! node whose Consul datacenter is not the owner refuses to start, and a
//! running one fences at its next mark renewal (the claim is read again
//! before every mark write). With one Consul datacenter the primary is the
//! local one: one more key, one more read per mark renewal.
//!
//! Rule 42: each time the primary confirms the claim, a node of the owner
//! datacenter keeps a copy in its own datacenter's KV
//! (`<prefix>/<cluster>/datacenter-confirmed/<id>`, a [`ConfirmedClaim`]).
//! When the primary cannot be reached (not when it answers that another
//! datacenter owns the id), that copy lets the datacenter's nodes keep
//! starting and serving; without one (a first claim) the node refuses,
//! naming the primary.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::kv_paths::ClusterPaths;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite};
use crate::metrics as m;

/// How often, at most, a node serving on its cached claim repeats the
/// WARN that the primary is unreachable (every mark renewal checks).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The value of a datacenter claim: who owns the datacenter id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatacenterClaim {
    /// The owner's Consul datacenter name.
    pub consul_datacenter: String,
    /// The idgen cluster (`consul.cluster`) it was claimed for.
    pub cluster: String,
    /// When it was claimed, Unix ms.
    pub claimed_ms: u64,
    /// The instance that claimed it.
    pub claimed_by: String,
    /// Where a release (rule 44) stands: owned, or on its way to another
    /// owner. Absent in records written before releases existed: owned.
    #[serde(default, skip_serializing_if = "ClaimState::is_owned")]
    pub state: ClaimState,
    /// Every ID of this datacenter id issued before the last release is
    /// below this Unix ms (the old owner's highest mark, rule 44): a node
    /// of the owner starts above it, whatever its clock says.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub floor_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a datacenter claim stands (rule 44).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    /// The owner's nodes issue on it.
    #[default]
    Owned,
    /// A release has begun: no node and no claimer treats the id as owned
    /// (the owner's nodes fence at their next check) until the release is
    /// run again to its end.
    Releasing,
    /// Released: the next claim replaces the record (check-and-set) and
    /// keeps its floor.
    Released,
}

impl ClaimState {
    /// Whether the owner's nodes may issue on the claim.
    pub fn is_owned(&self) -> bool {
        *self == ClaimState::Owned
    }

    /// The state as `idgen admin datacenters list` shows it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ClaimState::Owned => "owned",
            ClaimState::Releasing => "releasing",
            ClaimState::Released => "released",
        }
    }
}

/// The copy of a confirmed claim a node keeps in its own Consul
/// datacenter's KV (rule 42). Only nodes of the owner datacenter write it,
/// and only right after the primary confirmed the claim, read with
/// `?consistent`, named this datacenter: it repeats what the primary said
/// and never decides anything the primary has not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmedClaim {
    /// The claim as the primary held it.
    pub claim: DatacenterClaim,
    /// The primary Consul datacenter that confirmed it.
    pub primary: String,
    /// When the primary confirmed it, Unix ms.
    pub confirmed_ms: u64,
    /// Set by a release (rule 44) before the primary's claim is removed:
    /// from then on the copy vouches for nothing.
    #[serde(default)]
    pub released: bool,
}

/// Why a datacenter id cannot be used here.
#[derive(Debug, Error)]
pub enum DatacenterClaimError {
    /// Another Consul datacenter owns the id.
    #[error("datacenter id {id} belongs to Consul datacenter {owner:?} (claimed by {claimed_by} at {claimed_ms} ms), but this node runs in Consul datacenter {local:?}: two datacenters with one id would issue the same IDs. Give this Consul datacenter's nodes a node.datacenter_id of their own (one per Consul datacenter; the claims are under <prefix>/<cluster>/datacenters/ in the primary)")]
    OwnedElsewhere {
        /// The datacenter id.
        id: u64,
        /// The owning Consul datacenter.
        owner: String,
        /// This node's Consul datacenter.
        local: String,
        /// Who claimed it.
        claimed_by: String,
        /// When.
        claimed_ms: u64,
    },
    /// The claim this node relied on is gone (released by an operator).
    #[error("the claim of datacenter id {id} was removed from the primary Consul datacenter {primary:?}: this node stops issuing; restart it to claim the id again")]
    Released {
        /// The datacenter id.
        id: u64,
        /// The primary datacenter.
        primary: String,
    },
    /// An operator is releasing the id (`idgen admin datacenters release`).
    #[error("datacenter id {id} is being released (its claim in the primary Consul datacenter {primary:?} is marked releasing, rule 44): no node issues on it until the release ends; run `idgen admin datacenters release {id}` again to finish it, then start this datacenter's nodes to claim it anew")]
    Releasing {
        /// The datacenter id.
        id: u64,
        /// The primary datacenter.
        primary: String,
    },
    /// The primary could not be asked.
    #[error("cannot reach the primary Consul datacenter {primary:?} (consul.primary_datacenter) to check datacenter id {id}: {source}; a first claim of a datacenter id needs the primary")]
    PrimaryUnreachable {
        /// The datacenter id.
        id: u64,
        /// The primary datacenter.
        primary: String,
        /// What failed.
        #[source]
        source: ConsulError,
    },
    /// The primary could not be asked and this datacenter holds no
    /// confirmed claim of the id: a first claim needs the primary.
    #[error("cannot reach the primary Consul datacenter {primary:?} (consul.primary_datacenter) to claim datacenter id {id}, and this Consul datacenter {local:?} holds no confirmed claim of it ({cache_key} {why}): a first claim of a datacenter id needs the primary; restore the link to {primary:?} and start again")]
    FirstClaimNeedsPrimary {
        /// The datacenter id.
        id: u64,
        /// The primary datacenter.
        primary: String,
        /// This node's Consul datacenter.
        local: String,
        /// The local copy's KV path.
        cache_key: String,
        /// Why the local copy does not vouch for the claim.
        why: &'static str,
        /// What failed (boxed: the largest variant stays small).
        #[source]
        source: Box<ConsulError>,
    },
    /// The record is not a claim.
    #[error("{key} in Consul datacenter {primary:?} holds {text:?}, not a datacenter claim; fix or delete it by hand")]
    Corrupt {
        /// The key.
        key: String,
        /// The primary datacenter.
        primary: String,
        /// What it holds.
        text: String,
    },
}

/// This node's datacenter id and where its claim lives.
#[derive(Debug, Clone)]
pub struct DatacenterRegistry {
    /// A client whose requests go to the primary (`?dc=`), or the local
    /// client when the primary is the local datacenter.
    primary: ConsulClient,
    primary_name: String,
    local: String,
    id: u64,
    key: String,
    cluster: String,
    /// This node's own Consul datacenter, where the confirmed copy lives.
    local_client: ConsulClient,
    /// The KV path of the confirmed copy in the local datacenter.
    cache_key: String,
    /// Whether the primary answers, shared by every clone.
    reach: Arc<Mutex<Reach>>,
}

/// What this node knows about reaching the primary.
#[derive(Debug, Default)]
struct Reach {
    /// This process wrote the confirmed copy since the primary last
    /// confirmed (once is enough: it repeats the same claim).
    cache_written: bool,
    /// Since when the primary has not answered (None: it answered last).
    unreachable_since: Option<Instant>,
    /// When the last WARN about it was logged.
    warned: Option<Instant>,
    /// The floor of the claim as last confirmed (rule 44).
    floor_ms: u64,
}

impl DatacenterRegistry {
    /// Finds this node's Consul datacenter and the primary (`configured`,
    /// else its own datacenter: set, it is a decision of the operator,
    /// since every renewal then asks the primary, and a first claim needs
    /// it to answer).
    pub async fn connect(
        client: &ConsulClient,
        keys: &ClusterPaths,
        configured: Option<&str>,
        id: u64,
    ) -> Result<Self, ConsulError> {
        let agent = client.agent_datacenters().await?;
        if configured.is_none() && !agent.primary.is_empty() && agent.primary != agent.datacenter {
            tracing::warn!(
                datacenter = %agent.datacenter,
                primary = %agent.primary,
                "this Consul datacenter belongs to a federation, but consul.primary_datacenter is empty: datacenter ids are registered in this datacenter only, so another datacenter given the same node.datacenter_id would issue the same IDs; set consul.primary_datacenter = {:?} on every datacenter's nodes (docs/CLUSTER.md, Several datacenters)",
                agent.primary
            );
        }
        let primary_name = configured
            .map(str::to_owned)
            .unwrap_or_else(|| agent.datacenter.clone());
        let primary = if primary_name == agent.datacenter {
            client.clone()
        } else {
            client.in_datacenter(&primary_name)
        };
        Ok(Self {
            primary,
            primary_name,
            local: agent.datacenter,
            id,
            key: keys.datacenter_claim(id),
            cluster: keys.cluster_name().to_owned(),
            local_client: client.clone(),
            cache_key: keys.datacenter_confirmed(id),
            reach: Arc::default(),
        })
    }

    /// A client of the primary datacenter (`?dc=`; the local client when
    /// the primary is the local datacenter).
    pub fn primary_client(&self) -> &ConsulClient {
        &self.primary
    }

    /// Whether the primary is another Consul datacenter than this node's.
    pub fn is_remote(&self) -> bool {
        self.primary_name != self.local
    }

    /// The primary datacenter's name.
    pub fn primary(&self) -> &str {
        &self.primary_name
    }

    /// This node's Consul datacenter.
    pub fn local(&self) -> &str {
        &self.local
    }

    fn unreachable(&self, source: ConsulError) -> DatacenterClaimError {
        DatacenterClaimError::PrimaryUnreachable {
            id: self.id,
            primary: self.primary_name.clone(),
            source,
        }
    }

    /// The claim as the primary holds it now (`?consistent`).
    async fn read(&self) -> Result<Option<DatacenterClaim>, DatacenterClaimError> {
        Ok(self.read_indexed().await?.map(|(claim, _)| claim))
    }

    /// The claim and its ModifyIndex (for a check-and-set).
    async fn read_indexed(&self) -> Result<Option<(DatacenterClaim, u64)>, DatacenterClaimError> {
        let (entry, _) = self
            .primary
            .kv_get(&self.key, Consistency::Consistent)
            .await
            .map_err(|e| self.unreachable(e))?;
        entry
            .map(|e| {
                parse_claim(&e.value)
                    .map(|claim| (claim, e.modify_index))
                    .ok_or_else(|| DatacenterClaimError::Corrupt {
                        key: self.key.clone(),
                        primary: self.primary_name.clone(),
                        text: String::from_utf8_lossy(&e.value)
                            .chars()
                            .take(200)
                            .collect(),
                    })
            })
            .transpose()
    }

    /// The floor a release left on this id (rule 44): every mark of this
    /// node is read at or above it. 0 before the claim was read.
    pub fn floor_ms(&self) -> u64 {
        self.reach().floor_ms
    }

    fn owned(&self, claim: DatacenterClaim) -> Result<DatacenterClaim, DatacenterClaimError> {
        if !claim.state.is_owned() {
            return Err(DatacenterClaimError::Releasing {
                id: self.id,
                primary: self.primary_name.clone(),
            });
        }
        if claim.consul_datacenter == self.local {
            return Ok(claim);
        }
        Err(DatacenterClaimError::OwnedElsewhere {
            id: self.id,
            owner: claim.consul_datacenter,
            local: self.local.clone(),
            claimed_by: claim.claimed_by,
            claimed_ms: claim.claimed_ms,
        })
    }

    /// At start: the id's claim, made by this node if there is none yet
    /// (create-only, so of two datacenters racing exactly one wins), and
    /// refused when another Consul datacenter owns it. With the primary
    /// unreachable, the confirmed copy in this datacenter stands in for it
    /// (rule 42); without one the node refuses.
    pub async fn ensure(&self, instance: &str) -> Result<DatacenterClaim, DatacenterClaimError> {
        for _ in 0..3 {
            let cache_index = self.cache_index().await;
            let index = match self.read_indexed().await {
                Ok(Some((claim, _))) if claim.state != ClaimState::Released => {
                    return self.confirmed(claim, cache_index).await
                }
                // Released (rule 44): replaced by check-and-set, floor kept.
                Ok(Some((old, index))) => Some((old.floor_ms, index)),
                Ok(None) => None,
                Err(e) => return self.without_primary(e).await,
            };
            let (floor_ms, cas) = index.unwrap_or((0, 0));
            let claim = DatacenterClaim {
                consul_datacenter: self.local.clone(),
                cluster: self.cluster.clone(),
                claimed_ms: now_ms(),
                claimed_by: instance.to_owned(),
                state: ClaimState::Owned,
                floor_ms,
            };
            let value = serde_json::to_vec(&claim).map_err(|e| DatacenterClaimError::Corrupt {
                key: self.key.clone(),
                primary: self.primary_name.clone(),
                text: e.to_string(),
            })?;
            // Whether or not this write won, the consistent read above
            // (next round) says who owns the id.
            match self
                .primary
                .kv_put(&self.key, &value, KvWrite::Cas(cas))
                .await
            {
                Ok(true) => {
                    tracing::info!(datacenter_id = self.id, consul_datacenter = %self.local, primary = %self.primary_name, floor_ms, "datacenter id claimed in the primary Consul datacenter");
                }
                Ok(false) => {}
                Err(e) if e.outcome_unknown() => {}
                Err(e) => return self.without_primary(self.unreachable(e)).await,
            }
        }
        self.check().await
    }

    /// At every mark renewal: the claim still exists and is this
    /// datacenter's (or, the primary unreachable, this datacenter's
    /// confirmed copy says so).
    pub async fn check(&self) -> Result<DatacenterClaim, DatacenterClaimError> {
        let cache_index = self.cache_index().await;
        match self.read().await {
            Ok(Some(claim)) => self.confirmed(claim, cache_index).await,
            Ok(None) => Err(DatacenterClaimError::Released {
                id: self.id,
                primary: self.primary_name.clone(),
            }),
            Err(e) => self.without_primary(e).await,
        }
    }

    /// Whether the primary answered the last claim check (false while this
    /// node runs on its datacenter's confirmed copy).
    pub fn primary_answered(&self) -> bool {
        self.reach().unreachable_since.is_none()
    }

    fn reach(&self) -> std::sync::MutexGuard<'_, Reach> {
        self.reach
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The confirmed copy's ModifyIndex, read BEFORE the primary is asked,
    /// when this process still has to write the copy (None: nothing to
    /// write, or the local read failed: the copy is written next time).
    /// The write is a check-and-set on it, so a release that marked the
    /// copy released after this read (rule 44) is never overwritten by a
    /// confirmation the primary gave before the release.
    async fn cache_index(&self) -> Option<u64> {
        if !self.is_remote() || self.reach().cache_written {
            return None;
        }
        match self
            .local_client
            .kv_get(&self.cache_key, Consistency::Consistent)
            .await
        {
            Ok((entry, _)) => Some(entry.map_or(0, |e| e.modify_index)),
            Err(_) => None,
        }
    }

    /// The primary answered with `claim`: refused if another datacenter's;
    /// else the primary is reachable again and, once per process, the
    /// confirmed copy is written in this datacenter's KV.
    async fn confirmed(
        &self,
        claim: DatacenterClaim,
        cache_index: Option<u64>,
    ) -> Result<DatacenterClaim, DatacenterClaimError> {
        let claim = self.owned(claim)?;
        self.reach().floor_ms = claim.floor_ms;
        metrics::gauge!(m::DATACENTER_PRIMARY_REACHABLE).set(1.0);
        if let Some(since) = self.reach().unreachable_since.take() {
            tracing::info!(primary = %self.primary_name, datacenter_id = self.id, unreachable_s = since.elapsed().as_secs(), "the primary Consul datacenter answers again and confirmed this datacenter's claim");
        }
        if let Some(index) = cache_index {
            let copy = ConfirmedClaim {
                claim: claim.clone(),
                primary: self.primary_name.clone(),
                confirmed_ms: now_ms(),
                released: false,
            };
            let value = serde_json::to_vec(&copy).unwrap_or_default();
            match self
                .local_client
                .kv_put(&self.cache_key, &value, KvWrite::Cas(index))
                .await
            {
                Ok(true) => self.reach().cache_written = true,
                // Another node's copy, or a release's mark: read again at
                // the next check.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(key = %self.cache_key, error = %e, "the confirmed datacenter claim could not be copied into this datacenter's KV; retried at the next check")
                }
            }
        }
        Ok(claim)
    }

    /// The primary did not answer (`error`): a transport failure or a 5xx
    /// (Consul's `Remote DC has no server currently reachable`) is served
    /// from this datacenter's confirmed copy when it vouches for the claim
    /// (rule 42); anything else, or no such copy, is refused.
    async fn without_primary(
        &self,
        error: DatacenterClaimError,
    ) -> Result<DatacenterClaim, DatacenterClaimError> {
        let source = match error {
            DatacenterClaimError::PrimaryUnreachable { source, .. }
                if self.is_remote() && source.is_retryable() =>
            {
                source
            }
            other => return Err(other),
        };
        metrics::gauge!(m::DATACENTER_PRIMARY_REACHABLE).set(0.0);
        metrics::counter!(m::DATACENTER_PRIMARY_UNREACHABLE_CHECKS).increment(1);
        let refuse = |why| DatacenterClaimError::FirstClaimNeedsPrimary {
            id: self.id,
            primary: self.primary_name.clone(),
            local: self.local.clone(),
            cache_key: self.cache_key.clone(),
            why,
            source: Box::new(source),
        };
        let copy = match self
            .local_client
            .kv_get(&self.cache_key, Consistency::Consistent)
            .await
        {
            Ok((Some(entry), _)) => serde_json::from_slice::<ConfirmedClaim>(&entry.value).ok(),
            Ok((None, _)) => None,
            Err(_) => return Err(refuse("could not be read either")),
        };
        let Some(copy) = copy else {
            return Err(refuse("is absent"));
        };
        if copy.released {
            return Err(refuse("was marked released"));
        }
        if copy.claim.consul_datacenter != self.local
            || copy.claim.cluster != self.cluster
            || copy.primary != self.primary_name
        {
            return Err(refuse("names another datacenter, cluster or primary"));
        }
        self.warn_unreachable(&copy);
        self.reach().floor_ms = copy.claim.floor_ms;
        Ok(copy.claim)
    }

    /// The WARN of a node serving on its confirmed copy: at the first
    /// failed check, then at most every [`WARN_EVERY`].
    fn warn_unreachable(&self, copy: &ConfirmedClaim) {
        let now = Instant::now();
        let mut reach = self.reach();
        let since = *reach.unreachable_since.get_or_insert(now);
        if reach.warned.is_some_and(|at| now - at < WARN_EVERY) {
            return;
        }
        reach.warned = Some(now);
        drop(reach);
        let confirmed_s = now_ms().saturating_sub(copy.confirmed_ms) / 1000;
        tracing::warn!(
            primary = %self.primary_name,
            datacenter_id = self.id,
            unreachable_s = since.elapsed().as_secs(),
            "the primary Consul datacenter {:?} has been unreachable for {} s: this node keeps issuing on datacenter id {} as confirmed by the primary {} s ago and copied at {} (rule 42); a first claim, a release or a layout change waits for the primary",
            self.primary_name,
            since.elapsed().as_secs(),
            self.id,
            confirmed_s,
            self.cache_key,
        );
    }
}

/// A claim record, or `None` when the bytes are not one.
pub fn parse_claim(value: &[u8]) -> Option<DatacenterClaim> {
    serde_json::from_slice(value).ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy written before `released` existed reads as not released, and
    /// a copy a release marked reads as released: the one field that makes
    /// a copy vouch for nothing survives the round trip.
    #[test]
    fn a_confirmed_copy_is_released_only_when_marked() {
        let old = r#"{"claim":{"consul_datacenter":"dc2","cluster":"test","claimed_ms":1,"claimed_by":"b"},"primary":"dc1","confirmed_ms":2}"#;
        let copy: ConfirmedClaim = serde_json::from_str(old).expect("parses");
        assert!(!copy.released);
        let marked = ConfirmedClaim {
            released: true,
            ..copy
        };
        let text = serde_json::to_string(&marked).expect("serializes");
        let back: ConfirmedClaim = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, marked);
        assert!(back.released);
    }

    /// A claim written before releases existed reads as owned with no
    /// floor (and is written back without the new fields), and a released
    /// claim keeps its state and floor through the round trip (rule 44).
    #[test]
    fn a_claim_is_owned_unless_marked_and_keeps_its_floor() {
        let old = r#"{"consul_datacenter":"dc2","cluster":"test","claimed_ms":1,"claimed_by":"b"}"#;
        let claim = parse_claim(old.as_bytes()).expect("parses");
        assert_eq!(claim.state, ClaimState::Owned);
        assert_eq!(claim.floor_ms, 0);
        let text = serde_json::to_string(&claim).expect("serializes");
        assert_eq!(text, old);
        let released = DatacenterClaim {
            state: ClaimState::Released,
            floor_ms: 42,
            ..claim
        };
        let text = serde_json::to_string(&released).expect("serializes");
        assert!(text.contains(r#""state":"released""#), "{text}");
        assert_eq!(parse_claim(text.as_bytes()), Some(released));
        assert_eq!(parse_claim(b"not a claim"), None);
    }
}
