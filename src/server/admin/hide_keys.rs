//! Hide keys (issue 23): create, rotate, retire and list, through
//! [`HideKeyRings`](crate::modes::hide_keys::HideKeyRings) so this node
//! serves a change at once and every change is audit-logged with the
//! caller. Replies carry versions and states, never key material.

use std::sync::Arc;

use tonic::{Request, Status};

use super::{rfc3339, store_status, AdminService};
use crate::cluster::status::HideUse;
use crate::id::hide::KeyVersion;
use crate::proto;
use crate::server::tls::PeerCertificate;
use crate::store::hide_keys::{HideKeyInfo, VersionLimit};

/// A namespace `what` whose version field has `bits` bits.
fn within_bits(what: String, bits: u32) -> (KeyVersion, String) {
    let max = ((1u32 << bits.min(8)) - 1) as KeyVersion;
    (
        max,
        format!("{what} ({bits} version bits, versions 0 to {max})"),
    )
}

/// Who made an admin call, for the audit log: the client certificate's
/// first name, or "admin token" (never the token itself), and the peer.
pub(crate) fn caller<T>(request: &Request<T>) -> String {
    let peer = request
        .remote_addr()
        .map_or_else(|| "unknown peer".to_owned(), |p| p.ip().to_string());
    match request
        .extensions()
        .get::<PeerCertificate>()
        .and_then(|c| c.names.first().cloned())
    {
        Some(name) => format!("certificate {name} from {peer}"),
        None => format!("admin token from {peer}"),
    }
}

/// A key as a reply carries it.
pub(crate) fn key_message(info: &HideKeyInfo) -> proto::HideKey {
    proto::HideKey {
        key_id: info.key_id.clone(),
        versions: info
            .versions
            .iter()
            .map(|v| proto::HideKeyVersion {
                version: u32::from(v.version),
                state: v.state.as_str().to_owned(),
                created_ms: v.created_ms,
                created: rfc3339(v.created_ms),
            })
            .collect(),
        active: info.active().map(u32::from),
    }
}

/// A key as the console's JSON API shows it.
pub(crate) fn key_json(k: &proto::HideKey) -> serde_json::Value {
    serde_json::json!({
        "key_id": k.key_id,
        "active": k.active,
        "versions": k.versions.iter().map(|v| serde_json::json!({
            "version": v.version,
            "state": v.state,
            "created_ms": v.created_ms,
            "created": v.created,
        })).collect::<Vec<_>>(),
    })
}

fn changed(info: HideKeyInfo) -> proto::HideKeyChangeResponse {
    proto::HideKeyChangeResponse {
        key: Some(key_message(&info)),
    }
}

/// A change of one key, as [`HideKeyRings`](crate::modes::hide_keys::HideKeyRings) makes it.
#[derive(Clone)]
enum KeyAction {
    Create,
    /// Within the limit, if any.
    Rotate(Option<VersionLimit>),
    Retire,
}

impl AdminService {
    pub(super) async fn create_hide_key(
        &self,
        who: String,
        r: proto::CreateHideKeyRequest,
    ) -> Result<proto::HideKeyChangeResponse, Status> {
        self.change_hide_key(KeyAction::Create, r.key_id, who).await
    }

    pub(super) async fn rotate_hide_key(
        &self,
        who: String,
        r: proto::RotateHideKeyRequest,
    ) -> Result<proto::HideKeyChangeResponse, Status> {
        let limit = if r.force {
            tracing::warn!(key_id = %r.key_id, %who, "hide key rotated with force: namespaces whose field cannot hold the new version stop issuing");
            None
        } else {
            self.version_limit(&r.key_id).await?
        };
        self.change_hide_key(KeyAction::Rotate(limit), r.key_id, who)
            .await
    }

    /// This node's hidden namespaces that only its config file names: its
    /// hidden snowflake layout and hidden lease zone (published in its
    /// status record on Consul, for other nodes' rotation checks).
    pub fn local_hide_uses(&self) -> Vec<HideUse> {
        let mut uses = Vec::new();
        if let Some((key, bits)) = &self.deps.node.layout_hide {
            uses.push(HideUse {
                key: key.clone(),
                namespace: "the snowflake layout".to_owned(),
                version_bits: *bits,
            });
        }
        if let Some((zone, key, bits)) = self.deps.node.lease.as_ref().and_then(|l| l.hide_key()) {
            uses.push(HideUse {
                key: key.to_owned(),
                namespace: format!("lease zone {zone}"),
                version_bits: bits,
            });
        }
        uses
    }

