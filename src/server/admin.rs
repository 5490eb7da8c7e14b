//! The `idgen.v1.Admin` gRPC service: segment tags, the holders of worker
//! ids and lease tokens, strict namespaces' steps, and the cluster's ID
//! layout (read, and changed only when no ID can repeat; see
//! `store::cluster_layout`).
//!
//! Every call is authorized first: the metadata `authorization: Bearer
//! <token>` must carry the server's `admin.token`, compared in constant
//! time. A server without a token refuses every admin call, so the API is
//! off unless an operator turns it on. The token is never logged.
//!
//! Nothing here can make an ID repeat: a tag's `max_id` only moves
//! forward, a deleted tag leaves a tombstone that a re-created tag
//! continues above (see `store::segment`), and a forced release returns
//! only after the released session's lock-delay, which holds any new
//! holder off until the old one has stopped issuing (its local deadline
//! is at most min(TTL, lock-delay) after its last renew; `store::consul`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use super::status::refusal;
use super::status::{code_name, to_status};
use super::tls::PeerCertificate;
use crate::config::AdminToken;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, SessionInfo};
use crate::error::Error;
use crate::error::ErrorKind;
use crate::id::format::FormatDef;
use crate::id::format::TokenSpace;
use crate::id::segment::{check_max_id, check_step, SegmentError, Tag, TagRecord, TagUpdate};
use crate::id::strict::Namespace;
use crate::id::Clock;
use crate::metrics as m;
use crate::modes::format_reload::{FormatCatalog, ReloadError, Reloaded};
use crate::modes::lease::Leases;
use crate::modes::strict::Strict;
use crate::proto::admin_server::{Admin, AdminServer};
use crate::proto::{self, HolderKind};
use crate::store::cluster_layout::{change_layout, read_layout, LayoutRecord, RecordedLayout};
use crate::store::consul::{ClusterKeys, OwnerInfo};
use crate::store::format_def::StoredFormat;
use crate::store::lease::TokenRecord;
use crate::store::snapshot::SnapshotSource;
use crate::store::{SegmentStore, StoreError, WorkerKey};

mod auth_throttle;

use auth_throttle::{AuthThrottle, Gate};

/// The step of a tag created without one.
pub const DEFAULT_TAG_STEP: u64 = 1000;

/// Longest tag description, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// The longest lock-delay Consul applies; a forced release never waits
/// longer.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// Consul's lock-delay when a session does not report one.
const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

/// The holder state reported for the embedded backend.
pub const EMBEDDED_STATE: &str = "embedded (this node)";

const DISABLED: &str = "the admin API is disabled on this server: set admin.token or admin.token_file in its config (or IDGEN_ADMIN__TOKEN) and restart it";
const NO_CERT: &str = "admin calls on this server need a client certificate named in its admin.client_cert_names, over TLS (idgen admin: --addr https://... --ca, --cert, --key)";
const NO_HEADER: &str = "admin calls need the metadata `authorization: Bearer <token>` carrying the server's admin token (idgen admin: --token, --token-file or IDGEN_ADMIN__TOKEN)";
const WRONG_TOKEN: &str =
    "the admin token is wrong: use the token in the server's admin.token or admin.token_file";

/// What the admin service works on. Each `None` turns off the calls that
/// need it (FAILED_PRECONDITION naming what to enable).
pub struct AdminDeps {
    /// The token callers must present; `None` (and no
    /// `client_cert_names`) refuses every call.
    pub token: Option<AdminToken>,
    /// Client certificate names allowed (`admin.client_cert_names`);
    /// non-empty: a call needs a verified certificate with one of them,
    /// and the token too when one is set.
    pub client_cert_names: Vec<String>,
    /// Peers allowed to make admin calls (`admin.allow`); empty: all.
    pub allow: crate::config::AllowList,
    /// Segment records, when segment mode is enabled.
    pub segments: Option<Arc<dyn SegmentStore>>,
    /// Strict mode, when enabled.
    pub strict: Option<Arc<Strict>>,
    /// Segment mode's buffers, when enabled: a deleted tag's are dropped
    /// at once, and creations count against its `segment.max_tags`.
    pub segment_server: Option<Arc<crate::modes::segment::Segments>>,
    /// The Consul client and key layout, on the Consul backend.
    pub cluster: Option<(ConsulClient, ClusterKeys)>,
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
    pub lease: Option<Arc<Leases>>,
    /// Lease mode's zone, when enabled.
    pub lease_zone: Option<u64>,
    /// Formatted mode, when formats are defined (its tokens).
    pub formats: Option<Arc<crate::modes::format::Formats>>,
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
        if deps.token.is_none() && deps.client_cert_names.is_empty() {
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
        self.deps.token.is_some() || !self.deps.client_cert_names.is_empty()
    }
}

