//! The `idgen.v1.Admin` gRPC service: segment tags, the holders of worker
//! ids and lease tokens, strict namespaces' steps, and the cluster's ID
//! layout (read, and changed only when no ID can repeat; see
//! `store::cluster_layout`).
//!
//! Every call is authorized first: the metadata `authorization: Bearer
//! <token>` must carry the server's admin token (`admin.token`), compared
//! in constant time. A server without an admin token (or client
//! certificate names) refuses every admin call, so the API is off unless
//! an operator turns it on. The admin token is never logged.
//!
//! Nothing here can make an ID repeat: a tag's `max_id` only moves
//! forward, a deleted tag leaves a tombstone that a re-created tag
//! continues above (see `store::segment`), and a forced release returns
//! only after the released session's lock-delay, which holds any new
//! holder off until the old one has stopped issuing (its local deadline
//! is at most min(TTL, lock-delay) after its last renew; the release
//! itself is `cluster::holders`, so this layer makes no Consul KV or
//! session call).
//!
//! One file per concern: `auth.rs` (credentials) with `auth_throttle.rs`
//! (failed logins per peer), `tags.rs`, `strict.rs`, `holders.rs`,
//! `layout.rs`, `formats.rs`, `keys.rs` (hide keys), `datacenters.rs`
//! (datacenter id claims) and `backup.rs` (with the skip-ahead). This
//! file holds the service, its dependencies and the routing of each RPC
//! through [`AdminService::call`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tonic::{Code, Request, Response, Status};

use super::status::refusal;
use super::status::{code_name, to_status};
use crate::config::AdminToken;
use crate::consul::{ConsulClient, ConsulError};
use crate::error::Error;
use crate::error::ErrorKind;
use crate::id::segment::SegmentError;
use crate::id::Clock;
use crate::metrics as m;
use crate::modes::format_catalog::FormatCatalog;
use crate::modes::lease::LeaseEngine;
use crate::modes::strict::StrictEngine;
use crate::proto;
use crate::proto::admin_server::{Admin, AdminServer};
use crate::store::kv_paths::ClusterPaths;
use crate::store::snapshot::SnapshotSource;
use crate::store::{SegmentStore, StoreError, WorkerKey};

mod auth;
mod auth_throttle;
mod backup;
mod datacenters;
mod formats;
mod hide_keys;
mod holders;
mod layout;
mod strict;
mod tags;

use auth_throttle::AuthThrottle;
pub use backup::BackupStream;
pub(crate) use hide_keys::key_json as hide_key_json;
pub use holders::EMBEDDED_STATE;
pub use tags::DEFAULT_TAG_STEP;

/// Longest tag description, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// What the admin service works on. Each `None` turns off the calls that
/// need it (FAILED_PRECONDITION naming what to enable).
pub struct AdminDeps {
    /// The admin token callers must present; `None` (and no
    /// `client_cert_names`) refuses every call.
    pub admin_token: Option<AdminToken>,
    /// Client certificate names allowed (`admin.client_cert_names`);
    /// non-empty: a call needs a verified certificate with one of them,
    /// and the admin token too when one is set.
    pub client_cert_names: Vec<String>,
    /// Peers allowed to make admin calls (`admin.allow`); empty: all.
    pub allow: crate::config::AllowList,
    /// Segment records, when segment mode is enabled.
    pub segments: Option<Arc<dyn SegmentStore>>,
    /// Strict mode, when enabled.
    pub strict: Option<Arc<StrictEngine>>,
    /// Segment mode's buffers, when enabled: a deleted tag's are dropped
    /// at once, and creations count against its `segment.max_tags`.
    pub segment_server: Option<Arc<crate::modes::segment::SegmentEngine>>,
    /// The Consul client and key layout, on the Consul backend.
    pub cluster: Option<(ConsulClient, ClusterPaths)>,
    /// This node, for holders on the embedded backend.
    pub node: NodeFacts,
    /// Timestamps of admin writes, and this node's start time.
    pub clock: Arc<dyn Clock>,
    /// Snapshots of the embedded state file (`Backup`); `None` on Consul.
    pub snapshots: Option<SnapshotSource>,
    /// Stored format definitions and this node's reloads (formatted mode).
    pub formats: Option<Arc<FormatCatalog>>,
    /// `hwm.reserve`: a skip-ahead raises every mark to now plus this.
    pub hwm_reserve: Duration,
    /// The hide key rings (`CreateHideKey`, `RotateHideKey`, ...).
    pub hide_keys: crate::modes::hide_keys::HideKeyRings,
    /// The Consul datacenters' claims (`ListDatacenters`,
    /// `ReleaseDatacenter`), on the Consul backend.
    pub datacenters: Option<crate::cluster::datacenter_release::Federation>,
}

