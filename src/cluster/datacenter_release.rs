//! Releasing a datacenter id (rule 44): `idgen admin datacenters release`.
//!
//! The marks of a datacenter id live in its owner's own Consul datacenter
//! (`hwm/<id>/<worker>`), which another datacenter never reads. So a new
//! owner would be kept above the old owner's IDs by nothing but the
//! clocks. The release therefore carries the old owner's highest mark into
//! the primary's claim record (`floor_ms`), and a node of the next owner
//! reads every mark at or above it (`ConsulHwmStore::load_hwm`).
//!
//! The steps, each a check-and-set or a `?consistent` read:
//! 1. refuse while the owner datacenter has a passing registered node of
//!    the id or a worker lock of the id held by a live session (checked
//!    before anything changes, and again after step 2), unless forced:
//!    then every such session is destroyed and its lock-delay waited out,
//!    as `idgen admin release --force` does for one holder;
//! 2. mark the primary's claim `releasing`: from then on no node issues on
//!    it (the owner's nodes fence at their next mark write, which reads
//!    the claim first) and no node claims it;
//! 3. mark the owner's confirmed copy released (`?dc=<owner>`, rule 42),
//!    written even where none exists, so a confirmation read before step 2
//!    cannot write a copy that vouches for the id later, and a node of the
//!    owner cut off from the primary stops claiming and writing marks on
//!    it; then step 1 is checked again (refused: the claim and the copy
//!    are put back);
//! 4. read the highest mark under the owner's `hwm/<id>/`: no mark can be
//!    written after step 1 (a mark write needs the worker lock, and reads
//!    the claim after taking it), and a node issues only below its mark;
//! 5. mark the claim `released` with that floor. The next claim, by any
//!    datacenter, replaces it by check-and-set and keeps the floor.
//!
//! A failed step leaves the claim `releasing` (no one issues on it) until
//! the release is run again; the owner datacenter unreachable fails it.

use std::time::Duration;

use thiserror::Error;

use super::holders::{self, LockKey, SessionState};
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite};
use crate::store::datacenter_claim::{parse_claim, ClaimState, ConfirmedClaim, DatacenterClaim};
use crate::store::kv_paths::ClusterPaths;

/// Where the claims live and how to reach each Consul datacenter.
#[derive(Debug, Clone)]
pub struct Federation {
    /// The local Consul agent's client.
    pub client: ConsulClient,
    /// The cluster's KV paths.
    pub keys: ClusterPaths,
    /// The Consul service name idgen nodes register under.
    pub service: String,
    /// `consul.primary_datacenter` (None: the local datacenter).
    pub primary: Option<String>,
}

/// Where a layout change runs: see [`Federation::layout_scope`].
#[derive(Debug, Clone)]
pub struct LayoutScope {
    /// This node's Consul datacenter.
    pub local: String,
    /// The primary Consul datacenter.
    pub primary: String,
    /// A client of the primary (the local client when it is the local one).
    pub client: ConsulClient,
    /// Whether the cluster spans several Consul datacenters.
    pub federated: bool,
}

/// One claim as the primary holds it.
#[derive(Debug, Clone)]
pub struct ListedClaim {
    /// The datacenter id.
    pub id: u64,
    /// The record; `None` when unreadable (then `raw` says what it holds).
    pub claim: Option<DatacenterClaim>,
    /// The first 200 characters of an unreadable record.
    pub raw: String,
}

/// What a release did.
#[derive(Debug, Clone)]
pub struct Released {
    /// The claim before the release (its owner).
    pub previous: DatacenterClaim,
    /// The floor recorded: every ID issued on the id so far is below it.
    pub floor_ms: u64,
    /// False when the id was released already (nothing done).
    pub changed: bool,
    /// Sessions destroyed (forced), with the lock-delay waited.
    pub destroyed: Vec<String>,
    /// How long the forced release waited for lock-delays.
    pub waited: Duration,
}

/// The owner's confirmed copy as a release found it, and the index of
/// the released mark it wrote over it.
#[derive(Debug)]
struct CopyMark {
    /// The copy's value before (None: there was none).
    previous: Option<Vec<u8>>,
    /// The ModifyIndex of the mark.
    index: u64,
}

