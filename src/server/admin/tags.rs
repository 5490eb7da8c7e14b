//! Segment tags: create, change, read, list and delete. A tag's `max_id`
//! only moves forward, and a deleted tag leaves a tombstone that a
//! re-created tag continues above (see `store::segment`).

use std::sync::Arc;

use tonic::Status;

use super::{check_description, rfc3339, store_status, unreadable, AdminService};
use crate::error::ErrorKind;
use crate::id::segment::SegmentError;
use crate::id::segment::{check_max_id, check_step, Tag, TagHide, TagRecord, TagUpdate};
use crate::proto;
use crate::server::status::refusal;
use crate::store::{CreateTag, SegmentStore, StoreError};

/// The step of a tag created without one.
pub const DEFAULT_TAG_STEP: u64 = 1000;

fn parse_tag(name: &str) -> Result<Tag, Status> {
    Tag::parse(name).map_err(|e| store_status(e.into()))
}

fn tag_message(tag: &Tag, r: &TagRecord) -> proto::SegmentTag {
    proto::SegmentTag {
        tag: tag.to_string(),
        max_id: r.max_id,
        step: r.step,
        description: r.description.clone(),
        created: rfc3339(r.created_ms),
        updated: rfc3339(r.updated_ms),
        hide: r.hide.as_ref().map(|h| proto::TagHide {
            key: h.key.clone(),
            version_bits: h.version_bits,
            domain_bits: h.domain_bits,
        }),
    }
}

/// The `hide` a CreateTag asks for, with the defaults filled in.
fn tag_hide(hide: Option<proto::TagHide>) -> Option<TagHide> {
    hide.map(|h| TagHide {
        key: h.key,
        version_bits: if h.version_bits == 0 {
            4
        } else {
            h.version_bits
        },
        domain_bits: if h.domain_bits == 0 {
            40
        } else {
            h.domain_bits
        },
    })
}

