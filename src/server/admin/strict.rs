//! Strict namespaces: their steps, their keys (listed and deleted, a
//! deleted key leaving a tombstone its next use continues above).

use std::sync::Arc;

use tonic::Status;

use super::{store_status, AdminService};
use crate::error::ErrorKind;
use crate::id::strict::Namespace;
use crate::modes::strict::StrictEngine;
use crate::proto;
use crate::server::status::refusal;
use crate::store::StoreError;

fn parse_namespace(name: &str) -> Result<Namespace, Status> {
    Namespace::parse(name).map_err(|e| store_status(e.into()))
}

impl AdminService {
    fn strict(&self) -> Result<&Arc<StrictEngine>, Status> {
        self.deps.strict.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "strict mode is not enabled on this server: set [strict] enabled = true in its config",
            )
        })
    }

    pub(super) async fn set_strict_step(
        &self,
        r: proto::SetStrictStepRequest,
    ) -> Result<proto::SetStrictStepResponse, Status> {
        let strict = self.strict()?;
        let ns = parse_namespace(&r.namespace)?;
        let step = crate::id::strict::check_step(r.step).map_err(|e| store_status(e.into()))?;
        let previous = strict
            .store()
            .namespace_step(&ns)
            .await
            .map_err(store_status)?
            .unwrap_or(strict.default_step());
        strict
            .store()
            .set_namespace_step(&ns, step)
            .await
            .map_err(store_status)?;
        strict.forget_step(&ns);
        tracing::info!(namespace = %ns, step, previous, "strict namespace step set");
        Ok(proto::SetStrictStepResponse {
            namespace: ns.to_string(),
            step,
            previous,
        })
    }

    pub(super) async fn get_strict_step(
        &self,
        r: proto::GetStrictStepRequest,
    ) -> Result<proto::GetStrictStepResponse, Status> {
        let strict = self.strict()?;
        let ns = parse_namespace(&r.namespace)?;
        let stored = strict
            .store()
            .namespace_step(&ns)
            .await
            .map_err(store_status)?;
        Ok(proto::GetStrictStepResponse {
            namespace: ns.to_string(),
            step: stored.unwrap_or(strict.default_step()),
            stored: stored.is_some(),
        })
    }

    pub(super) async fn list_strict_keys(
        &self,
        r: proto::ListStrictKeysRequest,
    ) -> Result<proto::ListStrictKeysResponse, Status> {
        let strict = self.strict()?;
        let ns = parse_namespace(&r.namespace)?;
        let keys = strict.store().list_keys(&ns).await.map_err(store_status)?;
        let tombstones = strict
            .store()
            .list_tombstones(&ns)
            .await
            .map_err(store_status)?;
        let message = |list: Vec<(crate::id::strict::StrictKey, u64)>| {
            list.into_iter()
                .map(|(key, value)| proto::StrictKeyValue {
                    key: key.to_string(),
                    value,
                })
                .collect()
        };
        Ok(proto::ListStrictKeysResponse {
            namespace: ns.to_string(),
            keys: message(keys),
            max_keys: strict.limits().max_keys_per_namespace,
            tombstones: message(tombstones),
        })
    }

    pub(super) async fn delete_strict_key(
        &self,
        r: proto::DeleteStrictKeyRequest,
    ) -> Result<proto::DeleteStrictKeyResponse, Status> {
        let strict = self.strict()?;
        let key = crate::id::strict::StrictKey::parse(&r.key)
            .map_err(|e| store_status(StoreError::from(e)))?;
        let last = strict
            .store()
            .delete_key(&key)
            .await
            .map_err(store_status)?;
        tracing::warn!(%key, last_value = last, "strict key deleted");
        Ok(proto::DeleteStrictKeyResponse {
            key: key.to_string(),
            last_value: last,
            note: format!(
                "strict key {key} is deleted and no longer counts against strict.max_keys_per_namespace. A tombstone with its last value ({last}) stays in the store, so the key used again continues above {last}: values never repeat"
            ),
        })
    }

    pub(super) async fn list_strict_namespaces(
        &self,
    ) -> Result<proto::ListStrictNamespacesResponse, Status> {
        let strict = self.strict()?;
        let default_step = strict.default_step();
        let stored = strict.store().namespaces().await.map_err(store_status)?;
        // Most namespaces never get a stored step: those with live keys are
        // listed too, with the default step they count with.
        let with_keys = strict
            .store()
            .key_namespaces()
            .await
            .map_err(store_status)?;
        let mut all: std::collections::BTreeMap<String, (u64, bool)> = with_keys
            .into_iter()
            .map(|ns| (ns.to_string(), (default_step, false)))
            .collect();
        all.extend(
            stored
                .into_iter()
                .map(|(ns, step)| (ns.to_string(), (step, true))),
        );
        Ok(proto::ListStrictNamespacesResponse {
            namespaces: all
                .into_iter()
                .map(|(namespace, (step, step_stored))| proto::StrictNamespace {
                    namespace,
                    step,
                    step_stored,
                })
                .collect(),
            default_step,
        })
    }
}
