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

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::kv_paths::ClusterPaths;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite};

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
}

impl DatacenterRegistry {
    /// Finds this node's Consul datacenter and the primary (`configured`,
    /// else its own datacenter: set, it is a decision of the operator,
    /// since every renewal then needs the primary to answer).
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
        let (entry, _) = self
            .primary
            .kv_get(&self.key, Consistency::Consistent)
            .await
            .map_err(|e| self.unreachable(e))?;
        entry
            .map(|e| {
                serde_json::from_slice(&e.value).map_err(|_| DatacenterClaimError::Corrupt {
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

    fn owned(&self, claim: DatacenterClaim) -> Result<DatacenterClaim, DatacenterClaimError> {
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
    /// refused when another Consul datacenter owns it.
    pub async fn ensure(&self, instance: &str) -> Result<DatacenterClaim, DatacenterClaimError> {
        for _ in 0..3 {
            if let Some(claim) = self.read().await? {
                return self.owned(claim);
            }
            let claim = DatacenterClaim {
                consul_datacenter: self.local.clone(),
                cluster: self.cluster.clone(),
                claimed_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                claimed_by: instance.to_owned(),
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
                .kv_put(&self.key, &value, KvWrite::Cas(0))
                .await
            {
                Ok(true) => {
                    tracing::info!(datacenter_id = self.id, consul_datacenter = %self.local, primary = %self.primary_name, "datacenter id claimed in the primary Consul datacenter");
                }
                Ok(false) => {}
                Err(e) if e.outcome_unknown() => {}
                Err(e) => return Err(self.unreachable(e)),
            }
        }
        match self.read().await? {
            Some(claim) => self.owned(claim),
            None => Err(DatacenterClaimError::Released {
                id: self.id,
                primary: self.primary_name.clone(),
            }),
        }
    }

    /// At every mark renewal: the claim still exists and is this
    /// datacenter's.
    pub async fn check(&self) -> Result<DatacenterClaim, DatacenterClaimError> {
        match self.read().await? {
            Some(claim) => self.owned(claim),
            None => Err(DatacenterClaimError::Released {
                id: self.id,
                primary: self.primary_name.clone(),
            }),
        }
    }
}