impl AdminService {
    fn segments(&self) -> Result<&Arc<dyn SegmentStore>, Status> {
        self.deps.segments.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "segment mode is not enabled on this server: set [segment] enabled = true in its config",
            )
        })
    }

    /// Refuses a hidden tag whose key does not exist or is retired: such
    /// a tag would be created and then refuse every call.
    async fn check_hide_key(&self, key: &str) -> Result<(), Status> {
        let keys = self.deps.hide_keys.list().await.map_err(store_status)?;
        match keys.iter().find(|k| k.key_id == key) {
            None => Err(refusal(
                ErrorKind::Precondition,
                format!("hide key {key:?} does not exist: create it first (`idgen admin keys create {key}`, or the console's hide keys), then create the tag"),
            )),
            Some(k) if k.active().is_none() => Err(refusal(
                ErrorKind::Precondition,
                format!("hide key {key:?} is retired: it makes no new IDs; rotate it to a new active version first (`idgen admin keys rotate {key}`) or name an active key (`idgen admin keys list`)"),
            )),
            Some(_) => Ok(()),
        }
    }

    pub(super) async fn create_tag(
        &self,
        r: proto::CreateTagRequest,
    ) -> Result<proto::CreateTagResponse, Status> {
        let store = self.segments()?;
        let tag = parse_tag(&r.tag)?;
        let step = if r.step == 0 {
            DEFAULT_TAG_STEP
        } else {
            r.step
        };
        let step = check_step(step).map_err(|e| store_status(e.into()))?;
        let initial = check_max_id(r.initial).map_err(|e| store_status(e.into()))?;
        check_description(&r.description)?;
        if let Some(h) = &r.hide {
            self.check_hide_key(&h.key).await?;
        }
        let record = TagRecord::new(initial, step, &r.description, self.now_ms())
            .and_then(|rec| rec.with_hide(&tag, tag_hide(r.hide)))
            .map_err(|e| store_status(e.into()))?;
        let max_tags = self
            .deps
            .segment_server
            .as_ref()
            .map_or(u64::MAX, |s| s.max_tags());
        let written = store
            .create_tag(&tag, &record, CreateTag::limited(max_tags))
            .await
            .map_err(store_status)?;
        let note = if written.max_id > record.max_id {
            format!(
                "a deleted tag {tag} had handed out IDs up to {}: the tag continues above it (first ID {}), not at {}",
                written.max_id,
                written.max_id + 1,
                initial + 1
            )
        } else {
            String::new()
        };
        tracing::info!(%tag, max_id = written.max_id, step, "segment tag created");
        Ok(proto::CreateTagResponse {
            tag: Some(tag_message(&tag, &written)),
            note,
        })
    }

    pub(super) async fn update_tag(
        &self,
        r: proto::UpdateTagRequest,
    ) -> Result<proto::UpdateTagResponse, Status> {
        let store = self.segments()?;
        let tag = parse_tag(&r.tag)?;
        if let Some(step) = r.step {
            check_step(step).map_err(|e| store_status(e.into()))?;
        }
        if let Some(max_id) = r.max_id {
            check_max_id(max_id).map_err(|e| store_status(e.into()))?;
        }
        if let Some(d) = &r.description {
            check_description(d)?;
        }
        let update = TagUpdate {
            step: r.step,
            description: r.description,
            max_id: r.max_id,
        };
        if update.is_empty() {
            return Err(refusal(
                ErrorKind::BadRequest,
                "nothing to change: set step, description or max_id",
            ));
        }
        let written = store
            .update_tag(&tag, &update, self.now_ms())
            .await
            .map_err(store_status)?;
        tracing::info!(%tag, max_id = written.max_id, step = written.step, "segment tag updated");
        Ok(proto::UpdateTagResponse {
            tag: Some(tag_message(&tag, &written)),
        })
    }

    pub(super) async fn get_tag(
        &self,
        r: proto::GetTagRequest,
    ) -> Result<proto::GetTagResponse, Status> {
        let store = self.segments()?;
        let tag = parse_tag(&r.tag)?;
        let record = store
            .get_tag(&tag)
            .await
            .map_err(store_status)?
            .ok_or_else(|| {
                store_status(StoreError::Segment(SegmentError::TagNotFound(
                    tag.to_string(),
                )))
            })?;
        Ok(proto::GetTagResponse {
            tag: Some(tag_message(&tag, &record)),
        })
    }

    pub(super) async fn list_tags(&self) -> Result<proto::ListTagsResponse, Status> {
        let store = self.segments()?;
        let listing = store.list_tags().await.map_err(store_status)?;
        for (key, error) in &listing.unreadable {
            tracing::error!(
                key,
                error,
                "segment record unreadable: left out of the tag list"
            );
        }
        Ok(proto::ListTagsResponse {
            tags: listing
                .tags
                .iter()
                .map(|(t, r)| tag_message(t, r))
                .collect(),
            unreadable: unreadable(listing.unreadable),
        })
    }

    pub(super) async fn delete_tag(
        &self,
        r: proto::DeleteTagRequest,
    ) -> Result<proto::DeleteTagResponse, Status> {
        let store = self.segments()?;
        let tag = parse_tag(&r.tag)?;
        let tombstone = store
            .delete_tag(&tag, self.now_ms())
            .await
            .map_err(store_status)?;
        if let Some(segments) = &self.deps.segment_server {
            segments.release(&tag, "deleted");
        }
        tracing::warn!(%tag, max_id = tombstone.max_id, "segment tag deleted");
        Ok(proto::DeleteTagResponse {
            tag: tag.to_string(),
            max_id: tombstone.max_id,
            note: format!(
                "tag {tag} is deleted: new ranges are refused (NOT_FOUND), also where segment.auto_create is on (auto-creation never brings a deleted tag back). Its record stays as a tombstone with max_id {}, so creating {tag} again with `idgen admin tags create` continues above it. Nodes that already hold a range of it may serve the rest of that range (IDs never handed out before) until it runs out.",
                tombstone.max_id
            ),
        })
    }
}