/// Compares two tokens in time that depends only on their lengths, never
/// on where they first differ.
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= std::hint::black_box(g ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Checks a call's credentials: with `names`, a verified client
/// certificate naming one of them, and the token as well when `token` is
/// set; without, the token alone.
fn authorize_call(
    token: Option<&AdminToken>,
    names: &[String],
    peer: Option<&PeerCertificate>,
    metadata: &MetadataMap,
) -> Result<(), Status> {
    if names.is_empty() {
        return authorize(token, metadata);
    }
    match peer {
        None => Err(refusal(ErrorKind::Unauthenticated, NO_CERT)),
        Some(p) if !p.any_in(names) => Err(refusal(
            ErrorKind::Denied,
            format!(
                "the client certificate (names {:?}) is not allowed to administer: its subject CN or a SAN must be in the server's admin.client_cert_names",
                p.names
            ),
        )),
        Some(_) if token.is_some() => authorize(token, metadata),
        Some(_) => Ok(()),
    }
}

/// Checks a call's token against `expected`.
fn authorize(expected: Option<&AdminToken>, metadata: &MetadataMap) -> Result<(), Status> {
    let Some(expected) = expected else {
        return Err(refusal(ErrorKind::Denied, DISABLED));
    };
    let given = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or_else(|| refusal(ErrorKind::Unauthenticated, NO_HEADER))?;
    if same_token(given.as_bytes(), expected.0.as_bytes()) {
        Ok(())
    } else {
        Err(refusal(ErrorKind::Denied, WRONG_TOKEN))
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
        e => to_status(&Error::Store(e)),
    }
}

fn consul_status(e: ConsulError) -> Status {
    to_status(&Error::Consul(e))
}

fn parse_tag(name: &str) -> Result<Tag, Status> {
    Tag::parse(name).map_err(|e| store_status(e.into()))
}

fn parse_namespace(name: &str) -> Result<Namespace, Status> {
    Namespace::parse(name).map_err(|e| store_status(e.into()))
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

fn tag_message(tag: &Tag, r: &TagRecord) -> proto::SegmentTag {
    proto::SegmentTag {
        tag: tag.to_string(),
        max_id: r.max_id,
        step: r.step,
        description: r.description.clone(),
        created: rfc3339(r.created_ms),
        updated: rfc3339(r.updated_ms),
    }
}

/// A worker id or lease token named by a request or a KV key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum LockKey {
    /// Datacenter, worker.
    Worker(u64, u64),
    /// Zone, token.
    Token(u64, u64),
    /// A formatted-mode token: space, token.
    FormatToken(TokenSpace, u64),
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Worker(dc, w) => write!(f, "worker id {dc}/{w}"),
            Self::Token(zone, t) => write!(f, "lease token {zone}/{t}"),
            Self::FormatToken(space, t) => write!(f, "format token {space}/{t}"),
        }
    }
}

impl LockKey {
    fn key(self, keys: &ClusterKeys) -> String {
        match self {
            Self::Worker(datacenter, worker) => keys.worker(WorkerKey { datacenter, worker }),
            Self::Token(zone, token) => keys.lease(zone, token),
            Self::FormatToken(space, token) => {
                format!("{}{token}", keys.format_token_dir(&space.name()))
            }
        }
    }
}

/// A folder of every datacenter's (or zone's) keys, from the folder of
/// group 0: `<root>/workers/0/` -> `<root>/workers/`.
fn all_groups(group_zero: &str) -> String {
    group_zero
        .strip_suffix("0/")
        .unwrap_or(group_zero)
        .to_owned()
}

/// `<group>/<id>` under `dir`.
fn group_and_id(dir: &str, key: &str) -> Option<(u64, u64)> {
    let (group, id) = key.strip_prefix(dir)?.split_once('/')?;
    Some((group.parse().ok()?, id.parse().ok()?))
}

