//! The cluster's ID layout: read, and changed only when no ID can repeat
//! (see `store::cluster_layout`).

use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use super::{consul_status, to_the_end, AdminService};
use crate::consul::ConsulClient;
use crate::error::{Error, ErrorKind};
use crate::proto;
use crate::server::status::{refusal, to_status};
use crate::store::cluster_layout::{
    change_federated_layout, change_layout, read_layout, LayoutFederation, LayoutRecord,
    RecordedLayout,
};
use crate::store::kv_paths::ClusterPaths;

impl AdminService {
    fn cluster(&self) -> Result<&(ConsulClient, ClusterPaths), Status> {
        self.deps.cluster.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "the cluster layout lives in Consul: this server runs on the embedded store, whose state file records its layout at `idgen init` and refuses another one",
            )
        })
    }

    pub(super) async fn get_layout(&self) -> Result<proto::GetLayoutResponse, Status> {
        let (client, keys) = self.cluster()?;
        match read_layout(client, keys).await {
            Ok(Some((record, _))) => Ok(layout_response(&record)),
            Ok(None) => Err(refusal(
                ErrorKind::NotFound,
                format!(
                    "no layout recorded at {} yet (the first node to start records it)",
                    keys.layout()
                ),
            )),
            Err(e) => Err(to_status(&Error::ClusterLayout(e))),
        }
    }

    pub(super) async fn set_layout(
        &self,
        r: proto::SetLayoutRequest,
    ) -> Result<proto::SetLayoutResponse, Status> {
        let (client, keys) = self.cluster()?;
        if r.preset.is_empty() || r.epoch.is_empty() {
            return Err(refusal(ErrorKind::BadRequest,
                "give the new layout's preset and epoch (as in the [layout] config section), plus any width overrides",
            ));
        }
        let width = |name: &str, v: Option<u32>| -> Result<Option<u8>, Status> {
            v.map(|b| {
                u8::try_from(b).map_err(|_| {
                    refusal(
                        ErrorKind::BadRequest,
                        format!("layout.{name} = {b} is out of range"),
                    )
                })
            })
            .transpose()
        };
        let section = crate::config::LayoutSection {
            preset: r.preset.clone(),
            epoch: r.epoch.clone(),
            time_unit: r.time_unit_ms.map(Duration::from_millis),
            time_bits: width("time_bits", r.time_bits)?,
            datacenter_bits: width("datacenter_bits", r.datacenter_bits)?,
            worker_bits: width("worker_bits", r.worker_bits)?,
            sequence_bits: width("sequence_bits", r.sequence_bits)?,
            // A hidden cluster's layout cannot be changed (change_layout
            // refuses it), so the target is always plain.
            ..Default::default()
        };
        let file = crate::config::FileConfig {
            layout: section.clone(),
            ..Default::default()
        };
        let layout = file
            .layout(self.now_ms())
            .map_err(|e| refusal(ErrorKind::BadRequest, e.to_string()))?;
        let expect = (r.expect_generation != 0).then_some(r.expect_generation);
        let by = format!(
            "`idgen admin layout set` on node {} ({})",
            self.deps.node.instance, self.deps.node.address
        );
        let preset = section.preset_name();
        let clock = Arc::clone(&self.deps.clock);
        let scope = match &self.deps.datacenters {
            Some(federation) => Some(federation.layout_scope().await.map_err(consul_status)?),
            None => None,
        };
        let (client, keys) = (client.clone(), keys.clone());
        // On its own task: dropped between its two writes, the change left
        // the record marked changing and every node fenced.
        let changed = to_the_end(format!("layout change to {preset}"), async move {
            let clock = clock.as_ref();
            match scope.filter(|s| s.federated) {
                // Rule 45: the primary's record first, then this datacenter's.
                Some(s) => {
                    let fed = LayoutFederation {
                        primary: &s.primary,
                        primary_client: &s.client,
                        local: (s.primary != s.local).then_some(&client),
                    };
                    change_federated_layout(fed, &keys, (&layout, &preset), expect, clock, &by)
                        .await
                }
                None => change_layout(&client, &keys, (&layout, &preset), expect, clock, &by).await,
            }
        })
        .await?;
        let report = changed.map_err(|e| to_status(&Error::ClusterLayout(e)))?;
        Ok(proto::SetLayoutResponse {
            record: Some(layout_response(&report.record)),
            old_max_id: report.old_max_id,
            new_first_id: report.new_first_id,
        })
    }
}

fn layout_message(l: &RecordedLayout) -> proto::IdLayout {
    proto::IdLayout {
        preset: l.preset.clone(),
        epoch: l.epoch.clone(),
        epoch_ms: l.epoch_ms,
        time_unit_ms: l.time_unit_ms,
        time_bits: l.time_bits.into(),
        datacenter_bits: l.datacenter_bits.into(),
        worker_bits: l.worker_bits.into(),
        sequence_bits: l.sequence_bits.into(),
    }
}

fn layout_response(r: &LayoutRecord) -> proto::GetLayoutResponse {
    proto::GetLayoutResponse {
        layout: Some(layout_message(&r.layout)),
        generation: r.generation,
        floor_ms: r.floor_ms,
        changing: r.changing_to.is_some(),
        history: r
            .history
            .iter()
            .map(|h| proto::LayoutHistoryEntry {
                generation: h.generation,
                layout: Some(layout_message(&h.layout)),
                replaced_ms: h.replaced_ms,
                max_id: h.max_id,
            })
            .collect(),
    }
}