/// What this node holds, reported by `ListHolders` on the embedded
/// backend (in Consul the holders are read from KV).
pub struct NodeFacts {
    /// The node's stable instance name.
    pub instance: String,
    /// The node's advertised gRPC address.
    pub address: String,
    /// The worker id from config.
    pub worker: WorkerKey,
    /// Lease mode, when enabled (its token in use).
    pub lease: Option<Arc<LeaseEngine>>,
    /// Lease mode's zone, when enabled.
    pub lease_zone: Option<u64>,
    /// Formatted mode, when formats are defined (its tokens).
    pub formats: Option<Arc<crate::modes::formatted::FormattedEngine>>,
    /// A hidden snowflake layout's hide key id and version width
    /// (`layout.hide_key`, `layout.hide_version_bits`).
    pub layout_hide: Option<(String, u32)>,
}

/// The admin service.
pub struct AdminService {
    deps: AdminDeps,
    /// When the service was made (about when the node started), Unix ms.
    started_ms: u64,
    /// Failed authentications by peer: brute force is slowed to a crawl.
    throttle: AuthThrottle,
}

/// The admin service, ready to add to a tonic server.
pub fn service(deps: AdminDeps) -> AdminServer<AdminService> {
    AdminServer::new(AdminService::new(deps))
}

/// Marks a request that came through the admin console's JSON API on the
/// HTTP port (`server::console`): its refusals and call metrics are
/// labelled `http`. Everything else (the allow-list, the credentials, the
/// rules of each call) is the gRPC service's own code.
#[derive(Debug, Clone, Copy)]
pub struct ViaHttp;

impl AdminService {
    /// The admin service over `deps`. The gRPC port serves it through
    /// [`AdminServer::from_arc`] and the console's JSON API calls the same
    /// instance.
    pub fn new(deps: AdminDeps) -> Self {
        if deps.admin_token.is_none() && deps.client_cert_names.is_empty() {
            tracing::info!("admin API disabled: no admin.token or admin.token_file configured");
        }
        for port in ["grpc", "http"] {
            metrics::counter!(m::PEER_REFUSALS, "port" => port, "list" => "admin").increment(0);
        }
        let started_ms = deps.clock.now_millis();
        Self {
            deps,
            started_ms,
            throttle: AuthThrottle::default(),
        }
    }

    /// Whether any admin credential is configured (`admin.token`,
    /// `admin.token_file` or `admin.client_cert_names`); without one every
    /// call is refused and the console is not served.
    pub fn enabled(&self) -> bool {
        self.deps.admin_token.is_some() || !self.deps.client_cert_names.is_empty()
    }

    /// This node's instance name and advertised gRPC address (the admin
    /// console names the node it runs on).
    pub fn node_identity(&self) -> (&str, &str) {
        (&self.deps.node.instance, &self.deps.node.address)
    }
}

fn rfc3339(ms: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The status of a store error: the one mapping, except that a change
/// that could repeat IDs is a precondition, not a malformed argument.
fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::Segment(SegmentError::MaxIdBackwards { .. }) => {
            refusal(ErrorKind::Precondition, e.to_string())
        }
        e => to_status(&Error::from(e)),
    }
}

fn consul_status(e: ConsulError) -> Status {
    to_status(&Error::Consul(e))
}

fn check_description(d: &str) -> Result<(), Status> {
    if d.len() > MAX_DESCRIPTION_LEN {
        return Err(refusal(
            ErrorKind::BadRequest,
            format!(
                "description is {} bytes long: use at most {MAX_DESCRIPTION_LEN}",
                d.len()
            ),
        ));
    }
    Ok(())
}