fn millis(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a held key's value says, and the session holding it (`info`, when
/// it is alive).
fn holder_from(
    held: LockKey,
    entry: &KvEntry,
    state: &str,
    info: Option<&SessionInfo>,
) -> proto::Holder {
    let (kind, datacenter, zone, id) = match held {
        LockKey::Worker(dc, w) => (HolderKind::Worker, dc, 0, w),
        LockKey::Token(zone, t) => (HolderKind::LeaseToken, 0, zone, t),
        LockKey::FormatToken(_, t) => (HolderKind::FormatToken, 0, 0, t),
    };
    let (space, rendered) = match held {
        LockKey::FormatToken(space, t) => (space.name(), space.render(t)),
        _ => (String::new(), String::new()),
    };
    let (owner, reserved) = match held {
        LockKey::Worker(..) => (serde_json::from_slice::<OwnerInfo>(&entry.value).ok(), 0),
        LockKey::Token(..) | LockKey::FormatToken(..) => {
            match serde_json::from_slice::<TokenRecord>(&entry.value) {
                Ok(r) => (Some(r.owner), r.reserved),
                Err(_) => (None, 0),
            }
        }
    };
    let (instance, address, since) = match owner {
        Some(o) => (o.instance, o.address, rfc3339(o.since_ms)),
        None => (
            "<unreadable value>".to_owned(),
            String::new(),
            String::new(),
        ),
    };
    proto::Holder {
        kind: kind as i32,
        datacenter,
        zone,
        id,
        instance,
        address,
        since,
        session: entry.session.clone().unwrap_or_default(),
        state: state.to_owned(),
        reserved,
        lock_delay_ms: millis(info.map(|i| i.lock_delay.unwrap_or(DEFAULT_LOCK_DELAY))),
        session_ttl_ms: millis(info.and_then(|i| i.ttl)),
        space,
        rendered,
    }
}

impl AdminService {
    /// Checks `admin.allow` and the credentials of `request` (bearer token
    /// and/or client certificate), runs `f`, counts the call by method and
    /// code, and logs it (never the token). Every admin RPC goes through
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

    /// Checks the credentials of `request` unless its peer has failed too
    /// often (then RESOURCE_EXHAUSTED with a retry hint, unchecked); counts
    /// and logs failures per peer (see `admin/auth_throttle.rs`).
    fn authenticate<Req>(
        &self,
        request: &Request<Req>,
        port: &'static str,
        peer: Option<std::net::IpAddr>,
    ) -> Result<(), Status> {
        let now = tokio::time::Instant::now();
        if let Some(ip) = peer {
            if let Gate::Refuse(left) = self.throttle.gate(ip, now) {
                metrics::counter!(m::ADMIN_AUTH_THROTTLED, "port" => port).increment(1);
                return Err(refusal(
                    ErrorKind::Exhausted,
                    format!(
                        "too many failed admin authentications from {ip}: retry in {} s with the right admin token",
                        left.as_secs().max(1)
                    ),
                ));
            }
        }
        let checked = authorize_call(
            self.deps.token.as_ref(),
            &self.deps.client_cert_names,
            request.extensions().get::<PeerCertificate>(),
            request.metadata(),
        );
        let Some(ip) = peer else { return checked };
        match &checked {
            Ok(()) => self.throttle.succeeded(ip),
            // The API is off: not a guess at a credential.
            Err(s) if s.message() == DISABLED => {}
            Err(s) => {
                metrics::counter!(m::ADMIN_AUTH_FAILURES, "port" => port).increment(1);
                if let Some(w) = self.throttle.failed(ip, now) {
                    tracing::warn!(
                        port,
                        peer = %ip,
                        failures = w.failures,
                        refused_unchecked = w.refused,
                        shut_out_for = w.blocked_for.map(|d| humantime::format_duration(d).to_string()),
                        error = s.message(),
                        "failed admin authentication (logged when a peer starts failing and each time it is shut out; see idgen_admin_auth_failures_total)"
                    );
                }
            }
        }
        checked
    }

    fn now_ms(&self) -> u64 {
        self.deps.clock.now_millis()
    }

    fn segments(&self) -> Result<&Arc<dyn SegmentStore>, Status> {
        self.deps.segments.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "segment mode is not enabled on this server: set [segment] enabled = true in its config",
            )
        })
    }

    fn strict(&self) -> Result<&Arc<Strict>, Status> {
        self.deps.strict.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "strict mode is not enabled on this server: set [strict] enabled = true in its config",
            )
        })
    }

    async fn create_tag(
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
        let record = TagRecord::new(initial, step, &r.description, self.now_ms())
            .map_err(|e| store_status(e.into()))?;
        let max_tags = self
            .deps
            .segment_server
            .as_ref()
            .map_or(u64::MAX, |s| s.max_tags());
        let written = store
            .create_tag_limited(&tag, &record, max_tags)
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

    async fn update_tag(
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

    async fn get_tag(&self, r: proto::GetTagRequest) -> Result<proto::GetTagResponse, Status> {
        let store = self.segments()?;
        let tag = parse_tag(&r.tag)?;
        let record = store
            .get_tag(&tag)
            .await
            .map_err(store_status)?
            .ok_or_else(|| store_status(StoreError::TagNotFound(tag.to_string())))?;
        Ok(proto::GetTagResponse {
            tag: Some(tag_message(&tag, &record)),
        })
    }

    async fn list_tags(&self) -> Result<proto::ListTagsResponse, Status> {
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
            unreadable: listing
                .unreadable
                .into_iter()
                .map(|(key, error)| proto::UnreadableRecord { key, error })
                .collect(),
        })
    }

    async fn delete_tag(
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
                "tag {tag} is deleted: new ranges are refused (NOT_FOUND). Its record stays as a tombstone with max_id {}, so creating {tag} again continues above it. Nodes that already hold a range of it may serve the rest of that range (IDs never handed out before) until it runs out.",
                tombstone.max_id
            ),
        })
    }

    async fn list_holders(&self) -> Result<proto::ListHoldersResponse, Status> {
        let Some((client, keys)) = &self.deps.cluster else {
            return Ok(self.embedded_holders());
        };
        let workers_dir = all_groups(&keys.workers_dir(0));
        let lease_dir = all_groups(&keys.lease_dir(0));
        let workers = client
            .kv_list(&workers_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let tokens = client
            .kv_list(&lease_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let mut entries: Vec<(LockKey, KvEntry)> = Vec::new();
        for e in workers {
            if let Some((dc, w)) = group_and_id(&workers_dir, &e.key) {
                entries.push((LockKey::Worker(dc, w), e));
            }
        }
        for e in tokens {
            if let Some((zone, t)) = group_and_id(&lease_dir, &e.key) {
                entries.push((LockKey::Token(zone, t), e));
            }
        }
        let format_dir = keys.format_tokens_dir();
        let format_tokens = client
            .kv_list(&format_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        for e in format_tokens {
            let held = e
                .key
                .strip_prefix(&format_dir)
                .and_then(|rest| rest.split_once('/'))
                .and_then(|(space, t)| Some((TokenSpace::from_name(space)?, t.parse().ok()?)));
            if let Some((space, t)) = held {
                entries.push((LockKey::FormatToken(space, t), e));
            }
        }
        entries.sort_by_key(|(h, _)| *h);
        // One node's worker id and token share a session: ask once.
        let mut sessions: HashMap<String, Option<SessionInfo>> = HashMap::new();
        let mut holders = Vec::with_capacity(entries.len());
        for (held, e) in &entries {
            let (state, info) = match &e.session {
                None => ("released", None),
                Some(s) => {
                    if !sessions.contains_key(s) {
                        let info = client.session_info(s).await.map_err(consul_status)?;
                        sessions.insert(s.clone(), info);
                    }
                    match sessions.get(s) {
                        Some(Some(info)) => ("alive", Some(info)),
                        _ => ("gone", None),
                    }
                }
            };
            holders.push(holder_from(*held, e, state, info));
        }
        Ok(proto::ListHoldersResponse {
            backend: "consul".into(),
            holders,
        })
    }

    fn embedded_holders(&self) -> proto::ListHoldersResponse {
        let node = &self.deps.node;
        let since = rfc3339(self.started_ms);
        let mut holders = vec![proto::Holder {
            kind: HolderKind::Worker as i32,
            datacenter: node.worker.datacenter,
            zone: 0,
            id: node.worker.worker,
            instance: node.instance.clone(),
            address: node.address.clone(),
            since: since.clone(),
            session: String::new(),
            state: EMBEDDED_STATE.into(),
            reserved: 0,
            lock_delay_ms: 0,
            session_ttl_ms: 0,
            space: String::new(),
            rendered: String::new(),
        }];
        if let Some(token) = node.lease.as_ref().and_then(|l| l.token()) {
            holders.push(proto::Holder {
                kind: HolderKind::LeaseToken as i32,
                datacenter: 0,
                zone: node.lease_zone.unwrap_or(0),
                id: token,
                instance: node.instance.clone(),
                address: node.address.clone(),
                since,
                session: String::new(),
                state: EMBEDDED_STATE.into(),
                reserved: 0,
                lock_delay_ms: 0,
                session_ttl_ms: 0,
                space: String::new(),
                rendered: String::new(),
            });
        }
        let format_tokens = node.formats.as_ref().map(|f| f.held_tokens());
        for (space, token) in format_tokens.unwrap_or_default() {
            holders.push(proto::Holder {
                kind: HolderKind::FormatToken as i32,
                datacenter: 0,
                zone: 0,
                id: token,
                instance: node.instance.clone(),
                address: node.address.clone(),
                since: rfc3339(self.started_ms),
                session: String::new(),
                state: EMBEDDED_STATE.into(),
                reserved: 0,
                lock_delay_ms: 0,
                session_ttl_ms: 0,
                space: space.name(),
                rendered: space.render(token),
            });
        }
        proto::ListHoldersResponse {
            backend: "embedded".into(),
            holders,
        }
    }

    fn held(r: &proto::ForceReleaseRequest) -> Result<LockKey, Status> {
        let kind = HolderKind::try_from(r.kind);
        if !r.space.is_empty() && kind != Ok(HolderKind::FormatToken) {
            return Err(refusal(
                ErrorKind::BadRequest,
                "space is for a format token (HOLDER_KIND_FORMAT_TOKEN): leave it empty for a worker id or lease token",
            ));
        }
        match kind {
            Ok(HolderKind::Worker) if r.zone != 0 => Err(refusal(ErrorKind::BadRequest,
                "a worker id has a datacenter, not a zone: leave zone at 0 and set datacenter",
            )),
            Ok(HolderKind::Worker) => Ok(LockKey::Worker(r.datacenter, r.id)),
            Ok(HolderKind::LeaseToken) if r.datacenter != 0 => Err(refusal(ErrorKind::BadRequest,
                "a lease token has a zone, not a datacenter: leave datacenter at 0 and set zone",
            )),
            Ok(HolderKind::LeaseToken) => {
                crate::id::lease::check_zone(r.zone)
                    .and_then(|_| crate::id::lease::check_token(r.id))
                    .map_err(|e| store_status(e.into()))?;
                Ok(LockKey::Token(r.zone, r.id))
            }
            Ok(HolderKind::FormatToken) => Self::held_format_token(r),
            _ => Err(refusal(ErrorKind::BadRequest, format!(
                "kind {} is not one to release: use HOLDER_KIND_WORKER, HOLDER_KIND_LEASE_TOKEN or HOLDER_KIND_FORMAT_TOKEN (idgen admin release --kind worker|token|format-token)",
                r.kind
            ))),
        }
    }

    /// The format token a release request names: a known space and a
    /// token number inside it.
    fn held_format_token(r: &proto::ForceReleaseRequest) -> Result<LockKey, Status> {
        if r.datacenter != 0 || r.zone != 0 {
            return Err(refusal(ErrorKind::BadRequest,
                "a format token has a space, not a datacenter or zone: leave both at 0 and set space (as `idgen admin holders` shows it)",
            ));
        }
        let name = r.space.trim();
        let Some(space) = TokenSpace::from_name(name) else {
            return Err(refusal(ErrorKind::BadRequest, format!(
                "space {name:?} is not a format token space: give one as `idgen admin holders` shows it (digits-N or alnum-N with N from 1 to 4, or uniq64)"
            )));
        };
        if r.id >= space.size() {
            return Err(refusal(ErrorKind::BadRequest, format!(
                "token {} is outside space {space}, whose tokens are 0 to {} (give the number `idgen admin holders` shows as id, not the rendered token)",
                r.id,
                space.max()
            )));
        }
        Ok(LockKey::FormatToken(space, r.id))
    }

    async fn force_release(
        &self,
        r: proto::ForceReleaseRequest,
    ) -> Result<proto::ForceReleaseResponse, Status> {
        let held = Self::held(&r)?;
        let Some((client, keys)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: its worker id and lease token come from its config and nothing is leased, so there is nothing to release",
            ));
        };
        let key = held.key(keys);
        let (entry, _) = client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let Some(entry) = entry else {
            return Err(refusal(ErrorKind::NotFound, format!(
                "{held} has never been claimed in this cluster (no key {key}); see `idgen admin holders`"
            )));
        };
        let Some(session) = entry.session.clone() else {
            let holder = holder_from(held, &entry, "released", None);
            return Ok(proto::ForceReleaseResponse {
                released: false,
                message: format!(
                    "{held} is not held (last holder {} at {}): nothing to do",
                    holder.instance, holder.address
                ),
                holder: Some(holder),
                waited_ms: 0,
            });
        };
        let Some(info) = client.session_info(&session).await.map_err(consul_status)? else {
            return Ok(proto::ForceReleaseResponse {
                released: false,
                message: format!(
                    "{held}: its session {session} has just ended, so it is not held: nothing to do (it can be claimed once its lock-delay has passed)"
                ),
                holder: Some(holder_from(held, &entry, "gone", None)),
                waited_ms: 0,
            });
        };
        let holder = holder_from(held, &entry, "alive", Some(&info));
        if !r.force {
            return Err(refusal(ErrorKind::Precondition, format!(
                "{held} is held by instance {} at {} and its session {session} is alive; releasing it destroys that session, which frees everything that node holds: pass --force (force = true) to do it anyway (the holder stops issuing when it notices)",
                holder.instance, holder.address
            )));
        }
        let lock_delay = info
            .lock_delay
            .unwrap_or(DEFAULT_LOCK_DELAY)
            .min(MAX_LOCK_DELAY);
        client.session_destroy(&session).await.map_err(|e| {
            refusal(ErrorKind::Unavailable, format!(
                "could not destroy session {session} ({e}); it may or may not be gone: check with `idgen admin holders` and retry"
            ))
        })?;
        tracing::warn!(
            %held,
            session,
            instance = holder.instance,
            address = holder.address,
            "admin force-released: session destroyed; waiting out its lock-delay"
        );
        let waiting = Instant::now();
        tokio::time::sleep(lock_delay).await;
        let waited = waiting.elapsed();
        Ok(proto::ForceReleaseResponse {
            released: true,
            message: format!(
                "destroyed session {session} of instance {} at {}: this freed everything that node held (its worker id, and its lease token and format tokens, if any). It stops issuing by its lock deadline and claims again. Waited out the lock-delay ({lock_delay:?}): {held} is free now, for whoever claims it first",
                holder.instance, holder.address
            ),
            holder: Some(holder),
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        })
    }

    async fn renew_session(
        &self,
        r: proto::RenewSessionRequest,
    ) -> Result<proto::RenewSessionResponse, Status> {
        let session = r.session.trim();
        if session.is_empty() {
            return Err(refusal(
                ErrorKind::BadRequest,
                "give the session id to renew, as `idgen admin holders` (or the console) shows it",
            ));
        }
        let Some((client, _)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: it has no Consul session to renew (its worker id and lease token come from its config)",
            ));
        };
        // Only a session read back from this cluster's keys is sent to
        // Consul, so the id never has to be trusted as a URL part.
        let held: Vec<proto::Holder> = self
            .list_holders()
            .await?
            .holders
            .into_iter()
            .filter(|h| h.session == session)
            .collect();
        if held.is_empty() {
            return Err(refusal(ErrorKind::NotFound, format!(
                "session {session:?} holds no worker id or lease token of this cluster: nothing to renew (see `idgen admin holders`)"
            )));
        }
        let info = client
            .session_renew(session)
            .await
            .map_err(consul_status)?
            .ok_or_else(|| {
                refusal(ErrorKind::NotFound, format!(
                    "session {session} has just ended: Consul no longer knows it, so nothing is renewed (its ids are free once their lock-delay has passed)"
                ))
            })?;
        let ttl_ms = millis(info.ttl);
        tracing::warn!(session, ttl_ms, "admin renewed a holder's session by hand");
        Ok(proto::RenewSessionResponse {
            session: session.to_owned(),
            ttl_ms,
            message: format!(
                "renewed session {session} of instance {}: Consul keeps it (and the {} id(s) it holds) for {} ms more unless it is renewed again",
                held[0].instance,
                held.len(),
                ttl_ms
            ),
            holders: held,
        })
    }

    async fn set_strict_step(
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

    async fn get_strict_step(
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

    fn cluster(&self) -> Result<&(ConsulClient, ClusterKeys), Status> {
        self.deps.cluster.as_ref().ok_or_else(|| {
            refusal(ErrorKind::Precondition,
                "the cluster layout lives in Consul: this server runs on the embedded store, whose state file records its layout at `idgen init` and refuses another one",
            )
        })
    }

    async fn skip_ahead(
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
                "give --margin N above the number of IDs any one counter handed out between the Consul snapshot and its restore (see docs/OPERATIONS.md, \"Restoring a Consul snapshot\")",
            ));
        }
        let reserve_ms = u64::try_from(self.deps.hwm_reserve.as_millis()).unwrap_or(u64::MAX);
        let report =
            crate::store::skip_ahead::skip_ahead(client, keys, r.margin, self.now_ms(), reserve_ms)
                .await
                .map_err(|e| to_status(&Error::Store(e)))?;
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

    async fn get_layout(&self) -> Result<proto::GetLayoutResponse, Status> {
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

    async fn set_layout(
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
        };
        let file = crate::config::FileConfig {
            layout: section.clone(),
            ..Default::default()
        };
        let layout = file
            .layout(self.now_ms())
            .map_err(|e| refusal(ErrorKind::BadRequest, e.to_string()))?;
        let expect = (r.expect_generation != 0).then_some(r.expect_generation);
        let report = change_layout(
            client,
            keys,
            &layout,
            &section.preset_name(),
            expect,
            self.deps.clock.as_ref(),
        )
        .await
        .map_err(|e| to_status(&Error::ClusterLayout(e)))?;
        Ok(proto::SetLayoutResponse {
            record: Some(layout_response(&report.record)),
            old_max_id: report.old_max_id,
            new_first_id: report.new_first_id,
        })
    }

    async fn list_strict_keys(
        &self,
        r: proto::ListStrictKeysRequest,
    ) -> Result<proto::ListStrictKeysResponse, Status> {
        let strict = self.strict()?;
        let ns = parse_namespace(&r.namespace)?;
        let keys = strict.store().list_keys(&ns).await.map_err(store_status)?;
        Ok(proto::ListStrictKeysResponse {
            namespace: ns.to_string(),
            keys: keys
                .into_iter()
                .map(|(key, value)| proto::StrictKeyValue {
                    key: key.to_string(),
                    value,
                })
                .collect(),
            max_keys: strict.limits().max_keys_per_namespace,
        })
    }

    async fn delete_strict_key(
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

    async fn list_strict_namespaces(&self) -> Result<proto::ListStrictNamespacesResponse, Status> {
        let strict = self.strict()?;
        let mut namespaces = strict.store().namespaces().await.map_err(store_status)?;
        namespaces.sort();
        Ok(proto::ListStrictNamespacesResponse {
            namespaces: namespaces
                .into_iter()
                .map(|(ns, step)| proto::StrictNamespace {
                    namespace: ns.to_string(),
                    step,
                })
                .collect(),
            default_step: strict.default_step(),
        })
    }
}

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

    async fn create_format(
        &self,
        r: proto::CreateFormatRequest,
    ) -> Result<proto::CreateFormatResponse, Status> {
        let catalog = Arc::clone(self.catalog()?);
        let def = parse_definition(&r.definition_json)?;
        check_description(&def.description)?;
        let fresh = r.fresh;
        let (written, reload) = to_the_end(async move { catalog.create(def, fresh).await })
            .await
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
                crate::store::format::one_node_formats_warning(&names)
            );
        }
    }

    async fn update_format(
        &self,
        r: proto::UpdateFormatRequest,
    ) -> Result<proto::UpdateFormatResponse, Status> {
        let catalog = self.catalog()?;
        let def = parse_definition(&r.definition_json)?;
        check_description(&def.description)?;
        let previous = catalog.store().get(&def.name).await.map_err(store_status)?;
        let catalog = Arc::clone(catalog);
        let (written, reload) = to_the_end(async move { catalog.update(def).await })
            .await
            .map_err(|e| to_status(&e))?;
        Ok(proto::UpdateFormatResponse {
            format: Some(self.format_message(&written)),
            previous: previous.map(|p| self.format_message(&p)),
            reload: Some(reload_message(reload)),
        })
    }

    async fn get_format(
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
            .ok_or_else(|| store_status(StoreError::FormatNotFound(r.name.clone())))?;
        Ok(proto::GetFormatResponse {
            format: Some(self.format_message(&stored)),
        })
    }

    async fn list_formats(&self) -> Result<proto::ListFormatsResponse, Status> {
        let catalog = self.catalog()?;
        let listing = catalog.store().list().await.map_err(store_status)?;
        Ok(proto::ListFormatsResponse {
            formats: listing
                .formats
                .iter()
                .map(|f| self.format_message(f))
                .collect(),
            unreadable: listing
                .unreadable
                .into_iter()
                .map(|(key, error)| proto::UnreadableRecord { key, error })
                .collect(),
        })
    }

    async fn delete_format(
        &self,
        r: proto::DeleteFormatRequest,
    ) -> Result<proto::DeleteFormatResponse, Status> {
        let catalog = Arc::clone(self.catalog()?);
        let name = r.name.clone();
        let (tombstone, reload) = to_the_end(async move { catalog.delete(&name).await })
            .await
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

    async fn reload_formats(&self) -> Result<proto::ReloadFormatsResponse, Status> {
        let catalog = self.catalog()?;
        let reloaded = catalog
            .reload("admin")
            .await
            .map_err(|e| reload_status(&e))?;
        tracing::info!(formats = ?reloaded.formats, changed = ?reloaded.changed, "formats reloaded (admin)");
        Ok(reload_message(reloaded))
    }
}