/// Why a release was refused or failed.
#[derive(Debug, Error)]
pub enum ReleaseError {
    /// No claim of the id.
    #[error("datacenter id {id} is not claimed in the primary Consul datacenter {primary:?} (no {key}): nothing to release; see `idgen admin datacenters list`")]
    NotClaimed {
        /// The id.
        id: u64,
        /// The primary.
        primary: String,
        /// The KV path.
        key: String,
    },
    /// The owner datacenter still runs nodes of the id.
    #[error("datacenter id {id} is owned by Consul datacenter {owner:?}, which still has {what}: releasing it now would let another datacenter issue IDs while the owner may still issue. Stop the owner's nodes (or wait until their Consul checks fail and their sessions end) and run the release again, or pass --force to destroy their sessions and wait out the lock-delay{reverted}")]
    OwnerAlive {
        /// The id.
        id: u64,
        /// The owner's Consul datacenter.
        owner: String,
        /// The live nodes and locks.
        what: String,
        /// Whether the claim was set back to owned.
        reverted: &'static str,
    },
    /// A record changed under the release.
    #[error("{key} changed while datacenter id {id} was being released (another release or claim ran at the same time): read `idgen admin datacenters list` and run the release again")]
    Changed {
        /// The id.
        id: u64,
        /// The KV path.
        key: String,
    },
    /// A record that is not what it should be.
    #[error("{key} in Consul datacenter {datacenter:?} holds {text:?}, not a {what}; fix or delete it by hand")]
    Corrupt {
        /// The KV path.
        key: String,
        /// Where.
        datacenter: String,
        /// What it should be.
        what: &'static str,
        /// What it holds.
        text: String,
    },
    /// A Consul datacenter did not answer.
    #[error("Consul datacenter {datacenter:?} could not be asked ({source}); the claim of datacenter id {id} is {state}: run the release again once it answers")]
    Consul {
        /// The id.
        id: u64,
        /// Which datacenter.
        datacenter: String,
        /// Where the claim stands.
        state: &'static str,
        /// What failed.
        #[source]
        source: ConsulError,
    },
}

impl Federation {
    /// The primary's name and a client of it.
    async fn primary(&self) -> Result<(String, ConsulClient), ConsulError> {
        let local = self.client.agent_datacenters().await?.datacenter;
        let name = self.primary.clone().unwrap_or_else(|| local.clone());
        let client = self.client_of(&name, &local);
        Ok((name, client))
    }

    /// Where a layout change runs (rule 45): this node's Consul
    /// datacenter, the primary's name and a client of it, and whether the
    /// cluster spans several datacenters (the primary is another one, or,
    /// run in the primary, a claim names another owner).
    pub async fn layout_scope(&self) -> Result<LayoutScope, ConsulError> {
        let local = self.client.agent_datacenters().await?.datacenter;
        let primary = self.primary.clone().unwrap_or_else(|| local.clone());
        let client = self.client_of(&primary, &local);
        let federated = primary != local
            || self
                .list()
                .await?
                .1
                .iter()
                .filter_map(|c| c.claim.as_ref())
                .any(|c| c.consul_datacenter != local);
        Ok(LayoutScope {
            local,
            primary,
            client,
            federated,
        })
    }

    fn client_of(&self, dc: &str, local: &str) -> ConsulClient {
        if dc == local {
            self.client.clone()
        } else {
            self.client.in_datacenter(dc)
        }
    }

    /// Every claim in the primary, by id; the primary's name first.
    pub async fn list(&self) -> Result<(String, Vec<ListedClaim>), ConsulError> {
        let (name, primary) = self.primary().await?;
        let dir = self.keys.datacenter_claims_dir();
        let mut out = Vec::new();
        for e in primary.kv_list(&dir, Consistency::Consistent).await? {
            let Some(id) = e.key.strip_prefix(&dir).and_then(|s| s.parse().ok()) else {
                continue;
            };
            out.push(ListedClaim {
                id,
                claim: parse_claim(&e.value),
                raw: String::from_utf8_lossy(&e.value)
                    .chars()
                    .take(200)
                    .collect(),
            });
        }
        out.sort_by_key(|c| c.id);
        Ok((name, out))
    }

