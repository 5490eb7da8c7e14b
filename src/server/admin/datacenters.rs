//! Datacenter id claims: listed, and released (rule 44). The claims and
//! the release's steps are `store::datacenter_release`; this file checks
//! requests, maps refusals to codes and audits each release.

use tonic::Status;

use super::{consul_status, rfc3339, to_the_end, AdminService};
use crate::cluster::datacenter_release::{Federation, ReleaseError};
use crate::error::ErrorKind;
use crate::proto;
use crate::server::status::refusal;
use crate::store::datacenter_claim::DatacenterClaim;

/// A claim as a reply carries it.
fn claim_message(id: u64, c: &DatacenterClaim) -> proto::DatacenterClaim {
    proto::DatacenterClaim {
        id,
        consul_datacenter: c.consul_datacenter.clone(),
        cluster: c.cluster.clone(),
        claimed_by: c.claimed_by.clone(),
        claimed: rfc3339(c.claimed_ms),
        state: c.state.as_str().to_owned(),
        floor_ms: c.floor_ms,
    }
}

/// The code of a refused or failed release.
fn release_status(e: &ReleaseError) -> Status {
    let kind = match e {
        ReleaseError::NotClaimed { .. } => ErrorKind::NotFound,
        ReleaseError::OwnerAlive { .. } | ReleaseError::Corrupt { .. } => ErrorKind::Precondition,
        ReleaseError::Changed { .. } => ErrorKind::Conflict,
        ReleaseError::Consul { .. } => ErrorKind::Unavailable,
    };
    refusal(kind, e.to_string())
}

impl AdminService {
    fn federation(&self) -> Result<&Federation, Status> {
        self.deps.datacenters.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: datacenter ids are claimed only in Consul (store.backend = \"consul\")",
            )
        })
    }

    pub(super) async fn list_datacenters(&self) -> Result<proto::ListDatacentersResponse, Status> {
        let (primary, listed) = self.federation()?.list().await.map_err(consul_status)?;
        let mut claims = Vec::new();
        let mut unreadable = Vec::new();
        for c in listed {
            match &c.claim {
                Some(claim) => claims.push(claim_message(c.id, claim)),
                None => unreadable.push(proto::UnreadableRecord {
                    key: format!("datacenters/{}", c.id),
                    error: format!("not a datacenter claim: {:?}", c.raw),
                }),
            }
        }
        Ok(proto::ListDatacentersResponse {
            primary,
            claims,
            unreadable,
        })
    }

    pub(super) async fn release_datacenter(
        &self,
        who: String,
        r: proto::ReleaseDatacenterRequest,
    ) -> Result<proto::ReleaseDatacenterResponse, Status> {
        let federation = self.federation()?.clone();
        let (id, force) = (r.id, r.force);
        // On its own task: dropped after it marked the claim releasing (a
        // forced release waits out a lock-delay, longer than the CLI's
        // default deadline), the claim stayed releasing and its datacenter
        // fenced.
        let result = to_the_end(format!("release of datacenter id {id}"), async move {
            federation.release(id, force).await
        })
        .await?;
        let done = match result {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(target: "idgen::audit", action = "release_datacenter", who, datacenter_id = r.id, force = r.force, error = %e, "datacenter id release refused or failed");
                return Err(release_status(&e));
            }
        };
        let owner = &done.previous.consul_datacenter;
        let message = if done.changed {
            tracing::info!(target: "idgen::audit", action = "release_datacenter", who, datacenter_id = r.id, force = r.force, owner = %owner, floor_ms = done.floor_ms, destroyed = ?done.destroyed, "datacenter id released");
            format!(
                "released datacenter id {} of Consul datacenter {owner:?}{}: another Consul datacenter's nodes can claim it now, and they start above {} ms (the old owner's highest mark)",
                r.id,
                if done.destroyed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (destroyed session(s) {} and waited out their lock-delay)",
                        done.destroyed.join(", ")
                    )
                },
                done.floor_ms
            )
        } else {
            format!(
                "datacenter id {} was released already (last owner {owner:?}, floor {} ms): nothing to do",
                r.id, done.floor_ms
            )
        };
        Ok(proto::ReleaseDatacenterResponse {
            released: done.changed,
            message,
            previous: Some(claim_message(r.id, &done.previous)),
            floor_ms: done.floor_ms,
            waited_ms: u64::try_from(done.waited.as_millis()).unwrap_or(u64::MAX),
        })
    }
}