/// Runs a format change to its end on its own task. A caller past its
/// deadline drops the gRPC handler's future; dropped between storing a
/// definition and installing it, a created format stayed stored but
/// unserved on the embedded store (nothing else reloads there).
async fn to_the_end<T: Send + 'static>(
    change: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    tokio::spawn(change)
        .await
        .unwrap_or_else(|e| Err(Error::Setup(format!("the format change stopped: {e}"))))
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

/// Largest piece of a snapshot per message.
const BACKUP_CHUNK: usize = 1 << 20;

/// The stream `Backup` answers with.
pub type BackupStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<proto::BackupChunk, Status>> + Send + 'static>,
>;

impl AdminService {
    async fn backup(&self, now_ms: u64) -> Result<Vec<u8>, Status> {
        let Some(source) = self.deps.snapshots.clone() else {
            return Err(refusal(ErrorKind::Precondition,
                "Backup copies the embedded state file; this node keeps its state in Consul: back up Consul instead (`consul snapshot save`)",
            ));
        };
        let taken = tokio::task::spawn_blocking(move || source.take(now_ms))
            .await
            .map_err(|e| refusal(ErrorKind::Internal, format!("backup task failed: {e}")))?;
        taken.map_err(|e| to_status(&Error::Store(e)))
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_layout(
        &self,
        request: Request<proto::GetLayoutRequest>,
    ) -> Result<Response<proto::GetLayoutResponse>, Status> {
        self.call("GetLayout", request, |_| AdminService::get_layout(self))
            .await
    }

    async fn set_layout(
        &self,
        request: Request<proto::SetLayoutRequest>,
    ) -> Result<Response<proto::SetLayoutResponse>, Status> {
        self.call("SetLayout", request, |r| AdminService::set_layout(self, r))
            .await
    }

    type BackupStream = BackupStream;

    async fn backup(
        &self,
        request: Request<proto::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
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

    async fn create_tag(
        &self,
        request: Request<proto::CreateTagRequest>,
    ) -> Result<Response<proto::CreateTagResponse>, Status> {
        self.call("CreateTag", request, |r| AdminService::create_tag(self, r))
            .await
    }

    async fn update_tag(
        &self,
        request: Request<proto::UpdateTagRequest>,
    ) -> Result<Response<proto::UpdateTagResponse>, Status> {
        self.call("UpdateTag", request, |r| AdminService::update_tag(self, r))
            .await
    }

    async fn get_tag(
        &self,
        request: Request<proto::GetTagRequest>,
    ) -> Result<Response<proto::GetTagResponse>, Status> {
        self.call("GetTag", request, |r| AdminService::get_tag(self, r))
            .await
    }

    async fn list_tags(
        &self,
        request: Request<proto::ListTagsRequest>,
    ) -> Result<Response<proto::ListTagsResponse>, Status> {
        self.call("ListTags", request, |_| AdminService::list_tags(self))
            .await
    }

    async fn delete_tag(
        &self,
        request: Request<proto::DeleteTagRequest>,
    ) -> Result<Response<proto::DeleteTagResponse>, Status> {
        self.call("DeleteTag", request, |r| AdminService::delete_tag(self, r))
            .await
    }

    async fn list_holders(
        &self,
        request: Request<proto::ListHoldersRequest>,
    ) -> Result<Response<proto::ListHoldersResponse>, Status> {
        self.call("ListHolders", request, |_| AdminService::list_holders(self))
            .await
    }

    async fn force_release(
        &self,
        request: Request<proto::ForceReleaseRequest>,
    ) -> Result<Response<proto::ForceReleaseResponse>, Status> {
        self.call("ForceRelease", request, |r| {
            AdminService::force_release(self, r)
        })
        .await
    }

    async fn set_strict_step(
        &self,
        request: Request<proto::SetStrictStepRequest>,
    ) -> Result<Response<proto::SetStrictStepResponse>, Status> {
        self.call("SetStrictStep", request, |r| {
            AdminService::set_strict_step(self, r)
        })
        .await
    }

    async fn get_strict_step(
        &self,
        request: Request<proto::GetStrictStepRequest>,
    ) -> Result<Response<proto::GetStrictStepResponse>, Status> {
        self.call("GetStrictStep", request, |r| {
            AdminService::get_strict_step(self, r)
        })
        .await
    }

    async fn list_strict_namespaces(
        &self,
        request: Request<proto::ListStrictNamespacesRequest>,
    ) -> Result<Response<proto::ListStrictNamespacesResponse>, Status> {
        self.call("ListStrictNamespaces", request, |_| {
            AdminService::list_strict_namespaces(self)
        })
        .await
    }

    async fn list_strict_keys(
        &self,
        request: Request<proto::ListStrictKeysRequest>,
    ) -> Result<Response<proto::ListStrictKeysResponse>, Status> {
        self.call("ListStrictKeys", request, |r| {
            AdminService::list_strict_keys(self, r)
        })
        .await
    }

    async fn delete_strict_key(
        &self,
        request: Request<proto::DeleteStrictKeyRequest>,
    ) -> Result<Response<proto::DeleteStrictKeyResponse>, Status> {
        self.call("DeleteStrictKey", request, |r| {
            AdminService::delete_strict_key(self, r)
        })
        .await
    }

    async fn skip_ahead(
        &self,
        request: Request<proto::SkipAheadRequest>,
    ) -> Result<Response<proto::SkipAheadResponse>, Status> {
        self.call("SkipAhead", request, |r| AdminService::skip_ahead(self, r))
            .await
    }

    async fn renew_session(
        &self,
        request: Request<proto::RenewSessionRequest>,
    ) -> Result<Response<proto::RenewSessionResponse>, Status> {
        self.call("RenewSession", request, |r| {
            AdminService::renew_session(self, r)
        })
        .await
    }

    async fn create_format(
        &self,
        request: Request<proto::CreateFormatRequest>,
    ) -> Result<Response<proto::CreateFormatResponse>, Status> {
        self.call("CreateFormat", request, |r| {
            AdminService::create_format(self, r)
        })
        .await
    }

    async fn update_format(
        &self,
        request: Request<proto::UpdateFormatRequest>,
    ) -> Result<Response<proto::UpdateFormatResponse>, Status> {
        self.call("UpdateFormat", request, |r| {
            AdminService::update_format(self, r)
        })
        .await
    }

    async fn get_format(
        &self,
        request: Request<proto::GetFormatRequest>,
    ) -> Result<Response<proto::GetFormatResponse>, Status> {
        self.call("GetFormat", request, |r| AdminService::get_format(self, r))
            .await
    }

    async fn list_formats(
        &self,
        request: Request<proto::ListFormatsRequest>,
    ) -> Result<Response<proto::ListFormatsResponse>, Status> {
        self.call("ListFormats", request, |_| AdminService::list_formats(self))
            .await
    }

    async fn delete_format(
        &self,
        request: Request<proto::DeleteFormatRequest>,
    ) -> Result<Response<proto::DeleteFormatResponse>, Status> {
        self.call("DeleteFormat", request, |r| {
            AdminService::delete_format(self, r)
        })
        .await
    }

    async fn reload_formats(
        &self,
        request: Request<proto::ReloadFormatsRequest>,
    ) -> Result<Response<proto::ReloadFormatsResponse>, Status> {
        self.call("ReloadFormats", request, |_| {
            AdminService::reload_formats(self)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn md(value: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(v) = value {
            m.insert("authorization", MetadataValue::try_from(v).unwrap());
        }
        m
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"s3cret", b"s3cret"));
        for other in [
            &b""[..],
            b"s3cre",
            b"s3crett",
            b"S3cret",
            b"x3cret",
            b"s3crex",
        ] {
            assert!(!same_token(other, b"s3cret"), "{other:?}");
        }
        assert!(!same_token(b"", b"\xff"), "a missing byte never matches");
    }

    #[test]
    fn credentials_get_the_documented_codes() {
        let token = AdminToken("s3cret".into());
        let code = |t: Option<&AdminToken>, h: Option<&str>| {
            authorize(t, &md(h)).map_err(|s| s.code()).err()
        };
        assert_eq!(code(Some(&token), Some("Bearer s3cret")), None);
        assert_eq!(code(Some(&token), Some("bearer  s3cret ")), None);
        assert_eq!(code(Some(&token), None), Some(Code::Unauthenticated));
        assert_eq!(
            code(Some(&token), Some("s3cret")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Basic s3cret")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Bearer ")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Bearer wrong")),
            Some(Code::PermissionDenied)
        );
        // No token on the server: off, whatever the caller sends.
        assert_eq!(
            code(None, Some("Bearer s3cret")),
            Some(Code::PermissionDenied)
        );
        assert_eq!(code(None, None), Some(Code::PermissionDenied));
        let s = authorize(None, &md(None)).unwrap_err();
        assert!(s.message().contains("admin.token"), "{s:?}");
        let s = authorize(Some(&token), &md(Some("Bearer wrong"))).unwrap_err();
        assert!(!s.message().contains("s3cret"));
    }

    #[test]
    fn holder_keys_parse() {
        let keys = ClusterKeys::new("idgen", "prod");
        let dir = all_groups(&keys.workers_dir(0));
        assert_eq!(dir, "idgen/prod/workers/");
        assert_eq!(all_groups(&keys.lease_dir(0)), "idgen/prod/lease/");
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/2/17"), Some((2, 17)));
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/2/"), None);
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/x/1"), None);
        assert_eq!(
            LockKey::Token(1, 5).key(&keys),
            "idgen/prod/lease/1/5",
            "the key the lease store locks"
        );
    }

    #[test]
    fn release_requests_are_checked() {
        let req = |kind: HolderKind, datacenter, zone| proto::ForceReleaseRequest {
            kind: kind as i32,
            datacenter,
            zone,
            id: 3,
            force: false,
            space: String::new(),
        };
        let format = |space: &str, id| proto::ForceReleaseRequest {
            space: space.into(),
            id,
            ..req(HolderKind::FormatToken, 0, 0)
        };
        let held = |r| AdminService::held(&r).map_err(|s| s.code());
        assert_eq!(
            held(req(HolderKind::Worker, 1, 0)),
            Ok(LockKey::Worker(1, 3))
        );
        assert_eq!(
            held(req(HolderKind::LeaseToken, 0, 2)),
            Ok(LockKey::Token(2, 3))
        );
        let alnum2 = TokenSpace::from_name("alnum-2").unwrap();
        assert_eq!(
            held(format("alnum-2", 1295)),
            Ok(LockKey::FormatToken(alnum2, 1295))
        );
        assert_eq!(
            held(format("uniq64", 4095)),
            Ok(LockKey::FormatToken(TokenSpace::Uniq64, 4095))
        );
        for bad in [
            req(HolderKind::Unspecified, 0, 0),
            req(HolderKind::Worker, 0, 1),
            req(HolderKind::LeaseToken, 1, 0),
            req(HolderKind::LeaseToken, 0, 1000),
            // A format token: an unknown space, a token outside its space,
            // no space, a datacenter or zone, a space on another kind.
            format("alnum-9", 1),
            format("alnum-2", 1296),
            format("uniq64", 4096),
            format("", 1),
            proto::ForceReleaseRequest {
                zone: 1,
                ..format("digits-2", 1)
            },
            proto::ForceReleaseRequest {
                datacenter: 1,
                ..format("digits-2", 1)
            },
            proto::ForceReleaseRequest {
                space: "digits-2".into(),
                ..req(HolderKind::Worker, 1, 0)
            },
        ] {
            assert_eq!(held(bad), Err(Code::InvalidArgument));
        }
    }
}
