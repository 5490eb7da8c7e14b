//! Format definitions: create, change, read, list, delete and reload.
//! Changes run to their end on a task of their own (`to_the_end`).

use std::sync::Arc;

use tonic::Status;

use super::{check_description, rfc3339, store_status, to_the_end, unreadable, AdminService};
use crate::error::ErrorKind;
use crate::id::format::FormatDef;
use crate::id::format::FormatError;
use crate::modes::format_catalog::{FormatCatalog, ReloadError, Reloaded};
use crate::proto;
use crate::server::status::{refusal, to_status};
use crate::store::format::catalog::StoredFormat;
use crate::store::StoreError;

/// A definition given as JSON, refused naming what is wrong.
fn parse_definition(json: &str) -> Result<FormatDef, Status> {
    if json.trim().is_empty() {
        return Err(refusal(
            ErrorKind::BadRequest,
            "definition_json is empty: give the format as JSON, with the keys of a config file's [[formats]] entry (name, template | lua | preset, zone, reset, ...)",
        ));
    }
    serde_json::from_str(json).map_err(|e| {
        refusal(
            ErrorKind::BadRequest,
            format!("definition_json is not a format definition: {e}"),
        )
    })
}

fn reload_message(r: Reloaded) -> proto::ReloadFormatsResponse {
    proto::ReloadFormatsResponse {
        formats: r.formats,
        changed: r.changed,
    }
}

fn reload_status(e: &ReloadError) -> Status {
    refusal(
        e.kind,
        format!("reload refused, the previous formats are still served: {e}"),
    )
}

impl AdminService {
    fn catalog(&self) -> Result<&Arc<FormatCatalog>, Status> {
        self.deps.formats.as_ref().ok_or_else(|| {
            refusal(
                ErrorKind::Precondition,
                "formatted mode is not running on this server",
            )
        })
    }

    fn format_message(&self, f: &StoredFormat) -> proto::FormatDefinition {
        let served = self
            .deps
            .formats
            .as_ref()
            .is_some_and(|c| !f.deleted && c.formats().table().contains_key(&f.def.name));
        proto::FormatDefinition {
            name: f.def.name.clone(),
            definition_json: serde_json::to_string(&f.def).unwrap_or_default(),
            deleted: f.deleted,
            source: f.source.as_str().to_owned(),
            created: rfc3339(f.created_ms),
            updated: rfc3339(f.updated_ms),
            served,
        }
    }

    pub(super) async fn create_format(
        &self,
        r: proto::CreateFormatRequest,
    ) -> Result<proto::CreateFormatResponse, Status> {
        let catalog = Arc::clone(self.catalog()?);
        let def = parse_definition(&r.definition_json)?;
        check_description(&def.description)?;
        let fresh = r.fresh;
        let (written, reload) = to_the_end(format!("create {}", def.name), async move {
            catalog.create(def, fresh).await
        })
        .await?
        .map_err(|e| to_status(&e))?;
        let catalog = self.catalog()?;
        self.warn_one_node_format(catalog, &written.def.name);
        Ok(proto::CreateFormatResponse {
            format: Some(self.format_message(&written)),
            reload: Some(reload_message(reload)),
        })
    }

    /// On the embedded store, a new format with one counter for the whole
    /// cluster is named at once, as at start-up: another embedded node
    /// would hand out the same IDs of it.
    fn warn_one_node_format(&self, catalog: &FormatCatalog, name: &str) {
        if self.deps.snapshots.is_none() {
            return; // Consul: one counter in KV for every node.
        }
        let cluster_wide = catalog
            .formats()
            .get(name)
            .is_ok_and(|f| f.scope() == crate::id::format::Scope::Cluster);
        if cluster_wide {
            let names = [name.to_owned()];
            tracing::warn!(
                format = name,
                "{}",
                crate::store::format::counters::one_node_formats_warning(&names)
            );
        }
    }

    pub(super) async fn update_format(
        &self,
        r: proto::UpdateFormatRequest,
    ) -> Result<proto::UpdateFormatResponse, Status> {
        let catalog = self.catalog()?;
        let def = parse_definition(&r.definition_json)?;
        check_description(&def.description)?;
        let previous = catalog.store().get(&def.name).await.map_err(store_status)?;
        let catalog = Arc::clone(catalog);
        let (written, reload) = to_the_end(format!("update {}", def.name), async move {
            catalog.update(def).await
        })
        .await?
        .map_err(|e| to_status(&e))?;
        Ok(proto::UpdateFormatResponse {
            format: Some(self.format_message(&written)),
            previous: previous.map(|p| self.format_message(&p)),
            reload: Some(reload_message(reload)),
        })
    }

    pub(super) async fn get_format(
        &self,
        r: proto::GetFormatRequest,
    ) -> Result<proto::GetFormatResponse, Status> {
        let catalog = self.catalog()?;
        crate::id::format::check_name(&r.name).map_err(|e| store_status(e.into()))?;
        let stored = catalog
            .store()
            .get(&r.name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| {
                store_status(StoreError::Format(FormatError::NotFound(r.name.clone())))
            })?;
        Ok(proto::GetFormatResponse {
            format: Some(self.format_message(&stored)),
        })
    }

    pub(super) async fn list_formats(&self) -> Result<proto::ListFormatsResponse, Status> {
        let catalog = self.catalog()?;
        let listing = catalog.store().list().await.map_err(store_status)?;
        Ok(proto::ListFormatsResponse {
            formats: listing
                .formats
                .iter()
                .map(|f| self.format_message(f))
                .collect(),
            unreadable: unreadable(listing.unreadable),
        })
    }

    pub(super) async fn delete_format(
        &self,
        r: proto::DeleteFormatRequest,
    ) -> Result<proto::DeleteFormatResponse, Status> {
        let catalog = Arc::clone(self.catalog()?);
        let name = r.name.clone();
        let (tombstone, reload) = to_the_end(format!("delete {name}"), async move {
            catalog.delete(&name).await
        })
        .await?
        .map_err(|e| to_status(&e))?;
        Ok(proto::DeleteFormatResponse {
            format: Some(self.format_message(&tombstone)),
            note: format!(
                "format {} is deleted: calls get NOT_FOUND (other Consul nodes within a few seconds). Its definition and counters stay in the store as a tombstone, and the name can never be created again, since a new definition could repeat IDs it handed out; remove it from every config file's [[formats]] too",
                r.name
            ),
            reload: Some(reload_message(reload)),
        })
    }

    pub(super) async fn reload_formats(&self) -> Result<proto::ReloadFormatsResponse, Status> {
        let catalog = self.catalog()?;
        let reloaded = catalog
            .reload("admin")
            .await
            .map_err(|e| reload_status(&e))?;
        tracing::info!(formats = ?reloaded.formats, changed = ?reloaded.changed, "formats reloaded (admin)");
        Ok(reload_message(reloaded))
    }
}