impl AdminService {
    /// Checks `admin.allow` and the credentials of `request` (admin token
    /// and/or client certificate), runs `f`, counts the call by method and
    /// code, and logs it (never the admin token). Every admin RPC goes through
    /// here, and so does every call of the console's JSON API.
    pub async fn call<Req, T, Fut>(
        &self,
        method: &'static str,
        request: Request<Req>,
        f: impl FnOnce(Req) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Status>>,
    {
        let peer = request.remote_addr();
        let port = if request.extensions().get::<ViaHttp>().is_some() {
            "http"
        } else {
            "grpc"
        };
        if let Some(ip) = peer
            .map(|p| p.ip())
            .filter(|ip| !self.deps.allow.allows(*ip))
        {
            super::listener::count_refusal(port, "admin", &ip.to_string());
            metrics::counter!(m::ADMIN_CALLS, "method" => method, "code" => code_name(Code::PermissionDenied))
                .increment(1);
            return Err(refusal(
                ErrorKind::Denied,
                format!("peer {ip} is not in this node's admin.allow"),
            ));
        }
        let authorized = self.authenticate(&request, port, peer.map(|p| p.ip()));
        let auth_failed = authorized.is_err();
        let result = match authorized {
            Ok(()) => f(request.into_inner()).await,
            Err(s) => Err(s),
        };
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        metrics::counter!(m::ADMIN_CALLS, "method" => method, "code" => code_name(code))
            .increment(1);
        match &result {
            Ok(_) => tracing::info!(
                method,
                port,
                peer = peer.map(tracing::field::display),
                "admin call"
            ),
            // Counted and logged (rate-limited) by `authenticate`.
            Err(s) if auth_failed => tracing::debug!(
                method,
                port,
                peer = peer.map(tracing::field::display),
                code = code_name(code),
                error = s.message(),
                "admin call refused"
            ),
            Err(s) => tracing::info!(
                method,
                port,
                peer = peer.map(tracing::field::display),
                code = code_name(code),
                error = s.message(),
                "admin call failed"
            ),
        }
        result.map(Response::new)
    }

    fn now_ms(&self) -> u64 {
        self.deps.clock.now_millis()
    }
}

/// The records a listing could not read, as a reply carries them.
fn unreadable(records: Vec<(String, String)>) -> Vec<proto::UnreadableRecord> {
    records
        .into_iter()
        .map(|(key, error)| proto::UnreadableRecord { key, error })
        .collect()
}

/// Runs an admin change to its end on its own task. A caller past its
/// deadline (the CLI's `--timeout`, 5 s by default) or gone drops the
/// gRPC handler's future, and a change dropped half-way stays half-done:
/// a created format stored but unserved on the embedded store (nothing
/// else reloads there); a layout record left marked changing (every node
/// fenced until the stale change is rolled back); a datacenter claim left
/// releasing (its datacenter fenced for good); a skip-ahead that never
/// deletes its record (counter modes halted). A change whose caller went
/// away logs how it ended (`what` names it), since no one else will hear
/// of it. `Err` only when the change's task stopped without an answer.
async fn to_the_end<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    what: String,
    change: impl Future<Output = Result<T, E>> + Send + 'static,
) -> Result<Result<T, E>, Status> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name = what.clone();
    tokio::spawn(async move {
        let result = change.await;
        let outcome = match &result {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        if tx.send(result).is_err() {
            match outcome {
                Ok(()) => {
                    tracing::info!(change = what, "admin change done after its caller gave up")
                }
                Err(error) => tracing::warn!(
                    change = what,
                    error,
                    "admin change failed after its caller gave up"
                ),
            }
        }
    });
    rx.await.map_err(|_| {
        refusal(
            ErrorKind::Internal,
            format!("the {name} stopped without an answer (it panicked): see the node's log"),
        )
    })
}

/// The `idgen.v1.Admin` trait, one line per RPC: each runs its handler
/// (the `AdminService` method of the same name) through
/// [`AdminService::call`] under the RPC's name. Handlers under `request`
/// take the request message; those under `no_request` need nothing from
/// it; those under `with_caller` also take who called (audited
/// changes). `Backup` answers with a stream (`backup.rs`).
macro_rules! admin_routes {
    (
        request { $($rpc:ident($req:ident) -> $resp:ident = $name:literal;)* }
        no_request { $($rpc0:ident($req0:ident) -> $resp0:ident = $name0:literal;)* }
        with_caller { $($rpc1:ident($req1:ident) -> $resp1:ident = $name1:literal;)* }
    ) => {
        #[tonic::async_trait]
        impl Admin for AdminService {
            type BackupStream = BackupStream;

            async fn backup(
                &self,
                request: Request<proto::BackupRequest>,
            ) -> Result<Response<Self::BackupStream>, Status> {
                self.backup_stream(request).await
            }

            $(
                async fn $rpc(
                    &self,
                    request: Request<proto::$req>,
                ) -> Result<Response<proto::$resp>, Status> {
                    self.call($name, request, |r| AdminService::$rpc(self, r)).await
                }
            )*

            $(
                async fn $rpc0(
                    &self,
                    request: Request<proto::$req0>,
                ) -> Result<Response<proto::$resp0>, Status> {
                    self.call($name0, request, |_| AdminService::$rpc0(self)).await
                }
            )*

            $(
                async fn $rpc1(
                    &self,
                    request: Request<proto::$req1>,
                ) -> Result<Response<proto::$resp1>, Status> {
                    let who = hide_keys::caller(&request);
                    self.call($name1, request, |r| AdminService::$rpc1(self, who, r)).await
                }
            )*
        }
    };
}

