//! What a node holds under its worker lock's session besides the lock:
//! lease mode's token and formatted mode's tokens, moved to the new
//! session after every re-claim and given back at shutdown.

use std::sync::Arc;

use crate::cluster::membership::SessionBound;
use crate::consul::ConsulClient;
use crate::modes::lease::LeaseEngine;
use crate::modes::Issuer;
use crate::store::format::tokens::{ConsulFormatTokens, FormatTokens};
use crate::store::kv_paths::{ClusterPaths, OwnerInfo};
use crate::store::lease::ConsulLeaseTokens;
use crate::store::StoreError;

/// Lease mode's token in a cluster: held under the worker lock's session,
/// so it follows every re-claim to the new session.
struct SessionTokens {
    leases: Arc<LeaseEngine>,
    client: ConsulClient,
    keys: ClusterPaths,
    zone: u64,
    /// The zone's largest token (lower for a hidden zone).
    max_token: u64,
}

#[async_trait::async_trait]
impl SessionBound for SessionTokens {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        let tokens = ConsulLeaseTokens::new(
            self.client.clone(),
            self.keys.clone(),
            self.zone,
            session.to_owned(),
            owner.clone(),
        )?
        .with_max_token(self.max_token);
        self.leases.install(Arc::new(tokens));
        Ok(())
    }

    async fn release(&self) {
        if let Err(e) = self.leases.release().await {
            tracing::warn!(error = %e, "cannot release the lease token; it frees itself when the session ends");
        }
    }
}

/// Formatted mode's tokens in a cluster: held under the worker lock's
/// session, taken again under the new one after every re-claim.
struct SessionFormatTokens(Arc<ConsulFormatTokens>);

#[async_trait::async_trait]
impl SessionBound for SessionFormatTokens {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        self.0.moved(session, owner);
        Ok(())
    }

    async fn release(&self) {
        self.0.release().await;
    }
}

/// Everything held under the worker lock's session, moved and released
/// together.
struct SessionHeld(Vec<Arc<dyn SessionBound>>);

#[async_trait::async_trait]
impl SessionBound for SessionHeld {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        let mut result = Ok(());
        for held in &self.0 {
            if let Err(e) = held.moved(session, owner) {
                result = Err(e);
            }
        }
        result
    }

    async fn release(&self) {
        for held in &self.0 {
            held.release().await;
        }
    }
}

/// What `issuer` holds under the worker lock's session: lease mode's
/// token (in `zone`: the zone and its largest token) and formatted mode's
/// tokens, when enabled.
pub(super) fn session_held(
    issuer: &Issuer,
    zone: Option<(u64, u64)>,
    (client, keys): (ConsulClient, ClusterPaths),
    format_tokens: Arc<ConsulFormatTokens>,
) -> Option<Arc<dyn SessionBound>> {
    let mut held: Vec<Arc<dyn SessionBound>> = Vec::new();
    if let (Some((zone, max_token)), Some(leases)) = (zone, issuer.leases()) {
        held.push(Arc::new(SessionTokens {
            leases: Arc::clone(leases),
            client,
            keys,
            zone,
            max_token,
        }));
    }
    if issuer.formats().is_some() {
        held.push(Arc::new(SessionFormatTokens(format_tokens)));
    }
    (!held.is_empty()).then(|| Arc::new(SessionHeld(held)) as Arc<dyn SessionBound>)
}