    /// Releases datacenter id `id` (module docs): the steps in order,
    /// `force` destroying the owner's sessions of the id.
    pub async fn release(&self, id: u64, force: bool) -> Result<Released, ReleaseError> {
        let fail = |dc: &str, state, source| ReleaseError::Consul {
            id,
            datacenter: dc.to_owned(),
            state,
            source,
        };
        let (local, primary_name, primary, claim, index) = self.current(id).await?;
        let key = self.keys.datacenter_claim(id);
        if claim.state == ClaimState::Released {
            return Ok(Released {
                floor_ms: claim.floor_ms,
                previous: claim,
                changed: false,
                destroyed: Vec::new(),
                waited: Duration::ZERO,
            });
        }
        let owner_name = claim.consul_datacenter.clone();
        let owner = self.client_of(&owner_name, &local);
        // Step 1, before anything changes: a live owner is refused as is.
        if !force {
            let alive = self
                .alive(&owner, id)
                .await
                .map_err(|e| fail(&owner_name, "unchanged", e))?;
            if !alive.is_empty() {
                return Err(self.owner_alive(id, &claim, alive, ""));
            }
        }
        // Step 2.
        let index = if claim.state == ClaimState::Owned {
            let releasing = DatacenterClaim {
                state: ClaimState::Releasing,
                ..claim.clone()
            };
            self.put_claim(&primary, &primary_name, &key, &releasing, index)
                .await?
        } else {
            index
        };
        // Step 3 before step 1 is checked again: a node of the owner that
        // cannot reach the primary claims and writes marks on the copy, so
        // the copy must vouch for nothing before no live lock is trusted.
        let mark = self
            .mark_copy_released(&owner, &owner_name, id, &claim, &primary_name)
            .await?;
        // Step 1 again, now that no node can start or write a mark on it.
        let (destroyed, waited) = self
            .silence(
                id,
                &owner,
                &owner_name,
                &primary,
                &primary_name,
                &claim,
                (index, &mark),
                force,
            )
            .await?;
        let floor_ms = self
            .highest_mark(&owner, &owner_name, id)
            .await?
            .max(claim.floor_ms);
        let released = DatacenterClaim {
            state: ClaimState::Released,
            floor_ms,
            ..claim.clone()
        };
        self.put_claim(&primary, &primary_name, &key, &released, index)
            .await?;
        tracing::warn!(datacenter_id = id, owner = %owner_name, primary = %primary_name, floor_ms, force, "datacenter id released: the next owner starts above floor_ms");
        Ok(Released {
            previous: claim,
            floor_ms,
            changed: true,
            destroyed,
            waited,
        })
    }

    /// The local datacenter's name, the primary's name and client, and the
    /// claim of `id` with its ModifyIndex.
    async fn current(
        &self,
        id: u64,
    ) -> Result<(String, String, ConsulClient, DatacenterClaim, u64), ReleaseError> {
        let local = self
            .client
            .agent_datacenters()
            .await
            .map_err(|source| ReleaseError::Consul {
                id,
                datacenter: "local".to_owned(),
                state: "unchanged",
                source,
            })?
            .datacenter;
        let primary_name = self.primary.clone().unwrap_or_else(|| local.clone());
        let primary = self.client_of(&primary_name, &local);
        let (claim, index) = self
            .read_claim(&primary, &primary_name, id)
            .await?
            .ok_or_else(|| ReleaseError::NotClaimed {
                id,
                primary: primary_name.clone(),
                key: self.keys.datacenter_claim(id),
            })?;
        Ok((local, primary_name, primary, claim, index))
    }