admin_routes! {
    request {
        set_layout(SetLayoutRequest) -> SetLayoutResponse = "SetLayout";
        create_tag(CreateTagRequest) -> CreateTagResponse = "CreateTag";
        update_tag(UpdateTagRequest) -> UpdateTagResponse = "UpdateTag";
        get_tag(GetTagRequest) -> GetTagResponse = "GetTag";
        delete_tag(DeleteTagRequest) -> DeleteTagResponse = "DeleteTag";
        force_release(ForceReleaseRequest) -> ForceReleaseResponse = "ForceRelease";
        set_strict_step(SetStrictStepRequest) -> SetStrictStepResponse = "SetStrictStep";
        get_strict_step(GetStrictStepRequest) -> GetStrictStepResponse = "GetStrictStep";
        list_strict_keys(ListStrictKeysRequest) -> ListStrictKeysResponse = "ListStrictKeys";
        delete_strict_key(DeleteStrictKeyRequest) -> DeleteStrictKeyResponse = "DeleteStrictKey";
        skip_ahead(SkipAheadRequest) -> SkipAheadResponse = "SkipAhead";
        renew_session(RenewSessionRequest) -> RenewSessionResponse = "RenewSession";
        create_format(CreateFormatRequest) -> CreateFormatResponse = "CreateFormat";
        update_format(UpdateFormatRequest) -> UpdateFormatResponse = "UpdateFormat";
        get_format(GetFormatRequest) -> GetFormatResponse = "GetFormat";
        delete_format(DeleteFormatRequest) -> DeleteFormatResponse = "DeleteFormat";
    }
    no_request {
        get_layout(GetLayoutRequest) -> GetLayoutResponse = "GetLayout";
        list_tags(ListTagsRequest) -> ListTagsResponse = "ListTags";
        list_holders(ListHoldersRequest) -> ListHoldersResponse = "ListHolders";
        list_strict_namespaces(ListStrictNamespacesRequest) -> ListStrictNamespacesResponse = "ListStrictNamespaces";
        list_formats(ListFormatsRequest) -> ListFormatsResponse = "ListFormats";
        reload_formats(ReloadFormatsRequest) -> ReloadFormatsResponse = "ReloadFormats";
        list_hide_keys(ListHideKeysRequest) -> ListHideKeysResponse = "ListHideKeys";
        list_datacenters(ListDatacentersRequest) -> ListDatacentersResponse = "ListDatacenters";
    }
    with_caller {
        create_hide_key(CreateHideKeyRequest) -> HideKeyChangeResponse = "CreateHideKey";
        rotate_hide_key(RotateHideKeyRequest) -> HideKeyChangeResponse = "RotateHideKey";
        retire_hide_key(RetireHideKeyRequest) -> HideKeyChangeResponse = "RetireHideKey";
        release_datacenter(ReleaseDatacenterRequest) -> ReleaseDatacenterResponse = "ReleaseDatacenter";
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::to_the_end;
    use crate::modes::refill::yield_until;

    #[tokio::test]
    async fn a_change_whose_caller_is_dropped_half_way_runs_to_its_end() {
        // The change's two steps, with the caller dropped between them (a
        // layout change between its two writes, a release between marking
        // the claim releasing and released).
        let steps = Arc::new(AtomicU32::new(0));
        let go_on = Arc::new(Notify::new());
        let call = tokio::spawn({
            let (steps, go_on) = (Arc::clone(&steps), Arc::clone(&go_on));
            async move {
                to_the_end("test change".to_owned(), async move {
                    steps.fetch_add(1, Ordering::SeqCst);
                    go_on.notified().await;
                    steps.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                })
                .await
            }
        });
        yield_until("the first step", || steps.load(Ordering::SeqCst) == 1).await;
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        go_on.notify_waiters();
        yield_until("the second step", || steps.load(Ordering::SeqCst) == 2).await;
    }

    #[tokio::test]
    async fn a_caller_gets_the_changes_own_answer() {
        let done = to_the_end("ok".to_owned(), async { Ok::<_, String>(7) }).await;
        assert_eq!(done.unwrap(), Ok(7));
        let refused = to_the_end("no".to_owned(), async {
            Err::<u8, _>("refused".to_owned())
        })
        .await;
        assert_eq!(refused.unwrap(), Err("refused".to_owned()));
    }
}
