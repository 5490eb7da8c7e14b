//! The embedded state file's snapshot (`Backup`), and the skip-ahead of
//! every counter after a Consul snapshot is restored (`SkipAhead`).

use tonic::{Request, Response, Status};

use super::{to_the_end, AdminService};
use crate::error::{Error, ErrorKind};
use crate::proto;
use crate::server::status::{refusal, to_status};

/// Largest piece of a snapshot per message.
const BACKUP_CHUNK: usize = 1 << 20;

/// The stream `Backup` answers with.
pub type BackupStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<proto::BackupChunk, Status>> + Send + 'static>,
>;

impl AdminService {
    /// `Backup`: the snapshot, taken through [`AdminService::call`], as a
    /// stream of chunks.
    pub(super) async fn backup_stream(
        &self,
        request: Request<proto::BackupRequest>,
    ) -> Result<Response<BackupStream>, Status> {
        let taken_at_ms = self.deps.clock.now_millis();
        let bytes = self
            .call("Backup", request, |_| {
                AdminService::backup(self, taken_at_ms)
            })
            .await?
            .into_inner();
        let total_bytes = bytes.len() as u64;
        tracing::info!(total_bytes, "state file snapshot taken for a backup");
        // (After a lost state file this is the rescue snapshot: see
        // `SnapshotSource::take`.)
        let chunks: Vec<Result<proto::BackupChunk, Status>> = bytes
            .chunks(BACKUP_CHUNK)
            .map(|c| {
                Ok(proto::BackupChunk {
                    data: c.to_vec(),
                    taken_at_ms,
                    total_bytes,
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn backup(&self, now_ms: u64) -> Result<Vec<u8>, Status> {
        let Some(source) = self.deps.snapshots.clone() else {
            return Err(refusal(ErrorKind::Precondition,
                "Backup copies the embedded state file; this node keeps its state in Consul: back up Consul instead (`consul snapshot save`)",
            ));
        };
        let taken = tokio::task::spawn_blocking(move || source.take(now_ms))
            .await
            .map_err(|e| refusal(ErrorKind::Internal, format!("backup task failed: {e}")))?;
        taken.map_err(|e| to_status(&Error::from(e)))
    }

    pub(super) async fn skip_ahead(
        &self,
        r: proto::SkipAheadRequest,
    ) -> Result<proto::SkipAheadResponse, Status> {
        let Some((client, keys)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "skip-ahead moves the counters of a Consul cluster: this server runs on the embedded store, whose restore is `idgen state restore <backup> --skip-ahead <N>`",
            ));
        };
        if r.margin == 0 {
            return Err(refusal(ErrorKind::BadRequest,
                "give --margin N above the number of IDs any one counter handed out between the Consul snapshot and its restore (see docs/BACKUP.md#restoring-a-consul-snapshot)",
            ));
        }
        let reserve_ms = u64::try_from(self.deps.hwm_reserve.as_millis()).unwrap_or(u64::MAX);
        let (client, keys, margin, now_ms) =
            (client.clone(), keys.clone(), r.margin, self.now_ms());
        // On its own task: cut short by the caller's deadline, a run left
        // its record, and so every counter mode halted, on every node.
        let report = to_the_end(format!("skip-ahead by {margin}"), async move {
            crate::store::skip_ahead::skip_ahead(&client, &keys, margin, now_ms, reserve_ms).await
        })
        .await?
        .map_err(|e| to_status(&Error::from(e)))?;
        let record = report.record.unwrap_or_default();
        let message = report.summary(r.margin);
        tracing::warn!(margin = r.margin, %message, "skip-ahead");
        Ok(proto::SkipAheadResponse {
            segments: report.segments,
            strict: report.strict,
            lease_tokens: report.lease_tokens,
            format_counters: report.format_counters,
            marks: report.marks,
            until_ms: record.until_ms,
            floor: record.floor,
            runs: record.runs,
            message,
        })
    }
}