    async fn read_claim(
        &self,
        primary: &ConsulClient,
        primary_name: &str,
        id: u64,
    ) -> Result<Option<(DatacenterClaim, u64)>, ReleaseError> {
        let key = self.keys.datacenter_claim(id);
        let (entry, _) = primary
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|source| ReleaseError::Consul {
                id,
                datacenter: primary_name.to_owned(),
                state: "unchanged",
                source,
            })?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let claim = parse_claim(&entry.value).ok_or_else(|| ReleaseError::Corrupt {
            key,
            datacenter: primary_name.to_owned(),
            what: "datacenter claim",
            text: String::from_utf8_lossy(&entry.value)
                .chars()
                .take(200)
                .collect(),
        })?;
        Ok(Some((claim, entry.modify_index)))
    }

    /// Writes `claim` over the record at `index`; the new index.
    async fn put_claim(
        &self,
        primary: &ConsulClient,
        primary_name: &str,
        key: &str,
        claim: &DatacenterClaim,
        index: u64,
    ) -> Result<u64, ReleaseError> {
        let id = self.id_of(key);
        let value = serde_json::to_vec(claim).unwrap_or_default();
        let state = if claim.state == ClaimState::Released {
            "releasing"
        } else {
            "unchanged or releasing"
        };
        let fail = |source| ReleaseError::Consul {
            id,
            datacenter: primary_name.to_owned(),
            state,
            source,
        };
        if !primary
            .kv_put(key, &value, KvWrite::Cas(index))
            .await
            .map_err(fail)?
        {
            return Err(ReleaseError::Changed {
                id,
                key: key.to_owned(),
            });
        }
        let (entry, _) = primary
            .kv_get(key, Consistency::Consistent)
            .await
            .map_err(fail)?;
        Ok(entry.map_or(0, |e| e.modify_index))
    }

    fn id_of(&self, key: &str) -> u64 {
        key.rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The owner's passing registered nodes of `id` and its worker locks
    /// of `id` held by live sessions, named for the refusal.
    async fn alive(&self, owner: &ConsulClient, id: u64) -> Result<Vec<String>, ConsulError> {
        let mut alive: Vec<String> = owner
            .health_service(&self.service, true)
            .await?
            .into_iter()
            .filter(|s| s.meta.get("datacenter") == Some(&id.to_string()))
            .map(|s| format!("passing node {} at {}:{}", s.id, s.address, s.port))
            .collect();
        for h in self.held_workers(owner, id).await? {
            alive.push(format!(
                "{} held by session {}",
                h.held,
                h.session.unwrap_or_default()
            ));
        }
        Ok(alive)
    }

    async fn held_workers(
        &self,
        owner: &ConsulClient,
        id: u64,
    ) -> Result<Vec<holders::Holder>, ConsulError> {
        Ok(holders::list(owner, &self.keys)
            .await?
            .into_iter()
            .filter(|h| matches!(h.held, LockKey::Worker(dc, _) if dc == id))
            .filter(|h| matches!(h.state, SessionState::Alive(_)))
            .collect())
    }

    fn owner_alive(
        &self,
        id: u64,
        claim: &DatacenterClaim,
        alive: Vec<String>,
        reverted: &'static str,
    ) -> ReleaseError {
        ReleaseError::OwnerAlive {
            id,
            owner: claim.consul_datacenter.clone(),
            what: alive.join(", "),
            reverted,
        }
    }

    /// Step 1 after the claim is `releasing` (at `index`): without
    /// `force`, a live owner sets the claim back to owned and is refused;
    /// with it, every live session of a worker lock of the id is
    /// destroyed and its lock-delay waited out.
    #[allow(clippy::too_many_arguments)]
    async fn silence(
        &self,
        id: u64,
        owner: &ConsulClient,
        owner_name: &str,
        primary: &ConsulClient,
        primary_name: &str,
        claim: &DatacenterClaim,
        (index, mark): (u64, &CopyMark),
        force: bool,
    ) -> Result<(Vec<String>, Duration), ReleaseError> {
        let fail = |source| ReleaseError::Consul {
            id,
            datacenter: owner_name.to_owned(),
            state: "releasing",
            source,
        };
        if !force {
            #[cfg(test)]
            tests::between_checks(&self.keys.datacenter_claim(id)).await;
            let alive = self.alive(owner, id).await.map_err(fail)?;
            if alive.is_empty() {
                return Ok((Vec::new(), Duration::ZERO));
            }
            let key = self.keys.datacenter_claim(id);
            let owned = DatacenterClaim {
                state: ClaimState::Owned,
                ..claim.clone()
            };
            self.restore_copy(owner, id, mark).await;
            let reverted = match self.put_claim(primary, primary_name, &key, &owned, index).await {
                Ok(_) => " (the claim was set back to owned)",
                Err(_) => " (the claim stays releasing: no node issues on it until the release is run again)",
            };
            return Err(self.owner_alive(id, claim, alive, reverted));
        }
        let mut destroyed = Vec::new();
        let mut waited = Duration::ZERO;
        for holder in self.held_workers(owner, id).await.map_err(fail)? {
            if let Some(r) = holders::force_release(owner, &holder).await.map_err(fail)? {
                destroyed.push(holder.session.clone().unwrap_or_default());
                waited += r.waited;
            }
        }
        Ok((destroyed, waited))
    }

    /// Step 3: the owner's confirmed copy marked released, by
    /// check-and-set (written released where there is none).
    async fn mark_copy_released(
        &self,
        owner: &ConsulClient,
        owner_name: &str,
        id: u64,
        claim: &DatacenterClaim,
        primary_name: &str,
    ) -> Result<CopyMark, ReleaseError> {
        let key = self.keys.datacenter_confirmed(id);
        let fail = |source| ReleaseError::Consul {
            id,
            datacenter: owner_name.to_owned(),
            state: "releasing",
            source,
        };
        let (entry, _) = owner
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(fail)?;
        let index = entry.as_ref().map_or(0, |e| e.modify_index);
        let copy = ConfirmedClaim {
            claim: DatacenterClaim {
                state: ClaimState::Owned,
                ..claim.clone()
            },
            primary: primary_name.to_owned(),
            confirmed_ms: claim.claimed_ms,
            released: true,
        };
        let value = serde_json::to_vec(&copy).unwrap_or_default();
        if !owner
            .kv_put(&key, &value, KvWrite::Cas(index))
            .await
            .map_err(fail)?
        {
            return Err(ReleaseError::Changed { id, key });
        }
        let (written, _) = owner
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(fail)?;
        Ok(CopyMark {
            previous: entry.map(|e| e.value),
            index: written.map_or(0, |e| e.modify_index),
        })
    }

    /// Puts the owner's copy back as it was before `mark` (a refused
    /// release changes nothing), by check-and-set on the mark; best effort:
    /// a copy left marked only keeps the owner from starting on it while
    /// the primary is unreachable.
    async fn restore_copy(&self, owner: &ConsulClient, id: u64, mark: &CopyMark) {
        let key = self.keys.datacenter_confirmed(id);
        let restored = match &mark.previous {
            Some(value) => owner.kv_put(&key, value, KvWrite::Cas(mark.index)).await,
            None => owner.kv_delete(&key, Some(mark.index)).await,
        };
        if !matches!(restored, Ok(true)) {
            tracing::warn!(key, datacenter_id = id, "a refused datacenter release could not put the owner's confirmed copy back; it stays marked released until a node of the owner confirms the claim again");
        }
    }

    /// Step 4: the highest mark under the owner's `hwm/<id>/`.
    async fn highest_mark(
        &self,
        owner: &ConsulClient,
        owner_name: &str,
        id: u64,
    ) -> Result<u64, ReleaseError> {
        let dir = format!("{}{id}/", self.keys.hwm_dir());
        let marks = owner
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(|source| ReleaseError::Consul {
                id,
                datacenter: owner_name.to_owned(),
                state: "releasing",
                source,
            })?;
        let mut highest = 0;
        for e in marks {
            let text = String::from_utf8_lossy(&e.value);
            let mark: u64 = text.trim().parse().map_err(|_| ReleaseError::Corrupt {
                key: e.key.clone(),
                datacenter: owner_name.to_owned(),
                what: "high-water mark (decimal Unix ms)",
                text: text.chars().take(200).collect(),
            })?;
            highest = highest.max(mark);
        }
        Ok(highest)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Mutex, PoisonError};

    use super::*;
    use crate::consul::ServiceRegistration;
    use crate::store::test_consul_client;

    type Hook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

    /// Hooks a release runs between its step 3 and its second liveness
    /// check, by the claim's KV path (each test has a cluster of its own).
    static BETWEEN_CHECKS: Mutex<Vec<(String, Hook)>> = Mutex::new(Vec::new());

    /// Runs (once) the hook armed for the claim at `key`, if any.
    pub(super) async fn between_checks(key: &str) {
        let hook = {
            let mut hooks = BETWEEN_CHECKS
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let at = hooks.iter().position(|(k, _)| k == key);
            at.map(|i| hooks.remove(i).1)
        };
        if let Some(hook) = hook {
            hook().await;
        }
    }

    /// The owner's node comes back between the two liveness checks (it
    /// registers, passing, after the claim turned `releasing` and the
    /// owner's copy was marked released): the release is refused and both
    /// records are put back as they were, so the owner's nodes keep
    /// issuing and keep starting on the copy while the primary is away.
    #[tokio::test]
    async fn an_owner_back_between_the_two_checks_gets_its_claim_and_copy_back() {
        let dc1 = consul_testserver::TestConsul::start(consul_testserver::Config::default())
            .await
            .expect("dc1 starts");
        let dc2 = dc1.add_datacenter("dc2").await.expect("dc2 starts");
        let keys = ClusterPaths::new("idgen", "put-back");
        let (primary, owner) = (
            test_consul_client(dc1.addr()),
            test_consul_client(dc2.addr()),
        );
        let claim =
            br#"{"consul_datacenter":"dc2","cluster":"put-back","claimed_ms":1,"claimed_by":"b1"}"#;
        let copy = br#"{"claim":{"consul_datacenter":"dc2","cluster":"put-back","claimed_ms":1,"claimed_by":"b1"},"primary":"dc1","confirmed_ms":1}"#;
        assert!(primary
            .kv_put(&keys.datacenter_claim(2), claim, KvWrite::Set)
            .await
            .unwrap());
        assert!(owner
            .kv_put(&keys.datacenter_confirmed(2), copy, KvWrite::Set)
            .await
            .unwrap());

        let back = owner.clone();
        let hook: Hook = Box::new(move || {
            Box::pin(async move {
                let node = ServiceRegistration {
                    id: "idgen-b1".into(),
                    name: "idgen".into(),
                    tags: Vec::new(),
                    address: "127.0.0.1".into(),
                    port: 50051,
                    meta: [("datacenter".to_owned(), "2".to_owned())].into(),
                    checks: Vec::new(),
                };
                back.service_register(&node)
                    .await
                    .expect("the owner's node registers");
            })
        });
        BETWEEN_CHECKS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((keys.datacenter_claim(2), hook));

        let federation = Federation {
            client: primary.clone(),
            keys: keys.clone(),
            service: "idgen".into(),
            primary: Some("dc1".into()),
        };
        let e = federation
            .release(2, false)
            .await
            .expect_err("the owner is back: refused");
        let text = e.to_string();
        assert!(
            matches!(
                e,
                ReleaseError::OwnerAlive {
                    reverted: " (the claim was set back to owned)",
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("passing node idgen-b1 at 127.0.0.1:50051"),
            "{text}"
        );
        assert!(
            BETWEEN_CHECKS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty(),
            "the release reached its second check"
        );
        let (record, _) = primary
            .kv_get(&keys.datacenter_claim(2), Consistency::Consistent)
            .await
            .unwrap();
        let record = parse_claim(&record.expect("the claim stays").value).expect("a claim");
        assert_eq!(record.state, ClaimState::Owned, "the claim is owned again");
        assert_eq!(record.consul_datacenter, "dc2");
        let (back, _) = owner
            .kv_get(&keys.datacenter_confirmed(2), Consistency::Consistent)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&back.expect("the copy stays").value),
            String::from_utf8_lossy(copy),
            "the owner's copy is put back as it was, not marked released"
        );
    }
}