    /// The narrowest version field among the namespaces that show IDs
    /// under `key_id` (formats with a hidden counter, live hidden segment
    /// tags, this node's hidden snowflake layout and lease zone, and on
    /// Consul those every other node published in its status record),
    /// naming those that have it; `None` when no namespace limits the key
    /// below what the store allows.
    async fn version_limit(&self, key_id: &str) -> Result<Option<VersionLimit>, Status> {
        let mut users: Vec<(KeyVersion, String)> = Vec::new();
        let formats = self.deps.formats.as_ref().map(|c| Arc::clone(c.formats()));
        if let Some(formats) = formats.or_else(|| self.deps.node.formats.clone()) {
            for (name, format) in formats.table().iter() {
                if let Some(t) = format.template().filter(|t| t.hidden_seq()) {
                    if format.def().hide_key_id() == key_id {
                        let field = format!("a hidden counter of {} digits", t.seq_width());
                        users.push((9, format!("format {name:?} ({field}, versions 0 to 9)")));
                    }
                }
            }
        }
        if let Some(segments) = &self.deps.segments {
            let listing = segments.list_tags().await.map_err(store_status)?;
            for (tag, record) in &listing.tags {
                if let Some(h) = record.hide.as_ref().filter(|h| h.key == key_id) {
                    users.push(within_bits(
                        format!("segment tag {:?}", tag.as_str()),
                        h.version_bits,
                    ));
                }
            }
        }
        for u in self.local_hide_uses() {
            if u.key == key_id {
                users.push(within_bits(u.namespace, u.version_bits));
            }
        }
        // Other nodes' hidden lease zones and layouts are in their own
        // config files: each publishes them in its status record.
        if let Some((client, keys)) = &self.deps.cluster {
            let records = crate::cluster::status::records(client, keys)
                .await
                .map_err(|e| {
                    Status::unavailable(format!(
                        "cannot read the other nodes' status records from Consul to check which of their hidden lease zones and snowflake layouts use key {key_id:?}: {e}; retry, or rotate with --force if you know that none of them holds fewer versions"
                    ))
                })?;
            for r in records
                .iter()
                .filter(|r| r.instance() != self.deps.node.instance)
            {
                for u in r.hides.iter().filter(|u| u.key == key_id) {
                    let what = format!("{} of node {}", u.namespace, r.instance());
                    users.push(within_bits(what, u.version_bits));
                }
            }
        }
        let Some(max) = users.iter().map(|(max, _)| *max).min() else {
            return Ok(None);
        };
        let holders: Vec<String> = users
            .into_iter()
            .filter(|(m, _)| *m == max)
            .map(|(_, what)| what)
            .collect();
        Ok(Some(VersionLimit {
            max,
            holders: holders.join(", "),
        }))
    }

    pub(super) async fn retire_hide_key(
        &self,
        who: String,
        r: proto::RetireHideKeyRequest,
    ) -> Result<proto::HideKeyChangeResponse, Status> {
        self.change_hide_key(KeyAction::Retire, r.key_id, who).await
    }

    /// Runs `action` on its own task, so a caller that goes away cannot
    /// stop a change between its write and the rings' reload and audit.
    async fn change_hide_key(
        &self,
        action: KeyAction,
        key_id: String,
        who: String,
    ) -> Result<proto::HideKeyChangeResponse, Status> {
        let rings = self.deps.hide_keys.clone();
        let info = tokio::spawn(async move {
            match action {
                KeyAction::Create => rings.create(&key_id, &who).await,
                KeyAction::Rotate(limit) => rings.rotate_within(&key_id, &who, limit).await,
                KeyAction::Retire => rings.retire(&key_id, &who).await,
            }
        })
        .await
        .map_err(|e| Status::internal(format!("the hide key change stopped: {e}")))?
        .map_err(store_status)?;
        Ok(changed(info))
    }

    pub(super) async fn list_hide_keys(&self) -> Result<proto::ListHideKeysResponse, Status> {
        let keys = self.deps.hide_keys.list().await.map_err(store_status)?;
        Ok(proto::ListHideKeysResponse {
            keys: keys.iter().map(key_message).collect(),
        })
    }
}
